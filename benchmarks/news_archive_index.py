"""News archive index (issues #18, #38): recall@k of an approximate FAISS index against exact
search, per-query latency, build time, memory and size on disk, on N x D vectors that are never
all in memory (the targets: 1M and 10M x 256).

Vectors come in chunks of ``DB_CHUNK`` rows, chunk c from ``default_rng([seed, c])`` alone, so the
build streams them and the exact oracle regenerates them: ``random`` (unit normal: no clusters
to prune by) or ``trained`` (``--model`` from ``news_fusion.py --save-model``; CNN features drawn
from a ``--mixture-k`` mixture fitted to ``--data``'s images, through the image tower). Queries
(``--query-mode``): ``noisy`` database vectors, ``random``, or ``articles`` (the served model's
real queries). The index is built by ``archive.build.build_streamed`` into ``--index-cache``
(checkpointed, resumed, reused for the same N, D, seed, vectors and kind; ``--build-only`` stops
there) and loaded as the served model loads it, at its calibrated settings and the swept ones
(``--breadth``; ivfpq ``--nprobe`` x ``--k-factor`` x ``--exact-factor``), one query at a time on
``--threads`` FAISS threads. One JSON object on stdout; commands in docs/benchmarks-news.md.
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
from _timing import pct, rss_mb, smaps_mb

DB_CHUNK = 65_536  # rows a database chunk draws from its own seed (part of every cache key)


class Mixture:
    """Per-cluster diagonal Gaussians over CNN features: centres [K, D], std [K, D], weights."""

    def __init__(self, feats: np.ndarray, k: int, seed: int) -> None:
        import faiss

        k = max(1, min(k, len(feats) // 4))
        km = faiss.Kmeans(feats.shape[1], k, niter=20, seed=seed, min_points_per_centroid=1)
        km.train(np.ascontiguousarray(feats, dtype=np.float32))
        assign = km.index.search(np.ascontiguousarray(feats, dtype=np.float32), 1)[1][:, 0]
        self.centres = km.centroids.astype(np.float32)
        floor = feats.std(0) * 0.5  # a cluster of one image: half the global spread
        self.std = np.stack(
            [feats[assign == c].std(0) if (assign == c).sum() > 1 else floor for c in range(k)]
        ).astype(np.float32)
        self.weights = np.bincount(assign, minlength=k) / len(feats)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        comp = rng.choice(len(self.weights), size=n, p=self.weights)
        noise = rng.standard_normal((n, self.centres.shape[1]), dtype=np.float32)
        return self.centres[comp] + self.std[comp] * noise


class Database:
    """Chunk c of the N x D database, regenerated from its own seed whenever asked."""

    def __init__(self, args) -> None:
        self.n, self.dim, self.seed, self.kind = args.n, args.dim, args.seed, args.vectors
        self.net = self.mixture = None
        if self.kind == "trained":
            from archive.build import archive_images
            from schemas.manifest import Manifest
            from training.checkpoints import load_checkpoint_model

            self.net = load_checkpoint_model(Path(args.model) / "checkpoint")[0]
            self.dim = self.net.cfg.d
            paths = [str(p) for p in Manifest.read(args.data).shard_paths(args.data)]
            _, _, feats = archive_images(paths)
            self.mixture = Mixture(feats, args.mixture_k, args.seed)
            self.images = len(feats)

    def chunks(self) -> int:
        return -(-self.n // DB_CHUNK)

    def chunk(self, c: int) -> np.ndarray:
        rows = min(DB_CHUNK, self.n - c * DB_CHUNK)
        rng = np.random.default_rng([self.seed, c])
        if self.kind == "random":
            x = rng.standard_normal((rows, self.dim), dtype=np.float32)
            return x / np.linalg.norm(x, axis=1, keepdims=True)
        from archive.build import embed_images

        return embed_images(self.net, self.mixture.sample(rng, rows))

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """The vectors of some rows (their chunks regenerated)."""
        out = np.empty((len(rows), self.dim), np.float32)
        for c in np.unique(rows // DB_CHUNK):
            take = np.flatnonzero(rows // DB_CHUNK == c)
            out[take] = self.chunk(int(c))[rows[take] - c * DB_CHUNK]
        return out

    def source(self):
        """The build's source: chunk c from position c."""
        from archive.build import ArchiveChunk

        def source(start: int):
            for c in range(start, self.chunks()):
                x = self.chunk(c)
                first = c * DB_CHUNK
                yield ArchiveChunk([str(i) for i in range(first, first + len(x))], x, [""] * len(x), c + 1)

        return source


