"""The training loop (one function, run by every Ray Train worker) and the driver that starts it.

Each worker reads its split of the training shards through Ray Data, forms batches of B
documents, and minimises the in-batch hinge loss; gradients are averaged by DDP (gloo on CPU,
NCCL on GPU). The validation loss is the same unsupervised loss on validation documents,
all-reduced across workers; it drives reduce-on-plateau and picks the best checkpoint, so no
label is used to choose the model. Rank 0 writes each epoch's checkpoint and, when a run id is
given, logs the epoch's metrics to MLflow.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from training.backbone import build_model, needs_regions
from training.config import MODEL_FIELDS, TrainConfig
from training.data import TRAINING_COLUMNS, DocBatch, drop_empty, make_batch, one_pair_per_document
from training.metrics import document_metrics
from training.objectives.registry import objective_loss
from training.text import Vocabulary

CHECKPOINT_FILE = "state.pt"
# Fault injection for the resume tests: rank 0 SIGKILLs itself once after reporting this epoch.
KILL_AT_EPOCH_ENV = "MMLINKS_TEST_KILL_AT_EPOCH"
KILL_MARKER_ENV = "MMLINKS_TEST_KILL_MARKER"


class DivergedError(RuntimeError):
    """The loss became NaN or infinite: training stops, the last good checkpoint stays."""


class IncompatibleResumeError(RuntimeError):
    """A run name was reused with a config that would not continue the same model."""


def batch_loss(model, batch: DocBatch, cfg: TrainConfig) -> torch.Tensor:
    return objective_loss(model, batch, cfg)[0]


def link_scores(model, batch: DocBatch) -> list[np.ndarray]:
    """Per-document sentence x image cosine matrices."""
    s, v = model.encode(batch)
    out, so, vo = [], 0, 0
    for n, m in zip(batch.n_sentences, batch.n_images, strict=True):
        out.append((s[so : so + n] @ v[vo : vo + m].T).detach().cpu().numpy())
        so, vo = so + n, vo + m
    return out


def document_batches(shard, batch_docs: int, rng: np.random.Generator) -> Iterator:
    """Batches of ``batch_docs`` documents from this worker's share of the training set.

    Ray Data hands over chunks of a few hundred documents (prefetched in the background) and
    the chunk is shuffled and cut here: asking Ray Data for every 11-document batch costs a
    few milliseconds each, as much as a training step on small documents. Chunks are a
    multiple of the batch size, so every batch but an epoch's last is full, and workers with
    equal shares cut the same number of batches (DDP stays in step).
    """
    chunk = batch_docs * max(1, 256 // batch_docs)
    for table in shard.iter_batches(batch_size=chunk, batch_format="pyarrow", prefetch_batches=2):
        table = table.take(pa.array(rng.permutation(table.num_rows)))
        for start in range(0, table.num_rows, batch_docs):
            yield table.slice(start, batch_docs)


def validation_batches(paths: list[str], batch_docs: int, rank: int, world: int) -> list:
    """This worker's share of fixed validation batches.

    The validation loss picks the checkpoint, so it must not depend on which documents happen
    to share a batch: documents are sorted by id, cut into batches of ``batch_docs`` (a short
    tail joins the previous batch, so none has fewer than 2 documents), and batch i goes to
    worker i % world. The loss is then averaged per document, not per batch.
    """
    from schemas.shards import read_table

    table, _ = drop_empty(read_table(paths, columns=TRAINING_COLUMNS).sort_by("doc_id"))
    starts = list(range(0, table.num_rows, batch_docs))
    if len(starts) > 1 and table.num_rows - starts[-1] < 2:
        starts.pop()
    bounds = [*starts[1:], table.num_rows]
    batches = [table.slice(s, e - s) for s, e in zip(starts, bounds, strict=True)]
    return [b for i, b in enumerate(batches) if i % world == rank and b.num_rows >= 2]


def _unwrap(model):
    return model.module if hasattr(model, "module") else model


def check_resumable(saved: dict, cfg: TrainConfig) -> None:
    """Refuse to continue a checkpoint whose model or loss differ from this config's."""
    old = TrainConfig.from_dict(saved)
    diffs = [
        f"{f}={getattr(old, f)!r} (asked {getattr(cfg, f)!r})"
        for f in MODEL_FIELDS
        if getattr(old, f) != getattr(cfg, f)
    ]
    if diffs:
        raise IncompatibleResumeError(
            f"cannot resume run {cfg.run_name!r}: its checkpoint was trained with "
            + ", ".join(diffs)
            + "; use a new --run-name or the same settings"
        )


