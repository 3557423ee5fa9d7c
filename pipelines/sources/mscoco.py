"""MSCOCO captions as constructed 10-image, 10-sentence documents (Hessel et al. 2019, supplement;
the construction and the counts against the paper's: docs/sources.md).

Each document is five "true" images with their captions, five "fake" ones and five distractor
captions, grouped and split by ``split_sizes``. Why the pool is sorted and every choice seeded by
``seed`` and group/version: the documents are a function of the input files, whatever Beam's
ordering. The pool is collected on one worker (a few hundred MB), then documents fan out."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import apache_beam as beam

from pipelines import fileio
from pipelines.records import DEAD_LETTER, RawDocument, count, dead_letter, dead_lettered
from pipelines.sources.base import SourceContext, SourceOption, SourceSpec
from pipelines.sources.jsonstream import MalformedJson, has_invalid_utf8, stream_arrays, text_chunks
from pipelines.sources.jsonstream import repaired as _repaired
from pipelines.sources.sampling import rng_for, sample_excluding
from schemas.errors import MmlinksError

SOURCE = "mscoco"
PARTS = ("train", "val")
SPLITS = ("train", "val", "test")
GROUP = 5  # true (and fake) images per document
DISTRACTORS = 5
BUILD_DEFAULTS = {
    "dedupe_threshold": "off",  # training versions repeat their images on purpose
    # A document is exactly 10 images: one that fails to load (undecodable, deleted) drops the
    # document rather than leaving a 9-image one with a dangling caption.
    "filter_options": {"min_images": "10"},
}

OPTIONS = (
    SourceOption("seed", "0", "seed of the true/fake split, the grouping, distractors and shuffles"),
    SourceOption("split_sizes", "0.6:0.2:0.2", "train:val:test proportions of the document groups"),
    SourceOption("years", "2017", "annotation years to read, comma-separated, first wins (2017, 2014)"),
)


@dataclass
class CocoImage:
    image_id: int
    uri: str
    captions: list[str] = field(default_factory=list)  # in annotation-id order


@dataclass
class CocoBuild:
    documents: list[RawDocument]
    problems: list[tuple[str, str, str]]  # (doc id, reason, detail) for dead letters
    unused_images: int


def split_counts(n_groups: int, proportions: tuple[float, float, float]) -> dict[str, int]:
    """Groups per split: val and test rounded from their proportions, train the rest."""
    total = sum(proportions)
    val = round(n_groups * proportions[1] / total)
    test = min(n_groups - val, round(n_groups * proportions[2] / total))
    return {"train": n_groups - val - test, "val": val, "test": test}


def build_documents(images: list[CocoImage], seed: str, proportions: tuple[float, float, float]) -> CocoBuild:
    """The paper's MSCOCO documents from the captioned image pool (pure and deterministic)."""
    pool = sorted((im for im in images if im.captions), key=lambda im: im.image_id)
    order = list(range(len(pool)))
    rng_for("mscoco-pool", seed).shuffle(order)
    half = len(order) // 2
    n_groups = half // GROUP
    true_ids, fake_ids = order[:half], order[half : 2 * half]
    groups = [
        (true_ids[g * GROUP : (g + 1) * GROUP], fake_ids[g * GROUP : (g + 1) * GROUP])
        for g in range(n_groups)
    ]
    sizes = split_counts(n_groups, proportions)
    split_of = ["train"] * sizes["train"] + ["val"] * sizes["val"] + ["test"] * sizes["test"]
    out = CocoBuild([], [], len(pool) - 2 * GROUP * n_groups)
    for split in SPLITS:
        members = [g for g in range(n_groups) if split_of[g] == split]
        # The split's caption pool: (caption, image position in `pool`) of all its images.
        captions = [(c, i) for g in members for i in (*groups[g][0], *groups[g][1]) for c in pool[i].captions]
        for g in members:
            out_docs, problems = _group_documents(g, groups[g], split, pool, captions, seed)
            out.documents.extend(out_docs)
            out.problems.extend(problems)
    return out


