"""Linking across a family of corpora (issue #44): the default model beside the simplest one.

Per grid cell: a feature-level corpus (``mmlinks data synth-features``), its training split's
image ratio, and every row trained through ``mmlinks train --workers 0``'s path
(``run_experiment``) for each seed. Prints one JSON object: per cell its ratio and residual, per
row test AUC / p@1 per seed and their means (the default row also its pick and each candidate's
score, issue #60), and the default's margin over the baseline; docs/benchmarks-linking.md holds
the tables and commands. Cells are ``SHARING:K:MIXING:STRENGTH[:TOPIC_WORDS[:TOPIC_SKEW]][:KEY=VALUE...]``
(e.g. ``topic:40:added:4.1:looks=3:images=2-3``); rows are names from ROWS or ``NAME=JSON``.

    python benchmarks/link_family.py --grid issue --rows default,bag --seeds 0,1 --jobs 3
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import multiprocessing
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The demo's width and rate, 10 epochs: the issue's setting. Every other field is TrainConfig's.
BASE = dict(epochs=10, d_multi=256, lr=1e-3, num_workers=0)
# The simplest model as the issue's reference trains it: hard negatives from the first step, the
# last epoch kept.
BAG = {"backbone": "bag", "negatives_warmup": 0, "select_by": "last"}
ROWS: dict[str, dict] = {
    "default": {},
    "bag": BAG,
    "bag-glove": {**BAG, "word_vectors": "glove"},
    "bag-random": {**BAG, "word_vectors": "random"},
    # the default's image-side candidates trained in full (issue #60; training/link/image_side.py)
    "none": {"image_centring": "none", "image_dropout": 0},
    "balanced": {"image_centring": "balanced", "image_mean_weight": 1, "image_dropout": 0},
    "balanced+dropout": {"image_centring": "balanced", "image_mean_weight": 1, "image_dropout": 0.4},
    "none+dropout": {"image_centring": "none", "image_dropout": 0.4},
}
# strength -> image ratio on 600 training documents (K 40): added ~0.25 + 1.2 s^2; clipped lower
STRENGTHS = {"added": {3: 1.55, 10: 2.85, 20: 4.1}, "clipped": {3: 1.9, 10: 3.6, 20: 5.0}}


def issue_grid() -> list[str]:
    cells = [
        f"topic:{k}:{mix}:{STRENGTHS[mix][r]}"
        for k in (10, 40, 200)
        for mix in ("added", "clipped")
        for r in (3, 10, 20)
    ]
    return [*cells, "document:40:added:4.1", "document:40:clipped:5.0", "none:40:added:0"]


# A cell's optional KEY=VALUE parts (issue #60's structures), e.g. ``topic:15:added:4.1:images=2-3``.
CELL_KEYS = {
    "looks": "looks_per_topic",
    "share": "look_share",
    "noise": "feature_noise",
    "extra": "extra_sentences",
    "unlinked": "extra_images",
}


def parse_cell(cell: str) -> dict:
    """``SHARING:K:MIXING:STRENGTH[:TOPIC_WORDS[:TOPIC_SKEW]][:KEY=VALUE...]`` -> corpus options;
    keys: ``images=A-B`` (images per document), ``looks=L``, ``share=F``, ``noise=S``, ``extra=N``
    (distractor sentences a document: no image, no link), ``unlinked=N`` (distractor images a
    document: a digit no sentence names)."""
    keyed = [p for p in cell.split(":") if "=" in p]
    parts = [p for p in cell.split(":") if "=" not in p]
    if len(parts) not in (4, 5, 6):
        raise SystemExit(
            f"bad cell {cell!r}: SHARING:K:MIXING:STRENGTH[:TOPIC_WORDS[:TOPIC_SKEW]][:KEY=VALUE]"
        )
    try:  # a number that is not one ends in the cell's one line, not a traceback
        out = {"look_sharing": parts[0], "topics": int(parts[1]), "look_mixing": parts[2]}
        out["look_strength"] = float(parts[3])
        if len(parts) >= 5:
            out["topic_words"] = int(parts[4])
        if len(parts) == 6:
            out["topic_skew"] = float(parts[5])
        for item in keyed:
            key, _, value = item.partition("=")
            if key == "images":
                low, _, high = value.partition("-")
                out["images_min"], out["images_max"] = int(low), int(high or low)
            elif key in CELL_KEYS:
                out[CELL_KEYS[key]] = int(value) if key in ("looks", "extra", "unlinked") else float(value)
            else:
                raise SystemExit(f"bad cell {cell!r}: unknown key {key!r} (images, {', '.join(CELL_KEYS)})")
    except ValueError as exc:
        raise SystemExit(f"bad cell {cell!r}: {exc}") from None
    return out


def make_corpus(root: Path, cell: str, sizes: dict, seed: int) -> tuple[str, dict]:
    """(the cell's corpus folder, written once per size and seed; its training split's figures:
    image ratio and residual ratio)."""
    from pipelines.confounds import RESIDUAL_SAMPLE, image_ratio, residual_ratio
    from pipelines.feature_corpus import FeatureCorpusConfig, write_feature_corpus
    from schemas.manifest import Manifest
    from schemas.shards import read_documents

    folder = root / f"{cell.replace(':', '_')}-s{seed}-{sizes['docs']}-d{sizes['dim']}"
    if sizes != corpus_sizes(sizes["docs"], sizes["dim"]):  # other splits: a corpus of their own
        folder = folder.with_name(f"{folder.name}-v{sizes['val_docs']}-t{sizes['test_docs']}")
    if not (folder / "manifest.json").exists():
        write_feature_corpus(folder, FeatureCorpusConfig(**parse_cell(cell), **sizes, seed=seed))
    train = [str(p) for p in Manifest.read(folder).shard_paths(folder, "train")]
    docs = read_documents(train)[:RESIDUAL_SAMPLE]
    feats = [[im.features for im in d.images] for d in docs]
    ratio = image_ratio(feats)[0]
    residual = residual_ratio(feats) if ratio is not None and ratio >= 5 else None
    figures = {
        "ratio": round(ratio, 2) if ratio is not None else None,
        "residual": round(residual, 2) if residual is not None else None,
    }
    return str(folder), figures


def test_links(data: str) -> dict[str, list | None]:
    """{doc_id: its (sentence, image) links, None where unlabelled} of the test split."""
    from schemas.manifest import Manifest
    from schemas.shards import iter_tables

    links: dict[str, list | None] = {}
    for table in iter_tables(Manifest.read(data).shard_paths(data, "test"), 256, ["doc_id", "links"]):
        for doc_id, pairs in zip(table.column("doc_id").to_pylist(), table.column("links").to_pylist()):
            links[doc_id] = None if pairs is None else [(p["sentence"], p["image"]) for p in pairs]
    return links


def image_centred_auc(predictions: list[dict], links: dict[str, list | None]) -> float:
    """AUC (macro, x100) once each image's mean score over its document's sentences is taken off:
    where it stands far above the run's AUC, per-image offsets (an image scoring high with every
    sentence, e.g. one no sentence names) cost the AUC, not the links inside the document. A
    diagnostic: no model scores this way. ``predictions``: ``evaluate``'s, in any order."""
    import numpy as np

    from training.metrics import document_metrics, summarize

    per_doc = []
    for row in predictions:
        scores = np.asarray(row["scores"], dtype=np.float64)
        centred = scores - scores.mean(0, keepdims=True)
        metrics = document_metrics(row["doc_id"], centred, links[row["doc_id"]])
        if metrics is not None:
            per_doc.append(metrics)
    return summarize(per_doc)["auc"]


