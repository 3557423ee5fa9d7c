"""The Ray driver of a training run: checks the data, builds vocabulary and model config,
connects to Ray, and runs ``training.loop`` under a TorchTrainer (or in this process with
``--workers 0``). ``fit`` returns the best model (``TrainResult``)."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from training import checkpoints, fault_hooks
from training.backbone import get_backbone, needs_regions
from training.checkpoints import (
    IncompatibleResumeError,
    history_of,
    load_checkpoint_model,
    resumed_run_config,
)
from training.config import SELECTION_ORDER, TrainConfig
from training.cores import usable_cores
from training.data import TRAINING_COLUMNS, structure_measurable
from training.loop import train_loop_per_worker
from training.ray_session import connect_ray, failure_message
from training.run_inputs import RunInputs, read_inputs
from training.text import Vocabulary, training_sentences


@dataclass
class TrainResult:
    model: torch.nn.Module  # MulLink or TransformerLink: both have encode(batch)
    vocab: Vocabulary
    model_config: dict  # the backbone's config (with its "backbone" key)
    best_epoch: int
    best_val_loss: float
    checkpoint_path: str  # where Ray stored it (a path or a URI under storage_path)
    checkpoint: object  # the ray.train.Checkpoint; use .as_directory() to read it anywhere
    history: list[dict]
    choice: object | None = None  # what the backbone chose by measuring (BackboneSpec.choose)


def training_feature_stats(
    paths: list[str], centred: bool = False, centre: str = "mean"
) -> tuple[np.ndarray, ...]:
    """Per-dimension mean and std of the training images' CNN features (streamed by shard);
    with ``centred``, a third array: the std of the standardised features minus their
    document's mean (``centre`` median: its per-channel median, as the encoder takes it), over
    documents with >= 2 images (``training.model.ImageEncoder``'s document centring; a second
    pass), and a fourth: the spread of those documents' means (or medians)."""
    from schemas.shards import read_table
    from training.data import features_of

    total, total_sq, n = None, None, 0
    for p in paths:
        feats, _ = features_of(read_table([p], columns=["images"]))
        if not feats or not sum(len(f) for f in feats):
            continue
        x = np.concatenate(feats).astype(np.float64)
        total = x.sum(0) if total is None else total + x.sum(0)
        total_sq = (x**2).sum(0) if total_sq is None else total_sq + (x**2).sum(0)
        n += len(x)
    if not n:
        from schemas.errors import MmlinksError

        raise MmlinksError("the training shards hold no image: nothing to train the image encoder on")
    mean = total / n
    std = np.sqrt(np.maximum(total_sq / n - mean**2, 0))
    if not centred:
        return mean.astype(np.float32), std.astype(np.float32)
    sq, m, bsq, b = np.zeros_like(mean), 0, np.zeros_like(mean), 0
    for p in paths:
        feats, _ = features_of(read_table([p], columns=["images"]))
        for f in feats:
            if len(f) >= 2:
                z = (f.astype(np.float64) - mean) / np.maximum(std, 1e-6)
                look = np.median(z, 0) if centre == "median" else z.mean(0)
                sq += ((z - look) ** 2).sum(0)
                m += len(f)
                bsq += len(f) * look**2  # per image, as the encoder sees each mean
                b += len(f)
    centred_std = np.sqrt(sq / m) if m else np.ones_like(mean)
    between_std = np.sqrt(bsq / b) if b else np.ones_like(mean)
    f32 = np.float32
    return mean.astype(f32), std.astype(f32), centred_std.astype(f32), between_std.astype(f32)


CACHE_LIMIT_BYTES = 2 << 30  # "auto" caches training shards up to this size on disk
DRIVER_READ_LIMIT_BYTES = 64 << 20  # cached shards up to this size are read by the driver itself


def shard_bytes(paths: list[str]) -> int:
    import pyarrow.fs as pafs

    total = 0
    for p in paths:
        fs, path = pafs.FileSystem.from_uri(p) if "://" in p else (pafs.LocalFileSystem(), p)
        total += fs.get_file_info(path).size or 0
    return total


