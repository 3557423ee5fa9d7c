"""The GRU backbone's image side (issues #33, #44, #60): ``--image-centring auto`` trains each
candidate briefly and keeps the one whose validation scores hold the most within-document link
structure; a side given by hand is kept, and a resumed run keeps what it chose."""

import dataclasses
from pathlib import Path

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from pipelines.confounds import dataset_confounds
from schemas.manifest import Manifest
from training.config import TrainConfig
from training.link import image_side as side_mod
from training.link.image_side import (
    AUTO_RATIO,
    AUTO_WEIGHTS,
    CANDIDATES,
    ImageSide,
    choose,
    image_side,
    pick,
    trial_config,
    trial_epochs,
)


def _train_paths(data: Path) -> list[str]:
    return [str(p) for p in Manifest.read(data).shard_paths(data, "train")]


def _val_paths(data: Path) -> list[str]:
    return [str(p) for p in Manifest.read(data).shard_paths(data, "val")]


def _choose_ten_epochs(data: Path, trial, stages: list[str]):
    """``choose`` for a 10-epoch run on ``data``, its stage lines appended to ``stages``."""
    return choose(
        TrainConfig(data=str(data), epochs=10),
        _train_paths(data),
        _val_paths(data),
        trial,
        stage=stages.append,
    )


@pytest.fixture(scope="module")
def looked(dataset, tmp_path_factory):
    from pipelines.image_look import blend_look

    out = tmp_path_factory.mktemp("mean-weight") / "looked"
    blend_look(dataset, out, 0.9, seed=1)
    return out


def test_a_side_given_by_hand_is_kept_and_a_balanced_weight_follows_the_ratio(dataset, looked):
    plain = dataset_confounds(dataset, ["train"])["train"].image_ratio
    strong = dataset_confounds(looked, ["train"])["train"].image_ratio
    assert plain < AUTO_RATIO <= strong, (plain, strong)
    cfg = TrainConfig(data=str(dataset))
    assert cfg.image_mean_weight == -1 and cfg.image_centring == "auto" and cfg.image_dropout == -1
    for data, weight in ((dataset, AUTO_WEIGHTS[0]), (looked, AUTO_WEIGHTS[1])):
        balanced = TrainConfig(data=str(data), image_centring="balanced")
        assert balanced.image_dropout == 0.4  # only auto leaves the dropout to the choice
        assert image_side(balanced, _train_paths(data)) == ImageSide("balanced", weight, 0.4)
    paths = _train_paths(looked)
    for weight in (0.7, 0.0):
        cfg = TrainConfig(data=str(looked), image_centring="balanced", image_mean_weight=weight)
        assert image_side(cfg, paths) == ImageSide("balanced", weight, 0.4)
    none = TrainConfig(data=str(looked), image_centring="none", image_dropout=0.1)
    assert image_side(none, paths) == ImageSide("none", 0.5, 0.1)
    # auto that was never chosen (a model config built outside training.driver.fit): the paper's
    assert image_side(TrainConfig(data=str(looked)), paths) == ImageSide("none", 0.5, 0.4)


@pytest.mark.parametrize("bad", [-0.5, -2.0])
def test_a_negative_weight_other_than_auto_is_refused(bad):
    with pytest.raises(Exception, match=r"image_mean_weight|image-mean-weight"):
        TrainConfig(data="x", image_mean_weight=bad)


def _docs(mean: float, n: int = 60, spread: float = 0.3, seed: int = 0) -> list[float]:
    return list(mean + spread * np.random.default_rng(seed).normal(size=n))


def test_pick_takes_the_best_unless_a_simpler_side_is_within_noise_and_the_bag_below_chance():
    # a clear lead: the best
    assert pick(
        {"none": _docs(0.1), "balanced": _docs(0.4), "balanced+dropout": _docs(0.3), "bag": _docs(0.2)}
    ) == ("balanced", "")
    # the same documents score every candidate: a small lead that every document shows is real
    assert pick({"none": _docs(0.30), "balanced": _docs(0.32), "bag": _docs(0.1, seed=1)}).name == "balanced"
    # a lead the documents cannot tell from noise: the simpler side (PREFERENCE)
    tied = {"none": _docs(0.30, seed=2), "balanced": _docs(0.31, seed=3), "bag": _docs(0.0, seed=4)}
    assert pick(tied).name == "none"
    assert pick({"bag": _docs(0.5, seed=5), "none": _docs(0.5, seed=6)}).name == "bag"
    # no trial linked beyond chance: nothing favours a GRU side, the bag (the floor)
    assert pick({"none": _docs(-0.2), "balanced": _docs(-0.05), "bag": _docs(-0.1)}).name == "bag"
    assert pick({"none": [None, float("nan")], "bag": [None, None]}).name == "none"  # nothing measured
    assert pick({"none": [None, 0.3, 0.4], "bag": [0.1, None, 0.1]}).name == "none"