def _group_documents(g, group, split, pool, captions, seed):
    true_ids, fake_ids = group
    images = [*true_ids, *fake_ids]
    rng_for("mscoco-images", seed, g).shuffle(images)
    position = {i: k for k, i in enumerate(images)}
    in_doc = set(images)
    n_versions = min(len(pool[i].captions) for i in true_ids) if split == "train" else 1
    docs, problems = [], []
    for v in range(n_versions):
        doc_id = f"coco-{g}-v{v}"
        rng = rng_for("mscoco-version", seed, g, v)
        picked = sample_excluding(rng, len(captions), DISTRACTORS, lambda j: captions[j][1] in in_doc)
        if picked is None:
            problems.append((doc_id, "too_few_distractors", f"fewer than {DISTRACTORS} captions in {split}"))
            continue
        # (caption, image position in the document or None for a distractor)
        sentences = [(pool[i].captions[v], position[i]) for i in true_ids]
        sentences += [(captions[j][0], None) for j in picked]
        rng.shuffle(sentences)
        docs.append(
            RawDocument(
                doc_id=doc_id,
                source=SOURCE,
                sentences=[s for s, _ in sentences],
                image_uris=[pool[i].uri for i in images],
                links=sorted((k, im) for k, (_, im) in enumerate(sentences) if im is not None),
                metadata={
                    "group": str(g),
                    "version": str(v),
                    "coco_image_ids": ",".join(str(pool[i].image_id) for i in images),
                    "seed": seed,
                },
                split=split,
            )
        )
    return docs, problems


# --- Beam ---------------------------------------------------------------------------------------


def _int_id(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"id {value!r} is not an integer")
    return int(value)


class ReadCaptionFile(beam.DoFn):
    """(rank, year, part) -> ("pool", (rank, image id, uri, ((annotation id, caption), ...)))."""

    def __init__(self, root: str):
        self.root = root

    def process(self, job):
        rank, year, part = job
        name = f"annotations/captions_{part}{year}.json"
        images: dict[int, str] = {}
        captions: dict[int, list[tuple[int, str]]] = {}
        try:
            with fileio.open_read(fileio.join(self.root, "annotations", f"captions_{part}{year}.json")) as fh:
                for n, (key, entry) in enumerate(stream_arrays(text_chunks(fh), {"images", "annotations"})):
                    source_id = f"{name}#{key}-{n}"
                    if has_invalid_utf8(entry):
                        yield dead_letter("line", source_id, "not_utf8", "the entry holds non-UTF-8 bytes")
                        continue
                    entry = _repaired(entry)
                    try:
                        if not isinstance(entry, dict):
                            raise ValueError(f"entry is {type(entry).__name__}, not an object")
                        if key == "images":
                            file_name = entry.get("file_name")
                            if not isinstance(file_name, str) or not file_name or "/" in file_name:
                                raise ValueError("no plain file_name")
                            image_id = _int_id(entry.get("id"))
                            if image_id in images:  # the first entry keeps the id; this one is counted
                                yield dead_letter(
                                    "line", source_id, "duplicate_image", f"image id {image_id}"
                                )
                                continue
                            images[image_id] = fileio.join(self.root, f"{part}{year}", file_name)
                        else:
                            text = entry.get("caption")
                            if not isinstance(text, str):
                                raise ValueError("no caption")
                            image_id = _int_id(entry.get("image_id"))
                            captions.setdefault(image_id, []).append((_int_id(entry.get("id")), text.strip()))
                    except (ValueError, TypeError) as exc:
                        yield dead_letter("line", source_id, "malformed_entry", str(exc))
        except FileNotFoundError as exc:
            yield dead_letter("line", name, "missing_annotation_file", str(exc))
            return
        except MalformedJson as exc:
            yield dead_letter("line", name, "malformed_annotation_file", str(exc))
            return
        except OSError as exc:
            yield dead_letter("line", name, "unreadable_annotation_file", str(exc))
            return
        for image_id in sorted(set(captions) - set(images)):
            for ann_id, _ in captions[image_id]:
                yield dead_letter(
                    "sentence", f"{name}#caption-{ann_id}", "unknown_image", f"image_id {image_id}"
                )
        count("coco_images_read", len(images))
        for image_id, uri in images.items():
            yield "pool", (rank, image_id, uri, tuple(sorted(captions.get(image_id, []))))