def training_dataset(paths: list[str], cache: str, extra_columns: tuple[str, ...] = ()):
    """The training documents as a Ray Dataset, split between the workers every epoch.

    Streamed (``no``, and ``auto`` above 2 GiB of shards): every epoch reads the shards again,
    so the training set never has to fit in the cluster's memory. Cached (``yes``, and ``auto``
    for smaller data): read once into the object store (which spills to disk under pressure),
    so an epoch does not pay Ray Data's start-up and Parquet decoding again. Cached shards of
    at most 64 MiB are read by the driver (one block per shard, in order) instead of by Ray
    Data's read tasks: on small data those tasks' start-up (~8 s on 2 cores) would cost more
    than the whole epoch.
    """
    import ray.data

    columns = [*TRAINING_COLUMNS, *extra_columns]
    size = shard_bytes(paths) if cache != "no" else 0
    if cache != "no" and size <= DRIVER_READ_LIMIT_BYTES:
        from schemas.shards import read_table

        return ray.data.from_arrow([read_table([p], columns=columns) for p in paths])
    import pyarrow.parquet as pq

    from schemas.feature_bytes import decode_features, shard_feature_dtype

    dtype = shard_feature_dtype(pq.read_schema(paths[0]))  # one dataset: one dtype (manifest)
    ds = ray.data.read_parquet(paths, columns=columns).map_batches(
        decode_features, batch_format="pyarrow", fn_kwargs={"dtype": dtype}, zero_copy_batch=True
    )
    if cache == "yes" or (cache == "auto" and size <= CACHE_LIMIT_BYTES):
        ds = ds.materialize()
    return ds


class LocalShards:
    """``--workers 0``'s training set: the shards read in this process one at a time, in order,
    through the one method of a Ray Data shard the loop calls (``iter_batches``), cut into the
    same batches Ray Data's ordered iteration gives (rows carried across shard ends). No Ray
    to start (~5-10 s and a dozen processes on 2 cores) and never more than one shard plus one
    batch in memory, whatever the dataset's size."""

    def __init__(self, paths: list[str], extra_columns: tuple[str, ...] = (), limit: int | None = None):
        self.paths = list(paths)
        self.columns = [*TRAINING_COLUMNS, *extra_columns]
        self.limit = limit  # the first documents only (a candidate's brief run)

    def iter_batches(self, batch_size: int, batch_format: str = "pyarrow", prefetch_batches: int = 0):
        import pyarrow as pa

        from schemas.shards import read_table

        carry, left = None, self.limit
        for path in self.paths:
            if left is not None and left <= 0:
                break
            table = read_table([path], columns=self.columns)
            if left is not None:
                table = table.slice(0, left)
                left -= table.num_rows
            if carry is not None:
                table = pa.concat_tables([carry, table])
            whole = table.num_rows - table.num_rows % batch_size
            for start in range(0, whole, batch_size):
                yield table.slice(start, batch_size)
            carry = table.slice(whole) if whole < table.num_rows else None
        if carry is not None:
            yield carry


def check_inputs(cfg: TrainConfig) -> RunInputs:
    """What ``fit`` trains ``cfg`` on: ``check_trainable`` of what ``read_inputs`` reads."""
    return check_trainable(read_inputs(cfg))