def test_the_pick_says_why_where_it_is_not_the_top_score():
    """The bag picked below `none`'s mean reads as a mistake unless the line says why: `none`'s
    lead within noise (the simpler side) or no candidate above chance (the floor)."""
    from cli.train import choice_line

    lead, tied = _docs(0.4), _docs(0.38, seed=1)
    assert pick({"none": lead, "bag": _docs(0.1, seed=1)}) == ("none", "")  # the top: no reason
    assert pick({"none": lead, "bag": tied}) == ("bag", "tied")
    at_chance = {"none": _docs(0.01, spread=1.0), "bag": _docs(-0.01, spread=1.0, seed=1)}
    assert pick(at_chance) == ("bag", "chance")
    noise = _docs(0.0, spread=1.0)  # at chance, and the bag a little above it: the floor is the top
    assert pick({"none": noise, "bag": [v + 0.01 for v in noise]}) == ("bag", "")
    assert pick({"none": [None], "bag": [None]}) == ("none", "")  # nothing measured: none's own line
    choice = side_mod.Choice("bag", CANDIDATES["bag"], {"none": 0.4, "bag": 0.38}, 1.0, 100, 3, reason="tied")
    assert "; the top score's lead is within two standard errors: the simpler side (1 s)" in choice.summary()
    line = choice_line(choice.to_dict())
    assert line == (
        "image side: bag (within-document link structure: none 0.400, bag 0.380); "
        "the top score's lead is within two standard errors: the simpler side"
    )


def test_a_trial_is_the_candidate_briefly_in_this_process_the_last_epoch_kept(tmp_path):
    cfg = TrainConfig(data=str(tmp_path), epochs=10, num_workers=2, run_name="mine", select_by="val_within")
    bag = trial_config(cfg, "bag")
    assert (bag.backbone, bag.negatives_warmup, bag.batch_sampling) == ("bag", 0, "random")
    # the run's epochs (a first-round trial stops early: trial_epochs), so its warm-up is the run's
    assert (bag.epochs, bag.select_by, bag.num_workers, bag.run_name) == (10, "last", 0, "")
    balanced = trial_config(cfg, "balanced+dropout")
    assert (balanced.image_centring, balanced.image_dropout, balanced.image_mean_weight) == (
        "balanced",
        0.4,
        1.0,
    )
    # the run's first 3 epochs: its warm-up of 3 as it is (mean negatives throughout), not scaled to the trial
    assert (balanced.negatives_warmup, balanced.negatives, balanced.backbone) == (3, "hard", "gru")
    assert (trial_config(TrainConfig(data="x", epochs=50), "none").negatives_warmup, trial_epochs(50)) == (
        3,
        15,
    )
    assert (trial_epochs(10), trial_epochs(2)) == (3, 2)  # never more than the run


def test_every_epoch_of_a_first_round_trial_pools_mean_negatives_as_the_runs_warm_up_does(dataset):
    """The loss a trial trains on, not only its config: the run's first 3 epochs pool mean
    negatives (its warm-up), so every epoch of a 3-epoch trial must too; the run's 4th is hard."""
    import torch

    from schemas.shards import read_table
    from training.backbone import build_model, get_backbone
    from training.data import TRAINING_COLUMNS, make_batch
    from training.epoch_batches import drop_empty
    from training.objectives.registry import objective_loss
    from training.text import Vocabulary, embedding_matrix

    run = TrainConfig(data=str(dataset), epochs=10, d_multi=16, min_word_count=1, word_vectors="random")
    trial, first = trial_config(run, "none"), trial_epochs(run.epochs)
    assert (first, trial.negatives) == (3, "hard")
    manifest = Manifest.read(dataset)
    table, _ = drop_empty(read_table(manifest.shard_paths(dataset, "train"), columns=TRAINING_COLUMNS))
    table = table.sort_by("doc_id").slice(0, 6)
    vocab = Vocabulary.build([s for doc in table.column("sentences").to_pylist() for s in doc], 1)
    emb, _ = embedding_matrix(vocab, "random", seed=0)
    paths = manifest.shard_paths(dataset, "train")
    model = build_model(
        get_backbone("gru").model_config(trial, manifest, len(vocab), emb.shape[1], paths), emb
    )
    batch = make_batch(table, vocab, 20, np.random.default_rng(0))

    def loss(cfg: TrainConfig, epoch: int) -> float:
        with torch.no_grad():
            return float(
                objective_loss(model.eval(), batch, cfg, torch.Generator().manual_seed(0), epoch=epoch)[0]
            )

    mean = dataclasses.replace(trial, negatives="mean")
    assert [loss(trial, e) for e in range(first)] == [loss(mean, e) for e in range(first)]
    assert loss(run, 3) != loss(dataclasses.replace(run, negatives="mean"), 3)  # the two poolings differ here


