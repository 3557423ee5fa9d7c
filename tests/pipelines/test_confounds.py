"""The confound figures (issue #33): the image ratio and the text share, against their definition."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pipelines.confounds import image_ratio, split_confounds, text_share


def _oracle_ratio(docs: list[np.ndarray]) -> float:
    """The issue's definition, written out one document at a time."""
    allx = np.concatenate(docs).astype(np.float64)
    mean, std = allx.mean(0), allx.std(0)
    keep = std > 1e-12
    between, within = [], []
    for m in docs:
        if len(m) < 2:
            continue
        z = (m[:, keep] - mean[keep]) / std[keep]
        c = z.mean(0)
        between.append(np.sum((c - 0.0) ** 2))  # the global mean of standardised features is 0
        within.append(np.mean([np.sum((row - c) ** 2) for row in z]))
    return float(np.mean(between) / np.mean(within))


docs_strategy = st.lists(st.tuples(st.integers(1, 5), st.integers(0, 10_000)), min_size=3, max_size=12).map(
    lambda spec: [np.random.default_rng(seed).normal(size=(n, 4)) * (1 + seed % 3) for n, seed in spec]
)


@settings(max_examples=60, deadline=None)
@given(docs_strategy)
def test_the_image_ratio_is_the_definition(docs):
    if sum(len(d) >= 2 for d in docs) == 0:
        assert image_ratio(docs)[0] is None
        return
    got, n = image_ratio(docs)
    assert n == sum(len(d) >= 2 for d in docs)
    assert got == pytest.approx(_oracle_ratio(docs), rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(docs_strategy, st.floats(0.1, 50), st.floats(-5, 5))
def test_the_image_ratio_ignores_the_units_of_each_dimension(docs, scale, shift):
    if not any(len(d) >= 2 for d in docs):
        return
    scaled = [d * np.array([scale, 1.0, 2.0, 1.0]) + shift for d in docs]
    assert image_ratio(scaled)[0] == pytest.approx(image_ratio(docs)[0], rel=1e-6)


def test_a_shared_look_per_document_raises_the_ratio():
    rng = np.random.default_rng(0)
    content = [rng.normal(size=(5, 16)) for _ in range(50)]
    plain = image_ratio(content)[0]
    looked = image_ratio([c + 6 * rng.normal(size=16) for c in content])[0]
    assert plain < 0.5 < 10 < looked


def test_the_text_share_counts_words_that_most_sentences_of_a_document_share():
    # Per document: two topic words in all 3 sentences, two words of its own in each sentence, and
    # "the" everywhere (in every document: not content).
    topic = [[f"the topic{d}a topic{d}b word{d}{k}x word{d}{k}y" for k in range(3)] for d in range(5)]
    share, n = text_share(topic, max_df=0.25)
    assert n == 5
    assert share == pytest.approx(0.5)  # 6 topic occurrences of the 12 content tokens per document
    plain = [[s.split(" ", 3)[-1] for s in doc] for doc in topic]
    assert text_share(plain, max_df=0.25)[0] == 0.0
    # A word in two of three sentences is "in most of them"; in one of three, not.
    two = [[f"topic{d} word{d}{k}" if k < 2 else f"word{d}{k}" for k in range(3)] for d in range(5)]
    assert text_share(two, max_df=0.25)[0] == pytest.approx(2 / 5)


def test_a_split_with_single_image_documents_has_no_ratio():
    from schemas.document import Document, ImageRecord

    doc = Document("d", "s", "train", ["a b"], [ImageRecord("c", "u", 1, 1, 0, [1.0, 2.0])])
    figures = split_confounds([doc, doc])
    assert figures.image_ratio is None and figures.image_documents == 0 and figures.documents == 2


def test_the_residual_drops_up_to_48_directions_a_quarter_of_the_width_and_of_the_documents():
    from pipelines.confounds import residual_directions

    assert residual_directions(1280, 5000) == 48
    assert residual_directions(128, 5000) == 32  # a quarter of the width
    assert residual_directions(1280, 101) == 25  # a quarter of the 100 directions 101 means span
    assert residual_directions(63, 5000) == 0 and residual_directions(1280, 64) == 0  # under 16


def test_a_split_reports_the_residual_ratio_where_there_are_directions_to_drop():
    from pipelines.confounds import residual_directions
    from schemas.document import Document, ImageRecord

    rng = np.random.default_rng(0)

    def docs(dim: int, n: int = 200) -> list:
        looks = rng.normal(size=(3, dim)) * 4  # three topics' looks
        return [
            Document(
                f"d{i}",
                "s",
                "train",
                ["a b"],
                [
                    ImageRecord(f"c{i}{k}", "u", 1, 1, k, list(looks[i % 3] + rng.normal(size=dim)))
                    for k in range(4)
                ],
            )
            for i in range(n)
        ]

    wide = docs(192)
    figures = split_confounds(wide)
    feats = [np.array([im.features for im in d.images]) for d in wide]
    r = residual_directions(192, len(wide))
    assert r == 48
    assert figures.image_residual == pytest.approx(image_ratio(feats, drop_directions=r)[0])
    assert figures.image_residual < 1 < figures.image_ratio  # three looks: dropped with their directions
    narrow, few = split_confounds(docs(63)), split_confounds(docs(192, n=60))
    assert narrow.image_ratio > 1 and narrow.image_residual is None
    assert few.image_ratio > 1 and few.image_residual is None


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 6), st.floats(3, 10))
def test_the_residual_ratio_drops_a_look_a_few_topics_share_but_not_one_per_document(seed, topics, strength):
    """issue #44: a look shared by K <= r topics lies in K directions of the document means, so
    dropping r principal directions leaves about the unconfounded corpus's ratio; a look per
    document spreads over every direction and stays."""
    rng = np.random.default_rng(seed)
    dim, r = 48, 8
    content = [rng.normal(size=(int(rng.integers(3, 7)), dim)) for _ in range(120)]
    looks = strength * rng.normal(size=(topics, dim))
    shared = [c + looks[i % topics] for i, c in enumerate(content)]
    own = [c + strength * rng.normal(size=dim) for c in content]
    plain = image_ratio(content)[0]
    assert image_ratio(shared, drop_directions=0) == image_ratio(shared)
    # a strong shared look is the premise: two topics whose random looks nearly coincide leave the
    # standardised documents little to tell apart (seed 687, 2 topics: 4.7x the plain ratio)
    assume(image_ratio(shared)[0] > 5 * plain)
    assert image_ratio(shared, drop_directions=r)[0] < 1.5 * plain + 0.05
    assert image_ratio(own, drop_directions=r)[0] > 0.6 * image_ratio(own)[0]


