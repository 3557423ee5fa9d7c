"""Checkpoints of a training run and the rules for resuming one.

A folder (``state.pt``, ``meta.json``, ``vocab.json``) evaluates on its own. A run resumes only
with a config continuing the same model and loss (``MODEL_FIELDS``); why exact: an epoch's
randomness derives from (seed, rank, epoch), so a resumed run replays it as an uninterrupted one."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from schemas.errors import storage_full
from training.backbone import build_model, unwrap
from training.config import MODEL_FIELDS, TrainConfig

CHECKPOINT_FILE = "state.pt"
METRICS_FILE = "metrics.json"  # the epoch's reported metrics, next to an in-process run's checkpoint
KEEP_BEST = 2  # checkpoints kept by score (Ray's CheckpointConfig(num_to_keep=2) in make_trainer)


class IncompatibleResumeError(RuntimeError):
    """A run name was reused with a config that would not continue the same model."""


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


@dataclass
class LoopState:
    """What a worker carries from epoch to epoch (and what a checkpoint restores)."""

    start: int = 0  # the first epoch to run
    best_val: float = float("inf")  # the validation loss of the best epoch
    best_epoch: int = -1
    best_score: float = float("inf")  # the --select-by value of the best epoch, as minimised
    history: list[dict] = field(default_factory=list)
    step: int = 0  # optimizer steps so far (the warm-up counts them)


def restore(ckpt, cfg: TrainConfig, model, opt, sched) -> LoopState:
    """Load a Ray checkpoint into model, optimizer and scheduler; the state to continue from."""
    if not ckpt:
        return LoopState()
    with ckpt.as_directory() as d:
        meta = json.loads((Path(d) / "meta.json").read_text())
        check_resumable(meta["train"], cfg)
        state = torch.load(Path(d) / CHECKPOINT_FILE, map_location="cpu", weights_only=False)
    unwrap(model).load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    return LoopState(
        start=state["epoch"] + 1,
        best_val=state["best_val_loss"],
        best_epoch=state["best_epoch"],
        best_score=state.get("best_score", state["best_val_loss"]),  # checkpoints before --select-by
        history=state.get("history", []),
        step=state.get("step", 0),
    )


def write(
    folder: Path,
    *,
    model,
    opt,
    sched,
    state: LoopState,
    epoch: int,
    val_loss: float,
    model_cfg: dict,
    cfg,
    vocab,
) -> None:
    """Write epoch ``epoch``'s checkpoint files into ``folder`` (rank 0 only)."""
    torch.save(
        {
            "model": unwrap(model).state_dict(),
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "epoch": epoch,
            "step": state.step,
            "best_val_loss": state.best_val,
            "best_epoch": state.best_epoch,
            "best_score": state.best_score,
            "val_loss": val_loss,
            "history": state.history,
        },
        folder / CHECKPOINT_FILE,
    )
    (folder / "meta.json").write_text(
        json.dumps(
            {
                "model": model_cfg,
                # checkpoints travel into model artifacts: no addresses or URIs
                "train": cfg.public_dict(),
                "epoch": epoch,
                "history": state.history,
            }
        )
    )
    vocab.save(folder / "vocab.json")  # a checkpoint folder evaluates on its own


def store_model_buffer(folder: str | Path, name: str, value: torch.Tensor) -> None:
    """Set buffer ``name`` of the model state in checkpoint ``folder`` (a copy being packaged):
    what a run computes after its last epoch (a retrieval model's query bank) travels with it."""
    path = Path(folder) / CHECKPOINT_FILE
    state = torch.load(path, map_location="cpu", weights_only=False)
    state["model"][name] = value.detach().cpu().clone()
    torch.save(state, path)


def load_checkpoint_model(path: str | Path) -> tuple[torch.nn.Module, dict]:
    path = Path(path)
    meta = json.loads((path / "meta.json").read_text())
    state = torch.load(path / CHECKPOINT_FILE, map_location="cpu", weights_only=False)
    model = build_model(meta["model"])
    model.load_state_dict(state["model"])
    return model.eval(), {**meta, **{k: state[k] for k in ("epoch", "val_loss", "best_epoch")}}


