"""The ``wiki`` source spec: options, the mode switch, the polite client and image fetcher."""

from __future__ import annotations

from urllib.parse import urlsplit

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from pipelines import fileio
from pipelines.sources.base import SourceContext, SourceOption, SourceSpec
from pipelines.sources.wiki.common import MODES, SOURCE
from pipelines.sources.wiki.imageclef import ReadImageClef, imageclef_layout
from pipelines.sources.wiki.mediawiki import MediaWikiArticles, ReadMediaWiki
from schemas.errors import MmlinksError


def _http_options() -> tuple[SourceOption, ...]:
    from pipelines.sources.http_options import http_source_options

    out = []
    for opt in http_source_options():
        if opt.name == "concurrency":  # MediaWiki: one request at a time
            opt = SourceOption(opt.name, "1", opt.help, defines_data=opt.defines_data)
        out.append(opt)
    return tuple(out)


def _mode(ctx: SourceContext) -> str:
    mode = (ctx.str("mode") or "").strip().lower()
    if mode not in MODES:
        raise MmlinksError(f"--source-option mode must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


def _langs(ctx: SourceContext) -> tuple[str, ...]:
    langs = tuple(x.strip().lower() for x in (ctx.str("lang") or "").split(",") if x.strip())
    if not langs:
        raise MmlinksError("--source-option lang wants a language code such as en (or en,de)")
    return langs


def _api_base(ctx: SourceContext) -> str:
    base = (ctx.str("api_base") or "").strip().rstrip("/")
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise MmlinksError(f"--source-option api_base wants an http(s) URL, not {base!r}")
    return base


def _image_host(ctx: SourceContext) -> str:
    host = (ctx.str("image_host") or "").strip().lower()
    if not host or "/" in host:
        raise MmlinksError(f"--source-option image_host wants a host name, not {host!r}")
    return host


def _client(ctx: SourceContext, host: str):
    from pipelines.sources.http_options import policy_from_context
    from pipelines.web.client import PoliteClient

    overrides: dict = {}
    agent = (ctx.str("user_agent") or "").strip()
    if agent:
        overrides["user_agent"] = agent
    return PoliteClient(policy_from_context(ctx, {host}, **overrides))


def _make(ctx: SourceContext) -> beam.PTransform:
    if _mode(ctx) == "imageclef":
        return ReadImageClef(ctx.input, _langs(ctx))
    api_base = _api_base(ctx)
    fetch = MediaWikiArticles(
        _client(ctx, urlsplit(api_base).netloc),
        api_base,
        _image_host(ctx),
        ctx.state(),
    )
    return ReadMediaWiki(ctx.input, fetch)


def _fetcher(ctx: SourceContext):
    if _mode(ctx) != "mediawiki":
        return None  # local files (or any Beam FileSystems URI): by scheme
    from pipelines.image_fetch import PoliteFetcher

    return PoliteFetcher(_client(ctx, _image_host(ctx)))


def _check(ctx: SourceContext) -> None:
    mode = _mode(ctx)
    if mode == "imageclef":
        _langs(ctx)
        patterns, _ = imageclef_layout(ctx.input)
        if not any(r.metadata_list for r in FileSystems.match(patterns, limits=[1] * len(patterns))):
            raise MmlinksError(
                f"{ctx.input} is not an ImageCLEF Wikipedia collection "
                "(no all_text/metadata/<dir>/<id>.xml or metadata/<dir>/<id>.xml files)"
            )
        return
    _api_base(ctx)
    _image_host(ctx)
    if not fileio.exists(ctx.input):
        raise MmlinksError(f"--input {ctx.input}: no such titles file (one article title per line)")


SPEC = SourceSpec(
    name=SOURCE,
    summary="Wikipedia articles: the ImageCLEF 2010/2011 Wikipedia collection, or titles via MediaWiki",
    make=_make,
    options=(
        SourceOption("mode", "imageclef", "imageclef (--input: collection root) | mediawiki (titles file)"),
        SourceOption("lang", "en", "imageclef: languages whose articles become documents (en; en,de)"),
        SourceOption("api_base", "https://en.wikipedia.org", "mediawiki: the wiki ({api_base}/w/api.php)"),
        SourceOption("image_host", "upload.wikimedia.org", "mediawiki: the host image URLs must be on"),
        SourceOption("user_agent", None, "mediawiki: a User-Agent with your contact details", False),
        *_http_options(),
    ),
    # The paper applies no near-duplicate removal to WIKI, and one image legitimately appears in
    # several articles (maps, flags, portraits); the paper's split is 14K/1K/1K.
    build_defaults={
        "filter_preset": "wiki",
        "dedupe_threshold": "off",
        "split_ratios": {"train": 0.875, "val": 0.0625, "test": 0.0625},
    },
    fetcher=_fetcher,
    check=_check,
)