def check_trainable(inputs: RunInputs) -> RunInputs:
    """What ``fit_inputs`` trains on: ``inputs`` (what ``training.run_inputs.read_inputs`` read
    of a config) with the config's data path made absolute and what training needs beyond a
    valid dataset checked before Ray starts: a visible GPU for ``--workers 0 --gpu``, train and
    val shards, two validation documents, and a resumed run's compatibility."""
    from schemas.errors import MmlinksError
    from schemas.shards import count_rows

    inp = inputs
    cfg = inputs.cfg
    if cfg.num_workers == 0 and cfg.use_gpu and not torch.cuda.is_available():
        # here, not in validate: a config is valid on a machine without a GPU (a checkpoint's, to
        # resume elsewhere; a grid's, built on the driver), only training it here is not
        raise MmlinksError("--gpu with --workers 0 trains on this process's GPU: none is visible")
    if "://" not in cfg.data:  # Ray workers may run in another directory (or on another node)
        cfg = dataclasses.replace(cfg, data=str(Path(cfg.data).resolve()))
    if not inp.train_paths or not inp.val_paths:
        raise MmlinksError(f"{cfg.data} needs train and val shards to train")
    n_val = count_rows(inp.val_paths)
    if n_val < 2:
        raise MmlinksError(f"{cfg.data} has {n_val} validation document(s); the validation loss needs >= 2")
    if cfg.select_by == "val_structure" and not structure_measurable(inp.val_paths):
        raise MmlinksError(
            f"--select-by val_structure: no validation document of {cfg.data} has three sentences and "
            "three images to measure it on (val_loss needs none)"
        )
    storage = inp.storage or str(Path(cfg.data).resolve().parent / "ray_results")
    if cfg.run_name:
        choose = get_backbone(cfg.model_backbone).choose
        try:
            cfg = resumed_run_config(cfg, storage, choose, inp.train_paths, inp.val_paths)
        except IncompatibleResumeError as exc:
            raise MmlinksError(str(exc)) from None
    return dataclasses.replace(inp, cfg=cfg, storage=storage)


def make_trainer(inp: RunInputs, loop_config: dict, run_name: str):
    """The TorchTrainer of one run (workers, storage, checkpoint retention, failures)."""
    from ray.train import CheckpointConfig, DataConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    cfg = inp.cfg
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config,
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu),
        run_config=RunConfig(
            name=run_name,
            storage_path=inp.storage,
            checkpoint_config=CheckpointConfig(
                num_to_keep=2,
                checkpoint_score_attribute=checkpoints.SELECT_SCORE,
                checkpoint_score_order=SELECTION_ORDER[cfg.select_by],
            ),
            failure_config=FailureConfig(max_failures=cfg.max_failures),
        ),
        datasets={"train": training_dataset(inp.train_paths, cfg.cache_data, inp.objective.columns)},
        # One worker reads the whole set: no split, so no split-coordinator actor to start (a
        # process of its own, ~2 s on 2 cores); two or more get equal streaming splits.
        dataset_config=DataConfig(datasets_to_split="all" if cfg.num_workers > 1 else []),
    )


def best_checkpoint(trainer, select_by: str = "val_loss"):
    """Run the trainer; (the latest checkpoint, the best one by ``select_by``) or MmlinksError."""
    import ray.train

    from schemas.errors import MmlinksError

    try:
        result = trainer.fit()
    except ray.train.TrainingFailedError as exc:  # V2 raises instead of returning result.error
        raise MmlinksError(f"training failed: {failure_message(exc)}") from exc
    if result.error:
        raise MmlinksError(f"training failed: {failure_message(result.error)}")
    try:
        best = result.get_best_checkpoint(metric=checkpoints.SELECT_SCORE, mode=SELECTION_ORDER[select_by])
    except RuntimeError as exc:  # Ray raises when the run directory holds no checkpoint
        raise MmlinksError(f"training produced no checkpoint: {exc}") from exc
    if best is None:
        raise MmlinksError("training produced no checkpoint")
    return result.checkpoint, best


def run_in_process(inp: RunInputs, loop_config: dict, run_dir: Path):
    """``--workers 0``: the loop in this process (``training.loop.train_in_process``), resumed
    from the run folder's latest checkpoint if it has one; (the latest checkpoint, the best one
    by ``select_by``) from the run folder, or MmlinksError."""
    import ray.train

    from schemas.errors import MmlinksError
    from training.loop import train_in_process

    cfg = inp.cfg
    dataset = LocalShards(inp.train_paths, inp.objective.columns, inp.train_limit)
    latest = checkpoints.latest_local(run_dir)  # a rerun of the same run resumes from it
    threads = torch.get_num_threads()  # the loop sets this process's own
    try:
        train_in_process({**loop_config, "local_run_dir": str(run_dir)}, dataset, latest)
    except MmlinksError:
        raise
    except Exception as exc:  # what a Ray worker's failure would report, as one line
        raise MmlinksError(f"training failed: {failure_message(exc)}") from exc
    finally:
        torch.set_num_threads(threads)
    ranked = checkpoints.ranked_local(run_dir, cfg.select_by, SELECTION_ORDER[cfg.select_by])
    if not ranked:
        raise MmlinksError("training produced no checkpoint")
    as_checkpoint = ray.train.Checkpoint.from_directory
    return as_checkpoint(str(checkpoints.latest_local(run_dir))), as_checkpoint(str(ranked[0]))