def test_choose_trains_every_candidate_then_continues_the_best_two_and_keeps_the_best_there(
    dataset, monkeypatch
):
    """Issue #60: the first round trains every candidate for ``trial_epochs``; its best two go on
    in their own folders (resumed) to the run's epochs and the pick is read there, not after the
    first round: brief trials misrank a side that starts slowly (unlinked images beside 40 topics:
    balanced + dropout, second after 3 epochs, 89.0 AUC in full where the first round's pick read
    74.8). The run then keeps its last epoch, the one read."""
    cfg = TrainConfig(data=str(dataset), epochs=10)
    trained = []
    first, final = (0.1, 0.4, 0.3, 0.2), (0.2, 0.5)  # balanced leads the first round, + dropout the second
    measured = iter([_docs(m) for m in (*first, *final)])

    def trial(trial_cfg, limit, folder, stop):
        side = (trial_cfg.backbone, trial_cfg.image_centring, trial_cfg.image_dropout)
        trained.append((*side, limit, Path(folder).name, trial_cfg.epochs, stop))
        return "model", "vocab"

    monkeypatch.setattr(side_mod, "criterion", lambda *a: next(measured))
    stages = []
    choice = choose(cfg, _train_paths(dataset), _val_paths(dataset), trial, stage=stages.append)
    n_train = Manifest.read(dataset).counts["splits"]["train"]
    assert [t[:3] for t in trained[:3]] == [
        ("gru", "none", 0.0),
        ("gru", "balanced", 0.0),
        ("gru", "balanced", 0.4),
    ]
    assert trained[3][0] == "bag" and all(t[3] == min(side_mod.TRIAL_DOCS, n_train) for t in trained)
    # the run's config throughout (its warm-up); the first round stops at 3, the finalists go on in
    # the same folders to 10
    assert [t[4:] for t in trained] == [(n, 10, 3) for n in CANDIDATES] + [
        ("balanced", 10, 10),
        ("balanced+dropout", 10, 10),
    ]
    assert stages == [
        "choosing the image side: 4 candidates x 3 epochs",
        "choosing the image side: balanced and balanced+dropout on to 10 epochs",
        "image side chosen: balanced+dropout",
    ]
    assert choice.name == "balanced+dropout" and choice.reason == ""
    assert choice.overrides == {**CANDIDATES["balanced+dropout"], "select_by": "last"}
    means = {k: float(np.mean(_docs(m))) for k, m in zip(CANDIDATES, first, strict=True)}
    ended = {
        k: float(np.mean(_docs(m))) for k, m in zip(["balanced", "balanced+dropout"], final, strict=True)
    }
    assert choice.scores == pytest.approx(means) and choice.finalists == pytest.approx(ended)
    assert (choice.trial_epochs, choice.first_epochs) == (10, 3)
    summary = choice.summary()
    assert summary.startswith(
        "balanced+dropout, by within-document link structure on validation after the run's 10 epochs: "
        f"balanced+dropout {ended['balanced+dropout']:.3f}, balanced {ended['balanced']:.3f}; the best 2 of "
        f"4 after 3 epochs on {min(side_mod.TRIAL_DOCS, n_train)} documents: balanced {means['balanced']:.3f}"
    ), summary
    assert summary.endswith("; the run keeps its last epoch"), summary
    from cli.train import choice_line  # what `mmlinks train` prints of it

    line = choice_line(choice.to_dict())
    assert line.startswith(
        f"image side: balanced+dropout (within-document link structure: balanced {ended['balanced']:.3f}, "
        f"balanced+dropout {ended['balanced+dropout']:.3f} after 10 epochs; none {means['none']:.3f}"
    ), line
    # nothing to choose: a side given by hand, or another backbone
    assert choose(TrainConfig(data=str(dataset), image_centring="none"), [], [], trial) is None
    assert choose(TrainConfig(data=str(dataset), backbone="bag"), [], [], trial) is None
    assert len(trained) == 6


def test_a_run_no_longer_than_a_trial_is_chosen_in_one_round_and_a_rule_given_by_hand_is_kept(
    dataset, monkeypatch
):
    """A run of at most ``trial_epochs`` epochs: the first round is the run's length, so it
    decides (the bag included) and the run keeps its last epoch. A ``--select-by`` given by hand is
    the run's, whichever side wins and however many rounds."""
    trained = []

    def trial(trial_cfg, limit, folder, stop):
        trained.append(stop)
        return "model", "vocab"

    measured = iter([_docs(m) for m in (0.1, 0.1, 0.1, 0.4)])
    monkeypatch.setattr(side_mod, "criterion", lambda *a: next(measured))
    cfg = TrainConfig(data=str(dataset), epochs=3)
    short = choose(cfg, _train_paths(dataset), _val_paths(dataset), trial)
    assert trained == [3] * 4 and short.name == "bag" and short.finalists == {}
    assert short.overrides["select_by"] == "last" and short.trial_epochs == short.first_epochs == 3
    assert "after 3 epochs on" in short.summary() and "the best 2" not in short.summary()
    for epochs, best, given in [
        (3, (0.4, 0.1, 0.1, 0.2), "val_loss"),
        (4, (0.4, 0.1, 0.1, 0.2), "val_structure"),
    ]:
        measured = iter([_docs(m) for m in (*best, 0.4, 0.2)])
        cfg = TrainConfig(data=str(dataset), epochs=epochs, select_by=given)
        kept = choose(cfg, _train_paths(dataset), _val_paths(dataset), trial)
        assert kept.name == "none" and kept.overrides["select_by"] == given
        assert "last epoch" not in kept.summary()
    assert trained[4:] == [3] * 4 + [3] * 4 + [4, 4]


