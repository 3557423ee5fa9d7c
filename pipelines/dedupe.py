"""Exact near-duplicate image removal (Hessel et al. 2019): drop documents sharing a near-identical image.

The paper's rule: two images are duplicates when the Hamming distance of their 64-bit DCT perceptual
hashes (``features.images.phash64``) is at most 3; a document containing a duplicate is removed.
All-pairs comparison is quadratic, and a lossy index (LSH, sampling) would silently keep duplicates,
so this module uses the pigeonhole / multi-index idea, which is exact and near-linear:

* Split the 64 bits into ``threshold + 1`` contiguous blocks. Two hashes within distance ``t`` differ
  in at most ``t`` bits, so they agree exactly on at least one block.
* Candidates are hashes sharing ``(block index, block value)``; each candidate is verified with
  ``popcount(a ^ b)``. A pair is reported only from the LOWEST block on which it agrees, so it comes
  out exactly once without a global dedupe.
* Two levels: a block group of ``s`` hashes costs ``s * (s - 1) / 2`` comparisons, and with 16-bit
  blocks (t=3) random hashes make groups of ``n / 65536``, so one level alone grows as ``n**2``. Two
  hashes of one block group also differ in at most ``t`` of the other ``64 - width`` bits, so they
  agree on one of ``t + 1`` sub-blocks of those bits: a group of ``TWO_LEVEL_MIN_GROUP`` or more is
  split by the compound key (block value, sub-block value), ~28 bits for t=3, whose groups are tiny.
  Each pair is reported from its lowest agreeing (block, sub-block). Smaller groups are compared
  directly, because the second level (``t + 1`` near-sorted argsorts of the group per block, ~100-200
  ns a hash per block) costs more than ``s / 2`` comparisons at ~1 ns until ``s`` is in the hundreds.
  Measured at t=3: random hashes, 1M (groups ~15): 0.13 s direct, 0.40 s with two levels everywhere;
  16M (groups ~244): about even (10-13 s); 1M hashes crowding 4096 block values (groups ~244): 5.1 s
  direct, 1.1 s two-level. So the direct scan's cost per hash is capped near ``TWO_LEVEL_MIN_GROUP / 2``
  comparisons a block, and beyond it cost grows as n log(group size), not n**2.
* Identical hashes are collapsed first (they are pairs of each other), so repeats cost one sort.

Degenerate hashes (near-flat images: phash thresholds at the median, so real hashes have ~32 set
bits, while a blank image has ~0) would all agree on every block and form giant groups; they are
skipped (counted) instead: blank images are not evidence of duplicated content.

``near_duplicate_pairs`` is the pure-NumPy core; ``FindDuplicateDocuments`` is the Beam transform
that applies it at document level, one (block index, block value) group at a time. The module is
kept whole (about 600 lines) on purpose: both halves are one algorithm, sharing the block layout,
the degenerate-hash rule and the lowest-agreeing-block reporting that makes it exact.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np

from pipelines.records import count

PAPER_THRESHOLD = 3
DEFAULT_MIN_BITS = 8
POLICIES = ("drop_all", "keep_first")
_MASK64 = (1 << 64) - 1
_SMALL_GROUP = 16  # block groups up to this size are verified in pure Python (cheaper than NumPy setup)
TWO_LEVEL_MIN_GROUP = 128  # block groups this big use compound (block, sub-block) keys; see _second_level

OrderKey = tuple[str, str]  # (created_utc, doc_id); the doc id is always last
Candidate = tuple[str, tuple[OrderKey, int]]  # (doc_id, (partner's order key, distance))


# --------------------------------------------------------------------------------------------- core


def block_layout(threshold: int) -> list[tuple[int, int]]:
    """``threshold + 1`` contiguous (shift, width) blocks covering bits 0..63, widths differing by <= 1."""
    if not 0 <= threshold < 64:
        raise ValueError(f"threshold must be in 0..63, got {threshold}")
    base, extra = divmod(64, threshold + 1)
    layout, shift = [], 0
    for k in range(threshold + 1):
        width = base + (1 if k < extra else 0)
        layout.append((shift, width))
        shift += width
    return layout


def _block_values(x: np.ndarray, shift: int, width: int) -> np.ndarray:
    return (x >> np.uint64(shift)) & np.uint64((1 << width) - 1)


def is_degenerate(h: int, min_bits: int = DEFAULT_MIN_BITS) -> bool:
    """True for a (near-)flat hash: at most ``min_bits`` bits set, or at most ``min_bits`` bits clear."""
    bits = (int(h) & _MASK64).bit_count()
    return bits <= min_bits or bits >= 64 - min_bits


def degenerate_mask(hashes: np.ndarray, min_bits: int = DEFAULT_MIN_BITS) -> np.ndarray:
    """Vectorised ``is_degenerate`` over a uint64 array."""
    bits = np.bitwise_count(np.asarray(hashes, dtype=np.uint64))
    return (bits <= min_bits) | (bits >= 64 - min_bits)


def _as_hashes(hashes: Iterable[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(hashes)
    if arr.dtype == np.int64:  # signed view of the same 64 bits
        return arr.ravel().view(np.uint64)
    return np.asarray(arr, dtype=np.uint64).ravel()


def _empty_pairs() -> np.ndarray:
    return np.empty((0, 2), dtype=np.int64)


def _block_dtype(width: int) -> type[np.unsignedinteger]:
    return next(
        dt for dt in (np.uint8, np.uint16, np.uint32, np.uint64) if width <= 8 * np.dtype(dt).itemsize
    )


def _narrow_block(x: np.ndarray, shift: int, width: int) -> np.ndarray:
    """Block values in the narrowest unsigned dtype (uint8/uint16 blocks are radix-sorted)."""
    dt = _block_dtype(width)
    v = (x >> np.uint64(shift) if shift else x).astype(dt)  # astype truncates to the dtype's width
    if width < 8 * v.itemsize:
        v &= dt((1 << width) - 1)
    return v


def _residual32(x: np.ndarray, shift: int, width: int) -> np.ndarray:
    """32 bits of ``x`` outside the block (width <= 32): a necessary test on half the bytes."""
    if shift >= 32:
        return x.astype(np.uint32)
    if shift + width <= 32:
        return (x >> np.uint64(32)).astype(np.uint32)
    rot = (shift + width) % 64  # a block across bit 32: rotate it to the top, keep the low half
    return ((x >> np.uint64(rot)) | (x << np.uint64(64 - rot))).astype(np.uint32)


def _close_by_columns(
    rs: np.ndarray, starts: np.ndarray, sizes: np.ndarray, threshold: int, xor: np.ndarray, bits: np.ndarray
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Position pairs (p, q) in the same group with popcount(rs[p] ^ rs[q]) <= threshold, all groups small.

    Column c holds the c-th member of every group with more than c members, groups by size descending,
    so comparing columns c1 < c2 is one contiguous XOR over the first len(column c2) rows: no index
    arrays; 2-3x faster than offsets for the ~15-member groups of 1M random hashes.
    """
    gsel = np.flatnonzero(sizes >= 2)
    top = int(sizes.max())
    by_size = gsel[np.argsort((top - sizes[gsel]).astype(_block_dtype(top.bit_length())), kind="stable")]
    base = starts[by_size]
    lengths = by_size.size - np.cumsum(np.bincount(sizes[by_size], minlength=top + 1))  # [c]: #sizes > c
    cols = [rs[base[: lengths[c]] + c] for c in range(top)]
    ps: list[np.ndarray] = []
    qs: list[np.ndarray] = []
    for c1 in range(top - 1):
        for c2 in range(c1 + 1, top):
            k = cols[c2].size
            np.bitwise_xor(cols[c1][:k], cols[c2], out=xor[:k])
            np.bitwise_count(xor[:k], out=bits[:k])
            if bits[:k].min() <= threshold:
                rows = base[np.flatnonzero(bits[:k] <= threshold)]
                ps.append(rows + c1)
                qs.append(rows + c2)
    return ps, qs


