"""Building an archive index of millions of images in bounded memory, resumably (issue #38).

``build_streamed`` trains the index on the first ``train_size`` vectors of a *source* (a function
yielding chunks of (ids, vectors, uris) from a position), then adds chunk by chunk, so only one
chunk and the training sample are in memory beside the index. With a ``folder`` it checkpoints
(names appended to ``archive.store`` tables, ``build-<rows>.faiss``, then ``build.json`` renamed
into place); a rerun cuts back to the last checkpoint and resumes from its position. Why a resumed
index equals an uninterrupted one: FAISS's adds append in order and depend only on the trained
quantizers. Ids seen before are skipped (first wins, as ``archive_images`` does)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from archive.calibration import TARGET_RECALL
from archive.faiss_kinds import (
    IVFPQ_STORE,
    TRAIN_SIZE,
    TRAINED_KINDS,
    index_files,
    read_index_files,
    write_index_files,
)
from archive.index import ArchiveIndex
from archive.store import (
    IdLookup,
    StringTable,
    VectorFile,
    append_table,
    append_vectors,
    hash_ids,
    save_npy_atomic,
    truncate_table,
    truncate_vectors,
    write_json_atomic,
)
from schemas.errors import MmlinksError
from training.fault_hooks import archive_build_reached

CHECKPOINT_ROWS = 1_000_000  # rows between checkpoints: at 10M, ~10 writes of the growing index
CHUNK_IMAGES = 65_536  # images per chunk of shard_source (~0.5 GB of 2048-d float32 features)


@dataclass
class ArchiveChunk:
    """Rows of a source: ``vectors`` [n, D] are the index's vectors, or what the build's
    ``transform`` turns into them (CNN features); ``end``: the source position after them."""

    ids: list[str]
    vectors: np.ndarray
    uris: list[str]
    end: int


Source = Callable[[int], Iterable[ArchiveChunk]]


class _Names:
    """Row -> id over the index's rows and the accepted rows not added yet."""

    def __init__(self, table, pending: list[str]) -> None:
        self.table, self.pending = table, pending

    def __getitem__(self, row: int) -> str:
        n = len(self.table)
        return self.table[row] if row < n else self.pending[row - n]


