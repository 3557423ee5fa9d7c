"""The link job's element functions and DoFns, each small enough to test alone.

Documents travel as dicts (``doc_id``, ``split``, ``sentences``, ``features``, ``links``,
``shard``). Why chunks in a fixed order: a document's scores never depend on how a runner
bundled its neighbours."""

from __future__ import annotations

import hashlib
import json
import math
import pickle
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pipelines import fileio
from pipelines.records import count, dead_letter
from schemas.feature_bytes import NUMPY_DTYPES, feature_values, stored_dtype
from schemas.links import link_shard_bytes
from schemas.manifest import ShardInfo

EVAL = "eval"
# what the job reads of a shard ("links" only for --eval): of the images only their features
# (a nested column path: the images' ids, URIs, sizes and regions are never decoded)
LINK_COLUMNS = ["doc_id", "split", "sentences", "images.list.element.features", "links"]


@dataclass
class Chunk:
    """At most ``batch_docs`` documents scored together, and the key that names them in order."""

    key: str
    docs: list[dict]

    def without_features(self) -> Chunk:
        """This chunk once scored: what linking still needs (ids, sentences, links, shard); the
        feature matrices, most of its bytes, are dropped."""
        return Chunk(self.key, [{k: v for k, v in d.items() if k != "features"} for d in self.docs])


PICKLED_FIELD_BYTES = 64  # a rough pickled size of a sentence or a small field (ids, split, shard)


class ChunkCoder(beam.coders.Coder):
    """How a runner moves a ``Chunk`` (pickle: numpy arrays inside dicts) and, the reason this
    coder exists, how it *sizes* one without encoding it.

    Beam samples the size of elements on every PCollection for its byte counters, and the
    default coder of a dict holding numpy arrays sizes one by pickling it whole: for this job
    (large elements, few of them, so most are sampled) that was 209 MB of pickling per 5,000
    documents, for a metric (docs/benchmarks.md, issue #16; its wall-time gain was within the
    machine's noise). Sizing from the arrays' ``nbytes`` gives the counter without the copy."""

    def encode(self, value: Chunk) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def decode(self, encoded: bytes) -> Chunk:
        return pickle.loads(encoded)  # a runner's own transport between this job's stages

    def estimate_size(self, value: Chunk) -> int:
        return sum(
            PICKLED_FIELD_BYTES * (len(d["sentences"]) + 4) + getattr(d.get("features"), "nbytes", 0)
            for d in value.docs
        )

    def is_deterministic(self) -> bool:
        return False  # never a key: chunks are only moved, never grouped by value

    def to_type_hint(self) -> type:
        return Chunk


beam.coders.registry.register_coder(Chunk, ChunkCoder)


def check_document(doc: dict, dim: int, max_sentences: int, max_images: int) -> tuple[str, str] | None:
    """(reason, detail) when a document cannot be linked, else None."""
    n, feats = len(doc["sentences"]), doc["features"]
    m = len(feats)
    if doc.get("corrupt"):
        return "corrupt_features", doc["corrupt"]
    if n == 0 or m == 0:
        return "empty_document", f"{n} sentences, {m} images"
    if n > max_sentences or m > max_images:
        return "too_large", f"{n} sentences, {m} images (limits {max_sentences}, {max_images})"
    if feats.ndim != 2 or feats.shape[1] != dim:
        width = feats.shape[1] if feats.ndim == 2 else "ragged"
        return "wrong_feature_width", f"features of width {width}, the model takes {dim}"
    if not doc.get("finite") and not np.isfinite(feats).all():
        return "non_finite_features", "NaN or infinity in the image features"
    return None


def _features(images: list[dict | None]) -> np.ndarray:
    rows = [[] if im is None or im.get("features") is None else im["features"] for im in images]
    if not rows:
        return np.zeros((0, 0), np.float32)
    if len({len(r) for r in rows}) > 1:  # ragged: dead-lettered by check_document
        out = np.empty(len(rows), dtype=object)
        out[:] = rows
        return out
    return np.asarray(rows, dtype=np.float32).reshape(len(rows), -1)