@pytest.mark.parametrize(
    "second", ["a gru side leads", "the bag leads", "no finalist links", "the bag too", "none linked yet"]
)
def test_the_bag_is_a_finalist_like_any_other_and_the_floor_where_nothing_links_in_full(
    dataset, monkeypatch, second
):
    """The bag among the best two goes on to the run's epochs as the GRU sides do, and is the pick
    where it leads there or where no finalist links beyond chance (its floor). Where it is not a
    finalist and neither finalist links after the run's epochs, it goes on too (one more trial):
    the floor holds by construction. Where no candidate linked after the first round, its order is
    noise: every candidate goes on (400 documents of issue #33's looks: none linked in 3 epochs,
    balanced + dropout did in 10)."""
    trained = []

    def trial(trial_cfg, limit, folder, stop):
        trained.append((Path(folder).name, stop))
        return "model", "vocab"

    def centred(seed: int, shift: float = 0.0) -> list[float]:  # a mean of exactly ``shift``: chance
        noise = np.array(_docs(0.0, seed=seed))
        return list(noise - noise.mean() + shift)

    bag_finalist = [_docs(0.0, seed=5), _docs(0.0, seed=6), _docs(0.30, seed=2), _docs(0.32, seed=3)]
    later = {
        "a gru side leads": [_docs(0.5), _docs(0.1, seed=1)],
        "the bag leads": [_docs(0.1), _docs(0.5, seed=1)],
        "no finalist links": [centred(7), centred(8, -0.01)],
        "the bag too": [centred(7), centred(8, -0.01), centred(9, -0.02)],
        "none linked yet": [centred(7), centred(8), _docs(0.4), centred(9, 0.01)],
    }[second]
    first = bag_finalist
    if second == "the bag too":  # none and balanced the finalists, the bag last
        first = [_docs(0.30, seed=2), _docs(0.32, seed=3), _docs(0.0, seed=5), _docs(0.0, seed=6)]
    if second == "none linked yet":  # the bag and balanced + dropout ahead, within chance
        first = [centred(1, -0.02), centred(2, -0.01), centred(3, 0.01), centred(4, 0.02)]
    measured = iter(first + later)
    monkeypatch.setattr(side_mod, "criterion", lambda *a: next(measured))
    stages = []
    choice = _choose_ten_epochs(dataset, trial, stages)
    finalists = {"the bag too": ["none", "balanced", "bag"], "none linked yet": list(CANDIDATES)}.get(
        second, ["balanced+dropout", "bag"]
    )
    assert trained == [(n, 3) for n in CANDIDATES] + [(n, 10) for n in finalists]
    assert list(choice.finalists) == finalists
    want = {
        "a gru side leads": ("balanced+dropout", ""),
        "the bag leads": ("bag", ""),
        "no finalist links": ("bag", "chance"),
        "the bag too": ("bag", "chance"),
        "none linked yet": ("balanced+dropout", ""),
    }[second]
    assert (choice.name, choice.reason) == want
    if second == "none linked yet":
        assert (
            stages[1] == "choosing the image side: no candidate linking after 3 epochs: all on to 10 epochs"
        )
    if second == "the bag too":
        assert (
            stages[2] == "choosing the image side: no finalist linking after 10 epochs: bag on to 10 epochs"
        )


def test_where_no_validation_document_can_be_measured_no_candidate_is_trained_and_none_kept(
    dataset, tmp_path, monkeypatch
):
    """Documents of two images or two sentences give ``link_structure`` nothing (None): on a
    corpus of two images a document the choice trains no candidate (their list lengths say so
    before any trial), keeps ``none`` and says why (before, their exact 0s read as 'no candidate
    linking': two rounds of four, then the bag). Where documents could be measured but every
    score came back non-finite, one round and ``none``: a longer one could measure no more."""
    from pipelines.feature_corpus import FeatureCorpusConfig, write_feature_corpus

    trained = []

    def trial(trial_cfg, limit, folder, stop):
        trained.append(stop)
        return "model", "vocab"

    two = tmp_path / "two"
    write_feature_corpus(
        two, FeatureCorpusConfig(docs=40, val_docs=10, test_docs=10, images_min=2, images_max=2)
    )
    stages = []
    cfg = TrainConfig(data=str(two), epochs=10)
    choice = choose(cfg, _train_paths(two), _val_paths(two), trial, stage=stages.append)
    assert trained == [] and stages == ["image side chosen: none"]
    assert choice.name == "none" and choice.overrides == CANDIDATES["none"]
    assert choice.scores == dict.fromkeys(CANDIDATES) and choice.trial_epochs == 0
    assert "none: no validation document of >= 3 sentences and images scored" in choice.summary()
    monkeypatch.setattr(side_mod, "criterion", lambda *a: [None] * 60)
    cfg = TrainConfig(data=str(dataset), epochs=10)
    choice = choose(cfg, _train_paths(dataset), _val_paths(dataset), trial)
    assert trained == [3] * 4 and choice.name == "none" and choice.scores == dict.fromkeys(CANDIDATES)


def test_a_resumed_run_keeps_what_it_chose_without_training():
    cfg = TrainConfig(data="x")
    saved = TrainConfig(data="x", **CANDIDATES["balanced+dropout"]).to_dict()

    def trial(*a):
        raise AssertionError("a resumed run trains no candidate")

    kept = choose(cfg, [], [], trial, saved=saved)
    assert kept.name == "balanced+dropout" and kept.overrides["image_dropout"] == 0.4
    bag_saved = TrainConfig(data="x", **CANDIDATES["bag"]).to_dict()
    assert choose(cfg, [], [], trial, saved=bag_saved).overrides["backbone"] == "bag"
    by_hand = TrainConfig(data="x", **{**CANDIDATES["bag"], "select_by": "val_structure"}).to_dict()
    assert choose(cfg, [], [], trial, saved=by_hand).name == "bag"  # its side, whatever rule it kept
    assert choose(cfg, [], [], trial, saved=by_hand).overrides["select_by"] == "val_structure"
    again = dataclasses.replace(cfg, select_by="val_loss")  # a rule given by hand when resuming wins
    assert choose(again, [], [], trial, saved=bag_saved).overrides["select_by"] == "val_loss"
    assert choose(cfg, [], [], None, saved=None) is None  # nothing saved and no trial: nothing chosen


