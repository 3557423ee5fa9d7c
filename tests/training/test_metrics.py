import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from training.metrics import document_metrics, precision_at_k, random_baseline, roc_auc


def pairwise_auc(scores, labels):
    pos, neg = scores[labels], scores[~labels]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, st.integers(2, 30), elements=st.sampled_from([0.0, 0.1, 0.5, 0.7, 1.0])), st.data())
def test_auc_equals_pairwise_definition_with_ties(scores, data):
    labels = np.array(data.draw(st.lists(st.booleans(), min_size=len(scores), max_size=len(scores))))
    if labels.all() or not labels.any():
        with pytest.raises(ValueError):
            roc_auc(scores, labels)
        return
    assert roc_auc(scores, labels) == pytest.approx(pairwise_auc(scores, labels))


def test_precision_at_k_ranks_all_cells_and_caps_k():
    scores = np.array([[0.9, 0.1], [0.8, 0.2]])
    labels = np.array([[True, False], [False, True]])
    assert precision_at_k(scores, labels, 1) == 1.0
    assert precision_at_k(scores, labels, 2) == 0.5
    assert precision_at_k(scores, labels, 5) == 0.5  # k > n*m: all 4 cells


def test_documents_without_or_with_only_positive_cells_are_skipped():
    s = np.zeros((2, 2))
    assert document_metrics("d", s, None) is None
    assert document_metrics("d", s, []) is None
    assert document_metrics("d", s, [(0, 0), (0, 1), (1, 0), (1, 1)]) is None
    m = document_metrics("d", np.array([[1.0, 0.0], [0.0, 1.0]]), [(0, 0), (1, 1)])
    assert (m.auc, m.p_at_1, m.p_at_5) == (1.0, 1.0, 0.5)


def test_random_baseline_is_near_fifty():
    docs = [(f"d{i}", 5, 5, [(j, j) for j in range(5)]) for i in range(400)]
    r = random_baseline(docs, seed=1)
    assert 47 < r["auc"] < 53
    assert r["n_docs"] == 400


def test_within_document_gap_is_zero_for_a_flat_document_and_grows_with_the_links():
    from training.metrics import within_document_gap

    assert within_document_gap(np.full((3, 4), 0.7)) == pytest.approx(0.0)
    linked = np.full((3, 3), 0.1) + 0.6 * np.eye(3)
    assert within_document_gap(linked) == pytest.approx(0.7 - linked.mean())
    assert within_document_gap(linked) > within_document_gap(np.full((3, 3), 0.1) + 0.1 * np.eye(3))
    assert within_document_gap(np.ones((1, 1))) is None
    assert within_document_gap(np.array([[np.nan, 1.0]])) is None


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 5), st.integers(1, 5), st.integers(0, 10_000))
def test_within_document_gap_is_never_negative_and_ignores_a_shared_offset(n, m, seed):
    from training.metrics import within_document_gap

    scores = np.random.default_rng(seed).normal(size=(n, m))
    gap = within_document_gap(scores)
    if n * m < 2:
        assert gap is None
        return
    assert gap >= -1e-12  # the best matching is at least as good as the average matching
    assert within_document_gap(scores + 3.0) == pytest.approx(gap)  # a document-wide style adds nothing


def test_a_flat_within_document_signal_is_warned_about_and_a_rising_one_is_not():
    from training.metrics import FLAT_WITHIN_GAP, flat_within_warning

    flat = [{"epoch": e, "val_within": 0.01 + 0.001 * e} for e in range(5)]
    rising = [{"epoch": e, "val_within": 0.02 + 0.05 * e} for e in range(5)]
    warning = flat_within_warning(flat)
    assert warning and "stayed flat" in warning and "5 epochs" in warning
    assert flat_within_warning(rising) is None
    assert flat_within_warning([{"epoch": 0, "val_within": float("nan")}]) is None  # nothing to judge
    assert flat_within_warning([]) is None
    assert flat_within_warning([{"epoch": 0, "val_within": FLAT_WITHIN_GAP}]) is None


