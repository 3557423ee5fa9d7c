"""MSCOCO and VIST (Story-DII, Story-SIS, DII-Stress): constructions checked against the input JSON."""

from __future__ import annotations

import json
import os
import random
from collections import Counter, defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.sources import get_spec
from pipelines.sources.mscoco import CocoImage, build_documents, split_counts
from pipelines.sources.sampling import rng_for, sample_excluding
from pipelines.sources.vist import _fill_slots, group_dii, ordered_story
from schemas.errors import MmlinksError
from tests.fixtures.crowd import coco_truth, collect_source, write_mscoco, write_vist

# --- seeded sampling ----------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 60),
    k=st.integers(0, 12),
    excluded=st.sets(st.integers(0, 59)),
    seed=st.text(max_size=4),
)
def test_sample_excluding_is_exact_and_deterministic(n, k, excluded, seed):
    got = sample_excluding(rng_for(seed), n, k, excluded.__contains__)
    eligible = [i for i in range(n) if i not in excluded]
    if len(eligible) < k:
        assert got is None
        return
    assert len(got) == k and len(set(got)) == k
    assert not set(got) & excluded and all(0 <= i < n for i in got)
    assert got == sample_excluding(rng_for(seed), n, k, excluded.__contains__)


def test_sample_excluding_is_uniform_over_the_eligible():
    seen = Counter()
    for s in range(4000):
        seen.update(sample_excluding(rng_for("u", s), 10, 2, lambda i: i < 2))
    assert set(seen) == set(range(2, 10))
    for i in range(2, 10):  # expected 1000 each; 5 sigma is about 140
        assert abs(seen[i] - 1000) < 150, seen


# --- MSCOCO: the construction -------------------------------------------------------------------


def _coco_pool(counts: list[int]) -> list[CocoImage]:
    return [
        CocoImage(10 + i, f"/coco/{10 + i}.jpg", [f"img{10 + i} cap{c}" for c in range(n)])
        for i, n in enumerate(counts)
    ]


def _owner(caption: str) -> str:
    return f"/coco/{caption.split()[0][3:]}.jpg"


