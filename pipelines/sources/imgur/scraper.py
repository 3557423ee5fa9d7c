"""``AlbumScraper``: one album per page request (or API call), through the polite client, with
finished albums remembered in the crawl state so they are never fetched again.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pipelines.crawl_state import CrawlState
from pipelines.sources.imgur.album import (
    _ID_RE,
    API_BASE,
    IMAGE_BASE,
    PAGE_BASE,
    STATE_KIND,
    Album,
    AlbumFailed,
    AlbumImage,
    AlbumParseError,
    _text,
)
from pipelines.sources.imgur.parsers import (
    parse_album_api_v3,
    parse_album_hit_json,
    parse_album_html_2018,
    parse_album_html_json,
)
from pipelines.web import HttpError, HttpResponse, PoliteClient, redact_url
from schemas.errors import MmlinksError

# --------------------------------------------------------------------------------------------
# Scraper


def _refuse_userinfo(name: str, base: str) -> None:
    """MmlinksError for a base URL with user info; the URL is not echoed (it holds a secret)."""
    try:
        netloc = urlsplit(base).netloc
    except ValueError:
        netloc = ""
    if "@" in netloc:
        raise MmlinksError(
            f"{name} carries user info (user:token@host); credentials belong in the environment "
            "(IMGUR_CLIENT_ID), not in a base URL"
        )


def _merge_fill_in(page: Album, rest: Album) -> Album:
    """The hit.json list (complete, in album order) with the page's captions where it has none."""
    page_captions = {im.hash: im.caption for im in page.images}
    images = [
        im
        if im.caption or not page_captions.get(im.hash)
        else AlbumImage(im.hash, im.ext, im.url, page_captions[im.hash], im.animated)
        for im in rest.images
    ]
    declared = page.declared_count if page.declared_count is not None else rest.declared_count
    complete = declared is None or len(images) >= declared
    # Page captions taken over may include repaired ones (at most as many as were taken over).
    taken = sum(a is not b for a, b in zip(images, rest.images, strict=True))
    repaired = rest.captions_repaired + min(page.captions_repaired, taken)
    return Album(page.album_id, images, page.source, declared, complete, rest.skipped, repaired)