def fit(
    cfg: TrainConfig, mlflow_run_id: str | None = None, mlflow_tracking_uri: str | None = None
) -> TrainResult:
    """Train on ``cfg.data`` with Ray Train and return the lowest-validation-loss model:
    ``fit_inputs`` on what ``training.run_inputs.read_inputs`` reads of ``cfg``."""
    return fit_inputs(read_inputs(cfg), mlflow_run_id, mlflow_tracking_uri)


def fit_inputs(
    inputs: RunInputs, mlflow_run_id: str | None = None, mlflow_tracking_uri: str | None = None
) -> TrainResult:
    """``fit`` on what was read of the config (``training.run_inputs.RunInputs``); a run that
    died of a full disk fails with one line naming its storage path."""
    from schemas.errors import MmlinksError

    try:
        return train(inputs, mlflow_run_id, mlflow_tracking_uri)
    except MmlinksError as exc:
        full = checkpoints.out_of_space_message(exc, inputs.storage)
        if full is None:
            raise
        raise MmlinksError(full) from exc


def train(inputs: RunInputs, mlflow_run_id: str | None, mlflow_tracking_uri: str | None) -> TrainResult:
    """``fit_inputs``: check, choose, build the workers' config, train, load the best model."""
    import ray.data

    inp = check_trainable(inputs)
    # A fresh name per run: Ray resumes any run whose name already exists under storage, so
    # reusing a fixed name would silently continue (or re-register) an old run. Pass the same
    # run_name and storage_path explicitly to resume after a crash.
    run_name = inp.cfg.run_name or f"train-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    # an in-process run may take the chosen candidate's trial as its own (image_side.choose's keep)
    keep = None if inp.cfg.num_workers else str(Path(inp.storage) / run_name)
    choice = choose_settings(inp, mlflow_run_id, mlflow_tracking_uri, keep)
    if choice is not None:
        inp = dataclasses.replace(inp, cfg=dataclasses.replace(inp.cfg, **choice.overrides))
    cfg = inp.cfg
    loop_config, vocab = worker_loop_config(inp, run_name, mlflow_run_id, mlflow_tracking_uri)
    if mlflow_run_id and mlflow_tracking_uri:
        from training import tracking  # mlflow: the driver's, not every worker's import

        tracking.log_model_params(mlflow_run_id, mlflow_tracking_uri, loop_config["model"])
        if choice is not None:
            tracking.log_choice(mlflow_run_id, mlflow_tracking_uri, choice)
        if choice is not None and choice.trial_kept:  # its epochs' metrics, as the loop logs a run's
            from mlflow.tracking import MlflowClient

            from training.epoch_reports import log_metrics

            client = MlflowClient(mlflow_tracking_uri)
            meta = json.loads((checkpoints.latest_local(Path(keep)) / "meta.json").read_text())
            for metrics in meta["history"]:
                log_metrics(client, mlflow_run_id, metrics, int(metrics["epoch"]))
    if cfg.num_workers:  # --workers 0 reads its shards itself (LocalShards): no Ray to start
        connect_ray(cfg)
        data_ctx = ray.data.DataContext.get_current()
        data_ctx.enable_progress_bars = False
        data_ctx.execution_options.preserve_order = True  # same batches on a resumed run
    model_cfg = loop_config["model"]
    if cfg.num_workers:
        latest, best = best_checkpoint(make_trainer(inp, loop_config, run_name), cfg.select_by)
    else:
        latest, best = run_in_process(inp, loop_config, Path(inp.storage) / run_name)
    with best.as_directory() as d:
        model, meta = load_checkpoint_model(d)
    return TrainResult(
        model=model,
        vocab=vocab,
        model_config=model_cfg,
        best_epoch=int(meta["epoch"]),
        best_val_loss=float(meta["val_loss"]),
        checkpoint_path=best.path,
        checkpoint=best,
        history=history_of(latest, meta),
        choice=choice,
    )


