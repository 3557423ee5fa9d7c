"""CITE (Alikhani et al. 2019), the base of CITE++: RecipeQA steps and images labelled with
coherence answers, joined to the ``recipeqa`` source's images (issue #17; docs/sources.md).

The annotation file is a pandas-written ``|`` table. Splits: the paper's 80 / 20 train / test,
10 % of train as validation (0.72 / 0.08 / 0.2 by document id)."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import PurePosixPath

import apache_beam as beam

from pipelines import fileio
from pipelines.records import RawDocument, count, dead_letter, dead_lettered
from pipelines.sources.base import SourceContext, SourceOption, SourceSpec
from pipelines.sources.csvtable import csv_rows
from schemas.errors import MmlinksError

SOURCE = "cite"
# The paper's Table 1: question -> relation (names usable as --relation and in metric names)
QUESTIONS = {
    "q2_resp": "Expansion",  # the image gives visual information about the step
    "q3_resp": "ImageNeeded",  # you need the image to carry out the step
    "q4_resp": "Elaboration-t",  # the text gives quantities the image cannot show
    "q5_resp": "Elaboration-i-tool",  # the image shows a tool the text does not mention
    "q6_resp": "Temporal-i-before-t",  # the image shows how to prepare before the step
    "q7_resp": "Temporal-i-after-t",  # the image shows the result of the step
    "q8_resp": "Temporal-i-during-t",  # the image shows the action in progress
}
RELATIONS = tuple(QUESTIONS.values())
COLUMNS = ("", "Index", "q1_resp", *QUESTIONS, "q9_resp", "q10_resp", "qimg", "stim_id", "stim_txt")
TRUE, FALSE = {"True", "true", "1"}, {"False", "false", "0"}
SPLITS = ("train", "val", "test")  # the RecipeQA image folders searched, in order
OPTIONS = (
    SourceOption("recipeqa", None, "the RecipeQA folder the step images are read from (required)"),
    SourceOption(
        "images_dir",
        "images/images-qa",
        "image folder under --recipeqa: <images_dir>/<split>/images-qa/<file>",
    ),
)


def clean_text(text: str) -> str:
    """HTML entities unescaped (``&#160;`` is a no-break space), whitespace collapsed."""
    return re.sub(r"\s+", " ", html.unescape(text)).strip()


def recipe_of(image: str) -> tuple[str, int] | None:
    """``churros_1_0.jpg`` -> ("churros", 1): RecipeQA's <recipe_id>_<step>_<n> file names."""
    parts = PurePosixPath(image).stem.rsplit("_", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return parts[0], int(parts[1])


def parse_cite_csv(text: str, name: str) -> Iterator[dict | tuple[str, str, str]]:
    """One dict per usable row (doc_id, text, image file, relations, metadata), or (source id,
    reason, detail) for a row that cannot be a pair."""
    stem = PurePosixPath(name).stem
    for n, row in enumerate(csv_rows(text, name, COLUMNS, delimiter="|")):
        if isinstance(row, tuple):  # bad_header or malformed_csv: the file ends here
            yield row
            return
        index = (row.get("Index") or "").strip() or str(n)
        sid = f"{stem}:{index}"
        body, image = clean_text(row.get("stim_txt") or ""), (row.get("qimg") or "").strip()
        if not body:
            yield (sid, "no_text", "")
            continue
        answers = {q: (row.get(q) or "").strip() for q in QUESTIONS}
        bad = {q: v for q, v in answers.items() if v not in TRUE | FALSE}
        if bad:
            yield (sid, "bad_label", str(bad)[:200])
            continue
        if not image or "/" in image or image.startswith("."):
            yield (sid, "bad_image_name", image[:200])
            continue
        meta = {
            "relations": ",".join(rel for q, rel in QUESTIONS.items() if answers[q] in TRUE),
            "cite_stim_id": (row.get("stim_id") or "").strip(),
            "cite_file": stem,
        }
        recipe = recipe_of(image)
        if recipe is not None:
            meta["recipe_id"], meta["recipe_step"] = recipe[0], str(recipe[1])
        for q in ("q1_resp", "q9_resp", "q10_resp"):
            if (row.get(q) or "").strip():
                meta[f"cite_{q[:-5]}"] = clean_text(row[q])[:500]
        yield {"doc_id": f"cite-{stem}-{index}", "text": body, "image": image, "metadata": meta}


class ParseCiteFile(beam.DoFn):
    """A CSV file -> RawDocuments whose image is found in RecipeQA (dead letters otherwise)."""

    def __init__(self, image_root: str):
        self.image_root = image_root

    def _find(self, image: str) -> str | None:
        for split in SPLITS:
            path = fileio.join(self.image_root, split, "images-qa", image)
            if fileio.exists(path):
                return path
        return None

    def process(self, path: str):
        try:
            text = fileio.read_text(path)
        except UnicodeDecodeError as exc:
            yield dead_letter("line", path, "not_utf8", str(exc))
            return
        for item in parse_cite_csv(text, path):
            if not isinstance(item, dict):
                yield dead_letter("line", *item)
                continue
            uri = self._find(item["image"])
            if uri is None:
                yield dead_letter("document", item["doc_id"], "image_not_in_recipeqa", item["image"])
                continue
            count("documents_in")
            yield RawDocument(
                doc_id=item["doc_id"],
                source=SOURCE,
                sentences=[item["text"]],
                image_uris=[uri],
                links=[(0, 0)],
                metadata=item["metadata"],
                split=None,
            )


class ReadCite(beam.PTransform):
    """The annotation CSVs -> RawDocument, with a ``dead_letter`` tagged output."""

    def __init__(self, input_uri: str, recipeqa: str, images_dir: str = "images/images-qa"):
        super().__init__()
        self.files = fileio.input_files(input_uri, ".csv")
        self.image_root = fileio.join(recipeqa, *images_dir.strip("/").split("/"))

    def expand(self, pbegin):
        return (
            pbegin
            | "Files" >> beam.Create(self.files)
            | "Parse" >> dead_lettered(ParseCiteFile(self.image_root))
        )


def _make(ctx: SourceContext):
    return ReadCite(ctx.input, ctx.str("recipeqa") or "", ctx.str("images_dir") or "")


def _check(ctx: SourceContext) -> None:
    if not ctx.str("recipeqa"):
        raise MmlinksError(
            "--source cite needs the RecipeQA folder of the step images: --source-option recipeqa=DIR"
        )
    if not fileio.input_files(ctx.input, ".csv"):
        raise MmlinksError(f"cite input {ctx.input} holds no CSV file (the released data/data.csv)")


SPEC = SourceSpec(
    name=SOURCE,
    summary="CITE / CITE++ (Alikhani et al.): RecipeQA step texts + images with coherence answers Q2-Q8",
    make=_make,
    options=OPTIONS,
    build_defaults={"split_ratios": {"train": 0.72, "val": 0.08, "test": 0.2}},
    check=_check,
    relations=lambda ctx: list(RELATIONS),
)