def feature_matrices(table: pa.Table) -> tuple[list[np.ndarray], bool]:
    """(per-document [m, D] float32 feature matrices of a table's ``images``, whether every
    value is finite), read in bulk (``schemas.feature_bytes.feature_values``: the stored bytes
    viewed in place, no copy for float32 shards) and cut per document with plain slices.
    ``training.data.features_of`` does the same for training but copies (``astype``) so that
    its arrays are writable; linking only reads them. Finiteness is checked once per table
    (one numpy pass) rather than per document. Raises ValueError when the widths differ
    inside the table or an image has no features."""
    values, counts = feature_values(table)
    values = values.astype(np.float32, copy=False)
    ends = np.cumsum(counts).tolist()
    starts = [0, *ends][:-1]
    return [values[a:b] for a, b in zip(starts, ends, strict=True)], bool(np.isfinite(values).all())


def documents_of_table(table: pa.Table, shard: str) -> list[dict]:
    """Shard rows (features stored or logical) -> document dicts; features read per table
    (``feature_matrices``), row by row only when widths differ inside the table or a vector is
    missing or damaged (such documents are dead-lettered later). A table without a ``links``
    column (read without it: no evaluation) gives ``links`` None. ``finite`` True: every
    feature value of the document is known finite (``check_document`` skips its own pass)."""
    ids = table.column("doc_id").to_pylist()
    sentences = table.column("sentences").to_pylist()
    splits = table.column("split").to_pylist()
    if "links" in table.column_names:
        links = [
            None if lk is None else [(x["sentence"], x["image"]) for x in lk]
            for lk in table.column("links").to_pylist()
        ]
    else:
        links = [None] * len(ids)
    corrupt: list[str | None] = [None] * len(ids)
    try:
        feats, finite = feature_matrices(table)
    except ValueError:  # mixed widths, a missing or a damaged vector in this table: row by row
        (feats, corrupt), finite = _rows_features(table), False
    docs = [
        {
            "doc_id": d,
            "split": sp,
            "sentences": s,
            "features": f,
            "links": lk,
            "shard": shard,
            "finite": finite,
        }
        for d, sp, s, f, lk in zip(ids, splits, sentences, feats, links, strict=True)
    ]
    for doc, why in zip(docs, corrupt, strict=True):
        if why:
            doc["corrupt"] = why
    return docs


def _rows_features(table: pa.Table) -> tuple[list[np.ndarray], list[str | None]]:
    """Each document's features on its own (``_features``), and why a document's stored bytes
    cannot be read (not a whole number of values: dead-lettered as ``corrupt_features``)."""
    stored = pa.types.is_binary(table.schema.field("images").type.value_type.field("features").type)
    dtype = stored_dtype(table, None) if stored else None
    feats, corrupt = [], []
    for images in table.column("images").to_pylist():
        vectors = [None if im is None else im.get("features") for im in images]
        if dtype is not None:
            size = NUMPY_DTYPES[dtype].itemsize
            if any(v is not None and len(v) % size for v in vectors):
                feats.append(np.zeros((0, 0), np.float32))
                corrupt.append(f"a stored feature vector is not a whole number of {dtype} values")
                continue
            vectors = [None if v is None else np.frombuffer(v, NUMPY_DTYPES[dtype]) for v in vectors]
        feats.append(_features([{"features": v} for v in vectors]))
        corrupt.append(None)
    return feats, corrupt


def chunks_of(docs: list[dict], key: str, limits: tuple[int, int, int]) -> Iterator:
    """Documents in their fixed order -> dead letters for the unlinkable ones and one chunk of
    the rest (the caller passes at most ``batch_docs`` documents)."""
    dim, max_s, max_i = limits
    kept = []
    count("documents_read", len(docs))  # one counter update per chunk, not per document
    for doc in docs:
        bad = check_document(doc, dim, max_s, max_i)
        if bad:
            yield dead_letter("document", doc["doc_id"], *bad)
        else:
            kept.append(doc)
    if kept:
        yield Chunk(key, kept)


ROW_GROUPS_PER_UNIT = 2  # decoded in parallel, one thread each (see ReadChunks)


