"""The news image archive index (issues #18, #38): every archive image embedded by a news
model's image tower, searchable by an article's fused text vector (FAISS; the kinds:
``archive/faiss_kinds.py``).

Images are named by their ``content_id``, so an agency photo recurring across articles is one
entry. Why tombstones and a chained ``fingerprint``: an index grows (``add``) and shrinks
(``delete``) without a rebuild, and each change bumps ``version`` so a served model or the
Dagster asset names the exact archive. The folder: ``index.faiss`` (ivfpq: also
``index.refine.faiss``, ``vectors.f32``), ``index.json`` (state, settings, provenance), the name
tables (``archive.store``) and ``deleted.npy``; read back by ``archive/folder.py``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from archive.calibration import CALIBRATION_QUERIES, TARGET_RECALL, calibrate
from archive.faiss_kinds import (
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
    selector_supported,
    train,
    write_index_files,
)
from archive.folder import FORMAT, read_folder
from archive.store import (
    IdLookup,
    StringTable,
    VectorFile,
    chained,
    hash_ids,
    save_npy_atomic,
    write_json_atomic,
)
from schemas.errors import MmlinksError

__all__ = [
    "KINDS",
    "PQ_REFINE_FACTOR",
    "ArchiveIndex",
    "back_with_huge_pages",
    "ivf_cells",
    "ivf_nprobe",
    "pq_subquantizers",
]


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
        """A memory-mapped index (``load(mmap=True)``, as served): read what every query touches at
        random into memory now and keep it there (``archive.faiss_kinds.hold_resident``, which says why):
        the mapped re-rank store and the name tables. ``vectors.f32`` stays on disk, read per query (its
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
        """Choose an ivfpq index's nprobe and re-rank factor by measurement on ``queries``
        (default: ``count`` of its own vectors plus noise): ``archive.calibration.calibrate``.
        What it measured, also saved in index.json."""
        return calibrate(self, target, queries, count, seed)

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
        """``mmap``: map the index's big arrays from ``index.faiss`` (``archive.faiss_kinds.read_index``)
        and the names from their tables, so that several serving processes share one copy in
        the page cache; such an index cannot ``add``. ``huge_pages``: back the index's vectors
        and codes with 2 MB pages (``back_with_huge_pages``; not for a mapped index). The folder
        is read and checked by ``archive.folder.read_folder``."""
        folder = Path(folder)
        args, legacy = read_folder(folder, mmap)
        out = cls(**args)
        if not legacy:
            out._lookup = IdLookup.load(folder, out.rows)  # None (built on first use) if stale
        if huge_pages and not mmap:
            back_with_huge_pages(out.index)
        return out