@settings(max_examples=40, deadline=None)
@given(
    counts=st.integers(0, 90).flatmap(lambda n: st.lists(st.integers(0, 6), min_size=n, max_size=n)),
    seed=st.sampled_from(["0", "1", "abc"]),
    proportions=st.sampled_from([(0.6, 0.2, 0.2), (1.0, 0.0, 0.0), (0.5, 0.25, 0.25), (1, 1, 1)]),
)
def test_coco_documents_follow_the_paper(counts, seed, proportions):
    pool = _coco_pool(counts)
    built = build_documents(pool, seed, proportions)
    captioned = [im for im in pool if im.captions]
    n_groups = (len(captioned) // 2) // 5
    assert built.unused_images == len(captioned) - 10 * n_groups
    split_of_image: dict[str, str] = {}
    groups: dict[str, list] = defaultdict(list)
    for doc in built.documents:
        assert len(doc.image_uris) == 10 == len(set(doc.image_uris)) == len(doc.sentences)
        assert len(doc.links) == 5 and len({s for s, _ in doc.links}) == 5 == len({i for _, i in doc.links})
        for uri in doc.image_uris:  # splits are disjoint by image
            assert split_of_image.setdefault(uri, doc.split) == doc.split
        linked = {s for s, _ in doc.links}
        for s, i in doc.links:  # a linked caption was written for its image
            assert _owner(doc.sentences[s]) == doc.image_uris[i]
        for s, text in enumerate(doc.sentences):
            if s not in linked:  # a distractor: another image's caption, same split
                assert _owner(text) not in doc.image_uris
                assert split_of_image.setdefault(_owner(text), doc.split) == doc.split
        groups[doc.metadata["group"]].append(doc)
    dropped = Counter(doc_id.rsplit("-v", 1)[0] for doc_id, reason, _ in built.problems)
    assert {reason for _, reason, _ in built.problems} <= {"too_few_distractors"}
    assert len(set(groups) | {g.split("-")[1] for g in dropped}) == n_groups
    by_uri = {im.uri: im for im in pool}
    for g, docs in groups.items():
        true = {docs[0].image_uris[i] for _, i in docs[0].links}
        assert all({d.image_uris[i] for _, i in d.links} == true for d in docs)  # the same true images
        expected = min(len(by_uri[u].captions) for u in true) if docs[0].split == "train" else 1
        assert len(docs) + dropped[f"coco-{g}"] == expected
        assert [d.metadata["version"] for d in docs] == [str(v) for v in range(len(docs))] or dropped[
            f"coco-{g}"
        ]
        for d in docs:  # version v shows each true image's v-th caption (annotation order)
            v = int(d.metadata["version"])
            assert all(d.sentences[s] == by_uri[d.image_uris[i]].captions[v] for s, i in d.links)
    again = build_documents(list(reversed(pool)), seed, proportions)
    assert again.documents == built.documents


def test_a_different_seed_groups_differently_and_splits_follow_the_proportions():
    pool = _coco_pool([5] * 200)
    a, b = build_documents(pool, "0", (0.6, 0.2, 0.2)), build_documents(pool, "1", (0.6, 0.2, 0.2))
    groups = [{frozenset(d.image_uris) for d in x.documents} for x in (a, b)]
    assert groups[0] != groups[1]
    assert Counter(d.split for d in a.documents) == {"train": 12 * 5, "val": 4, "test": 4}
    # the paper's 8278 groups: 0.6:0.2:0.2 is within 2 groups of its 4968/1655/1655, exact on request
    assert split_counts(8278, (0.6, 0.2, 0.2)) == {"train": 4966, "val": 1656, "test": 1656}
    assert split_counts(8278, (4968, 1655, 1655)) == {"train": 4968, "val": 1655, "test": 1655}


# --- MSCOCO: the Beam source on a fixture download ----------------------------------------------


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    root = tmp_path_factory.mktemp("mscoco")
    counts = [5, 5, 4, 6, 5] * 20  # 100 captioned images: 10 groups, 6/2/2
    write_mscoco(root, n_images=100, captions_per_image=counts)
    return root, counts, collect_source("mscoco", root), collect_source("mscoco", root)


def test_coco_documents_from_the_annotation_files(coco):
    root, _, run, _ = coco
    truth = coco_truth(root)
    assert run.dead_letters == []
    assert (
        Counter(d.split for d in run.documents)["val"] == 2 == Counter(d.split for d in run.documents)["test"]
    )
    for doc in run.documents:
        assert all(os.path.exists(u) for u in doc.image_uris)
        for s, i in doc.links:
            assert os.path.basename(doc.image_uris[i]) == truth[doc.sentences[s]]
        for s in set(range(10)) - {s for s, _ in doc.links}:
            assert truth[doc.sentences[s]] not in {os.path.basename(u) for u in doc.image_uris}
    assert not any("1700" in u for d in run.documents for u in d.image_uris)  # the uncaptioned image
    assert run.counters["coco_images_without_captions"] == 1
    assert run.counters["coco_images_read"] == 101


def test_coco_is_deterministic_across_runs_and_seeds(coco):
    root, _, run, again = coco
    assert run.documents == again.documents
    other = collect_source("mscoco", root, {"seed": "7"})
    assert {frozenset(d.image_uris) for d in other.documents} != {
        frozenset(d.image_uris) for d in run.documents
    }


def test_coco_years_merge_by_annotation_id_and_bad_entries_are_dead_lettered(tmp_path):
    write_mscoco(tmp_path, n_images=20, year="2017")
    write_mscoco(tmp_path, n_images=20, year="2014", write_images=False)  # same ids and captions
    path = tmp_path / "annotations" / "captions_train2017.json"
    content = json.loads(path.read_text())
    content["annotations"] += [
        {"image_id": "x", "id": 1, "caption": "bad id"},
        {"image_id": 424242, "id": 2, "caption": "no such image"},
        "not an object",
    ]
    content["images"].append({"id": 5, "file_name": "../up.jpg"})
    path.write_text(json.dumps(content))
    run = collect_source("mscoco", tmp_path, {"years": "2017,2014", "split_sizes": "1:0:0"})
    assert run.reasons() == {("line", "malformed_entry"): 3, ("sentence", "unknown_image"): 1}
    assert all("2017/" in u for d in run.documents for u in d.image_uris)
    assert {len(d.sentences) for d in run.documents} == {10}
    assert len(run.documents) == 2 * 5  # 2 groups x 5 versions: 2014 captions did not double them
    missing = collect_source("mscoco", tmp_path, {"years": "2017,2015", "split_sizes": "1:0:0"})
    assert missing.reasons()[("line", "missing_annotation_file")] == 2


def test_coco_options_are_checked(tmp_path):
    spec = get_spec("mscoco")
    assert spec.build_defaults == {"dedupe_threshold": "off", "filter_options": {"min_images": "10"}}
    state = str(tmp_path / "state")
    with pytest.raises(MmlinksError, match="not an MSCOCO folder"):
        spec.check(spec.context(str(tmp_path), {}, state))
    for bad in ({"split_sizes": "1:2"}, {"split_sizes": "a:b:c"}, {"split_sizes": "0:0:0"}, {"years": "17"}):
        with pytest.raises(MmlinksError):
            spec.check(spec.context(str(tmp_path), bad, state))


# --- VIST: grouping -----------------------------------------------------------------------------


def _dii_albums(albums, interleaved, workers=None):
    """Per album [(n image sets, n caption sets)] -> (one caption stream per album, true sets).

    ``workers``: None (no worker ids), "set" (one worker writes a whole caption set) or "caption"
    (every caption another worker). A true set is a tuple of (photo, text) in story order.
    """
    streams, truth = [], []
    photo = 0
    for a, (n_sets, n_caption_sets) in enumerate(albums):
        stream = []
        for s in range(n_sets):
            photos = [str(photo + k) for k in range(5)]
            photo += 5
            cap = {
                (c, k): {
                    "photo": photos[k],
                    "album": f"a{a}",
                    "order": k,
                    "story": None,
                    "worker": {None: None, "set": f"w{a}.{s}.{c}", "caption": f"w{a}.{s}.{c}.{k}"}[workers],
                    "text": f"{c}:{photos[k]}",
                }
                for c in range(n_caption_sets)
                for k in range(5)
            }
            keys = [(c, k) for k in range(5) for c in range(n_caption_sets)] if interleaved else sorted(cap)
            stream += [cap[key] for key in keys]
            truth += [tuple((p, f"{c}:{p}") for p in photos) for c in range(n_caption_sets)]
        streams.append(stream)
    return streams, truth


def _merge(streams, seed):
    """The albums' captions merged in any order that keeps each album's own order."""
    rng, merged, heads = random.Random(seed), [], [0] * len(streams)
    while any(h < len(s) for h, s in zip(heads, streams, strict=True)):
        a = rng.choice([i for i, s in enumerate(streams) if heads[i] < len(s)])
        merged.append(streams[a][heads[a]])
        heads[a] += 1
    return merged


def _complete_sets(groups):
    stories = [ordered_story(g) for _, g in groups]
    return [tuple((c["photo"], c["text"]) for c in s) for s in stories if s is not None]


@settings(max_examples=100, deadline=None)
@given(
    albums=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3)), min_size=1, max_size=4),
    interleaved=st.booleans(),
    workers=st.sampled_from([None, "set", "caption"]),
    merge_seed=st.integers(0, 1000),
)
def test_dii_caption_sets_regroup_from_either_layout_and_mixed_albums(
    albums, interleaved, workers, merge_seed
):
    streams, truth = _dii_albums(albums, interleaved, workers)
    groups = group_dii(_merge(streams, merge_seed))
    assert all(ordered_story(g) is not None for _, g in groups)
    assert set(_complete_sets(groups)) == set(truth)
    assert len(groups) == len(truth) == len({key for key, _ in groups})


