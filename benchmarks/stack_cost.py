"""What the training stack costs (issue #63): ``mmlinks train`` against a bare PyTorch loop of the
same model, objective and batches in one process.

Rows (``--rows``): ``bare1`` / ``bare2``, a plain loop at 1 / 2 torch threads over the run's own
batches, vocabulary, word vectors and model config (``worker_loop_config``), so it differs from
the stack only by what the stack adds (Ray, per-step agreement, validation, checkpoints,
MLflow), its epoch split into data, forward (the assignment solver also alone), backward and
optimizer; ``w0`` / ``w1`` / ``w2``, ``mmlinks train --workers N`` with its own MLflow store
(``w0-1t``: one torch thread), each epoch from what the run logged, the rest of the wall time
being what is neither training nor validation. Epoch 0 is the warm-up; figures are medians of
the later epochs. The model side is fixed (``--image-centring``, default ``none``): ``auto``'s
candidate runs happen once, not per epoch. ``--device cuda``: bare rows on the GPU (no split),
``--gpu`` on the stack rows. Prints one JSON object; docs/benchmarks-scale.md holds the table::

    python benchmarks/stack_cost.py --docs 10000 --epochs 3 --rows bare1,bare2,w0,w1,w2
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROWS = ("bare1", "bare2", "w0", "w0-1t", "w1", "w2")
MMLINKS = [sys.executable, "-m", "cli"]


def make_corpus(out: Path, docs: int, seed: int) -> str:
    """A ``data synth-features`` corpus of ``docs`` training documents (10 % each val / test)."""
    if not (out / "manifest.json").exists():
        cmd = [*MMLINKS, "data", "synth-features", "--out", str(out), "--docs", str(docs)]
        cmd += ["--val-docs", str(max(docs // 10, 20)), "--test-docs", str(max(docs // 10, 20))]
        subprocess.run([*cmd, "--seed", str(seed), "--quiet"], check=True, stdout=subprocess.DEVNULL)
    return str(out)


def train_config(data: str, settings: dict):
    from training.config import TrainConfig

    return TrainConfig(data=data, **settings)


def steady(values: list[float]) -> float | None:
    """The median over the epochs after the first (the warm-up), or the only one."""
    later = values[1:] or values
    return round(statistics.median(later), 4) if later else None


class Timer:
    """Seconds summed per named part; ``sync`` runs before each reading (a GPU's queue)."""

    def __init__(self, sync=None):
        self.parts: dict[str, float] = {}
        self.sync = sync or (lambda: None)

    @contextlib.contextmanager
    def part(self, name: str):
        self.sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.parts[name] = self.parts.get(name, 0.0) + time.perf_counter() - t0


class InMemory:
    """The training split held in memory, handed over in chunks as a Ray Data shard does."""

    def __init__(self, table):
        self.table = table

    def iter_batches(self, batch_size: int, batch_format: str = "pyarrow", prefetch_batches: int = 0):
        for start in range(0, self.table.num_rows, batch_size):
            yield self.table.slice(start, batch_size)


def bare_loop(data: str, settings: dict, epochs: int, threads: int, device: str) -> dict:
    """The plain loop: the same inputs as the run, no stack around them."""
    import numpy as np
    import torch

    import training.link.similarity as similarity
    from schemas.shards import read_table
    from training.backbone import build_model, needs_regions
    from training.data import TRAINING_COLUMNS, make_batch
    from training.driver import check_inputs, worker_loop_config
    from training.epoch_batches import document_batches, drop_empty
    from training.objectives.registry import get_objective, objective_loss
    from training.text import Vocabulary

    inp = check_inputs(train_config(data, settings))
    cfg = inp.cfg
    loop_config, _ = worker_loop_config(inp, "bare")
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(threads)
    dev = torch.device(device)
    model = build_model(loop_config["model"], loop_config["embeddings"], loop_config["feature_stats"]).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    vocab, regions = Vocabulary(loop_config["vocab"]), needs_regions(loop_config["model"])
    spec = get_objective(cfg.objective)
    table, _ = drop_empty(read_table(inp.train_paths, columns=[*TRAINING_COLUMNS, *spec.columns]))
    split = dev.type == "cpu"  # a GPU's parts would need a synchronisation each
    timer = Timer()
    solve = similarity.solve_matchings

    def timed_solve(*a, **k):
        with timer.part("solver"):
            return solve(*a, **k)

    similarity.solve_matchings = timed_solve
    epochs_out = []
    try:
        for epoch in range(epochs):
            rng = np.random.default_rng([cfg.seed, epoch])
            gen = torch.Generator().manual_seed(cfg.seed + epoch)
            timer.parts.clear()
            model.train()
            docs, t0 = 0, time.perf_counter()
            # the run's own batches: its sampler (--batch-sampling; the default's near neighbours)
            # over the split in memory, cut as Ray Data or LocalShards hand it over
            batches = document_batches(
                InMemory(table), cfg.batch_docs, rng, cfg.batch_sampling, cfg.near_share
            )
            while True:
                with timer.part("data") if split else contextlib.nullcontext():
                    rows = next(batches, None)
                    if rows is None or rows.num_rows < 2:
                        break
                    if spec.prepare is not None:
                        rows = spec.prepare(rows, rng)
                    batch = make_batch(rows, vocab, cfg.max_tokens, rng, regions, cfg.max_regions)
                    if dev.type != "cpu":
                        batch.tokens, batch.features = batch.tokens.to(dev), batch.features.to(dev)
                with timer.part("forward") if split else contextlib.nullcontext():
                    loss, _ = objective_loss(model, batch, cfg, gen, spec, epoch=epoch)
                with timer.part("backward") if split else contextlib.nullcontext():
                    opt.zero_grad()
                    loss.backward()
                with timer.part("optimizer") if split else contextlib.nullcontext():
                    opt.step()
                docs += len(batch)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            row = {"epoch": epoch, "docs": docs, "seconds": round(seconds, 3), "docs_per_s": docs / seconds}
            if split:
                row["parts_s"] = {k: round(v, 3) for k, v in timer.parts.items()}
            epochs_out.append(row)
    finally:
        similarity.solve_matchings = solve
    return {
        "docs_per_s": steady([e["docs_per_s"] for e in epochs_out]),
        "epochs": epochs_out,
    }


def stack_row(
    data: str, settings: dict, epochs: int, workers: int, device: str, root: Path, threads: int | None = None
) -> dict:
    """``mmlinks train --workers N`` as a user runs it; per-epoch figures from its MLflow run."""
    from mlflow.tracking import MlflowClient

    from schemas.config_fields import options_of
    from schemas.shards import read_table
    from training.config import TrainConfig
    from training.driver import check_inputs

    train_paths = check_inputs(train_config(data, settings)).train_paths
    train_docs = read_table(train_paths, columns=["doc_id"]).num_rows
    work = root / f"w{workers}-{threads or 'auto'}t"
    work.mkdir(parents=True, exist_ok=True)
    cmd = [*MMLINKS, "train", "--data", data, "--workdir", str(work), "--json", "--workers", str(workers)]
    flags = {name: info.flag for name, (_, info) in options_of(TrainConfig).items()}
    for key, value in {**settings, "epochs": epochs}.items():
        flag = flags.get(key)
        if flag == "":
            raise SystemExit(f"{key} has no command-line flag: the stack rows cannot set it")
        cmd += [flag or "--" + key.replace("_", "-"), str(value)]
    if device == "cuda":
        cmd.append("--gpu")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "OMP_NUM_THREADS")}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode:
        tail = f"{proc.stdout[-500:]} {proc.stderr[-2000:]}"
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {tail}")
    result = json.loads(proc.stdout)
    client = MlflowClient(tracking_uri=result["tracking_uri"])

    def history(key: str) -> list:
        return sorted(client.get_metric_history(result["run_id"], key), key=lambda m: m.step)

    val_loss = history("val_loss")
    walls = [(b.timestamp - a.timestamp) / 1000 for a, b in itertools.pairwise(val_loss)]
    per = {k: [m.value for m in history(k)] for k in ("docs_per_s", "step_s", "data_wait_frac", "val_s")}
    docs_per_s, val_s = steady(per["docs_per_s"]), steady(per["val_s"])
    epoch_wall = round(statistics.median(walls), 3) if walls else None
    out = {
        "command": "mmlinks " + " ".join(cmd[3:]),
        "registered": f"{result.get('model_uri')} (version {result.get('model_version')})",
        "test_auc": (result.get("test") or {}).get("auc"),
        "train_docs": train_docs,
        "wall_s": round(wall, 1),
        "docs_per_s": docs_per_s,
        "step_s": steady(per["step_s"]),
        "data_wait_frac": steady(per["data_wait_frac"]),
        "val_s": val_s,
        "epoch_wall_s": epoch_wall,
        "per_epoch": per,
    }
    if train_docs and docs_per_s and epoch_wall and val_s is not None:
        out["rest_s"] = round(epoch_wall - train_docs / docs_per_s - val_s, 3)
    return out


