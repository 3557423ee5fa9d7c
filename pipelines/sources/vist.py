"""Visual Storytelling (VIST, Huang et al. 2016) as Story-DII, Story-SIS and DII-Stress documents
(the documents, as the Hessel et al. 2019 supplement builds them: docs/sources.md).

Why ``group_dii``: released DII elements carry no story id, so captions are regrouped per album
in file order, a caption joining the earliest open set of its album (preferring its worker's)
whose orders are all smaller; a dropped caption never lets the next set fill its slot. A story
with a missing image is discarded whole, as in the paper. Each split is built by one worker,
since DII-Stress sampling needs the whole split."""

from __future__ import annotations

import copy
import os
from collections import defaultdict
from typing import Any

import apache_beam as beam

from pipelines import fileio
from pipelines.records import DEAD_LETTER, RawDocument, count, dead_letter, dead_lettered
from pipelines.sources.base import SourceContext, SourceOption, SourceSpec
from pipelines.sources.jsonstream import MalformedJson, has_invalid_utf8, stream_arrays, text_chunks
from pipelines.sources.jsonstream import repaired as _repaired
from pipelines.sources.sampling import rng_for, sample_excluding
from schemas.errors import MmlinksError

SPLITS = ("train", "val", "test")
STORY_LENGTH = 5
IMAGE_EXTENSIONS = (".jpg", ".png", ".jpeg", ".gif")  # preference order when several exist
TEXT_FIELDS = ("original_text", "text")
# source -> (annotation folder, file label, the element's order field)
TIERS = {
    "story-dii": ("dii", "description-in-isolation", "photo_order_in_story"),
    "story-sis": ("sis", "story-in-sequence", "worker_arranged_photo_order"),
    "dii-stress": ("dii", "description-in-isolation", "photo_order_in_story"),
}
BUILD_DEFAULTS = {
    "dedupe_threshold": "off",  # the same photos recur across stories on purpose
    # The paper discards a story with any invalid image: one the image store cannot decode
    # leaves 4 images, and this rule drops that story (missing files are caught here already).
    "filter_options": {"min_images": "5"},
}

COMMON_OPTIONS = (
    SourceOption("splits", "train,val,test", "official splits to read, comma-separated"),
    SourceOption(
        "text_field", None, "original_text or text (default: original_text when present, else text)"
    ),
    SourceOption("images_dir", "images", "image folder under INPUT: <images_dir>/<split>/<photo id>.jpg"),
)
STRESS_OPTIONS = (
    SourceOption("seed", "0", "seed of the distractor sampling and sentence shuffle"),
    SourceOption("distractors", "45", "distractor captions added to each Story-DII document"),
)


# --- parsing and grouping (pure) -----------------------------------------------------------------


def parse_element(entry: Any, order_field: str, text_field: str | None, need_story: bool) -> dict:
    """One annotation entry (a one-element list) -> {photo, album, order, story, text}; ValueError."""
    if isinstance(entry, list):
        if len(entry) != 1:
            raise ValueError(f"annotation is a list of {len(entry)} elements, not 1")
        entry = entry[0]
    if not isinstance(entry, dict):
        raise ValueError(f"annotation is {type(entry).__name__}, not an object")
    photo, album, order = entry.get("photo_flickr_id"), entry.get("album_id"), entry.get(order_field)
    if not isinstance(photo, str | int) or isinstance(photo, bool) or not str(photo).strip():
        raise ValueError("no photo_flickr_id")
    if not isinstance(album, str | int) or isinstance(album, bool):
        raise ValueError("no album_id")
    if isinstance(order, str) and order.strip().isdigit():
        order = int(order)
    if not isinstance(order, int) or isinstance(order, bool):
        raise ValueError(f"no integer {order_field}")
    story = entry.get("story_id")
    if need_story and not isinstance(story, str | int):
        raise ValueError("no story_id")
    field = text_field or ("original_text" if isinstance(entry.get("original_text"), str) else "text")
    text = entry.get(field)
    if not isinstance(text, str):
        raise ValueError(f"no {field}")
    worker = entry.get("worker_id")
    return {
        "photo": str(photo).strip(),
        "album": str(album),
        "order": order,
        "story": None if story is None else str(story),
        "worker": str(worker) if isinstance(worker, str | int) and str(worker).strip() else None,
        "text": text.strip(),
    }


