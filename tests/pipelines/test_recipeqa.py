"""RecipeQA: streamed split files, one document per recipe, links per step, bad input dead-lettered."""

from __future__ import annotations

import io
import json
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.sources import get_spec
from pipelines.sources.jsonstream import MalformedJson, has_invalid_utf8, stream_arrays, text_chunks
from pipelines.sources.recipeqa import (
    MergeContexts,
    image_file_name,
    merge_candidates,
    parse_item,
    recipe_document,
)
from schemas.errors import MmlinksError
from tests.fixtures.crowd import collect_source
from tests.fixtures.recipeqa import BAD_BYTES_MARK, Recipe, default_recipes, item, write_recipeqa

# --- the streaming JSON reader ------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


def _encode(obj, style: int) -> bytes:
    kwargs = [{}, {"indent": 1}, {"separators": (",", ":")}, {"ensure_ascii": False, "indent": "\t"}][style]
    return json.dumps(obj, **kwargs).encode()


@settings(max_examples=150, deadline=None)
@given(
    data=st.lists(json_values, max_size=8),
    other=st.dictionaries(st.text(max_size=5).filter(lambda k: k != "data"), json_values, max_size=3),
    data_first=st.booleans(),
    style=st.integers(0, 3),
    chunk=st.integers(1, 64),
)
def test_stream_arrays_yields_exactly_what_json_loads_reads(data, other, data_first, style, chunk):
    doc = {"data": data, **other} if data_first else {**other, "data": data}
    raw = _encode(doc, style)
    got = [v for _, v in stream_arrays(text_chunks(io.BytesIO(raw), chunk), {"data"}, {"data"})]
    assert got == json.loads(raw)["data"]


@settings(max_examples=150, deadline=None)
@given(data=st.lists(json_values, min_size=1, max_size=6), style=st.integers(0, 3), chunk=st.integers(1, 16))
def test_a_cut_file_raises_after_a_prefix_of_the_items(data, style, chunk):
    raw = _encode({"data": data}, style)
    cut = random.Random(len(raw)).randrange(len(raw))
    got = []
    with pytest.raises(MalformedJson):
        for _, v in stream_arrays(text_chunks(io.BytesIO(raw[:cut]), chunk), {"data"}, {"data"}):
            got.append(v)
    # every item but the last one read is whole (a number can be cut to a shorter number)
    assert got[:-1] == data[: max(0, len(got) - 1)]


@pytest.mark.parametrize(
    "raw",
    [
        b"[1, 2]",
        b'{"data": {"a": 1}}',
        b'{"items": []}',
        b'{"data": [1,, 2]}',
        b'{"data": []} []',
        b"",
        b"not json",
        b'{"data": [' + b"[" * 5000 + b"]" * 5000 + b"]}",  # past Python's recursion limit
        b'{"data": [' + b"[" * 100 + b"]" * 100 + b"]}",  # past the cap of 100 levels
        b'{"x": ' + b'{"a":' * 3000 + b"1" + b"}" * 3000 + b', "data": []}',  # a deep skipped member
        b'{"data": [' + b"9" * 5000 + b"]}",  # past Python's 4300-digit integer conversion limit
    ],
)
def test_not_an_object_with_a_data_list_is_malformed(raw):
    with pytest.raises(MalformedJson):
        list(stream_arrays(text_chunks(io.BytesIO(raw), 3), {"data"}, {"data"}))


def test_invalid_utf8_is_kept_apart_per_item_and_characters_survive_chunk_edges():
    raw = '{"data": ["h\u00e9llo \u4e16\u754c", "ok"]}'.encode().replace(b"ok", b"o\xffk")
    items = [v for _, v in stream_arrays(text_chunks(io.BytesIO(raw), 1), {"data"})]
    assert items[0] == "h\u00e9llo \u4e16\u754c" and not has_invalid_utf8(items[0])
    assert has_invalid_utf8(items[1]) and has_invalid_utf8({"k": [items[1]]})


# --- pure pieces --------------------------------------------------------------------------------


def _candidate(task, qid, titled, n_steps, images=1, with_images=None, recipe_id="r"):
    recipe = Recipe(
        recipe_id,
        "train",
        [(f"T{k}", f"body {k}", [f"i{k}_{m}.jpg" for m in range(images)]) for k in range(n_steps)],
    )
    return parse_item(item(task, qid, recipe, titled=titled, images=with_images))


def _step(sid, title, body, images):
    return {"id": sid, "title": title, "body": body, "images": images}