def epoch_seed(cfg: TrainConfig, rank: int, epoch: int) -> int:
    """All randomness of an epoch derives from (seed, rank, epoch), so a run resumed from the
    checkpoint of epoch e replays epoch e + 1 exactly as an uninterrupted run would."""
    return int(np.random.default_rng([cfg.seed, rank, epoch]).integers(2**31))


def train_loop_per_worker(config: dict) -> None:
    import ray.train
    import ray.train.torch

    cfg = TrainConfig.from_dict(config["train"])
    torch.set_num_threads(cfg.threads_per_worker)
    torch.manual_seed(cfg.seed)  # identical initial weights on every worker
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    vocab = Vocabulary(config["vocab"])
    model = build_model(config["model"], config.get("embeddings"), config.get("feature_stats"))
    regions = needs_regions(config["model"])
    model = ray.train.torch.prepare_model(model) if world > 1 or cfg.use_gpu else model
    device = ray.train.torch.get_device() if cfg.use_gpu else torch.device("cpu")
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    # torch lowers the rate once num_bad_epochs > patience; the paper's rule is "after
    # plateau_patience epochs without improvement", hence the - 1.
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(
        opt, mode="min", factor=cfg.plateau_factor, patience=max(0, cfg.plateau_patience - 1)
    )
    start, best_val, best_epoch, history, step = 0, float("inf"), -1, [], 0
    ckpt = ray.train.get_checkpoint()
    if ckpt:  # resume after a failure or a restarted job
        with ckpt.as_directory() as d:
            meta = json.loads((Path(d) / "meta.json").read_text())
            check_resumable(meta["train"], cfg)
            state = torch.load(Path(d) / CHECKPOINT_FILE, map_location="cpu", weights_only=False)
        _unwrap(model).load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        start, best_val, best_epoch = state["epoch"] + 1, state["best_val_loss"], state["best_epoch"]
        history, step = state.get("history", []), state.get("step", 0)

    mlflow_client = None
    if rank == 0 and config.get("mlflow_run_id"):
        from mlflow.tracking import MlflowClient

        mlflow_client = MlflowClient(tracking_uri=config["mlflow_tracking_uri"])

    train_shard = ray.train.get_dataset_shard("train")
    val_batches = validation_batches(config["val_paths"], cfg.batch_docs, rank, world)

    def to_device(b: DocBatch) -> DocBatch:
        if device.type == "cpu":
            return b
        b.tokens, b.features = b.tokens.to(device), b.features.to(device)
        if b.regions is not None:
            b.regions = b.regions.to(device)
        return b

    def prepare(table, rng) -> DocBatch:
        if cfg.objective == "nostruct":
            table = one_pair_per_document(table, rng)
        return to_device(make_batch(table, vocab, cfg.max_tokens, rng, regions, cfg.max_regions))

    def set_warmup_lr() -> None:
        if step < cfg.warmup_steps:
            for g in opt.param_groups:
                g["lr"] = cfg.lr * max(1e-3, (step + 1) / cfg.warmup_steps)

    for epoch in range(start, cfg.epochs):
        seed = epoch_seed(cfg, rank, epoch)
        rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)  # dropout masks
        t0 = time.perf_counter()
        model.train()
        total, steps, docs, skipped, wait = 0.0, 0, 0, 0, 0.0
        parts_sum: dict[str, float] = {}
        batches = document_batches(train_shard, cfg.batch_docs, rng)
        first_wait = None
        while True:
            tw = time.perf_counter()
            table = next(batches, None)
            if first_wait is None:  # the epoch's start-up: Ray Data begins a new execution
                first_wait = time.perf_counter() - tw
            else:
                wait += time.perf_counter() - tw
            if table is None:
                break
            table, n_empty = drop_empty(table)
            skipped += n_empty
            set_warmup_lr()
            if table.num_rows < 2:
                if world == 1:
                    continue
                # DDP needs every worker in every all-reduce: a zero loss over all weights.
                loss = sum(p.sum() for p in model.parameters()) * 0.0
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                continue
            batch = prepare(table, rng)
            loss, parts = objective_loss(model, batch, cfg, gen)
            if not torch.isfinite(loss):
                last = f"epoch {epoch - 1}" if epoch > 0 else "none (first epoch)"
                raise DivergedError(
                    f"loss diverged ({loss.item()}) at epoch {epoch} step {steps}; training stopped, "
                    f"the last good checkpoint is {last}; lower --lr or check the features for NaN"
                )
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, steps, docs, step = total + loss.item(), steps + 1, docs + len(batch), step + 1
            for k, v in parts.items():
                parts_sum[k] = parts_sum.get(k, 0.0) + v
        train_time = time.perf_counter() - t0

        model.eval()
        # loss x docs, docs, auc sum, auc docs, skipped docs
        sums = torch.zeros(5, dtype=torch.float64, device=device)
        sums[4] = skipped
        with torch.no_grad():
            for i, table in enumerate(val_batches):
                # The unwrapped module: workers hold different numbers of validation batches,
                # and a DDP forward would wait for a matching forward (buffer sync) on every
                # other worker, which never comes.
                net = _unwrap(model)
                loss_batch = prepare(table, None)
                val_gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + rank * 10_007 + i)
                sums[0] += objective_loss(net, loss_batch, cfg, val_gen)[0].item() * len(loss_batch)
                sums[1] += len(loss_batch)
                full = (
                    loss_batch
                    if cfg.objective != "nostruct"
                    else to_device(make_batch(table, vocab, cfg.max_tokens, None, regions, cfg.max_regions))
                )
                for doc_id, scores, links in zip(
                    full.doc_ids, link_scores(net, full), full.links, strict=True
                ):
                    m = document_metrics(doc_id, scores, links)
                    if m is not None:
                        sums[2] += m.auc
                        sums[3] += 1
        if world > 1:
            torch.distributed.all_reduce(sums)
        val_loss = float(sums[0] / sums[1]) if sums[1] else float("nan")
        val_auc = float(100 * sums[2] / sums[3]) if sums[3] else float("nan")
        if not np.isfinite(val_loss) and sums[1]:
            raise DivergedError(
                f"validation loss diverged ({val_loss}) at epoch {epoch}; training stopped, the last good "
                f"checkpoint is {f'epoch {epoch - 1}' if epoch > 0 else 'none (first epoch)'}"
            )
        if step >= cfg.warmup_steps:  # warm-up owns the rate until it ends
            sched.step(val_loss if np.isfinite(val_loss) else total / max(steps, 1))
        if val_loss < best_val:
            best_val, best_epoch = val_loss, epoch
        metrics = {
            "epoch": epoch,
            "train_loss": total / max(steps, 1),
            "val_loss": val_loss,
            "val_auc": val_auc,
            "lr": opt.param_groups[0]["lr"],
            "docs_per_s": docs * world / max(train_time, 1e-9),
            # steady state: time blocked on the loader after the first batch / that time's total
            "data_wait_frac": wait / max(train_time - (first_wait or 0.0), 1e-9),
            "epoch_start_s": first_wait or 0.0,
            "step_s": (train_time - wait - (first_wait or 0.0)) / max(steps, 1),
            "skipped_docs": int(sums[4]),
            "best_epoch": best_epoch,
            "best_val_loss": best_val,
            **{f"train_loss_{k}": v / max(steps, 1) for k, v in parts_sum.items() if len(parts_sum) > 1},
        }
        history.append(metrics)
        if mlflow_client is not None:
            run_id = config["mlflow_run_id"]
            for k, v in metrics.items():
                if k not in ("epoch", "best_epoch", "best_val_loss") and np.isfinite(v):
                    mlflow_client.log_metric(run_id, k, v, step=epoch)
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if rank == 0:
                torch.save(
                    {
                        "model": _unwrap(model).state_dict(),
                        "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict(),
                        "epoch": epoch,
                        "step": step,
                        "best_val_loss": best_val,
                        "best_epoch": best_epoch,
                        "val_loss": val_loss,
                        "history": history,
                    },
                    Path(tmp) / CHECKPOINT_FILE,
                )
                (Path(tmp) / "meta.json").write_text(
                    json.dumps(
                        {
                            "model": config["model"],
                            # checkpoints travel into model artifacts: no addresses or URIs
                            "train": cfg.public_dict(),
                            "epoch": epoch,
                            "history": history,
                        }
                    )
                )
                vocab.save(Path(tmp) / "vocab.json")  # a checkpoint folder evaluates on its own
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report(metrics, checkpoint=checkpoint)
        _maybe_kill_for_test(rank, epoch, config.get("test_kill"))


