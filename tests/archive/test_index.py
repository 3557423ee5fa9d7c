"""The news archive index (FAISS) against brute-force search, and its folder round trip."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archive.index import (
    KINDS,
    PQ_REFINE_FACTOR,
    ArchiveIndex,
    ivf_cells,
    ivf_nprobe,
    pq_subquantizers,
)
from schemas.errors import MmlinksError


def _unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 60),
    d=st.integers(1, 12),
    q=st.integers(1, 4),
    k=st.integers(1, 70),
    seed=st.integers(0, 2**16),
    duplicates=st.booleans(),
)
def test_the_flat_index_returns_the_brute_force_top_k(n, d, q, k, seed, duplicates):
    rng = np.random.default_rng(seed)
    x = _unit(rng, n, d)
    if duplicates and n > 1:
        x[n // 2 :] = x[: n - n // 2]  # equal vectors: ties in the scores
    ids = [f"img-{i}" for i in range(n)]
    queries = _unit(rng, q, d)
    index = ArchiveIndex.build(ids, x, kind="flat")
    scores, got = index.search(queries, k)
    brute = queries @ x.T  # [q, n]
    kk = min(k, n)
    assert scores.shape == (q, kk) and all(len(g) == kk for g in got)
    for row in range(q):
        want = np.sort(brute[row])[::-1][:kk]
        np.testing.assert_allclose(scores[row], want, atol=1e-5)  # the best k scores, best first
        own = brute[row][[ids.index(i) for i in got[row]]]
        np.testing.assert_allclose(own, scores[row], atol=1e-5)  # each id carries its own score
        assert len(set(got[row])) == kk


def test_an_index_survives_its_folder_and_keeps_its_provenance(tmp_path):
    rng = np.random.default_rng(0)
    x = _unit(rng, 30, 8)
    ids = [f"c{i}" for i in range(30)]
    for kind in KINDS:
        index = ArchiveIndex.build(ids, x, [f"u{i}" for i in range(30)], kind, {"run_id": "r1"})
        back = ArchiveIndex.load(index.save(tmp_path / kind))
        q = _unit(rng, 3, 8)
        assert back.search(q, 5)[1] == index.search(q, 5)[1]
        assert back.kind == kind and back.info == {"run_id": "r1"} and back.uris[3] == "u3"
        # on 30 vectors HNSW's graph is exhaustive enough to find the exact best match; IVF
        # probes the cell a vector was filed in, so it finds the vector itself
        assert back.search(x[:5], 1)[1] == [[i] for i in ids[:5]]


def test_the_ivf_index_is_exact_when_it_probes_every_cell_and_close_with_its_default_probes():
    rng = np.random.default_rng(1)
    x, q = _unit(rng, 2000, 16), _unit(rng, 50, 16)
    ids = [str(i) for i in range(2000)]
    exact = ArchiveIndex.build(ids, x, kind="flat")
    ivf = ArchiveIndex.build(ids, x, kind="ivf")
    cells = ivf_cells(2000)
    assert ivf.index.nlist == cells == 44 and ivf.index.nprobe == ivf_nprobe(cells) == 5
    want_scores, want = exact.search(q, 10)
    default = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ivf.search(q, 10)[1], want, strict=True)])
    ivf.index.nprobe = cells
    scores, got = ivf.search(q, 10)
    np.testing.assert_allclose(scores, want_scores, atol=1e-5)
    assert [set(g) for g in got] == [set(w) for w in want]
    # 16-d clusters are coarse for random data; the default probes still find most neighbours
    assert 0.6 <= default < 1.0
    with pytest.raises(MmlinksError, match="at least one vector"):
        ArchiveIndex.build([], np.zeros((0, 16), np.float32), kind="ivf")


def test_the_pq_index_reranks_exactly_and_is_exact_when_it_reranks_everything(tmp_path):
    rng = np.random.default_rng(2)
    x, q = _unit(rng, 2000, 16), _unit(rng, 50, 16)
    ids = [str(i) for i in range(2000)]
    exact = ArchiveIndex.build(ids, x, kind="flat")
    pq = ArchiveIndex.build(ids, x, kind="pq")
    assert pq_subquantizers(16) == 4 and pq.index.k_factor == PQ_REFINE_FACTOR
    want_scores, want = exact.search(q, 10)
    scores, got = pq.search(q, 10)
    # the scores are the re-ranked candidates' exact inner products, best first
    for s, row, qq in zip(scores, got, q, strict=True):
        np.testing.assert_allclose(s, [float(x[int(i)] @ qq) for i in row], atol=1e-5)
        assert list(s) == sorted(s, reverse=True)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, want, strict=True)])
    assert recall >= 0.9
    pq.index.k_factor = 200  # 10 x 200 = every vector re-ranked: exact
    scores, got = pq.search(q, 10)
    np.testing.assert_allclose(scores, want_scores, atol=1e-5)
    assert [set(g) for g in got] == [set(w) for w in want]
    pq.index.k_factor = PQ_REFINE_FACTOR
    loaded = ArchiveIndex.load(pq.save(tmp_path / "pq"))
    assert loaded.kind == "pq" and loaded.index.k_factor == PQ_REFINE_FACTOR  # saved with it
    assert loaded.search(q, 10)[1] == pq.search(q, 10)[1]
    with pytest.raises(MmlinksError, match="at least 16 vectors"):
        ArchiveIndex.build(ids[:3], x[:3], kind="pq")


def test_bad_index_inputs_are_one_line_errors(tmp_path):
    x = np.eye(3, dtype=np.float32)
    with pytest.raises(MmlinksError, match="unique"):
        ArchiveIndex.build(["a", "a", "b"], x)
    with pytest.raises(MmlinksError, match="unknown archive index kind"):
        ArchiveIndex.build(["a", "b", "c"], x, kind="lsh")
    with pytest.raises(MmlinksError, match="3-d index"):
        ArchiveIndex.build(["a", "b", "c"], x).search(np.ones((1, 4)), 1)
    with pytest.raises(MmlinksError, match="no archive index"):
        ArchiveIndex.load(tmp_path)


def test_the_registry_says_how_each_objective_is_packaged():
    import dataclasses

    from training.objectives.registry import get_objective, objective_names, register_objective

    kinds = {name: get_objective(name).packaging for name in objective_names()}
    assert kinds["news"] == "news-archive" and kinds["cmca"] == kinds["cmcm-c"] == "pairs"
    assert kinds["ap"] == kinds["li2021"] == "link"
    with pytest.raises(ValueError, match="packaging 'zip'"):
        register_objective(dataclasses.replace(get_objective("ap"), name="ap-zip", packaging="zip"))
