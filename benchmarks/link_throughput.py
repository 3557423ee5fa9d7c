"""Throughput of batch linking (`mmlinks link`, issue #16): the Beam job vs the bare model; JSON.

The shards are written directly (``write_shard``: Lite0-sized features), because building
thousands of documents through the CNN measures the build, not the link job. The model is a
seeded, untrained MulLink of ``mmlinks train``'s default shape, packaged and registered as a run
would be (its quality does not change its speed); ``--d-multi 256`` is the demo's: the job's own
per-document work is the same for any model, so the ratio is lowest for the cheapest one.

Medians of ``--repeats`` (each runs the bare loop, then the job, so both see the same neighbours):
- ``beam``: ``link_documents`` on all documents; the steady state is measured inside the run (in
  workers through an inherited ``sitecustomize`` hook) from the moment every worker has linked
  its first chunk, so imports, model loads and start-up are outside the window and reading,
  linking, writing and the commit inside it; ``difference_*`` cross-checks against a small run.
- ``bare``: the model loaded once, the same chunks scored (``score``) and scored + assigned
  (``score_assign``, the job's work per chunk).
- ``ratio_steady_vs_bare`` (against score + assign) and ``ratio_steady_vs_bare_score`` (the
  issue's words, "the bare model scoring the same documents": the stricter reading).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path
from statistics import median

import numpy as np

WORDS = "a the red blue green small big round square star circle moon kite shelf wood paint wall".split()


def write_dataset(out: Path, docs: int, seed: int, per_shard: int = 1000) -> Path:
    """Documents with random features straight into shards + manifest (no build)."""
    from schemas.document import SCHEMA_VERSION, Document, ImageRecord
    from schemas.manifest import FeatureExtractorInfo, Manifest, ShardInfo
    from schemas.shards import write_shard

    rng = np.random.default_rng(seed)
    shards, split_counts = [], {"train": 0, "val": 0, "test": 0}
    for start in range(0, docs, per_shard):
        batch = []
        for i in range(start, min(docs, start + per_shard)):
            n, m = int(rng.integers(3, 11)), int(rng.integers(5, 9))
            feats = np.maximum(rng.standard_normal((m, 1280)), 0).astype(np.float32)
            images = [
                ImageRecord(f"c{i}-{j}", f"u{i}-{j}", 64, 64, 0, f.tolist()) for j, f in enumerate(feats)
            ]
            sentences = [" ".join(rng.choice(WORDS, int(rng.integers(4, 12)))) for _ in range(n)]
            links = [(int(s), j) for j, s in enumerate(rng.integers(0, n, m)) if rng.random() < 0.5]
            batch.append(Document(f"doc-{i:06d}", "bench", "test", sentences, images, links))
        name = f"test-{start // per_shard:05d}-000.parquet"
        rows, size, sha = write_shard(out / "versions" / "v1" / name, sorted(batch, key=lambda d: d.doc_id))
        shards.append(ShardInfo(f"versions/v1/{name}", "test", rows, size, sha))
        split_counts["test"] += rows
    info = FeatureExtractorInfo("efficientnet-lite0", "bench", 1280)
    manifest = Manifest(
        SCHEMA_VERSION, f"bench-{docs}-{seed}", "bench", {"splits": split_counts}, info, shards
    )
    manifest.write(out)
    return out


def register(workdir: Path, data: Path, d_multi: int, word_dim: int, seed: int) -> tuple[str, dict]:
    """A seeded MulLink of `mmlinks train`'s default shape (``d_multi`` given) packaged and
    registered as `bench@production`; returns the URI and the model config."""
    import mlflow
    import torch
    from mlflow.tracking import MlflowClient

    from models.packaging import log_link_model
    from schemas.manifest import Manifest
    from training.backbone import build_model, get_backbone
    from training.config import TrainConfig
    from training.text import Vocabulary
    from training.tracking import configure, tracking_uri

    manifest = Manifest.read(data)
    vocab = Vocabulary.build(WORDS, min_count=1)
    torch.manual_seed(seed)
    train = TrainConfig(data=str(data), d_multi=d_multi)
    cfg = get_backbone(train.model_backbone).model_config(train, manifest, len(vocab), word_dim, [])
    model = build_model(cfg).eval()
    ckpt = workdir / "ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "epoch": 0, "val_loss": 0.0, "best_epoch": 0}, ckpt / "state.pt")
    (ckpt / "meta.json").write_text(json.dumps({"model": cfg, "train": {"max_tokens": train.max_tokens}}))
    uri = tracking_uri(workdir)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    mlflow.set_experiment(experiment_id=configure(uri, "bench"))
    with mlflow.start_run():
        mlflow.log_params(
            {"feature_extractor": "efficientnet-lite0@bench", "schema_version": str(manifest.schema_version)}
        )
        model_uri = log_link_model(str(ckpt), vocab)
    version = mlflow.register_model(model_uri, "bench").version
    MlflowClient(uri).set_registered_model_alias("bench", "production", version)
    return "models:/bench@production", {**cfg, "backbone": train.model_backbone}


def small_copy(data: Path, out: Path, docs: int) -> Path:
    """The first ``docs`` documents of ``data`` as a one-shard dataset (the start-up run)."""
    from schemas.manifest import Manifest, ShardInfo
    from schemas.shards import read_documents, write_shard

    manifest = Manifest.read(data)
    first = read_documents(manifest.shard_paths(data)[:1])[:docs]
    rows, size, sha = write_shard(out / "versions" / "v1" / "test-00000-000.parquet", first)
    manifest.shards = [ShardInfo("versions/v1/test-00000-000.parquet", "test", rows, size, sha)]
    manifest.dataset_version += "-small"
    manifest.write(out)
    return out


def cpu_s() -> float:
    """CPU seconds of this process and its reaped children (Beam's worker processes): on a shared
    machine, wall time measures the neighbours too."""
    return sum(
        r.ru_utime + r.ru_stime
        for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )


CHUNKS_DONE: list[tuple[float, float, int]] = []  # (wall, CPU, documents) as each chunk is linked
WORKER_LOG_ENV = "MMLINKS_BENCH_CHUNK_LOG"

# Loaded by every Python process started with the hook's folder first on PYTHONPATH (the job's
# worker processes): it times LinkChunk there, as time_chunks does in this process, appending
# "pid unix-time documents" per chunk to the file $MMLINKS_BENCH_CHUNK_LOG names (lines this
# short are written whole by O_APPEND). Nothing in mmlinks itself knows about it.
WORKER_HOOK = f"""
import os, time
if os.environ.get({WORKER_LOG_ENV!r}):
    from linking import steps as _steps
    _process = _steps.LinkChunk.process
    def _timed(self, result):
        yield from _process(self, result)
        with open(os.environ[{WORKER_LOG_ENV!r}], "a") as f:
            f.write(f"{{os.getpid()}} {{time.time()!r}} {{len(result.inference)}}\\n")
    _steps.LinkChunk.process = _timed
"""


def hook_workers(work: Path) -> Path:
    """Time the chunks in the job's worker processes (multi-process runs): a ``sitecustomize``
    module on the PYTHONPATH the workers inherit. Returns the log file each run clears."""
    hook = work / "worker-hook"
    hook.mkdir(parents=True, exist_ok=True)
    (hook / "sitecustomize.py").write_text(WORKER_HOOK)
    root = str(Path(__file__).resolve().parents[1])
    given = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(hook), root, *given])
    log = work / "worker-chunks.log"
    os.environ[WORKER_LOG_ENV] = str(log)
    return log


def worker_steady(log: Path, t0: float, t1: float) -> dict | None:
    """The steady state of a multi-process run from its workers' chunk times (unix seconds;
    ``t0``/``t1``: the run's start and return): from the moment *every* worker has linked its
    first chunk to the job's return, the documents linked after it over that time. Per
    CPU-second is not known per window here (the workers' CPU is only reaped at the end)."""
    if not log.exists():
        return None
    rows = [line.split() for line in log.read_text().splitlines() if line.strip()]
    chunks = sorted((float(t), pid, int(n)) for pid, t, n in rows)
    firsts: dict[str, float] = {}
    for t, pid, _ in chunks:
        firsts.setdefault(pid, t)
    start = max(firsts.values())
    rest = sum(n for t, _, n in chunks if t > start)
    if len(chunks) < 2 or rest == 0:
        return None
    rate = rest / (t1 - start)
    before = sum(n for t, _, n in chunks if t <= start)
    return {
        "chunks": len(chunks),
        "workers_seen": len(firsts),
        "steady_docs_per_s": rate,
        "steady_docs_per_cpu_s": None,
        "start_up_s": (start - t0) - before / rate,  # to every worker's first chunk, less their share
        "start_up_cpu_s": None,
        "after_last_chunk_s": t1 - chunks[-1][0],
    }


def time_chunks() -> None:
    """Record when each chunk leaves ``LinkChunk`` (the job's last per-chunk step), from inside
    the run. Only an in-process run (``--direct-workers 1``) executes the DoFn in this process;
    with worker processes the list stays empty and the in-run figures are null. One
    ``perf_counter`` per chunk: nothing the job would notice."""
    from linking.steps import LinkChunk

    process = LinkChunk.process

    def timed(self, result):
        yield from process(self, result)
        CHUNKS_DONE.append((time.perf_counter(), cpu_s(), len(result.inference)))

    LinkChunk.process = timed


def beam_run(data: Path, out: Path, model: str, workdir: Path, args, worker_log: Path | None = None) -> dict:
    """One ``link_documents`` run: its wall and CPU, and the in-run steady state (the module's
    docstring says which window)."""
    from linking.config import LinkConfig
    from linking.job import link_documents

    shutil.rmtree(out, ignore_errors=True)
    cfg = LinkConfig(
        model=model,
        out=str(out),
        data=str(data),
        batch_docs=args.batch_docs,
        direct_workers=args.direct_workers or None,
        workdir=str(workdir),
    )
    CHUNKS_DONE.clear()
    if worker_log is not None:
        worker_log.unlink(missing_ok=True)
    u0, t0, c0 = time.time(), time.perf_counter(), cpu_s()
    result = link_documents(cfg)
    u1, t1, c1 = time.time(), time.perf_counter(), cpu_s()
    run = {"wall_s": t1 - t0, "cpu_s": c1 - c0, "summary": result.summary(), "in_run": None}
    if worker_log is not None:
        run["in_run"] = worker_steady(worker_log, u0, u1)
    elif len(CHUNKS_DONE) > 1:
        (w_first, c_first, n_first), (w_last, _, _) = CHUNKS_DONE[0], CHUNKS_DONE[-1]
        rest = sum(n for *_, n in CHUNKS_DONE[1:])
        rate, rate_cpu = rest / (t1 - w_first), rest / max(c1 - c_first, 1e-9)
        run["in_run"] = {
            "chunks": len(CHUNKS_DONE),
            "steady_docs_per_s": rate,
            "steady_docs_per_cpu_s": rate_cpu,
            "start_up_s": (w_first - t0) - n_first / rate,  # to the first chunk, less its share
            "start_up_cpu_s": (c_first - c0) - n_first / rate_cpu,
            "after_last_chunk_s": t1 - w_last,  # writing the shards, committing (inside the window)
        }
    return run


def bare_setup(data: Path, model: str, workdir: Path, batch_docs: int, threads: int):
    """The bare side: the model loaded once, the same chunks read before any clock starts."""
    import torch

    from features.cpu_heap import tune_cpu_heap
    from linking.model import load_scorer, resolve_model
    from linking.steps import LINK_COLUMNS, documents_of_table, shard_tables
    from schemas.manifest import Manifest
    from training.tracking import tracking_uri

    trim = tune_cpu_heap()  # as the job's handler does in each worker, trimming after each chunk
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    scorer = load_scorer(resolve_model(model, tracking_uri(workdir)).load_uri, tracking_uri(workdir))
    load_s = time.perf_counter() - t0
    chunks = []
    for path in Manifest.read(data).shard_paths(data):
        with open(path, "rb") as fh:
            chunks += [documents_of_table(t, path.name) for t in shard_tables(fh, batch_docs, LINK_COLUMNS)]
    scorer.score(chunks[0])  # warm-up, as the job's steady state starts after its first chunk
    return scorer, chunks, load_s, trim


def bare_round(scorer, chunks: list[list[dict]], assign: bool, trim=None) -> tuple[float, float]:
    """(docs/s, docs per CPU-s) of one pass over the chunks in a loop: score, and with
    ``assign`` also the matching, then the heap trim (the work the job does per chunk)."""
    from linking.assign import assign_links, pad_scores

    n = sum(len(c) for c in chunks)
    t0, c0 = time.perf_counter(), cpu_s()
    for c in chunks:
        scores = scorer.score(c)
        if assign:
            padded, rows, cols = pad_scores(scores)
            assign_links(padded, rows, cols, "matching", float("-inf"))
        if trim is not None:
            trim()
    return n / (time.perf_counter() - t0), n / max(cpu_s() - c0, 1e-9)


def main() -> None:
    from schemas.config_fields import default_value
    from training.config import TrainConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=5000)
    ap.add_argument("--direct-workers", type=int, default=0, help="0: LinkConfig's default (one per core)")
    ap.add_argument("--batch-docs", type=int, default=64)
    ap.add_argument(
        "--d-multi",
        type=int,
        default=default_value(TrainConfig, "d_multi"),
        help="the model's joint width (default: `mmlinks train`'s; the demo trains 256)",
    )
    ap.add_argument(
        "--word-dim", type=int, default=50, help="word vector width (TrainConfig's glove: GloVe 6B 50-d)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="repetitions; medians are reported")
    ap.add_argument("--workdir", default="")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="mmlinks-link-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.perf_counter()
    data = write_dataset(work / "ds", args.docs, args.seed)
    gen_s = time.perf_counter() - t0
    model, model_cfg = register(work, data, args.d_multi, args.word_dim, args.seed)
    small_n = min(args.docs, 2 * args.batch_docs)
    small = small_copy(data, work / "ds-small", small_n)
    threads = os.cpu_count() or 1
    scorer, chunks, load_s, trim = bare_setup(data, model, work, args.batch_docs, threads)
    time_chunks()
    in_process = (args.direct_workers or os.cpu_count() or 1) == 1
    worker_log = None if in_process else hook_workers(work)
    reps = []
    for _ in range(args.repeats):  # interleaved, so both sides see the same neighbours
        score = bare_round(scorer, chunks, assign=False, trim=trim)
        score_assign = bare_round(scorer, chunks, assign=True, trim=trim)
        small_run = beam_run(small, work / "links-small", model, work, args, worker_log)
        full = beam_run(data, work / "links", model, work, args, worker_log)
        reps.append({"score": score, "score_assign": score_assign, "small": small_run, "full": full})
    out = report(args, reps, small_n, gen_s, load_s, threads)
    out["model"] = {k: model_cfg[k] for k in ("backbone", "d_multi", "word_dim", "text_pooling")}
    print(json.dumps(out, indent=1))


def report(args, reps: list[dict], small_n: int, gen_s: float, load_s: float, threads: int) -> dict:
    """Medians over the repetitions, plus each repetition's ratios."""
    summary = reps[-1]["full"]["summary"]
    n = summary["documents_linked"]
    bare = {"documents": n, "threads": threads, "model_load_s": round(load_s, 2)}
    for what in ("score", "score_assign"):
        bare[f"{what}_docs_per_s"] = round(median([r[what][0] for r in reps]), 1)
        bare[f"{what}_docs_per_cpu_s"] = round(median([r[what][1] for r in reps]), 1)
    # cross-check: the extra documents of the full run over its extra time against the small run
    diff = [(n - small_n) / max(r["full"]["wall_s"] - r["small"]["wall_s"], 1e-9) for r in reps]
    diff_cpu = [(n - small_n) / max(r["full"]["cpu_s"] - r["small"]["cpu_s"], 1e-9) for r in reps]
    beam = {
        "direct_workers": args.direct_workers or os.cpu_count(),
        "end_to_end_s": round(median([r["full"]["wall_s"] for r in reps]), 2),
        "end_to_end_cpu_s": round(median([r["full"]["cpu_s"] for r in reps]), 2),
        "small_run": {"documents": small_n, "wall_s": round(median([r["small"]["wall_s"] for r in reps]), 2)},
        "difference_steady_docs_per_s": round(median(diff), 1),
        "difference_steady_docs_per_cpu_s": round(median(diff_cpu), 1),
        "link_rate": summary["link_rate"],
    }
    beam["end_to_end_docs_per_s"] = round(n / beam["end_to_end_s"], 1)
    out = {
        "documents": n,
        "generate_dataset_s": round(gen_s, 1),
        "batch_docs": args.batch_docs,
        "repeats": len(reps),
        "cpus": os.cpu_count(),
        "beam": beam,
        "bare": bare,
        "ratio_difference_vs_bare": round(
            beam["difference_steady_docs_per_s"] / bare["score_assign_docs_per_s"], 3
        ),
    }
    in_run = [r["full"]["in_run"] for r in reps]
    if all(in_run):
        for k in (
            "steady_docs_per_s",
            "steady_docs_per_cpu_s",
            "start_up_s",
            "start_up_cpu_s",
            "after_last_chunk_s",
        ):
            values = [x[k] for x in in_run]
            digits = 2 if k.endswith("_s") and "docs" not in k else 1
            beam[f"in_run_{k}"] = None if None in values else round(median(values), digits)
        out["ratio_steady_vs_bare"] = round(
            beam["in_run_steady_docs_per_s"] / bare["score_assign_docs_per_s"], 3
        )
        cpu = beam["in_run_steady_docs_per_cpu_s"]
        out["ratio_steady_vs_bare_cpu"] = cpu and round(cpu / bare["score_assign_docs_per_cpu_s"], 3)
        out["ratio_per_repeat"] = [
            round(x["steady_docs_per_s"] / r["score_assign"][0], 3) for x, r in zip(in_run, reps, strict=True)
        ]
        out["ratio_steady_vs_bare_score"] = round(
            beam["in_run_steady_docs_per_s"] / bare["score_docs_per_s"], 3
        )
        out["ratio_steady_vs_bare_score_cpu"] = cpu and round(cpu / bare["score_docs_per_cpu_s"], 3)
        out["ratio_score_per_repeat"] = [
            round(x["steady_docs_per_s"] / r["score"][0], 3) for x, r in zip(in_run, reps, strict=True)
        ]
    return out


if __name__ == "__main__":
    main()