class _Build:
    def __init__(self, folder: Path | None, settings: dict, transform, progress) -> None:
        self.folder, self.settings, self.transform, self.progress = folder, settings, transform, progress
        self.index: ArchiveIndex | None = None
        self.lookup = IdLookup()
        self.pending: list[str] = []  # accepted ids waiting for the index (training sample)
        self.position = 0
        self.since = 0  # rows added since the last checkpoint
        self.checkpointed: str | None = None
        self.calibration_queries: np.ndarray | None = None

    @property
    def accepted(self) -> int:
        return (self.index.rows if self.index is not None else 0) + len(self.pending)

    def accept(self, chunk: ArchiveChunk) -> tuple[list[str], np.ndarray, list[str]]:
        """The chunk's rows whose id is new (first occurrence), transformed."""
        ids = [str(i) for i in chunk.ids]
        if len(chunk.uris) != len(ids) or len(chunk.vectors) != len(ids):
            sizes = f"{len(ids)} ids, {len(chunk.uris)} uris, {len(chunk.vectors)} vectors"
            raise MmlinksError(f"archive chunk: {sizes}")
        hashes = hash_ids(ids)
        table = self.index.ids if self.index is not None else StringTable()
        known = self.lookup.find(ids, _Names(table, self.pending), hashes=hashes) >= 0
        keep, seen = [], set()
        for j, name in enumerate(ids):
            if not known[j] and name not in seen:
                seen.add(name)
                keep.append(j)
        start = self.accepted
        self.lookup.insert(hashes[keep], np.arange(start, start + len(keep), dtype=np.int64))
        x = chunk.vectors[keep] if len(keep) < len(ids) else chunk.vectors
        if len(keep) and self.transform is not None:
            x = self.transform(x)
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self.index is not None and len(keep) and x.shape[1] != self.index.dim:
            raise MmlinksError(f"archive chunk of {x.shape[1]}-d vectors for a {self.index.dim}-d index")
        return [ids[j] for j in keep], x, [str(chunk.uris[j] or "") for j in keep]

    def add(self, ids: list[str], x: np.ndarray, uris: list[str]) -> None:
        if not ids:
            return
        self.index.append_rows(ids, x, uris)
        if self.folder is not None:  # the names go to their files, not to memory
            append_table(self.folder, "ids", ids)
            append_table(self.folder, "uris", uris)
            self.index.ids = StringTable.open(self.folder, "ids", self.index.rows)
            self.index.uris = StringTable.open(self.folder, "uris", self.index.rows)
            if self.index.exact is not None:
                append_vectors(self.folder, "vectors", x)
                self.index.exact = VectorFile.open(self.folder, "vectors", self.index.dim, self.index.rows)
        self.since += len(ids)
        archive_build_reached("added")

    def checkpoint(self) -> None:
        self.since = 0
        if self.progress:
            self.progress({"rows": self.index.rows, "position": self.position})
        if self.folder is None:
            return
        rows = self.index.rows
        name = f"build-{rows}"
        write_index_files(self.index.kind, self.index.index, self.folder, name)
        state = {"settings": self.settings, "rows": rows, "position": self.position, "index": name}
        state.update(fingerprint=self.index.fingerprint, search=self.index.search_settings)
        write_json_atomic(self.folder / "build.json", state)
        self.checkpointed = name
        _drop_checkpoints(self.folder, keep=name)
        archive_build_reached("checkpoint")

    def resume(self, state: dict) -> None:
        rows = int(state["rows"])
        for table in ("ids", "uris"):
            truncate_table(self.folder, table, rows)
        index = read_index_files(self.settings["kind"], self.folder, state["index"], False)
        exact = None
        if self.settings["kind"] == "ivfpq":
            truncate_vectors(self.folder, "vectors", rows, int(index.d))
            exact = VectorFile.open(self.folder, "vectors", int(index.d), rows)
        if int(index.ntotal) != rows:
            raise MmlinksError(f"archive build in {self.folder}: {state['index']} holds {index.ntotal} rows")
        s = self.settings
        self.index = ArchiveIndex(
            index,
            StringTable.open(self.folder, "ids", rows),
            StringTable.open(self.folder, "uris", rows),
            s["kind"],
            dict(s["info"]),
            fingerprint=state["fingerprint"],
            search_settings=dict(state.get("search") or {}),
            exact=exact,
        )
        self.lookup = IdLookup.of(self.index.ids)
        self.position = int(state["position"])
        self.checkpointed = state["index"]
        _drop_checkpoints(self.folder, keep=state["index"])

    def finish(self) -> ArchiveIndex:
        if self.since or (self.folder is not None and self.checkpointed is None):
            self.checkpoint()
        index = self.index
        index._lookup = self.lookup
        index.build_settings = _public(self.settings)
        if self.settings.get("target_recall") is not None:
            index.calibrate(self.settings["target_recall"], self.calibration_queries)
        if self.folder is not None:
            # Linked, not renamed: until build.json goes, a kill anywhere here leaves the
            # checkpoint that build.json names, so the next run resumes and finishes again.
            kind = index.kind
            for built, final in zip(
                index_files(kind, self.folder, self.checkpointed),
                index_files(kind, self.folder, "index"),
                strict=True,
            ):
                linked = final.with_name(final.name + ".link")
                linked.unlink(missing_ok=True)
                os.link(built, linked)
                os.replace(linked, final)
            self.lookup.save(self.folder)
            save_npy_atomic(self.folder / "deleted.npy", index.deleted)
            write_json_atomic(self.folder / "index.json", index.meta())
            archive_build_reached("finish")
            (self.folder / "build.json").unlink()
            _drop_checkpoints(self.folder, keep="")
        return index


def _drop_checkpoints(folder: Path, keep: str) -> None:
    """Remove every checkpoint's files but ``keep``'s (and half-written ones)."""
    for old in folder.glob("build-*.faiss*"):
        if old.name.split(".", 1)[0] != keep or old.name.endswith(".tmp"):
            old.unlink()


def _public(settings: dict) -> dict:
    """The build settings recorded in index.json (provenance lives in ``info``)."""
    return {k: v for k, v in settings.items() if k != "info"}


BUILD_FILES = ("index.faiss", "index.refine.faiss", "index.json", "build.json", "deleted.npy", "ids.json")
BUILD_FILES += tuple(f"{t}.{s}" for t in ("ids", "uris") for s in ("bin", "offsets"))
BUILD_FILES += ("ids.hash.npy", "ids.hash_rows.npy", "vectors.f32")


def _clear(folder: Path) -> None:
    """Remove what an earlier, unfinished build left before its first checkpoint."""
    for name in BUILD_FILES:
        (folder / name).unlink(missing_ok=True)
    for old in folder.glob("build-*.faiss*"):
        old.unlink()


