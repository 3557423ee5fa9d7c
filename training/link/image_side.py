"""The GRU backbone's image side, chosen by measuring the corpus at hand (issue #60).

``--image-centring auto`` trains each of ``CANDIDATES`` briefly, continues the two whose
validation scores hold the most label-free within-document link structure
(``training.metrics.link_structure``) to the run's epochs and keeps the one that holds the most
there; the bag is a candidate, so the simplest model is the floor.
Why measured, not a rule: a threshold rule on the image ratio lost 6-12 AUC to the bag on
corpora of 2-3 images or several looks per topic (docs/training.md, docs/benchmarks-linking.md).
Its own module because it trains (the registration module only declares)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import pickle
import platform
import queue
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from training.config import AUTO_VALUES, TrainConfig
from training.metrics import STRUCTURE_MIN_SIDE

log = logging.getLogger(__name__)

# name -> the TrainConfig fields it sets. none: each image's feature as it is (the bag's image side);
# balanced: the image minus its document's mean plus the mean at weight 1 (issue #44's looks of
# hundreds of topics or of each document: none stayed at 51-72 there); +dropout: the paper's 0.4 on
# the image feature (issue #33's photo-crop looks linked at 92.7 with it, 68.3 without). The
# paper's none + dropout 0.4 is no candidate: it trailed none in full on both corpora (docs/training.md).
CANDIDATES: dict[str, dict] = {
    "none": {"image_centring": "none", "image_dropout": 0.0, "image_mean_weight": 0.5},
    "balanced": {"image_centring": "balanced", "image_dropout": 0.0, "image_mean_weight": 1.0},
    "balanced+dropout": {"image_centring": "balanced", "image_dropout": 0.4, "image_mean_weight": 1.0},
    # the simplest model, trained as the reference trains it
    "bag": {"backbone": "bag", "negatives_warmup": 0, "select_by": "last", "batch_sampling": "random"},
}
# What a choice may set: a resumed run takes these from its checkpoint's config instead of choosing.
CHOICE_FIELDS = tuple(dict.fromkeys(k for c in CANDIDATES.values() for k in c))
# A candidate trains on the first TRIAL_DOCS training documents for TRIAL_SHARE of the run's
# epochs, at least TRIAL_MIN_EPOCHS: a model learns to link only after some hundreds of steps (on
# 1,500 documents of a topic-looks corpus at lr 1e-3 the none candidate's validation AUC was 59
# after 2 epochs, 67 after 3, and no criterion can rank what has not started to link).
TRIAL_DOCS = 2000
# ... or on all of them, up to KEPT_TRIAL_DOCS, where the pick's trial can be the run (``choose``'s
# keep: a --workers 0 run). The trials train 3 x 3 + 2 x 7 GRU epochs at ~1.4x the run's
# documents/s (two one-thread processes against one two-thread loop): ~17 n document-epochs on all
# n documents, against ~17 x 2,000 + 10 n on 2,000 and the run trained again; even at n ~ 4,900.
KEPT_TRIAL_DOCS = 4800
TRIAL_SHARE = 0.3
TRIAL_MIN_EPOCHS = 3
VAL_DOCS = 1000  # validation documents the criterion reads
# link_structure's chance draws a document: with validation's 8 the pick moved with the draws (4 corpora
CRITERION_SHUFFLES = 64  # of 20, 1 draw in 6 each; with 64, one: docs/benchmarks-linking.md)
# Below this many document-epochs a trial takes a few seconds, less than a process of its own
# costs to start (~2 s importing torch and the project on 2 cores): the trials then run here, in turn.
PARALLEL_MIN_DOC_EPOCHS = 600
# Simplest first: on a tie (a lead within TIE_SE paired standard errors) the simpler side wins.
PREFERENCE = ("bag", "none", "balanced", "balanced+dropout")
TIE_SE = 2.0
# --image-centring balanced with --image-mean-weight -1 (given by hand): weight 1 at training image
# ratios >= AUTO_RATIO, else 0.5 (issue #33: a ratio-12.5 corpus linked only at 1; unconfounded ones
# and the demo best at 0.5)
AUTO_RATIO = 5.0
AUTO_WEIGHTS = (0.5, 1.0)

# (trial config, training-document limit, run folder, epoch to stop after) -> (model, vocabulary):
# the driver's in-process training (``training.driver.train_trial``: resumed from the folder's
# latest checkpoint, so a second round continues the first), passed in so the family never
# imports the driver.
Trial = Callable[["TrainConfig", int, str, int], tuple]
FINALISTS = 2  # the first round's best, continued to the run's epochs (``choose``)


@dataclass
class Choice:
    """What was chosen and why: every candidate's criterion (None where it gave none)."""

    name: str
    overrides: dict
    scores: dict[str, float | None] = field(default_factory=dict)  # every candidate's, the first round's
    seconds: float = 0.0
    trial_docs: int = 0
    trial_epochs: int = 0  # the epochs the pick was read after: the first round's, or the run's
    trial_kept: str = ""  # the pick's trial folder, kept as the run's own (``choose``'s ``keep``)
    # why the pick, where it is not simply the top score (``PICK_REASONS``): "tied" (a simpler side
    # within noise of the top), "chance" (no candidate beat chance: the floor); "" otherwise
    reason: str = ""
    # the first round's best (``FINALISTS``) continued to the run's epochs: their scores there
    finalists: dict[str, float | None] = field(default_factory=dict)
    first_epochs: int = 0  # the first round's epochs

    def summary(self) -> str:
        """One line for a log, the report and the CLI: the pick, then every candidate's score."""
        if not self.scores:
            return f"{self.name} (the resumed run's)"
        last = "; the run keeps its last epoch" if self.overrides.get("select_by") == "last" else ""
        if self.trial_kept:
            last = "; the run is its trial (the run's epochs on all its documents)"
        if all(v is None for v in self.scores.values()):  # pick's fallback (or every score not finite)
            return (
                f"{self.name}: no validation document of >= {STRUCTURE_MIN_SIDE} sentences and images scored "
                f"(candidates trained {self.trial_epochs} epochs; {self.seconds:.0f} s){last}"
            )
        why = f"; {PICK_REASONS[self.reason]}" if self.reason else ""  # the pick is not the top score
        first = f"after {self.first_epochs or self.trial_epochs} epochs on {self.trial_docs} documents"
        if self.finalists:
            return (
                f"{self.name}, by within-document link structure on validation after the run's "
                f"{self.trial_epochs} epochs: {ranked(self.finalists)}{why}; the best {len(self.finalists)} "
                f"of {len(self.scores)} {first}: {ranked(self.scores)} ({self.seconds:.0f} s){last}"
            )
        return (
            f"{self.name}, by within-document link structure on validation {first}: "
            f"{ranked(self.scores)}{why} ({self.seconds:.0f} s){last}"
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def ranked(scores: dict[str, float | None]) -> str:
    """``name score, ...``, the highest first (``-`` where a candidate gave none)."""
    order = sorted(scores.items(), key=lambda kv: -(kv[1] if kv[1] is not None else -math.inf))
    return ", ".join(f"{k} {v:.3f}" if v is not None else f"{k} -" for k, v in order)


def needs_choice(cfg: TrainConfig) -> bool:
    """The GRU backbone of a link objective with ``--image-centring auto``."""
    return (
        cfg.model_backbone == "gru" and cfg.image_centring == "auto" and cfg.objective_spec.family == "link"
    )


def trial_epochs(epochs: int) -> int:
    return min(epochs, max(TRIAL_MIN_EPOCHS, math.ceil(TRIAL_SHARE * epochs)))


def trial_config(cfg: TrainConfig, name: str) -> TrainConfig:
    """Candidate ``name``'s run: its fields on the run's config, the last epoch kept, in this
    process. It keeps the run's epochs, so its warm-up is the run's (mean negatives for the first
    ``negatives_warmup`` epochs, no plateau step meanwhile): a trial stopped after a few epochs is
    the run's first epochs, and a second round resumed from it is the run. Not a warm-up scaled to a
    brief trial: with 1 mean-negative epoch of 3 the hard negatives came before the run's, and
    `none`, slowed by them, trailed `balanced` (0.048 vs 0.106) on unlinked images where in full it
    read 98.6 and `balanced` 89.5; as the run's first 3 epochs, 0.150 vs 0.148, a tie."""
    values = {**CANDIDATES[name], "select_by": "last", "num_workers": 0}
    return dataclasses.replace(cfg, **values, run_name="", max_failures=0)


def validation_scores(model, vocab, val_paths: list[str], max_tokens: int) -> list[tuple]:
    """(score matrix, links) of each of the first ``VAL_DOCS`` validation documents, in order: what
    the criterion reads (links only for a benchmark's labelled check: ``benchmarks/criterion_regret.py``)."""
    import torch

    from schemas.shards import iter_tables
    from training.data import TRAINING_COLUMNS, make_batch
    from training.loop import link_scores

    rows: list[tuple] = []
    model.eval()
    with torch.no_grad():
        for table in iter_tables(val_paths, 64, TRAINING_COLUMNS):
            batch = make_batch(table, vocab, max_tokens, None)
            rows.extend(zip(link_scores(model, batch), batch.links, strict=True))
            if len(rows) >= VAL_DOCS:  # one row per document
                break
    return rows[:VAL_DOCS]


def criterion(model, vocab, val_paths: list[str], max_tokens: int, seed: int) -> list[float | None]:
    """``link_structure`` of each of the first ``VAL_DOCS`` validation documents, in order (None
    where a document has no value: fewer than two sentences or images); no labels read."""
    from training.metrics import link_structure

    rng = np.random.default_rng(seed)
    return [
        link_structure(s, rng, CRITERION_SHUFFLES)
        for s, _ in validation_scores(model, vocab, val_paths, max_tokens)
    ]


def scored_trial(
    trial: Trial, trial_cfg: TrainConfig, docs: int, folder: str, stop: int, val_paths, max_tokens, seed
):
    """One candidate's per-document criterion: its run up to epoch ``stop`` (continued from what
    ``folder`` holds), then ``criterion`` on validation."""
    model, vocab = trial(trial_cfg, docs, folder, stop)
    return criterion(model, vocab, val_paths, max_tokens, seed)


class TrialProcess:
    """A Python process of its own that scores the candidates it is handed, one after another
    (``python -m training.link.image_side``: one args file's path per stdin line, one JSON line
    back). One per parallel job, not one per candidate: a process pays ~2.5 CPU-s importing torch
    and ~1 s more on its first optimizer (torch's lazy import of its compiler), as much as a small
    trial's training. Not multiprocessing: its spawn re-imports the caller's main script, which
    breaks a user's script without a ``__main__`` guard, and a fork would inherit this process's
    torch threads. cloudpickle, not pickle: the run's inputs carry its objective's spec, whose
    loss functions are closures (as Ray's workers receive it)."""

    def __init__(self):
        root = str(Path(__file__).resolve().parents[2])  # the project, importable from anywhere
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        self.stderr = tempfile.TemporaryFile("w+")  # read back only for a failure's last line
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "training.link.image_side"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env={**os.environ, "PYTHONPATH": path},
        )

    def score(self, args: tuple, name: str) -> list[float | None]:
        """``scored_trial(*args)`` in this process (candidate ``name``, for a failure's line)."""
        import cloudpickle

        from schemas.errors import MmlinksError

        path = Path(f"{args[3]}.args.pickle")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(cloudpickle.dumps(args))
        try:
            self.proc.stdin.write(f"{path}\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line.strip():
            self.proc.wait()
            self.stderr.seek(0)
            why = (self.stderr.read().strip().splitlines() or [f"exit {self.proc.returncode}"])[-1]
            raise MmlinksError(f"image side: training candidate {name} failed: {why}")
        return json.loads(line)["values"]

    def close(self) -> None:
        """End the process once its current candidate is done (its stdin closes)."""
        with contextlib.suppress(BrokenPipeError):  # a process that already failed
            self.proc.stdin.close()
        self.proc.wait()
        self.stderr.close()


def mean_score(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None and np.isfinite(v)]
    return float(np.mean(known)) if known else None


class Pick(NamedTuple):
    """``pick``'s candidate and why, where it is not simply the top score (``PICK_REASONS``)."""

    name: str
    reason: str = ""


# Why ``pick`` took a candidate other than the top score, as the summary and `mmlinks train` say it.
PICK_REASONS = {
    "tied": "the top score's lead is within two standard errors: the simpler side",
    "chance": "no candidate linked beyond chance (two standard errors): the floor",
}


def pick(per_doc: dict[str, list[float | None]]) -> Pick:
    """The candidate whose validation documents hold the most link structure on average, unless a
    simpler one (``PREFERENCE``) is within ``TIE_SE`` standard errors of it, paired document by
    document (the same documents score every candidate): a difference the validation split
    cannot tell from noise is no evidence for the more complex side ("tied"). Where no candidate
    beats chance by more than that noise (``beats_chance``: no trial linked inside documents, as on
    8-15-image documents at the demo's settings, where every model stays near chance), nothing
    measured favours a GRU side: the bag, the floor ("chance", unless it is the top score too).
    ``none`` (the bag's image side) where nothing could be measured (no validation document has
    ``STRUCTURE_MIN_SIDE`` sentences and images: on 2-3-image corpora ``none`` linked at or above
    the bag in all five, docs/benchmarks-linking.md)."""
    means = {k: mean_score(v) for k, v in per_doc.items()}
    known = {k: m for k, m in means.items() if m is not None}
    if not known:
        return Pick("none")
    best = max(known, key=lambda k: (known[k], -PREFERENCE.index(k)))
    if "bag" in known and not any(beats_chance(per_doc[k]) for k in known):
        return Pick("bag", "chance" if best != "bag" else "")
    for k in PREFERENCE:
        if k == best:
            return Pick(best)
        if k in known and _tied(per_doc[best], per_doc[k]):
            return Pick(k, "tied")
    return Pick(best)


def beats_chance(values: list[float | None]) -> bool:
    """Whether a candidate's mean criterion is above chance (0) by more than ``TIE_SE`` standard
    errors: the tie rule's evidence, against a model that links nothing. A mean just above 0 (a
    trial at chance on 8-15-image documents, picked, ended 10 AUC below the bag) is no sign that
    the side links."""
    v = np.array([x for x in values if x is not None and np.isfinite(x)], dtype=np.float64)
    return len(v) >= 2 and float(v.mean()) > TIE_SE * float(v.std(ddof=1)) / np.sqrt(len(v))


def _tied(best: list[float | None], other: list[float | None]) -> bool:
    """Whether ``best``'s lead over ``other`` is within TIE_SE standard errors of its paired mean."""
    d = np.array([a - b for a, b in zip(best, other, strict=True) if a is not None and b is not None], float)
    d = d[np.isfinite(d)]
    if len(d) < 2:
        return False
    return float(d.mean()) <= TIE_SE * float(d.std(ddof=1)) / np.sqrt(len(d))


def choose(
    cfg: TrainConfig,
    train_paths: list[str],
    val_paths: list[str],
    trial: Trial | None,
    saved: dict | None = None,
    jobs: int = 1,
    stage: Callable[[str], None] | None = None,
    keep: str | None = None,
) -> Choice | None:
    """The image side of ``cfg``'s run, or None when the config names it (nothing to choose).

    ``saved``: a resumed run's checkpoint config, whose choice is kept (no trials). ``trial``
    trains a candidate; None only with ``saved``. ``jobs`` > 1 trains that many candidates at
    once, each in a process of its own (``trial`` must then pickle): the trials are one-thread
    loops, so on 2 cores two at a time halve their wall time. ``stage``: told what is under way (the
    epoch bar shows it: the trials take minutes before the run's first epoch)."""
    if not needs_choice(cfg):
        return None
    if saved is not None and (saved.get("image_centring") != "auto" or saved.get("backbone") != "gru"):
        kept = {k: saved[k] for k in CHOICE_FIELDS if k in saved}  # its side, whatever its checkpoint rule
        if cfg.select_by != AUTO_VALUES["select_by"]:  # a rule given by hand on this command wins
            kept["select_by"] = cfg.select_by
        same = (n for n, c in CANDIDATES.items() if all(kept.get(k) == c[k] for k in c if k != "select_by"))
        return Choice(next(same, "resumed"), kept)
    if trial is None:
        return None
    stage = stage or (lambda text: None)
    import pyarrow.parquet as pq

    from training.data import structure_measurable

    t0 = time.perf_counter()
    total = sum(pq.ParquetFile(p).metadata.num_rows for p in train_paths)
    # all documents only where the pick's trial can become the run: one kept by its last epoch (a
    # --select-by given by hand other than last trains the run anew, which the subset serves as well)
    can_keep = keep and cfg.select_by in (AUTO_VALUES["select_by"], "last")
    docs = total if can_keep and total <= KEPT_TRIAL_DOCS else min(TRIAL_DOCS, total)
    # Two rounds. The first trains every candidate for trial_epochs and keeps the FINALISTS best; they
    # go on to the run's epochs (resumed: the first round's trials are the run's first epochs) and the
    # pick is read there. Not the first round's pick: brief trials misrank sides that start slowly
    # (unlinked images beside 40 topics: balanced + dropout read 77.0 by labels after 3 epochs, 89.0
    # in full; the first round's pick lost 14.2 AUC to it). Where no candidate links after the first
    # round, all go on; the bag is a finalist where it is among the best two, and goes on too where
    # neither finalist links beyond chance: the floor (pick) holds. Across 23 structures x 2 seeds this
    # lost 0.67 and 0.48 validation AUC on average to the best candidate in full, the first round's pick
    # (with a second round of all where it took the bag) 1.38 and 0.60 (docs/benchmarks-linking-criteria.md).
    first = trial_epochs(cfg.epochs)
    # no validation document of 3 sentences and 3 images (all of 2): no trial could be scored, none is
    # trained; none is kept (pick)
    measurable = structure_measurable(val_paths)
    beside = Path(keep).parent if keep else None  # the trials beside the run's folder: the pick's moves
    if beside:  # there by a rename (atomic), not a copy across filesystems a kill could cut short
        beside.mkdir(parents=True, exist_ok=True)
        sweep_killed_trials(beside)
    with (
        tempfile.TemporaryDirectory(prefix=trials_prefix(), dir=beside) as tmp,
        contextlib.closing(TrialPool(jobs)) as pool,
    ):

        def run_round(names, stop: int, done: int) -> dict[str, list[float | None]]:
            args = {n: (trial, trial_config(cfg, n), docs, f"{tmp}/{n}", stop) for n in names}
            args = {n: (*a, val_paths, cfg.max_tokens, cfg.seed) for n, a in args.items()}
            return pool.run(args, docs * (stop - done))

        scores: dict[str, list[float | None]] = {k: [] for k in CANDIDATES}
        finalists: dict[str, list[float | None]] = {}
        if measurable:
            stage(f"choosing the image side: {len(CANDIDATES)} candidates x {first} epochs")
            scores = run_round(CANDIDATES, first, 0)
            measured = any(mean_score(v) is not None for v in scores.values())  # longer trials could not
            if measured and first < cfg.epochs:
                # where no candidate links yet, the first round's order is noise: every one goes on (on
                # 400 documents of issue #33's looks none linked in 3 epochs; in 10, balanced + dropout did)
                best = finalists_of(scores)
                linking = len(best) < len(scores)
                what = " and ".join(best) if linking else f"no candidate linking after {first} epochs: all"
                stage(f"choosing the image side: {what} on to {cfg.epochs} epochs")
                finalists = run_round(best, cfg.epochs, first)
                if needs_floor(finalists):
                    # the floor (pick's chance rule) needs the bag read at the same length
                    stage(
                        f"choosing the image side: no finalist linking after {cfg.epochs} epochs: "
                        f"bag on to {cfg.epochs} epochs"
                    )
                    finalists |= run_round(["bag"], cfg.epochs, first)
        name, reason = pick(finalists or scores)
        epochs = cfg.epochs if finalists else first if measurable else 0
        stage(f"image side chosen: {name}")
        overrides = dict(CANDIDATES[name])
        if cfg.select_by != AUTO_VALUES["select_by"]:  # a --select-by given by hand: the run keeps it
            overrides["select_by"] = cfg.select_by
        # the pick was read after the run's epochs: the run keeps the last, the one read (by
        # val_within an 8-15-image run kept epoch 3 of 10: 51.1 AUC; its last 59.8; unlinked images
        # beside 40 topics, balanced + dropout: epoch 3, 82.6; its last 87.9)
        elif measurable and epochs >= cfg.epochs:
            overrides["select_by"] = "last"
        # the pick's trial is the run itself where it trained the run's epochs on all its documents
        # and kept the last
        kept = ""
        as_run = measurable and epochs >= cfg.epochs and docs == total and overrides["select_by"] == "last"
        if keep and as_run and not Path(keep).exists():
            kept = str(Path(f"{tmp}/{name}").rename(keep))
    means = {k: mean_score(v) for k, v in scores.items()}
    ended = {k: mean_score(v) for k, v in finalists.items()}
    seconds = time.perf_counter() - t0
    return Choice(
        name, overrides, means, seconds, docs, epochs, kept, reason, ended, first if measurable else 0
    )


def finalists_of(per_doc: dict[str, list[float | None]]) -> list[str]:
    """The ``FINALISTS`` candidates of the highest mean criterion (none: last), in ``CANDIDATES``
    order, a tie the earlier; every candidate where none beats chance (the order is noise then)."""
    if not any(map(beats_chance, per_doc.values())):
        return list(per_doc)
    means = {k: mean_score(v) for k, v in per_doc.items()}
    order = sorted(means, key=lambda k: math.inf if means[k] is None else -means[k])
    return [k for k in per_doc if k in order[:FINALISTS]]


def needs_floor(finalists: dict[str, list[float | None]]) -> bool:
    """Whether the bag must go on too: no finalist beats chance and the bag is none of them, so
    ``pick``'s floor could not hold."""
    return "bag" not in finalists and not any(map(beats_chance, finalists.values()))


TRIALS_PREFIX = "mmlinks-image-side-"


def trials_prefix() -> str:
    """The trials folder's name up to tempfile's random part: whose it is (host and pid), so that
    a later run can tell a killed run's folder from a live one's (``sweep_killed_trials``)."""
    return f"{TRIALS_PREFIX}{platform.node()}-{os.getpid()}-"


def sweep_killed_trials(folder: Path) -> list[str]:
    """Remove the trials folders in ``folder`` that a killed run left (its process gone; a SIGKILL
    skips the ``TemporaryDirectory``'s cleanup: four candidates' checkpoints each time); a live
    process's (this one's too: another run in one of its threads), another host's and a folder
    named otherwise are kept. Returns those removed."""
    import shutil

    from training.processes import process_gone

    removed = []
    for path in folder.glob(f"{TRIALS_PREFIX}*"):
        owner = path.name[len(TRIALS_PREFIX) :].rpartition("-")[0]  # less tempfile's random part
        host, _, pid = owner.rpartition("-")
        if path.is_dir() and process_gone(host, pid):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


class TrialPool:
    """Where a choice's trials train: here in turn, or ``jobs`` at a time in ``jobs`` processes of
    their own (``TrialProcess``) when a round's trials are long enough to pay for one. The processes
    start with the first round that needs them and serve the later one (the finalists; the bag's
    floor, one candidate, trains here): a pair per round paid its torch imports and first optimizer
    again (~3.5 CPU-s a process on 2 cores), four processes a choice, now two. Each process takes the
    next candidate not yet taken, so a quick one (the bag) frees its process."""

    def __init__(self, jobs: int):
        self.jobs = jobs
        self.procs: list[TrialProcess] = []

    def run(self, jobs_args: dict, doc_epochs: int) -> dict[str, list[float | None]]:
        """Every candidate's per-document criterion, in ``jobs_args``' order."""
        jobs = max(1, min(self.jobs, len(jobs_args)))
        if jobs == 1 or doc_epochs < PARALLEL_MIN_DOC_EPOCHS:
            return {name: scored_trial(*a) for name, a in jobs_args.items()}
        # the cores shared between the processes (each would otherwise take them all: torch_threads)
        from training.cores import usable_cores

        threads = max(1, usable_cores() // jobs)
        one = {
            k: (a[0], dataclasses.replace(a[1], threads_per_worker=threads), *a[2:])
            for k, a in jobs_args.items()
        }
        for i, proc in enumerate(self.procs):
            # ended while idle between rounds (the OOM killer): it held no candidate, so another takes
            # its place (not the next candidate's failure under that candidate's name)
            if proc.proc.poll() is not None:
                log.warning(
                    "image side: a trial process ended between rounds (exit %s)", proc.proc.returncode
                )
                proc.close()
                self.procs[i] = TrialProcess()
        while len(self.procs) < jobs:
            self.procs.append(TrialProcess())
        names = queue.SimpleQueue()
        for name in one:
            names.put(name)

        def serve(proc: TrialProcess) -> dict[str, list[float | None]]:  # candidates until none is left
            out = {}
            while True:
                try:
                    name = names.get_nowait()
                except queue.Empty:
                    return out
                try:
                    out[name] = proc.score(one[name], name)
                except BaseException:  # the choice fails: no other process starts another candidate
                    while not names.empty():
                        names.get_nowait()
                    raise

        with ThreadPoolExecutor(jobs) as pool:  # threads that only wait on their processes
            futures = [pool.submit(serve, proc) for proc in self.procs[:jobs]]
            done = {k: v for f in futures for k, v in f.result().items()}
        return {name: done[name] for name in one}  # the candidates' order, whichever process took them

    def close(self) -> None:
        """End every process once its current candidate is done (each waited for, whatever the
        others' close raised: a second Ctrl-C)."""
        procs, self.procs = self.procs, []
        with contextlib.ExitStack() as stack:
            for proc in procs:
                stack.callback(proc.close)


@dataclass(frozen=True)
class ImageSide:
    """What the GRU backbone's image encoder reads: ``ModelConfig``'s three image fields."""

    centring: str
    mean_weight: float
    dropout: float


def training_image_ratio(train_paths: list[str]) -> float | None:
    """The image ratio of the first ``RESIDUAL_SAMPLE`` training documents (None: too few images)."""
    from pipelines.confounds import RESIDUAL_SAMPLE, image_ratio
    from schemas.shards import read_documents

    docs = []
    for path in train_paths:
        docs.extend(read_documents([path]))
        if len(docs) >= RESIDUAL_SAMPLE:
            break
    feats = [[im.features for im in d.images if im.features is not None] for d in docs[:RESIDUAL_SAMPLE]]
    return image_ratio([f for f in feats if f])[0]


def image_side(cfg: TrainConfig, train_paths: list[str]) -> ImageSide:
    """``cfg``'s image side once chosen (``choose``): its three fields, a balanced weight of -1
    resolved from the training split's image ratio (read only then). ``auto`` that reaches here
    (a model config built without ``training.driver.fit``) is the paper's image side."""
    centring, weight, dropout = cfg.image_centring, cfg.image_mean_weight, cfg.image_dropout
    if centring == "auto":
        centring, dropout = "none", 0.4 if dropout < 0 else dropout
    if centring == "balanced" and weight < 0:
        ratio = training_image_ratio(train_paths)
        weight = AUTO_WEIGHTS[ratio is not None and ratio >= AUTO_RATIO]
    return ImageSide(centring, AUTO_WEIGHTS[0] if weight < 0 else weight, 0.4 if dropout < 0 else dropout)


if __name__ == "__main__":  # a TrialProcess: one candidate's args file per stdin line, one JSON line each
    for line in sys.stdin:
        values = scored_trial(*pickle.loads(Path(line.strip()).read_bytes()))
        clean = [v if v is not None and np.isfinite(v) else None for v in values]
        print(json.dumps({"values": clean}), flush=True)
