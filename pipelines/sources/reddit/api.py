"""The Reddit API through praw: credentials from the environment, the client, and one-line errors.

Credentials come only from praw's own environment variables (``praw_client_id``,
``praw_client_secret``, ``praw_user_agent``) of a read-only OAuth app; their values are never
logged, put in options, metadata or error messages (:func:`api_error` scrubs them).
"""

from __future__ import annotations

import importlib.metadata
import sys
from typing import Any

from pipelines.sources.base import env_credential
from schemas.errors import MmlinksError

REDDIT_CREDENTIALS = ("praw_client_id", "praw_client_secret", "praw_user_agent")
_REQUIRED_CREDENTIALS = REDDIT_CREDENTIALS[:2]


def missing_credentials() -> list[str]:
    return [name for name in _REQUIRED_CREDENTIALS if env_credential(name) is None]


def require_credentials(why: str) -> None:
    """Raise a clear MmlinksError (names only, never values) when the API credentials are unset."""
    missing = missing_credentials()
    if missing:
        raise MmlinksError(
            f"{why} needs Reddit API credentials: set the environment variable(s) {', '.join(missing)} "
            f"(a read-only OAuth app from https://www.reddit.com/prefs/apps; optionally praw_user_agent)"
        )


def default_user_agent() -> str:
    """Reddit's requested format ``<platform>:<app id>:<version> (by u/<name>)``.

    Reddit asks for the operator's own account name here: set ``praw_user_agent`` to name it.
    """
    try:
        ver = importlib.metadata.version("mmlinks")
    except importlib.metadata.PackageNotFoundError:  # a source checkout, not installed
        ver = "0.1.0"
    return f"{sys.platform}:mmlinks:{ver} (by u/mmlinks-research)"


def make_reddit(api_base: str | None = None, **praw_kwargs: Any):
    """A read-only ``praw.Reddit`` from the environment's credentials.

    ``api_base`` replaces both https://oauth.reddit.com (API calls) and https://www.reddit.com
    (the token endpoint): prawcore accepts any http(s) base, which is how tests talk to a
    loopback fixture server through praw's real code path. Raises MmlinksError naming the
    missing variables (never their values).
    """
    import praw

    require_credentials("the Reddit API")
    settings: dict[str, Any] = {
        "client_id": env_credential("praw_client_id"),
        "client_secret": env_credential("praw_client_secret"),
        "user_agent": env_credential("praw_user_agent") or default_user_agent(),
        "check_for_updates": False,
        "check_for_async": False,
    }
    if api_base:
        settings["oauth_url"] = api_base
        settings["reddit_url"] = api_base
    settings.update(praw_kwargs)
    reddit = praw.Reddit(**settings)
    reddit.read_only = True
    return reddit


def api_errors() -> tuple[type[BaseException], ...]:
    import praw.exceptions
    import prawcore.exceptions

    return (prawcore.exceptions.PrawcoreException, praw.exceptions.PRAWException)


def api_error(exc: BaseException, doing: str) -> MmlinksError:
    """A praw/prawcore exception as one line: its type, the message with every credential value
    scrubbed, and a hint for 401 (credentials), 403 (forbidden), 404 (no such subreddit) and
    network failures. ``doing`` says what failed, e.g. ``"the crawl of r/DIY"``."""
    import prawcore.exceptions

    status = getattr(getattr(exc, "response", None), "status_code", None)
    detail = " ".join(str(exc).split())[:300]
    for name in REDDIT_CREDENTIALS:  # never echo a credential, whatever the message holds
        value = env_credential(name)
        if value:
            detail = detail.replace(value, "***")
    hint = ""
    if status == 401 or isinstance(exc, prawcore.exceptions.OAuthException):
        hint = " (check praw_client_id and praw_client_secret: a read-only 'script' app's id and secret)"
    elif status == 403:
        hint = " (forbidden: a private, quarantined or banned subreddit?)"
    elif status == 404 or isinstance(exc, prawcore.exceptions.Redirect):
        hint = " (no such subreddit?)"
    elif isinstance(exc, prawcore.exceptions.RequestException):
        hint = " (network: Reddit could not be reached)"
    return MmlinksError(f"the Reddit API failed during {doing}: {type(exc).__name__}: {detail}{hint}")