def test_a_run_resumed_from_before_the_choice_keeps_the_side_its_checkpoint_was_built_with(dataset, tmp_path):
    """A checkpoint written before issue #60 recorded ``auto``; its model config holds what the
    threshold rule resolved it to, and the resumed run keeps that instead of choosing again."""
    import json

    from training.driver import check_inputs

    cfg = TrainConfig(data=str(dataset), storage_path=str(tmp_path), run_name="old", num_workers=0)
    ckpt = tmp_path / "old" / "checkpoint_000001"
    ckpt.mkdir(parents=True)
    model = {"image_centring": "balanced", "image_dropout": 0.4, "image_mean_weight": 1.0}
    (ckpt / "meta.json").write_text(json.dumps({"epoch": 1, "train": cfg.to_dict(), "model": model}))
    kept = check_inputs(cfg).cfg
    assert (kept.image_centring, kept.image_dropout, kept.image_mean_weight) == ("balanced", 0.4, 1.0)
    assert not side_mod.needs_choice(kept)


def test_a_run_resumed_from_before_the_median_centres_as_its_checkpoint_did(dataset, tmp_path):
    """A checkpoint written before ``image_centre`` whose model centred did so on the mean: a rerun
    with the new default (median) would continue another model, so it is refused by name, and
    resumes with ``--image-centre mean``; one whose model did not centre resumes as it is."""
    import json

    from schemas.errors import MmlinksError
    from training.driver import check_inputs

    for run, centring in (("centred", "balanced"), ("plain", "none")):
        cfg = TrainConfig(data=str(dataset), storage_path=str(tmp_path), run_name=run, num_workers=0)
        ckpt = tmp_path / run / "checkpoint_000001"
        ckpt.mkdir(parents=True)
        train = {k: v for k, v in cfg.to_dict().items() if k != "image_centre"}
        model = {"image_centring": centring, "image_dropout": 0.0, "image_mean_weight": 1.0}
        (ckpt / "meta.json").write_text(json.dumps({"epoch": 1, "train": train, "model": model}))
    with pytest.raises(MmlinksError, match=r"image_centre='mean' \(asked 'median'\); use a new --run-name"):
        check_inputs(TrainConfig(data=str(dataset), storage_path=str(tmp_path), run_name="centred"))
    kept = check_inputs(
        TrainConfig(data=str(dataset), storage_path=str(tmp_path), run_name="centred", image_centre="mean")
    ).cfg
    assert (kept.image_centring, kept.image_centre) == ("balanced", "mean")
    plain = check_inputs(TrainConfig(data=str(dataset), storage_path=str(tmp_path), run_name="plain")).cfg
    assert (plain.image_centring, plain.image_centre) == ("none", "median")


def test_a_killed_runs_trials_folder_is_swept_by_the_next_and_no_live_ones(tmp_path):
    """A SIGKILL skips the trials' ``TemporaryDirectory`` cleanup and left four candidates'
    checkpoints beside the run for good; the next choice removes the folders whose process is gone
    and keeps a live process's (this one's too), another host's and any other folder."""
    import os
    import platform
    import subprocess
    import sys
    import tempfile

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = platform.node()
    prefix = side_mod.TRIALS_PREFIX

    def folder(owner: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=f"{prefix}{owner}-", dir=tmp_path))
        (path / "none-3").mkdir()  # a candidate's checkpoints
        return path

    gone = folder(f"{host}-{dead.pid}")
    kept = [
        folder(f"{host}-{os.getppid()}"),
        folder(f"{host}-{os.getpid()}"),
        folder(f"elsewhere-{dead.pid}"),
    ]
    kept += [tmp_path / f"{prefix}old", tmp_path / "run"]  # named otherwise (before the pid was)
    for path in kept[-2:]:
        path.mkdir()
    assert side_mod.trials_prefix() == f"{prefix}{host}-{os.getpid()}-"
    assert side_mod.sweep_killed_trials(tmp_path) == [str(gone)]
    assert not gone.exists() and all(p.exists() for p in kept)


@pytest.mark.slow
def test_candidates_train_in_processes_of_their_own_with_the_runs_inputs(dataset, tmp_path, monkeypatch):
    """Two trials at a time run in processes of their own, each handed the run's inputs: those
    carry the objective's spec, whose loss functions are closures (a plain pickle refused them:
    "Can't pickle local object '_hessel.<locals>.loss'", and every default run on a corpus big
    enough for parallel trials failed). The four candidates share two processes (one each cost a
    torch import per candidate), and so do the finalists after them (two more processes per round
    before: ~3.5 CPU-s each), and each scores as it does trained here, in turn."""
    import functools

    from tests.conftest import small_train_config
    from training.driver import check_inputs, train_trial

    started = []
    real_start = side_mod.TrialProcess.__init__

    def counted(self):
        real_start(self)
        started.append(self.proc.pid)

    monkeypatch.setattr(side_mod.TrialProcess, "__init__", counted)
    monkeypatch.setattr(side_mod, "PARALLEL_MIN_DOC_EPOCHS", 0)  # the fixture's corpus is small
    # 4 epochs: the first round's 3, then a second round (the finalists, or all where none links)
    inp = check_inputs(small_train_config(dataset, tmp_path, image_centring="auto", epochs=4, d_multi=16))
    trial = functools.partial(train_trial, inp)
    choice = choose(inp.cfg, inp.train_paths, inp.val_paths, trial, jobs=2)
    assert choice.name in CANDIDATES and list(choice.scores) == list(CANDIDATES)
    assert choice.trial_epochs == 4 and len(choice.finalists) >= 2, choice
    assert len(started) == 2, started
    here = choose(inp.cfg, inp.train_paths, inp.val_paths, trial, jobs=1)
    # the same scores to float rounding (the first trial of a process may sum in another order, and
    # two epochs of training carry it on: 7e-8 apart on a score of 0.013, 5.5e-6 of it, in one suite
    # run); the pick's noise, two standard errors, is ~1e-2
    assert here.scores == pytest.approx(choice.scores, rel=1e-4, abs=1e-6) and here.name == choice.name


