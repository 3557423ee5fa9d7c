"""The paper's hyperparameter grids as parallel Ray Tune trials, one nested MLflow run each.

What the paper ran (Hessel, Lee & Mimno 2019, Sec. 4.1 and supplement Sec. 3): every
combination of b in {10, 20, 30} in-batch negatives, similarity DC / TK / AP, k = min(n, m) or
ceil(min(n, m) / 2) for TK and AP, and hard-negative mining (max) or not (mean). The
supplement's Tables S1-S4 list exactly ten trained rows per b: NoStruct, NoStruct + hard neg,
DC, DC + hard neg, TK, TK + hard neg, TK + hard neg + 1/2 k, AP, AP + hard neg,
AP + hard neg + 1/2 k (1/2 k only with hard negatives). The main Tables 2 and 3 show b = 10 and
the rows NoStruct, DC, TK, TK + 1/2 k, AP, AP + 1/2 k; the structured rows there are the
hard-negative ones ("AP + hard neg in these tables is the same as the AP described in the
main paper"), while the main NoStruct row matches the supplement's NoStruct *without* hard
negatives (e.g. MSCOCO AUC 87.5 / 88.3 vs 51.8 for NoStruct + hard neg), so that is the one
shown. Table 2 covers the crowd-labelled MSCOCO, Story-DII, Story-SIS and DII-Stress; Table 3
covers RQA and DIY with 50 tokens per sentence (WIKI has no ground truth, so no table row).

The paper does not pick among variants: every configuration is its own row, and the
validation loss only picks each run's checkpoint (the lowest-validation-loss epoch, which
``training.train.fit`` already does). The table here follows that. Random comes from each
dataset's test split (``evaluate``'s random baseline); the Obj Detect row (DenseNet class
names + word2vec, best K chosen on test) has no counterpart in this code base and is left out.

Each (dataset, grid point) is one Tune trial whose function calls ``run_experiment``; the trial
is only a driver (a small CPU fraction), the TorchTrainer inside it asks for the workers.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from schemas.errors import MmlinksError
from training.config import TrainConfig

METRICS = ("auc", "p_at_1", "p_at_5")
# Ray Tune refuses a trial with no resources at all; the trial only drives Ray Train (its
# workers reserve their own CPUs), so a sliver keeps it from taking a worker's slot.
TRIAL_DRIVER_CPUS = 0.1

# (objective, k, negatives) in the supplement's row order, with its row names.
ALL_ROWS: tuple[tuple[tuple[str, str, str], str], ...] = (
    (("nostruct", "full", "mean"), "NoStruct"),
    (("nostruct", "full", "hard"), "NoStruct + hard neg"),
    (("dc", "full", "mean"), "DC"),
    (("dc", "full", "hard"), "DC + hard neg"),
    (("tk", "full", "mean"), "TK"),
    (("tk", "full", "hard"), "TK + hard neg"),
    (("tk", "half", "mean"), "TK + 1/2 k"),  # not in the paper's grid; named for custom grids
    (("tk", "half", "hard"), "TK + hard neg + 1/2 k"),
    (("ap", "full", "mean"), "AP"),
    (("ap", "full", "hard"), "AP + hard neg"),
    (("ap", "half", "mean"), "AP + 1/2 k"),
    (("ap", "half", "hard"), "AP + hard neg + 1/2 k"),
)
# The main paper's Tables 2 and 3 (b = 10): which trained variant each printed row is.
MAIN_ROWS: tuple[tuple[tuple[str, str, str], str], ...] = (
    (("nostruct", "full", "mean"), "NoStruct"),
    (("dc", "full", "hard"), "DC"),
    (("tk", "full", "hard"), "TK"),
    (("tk", "half", "hard"), "  + 1/2 k"),
    (("ap", "full", "hard"), "AP"),
    (("ap", "half", "hard"), "  + 1/2 k"),
)
# The ten trained rows of supplement Tables S1-S4 (each b).
PAPER_VARIANTS: tuple[tuple[str, str, str], ...] = (
    ("nostruct", "full", "mean"),
    ("nostruct", "full", "hard"),
    ("dc", "full", "mean"),
    ("dc", "full", "hard"),
    ("tk", "full", "mean"),
    ("tk", "full", "hard"),
    ("tk", "half", "hard"),
    ("ap", "full", "mean"),
    ("ap", "full", "hard"),
    ("ap", "half", "hard"),
)
PAPER_B = (10, 20, 30)


def paper_points(b_values: Sequence[int] = PAPER_B) -> tuple[dict, ...]:
    """TrainConfig overrides of the paper's grid: ten variants for each b (B = b + 1 documents)."""
    return tuple(
        {"objective": o, "k": k, "negatives": n, "batch_docs": b + 1}
        for b in b_values
        for o, k, n in PAPER_VARIANTS
    )