TRIAL_JOBS = 4  # candidates trained at once, one process (one core) each, by choose_settings


def choose_settings(
    inp: RunInputs, run_id: str | None = None, tracking_uri: str | None = None, keep: str | None = None
):
    """What the backbone chooses by measuring the corpus (``BackboneSpec.choose``: the gru
    backbone's image side, issue #60), its candidates trained here by ``train_trial``; None when
    the config names everything. What is under way goes to the run's ``mmlinks.stage`` tag."""
    choose = get_backbone(inp.cfg.model_backbone).choose
    if choose is None:
        return None
    stage = None
    if run_id and tracking_uri:  # mlflow only where tracked (the GPU image has none)
        from training import tracking

        stage = functools.partial(tracking.set_stage, run_id, tracking_uri)
    trial, jobs = functools.partial(train_trial, inp), min(TRIAL_JOBS, usable_cores())
    choice = choose(inp.cfg, inp.train_paths, inp.val_paths, trial, jobs=jobs, stage=stage, keep=keep)
    if choice is not None:
        logging.getLogger("mmlinks.train").info("image side: %s", choice.summary())
    return choice


def train_trial(inp: RunInputs, cfg: TrainConfig, limit: int, run_dir: str, stop: int) -> tuple:
    """(model, vocabulary) of a candidate's run (``BackboneSpec.choose``): ``cfg`` trained in this
    process on the first ``limit`` training documents up to epoch ``stop`` (continued from
    ``run_dir``'s latest checkpoint where an earlier round left one), on its GPU where ``--gpu``
    asks for one and this process sees one; the last epoch's model. The latest checkpoint, not the
    best-ranked: a trial stopped inside the run's warm-up has only unselectable epochs."""
    from training.objectives.registry import adopt_objective

    adopt_objective(inp.objective)  # a candidate may train in a process of its own
    gpu = cfg.use_gpu and torch.cuda.is_available()
    trial = dataclasses.replace(inp, cfg=dataclasses.replace(cfg, use_gpu=gpu), train_limit=limit)
    loop_config, vocab = worker_loop_config(trial, Path(run_dir).name)
    loop_config["test_kill"] = None  # a fault test's kill is for the run, not its candidates
    loop_config["stop_epoch"] = stop
    latest, _ = run_in_process(trial, loop_config, Path(run_dir))
    with latest.as_directory() as d:
        model, _ = load_checkpoint_model(d)
    return model, vocab


def worker_loop_config(
    inp: RunInputs, run_name: str, mlflow_run_id: str | None = None, mlflow_tracking_uri: str | None = None
) -> tuple[dict, Vocabulary]:
    """(what every worker's ``train_loop_per_worker`` gets, the vocabulary): the vocabulary,
    word vectors, model config and feature statistics built from the training split."""
    from training.text import embedding_matrix

    cfg, train_paths = inp.cfg, inp.train_paths
    backbone = get_backbone(cfg.model_backbone)  # a candidate's (train_trial) may differ from the run's
    vocab = Vocabulary.build(training_sentences(train_paths, backbone.needs_regions), cfg.min_word_count)
    emb, _ = embedding_matrix(vocab, cfg.word_vectors, seed=cfg.seed)
    model_cfg = backbone.model_config(cfg, inp.manifest, len(vocab), emb.shape[1], train_paths)
    feature_stats = training_feature_stats(
        train_paths,
        centred=model_cfg.get("image_centring", "none") != "none",
        centre=model_cfg.get("image_centre", "mean"),
    )
    loop_config = {
        "train": dataclasses.replace(cfg, run_name=run_name),  # the config itself, as validated
        "model": model_cfg,
        "regions": needs_regions(model_cfg),  # region features and concept tokens in each batch
        "vocab": vocab.words,
        "embeddings": emb,
        "feature_stats": feature_stats,
        "val_paths": inp.val_paths,
        "mlflow_run_id": mlflow_run_id,
        "mlflow_tracking_uri": mlflow_tracking_uri,
        # the spec itself: an objective registered at run time (a test's) reaches the workers
        "objective_spec": inp.objective,
        "test_kill": fault_hooks.kill_config(),
    }
    return loop_config, vocab
