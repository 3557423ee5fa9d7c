"""Imgur albums: URL parsing, page/API parsers and a scraper that remembers finished albums.

The paper (Hessel et al. 2019, supplement) scraped each r/DIY album page and took every
``div.post-image-container`` (the image) with its ``.post-image-description`` (the caption written
beside it). Imgur has changed three times since, so there are three parsers, each a pure function
of the response text:

- ``parse_album_html_2018``: the 2013-2018 server-rendered page the paper saw (also what web
  archives hold). Large albums inlined only their first images; the page declared the full count
  (``"num_images"`` in its inline script) and a "load more" button (``post-loadall`` /
  ``js-post-truncated``), and the browser fetched the rest from ``/ajaxalbums/getimages/<id>/hit.json``
  (``parse_album_hit_json``). ``AlbumScraper`` does the same.
- ``parse_album_html_json``: the current client-rendered page, which carries the whole post as an
  escaped JSON string in ``window.postDataJSON="..."`` (``media`` list).
- ``parse_album_api_v3``: ``GET https://api.imgur.com/3/album/{id}/images`` with a registered
  ``Client-ID`` (env ``IMGUR_CLIENT_ID``), the sanctioned route when a client id is available.

Format facts were checked against public scrapers of each era (gallery-dl, yt-dlp, JDownloader):
the 2018 hit.json ``ext`` carries its leading dot (``".jpg"``) and sometimes a query
(``".jpg?1"``); ``postDataJSON`` escapes single quotes as ``\\'`` (not valid JSON, so the string is
decoded as a JavaScript literal first); current ``ext`` values are bare (``"jpeg"``).

One album costs one page request (or one API call), plus one hit.json request for a truncated
2018 page. Images are not fetched here: the build's image store fetches them later.

JSON can carry lone UTF-16 surrogates (``"\\ud83d"`` decodes to a str no encoder accepts); every
caption is repaired (a lone surrogate becomes U+FFFD, a split pair is joined) and the album
counts its repaired captions in ``captions_repaired``. Deeply nested JSON (``RecursionError``)
is ``bad_album_json`` like any other undecodable body.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from pipelines.crawl_state import CrawlState
from pipelines.web import HttpError, HttpResponse, PoliteClient, redact_url
from schemas.errors import MmlinksError
from schemas.text import repair_surrogates

PAGE_BASE = "https://imgur.com"
API_BASE = "https://api.imgur.com"
IMAGE_BASE = "https://i.imgur.com"
STATE_KIND = "album"

# Extensions and MIME types that mean a moving image: the paper drops GIFs and animations.
ANIMATED_EXTS = frozenset({"gif", "gifv", "mp4", "webm", "mov"})
_MIME_EXT = {
    "image/jpeg": "jpg",
    "image/jpg": "jpg",
    "image/png": "png",
    "image/gif": "gif",
    "image/webp": "webp",
    "image/avif": "avif",
    "image/heic": "heic",
    "video/mp4": "mp4",
    "video/webm": "webm",
    "video/quicktime": "mov",
}

# --------------------------------------------------------------------------------------------
# Album URLs

_HOSTS = frozenset(f"{sub}imgur.{tld}" for sub in ("", "www.", "m.", "i.") for tld in ("com", "io"))
_ID_RE = re.compile(r"[A-Za-z0-9]{7}|[A-Za-z0-9]{5}")


def parse_album_url(url: str) -> tuple[str, str] | None:
    """``(kind, album_id)`` for an imgur album or gallery URL, else None; kind is ``a`` or ``gallery``.

    Accepted, as found in Reddit submissions 2013-2024: ``http(s)://``, ``//`` or no scheme;
    hosts ``imgur.com``/``imgur.io`` with ``www.``, ``m.`` or ``i.``; paths ``/a/<id>``,
    ``/gallery/<id>`` and topic galleries ``/t/<tag>/<id>`` (``/topic/``); anything after the id
    (``/all``, ``/layout/blog``, ``/embed``, ``/zip``, ``?query``, ``#0``); and the 2023+ slugs
    ``/a/my-album-title-<id>`` where the id is the last dash-separated token. Ids are 5
    (to ~2015) or 7 alphanumerics. Gallery posts of albums share the album's id, so a gallery id
    is fetched as an album; a gallery of a single image then has no album (``album_not_found`` or
    no markup), which is the right outcome for a multi-image corpus. Single-image URLs
    (``imgur.com/<id>``, ``i.imgur.com/<id>.jpg``) are not albums: None.
    """
    url = (url or "").strip()
    if not url:
        return None
    if "://" not in url:
        url = "//" + url.lstrip("/")
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
    except ValueError:
        return None
    if parts.scheme not in ("", "http", "https") or host not in _HOSTS:
        return None
    segs = [s for s in parts.path.split("/") if s]
    if len(segs) >= 2 and segs[0].lower() in ("a", "gallery"):
        kind, token = ("a" if segs[0].lower() == "a" else "gallery"), segs[1]
    elif len(segs) >= 3 and segs[0].lower() in ("t", "topic"):
        kind, token = "gallery", segs[2]
    else:
        return None
    album_id = token.rsplit("-", 1)[-1]
    return (kind, album_id) if _ID_RE.fullmatch(album_id) else None


def album_id_from_url(url: str) -> str | None:
    """The album id in an imgur album/gallery URL (see ``parse_album_url``), else None."""
    parsed = parse_album_url(url)
    return parsed[1] if parsed else None


# --------------------------------------------------------------------------------------------
# Albums


@dataclass(frozen=True)
class AlbumImage:
    hash: str  # imgur image id
    ext: str  # lower case, no dot ("jpg", "png", "gif", ...)
    url: str  # what the image store fetches: {image_base}/{hash}.{ext} (not kept in records)
    caption: str | None  # whitespace-normalised description; None when empty
    animated: bool


@dataclass
class Album:
    album_id: str
    images: list[AlbumImage]
    source: str  # which parser produced it: html-2018 | html-json | api-v3
    # The count the page declared, when it declared one (2018 pages: "num_images").
    declared_count: int | None = None
    # False when the album holds fewer images than it has: a 2018 page whose remaining images
    # could not be fetched (or ``fetch_all=False``). Recorded so the user can tell.
    complete: bool = True
    skipped: int = 0  # entries without a usable image id (reported as dead letters)
    captions_repaired: int = 0  # captions whose lone UTF-16 surrogates became U+FFFD

    def to_record(self) -> dict:
        """The crawl-state record. Images keep hash and extension only, not URLs: the URL is
        built from the image base of the run that reads the record (``from_record``)."""
        return {
            "album_id": self.album_id,
            "images": [
                {"hash": im.hash, "ext": im.ext, "caption": im.caption, "animated": im.animated}
                for im in self.images
            ],
            "source": self.source,
            "declared_count": self.declared_count,
            "complete": self.complete,
            "skipped": self.skipped,
            "captions_repaired": self.captions_repaired,
        }

    @classmethod
    def from_record(cls, rec: dict, *, image_base: str = IMAGE_BASE) -> Album:
        """The album of a ``to_record`` record, image URLs under ``image_base``.

        KeyError/TypeError/ValueError for a record that does not fit (the caller scrapes again).
        """
        images = []
        for im in rec["images"]:
            image_hash, ext = im["hash"], _clean_ext(im["ext"])
            if not isinstance(image_hash, str) or not _VALID_HASH.fullmatch(image_hash) or ext is None:
                raise ValueError(f"bad image in album record: {image_hash!r}")
            caption = im.get("caption")
            if caption is not None and not isinstance(caption, str):
                raise TypeError("caption is not a string")
            url = _image_url(image_base, image_hash, ext)
            images.append(AlbumImage(image_hash, ext, url, caption, bool(im["animated"])))
        return cls(
            album_id=str(rec["album_id"]),
            images=images,
            source=str(rec["source"]),
            declared_count=rec.get("declared_count"),
            complete=bool(rec.get("complete", True)),
            skipped=int(rec.get("skipped", 0)),
            captions_repaired=int(rec.get("captions_repaired", 0)),
        )


class AlbumParseError(MmlinksError):
    """A response without an album: ``no_album_markup``, ``bad_album_json`` or ``album_not_found``."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class AlbumFailed(MmlinksError):
    """An album that could not be scraped. ``transient`` ones are retried by the next run.

    ``recorded``: the failure belongs to the album itself (gone, no markup, broken JSON) and is
    kept in the crawl state; permanent failures that depend on this run's settings (a refused
    host, a byte limit) are not, so a rerun with other settings tries again.
    """

    def __init__(self, reason: str, detail: str = "", *, transient: bool = False, recorded: bool = False):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.transient = transient
        self.recorded = recorded and not transient


def _caption(text: object) -> tuple[str | None, bool]:
    """(whitespace-normalised caption or None, whether lone surrogates were repaired)."""
    if not isinstance(text, str):
        return None, False
    text, replaced = repair_surrogates(text)
    text = " ".join(text.split())
    return text or None, replaced > 0


def _clean_ext(ext: object) -> str | None:
    if not isinstance(ext, str):
        return None
    ext = ext.strip().lstrip(".").split("?", 1)[0].split("#", 1)[0].lower()
    return ext if re.fullmatch(r"[a-z0-9]{1,5}", ext) else None


def _ext_from_url(url: object, image_hash: str) -> str | None:
    """The extension of an i.imgur.com URL for this image (thumbnail suffixes s/b/t/m/l/h allowed)."""
    if not isinstance(url, str) or not url:
        return None
    try:
        name = urlsplit(url).path.rsplit("/", 1)[-1]
    except ValueError:
        return None
    m = re.fullmatch(re.escape(image_hash) + r"[sbtmlh]?\.([A-Za-z0-9]{1,5})", name)
    return m.group(1).lower() if m else None


def _image_url(image_base: str, image_hash: str, ext: str) -> str:
    return f"{image_base.rstrip('/')}/{image_hash}.{ext}"


def _image(
    image_hash: str, ext: str | None, caption: object, animated: bool, image_base: str
) -> tuple[AlbumImage, bool]:
    """(the image, whether its caption had lone surrogates repaired)."""
    ext = ext or "jpg"
    text, repaired = _caption(caption)
    image = AlbumImage(
        hash=image_hash,
        ext=ext,
        url=_image_url(image_base, image_hash, ext),
        caption=text,
        animated=bool(animated) or ext in ANIMATED_EXTS,
    )
    return image, repaired


def _text(html: str | bytes) -> str:
    # Imgur pages are UTF-8; a stray byte costs one replacement character, not the album.
    return html.decode("utf-8", "replace") if isinstance(html, bytes) else html


_VALID_HASH = re.compile(r"[A-Za-z0-9]{5,10}")

# --------------------------------------------------------------------------------------------
# 2018 pages

_NUM_IMAGES_RE = re.compile(r'"?num_images"?\s*:\s*"?(\d+)')
_ALBUM_COUNT_RE = re.compile(r'"?album_images"?\s*:\s*\{\s*"?count"?\s*:\s*"?(\d+)')
_TRUNCATED_RE = re.compile(r"\b(?:js-post-truncated|post-loadall)\b")


def _declared_count_2018(text: str) -> int | None:
    counts = [int(m.group(1)) for rx in (_NUM_IMAGES_RE, _ALBUM_COUNT_RE) for m in rx.finditer(text)]
    return max(counts) if counts else None


def _has_container_class(value: object) -> bool:
    if value is None:
        return False
    classes = value if isinstance(value, (list, tuple)) else str(value).split()
    return "post-image-container" in classes


def parse_album_html_2018(html: str | bytes, *, album_id: str = "", image_base: str = IMAGE_BASE) -> Album:
    """Every ``div.post-image-container`` of a 2013-2018 album page, in page order.

    The container's ``id`` is the image hash. The extension comes from the container's own
    markup (``<img src>``, ``<a href>``, ``<source src>``, ``<meta itemprop=contentURL>``,
    ``data-ext``), ``jpg`` when it names none (the page served a placeholder until scrolled).
    Animated: a GIF/GIFV/MP4/WebM extension, a ``<video>`` element or ``itemtype`` VideoObject.
    The caption is the text of ``.post-image-description`` inside the container, ``<br>`` as a
    space and whitespace normalised; empty means no caption. Containers without an id are
    counted in ``skipped``. ``complete`` is False when the page declares more images than it
    inlines (``"num_images"``) or shows the "load more" marker.
    """
    from bs4 import BeautifulSoup, SoupStrainer

    text = _text(html)
    if "post-image-container" not in text:
        raise AlbumParseError("no_album_markup", "no div.post-image-container")
    # Only the containers are built into a tree (the page is mostly script and chrome). The
    # strainer sees the raw class string, so match one class among several by hand.
    strainer = SoupStrainer("div", attrs={"class": _has_container_class})
    soup = BeautifulSoup(text, "html.parser", parse_only=strainer)
    containers = soup.find_all("div", class_="post-image-container")
    if not containers:
        raise AlbumParseError("no_album_markup", "no div.post-image-container")
    images: list[AlbumImage] = []
    skipped = repaired = 0
    seen_nested: set[int] = set()
    for div in containers:
        if id(div) in seen_nested:
            continue
        for inner in div.find_all("div", class_="post-image-container"):
            seen_nested.add(id(inner))  # a malformed page nesting containers: the outer one counts
        image_hash = (div.get("id") or "").strip()
        if not _VALID_HASH.fullmatch(image_hash):
            skipped += 1
            continue
        ext = _clean_ext(div.get("data-ext"))
        urls = [
            el.get(attr)
            for el, attr in (
                *((el, "src") for el in div.find_all(["img", "source", "video"])),
                *((el, "href") for el in div.find_all("a")),
                *((el, "content") for el in div.find_all("meta")),
            )
        ]
        url_exts = [e for e in (_ext_from_url(u, image_hash) for u in urls) if e]
        ext = ext or (url_exts[0] if url_exts else None)
        itemtype = str(div.get("itemtype") or "")
        animated = (
            "VideoObject" in itemtype
            or div.find("video") is not None
            or any(e in ANIMATED_EXTS for e in url_exts)
        )
        desc = div.find(class_="post-image-description")
        caption = None
        if desc is not None:
            for br in desc.find_all("br"):
                br.replace_with(" ")
            caption = desc.get_text()
        image, fixed = _image(image_hash, ext, caption, animated, image_base)
        images.append(image)
        repaired += fixed
    declared = _declared_count_2018(text)
    truncated = bool(_TRUNCATED_RE.search(text)) or (declared is not None and declared > len(images))
    return Album(
        album_id,
        images,
        "html-2018",
        declared_count=declared,
        complete=not truncated,
        skipped=skipped,
        captions_repaired=repaired,
    )


def parse_album_hit_json(body: str | bytes, *, album_id: str = "", image_base: str = IMAGE_BASE) -> Album:
    """The 2018 "load more" endpoint ``/ajaxalbums/getimages/<id>/hit.json``.

    ``{"data": {"count": N, "images": [{"hash", "ext": ".jpg", "description", "animated",
    "title", ...}]}, "success": true, "status": 200}``; an unknown album answered
    ``{"data": [], ...}``, which becomes ``album_not_found``.
    """
    try:
        payload = json.loads(_text(body))
    except RecursionError:  # nesting deeper than the interpreter's stack
        raise AlbumParseError("bad_album_json", "hit.json: nested too deeply") from None
    except ValueError as exc:
        raise AlbumParseError("bad_album_json", f"hit.json: {exc}") from None
    data = payload.get("data") if isinstance(payload, dict) else None
    if data == []:
        raise AlbumParseError("album_not_found", "hit.json: empty data")
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise AlbumParseError("bad_album_json", "hit.json: no data.images list")
    images, skipped, repaired = [], 0, 0
    for item in data["images"]:
        image_hash = item.get("hash") if isinstance(item, dict) else None
        if not isinstance(image_hash, str) or not _VALID_HASH.fullmatch(image_hash):
            skipped += 1
            continue
        ext = _clean_ext(item.get("ext"))
        animated = bool(item.get("animated")) or bool(item.get("prefer_video"))
        image, fixed = _image(image_hash, ext, item.get("description"), animated, image_base)
        images.append(image)
        repaired += fixed
    count = data.get("count")
    declared = count if isinstance(count, int) and not isinstance(count, bool) else None
    return Album(
        album_id, images, "html-2018", declared_count=declared, skipped=skipped, captions_repaired=repaired
    )


# --------------------------------------------------------------------------------------------
# Current pages: window.postDataJSON="..."


class JsStringError(ValueError):
    pass


_JS_SIMPLE = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f", "v": "\v"}
_JS_ESCAPE_RE = re.compile(
    r"\\(u\{[0-9A-Fa-f]{1,6}\}|u[0-9A-Fa-f]{4}|x[0-9A-Fa-f]{2}|0(?![0-9])|\r\n|[\s\S])"
)


def _js_escape(m: re.Match) -> str:
    esc = m.group(1)
    head = esc[0]
    if head == "u" and len(esc) > 1:
        code = int(esc[2:-1] if esc[1] == "{" else esc[1:], 16)
        if code > 0x10FFFF:
            raise JsStringError(f"code point out of range: \\{esc}")
        return chr(code)
    if head == "x" and len(esc) == 3:
        return chr(int(esc[1:], 16))
    if head in "ux":
        raise JsStringError(f"malformed escape \\{esc}")
    if esc == "0":
        return "\0"
    if esc in ("\r\n", "\n", "\r", "\u2028", "\u2029"):
        return ""  # line continuation
    return _JS_SIMPLE.get(esc, esc)  # \" \' \\ \/ and any other identity escape


def decode_js_string(body: str, *, repair: bool = True) -> str:
    """The value of a JavaScript string literal's body (without its quotes).

    Handles ``\\n``-style escapes, ``\\xHH``, ``\\uHHHH`` (surrogate pairs joined), ``\\u{H..}``,
    line continuations and identity escapes such as ``\\'``, which JSON would reject. With
    ``repair`` a lone surrogate becomes U+FFFD; without, surrogates are left as decoded (the
    album parser repairs and counts them caption by caption).
    """
    if re.search(r"(?<!\\)(?:\\\\)*\\\Z", body):
        raise JsStringError("dangling backslash")
    out = _JS_ESCAPE_RE.sub(_js_escape, body)
    return repair_surrogates(out)[0] if repair else out


_POSTDATA_RE = re.compile(r"""window\.postDataJSON\s*=\s*(["'])""")
# The body of a string literal up to its closing quote (unrolled: linear, no backtracking).
_LITERAL_BODY = {q: re.compile(rf"[^{q}\\]*(?:\\[\s\S][^{q}\\]*)*") for q in "\"'"}


def _postdata_literal(text: str) -> str:
    m = _POSTDATA_RE.search(text)
    if m is None:
        raise AlbumParseError("no_album_markup", "no window.postDataJSON")
    stop = _LITERAL_BODY[m.group(1)].match(text, m.end()).end()
    if stop >= len(text) or text[stop] != m.group(1):
        raise AlbumParseError("bad_album_json", "window.postDataJSON string is not terminated")
    return text[m.end() : stop]


def parse_album_html_json(html: str | bytes, *, album_id: str = "", image_base: str = IMAGE_BASE) -> Album:
    """The ``media`` list of a current page's ``window.postDataJSON="..."``.

    The value is a JavaScript string literal holding JSON: it is decoded as JavaScript (imgur
    escapes ``'`` as ``\\'``) and then parsed as JSON. Each medium: ``id``, ``ext`` (bare,
    e.g. ``jpeg``), ``url``, ``type`` (``image``/``video``), ``mime_type`` and ``metadata``
    (``description``, ``is_animated``). Animated: ``is_animated``, a video type/MIME or a
    GIF/MP4 extension. The album's own ``image_count`` is not trusted (it can be 0 above a
    full list), so ``declared_count`` stays None.
    """
    text = _text(html)
    literal = _postdata_literal(text)
    try:
        payload = json.loads(decode_js_string(literal, repair=False))
    except RecursionError:  # nesting deeper than the interpreter's stack
        raise AlbumParseError("bad_album_json", "postDataJSON: nested too deeply") from None
    except (JsStringError, ValueError) as exc:
        raise AlbumParseError("bad_album_json", f"postDataJSON: {exc}") from None
    media = payload.get("media") if isinstance(payload, dict) else None
    if not isinstance(media, list):
        raise AlbumParseError("bad_album_json", "postDataJSON has no media list")
    images, skipped, repaired = [], 0, 0
    for item in media:
        image_hash = item.get("id") if isinstance(item, dict) else None
        if not isinstance(image_hash, str) or not _VALID_HASH.fullmatch(image_hash):
            skipped += 1
            continue
        meta = item.get("metadata") if isinstance(item.get("metadata"), dict) else {}
        mime = str(item.get("mime_type") or "").lower()
        ext = _clean_ext(item.get("ext")) or _ext_from_url(item.get("url"), image_hash) or _MIME_EXT.get(mime)
        animated = (
            bool(meta.get("is_animated"))
            or item.get("type") == "video"
            or mime.startswith("video/")
            or mime == "image/gif"
        )
        image, fixed = _image(image_hash, ext, meta.get("description"), animated, image_base)
        images.append(image)
        repaired += fixed
    album_id = album_id or repair_surrogates(str(payload.get("id") or ""))[0]
    return Album(album_id, images, "html-json", skipped=skipped, captions_repaired=repaired)


# --------------------------------------------------------------------------------------------
# API v3


def parse_album_api_v3(
    body: str | bytes | dict, *, album_id: str = "", image_base: str = IMAGE_BASE
) -> Album:
    """``GET /3/album/{id}/images``: ``{"data": [image, ...], "success": true, "status": 200}``.

    Image fields used: ``id``, ``link`` (its extension), ``type`` (MIME, the fallback for the
    extension), ``description``, ``animated``. A body with ``success: false`` and status 404 is
    ``album_not_found``; any other shape is ``bad_album_json``.
    """
    if isinstance(body, dict):
        payload = body
    else:
        try:
            payload = json.loads(_text(body))
        except RecursionError:  # nesting deeper than the interpreter's stack
            raise AlbumParseError("bad_album_json", "API v3: nested too deeply") from None
        except ValueError as exc:
            raise AlbumParseError("bad_album_json", f"API v3: {exc}") from None
    if not isinstance(payload, dict):
        raise AlbumParseError("bad_album_json", "API v3: not an object")
    if payload.get("success") is False:
        if payload.get("status") == 404:
            raise AlbumParseError("album_not_found", "API v3: status 404")
        raise AlbumParseError("bad_album_json", f"API v3: success false, status {payload.get('status')}")
    data = payload.get("data")
    if not isinstance(data, list):
        raise AlbumParseError("bad_album_json", "API v3: data is not a list")
    images, skipped, repaired = [], 0, 0
    for item in data:
        image_hash = item.get("id") if isinstance(item, dict) else None
        if not isinstance(image_hash, str) or not _VALID_HASH.fullmatch(image_hash):
            skipped += 1
            continue
        mime = str(item.get("type") or "").lower()
        ext = _ext_from_url(item.get("link"), image_hash) or _MIME_EXT.get(mime)
        animated = bool(item.get("animated")) or mime.startswith("video/") or mime == "image/gif"
        image, fixed = _image(image_hash, ext, item.get("description"), animated, image_base)
        images.append(image)
        repaired += fixed
    return Album(album_id, images, "api-v3", skipped=skipped, captions_repaired=repaired)


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

    With ``client_id`` (env ``IMGUR_CLIENT_ID``) it calls API v3 (header
    ``Authorization: Client-ID <id>``); otherwise it fetches ``{page_base}/a/{id}`` and tries the
    2018 parser, then the embedded-JSON parser. A truncated 2018 page is completed from
    ``{page_base}/ajaxalbums/getimages/{id}/hit.json?all=true`` unless ``fetch_all`` is False
    (the paper's scraper read only the page, so it saw only the inlined images).

    Failures (``AlbumFailed``): 404/410 -> ``album_not_found``; a page without either markup ->
    ``no_album_markup``; undecodable embedded JSON -> ``bad_album_json`` (all three recorded);
    401/403/408/429/5xx and the client's transient errors -> transient, not recorded, retried by
    the next run; the client's policy refusals (``refused_host``, ``too_large``, ...) ->
    permanent, not recorded. Thread-safe as far as the client is: one scraper may serve a pool.
    Recorded failures are final for later runs too; to try them again, delete the crawl state's
    ``items/album`` folder (or the one record).

    Records are keyed by route and base as well as album id (``state_key``:
    ``page|<page_base>|<id>`` or ``api|<api_base>|<id>``), so an answer from live imgur (say
    ``album_not_found``) is not reused when ``page_base`` points at a web archive, nor a page
    answer when the API is used. Records keep image hash and extension, not URLs: image URLs
    are built from this scraper's ``image_base`` when a record is read. Records from before
    this keying (album id alone) are not found under the new keys: those albums are scraped
    again (the HTTP cache, keyed by the full URL, may still answer them).

    Base URLs must not carry user info (``user:token@host``): credentials come from the
    environment (``client_id``), and bases end up in keys, records and messages.
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


__all__ = [
    "API_BASE",
    "IMAGE_BASE",
    "PAGE_BASE",
    "Album",
    "AlbumFailed",
    "AlbumImage",
    "AlbumParseError",
    "AlbumScraper",
    "album_id_from_url",
    "decode_js_string",
    "parse_album_api_v3",
    "parse_album_hit_json",
    "parse_album_html_2018",
    "parse_album_html_json",
    "parse_album_url",
]