def group_dii(elements: list[dict]) -> list[tuple[str, list[dict]]]:
    """DII captions (file order) -> [(story key, captions)]: by story_id, else by slot filling.

    Without story ids see ``_fill_slots``: a first pass prefers a set of the caption's own worker;
    when most of the sets it makes are one worker's each (a release whose workers write whole
    caption sets), a second pass lets a caption join only its own worker's set. Keys: the story
    id, else "<album>-<n>" with n counting the album's sets in file order.
    """
    if elements and all(e["story"] is not None for e in elements):
        return group_by_story(elements)
    groups = _fill_slots(elements, require_worker=False)
    workers = [{e.get("worker") for e in captions} for _, captions in groups if len(captions) > 1]
    one_worker = sum(1 for w in workers if len(w) == 1 and None not in w)
    if workers and 2 * one_worker > len(workers):
        groups = _fill_slots(elements, require_worker=True)
    return groups


def _fill_slots(elements: list[dict], require_worker: bool) -> list[tuple[str, list[dict]]]:
    """Per album, a caption joins the earliest open set whose orders are all below its own.

    Within a caption set the orders rise in file order in both layouts (set after set, or image
    after image with the sets in lockstep), so a set never takes a caption of an order below its
    highest. A set closes when it has STORY_LENGTH captions, or when a newer set of its album
    receives an order below its highest, or its highest order with another photo: in lockstep the
    newer sets trail at the same order and photo, so the older set was left behind (a caption of
    it was dropped) and must not take the next set's captions. Among the open sets a caption may
    join, one of its own worker comes first; with ``require_worker`` it joins no other.
    """
    groups: list[tuple[str, list[dict]]] = []
    open_sets: dict[str, list[int]] = defaultdict(list)  # album -> indices of open groups, oldest first
    made: dict[str, int] = defaultdict(int)
    for e in elements:
        album, order, worker = e["album"], e["order"], e.get("worker")
        fits = [g for g in open_sets[album] if groups[g][1][-1]["order"] < order]
        same = [g for g in fits if worker is not None and groups[g][1][0].get("worker") == worker]
        target = same[0] if same else (None if require_worker or not fits else fits[0])
        if target is None:
            target = len(groups)
            groups.append((f"{album}-{made[album]}", []))
            made[album] += 1
            open_sets[album].append(target)
        groups[target][1].append(e)
        closed = {
            g for g in open_sets[album][: open_sets[album].index(target)] if _left_behind(groups[g][1][-1], e)
        }
        if len(groups[target][1]) >= STORY_LENGTH:
            closed.add(target)
        if closed:
            open_sets[album] = [g for g in open_sets[album] if g not in closed]
    return groups


def _left_behind(last: dict, e: dict) -> bool:
    """Whether an older set whose latest caption is ``last`` is closed by ``e`` joining a newer set.

    Lockstep sets (captions of one image set, image after image) see the newer set reach an order
    the older one already has, with the same photo; anything else means the older set was passed.
    """
    return last["order"] > e["order"] or (last["order"] == e["order"] and last["photo"] != e["photo"])


def group_by_story(elements: list[dict]) -> list[tuple[str, list[dict]]]:
    """Captions -> [(story id, captions)], stories in order of first appearance."""
    stories: dict[str, list[dict]] = {}
    for e in elements:
        stories.setdefault(str(e["story"]), []).append(e)
    return list(stories.items())


def ordered_story(captions: list[dict]) -> list[dict] | None:
    """The captions in story order, or None unless they are exactly orders 0..STORY_LENGTH-1."""
    if sorted(c["order"] for c in captions) != list(range(STORY_LENGTH)):
        return None
    return sorted(captions, key=lambda c: c["order"])


def image_index(paths: list[str]) -> dict[str, str]:
    """Photo id -> path, from a listing of the split's image folder (preferred extension wins)."""
    best: dict[str, tuple[int, str]] = {}
    for path in paths:
        stem, ext = os.path.splitext(path.replace("\\", "/").rsplit("/", 1)[-1])
        rank = IMAGE_EXTENSIONS.index(ext.lower()) if ext.lower() in IMAGE_EXTENSIONS else None
        if rank is not None and (stem not in best or rank < best[stem][0]):
            best[stem] = (rank, path)
    return {stem: path for stem, (_, path) in best.items()}