def _drop(streams, picks):
    """Drop the captions at the (album, fraction) positions in ``picks``; return the streams."""
    out = [list(s) for s in streams]
    for a, frac in picks:
        stream = out[a % len(out)]
        if stream:
            del stream[int(frac * len(stream)) % len(stream)]
    return out


def _check_no_chimera(groups, streams, truth):
    kept = {id(e) for s in streams for e in s}
    complete = _complete_sets(groups)
    assert set(complete) <= set(truth)  # never a set mixing captions of two caption sets
    assert len(complete) == len(set(complete))
    kept_text = {(e["photo"], e["text"]) for s in streams for e in s}
    undamaged = [t for t in truth if set(t) <= kept_text]
    assert set(undamaged) <= set(complete)  # and every caption set left whole is found
    assert sum(len(g) for _, g in groups) == len(kept)


@settings(max_examples=150, deadline=None)
@given(
    albums=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3)), min_size=1, max_size=3),
    drops=st.lists(st.floats(0, 1, exclude_max=True), max_size=3),
    merge_seed=st.integers(0, 1000),
)
def test_one_dropped_dii_caption_per_album_makes_no_chimera_without_worker_ids(albums, drops, merge_seed):
    streams, truth = _dii_albums(albums, interleaved=False)
    streams = _drop(streams, list(enumerate(drops)))  # at most one per album
    groups = group_dii(_merge(streams, merge_seed))
    _check_no_chimera(groups, streams, truth)