@pytest.mark.parametrize("how", ["raises", "killed"])
def test_a_candidate_failing_in_its_process_fails_the_choice_in_one_line_and_leaves_no_process(
    dataset, monkeypatch, tmp_path, how
):
    """A trial that raises (a full disk) or whose process dies (the OOM killer) ends the choice
    with one line naming the candidate and the cause; the other process starts no candidate
    after it (the bag, last, never trains) and every trial process is gone."""
    from schemas.errors import MmlinksError

    started = []
    real_start = side_mod.TrialProcess.__init__

    def counted(self):
        real_start(self)
        started.append(self.proc)

    monkeypatch.setattr(side_mod.TrialProcess, "__init__", counted)
    monkeypatch.setattr(side_mod, "PARALLEL_MIN_DOC_EPOCHS", 0)

    started_log = tmp_path / "started"

    def trial(trial_cfg, limit, folder, stop):  # pickled by value into the trial processes
        import os
        import time
        import types

        with open(started_log, "a") as log:
            log.write(f"{trial_cfg.backbone}:{trial_cfg.image_centring}:{trial_cfg.image_dropout}\n")
        if trial_cfg.image_centring == "balanced" and trial_cfg.image_dropout == 0:
            # balanced: still training in its process when balanced+dropout fails (waits for it to
            # start, whatever the processes' start-up skew, then for its failure to reach the parent)
            for _ in range(600):
                if ":balanced:0.4" in open(started_log).read():
                    break
                time.sleep(0.1)
            time.sleep(2)
        if trial_cfg.backbone == "gru" and trial_cfg.image_dropout > 0:  # balanced+dropout only
            if how == "killed":
                os._exit(9)
            raise OSError(28, "No space left on device")
        return types.SimpleNamespace(eval=lambda: None), None  # no validation paths: nothing scored

    cfg = TrainConfig(data=str(dataset), epochs=3)
    monkeypatch.setattr("training.data.structure_measurable", lambda paths: True)  # no paths: none read
    with pytest.raises(MmlinksError) as err:
        choose(cfg, _train_paths(dataset), [], trial, jobs=2)
    message = str(err.value)
    assert "\n" not in message and message.startswith("image side: training candidate balanced+dropout")
    assert ("No space left on device" if how == "raises" else "exit 9") in message, message
    assert len(started) == 2 and all(p.poll() is not None for p in started)
    assert not [t for t in started_log.read_text().split() if t.startswith("bag:")], started_log.read_text()


def test_a_trial_process_ended_between_rounds_is_replaced_and_the_choice_goes_on(
    dataset, monkeypatch, tmp_path, caplog
):
    """The processes serve every round (``TrialPool``): one that ended while idle between rounds (the
    OOM killer) held no candidate, so a new one takes its place and every candidate of the next
    round trains; before, the next candidate sent to it failed the choice under its own name."""
    import os
    import signal

    started = []
    real_start, real_run = side_mod.TrialProcess.__init__, side_mod.TrialPool.run

    def counted(self):
        real_start(self)
        started.append(self.proc)

    def run_after_a_kill(self, jobs_args, doc_epochs):
        if self.procs:  # the second round: the first round's processes are idle
            os.kill(self.procs[0].proc.pid, signal.SIGKILL)
            self.procs[0].proc.wait()
        return real_run(self, jobs_args, doc_epochs)

    monkeypatch.setattr(side_mod.TrialProcess, "__init__", counted)
    monkeypatch.setattr(side_mod.TrialPool, "run", run_after_a_kill)
    monkeypatch.setattr(side_mod, "PARALLEL_MIN_DOC_EPOCHS", 0)
    monkeypatch.setattr("training.data.structure_measurable", lambda paths: True)  # no paths: none read
    # a score for every trial (no validation paths: none reads any), none beyond chance: all go on
    monkeypatch.setattr(side_mod, "mean_score", lambda values: 0.0)
    trained = tmp_path / "trained"

    def trial(trial_cfg, limit, folder, stop):  # pickled by value into the trial processes
        import types

        with open(trained, "a") as log:
            log.write(f"{trial_cfg.backbone}:{trial_cfg.image_centring}:{trial_cfg.image_dropout}:{stop}\n")
        return types.SimpleNamespace(eval=lambda: None), None

    with caplog.at_level("WARNING", logger=side_mod.__name__):
        choice = choose(TrainConfig(data=str(dataset), epochs=4), _train_paths(dataset), [], trial, jobs=2)
    assert choice.trial_epochs == 4 and set(choice.finalists) == set(CANDIDATES), choice
    assert sorted(line.rsplit(":", 1)[1] for line in trained.read_text().split()) == ["3"] * 4 + ["4"] * 4
    assert len(started) == 3 and all(p.poll() is not None for p in started)
    assert "a trial process ended between rounds (exit -9)" in caplog.text


