"""The feature-level corpus family (``mmlinks data synth-features``, issues #44 and #47)."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.confounds import dataset_confounds
from pipelines.feature_corpus import (
    DIGIT_WORDS,
    FeatureCorpusConfig,
    _world,
    split_documents,
    write_feature_corpus,
)
from schemas.errors import MmlinksError
from schemas.manifest import Manifest
from schemas.shards import read_documents

SMALL = dict(docs=60, val_docs=12, test_docs=12, topics=5, dim=32)


def _docs(root):
    m = Manifest.read(root)
    return m, {s: read_documents(m.shard_paths(root, s)) for s in ("train", "val", "test")}


def test_dataset_layout_links_and_splits(tmp_path):
    cfg = FeatureCorpusConfig(**SMALL, shard_docs=25, extra_sentences=1)
    write_feature_corpus(tmp_path / "ds", cfg)
    m, docs = _docs(tmp_path / "ds")  # shard_paths verifies every shard's size and sha256
    assert m.counts["splits"] == {"train": 60, "val": 12, "test": 12}
    assert m.feature_extractor.dim == 32 and m.source == "feature-synth"
    assert len([s for s in m.shards if s.split == "train"]) == 3  # 25 + 25 + 10
    assert all(d.split == split for split, ds in docs.items() for d in ds)
    for d in docs["train"]:
        assert cfg.images_min <= len(d.images) <= cfg.images_max
        assert len(d.sentences) == len(d.images) + 1  # one distractor
        linked = {s for s, _ in d.links}
        assert sorted(i for _, i in d.links) == list(range(len(d.images)))
        for s, text in enumerate(d.sentences):
            named = [w for w in text.split() if w in DIGIT_WORDS]
            assert len(named) == (1 if s in linked else 0)  # a linked sentence names one digit
        digits = [next(w for w in d.sentences[s].split() if w in DIGIT_WORDS) for s, _ in d.links]
        assert len(set(digits)) == len(digits)  # distinct digits: each sentence has one right image
        assert all(len(im.features) == 32 for im in d.images)


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        write_feature_corpus(tmp_path / name, FeatureCorpusConfig(**SMALL, seed=seed))
    a, b, c = (Manifest.read(tmp_path / n) for n in "abc")
    assert a.dataset_version == b.dataset_version != c.dataset_version
    assert [s.sha256 for s in a.shards] == [s.sha256 for s in b.shards]


def test_corpora_written_before_the_topic_skew_are_byte_identical(tmp_path):
    """The skew's default draws topics as before it existed: the dataset versions of two corpora
    written by the code before it (issue #44's rule: today's corpora stay byte-identical)."""
    write_feature_corpus(tmp_path / "a", FeatureCorpusConfig(**SMALL, seed=3))
    write_feature_corpus(
        tmp_path / "b",
        FeatureCorpusConfig(**SMALL, seed=3, look_sharing="topic+document", look_mixing="clipped"),
    )
    assert Manifest.read(tmp_path / "a").dataset_version == "ecac981991b44bc0"
    assert Manifest.read(tmp_path / "b").dataset_version == "227751d1d3eb476b"


def test_a_topic_skew_gives_zipf_sized_topics():
    """``--topic-skew 1``: topic r's share of documents follows 1 / (r + 1), as in forums where a
    few project types hold most posts; 0 keeps them equal."""
    cfg = dict(SMALL, topics=10, docs=6000)
    for skew in (0.0, 1.0):
        world = _world(FeatureCorpusConfig(**cfg, topic_skew=skew))
        topics = [d["topic"] for d in split_documents(world, "train", 6000)]
        share = np.bincount(topics, minlength=10) / 6000
        want = np.arange(1, 11, dtype=float) ** -skew
        assert np.abs(share - want / want.sum()).max() < 0.02


def test_a_second_write_into_a_dataset_is_refused(tmp_path):
    write_feature_corpus(tmp_path / "ds", FeatureCorpusConfig(**SMALL))
    with pytest.raises(MmlinksError, match="already holds a dataset"):
        write_feature_corpus(tmp_path / "ds", FeatureCorpusConfig(**SMALL))


def test_bad_options_are_refused_in_one_line():
    with pytest.raises(MmlinksError, match="look_sharing"):
        FeatureCorpusConfig(look_sharing="album")
    with pytest.raises(MmlinksError, match="images_min"):
        FeatureCorpusConfig(images_min=6, images_max=4)


def test_topic_looks_are_shared_by_a_topic_and_document_looks_are_not():
    def look_of(sharing):
        world = _world(FeatureCorpusConfig(**SMALL, look_sharing=sharing, look_strength=4.0))
        docs = list(split_documents(world, "train", 60))
        none = list(split_documents(_world(FeatureCorpusConfig(**SMALL, look_sharing="none")), "train", 60))
        # same draws apart from the look: the mean shift of each document is its look
        return [(d["topic"], (d["features"] - n["features"]).mean(0)) for d, n in zip(docs, none)]

    def same_topic_cosine(pairs):
        cos = []
        for i, (ti, li) in enumerate(pairs):
            for tj, lj in pairs[i + 1 :]:
                if ti == tj:
                    cos.append(li @ lj / (np.linalg.norm(li) * np.linalg.norm(lj)))
        return float(np.mean(cos))

    assert same_topic_cosine(look_of("topic")) > 0.99
    assert abs(same_topic_cosine(look_of("document"))) < 0.2


@settings(max_examples=6, deadline=None)
@given(mixing=st.sampled_from(["added", "clipped"]), low=st.floats(0.3, 1.5), gain=st.floats(1.5, 3.0))
def test_a_stronger_look_gives_a_higher_image_ratio(tmp_path_factory, mixing, low, gain):
    ratios = []
    for strength in (low, low * gain):
        out = tmp_path_factory.mktemp("ratio")
        cfg = FeatureCorpusConfig(**{**SMALL, "docs": 150}, look_mixing=mixing, look_strength=strength)
        write_feature_corpus(out / "ds", cfg)
        ratios.append(dataset_confounds(out / "ds", ["train"])["train"].image_ratio)
    assert ratios[1] > ratios[0]


def test_clipped_features_are_never_negative_and_added_ones_can_be():
    for mixing, negative in (("clipped", False), ("added", True)):
        world = _world(FeatureCorpusConfig(**SMALL, look_mixing=mixing, look_strength=3.0))
        feats = np.concatenate([d["features"] for d in split_documents(world, "train", 30)])
        assert bool((feats < 0).any()) is negative


def test_test_bitmaps_are_never_seen_in_training():
    world = _world(FeatureCorpusConfig(**SMALL))
    train = {int(r) for rows in world.pools["train"].values() for r in rows}
    test = {int(r) for rows in world.pools["test"].values() for r in rows}
    assert train and test and not train & test


def test_hessel_layout_is_what_import_hessel_reads(tmp_path):
    cfg = FeatureCorpusConfig(**SMALL, layout="hessel")
    write_feature_corpus(tmp_path / "raw", cfg)
    docs = json.loads((tmp_path / "raw" / "docs.json").read_text())
    id2row = json.loads((tmp_path / "raw" / "id2row.json").read_text())
    feats = np.load(tmp_path / "raw" / "features.npy")
    assert {k: len(v) for k, v in docs.items()} == {"train": 60, "val": 12, "test": 12}
    assert feats.shape == (len(id2row), 32)
    images, sentences, meta = docs["train"][0]
    assert meta.startswith("topic-")
    for image_id, s in images:  # the image side names its sentence, the sentence side its image
        assert sentences[s][1] == [i for i, _ in images].index(image_id)


@pytest.mark.slow
def test_cli_writes_a_dataset_that_import_hessel_and_inspect_read(tmp_path):
    from cli.main import main

    raw = tmp_path / "raw"
    args = ["--docs", "40", "--val-docs", "10", "--test-docs", "10", "--topics", "4", "--dim", "16"]
    assert main(["data", "synth-features", "--out", str(raw), "--layout", "hessel", "--quiet", *args]) == 0
    ds = tmp_path / "ds"
    assert (
        main(
            [
                "data", "import-hessel", "--docs", str(raw / "docs.json"),
                "--features", str(raw / "features.npy"), "--id2row", str(raw / "id2row.json"),
                "--out", str(ds),
            ]
        )
        == 0
    )  # fmt: skip
    m, docs = _docs(ds)
    assert m.counts["splits"] == {"train": 40, "val": 10, "test": 10}
    assert all(d.links for d in docs["test"])


def test_the_options_of_issue_60_leave_earlier_corpora_byte_identical(tmp_path):
    """Each new option at its old value draws nothing new and is not named in the manifest: the
    corpus keeps its bytes and version id."""
    base = dict(SMALL, seed=5, look_mixing="clipped")
    write_feature_corpus(tmp_path / "a", FeatureCorpusConfig(**base))
    write_feature_corpus(
        tmp_path / "b",
        FeatureCorpusConfig(**base, looks_per_topic=1, look_share=1.0, feature_noise=0.0, extra_images=0),
    )
    a, b = Manifest.read(tmp_path / "a"), Manifest.read(tmp_path / "b")
    assert a.dataset_version == b.dataset_version
    assert not {"looks_per_topic", "extra_images"} & set(a.build_params["feature_corpus"])
    write_feature_corpus(tmp_path / "c", FeatureCorpusConfig(**base, looks_per_topic=3))
    c = Manifest.read(tmp_path / "c")
    assert c.dataset_version != a.dataset_version and c.build_params["feature_corpus"]["looks_per_topic"] == 3


def _plain_and(cfg_kw: dict, n: int = 40) -> tuple[list[dict], list[dict]]:
    """The documents of the same corpus without a look and with ``cfg_kw``'s."""
    plain = _world(FeatureCorpusConfig(**SMALL, look_sharing="none"))
    looked = _world(FeatureCorpusConfig(**SMALL, **cfg_kw))
    return list(split_documents(plain, "train", n)), list(split_documents(looked, "train", n))


def test_several_looks_per_topic_give_the_images_of_one_document_different_looks():
    plain, looked = _plain_and(dict(look_strength=4.0, looks_per_topic=3))
    differs = 0
    for p, d in zip(plain, looked, strict=True):
        look = d["features"] - p["features"]  # added mixing: the look itself
        kinds = {tuple(np.round(row, 2)) for row in look}
        assert 1 <= len(kinds) <= 3  # one of the topic's three looks per image
        differs += len(kinds) > 1
    assert differs > len(looked) / 2  # most documents mix looks


def test_a_look_share_leaves_some_images_plain_and_noise_spreads_every_image():
    plain, shared = _plain_and(dict(look_strength=4.0, look_share=0.5), n=60)
    carried = [
        bool(np.abs(d["features"][k] - p["features"][k]).max() > 0)
        for p, d in zip(plain, shared)
        for k in range(len(d["features"]))
    ]
    assert 0.35 < np.mean(carried) < 0.65
    _, noisy = _plain_and(dict(look_sharing="none", feature_noise=1.0), n=60)
    for p, d in zip(plain, noisy, strict=True):
        assert not np.allclose(p["features"], d["features"])
        assert [s for s in p["sentences"]] == d["sentences"]  # the noise's own stream: same text


@given(st.integers(11, 15), st.integers(0, 10))
@settings(max_examples=10, deadline=None)
def test_above_ten_images_a_digit_repeats_at_most_twice(n_img, seed):
    world = _world(FeatureCorpusConfig(**{**SMALL, "docs": 3}, images_min=n_img, images_max=n_img, seed=seed))
    for d in split_documents(world, "train", 3):
        digits = [next(w for w in d["sentences"][s].split() if w in DIGIT_WORDS) for s, _ in d["links"]]
        assert len(digits) == n_img and max(digits.count(x) for x in digits) <= 2
        assert len(set(digits)) == 10


def test_images_per_document_beyond_fifteen_are_refused():
    with pytest.raises(MmlinksError, match="images_max"):
        FeatureCorpusConfig(images_max=16)
    with pytest.raises(MmlinksError, match="images_max \\+ extra_images"):  # a distractor's digit is unnamed
        FeatureCorpusConfig(images_min=4, images_max=8, extra_images=3)


@given(st.integers(2, 6), st.integers(1, 4), st.integers(0, 10))
@settings(max_examples=12, deadline=None)
def test_distractor_images_show_a_digit_no_sentence_names_and_the_links_find_the_rest(n_img, n_extra, seed):
    """``extra_images``: each document gains unlinked images at random places; every linked
    sentence still points at the image of the digit it names (the same image as in the corpus
    without distractors), and no sentence names a distractor's digit."""
    from pipelines.feature_corpus import content_features

    kw = dict(SMALL, docs=8, images_min=n_img, images_max=n_img, look_sharing="none", seed=seed)
    world = _world(FeatureCorpusConfig(**kw, extra_images=n_extra))
    bitmaps = content_features(world.pixels, 32)  # every bitmap's features (no look, no noise)

    def digit_of(f: np.ndarray) -> int:
        gap = np.abs(bitmaps - f).max(1)
        assert gap.min() < 1e-4  # an image is a bitmap's features (stored as float32)
        return int(world.labels[gap.argmin()])

    plain = list(split_documents(_world(FeatureCorpusConfig(**kw)), "train", 8))
    moved = 0
    for p, d in zip(plain, split_documents(world, "train", 8), strict=True):
        assert len(d["features"]) == n_img + n_extra and d["sentences"] == p["sentences"]
        shown = [digit_of(f) for f in d["features"]]
        named = set()
        for (s, im), (ps, pim) in zip(d["links"], p["links"], strict=True):
            word = next(w for w in d["sentences"][s].split() if w in DIGIT_WORDS)
            assert s == ps and DIGIT_WORDS[shown[im]] == word  # the link finds the digit it names
            np.testing.assert_array_equal(d["features"][im], p["features"][pim])
            named.add(shown[im])
            moved += im != pim
        unlinked = set(range(len(shown))) - {im for _, im in d["links"]}
        assert len(unlinked) == n_extra and not {shown[k] for k in unlinked} & named
    assert moved > 0  # the distractors sit among the linked images, not only after them