@settings(max_examples=150, deadline=None)
@given(
    albums=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3)), min_size=1, max_size=3),
    interleaved=st.booleans(),
    drops=st.lists(st.tuples(st.integers(0, 2), st.floats(0, 1, exclude_max=True)), max_size=6),
    merge_seed=st.integers(0, 1000),
)
def test_dropped_dii_captions_make_no_chimera_with_worker_ids(albums, interleaved, drops, merge_seed):
    streams, truth = _dii_albums(albums, interleaved, workers="set")
    streams = _drop(streams, drops)
    groups = _fill_slots(_merge(streams, merge_seed), require_worker=True)
    _check_no_chimera(groups, streams, truth)


@pytest.mark.parametrize("workers", [None, "set"])
@pytest.mark.parametrize("same_photos", [True, False])
@pytest.mark.parametrize("dropped", range(5))
def test_a_dropped_dii_caption_never_lets_the_next_set_fill_its_slot(workers, same_photos, dropped):
    # album A: set 1 = a0..a4 with one caption dropped, then set 2 = b0..b4 (same or other photos)
    streams, truth = _dii_albums([(1 if same_photos else 2, 2 if same_photos else 1)], False, workers)
    stream = streams[0]
    del stream[dropped]
    groups = group_dii(stream)
    assert [key for key, _ in groups] == ["a0-0", "a0-1"]
    assert [c["order"] for c in groups[0][1]] == [k for k in range(5) if k != dropped]
    assert ordered_story(groups[0][1]) is None  # -> incomplete_story
    assert _complete_sets(groups) == [truth[1]]


def test_dii_worker_ids_decide_only_when_sets_are_one_workers():
    # image after image, the first caption of one set dropped: only the worker ids tell the sets
    # apart, and they are used because the other albums' sets are one worker's each
    streams, truth = _dii_albums([(1, 2), (1, 2), (1, 2)], interleaved=True, workers="set")
    del streams[0][0]
    elements = [e for s in streams for e in s]
    assert _complete_sets(_fill_slots(elements, require_worker=False))[0] != truth[1]  # orders alone
    assert _complete_sets(group_dii(elements)) == truth[1:]
    # a worker per caption: worker ids say nothing about the sets; orders still regroup them
    streams, truth = _dii_albums([(2, 2)], interleaved=True, workers="caption")
    assert set(_complete_sets(group_dii(streams[0]))) == set(truth)


# --- VIST: the Beam sources on a fixture download -----------------------------------------------


def _vist_truth(root, folder, label, split):
    content = json.loads((root / folder / f"{split}.{label}.json").read_text())
    return [entry[0] for entry in content["annotations"]]


@pytest.fixture(scope="module")
def vist(tmp_path_factory):
    root = tmp_path_factory.mktemp("vist")
    write_vist(root, sets_per_split=7, caption_sets=2, missing=("70003",))
    return root


def test_story_dii_documents_match_the_caption_sets(vist):
    run = collect_source("story-dii", vist)
    docs = run.documents
    assert run.reasons() == {("document", "missing_image"): 2}  # both caption sets of photo 70003's set
    assert len(docs) == 3 * 7 * 2 - 2
    expected = set()
    for split in ("train", "val", "test"):
        by_worker = defaultdict(list)  # the fixture's workers write one caption set each
        for e in _vist_truth(vist, "dii", "description-in-isolation", split):
            by_worker[e["worker_id"]].append(e)
        for caps in by_worker.values():
            caps.sort(key=lambda e: e["photo_order_in_story"])
            if "70003" not in [e["photo_flickr_id"] for e in caps]:
                expected.add(
                    (
                        split,
                        tuple(e["photo_flickr_id"] for e in caps),
                        tuple(e["original_text"] for e in caps),
                    )
                )
    got = set()
    for doc in docs:
        photos = tuple(os.path.splitext(os.path.basename(u))[0] for u in doc.image_uris)
        got.add((doc.split, photos, tuple(doc.sentences)))
        assert doc.links == [(k, k) for k in range(5)]
        assert doc.metadata["photo_ids"] == ",".join(photos)
        assert all(os.path.exists(u) for u in doc.image_uris)
    assert got == expected
    assert any(u.endswith(".png") for d in docs for u in d.image_uris)