@dataclass(frozen=True)
class GridSpec:
    """One paper table: the datasets it reports and the TrainConfig overrides of its grid."""

    name: str
    title: str
    datasets: tuple[str, ...]  # the paper's column order
    points: tuple[dict, ...]  # TrainConfig overrides, one trial per point and dataset
    base_overrides: dict = field(default_factory=dict)  # the table's protocol (e.g. max_tokens)
    main_b: int = 10  # the b of the main-paper table


GRIDS: dict[str, GridSpec] = {
    "paper-table2": GridSpec(
        name="paper-table2",
        title="Hessel et al. 2019, Table 2: crowdlabeled datasets",
        datasets=("MSCOCO", "Story-DII", "Story-SIS", "DII-Stress"),
        points=paper_points(),
    ),
    "paper-table3": GridSpec(
        name="paper-table3",
        title="Hessel et al. 2019, Table 3: organically-multimodal datasets",
        datasets=("RQA", "DIY"),
        points=paper_points(),
        base_overrides={"max_tokens": 50},  # Sec. 5: sentences up to 50 tokens for RQA and DIY
    ),
}


def variant(point: dict) -> tuple[str, str, str]:
    """(objective, k, negatives) of a grid point; k does not apply to NoStruct and DC."""
    objective = point["objective"]
    k = point.get("k", "full") if objective in ("tk", "ap") else "full"
    return objective, k, point.get("negatives", "hard")


def point_b(point: dict, base: TrainConfig) -> int:
    return int(point.get("batch_docs", base.batch_docs)) - 1


def point_key(point: dict, base: TrainConfig) -> str:
    o, k, n = variant(point)
    return f"{o}-{k}-{n}-b{point_b(point, base)}"


def row_name(v: tuple[str, str, str]) -> str:
    names = dict(ALL_ROWS)
    if v in names:
        return names[v]
    return "-".join(v)


@dataclass
class TrialResult:
    dataset: str
    key: str  # e.g. ap-half-hard-b10
    method: str  # the supplement's row name, e.g. "AP + hard neg + 1/2 k"
    b: int
    overrides: dict
    status: str  # ok | error
    run_id: str | None = None
    test: dict = field(default_factory=dict)
    random: dict = field(default_factory=dict)
    best_epoch: int | None = None
    best_val_loss: float | None = None
    seconds: float | None = None  # the trial's wall time (train, evaluate, log)
    error: str = ""


@dataclass
class GridResult:
    grid: str
    parent_run_id: str
    tracking_uri: str
    datasets: dict[str, str]
    trials: list[TrialResult]
    table: dict
    seconds: float = 0.0

    @property
    def failed(self) -> list[TrialResult]:
        return [t for t in self.trials if t.status != "ok"]

    def to_dict(self) -> dict:
        return {
            "grid": self.grid,
            "parent_run_id": self.parent_run_id,
            "tracking_uri": self.tracking_uri,
            "datasets": self.datasets,
            "trials": [asdict(t) for t in self.trials],
            "failed_trials": len(self.failed),
            "table": self.table,
            "seconds": self.seconds,
        }


# --------------------------------------------------------------------------------- trials


