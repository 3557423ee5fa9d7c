"""A content-addressed image store with fetching, so a rebuild never fetches or decodes twice
(what it rejects and retries: docs/design.md, "Validate").

``blobs/`` (bytes), ``info/`` (decode facts) and ``uris/`` (source uri -> content id) under
``root``; records hold facts, so cheap policy (placeholders, blanks) is re-applied on load. Why
canonical JSON through a rename, blob -> info -> uri: concurrent workers write identical bytes and
a uri record implies its info and blob. A damaged blob is fetched again rather than blamed on an
intact source (``DamagedBlobError`` when it cannot be)."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from features.images import InvalidImage, inspect_image
from pipelines import fault_hooks, fileio
from pipelines.image_fetch import (
    Fetcher,
    default_fetcher,
)
from schemas.errors import MmlinksError

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 32 * 1024 * 1024
REMOVED_SUFFIX = "/removed.png"  # imgur serves this placeholder (via a redirect) for deleted images
GIF_MAGIC = (b"GIF87a", b"GIF89a")
_CID_RE = re.compile(r"^[0-9a-f]{64}$")

# Reasons raised here in addition to those of features.images (undecodable, animated, ...) and
# of the fetchers (pipelines.image_fetch: too_large, fetch_failed, not_found).
GIF, PLACEHOLDER, BLANK = "gif", "placeholder", "blank"


class DamagedBlobError(OSError):
    """A stored blob whose bytes are not the ones its name (their sha256) says, and which could not
    be fetched again from its source. It names the blob, not the source (which may be intact)."""


def _hamming(a: int, b: int) -> int:
    return (a ^ b).bit_count()


def is_blank_phash(phash: int) -> bool:
    """A degenerate 64-bit phash (<= 8 or >= 56 bits set): a flat or near-flat image."""
    return not 8 < phash.bit_count() < 56


@dataclass(frozen=True)
class Placeholders:
    """Known placeholder images ("this image was removed"), by exact bytes or perceptual hash."""

    sha256s: frozenset[str] = frozenset()
    phashes: frozenset[int] = frozenset()
    max_distance: int = 0  # Hamming distance on the 64-bit phash

    def __post_init__(self):
        object.__setattr__(self, "sha256s", frozenset(self.sha256s))
        object.__setattr__(self, "phashes", frozenset(int(p) for p in self.phashes))

    @classmethod
    def from_images(cls, images: Iterable[bytes], max_distance: int = 0) -> Placeholders:
        shas, phashes = set(), set()
        for data in images:
            info, _ = inspect_image(data)
            shas.add(info.content_id)
            phashes.add(info.phash)
        return cls(frozenset(shas), frozenset(phashes), max_distance)

    @classmethod
    def from_dir(cls, path: str, max_distance: int = 0) -> Placeholders:
        """Every file below ``path`` (local or a FileSystems URI) is an example placeholder image."""
        files = fileio.list_files(path)
        if not files:
            raise MmlinksError(f"no placeholder images found under {path}")
        images = []
        for f in files:
            data = fileio.read_bytes(f)
            try:
                inspect_image(data)
            except InvalidImage as exc:
                raise MmlinksError(f"placeholder example {f} is not a usable image: {exc}") from exc
            images.append(data)
        return cls.from_images(images, max_distance)

    def match(self, content_id: str, phash: int | None) -> str | None:
        """A short description of the match, or None."""
        if content_id in self.sha256s:
            return f"sha256 {content_id[:12]} is a known placeholder"
        if phash is not None:
            for p in self.phashes:
                if _hamming(p, phash) <= self.max_distance:
                    return f"phash {phash:016x} within {self.max_distance} of placeholder {p:016x}"
        return None

    def __bool__(self) -> bool:
        return bool(self.sha256s or self.phashes)


@dataclass(frozen=True)
class StoredImage:
    uri: str
    content_id: str  # sha256 of the bytes
    width: int
    height: int
    phash: int
    cached: bool  # True: nothing was fetched or decoded for this load
    final_uri: str | None = None
    store: ImageStore | None = field(default=None, repr=False, compare=False)
    data: bytes | None = field(default=None, repr=False, compare=False)  # set when just fetched

    def read_bytes(self) -> bytes:
        """The image bytes: kept from the fetch, or read from the store's blob."""
        if self.data is not None:
            return self.data
        if self.store is None:
            raise MmlinksError(f"no bytes or store for {self.content_id}")
        return self.store.get_bytes(self.content_id)

    def to_record(self) -> dict:
        """The image entry the validate stage emits (content_id, uri, width, height, phash)."""
        return {
            "content_id": self.content_id,
            "uri": self.uri,
            "width": self.width,
            "height": self.height,
            "phash": self.phash,
        }