def test_the_visual_tasks_titles_and_the_textual_cloze_images_merge_per_step():
    # real RecipeQA: visual tasks show titles + bodies without images, textual_cloze the reverse
    titled = _candidate("visual_cloze", "q2", True, 4)
    imaged = _candidate("textual_cloze", "q1", False, 4)
    assert all(not images for _, _, images in titled["steps"])
    assert all(not title for title, _, _ in imaged["steps"])
    merged = merge_candidates([imaged, titled])
    assert merged["steps"] == [[f"T{k}", f"body {k}", [f"i{k}_0.jpg"]] for k in range(4)]
    assert (merged["qid"], merged["task"], merged["contexts"], merged["unaligned"]) == (
        "q2",
        "visual_cloze",
        2,
        0,
    )
    doc, problems, _ = recipe_document("train", "r", merged, "/img")
    assert problems == [] and doc.sentences == [f"T{k} body {k}" for k in range(4)]
    assert doc.links == [(k, k) for k in range(4)]


def test_contexts_align_by_step_id_then_by_position_else_are_left_out():
    def cand(qid, steps, ids=True):
        return parse_item(
            {
                "qid": qid,
                "recipe_id": "r",
                "context": [{**step, "id": step["id"] if ids else None} for step in steps],
            }
        )

    base = cand("a", [_step("s1", "Mix", "mix it", []), _step("s2", "Bake", "bake", [])])
    # by id: another order of steps, a longer body, a step the base lacks (inserted after s1)
    by_id = cand(
        "b",
        [
            _step("s2", "", "bake it well", ["b.jpg"]),
            _step("s1", "", "mix", ["a.jpg", "a2.jpg"]),
            _step("s1b", "", "rest", ["r.jpg"]),
        ],
    )
    # no ids, as many steps as the base: by position; the image a.jpg twice is one image
    by_pos = cand("c", [_step(0, "", "", ["a.jpg", "p.jpg"]), _step(1, "", "", [])], ids=False)
    # no ids and another step count: cannot be aligned, left out
    stray = cand("d", [_step(0, "", "x", ["x.jpg"])], ids=False)
    merged = merge_candidates([stray, by_pos, by_id, base])
    assert merged["steps"] == [
        ["Mix", "mix it", ["a.jpg", "a2.jpg", "p.jpg"]],
        ["", "rest", ["r.jpg"]],
        ["Bake", "bake it well", ["b.jpg"]],
    ]
    assert merged["step_ids"] == ["s1", "s1b", "s2"]
    assert (merged["qid"], merged["contexts"], merged["unaligned"]) == ("a", 3, 1)


@settings(max_examples=60, deadline=None)
@given(order=st.permutations(range(6)), cut=st.integers(0, 6))
def test_the_merged_context_does_not_depend_on_the_order_of_the_questions(order, cut):
    cands = [
        _candidate("textual_cloze", "q0", False, 5),  # images, no titles
        _candidate("textual_cloze", "q5", False, 5),  # the same context: one copy counts
        _candidate("visual_cloze", "q3", True, 4),
        _candidate("visual_coherence", "q2", True, 4),  # same as q3: the smaller qid names it
        _candidate("visual_ordering", "q1", True, 3),
        _candidate("visual_cloze", "q4", True, 5, images=2, with_images=True),
    ]
    expected = merge_candidates(cands)
    shuffled = [cands[i] for i in order]
    assert merge_candidates(shuffled) == expected
    # as a Beam combiner: any split into partial accumulators gives the same result
    fn = MergeContexts()
    parts = [shuffled[:cut], shuffled[cut:]]
    accs = []
    for part in parts:
        acc = fn.create_accumulator()
        for c in part:
            acc = fn.add_input(acc, c)
        accs.append(acc)
    assert fn.extract_output(fn.merge_accumulators(accs[::-1])) == expected
    assert expected["qid"] == "q4" and expected["contexts"] == 4  # q0 = q5 and q2 = q3
    assert [len(images) for _, _, images in expected["steps"]] == [2] * 5  # i{k}_0, i{k}_1


def test_sentences_links_and_empty_steps_keep_their_index():
    cand = parse_item(
        {
            "qid": "q",
            "recipe_id": "r1",
            "context": [
                {"id": 0, "title": " Mix ", "body": "the flour ", "images": ["a.jpg", "b.jpg"]},
                {"id": 1, "title": "", "body": "", "images": ["d.jpg"]},  # no tokens: index 1, no image
                {"id": 2, "body": "bake it", "images": ["c.jpg", "a.jpg"]},  # no title; a.jpg again
                {"id": 3, "title": "Serve", "body": None, "images": []},
                {"id": 4, "title": "...", "body": " - ", "images": ["a.jpg", "e.jpg"]},  # punctuation
            ],
        }
    )
    doc, problems, of_empty_steps = recipe_document("val", "r1", cand, "/data/images/images-qa")
    assert problems == [] and of_empty_steps == 3
    assert doc.sentences == ["Mix the flour", "", "bake it", "Serve", "... -"]
    assert doc.image_uris == [
        f"/data/images/images-qa/val/images-qa/{n}" for n in ("a.jpg", "b.jpg", "c.jpg")
    ]
    assert doc.links == [(0, 0), (0, 1), (2, 2), (2, 0)]
    assert doc.split == "test" and doc.doc_id == "rqa-r1"


