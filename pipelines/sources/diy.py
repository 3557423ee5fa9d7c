"""The ``diy`` source: r/DIY imgur-album posts -> one document per album (Hessel et al. 2019).

The Reddit side is ``reddit.ReadCandidatePosts``; this scrapes each album and shapes the
document (``diy-<post id>``, captions in image order). Why a caption of an animated image stays a
sentence without a link: the paper kept those (its footnote 3)."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import apache_beam as beam

from pipelines.records import DEAD_LETTER, RawDocument, count, dead_letter, dead_lettered
from pipelines.sources.base import SourceContext, SourceOption, SourceSpec, env_credential
from pipelines.sources.http_options import http_source_options, policy_from_context, polite_fetcher
from pipelines.sources.imgur import (
    API_BASE,
    IMAGE_BASE,
    PAGE_BASE,
    Album,
    AlbumFailed,
    AlbumScraper,
    album_id_from_url,
)
from pipelines.sources.reddit import (
    REDDIT_CREDENTIALS,
    REDDIT_OPTIONS,
    ReadCandidatePosts,
    list_input_files,
    reddit_config,
)
from pipelines.web import PoliteClient
from schemas.errors import MmlinksError

SOURCE = "diy"
IMGUR_CLIENT_ID = "IMGUR_CLIENT_ID"

IMGUR_OPTIONS: tuple[SourceOption, ...] = (
    SourceOption(
        "imgur_page_base",
        PAGE_BASE,
        "where album pages are read: {base}/a/<id> (a web-archive prefix reproduces 2018 pages)",
    ),
    SourceOption("imgur_api_base", API_BASE, "imgur API v3 base, used when IMGUR_CLIENT_ID is set"),
    SourceOption("imgur_image_base", IMAGE_BASE, "image URLs are {base}/<hash>.<ext>"),
    SourceOption(
        "imgur_full_albums",
        "true",
        "true: fetch the images a large 2018 page did not inline; false: only the inlined ones "
        "(what the paper's page scraper saw)",
    ),
)


_BASE_OPTIONS = (
    ("imgur_page_base", PAGE_BASE),
    ("imgur_api_base", API_BASE),
    ("imgur_image_base", IMAGE_BASE),
)


def _host(url: str, option: str = "imgur_*_base") -> str:
    """``host`` or ``host:port`` of a base URL, as the HTTP policy's allowlist wants it.

    A base URL with user info (``https://user:token@host``) is refused: credentials belong in
    the environment (``IMGUR_CLIENT_ID``), while base URLs land in build parameters, crawl-state
    keys and dead-letter details. The refused URL is not echoed.
    """
    try:
        parts = urlsplit(url)
        hostname = parts.hostname
        parts.port  # noqa: B018 - a bad port raises ValueError here
    except ValueError:
        parts, hostname = None, None
    if parts is not None and "@" in parts.netloc:
        raise MmlinksError(
            f"--source-option {option} must not carry user info (user:token@host); "
            "credentials belong in the environment (IMGUR_CLIENT_ID)"
        )
    if parts is None or parts.scheme not in ("http", "https") or not hostname:
        # Never echo what might hold a secret: user info, a query, a fragment.
        shown = "(not shown: it contains '@')" if "@" in url else repr(url.split("?", 1)[0].split("#", 1)[0])
        raise MmlinksError(f"--source-option {option} wants an http(s) base URL, not {shown}")
    return parts.netloc.lower()


def _bases(ctx: SourceContext) -> tuple[str, str, str]:
    page_base, api_base, image_base = (ctx.str(name) or default for name, default in _BASE_OPTIONS)
    return page_base, api_base, image_base


def document_from_album(post: dict, album: Album) -> Iterator[RawDocument | beam.pvalue.TaggedOutput]:
    """The RawDocument for one post and its album, plus dead letters for what was left out."""
    post_id = str(post["id"])
    doc_id = f"{SOURCE}-{post_id}"
    if album.skipped:
        yield dead_letter(
            "image", f"{doc_id}#album", "unparseable_entry", f"{album.skipped} album entries had no image id"
        )
    if not album.images:
        yield dead_letter("document", doc_id, "empty_album", f"album {album.album_id} has no images")
        return
    sentences: list[str] = []
    image_uris: list[str] = []
    links: list[tuple[int, int]] = []
    for k, image in enumerate(album.images):
        if image.animated:
            yield dead_letter("image", f"{doc_id}#image-{k}", "animated", image.url)
            if image.caption:
                sentences.append(image.caption)  # kept, unlinked (paper, footnote 3)
            continue
        if image.caption:
            links.append((len(sentences), len(image_uris)))
            sentences.append(image.caption)
        image_uris.append(image.url)
    if not image_uris:
        yield dead_letter("document", doc_id, "only_animated", f"album {album.album_id}: all animated")
        return
    if not album.complete:
        count("albums_incomplete")
    if album.captions_repaired:  # lone UTF-16 surrogates in the album's JSON, now U+FFFD
        count("captions_repaired", album.captions_repaired)
    metadata = {
        "post_id": post_id,
        "title": str(post.get("title") or ""),
        "permalink": str(post.get("permalink") or ""),
        "created_utc": str(post.get("created_utc") or ""),
        "score": str(post.get("score") if post.get("score") is not None else ""),
        "url": str(post.get("url") or ""),
        "album_id": album.album_id,
        "album_source": album.source,
        "album_complete": "true" if album.complete else "false",
    }
    count("documents_out")
    yield RawDocument(
        doc_id=doc_id,
        source=SOURCE,
        sentences=sentences,
        image_uris=image_uris,
        links=links,
        metadata=metadata,
    )


class ScrapeAlbums(beam.DoFn):
    """Candidate post -> RawDocument (or dead letters), one album scrape per post.

    The HTTP client and crawl state are made in ``setup`` on the worker; the imgur client id is
    read from the environment there, so it never travels in the pipeline or the options.
    """

    def __init__(self, ctx: SourceContext):
        self.ctx = ctx
        self._scraper: AlbumScraper | None = None

    def setup(self):
        from pipelines.crawl_state import CrawlState

        page_base, api_base, image_base = _bases(self.ctx)
        client_id = env_credential(IMGUR_CLIENT_ID)
        hosts = {_host(page_base, "imgur_page_base")}
        if client_id:
            hosts.add(_host(api_base, "imgur_api_base"))
        self._scraper = AlbumScraper(
            PoliteClient(policy_from_context(self.ctx, hosts)),
            CrawlState(self.ctx.state()),
            page_base=page_base,
            api_base=api_base,
            image_base=image_base,
            client_id=client_id,
            fetch_all=self.ctx.bool("imgur_full_albums"),
        )

    def process(self, post: dict):
        post_id = post.get("id") if isinstance(post, dict) else None
        if not isinstance(post_id, str) or not post_id:
            yield dead_letter("document", str(post)[:80], "bad_post", "candidate post without an id")
            return
        doc_id = f"{SOURCE}-{post_id}"
        url = str(post.get("url") or "")
        # Our parser first: it validates the id (5 or 7 alphanumerics) and knows every URL shape.
        album_id = album_id_from_url(url) or post.get("album_id")
        if not album_id:
            yield dead_letter("document", doc_id, "not_album_url", url)
            return
        count("albums_requested")
        assert self._scraper is not None
        try:
            album = self._scraper.scrape(str(album_id))
        except AlbumFailed as exc:
            if exc.transient:
                # Not recorded in the crawl state: the next run asks again.
                count("albums_transient_failures")
                detail = f"transient, a rerun retries it: {exc.detail}"
            else:
                detail = exc.detail
            yield dead_letter("document", doc_id, exc.reason, f"album {album_id}: {detail}")
            return
        yield from document_from_album(post, album)


class ReadDiy(beam.PTransform):
    """Candidate r/DIY posts -> RawDocuments, with a ``dead_letter`` output.

    ``candidates`` replaces ``ReadCandidatePosts(ctx)`` (tests feed posts directly); it must
    return ``{"posts": ..., "dead_letter": ...}``. Album requests are spread over workers by a
    reshuffle: the post list arrives in file order, often on one worker.
    """

    def __init__(self, ctx: SourceContext, candidates: beam.PTransform | None = None):
        super().__init__()
        self.ctx = ctx
        self.candidates = candidates

    def expand(self, pbegin):
        found = pbegin | "Candidates" >> (self.candidates or ReadCandidatePosts(self.ctx))
        scraped = (
            found["posts"]
            | "SpreadAlbums" >> beam.Reshuffle()
            | "ScrapeAlbums" >> dead_lettered(ScrapeAlbums(self.ctx))
        )
        dead = (found[DEAD_LETTER], scraped[DEAD_LETTER]) | "DeadLetters" >> beam.Flatten()
        return {"documents": scraped.documents, DEAD_LETTER: dead}


def _check(ctx: SourceContext) -> None:
    """Fail before Beam starts: no submission files, a bad option value, a bad base URL."""
    config = reddit_config(ctx)  # subreddit, months, min_score, refresh_scores (+ credentials)
    if not list_input_files(ctx.input, config):
        raise MmlinksError(
            f"diy input {ctx.input} holds no Reddit submission files for "
            f"{ctx.str('start')}..{ctx.str('end')} (RS_YYYY-MM.zst, <sub>_submissions.zst, *.ndjson)"
        )
    hosts = {_host(base, name) for base, (name, _default) in zip(_bases(ctx), _BASE_OPTIONS, strict=True)}
    policy_from_context(ctx, hosts)  # parses rate, concurrency, retries, ... with clear errors
    ctx.bool("imgur_full_albums")


FILES_SHOWN = 8  # file names in the "reading N files as dumps" line


def _describe(ctx: SourceContext) -> str:
    """Which files the build takes as Reddit submission dumps (what a wrong --input reveals)."""
    files = list_input_files(ctx.input, reddit_config(ctx))
    names = [f.replace("\\", "/").rsplit("/", 1)[-1] for f in files]
    shown = ", ".join(names[:FILES_SHOWN]) + (
        f", ... ({len(names) - FILES_SHOWN} more)" if len(names) > FILES_SHOWN else ""
    )
    return f"reading {len(files)} files under {ctx.input} as Reddit submission dumps: {shown}"


def _fetcher(ctx: SourceContext):
    return polite_fetcher(ctx, {_host(_bases(ctx)[2], "imgur_image_base")})


SPEC = SourceSpec(
    name=SOURCE,
    summary="r/DIY imgur albums: Reddit dump files (+ score refresh) -> album images and captions",
    make=lambda ctx: ReadDiy(ctx),
    options=REDDIT_OPTIONS + IMGUR_OPTIONS + http_source_options(),
    credentials=(*REDDIT_CREDENTIALS, IMGUR_CLIENT_ID),
    build_defaults={"filter_preset": "diy"},
    fetcher=_fetcher,
    check=_check,
    describe=_describe,
)