def _canonical(record: dict) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def _sha256(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def _reject(reason: str, detail: str, cached: bool) -> InvalidImage:
    exc = InvalidImage(reason, detail)
    exc.cached = cached  # type: ignore[attr-defined]
    return exc


class ImageStore:
    """``load(uri)`` fetches, decodes and stores an image once; later loads read two small records.

    Safe to share between threads and between workers on a shared root. Picklable (only the root
    and settings travel; fetchers are created again on the worker).
    """

    def __init__(
        self,
        root: str,
        *,
        placeholders: Placeholders | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        fetcher: Fetcher | None = None,
    ):
        self.root = fileio.normalize(str(root))
        self.placeholders = placeholders or Placeholders()
        self.max_bytes = max_bytes
        self.fetcher = fetcher
        self._defaults: dict[str, Fetcher] = {}

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_defaults"] = {}
        return state

    def __repr__(self) -> str:
        return f"ImageStore({self.root!r})"

    # ---- layout
    def blob_uri(self, content_id: str) -> str:
        return fileio.join(self.root, "blobs", content_id[:2], content_id)

    def info_uri(self, content_id: str) -> str:
        return fileio.join(self.root, "info", content_id[:2], f"{content_id}.json")

    def uri_record_uri(self, uri: str) -> str:
        h = _sha256(uri)
        return fileio.join(self.root, "uris", h[:2], f"{h}.json")

    # ---- records
    def _read_json(self, uri: str) -> dict | None:
        try:
            return json.loads(fileio.read_bytes(uri))
        except FileNotFoundError:
            return None
        except json.JSONDecodeError:
            log.warning("ignoring corrupt store record %s", uri)
            return None
        except OSError:
            if not fileio.exists(uri):
                return None
            raise

    def lookup(self, uri: str) -> dict | None:
        """The stored record for a source URI, or None if it was never (permanently) resolved."""
        return self._read_json(self.uri_record_uri(uri))

    def info(self, content_id: str) -> dict | None:
        """The stored decode facts or decode rejection for a content id, or None."""
        return self._read_json(self.info_uri(content_id))

    def contains(self, content_id: str) -> bool:
        return fileio.exists(self.blob_uri(content_id))

    def get_bytes(self, content_id: str) -> bytes:
        """The stored bytes of an image, checked against their content id; KeyError if the store
        does not have them. Damaged bytes are fetched again from the image's source (``repair``)."""
        if not _CID_RE.match(content_id):
            raise KeyError(f"not a sha256 content id: {content_id!r}")
        try:
            data = fileio.read_bytes(self.blob_uri(content_id))
        except FileNotFoundError:
            raise KeyError(f"image {content_id} is not in {self.root}") from None
        if _sha256(data) == content_id:
            return data
        return self.repair(content_id, f"its sha256 is {_sha256(data)[:12]}")

    def repair(self, content_id: str, why: str) -> bytes:
        """Fetch a damaged blob's image again from the source its info record names and rewrite
        the blob; its bytes. ``DamagedBlobError`` (naming the blob) when there is no source on
        record (stores written before sources were recorded), the fetch fails, or the source now
        holds other bytes."""
        blob = self.blob_uri(content_id)
        info = self.info(content_id) or {}
        source = info.get("source")
        if not source:
            raise DamagedBlobError(
                f"stored image blob {blob} is damaged ({why}) and its info record names no source to "
                "fetch it from again; delete the blob and its info record, then rebuild"
            )
        try:
            got = self._fetcher_for(source).fetch(source, self.max_bytes)
        except InvalidImage as exc:
            raise DamagedBlobError(
                f"stored image blob {blob} is damaged ({why}) and fetching it again from {source} "
                f"failed ({exc.reason}: {exc.detail})"
            ) from None
        if _sha256(got.data) != content_id:
            raise DamagedBlobError(
                f"stored image blob {blob} is damaged ({why}) and its source {source} now holds other "
                "bytes; delete the blob and its info record, then rebuild"
            )
        fileio.write_bytes_atomic(blob, got.data)
        log.warning("stored image blob %s was damaged (%s): fetched again from %s", blob, why, source)
        return got.data

    # ---- the key operation
    def _fetcher_for(self, uri: str) -> Fetcher:
        if self.fetcher is not None:
            return self.fetcher
        kind = "http" if urlsplit(uri).scheme.lower() in ("http", "https") else "fs"
        if kind not in self._defaults:
            self._defaults[kind] = default_fetcher(uri)
        return self._defaults[kind]

    def load(self, uri: str, fetcher: Fetcher | None = None) -> StoredImage:
        """The image at ``uri`` (fetched, decoded and stored once), or InvalidImage(reason, detail).

        Raised InvalidImage carries ``cached`` (True when it came from a stored record). Reasons:
        fetch ``not_found``/``too_large``/``fetch_failed``/``placeholder`` (redirect to
        removed.png), content ``gif``/``undecodable``/``animated``/``too_small``/
        ``too_many_pixels``/``empty_image``, policy ``placeholder`` (hash match)/``blank``.
        """
        fetcher = fetcher or self._fetcher_for(uri)
        stamp_of = getattr(fetcher, "stamp", None)
        stamp = stamp_of(uri) if stamp_of else None
        rec = self.lookup(uri)
        if rec is not None and rec.get("stamp") != stamp:
            rec = None  # the file changed since it was stored
        if rec is not None:
            if "rejected" in rec:
                raise _reject(rec["rejected"], rec.get("detail", ""), cached=True)
            info = self.info(rec["content_id"])
            if info is not None:
                return self._accept(uri, info, cached=True, final_uri=rec.get("final_uri"))
            log.warning("store record for %s has no info for %s: fetching again", uri, rec["content_id"])

        try:
            got = fetcher.fetch(uri, self.max_bytes)
        except InvalidImage as exc:
            if not getattr(exc, "transient", False):
                self._write_uri_rejection(uri, exc.reason, exc.detail, stamp)
            exc.cached = False  # type: ignore[attr-defined]
            raise
        if urlsplit(got.final_uri).path.endswith(REMOVED_SUFFIX):
            detail = f"redirected to {got.final_uri}" if got.final_uri != uri else got.final_uri
            self._write_uri_rejection(uri, PLACEHOLDER, detail, stamp)
            raise _reject(PLACEHOLDER, detail, cached=False)

        cid = _sha256(got.data)
        info = self.info(cid)
        if info is None:
            info = self._decode_and_store(cid, got.data, uri)
        record = {"uri": uri, "content_id": cid, "final_uri": got.final_uri}
        if stamp is not None:
            record["stamp"] = stamp
        fileio.write_bytes_atomic(self.uri_record_uri(uri), _canonical(record))
        fault_hooks.reached("fetch")
        return self._accept(uri, info, cached=False, final_uri=got.final_uri, data=got.data)

    def _decode_and_store(self, cid: str, data: bytes, source: str) -> dict:
        try:
            if data[:6] in GIF_MAGIC:
                raise InvalidImage(GIF, "GIF images are dropped")
            meta, _ = inspect_image(data)
        except InvalidImage as exc:
            info = {"content_id": cid, "rejected": exc.reason, "detail": exc.detail[:500]}
        else:
            # the source: where a damaged blob is fetched from again (``repair``)
            info = {"content_id": cid, "width": meta.width, "height": meta.height, "phash": meta.phash}
            info["source"] = source
            if not self.contains(cid):
                fileio.write_bytes_atomic(self.blob_uri(cid), data)
        fileio.write_bytes_atomic(self.info_uri(cid), _canonical(info))
        return info

    def _write_uri_rejection(self, uri: str, reason: str, detail: str, stamp: str | None = None) -> None:
        record = {"uri": uri, "rejected": reason, "detail": detail[:500]}
        if stamp is not None:
            record["stamp"] = stamp
        fileio.write_bytes_atomic(self.uri_record_uri(uri), _canonical(record))

    def _accept(self, uri: str, info: dict, *, cached: bool, final_uri=None, data=None) -> StoredImage:
        cid = info["content_id"]
        if "rejected" in info:
            raise _reject(info["rejected"], info.get("detail", ""), cached=cached)
        phash = int(info["phash"])
        why = self.placeholders.match(cid, phash)
        if why:
            raise _reject(PLACEHOLDER, why, cached=cached)
        if is_blank_phash(phash):
            raise _reject(BLANK, f"degenerate phash {phash:016x}", cached=cached)
        return StoredImage(
            uri=uri,
            content_id=cid,
            width=int(info["width"]),
            height=int(info["height"]),
            phash=phash,
            cached=cached,
            final_uri=final_uri,
            store=self,
            data=data,
        )