@pytest.mark.slow
def test_the_choice_sees_an_offset_that_two_looks_on_half_the_images_give_the_bag(tmp_path):
    """Issue #60: a topic's two looks and a document's own, each on half the images, lift every
    score of the bag's looked images, an offset its AUC pays for (the trials' validation AUC: bag
    81, none 94). In the double-centred cells' units alone the bag tied none (0.456 vs 0.451 here)
    and the choice took it, ~10 AUC below none in full; scaled by the centred cells' share of the
    spread it trails (0.237 vs none 0.348, balanced 0.337) and a GRU side is kept."""
    from pipelines.feature_corpus import FeatureCorpusConfig, write_feature_corpus
    from training.driver import check_trainable, choose_settings
    from training.run_inputs import read_inputs

    data = tmp_path / "two-looks"
    looks = dict(
        look_sharing="topic+document", topics=40, look_strength=4.1, looks_per_topic=2, look_share=0.5
    )
    write_feature_corpus(data, FeatureCorpusConfig(docs=1000, val_docs=100, test_docs=100, **looks))
    # 4 epochs: the first round's 3 are those of the demo's 10 (the same warm-up and plateau), the
    # finalists one more (14,000 trial document-epochs, not 10 epochs' 26,000)
    cfg = TrainConfig(data=str(data), epochs=4, d_multi=256, lr=1e-3, num_workers=0)
    choice = choose_settings(check_trainable(read_inputs(cfg)))
    assert choice.name in ("none", "balanced"), choice.summary()
    assert choice.scores["bag"] < min(choice.scores["none"], choice.scores["balanced"]), choice.summary()


@hypothesis.given(st.lists(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), max_size=4), max_size=3))
@hypothesis.settings(max_examples=25, deadline=None)
def test_structure_measurable_reads_list_lengths_as_the_documents_have_them(shards):
    """Against the brute-force answer: some document of some shard has >= 3 sentences and >= 3
    images (``STRUCTURE_MIN_SIDE``); read from the lengths of the sentences and image ids alone."""
    import tempfile

    from schemas.document import Document, ImageRecord
    from schemas.shards import write_shard
    from training.data import structure_measurable
    from training.metrics import STRUCTURE_MIN_SIDE

    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for s, shard in enumerate(shards):
            docs = [
                Document(f"d{s}-{i}", "synthetic", "val", ["a word"] * n,
                         [ImageRecord(f"{s}{i}{k:062x}", "i.jpg", 4, 4, k, [0.5, 1.0]) for k in range(m)])
                for i, (n, m) in enumerate(shard)
            ]  # fmt: skip
            paths.append(f"{tmp}/val-{s:05d}.parquet")
            write_shard(paths[-1], docs)
        want = any(n >= STRUCTURE_MIN_SIDE and m >= STRUCTURE_MIN_SIDE for shard in shards for n, m in shard)
        assert structure_measurable(paths) is want


def test_a_pick_whose_trial_trained_the_run_is_the_run_itself(dataset, tmp_path, monkeypatch, capsys):
    """Where the trials ran the run's epochs on every training document (here: 4 epochs, the
    first round's 3 and the finalists' one more, resumed from their checkpoints), the pick's trial
    is what an in-process run would train anew with the same config and draws: its checkpoints
    become the run's, which trains no epoch more. The result is the run trained anew with the
    chosen side: the same history and test metrics (a trial stopped inside the warm-up and resumed
    is the run's first epochs), its epochs' metrics in MLflow, and a summary that says so."""
    from mlflow.tracking import MlflowClient

    from models.experiment import run_experiment
    from tests.conftest import small_train_config, tracking_uri
    from training.fault_hooks import EPOCH_LOG_ENV

    base = dict(image_centring="auto", select_by="val_within", epochs=4, d_multi=16)
    cfg = small_train_config(dataset, tmp_path / "kept", run_name="kept", **base)
    monkeypatch.setenv(EPOCH_LOG_ENV, str(tmp_path / "kept.log"))  # the run's epochs (not its trials')
    kept = run_experiment(cfg, tracking_uri(tmp_path / "kept"), None, None)
    assert not (tmp_path / "kept.log").exists()  # it trained none
    choice = kept.choice
    assert choice["trial_kept"] == str(tmp_path / "kept" / "kept") and choice["trial_epochs"] == 4
    assert choice["first_epochs"] == 3 and len(choice["finalists"]) >= 2  # the bag too where none links
    overrides = {**choice["overrides"], "run_name": "anew"}
    anew_cfg = dataclasses.replace(cfg, storage_path=str(tmp_path / "anew"), **overrides)
    monkeypatch.setenv(EPOCH_LOG_ENV, str(tmp_path / "anew.log"))
    anew = run_experiment(anew_cfg, tracking_uri(tmp_path / "anew"), None, None)
    assert (tmp_path / "anew.log").read_text().split() == ["0", "1", "2", "3"]
    assert anew.choice is None and kept.best_epoch == anew.best_epoch == 3
    for key in ("auc", "p_at_1", "p_at_5"):
        assert kept.test[key] == pytest.approx(anew.test[key], rel=1e-5), key
    client = MlflowClient(kept.tracking_uri)
    metrics = client.get_run(kept.run_id).data.metrics  # both rounds' scores, as the record holds them
    for prefix, scores in [("choice_score", choice["scores"]), ("choice_final_score", choice["finalists"])]:
        for name, value in ((n, v) for n, v in scores.items() if v is not None):  # None: not logged
            assert metrics[f"{prefix}.{name.replace('+', '_')}"] == pytest.approx(value), (prefix, name)
    logged = [m.value for m in client.get_metric_history(kept.run_id, "val_loss")]
    trained = [m.value for m in MlflowClient(anew.tracking_uri).get_metric_history(anew.run_id, "val_loss")]
    assert logged == pytest.approx(trained, rel=1e-5) and len(logged) == 4
    summary = side_mod.Choice(**choice).summary()
    assert summary.endswith("; the run is its trial (the run's epochs on all its documents)"), summary
    from cli.train import show_train  # what `mmlinks train` prints of it

    capsys.readouterr()
    show_train(kept.to_dict())
    said = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("image side: ")]
    assert len(said) == 1 and said[0].endswith("; the run is its trial, not trained again"), said


