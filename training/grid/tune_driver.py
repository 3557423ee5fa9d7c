"""The grid's Ray Tune driver: one trial per (dataset, grid point), each a ``run_experiment``
nested under one MLflow parent run; trials are only drivers (a small CPU fraction), the
TorchTrainer inside each asks for its workers."""

from __future__ import annotations

import contextlib
import re
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from schemas.errors import MmlinksError
from training.config import TrainConfig
from training.grid.news import flat_news_metrics
from training.grid.plan import check_inputs, grid_inits, ray_storage, select_spec, trial_specs
from training.grid.render import build_table
from training.grid.results import METRICS, GridResult, TrialResult
from training.grid.retrieval import flat_test_metrics
from training.grid.rows import GridSpec, point_b, row_name, variant
from training.grid.tracking import (
    _absolute_tracking_uri,
    _best_val_loss,
    log_grid_params,
    log_grid_result,
    open_parent_run,
)

if TYPE_CHECKING:  # pragma: no cover
    from training.experiment import Packager

# Ray Tune refuses a trial with no resources at all; the trial only drives Ray Train (its
# workers reserve their own CPUs), so a sliver keeps it from taking a worker's slot.
TRIAL_DRIVER_CPUS = 0.1


def _grid_trial(
    config: dict,
    *,
    base: dict,
    tracking_uri: str,
    parent_run_id: str,
    grid: str,
    report_dir: str | None,
    family: str = "link",
    package=None,
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
            package=package,  # logs the trial's model (runs:/...), as mmlinks train does
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
            **_trial_metrics(res, family),
        }
    except MmlinksError as exc:
        out["error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    tune.report({**out, "seconds": round(time.perf_counter() - t0, 1)})


def _trial_metrics(res, family: str) -> dict:
    """The flat scalars a trial reports: test (and random-baseline) metrics of its family."""
    if family == "retrieval":
        return flat_test_metrics(res.test)
    if family == "news":
        return flat_news_metrics(res.test)
    test, random = res.test or {}, res.random or {}
    return {
        **{f"test_{k}": test.get(k) for k in (*METRICS, "n_docs")},
        **{f"random_{k}": random.get(k) for k in METRICS},
    }


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


def trial_resources(base: TrainConfig, trial_cpus: float) -> dict:
    """What one trial reserves: its driver's CPUs, and a GPU where it trains in its own process
    on one (``--workers 0 --gpu``): Ray then sets the trial's CUDA_VISIBLE_DEVICES, so each
    trial's ``cuda:0`` is its own GPU, not every trial's the node's first."""
    if base.num_workers == 0 and base.use_gpu:
        return {"cpu": trial_cpus, "gpu": 1}
    return {"cpu": trial_cpus}


@contextlib.contextmanager
def _ray_session(base: TrainConfig) -> Iterator[None]:
    """Reuse a running Ray, else start one the way ``fit`` does (shut down again afterwards)."""
    import ray

    from training.ray_session import connect_ray

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
            if r.get("status") == "ok" and "test_medr" in r:
                self._line(trial, f"MedR {r.get('test_medr') or float('nan'):.2f}  run {r.get('run_id')}")
            elif r.get("status") == "ok" and "test_t2i_r10" in r:  # the news tables
                r10 = r.get("test_t2i_r10")
                r10 = float("nan") if r10 is None else r10
                self._line(trial, f"t2i R@10 {r10:.1f}  run {r.get('run_id')}")
            elif r.get("status") == "ok":
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
        t = _unreported(s, base, "")
        t.status = m.get("status", "error") if r.error is None else "error"
        t.run_id, t.seconds = m.get("run_id"), m.get("seconds")
        if t.status == "ok":
            t.test = {k[5:]: v for k, v in m.items() if k.startswith("test_")}
            t.random = {k[7:]: v for k, v in m.items() if k.startswith("random_")}
            t.best_epoch, t.best_val_loss = m.get("best_epoch"), m.get("best_val_loss")
        else:
            t.error = m.get("error") or (_error_line(r.error) if r.error is not None else "no result")
        found[(t.dataset, t.key)] = t
    for key, s in by_key.items():  # a trial Tune never reported (should not happen) still shows
        if key not in found:
            found[key] = _unreported(s, base, "no result from Tune")
    return [found[(s["dataset"], s["key"])] for s in specs]


def _unreported(s: dict, base: TrainConfig, error: str) -> TrialResult:
    """A trial spec's result before (or without) its metrics: status error with ``error``."""
    return TrialResult(
        dataset=s["dataset"],
        key=s["key"],
        method=s.get("method") or row_name(variant(s["overrides"])),
        b=point_b(s["overrides"], base),
        overrides=s["overrides"],
        status="error",
        error=error,
        seed=s["overrides"].get("seed"),
        row=s.get("row", ""),
    )


def _error_line(exc: BaseException) -> str:
    """The message of a trial's exception: Tune wraps it in a traceback whose last line is it."""
    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else type(exc).__name__


def _tune(
    spec: GridSpec,
    base_cfg: TrainConfig,
    specs: list[dict],
    trainable,
    storage: str,
    progress: bool,
    **limits,
):
    """Run the trials with Tune (inside a Ray session); Tune's ResultGrid."""
    from ray import tune

    with _ray_session(base_cfg):
        safe = default_max_concurrent(base_cfg, limits["trial_cpus"])
        concurrent = limits["max_concurrent"] or safe
        if concurrent > safe:
            print(
                f"warning: {concurrent} concurrent trials may leave no CPU for Ray Data's read tasks "
                f"(this cluster holds {safe}); trials can then wait for data forever",
                file=sys.stderr,
            )
        limits["on_concurrency"](concurrent)
        tuner = tune.Tuner(
            tune.with_resources(trainable, trial_resources(base_cfg, limits["trial_cpus"])),
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
            return tuner.fit()


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
    rows: Sequence[str] | None = None,
    repeats: int | None = None,
    init_from_grid: str | None = None,
    package: Packager | None = None,
) -> GridResult:
    """Run a paper grid: one Tune trial per (dataset, grid point), each an MLflow run nested
    under one parent run that ends up holding the table (markdown and JSON).

    ``name``: a key of GRIDS or a GridSpec. ``datasets``: column name -> dataset directory.
    ``b_values`` keeps only the points with those b (e.g. [10] for the main-paper tables).
    ``baselines``: untrained rows computed elsewhere, method -> dataset -> {auc, p_at_1, p_at_5}
    (e.g. {"Obj Detect": ...} from training.link.baselines), printed after Random as in the paper.
    ``rows`` keeps only the points of those rows (retrieval: cmca, cmcm, cmcm-noattn,
    cmcm-c-RELATION; linking: OBJECTIVE-K-NEGATIVES); ``repeats`` sets how many seeds a
    retrieval grid trains each model with (default: the spec's, 3 for Alikhani et al.'s tables).
    ``init_from_grid``: news-table2 only, the MLflow parent run of a finished news-table1 grid
    whose best "full" trial per source the fuser rows load (``training/grid/init_grid.py``).
    Trials are not registered in the model registry: a grid compares, it does not ship; each
    trial's model is still logged to its run by ``package`` (``training.experiment.Packager``,
    required: ``models.experiment.package_run``), the checkpoint ``init_from_grid`` reads.
    """
    spec = select_spec(name, base_cfg, b_values, rows, repeats)
    if max_concurrent is not None and max_concurrent < 1:
        raise MmlinksError("max concurrent trials must be >= 1")
    tracking_uri = _absolute_tracking_uri(tracking_uri)
    inits = grid_inits(spec, base_cfg, datasets, tracking_uri, storage_path, init_from_grid)
    datasets = check_inputs(spec, base_cfg, datasets, inits)
    if package is None:
        raise TypeError("run_grid needs package= (models.experiment.package_run): each trial logs its model")
    from ray import tune

    specs = trial_specs(spec, base_cfg, datasets, inits)
    storage = ray_storage(storage_path, base_cfg, datasets)
    report_dir = str(Path(report_dir).resolve()) if report_dir is not None else None
    client, parent_id = open_parent_run(tracking_uri, spec.name)
    t0, status = time.perf_counter(), "FAILED"
    try:
        log_grid_params(client, parent_id, spec, base_cfg, datasets, specs)
        if init_from_grid:  # the lineage: which Table 1 grid, which checkpoint per source
            client.log_param(parent_id, "init_from_grid", init_from_grid)
            client.log_dict(parent_id, inits, "grid/init_from_grid.json")
        trainable = tune.with_parameters(
            _grid_trial,
            base={**base_cfg.given_dict(), "run_name": ""},
            tracking_uri=tracking_uri,
            parent_run_id=parent_id,
            grid=spec.name,
            report_dir=report_dir,
            family=spec.family,
            package=package,
        )
        result_grid = _tune(
            spec,
            base_cfg,
            specs,
            trainable,
            storage,
            progress,
            trial_cpus=trial_cpus,
            max_concurrent=max_concurrent,
            on_concurrency=lambda n: client.log_param(parent_id, "max_concurrent_trials", str(n)),
        )
        trials = _collect(result_grid, specs, base_cfg)
        result = GridResult(
            grid=spec.name,
            parent_run_id=parent_id,
            tracking_uri=tracking_uri,
            datasets=datasets,
            trials=trials,
            table=build_table(spec, trials, base_cfg, baselines),
            seconds=round(time.perf_counter() - t0, 1),
        )
        log_grid_result(client, parent_id, result)
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
