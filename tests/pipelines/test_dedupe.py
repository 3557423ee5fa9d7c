"""Near-duplicate image removal: the multi-index core against brute force, and the Beam transform
against a document-level brute-force oracle."""

from __future__ import annotations

import itertools

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import pipelines.near_duplicates as near_duplicates
from features.images import phash64
from pipelines.dedupe import DuplicateVerdict, FindDuplicateDocuments, document_order
from pipelines.direct_runner import DirectRunner
from pipelines.near_duplicates import (
    TWO_LEVEL_MIN_GROUP,
    _argsort_u64,
    _columns_pay_off,
    _distinct_pairs,
    _outside_block,
    _residual32,
    _sub_block_mask,
    block_layout,
    brute_force_pairs,
    degenerate_mask,
    is_degenerate,
    near_duplicate_pairs,
    sub_block_layout,
)
from pipelines.records import COUNTS_NAMESPACE

U64 = st.integers(0, 2**64 - 1)
MASK = 2**64 - 1


def python_pairs(hashes: list[int], t: int) -> list[tuple[int, int]]:
    """The oracle's oracle: plain Python over all pairs."""
    return [
        (i, j)
        for i, j in itertools.combinations(range(len(hashes)), 2)
        if (hashes[i] ^ hashes[j]).bit_count() <= t
    ]


def check_against_brute_force(hashes: list[int] | np.ndarray, t: int) -> np.ndarray:
    arr = np.asarray(hashes, dtype=np.uint64)
    got = near_duplicate_pairs(arr, t)
    want = brute_force_pairs(arr, t)
    assert got.dtype == np.int64 and got.shape == (len(want), 2)
    np.testing.assert_array_equal(got, want)
    return got


def flip(h: int, bits: list[int]) -> int:
    for b in bits:
        h ^= 1 << b
    return h


# ------------------------------------------------------------------------------------------ layout


@pytest.mark.parametrize("t", range(64))
def test_block_layout_tiles_64_bits(t):
    layout = block_layout(t)
    assert len(layout) == t + 1
    shift = 0
    for s, w in layout:
        assert s == shift and w >= 1
        shift += w
    assert shift == 64
    widths = [w for _, w in layout]
    assert max(widths) - min(widths) <= 1


@pytest.mark.parametrize("t", range(1, 9))
def test_residual_bits_lie_outside_each_block(t):
    """The 32-bit prefilter must use bits the block does not fix, or it filters nothing."""
    for shift, width in block_layout(t):
        block = np.array([((1 << width) - 1) << shift], dtype=np.uint64)
        assert _residual32(block, shift, width).tolist() == [0]
        assert np.bitwise_count(_residual32(np.array([MASK], dtype=np.uint64), shift, width)).tolist() == [32]


def test_block_layout_paper_threshold_and_bounds():
    assert block_layout(3) == [(0, 16), (16, 16), (32, 16), (48, 16)]
    with pytest.raises(ValueError):
        block_layout(-1)
    with pytest.raises(ValueError):
        block_layout(64)


@pytest.mark.parametrize("t", range(1, 9))
def test_sub_blocks_tile_the_bits_outside_each_block(t):
    """Sub-block masks are disjoint, avoid the block, cover the rest, and match ``_outside_block``."""
    bits = np.uint64(1) << np.arange(64, dtype=np.uint64)
    for shift, width in block_layout(t):
        block = ((1 << width) - 1) << shift
        subs = sub_block_layout(t, width)
        assert len(subs) == t + 1 and sum(w for _, w in subs) == 64 - width
        masks = [_sub_block_mask(s2, w2, shift, width) for s2, w2 in subs]
        union = 0
        for mask in masks:
            assert mask & block == 0 and mask & union == 0
            union |= mask
        assert union | block == MASK
        rest = _outside_block(bits, shift, width)
        for (s2, w2), mask in zip(subs, masks):
            in_sub = ((rest >> np.uint64(s2)) & np.uint64((1 << w2) - 1)) != 0
            assert in_sub.tolist() == [bool(mask >> i & 1) for i in range(64)]


# ------------------------------------------------------------------------------------------ degenerate