def row_groups(
    shard: tuple[str, str], data_dir: str, per_unit: int = ROW_GROUPS_PER_UNIT
) -> list[tuple[str, str, tuple[int, ...]]]:
    """(shard path, output name) -> (path, name, row groups) units of up to ``per_unit``
    consecutive Parquet row groups, read from the footer only: the units the job spreads over
    workers (the features are read where they are scored, never shuffled)."""
    import pyarrow.parquet as pq

    from schemas.shards import check_schema

    path, name = shard
    with fileio.open_read(fileio.join(data_dir, path)) as fh:
        pf = pq.ParquetFile(fh)
        check_schema(pf.schema_arrow, path)
        n = pf.num_row_groups
        return [(path, name, tuple(range(k, min(n, k + per_unit)))) for k in range(0, n, per_unit)]


class ReadChunks(beam.DoFn):
    """(shard path, output name, row groups) -> chunks of at most ``batch_docs`` documents of
    each row group in file order (the dataset sorts shards by doc id), plus dead letters.

    A unit's row groups are decoded in parallel, one thread each, before its first chunk is scored:
    decoding the feature column is most of what the job does besides the model, it runs in Arrow
    without the GIL, and between the model's passes the other cores are idle. Decoding ahead *while*
    the model runs was tried (a read-ahead thread at normal priority, nice 19 and SCHED_IDLE): each
    slowed the model's threads more than it saved. Chunks, their order and so the output bytes are a
    plain loop's."""

    def __init__(self, data_dir: str, batch_docs: int, limits: tuple[int, int, int], evaluate: bool = True):
        self.data_dir, self.batch_docs, self.limits = data_dir, batch_docs, limits
        # the ground-truth links are decoded only for an evaluation
        self.columns = LINK_COLUMNS if evaluate else [c for c in LINK_COLUMNS if c != "links"]

    def setup(self):
        from pipelines.worker_tuning import tune_worker_process

        tune_worker_process()
        self._pool = ThreadPoolExecutor(ROW_GROUPS_PER_UNIT, thread_name_prefix="decode")

    def teardown(self):
        self._pool.shutdown(wait=True)

    def process(self, unit: tuple[str, str, tuple[int, ...]]):
        path, name, groups = unit
        decoded = list(self._pool.map(lambda g: self.decode(path, name, g), groups))
        for group, tables in zip(groups, decoded, strict=True):
            for k, docs in enumerate(tables):
                yield from chunks_of(docs, f"{name}#{group}.{k}", self.limits)

    def decode(self, path: str, name: str, group: int) -> list[list[dict]]:
        """One row group -> its documents, ``batch_docs`` at a time."""
        with fileio.open_read_arrow(fileio.join(self.data_dir, path)) as fh:
            tables = shard_tables(fh, self.batch_docs, self.columns, [group])
            return [documents_of_table(t, name) for t in tables]


def shard_tables(
    fh, batch_docs: int, columns: list[str], groups: list[int] | None = None
) -> Iterator[pa.Table]:
    """An open shard's rows (of row groups ``groups``; all by default), ``batch_docs`` at a
    time, as stored (features as bytes: ``documents_of_table`` reads them in place) with the
    shard's schema metadata. ``columns`` may name nested paths (``LINK_COLUMNS``)."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(fh)
    meta = pf.schema_arrow.metadata  # a record batch does not carry it: the feature dtype
    # one decoding thread per call: the job decodes row groups on its own threads (ReadChunks),
    # and Arrow's pool on top of them only added hand-offs
    for rb in pf.iter_batches(batch_size=batch_docs, row_groups=groups, columns=columns, use_threads=False):
        yield pa.Table.from_batches([rb]).replace_schema_metadata(meta)


def from_document(doc) -> dict:
    """A built ``schemas.document.Document`` (raw --input) -> a document dict."""
    feats = _features([{"features": im.features} for im in doc.images])
    return {
        "doc_id": doc.doc_id,
        "split": doc.split,
        "sentences": list(doc.sentences),
        "features": feats,
        "links": None if doc.links is None else [tuple(x) for x in doc.links],
        "shard": "",
    }


def raw_chunks(kv, batch_docs: int, limits: tuple[int, int, int]) -> Iterator:
    """(bucket, documents) -> the bucket's documents sorted by id, cut into chunks."""
    bucket, docs = kv
    name = f"links-{bucket:05d}.parquet"
    docs = sorted(docs, key=lambda d: d["doc_id"])
    for k in range(0, len(docs), batch_docs):
        yield from chunks_of([{**d, "shard": name} for d in docs[k : k + batch_docs]], f"{name}#{k}", limits)


