"""The paper's per-source document filters and fixed-size splits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipelines.filters import PRESETS, DocumentFilter, filter_for
from pipelines.splits import assign_split, sized_assignment, split_rank_key
from schemas.errors import MmlinksError

LONG = "this caption has six real tokens"
SHORT = "too short"


def doc(sentences, n_images, links=None):
    return {
        "doc_id": "d",
        "sentences": sentences,
        "images": [{"i": k} for k in range(n_images)],
        "links": links,
    }


@pytest.mark.parametrize(
    ("sentences", "n_images", "rule"),
    [
        ([LONG, LONG], 2, None),
        ([LONG, SHORT], 2, "too_few_long_captions"),  # >= 2 captions of >= 5 tokens
        ([LONG, LONG], 1, "too_few_images"),
        ([LONG, LONG], 41, "too_many_images"),
        ([LONG] * 41, 2, "too_many_sentences"),
        ([LONG], 2, "too_few_sentences"),
        ([LONG] * 40, 40, None),  # the bounds are inclusive
    ],
)
def test_diy_rules(sentences, n_images, rule):
    kept, got, _ = PRESETS["diy"].apply(doc(sentences, n_images))
    assert got == rule
    assert (kept is None) == (rule is not None)


def test_wiki_keeps_first_100_sentences_and_cuts_their_links():
    sentences = [f"sentence number {k}" for k in range(150)]
    kept, rule, cut = PRESETS["wiki"].apply(doc(sentences, 3, links=[(5, 0), (120, 1)]))
    assert rule is None and len(kept["sentences"]) == 100 and kept["sentences"][-1] == "sentence number 99"
    assert kept["links"] == [(5, 0)] and cut == 1
    assert PRESETS["wiki"].apply(doc(sentences[:9], 3))[1] == "too_few_sentences"
    assert PRESETS["wiki"].apply(doc(sentences[:10], 2))[1] == "too_few_images"


def test_recipeqa_needs_a_linked_image():
    assert PRESETS["recipeqa"].apply(doc([LONG, LONG], 2, links=[]))[1] == "too_few_links"
    assert PRESETS["recipeqa"].apply(doc([LONG, LONG], 2, links=[(0, 1)]))[1] is None
    # unlabelled documents (links = null) are not held to a link rule
    assert PRESETS["recipeqa"].apply(doc([LONG, LONG], 2, links=None))[1] is None


def test_sources_get_their_preset_and_overrides_apply():
    assert filter_for("diy") == PRESETS["diy"]
    assert filter_for("synthetic") == PRESETS["none"]
    f = filter_for("diy", overrides={"max_images": "20", "max_sentences": "none"})
    assert f.max_images == 20 and f.max_sentences is None
    with pytest.raises(MmlinksError, match="unknown filter option"):
        filter_for("diy", overrides={"max_imgs": "3"})
    with pytest.raises(MmlinksError, match="unknown filter preset"):
        filter_for("diy", preset="reddit")
    with pytest.raises(MmlinksError, match="integer"):
        filter_for("diy", overrides={"max_images": "many"})


@given(st.lists(st.text(max_size=8), max_size=30), st.integers(0, 45), st.integers(0, 45))
def test_a_kept_document_satisfies_every_rule(words, n_sent, n_images):
    rules = DocumentFilter(first_sentences=30, min_sentences=2, max_sentences=25, min_images=2, max_images=40)
    sentences = [" ".join(words[: k % (len(words) + 1)]) or "x" for k in range(n_sent)]
    kept, rule, _ = rules.apply(doc(sentences, n_images))
    if kept is not None:
        assert 2 <= len(kept["sentences"]) <= 25 and 2 <= len(kept["images"]) <= 40
    else:
        expected_fail = not (2 <= min(n_sent, 30) <= 25 and 2 <= n_images <= 40)
        assert expected_fail and rule


@given(st.sets(st.text(min_size=1, max_size=12), max_size=60), st.integers(0, 20), st.integers(0, 20))
def test_sized_splits_take_the_lowest_ranked_documents(ids, n_test, n_val):
    ranked = sorted(ids, key=split_rank_key)
    got = sized_assignment(ranked, {"test": n_test, "val": n_val})
    assert [i for i in ranked if got.get(i) == "test"] == ranked[:n_test]
    assert [i for i in ranked if got.get(i) == "val"] == ranked[n_test : n_test + n_val]
    # the same ids in any other order give the same assignment
    assert sized_assignment(sorted(ids, key=split_rank_key), {"test": n_test, "val": n_val}) == got


@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=50, unique=True))
def test_ratio_splits_do_not_depend_on_other_documents(ids):
    alone = {i: assign_split(i) for i in ids}
    assert all(assign_split(i) == alone[i] for i in reversed(ids))


def test_user_filter_options_are_laid_over_the_sources_defaults():
    from pipelines.build_config import BuildConfig

    cfg = BuildConfig.for_source(
        "mscoco", "in", "out", filter_options={"max_sentences": "12"}, dedupe_threshold=3
    )
    assert cfg.filter_options == {"min_images": "10", "max_sentences": "12"}
    assert cfg.dedupe_threshold == 3  # a scalar the user gives replaces the source's default
    assert cfg.document_filter().min_images == 10
    assert BuildConfig.for_source(
        "mscoco", "in", "out", filter_options={"min_images": "9"}
    ).filter_options == {"min_images": "9"}
