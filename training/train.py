"""The training loop (one function, run by every Ray Train worker) and the driver that starts it.

Each worker reads its split of the training shards through Ray Data, forms batches of B
documents, and minimises the in-batch hinge loss; gradients are averaged by DDP (gloo on CPU,
NCCL on GPU). The validation loss is the same unsupervised loss on validation documents,
all-reduced across workers; it drives reduce-on-plateau and picks the best checkpoint, so no
label is used to choose the model. Rank 0 writes each epoch's checkpoint and, when a run id is
given, logs the epoch's metrics to MLflow.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from training.config import TrainConfig
from training.data import TRAINING_COLUMNS, DocBatch, make_batch, pad_documents
from training.metrics import document_metrics
from training.model import ModelConfig, MulLink
from training.objectives.loss import in_batch_loss
from training.objectives.similarity import document_similarity
from training.text import Vocabulary

CHECKPOINT_FILE = "state.pt"


def batch_loss(model, batch: DocBatch, cfg: TrainConfig) -> torch.Tensor:
    s, v = model(batch.tokens, batch.lengths, batch.features)
    s_pad, s_mask = pad_documents(s, batch.n_sentences)
    v_pad, v_mask = pad_documents(v, batch.n_images)
    sims = document_similarity(cfg.similarity, s_pad, s_mask, v_pad, v_mask, cfg.k)
    return in_batch_loss(sims, cfg.margin, cfg.negatives)


def link_scores(model: MulLink, batch: DocBatch) -> list[np.ndarray]:
    """Per-document sentence x image cosine matrices."""
    s, v = model(batch.tokens, batch.lengths, batch.features)
    out, so, vo = [], 0, 0
    for n, m in zip(batch.n_sentences, batch.n_images, strict=True):
        out.append((s[so : so + n] @ v[vo : vo + m].T).detach().cpu().numpy())
        so, vo = so + n, vo + m
    return out


def validation_batches(paths: list[str], batch_docs: int, rank: int, world: int) -> list:
    """This worker's share of fixed validation batches.

    The validation loss picks the checkpoint, so it must not depend on which documents happen
    to share a batch: documents are sorted by id, cut into batches of ``batch_docs`` (a short
    tail joins the previous batch, so none has fewer than 2 documents), and batch i goes to
    worker i % world. The loss is then averaged per document, not per batch.
    """
    from schemas.shards import read_table

    table = read_table(paths, columns=TRAINING_COLUMNS).sort_by("doc_id")
    starts = list(range(0, table.num_rows, batch_docs))
    if len(starts) > 1 and table.num_rows - starts[-1] < 2:
        starts.pop()
    bounds = [*starts[1:], table.num_rows]
    batches = [table.slice(s, e - s) for s, e in zip(starts, bounds, strict=True)]
    return [b for i, b in enumerate(batches) if i % world == rank and b.num_rows >= 2]


def _unwrap(model):
    return model.module if hasattr(model, "module") else model


def train_loop_per_worker(config: dict) -> None:
    import ray.train
    import ray.train.torch

    cfg = TrainConfig.from_dict(config["train"])
    torch.set_num_threads(cfg.threads_per_worker)
    torch.manual_seed(cfg.seed)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    rng = np.random.default_rng([cfg.seed, rank])
    vocab = Vocabulary(config["vocab"])
    model_cfg = ModelConfig(**config["model"])
    model = MulLink(model_cfg, config.get("embeddings"), config.get("feature_stats"))
    model = ray.train.torch.prepare_model(model) if world > 1 or cfg.use_gpu else model
    device = ray.train.torch.get_device() if cfg.use_gpu else torch.device("cpu")
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    # torch lowers the rate once num_bad_epochs > patience; the paper's rule is "after
    # plateau_patience epochs without improvement", hence the - 1.
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(
        opt, mode="min", factor=cfg.plateau_factor, patience=max(0, cfg.plateau_patience - 1)
    )
    start, best_val, best_epoch, history = 0, float("inf"), -1, []
    ckpt = ray.train.get_checkpoint()
    if ckpt:  # resume after a failure or a restarted job
        with ckpt.as_directory() as d:
            state = torch.load(Path(d) / CHECKPOINT_FILE, map_location="cpu", weights_only=False)
        _unwrap(model).load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        start, best_val, best_epoch = state["epoch"] + 1, state["best_val_loss"], state["best_epoch"]
        history = state.get("history", [])

    mlflow_client = None
    if rank == 0 and config.get("mlflow_run_id"):
        from mlflow.tracking import MlflowClient

        mlflow_client = MlflowClient(tracking_uri=config["mlflow_tracking_uri"])

    train_shard = ray.train.get_dataset_shard("train")
    val_batches = validation_batches(config["val_paths"], cfg.batch_docs, rank, world)

    def to_device(b: DocBatch) -> DocBatch:
        if device.type == "cpu":
            return b
        b.tokens, b.lengths, b.features = b.tokens.to(device), b.lengths, b.features.to(device)
        return b

    for epoch in range(start, cfg.epochs):
        t0 = time.perf_counter()
        model.train()
        total, steps, docs = 0.0, 0, 0
        for table in train_shard.iter_batches(
            batch_size=cfg.batch_docs, batch_format="pyarrow", local_shuffle_buffer_size=256
        ):
            if table.num_rows < 2:
                continue  # equal splits give every worker the same count, so DDP stays in step
            batch = to_device(make_batch(table, vocab, cfg.max_tokens, rng))
            loss = batch_loss(model, batch, cfg)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, steps, docs = total + loss.item(), steps + 1, docs + len(batch)
        train_time = time.perf_counter() - t0

        model.eval()
        sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss x docs, docs, auc sum, auc docs
        with torch.no_grad():
            for table in val_batches:
                batch = to_device(make_batch(table, vocab, cfg.max_tokens))
                # The unwrapped module: workers hold different numbers of validation batches,
                # and a DDP forward would wait for a matching forward (buffer sync) on every
                # other worker, which never comes.
                sums[0] += batch_loss(_unwrap(model), batch, cfg).item() * len(batch)
                sums[1] += len(batch)
                for doc_id, scores, links in zip(
                    batch.doc_ids, link_scores(_unwrap(model), batch), batch.links, strict=True
                ):
                    m = document_metrics(doc_id, scores, links)
                    if m is not None:
                        sums[2] += m.auc
                        sums[3] += 1
        if world > 1:
            torch.distributed.all_reduce(sums)
        val_loss = float(sums[0] / sums[1]) if sums[1] else float("nan")
        val_auc = float(100 * sums[2] / sums[3]) if sums[3] else float("nan")
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
            "best_epoch": best_epoch,
            "best_val_loss": best_val,
        }
        history.append(metrics)
        if mlflow_client is not None:
            run_id = config["mlflow_run_id"]
            for k in ("train_loss", "val_loss", "val_auc", "lr", "docs_per_s"):
                if np.isfinite(metrics[k]):
                    mlflow_client.log_metric(run_id, k, metrics[k], step=epoch)
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if rank == 0:
                torch.save(
                    {
                        "model": _unwrap(model).state_dict(),
                        "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict(),
                        "epoch": epoch,
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
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report(metrics, checkpoint=checkpoint)


@dataclass
class TrainResult:
    model: MulLink
    vocab: Vocabulary
    model_config: ModelConfig
    best_epoch: int
    best_val_loss: float
    checkpoint_path: str  # where Ray stored it (a path or a URI under storage_path)
    checkpoint: object  # the ray.train.Checkpoint; use .as_directory() to read it anywhere
    history: list[dict]


def load_checkpoint_model(path: str | Path) -> tuple[MulLink, dict]:
    path = Path(path)
    meta = json.loads((path / "meta.json").read_text())
    state = torch.load(path / CHECKPOINT_FILE, map_location="cpu", weights_only=False)
    model = MulLink(ModelConfig(**meta["model"]))
    model.load_state_dict(state["model"])
    return model.eval(), {**meta, **{k: state[k] for k in ("epoch", "val_loss", "best_epoch")}}


def training_feature_stats(paths: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension mean and std of the training images' CNN features (streamed by shard)."""
    from schemas.shards import read_table
    from training.data import features_of

    total, total_sq, n = None, None, 0
    for p in paths:
        feats, _ = features_of(read_table([p], columns=["images"]))
        x = np.concatenate(feats).astype(np.float64)
        total = x.sum(0) if total is None else total + x.sum(0)
        total_sq = (x**2).sum(0) if total_sq is None else total_sq + (x**2).sum(0)
        n += len(x)
    mean = total / n
    return mean.astype(np.float32), np.sqrt(np.maximum(total_sq / n - mean**2, 0)).astype(np.float32)


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
    from schemas.shards import read_table
    from training.text import embedding_matrix

    cfg.validate()
    manifest = Manifest.read(cfg.data)
    train_paths = [str(p) for p in manifest.shard_paths(cfg.data, "train")]
    val_paths = [str(p) for p in manifest.shard_paths(cfg.data, "val")]
    if not train_paths or not val_paths:
        raise MmlinksError(f"{cfg.data} needs train and val shards to train")
    # Reading the sentences also checks every shard's schema version before Ray starts.
    sentences = read_table(train_paths, columns=["sentences"]).column("sentences").to_pylist()
    n_val = read_table(val_paths, columns=["doc_id"]).num_rows
    if n_val < 2:
        raise MmlinksError(f"{cfg.data} has {n_val} validation document(s); the validation loss needs >= 2")
    feature_stats = training_feature_stats(train_paths)
    vocab = Vocabulary.build((s for doc in sentences for s in doc), cfg.min_word_count)
    emb, _ = embedding_matrix(vocab, cfg.word_vectors, seed=cfg.seed)
    model_cfg = ModelConfig(
        vocab_size=len(vocab),
        word_dim=emb.shape[1],
        image_dim=manifest.feature_extractor.dim,
        d_multi=cfg.d_multi,
        image_dropout=cfg.image_dropout,
    )

    if not ray.is_initialized():
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
    ray.data.DataContext.get_current().enable_progress_bars = False
    storage = cfg.storage_path or str(Path(cfg.data).resolve().parent / "ray_results")
    # A fresh name per run: Ray resumes any run whose name already exists under storage, so
    # reusing a fixed name would silently continue (or re-register) an old run. Pass the same
    # run_name and storage_path explicitly to resume after a crash.
    run_name = cfg.run_name or f"train-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "train": cfg.to_dict(),
            "model": model_cfg.to_dict(),
            "vocab": vocab.words,
            "embeddings": emb,
            "feature_stats": feature_stats,
            "val_paths": val_paths,
            "mlflow_run_id": mlflow_run_id,
            "mlflow_tracking_uri": mlflow_tracking_uri,
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
        datasets={
            "train": ray.data.read_parquet(train_paths, columns=TRAINING_COLUMNS).materialize(),
        },
    )
    try:
        result = trainer.fit()
    except ray.train.TrainingFailedError as exc:  # V2 raises instead of returning result.error
        raise MmlinksError(
            f"training failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from exc
    if result.error:
        raise MmlinksError(f"training failed: {result.error}")
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