def article_queries(args, net, count: int, splits=("test", "val", "train")) -> np.ndarray:
    """The fused text vectors of the first ``count`` articles of ``--data``'s ``splits``: the
    measured queries (test split first), or the build's calibration queries (train split)."""
    from schemas.manifest import Manifest
    from schemas.news import sources_of
    from schemas.shards import read_table
    from training.news.encode import encode_articles
    from training.text import Vocabulary

    vocab = Vocabulary.load(Path(args.model) / "vocab.json")
    max_tokens = json.loads((Path(args.model) / "checkpoint" / "meta.json").read_text())["train"][
        "max_tokens"
    ]
    manifest = Manifest.read(args.data)
    paths = [str(p) for s in splits for p in manifest.shard_paths(args.data, s)]
    table = read_table(paths, columns=["sentences", "metadata"])
    arts = [
        dict(zip(sources_of(dict(m or {})), s, strict=True))
        for s, m in zip(
            table.column("sentences").to_pylist(), table.column("metadata").to_pylist(), strict=True
        )
    ][:count]
    return encode_articles(net, vocab, max_tokens, arts).numpy()


def queries(db: Database, args, mode: str) -> np.ndarray:
    rng = np.random.default_rng([args.seed, {"noisy": 1, "random": 2, "articles": 3}[mode]])
    if mode == "articles":
        q = article_queries(args, db.net, args.queries)
    elif mode == "noisy":
        src = db.rows(rng.integers(0, db.n, args.queries))
        q = src + args.noise * rng.standard_normal(src.shape, dtype=np.float32) / np.sqrt(db.dim)
    else:
        q = rng.standard_normal((args.queries, db.dim), dtype=np.float32)
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


def oracle(db: Database, q: np.ndarray, k: int, path: Path | None) -> list[list[int]]:
    """The exact top k rows of every query over all N rows, chunk by chunk (a running top k:
    never more than a chunk of the database in memory); cached at ``path``."""
    if path and path.is_file():
        return json.loads(path.read_text())
    best_s = np.full((len(q), k), -np.inf, np.float32)
    best_r = np.full((len(q), k), -1, np.int64)
    for c in range(db.chunks()):
        s = q @ db.chunk(c).T
        top = np.argpartition(-s, min(k, s.shape[1] - 1), axis=1)[:, :k]
        all_s = np.concatenate([best_s, np.take_along_axis(s, top, 1)], 1)
        all_r = np.concatenate([best_r, top + c * DB_CHUNK], 1)
        keep = np.argsort(-all_s, axis=1, kind="stable")[:, :k]
        best_s, best_r = np.take_along_axis(all_s, keep, 1), np.take_along_axis(all_r, keep, 1)
    truth = best_r.tolist()
    if path:
        path.write_text(json.dumps(truth))
    return truth


def folder_mb(folder: Path) -> dict:
    files = {f.name: f.stat().st_size for f in folder.iterdir() if f.is_file()}
    out = {"total": round(sum(files.values()) / 2**20, 1)}
    for name in ("index.faiss", "index.refine.faiss", "vectors.f32"):
        if name in files:
            out[name] = round(files[name] / 2**20, 1)
    out["names"] = round(sum(v for k, v in files.items() if k.startswith(("ids.", "uris."))) / 2**20, 1)
    return out


def build(db: Database, args) -> tuple[dict, object]:
    """Build (or resume, or reuse) the index; its report and the built ArchiveIndex."""
    from archive.build import build_streamed

    key = {"n": db.n, "dim": db.dim, "seed": args.seed, "vectors": args.vectors, "db_chunk": DB_CHUNK}
    if args.vectors == "trained":
        key.update(model=str(Path(args.model).resolve()), mixture_k=args.mixture_k)
    t0, c0 = time.perf_counter(), time.process_time()

    def progress(p: dict) -> None:
        p.update(elapsed_s=round(time.perf_counter() - t0, 1), rss_mb=rss_mb())
        print(json.dumps({"checkpoint": p}), file=sys.stderr, flush=True)

    calibration = None  # random: the index's own vectors plus noise (its default)
    if args.vectors == "trained":  # the train split's articles (the measured ones: test, val)
        calibration = article_queries(args, db.net, 200, ("train",))
    index = build_streamed(
        db.source(),
        args.kind,
        {"bench": key, "run_id": "bench"},  # the run news_serving_latency.py --archive-env packages
        args.index_cache,
        train_size=args.train_size,
        expected=db.n,
        checkpoint_rows=args.checkpoint_rows,
        progress=progress,
        calibration_queries=calibration,
    )
    out = {"build_s": round(time.perf_counter() - t0, 1), "build_cpu_s": round(time.process_time() - c0, 1)}
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    out["kind"], out["images"] = index.kind, len(index)
    out["search"], out["calibration"] = index.search_settings, index.calibration
    if args.index_cache:
        out["disk_mb"] = folder_mb(Path(args.index_cache))
    return out, index


