"""News image selection through the served model (issue #18): the latency of one article query
(encode the text + search the archive index + HTTP) against an archive of N images.

A seeded random news model of ``--dim`` (speed does not depend on the weights), or with
``--trained DIR --data DS`` the one ``news_fusion.py --save-model`` kept, is packaged with
``log_news_model`` and an archive: ``--index-cache`` (an ``ArchiveIndex`` folder) or an exact
``flat`` index of ``--images`` random vectors; ``--archive-env`` serves a folder through
``MMLINKS_NEWS_ARCHIVE`` instead, as production serves the Dagster asset's. Timed one article at
a time, top 10: ``in_process`` (``pyfunc.load_model(...).predict``, the encoding alone, and recall
against exact search) and ``served`` (``mlflow models serve`` on loopback) unless ``--no-serve``;
``--workers N`` reports each server's Rss / Pss from ``smaps_rollup`` (a mapped archive counts
once in Pss); ``--evict`` starts cold, ``--as-served`` loads as the scoring server does.
Retired in issue #61: ``--floor``, ``--encoder-check``, ``--thread-sweep`` (commit d839ce0),
``--threads`` and ``--refine-factor`` (last at d0a6dcc). One JSON object on stdout::

    PYTHONPATH=. python benchmarks/news_serving_latency.py --index-cache /tmp/hnsw-1m-256 --queries 200
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
from _timing import pct, rss_mb, smaps_mb

MLFLOW = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or "mlflow"
LENGTHS = {"headline": 12, "lead": 40, "body": 400, "caption": 15}


def news_checkpoint(folder: Path, words: int, dim: int, max_tokens: int, seed: int):
    """A random news model's checkpoint folder and its vocabulary (``w0`` .. ``w{words-1}``)."""
    import torch

    from training.checkpoints import CHECKPOINT_FILE
    from training.news.model import NewsConfig, NewsRetrieval
    from training.text import Vocabulary

    vocab = Vocabulary(["<pad>", "<unk>", *(f"w{i}" for i in range(words))])
    torch.manual_seed(seed)
    cfg = NewsConfig(vocab_size=len(vocab.words), word_dim=300, image_dim=2048, d=dim, d_hidden=600)
    folder.mkdir(parents=True)
    net = NewsRetrieval(cfg).eval()
    torch.save(
        {"model": net.state_dict(), "epoch": 1, "val_loss": 0.0, "best_epoch": 1}, folder / CHECKPOINT_FILE
    )
    (folder / "meta.json").write_text(
        json.dumps({"model": cfg.to_dict(), "train": {"max_tokens": max_tokens}})
    )
    return folder, vocab