def _close_by_offsets(
    rs: np.ndarray, ends: np.ndarray, sizes: np.ndarray, threshold: int, xor: np.ndarray, bits: np.ndarray
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """As ``_close_by_columns``, for any group sizes: compare p with p + d for d = 1, 2, ...

    rem[p] counts the later positions in p's group; with positions ordered by rem (descending), those
    still inside their group at offset d are a prefix, so the work is the sum of s * (s - 1) / 2.
    """
    m = rs.size
    top = int(sizes.max()) - 1
    rem = np.repeat(ends, sizes) - np.arange(m)
    key = rem.astype(_block_dtype(top.bit_length()))
    np.subtract(top, key, out=key)
    active = np.argsort(key, kind="stable")[: m - sizes.size]  # drop rem == 0 (one per group)
    first = rs[active]
    n_at = np.cumsum(np.bincount(rem, minlength=top + 1)[::-1])[::-1]  # n_at[d]: #positions rem >= d
    ps: list[np.ndarray] = []
    qs: list[np.ndarray] = []
    for d in range(1, top + 1):
        k = int(n_at[d])
        np.take(rs[d:], active[:k], out=xor[:k])  # rs[p + d] for the active p
        np.bitwise_xor(xor[:k], first[:k], out=xor[:k])
        np.bitwise_count(xor[:k], out=bits[:k])
        if bits[:k].min() <= threshold:
            p = active[np.flatnonzero(bits[:k] <= threshold)]
            ps.append(p)
            qs.append(p + d)
    return ps, qs


def _columns_pay_off(sizes: np.ndarray) -> bool:
    """The column scan makes ~max_size**2 / 2 NumPy calls; worth it unless one group dwarfs the work."""
    top = int(sizes.max())
    return top * (top - 1) // 2 <= max(2048, int((sizes * (sizes - 1) // 2).sum()) // 4096)


def sub_block_layout(threshold: int, width: int) -> list[tuple[int, int]]:
    """``threshold + 1`` (shift, width) sub-blocks tiling the ``64 - width`` bits outside a block of
    ``width`` bits, numbered as in ``_outside_block`` (the bits below the block, then those above)."""
    base, extra = divmod(64 - width, threshold + 1)
    layout, shift = [], 0
    for k in range(threshold + 1):
        w = base + (1 if k < extra else 0)
        layout.append((shift, w))
        shift += w
    return layout


def _outside_block(x: np.ndarray, shift: int, width: int) -> np.ndarray:
    """The ``64 - width`` bits of ``x`` outside the block, packed down: bits below it, then bits above."""
    top = shift + width
    low = x & np.uint64((1 << shift) - 1)
    return low | ((x >> np.uint64(top)) << np.uint64(shift)) if top < 64 else low


def _sub_block_mask(sub_shift: int, sub_width: int, shift: int, width: int) -> int:
    """The sub-block (``_outside_block`` numbering) as a mask of the original 64 bits."""
    packed = ((1 << sub_width) - 1) << sub_shift
    return (packed & ((1 << shift) - 1)) | ((packed >> shift) << (shift + width))


def _second_level(
    uniq: np.ndarray, idx: np.ndarray, bv: np.ndarray, layout: list[tuple[int, int]], bi: int, threshold: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Pairs (a, b) of ``uniq`` indices within ``threshold`` among the members ``idx`` of big groups of
    block ``bi`` (``bv``: their block values, ascending), each from its lowest agreeing (block, sub-block).

    Two hashes in one block group differ in at most ``threshold`` of the other ``64 - width`` bits, so
    they agree on one of ``threshold + 1`` sub-blocks of those bits: candidates share the compound key
    (block value, sub-block value), ~``width + (64 - width) / (threshold + 1)`` bits (28 for t=3), so the
    compound groups are tiny; their pairs are verified on all 64 bits. ``bv`` is ascending, so each
    compound key array is sorted except within the block groups, which ``kind="stable"`` (timsort; radix
    for <= 16 bits) sorts in ~n log(group size).
    """
    shift, width = layout[bi]
    hb = uniq[idx]
    rest = _outside_block(hb, shift, width)
    subs = sub_block_layout(threshold, width)
    ct = _block_dtype(width + max(w for _, w in subs))
    high = bv.astype(ct)
    earlier_blocks = [np.uint64(((1 << w) - 1) << s) for s, w in layout[:bi]]
    earlier_subs: list[np.uint64] = []
    out_a: list[np.ndarray] = []
    out_b: list[np.ndarray] = []
    for s2, w2 in subs:
        key = (high << ct(w2)) | _narrow_block(rest, s2, w2).astype(ct, copy=False)
        p = np.argsort(key, kind="stable")
        key = key[p]
        same = key[1:] == key[:-1]
        if same.any():
            member = np.zeros(key.size, bool)  # positions in a compound group of 2 or more
            member[1:] = same
            member[:-1] |= same
            sel = np.flatnonzero(member)
            k = key[sel]
            ends = np.append(np.flatnonzero(k[1:] != k[:-1]), sel.size - 1)
            sizes = np.diff(ends, prepend=-1)
            where = idx[p[sel]]
            xor, bits = np.empty(sel.size, np.uint64), np.empty(sel.size, np.uint8)
            ps, qs = _close_by_offsets(uniq[where], ends, sizes, threshold, xor, bits)  # all 64 bits: exact
            if ps:
                a, b = where[np.concatenate(ps)], where[np.concatenate(qs)]
                x = uniq[a] ^ uniq[b]
                keep = np.ones(x.size, bool)
                for mask in earlier_blocks + earlier_subs:  # emit only from the lowest agreeing key
                    keep &= (x & mask) != 0
                out_a.append(a[keep])
                out_b.append(b[keep])
        earlier_subs.append(np.uint64(_sub_block_mask(s2, w2, shift, width)))
    return out_a, out_b


def _distinct_pairs(
    uniq: np.ndarray, threshold: int, scan: str = "auto", two_level_min: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (a < b) into the sorted distinct hashes ``uniq`` within ``threshold``, each once.

    Per block: sort by block value. Groups smaller than ``two_level_min`` (default
    ``TWO_LEVEL_MIN_GROUP``) are scanned directly: same-group position pairs whose 32-bit residuals (bits
    outside the block) are within ``threshold`` (a necessary test), verified on all 64 bits. Bigger groups
    go to ``_second_level``. A pair is kept only in the lowest block on which it agrees. ``scan``:
    "columns", "offsets" or "auto" (see ``_columns_pay_off``) for the direct scan.
    """
    m = uniq.size
    if threshold == 0 or m < 2:  # distinct hashes are never within distance 0
        return np.empty(0, np.int64), np.empty(0, np.int64)
    big_min = max(2, TWO_LEVEL_MIN_GROUP if two_level_min is None else two_level_min)
    layout = block_layout(threshold)
    out_a: list[np.ndarray] = []
    out_b: list[np.ndarray] = []
    xor, bits = np.empty(m, np.uint32), np.empty(m, np.uint8)  # reused: fresh MB-sized temporaries fault
    positions = np.arange(m)
    for bi, (shift, width) in enumerate(layout):
        sv = _narrow_block(uniq, shift, width)
        if shift + width == 64:  # the top block: ``uniq`` is already sorted by it
            order = positions
        else:
            order = np.argsort(sv, kind="stable")
            sv = sv[order]
        ends = np.append(np.flatnonzero(sv[1:] != sv[:-1]), m - 1)  # last position of each group
        sizes = np.diff(ends, prepend=-1)
        if sizes.max() < 2:
            continue
        big = sizes >= big_min
        if big.any():
            in_big = np.repeat(big, sizes)
            ps, qs = _second_level(uniq, order[in_big], sv[in_big], layout, bi, threshold)
            out_a += ps
            out_b += qs
            order, sizes = order[~in_big], sizes[~big]
            ends = np.cumsum(sizes) - 1
            if order.size == 0 or sizes.max() < 2:
                continue
        rs = _residual32(uniq, shift, width)
        if order is not positions:
            rs = rs[order]
        if scan == "columns" or (scan == "auto" and _columns_pay_off(sizes)):
            ps, qs = _close_by_columns(rs, ends - sizes + 1, sizes, threshold, xor, bits)
        else:
            ps, qs = _close_by_offsets(rs, ends, sizes, threshold, xor, bits)
        if not ps:
            continue
        a, b = order[np.concatenate(ps)], order[np.concatenate(qs)]
        x = uniq[a] ^ uniq[b]
        keep = np.bitwise_count(x) <= threshold
        for s2, w2 in layout[:bi]:  # emit only from the lowest block on which the pair agrees
            keep &= _block_values(x, s2, w2) != 0
        out_a.append(a[keep])
        out_b.append(b[keep])
    if not out_a:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    a, b = np.concatenate(out_a), np.concatenate(out_b)
    return np.minimum(a, b), np.maximum(a, b)


def _cross(
    ga: np.ndarray, gb: np.ndarray, members: np.ndarray, starts: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """All (original index, original index) pairs between distinct-hash groups ``ga[k]`` and ``gb[k]``."""
    ca, cb = counts[ga], counts[gb]
    sizes = ca * cb
    total = int(sizes.sum())
    rep = np.repeat(np.arange(ga.size), sizes)
    off = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    cbr = cb[rep]
    i = members[starts[ga][rep] + off // cbr]
    j = members[starts[gb][rep] + off % cbr]
    return i, j


def _argsort_u64(h: np.ndarray) -> np.ndarray:
    """A stable ``np.argsort(h)``, ~2x faster on 1M random hashes: a radix pass on the top 16 bits
    leaves short unsorted runs, which timsort (``kind="stable"``) finishes in near-linear time."""
    part = np.argsort((h >> np.uint64(48)).astype(np.uint16), kind="stable")
    return part[np.argsort(h[part], kind="stable")]


def near_duplicate_pairs(hashes: Iterable[int] | np.ndarray, threshold: int = PAPER_THRESHOLD) -> np.ndarray:
    """Every index pair (i, j), i < j, with ``popcount(hashes[i] ^ hashes[j]) <= threshold``.

    ``hashes`` is a uint64 array (int64 is read as the same bits) in any order, repeats allowed.
    Returns an int64 array [P, 2], each pair once, sorted lexicographically. Exact. Cost is about
    n log n plus, per block group of s distinct hashes, s * (s - 1) / 2 comparisons while s is below
    ``TWO_LEVEL_MIN_GROUP`` and ~s log s (the second level) from there on; filter near-flat hashes out
    first (``degenerate_mask``): they share block AND sub-block values, so no key separates them.
    """
    block_layout(threshold)  # validates
    h = _as_hashes(hashes)
    if h.size < 2:
        return _empty_pairs()
    # Collapse repeats (np.unique's work, with one sort): members lists the original indices grouped
    # by distinct hash; group k is members[starts[k] : starts[k] + counts[k]].
    members = _argsort_u64(h)
    hs = h[members]
    starts = np.flatnonzero(np.append(True, hs[1:] != hs[:-1]))
    counts = np.diff(starts, append=h.size)
    uniq = hs[starts]

    ua, ub = _distinct_pairs(uniq, threshold)
    i1, j1 = _cross(ua, ub, members, starts, counts)
    # Identical hashes: all pairs inside each group of repeats.
    rep = np.flatnonzero(counts >= 2)
    i2, j2 = _cross(rep, rep, members, starts, counts)
    keep = i2 < j2
    i = np.concatenate([np.minimum(i1, j1), i2[keep]])
    j = np.concatenate([np.maximum(i1, j1), j2[keep]])
    order = np.lexsort((j, i))
    return np.stack([i[order], j[order]], axis=1).astype(np.int64, copy=False)


def brute_force_pairs(
    hashes: Iterable[int] | np.ndarray, threshold: int = PAPER_THRESHOLD, chunk_elems: int = 1 << 23
) -> np.ndarray:
    """All-pairs oracle with the same output as ``near_duplicate_pairs``; ~``chunk_elems`` * 9 B of memory."""
    h = _as_hashes(hashes)
    n = h.size
    rows = max(1, chunk_elems // max(n, 1))
    out: list[np.ndarray] = []
    for s in range(0, n, rows):
        e = min(n, s + rows)
        close = np.bitwise_count(h[s:e, None] ^ h[None, s:]) <= threshold
        ii, jj = np.nonzero(close)
        ii, jj = ii + s, jj + s
        keep = jj > ii
        out.append(np.stack([ii[keep], jj[keep]], axis=1))
    if not out:
        return _empty_pairs()
    pairs = np.concatenate(out).astype(np.int64, copy=False)
    return pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]


# --------------------------------------------------------------------------------------------- Beam


@dataclass(frozen=True, order=True)
class DuplicateVerdict:
    """A document to drop; ``duplicate_of`` is its earliest duplicate partner (``document_order``)."""

    doc_id: str
    duplicate_of: str
    distance: int  # smallest Hamming distance between an image of doc_id and one of duplicate_of


def document_order(doc: dict[str, Any]) -> OrderKey:
    """The order for ``keep_first`` (and for choosing ``duplicate_of``): (created_utc, doc_id), as strings."""
    return (str((doc.get("metadata") or {}).get("created_utc", "")), str(doc["doc_id"]))


def _signed(h: int) -> int:
    """Beam's int coder is signed 64-bit: key on the signed view of the same bits."""
    h &= _MASK64
    return h - (1 << 64) if h >> 63 else h


def _distance(a: int, b: int) -> int:
    return ((a ^ b) & _MASK64).bit_count()


def _image_hashes(doc: dict[str, Any], min_bits: int) -> Iterator[tuple[int, OrderKey]]:
    key = document_order(doc)
    hashes = [img["phash"] for img in doc.get("images") or () if img.get("phash") is not None]
    count("dedupe:hashes", len(hashes))
    skipped = 0
    for h in hashes:
        if is_degenerate(h, min_bits):
            skipped += 1
        else:
            yield _signed(int(h)), key
    if skipped:
        count("dedupe:degenerate_hashes_skipped", skipped)


def _block_keys(
    kv: tuple[int, list[OrderKey]], layout: list[tuple[int, int]]
) -> Iterator[tuple[tuple[int, int], int]]:
    h = kv[0]
    u = h & _MASK64
    for bi, (shift, width) in enumerate(layout):
        yield (bi, (u >> shift) & ((1 << width) - 1)), h


def _verify_block(
    kv: tuple[tuple[int, int], Iterable[int]], layout: list[tuple[int, int]], threshold: int
) -> Iterator[tuple[int, int]]:
    """Verified pairs (signed hashes) of one block group whose lowest agreeing block is this one."""
    (bi, _), hashes = kv
    hs = sorted(set(hashes))
    if len(hs) < 2:
        return
    if len(hs) <= _SMALL_GROUP:
        cand = [(a, b) for a, b in itertools.combinations(hs, 2) if _distance(a, b) <= threshold]
    else:
        arr = np.asarray(hs, dtype=np.int64)
        cand = [(hs[i], hs[j]) for i, j in near_duplicate_pairs(arr, threshold).tolist()]
    found = 0
    for a, b in cand:
        x = (a ^ b) & _MASK64
        if all((x >> s) & ((1 << w) - 1) for s, w in layout[:bi]):
            found += 1
            yield a, b
    if found:
        count("dedupe:duplicate_image_pairs", found)


def _decide(union: dict[OrderKey, set[int]], policy: str) -> Iterator[Candidate]:
    """Candidate verdicts for a set of documents that are pairwise duplicates (a clique).

    Every member's partner is the earliest other member; keep_first spares the earliest member.
    """
    if len(union) < 2:
        return
    ordered = sorted(union)
    first = ordered[0]
    for x in ordered:
        if x == first and policy == "keep_first":
            continue
        partner = ordered[1] if x == first else first
        d = min(_distance(a, b) for a in union[x] for b in union[partner])
        yield x[-1], (partner, d)


def _exact_verdicts(kv: tuple[int, list[OrderKey]], policy: str) -> Iterator[Candidate]:
    h, members = kv
    yield from _decide({m: {h} for m in members}, policy)


def _pair_refs(pair: tuple[int, int]) -> Iterator[tuple[int, tuple[int, int]]]:
    yield pair[0], pair
    yield pair[1], pair


def _attach_members(kv: tuple[int, dict[str, list]]) -> Iterator[tuple[tuple[int, int], tuple]]:
    h, grouped = kv
    for members in grouped["members"]:
        for pair in grouped["pairs"]:
            yield pair, (h, members)


def _pair_verdicts(
    kv: tuple[tuple[int, int], Iterable[tuple[int, list[OrderKey]]]], policy: str
) -> Iterator[Candidate]:
    _, parts = kv
    union: dict[OrderKey, set[int]] = defaultdict(set)
    for h, members in parts:
        for m in members:
            union[m].add(h)
    yield from _decide(union, policy)


def _to_verdict(kv: tuple[str, tuple[OrderKey, int]]) -> DuplicateVerdict:
    doc_id, best = kv
    count("dedupe:documents_flagged")
    return DuplicateVerdict(doc_id, best[0][-1], best[1])


class FindDuplicateDocuments(beam.PTransform):
    """Document dicts -> one ``DuplicateVerdict`` per document to drop (each document at most once).

    Only duplicates between different documents count. Two images are duplicates when their phash
    Hamming distance is <= ``threshold`` (neither hash degenerate, see ``is_degenerate``).

    * ``drop_all``: drop every document with an image that duplicates an image of another document.
    * ``keep_first``: drop a document when one of its images duplicates an image of an EARLIER document
      in ``document_order``. This is a pairwise rule, not the greedy sequential one (a document whose
      only earlier duplicate is itself dropped is still dropped), so it parallelises.

    ``duplicate_of`` is the document's earliest partner (``document_order``), ``distance`` the smallest
    image distance to it. Work is linear in the number of images plus the block-group sizes:
    exact hash -> members; distinct hash -> block groups -> verified hash pairs (each from its lowest
    agreeing block) -> joined back to both hashes' members -> decisions -> min per document.

    The shuffle keys stay single-level (``threshold + 1`` per distinct hash), not the core's compound
    (block, sub-block) keys (``(threshold + 1) ** 2``): in Beam every emitted element costs microseconds
    (DirectRunner, measured: ~9 us per extra keyed element, so 16 keys instead of 4 a hash roughly
    doubled the GroupByKey stage), while verifying a block group in NumPy costs nanoseconds a pair, and
    ``near_duplicate_pairs`` applies the second level itself inside any group of ``TWO_LEVEL_MIN_GROUP``
    or more (document corpora of ~10M images make groups of ~150 at t=3).
    """

    def __init__(
        self,
        threshold: int = PAPER_THRESHOLD,
        policy: str = "drop_all",
        min_bits: int = DEFAULT_MIN_BITS,
        label: str | None = None,
    ) -> None:
        super().__init__(label)
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.layout = block_layout(threshold)
        self.threshold, self.policy, self.min_bits = threshold, policy, min_bits

    def expand(self, docs: beam.PCollection) -> beam.PCollection:
        policy, layout, threshold = self.policy, self.layout, self.threshold
        members = (
            docs
            | "HashImages" >> beam.FlatMap(_image_hashes, self.min_bits)
            | "GroupByHash" >> beam.GroupByKey()
            | "Members" >> beam.MapTuple(lambda h, ms: (h, sorted(set(ms))))
        )
        exact = members | "ExactVerdicts" >> beam.FlatMap(_exact_verdicts, policy)
        pairs = (
            members
            | "BlockKeys" >> beam.FlatMap(_block_keys, layout)
            | "GroupByBlock" >> beam.GroupByKey()
            | "VerifyBlock" >> beam.FlatMap(_verify_block, layout, threshold)
        )
        near = (
            {"members": members, "pairs": pairs | "PairRefs" >> beam.FlatMap(_pair_refs)}
            | "JoinByHash" >> beam.CoGroupByKey()
            | "AttachMembers" >> beam.FlatMap(_attach_members)
            | "GroupByPair" >> beam.GroupByKey()
            | "PairVerdicts" >> beam.FlatMap(_pair_verdicts, policy)
        )
        return (
            (exact, near)
            | "AllCandidates" >> beam.Flatten()
            | "EarliestPartner" >> beam.CombinePerKey(min)
            | "Verdicts" >> beam.Map(_to_verdict)
        )