class AlbumScraper:
    """Scrape albums once: finished results (and the album's own permanent failures) are kept.

    API v3 with ``client_id``; otherwise the page, tried with the 2018 parser, then the embedded
    JSON one, and a truncated 2018 page completed from ``hit.json`` unless ``fetch_all`` is False
    (the paper's scraper read only the page, so it saw only the inlined images). 404/410, a page
    without either markup and undecodable JSON are recorded failures, final for later runs too
    (delete the crawl state's ``items/album`` to try again); 401/403/408/429/5xx and the client's
    transient errors are retried by the next run; the client's policy refusals are permanent, not
    recorded. Thread-safe as far as the client is.

    Records are keyed by route and base as well as album id (``state_key``), so an answer from live
    imgur is not reused when ``page_base`` points at a web archive, nor a page answer for the API;
    they keep image hash and extension, and URLs are built from this scraper's ``image_base``. Base
    URLs must not carry user info: they end up in keys, records and messages.
    """

    def __init__(
        self,
        client: PoliteClient,
        state: CrawlState | None,
        *,
        page_base: str = PAGE_BASE,
        api_base: str = API_BASE,
        image_base: str = IMAGE_BASE,
        client_id: str | None = None,
        fetch_all: bool = True,
        max_page_bytes: int | None = 8 * 1024 * 1024,
    ):
        for name, base in (("page_base", page_base), ("api_base", api_base), ("image_base", image_base)):
            _refuse_userinfo(name, base)
        self.client = client
        self.state = state
        self.page_base = page_base.rstrip("/")
        self.api_base = api_base.rstrip("/")
        self.image_base = image_base.rstrip("/")
        self.client_id = client_id
        self.fetch_all = fetch_all
        self.max_page_bytes = max_page_bytes

    def __repr__(self) -> str:  # never shows the client id
        return f"AlbumScraper(page_base={self.page_base!r}, api={'on' if self.client_id else 'off'})"

    def state_key(self, album_id: str) -> str:
        """The crawl-state key of an album: the route (``api``/``page``), its base, the id."""
        if self.client_id:
            return f"api|{self.api_base}|{album_id}"
        return f"page|{self.page_base}|{album_id}"

    def scrape(self, album_id: str) -> Album:
        if not _ID_RE.fullmatch(album_id or ""):
            raise AlbumFailed("bad_album_id", repr(album_id))
        key = self.state_key(album_id)
        if self.state is not None:
            rec = self.state.get(STATE_KIND, key)
            if rec is not None:
                if "failed" in rec:
                    raise AlbumFailed(str(rec["failed"]), str(rec.get("detail", "")), recorded=True)
                try:
                    album = Album.from_record(rec, image_base=self.image_base)
                except (KeyError, TypeError, ValueError, AttributeError):
                    album = None  # a record from another version: scrape again
                # An album kept partial by fetch_all=False is completed once fetch_all is on.
                if album is not None and (album.complete or rec.get("fill_in_tried") or not self.fetch_all):
                    return album
        try:
            album = self._scrape_api(album_id) if self.client_id else self._scrape_page(album_id)
        except AlbumFailed as exc:
            if exc.recorded and self.state is not None:
                self.state.put(STATE_KIND, key, {"failed": exc.reason, "detail": exc.detail})
            raise
        if self.state is not None:
            self.state.put(STATE_KIND, key, {**album.to_record(), "fill_in_tried": self.fetch_all})
        return album

    def _get(self, url: str, *, params: dict[str, str] | None = None, headers: dict[str, str] | None = None):
        try:
            resp: HttpResponse = self.client.get(
                url, params=params, headers=headers, max_bytes=self.max_page_bytes
            )
        except HttpError as exc:
            raise AlbumFailed(exc.reason, exc.detail, transient=exc.transient) from exc
        status = resp.status
        shown = redact_url(url)  # details end up in dead letters and the crawl state
        if status in (404, 410):
            raise AlbumFailed("album_not_found", f"HTTP {status} {shown}", recorded=True)
        if status in (401, 403):
            # Imgur answers 403 "over capacity" under load; and a bad client id must not mark
            # albums as finished.
            reason = "over_capacity" if b"capacity" in resp.body[:2000].lower() else "forbidden"
            raise AlbumFailed(reason, f"HTTP {status} {shown}", transient=True)
        if status in (408, 429) or status >= 500:
            raise AlbumFailed(f"http_{status}", f"HTTP {status} {shown}", transient=True)
        if not 200 <= status < 300:
            raise AlbumFailed(f"http_{status}", f"HTTP {status} {shown}")
        return resp

    def _scrape_api(self, album_id: str) -> Album:
        url = f"{self.api_base}/3/album/{album_id}/images"
        resp = self._get(url, headers={"Authorization": f"Client-ID {self.client_id}"})
        try:
            return parse_album_api_v3(resp.body, album_id=album_id, image_base=self.image_base)
        except AlbumParseError as exc:
            raise AlbumFailed(exc.reason, exc.detail, recorded=True) from None

    def _scrape_page(self, album_id: str) -> Album:
        resp = self._get(f"{self.page_base}/a/{album_id}")
        text = _text(resp.body)
        try:
            album = parse_album_html_2018(text, album_id=album_id, image_base=self.image_base)
        except AlbumParseError:
            try:
                return parse_album_html_json(text, album_id=album_id, image_base=self.image_base)
            except AlbumParseError as exc:
                raise AlbumFailed(exc.reason, exc.detail, recorded=True) from None
        if not album.images and "postDataJSON" in text:
            # Containers without image ids next to embedded JSON: a newer page reusing the class.
            try:
                return parse_album_html_json(text, album_id=album_id, image_base=self.image_base)
            except AlbumParseError:
                pass
        if album.complete or not self.fetch_all:
            return album
        return self._fill_in(album)

    def _fill_in(self, page: Album) -> Album:
        url = f"{self.page_base}/ajaxalbums/getimages/{page.album_id}/hit.json"
        try:
            resp = self._get(url, params={"all": "true"})
            rest = parse_album_hit_json(resp.body, album_id=page.album_id, image_base=self.image_base)
        except AlbumFailed as exc:
            if exc.transient:
                raise  # retry the whole album next run rather than record a partial one
            return page  # the endpoint is gone: keep what the page inlined (complete=False)
        except AlbumParseError:
            return page
        if len(rest.images) < len(page.images):
            return page
        return _merge_fill_in(page, rest)