def settings_grid(index, args, calibrated: dict) -> list[tuple[str, dict]]:
    """(name, settings) of every combination swept; ivfpq: its own (calibrated) settings first."""
    if index.kind == "ivfpq":
        s = dict(calibrated)
        grid = [
            (f"calibrated nprobe={s['nprobe']} k_factor={s['k_factor']} exact_factor={s['exact_factor']}", s)
        ]
        probes = [int(v) for v in args.nprobe.split(",") if v]
        factors = [int(v) for v in args.k_factor.split(",") if v] or [s["k_factor"]]
        exact = [int(v) for v in args.exact_factor.split(",") if v] or [s["exact_factor"]]
        for p in probes:
            for kf in factors:
                for ef in exact:
                    name = f"nprobe={p} k_factor={kf} exact_factor={ef}"
                    grid.append((name, {"nprobe": p, "k_factor": kf, "exact_factor": ef}))
        return grid
    return [(f"breadth={b}", {"breadth": b}) for b in [int(b) for b in args.breadth.split(",") if b] or [0]]


def apply(index, settings: dict) -> None:
    if index.kind == "ivfpq":
        import faiss

        nlist = int(faiss.downcast_index(index.index.base_index).nlist)
        index.set_search(min(settings["nprobe"], nlist), settings["k_factor"], settings["exact_factor"])
    elif settings["breadth"]:
        if index.kind == "hnsw":
            index.index.hnsw.efSearch = settings["breadth"]
        elif index.kind == "pq":
            index.index.k_factor = settings["breadth"]
        else:
            index.index.nprobe = settings["breadth"]


def timed(index, q: np.ndarray, k: int) -> tuple[np.ndarray, list[list[int]]]:
    """(latency ms per query, hit rows per query), one query at a time."""
    lat, hits = [], []
    for row in q:
        t = time.perf_counter()
        _, got = index.search_rows(row[None], k)
        lat.append((time.perf_counter() - t) * 1000)
        hits.append(got[0])
    return np.asarray(lat), hits


def _share_worker(folder: str, mmap: bool, q: np.ndarray, conn) -> None:
    """A process that loads the index, runs the queries, reports, and waits to be measured."""
    import faiss

    from archive.index import ArchiveIndex

    faiss.omp_set_num_threads(1)
    before = rss_mb()
    index = ArchiveIndex.load(folder, mmap=mmap)
    for row in q:
        index.search_rows(row[None], 10)
    conn.send(before)
    conn.recv()  # measured: exit


