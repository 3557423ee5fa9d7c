"""The news image archive index (issue #18): every archive image embedded by a news model's
image tower, searchable by an article's fused text vector.

FAISS does the search (a library, not hand-written code): ``flat`` is ``IndexFlatIP``, the
exact inner-product search (the vectors are unit length, so it ranks by cosine) used for tests
and archives up to a few hundred thousand images; ``hnsw`` is ``IndexHNSWFlat`` with the inner
product metric, the approximate graph index for millions of images; ``ivf`` is ``IndexIVFFlat``
(k-means cells, ``sqrt(N)`` of them, of which a query scans the ``nprobe`` nearest), which builds
in a minute where HNSW takes tens over 1M vectors on two cores (recall against exact search and
latency of both are measured by ``benchmarks/news_archive_index.py``); ``pq`` is
``IndexRefineFlat`` over ``IndexPQFastScan``: every vector's 4-bit product-quantisation code is
scanned (SIMD lookup tables, 32 bytes a 256-d vector, no graph or cells to miss a neighbour
in), and the best ``k x PQ_REFINE_FACTOR`` candidates are re-ranked by their exact inner
product, so its scores are exact cosines. On random vectors, whose neighbours do not cluster,
HNSW and IVF need to visit most of the archive for recall 0.95; a scan of compact codes does
that cheaply. Ties are broken by FAISS (lower position first for the flat index).

Archive images are named by their ``content_id`` (the SHA-256 of the image bytes the build
stores), so an agency photo that recurs across articles is one archive entry. The index folder
holds ``index.faiss``, ``ids.json`` (content id and uri per row) and ``index.json`` (kind,
dimension, size and the model it was built from: the index is versioned next to that model).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from schemas.errors import MmlinksError

KINDS = ("flat", "hnsw", "ivf", "pq")
HNSW_M = 32  # graph neighbours per node (FAISS's usual 32)
# search breadth: 128 gave recall@10 0.88 on 20k random 256-d vectors, 512 gave 0.99; on 100k, 512
# gives 0.80 and 2048 0.98 (slower than exact search there; docs/benchmarks.md)
HNSW_EF_SEARCH = 512
HNSW_EF_CONSTRUCTION = 80
# the share of IVF cells a query scans (nprobe = ceil(share * cells)); see docs/benchmarks.md
IVF_PROBE_SHARE = 0.1
PQ_BITS = 4  # FastScan's code size per sub-vector (16 centroids each)
PQ_DIMS_PER_CODE = 4  # 256-d vectors: 64 sub-quantizers, 32 bytes a vector
# candidates re-ranked exactly per hit asked for (FAISS reads at most 1000): recall 0.98 at 1M
PQ_REFINE_FACTOR = 1000
PQ_MIN_TRAIN = 1 << PQ_BITS  # k-means needs at least one vector per centroid
PQ_MAX_REFINE_FACTOR = 1000  # FAISS refuses to read back an IndexRefine saved with more


def pq_subquantizers(d: int) -> int:
    """The number of PQ sub-vectors for d dims: the largest divisor of d up to d / 4."""
    return max(m for m in range(1, max(1, d // PQ_DIMS_PER_CODE) + 1) if d % m == 0)


def ivf_cells(n: int) -> int:
    """k-means cells for n vectors: sqrt(n) (FAISS's guideline is 4..16 sqrt(n); fewer cells
    keep the k-means training cheap), at least 1."""
    return max(1, int(np.sqrt(n)))


def ivf_nprobe(cells: int) -> int:
    return max(1, min(cells, int(np.ceil(IVF_PROBE_SHARE * cells))))


def _faiss():
    import faiss

    return faiss


@dataclass
class ArchiveIndex:
    """``ids[i]`` / ``uris[i]`` name row i of ``index`` (a FAISS index of d-dim unit vectors)."""

    index: object
    ids: list[str]
    uris: list[str]
    kind: str = "flat"
    info: dict = field(default_factory=dict)  # provenance: model URI / version, dataset version

    @classmethod
    def build(
        cls,
        ids: list[str],
        vectors: np.ndarray,
        uris: list[str] | None = None,
        kind: str = "flat",
        info: dict | None = None,
    ) -> ArchiveIndex:
        """vectors [N, d] (unit length: inner product = cosine) named by ``ids``."""
        if kind not in KINDS:
            raise MmlinksError(f"unknown archive index kind {kind!r}; known: {', '.join(KINDS)}")
        x = np.ascontiguousarray(vectors, dtype=np.float32)
        if x.ndim != 2 or len(x) != len(ids):
            raise MmlinksError(f"archive index: {len(ids)} ids for vectors of shape {x.shape}")
        if len(set(ids)) != len(ids):
            raise MmlinksError("archive index: image ids must be unique")
        faiss = _faiss()
        d = x.shape[1]
        if kind == "flat":
            index = faiss.IndexFlatIP(d)
        elif kind == "hnsw":
            index = faiss.IndexHNSWFlat(d, HNSW_M, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
            index.hnsw.efSearch = HNSW_EF_SEARCH
        elif kind == "pq":
            if len(x) < PQ_MIN_TRAIN:
                raise MmlinksError(
                    f"archive index: a pq index needs at least {PQ_MIN_TRAIN} vectors to train on "
                    f"(got {len(x)}); use flat for small archives"
                )
            base = faiss.IndexPQFastScan(d, pq_subquantizers(d), PQ_BITS, faiss.METRIC_INNER_PRODUCT)
            index = faiss.IndexRefineFlat(base)
            index.k_factor = PQ_REFINE_FACTOR
            index.train(x)
        else:
            if not len(x):
                raise MmlinksError("archive index: an ivf index needs at least one vector to train on")
            cells = ivf_cells(len(x))
            index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, cells, faiss.METRIC_INNER_PRODUCT)
            index.cp.min_points_per_centroid = 1  # tiny archives: no warning, the cells are few
            index.cp.spherical = True  # unit centroids for unit vectors (cosine cells)
            index.train(x)
            index.nprobe = ivf_nprobe(cells)
        if len(x):
            index.add(x)
        uris = list(uris) if uris is not None else [""] * len(ids)
        return cls(index, [str(i) for i in ids], uris, kind, dict(info or {}))

    @property
    def refine_factor(self) -> int | None:
        """A ``pq`` index's re-rank factor (candidates re-ranked exactly per hit asked for);
        None for the other kinds."""
        return int(self.index.k_factor) if self.kind == "pq" else None

    def set_refine_factor(self, factor: int) -> None:
        """Re-rank ``factor x k`` candidates (1..1000) a query; saved with the index, so a
        served model keeps the factor its archive's recall was measured at (``PQ_REFINE_FACTOR``
        unless set: docs/benchmarks.md, issue #18, measures recall and latency by factor)."""
        if self.kind != "pq":
            raise MmlinksError(f"a {self.kind} archive index has no re-rank factor (pq only)")
        if isinstance(factor, bool) or not isinstance(factor, int) or not 1 <= factor <= PQ_MAX_REFINE_FACTOR:
            raise MmlinksError(
                f"re-rank factor must be an integer in 1..{PQ_MAX_REFINE_FACTOR}, got {factor!r}"
            )
        self.index.k_factor = factor

    @property
    def dim(self) -> int:
        return int(self.index.d)

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """queries [Q, d] -> (scores [Q, k'], ids per query), best first, k' = min(k, size)."""
        scores, rows = self.search_rows(queries, k)
        return scores, [[self.ids[r] for r in row] for row in rows]

    def search_rows(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[int]]]:
        """queries [Q, d] -> (scores [Q, k'], row numbers per query): ``ids[r]`` / ``uris[r]``
        name a hit (no per-call id -> uri map: building one took 0.55 s of CPU at 1M images)."""
        q = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        if q.shape[1] != self.dim:
            raise MmlinksError(f"archive index: {q.shape[1]}-d queries for a {self.dim}-d index")
        k = min(int(k), len(self))
        if k <= 0:
            return np.zeros((len(q), 0), np.float32), [[] for _ in q]
        scores, rows = self.index.search(q, k)
        # HNSW and IVF may return fewer than k hits (-1 rows: a tiny graph, too few probed
        # cells): drop them
        return scores, [[int(r) for r in row if r >= 0] for row in rows]

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        _faiss().write_index(self.index, str(folder / "index.faiss"))
        (folder / "ids.json").write_text(json.dumps({"ids": self.ids, "uris": self.uris}))
        meta = {"kind": self.kind, "dim": self.dim, "size": len(self), **self.info}
        if self.kind == "pq":
            meta["refine_factor"] = self.refine_factor
        (folder / "index.json").write_text(json.dumps(meta, indent=1))
        return folder

    @classmethod
    def load(cls, folder: str | Path, huge_pages: bool = False) -> ArchiveIndex:
        """``huge_pages``: back the index's vectors and codes with 2 MB pages
        (``back_with_huge_pages``), for a server that searches it."""
        folder = Path(folder)
        if not (folder / "index.faiss").is_file():
            raise MmlinksError(f"no archive index in {folder} (index.faiss missing)")
        index = _faiss().read_index(str(folder / "index.faiss"))
        names = json.loads((folder / "ids.json").read_text())
        meta = json.loads((folder / "index.json").read_text())
        kind = meta.pop("kind", "flat")
        for key in ("dim", "size"):
            meta.pop(key, None)
        if kind == "hnsw":
            index.hnsw.efSearch = HNSW_EF_SEARCH
        elif kind == "ivf":
            index.nprobe = ivf_nprobe(int(index.nlist))
        elif kind == "pq":  # indexes saved before the factor was saved: the old default
            index.k_factor = int(meta.pop("refine_factor", PQ_REFINE_FACTOR))
        if huge_pages:
            back_with_huge_pages(index)
        return cls(index, names["ids"], names["uris"], kind, meta)


MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25  # <sys/mman.h>; MADV_COLLAPSE: Linux 6.1+
HUGE_PAGE = 2 << 20


def back_with_huge_pages(index) -> int:
    """Ask Linux to back the flat vectors and codes of ``index`` (and of its base, refine or
    storage index) with 2 MB transparent huge pages, now (``MADV_COLLAPSE``); how many MB it
    covered. A ``pq`` query reads ~5-10k random 1 KB vectors of a 1 GB array for its exact
    re-rank, each a TLB miss on 4 KB pages. Measured at 1M images (docs/benchmarks.md, issue
    #18): predict's CPU time -9 % at the default factor 1000, no gain at factor 512 or for the
    index alone; the results are the same bytes. Best effort:
    where the kernel or the libc refuses (not Linux, THP off, no contiguous memory), nothing
    changes. FAISS owns these buffers, so this calls ``madvise`` through ctypes (Python's
    ``mmap.madvise`` only covers mmap objects)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    faiss = _faiss()
    covered = 0
    stack = [index]
    while stack:
        ix = faiss.downcast_index(stack.pop())
        parts = (getattr(ix, name, None) for name in ("base_index", "refine_index", "storage"))
        stack += [p for p in parts if p is not None]
        codes = getattr(ix, "codes", None)
        if codes is None or not hasattr(codes, "data") or not codes.size():
            continue
        addr, size = int(codes.data()), int(codes.size())
        start = -(-addr // HUGE_PAGE) * HUGE_PAGE  # whole huge pages inside the buffer only
        end = (addr + size) // HUGE_PAGE * HUGE_PAGE
        if end > start and libc.madvise(start, end - start, MADV_HUGEPAGE) == 0:
            if libc.madvise(start, end - start, MADV_COLLAPSE) == 0:
                covered += end - start
    return covered >> 20


def archive_images(paths: list) -> tuple[list[str], list[str], np.ndarray]:
    """(content ids, uris, CNN features [N, D]) of every distinct image of these shards (the
    first occurrence of a content id wins: a recurring agency photo is one archive image)."""
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


def build_archive_index(net, paths: list, kind: str = "flat", info: dict | None = None) -> ArchiveIndex:
    """The archive index of the images of ``paths`` (dataset shards) under model ``net``."""
    ids, uris, feats = archive_images(paths)
    if not ids:
        raise MmlinksError("the archive has no image with features")
    if feats.shape[1] != net.cfg.image_dim:
        raise MmlinksError(
            f"the model takes {net.cfg.image_dim}-d image features, the archive has {feats.shape[1]}-d"
        )
    return ArchiveIndex.build(ids, embed_images(net, feats), uris, kind, info)