def test_the_flat_within_warning_names_a_strongly_confounded_training_split():
    from pipelines.confounds import SplitConfounds
    from training.metrics import flat_within_warning

    flat = [{"val_within": 0.02}, {"val_within": 0.03}]
    looked = SplitConfounds(
        documents=10, image_ratio=21.3, image_documents=10, text_share=0.05, text_documents=10
    )
    plain = SplitConfounds(
        documents=10, image_ratio=0.3, image_documents=10, text_share=0.0, text_documents=10
    )
    warning = flat_within_warning(flat, confounds=looked)
    assert "strongly confounded (image ratio 21.3, text share 0.05" in warning
    assert "confounded" not in flat_within_warning(flat, confounds=plain)
    assert flat_within_warning([{"val_within": 0.3}], confounds=looked) is None  # it learned: no warning


def test_link_structure_is_near_zero_for_flat_or_random_scores_and_high_for_links():
    from training.metrics import link_structure

    rng = np.random.default_rng(0)
    assert link_structure(np.full((3, 4), 0.4), rng) == pytest.approx(0.0)
    assert (
        link_structure(np.ones((1, 5)), rng) is None
        and link_structure(np.array([[np.nan, 1, 0], [0, 1, 0], [1, 0, 0]]), rng) is None
    )
    # two sentences or two images: the cells a 2 x 2 matching leaves are a matching too, so scores that
    # rank the links last would read as linked as scores that rank them first
    for shape in [(2, 2), (2, 5), (6, 2)]:
        assert link_structure(np.eye(*shape) + 0.1 * rng.normal(size=shape), rng) is None
    noise = [link_structure(rng.normal(size=(4, 5)), rng) for _ in range(300)]
    assert abs(np.mean(noise)) < 0.05
    linked = [link_structure(np.eye(5) + 0.1 * rng.normal(size=(5, 5)), rng) for _ in range(50)]
    assert np.mean(linked) > 0.4


def test_an_images_offset_pulls_link_structure_down_as_it_pulls_the_documents_auc():
    """A look that lifts every score of two of a document's five images (the bag on two looks a
    topic, issue #60) ranks their unlinked cells above the others' links: the AUC falls, and so
    must the criterion; in the double-centred cells' units it stayed the same, and the bag tied the GRU."""
    from training.metrics import document_metrics, link_structure

    rng = np.random.default_rng(0)
    links = [(i, i) for i in range(5)]
    clean, lifted, auc_clean, auc_lifted = [], [], [], []
    for _ in range(200):
        scores = np.eye(5) + 0.3 * rng.normal(size=(5, 5))
        offset = scores + np.array([1.5, 1.5, 0, 0, 0])  # images 0 and 1 share the look
        clean.append(link_structure(scores, rng, 64))
        lifted.append(link_structure(offset, rng, 64))
        auc_clean.append(document_metrics("d", scores, links).auc)
        auc_lifted.append(document_metrics("d", offset, links).auc)
    assert np.mean(auc_lifted) < np.mean(auc_clean) - 0.1
    assert np.mean(lifted) < 0.7 * np.mean(clean)  # centred-only units: the same (0.41 both)
    look = np.array([2.0, 2, 0, 0, 0])
    offset_only = [link_structure(rng.normal(size=(5, 5)) + look, rng, 64) for _ in range(100)]
    assert abs(np.mean(offset_only)) < 0.05  # offsets alone: chance (its draws keep them)


@given(st.integers(1, 6), st.integers(2, 6), st.integers(0, 1000), st.floats(0.1, 10), st.floats(-3, 3))
@settings(max_examples=30, deadline=None)
def test_link_structure_ignores_the_cosines_scale_and_offset(n, m, seed, scale, shift):
    """A model whose cosines spread wider, or sit higher, links no better: the criterion
    compares the GRU and the bag backbone (issue #60)."""
    from training.metrics import link_structure

    scores = np.random.default_rng(seed).normal(size=(n, m))
    a = link_structure(scores, np.random.default_rng(1))
    b = link_structure(scale * scores + shift, np.random.default_rng(1))
    assert (a is None) == (b is None) == (min(n, m) < 3)
    assert a is None or a == pytest.approx(b, abs=1e-9)