def run_one(data: str, settings: dict, loop: str = "experiment") -> dict:
    """Train one row on one corpus and score it on the test split. ``loop``: ``experiment`` is
    ``mmlinks train --workers 0`` (``run_experiment``: MLflow run, registry, report); ``fit`` is
    the same training and checkpoint choice (``fit``) and test scoring (``evaluate``) without
    MLflow, for a machine that has none (the GPU image; ``settings`` with ``use_gpu`` trains on
    this process's GPU), and scores the validation split too (``val_auc``, ``val_p_at_1``: where
    validation and test disagree, the choice read the one and the table the other)."""
    from training.config import TrainConfig

    cfg = TrainConfig(data=data, **settings)
    t0 = time.perf_counter()
    if loop == "fit":
        _ray_stand_in()
        from training.driver import fit
        from training.evaluate import evaluate

        with tempfile.TemporaryDirectory(prefix="link-family-") as wd:
            result = fit(dataclasses.replace(cfg, storage_path=wd))
            scored, val = (
                evaluate(result.model, result.vocab, cfg.data, split, cfg.max_tokens, seed=cfg.seed)
                for split in ("test", "val")
            )
            test, val = scored["model"], val["model"]
        fit_figures = {
            "val_auc": round(val["auc"], 1),
            "val_p_at_1": round(val["p_at_1"], 1),
            "auc_image_centred": round(image_centred_auc(scored["predictions"], test_links(cfg.data)), 1),
        }
        best_epoch = result.best_epoch
        choice = result.choice.to_dict() if result.choice is not None else None
    else:
        from models.experiment import run_experiment

        with tempfile.TemporaryDirectory(prefix="link-family-") as wd:
            r = run_experiment(cfg, f"sqlite:///{wd}/mlflow.db", None, None, report_dir=wd)
        test, best_epoch, choice, fit_figures = r.test, r.best_epoch, r.choice, {}
    return {
        "auc": round(test["auc"], 1),
        "p_at_1": round(test["p_at_1"], 1),
        **fit_figures,
        "best_epoch": best_epoch,
        "seconds": round(time.perf_counter() - t0, 1),
        "device": "cuda" if settings.get("use_gpu") else "cpu",
        **(
            {
                "choice": choice["name"],
                "scores": choice["scores"],
                "finalists": choice.get("finalists") or {},
                "trial_epochs": choice["trial_epochs"],
                "trial_is_run": bool(choice.get("trial_kept")),
            }
            if choice
            else {}
        ),
    }