def test_a_recipe_whose_only_images_are_on_empty_steps_has_no_linked_images():
    cand = parse_item(
        {
            "qid": "q",
            "recipe_id": "r2",
            "context": [
                {"id": 0, "title": "Mix", "body": "the flour", "images": []},
                {"id": 1, "title": "", "body": "", "images": ["a.jpg", "b.jpg"]},
            ],
        }
    )
    doc, problems, of_empty_steps = recipe_document("train", "r2", cand, "/img")
    assert doc is None and of_empty_steps == 2
    assert [(k, r) for k, _, r, _ in problems] == [("document", "no_linked_images")]


def test_image_names_that_leave_the_folder_are_refused_and_stars_become_underscores():
    assert image_file_name("cake*easy*_3.jpg") == "cake_easy__3.jpg"
    assert image_file_name("../../etc/passwd") is None
    assert image_file_name("/abs.jpg") is None
    cand = parse_item(
        {"qid": "q", "recipe_id": "r", "context": [{"title": "t", "body": "b", "images": ["../x.jpg"]}]}
    )
    doc, problems, _ = recipe_document("train", "r", cand, "/img")
    assert doc is None
    assert [(k, r) for k, _, r, _ in problems] == [
        ("image", "bad_file_name"),
        ("document", "no_linked_images"),
    ]


@pytest.mark.parametrize(
    "bad",
    [
        42,
        {"qid": "x"},
        {"context": []},
        {"context": ["step"]},
        {"context": [{"images": "a.jpg"}]},
        {"context": [{"title": 3}]},
    ],
)
def test_malformed_items_raise(bad):
    with pytest.raises(ValueError):
        parse_item(bad)


# --- the Beam source on a fixture download ------------------------------------------------------


