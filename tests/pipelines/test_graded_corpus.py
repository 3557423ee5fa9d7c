"""The graded-salience coherence corpus (issue #45, `data synth-coherence --salience graded`):
the truth each pair carries, its held-out digit bitmaps, and today's corpora left as they were."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipelines.coherence_corpus import (
    BACKDROPS,
    DIGIT_WORDS,
    GRADED_RELATIONS,
    INKS,
    CoherenceSynthConfig,
    digit_bitmaps,
    doc_id,
    generate_pair,
    write_coherence_corpus,
)
from schemas.errors import MmlinksError
from schemas.manifest import ATTRIBUTE_PREFIX, NAMED_KEY, pair_attributes


def _digest(cfg: CoherenceSynthConfig) -> str:
    digest = hashlib.sha256()
    splits = cfg.assigned_splits()
    for i in range(cfg.pairs):
        rec, img = generate_pair(cfg, i, None if splits is None else splits.get(doc_id(cfg, i), "train"))
        digest.update(json.dumps(rec, sort_keys=True).encode())
        digest.update(img.tobytes())
    return digest.hexdigest()


def test_todays_corpora_keep_their_bytes_with_salience_off(tmp_path):
    """Records and pixels pinned before --salience existed (default and split/confound options),
    and corpus.json's keys: datasets built from them stay byte-identical."""
    assert _digest(CoherenceSynthConfig(pairs=12, image_size=48, seed=3)) == (
        "86fa96f0f9fb43f60f4b1bc4c7a5e915c5040db9dce99a7492dee6940c14e620"
    )
    confound = CoherenceSynthConfig(
        pairs=12,
        image_size=48,
        seed=1,
        objects=5,
        split_sizes={"val": 3, "test": 3},
        train_states="one",
        state_look="brush",
    )
    assert _digest(confound) == "51b93aae1710f0565fbd6e13fba19a6a3952da7c5c2594289d8229ed8c75524c"
    write_coherence_corpus(tmp_path, CoherenceSynthConfig(pairs=2, image_size=32))
    meta = json.loads((tmp_path / "corpus.json").read_text())
    assert "salience" not in meta and "digit_scale" not in meta
    assert meta["relations"] == ["Visible", "Action", "Story"]


def _graded(**kw) -> CoherenceSynthConfig:
    return CoherenceSynthConfig(**{"pairs": 200, "image_size": 64, "salience": "graded", **kw})


def test_each_caption_names_exactly_its_named_attributes_with_the_images_values():
    cfg = _graded()
    relations = set()
    for i in range(cfg.pairs):
        rec, img = generate_pair(cfg, i)
        values, named = pair_attributes(rec["metadata"])
        assert set(values) == {"digit", "ink", "backdrop"}
        words = rec["sentences"][0].split()
        assert ("digit" in named) == (DIGIT_WORDS[int(values["digit"])] in words)
        assert ("ink" in named) == (values["ink"] in words)
        assert ("backdrop" in named) == (values["backdrop"] in words)
        # no caption names another value of an attribute than the image's
        assert not set(words) & (set(DIGIT_WORDS) - {DIGIT_WORDS[int(values["digit"])]})
        assert not set(words) & ((set(INKS) | set(BACKDROPS)) - {values["ink"], values["backdrop"]})
        relations.add(rec["metadata"]["relations"])
        assert img.size == (64, 64)
    assert relations == set(GRADED_RELATIONS)


def test_the_ink_is_drawn_and_the_backdrop_dominates():
    """The image's most common colour is its backdrop's, and some pixels are the ink's."""
    cfg = _graded(pairs=30)
    for i in range(cfg.pairs):
        rec, img = generate_pair(cfg, i)
        values, _ = pair_attributes(rec["metadata"])
        colours = dict((c, n) for n, c in img.getcolors(64 * 64))
        assert colours.get(INKS[values["ink"]], 0) > 0
        assert max(colours.values()) > 64 * 64 / 3 and max(colours.values()) != colours.get(
            INKS[values["ink"]]
        )


def test_evaluation_pairs_draw_held_out_bitmaps():
    """With the generator's splits, no val/test pair shares a digit bitmap with a training pair,
    and each pair's digit is its bitmap's label."""
    cfg = _graded(pairs=150, split_sizes={"val": 20, "test": 40})
    _, labels = digit_bitmaps()
    splits = cfg.assigned_splits()
    used: dict[bool, set[int]] = {True: set(), False: set()}
    for i in range(cfg.pairs):
        split = splits.get(doc_id(cfg, i), "train")
        rec, _ = generate_pair(cfg, i, split)
        pick = int(rec["metadata"]["bitmap"])
        assert rec["metadata"]["attr.digit"] == str(int(labels[pick]))
        used[split == "train"].add(pick)
    assert used[True] and used[False] and not used[True] & used[False]
    assert len(used[True]) > 60  # many bitmaps, not one per digit


def test_the_written_corpus_carries_the_graded_vocabulary(tmp_path):
    write_coherence_corpus(tmp_path, _graded(pairs=5))
    meta = json.loads((tmp_path / "corpus.json").read_text())
    assert meta["relations"] == list(GRADED_RELATIONS) and meta["salience"] == "graded"
    rec = json.loads((tmp_path / "documents.jsonl").read_text().splitlines()[0])
    assert rec["metadata"][NAMED_KEY] is not None and ATTRIBUTE_PREFIX + "digit" in rec["metadata"]


def test_graded_refuses_the_painting_confound_options():
    with pytest.raises(MmlinksError, match="salience graded"):
        _graded(objects=3)


@given(
    st.dictionaries(st.sampled_from(["digit", "ink", "x"]), st.text(max_size=3), max_size=3),
    st.lists(st.sampled_from(["digit", "ink", "x", "nope", ""]), max_size=4),
)
def test_pair_attributes_reads_only_attributes_the_pair_has(values, named):
    meta = {ATTRIBUTE_PREFIX + k: v for k, v in values.items()}
    meta[NAMED_KEY] = ",".join(named)
    meta["relations"] = "Visible"
    got, got_named = pair_attributes(meta)
    assert got == values
    assert got_named == {n for n in named if n in values}
    assert pair_attributes(None) == ({}, set())
