"""``benchmarks/criterion_regret.py`` (issue #60): the criterion before the offsets fix is
recovered exactly, and a criterion's regret is read against the candidates' labelled AUC."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

# by path: an installed dependency ships a top-level ``benchmarks`` package of its own; the script
# imports link_family from beside it, registered here (not the whole folder put on sys.path)
_ROOT = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, _ROOT / f"{name}.py")
    module = sys.modules.setdefault(name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


link_family = _load("link_family")
criterion_regret = _load("criterion_regret")


def _centred_units_oracle(scores: np.ndarray, rng: np.random.Generator, shuffles: int) -> float:
    """The criterion as it was before the offsets fix, written out: each draw double-centred and
    read in its own spread's units, the shuffles' mean subtracted."""
    from scipy.optimize import linear_sum_assignment

    draws = [scores, *(rng.permutation(scores.ravel()).reshape(scores.shape) for _ in range(shuffles))]
    peaks = []
    for x in draws:
        c = x - x.mean(0) - x.mean(1, keepdims=True) + x.mean()
        rows, cols = linear_sum_assignment(c, maximize=True)
        peaks.append(c[rows, cols].mean() / c.std())
    return peaks[0] - float(np.mean(peaks[1:]))


@given(st.integers(3, 6), st.integers(3, 6), st.integers(0, 1000))
@settings(max_examples=20, deadline=None)
def test_the_criterion_before_the_offsets_fix_is_recovered_exactly(n, m, seed):
    from training.link.image_side import CRITERION_SHUFFLES

    g = np.random.default_rng(seed)
    scores = np.eye(n, m) + g.normal(size=(n, m)) + g.normal(size=m) * 2  # links, noise, image offsets
    got = criterion_regret.centred_units(scores, np.random.default_rng(7))
    assert got == pytest.approx(_centred_units_oracle(scores, np.random.default_rng(7), CRITERION_SHUFFLES))
    shipped = criterion_regret.shipped(scores, np.random.default_rng(7))
    assert abs(shipped) <= abs(got) + 1e-12  # the fix only dilutes


def test_regret_is_the_best_candidates_auc_less_the_picks():
    """Two candidates link alike inside documents; one also lifts two images' every score (an
    offset): its AUC is lower. Read in the centred units the two tie (the simpler one, the bag,
    is taken); shipped, the offset dilutes the bag's value and ``none`` is taken."""
    g = np.random.default_rng(0)
    links = [(i, i) for i in range(5)]
    kept = {"none": [], "bag": []}
    for _ in range(60):
        clean = np.eye(5) + 0.4 * g.normal(size=(5, 5))
        kept["none"].append((clean, links))
        kept["bag"].append((clean + np.array([1.5, 1.5, 0, 0, 0]), links))
    out = criterion_regret.regret(kept, seed=0)
    assert out["auc"]["none"] > out["auc"]["bag"] + 5
    assert out["shipped"]["pick"] == "none" and out["shipped"]["regret"] == 0
    assert out["centred_units"]["pick"] == "bag"
    assert out["consensus"]["pick"] == "none" and out["consensus"]["regret"] == 0  # raw AUC: offsets count
    assert out["centred_units"]["regret"] == pytest.approx(out["auc"]["none"] - out["auc"]["bag"], abs=0.11)


@pytest.mark.parametrize("argv", [["--cells", ","], ["--cells", "topic:40:added:4.1", "--seeds", ","]])
def test_naming_no_cell_or_no_seed_is_a_one_line_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        criterion_regret.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("--cells and --seeds must each name at least one"), err


def test_a_candidate_with_no_labelled_document_is_named():
    unlinked = [(np.eye(3), [])]  # a link-free document: no AUC
    with pytest.raises(SystemExit, match="candidate bag scored no labelled validation document"):
        criterion_regret.regret({"none": [(np.eye(3), [(0, 0)])], "bag": unlinked}, seed=0)