def saved_meta(storage: str, run_name: str) -> dict | None:
    """The ``meta.json`` (train and model configs) of the newest readable checkpoint of a local
    run directory, if any (a checkpoint cut short by a full disk may hold a truncated
    ``meta.json``: the next one is used)."""
    root = Path(storage) / run_name
    if "://" in storage or not root.is_dir():
        return None
    metas = sorted(root.glob("checkpoint_*/meta.json"), key=lambda p: p.stat().st_mtime)
    for meta in reversed(metas):
        try:
            found = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(found, dict) and isinstance(found.get("train"), dict):
            return found
    return None


def saved_train_config(storage: str, run_name: str) -> dict | None:
    """The train config of the newest readable checkpoint of a local run (``saved_meta``), if any."""
    meta = saved_meta(storage, run_name)
    return None if meta is None else meta["train"]


def resumed_config(storage: str, run_name: str) -> dict | None:
    """The train config a rerun of run ``run_name`` resumes (``saved_meta``), if any. A
    checkpoint written before issue #60 recorded ``image_centring`` auto: its model config holds
    what the threshold rule resolved the image side to, which the resumed run must keep; one
    whose model centred before ``image_centre`` existed centred on the mean. Both configs come
    from one checkpoint's ``meta.json``, read once."""
    meta = saved_meta(storage, run_name)
    if meta is None:
        return None
    saved, model = meta["train"], meta.get("model") or {}
    if "image_centre" not in saved and model.get("image_centring", "none") != "none":
        saved = {**saved, "image_centre": "mean"}  # centred before the median existed (issue #60)
    if saved.get("image_centring") == "auto":
        sides = ("image_centring", "image_dropout", "image_mean_weight")
        saved = {**saved, **{k: model[k] for k in sides if k in model}}
    return saved


def resumed_run_config(cfg: TrainConfig, storage: str, choose, train_paths, val_paths) -> TrainConfig:
    """``cfg`` for a rerun of run ``cfg.run_name`` under ``storage``: what its checkpoint's run
    chose by measuring (``choose``: the backbone's ``BackboneSpec.choose``, or None) kept, and
    refused (``IncompatibleResumeError``) where its model or loss differ; ``cfg`` itself when
    the run has no checkpoint yet."""
    saved = resumed_config(storage, cfg.run_name)
    if saved is None:
        return cfg
    kept = choose(cfg, train_paths, val_paths, None, saved) if choose else None
    if kept is not None:  # a resumed run keeps what it chose
        cfg = dataclasses.replace(cfg, **kept.overrides)
    check_resumable(saved, cfg)
    return cfg