def test_degenerate_hashes():
    assert is_degenerate(0) and is_degenerate(MASK) and is_degenerate(0xFF) and is_degenerate(MASK ^ 0xFF)
    assert not is_degenerate(0x1FF) and not is_degenerate(MASK ^ 0x1FF)
    assert not is_degenerate(0xF0F0F0F0F0F0F0F0)
    assert is_degenerate(0xFFFF, min_bits=16) and not is_degenerate(0xFFFF, min_bits=15)
    edges = np.array([0xFF, MASK ^ 0xFF, 0x1FF, MASK ^ 0x1FF, 0, MASK], dtype=np.uint64)
    assert degenerate_mask(edges).tolist() == [True, True, False, False, True, True]


@given(st.lists(U64, max_size=50), st.integers(0, 20))
def test_degenerate_mask_matches_scalar(hashes, min_bits):
    want = [is_degenerate(h, min_bits) for h in hashes]
    assert degenerate_mask(np.asarray(hashes, dtype=np.uint64), min_bits).tolist() == want


def test_flat_image_phash_is_degenerate_and_a_photo_is_not():
    from skimage import data

    assert is_degenerate(phash64(Image.new("RGB", (64, 64), (120, 30, 200))))
    photo = phash64(Image.fromarray(data.chelsea()))
    assert not is_degenerate(photo)
    assert 20 <= photo.bit_count() <= 44  # phash thresholds at the median


# ------------------------------------------------------------------------------------------ core


@given(st.lists(U64, max_size=40), st.integers(0, 6))
def test_brute_force_matches_plain_python(hashes, t):
    got = brute_force_pairs(np.asarray(hashes, dtype=np.uint64), t, chunk_elems=7)  # many tiny chunks
    assert [tuple(p) for p in got.tolist()] == python_pairs(hashes, t)


@given(st.lists(U64, max_size=300), st.integers(0, 6))
def test_random_hashes_match_brute_force(hashes, t):
    check_against_brute_force(hashes, t)


@st.composite
def clustered(draw):
    """A few seeds, each copied with a few flipped bits (some copies exact repeats), shuffled."""
    seeds = draw(st.lists(U64, min_size=1, max_size=5))
    out = []
    for seed in seeds:
        for bits in draw(st.lists(st.lists(st.integers(0, 63), max_size=6), min_size=1, max_size=25)):
            out.append(flip(seed, bits))
    return draw(st.permutations(out))


@given(clustered(), st.integers(0, 6))
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_clustered_hashes_match_brute_force(hashes, t):
    check_against_brute_force(hashes, t)


@given(clustered(), st.integers(1, 6))
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
def test_column_and_offset_scans_both_exact(hashes, t):
    """The two within-group scans (columns for small groups, offsets for any) agree with brute force."""
    uniq = np.unique(np.asarray(hashes, dtype=np.uint64))
    want = [tuple(p) for p in brute_force_pairs(uniq, t).tolist()]
    for scan in ("offsets", "columns"):
        a, b = _distinct_pairs(uniq, t, scan=scan)
        assert sorted(zip(a.tolist(), b.tolist())) == want


@given(st.one_of(clustered(), st.lists(U64, max_size=200)), st.integers(0, 8), st.integers(2, 6))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_two_level_matches_brute_force(hashes, t, two_level_min):
    """Groups of ``two_level_min`` or more take the second level (compound keys), smaller ones the direct
    scan: every pair is found, and found once, at thresholds 0..8."""
    uniq = np.unique(np.asarray(hashes, dtype=np.uint64))
    want = [tuple(p) for p in brute_force_pairs(uniq, t).tolist()]
    a, b = _distinct_pairs(uniq, t, two_level_min=two_level_min)
    got = list(zip(a.tolist(), b.tolist()))
    assert sorted(got) == want  # sorted(), not set(): a pair reported twice fails


@pytest.mark.parametrize("t", range(9))
def test_two_level_everywhere_crowded_all_thresholds(t, monkeypatch):
    """The public function with every group of 2+ on the second level, on crowded blocks with repeats."""
    monkeypatch.setattr(near_duplicates, "TWO_LEVEL_MIN_GROUP", 2)
    rng = np.random.default_rng(100 + t)
    base = rng.integers(0, 2**64, 80, dtype=np.uint64) & np.uint64(0xFFFF_0000_FFFF_FFFF)  # one block-2 group
    near = [
        np.uint64(flip(int(h), rng.choice(64, size=k, replace=False).tolist()))
        for h in base[:40]
        for k in range(1, 10)
    ]
    hashes = np.concatenate([base, rng.integers(0, 2**64, 300, dtype=np.uint64), near, base[:7]])
    got = check_against_brute_force(hashes[rng.permutation(hashes.size)], t)
    assert len(got) >= 7 + 40 * t


