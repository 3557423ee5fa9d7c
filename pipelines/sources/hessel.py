"""The original authors' prebuilt datasets (``docs.json`` + ``features.npy`` + ``id2row.json``),
so a user can train on the published data and splits without re-scraping.

Links are the union of both sides' labels (the authors' README stores them on the image side).
The authors already did the store, near-duplicates, filters and CNN, so those are skipped;
``content_id`` is the sha256 of ``hessel:<image id>``."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile

import apache_beam as beam
import numpy as np

from pipelines import fileio
from pipelines.records import count, dead_letter
from pipelines.sources.base import SourceContext, SourceOption, SourceSpec
from pipelines.sources.jsonstream import MalformedJson, has_invalid_utf8, stream_arrays, text_chunks
from pipelines.validate import keep_sentences_with_tokens
from schemas.document import Document, ImageRecord
from schemas.errors import MmlinksError
from schemas.manifest import FeatureExtractorInfo
from schemas.text import repair_strings, repair_text

SOURCE = "hessel"
SPLITS = ("train", "val", "test")
# Paths are not part of the dataset version (like --input): the shards' and the matrix's bytes are.
OPTIONS = (
    SourceOption("docs", None, "documents JSON (default: INPUT/docs.json)", defines_data=False),
    SourceOption("features", None, "N x D feature matrix (default: INPUT/features.npy)", defines_data=False),
    SourceOption("id2row", None, "image id -> row JSON (default: INPUT/id2row.json)", defines_data=False),
    SourceOption("name", None, "dataset name recorded in metadata, e.g. diy (default: the input folder's)"),
)


def _paths(ctx: SourceContext) -> tuple[str, str, str]:
    return (
        ctx.str("docs") or fileio.join(ctx.input, "docs.json"),
        ctx.str("features") or fileio.join(ctx.input, "features.npy"),
        ctx.str("id2row") or fileio.join(ctx.input, "id2row.json"),
    )


def _local_copy(uri: str) -> str:
    """A local path for ``uri`` (copied once per worker from an object store), for np.load's mmap.

    The copy is named by the object's URI, size and modification time, so an object replaced
    at the same URI is copied again rather than served stale.
    """
    if fileio.is_local(uri):
        return fileio.normalize(uri)
    from apache_beam.io.filesystems import FileSystems

    meta = FileSystems.match([uri])[0].metadata_list
    stamp = f"{uri}|{meta[0].size_in_bytes}|{meta[0].last_updated_in_seconds}" if meta else uri
    digest = hashlib.sha256(stamp.encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"mmlinks-hessel-{digest}.npy")
    if not os.path.exists(path):
        fileio.write_bytes_atomic(path, fileio.read_bytes(uri))
    return path


def _npy_shape(uri: str) -> tuple[tuple[int, ...], np.dtype]:
    try:
        arr = np.load(_local_copy(uri), mmap_mode="r")
    except (ValueError, OSError, EOFError) as exc:  # not an .npy, pickled objects, truncated
        raise MmlinksError(f"{uri} is not a readable .npy matrix: {exc}") from None
    return arr.shape, arr.dtype


def _read_id2row(uri: str) -> dict[str, int]:
    try:
        data = json.loads(fileio.read_bytes(uri))
    except (ValueError, RecursionError) as exc:
        raise MmlinksError(f"{uri} is not JSON: {exc}") from None
    if not isinstance(data, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in data.values()
    ):
        raise MmlinksError(f"{uri} must map image ids to integer rows")
    return data


def _file_digest(uri: str) -> str:
    h = hashlib.sha256()
    with fileio.open_read(uri) as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def content_id(image_id: str) -> str:
    return hashlib.sha256(f"hessel:{image_id}".encode()).hexdigest()


class ReadHesselDocs(beam.DoFn):
    """docs.json -> (split, index, raw document) for each document of each split.

    Streamed item by item (the published DIY and WIKI files are large): memory holds one
    document at a time, and a fault part-way keeps the documents before it.
    """

    def process(self, uri: str):
        index = dict.fromkeys(SPLITS, 0)
        try:
            with fileio.open_read(uri) as fh:
                for split, doc in stream_arrays(text_chunks(fh), SPLITS):
                    count("documents_in")
                    k, index[split] = index[split], index[split] + 1
                    if has_invalid_utf8(doc):
                        yield dead_letter("document", f"{split}#{k}", "not_utf8", "invalid UTF-8 bytes")
                        continue
                    doc, repaired = repair_strings(doc)  # escaped lone surrogates: Beam cannot encode them
                    if repaired:
                        count("text_repaired", repaired)
                    yield split, k, doc
        except (MalformedJson, RecursionError) as exc:
            yield dead_letter("line", uri, "malformed_docs_json", str(exc)[:300])


def _label(value, n: int) -> int | str | None:
    """A label: None (unlabelled), -1 (no link), an index in [0, n), or 'bad'."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return "bad"
    return value if -1 <= value < n else "bad"


