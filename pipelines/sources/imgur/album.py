"""Imgur's hosts and album URLs, the parsed :class:`Album`, and the helpers every parser shares
(captions repaired and whitespace-normalised, image URLs from hashes and extensions).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

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