def test_second_level_runs_by_default_on_a_crowded_block(monkeypatch):
    """A block value shared by thousands of hashes (> TWO_LEVEL_MIN_GROUP) takes the second level with
    the default settings; planted neighbours at 1..3 bits (also inside the crowd) are all found."""
    calls = []

    def spy(uniq, idx, *args):
        calls.append(idx.size)
        return second_level(uniq, idx, *args)

    second_level = near_duplicates._second_level
    monkeypatch.setattr(near_duplicates, "_second_level", spy)
    rng = np.random.default_rng(11)
    crowd = rng.integers(0, 2**64, 3000, dtype=np.uint64) & np.uint64(0xFFFF_FFFF_0000_FFFF)
    crowd |= np.uint64(0xBEEF_0000)
    assert crowd.size >= 10 * TWO_LEVEL_MIN_GROUP
    src = rng.choice(crowd.size, 300, replace=False)
    near = np.array(
        [
            flip(int(crowd[s]), rng.choice(64, size=1 + k % 3, replace=False).tolist())
            for k, s in enumerate(src)
        ],
        dtype=np.uint64,
    )
    hashes = np.concatenate([crowd, near, rng.integers(0, 2**64, 2000, dtype=np.uint64)])
    got = check_against_brute_force(hashes, 3)
    assert calls and max(calls) >= crowd.size
    found = {tuple(p) for p in got.tolist()}
    assert all((int(s), crowd.size + k) in found for k, s in enumerate(src))


def test_scan_choice():
    assert _columns_pay_off(np.full(65536, 15))  # 1M random hashes, 16-bit blocks
    assert _columns_pay_off(np.full(65536, 60))  # 4M
    assert not _columns_pay_off(np.array([3000] + [2] * 1000))  # one crowded block value: offsets
    assert not _columns_pay_off(np.array([100] * 3))


@given(
    st.lists(st.sampled_from([0, 1, 3, 2**63, 2**64 - 1, 0xF0F0F0F0F0F0F0F0]), max_size=60), st.integers(0, 6)
)
def test_repeated_hashes_match_brute_force(hashes, t):
    got = check_against_brute_force(hashes, t)
    if t == 0:  # exactly the equal pairs
        assert [tuple(p) for p in got.tolist()] == [
            (i, j) for i, j in itertools.combinations(range(len(hashes)), 2) if hashes[i] == hashes[j]
        ]


@pytest.mark.parametrize("t", range(9))
def test_empty_and_single_input(t):
    for hashes in ([], [5], np.array([MASK], dtype=np.uint64)):
        got = near_duplicate_pairs(np.asarray(hashes, dtype=np.uint64), t)
        assert got.shape == (0, 2) and got.dtype == np.int64
        assert brute_force_pairs(np.asarray(hashes, dtype=np.uint64), t).shape == (0, 2)


@pytest.mark.parametrize("t", range(9))
def test_crowded_blocks_all_thresholds(t):
    """Big groups in every block (shared low bits, neighbours at 1..8 bits), repeats, high bit set."""
    rng = np.random.default_rng(t)
    base = rng.integers(0, 2**64, 60, dtype=np.uint64) & np.uint64(0xFFFF_FFFF_FFFF_0000)  # one block-0 group
    noise = rng.integers(0, 2**64, 400, dtype=np.uint64)
    near = []
    for h in base[:30]:
        for k in range(1, 9):
            bits = rng.choice(64, size=k, replace=False)
            near.append(np.uint64(flip(int(h), [int(b) for b in bits])))
    hashes = np.concatenate([base, noise, np.array(near, dtype=np.uint64), base[:10], noise[:5]])
    hashes = hashes[rng.permutation(hashes.size)]
    got = check_against_brute_force(hashes, t)
    assert len(got) >= 15 + 30 * t  # the repeats, plus each base hash with its copies at <= t bits
    # int64 input is read as the same 64 bits
    np.testing.assert_array_equal(near_duplicate_pairs(hashes.view(np.int64), t), got)