def _maybe_kill_for_test(rank: int, epoch: int, kill: dict | None) -> None:
    """SIGKILL rank 0 once after epoch ``kill["epoch"]`` (the marker file makes it once): how
    the tests kill a worker for real. The driver sets ``kill`` only from the environment
    variables ``MMLINKS_TEST_KILL_AT_EPOCH`` and ``MMLINKS_TEST_KILL_MARKER``."""
    if not kill or rank != 0 or int(kill["epoch"]) != epoch or Path(kill["marker"]).exists():
        return
    Path(kill["marker"]).write_text(str(epoch))
    os.kill(os.getpid(), signal.SIGKILL)


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


def load_checkpoint_model(path: str | Path) -> tuple[torch.nn.Module, dict]:
    path = Path(path)
    meta = json.loads((path / "meta.json").read_text())
    state = torch.load(path / CHECKPOINT_FILE, map_location="cpu", weights_only=False)
    model = build_model(meta["model"])
    model.load_state_dict(state["model"])
    return model.eval(), {**meta, **{k: state[k] for k in ("epoch", "val_loss", "best_epoch")}}


def training_feature_stats(paths: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension mean and std of the training images' CNN features (streamed by shard)."""
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
    return mean.astype(np.float32), np.sqrt(np.maximum(total_sq / n - mean**2, 0)).astype(np.float32)


def training_sentences(paths: list[str], with_concepts: bool) -> Iterator[str]:
    """Training sentences shard by shard (never the whole corpus in memory), plus the region
    labels when the backbone reads them as concept tokens sharing the word embedding."""
    from schemas.shards import read_table

    for p in paths:
        for doc in read_table([p], columns=["sentences"]).column("sentences").to_pylist():
            yield from doc
    if with_concepts:
        from training.regions import concept_words

        yield from concept_words(paths)


def model_config(cfg: TrainConfig, manifest, vocab_size: int, word_dim: int, train_paths: list[str]) -> dict:
    from schemas.errors import MmlinksError

    if cfg.backbone == "gru":
        from training.model import ModelConfig

        return ModelConfig(
            vocab_size=vocab_size,
            word_dim=word_dim,
            image_dim=manifest.feature_extractor.dim,
            d_multi=cfg.d_multi,
            image_dropout=cfg.image_dropout,
        ).to_dict()
    from training.regions import region_dim
    from training.transformer import TransformerConfig

    dim = region_dim(train_paths)
    if dim is None:
        raise MmlinksError(
            f"{cfg.data} has no region features; --backbone transformer needs them: rebuild the "
            "dataset with --regions (e.g. --regions grid-lite0 offline, fasterrcnn-r50-fpn with weights)"
        )
    return TransformerConfig(
        vocab_size=vocab_size,
        word_dim=word_dim,
        image_dim=manifest.feature_extractor.dim,
        region_dim=dim,
        d_multi=cfg.d_multi,
        layers=cfg.transformer_layers,
        heads=cfg.transformer_heads,
        max_tokens=cfg.max_tokens,
        max_regions=cfg.max_regions,
    ).to_dict()


def saved_train_config(storage: str, run_name: str) -> dict | None:
    """The train config of the newest checkpoint of a local run directory, if any."""
    root = Path(storage) / run_name
    if "://" in storage or not root.is_dir():
        return None
    metas = sorted(root.glob("checkpoint_*/meta.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(metas[-1].read_text())["train"] if metas else None


CACHE_LIMIT_BYTES = 2 << 30  # "auto" caches training shards up to this size on disk


def shard_bytes(paths: list[str]) -> int:
    import pyarrow.fs as pafs

    total = 0
    for p in paths:
        fs, path = pafs.FileSystem.from_uri(p) if "://" in p else (pafs.LocalFileSystem(), p)
        total += fs.get_file_info(path).size or 0
    return total


def training_dataset(paths: list[str], cache: str):
    """The training documents as a Ray Dataset, split between the workers every epoch.

    Streamed (``no``, and ``auto`` above 2 GiB of shards): every epoch reads the shards again,
    so the training set never has to fit in the cluster's memory. Cached (``yes``, and ``auto``
    for smaller data): read once into the object store (which spills to disk under pressure),
    so an epoch does not pay Ray Data's start-up and Parquet decoding again; on small data
    that start-up would otherwise dominate the data wait.
    """
    import ray.data

    ds = ray.data.read_parquet(paths, columns=TRAINING_COLUMNS)
    if cache == "yes" or (cache == "auto" and shard_bytes(paths) <= CACHE_LIMIT_BYTES):
        ds = ds.materialize()
    return ds


def connect_ray(cfg: TrainConfig) -> bool:
    """Join ``cfg.ray_address`` or start a local Ray, unless one is running; True if started."""
    import ray

    if ray.is_initialized():
        return False
    if cfg.ray_address:
        ray.init(address=cfg.ray_address, log_to_driver=cfg.ray_logs)
    else:
        # Logical CPUs above the core count leave room for Ray Data's read tasks next to the
        # training workers (otherwise two workers on two cores starve the data pipeline).
        # address="local" always starts a fresh instance, never attaches to a stray cluster.
        ray.init(
            address="local",
            num_cpus=max(4, (os.cpu_count() or 1) * 2),
            include_dashboard=False,
            log_to_driver=cfg.ray_logs,
            configure_logging=cfg.ray_logs,
        )
    return True


def failure_message(exc: BaseException) -> str:
    """The one line that says why workers failed: our own errors first, then the last
    ``SomeError: message`` line of the workers' tracebacks, else the first line."""
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for marker in ("loss diverged", "validation loss diverged", "cannot resume run"):
        for line in lines:
            if marker in line:
                return line[line.index(marker) :]
    errors = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b.*:", ln)]
    if errors:
        return errors[-1]
    return lines[0] if lines else type(exc).__name__


def fit(
    cfg: TrainConfig,
    mlflow_run_id: str | None = None,
    mlflow_tracking_uri: str | None = None,
) -> TrainResult:
    """Train on ``cfg.data`` with Ray Train and return the lowest-validation-loss model."""
    import ray
    import ray.data
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from schemas.errors import MmlinksError
    from schemas.manifest import Manifest
    from schemas.shards import check_shards, read_table
    from training.text import embedding_matrix

    cfg.validate()
    if "://" not in cfg.data:  # Ray workers may run in another directory (or on another node)
        cfg = dataclasses.replace(cfg, data=str(Path(cfg.data).resolve()))
    manifest = Manifest.read(cfg.data)
    train_paths = [str(p) for p in manifest.shard_paths(cfg.data, "train")]
    val_paths = [str(p) for p in manifest.shard_paths(cfg.data, "val")]
    if not train_paths or not val_paths:
        raise MmlinksError(f"{cfg.data} needs train and val shards to train")
    check_shards(train_paths + val_paths)  # schema versions, before Ray starts
    n_val = read_table(val_paths, columns=["doc_id"]).num_rows
    if n_val < 2:
        raise MmlinksError(f"{cfg.data} has {n_val} validation document(s); the validation loss needs >= 2")
    storage = cfg.storage_path or str(Path(cfg.data).resolve().parent / "ray_results")
    if cfg.run_name:
        saved = saved_train_config(storage, cfg.run_name)
        if saved is not None:
            try:
                check_resumable(saved, cfg)
            except IncompatibleResumeError as exc:
                raise MmlinksError(str(exc)) from None
    feature_stats = training_feature_stats(train_paths)
    vocab = Vocabulary.build(
        training_sentences(train_paths, cfg.backbone == "transformer"), cfg.min_word_count
    )
    emb, _ = embedding_matrix(vocab, cfg.word_vectors, seed=cfg.seed)
    model_cfg = model_config(cfg, manifest, len(vocab), emb.shape[1], train_paths)

    connect_ray(cfg)
    data_ctx = ray.data.DataContext.get_current()
    data_ctx.enable_progress_bars = False
    data_ctx.execution_options.preserve_order = True  # same batches on a resumed run
    # A fresh name per run: Ray resumes any run whose name already exists under storage, so
    # reusing a fixed name would silently continue (or re-register) an old run. Pass the same
    # run_name and storage_path explicitly to resume after a crash.
    run_name = cfg.run_name or f"train-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "train": {**cfg.to_dict(), "run_name": run_name},
            "model": model_cfg,
            "vocab": vocab.words,
            "embeddings": emb,
            "feature_stats": feature_stats,
            "val_paths": val_paths,
            "mlflow_run_id": mlflow_run_id,
            "mlflow_tracking_uri": mlflow_tracking_uri,
            "test_kill": {"epoch": os.environ[KILL_AT_EPOCH_ENV], "marker": os.environ[KILL_MARKER_ENV]}
            if KILL_AT_EPOCH_ENV in os.environ and KILL_MARKER_ENV in os.environ
            else None,
        },
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu),
        run_config=RunConfig(
            name=run_name,
            storage_path=storage,
            checkpoint_config=CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="val_loss", checkpoint_score_order="min"
            ),
            failure_config=FailureConfig(max_failures=cfg.max_failures),
        ),
        datasets={"train": training_dataset(train_paths, cfg.cache_data)},
    )
    try:
        result = trainer.fit()
    except ray.train.TrainingFailedError as exc:  # V2 raises instead of returning result.error
        raise MmlinksError(f"training failed: {failure_message(exc)}") from exc
    if result.error:
        raise MmlinksError(f"training failed: {failure_message(result.error)}")
    try:
        best = result.get_best_checkpoint(metric="val_loss", mode="min")
    except RuntimeError as exc:  # Ray raises when the run directory holds no checkpoint
        raise MmlinksError(f"training produced no checkpoint: {exc}") from exc
    if best is None:
        raise MmlinksError("training produced no checkpoint")
    with best.as_directory() as d:
        model, meta = load_checkpoint_model(d)
    # Ray Train keeps metrics only next to retained checkpoints; the latest one carries the
    # whole per-epoch history.
    history = meta.get("history", [])
    if result.checkpoint is not None:
        with result.checkpoint.as_directory() as d:
            history = json.loads((Path(d) / "meta.json").read_text()).get("history", history)
    return TrainResult(
        model=model,
        vocab=vocab,
        model_config=model_cfg,
        best_epoch=int(meta["epoch"]),
        best_val_loss=float(meta["val_loss"]),
        checkpoint_path=best.path,
        checkpoint=best,
        history=history,
    )
