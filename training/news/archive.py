"""The news image archive index (issues #18, #38): every archive image embedded by a news
model's image tower, searchable by an article's fused text vector.

FAISS does the search (a library, not hand-written code); the kinds (``flat``, ``hnsw``,
``ivf``, ``pq`` and, for tens of millions of images, ``ivfpq``) are described and made in
``training/news/archive_faiss.py``. Archive images are named by their ``content_id`` (the
SHA-256 of the image bytes the build stores), so an agency photo that recurs across articles
is one archive entry. Ties are broken by FAISS (lower position first for the flat index).

An index grows and shrinks without a rebuild: ``add`` appends images (refusing ids already
live), ``delete`` withdraws them (tombstones: the rows stay in FAISS, every search skips them;
``len`` counts live images). Each add or delete batch bumps ``version`` and chains the
``fingerprint`` (a hash over the build and every change), both in ``index.json`` next to the
model's provenance (``info``), so a served model or the Dagster asset names the exact archive.

The folder holds ``index.faiss`` (ivfpq: its re-rank store apart, ``index.refine.faiss``, and
its float32 vectors, ``vectors.f32``); ``index.json`` (kind, dimension, rows, live size,
version, fingerprint, search settings and their calibration, provenance); the names as
memory-mappable string tables (``ids.bin`` / ``ids.offsets``, ``uris.bin`` / ``uris.offsets``:
``archive_store``, with the id look-up's hash column ``ids.hash.npy`` / ``ids.hash_rows.npy``);
``deleted.npy`` (the withdrawn rows). Folders written before issue #38 (``ids.json``) still
load. ``load(mmap=True)`` maps the re-rank store from its file, so that serving workers share it.

The streamed build (``build_streamed``) makes an index of any size in bounded memory, from
chunks of (ids, vectors, uris), checkpointed and resumable: ``training/news/archive_build.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from schemas.errors import MmlinksError
from training.news.archive_faiss import (
    HNSW_EF_SEARCH,
    IVFPQ_STORE,
    KINDS,
    PQ_MAX_REFINE_FACTOR,
    PQ_REFINE_FACTOR,
    Params,
    back_with_huge_pages,
    check_search,
    code_buffers,
    default_search,
    hold_resident,
    ivf_cells,
    ivf_nprobe,
    ivfpq_cells,
    new_index,
    pq_subquantizers,
    read_index_files,
    selector_supported,
    train,
    write_index_files,
)
from training.news.archive_store import (
    IdLookup,
    StringTable,
    VectorFile,
    chained,
    hash_ids,
    save_npy_atomic,
    write_json_atomic,
)

__all__ = [
    "KINDS",
    "PQ_REFINE_FACTOR",
    "ArchiveIndex",
    "back_with_huge_pages",
    "ivf_cells",
    "ivf_nprobe",
    "pq_subquantizers",
]

FORMAT = 2  # 1: ids.json (issue #18); 2: string tables, tombstones, version, fingerprint
# index.json keys that are the index's own state, not provenance (``info``)
STATE_KEYS = ("kind", "dim", "size", "rows", "deleted", "version", "fingerprint", "search")
STATE_KEYS += ("refine_factor", "format", "build", "calibration")
# ivfpq's nprobe and re-rank factor are measured at build time (``calibrate``): the cheapest
# whose recall@10 against exact search reaches this on the calibration queries. One fixed
# setting cannot serve both ends: random vectors need every cell probed for 0.95 at 1M, a
# trained model's embeddings ~3 % of them (docs/benchmarks.md, issue #38)
TARGET_RECALL = 0.97
CALIBRATION_QUERIES = 200
CALIBRATION_NOISE = 0.5  # query = vector + noise * N(0, I/d): a near neighbour, not the vector
# re-rank factors tried: at 1M a trained model's clustered embeddings need 300 for 0.97 on
# noisy queries, random vectors 50-100 (docs/benchmarks.md, issue #38)
CALIBRATION_FACTORS = (100, 300, 1000)


def _faiss():
    import faiss

    return faiss


def start_fingerprint(kind: str, d: int, settings: dict | None = None) -> str:
    """The fingerprint of an empty index of ``kind``: a hash over what the build was asked."""
    return chained("", json.dumps({"kind": kind, "dim": d, **(settings or {})}, sort_keys=True), [])


@dataclass(eq=False)
class ArchiveIndex:
    """``ids[i]`` / ``uris[i]`` name row i of ``index`` (a FAISS index of d-dim unit vectors);
    ``deleted`` holds the withdrawn rows (sorted), which no search returns."""

    index: object
    ids: StringTable | list
    uris: StringTable | list
    kind: str = "flat"
    info: dict = field(default_factory=dict)  # provenance: model URI / version, dataset version
    deleted: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    version: int = 1
    fingerprint: str = ""
    search_settings: dict = field(default_factory=dict)  # ivfpq: nprobe, k_factor
    mmapped: bool = False  # loaded with mmap=True: searchable, not extendable
    build_settings: dict = field(default_factory=dict)
    exact: VectorFile | None = None  # ivfpq: the float32 vectors of its final re-rank
    calibration: dict = field(default_factory=dict)  # ivfpq: how its nprobe was chosen
    resident: dict = field(default_factory=dict)  # bytes hold_resident read in and keeps

    def __post_init__(self) -> None:
        if not isinstance(self.ids, StringTable):
            self.ids = StringTable(self.ids)
        if not isinstance(self.uris, StringTable):
            self.uris = StringTable(self.uris)
        if self.kind == "ivfpq":
            self.search_settings = {**default_search(self.kind, self.index), **self.search_settings}
        self._lookup: IdLookup | None = None
        self._params: Params | None = None

    # -- making one ------------------------------------------------------------------------

    @classmethod
    def empty(
        cls,
        kind: str,
        train_vectors: np.ndarray,
        info: dict | None = None,
        expected: int | None = None,
        store: str = IVFPQ_STORE,
    ) -> ArchiveIndex:
        """An index of ``kind`` trained on ``train_vectors`` [n, d] (ivf, pq, ivfpq; the
        others only take their dimension), holding nothing yet. ``expected``: the number of
        images it will hold (ivfpq sizes its cells by it; default: the training sample's)."""
        if kind not in KINDS:
            raise MmlinksError(f"unknown archive index kind {kind!r}; known: {', '.join(KINDS)}")
        x = np.ascontiguousarray(train_vectors, dtype=np.float32)
        if x.ndim != 2:
            raise MmlinksError(f"archive index: training vectors of shape {x.shape}, want [n, d]")
        d, n = x.shape[1], len(x)
        if kind == "ivf":
            cells = ivf_cells(n)
        else:
            cells = ivfpq_cells(expected or n, max(n, 1)) if kind == "ivfpq" else 1
        index = new_index(kind, d, cells, store)
        train(kind, index, x)
        if kind == "ivf":
            index.nprobe = ivf_nprobe(cells)
        settings = {"cells": cells, "store": store} if kind == "ivfpq" else {}
        if kind in ("ivf", "pq", "ivfpq"):  # which rows trained the quantizers changes every code
            settings["trained_on"] = n
        fingerprint = start_fingerprint(kind, d, settings)
        exact = VectorFile(d) if kind == "ivfpq" else None
        return cls(index, [], [], kind, dict(info or {}), fingerprint=fingerprint, exact=exact)

    @classmethod
    def build(
        cls,
        ids: list[str],
        vectors: np.ndarray,
        uris: list[str] | None = None,
        kind: str = "flat",
        info: dict | None = None,
        store: str = IVFPQ_STORE,
    ) -> ArchiveIndex:
        """vectors [N, d] (unit length: inner product = cosine) named by ``ids``, in memory;
        trained (ivf, pq, ivfpq) on all of them. Millions of images: ``build_streamed``."""
        if kind not in KINDS:
            raise MmlinksError(f"unknown archive index kind {kind!r}; known: {', '.join(KINDS)}")
        x = np.ascontiguousarray(vectors, dtype=np.float32)
        if x.ndim != 2 or len(x) != len(ids):
            raise MmlinksError(f"archive index: {len(ids)} ids for vectors of shape {x.shape}")
        if len(set(ids)) != len(ids):
            raise MmlinksError("archive index: image ids must be unique")
        out = cls.empty(kind, x, info, store=store)
        uris = list(uris) if uris is not None else [""] * len(ids)
        if len(x):
            out.append_rows([str(i) for i in ids], x, uris)
        out.calibrate()
        return out

    def append_rows(self, ids: list[str], x: np.ndarray, uris: list[str]) -> None:
        """Append rows (checked by the caller) and chain them into the fingerprint."""
        if self.mmapped:
            raise MmlinksError("archive index loaded memory-mapped (read-only): load it with mmap=False")
        self.index.add(x)
        self._params = None
        if self.exact is not None:
            self.exact.extend(x)
        self.ids.extend(ids)
        self.uris.extend(uris)
        if self._lookup is not None:
            self._lookup.insert(hash_ids(ids), np.arange(self.rows - len(ids), self.rows, dtype=np.int64))
        self.fingerprint = chained(self.fingerprint, "rows", ids, x)

    # -- changing one ----------------------------------------------------------------------

    def lookup(self) -> IdLookup:
        """The id -> row look-up (built on first use: 10M ids hash in ~10 s)."""
        if self._lookup is None:
            self._lookup = IdLookup.of(self.ids)
        return self._lookup

    def is_live(self, row: int) -> bool:
        i = np.searchsorted(self.deleted, row)
        return not (i < len(self.deleted) and self.deleted[i] == row)

    def rows_of(self, ids: list[str]) -> np.ndarray:
        """The live row of each id (-1: not in the archive, or withdrawn)."""
        return self.lookup().find([str(i) for i in ids], self.ids, self.is_live)

    def add(self, ids: list[str], vectors: np.ndarray, uris: list[str] | None = None) -> None:
        """Append images without a rebuild (an ivf / pq / ivfpq index encodes them with what
        it was trained on). Refuses ids already live, or given twice; a withdrawn id may come
        back (as a new row). One batch: version + 1."""
        ids = [str(i) for i in ids]
        x = np.ascontiguousarray(vectors, dtype=np.float32)
        if x.ndim != 2 or len(x) != len(ids) or (len(x) and x.shape[1] != self.dim):
            raise MmlinksError(f"archive add: {len(ids)} ids, vectors {x.shape}, a {self.dim}-d index")
        if len(set(ids)) != len(ids):
            raise MmlinksError("archive add: an id is given twice")
        uris = [str(u) for u in uris] if uris is not None else [""] * len(ids)
        if len(uris) != len(ids):
            raise MmlinksError(f"archive add: {len(uris)} uris for {len(ids)} ids")
        live = [i for i, r in zip(ids, self.rows_of(ids), strict=True) if r >= 0]
        if live:
            raise MmlinksError(f"archive add: {len(live)} ids already in the archive (e.g. {live[0]!r})")
        if not ids:
            return
        self.append_rows(ids, x, uris)
        self.version += 1
        self.fingerprint = chained(self.fingerprint, "add", [])

    def delete(self, ids: list[str]) -> None:
        """Withdraw images: no search returns them from now on (their rows stay in FAISS, as
        tombstones). Refuses ids not live in the archive. One batch: version + 1."""
        ids = [str(i) for i in ids]
        if len(set(ids)) != len(ids):
            raise MmlinksError("archive delete: an id is given twice")
        rows = self.rows_of(ids)
        missing = [i for i, r in zip(ids, rows, strict=True) if r < 0]
        if missing:
            raise MmlinksError(f"archive delete: {len(missing)} ids not in the archive (e.g. {missing[0]!r})")
        if not ids:
            return
        self.deleted = np.union1d(self.deleted, rows).astype(np.int64)
        self._params = None
        self.version += 1
        self.fingerprint = chained(self.fingerprint, "delete", ids)

    # -- search settings -------------------------------------------------------------------

    @property
    def refine_factor(self) -> int | None:
        """Candidates re-ranked per hit asked for (``pq``, ``ivfpq``); None for the others."""
        if self.kind == "ivfpq":
            return int(self.search_settings["k_factor"])
        return int(self.index.k_factor) if self.kind == "pq" else None

    @property
    def nprobe(self) -> int | None:
        """IVF cells a query scans (``ivf``, ``ivfpq``)."""
        if self.kind == "ivfpq":
            return int(self.search_settings["nprobe"])
        return int(self.index.nprobe) if self.kind == "ivf" else None

    def set_refine_factor(self, factor: int) -> None:
        """Re-rank ``factor x k`` candidates a query; saved with the index, so a served model
        keeps the factor its archive's recall was measured at (``pq``: 1..1000,
        ``PQ_REFINE_FACTOR`` unless set; ``ivfpq``: ``set_search``)."""
        if self.kind == "ivfpq":
            return self.set_search(k_factor=factor)
        if self.kind != "pq":
            raise MmlinksError(f"a {self.kind} archive index has no re-rank factor (pq, ivfpq only)")
        if isinstance(factor, bool) or not isinstance(factor, int) or not 1 <= factor <= PQ_MAX_REFINE_FACTOR:
            raise MmlinksError(
                f"re-rank factor must be an integer in 1..{PQ_MAX_REFINE_FACTOR}, got {factor!r}"
            )
        self.index.k_factor = factor

    def set_search(
        self, nprobe: int | None = None, k_factor: int | None = None, exact_factor: int | None = None
    ) -> None:
        """An ivfpq index's search settings, saved with it: ``nprobe`` cells scanned (1..cells),
        ``k x k_factor`` candidates re-ranked on the 8-bit store, of which the best ``k x
        exact_factor`` are re-ranked on the float32 vectors (0: none; the scores are then the
        8-bit store's)."""
        check_search(self.kind, self.index, nprobe, k_factor, exact_factor)
        for key, value in (("nprobe", nprobe), ("k_factor", k_factor), ("exact_factor", exact_factor)):
            if value is not None:
                self.search_settings[key] = value
        self._params = None

    # -- reading one -----------------------------------------------------------------------

    @property
    def dim(self) -> int:
        return int(self.index.d)

    @property
    def rows(self) -> int:
        """Rows in FAISS, withdrawn ones included."""
        return int(self.index.ntotal)

    def __len__(self) -> int:
        return self.rows - len(self.deleted)

    @property
    def search_fingerprint(self) -> str:
        """``fingerprint`` with the search settings chained in (nprobe, re-rank factors, as
        calibrated or set): two indexes with the same one return the same hits. The fingerprint
        alone names the contents; a re-calibration changes only this one."""
        return chained(self.fingerprint, "search " + json.dumps(self.search_settings, sort_keys=True), [])

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """queries [Q, d] -> (scores [Q, k'], ids per query), best first, k' = min(k, size)."""
        scores, rows = self.search_rows(queries, k)
        return scores, [[self.ids[r] for r in row] for row in rows]

    def search_rows(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[int]]]:
        """queries [Q, d] -> (scores [Q, k'], row numbers per query): ``ids[r]`` / ``uris[r]``
        name a hit (no per-call id -> uri map: building one took 0.55 s of CPU at 1M images).
        Withdrawn rows are never returned. ivfpq scores are inner products with the 8-bit
        re-rank store's vectors (within ~1e-3 of the exact cosines)."""
        q = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        if q.shape[1] != self.dim:
            raise MmlinksError(f"archive index: {q.shape[1]}-d queries for a {self.dim}-d index")
        k = min(int(k), len(self))
        if k <= 0:
            return np.zeros((len(q), 0), np.float32), [[] for _ in q]
        if len(self.deleted) and not selector_supported(self.kind):
            return self._search_filtered(q, k)
        shared = self._params  # one read: a concurrent delete or set_search may reset it
        if shared is None:
            shared = self._params = Params(
                self.kind, self.index, self.search_settings, self.deleted, self.rows
            )
        if self.kind == "ivfpq":
            return self._search_ivfpq(q, k, shared)
        params = shared.value
        scores, rows = self.index.search(q, k) if params is None else self.index.search(q, k, params=params)
        # HNSW and IVF may return fewer than k hits (-1 rows: a tiny graph, too few probed
        # cells, a selector): drop them
        return scores, [[int(r) for r in row if r >= 0] for row in rows]

    def _search_ivfpq(self, q: np.ndarray, k: int, params) -> tuple[np.ndarray, list[list[int]]]:
        """``k x k_factor`` candidates from the probed cells' codes, re-ranked on the 8-bit
        store; its best ``k x exact_factor`` re-ranked on the float32 vectors (read from disk).
        On random vectors the 8-bit store alone tops out at recall@10 ~0.975 at 1M (its
        rounding reorders near-equal scores), the exact stage at ~1.0 (docs/benchmarks.md,
        issue #38); its scores are exact cosines, as the other kinds'."""
        s = self.search_settings
        ef = int(s.get("exact_factor", 0)) if self.exact is not None else 0
        k2 = max(k, min(len(self), k * ef)) if ef else k
        refine = params.refine(max(1.0, float(s["k_factor"]) * k / k2))  # k x k_factor candidates in all
        scores, rows = self.index.search(q, k2, params=refine)
        if not ef:
            return scores[:, :k], [[int(r) for r in row if r >= 0] for row in rows]
        out_s, out_r = np.full((len(q), k), -np.inf, np.float32), []
        for i in range(len(q)):
            cand = rows[i][rows[i] >= 0]
            exact = self.exact.take(cand) @ q[i]
            best = np.argsort(-exact, kind="stable")[:k]
            out_s[i, : len(best)] = exact[best]
            out_r.append([int(r) for r in cand[best]])
        return out_s, out_r

    def hold_resident(self) -> dict:
        """A memory-mapped index (``load(mmap=True)``, as served): read what every query touches
        at random into memory now and keep it there (``archive_faiss.hold_resident``: mlock, else
        populate): the mapped re-rank store and the name tables. A query of a just-loaded (or
        long idle) server otherwise pays a disk read for each page it touches first: the first
        200 served articles at 1M, FAISS search p50 / p99 3.9 / 22 ms instead of 0.4 / 0.5
        (docs/benchmarks.md, issue #38). ``vectors.f32`` stays on disk, read per query (its
        page cache is the machine's, not this process's). Bytes held, and how."""
        if not self.mmapped:
            return {}
        ranges = code_buffers(self.index, mapped_only=True)
        self.resident = hold_resident(ranges + self.ids.mapped_ranges() + self.uris.mapped_ranges())
        return self.resident

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        """The stored vectors of ``rows`` (ivfpq: its float32 copy; else FAISS's own, all of
        them reconstructed: an ORDER model's exact scan reads them all anyway)."""
        if self.exact is not None:
            return self.exact.take(rows)
        return self.index.reconstruct_n(0, self.rows)[np.asarray(rows, np.int64)]

    def _search_filtered(self, q: np.ndarray, k: int) -> tuple[np.ndarray, list[list[int]]]:
        """A kind without a selector (``pq``): the best ``k + deleted`` rows, the live first k."""
        scores, rows = self.index.search(q, min(self.rows, k + len(self.deleted)))
        dead = np.isin(rows, self.deleted)
        out_s, out_r = np.zeros((len(q), k), np.float32), []
        for i in range(len(q)):
            keep = np.flatnonzero(~dead[i] & (rows[i] >= 0))[:k]
            out_s[i, : len(keep)] = scores[i, keep]
            out_r.append([int(r) for r in rows[i, keep]])
        return out_s, out_r

    def exact_search_rows(self, queries: np.ndarray, k: int) -> list[list[int]]:
        """The exact top k live rows of each query by inner product: one pass over the stored
        vectors (ivfpq: its float32 file, a block at a time) keeping a running top k."""
        q = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        k = min(int(k), len(self))
        blocks = self.exact.blocks() if self.exact is not None else [(0, self.vectors(np.arange(self.rows)))]
        best_s = np.full((len(q), k), -np.inf, np.float32)
        best_r = np.full((len(q), k), -1, np.int64)
        for start, v in blocks:
            s = q @ v.T
            dead = self.deleted[(self.deleted >= start) & (self.deleted < start + len(v))] - start
            s[:, dead] = -np.inf
            top = np.argpartition(-s, k - 1, axis=1)[:, :k] if s.shape[1] > k else np.argsort(-s, axis=1)
            all_s = np.concatenate([best_s, np.take_along_axis(s, top, 1)], 1)
            all_r = np.concatenate([best_r, top + start], 1)
            keep = np.argsort(-all_s, axis=1, kind="stable")[:, :k]
            best_s, best_r = np.take_along_axis(all_s, keep, 1), np.take_along_axis(all_r, keep, 1)
        return best_r.tolist()

    def calibrate(
        self,
        target: float = TARGET_RECALL,
        queries: np.ndarray | None = None,
        count: int = CALIBRATION_QUERIES,
        seed: int = 0,
    ) -> dict:
        """Choose an ivfpq index's nprobe and re-rank factor by measurement: for each factor of
        ``CALIBRATION_FACTORS`` (ascending), the fewest cells (1, 2, 4, ... or all) whose
        recall@10 against ``exact_search_rows`` reaches ``target``; the first factor that gets
        there wins (else the best recall seen). ``queries``: the vectors the served model will
        search with (a news archive: its articles' text vectors, ``build_model_archive``);
        default ``count`` of its own vectors plus noise (seeded). A factor stops climbing the
        probes once two doublings gained under 0.002 (the re-rank, not the cells, limits it).
        What it measured is saved in index.json."""
        if self.kind != "ivfpq" or not len(self):
            return {}
        rng = np.random.default_rng(seed)
        source = "given"
        if queries is None or not len(queries):
            rows = np.sort(rng.choice(self.live_rows(), size=min(count, len(self)), replace=False))
            noise = rng.standard_normal((len(rows), self.dim)).astype(np.float32) / np.sqrt(self.dim)
            queries, source = self.vectors(rows) + CALIBRATION_NOISE * noise, "noisy database vectors"
        q = np.ascontiguousarray(queries, dtype=np.float32)
        q /= np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
        k = min(10, len(self))
        truth = self.exact_search_rows(q, k)
        cells = int(_faiss().downcast_index(self.index.base_index).nlist)
        ladder = sorted({min(cells, 1 << i) for i in range(cells.bit_length() + 1)})
        measured, best = {}, None
        for factor in CALIBRATION_FACTORS:
            gains = []
            for nprobe in ladder:
                self.set_search(nprobe=nprobe, k_factor=factor)
                got = self.search_rows(q, k)[1]
                r = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(got, truth, strict=True)]))
                measured[f"nprobe={nprobe} k_factor={factor}"] = round(r, 4)
                if best is None or r > best[0] + 1e-9:
                    best = (r, nprobe, factor)
                gains.append(r)
                if r >= target or (len(gains) >= 3 and gains[-1] - gains[-3] < 0.002):
                    break
            if best[0] >= target:
                break
        self.set_search(nprobe=best[1], k_factor=best[2])
        self.calibration = {"target": target, "queries": len(q), "query_source": source, "seed": seed}
        self.calibration.update(recall=round(best[0], 4), measured=measured)
        return self.calibration

    def live_rows(self) -> np.ndarray:
        """Every live row, ascending."""
        return np.setdiff1d(np.arange(self.rows, dtype=np.int64), self.deleted, assume_unique=True)

    # -- its folder ------------------------------------------------------------------------

    def meta(self) -> dict:
        meta = {"kind": self.kind, "dim": self.dim, "size": len(self), "rows": self.rows}
        meta.update(deleted=len(self.deleted), version=self.version, fingerprint=self.fingerprint)
        meta["format"] = FORMAT
        if self.kind == "pq":
            meta["refine_factor"] = self.refine_factor
        if self.search_settings:
            meta["search"] = dict(self.search_settings)
        if self.build_settings:
            meta["build"] = dict(self.build_settings)
        if self.calibration:
            meta["calibration"] = dict(self.calibration)
        return {**meta, **self.info}

    def save(self, folder: str | Path) -> Path:
        """Write the folder (every file through a rename; ``index.json`` removed first and
        written last, so a folder with an ``index.json`` is complete, also when saved over)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "index.json").unlink(missing_ok=True)
        write_index_files(self.kind, self.index, folder, "index")
        self.ids.write(folder, "ids")
        self.uris.write(folder, "uris")
        if self.exact is not None:
            self.exact.write(folder, "vectors")
        self.lookup().save(folder)
        save_npy_atomic(folder / "deleted.npy", self.deleted)
        (folder / "ids.json").unlink(missing_ok=True)  # a folder of issue #18, saved over
        write_json_atomic(folder / "index.json", self.meta())
        return folder

    @classmethod
    def load(cls, folder: str | Path, huge_pages: bool = False, mmap: bool = False) -> ArchiveIndex:
        """``mmap``: map the index's big arrays from ``index.faiss`` (``archive_faiss.read_index``)
        and the names from their tables, so that several serving processes share one copy in
        the page cache; such an index cannot ``add``. ``huge_pages``: back the index's vectors
        and codes with 2 MB pages (``back_with_huge_pages``; not for a mapped index)."""
        folder = Path(folder)
        if not (folder / "index.faiss").is_file() or not (folder / "index.json").is_file():
            unfinished = (folder / "build.json").is_file()
            why = "an unfinished build: run it again to resume" if unfinished else "index.faiss missing"
            raise MmlinksError(f"no archive index in {folder} ({why})")
        meta = json.loads((folder / "index.json").read_text())
        kind = meta.get("kind", "flat")
        index = read_index_files(kind, folder, "index", mmap)
        state = {key: meta.pop(key) for key in STATE_KEYS if key in meta}
        if (folder / "ids.json").is_file():  # issue #18's folders
            names = json.loads((folder / "ids.json").read_text())
            ids, uris = names["ids"], names["uris"]
        else:
            ids = StringTable.open(folder, "ids", int(index.ntotal))
            uris = StringTable.open(folder, "uris", int(index.ntotal))
        deleted = np.load(folder / "deleted.npy") if (folder / "deleted.npy").is_file() else None
        _check_folder(folder, kind, index, state, deleted)
        exact = None
        if kind == "ivfpq" and (folder / "vectors.f32").is_file():
            exact = VectorFile.open(folder, "vectors", int(index.d), int(index.ntotal))
        elif kind == "ivfpq" and int(state.get("search", {}).get("exact_factor", 0)):
            raise MmlinksError(
                f"archive index {folder}: vectors.f32 is missing (its search re-ranks on it; copy the "
                "whole folder)"
            )
        if kind == "hnsw":
            index.hnsw.efSearch = HNSW_EF_SEARCH
        elif kind == "ivf":
            index.nprobe = ivf_nprobe(int(index.nlist))
        elif kind == "pq":  # indexes saved before the factor was saved: the old default
            index.k_factor = int(state.get("refine_factor", PQ_REFINE_FACTOR))
        out = cls(
            index,
            ids,
            uris,
            kind,
            meta,
            deleted=np.zeros(0, np.int64) if deleted is None else deleted.astype(np.int64),
            version=int(state.get("version", 1)),
            fingerprint=str(state.get("fingerprint", "")),
            search_settings=dict(state.get("search", {})),
            mmapped=mmap,
            build_settings=dict(state.get("build", {})),
            exact=exact,
            calibration=dict(state.get("calibration", {})),
        )
        if not isinstance(ids, list):
            out._lookup = IdLookup.load(folder, out.rows)  # None (built on first use) if stale
        if huge_pages and not mmap:
            back_with_huge_pages(index)
        return out


def _check_folder(folder: Path, kind: str, index, state: dict, deleted: np.ndarray | None) -> None:
    """Refuse a folder whose files do not belong together (a save or copy cut short): the rows
    index.json counts, the IVF codes' and the re-rank store's rows, the withdrawn rows."""
    rows = int(index.ntotal)
    problems = []
    if "rows" in state and int(state["rows"]) != rows:
        problems.append(f"index.json counts {state['rows']} rows, index.faiss holds {rows}")
    base, store = (
        (int(index.base_index.ntotal), int(index.refine_index.ntotal)) if kind == "ivfpq" else (0, 0)
    )
    if base != store:
        problems.append(f"index.faiss holds {base} rows, index.refine.faiss {store}")
    if deleted is not None and len(deleted):
        if "deleted" in state and int(state["deleted"]) != len(deleted):
            problems.append(
                f"index.json counts {state['deleted']} withdrawn rows, deleted.npy {len(deleted)}"
            )
        if int(np.max(deleted)) >= rows:
            problems.append("deleted.npy names rows past the end")
    if problems:
        raise MmlinksError(
            f"archive index {folder} is inconsistent: {'; '.join(problems)} (rebuild or re-copy it)"
        )


def archive_images(paths: list) -> tuple[list[str], list[str], np.ndarray]:
    """(content ids, uris, CNN features [N, D]) of every distinct image of these shards (the
    first occurrence of a content id wins: a recurring agency photo is one archive image), all
    in memory: small archives and tests (``archive_build.shard_source`` streams them)."""
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