@pytest.fixture(scope="module")
def rqa(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipeqa")
    recipes = default_recipes(n_train=4, n_val=2, n_test=1)
    # A recipe whose untitled textual_cloze context has a step more than its titled ones.
    longer = Recipe(
        "train-long",
        "train",
        [(f"Title {k}", f"long body number {k} here", [f"long_{k}.jpg"]) for k in range(4)],
    )
    # A recipe without images: dead-lettered.
    bare = Recipe("train-bare", "train", [("A title", "a body with words", []), ("B", "more words", [])])
    # A recipe whose only image belongs to a step without text: dead-lettered too.
    empty = Recipe("train-empty", "train", [("Mix", "the flour well", []), ("", " ", ["empty_1.jpg"])])
    extra_train = [
        item("textual_cloze", "long-tc", longer, titled=False),
        item("visual_cloze", "long-vc", Recipe("train-long", "train", longer.steps[:3])),
        item("visual_cloze", "bare-vc", bare),
        item("textual_cloze", "empty-tc", empty, titled=False),
        item("visual_cloze", "empty-vc", empty),
        42,
        {"qid": "no-context", "task": "visual_cloze"},
        {**item("visual_cloze", "bad-bytes", bare), "recipe_id": "bytes", "question_text": BAD_BYTES_MARK},
        # no recipe_id: keyed by its step ids, twice -> one document
        {k: v for k, v in item("visual_cloze", "anon-1", longer).items() if k != "recipe_id"},
        {k: v for k, v in item("textual_cloze", "anon-2", longer, titled=False).items() if k != "recipe_id"},
    ]
    # The fixture's own items for it have 3 steps; long-tc has 4 steps without titles.
    write_recipeqa(
        root,
        [*recipes, Recipe("train-long", "train", longer.steps[:3]), empty],
        extra_items={"train": extra_train},
    )
    run = collect_source("recipeqa", root, {"splits": "train,val,test"})
    return root, recipes, longer, run


def test_one_document_per_recipe_with_titles_and_links_per_step(rqa):
    # the titles come from the visual tasks, the step images from textual_cloze
    root, recipes, _, run = rqa
    docs = run.by_id()
    for recipe in recipes:
        if recipe.split == "test":
            assert f"rqa-{recipe.recipe_id}" not in docs
            continue
        doc = docs[f"rqa-{recipe.recipe_id}"]
        assert doc.sentences == [f"{t} {b}" for t, b, _ in recipe.steps]
        names = [n for _, _, images in recipe.steps for n in images]
        folder = root / "images" / "images-qa" / recipe.split / "images-qa"
        assert doc.image_uris == [str(folder / n) for n in names]
        assert sorted(doc.links) == sorted(
            (k, names.index(n)) for k, (_, _, ims) in enumerate(recipe.steps) for n in ims
        )
        assert doc.split == {"train": None, "val": "test"}[recipe.split]
        assert doc.metadata["task"] == "visual_cloze" and doc.metadata["recipe_id"] == recipe.recipe_id
        assert doc.metadata["contexts_merged"] == "3"
        assert all(os.path.exists(u) for u in doc.image_uris)


def test_the_contexts_of_a_recipe_merge_by_step_id(rqa):
    root, _, longer, run = rqa
    doc = run.by_id()["rqa-train-long"]
    assert doc.metadata["qid"] == "long-vc"  # the titled context gives the step order
    # titled steps 0-2, and step 3 that only the (untitled) long-tc context has
    assert doc.sentences == [f"{t} {b}" for t, b, _ in longer.steps[:3]] + [longer.steps[3][1]]
    folder = root / "images" / "images-qa" / "train" / "images-qa"
    assert doc.image_uris == [str(folder / f"long_{k}.jpg") for k in range(4)]
    assert doc.links == [(k, k) for k in range(4)]


def test_recipes_without_an_id_are_keyed_by_their_steps(rqa):
    *_, run = rqa
    anon = [d for d in run.documents if d.doc_id.startswith("rqa-steps-")]
    assert len(anon) == 1 and anon[0].metadata["qid"] == "anon-1" and "recipe_id" not in anon[0].metadata
    assert len(anon[0].image_uris) == 4 and anon[0].sentences[0] == "Title 0 long body number 0 here"


def test_bad_input_is_dead_lettered_and_counted(rqa):
    *_, run = rqa
    reasons = run.reasons()
    dead = sorted(r["source_id"] for r in run.dead_letters if r["reason"] == "no_linked_images")
    assert dead == ["rqa-train-bare", "rqa-train-empty"]
    assert run.counters["images_of_empty_steps"] == 1  # empty_1.jpg, once for the merged recipe
    assert reasons[("line", "malformed_item")] == 2
    assert reasons[("line", "not_utf8")] == 1
    assert run.counters["official_test_skipped"] == 1
    # 3 items per train/val fixture recipe (4 + 2 train, 2 val) and the 10 extra; test.json unread
    assert run.counters["recipe_items_read"] == 3 * 8 + 10
    # 6 fixture recipes in train/val + long + empty + bare + anon (the bad items make none)
    assert run.counters["recipes_unique"] == 10
    assert "recipe_contexts_unaligned" not in run.counters
    assert len(run.documents) == 8


def test_the_official_test_split_on_request(rqa):
    root, recipes, _, _ = rqa
    run = collect_source("recipeqa", root, {"splits": "val", "include_official_test": "true"})
    splits = {d.doc_id: d.split for d in run.documents}
    assert splits == {
        f"rqa-{r.recipe_id}": {"val": "test", "test": "test_official"}[r.split]
        for r in recipes
        if r.split != "train"
    }


def test_a_malformed_split_file_is_one_dead_letter_and_the_rest_still_builds(tmp_path):
    root = write_recipeqa(tmp_path, default_recipes(n_train=2, n_val=2, n_test=0))
    good = json.loads((root / "train.json").read_text())["data"]
    text = json.dumps({"data": good})
    (root / "train.json").write_text(text[: len(text) * 2 // 3])  # cut mid-file
    (root / "val.json").write_text('{"questions": []}')
    (root / "test.json").write_bytes(b"\x00 not json")
    run = collect_source("recipeqa", root, {"splits": "train,val,test", "include_official_test": "true"})
    dead = sorted((r["source_id"], r["reason"]) for r in run.dead_letters)
    assert dead == [
        ("test.json", "malformed_split_file"),
        ("train.json", "malformed_split_file"),
        ("val.json", "malformed_split_file"),
    ]
    # the recipes read before the cut are kept
    assert {d.doc_id for d in run.documents} <= {"rqa-train-recipe-0", "rqa-train-recipe-1"}
    assert run.documents


def test_options_and_input_are_checked_before_beam(tmp_path):
    spec = get_spec("recipeqa")
    assert spec.build_defaults == {
        "filter_preset": "recipeqa",
        "split_ratios": {"train": 0.87, "val": 0.13},
        "dedupe_threshold": "off",  # the paper removes near-duplicate images from DIY only
    }
    with pytest.raises(MmlinksError, match="not a RecipeQA folder"):
        spec.check(spec.context(str(tmp_path), {}, str(tmp_path / "state")))
    with pytest.raises(MmlinksError, match="splits"):
        spec.check(spec.context(str(tmp_path), {"splits": "dev"}, str(tmp_path / "state")))
    with pytest.raises(MmlinksError, match="true or false"):
        spec.check(spec.context(str(tmp_path), {"include_official_test": "maybe"}, str(tmp_path / "state")))
