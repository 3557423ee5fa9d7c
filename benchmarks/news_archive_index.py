"""News archive index (issue #18): recall@k of an approximate FAISS index (``hnsw`` or ``ivf``,
``training/news/archive.py``) against exact search, and per-query search latency, on N random
unit vectors of dimension D (the issue's target: 1M x 256, recall@10 >= 0.95, p99 <= 20 ms for
one article).

Database: N standard normal vectors, L2-normalised (``numpy.random.default_rng(seed)``), row i
named ``str(i)``. Queries, one at a time (an editor's article), drawn two ways (``--query-mode``):

- ``noisy``: a random database vector plus noise (``noise * N(0, I/D)``), renormalised: its
  source vector is a clear first hit, the other k - 1 are as hard as for a random query;
- ``random``: a fresh random unit vector (the worst case: the top k barely stand out).

The oracle is exact search (``IndexFlatIP``) over the whole database, the Q queries in one batch
(all cores); latency is timed one query at a time with ``--threads`` FAISS threads (default 1:
the index alone on one core), for the approximate index on every query and for exact search on
the first ``--exact-latency-queries``. ``--index-cache FOLDER`` saves the built approximate
index (an ``ArchiveIndex`` folder, loadable by the served model) and reuses it when it was built
for the same N, D, seed and kind (building HNSW over 1M vectors takes tens of minutes on 2
shared cores; a killed HNSW build resumes from its last saved chunk, and a partial build of
n rows of a bigger database serves as the index of ``--n n``: the database of n rows is the
bigger one's first n rows); ``--build-only`` stops after that. The oracle's answers are kept
beside a cached index. One JSON object on stdout. Example::

    PYTHONPATH=. python benchmarks/news_archive_index.py --n 1000000 --dim 256 --kind hnsw \\
        --queries 300 --index-cache /tmp/hnsw-1m-256
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np


def database(n: int, dim: int, seed: int) -> np.ndarray:
    """[n, dim] random unit vectors (what every cached index of this (n, dim, seed) holds)."""
    x = np.random.default_rng(seed).standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def queries(x: np.ndarray, count: int, mode: str, noise: float, seed: int) -> np.ndarray:
    """[count, D] unit queries: ``noisy`` (database vector + noise) or ``random``."""
    rng = np.random.default_rng([seed, 1 if mode == "noisy" else 2])
    d = x.shape[1]
    if mode == "noisy":
        q = x[rng.integers(0, len(x), count)] + noise * rng.standard_normal((count, d), np.float32) / np.sqrt(
            d
        )
    else:
        q = rng.standard_normal((count, d), dtype=np.float32)
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def cached_index(kind: str, x: np.ndarray, seed: int, cache: str | None, chunk: int):
    """(the approximate ArchiveIndex, build seconds or None when loaded whole from ``cache``).

    With a cache, HNSW is built ``chunk`` vectors at a time and saved after each chunk, so a
    killed build resumes where it stopped (HNSW inserts one vector at a time anyway; IVF trains
    on all vectors, so it is built in one go)."""
    from training.news.archive import ArchiveIndex

    key = {"n": len(x), "dim": x.shape[1], "seed": seed}
    if cache and (Path(cache) / "index.faiss").is_file():
        index = ArchiveIndex.load(cache)
        got = {k: index.info.get("bench", {}).get(k) for k in key}
        # the first n rows of a bigger database (same seed, dim) are this database: a partial
        # HNSW build of n rows of it is this database's index
        same = got["dim"] == key["dim"] and got["seed"] == key["seed"] and kind == index.kind == "hnsw"
        prefix = same and len(index) == len(x) and (got["n"] or 0) > len(x)
        if not prefix and (got != key or index.kind != kind):
            raise SystemExit(f"--index-cache {cache} holds a {index.kind} index of {got}, not {kind} {key}")
        if len(index) == len(x):
            return index, None
    elif kind in ("ivf", "pq") or not cache:
        t0 = time.perf_counter()
        index = ArchiveIndex.build([str(i) for i in range(len(x))], x, kind=kind, info={"bench": key})
        build_s = time.perf_counter() - t0
        index.info["bench"]["build_s"] = round(build_s, 1)
        if cache:
            index.save(cache)
        return index, build_s
    else:
        index = ArchiveIndex.build([], x[:0], kind=kind, info={"bench": {**key, "build_s": 0.0}})
    bench = index.info["bench"]
    for start in range(len(index), len(x), chunk):
        t0, c0 = time.perf_counter(), time.process_time()
        rows = x[start : start + chunk]
        index.index.add(rows)
        index.ids += [str(i) for i in range(start, start + len(rows))]
        index.uris += [""] * len(rows)
        bench["build_s"] = round(bench["build_s"] + time.perf_counter() - t0, 1)
        bench["build_cpu_s"] = round(bench.get("build_cpu_s", 0.0) + time.process_time() - c0, 1)
        index.save(cache)
        print(json.dumps({"built": len(index), **bench}), file=sys.stderr, flush=True)
    return index, bench["build_s"]


def oracle(exact, q: np.ndarray, args, mode: str) -> list[list[str]]:
    """The exact top k of every query, in one batch; kept beside a cached index (it costs a
    minute at 1M on 2 cores), keyed by everything that draws the queries."""
    name = f"oracle-n{args.n}-{mode}-q{len(q)}-k{args.k}-noise{args.noise}.json"
    path = Path(args.index_cache) / name if args.index_cache else None
    if path and path.is_file():
        return json.loads(path.read_text())
    truth = exact.search(q, args.k)[1]
    if path:
        path.write_text(json.dumps(truth))
    return truth


def timed(index, q: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
    """(latency ms per query, hits per query), one query at a time."""
    lat, hits = [], []
    for row in q:
        t = time.perf_counter()
        _, got = index.search(row[None], k)
        lat.append((time.perf_counter() - t) * 1000)
        hits.append(got[0])
    return np.asarray(lat), hits


def set_breadth(index, breadth: int) -> str:
    """Set HNSW efSearch / IVF nprobe (0: leave the library's); the setting's name."""
    if index.kind == "hnsw":
        if breadth:
            index.index.hnsw.efSearch = breadth
        return f"hnsw efSearch={index.index.hnsw.efSearch}"
    if index.kind == "pq":
        if breadth:
            index.index.k_factor = breadth
        return f"pq refine k_factor={index.index.k_factor:g}"
    if breadth:
        index.index.nprobe = breadth
    return f"ivf nprobe={index.index.nprobe}"


def pct(lat: np.ndarray) -> dict:
    return {f"p{p}_ms": round(float(np.percentile(lat, p)), 3) for p in (50, 99)} | {"queries": len(lat)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--kind", choices=("hnsw", "ivf", "pq"), default="hnsw", help="the approximate index")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--query-mode", choices=("noisy", "random", "both"), default="both")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument(
        "--noise", type=float, default=0.5, help="noisy query = database vector + noise * N(0, I/D)"
    )
    ap.add_argument("--threads", type=int, default=1, help="FAISS threads for the timed queries")
    ap.add_argument(
        "--breadth",
        default="",
        help="search breadth: HNSW efSearch, IVF nprobe or PQ's re-rank factor, comma-separated "
        "to sweep (default: the library's)",
    )
    ap.add_argument("--exact-latency-queries", type=int, default=50)
    ap.add_argument("--index-cache", default=None, help="folder: save the built index there, or reuse it")
    ap.add_argument(
        "--huge-pages",
        action="store_true",
        help="back the index's vectors and codes with 2 MB pages, as the served model loads it",
    )
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--build-chunk", type=int, default=100_000, help="HNSW vectors added between saves")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import faiss

    from training.news.archive import ArchiveIndex

    cores = os.cpu_count() or 1
    faiss.omp_set_num_threads(cores)
    t0 = time.perf_counter()
    x = database(args.n, args.dim, args.seed)
    out = {"n": args.n, "dim": args.dim, "k": args.k, "threads": args.threads, "kind": args.kind}
    out["data_s"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    index, build_s = cached_index(args.kind, x, args.seed, args.index_cache, args.build_chunk)
    out["index"] = {"build_s": round(build_s, 1) if build_s else None, "cached": build_s is None}
    if args.huge_pages:
        from training.news.archive import back_with_huge_pages

        out["index"]["huge_pages_mb"] = back_with_huge_pages(index.index)
    out["index"]["load_or_build_s"] = round(time.perf_counter() - t0, 1)
    for key in ("build_s", "build_cpu_s"):
        out["index"][f"cached_{key}"] = index.info.get("bench", {}).get(key)
    if args.kind == "hnsw":
        out["index"].update(M=index.index.hnsw.nb_neighbors(1), ef_search=index.index.hnsw.efSearch)
    elif args.kind == "pq":
        import faiss

        base = faiss.downcast_index(index.index.base_index)
        out["index"].update(subquantizers=int(base.M), bits=int(base.nbits), k_factor=index.index.k_factor)
    else:
        out["index"].update(cells=int(index.index.nlist), nprobe=int(index.index.nprobe))
    if args.index_cache:
        out["index"]["file_mb"] = round((Path(args.index_cache) / "index.faiss").stat().st_size / 2**20)
    if args.build_only:
        print(json.dumps(out))
        return out
    exact = ArchiveIndex.build(index.ids, x, kind="flat")
    modes = ("noisy", "random") if args.query_mode == "both" else (args.query_mode,)
    for mode in modes:
        q = queries(x, args.queries, mode, args.noise, args.seed)
        faiss.omp_set_num_threads(cores)
        t0 = time.perf_counter()
        truth = oracle(exact, q, args, mode)
        oracle_s = time.perf_counter() - t0
        faiss.omp_set_num_threads(args.threads)
        out[mode] = {"oracle_batch_s": round(oracle_s, 1)}
        for breadth in [int(b) for b in args.breadth.split(",") if b] or [0]:
            name = set_breadth(index, breadth)
            lat, hits = timed(index, q, args.k)
            recall = np.mean([len(set(a) & set(b)) / args.k for a, b in zip(hits, truth, strict=True)])
            out[mode][name] = {"recall_at_k_vs_exact": round(float(recall), 4), **pct(lat)}
        if args.exact_latency_queries:
            out[mode]["exact"] = pct(timed(exact, q[: args.exact_latency_queries], args.k)[0])
    out["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    out["machine"] = {"cpus": cores, "python": platform.python_version(), "faiss": faiss.__version__}
    out["load_avg_end"] = os.getloadavg()[0]
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