@pytest.mark.slow
def test_the_trials_are_read_by_candidate_name(dataset, monkeypatch):
    """The choice names a trial's folder NAME-EPOCHS: read by folder name, every key was
    ``none-3``-like and the regret failed on the first corpus ("x not in tuple")."""
    from training.link.image_side import CANDIDATES

    monkeypatch.setattr(
        link_family, "BASE", {**link_family.BASE, "epochs": 2, "d_multi": 16, "min_word_count": 1}
    )
    from training.link import image_side

    kept = criterion_regret.trial_scores(str(dataset), 0)
    assert set(kept) == set(CANDIDATES)
    share = image_side.TRIAL_SHARE
    full = criterion_regret.trial_scores(str(dataset), 0, share=1.0)  # every candidate for the run's epochs
    assert set(full) == set(CANDIDATES) and image_side.TRIAL_SHARE == share  # the choice's own share restored
    assert set(criterion_regret.regret(kept, 0)["shipped"]["means"]) == set(CANDIDATES)


def test_cached_trials_train_once_and_read_the_same_scores_back(tmp_path):
    calls = []

    def train():
        calls.append(1)
        return {"none": [(np.eye(3), [(0, 0)])]}

    first = criterion_regret.cached_trials(str(tmp_path), "corpus-s0", train)
    again = criterion_regret.cached_trials(str(tmp_path), "corpus-s0", train)
    assert len(calls) == 1 and (tmp_path / "corpus-s0.pkl").exists()
    assert np.array_equal(again["none"][0][0], first["none"][0][0]) and again["none"][0][1] == [(0, 0)]
    criterion_regret.cached_trials(None, "corpus-s0", train)  # no folder: trained every time
    assert len(calls) == 2


def _consensus_oracle(mine: np.ndarray, others: list[np.ndarray]) -> float:
    """One candidate's consensus value, written out: the others' double-centred scores in their own
    spread's units averaged, matched one to one, and the candidate's raw cells ranked pair by pair."""
    from scipy.optimize import linear_sum_assignment

    def z(x):
        c = x - x.mean(0) - x.mean(1, keepdims=True) + x.mean()
        return c / c.std()

    rows, cols = linear_sum_assignment(np.mean([z(x) for x in others], axis=0), maximize=True)
    linked = {(int(r), int(c)) for r, c in zip(rows, cols, strict=True)}
    pos = [mine[r, c] for r, c in linked]
    neg = [mine[r, c] for r in range(mine.shape[0]) for c in range(mine.shape[1]) if (r, c) not in linked]
    wins = [1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg]
    return float(np.mean(wins)) - 0.5


@given(st.integers(3, 6), st.integers(3, 6), st.integers(0, 1000))
@settings(max_examples=20, deadline=None)
def test_consensus_ranks_each_candidate_against_the_others_matching(n, m, seed):
    g = np.random.default_rng(seed)
    mats = {k: np.eye(n, m) + g.normal(size=(n, m)) for k in ("none", "balanced", "bag")}
    got = criterion_regret.consensus({k: [(x, None)] for k, x in mats.items()})
    for k, x in mats.items():
        others = [y for j, y in mats.items() if j != k]
        assert got[k][0] == pytest.approx(_consensus_oracle(x, others))


def test_consensus_gives_a_random_candidate_chance_and_skips_small_documents():
    """Leave-one-out: a candidate scoring at random is not rewarded for agreeing with itself."""
    g = np.random.default_rng(1)
    docs = 300
    kept = {
        k: [(np.eye(4) * 2 + g.normal(size=(4, 4)), None) for _ in range(docs)] for k in ("none", "balanced")
    }
    kept["bag"] = [(g.normal(size=(4, 4)), None) for _ in range(docs)]
    for k in kept:
        kept[k].append((np.eye(2), None))  # 2 x 2: below STRUCTURE_MIN_SIDE, no value
    got = criterion_regret.consensus(kept)
    assert all(v[-1] is None for v in got.values())
    assert abs(np.mean(got["bag"][:-1])) < 0.03
    assert np.mean(got["none"][:-1]) > 0.15 and np.mean(got["balanced"][:-1]) > 0.15  # the random one dilutes


