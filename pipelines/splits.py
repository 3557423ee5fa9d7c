"""Deterministic train/val/test assignment from the document id alone.

A hash of ``doc_id`` (not a random draw, not the position in the input) decides the split, so a
document keeps its split across rebuilds, reorderings and added documents.
"""

from __future__ import annotations

import hashlib

from schemas.errors import MmlinksError

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


def split_rank_key(doc_id: str) -> tuple[float, str]:
    """The order in which fixed-size splits take documents: by hash, so it is content-free."""
    return unit_hash(doc_id, "split:"), doc_id


def sized_assignment(ranked_ids: list[str], sizes: dict[str, int]) -> dict[str, str]:
    """Fixed-size splits: the first ``sizes[...]`` documents in hash order go to each named split.

    ``ranked_ids`` are the lowest-ranked document ids (see ``split_rank_key``), at least
    ``sum(sizes.values())`` of them when the corpus has that many. Splits are filled in the order
    test, val, then the others by name; documents not listed here go to ``train``. For the same
    inputs the assignment is identical on every rebuild; adding documents can move a document
    whose rank falls behind the new ones, which ratio splits (``assign_split``) never do.
    """
    if any(n < 0 for n in sizes.values()):
        raise ValueError(f"split sizes must be non-negative: {sizes}")
    order = [s for s in ("test", "val") if s in sizes] + sorted(set(sizes) - {"test", "val"})
    out: dict[str, str] = {}
    pos = 0
    for name in order:
        for doc_id in ranked_ids[pos : pos + sizes[name]]:
            out[doc_id] = name
        pos += sizes[name]
    return out


def parse_split_sizes(text: str) -> dict[str, int]:
    """``val=500,test=1000`` -> ``{"val": 500, "test": 1000}`` (the ``--split-sizes`` flags)."""
    sizes = {}
    for item in str(text).split(","):
        key, sep, value = item.partition("=")
        try:
            sizes[key.strip()] = int(value)
        except ValueError:
            sep = ""
        if not sep or not key.strip() or sizes[key.strip()] < 0:
            raise MmlinksError(f"--split-sizes wants counts like val=500,test=1000, not {text!r}")
    return sizes
