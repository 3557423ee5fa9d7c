"""The ivfpq design sweep (issue #38): for IVF cells x PQ sub-quantizers, recall@10 against exact
search of ``IndexIVFPQFastScan`` candidates re-ranked on three stores (float32 ``flat``,
``fp16``, 8-bit ``sq8``), by probes and re-rank factor, on the random database of
``benchmarks/news_archive_index.py`` (the same chunks: ``default_rng([seed, c])``).

The database is held in memory (N x D float32, plus one decoded copy per store: ~3 GB at 1M x
256; this is a design sweep, not the bounded build). Queries: 200 random unit vectors and 200
noisy database vectors (noise 0.5). Candidates: the base index's top ``10 x 1000`` at each
probe share; each store re-ranks the first ``10 x factor`` of them (its decoded vectors' inner
products), as ``IndexRefine`` does. One JSON line per setting on stderr, all of them on stdout.
Example (the docs' sweep, ~30 min on 2 shared cores)::

    PYTHONPATH=. python benchmarks/news_archive_sweep.py --n 1000000 --cells 1024,4096 --subquantizers 64,128
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

SHARES = (0.02, 0.05, 0.1, 0.2, 0.4, 1.0)
FACTORS = (10, 20, 50, 100, 200, 500, 1000)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--cells", default="1024,4096")
    ap.add_argument("--subquantizers", default="64,128")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import faiss

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from news_archive_index import DB_CHUNK

    d, n = args.dim, args.n
    x = np.empty((n, d), np.float32)
    for s in range(0, n, DB_CHUNK):
        c = np.random.default_rng([args.seed, s // DB_CHUNK]).standard_normal(
            (min(DB_CHUNK, n - s), d), np.float32
        )
        x[s : s + len(c)] = c / np.linalg.norm(c, axis=1, keepdims=True)
    rng = np.random.default_rng(7)
    qr = rng.standard_normal((200, d), dtype=np.float32)
    qn = x[rng.integers(0, n, 200)] + 0.5 * rng.standard_normal((200, d), dtype=np.float32) / np.sqrt(d)
    q = np.concatenate([qr, qn])
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    flat = faiss.IndexFlatIP(d)
    flat.add(x)
    truth = flat.search(q, 10)[1]
    del flat
    stores = {"flat": x}
    for name, qt in (("sq8", faiss.ScalarQuantizer.QT_8bit), ("fp16", faiss.ScalarQuantizer.QT_fp16)):
        sq = faiss.IndexScalarQuantizer(d, qt, faiss.METRIC_INNER_PRODUCT)
        sq.train(x[:100_000])
        stores[name] = sq.sa_decode(sq.sa_encode(x))

    def recall(got: np.ndarray, want: np.ndarray) -> float:
        return round(float(np.mean([len(set(g) & set(w)) / 10 for g, w in zip(got, want, strict=True)])), 4)

    out = {"n": n, "dim": d, "queries": {"random": 200, "noisy": 200}, "results": {}}
    for cells in [int(c) for c in args.cells.split(",")]:
        for m in [int(v) for v in args.subquantizers.split(",")]:
            t0 = time.perf_counter()
            base = faiss.IndexIVFPQFastScan(faiss.IndexFlatIP(d), d, cells, m, 4, faiss.METRIC_INNER_PRODUCT)
            base.train(x[: max(100_000, 40 * cells)])
            base.add(x)
            out["results"][f"cells{cells} M{m}"] = {"build_s": round(time.perf_counter() - t0, 1)}
            for share in SHARES:
                base.nprobe = max(1, round(share * cells))
                cand = base.search(q, 10 * max(FACTORS))[1]
                scores = {}
                for name, v in stores.items():
                    scores[name] = np.stack([v[np.maximum(c, 0)] @ qi for qi, c in zip(q, cand, strict=True)])
                    scores[name][cand < 0] = -9
                for factor in FACTORS:
                    row = {}
                    for name in stores:
                        top = np.argsort(-scores[name][:, : 10 * factor], axis=1, kind="stable")[:, :10]
                        got = np.take_along_axis(cand[:, : 10 * factor], top, 1)
                        row[name] = [recall(got[:200], truth[:200]), recall(got[200:], truth[200:])]
                    key = f"cells{cells} M{m} nprobe{base.nprobe} factor{factor}"
                    out["results"][key] = row  # [random, noisy] per store
                    print(json.dumps({key: row}), file=sys.stderr, flush=True)
    out["load_avg_end"] = os.getloadavg()[0]
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