def test_a_trial_share_outside_0_1_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        criterion_regret.main(["--cells", "topic:40:added:4.1", "--trial-share", "0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("--trial-share must be in (0, 1]")


def _docs(g: np.random.Generator, strength: float, n: int = 60) -> list:
    """n 4 x 4 documents linking the diagonal, as strongly as ``strength`` (0: scores at random)."""
    return [(strength * np.eye(4) + g.normal(size=(4, 4)), [(i, i) for i in range(4)]) for _ in range(n)]


def test_designs_read_the_trials_top_two_in_full():
    """``balanced`` leads the brief trials and fades; ``none`` ends best: today's choice keeps the
    trials' leader, the top two continued find ``none``; the bag (random throughout) never wins."""
    g = np.random.default_rng(3)
    strengths = {
        "none": (1.0, 3.0),
        "balanced": (2.0, 1.0),
        "balanced+dropout": (0.3, 0.5),
        "bag": (0.0, 0.0),
    }
    trials = {k: _docs(g, brief) for k, (brief, _) in strengths.items()}
    full = {k: _docs(g, ended) for k, (_, ended) in strengths.items()}
    out = criterion_regret.designs(trials, full, seed=0)
    assert out["top2"] == ["none", "balanced"]  # in the candidates' order
    assert out["today"]["pick"] == "balanced" and out["today"]["regret"] > 5
    for design in ("top2_shipped", "top2_consensus", "all_consensus"):
        assert out[design] == {"pick": "none", "regret": 0.0}, (design, out)


def test_designs_by_consensus_take_the_bag_where_nothing_links_in_full():
    g = np.random.default_rng(4)
    trials = {k: _docs(g, 1.0 if k == "none" else 0.0) for k in ("none", "balanced", "bag")}
    full = {k: _docs(g, 0.0) for k in trials}  # at chance: agreeing on noise is no link
    out = criterion_regret.designs(trials, full, seed=0)
    assert out["top2_consensus"]["pick"] == "bag" and out["all_consensus"]["pick"] == "bag"


def test_designs_with_a_trial_share_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        criterion_regret.main(["--cells", "topic:40:added:4.1", "--designs", "--trial-share", "1"])
    assert exit_.value.code == 2
    assert "--designs reads the choice's own trials" in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_top_two_design_reads_chance_only_from_the_two_it_trains_in_full():
    """The trials' two best link nothing in full; a third candidate, not trained in full by that
    design, does: the top two's consensus design takes the bag (it cannot know the third)."""
    g = np.random.default_rng(5)
    brief = {"none": 2.0, "balanced": 1.5, "balanced+dropout": 0.2, "bag": 0.0}
    ended = {"none": 0.0, "balanced": 0.0, "balanced+dropout": 3.0, "bag": 0.0}
    trials = {k: _docs(g, v) for k, v in brief.items()}
    full = {k: _docs(g, v) for k, v in ended.items()}
    out = criterion_regret.designs(trials, full, seed=0)
    assert out["top2"] == ["none", "balanced"]
    assert out["top2_consensus"]["pick"] == "bag"


def test_the_trials_cache_is_read_only_under_the_settings_it_was_written_with(tmp_path, monkeypatch, capsys):
    """A cached pickle is the trials only where the choice's settings match its fingerprint: the
    cache written before 4cfa465 held the choice's last round (10-epoch models where it ran a
    second) and was re-scored as if it were the first; an unreadable pickle ended in a traceback."""
    trained = []

    def train():
        trained.append(1)
        return {"none": [([[1.0, 0.0], [0.0, 1.0]], [(0, 0)])]}  # lists: compared with ==

    first = criterion_regret.cached_trials(str(tmp_path), "cell", train)
    assert criterion_regret.cached_trials(str(tmp_path), "cell", train) == first and len(trained) == 1
    monkeypatch.setattr(
        criterion_regret.link_family, "BASE", {**criterion_regret.link_family.BASE, "epochs": 3}
    )
    assert criterion_regret.cached_trials(str(tmp_path), "cell", train) == first and len(trained) == 2
    assert "written under other settings: training its trials again" in capsys.readouterr().err
    (tmp_path / "cell.pkl").write_bytes(b"not a pickle")
    assert criterion_regret.cached_trials(str(tmp_path), "cell", train) == first and len(trained) == 3
    assert "unreadable (UnpicklingError): training its trials again" in capsys.readouterr().err
    import pickle  # a pickle of the old format: the scores alone, no fingerprint

    (tmp_path / "cell.pkl").write_bytes(pickle.dumps(first))
    assert criterion_regret.cached_trials(str(tmp_path), "cell", train) == first and len(trained) == 4