@pytest.mark.parametrize("winner", ["none", "bag"])
def test_the_finalists_continue_their_own_trials_and_the_picks_is_the_run(
    dataset, tmp_path, monkeypatch, winner
):
    """The finalists go on from their first-round checkpoints (the same folder, not anew: their
    first epochs were the run's), with the run's warm-up throughout, so the pick's trial is the
    run: its folder moves to ``keep``, the other finalist's and the first round's do not."""
    trained = []

    def trial(trial_cfg, limit, folder, stop):
        assert Path(folder).parent.parent == tmp_path / "storage"  # beside the run: its move is a rename
        name = Path(folder).name
        first = not Path(folder).exists()
        assert first == (stop == 3)  # the second round resumes what the first left
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"epochs-{stop}").touch()
        trained.append((name, stop, trial_cfg.epochs, trial_cfg.negatives_warmup))
        return "model", "vocab"

    lead = {"none": (0.4, 0.1), "bag": (0.1, 0.4)}[winner]
    measured = iter([_docs(m) for m in (0.4, 0.1, 0.1, 0.3)] + [_docs(m) for m in lead])
    monkeypatch.setattr(side_mod, "criterion", lambda *a: next(measured))
    keep = tmp_path / "storage" / "run"
    choice = choose(
        TrainConfig(data=str(dataset), epochs=10),
        _train_paths(dataset),
        _val_paths(dataset),
        trial,
        keep=str(keep),
    )
    warm = {"bag": 0}
    assert trained == [(n, 3, 10, warm.get(n, 3)) for n in CANDIDATES] + [
        ("none", 10, 10, 3),
        ("bag", 10, 10, 0),
    ]
    assert choice.name == winner and choice.trial_epochs == 10 and choice.trial_kept == str(keep)
    assert choice.reason == "" == choice.to_dict()["reason"] and "standard errors" not in choice.summary()
    assert sorted(p.name for p in keep.iterdir()) == ["epochs-10", "epochs-3"]
    assert not list(keep.parent.glob(f"{side_mod.TRIALS_PREFIX}*"))  # the others went with the folder


def test_a_run_that_can_be_its_trial_trains_the_trials_on_all_its_documents_up_to_a_limit(
    dataset, tmp_path, monkeypatch
):
    """Above ``TRIAL_DOCS`` training documents the trials see the first ``TRIAL_DOCS`` and the run
    trains again; a run that can take its pick's trial (``keep``) trains them on all its documents
    up to ``KEPT_TRIAL_DOCS`` instead, and is its trial (on 3,000 documents that spared the run's
    10 epochs: docs/training.md). A run that cannot (Ray workers: no ``keep``) keeps the subset."""
    n_train = Manifest.read(dataset).counts["splits"]["train"]
    monkeypatch.setattr(side_mod, "TRIAL_DOCS", n_train // 2)
    monkeypatch.setattr(side_mod, "criterion", lambda *a: _docs(0.4))
    limits = []

    def trial(trial_cfg, docs_limit, folder, stop):
        limits.append(docs_limit)
        Path(folder).mkdir(parents=True, exist_ok=True)
        return "model", "vocab"

    cases = ((True, n_train, n_train), (True, n_train - 1, n_train // 2), (False, n_train, n_train // 2))
    for i, (kept, limit, docs) in enumerate(cases):
        monkeypatch.setattr(side_mod, "KEPT_TRIAL_DOCS", limit)
        limits.clear()
        keep = tmp_path / f"storage-{i}" / "run"
        cfg = TrainConfig(data=str(dataset), epochs=10)
        paths = (_train_paths(dataset), _val_paths(dataset))
        choice = choose(cfg, *paths, trial, keep=str(keep) if kept else None)
        assert set(limits) == {docs} and choice.trial_docs == docs, (kept, limit, limits)
        assert bool(choice.trial_kept) == (docs == n_train) == keep.exists(), (kept, limit, choice)
    # a --select-by by hand other than last: the run is trained anew whatever the trials saw, so the subset
    monkeypatch.setattr(side_mod, "KEPT_TRIAL_DOCS", n_train)
    limits.clear()
    keep = tmp_path / "storage-by-hand" / "run"
    cfg = TrainConfig(data=str(dataset), epochs=10, select_by="val_loss")
    choice = choose(cfg, _train_paths(dataset), _val_paths(dataset), trial, keep=str(keep))
    assert set(limits) == {n_train // 2} and not choice.trial_kept and not keep.exists(), (limits, choice)
