"""The FAISS side of the news archive index: its kinds (``KINDS``), how each is made and trained,
the search parameters a query runs with (skipping deleted rows), memory-mapped reads, huge pages.

``flat`` is exact (tests, small archives); ``hnsw``, ``ivf`` and ``pq`` (4-bit PQ re-ranked on
float32 vectors) are issue #18's; ``ivfpq`` (issue #38) re-ranks on an 8-bit store, which keeps
10M x 256 within ~3.3 GB where ``pq``'s float32 copy needs 10 GB. Why these parameters: the sweep
in docs/benchmarks.md. Deleted rows are skipped by an ``IDSelector``; ``pq``'s index refuses one,
so it over-fetches ``k + deleted`` and filters (``selector_supported``)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from schemas.errors import MmlinksError

KINDS = ("flat", "hnsw", "ivf", "pq", "ivfpq")
TRAINED_KINDS = ("ivf", "pq", "ivfpq")
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

# ivfpq (issue #38), chosen by the sweep of docs/benchmarks.md: see ivfpq_cells and the defaults
IVFPQ_DIMS_PER_CODE = 2  # 256-d: 128 sub-quantizers of 4 bits, 64 bytes a vector
IVFPQ_CELLS_PER_SQRT = 1  # cells = sqrt(N): the coarse assignment of 10M stays minutes
IVFPQ_MIN_POINTS_PER_CELL = 39  # FAISS's k-means warns below 39 training vectors a centroid
IVFPQ_PROBE_SHARE = 0.25  # default nprobe = ceil(share * cells)
IVFPQ_REFINE_FACTOR = 100  # default: k x 100 candidates re-ranked on the 8-bit store
IVFPQ_EXACT_FACTOR = 4  # default: the 8-bit store's best k x 4 re-ranked on the float32 vectors
IVFPQ_MAX_REFINE_FACTOR = 100_000
# the re-rank stores measured; the default keeps 10M x 256 at 2.5 GB (float16: 5 GB, float32: 10 GB)
REFINE_STORES = ("sq8", "fp16", "flat")
IVFPQ_STORE = "sq8"
IVFPQ_MIN_SAMPLE = 1024  # a smaller training sample is padded (train)
TRAIN_SIZE = 200_000  # vectors a streamed build trains on (its first ones)


def _faiss():
    import faiss

    return faiss


def pq_subquantizers(d: int, dims_per_code: int = PQ_DIMS_PER_CODE) -> int:
    """The number of PQ sub-vectors for d dims: the largest divisor of d up to d / dims_per_code."""
    return max(m for m in range(1, max(1, d // dims_per_code) + 1) if d % m == 0)


def ivf_cells(n: int) -> int:
    """k-means cells for n vectors: sqrt(n) (FAISS's guideline is 4..16 sqrt(n); fewer cells
    keep the k-means training cheap), at least 1."""
    return max(1, int(np.sqrt(n)))


def ivf_nprobe(cells: int, share: float = IVF_PROBE_SHARE) -> int:
    return max(1, min(cells, int(np.ceil(share * cells))))


def ivfpq_cells(expected: int, train: int) -> int:
    """IVF cells of an ivfpq index expected to hold ``expected`` vectors, trained on ``train``:
    ``IVFPQ_CELLS_PER_SQRT x sqrt(expected)``, at most one per ``IVFPQ_MIN_POINTS_PER_CELL``
    training vectors, at least 1."""
    cells = int(IVFPQ_CELLS_PER_SQRT * np.sqrt(max(expected, 1)))
    return max(1, min(cells, train // IVFPQ_MIN_POINTS_PER_CELL))


def new_index(kind: str, d: int, cells: int = 1, store: str = IVFPQ_STORE):
    """An empty FAISS index of ``kind`` for d-dim unit vectors (``cells``: ivf / ivfpq only)."""
    faiss = _faiss()
    ip = faiss.METRIC_INNER_PRODUCT
    if kind == "flat":
        return faiss.IndexFlatIP(d)
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, HNSW_M, ip)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.hnsw.efSearch = HNSW_EF_SEARCH
        return index
    if kind == "pq":
        index = faiss.IndexRefineFlat(faiss.IndexPQFastScan(d, pq_subquantizers(d), PQ_BITS, ip))
        index.k_factor = PQ_REFINE_FACTOR
        return index
    if kind == "ivf":
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, cells, ip)
        index.cp.min_points_per_centroid = 1  # tiny archives: no warning, the cells are few
        index.cp.spherical = True  # unit centroids for unit vectors (cosine cells)
        return index
    if kind != "ivfpq":
        raise MmlinksError(f"unknown archive index kind {kind!r}; known: {', '.join(KINDS)}")
    if store not in REFINE_STORES:
        raise MmlinksError(f"unknown re-rank store {store!r}; known: {', '.join(REFINE_STORES)}")
    base = faiss.IndexIVFPQFastScan(
        faiss.IndexFlatIP(d), d, cells, pq_subquantizers(d, IVFPQ_DIMS_PER_CODE), PQ_BITS, ip
    )
    base.cp.min_points_per_centroid = 1  # small archives: no k-means warnings
    base.cp.spherical = True
    base.pq.cp.min_points_per_centroid = 1
    if store == "flat":
        refine = faiss.IndexFlatIP(d)
    else:
        qt = faiss.ScalarQuantizer.QT_8bit if store == "sq8" else faiss.ScalarQuantizer.QT_fp16
        refine = faiss.IndexScalarQuantizer(d, qt, ip)
    index = faiss.IndexRefine(base, refine)  # its Python wrapper keeps base and refine alive
    index.k_factor = IVFPQ_REFINE_FACTOR
    return index


def train(kind: str, index, x: np.ndarray) -> None:
    """Train ``index`` on ``x``. An ivfpq sample under ``IVFPQ_MIN_SAMPLE`` vectors (a
    newsroom's first images, a test) is padded with seeded random unit vectors and the +-1
    basis vectors: a handful of vectors gives degenerate quantizers (one vector's residual to
    its own cell is 0, and FAISS's fast-scan tables turn that into NaN) and an 8-bit store
    whose per-dimension ranges clip every later image; the padding spans any unit vector."""
    if kind not in TRAINED_KINDS:
        return
    if kind == "pq" and len(x) < PQ_MIN_TRAIN:
        raise MmlinksError(
            f"archive index: a pq index needs at least {PQ_MIN_TRAIN} vectors to train on "
            f"(got {len(x)}); use flat for small archives"
        )
    if not len(x):
        raise MmlinksError(f"archive index: an {kind} index needs at least one vector to train on")
    if kind == "ivfpq" and len(x) < IVFPQ_MIN_SAMPLE:
        d = x.shape[1]
        fill = np.random.default_rng(0).standard_normal((IVFPQ_MIN_SAMPLE - len(x), d)).astype(np.float32)
        fill /= np.linalg.norm(fill, axis=1, keepdims=True)
        x = np.concatenate([x, fill, np.eye(d, dtype=np.float32), -np.eye(d, dtype=np.float32)])
    x = np.ascontiguousarray(x, dtype=np.float32)
    if kind != "ivfpq":
        index.train(x)
        return
    faiss = _faiss()
    base, _ = ivfpq_parts(index)
    # the cells first, on every thread (a few large matrix products); then the 128 small PQ
    # k-means and the 8-bit ranges on one: their thousands of OpenMP barriers took 128 s
    # instead of 3.4 s for 10k vectors on 2 cores shared with another job (docs/benchmarks.md)
    faiss.Clustering(x.shape[1], int(base.nlist), base.cp).train(x, base.quantizer)
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        index.train(x)  # the quantizer holds its nlist centroids: FAISS trains only the codes
    finally:
        faiss.omp_set_num_threads(threads)


def ivfpq_parts(index):
    """(the IVF fast-scan base, the re-rank store) of an ivfpq index."""
    faiss = _faiss()
    return faiss.downcast_index(index.base_index), faiss.downcast_index(index.refine_index)


def default_search(kind: str, index) -> dict:
    """An ivfpq index's search settings before any are set: ``IVFPQ_PROBE_SHARE`` of its
    cells, ``IVFPQ_REFINE_FACTOR`` and ``IVFPQ_EXACT_FACTOR``."""
    if kind != "ivfpq":
        return {}
    base, _ = ivfpq_parts(index)
    nprobe = ivf_nprobe(int(base.nlist), IVFPQ_PROBE_SHARE)
    return {"nprobe": nprobe, "k_factor": IVFPQ_REFINE_FACTOR, "exact_factor": IVFPQ_EXACT_FACTOR}


def check_search(kind: str, index, nprobe=None, k_factor=None, exact_factor=None) -> None:
    """Refuse search settings out of range in one line (before a query would)."""
    if kind != "ivfpq":
        raise MmlinksError(f"a {kind} archive index has no probe / re-rank settings (ivfpq only)")
    cells = int(ivfpq_parts(index)[0].nlist)
    limits = (
        ("nprobe", nprobe, 1, cells),
        ("re-rank factor", k_factor, 1, IVFPQ_MAX_REFINE_FACTOR),
        ("exact re-rank factor", exact_factor, 0, IVFPQ_MAX_REFINE_FACTOR),
    )
    for name, value, low, top in limits:
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= top:
            raise MmlinksError(f"{name} must be an integer in {low}..{top}, got {value!r}")


def selector_supported(kind: str) -> bool:
    return kind != "pq"


class Params:
    """The FAISS search parameters of one index state: the settings, and the deleted rows
    skipped through a bitmap selector (``IDSelectorNot(IDSelectorBitmap)``: one bit a row, a
    test per candidate). Holds every object FAISS points at, so none is freed under it."""

    def __init__(self, kind: str, index, search: dict, deleted: np.ndarray, rows: int) -> None:
        faiss = _faiss()
        self.keep: list = []
        sel = None
        if len(deleted) and selector_supported(kind):
            bits = np.zeros((rows + 7) // 8, np.uint8)
            np.bitwise_or.at(bits, deleted >> 3, (1 << (deleted & 7)).astype(np.uint8))
            inner = faiss.IDSelectorBitmap(len(bits), faiss.swig_ptr(bits))  # its n counts bytes
            sel = faiss.IDSelectorNot(inner)
            self.keep += [bits, inner, sel]
        self.value = self.ivf = None
        if kind == "ivfpq":
            self.ivf = faiss.SearchParametersIVF(nprobe=int(search["nprobe"]))
            if sel is not None:
                self.ivf.sel = sel
        elif sel is not None and kind == "hnsw":
            self.value = faiss.SearchParametersHNSW(sel=sel, efSearch=int(index.hnsw.efSearch))
        elif sel is not None and kind == "ivf":
            self.value = faiss.SearchParametersIVF(sel=sel, nprobe=int(index.nprobe))
        elif sel is not None:
            self.value = faiss.SearchParameters(sel=sel)

    def refine(self, k_factor: float):
        """ivfpq: a query's own ``IndexRefineSearchParameters`` over the shared (read-only) IVF
        ones: its factor depends on the k asked, and a server may predict on several threads."""
        out = _faiss().IndexRefineSearchParameters(k_factor=float(k_factor))
        out.base_index_params = self.ivf
        return out


def read_index(path: str, mmap: bool):
    """``faiss.read_index``; ``mmap``: ``IO_FLAG_MMAP_IFC``, which maps the flat code arrays
    (``IndexFlatCodes``: the re-rank store, a flat index's vectors) from the file instead of
    copying them, so serving processes share one copy in the page cache. FAISS 1.15 still
    copies IVF lists (ivfpq's fast-scan codes: ~20 % of it), and aborts the process on an add
    to a mapped array, so ``ArchiveIndex`` refuses adds to an index loaded this way."""
    faiss = _faiss()
    return faiss.read_index(path, faiss.IO_FLAG_MMAP_IFC if mmap else 0)


def index_files(kind: str, folder: Path, stem: str) -> list[Path]:
    """The files of a saved index: ``STEM.faiss``; ivfpq also ``STEM.refine.faiss``, its re-rank
    store apart, so that a memory-mapped load maps the store alone: mapped in one file with
    the IVF lists, the lists' pages read while FAISS copies them stayed resident in the
    mapping too (+72 MB a process at 1M, docs/benchmarks.md, issue #38)."""
    files = [folder / f"{stem}.faiss"]
    return [*files, folder / f"{stem}.refine.faiss"] if kind == "ivfpq" else files


def write_index_files(kind: str, index, folder: Path, stem: str) -> None:
    """Write an index's files, each through a temporary file and a rename."""
    faiss = _faiss()
    parts = ivfpq_parts(index) if kind == "ivfpq" else (index,)
    for part, path in zip(parts, index_files(kind, folder, stem), strict=True):
        tmp = path.with_name(path.name + ".tmp")
        faiss.write_index(part, str(tmp))
        os.replace(tmp, path)


def read_index_files(kind: str, folder: Path, stem: str, mmap: bool):
    """The index ``write_index_files`` wrote (ivfpq: the ``IndexRefine`` put back together;
    its factor is passed per query, ``Params.refine``)."""
    paths = index_files(kind, folder, stem)
    if kind != "ivfpq":
        return read_index(str(paths[0]), mmap)
    base = _faiss().read_index(str(paths[0]))  # the IVF lists are copied anyway
    index = _faiss().IndexRefine(base, read_index(str(paths[1]), mmap))  # keeps both alive
    index.k_factor = IVFPQ_REFINE_FACTOR
    return index


MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25  # <sys/mman.h>; MADV_COLLAPSE: Linux 6.1+
MADV_POPULATE_READ = 22  # <linux/mman.h>, Linux 5.14+: fault a range in now, read-only
HUGE_PAGE = 2 << 20
PAGE = 4096


def _libc():
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def code_buffers(index, mapped_only: bool = False) -> list[tuple[int, int]]:
    """(address, bytes) of the flat code arrays of ``index`` and of its base, refine or storage
    index (``IndexFlatCodes``: a flat index's vectors, pq's refine vectors, ivfpq's 8-bit
    store); ``mapped_only``: those mapped from a file (``read_index(mmap=True)``), not owned."""
    faiss = _faiss()
    out, stack = [], [index]
    while stack:
        ix = faiss.downcast_index(stack.pop())
        parts = (getattr(ix, name, None) for name in ("base_index", "refine_index", "storage"))
        stack += [p for p in parts if p is not None]
        codes = getattr(ix, "codes", None)
        if codes is None or not hasattr(codes, "data") or not codes.size():
            continue
        if mapped_only and getattr(codes, "is_owned", True):
            continue
        out.append((int(codes.data()), int(codes.size())))
    return out


def hold_resident(ranges: list[tuple[int, int]]) -> dict:
    """Read these mapped address ranges (a served index's memory-mapped files) into memory now
    and keep them there: ``mlock`` (resident until unmapped; the kernel's reclaim, e.g. a
    proactive one that pages out what was not touched for a minute, cannot drop them), or,
    where the process may not lock that much (``RLIMIT_MEMLOCK`` without ``CAP_IPC_LOCK``),
    ``MADV_POPULATE_READ`` (read in now, reclaimable later). Without it a served query's first
    touch of each page of ivfpq's 8-bit store is a disk read inside the request: at 1M, the
    first 200 queries' FAISS search p99 22 ms instead of 0.5 (docs/benchmarks.md, issue #38).
    Shared file pages: N workers that map the same file hold one copy. Best effort; bytes
    ``{"locked", "populated", "failed"}``."""
    out = {"locked": 0, "populated": 0, "failed": 0}
    libc = _libc()
    for addr, size in ranges:
        if not size:
            continue
        start = addr // PAGE * PAGE
        length = -(-(addr + size) // PAGE) * PAGE - start
        if libc is not None and libc.mlock(start, length) == 0:
            out["locked"] += size
        elif libc is not None and libc.madvise(start, length, MADV_POPULATE_READ) == 0:
            out["populated"] += size
        else:
            out["failed"] += size
    return out


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
    libc = _libc()
    if libc is None:
        return 0
    covered = 0
    for addr, size in code_buffers(index):
        start = -(-addr // HUGE_PAGE) * HUGE_PAGE  # whole huge pages inside the buffer only
        end = (addr + size) // HUGE_PAGE * HUGE_PAGE
        if end > start and libc.madvise(start, end - start, MADV_HUGEPAGE) == 0:
            if libc.madvise(start, end - start, MADV_COLLAPSE) == 0:
                covered += end - start
    return covered >> 20