@pytest.mark.parametrize("n", [10, 9000, 70_000])
def test_fast_argsort_is_a_stable_argsort(n):
    rng = np.random.default_rng(n)
    h = rng.integers(0, 2**64, n, dtype=np.uint64)
    h[: n // 3] = h[n // 3 : 2 * (n // 3)]  # repeats
    h[-n // 4 :] &= np.uint64(0xFFFF)  # many equal top 16 bits
    h[:5] = [0, 2**64 - 1, 2**63, 2**63 - 1, 1]
    np.testing.assert_array_equal(_argsort_u64(h), np.argsort(h, kind="stable"))


def test_planted_pairs_at_scale_are_all_found():
    rng = np.random.default_rng(7)
    hashes = rng.integers(0, 2**64, 200_000, dtype=np.uint64)
    src = rng.choice(hashes.size, 500, replace=False)
    planted = hashes[src].copy()
    for k in range(planted.size):
        planted[k] = np.uint64(flip(int(planted[k]), rng.choice(64, size=1 + k % 3, replace=False).tolist()))
    allh = np.concatenate([hashes, planted])
    pairs = near_duplicate_pairs(allh, 3)
    found = {tuple(p) for p in pairs.tolist()}
    assert all((int(s), hashes.size + k) in found for k, s in enumerate(src))
    # Every reported pair really is within the threshold.
    assert (np.bitwise_count(allh[pairs[:, 0]] ^ allh[pairs[:, 1]]) <= 3).all()


# ------------------------------------------------------------------------------------------ Beam


def doc(doc_id: str, hashes: list[int | None], created: str | None = None) -> dict:
    meta = {} if created is None else {"created_utc": created}
    return {
        "doc_id": doc_id,
        "images": [{"phash": h, "uri": f"{doc_id}/{k}"} for k, h in enumerate(hashes)],
        "metadata": meta,
        "sentences": ["x"],
    }


def oracle(docs: list[dict], t: int, policy: str, min_bits: int = 8) -> list[DuplicateVerdict]:
    """Document-level brute force: a document's partners are the OTHER documents with an image within t."""

    def usable(d):
        hs = [im["phash"] for im in d["images"] if im["phash"] is not None]
        return [h for h in hs if min_bits < h.bit_count() < 64 - min_bits]

    out = []
    for x in docs:
        partners = []
        for y in docs:
            if y["doc_id"] == x["doc_id"]:
                continue
            dists = [(a ^ b).bit_count() for a in usable(x) for b in usable(y)]
            if dists and min(dists) <= t:
                partners.append((document_order(y), min(dists)))
        if policy == "keep_first":
            partners = [p for p in partners if p[0] < document_order(x)]
        if partners:
            (order, dist) = min(partners)
            out.append(DuplicateVerdict(x["doc_id"], order[1], dist))
    return out


def run_both_policies(docs: list[dict], t: int = 3, min_bits: int = 8):
    """One DirectRunner pipeline, both policies; returns the counters of the drop_all branch."""
    p = beam.Pipeline(runner=DirectRunner())
    pc = p | beam.Create(docs)
    for policy in ("drop_all", "keep_first"):
        got = pc | f"Find_{policy}" >> FindDuplicateDocuments(threshold=t, policy=policy, min_bits=min_bits)
        assert_that(got, equal_to(oracle(docs, t, policy, min_bits)), label=f"Check_{policy}")
    result = p.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_namespace(COUNTS_NAMESPACE))["counters"]
    counts: dict[str, int] = {}
    for c in counters:
        if c.key.step.startswith("Find_drop_all"):
            counts[c.key.metric.name] = counts.get(c.key.metric.name, 0) + c.committed
    return counts


A = 0xF0F0_F0F0_F0F0_F0F0  # 32 bits set, high bit set (exercises the signed key path)
B = 0x0123_4567_89AB_CDEF
C = 0x5A5A_A5A5_3C3C_C3C3
E = 0x7E81_18E7_6699_9966
F = 0x3C3C_3C3C_C3C3_C3C3


def fixed_docs() -> list[dict]:
    return [
        # within-document near duplicates only: never dropped
        doc("solo", [B, B ^ 1, B ^ 0b110], "0005"),
        # chain a1 ~ a2 ~ a3 (3 bits each) with a1 !~ a3 (6 bits)
        doc("a1", [A], "0003"),
        doc("a2", [A ^ 0b111, C], "0002"),
        doc("a3", [A ^ 0b111_111], "0001"),
        # exact duplicates
        doc("e1", [E], "0010"),
        doc("e2", [E, None], "0009"),
        doc("e3", [E ^ (1 << 63) ^ (1 << 40)], ""),
        # exact duplicates with no near neighbour
        doc("x1", [F]),
        doc("x2", [F, F]),
        # degenerate images identical across documents: not duplicates
        doc("blank1", [0, MASK ^ 0x3]),
        doc("blank2", [0, MASK]),
        # 4 bits away: not a duplicate at t=3
        doc("far", [C ^ 0b1111], "0004"),
        doc("nothing", []),
    ]


def test_find_duplicate_documents_fixed_cases():
    docs = fixed_docs()
    drop_all = {v.doc_id: v for v in oracle(docs, 3, "drop_all")}
    keep_first = {v.doc_id: v for v in oracle(docs, 3, "keep_first")}
    # The oracle encodes the intended semantics; pin them down so the oracle itself is checked.
    assert drop_all == {
        "a1": DuplicateVerdict("a1", "a2", 3),
        "a2": DuplicateVerdict("a2", "a3", 3),
        "a3": DuplicateVerdict("a3", "a2", 3),
        "e1": DuplicateVerdict("e1", "e3", 2),
        "e2": DuplicateVerdict("e2", "e3", 2),
        "e3": DuplicateVerdict("e3", "e2", 2),
        "x1": DuplicateVerdict("x1", "x2", 0),
        "x2": DuplicateVerdict("x2", "x1", 0),
    }
    assert keep_first == {
        "a1": DuplicateVerdict("a1", "a2", 3),  # not the greedy rule: a2 is dropped too, a1 still goes
        "a2": DuplicateVerdict("a2", "a3", 3),
        "e1": DuplicateVerdict("e1", "e3", 2),
        "e2": DuplicateVerdict("e2", "e3", 2),
        "x2": DuplicateVerdict("x2", "x1", 0),
    }
    counts = run_both_policies(docs)
    assert counts["dedupe:hashes"] == 18
    assert counts["dedupe:degenerate_hashes_skipped"] == 4
    assert counts["dedupe:documents_flagged"] == 8
    # distinct-hash pairs within 3 bits: B~B^1, B~B^6, B^1~B^6 (within a doc), A~A^7, A^7~A^63, E^..~E
    assert counts["dedupe:duplicate_image_pairs"] == 6


@pytest.mark.parametrize("two_level_min", [TWO_LEVEL_MIN_GROUP, 2])
def test_find_duplicate_documents_crowded_block_group(two_level_min, monkeypatch):
    """More than _SMALL_GROUP hashes share a block value, so the NumPy core runs inside a block group
    (with its second level too when ``two_level_min`` is 2)."""
    monkeypatch.setattr(near_duplicates, "TWO_LEVEL_MIN_GROUP", two_level_min)
    rng = np.random.default_rng(3)
    base = [int(h) | 0xBEEF for h in rng.integers(0, 2**64, 40, dtype=np.uint64) & np.uint64(~0xFFFF & MASK)]
    docs = [doc(f"d{k:02d}", [h], f"{k % 7}") for k, h in enumerate(base)]
    docs += [
        doc(f"n{k:02d}", [flip(base[k], rng.choice(64, 1 + k % 4, replace=False).tolist())])
        for k in range(12)
    ]
    assert len(oracle(docs, 3, "drop_all")) >= 10
    run_both_policies(docs)


def test_policy_and_threshold_are_validated():
    with pytest.raises(ValueError):
        FindDuplicateDocuments(policy="keep_last")
    with pytest.raises(ValueError):
        FindDuplicateDocuments(threshold=64)


@st.composite
def documents(draw):
    pool = draw(clustered())
    pool += [0, 1 << 5]  # degenerate
    n = draw(st.integers(1, 12))
    docs = []
    for k in range(n):
        hashes = draw(st.lists(st.sampled_from(pool), max_size=4))
        created = draw(st.sampled_from([None, "", "1", "2", "3"]))
        docs.append(doc(f"doc{k}", hashes, created))
    return docs


@pytest.mark.slow
@given(documents(), st.integers(0, 5))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_find_duplicate_documents_matches_oracle(docs, t):
    run_both_policies(docs, t)