def _link_labels(doc_id: str, images_in: list, sentences_in: list):
    """Yields a dead letter per out-of-range label; returns ({(sentence, image)}, any label seen).

    Labels come from both sides (image -> sentence and sentence -> image), as in the authors' files.
    """
    n_img, n_sent = len(images_in), len(sentences_in)
    pairs, labelled = set(), False
    for k, (_, s) in enumerate(images_in):
        lab = _label(s, n_sent)
        if lab == "bad":
            yield dead_letter("link", doc_id, "out_of_range", f"image {k} -> sentence {s!r}")
        elif lab is not None:
            labelled = True
            if lab >= 0:
                pairs.add((lab, k))
    for k, (_, i) in enumerate(sentences_in):
        lab = _label(i, n_img)
        if lab == "bad":
            yield dead_letter("link", doc_id, "out_of_range", f"sentence {k} -> image {i!r}")
        elif lab is not None:
            labelled = True
            if lab >= 0:
                pairs.add((k, lab))
    return pairs, labelled


class AssembleHesselDocs(beam.DoFn):
    """(split, index, raw document) -> Document with features from the matrix; dead letters aside."""

    def __init__(self, features_uri: str, id2row_uri: str, name: str):
        self.features_uri, self.id2row_uri, self.name = features_uri, id2row_uri, name

    def setup(self):
        self.features = np.load(_local_copy(self.features_uri), mmap_mode="r")
        self.id2row = _read_id2row(self.id2row_uri)  # checked before the build started

    def process(self, item):
        split, index, raw = item
        doc_id = f"{SOURCE}-{self.name}-{split}-{index:07d}"
        if not (isinstance(raw, list) and len(raw) in (2, 3)):
            yield dead_letter("document", doc_id, "malformed_document", "want [images, sentences, metadata]")
            return
        raw_images, raw_sentences = raw[0], raw[1]
        meta = raw[2] if len(raw) == 3 else None
        if not isinstance(raw_images, list) or not isinstance(raw_sentences, list):
            yield dead_letter("document", doc_id, "malformed_document", "images and sentences must be lists")
            return
        try:
            images_in = [(str(im[0]), im[1] if len(im) > 1 else None) for im in raw_images]
            sentences_in = [(str(s[0]), s[1] if len(s) > 1 else None) for s in raw_sentences]
        except (TypeError, IndexError, KeyError) as exc:
            yield dead_letter("document", doc_id, "malformed_document", f"{type(exc).__name__}: {exc}")
            return
        pairs, labelled = yield from _link_labels(doc_id, images_in, sentences_in)

        images, image_map = [], {}
        for k, (image_id, _) in enumerate(images_in):
            row = self.id2row.get(image_id)
            if not isinstance(row, int) or not 0 <= row < self.features.shape[0]:
                yield dead_letter("image", f"{doc_id}#image-{k}", "missing_features", image_id)
                continue
            image_map[k] = len(images)
            images.append(
                ImageRecord(
                    content_id=content_id(image_id),
                    uri=image_id,
                    width=None,
                    height=None,
                    phash=None,
                    features=np.asarray(self.features[row], np.float32),
                )
            )
        texts = [text for text, _ in sentences_in]
        sentences, sentence_map = yield from keep_sentences_with_tokens(doc_id, texts)
        if not images:
            yield dead_letter("document", doc_id, "no_valid_images")
            return
        if not sentences:
            yield dead_letter("document", doc_id, "no_sentences")
            return
        links = None
        if labelled:
            links = []
            for s, i in sorted(pairs):
                if s in sentence_map and i in image_map:
                    links.append((sentence_map[s], image_map[i]))
                else:
                    yield dead_letter("link", doc_id, "endpoint_dropped", f"({s}, {i})")
        metadata = {"dataset": self.name, "original_split": split, "original_index": str(index)}
        if meta is not None:
            original = meta if isinstance(meta, str) else json.dumps(meta, sort_keys=True)
            metadata["original_id"] = repair_text(original)[0]
        count(f"documents_out:{split}")
        yield Document(
            doc_id=doc_id,
            source=SOURCE,
            split=split,
            sentences=sentences,
            images=images,
            links=links,
            metadata=metadata,
        )