class LinkChunk(beam.DoFn):
    """A scored chunk -> its link rows as one element per output shard (``(shard, block)``, the
    chunk's rows of that shard pickled: ``rows_of_block``): the shuffle to the writers moves a few
    byte strings per chunk, not one element per document, each encoded and decoded once instead of
    through Beam's generic coder at every hop (~0.09 -> ~0.035 CPU-s per 5,000 rows, inside the
    job's steady-state window). With ``evaluate`` also one evaluation record per labelled document
    on the ``eval`` output."""

    def __init__(self, assign: str, min_score: float, keep_scores: bool, evaluate: bool):
        self.assign, self.min_score = assign, min_score
        self.keep_scores, self.evaluate = keep_scores, evaluate

    # -> Iterator (untyped): from the yields Beam would infer Union[TaggedOutput, Tuple[str, bytes]]
    # and refuse it at the writers' GroupByKey
    def process(self, result) -> Iterator:
        from linking.assign import assign_links, pad_scores

        chunk, matrices = result.example, result.inference  # a Chunk without its features
        padded, n, m = pad_scores(matrices)
        sentence, score = assign_links(padded, n, m, self.assign, self.min_score)
        # counters once per chunk: a Beam counter update costs about as much as a small row
        count("documents_linked", len(matrices))
        count("images", int(m.sum()))
        count("images_linked", int(((sentence >= 0) & (np.arange(sentence.shape[1]) < m[:, None])).sum()))
        sentences, scores = sentence.tolist(), score.astype(np.float32).tolist()
        by_shard: dict[str, list[dict]] = {}
        for b, doc in enumerate(chunk.docs):
            row = link_row(doc, matrices[b], sentences[b][: m[b]], scores[b][: m[b]], self.keep_scores)
            by_shard.setdefault(doc["shard"], []).append(row)
            if self.evaluate and doc["links"] is not None:
                yield beam.pvalue.TaggedOutput(EVAL, eval_record(doc, matrices[b], row))
        for shard, rows in by_shard.items():
            yield shard, pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL)


def link_row(doc: dict, scores: np.ndarray, sentence: list[int], score: list[float], keep: bool) -> dict:
    """One document's link row; ``sentence`` (-1: unlinked) and ``score`` are plain Python lists
    (``ndarray.tolist()`` of the chunk's arrays: no per-element numpy scalars)."""
    return {
        "doc_id": doc["doc_id"],
        "split": doc["split"],
        "n_sentences": int(scores.shape[0]),
        "n_images": int(scores.shape[1]),
        "sentence": [s if s >= 0 else None for s in sentence],
        "score": [x if s >= 0 else None for s, x in zip(sentence, score, strict=True)],
        "scores": scores.astype(np.float32).tolist() if keep else None,
    }


def eval_record(doc: dict, scores: np.ndarray, row: dict) -> dict:
    """What the evaluation needs of one labelled document: its link counts and its metrics
    (``training.metrics``; None when AUC is undefined for it)."""
    from training.metrics import document_metrics, link_counts

    predicted = [(s, j) for j, s in enumerate(row["sentence"]) if s is not None]
    tp, n_pred, n_gold = link_counts(predicted, doc["links"])
    m = document_metrics(doc["doc_id"], scores, doc["links"])
    return {
        "doc_id": doc["doc_id"],
        "tp": tp,
        "predicted": n_pred,
        "gold": n_gold,
        "metrics": None if m is None else dict(m.__dict__),
    }


