"""News archive index (issue #18): recall@10 of the approximate FAISS index (HNSW, the
``hnsw`` kind of ``training/news/archive.py``) against exact search (``flat``), and per-query
search latency of both, on N random unit vectors of dimension D (the issue's target: 1M x 256,
recall@10 >= 0.95, p99 <= 20 ms for one article).

Queries are one at a time (an editor's article), each a random database vector plus noise, so
the exact neighbours are well defined. FAISS threads: ``--threads`` (default 1: the index alone
on one core; the machine is shared). One JSON object on stdout. Example::

    PYTHONPATH=. python benchmarks/news_archive_index.py --n 100000 --dim 256 --queries 500
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--noise", type=float, default=0.5, help="query = database vector + noise * N(0, I/D)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--ef-search", type=int, default=0, help="HNSW search breadth (0: the library's HNSW_EF_SEARCH)"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import faiss

    from training.news.archive import HNSW_EF_SEARCH, HNSW_M, ArchiveIndex

    faiss.omp_set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((args.n, args.dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    picks = rng.integers(0, args.n, args.queries)
    q = x[picks] + args.noise * rng.standard_normal((args.queries, args.dim), dtype=np.float32) / np.sqrt(
        args.dim
    )
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    ids = [str(i) for i in range(args.n)]
    out = {"n": args.n, "dim": args.dim, "queries": args.queries, "k": args.k, "threads": args.threads}
    results = {}
    for kind in ("flat", "hnsw"):
        t0 = time.perf_counter()
        index = ArchiveIndex.build(ids, x, kind=kind)
        if kind == "hnsw" and args.ef_search:
            index.index.hnsw.efSearch = args.ef_search
        build_s = time.perf_counter() - t0
        lat, hits = [], []
        for row in q:
            t = time.perf_counter()
            _, got = index.search(row[None], args.k)
            lat.append((time.perf_counter() - t) * 1000)
            hits.append(got[0])
        results[kind] = hits
        lat = np.asarray(lat)
        out[kind] = {
            "build_s": round(build_s, 2),
            "p50_ms": round(float(np.percentile(lat, 50)), 3),
            "p99_ms": round(float(np.percentile(lat, 99)), 3),
        }
    recall = np.mean(
        [len(set(a) & set(b)) / args.k for a, b in zip(results["hnsw"], results["flat"], strict=True)]
    )
    out["hnsw"].update(
        {
            "recall_at_k_vs_exact": round(float(recall), 4),
            "M": HNSW_M,
            "ef_search": args.ef_search or HNSW_EF_SEARCH,
        }
    )
    out["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "faiss": faiss.__version__}
    out["load_avg_end"] = os.getloadavg()[0]
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