class BuildDocuments(beam.DoFn):
    def __init__(self, seed: str, proportions: tuple[float, float, float]):
        self.seed, self.proportions = seed, proportions

    def process(self, kv):
        _, records = kv
        merged: dict[int, tuple[int, str, dict[int, str]]] = {}
        for rank, image_id, uri, caps in sorted(records, key=lambda r: (r[1], r[0])):
            best_rank, best_uri, by_ann = merged.get(image_id, (rank, uri, {}))
            for ann_id, text in caps:
                by_ann.setdefault(ann_id, text)  # lower rank (earlier year) first, by the sort
            merged[image_id] = (best_rank, best_uri, by_ann)
        images = [
            CocoImage(image_id, uri, [by_ann[a] for a in sorted(by_ann)])
            for image_id, (_, uri, by_ann) in sorted(merged.items())
        ]
        count("coco_images_without_captions", sum(1 for im in images if not im.captions))
        built = build_documents(images, self.seed, self.proportions)
        count("coco_images_unused", built.unused_images)
        for doc_id, reason, detail in built.problems:
            yield dead_letter("document", doc_id, reason, detail)
        count("documents_in", len(built.documents))
        yield from built.documents


class ReadMscoco(beam.PTransform):
    def __init__(self, root: str, years: list[str], seed: str, proportions: tuple[float, float, float]):
        super().__init__()
        self.root, self.years, self.seed, self.proportions = root, years, seed, proportions

    def expand(self, pbegin):
        jobs = [(rank, year, part) for rank, year in enumerate(self.years) for part in PARTS]
        read = (
            pbegin
            | "Files" >> beam.Create(jobs)
            | "Read" >> dead_lettered(ReadCaptionFile(self.root), "images")
        )
        built = (
            read.images
            | "OnePool" >> beam.GroupByKey()
            | "Build" >> dead_lettered(BuildDocuments(self.seed, self.proportions))
        )
        docs = built.documents | "Spread" >> beam.Reshuffle()
        dead = (read[DEAD_LETTER], built[DEAD_LETTER]) | "DeadLetters" >> beam.Flatten()
        return {"documents": docs, DEAD_LETTER: dead}


def _options(ctx: SourceContext) -> tuple[list[str], str, tuple[float, float, float]]:
    years = [y.strip() for y in (ctx.str("years") or "").split(",") if y.strip()]
    if not years or not all(y.isdigit() and len(y) == 4 for y in years) or len(set(years)) != len(years):
        raise MmlinksError(f"--source-option years wants years like 2017,2014, not {ctx.str('years')!r}")
    raw = ctx.str("split_sizes") or ""
    try:
        values = [float(x) for x in raw.split(":")]
    except ValueError:
        values = []
    if len(values) != 3 or not all(math.isfinite(v) and v >= 0 for v in values) or not sum(values) > 0:
        raise MmlinksError(f"--source-option split_sizes wants train:val:test proportions, not {raw!r}")
    return years, ctx.str("seed") or "0", (values[0], values[1], values[2])


def _make(ctx: SourceContext) -> ReadMscoco:
    years, seed, proportions = _options(ctx)
    return ReadMscoco(ctx.input, years, seed, proportions)


def _check(ctx: SourceContext) -> None:
    years, _, _ = _options(ctx)
    if not fileio.is_local(ctx.input):
        return
    files = [fileio.join(ctx.input, "annotations", f"captions_{p}{y}.json") for y in years for p in PARTS]
    if not any(fileio.exists(f) for f in files):
        raise MmlinksError(f"{ctx.input} is not an MSCOCO folder: none of {files} exists")


SPEC = SourceSpec(
    name=SOURCE,
    summary="MSCOCO: 5 true + 5 fake images, 5 true + 5 distractor captions (DIR/annotations + images)",
    make=_make,
    options=OPTIONS,
    build_defaults=BUILD_DEFAULTS,
    check=_check,
)