def test_story_sis_follows_the_worker_arranged_order(vist):
    run = collect_source("story-sis", vist, {"text_field": "text", "splits": "val,test"})
    assert len(run.documents) == 14 and {d.split for d in run.documents} == {"val", "test"}
    for split in ("val", "test"):
        stories = defaultdict(list)
        for e in _vist_truth(vist, "sis", "story-in-sequence", split):
            stories[e["story_id"]].append(e)
        for story_id, sents in stories.items():
            sents.sort(key=lambda e: e["worker_arranged_photo_order"])
            doc = run.by_id()[f"sis-{story_id}"]
            assert doc.sentences == [e["text"] for e in sents]
            assert [os.path.splitext(os.path.basename(u))[0] for u in doc.image_uris] == [
                e["photo_flickr_id"] for e in sents
            ]
            assert doc.links == [(k, k) for k in range(5)] and doc.split == split


def test_dii_stress_adds_45_same_split_distractors_deterministically(vist):
    run = collect_source("dii-stress", vist, {"splits": "train,val"})
    again = collect_source("dii-stress", vist, {"splits": "train,val"})
    other = collect_source("dii-stress", vist, {"splits": "train,val", "seed": "1"})
    assert run.documents == again.documents and run.documents != other.documents
    assert len(run.documents) == 2 * 14 - 2
    for doc in run.documents:
        photos = [os.path.splitext(os.path.basename(u))[0] for u in doc.image_uris]
        assert len(doc.sentences) == 50 and len(doc.image_uris) == 5 and len(doc.links) == 5
        linked = dict(doc.links)
        assert sorted(linked.values()) == list(range(5))
        for s, text in enumerate(doc.sentences):
            named_photo, named_split = text.split()[4], text.split()[-1].rstrip(".")
            assert named_split == doc.split  # "Worker c sees photo P in SPLIT."
            if s in linked:
                assert named_photo == photos[linked[s]]
            else:
                assert named_photo not in photos
        assert len(set(doc.sentences)) == 50


def test_dii_stress_with_too_small_a_pool_is_dead_lettered(vist):
    run = collect_source("dii-stress", vist, {"splits": "test", "distractors": "61"})
    assert run.documents == [] and run.reasons() == {("document", "too_few_distractors"): 14}


def test_vist_bad_annotations_and_incomplete_stories_are_dead_lettered(tmp_path):
    write_vist(tmp_path, sets_per_split=2, caption_sets=1)
    path = tmp_path / "dii" / "val.description-in-isolation.json"
    content = json.loads(path.read_text())
    first = content["annotations"][0][0]
    del content["annotations"][1]  # the first set loses its order-1 caption
    content["annotations"] += [[], [first, first], ["text"], [{"photo_flickr_id": "1", "album_id": "a"}]]
    path.write_text(json.dumps(content))
    cut = '{"annotations": [[{"photo_flickr_id": "1"'
    (tmp_path / "dii" / "test.description-in-isolation.json").write_text(cut)
    run = collect_source("story-dii", tmp_path)
    assert run.reasons() == {
        ("line", "malformed_annotation"): 4,
        ("document", "incomplete_story"): 1,
        ("line", "malformed_split_file"): 1,
    }
    assert Counter(d.split for d in run.documents) == {"train": 2, "val": 1}
    # the second set of the same album is whole and its own; the first is the incomplete one
    second = [e[0] for e in json.loads(path.read_text())["annotations"][4:9]]
    (val,) = [d for d in run.documents if d.split == "val"]
    assert val.metadata["photo_ids"] == ",".join(e["photo_flickr_id"] for e in second)
    assert val.sentences == [e["original_text"] for e in second]
    assert [r["source_id"] for r in run.dead_letters if r["reason"] == "incomplete_story"] == [
        f"dii-{first['album_id']}-0"
    ]


def test_vist_options_are_checked(tmp_path):
    state = str(tmp_path / "state")
    for name in ("story-dii", "story-sis", "dii-stress"):
        spec = get_spec(name)
        assert spec.build_defaults == {"dedupe_threshold": "off", "filter_options": {"min_images": "5"}}
        with pytest.raises(MmlinksError, match="not a VIST folder"):
            spec.check(spec.context(str(tmp_path), {}, state))
        with pytest.raises(MmlinksError, match="text_field"):
            spec.check(spec.context(str(tmp_path), {"text_field": "caption"}, state))
    stress = get_spec("dii-stress")
    with pytest.raises(MmlinksError, match="distractors"):
        stress.check(stress.context(str(tmp_path), {"distractors": "-1"}, state))
    with pytest.raises(MmlinksError, match="no option"):
        get_spec("story-dii").context(str(tmp_path), {"seed": "1"}, state)