def _absolute_tracking_uri(uri: str) -> str:
    """Tune runs each trial in its own working directory, so a relative sqlite path would open
    a fresh empty database there; anchor it to this process's directory."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix) :].startswith("/"):
        return prefix + str(Path(uri[len(prefix) :]).resolve())
    if "://" not in uri and uri:  # a bare path is a file store
        return str(Path(uri).resolve())
    return uri


def _best_val_loss(client, run_id: str) -> float | None:
    from mlflow.exceptions import MlflowException

    try:
        values = [m.value for m in client.get_metric_history(run_id, "val_loss")]
    except MlflowException:
        return None
    finite = [v for v in values if math.isfinite(v)]
    return min(finite) if finite else None


def _grid_trial(
    config: dict, *, base: dict, tracking_uri: str, parent_run_id: str, grid: str, report_dir: str | None
) -> None:
    """One Tune trial: train, evaluate and log one grid point on one dataset, then report the
    test metrics to Tune. An expected failure (MmlinksError) is reported as a failed trial with
    its message, so one bad point does not hide the rest of the table."""
    from mlflow.tracking import MlflowClient
    from ray import tune

    from training.experiment import run_experiment

    spec = config["trial"]
    cfg = TrainConfig.from_dict({**base, **spec["overrides"], "data": spec["data"], "run_name": ""})
    tags = {"mmlinks.grid": grid, "mmlinks.grid.dataset": spec["dataset"], "mmlinks.grid.point": spec["key"]}
    out = {"status": "error", "run_id": None, "error": ""}
    t0 = time.perf_counter()
    try:
        res = run_experiment(
            cfg,
            tracking_uri,
            model_name=None,  # a grid compares configurations; nothing is registered
            alias=None,
            progress=False,
            report_dir=report_dir,
            parent_run_id=parent_run_id,
        )
        client = MlflowClient(tracking_uri)
        for k, v in tags.items():
            client.set_tag(res.run_id, k, v)
        out = {
            "status": "ok",
            "run_id": res.run_id,
            "error": "",
            "best_epoch": res.best_epoch,
            "best_val_loss": _best_val_loss(client, res.run_id),
            **{f"test_{k}": res.test.get(k) for k in (*METRICS, "n_docs")},
            **{f"random_{k}": res.random.get(k) for k in METRICS},
        }
    except MmlinksError as exc:
        out["error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    tune.report({**out, "seconds": round(time.perf_counter() - t0, 1)})


def _trial_specs(spec: GridSpec, base: TrainConfig, datasets: dict[str, str]) -> list[dict]:
    specs = []
    for name, data in datasets.items():
        for point in spec.points:
            specs.append(
                {
                    "dataset": name,
                    "data": data,
                    "key": point_key(point, base),
                    "overrides": {**spec.base_overrides, **point},
                }
            )
    return specs


def _check_inputs(spec: GridSpec, base: TrainConfig, datasets: dict[str, str]) -> dict[str, str]:
    """Refuse a bad grid or dataset before any Ray or MLflow state is created."""
    from schemas.manifest import Manifest

    if not datasets:
        raise MmlinksError("a grid needs at least one dataset (NAME=DIR)")
    if not spec.points:
        raise MmlinksError(f"grid {spec.name} has no points")
    out = {}
    for name, data in datasets.items():
        if not name or not re.fullmatch(r"[\w.+-]+", name):
            raise MmlinksError(f"dataset name {name!r}: use letters, digits, '.', '_', '+' or '-'")
        if "://" not in data:
            if not Path(data).is_dir():
                raise MmlinksError(f"dataset {name}: {data} is not a directory")
            data = str(Path(data).resolve())  # trials run in their own working directories
        Manifest.read(data)
        out[name] = data
    keys = [point_key(p, base) for p in spec.points]
    if len(set(keys)) != len(keys):
        raise MmlinksError(
            f"grid {spec.name} repeats a point: {sorted(k for k in keys if keys.count(k) > 1)}"
        )
    for point in spec.points:
        TrainConfig.from_dict({**base.to_dict(), **spec.base_overrides, **point}).validate()
    return out


def _log_dataset_inputs(client, run_id: str, datasets: dict[str, str]) -> None:
    """Record each dataset as an input of the parent run before any trial starts.

    Besides saying what the grid ran on, this creates the dataset rows the trials' own
    ``log_input`` then finds: MLflow's SQL store checks for an existing (experiment, name,
    digest) row and inserts it if missing, so concurrent trials on one dataset race to insert
    the same row and all but one fail with a UNIQUE constraint error. Name, digest and source
    are the ones ``tracking.log_training_params`` uses.
    """
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    from schemas.manifest import Manifest

    inputs = []
    for data in dict.fromkeys(datasets.values()):
        manifest = Manifest.read(data)
        dataset = MetaDataset(
            source=resolve_dataset_source(str((Path(data) / "manifest.json").resolve())),
            name=f"{manifest.source}-{manifest.dataset_version}",
            digest=manifest.dataset_version,
        )
        tags = [InputTag(key=MLFLOW_DATASET_CONTEXT, value="training")]
        inputs.append(DatasetInput(dataset=dataset._to_mlflow_entity(), tags=tags))
    client.log_inputs(run_id, datasets=inputs)


def default_max_concurrent(base: TrainConfig, trial_cpus: float = TRIAL_DRIVER_CPUS) -> int:
    """As many trials as the cluster holds their drivers and full sets of Ray Train workers
    while one CPU stays free for the Ray Data read tasks that feed them.

    More trials would not run faster: Ray Train V2 starts a run only when all its workers fit,
    and once every CPU is held by workers the read tasks (1 CPU each) can never be scheduled,
    so every running trial would wait for data forever.
    """
    import ray

    res = ray.cluster_resources()
    workers = max(1, base.num_workers)
    n = int((res.get("CPU", 1) - 1) // (workers + trial_cpus))  # a Train worker holds 1 CPU, GPU or not
    if base.use_gpu:
        n = min(n, int(res.get("GPU", 0)) // workers)
    return max(1, n)


@contextlib.contextmanager
def _ray_session(base: TrainConfig) -> Iterator[None]:
    """Reuse a running Ray, else start one the way ``fit`` does (shut down again afterwards)."""
    import ray

    from training.driver import connect_ray

    if not connect_ray(base):
        yield
        return
    try:
        yield
    finally:
        ray.shutdown()


def _progress_callback(total: int):
    from ray import tune

    class Progress(tune.Callback):
        """One line on stderr per finished trial: the grid can run for hours on a cluster."""

        def __init__(self) -> None:
            self.done = 0

        def _line(self, trial, text: str) -> None:
            self.done += 1
            spec = trial.config.get("trial", {})
            print(f"[{self.done}/{total}] {spec.get('dataset')} {spec.get('key')}: {text}", file=sys.stderr)

        def on_trial_complete(self, iteration, trials, trial, **info) -> None:
            r = trial.last_result or {}
            if r.get("status") == "ok":
                self._line(trial, f"AUC {r.get('test_auc', float('nan')):.1f}  run {r.get('run_id')}")
            else:
                self._line(trial, f"failed: {r.get('error') or 'see the Tune log'}")

        def on_trial_error(self, iteration, trials, trial, **info) -> None:
            self._line(trial, "failed (error in the trial; see the Tune log)")

    return Progress()


def _collect(result_grid, specs: list[dict], base: TrainConfig) -> list[TrialResult]:
    by_key = {(s["dataset"], s["key"]): s for s in specs}
    found: dict[tuple[str, str], TrialResult] = {}
    for r in result_grid:
        s = r.config["trial"]
        m = r.metrics or {}
        v = variant(s["overrides"])
        t = TrialResult(
            dataset=s["dataset"],
            key=s["key"],
            method=row_name(v),
            b=point_b(s["overrides"], base),
            overrides=s["overrides"],
            status=m.get("status", "error") if r.error is None else "error",
            run_id=m.get("run_id"),
            seconds=m.get("seconds"),
        )
        if t.status == "ok":
            t.test = {k: m.get(f"test_{k}") for k in (*METRICS, "n_docs")}
            t.random = {k: m.get(f"random_{k}") for k in METRICS}
            t.best_epoch, t.best_val_loss = m.get("best_epoch"), m.get("best_val_loss")
        else:
            t.error = m.get("error") or (_error_line(r.error) if r.error is not None else "no result")
        found[(t.dataset, t.key)] = t
    for key, s in by_key.items():  # a trial Tune never reported (should not happen) still shows
        if key not in found:
            v = variant(s["overrides"])
            found[key] = TrialResult(
                s["dataset"],
                s["key"],
                row_name(v),
                point_b(s["overrides"], base),
                s["overrides"],
                "error",
                error="no result from Tune",
            )
    return [found[(s["dataset"], s["key"])] for s in specs]


def _error_line(exc: BaseException) -> str:
    """The message of a trial's exception: Tune wraps it in a traceback whose last line is it."""
    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else type(exc).__name__


