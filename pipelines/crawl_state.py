"""Checkpointed crawl progress, so an interrupted crawl resumes without refetching or duplicates.

Item records (``items/<kind>/<h[:2]>/<h>.json``: a finished item's result or permanent failure;
transient failures are never recorded) and cursors (``cursors/<name>.json``, replaced atomically).
Why canonical JSON through a rename: two workers finishing the same item write the same bytes and
a reader never sees half a record."""

from __future__ import annotations

import hashlib
import json
import re

from pipelines import fileio
from schemas.errors import MmlinksError

_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


def _canonical(record: dict) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class CrawlState:
    def __init__(self, root: str):
        self.root = str(root)

    def __repr__(self) -> str:
        return f"CrawlState({self.root!r})"

    def _item_uri(self, kind: str, key: str) -> str:
        if not _NAME_RE.match(kind):
            raise MmlinksError(f"crawl-state kind must be a plain name, not {kind!r}")
        h = hashlib.sha256(key.encode()).hexdigest()
        return fileio.join(self.root, "items", kind, h[:2], f"{h}.json")

    def get(self, kind: str, key: str) -> dict | None:
        """The finished item's record, or None when it has not finished (or the record is bad)."""
        uri = self._item_uri(kind, key)
        try:
            data = fileio.read_bytes(uri)
        except FileNotFoundError:
            return None
        except OSError:
            return None  # unreadable: treat as unfinished, the item is fetched again
        try:
            record = json.loads(data)
        except ValueError:
            return None
        if not isinstance(record, dict) or record.get("_key") != key:
            return None  # a torn or foreign record: refetch rather than trust it
        record.pop("_key")
        return record

    def put(self, kind: str, key: str, record: dict) -> None:
        fileio.write_bytes_atomic(self._item_uri(kind, key), _canonical({**record, "_key": key}))

    def done(self, kind: str, key: str) -> bool:
        return self.get(kind, key) is not None

    def _cursor_uri(self, name: str) -> str:
        if not _NAME_RE.match(name):
            raise MmlinksError(f"cursor name must be a plain name, not {name!r}")
        return fileio.join(self.root, "cursors", f"{name}.json")

    def cursor(self, name: str) -> dict | None:
        try:
            return json.loads(fileio.read_bytes(self._cursor_uri(name)))
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise MmlinksError(f"crawl cursor {self._cursor_uri(name)} is corrupt: {exc}") from exc

    def set_cursor(self, name: str, value: dict) -> None:
        fileio.write_bytes_atomic(self._cursor_uri(name), _canonical(value))