def test_the_residual_ratio_is_the_ratio_of_the_projected_features():
    """The oracle: project the standardised features off the top principal directions of the
    document means, then the ratio's definition on what is left (documents with >= 2 images)."""
    rng = np.random.default_rng(3)
    docs = [rng.normal(size=(int(rng.integers(1, 6)), 6)) + rng.normal(size=6) for _ in range(30)]
    allx = np.concatenate(docs)
    z = [(d - allx.mean(0)) / allx.std(0) for d in docs if len(d) >= 2]
    _, _, vt = np.linalg.svd(np.stack([m.mean(0) for m in z]), full_matrices=False)
    left = [m - m @ vt[:2].T @ vt[:2] for m in z]
    between = np.mean([np.sum(m.mean(0) ** 2) for m in left])
    within = np.mean([np.mean(np.sum((m - m.mean(0)) ** 2, 1)) for m in left])
    assert image_ratio(docs, drop_directions=2)[0] == pytest.approx(between / within, rel=1e-9)


def _look_corpus(n_docs: int, n_img: int, strength: float, seed: int = 0) -> list[np.ndarray]:
    """Documents whose images share a look of their own (``strength`` x the content's spread)."""
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(n_img, 16)) + strength * rng.normal(size=16) for _ in range(n_docs)]


def test_the_corrected_ratio_reads_one_look_alike_at_two_and_at_fifteen_images():
    """The plain ratio of one look grows as documents hold fewer images (a mean of n images
    carries 1/n of their spread); the corrected one stays (issue #60)."""
    from pipelines.confounds import corrected_image_ratio

    few, many = _look_corpus(3000, 2, 1.0), _look_corpus(400, 15, 1.0)
    assert image_ratio(few)[0] > 1.3 * image_ratio(many)[0]
    a, b = corrected_image_ratio(few), corrected_image_ratio(many)
    assert abs(a - b) < 0.15 * b and 0.8 < b < 1.2  # the look's variance / the content's: 1
    assert abs(corrected_image_ratio(_look_corpus(2000, 3, 0.0))) < 0.05  # no look: 0
    assert corrected_image_ratio([np.ones((1, 4))]) is None


def test_the_similarity_gap_sees_a_gain_look_the_ratio_barely_sees():
    """A look that multiplies the channels (a gain, issue #60's held-out structure) moves the
    variance ratio little but makes a document's images alike; unrelated images give ~0."""
    from pipelines.confounds import similarity_gap

    rng = np.random.default_rng(1)
    content = [np.abs(rng.normal(size=(5, 32))) for _ in range(400)]
    gained = [c * np.exp(1.5 * rng.normal(size=32)) for c in content]
    assert abs(similarity_gap(content)) < 0.05
    assert similarity_gap(gained) > 0.2
    assert similarity_gap([np.ones((1, 4)), np.ones((2, 4))]) is None
    figures = split_confounds([_Doc(f) for f in gained[:50]])
    assert figures.image_similarity_gap > 0.2 and figures.image_ratio_corrected is not None


class _Doc:
    """The two fields ``split_confounds`` reads of a ``schemas.document.Document``."""

    def __init__(self, feats):
        self.images = [type("Image", (), {"features": f})() for f in feats]
        self.sentences = ["a b", "c d"]