def run_grid(
    name: str | GridSpec,
    base_cfg: TrainConfig,
    datasets: dict[str, str],
    tracking_uri: str,
    max_concurrent: int | None = None,
    b_values: Sequence[int] | None = None,
    report_dir: str | Path | None = None,
    storage_path: str | None = None,
    progress: bool = False,
    trial_cpus: float = TRIAL_DRIVER_CPUS,
    baselines: dict[str, dict[str, dict]] | None = None,
) -> GridResult:
    """Run a paper grid: one Tune trial per (dataset, grid point), each an MLflow run nested
    under one parent run that ends up holding the table (markdown and JSON).

    ``name``: a key of GRIDS or a GridSpec. ``datasets``: column name -> dataset directory.
    ``b_values`` keeps only the points with those b (e.g. [10] for the main-paper tables).
    ``baselines``: untrained rows computed elsewhere, method -> dataset -> {auc, p_at_1, p_at_5}
    (e.g. {"Obj Detect": ...} from training.baselines), printed after Random as in the paper.
    Trials are not registered in the model registry: a grid compares, it does not ship.
    """
    spec = GRIDS.get(name) if isinstance(name, str) else name
    if spec is None:
        raise MmlinksError(f"unknown grid {name!r} (one of {', '.join(GRIDS)})")
    if b_values:
        keep = {int(b) for b in b_values}
        spec = replace(spec, points=tuple(p for p in spec.points if point_b(p, base_cfg) in keep))
        if not spec.points:
            raise MmlinksError(f"no point of grid {spec.name} has b in {sorted(keep)}")
    if max_concurrent is not None and max_concurrent < 1:
        raise MmlinksError("max concurrent trials must be >= 1")
    datasets = _check_inputs(spec, base_cfg, datasets)
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient
    from ray import tune

    from training import tracking
    from training.experiment import EXPERIMENT

    tracking_uri = _absolute_tracking_uri(tracking_uri)
    base = {**base_cfg.to_dict(), "run_name": ""}
    specs = _trial_specs(spec, base_cfg, datasets)
    first_data = next(iter(datasets.values()))
    storage = storage_path or base_cfg.storage_path or str(Path(first_data).resolve().parent / "ray_results")
    if "://" not in storage:
        storage = str(Path(storage).resolve())
    if report_dir is not None:
        report_dir = str(Path(report_dir).resolve())

    client = MlflowClient(tracking_uri)
    experiment_id = tracking.configure(tracking_uri, EXPERIMENT)
    parent = client.create_run(
        experiment_id,
        run_name=f"grid-{spec.name}",
        tags={"mmlinks.grid": spec.name, "mmlinks.grid.role": "parent"},
    )
    parent_id = parent.info.run_id
    t0 = time.perf_counter()
    status = "FAILED"
    try:
        params = {
            "grid": spec.name,
            "datasets": json.dumps(datasets, sort_keys=True),
            "dataset_names": ",".join(datasets),
            "points": len(spec.points),
            "trials": len(specs),
            "b_values": ",".join(str(b) for b in sorted({point_b(p, base_cfg) for p in spec.points})),
            **{f"base.{k}": v for k, v in base_cfg.public_dict().items()},
            **{f"table.{k}": v for k, v in spec.base_overrides.items()},
        }
        client.log_batch(parent_id, params=[Param(k, str(v)[:500]) for k, v in params.items()])
        client.log_dict(
            parent_id, {"grid": spec.name, "datasets": datasets, "trials": specs}, "grid/trials_spec.json"
        )
        _log_dataset_inputs(client, parent_id, datasets)
        with _ray_session(base_cfg):
            safe = default_max_concurrent(base_cfg, trial_cpus)
            concurrent = max_concurrent or safe
            if concurrent > safe:
                print(
                    f"warning: {concurrent} concurrent trials may leave no CPU for Ray Data's read tasks "
                    f"(this cluster holds {safe}); trials can then wait for data forever",
                    file=sys.stderr,
                )
            client.log_param(parent_id, "max_concurrent_trials", str(concurrent))
            trainable = tune.with_parameters(
                _grid_trial,
                base=base,
                tracking_uri=tracking_uri,
                parent_run_id=parent_id,
                grid=spec.name,
                report_dir=report_dir,
            )
            tuner = tune.Tuner(
                tune.with_resources(trainable, {"cpu": trial_cpus}),
                param_space={"trial": tune.grid_search(specs)},
                tune_config=tune.TuneConfig(
                    max_concurrent_trials=concurrent,
                    trial_name_creator=_trial_name,
                    trial_dirname_creator=_trial_name,
                ),
                run_config=tune.RunConfig(
                    name=f"grid-{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}",
                    storage_path=storage,
                    verbose=0,
                    callbacks=[_progress_callback(len(specs))] if progress else None,
                ),
            )
            with contextlib.redirect_stdout(sys.stderr):  # Tune's banners; stdout is for the table
                result_grid = tuner.fit()
        trials = _collect(result_grid, specs, base_cfg)
        table = build_table(spec, trials, base_cfg, baselines)
        result = GridResult(
            grid=spec.name,
            parent_run_id=parent_id,
            tracking_uri=tracking_uri,
            datasets=datasets,
            trials=trials,
            table=table,
            seconds=round(time.perf_counter() - t0, 1),
        )
        client.log_text(parent_id, format_table(result, markdown=True), "grid/table.md")
        client.log_text(parent_id, format_table(result), "grid/table.txt")
        client.log_dict(parent_id, table, "grid/table.json")
        client.log_dict(parent_id, {"trials": [asdict(t) for t in trials]}, "grid/trials.json")
        client.log_metric(parent_id, "failed_trials", len(result.failed))
        client.log_metric(parent_id, "ok_trials", len(trials) - len(result.failed))
        client.log_metric(parent_id, "seconds", result.seconds)
        status = "FINISHED" if len(result.failed) < len(trials) else "FAILED"
        return result
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except Exception:
        with tempfile.TemporaryDirectory() as tmp:  # leave the reason on the parent run
            p = Path(tmp) / "grid_error.txt"
            p.write_text(traceback.format_exc())
            client.log_artifact(parent_id, str(p))
        raise
    finally:
        client.set_terminated(parent_id, status)