def stress_document(doc: RawDocument, pool: list[tuple[str, str]], seed: str, k: int) -> RawDocument | None:
    """A Story-DII document + ``k`` distractor captions from ``pool`` [(caption, photo id)], shuffled.

    Distractors are never captions of the document's photos (another caption set of the same
    photos would describe them). None when the pool has fewer than ``k`` such captions.
    """
    photos = set(doc.metadata["photo_ids"].split(","))
    rng = rng_for("dii-stress", seed, doc.doc_id)
    picked = sample_excluding(rng, len(pool), k, lambda i: pool[i][1] in photos)
    if picked is None:
        return None
    sentences = [*doc.sentences, *(pool[i][0] for i in picked)]
    order = list(range(len(sentences)))
    rng.shuffle(order)
    position = {old: new for new, old in enumerate(order)}
    links = sorted((position[s], i) for s, i in doc.links or [])
    metadata = {**doc.metadata, "distractors": str(k), "seed": seed}
    return RawDocument(
        doc_id=doc.doc_id.replace("dii-", "diistress-", 1),
        source="dii-stress",
        sentences=[sentences[old] for old in order],
        image_uris=list(doc.image_uris),
        links=links,
        metadata=metadata,
        split=doc.split,
    )


# --- Beam ---------------------------------------------------------------------------------------


class ReadVistSplit(beam.DoFn):
    """Split name -> the split's documents (and dead letters), built from its annotation file."""

    def __init__(self, source: str, root: str, images_dir: str, text_field: str | None, seed: str, k: int):
        self.source, self.root, self.images_dir = source, root, images_dir
        self.text_field, self.seed, self.k = text_field, seed, k

    def process(self, split: str):
        folder, label, order_field = TIERS[self.source]
        name = f"{folder}/{split}.{label}.json"
        elements = []
        try:
            with fileio.open_read(fileio.join(self.root, folder, f"{split}.{label}.json")) as fh:
                for n, (_, entry) in enumerate(
                    stream_arrays(text_chunks(fh), {"annotations"}, {"annotations"})
                ):
                    count("vist_annotations_read")
                    if has_invalid_utf8(entry):
                        yield dead_letter(
                            "line", f"{name}#{n}", "not_utf8", "the annotation holds non-UTF-8 bytes"
                        )
                        continue
                    entry = _repaired(entry)
                    try:
                        elements.append(
                            parse_element(entry, order_field, self.text_field, self.source == "story-sis")
                        )
                    except ValueError as exc:
                        yield dead_letter("line", f"{name}#{n}", "malformed_annotation", str(exc))
        except FileNotFoundError as exc:
            yield dead_letter("line", name, "missing_split_file", str(exc))
            return
        except MalformedJson as exc:
            # The stories of a cut file are incomplete: nothing of it is used.
            yield dead_letter(
                "line", name, "malformed_split_file", f"after {len(elements)} annotations: {exc}"
            )
            return
        except OSError as exc:
            yield dead_letter("line", name, "unreadable_split_file", str(exc))
            return
        yield from self._documents(split, elements)

    def _documents(self, split: str, elements: list[dict]):
        prefix = "sis" if self.source == "story-sis" else "dii"
        groups = group_by_story(elements) if self.source == "story-sis" else group_dii(elements)
        images = self._images(split)
        docs: list[RawDocument] = []
        for key, captions in groups:
            doc_id = f"{prefix}-{key}"
            story = ordered_story(captions)
            if story is None:
                orders = sorted(c["order"] for c in captions)
                yield dead_letter(
                    "document", doc_id, "incomplete_story", f"{len(captions)} captions, orders {orders}"
                )
                continue
            missing = [c["photo"] for c in story if c["photo"] not in images]
            if missing:
                yield dead_letter("document", doc_id, "missing_image", f"no image file for {missing}")
                continue
            metadata = {"album_id": story[0]["album"], "photo_ids": ",".join(c["photo"] for c in story)}
            if story[0]["story"] is not None:
                metadata["story_id"] = story[0]["story"]
            docs.append(
                RawDocument(
                    doc_id=doc_id,
                    source=self.source,
                    sentences=[c["text"] for c in story],
                    image_uris=[images[c["photo"]] for c in story],
                    links=[(k, k) for k in range(len(story))],
                    metadata=metadata,
                    split=split,
                )
            )
        count(f"vist_stories_{split}", len(docs))
        if self.source != "dii-stress":
            yield from docs
            return
        docs.sort(key=lambda d: d.doc_id)  # a fixed pool order: the sampling depends on the input alone
        pool = [
            (s, p) for d in docs for s, p in zip(d.sentences, d.metadata["photo_ids"].split(","), strict=True)
        ]
        for doc in docs:
            stressed = stress_document(doc, pool, self.seed, self.k)
            if stressed is None:
                yield dead_letter(
                    "document",
                    doc.doc_id,
                    "too_few_distractors",
                    f"fewer than {self.k} captions of other photos",
                )
                continue
            yield stressed

    def _images(self, split: str) -> dict[str, str]:
        folder = fileio.join(self.root, *self.images_dir.strip("/").split("/"), split)
        try:
            return image_index(fileio.list_files(folder))
        except OSError:  # no folder: every story of the split is missing its images
            return {}