def build_streamed(
    source: Source,
    kind: str = "ivfpq",
    info: dict | None = None,
    folder: str | Path | None = None,
    transform: Callable[[np.ndarray], np.ndarray] | None = None,
    train_size: int = TRAIN_SIZE,
    expected: int | None = None,
    checkpoint_rows: int = CHECKPOINT_ROWS,
    store: str = IVFPQ_STORE,
    progress: Callable[[dict], None] | None = None,
    replace: bool = False,
    target_recall: float | None = TARGET_RECALL,
    calibration_queries: np.ndarray | None = None,
) -> ArchiveIndex:
    """The archive index of every distinct id of ``source``'s chunks (see the module): trained
    on the first ``train_size`` vectors (ivf, pq, ivfpq), ``expected`` images sizing ivfpq's
    cells (default: the training sample's size). With ``folder``: checkpointed there and
    resumed from there; a folder that already holds the finished index of the same settings
    is loaded, not rebuilt. A folder holding an index or a build of other settings is refused,
    or with ``replace`` cleared and built anew. ``progress(dict)`` hears of each checkpoint.
    An ivfpq index's nprobe and re-rank factor are then calibrated to ``target_recall`` on
    ``calibration_queries`` (``ArchiveIndex.calibrate``; None: no calibration, the defaults).
    A finished folder is returned as it is (its calibration included)."""
    settings = {"kind": kind, "train_size": int(train_size), "expected": expected, "store": store}
    if kind == "ivfpq":  # the only kind calibrated
        settings["target_recall"] = target_recall
    settings = json.loads(json.dumps({**settings, "info": dict(info or {})}))
    b = _Build(None if folder is None else Path(folder), settings, transform, progress)
    b.calibration_queries = calibration_queries
    if b.folder is not None:
        b.folder.mkdir(parents=True, exist_ok=True)
        if (b.folder / "index.json").is_file() and not (b.folder / "build.json").is_file():
            done = ArchiveIndex.load(b.folder)
            if done.build_settings == _public(settings) and done.info == settings["info"]:
                return done
            if not replace:
                raise MmlinksError(f"{b.folder} holds an archive index built with other settings")
            _clear(b.folder)
        state_path = b.folder / "build.json"
        state = json.loads(state_path.read_text()) if state_path.is_file() else None
        if state and state["settings"] != settings and replace:
            _clear(b.folder)
            state = None
        if state and state["settings"] != settings:
            raise MmlinksError(
                f"{b.folder} holds an unfinished archive build with other settings; remove it or rerun it"
            )
        if state:
            b.resume(state)
        else:
            _clear(b.folder)
    chunks: Iterator[ArchiveChunk] = iter(source(b.position))
    if b.index is None:
        _train(b, chunks, kind, info, train_size if kind in TRAINED_KINDS else 1, expected, store)
    for chunk in chunks:
        b.add(*b.accept(chunk))
        b.position = int(chunk.end)
        if b.since >= checkpoint_rows:
            b.checkpoint()
    return b.finish()


def _train(b: _Build, chunks: Iterator[ArchiveChunk], kind, info, train_size, expected, store) -> None:
    """Read chunks until ``train_size`` rows are accepted, train on them, add them, checkpoint."""
    buffer = []
    for chunk in chunks:
        ids, x, uris = b.accept(chunk)
        b.position = int(chunk.end)
        if ids:
            buffer.append((ids, x, uris))
            b.pending += ids
        if len(b.pending) >= train_size:
            break
    if not buffer:
        raise MmlinksError("the archive has no image to index")
    if len({x.shape[1] for _, x, _ in buffer}) > 1:
        raise MmlinksError("archive chunks of vectors of different widths")
    sample = np.concatenate([x for _, x, _ in buffer])[:train_size]
    b.index = ArchiveIndex.empty(kind, sample, info, expected, store)
    del sample
    b.pending = []
    for ids, x, uris in buffer:
        b.add(ids, x, uris)
    b.checkpoint()  # the trained quantizers: a resumed build never trains again


def _images_of(table, dtype: str, path) -> tuple[list[str], list[str], np.ndarray]:
    """(content ids, uris, features [n, D] float32) of a batch's images with features."""
    import pyarrow.compute as pc

    from schemas.feature_bytes import decode_features, feature_values

    try:
        feats, _ = feature_values(table, dtype)
        flat = pc.list_flatten(table.column("images"))
        ids = pc.struct_field(flat, "content_id").to_pylist()
        uris = [u or "" for u in pc.struct_field(flat, "uri").to_pylist()]
        return ids, uris, np.asarray(feats, dtype=np.float32).reshape(len(ids), -1)
    except ValueError:  # an image without features, or of another width: image by image
        ids, uris, feats = [], [], []
        for images in decode_features(table, dtype).column("images").to_pylist():
            for im in images or []:
                if im.get("features"):
                    ids.append(im["content_id"])
                    uris.append(im.get("uri") or "")
                    feats.append(np.asarray(im["features"], dtype=np.float32))
        if len({len(f) for f in feats}) > 1:
            raise MmlinksError(f"shard {path}: image features of different widths") from None
        return ids, uris, np.stack(feats) if feats else np.zeros((0, 0), np.float32)