def saved_epoch(storage: str, run_name: str) -> int | None:
    """The epoch of the newest readable checkpoint of a local run directory (what a rerun of the
    run resumes after), if any."""
    root = Path(storage) / run_name
    if "://" in storage or not root.is_dir():
        return None
    epochs = []
    for meta in root.glob("checkpoint_*/meta.json"):
        try:
            epochs.append(int(json.loads(meta.read_text())["epoch"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return max(epochs, default=None)


def resume_line(run_name: str, storage: str, epochs: int) -> str | None:
    """What a rerun says when ``--run-name`` names a run with checkpoints under ``storage``: from
    which epoch its ``epochs`` go on (epochs count from 0, as the history and "best epoch" do);
    None without a checkpoint."""
    last = saved_epoch(storage, run_name)
    if last is None:
        return None
    left = range(last + 1, epochs)
    # (a dict of the three wordings would build the last one, left[0], for an empty range too)
    if not left:
        rest = "no epoch left"
    elif len(left) == 1:
        rest = f"epoch {last + 1} left"
    else:
        rest = f"epochs {left[0]} to {left[-1]} left"
    return f"resuming training run {run_name!r} from its checkpoint of epoch {last}: {rest}"


def out_of_space_message(exc: BaseException, storage: str) -> str | None:
    """One line naming the storage path when a run failed for a full disk, else None.

    Ray Train persists each checkpoint from the worker (``pyarrow`` copies it to the storage
    path); a full disk there ends the run with the worker's ``OSError`` text only
    (``Error writing bytes to file ... No space left on device``), which names no path. Ray's
    checkpoint manager records a checkpoint only once it is whole, so the ones it kept are
    whole and the run resumes from the last of them.
    """
    what = storage_full(exc)
    if what is None:
        return None
    return (
        f"training ran out of space writing checkpoints to {storage or 'the storage path'} ({what}); "
        "the whole checkpoints already there stay: free space (or check the workers' temporary "
        "folder) and run the same command with the same --run-name to resume from the last one"
    )


def history_of(latest, best_meta: dict) -> list[dict]:
    """The whole per-epoch history: Ray Train keeps metrics only next to retained checkpoints,
    and the latest checkpoint (``latest``, a ``ray.train.Checkpoint`` or None) carries every
    epoch."""
    history = best_meta.get("history", [])
    if latest is not None:
        with latest.as_directory() as d:
            history = json.loads((Path(d) / "meta.json").read_text()).get("history", history)
    return history


# An in-process run (``--workers 0``, ``training.loop.train_in_process``) has no Ray Train to keep
# its checkpoints. These functions keep them under the run's folder the way a Ray run does:
# atomically, the KEEP_BEST best by score and the latest, with the metrics that chose them, so
# resume, retention and best-epoch selection work the same with and without worker processes.


def save_local(
    run_dir: Path, epoch: int, metrics: dict, write_files: Callable[[Path], None], select_by: str, order: str
) -> Path:
    """Write epoch ``epoch``'s checkpoint into ``run_dir`` (a temporary folder renamed into
    place, so a killed run never leaves half a checkpoint), then drop the ones Ray would."""
    run_dir.mkdir(parents=True, exist_ok=True)
    final = run_dir / f"checkpoint_{epoch:06d}"
    tmp = run_dir / f".tmp-checkpoint_{epoch:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write_files(tmp)
    (tmp / METRICS_FILE).write_text(json.dumps(metrics))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    keep = {latest_local(run_dir), *ranked_local(run_dir, select_by, order)[:KEEP_BEST]}
    for path, _ in local_checkpoints(run_dir):
        if path not in keep:
            shutil.rmtree(path, ignore_errors=True)
    return final


def local_checkpoints(run_dir: Path) -> list[tuple[Path, dict]]:
    """(folder, metrics) of each complete local-mode checkpoint, oldest epoch first."""
    found = []
    for metrics in sorted(Path(run_dir).glob(f"checkpoint_*/{METRICS_FILE}")):
        found.append((metrics.parent, json.loads(metrics.read_text())))
    return found


# The metric checkpoints are ranked by: the ``--select-by`` metric's value, or UNSELECTABLE (the
# worst, in the metric's direction) for an epoch that must not be chosen (training.loop: the
# mean-negatives warm-up). Checkpoints written before it exist are ranked by ``select_by``.
SELECT_SCORE = "select_score"
UNSELECTABLE = 1e12


def ranked_local(run_dir: Path, select_by: str, order: str) -> list[Path]:
    """The local checkpoints, best ``select_by`` first (non-finite values last, ties: earlier)."""

    def key(item: tuple[Path, dict]) -> tuple[bool, float]:
        v = float(item[1].get(SELECT_SCORE, item[1].get(select_by, math.nan)))
        return (not math.isfinite(v), v if order == "min" else -v)

    return [path for path, _ in sorted(local_checkpoints(run_dir), key=key)]


def latest_local(run_dir: Path) -> Path | None:
    found = local_checkpoints(run_dir)
    return found[-1][0] if found else None
