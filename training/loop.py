"""The training loop every Ray Train worker runs (or, with ``--workers 0``, the calling process:
``train_in_process``), and its epoch steps.

Why the validation loss picks the checkpoint: it is the same unsupervised loss, all-reduced
across workers, so no label chooses the model. Rank 0 writes checkpoints
(``training/checkpoints.py``) and logs the epoch to MLflow (``training/epoch_reports.py``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from training import checkpoints, fault_hooks
from training.backbone import build_model, optimizer_groups
from training.config import SELECTION_ORDER, WITHIN_SIGNALS, TrainConfig
from training.cores import torch_threads
from training.data import DocBatch, link_scores, make_batch
from training.epoch_batches import epoch_steps, validation_sets
from training.epoch_reports import keep_epoch, log_metrics, report_epoch
from training.metrics import document_metrics, link_structure, within_document_gap
from training.objectives.registry import ObjectiveSpec, objective_loss
from training.text import Vocabulary

# --select-by val_within (val_structure) keeps the latest epoch within this share of the widest so far.
WITHIN_TOLERANCE = 0.1


def plateau_on_within(cfg: TrainConfig) -> bool:
    """Whether the learning-rate plateau follows a within-document signal (the checkpoint's under
    ``--select-by val_within`` or ``val_structure``) rather than the validation loss (the paper's)."""
    return cfg.select_by in WITHIN_SIGNALS


class DivergedError(RuntimeError):
    """The loss became NaN or infinite: training stops, the last good checkpoint stays."""


# A worker's state before each step of an epoch (``agree_step``): its share is used up, its next
# batch has fewer than 2 usable documents (nothing to contrast), or it has a batch to train on.
EXHAUSTED, UNTRAINABLE, TRAINABLE = 0, 1, 2


def agree_step(state: int, world: int, device: torch.device) -> tuple[int, int]:
    """(the largest ``state`` over all workers, how many of them are TRAINABLE): one all-reduce
    of three counts a step.

    DDP all-reduces gradients in every backward and broadcasts buffers in every forward, so all
    workers must run the same number of forward/backward passes in an epoch, or one waits in a
    gradient all-reduce while another sends a buffer broadcast (gloo: "Received data size
    doesn't match expected size", issue #34). Ray's split and empty documents can leave the
    workers with different numbers of batches: with this, the epoch goes on while any worker has
    a batch, a step is taken when any worker can train, and the others join it with a zero-loss
    step (``Worker.zero_step``). The trainers' count scales their loss (``train_epoch``): DDP
    averages gradients over all ``world`` workers, so a padding worker's zero would otherwise
    halve (2 workers) the step the others take."""
    if world == 1:
        return state, int(state == TRAINABLE)
    counts = torch.zeros(3, dtype=torch.int64, device=device)
    counts[state] = 1
    torch.distributed.all_reduce(counts, op=torch.distributed.ReduceOp.SUM)
    found = counts.tolist()
    return max(i for i, n in enumerate(found) if n), found[TRAINABLE]


def epoch_seed(cfg: TrainConfig, rank: int, epoch: int) -> int:
    """All randomness of an epoch derives from (seed, rank, epoch), so a run resumed from the
    checkpoint of epoch e replays epoch e + 1 exactly as an uninterrupted run would."""
    return int(np.random.default_rng([cfg.seed, rank, epoch]).integers(2**31))


def _last_good(epoch: int) -> str:
    return f"epoch {epoch - 1}" if epoch > 0 else "none (first epoch)"


@dataclass
class Worker:
    """One worker's training state: config, objective, model, optimizer and counters."""

    cfg: TrainConfig
    objective: ObjectiveSpec
    rank: int
    world: int
    vocab: Vocabulary
    regions: bool
    device: torch.device
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    sched: object
    state: checkpoints.LoopState
    # a fixed batch of >= 2 validation documents (the same on every worker) for ``zero_step``
    spare: object | None = None

    def to_device(self, b: DocBatch) -> DocBatch:
        if self.device.type == "cpu":
            return b
        b.tokens, b.features = b.tokens.to(self.device), b.features.to(self.device)
        if b.regions is not None:
            b.regions = b.regions.to(self.device)
        return b

    def batch(self, table, rng, reduce: bool = True) -> DocBatch:
        """A batch on the device; the objective's ``prepare`` (e.g. NoStruct's one pair per
        document) applies unless ``reduce`` is False (the full documents, for link scores)."""
        cfg = self.cfg
        if reduce and self.objective.prepare is not None:
            table = self.objective.prepare(table, rng)
        return self.to_device(
            make_batch(table, self.vocab, cfg.max_tokens, rng, self.regions, cfg.max_regions)
        )

    def set_warmup_lr(self) -> None:
        cfg, step = self.cfg, self.state.step
        if step < cfg.warmup_steps:
            for g in self.opt.param_groups:
                g["lr"] = cfg.lr * g.get("lr_scale", 1.0) * max(1e-3, (step + 1) / cfg.warmup_steps)

    def loss(
        self, batch: DocBatch, gen: torch.Generator | None, epoch: int | None = None, model=None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The objective's loss of ``batch`` (and its named parts) through ``model`` (default:
        this worker's, DDP-wrapped where it is)."""
        net = self.model if model is None else model
        return objective_loss(net, batch, self.cfg, gen, self.objective, epoch=epoch)

    def step(self, loss: torch.Tensor) -> None:
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.state.step += 1

    def zero_step(self, epoch: int, gen: torch.Generator) -> None:
        """Join the other workers' step without contributing: the objective's loss x 0 on the
        spare batch, through the model's forward, so this worker takes part in DDP's buffer
        broadcast and gradient all-reduce exactly as they do (a loss built from the parameters
        alone would skip both, and the workers would fall out of step).

        The spare batch is validation data, so the forward must leave no trace: running
        statistics (BatchNorm in Li et al.'s Transformer) are frozen for it, and the zero
        gradient does not dilute the step (``train_epoch`` scales the trainers' loss). The
        optimizer then takes exactly the step the trainers take; only the step count moves."""
        if self.spare is None:
            raise RuntimeError("a worker ran out of training batches and has no validation batch to pad with")
        spare = self.batch(self.spare, None)
        with frozen_running_stats(self.model):
            loss = self.loss(spare, gen, epoch)[0]
        self.step(loss * 0.0)


@contextmanager
def frozen_running_stats(model: torch.nn.Module) -> Iterator[None]:
    """Normalisation layers that track running statistics (BatchNorm, InstanceNorm with
    ``track_running_stats``) in eval mode for the block: a forward uses their statistics and does
    not update them. The other modules keep their mode, so the forward uses the same parameters
    (DDP expects every one of them in each backward)."""
    norms = [
        m
        for m in model.modules()
        if isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.track_running_stats and m.training
    ]
    for m in norms:
        m.eval()
    try:
        yield
    finally:
        for m in norms:
            m.train()


def make_worker(
    config: dict, rank: int, world: int, prepare_model=None, device=None, checkpoint=None
) -> Worker:
    """Build model, optimizer and scheduler from the driver's config; resume from
    ``checkpoint`` (the one Ray hands over), if any."""
    cfg: TrainConfig = config["train"]  # the driver's, as it validated it
    objective: ObjectiveSpec = config["objective_spec"]
    plateau_mode = "max" if plateau_on_within(cfg) else "min"
    torch.set_num_threads(torch_threads(cfg.threads_per_worker))
    torch.manual_seed(cfg.seed)  # identical initial weights on every worker
    model = build_model(config["model"], config.get("embeddings"), config.get("feature_stats"))
    if prepare_model is not None:
        model = prepare_model(model)
    elif device is not None:  # an in-process run on a GPU (``--workers 0 --gpu``)
        model = model.to(device)
    opt = torch.optim.Adam(optimizer_groups(model, cfg.lr), lr=cfg.lr)
    # torch lowers the rate once num_bad_epochs > patience; the paper's rule is "after
    # plateau_patience epochs without improvement", hence the - 1.
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(
        opt,
        mode=plateau_mode,
        factor=cfg.plateau_factor,
        patience=max(0, cfg.plateau_patience - 1),
    )
    state = checkpoints.restore(checkpoint, cfg, model, opt, sched)
    return Worker(
        cfg=cfg,
        objective=objective,
        rank=rank,
        world=world,
        vocab=Vocabulary(config["vocab"]),
        regions=config["regions"],
        device=device or torch.device("cpu"),
        model=model,
        opt=opt,
        sched=sched,
        state=state,
    )


def train_epoch(w: Worker, shard, epoch: int, rng: np.random.Generator, gen: torch.Generator) -> dict:
    """One pass over this worker's training share; timing and loss sums of the epoch."""
    t0 = time.perf_counter()
    w.model.train()
    total, steps, docs, skipped, wait, first_wait, padded, uneven = 0.0, 0, 0, 0, 0.0, None, 0, 0
    parts_sum: dict[str, float] = {}
    # on a GPU the host makes the next batches while the card runs this step
    steps_in = epoch_steps(shard, w.cfg, rng, w.batch, ahead=w.device.type != "cpu")
    while True:
        tw = time.perf_counter()
        item = next(steps_in, None)
        if first_wait is None:  # the epoch's start-up: Ray Data begins a new execution
            first_wait = time.perf_counter() - tw
        else:
            wait += time.perf_counter() - tw
        batch = None
        if item is not None:
            batch, n_empty = item
            skipped += n_empty
        mine = EXHAUSTED if item is None else TRAINABLE if batch is not None else UNTRAINABLE
        anyone, trainers = agree_step(mine, w.world, w.device)  # every worker takes the same steps
        if anyone == EXHAUSTED:
            break
        if anyone == UNTRAINABLE:  # nobody can train on this step: all skip it
            continue
        w.set_warmup_lr()
        uneven += trainers < w.world  # some worker pads this step (every worker knows it)
        if mine != TRAINABLE:  # another worker trains: join its all-reduces with a zero loss
            w.zero_step(epoch, gen)
            padded += 1
            continue
        loss, parts = w.loss(batch, gen, epoch)
        if not torch.isfinite(loss):
            raise DivergedError(
                f"loss diverged ({loss.item()}) at epoch {epoch} step {steps}; training stopped, "
                f"the last good checkpoint is {_last_good(epoch)}; lower --lr or check the features for NaN"
            )
        # DDP averages over every worker; padding workers add zeros: average over the trainers.
        w.step(loss * (w.world / trainers) if trainers < w.world else loss)
        total, steps, docs = total + loss.item(), steps + 1, docs + len(batch)
        for k, v in parts.items():
            parts_sum[k] = parts_sum.get(k, 0.0) + v
    return {
        "total": total,
        "steps": steps,
        "docs": docs,
        "skipped": skipped,
        "wait": wait,
        "first_wait": first_wait or 0.0,
        "time": time.perf_counter() - t0,
        "parts": parts_sum,
        "padded": padded,
        "uneven": uneven,
    }


def validate_epoch(w: Worker, val_batches: list, skipped: int) -> torch.Tensor:
    """[loss x docs, docs, auc sum, auc docs, skipped docs, within-document gap sum, gap docs, link
    structure sum, its docs], summed over all workers (the gap: ``training.metrics.within_document_gap``;
    the structure: ``training.metrics.link_structure``, scale-free; both label-free)."""
    w.model.eval()
    sums = torch.zeros(9, dtype=torch.float64, device=w.device)
    sums[4] = skipped
    # The unwrapped module: workers hold different numbers of validation batches, and a DDP
    # forward would wait for a matching forward (buffer sync) on every other worker.
    net = checkpoints.unwrap(w.model)
    with torch.no_grad():
        for i, table in enumerate(val_batches):
            loss_batch = w.batch(table, None)
            val_gen = torch.Generator().manual_seed(w.cfg.seed * 1_000_003 + w.rank * 10_007 + i)
            sums[0] += w.loss(loss_batch, val_gen, model=net)[0].item() * len(loss_batch)
            sums[1] += len(loss_batch)
            if not w.objective.link_metrics:  # one fused text per document (news samples)
                continue
            full = loss_batch if w.objective.prepare is None else w.batch(table, None, reduce=False)
            rng = np.random.default_rng([w.cfg.seed, w.rank, i])  # link_structure's shuffles
            for doc_id, scores, links in zip(full.doc_ids, link_scores(net, full), full.links, strict=True):
                m = document_metrics(doc_id, scores, links)
                if m is not None:
                    sums[2] += m.auc
                    sums[3] += 1
                gap = within_document_gap(scores)
                if gap is not None:
                    sums[5] += gap
                    sums[6] += 1
                structure = link_structure(scores, rng)
                if structure is not None:
                    sums[7] += structure
                    sums[8] += 1
    if w.world > 1:
        torch.distributed.all_reduce(sums)
    return sums


def extra_val_metrics(w: Worker, all_val: list) -> dict[str, float]:
    """The objective's own validation metrics (retrieval: val_medr over every validation pair,
    the same on every worker), {} for the link objectives."""
    if w.objective.val_metrics is None:
        return {}
    net = checkpoints.unwrap(w.model)
    net.eval()
    batches = []
    for table in all_val:
        batches.append(w.batch(table, None))
    return w.objective.val_metrics(net, batches, w.cfg)


def epoch_metrics(w: Worker, epoch: int, tr: dict, sums: torch.Tensor, extra: dict | None = None) -> dict:
    """Step the scheduler, track the best epoch, and return the epoch's metrics row."""
    cfg, state = w.cfg, w.state
    val_loss = float(sums[0] / sums[1]) if sums[1] else float("nan")
    val_auc = float(100 * sums[2] / sums[3]) if sums[3] else float("nan")
    val_within = float(sums[5] / sums[6]) if sums[6] else float("nan")
    val_structure = float(sums[7] / sums[8]) if sums[8] else float("nan")
    if not np.isfinite(val_loss) and sums[1]:
        raise DivergedError(
            f"validation loss diverged ({val_loss}) at epoch {epoch}; training stopped, the last good "
            f"checkpoint is {_last_good(epoch)}"
        )
    steps, parts = tr["steps"], tr["parts"]
    warm = (
        epoch < cfg.negatives_warmup < cfg.epochs
        and cfg.negatives != "mean"
        and w.objective.model_loss is None
    )
    # The learning rate drops on a plateau of the signal the checkpoint is chosen by, never
    # during the warm-ups. On documents whose images look alike the hard-negative validation
    # loss is lowest at random weights and rises while the mean-negative warm-up teaches the
    # content, so a plateau on it cut the rate 125x before the model had linked anything
    # (issue #33: test AUC 59 on a 600-document corpus at image ratio 12).
    signals = {"val_loss": val_loss, "val_within": val_within, "val_structure": val_structure}
    if state.step >= cfg.warmup_steps and not warm:
        if plateau_on_within(cfg):
            if np.isfinite(signals[cfg.select_by]):
                w.sched.step(signals[cfg.select_by])
        else:
            w.sched.step(val_loss if np.isfinite(val_loss) else tr["total"] / max(steps, 1))
    # The checkpoint kept: lowest validation loss (the paper's), or widest within-document gap;
    # never an epoch of the mean-negatives warm-up when epochs after it follow (its losses and
    # gaps are on another scale than the hard-negative epochs', so they would not compare).
    extra = extra or {}
    value = {**signals, "last": float(epoch), **extra}.get(cfg.select_by, float("nan"))
    minimise = SELECTION_ORDER[cfg.select_by] == "min"
    worst = checkpoints.UNSELECTABLE if minimise else -checkpoints.UNSELECTABLE
    select_score = worst if warm else value
    score = value if minimise else -value
    if plateau_on_within(cfg):
        # The latest epoch whose gap is within WITHIN_TOLERANCE of the widest so far: the gap
        # peaks when the model first links inside documents and then eases off by a few hundredths
        # while the links still improve (issue #33: validation AUC 98.5 at the peak, 99.1 later),
        # so the argmax would stop too early. Ranked by epoch, the latest such epoch wins.
        select_score = worst
        if not warm and np.isfinite(value):
            widest = max(value, -state.best_score) if np.isfinite(state.best_score) else value
            state.best_score = -widest
            if value >= widest - WITHIN_TOLERANCE * abs(widest):
                state.best_val, state.best_epoch, select_score = val_loss, epoch, float(epoch)
    elif not warm and score < state.best_score:
        state.best_score, state.best_val, state.best_epoch = score, val_loss, epoch
    train_time, first_wait = tr["time"], tr["first_wait"]
    return {
        "epoch": epoch,
        "train_loss": tr["total"] / max(steps, 1),
        "val_loss": val_loss,
        "val_auc": val_auc,
        "val_within": val_within,
        "val_structure": val_structure,
        "lr": w.opt.param_groups[0]["lr"],
        "docs_per_s": tr["docs"] * w.world / max(train_time, 1e-9),
        # steady state: time blocked on the loader after the first batch / that time's total
        "data_wait_frac": tr["wait"] / max(train_time - first_wait, 1e-9),
        "epoch_start_s": first_wait,
        "step_s": (train_time - tr["wait"] - first_wait) / max(steps, 1),
        "val_s": tr.get("val_time", 0.0),  # the validation pass (issue #63's time split)
        "skipped_docs": int(sums[4]),
        # steps some worker joined with a padding step (its share had no batch left to train)
        "uneven_steps": tr.get("uneven", 0),
        "best_epoch": state.best_epoch,
        "best_val_loss": state.best_val,
        checkpoints.SELECT_SCORE: select_score,
        **extra,
        **{f"train_loss_{k}": v / max(steps, 1) for k, v in parts.items() if len(parts) > 1},
    }


def train_loop_per_worker(config: dict) -> None:
    """A Ray Train worker's entry point."""
    import ray.train
    import ray.train.torch

    from training.objectives.registry import adopt_objective

    adopt_objective(config["objective_spec"])  # a process of its own: the driver's objective
    cfg: TrainConfig = config["train"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    w = make_worker(
        config,
        rank,
        world,
        prepare_model=ray.train.torch.prepare_model if world > 1 or cfg.use_gpu else None,
        device=ray.train.torch.get_device() if cfg.use_gpu else None,
        checkpoint=ray.train.get_checkpoint(),
    )
    run_epochs(w, config, ray.train.get_dataset_shard("train"), report_epoch)


def train_in_process(config: dict, dataset, resume_from: Path | None = None) -> None:
    """``--workers 0``: the same loop in this process on the training ``dataset`` (a Ray
    Dataset), with no Ray Train controller or worker processes to start (~20 s and ~40 CPU-s a
    run on 2 cores). Ray Train's own local mode (``ScalingConfig(num_workers=0)``) would do the
    same but keeps no checkpoints and refuses to run inside a Ray Tune trial (a grid's); here
    checkpoints are kept under ``config["local_run_dir"]`` (``training.checkpoints.save_local``)
    and a rerun of the same run resumes from the latest (``resume_from``, a checkpoint folder)."""
    import ray.train

    device = torch.device("cuda", 0) if config["train"].use_gpu else None  # ``--gpu``
    w = make_worker(
        config,
        0,
        1,
        device=device,
        checkpoint=ray.train.Checkpoint.from_directory(str(resume_from)) if resume_from else None,
    )
    run_epochs(w, config, dataset, keep_epoch)


def run_epochs(w: Worker, config: dict, train_shard, report) -> None:
    """Train, validate, log and report every remaining epoch; ``report(w, config, epoch,
    metrics)`` hands each epoch's metrics and checkpoint to whoever keeps them."""
    cfg, rank, world = w.cfg, w.rank, w.world
    mlflow_client = None
    if rank == 0 and config.get("mlflow_run_id"):
        from mlflow.tracking import MlflowClient

        from training.tracking import wait_for_sqlite_locks

        wait_for_sqlite_locks()
        mlflow_client = MlflowClient(tracking_uri=config["mlflow_tracking_uri"])
    columns = w.objective.columns
    val_paths = config["val_paths"]
    # this worker's share, the padding batch and, for an objective with metrics of its own (the
    # retrieval objectives' MedR), every validation pair on every worker
    val = validation_sets(
        val_paths, cfg.batch_docs, rank, world, columns, every=bool(w.objective.val_metrics)
    )
    w.spare = val.spare
    # a candidate's trial may stop before the run's epochs (``training.link.image_side.choose``)
    for epoch in range(w.state.start, min(cfg.epochs, config.get("stop_epoch") or cfg.epochs)):
        seed = epoch_seed(cfg, rank, epoch)
        rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)  # dropout masks
        tr = train_epoch(w, train_shard, epoch, rng, gen)
        tv = time.perf_counter()
        sums = validate_epoch(w, val.mine, tr["skipped"])
        extra = extra_val_metrics(w, val.every)
        tr["val_time"] = time.perf_counter() - tv
        metrics = epoch_metrics(w, epoch, tr, sums, extra)
        w.state.history.append(metrics)
        if mlflow_client is not None:
            log_metrics(mlflow_client, config["mlflow_run_id"], metrics, epoch)
        report(w, config, epoch, metrics)
        fault_hooks.after_epoch(rank, epoch, config.get("test_kill"))
