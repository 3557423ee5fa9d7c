"""RecipeQA (Yagcioglu et al. 2018) as one document per recipe: steps are sentences, step images
linked (the input layout and splits: docs/sources.md).

Why contexts are merged (``merge_candidates``): each question shows a recipe in one modality, so
a recipe's contexts are aligned by step id (else position) to the best one and merged in a fixed
order, whatever Beam's combine order. Token-less steps lose their images (the paper discards
empty steps); the official test split (answers hidden) is skipped unless
``include_official_test=true``. Files stream item by item (``jsonstream``)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import apache_beam as beam

from pipelines import fileio
from pipelines.records import DEAD_LETTER, RawDocument, count, dead_letter, dead_lettered
from pipelines.sources.base import SourceContext, SourceOption, SourceSpec
from pipelines.sources.jsonstream import MalformedJson, has_invalid_utf8, stream_arrays, text_chunks
from pipelines.sources.jsonstream import repaired as _repaired
from schemas.errors import MmlinksError
from schemas.text import has_tokens

SOURCE = "recipeqa"
OFFICIAL_SPLITS = ("train", "val", "test")
# Official split -> document split (None: the build assigns train/val by hash).
DOC_SPLITS: dict[str, str | None] = {"train": None, "val": "test", "test": "test_official"}
BUILD_DEFAULTS = {
    "filter_preset": "recipeqa",
    "split_ratios": {"train": 0.87, "val": 0.13},
    "dedupe_threshold": "off",  # the paper removes near-duplicate images from DIY only
}

OPTIONS = (
    SourceOption("splits", "train,val", "official split files to read, comma-separated (train, val, test)"),
    SourceOption(
        "include_official_test",
        "false",
        "read test.json too (answers hidden, unused by the paper) as split test_official",
    ),
    SourceOption(
        "images_dir", "images/images-qa", "image folder under INPUT: <images_dir>/<split>/images-qa/<file>"
    ),
)


# --- parsing ------------------------------------------------------------------------------------


def _text(value: Any, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{what} is {type(value).__name__}, not a string")
    return value


def parse_item(item: Any) -> dict:
    """One question -> a compact recipe candidate; ValueError for a malformed item.

    Candidate: {"qid", "task", "recipe_id" (or None), "step_ids", "steps": [[title, body,
    [image file, ...]], ...]}.
    """
    if not isinstance(item, dict):
        raise ValueError(f"item is {type(item).__name__}, not an object")
    context = item.get("context")
    if not isinstance(context, list) or not context:
        raise ValueError("item has no context steps")
    steps, step_ids = [], []
    for k, step in enumerate(context):
        if not isinstance(step, dict):
            raise ValueError(f"context step {k} is {type(step).__name__}, not an object")
        images = step.get("images") or []
        if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
            raise ValueError(f"context step {k}: images is not a list of file names")
        steps.append([_text(step.get("title"), "title"), _text(step.get("body"), "body"), list(images)])
        step_ids.append(step.get("id"))
    recipe_id = item.get("recipe_id")
    return {
        "qid": str(item.get("qid", "")),
        "task": str(item.get("task", "")),
        "recipe_id": str(recipe_id) if isinstance(recipe_id, str | int) and str(recipe_id) else None,
        "step_ids": step_ids,
        "steps": steps,
    }


def recipe_key(candidate: dict) -> str:
    """The recipe a question is about: its recipe_id, else a hash of its step ids (else steps)."""
    if candidate["recipe_id"]:
        return candidate["recipe_id"]
    basis = candidate["step_ids"] if all(s is not None for s in candidate["step_ids"]) else candidate["steps"]
    return "steps-" + hashlib.sha1(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:16]


def _preference(candidate: dict) -> tuple:
    """Sort key, best first: titled, with images, longest; then the smallest qid (a total order)."""
    steps = candidate["steps"]
    titled = any(title.strip() for title, _, _ in steps)
    n_images = sum(len(images) for _, _, images in steps)
    chars = sum(len(title) + len(body) for title, body, _ in steps)
    return (
        not titled,
        n_images == 0,
        -len(steps),
        -n_images,
        -chars,
        candidate["qid"],
        json.dumps(candidate, sort_keys=True),
    )


def _content_key(candidate: dict) -> str:
    """Questions showing the same context (same steps) have the same key."""
    return json.dumps([candidate["step_ids"], candidate["steps"]], sort_keys=True)


def _id_keys(candidate: dict) -> list[str] | None:
    """The step ids as keys, or None unless every step has a distinct string or integer id."""
    ids = candidate["step_ids"]
    if not all(isinstance(i, str | int) and not isinstance(i, bool) for i in ids):
        return None
    keys = [json.dumps(i) for i in ids]
    return keys if len(set(keys)) == len(keys) else None


def merge_candidates(candidates) -> dict:
    """One recipe's contexts (any order) -> its merged context (see the module docstring).

    Output: a candidate (qid and task of the best single context) with "contexts" (how many
    distinct contexts were merged) and "unaligned" (how many could not be aligned, left out).
    """
    distinct: dict[str, dict] = {}
    for c in candidates:
        key = _content_key(c)
        if key not in distinct or _preference(c) < _preference(distinct[key]):
            distinct[key] = c
    ordered = sorted(distinct.values(), key=_preference)
    base = ordered[0]
    base_keys = _id_keys(base)
    by_position = [f"#{k}" for k in range(len(base["steps"]))]  # slot keys when ids do not align
    # slots: [key, [titles], [bodies], [images]] in document order
    slots = [
        [key, [title], [body], list(images)]
        for key, (title, body, images) in zip(base_keys or by_position, base["steps"], strict=True)
    ]
    unaligned = 0
    for c in ordered[1:]:
        keys = _id_keys(c) if base_keys is not None else None
        if keys is None or not set(keys) & set(base_keys or ()):
            if len(c["steps"]) != len(base["steps"]):
                unaligned += 1
                continue
            keys = base_keys or by_position  # step k is the base's step k
        insert_at = 0
        for key, (title, body, images) in zip(keys, c["steps"], strict=True):
            at = next((n for n, slot in enumerate(slots) if slot[0] == key), None)
            if at is None:
                slots.insert(insert_at, [key, [], [], []])
                at = insert_at
            slot = slots[at]
            slot[1].append(title)
            slot[2].append(body)
            for image in images:
                if image not in slot[3]:
                    slot[3].append(image)
            insert_at = at + 1
    steps = [
        [next((t for t in titles if t.strip()), ""), max(bodies, key=len, default=""), images]
        for _, titles, bodies, images in slots
    ]
    step_ids = [json.loads(slot[0]) for slot in slots] if base_keys is not None else base["step_ids"]
    return {
        "qid": base["qid"],
        "task": base["task"],
        "recipe_id": base["recipe_id"],
        "step_ids": step_ids,
        "steps": steps,
        "contexts": len(ordered) - unaligned,
        "unaligned": unaligned,
    }


class MergeContexts(beam.CombineFn):
    """The contexts of one recipe -> merge_candidates of them; keeps only distinct contexts.

    The accumulator maps a context's content to its preferred question, so adding and merging
    are associative and commutative, and the merge itself runs once, on a sorted list.
    """

    def create_accumulator(self) -> dict:
        return {}

    def add_input(self, acc: dict, candidate: dict) -> dict:
        key = _content_key(candidate)
        if key not in acc or _preference(candidate) < _preference(acc[key]):
            acc[key] = candidate
        return acc

    def merge_accumulators(self, accumulators) -> dict:
        out: dict = {}
        for acc in accumulators:
            for candidate in acc.values():
                self.add_input(out, candidate)
        return out

    def extract_output(self, acc: dict) -> dict:
        return merge_candidates(acc.values())


def image_file_name(name: str) -> str | None:
    """The file name an image has on disk; None for a name that would leave the image folder.

    Some names in the JSON contain '*easy*' while the files carry '_easy_' (a '*' cannot be
    stored portably, and it is a glob character for Beam's FileSystems), so '*' becomes '_'.
    """
    name = name.strip().replace("*", "_")
    if not name or name.startswith("/") or "\\" in name or ".." in name.split("/"):
        return None
    return name


def recipe_document(
    split: str, key: str, candidate: dict, image_root: str
) -> tuple[RawDocument | None, list[tuple[str, str, str, str]], int]:
    """(document or None, problems as (kind, source_id, reason, detail), images of empty steps).

    The last value counts the image references dropped because their step has no tokens.
    """
    doc_id = f"rqa-{key}"
    problems: list[tuple[str, str, str, str]] = []
    sentences: list[str] = []
    uris: list[str] = []
    index_of: dict[str, int] = {}
    links: list[tuple[int, int]] = []
    of_empty_steps = 0
    folder = fileio.join(image_root, split, "images-qa")
    for k, (title, body, images) in enumerate(candidate["steps"]):
        sentence = " ".join(part for part in (title.strip(), body.strip()) if part)
        sentences.append(sentence)
        if not has_tokens(sentence):  # the build drops this sentence: its images have no text
            of_empty_steps += len(images)
            continue
        for raw in images:
            name = image_file_name(raw)
            if name is None:
                problems.append(("image", f"{doc_id}#{raw[:80]}", "bad_file_name", "not a plain file name"))
                continue
            if name not in index_of:  # one file used by two steps is one image, linked to both
                index_of[name] = len(uris)
                uris.append(fileio.join(folder, name))
            if (k, index_of[name]) not in links:
                links.append((k, index_of[name]))
    if not uris:
        detail = f"{len(sentences)} steps, no step image"
        if of_empty_steps:
            detail += f" (dropped {of_empty_steps} of steps without text)"
        problems.append(("document", doc_id, "no_linked_images", detail))
        return None, problems, of_empty_steps
    metadata = {"official_split": split, "qid": candidate["qid"], "task": candidate["task"]}
    if candidate["recipe_id"]:
        metadata["recipe_id"] = candidate["recipe_id"]
    if "contexts" in candidate:
        metadata["contexts_merged"] = str(candidate["contexts"])
    doc = RawDocument(
        doc_id=doc_id,
        source=SOURCE,
        sentences=sentences,
        image_uris=uris,
        links=links,
        metadata=metadata,
        split=DOC_SPLITS[split],
    )
    return doc, problems, of_empty_steps


# --- Beam ---------------------------------------------------------------------------------------


class ReadSplitFile(beam.DoFn):
    """Official split name -> ((split, recipe key), candidate) per question, streamed from the file."""

    def __init__(self, root: str, include_test: bool):
        self.root, self.include_test = root, include_test

    def process(self, split: str):
        if split == "test" and not self.include_test:
            count("official_test_skipped")
            return
        name = f"{split}.json"
        uri = fileio.join(self.root, name)
        try:
            fh = fileio.open_read(uri)
        except OSError as exc:
            yield dead_letter("line", name, "missing_split_file", f"{type(exc).__name__}: {exc}")
            return
        index = -1
        try:
            with fh:
                for index, (_, item) in enumerate(stream_arrays(text_chunks(fh), {"data"}, {"data"})):
                    count("recipe_items_read")
                    qid = item.get("qid") if isinstance(item, dict) else None
                    source_id = f"{name}#{index}" + (f":{qid}" if isinstance(qid, str) else "")
                    if has_invalid_utf8(item):
                        yield dead_letter("line", source_id, "not_utf8", "the item holds non-UTF-8 bytes")
                        continue
                    item = _repaired(item)
                    try:
                        candidate = parse_item(item)
                    except ValueError as exc:
                        yield dead_letter("line", source_id, "malformed_item", str(exc))
                        continue
                    yield (split, recipe_key(candidate)), candidate
        except MalformedJson as exc:
            yield dead_letter("line", name, "malformed_split_file", f"after {index + 1} items: {exc}")
        except OSError as exc:
            yield dead_letter("line", name, "unreadable_split_file", f"after {index + 1} items: {exc}")


class ToDocument(beam.DoFn):
    def __init__(self, image_root: str):
        self.image_root = image_root

    def process(self, kv):
        (split, key), candidate = kv
        count("recipes_unique")
        if candidate.get("unaligned"):
            count("recipe_contexts_unaligned", candidate["unaligned"])
        doc, problems, of_empty_steps = recipe_document(split, key, candidate, self.image_root)
        if of_empty_steps:
            count("images_of_empty_steps", of_empty_steps)
        for kind, source_id, reason, detail in problems:
            yield dead_letter(kind, source_id, reason, detail)
        if doc is not None:
            count("documents_in")
            yield doc


class ReadRecipeQA(beam.PTransform):
    """``DIR/{train,val,test}.json`` -> one RawDocument per recipe, plus dead letters."""

    def __init__(self, root: str, splits: list[str], include_test: bool, images_dir: str):
        super().__init__()
        self.root, self.splits, self.include_test = root, splits, include_test
        self.image_root = fileio.join(root, *images_dir.strip("/").split("/"))

    def expand(self, pbegin):
        items = (
            pbegin
            | "Splits" >> beam.Create(self.splits)
            | "Stream" >> dead_lettered(ReadSplitFile(self.root, self.include_test), "items")
        )
        docs = (
            items.items
            | "MergeContextsPerRecipe" >> beam.CombinePerKey(MergeContexts())
            | "ToDocument" >> dead_lettered(ToDocument(self.image_root))
        )
        dead = (items[DEAD_LETTER], docs[DEAD_LETTER]) | "DeadLetters" >> beam.Flatten()
        return {"documents": docs.documents, DEAD_LETTER: dead}


def _splits(ctx: SourceContext) -> list[str]:
    names = [s.strip() for s in (ctx.str("splits") or "").split(",") if s.strip()]
    unknown = sorted(set(names) - set(OFFICIAL_SPLITS))
    if not names or unknown:
        raise MmlinksError(
            f"--source-option splits wants names from {list(OFFICIAL_SPLITS)}, not {ctx.str('splits')!r}"
        )
    include_test = ctx.bool("include_official_test")
    if include_test and "test" not in names:
        names.append("test")
    return sorted(set(names), key=OFFICIAL_SPLITS.index)


def _make(ctx: SourceContext) -> ReadRecipeQA:
    images_dir = ctx.str("images_dir") or ""
    return ReadRecipeQA(ctx.input, _splits(ctx), ctx.bool("include_official_test"), images_dir)


def _check(ctx: SourceContext) -> None:
    splits = _splits(ctx)
    if not fileio.is_local(ctx.input):
        return  # remote inputs are checked on the workers (a missing file is a dead letter)
    wanted = [s for s in splits if s != "test" or ctx.bool("include_official_test")]
    if not any(fileio.exists(fileio.join(ctx.input, f"{s}.json")) for s in wanted):
        raise MmlinksError(
            f"{ctx.input} is not a RecipeQA folder: none of {[f'{s}.json' for s in wanted]} is there"
        )


SPEC = SourceSpec(
    name=SOURCE,
    summary="RecipeQA: one document per recipe (steps + step images), DIR/{train,val}.json + images",
    make=_make,
    options=OPTIONS,
    build_defaults=BUILD_DEFAULTS,
    check=_check,
)