def archive(args):
    """The ArchiveIndex to package: the cached one, or a flat index of random vectors (16 of
    them with ``--archive-env``: the served archive is that folder)."""
    from archive.index import ArchiveIndex

    if args.index_cache:
        return ArchiveIndex.load(args.index_cache)
    n = 16 if args.archive_env else args.images
    x = np.random.default_rng(args.seed).standard_normal((n, args.dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return ArchiveIndex.build([str(i) for i in range(len(x))], x, kind="flat")


def dataset_articles(data: str, count: int) -> list[dict]:
    """The first ``count`` articles of a news dataset (test split first), with their language."""
    from schemas.manifest import Manifest
    from schemas.news import sources_of
    from schemas.shards import read_table

    manifest = Manifest.read(data)
    paths = [str(p) for s in ("test", "val", "train") for p in manifest.shard_paths(data, s)]
    table = read_table(paths, columns=["sentences", "metadata"])
    out = []
    for s, m in zip(table.column("sentences").to_pylist(), table.column("metadata").to_pylist(), strict=True):
        meta = dict(m or {})
        out.append({"language": meta.get("language", "en"), **dict(zip(sources_of(meta), s, strict=True))})
    return (out * (count // max(1, len(out)) + 1))[:count]


def articles(count: int, words: int, seed: int, data: str | None = None) -> list[dict]:
    if data:
        return dataset_articles(data, count)
    rng = np.random.default_rng([seed, 3])
    return [
        {
            "language": "en",
            **{s: " ".join(f"w{i}" for i in rng.integers(0, words, n)) for s, n in LENGTHS.items()},
        }
        for _ in range(count)
    ]


def evict(folder: str | None) -> None:
    """``--evict``: drop an archive folder's files from the page cache (``POSIX_FADV_DONTNEED``):
    the state a server starts from, or comes back to after a minute idle on a machine whose
    kernel pages out what was not touched (machine C's DAMON reclaim: 60 s)."""
    if not folder:
        return
    for f in Path(folder).iterdir():
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def in_process(model_path: Path, arts: list[dict], as_served: bool = False) -> dict:
    """``as_served``: the model loaded as ``mlflow models serve`` loads it (the scoring server's
    variable set: the GC frozen, a mapped archive held resident, ``serving.load_archive``)."""
    import mlflow
    import pandas as pd

    from models.news_threads import SCORING_SERVER_ENV, serving_threads
    from training.news.encode import encode_article

    before = rss_mb(os.getpid())
    t0 = time.perf_counter()
    if as_served:
        os.environ[SCORING_SERVER_ENV] = str(model_path)
    try:
        loaded = mlflow.pyfunc.load_model(str(model_path))
    finally:
        os.environ.pop(SCORING_SERVER_ENV, None)
    load_s = time.perf_counter() - t0
    loaded_rss = rss_mb(os.getpid())
    model = loaded.unwrap_python_model()
    predict, encode = [], []
    for a in arts:
        t = time.perf_counter()
        out = loaded.predict(pd.DataFrame([a]), params={"top_k": 10})
        predict.append((time.perf_counter() - t) * 1000)
        assert len(out["image_ids"][0]) == 10
        with serving_threads(model.threads):  # as predict encodes
            t = time.perf_counter()
            encode_article(model.model, model.vocab, model.max_tokens, a)
            encode.append((time.perf_counter() - t) * 1000)
    out = {"load_s": round(load_s, 1), "as_served": as_served, "predict": pct(predict)}
    out.update(encode_only=pct(encode), held_resident=getattr(model.archive, "resident", None))
    out["rss_mb"] = {"before_load": before, "after_load": loaded_rss, "after_queries": rss_mb(os.getpid())}
    return out | {"recall_at_10": served_recall(model, arts)}


def exact_top(archive, q: np.ndarray, k: int) -> list[list[int]]:
    """The exact top k live rows: an ivfpq archive's own ``exact_search_rows`` (one pass over
    its float32 vectors, a block at a time, withdrawn rows skipped); else the index's vectors."""
    if getattr(archive, "exact", None) is not None:
        return archive.exact_search_rows(q, k)
    return archive_exact_small(archive, q, k)


def archive_exact_small(archive, q: np.ndarray, k: int) -> list[list[int]]:
    """Exact search over an index that keeps its vectors in FAISS (flat, hnsw, pq's refine)."""
    import faiss

    index = archive.index
    exact = faiss.downcast_index(index.refine_index) if hasattr(index, "refine_index") else index
    return [row.tolist() for row in exact.search(q, k)[1]]


def served_recall(model, arts: list[dict]) -> dict:
    """Recall@10 of the packaged index, as the model searches it, against exact search over
    the same archive vectors, for this run's articles (the served queries): what the index's
    re-rank factor gives up. The exact oracle is the ``pq`` index's own full vectors (its
    re-rank store), an ``ivfpq`` folder's float32 vectors, or the index itself when exact."""
    from training.news.encode import encode_article

    q = np.concatenate([encode_article(model.model, model.vocab, model.max_tokens, a).numpy() for a in arts])
    got = model.archive.search_rows(q, 10)[1]
    want = exact_top(model.archive, q, 10)
    hits = [len(set(g) & set(w)) / 10 for g, w in zip(got, want, strict=True)]
    out = {"recall": round(float(np.mean(hits)), 4), "refine_factor": model.archive.refine_factor}
    return out | {
        "kind": model.archive.kind,
        "images": len(model.archive),
        "search": model.archive.search_settings,
    }


def served(model_path: Path, arts: list[dict], log: Path, workers: int = 1) -> dict:
    """p50/p99 of one POST per article to ``mlflow models serve`` (``workers`` workers) on
    loopback, and the resident memory of every server process afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = [MLFLOW, "models", "serve", "-m", str(model_path), "--env-manager", "local"]
    cmd += ["-h", "127.0.0.1", "-p", str(port), "-w", str(workers)]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        t0 = time.perf_counter()
        while True:
            if proc.poll() is not None or time.perf_counter() - t0 > 600:
                raise SystemExit(f"mlflow models serve did not start:\n{log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{base}/ping", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(1)
        start_s = time.perf_counter() - t0
        lat = []
        for a in arts:
            body = json.dumps({"dataframe_records": [a], "params": {"top_k": 10}}).encode()
            req = urllib.request.Request(f"{base}/invocations", body, {"Content-Type": "application/json"})
            t = time.perf_counter()
            with urllib.request.urlopen(req, timeout=60) as resp:
                got = json.loads(resp.read())
            lat.append((time.perf_counter() - t) * 1000)
            pred = got["predictions"][0]
            assert len(pred["image_ids"]) == 10, pred
        return {"start_s": round(start_s, 1), "request": pct(lat), "memory": server_memory(proc.pid)}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def server_memory(root: int) -> list[dict]:
    """``smaps_mb`` of the server process and its descendants."""
    pids, out = [root], []
    while pids:
        pid = pids.pop()
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                pids += [int(c) for c in (task / "children").read_text().split()]
            out.append({"pid": pid, **smaps_mb(pid)})
        except OSError:
            continue
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=1_000_000, help="archive size without --index-cache")
    ap.add_argument("--dim", type=int, default=256, help="the model's shared dimension")
    ap.add_argument("--index-cache", default=None, help="an ArchiveIndex folder to package")
    ap.add_argument(
        "--archive-env",
        default=None,
        help="an ArchiveIndex folder (info run_id 'bench') served through MMLINKS_NEWS_ARCHIVE, not copied",
    )
    ap.add_argument("--trained", default=None, help="a news_fusion.py --save-model folder: serve it")
    ap.add_argument("--data", default=None, help="with --trained: the dataset whose articles are the queries")
    ap.add_argument("--workers", type=int, default=1, help="mlflow models serve -w")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--vocab", type=int, default=50_000)
    ap.add_argument("--max-tokens", type=int, default=100)
    ap.add_argument("--workdir", default=None, help="where the model folder goes (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the model folder (reuse it with --model)")
    ap.add_argument("--model", default=None, help="a model folder this script packaged before")
    ap.add_argument("--no-serve", action="store_true")
    ap.add_argument(
        "--as-served",
        action="store_true",
        help="in process: load the model as mlflow models serve does (GC frozen, mapped archive held)",
    )
    ap.add_argument(
        "--evict",
        action="store_true",
        help="drop the --archive-env folder from the page cache before the in-process load and before "
        "the server starts (a cold server)",
    )
    ap.add_argument("--package-only", action="store_true", help="package into --workdir and stop")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    work = Path(args.workdir or tempfile.mkdtemp(prefix="news-serve-"))
    out: dict = {"queries": args.queries, "max_tokens": args.max_tokens}
    try:
        model_path = Path(args.model) if args.model else package(args, work, out)
        if args.package_only:
            args.keep = True
            print(json.dumps(out))
            return out
        arts = articles(args.queries, args.vocab, args.seed, args.data)
        if args.archive_env:
            from models.news_serving import ARCHIVE_ENV

            os.environ[ARCHIVE_ENV] = str(Path(args.archive_env).resolve())  # also the server's
            out["archive_env"] = os.environ[ARCHIVE_ENV]
        if args.evict:
            evict(args.archive_env)
        out["in_process"] = in_process(model_path, arts, args.as_served)
        if not args.no_serve:
            if args.evict:
                evict(args.archive_env)
            out["served"] = served(model_path, arts, work / "server.log", workers=args.workers)
    finally:
        if not args.keep and not args.model:
            shutil.rmtree(work, ignore_errors=True)
    return finish(out)


def finish(out: dict) -> dict:
    out["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    out["load_avg_end"] = os.getloadavg()[0]
    print(json.dumps(out))
    return out


def package(args, work: Path, out: dict) -> Path:
    from models.news_packaging import log_news_model
    from models.news_threads import SERVE_THREADS

    t0 = time.perf_counter()
    index = archive(args)
    out["archive"] = {"images": len(index), "kind": index.kind, "dim": index.dim}
    out["archive"]["refine_factor"] = index.refine_factor
    out["archive"]["load_or_build_s"] = round(time.perf_counter() - t0, 1)
    languages = ["en"]
    if args.trained:
        from models.news_packaging import train_languages
        from schemas.manifest import Manifest
        from training.text import Vocabulary

        ckpt, vocab = Path(args.trained) / "checkpoint", Vocabulary.load(Path(args.trained) / "vocab.json")
        languages = train_languages(
            [str(p) for p in Manifest.read(args.data).shard_paths(args.data, "train")]
        )
    else:
        ckpt, vocab = news_checkpoint(work / "ckpt", args.vocab, index.dim, args.max_tokens, args.seed)
    t0 = time.perf_counter()
    out["threads"] = SERVE_THREADS
    path = Path(log_news_model(str(ckpt), vocab, index, languages, "bench", work / "model", SERVE_THREADS))
    out["package_s"] = round(time.perf_counter() - t0, 1)
    out["model_mb"] = round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20)
    out["model"] = str(path)
    return path


if __name__ == "__main__":
    main()
