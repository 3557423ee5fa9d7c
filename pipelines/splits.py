"""Deterministic train/val/test assignment from the document id alone.

A hash of ``doc_id`` (not a random draw, not the position in the input) decides the split, so a
document keeps its split across rebuilds, reorderings and added documents.
"""

from __future__ import annotations

import hashlib

DEFAULT_RATIOS = {"train": 0.8, "val": 0.1, "test": 0.1}


def unit_hash(key: str, salt: str = "") -> float:
    digest = hashlib.sha256(f"{salt}{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_split(doc_id: str, ratios: dict[str, float] = DEFAULT_RATIOS) -> str:
    total = sum(ratios.values())
    if total <= 0 or any(v < 0 for v in ratios.values()):
        raise ValueError(f"split ratios must be non-negative and sum > 0: {ratios}")
    u = unit_hash(doc_id, "split:") * total
    acc = 0.0
    known = [n for n in ("train", "val", "test") if n in ratios]
    for name in known + sorted(set(ratios) - set(known)):
        acc += ratios[name]
        if u < acc:
            return name
    return name  # float rounding at the top edge


def shard_index(doc_id: str, num_shards: int) -> int:
    return int(unit_hash(doc_id, "shard:") * num_shards)