class EvalTotals(beam.CombineFn):
    """Evaluation records -> the job's evaluation totals, combined where they are made: one
    process never holds a record per document (the corpus-scale issue #47). Accumulator:
    (documents, tp, predicted, gold, scored documents, [sum auc, sum p@1, sum p@5, sum auc^2]);
    the sums are exact ``Fraction``s of the floats, so the totals do not depend on how a runner
    bundled or merged them and a rerun writes the same manifest bytes (the squares give the AUC's
    standard error, ``summarize``'s ``auc_se``, without a record per document)."""

    def create_accumulator(self):
        return (0, 0, 0, 0, 0, (Fraction(0),) * 4)

    def add_input(self, acc, record: dict):
        n, tp, pred, gold, scored, sums = acc
        m = record["metrics"]
        if m is not None:
            scored += 1
            keys = ("auc", "p_at_1", "p_at_5")
            sums = (
                *(_add_exact(s, m[k]) for s, k in zip(sums[:3], keys, strict=True)),
                _add_exact(sums[3], m["auc"], squared=True),  # the square of the exact value
            )
        return (n + 1, tp + record["tp"], pred + record["predicted"], gold + record["gold"], scored, sums)

    def merge_accumulators(self, accs):
        accs = list(accs)
        ints = [sum(a[i] for a in accs) for i in range(5)]
        sums = [Fraction(0)] * 4
        for a in accs:
            sums = [None if x is None or y is None else x + y for x, y in zip(sums, a[5], strict=True)]
        return (*ints, tuple(sums))

    def extract_output(self, acc) -> dict:
        """``labelled_documents``, ``links`` (``training.metrics.link_prf``) and ``scores``
        (``training.metrics.summarize``'s keys: macro averages x100, NaN without a scored one)."""
        from training.metrics import link_prf

        n, tp, pred, gold, scored, sums = acc
        means = [100 * float(s / scored) if scored and s is not None else float("nan") for s in sums[:3]]
        se = float("nan")
        if scored >= 2 and sums[0] is not None and sums[3] is not None:  # sd(ddof=1) / sqrt(n), exact
            var = (sums[3] - sums[0] * sums[0] / scored) / (scored - 1)
            se = 100 * math.sqrt(max(float(var), 0.0) / scored)
        return {
            "labelled_documents": n,
            "links": link_prf(tp, pred, gold),
            "scores": {
                **dict(zip(("auc", "p_at_1", "p_at_5"), means, strict=True)),
                "n_docs": scored,
                "auc_se": se,
            },
        }


def _add_exact(total: Fraction | None, value: float, squared: bool = False) -> Fraction | None:
    """``total + value`` (``squared``: ``+ value ** 2``) exactly; None (the mean is NaN, as
    ``np.mean`` gives) once a value is not finite: ``Fraction`` refuses NaN and infinities, and a
    job must not die on one document."""
    if total is None or not math.isfinite(value):
        return None
    return total + Fraction(value) ** (2 if squared else 1)


def rows_of_block(block: bytes) -> list[dict]:
    """A ``LinkChunk`` block -> its link rows. The blocks are this job's own intermediate data,
    written by ``LinkChunk`` in the same job, never read from outside it."""
    return pickle.loads(block)


class WriteLinkShards(beam.DoFn):
    """(shard name, blocks of rows) -> one Parquet shard, rows sorted by doc id; yields its ShardInfo."""

    def __init__(self, shard_dir: str):
        self.shard_dir = shard_dir

    def process(self, kv):
        name, blocks = kv  # a chunk's rows per block (LinkChunk)
        rows = sorted((r for block in blocks for r in rows_of_block(block)), key=lambda r: r["doc_id"])
        data = link_shard_bytes(rows)
        fileio.write_bytes_atomic(fileio.join(self.shard_dir, name), data)
        split = rows[0]["split"] if len({r["split"] for r in rows}) == 1 else "mixed"
        info = ShardInfo(name, split, len(rows), len(data), hashlib.sha256(data).hexdigest())
        yield json.dumps(info.__dict__, sort_keys=True)


def write_sorted_lines(lines: list[str], path: str) -> None:
    """A small output (dead letters, evaluation records) as one file, sorted, so reruns give
    the same bytes whatever order the runner produced them in."""
    fileio.write_bytes_atomic(path, "".join(f"{x}\n" for x in sorted(lines)).encode())
