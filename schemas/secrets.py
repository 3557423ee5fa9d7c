"""The credentials mmlinks and its libraries read from the environment, and one function that
takes their values out of a message before a user or a log sees it.

Why a scrub: a server may echo the ``Authorization`` header into an error body, which MLflow or
Ray put into the exception the CLI prints (issue #19)."""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

# Values read as credentials: Reddit's praw app, imgur's API client id, an MLflow server's token
# or basic-auth password, a Ray cluster's token.
CREDENTIAL_ENV = (
    "praw_client_id",
    "praw_client_secret",
    "IMGUR_CLIENT_ID",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_PASSWORD",
    "RAY_AUTH_TOKEN",
)
# URIs whose user info (``scheme://user:password@host``) is a credential.
URI_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
MIN_SECRET_CHARS = 4  # a shorter value would blank ordinary words


def credential_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Every secret string of ``environ``: the raw values, URI passwords, and the base64 form
    of ``user:password`` that HTTP basic auth sends; longest first (so a value containing another
    is replaced whole)."""
    env = os.environ if environ is None else environ
    found = {env.get(name, "").strip() for name in CREDENTIAL_ENV}
    pairs = []
    if env.get("MLFLOW_TRACKING_PASSWORD", "").strip():
        pairs.append((env.get("MLFLOW_TRACKING_USERNAME", ""), env["MLFLOW_TRACKING_PASSWORD"]))
    for name in URI_ENV:
        try:
            parts = urlsplit(env.get(name, ""))
        except ValueError:
            continue
        if parts.password:
            found.add(unquote(parts.password))
            found.add(parts.password)
            pairs.append((unquote(parts.username or ""), unquote(parts.password)))
    for user, password in pairs:
        found.add(base64.b64encode(f"{user}:{password}".encode()).decode())
    return sorted((v for v in found if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True)


def scrub_credentials(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with every credential value of the environment replaced by ``***``."""
    for value in credential_values(environ):
        text = text.replace(value, "***")
    return text