def share_check(folder: str, mmap: bool, q: np.ndarray, processes: int) -> list[dict]:
    """``--share-check N``: N processes load the same index folder (memory-mapped or not) and
    search it; each one's ``/proc/PID/smaps_rollup`` while all are alive. A mapped file's
    pages count in every process's Rss, once in total across their Pss."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs, conns = [], []
    for _ in range(processes):
        here, there = ctx.Pipe()
        p = ctx.Process(target=_share_worker, args=(folder, mmap, q, there))
        p.start()
        procs.append(p)
        conns.append(here)
    before = [c.recv() for c in conns]
    out = [
        {"pid": p.pid, "rss_before_load_mb": b, **smaps_mb(p.pid)} for p, b in zip(procs, before, strict=True)
    ]
    for c in conns:
        c.send(1)
    for p in procs:
        p.join()
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=256, help="random vectors' dimension (trained: the model's)")
    ap.add_argument("--vectors", choices=("random", "trained"), default="random")
    ap.add_argument("--model", help="trained: the folder benchmarks/news_fusion.py --save-model wrote")
    ap.add_argument("--data", help="trained: the news dataset the model was trained on")
    ap.add_argument("--mixture-k", type=int, default=64)
    ap.add_argument("--kind", choices=("hnsw", "ivf", "pq", "ivfpq"), default="ivfpq")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--query-mode", default="", help="noisy, random, articles (comma-separated)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--noise", type=float, default=0.5, help="noisy query = vector + noise * N(0, I/D)")
    ap.add_argument("--threads", type=int, default=1, help="FAISS threads for the timed queries")
    ap.add_argument("--breadth", default="", help="hnsw efSearch / ivf nprobe / pq factor, comma-separated")
    ap.add_argument("--nprobe", default="", help="ivfpq cells probed, comma-separated (default: the index's)")
    ap.add_argument("--k-factor", default="", help="ivfpq 8-bit re-rank factor(s)")
    ap.add_argument("--exact-factor", default="", help="ivfpq float32 re-rank factor(s), 0: none")
    ap.add_argument("--mmap", action="store_true", help="load the index memory-mapped, as served")
    ap.add_argument("--index-cache", default=None, help="folder: build the index there, or reuse it")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--train-size", type=int, default=200_000)
    ap.add_argument("--checkpoint-rows", type=int, default=1_000_000)
    ap.add_argument(
        "--share-check",
        type=int,
        default=0,
        help="N processes load the index (--mmap or not) and search it: their smaps_rollup",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.vectors == "trained" and not (args.model and args.data):
        raise SystemExit("--vectors trained needs --model and --data")

    import faiss
    import torch

    from archive.index import ArchiveIndex

    cores = os.cpu_count() or 1
    faiss.omp_set_num_threads(cores)
    torch.set_num_threads(cores)
    db = Database(args)
    out = {"n": db.n, "dim": db.dim, "k": args.k, "vectors": args.vectors, "kind": args.kind}
    if db.mixture is not None:
        out["mixture"] = {"k": len(db.mixture.weights), "images": db.images}
    out["build"], index = build(db, args)
    out["load_avg_after_build"] = os.getloadavg()[0]
    if args.build_only:
        print(json.dumps(out))
        return out
    if args.index_cache:
        del index
        before = rss_mb()
        t0 = time.perf_counter()
        index = ArchiveIndex.load(args.index_cache, mmap=args.mmap)
        out["load"] = {
            "s": round(time.perf_counter() - t0, 2),
            "mmap": args.mmap,
            "rss_added_mb": round(rss_mb() - before, 1),
        }
    calibrated = dict(index.search_settings)  # as built: the sweep below changes them
    modes = (
        args.query_mode.split(",")
        if args.query_mode
        else (["articles", "noisy"] if db.net else ["noisy", "random"])
    )
    cache = Path(args.index_cache) if args.index_cache else None
    if args.share_check and args.index_cache:
        q = queries(db, args, modes[0])
        out["share_check"] = {"mmap": args.mmap, "queries_each": len(q)}
        out["share_check"]["processes"] = share_check(args.index_cache, args.mmap, q, args.share_check)
        print(json.dumps(out))
        return out
    for mode in modes:
        q = queries(db, args, mode)
        faiss.omp_set_num_threads(cores)
        t0 = time.perf_counter()
        name = f"oracle-{mode}-q{len(q)}-k{args.k}-noise{args.noise}.json"
        truth = oracle(db, q, args.k, cache / name if cache else None)
        out[mode] = {"oracle_s": round(time.perf_counter() - t0, 1)}
        faiss.omp_set_num_threads(args.threads)
        torch.set_num_threads(args.threads)
        for label, settings in settings_grid(index, args, calibrated):
            apply(index, settings)
            lat, hits = timed(index, q, args.k)
            recall = np.mean([len(set(a) & set(b)) / args.k for a, b in zip(hits, truth, strict=True)])
            out[mode][label] = {"recall_at_k_vs_exact": round(float(recall), 4), **pct(lat, 3)}
            print(json.dumps({mode: {label: out[mode][label]}}), file=sys.stderr, flush=True)
    if args.index_cache:
        out["load"]["rss_after_queries_mb"] = rss_mb()
    out["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    out["machine"] = {"cpus": cores, "python": platform.python_version(), "faiss": faiss.__version__}
    out["load_avg_end"] = os.getloadavg()[0]
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
