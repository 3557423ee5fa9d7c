"""Per-image feature cache next to the image store, so a rebuild never runs the CNN twice.

Keyed by extractor, weights version, device kind, shape options and content id; entries are
``.npz`` files written atomically, a corrupt one a miss. Why a build treats its own entries
(``written_by``) as misses: the look-up is then a function of the cache as the build started, so a
Dask re-run of a lost look-up task splits hits and misses the same way (issue #35's CI failure
lost a document otherwise)."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile

import numpy as np

from features import ImageFeatures
from pipelines import fileio


def cache_key(extractor_name: str, version: str, device: str, options: dict | None = None) -> str:
    """Folder name for one (extractor, weights, device kind, output-shaping options) combination."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    shaping = {k: v for k, v in sorted((options or {}).items()) if k not in ("weights", "precision")}
    digest = hashlib.sha256(json.dumps(shaping, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{extractor_name}@{version}@{kind}@{digest}"


def encode(feats: ImageFeatures, written_by: str | None = None) -> bytes:
    arrays: dict[str, np.ndarray] = {}
    if written_by is not None:
        arrays["written_by"] = np.asarray(written_by, dtype=np.str_)
    if feats.features is not None:
        arrays["features"] = np.asarray(feats.features)
    if feats.regions is not None:
        r = feats.regions
        arrays["boxes"] = np.asarray(r["boxes"], np.float32).reshape(-1, 4)
        arrays["vectors"] = np.asarray(r["vectors"])
        arrays["labels"] = np.asarray(list(r["labels"]), dtype=np.str_)
        arrays["scores"] = np.asarray(r["scores"], np.float32)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def written_by(data: bytes) -> str | None:
    """The build that wrote an encoded entry (None for entries written without one)."""
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return str(z["written_by"]) if "written_by" in z.files else None


def decode(data: bytes) -> ImageFeatures:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        features = z["features"] if "features" in z.files else None
        regions = None
        if "boxes" in z.files:
            regions = {
                "boxes": z["boxes"],
                "vectors": z["vectors"],
                "labels": [str(s) for s in z["labels"]],
                "scores": z["scores"],
            }
    return ImageFeatures(features=features, regions=regions)


class FeatureCache:
    def __init__(self, store_root: str, key: str):
        self.root = fileio.join(store_root, "features", key)

    def _uri(self, content_id: str) -> str:
        return fileio.join(self.root, content_id[:2], f"{content_id}.npz")

    def get(self, content_id: str, unless_written_by: str | None = None) -> ImageFeatures | None:
        """The cached features, or None: no entry, a torn or foreign one, or one that the build
        ``unless_written_by`` wrote itself (module docstring)."""
        uri = self._uri(content_id)
        if not fileio.exists(uri):
            return None
        try:
            data = fileio.read_bytes(uri)
            if unless_written_by is not None and written_by(data) == unless_written_by:
                return None
            return decode(data)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile):
            return None  # a torn or foreign file: recompute and overwrite

    def put(self, content_id: str, feats: ImageFeatures, written_by: str | None = None) -> None:
        fileio.write_bytes_atomic(self._uri(content_id), encode(feats, written_by))