def _trial_name(trial) -> str:
    s = trial.config.get("trial", {})
    raw = f"{s.get('dataset', 'ds')}-{s.get('key', trial.trial_id)}-{trial.trial_id}"
    return re.sub(r"[^\w.+-]", "_", raw)


# ---------------------------------------------------------------------------------- table


def _metrics_cell(values: dict | None) -> dict | None:
    return None if values is None else {**{k: values.get(k) for k in METRICS}, "run_id": None}


def _cell(t: TrialResult | None, source: str = "test") -> dict | None:
    if t is None:
        return None
    if t.status != "ok":
        return {"error": t.error, "run_id": t.run_id}
    values = t.test if source == "test" else t.random
    return {**{k: values.get(k) for k in METRICS}, "run_id": t.run_id if source == "test" else None}


def build_table(
    spec: GridSpec,
    trials: list[TrialResult],
    base: TrainConfig,
    baselines: dict[str, dict[str, dict]] | None = None,
) -> dict:
    """The paper's layout as data: the main-paper block (b = spec.main_b) when its rows were
    run, then one block per b with every variant (the supplement's Tables S1-S4 layout)."""
    names = list(dict.fromkeys(t.dataset for t in trials))
    paper = [d for d in spec.datasets if d in names]
    columns = paper + [d for d in names if d not in paper]
    cell = {(t.dataset, t.key): t for t in trials}
    random: dict[str, dict | None] = {}
    for d in columns:  # the random baseline depends only on the test split and the seed
        ok = next((t for t in trials if t.dataset == d and t.status == "ok"), None)
        random[d] = _cell(ok, "random")
    b_values = sorted({t.b for t in trials})

    def rows_for(b: int, layout) -> list[dict]:
        rows = [{"method": "Random", "key": "random", "cells": dict(random)}]
        for method, values in (baselines or {}).items():
            cells = {d: _metrics_cell(values.get(d)) for d in columns}
            rows.append({"method": method, "key": re.sub(r"\W+", "-", method.lower()), "cells": cells})
        for v, label in layout:
            key = f"{v[0]}-{v[1]}-{v[2]}-b{b}"
            if not any((d, key) in cell for d in columns):
                continue
            rows.append(
                {"method": label, "key": key, "cells": {d: _cell(cell.get((d, key))) for d in columns}}
            )
        return rows

    blocks = []
    if spec.main_b in b_values:
        rows = rows_for(spec.main_b, MAIN_ROWS)
        if len(rows) > 1:
            blocks.append(
                {
                    "title": f"{spec.title} (b = {spec.main_b}; main-paper rows)",
                    "b": spec.main_b,
                    "layout": "main",
                    "rows": rows,
                }
            )
    for b in b_values:
        blocks.append(
            {
                "title": f"All configurations, b = {b} (supplement layout, cf. Tables S1-S4)",
                "b": b,
                "layout": "all",
                "rows": rows_for(b, ALL_ROWS),
            }
        )
    return {
        "grid": spec.name,
        "title": spec.title,
        "datasets": columns,
        "metrics": list(METRICS),
        "blocks": blocks,
        "notes": [
            "test-set macro averages x100; each run's checkpoint is its lowest-validation-loss epoch",
            *(
                []
                if "Obj Detect" in (baselines or {})
                else ["Obj Detect (paper row) is not part of this grid"]
            ),
        ],
    }