class HesselPrebuilt:
    """The ``prebuilt`` hook of the hessel source (see ``SourceSpec.prebuilt``)."""

    def extractor_info(self, ctx: SourceContext) -> tuple[FeatureExtractorInfo, None]:
        features = _paths(ctx)[1]
        shape, _ = _npy_shape(features)
        # The matrix's own bytes name the features: the same file gives the same dataset version.
        version = f"prebuilt-{_file_digest(features)[:16]}"
        return FeatureExtractorInfo(f"hessel-prebuilt:{_name(ctx)}", version, int(shape[1])), None

    def documents(self, p: beam.Pipeline, ctx: SourceContext):
        docs_uri, features, id2row = _paths(ctx)
        raw = (
            p
            | "DocsFile" >> beam.Create([docs_uri])
            | "ReadDocs" >> beam.ParDo(ReadHesselDocs()).with_outputs("dead_letter", main="docs")
        )
        assembled = (
            raw.docs
            | "Spread" >> beam.Reshuffle()
            | "Assemble"
            >> beam.ParDo(AssembleHesselDocs(features, id2row, _name(ctx))).with_outputs(
                "dead_letter", main="docs"
            )
        )
        dead = (raw.dead_letter, assembled.dead_letter) | "HesselDeadLetters" >> beam.Flatten()
        return assembled.docs, dead


def _name(ctx: SourceContext) -> str:
    name = ctx.str("name") or fileio.normalize(ctx.input).rstrip("/").split("/")[-1] or "dataset"
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)


def _check(ctx: SourceContext) -> None:
    docs, features, id2row = _paths(ctx)
    for label, uri in (("docs", docs), ("features", features), ("id2row", id2row)):
        if not fileio.exists(uri):
            raise MmlinksError(f"hessel {label} file {uri} does not exist")
    shape, dtype = _npy_shape(features)
    if len(shape) != 2 or not np.issubdtype(dtype, np.floating):
        raise MmlinksError(f"{features} must be a 2-D float matrix, not {dtype} {shape}")
    rows = list(_read_id2row(id2row).values())
    # A few bad rows are dead-lettered per image; none inside the matrix means the wrong pair.
    if rows and not any(0 <= r < shape[0] for r in rows):
        raise MmlinksError(f"no row of {id2row} is inside {features} ({shape[0]} rows): a mismatched pair?")


SPEC = SourceSpec(
    name=SOURCE,
    summary="the authors' prebuilt datasets: INPUT/docs.json + features.npy + id2row.json (any feature size)",
    options=OPTIONS,
    # The authors already deduplicated and filtered: say so in the build parameters.
    build_defaults={"dedupe_threshold": "off", "filter_preset": "none"},
    check=_check,
    prebuilt=HesselPrebuilt(),
)