def _ray_stand_in() -> None:
    """Where Ray is not installed (the GPU image has none, and its wheel is over what a device
    call may carry), the two Ray names an in-process run touches: ``ray.data`` (imported, unused
    with ``--workers 0``) and ``ray.train.Checkpoint`` (a folder). Not a mock of Ray's behaviour:
    no Ray code runs in an in-process run."""
    try:
        import ray.train

        return
    except ImportError:
        pass
    import types

    class Checkpoint:
        def __init__(self, path: str):
            self.path = path

        @classmethod
        def from_directory(cls, path: str) -> Checkpoint:
            return cls(path)

        @contextlib.contextmanager
        def as_directory(self):
            yield self.path

    ray = types.ModuleType("ray")
    ray.data, ray.train = types.ModuleType("ray.data"), types.ModuleType("ray.train")
    ray.train.Checkpoint = Checkpoint
    sys.modules.update({"ray": ray, "ray.data": ray.data, "ray.train": ray.train})


def run_key(sizes: dict, run: dict) -> str:
    """What makes two runs the same run (corpus sizes, every setting but the device: a GPU run
    is the CPU run's configuration, its arithmetic differing in rounding only), as a short
    digest: ``--jsonl`` reuses only a run of this key."""
    same = {"sizes": sizes, "run": {k: v for k, v in sorted(run.items()) if k != "use_gpu"}}
    return hashlib.sha256(json.dumps(same, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _job(args: tuple) -> tuple:
    cell, row, seed, data, settings, loop = args
    import logging

    logging.disable(logging.WARNING)
    return cell, row, seed, run_one(data, settings, loop)


def _corpus_job(args: tuple) -> tuple:
    root, cell, sizes, seed = args
    return cell, seed, make_corpus(root, cell, sizes, seed)


def corpus_sizes(docs: int, dim: int, val_docs: int | None = None, test_docs: int | None = None) -> dict:
    """A family corpus's sizes: ``docs`` training documents; validation and test ``val_docs`` and
    ``test_docs``, by default a tenth (>= 50) each."""
    tenth = max(50, docs // 10)
    return {"docs": docs, "val_docs": val_docs or tenth, "test_docs": test_docs or tenth, "dim": dim}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grid", choices=("issue",), help="a named grid of cells")
    p.add_argument("--cells", default="", help="comma-separated SHARING:K:MIXING:STRENGTH[:WORDS[:SKEW]]")
    p.add_argument("--rows", default="default,bag", help="comma-separated row names or NAME=JSON")
    p.add_argument("--seeds", default="0,1", help="seeds: corpus and training (one corpus per seed)")
    p.add_argument("--docs", type=int, default=3000, help="training documents")
    p.add_argument("--val-docs", type=int, help="validation documents (default: a tenth of --docs, >= 50)")
    p.add_argument("--test-docs", type=int, help="test documents (default: a tenth of --docs, >= 50)")
    p.add_argument("--dim", type=int, default=256, help="feature width of the corpora")
    p.add_argument("--corpora", default="/tmp/mmlinks-link-family", help="folder caching the corpora")
    p.add_argument("--jobs", type=int, default=1, help="training runs in parallel (processes)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a BASE field")
    p.add_argument(
        "--jsonl",
        help="append each run's result to this file as it finishes; runs already in it are not run again",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: every row on the GPU here")
    p.add_argument(
        "--loop",
        choices=("experiment", "fit"),
        default="experiment",
        help="experiment: mmlinks train's path (MLflow); fit: the same training and scoring without MLflow",
    )
    p.add_argument("--markdown", action="store_true", help="also print the docs' table (stderr)")
    args = p.parse_args(argv)
    for item in args.set:
        field, _, value = item.partition("=")
        try:
            BASE[field] = json.loads(value)
        except json.JSONDecodeError:
            BASE[field] = value
    if args.jobs > 1 and "threads_per_worker" not in BASE:  # the cores shared out between the runs
        from training.cores import usable_cores

        BASE["threads_per_worker"] = max(1, usable_cores() // args.jobs)
    cells = (issue_grid() if args.grid else []) + [c for c in args.cells.split(",") if c]
    if not cells:
        p.error("no cell: name one with --cells or --grid")
    rows: dict[str, dict] = {}
    for r in re.split(r",(?![^{]*})", args.rows):  # commas inside a JSON object stay
        name, _, js = r.partition("=")
        rows[name] = json.loads(js) if js else ROWS[name]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    for name in ("val_docs", "test_docs"):
        if getattr(args, name) is not None and getattr(args, name) < 2:
            p.error(f"--{name.replace('_', '-')} must be >= 2")
    sizes = corpus_sizes(args.docs, args.dim, args.val_docs, args.test_docs)
    root = Path(args.corpora)
    root.mkdir(parents=True, exist_ok=True)
    out: dict = {"base": BASE, "rows": rows, "seeds": seeds, "sizes": sizes, "cells": {}}
    done = {}
    if args.jsonl and Path(args.jsonl).exists():  # a rerun goes on where the last one stopped
        for line in Path(args.jsonl).read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError, AttributeError):  # a line cut short
                rec = json.loads(line)
                done[rec.pop("cell"), rec.pop("row"), rec.pop("seed"), rec.pop("same_as")] = rec
    cells = list(dict.fromkeys(cells))  # a cell named twice is one corpus, written once
    pairs = [(cell, seed) for seed in seeds for cell in cells]
    for cell in cells:
        out["cells"][cell] = {"ratio": {}, "residual": {}, "rows": {r: {} for r in rows}}
    # spawn, not fork: a CUDA process cannot fork; the workers get BASE with each job
    ctx = multiprocessing.get_context("spawn" if args.device == "cuda" else None)
    pool = ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx) if args.jobs > 1 else None
    with pool or contextlib.nullcontext():
        corpus_jobs = [(root, cell, sizes, seed) for cell, seed in pairs]
        for cell, seed, (data, figures) in (pool.map if pool else map)(_corpus_job, corpus_jobs):
            for key, value in figures.items():
                out["cells"][cell][key][seed] = value
            out["cells"][cell].setdefault("data", {})[seed] = data
        settings = {**BASE, **({"use_gpu": True} if args.device == "cuda" else {})}
        jobs, same_as = [], {}
        for cell, seed in pairs:  # seed by seed: a run cut short has whole seeds
            for r in rows:
                run = {**settings, "seed": seed, **rows[r]}
                same_as[cell, r, seed] = run_key(sizes, run)
                if (cell, r, seed, same_as[cell, r, seed]) in done:
                    out["cells"][cell]["rows"][r][seed] = done[cell, r, seed, same_as[cell, r, seed]]
                    continue
                jobs.append((cell, r, seed, out["cells"][cell]["data"][seed], run, args.loop))
        for cell, row, seed, res in completed(pool, _job, jobs):
            out["cells"][cell]["rows"][row][seed] = res
            if args.jsonl:
                rec = {"cell": cell, "row": row, "seed": seed, "same_as": same_as[cell, row, seed], **res}
                with open(args.jsonl, "a") as f:
                    f.write(json.dumps(rec) + "\n")
            print(f"{cell} {row} seed {seed}: {res}", file=sys.stderr, flush=True)
    for entry in out["cells"].values():
        entry.pop("data", None)
        for runs in entry["rows"].values():
            for key in ("auc", "p_at_1"):
                runs[f"mean_{key}"] = round(
                    statistics.mean(r[key] for r in runs.values() if isinstance(r, dict)), 1
                )
        entry["rank_correlation"] = rank_correlation(entry["rows"], seeds)
        if "default" in entry["rows"] and "bag" in entry["rows"]:
            entry["default_minus_bag"] = round(
                entry["rows"]["default"]["mean_auc"] - entry["rows"]["bag"]["mean_auc"], 1
            )
    print(json.dumps(out, indent=1))
    if args.markdown:
        print(markdown_table(out), file=sys.stderr)
    return out


def rank_correlation(rows: dict, seeds: list[int]) -> dict:
    """Per seed, Spearman's rho between the default's criterion for each image-side candidate (its
    measured scores) and that candidate's test AUC trained in full (a row of the candidate's name);
    only where every candidate has both."""
    from scipy.stats import spearmanr

    out = {}
    for seed in seeds:
        scores = rows.get("default", {}).get(seed, {}).get("scores") or {}
        pairs = [
            (v, rows[k][seed]["auc"]) for k, v in scores.items() if v is not None and seed in rows.get(k, {})
        ]
        if scores and len(pairs) == len(scores) >= 3:
            out[seed] = round(float(spearmanr(*zip(*pairs, strict=True)).statistic), 2)
    return out


def completed(pool: Executor | None, fn, jobs: list):
    """``fn`` of each job, as each finishes (in this process where there is no pool): a run that
    is killed keeps, in its ``--jsonl``, every run that finished, not only those ahead of the
    slowest in submission order (``pool.map``)."""
    if pool is None:
        yield from map(fn, jobs)
        return
    futures = [pool.submit(fn, job) for job in jobs]
    try:
        for future in as_completed(futures):
            yield future.result()
    finally:  # a failed run or Ctrl-C: the queued runs are dropped, not waited for (as pool.map does)
        for future in futures:
            future.cancel()


def markdown_table(out: dict) -> str:
    """The grid as docs/benchmarks-linking.md shows it: per cell the training ratio and residual (means
    over seeds; "-" where there is none), the image side the default measured (each seed's, once
    where they agree), each row's test AUC / p@1 per seed,
    and the default's margin over the bag on the seeds' means."""
    rows, seeds = list(out["rows"]), out["seeds"]
    head = ["cell", "train ratio", "residual", "measured pick", *rows]
    if "default" in rows and "bag" in rows:
        head.append("default - bag (mean)")
    ranked = any(entry.get("rank_correlation") for entry in out["cells"].values())
    if ranked:
        head.append("rho (criterion, AUC)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def mean(values) -> str:
        known = [v for v in values if v is not None]
        return f"{statistics.mean(known):.1f}" if known else "-"

    def once(values) -> str:
        return " / ".join(dict.fromkeys(v for v in values if v)) or "-"

    for cell, entry in out["cells"].items():
        cols = [f"`{cell}`", mean(entry["ratio"].values()), mean(entry.get("residual", {}).values())]
        default = entry["rows"].get("default", {})
        cols.append(once(default.get(s, {}).get("choice") for s in seeds))
        for row in rows:
            runs = entry["rows"][row]
            cols.append(", ".join(f"{runs[s]['auc']} / {runs[s]['p_at_1']}" for s in seeds if s in runs))
        if "default_minus_bag" in entry:
            cols.append(f"{entry['default_minus_bag']:+.1f}")
        if ranked:
            cols.append(", ".join(str(entry["rank_correlation"].get(s, "-")) for s in seeds))
        lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