def _fmt(x) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.1f}"


def _cells_text(c: dict | None) -> tuple[str, str]:
    if c is None:
        return "", ""
    if "error" in c:
        return "failed", ""
    return _fmt(c.get("auc")), f"{_fmt(c.get('p_at_1'))}/{_fmt(c.get('p_at_5'))}"


def format_table(result: GridResult | dict, markdown: bool = False) -> str:
    """The table in the paper's layout: per dataset "AUC" and "p@1/p@5" columns, one row per
    method; plain text for the console, or markdown for the MLflow artifact."""
    table = result.table if isinstance(result, GridResult) else result.get("table", result)
    columns = table["datasets"]
    out: list[str] = []
    for block in table["blocks"]:
        header1 = ["", *[x for d in columns for x in (d, "")]]
        header2 = ["method", *["AUC", "p@1/p@5"] * len(columns)]
        body = [
            [row["method"], *[x for d in columns for x in _cells_text(row["cells"].get(d))]]
            for row in block["rows"]
        ]
        if markdown:
            out.append(f"### {block['title']}\n")
            head = ["method", *[f"{d} {m}" for d in columns for m in ("AUC", "p@1/p@5")]]
            out.append("| " + " | ".join(head) + " |")
            out.append("|" + "---|" * len(head))
            out += ["| " + " | ".join(r) + " |" for r in body]
        else:
            out.append(block["title"])
            widths = [max(len(r[i]) for r in [header2, *body]) for i in range(len(header2))]
            for i in range(1, len(header1), 2):  # a dataset name spans its two columns
                span = widths[i] + 2 + widths[i + 1]
                if len(header1[i]) > span:
                    widths[i + 1] += len(header1[i]) - span
            line1 = widths[0] * " "
            for i in range(1, len(header1), 2):
                line1 += "  " + header1[i].ljust(widths[i] + 2 + widths[i + 1])
            out.append(line1.rstrip())
            rule = ["-" * w for w in widths]
            for r in [header2, rule, *body]:
                cells = [r[0].ljust(widths[0])] + [
                    r[i].rjust(widths[i]) if i % 2 else r[i].ljust(widths[i]) for i in range(1, len(r))
                ]
                out.append("  ".join(cells).rstrip())
        out.append("")
    out += [f"{'- ' if markdown else ''}{n}" for n in table.get("notes", [])]
    return "\n".join(out).rstrip() + "\n"