def parts_of(row: dict) -> dict | None:
    """A bare row's steady split: the median of each part over the later epochs, in seconds."""
    epochs = row["epochs"][1:] or row["epochs"]
    if "parts_s" not in epochs[0]:
        return None
    names = epochs[0]["parts_s"]
    return {k: round(statistics.median(e["parts_s"].get(k, 0.0) for e in epochs), 3) for k in names}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", help="a built dataset (default: write one with synth-features)")
    ap.add_argument("--docs", type=int, default=10_000, help="training documents of the written corpus")
    ap.add_argument("--epochs", type=int, default=3, help="epochs per row; the first is the warm-up")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    ap.add_argument("--backbone", default="gru", help="gru (the default) or bag")
    ap.add_argument("--objective", default="ap")
    ap.add_argument("--image-centring", default="none", help="the fixed image side of every row")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="a TrainConfig field")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    unknown = set(rows) - set(ROWS)
    if unknown:
        ap.error(f"unknown rows {sorted(unknown)}; known: {', '.join(ROWS)}")
    settings = {"objective": args.objective, "backbone": args.backbone, "seed": args.seed}
    if args.backbone == "gru":
        settings["image_centring"] = args.image_centring
    for item in args.set:
        key, _, value = item.partition("=")
        settings[key] = json.loads(value)
    with tempfile.TemporaryDirectory(prefix="stack_cost_") as tmp:
        root = Path(tmp)
        data = args.data or make_corpus(root / "corpus", args.docs, args.seed)
        out: dict = {"settings": settings, "epochs": args.epochs, "device": args.device}
        out["cores"] = os.cpu_count()
        results = {}
        for row in rows:
            t0 = time.perf_counter()
            if row.startswith("bare"):
                threads = int(row[4:])
                results[row] = bare_loop(data, settings, args.epochs, threads, args.device)
                results[row]["parts_s"] = parts_of(results[row])
            else:
                try:
                    workers, _, threads = row[1:].partition("-")
                    results[row] = stack_row(
                        data, settings, args.epochs, int(workers), args.device, root, int(threads[:-1] or 0)
                    )
                except SystemExit as exc:  # the command failed: say so in its row, measure the rest
                    results[row] = {"error": str(exc)[-2000:], "docs_per_s": None}
            took = time.perf_counter() - t0
            print(f"{row}: {results[row]['docs_per_s']} docs/s ({took:.0f} s)", file=sys.stderr)
            print(json.dumps({row: results[row]}), file=sys.stderr)  # kept if a later row fails
        out["rows"] = results
        speed = {r: v["docs_per_s"] for r, v in results.items() if v["docs_per_s"]}
        bare = [v for r, v in speed.items() if r.startswith("bare")]
        stack = [v for r, v in speed.items() if r.startswith("w")]
        for stack_row_name in ("w1", "w0"):  # a failed row has no figure: no ratio, the rest kept
            if speed.get(stack_row_name) and speed.get("bare1"):
                out[f"{stack_row_name}_vs_bare1"] = round(speed[stack_row_name] / speed["bare1"], 3)
        if bare and stack:
            out["best_stack_vs_best_bare"] = round(max(stack) / max(bare), 3)
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return out


if __name__ == "__main__":
    main()