def shard_source(paths: list, batch_rows: int = 1024, chunk_images: int = CHUNK_IMAGES) -> Source:
    """The images of dataset shards (in the order given), ``batch_rows`` documents read at a
    time, yielded in chunks of about ``chunk_images`` images; positions = documents read, and a
    resumed build skips whole row groups without reading them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from schemas.feature_bytes import shard_feature_dtype
    from schemas.shards import check_shards

    def source(start: int) -> Iterator[ArchiveChunk]:
        pos, parts = 0, []

        def flush() -> ArchiveChunk:
            ids = [i for p in parts for i in p[0]]
            uris = [u for p in parts for u in p[1]]
            widths = {p[2].shape[1] for p in parts if len(p[2])}
            if len(widths) > 1:
                raise MmlinksError("dataset shards with image features of different widths")
            feats = [p[2] for p in parts if len(p[2])]
            feats = np.concatenate(feats) if feats else np.zeros((0, 0), np.float32)
            parts.clear()
            return ArchiveChunk(ids, feats, uris, pos)

        for p in paths:
            check_shards([p])
            try:
                pf = pq.ParquetFile(p)
                dtype = shard_feature_dtype(pf.schema_arrow)
                for g in range(pf.num_row_groups):
                    n = pf.metadata.row_group(g).num_rows
                    if pos + n <= start:
                        pos += n
                        continue
                    for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[g], columns=["images"]):
                        skip = max(0, start - pos)
                        pos += batch.num_rows
                        if skip >= batch.num_rows:
                            continue
                        parts.append(_images_of(pa.Table.from_batches([batch.slice(skip)]), dtype, p))
                        if sum(len(part[0]) for part in parts) >= chunk_images:
                            yield flush()
            except (OSError, pa.ArrowInvalid) as exc:
                raise MmlinksError(f"cannot read shard {p}: {exc}") from exc
        if parts:
            yield flush()

    return source


def embedder(net) -> Callable[[np.ndarray], np.ndarray]:
    """CNN features -> the model's unit image vectors (the build's ``transform``)."""

    def transform(features: np.ndarray) -> np.ndarray:
        if features.shape[1] != net.cfg.image_dim:
            raise MmlinksError(
                f"the model takes {net.cfg.image_dim}-d image features, the archive has {features.shape[1]}-d"
            )
        return embed_images(net, features)

    return transform


def build_archive_index(
    net,
    paths: list,
    kind: str = "flat",
    info: dict | None = None,
    folder: str | Path | None = None,
    expected: int | None = None,
    **kwargs,
) -> ArchiveIndex:
    """The archive index of the images of ``paths`` (dataset shards) under model ``net``,
    streamed (``build_streamed``; ``folder``: checkpointed there, resumable). ``expected``:
    the number of images (default: the shards' document count, read from their footers)."""
    import pyarrow.parquet as pq

    if expected is None and kind == "ivfpq":
        expected = sum(pq.ParquetFile(p).metadata.num_rows for p in paths) or None
    try:
        return build_streamed(
            shard_source(paths), kind, info, folder, transform=embedder(net), expected=expected, **kwargs
        )
    except MmlinksError as exc:
        if str(exc) == "the archive has no image to index":
            raise MmlinksError("the archive has no image with features") from None
        raise


def archive_images(paths: list) -> tuple[list[str], list[str], np.ndarray]:
    """(content ids, uris, CNN features [N, D]) of every distinct image of these shards (the
    first occurrence of a content id wins: a recurring agency photo is one archive image), all
    in memory: small archives and tests (``shard_source`` streams them)."""
    from schemas.shards import read_table

    table = read_table(paths, columns=["doc_id", "images"]).sort_by("doc_id")
    ids, uris, feats, seen = [], [], [], set()
    for images in table.column("images").to_pylist():
        for im in images:
            if im["content_id"] in seen or not im.get("features"):
                continue
            seen.add(im["content_id"])
            ids.append(im["content_id"])
            uris.append(im.get("uri") or "")
            feats.append(np.asarray(im["features"], dtype=np.float32))
    return ids, uris, (np.stack(feats) if feats else np.zeros((0, 0), np.float32))


def embed_images(net, features: np.ndarray, batch: int = 4096) -> np.ndarray:
    """[N, D] CNN features -> [N, d] unit vectors through the news model's image tower."""
    import torch

    net.eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(features), batch):
            out.append(net.image(torch.as_tensor(features[i : i + batch])).float().numpy())
    return np.concatenate(out) if out else np.zeros((0, net.cfg.d), np.float32)