class ReadVist(beam.PTransform):
    def __init__(self, source: str, root: str, splits: list[str], images_dir: str, text_field, seed, k):
        super().__init__()
        self.fn = ReadVistSplit(source, root, images_dir, text_field, seed, k)
        self.splits = splits

    def expand(self, pbegin):
        out = pbegin | "Splits" >> beam.Create(self.splits) | "BuildSplit" >> dead_lettered(self.fn)
        # One worker built each split: spread the documents for the image stage.
        docs = out.documents | "Spread" >> beam.Reshuffle()
        return {"documents": docs, DEAD_LETTER: out[DEAD_LETTER]}


def _options(ctx: SourceContext) -> dict:
    splits = [s.strip() for s in (ctx.str("splits") or "").split(",") if s.strip()]
    if not splits or set(splits) - set(SPLITS):
        raise MmlinksError(
            f"--source-option splits wants names from {list(SPLITS)}, not {ctx.str('splits')!r}"
        )
    text_field = ctx.str("text_field") or None
    if text_field is not None and text_field not in TEXT_FIELDS:
        raise MmlinksError(f"--source-option text_field wants one of {list(TEXT_FIELDS)}, not {text_field!r}")
    seed, k = "0", 0
    if ctx.source == "dii-stress":
        seed = ctx.str("seed") or "0"
        k = ctx.int("distractors")
        if k is None or k < 0:
            raise MmlinksError("--source-option distractors wants a non-negative integer")
    return {
        "splits": sorted(set(splits), key=SPLITS.index),
        "images_dir": ctx.str("images_dir") or "images",
        "text_field": text_field,
        "seed": seed,
        "k": k,
    }


def _make(ctx: SourceContext) -> ReadVist:
    o = _options(ctx)
    return ReadVist(ctx.source, ctx.input, o["splits"], o["images_dir"], o["text_field"], o["seed"], o["k"])


def _check(ctx: SourceContext) -> None:
    o = _options(ctx)
    if not fileio.is_local(ctx.input):
        return
    folder, label, _ = TIERS[ctx.source]
    files = [fileio.join(ctx.input, folder, f"{s}.{label}.json") for s in o["splits"]]
    if not any(fileio.exists(f) for f in files):
        raise MmlinksError(f"{ctx.input} is not a VIST folder: none of {files} exists")


def _spec(source: str, summary: str) -> SourceSpec:
    return SourceSpec(
        name=source,
        summary=summary,
        make=_make,
        options=COMMON_OPTIONS + (STRESS_OPTIONS if source == "dii-stress" else ()),
        build_defaults=copy.deepcopy(BUILD_DEFAULTS),
        check=_check,
    )


SPECS = {
    "story-dii": _spec("story-dii", "VIST descriptions in isolation: 5 photos + their 5 captions (DIR/dii)"),
    "story-sis": _spec("story-sis", "VIST stories in sequence: 5 photos + the 5 story sentences (DIR/sis)"),
    "dii-stress": _spec("dii-stress", "Story-DII + 45 same-split distractor captions per document (DIR/dii)"),
}
