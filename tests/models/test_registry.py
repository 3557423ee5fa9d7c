"""Gated promotion, rollback and the promotion lock against a real MLflow SQLite registry."""

import json
import shutil
import threading
import time
from pathlib import Path

import mlflow
import pytest
import torch
from mlflow.tracking import MlflowClient

from models.packaging import log_link_model
from models.registry import CANDIDATE, PRODUCTION, Gate, PromotionLock, promote, rollback
from schemas.errors import MmlinksError, RetryLaterError
from tests.conftest import tracking_uri
from training.tracking import configure

NAME = "reg-test"


def _flipped_checkpoint(src: str, dst: Path) -> str:
    """The same model with its image projection negated: every score flips sign."""
    shutil.copytree(src, dst)
    state = torch.load(dst / "state.pt", weights_only=False)
    for key in ("image.proj.weight", "image.proj.bias"):
        state["model"][key] = -state["model"][key]
    torch.save(state, dst / "state.pt")
    return str(dst)


def log_compatible(checkpoint: str, vocab, dataset) -> str:
    """Log a model into the active run with the parameters `mmlinks train` logs for the
    compatibility check (schema version, feature extractor name@version of its dataset)."""
    from schemas.manifest import Manifest

    m = Manifest.read(dataset)
    fe = m.feature_extractor
    mlflow.log_params(
        {"schema_version": str(m.schema_version), "feature_extractor": f"{fe.name}@{fe.version}"}
    )
    return log_link_model(checkpoint, vocab)


def log_trained_and_flipped(trained, dataset, root: Path) -> dict[str, str]:
    """Into the active experiment, one run each: the session's trained model and the same model
    with its scores flipped; {"trained": URI, "flipped": URI}."""
    uris = {}
    for label, ckpt in (
        ("trained", trained.checkpoint_path),
        ("flipped", _flipped_checkpoint(trained.checkpoint_path, root / "flipped")),
    ):
        with mlflow.start_run(run_name=label):
            uris[label] = log_compatible(ckpt, trained.vocab, dataset)
    return uris


@pytest.fixture(scope="module")
def registry(trained, dataset, tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    uri = tracking_uri(root)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=configure(uri, "registry-tests"))  # artifacts beside the db
    uris = log_trained_and_flipped(trained, dataset, root)
    yield MlflowClient(uri), uris
    mlflow.set_tracking_uri(None)


def _register(client, uri, alias=CANDIDATE) -> str:
    v = str(mlflow.register_model(uri, NAME).version)
    client.set_registered_model_alias(NAME, alias, v)
    return v


def test_gate_promotes_rolls_back_and_explains_refusals(registry, dataset):
    client, uris = registry
    from models.registry import evaluate_model_uri

    scores = {k: evaluate_model_uri(u, dataset) for k, u in uris.items()}
    better = max(scores, key=lambda k: scores[k]["auc"])
    worse = min(scores, key=lambda k: scores[k]["auc"])
    assert scores[better]["auc"] > scores[worse]["auc"]  # flipping scores flips AUC around 50

    # 1. No production yet: the candidate only has to clear the absolute floor.
    v_good = _register(client, uris[better])
    res = promote(client, NAME, dataset, Gate())
    assert res.promoted and res.production_version is None
    assert str(client.get_model_version_by_alias(NAME, PRODUCTION).version) == v_good

    # 2. A worse candidate is refused, with the failing metric named; production stays.
    v_bad = _register(client, uris[worse])
    res = promote(client, NAME, dataset, Gate(max_auc_drop=0.0))
    assert not res.promoted
    assert any(f.startswith("auc ") and "below production" in f for f in res.failures)
    assert str(client.get_model_version_by_alias(NAME, PRODUCTION).version) == v_good
    assert "mmlinks.promotion_check" in client.get_model_version(NAME, v_bad).tags

    # 3. A lenient gate lets it through; rollback restores the previous version, twice undoes.
    res = promote(client, NAME, dataset, Gate(max_auc_drop=100, max_p_at_1_drop=100))
    assert res.promoted and res.production_version == v_good
    assert rollback(client, NAME) == (v_bad, v_good)
    assert str(client.get_model_version_by_alias(NAME, PRODUCTION).version) == v_good
    assert rollback(client, NAME) == (v_good, v_bad)


def test_floor_refuses_even_without_production(registry, dataset):
    client, uris = registry
    mlflow.register_model(uris["trained"], "floor-test")
    client.set_registered_model_alias("floor-test", CANDIDATE, "1")
    res = promote(client, "floor-test", dataset, Gate(min_auc=101))
    assert not res.promoted and "below the floor" in res.failures[0]


def test_unknown_model_or_alias_is_a_clear_error(registry, dataset):
    client, _ = registry
    with pytest.raises(MmlinksError, match="no 'candidate' version"):
        promote(client, "no-such-model", dataset, Gate())
    with pytest.raises(MmlinksError, match=r"no registered model|no previous production"):
        rollback(client, "no-such-model")


def test_concurrent_promotions_do_not_interleave(registry, dataset):
    client, uris = registry
    name = "race-test"
    v = str(mlflow.register_model(uris["trained"], name).version)
    client.set_registered_model_alias(name, CANDIDATE, v)

    # A promotion that finds the lock held past its wait is refused rather than interleaved.
    with PromotionLock(client, name):
        with pytest.raises(RetryLaterError, match="another promotion"):
            promote(client, name, dataset, Gate(lock_wait_s=0))
        assert str(client.get_model_version_by_alias(name, CANDIDATE).version) == v

    # Two promotions racing for the same candidate: exactly one moves production.
    outcomes, barrier = [], threading.Barrier(2)

    def attempt():
        barrier.wait()
        try:
            outcomes.append(promote(MlflowClient(client.tracking_uri), name, dataset, Gate()).promoted)
        except MmlinksError as exc:
            outcomes.append(str(exc))

    threads = [threading.Thread(target=attempt) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outcomes) == 2, outcomes  # neither thread died with an unexpected error
    assert outcomes.count(True) == 1, outcomes
    loser = next(o for o in outcomes if o is not True)
    assert loser is False or "already production" in loser, loser  # it waited: production is its
    assert str(client.get_model_version_by_alias(name, PRODUCTION).version) == v


def test_a_refused_promotion_racing_a_passing_one_leaves_the_passing_verdict(registry, dataset, monkeypatch):
    """While a refusing promotion evaluates a candidate, a lenient one promotes it. The refusing
    one then finds its candidate production and stops: it does not overwrite the verdict on the
    version production now is (the verdict is written under the lock, after that check; it used
    to be written before the lock)."""
    import models.registry as reg

    client, uris = registry
    name = "verdict-race"
    for uri, alias in ((uris["trained"], PRODUCTION), (uris["flipped"], CANDIDATE)):
        client.set_registered_model_alias(name, alias, str(mlflow.register_model(uri, name).version))
    evaluate, raced = reg.evaluate_model_uri, []

    def evaluate_then_race(*args, **kwargs):
        metrics = evaluate(*args, **kwargs)
        if not raced:  # the strict promotion's first evaluation: the lenient one runs meanwhile
            raced.append(None)
            raced[0] = promote(client, name, dataset, Gate(max_auc_drop=100, max_p_at_1_drop=100, min_auc=0))
        return metrics

    monkeypatch.setattr(reg, "evaluate_model_uri", evaluate_then_race)
    res = promote(client, name, dataset, Gate(min_auc=101))  # refuses any candidate
    assert res.already_production and not res.promoted  # it says so, and changes nothing
    assert raced[0].promoted
    assert str(client.get_model_version_by_alias(name, PRODUCTION).version) == "2"
    verdict = client.get_model_version(name, "2").tags["mmlinks.promotion_check"]
    assert json.loads(verdict)["failures"] == []  # the passing verdict, not the strict one's


class Died(Exception):
    """The process stopped here (the promotion's lock is released on the way out, as a dead
    holder's would be after its TTL)."""


class DiesAfter:
    """An MlflowClient whose ``nth`` call of ``method`` is the last thing the process does."""

    def __init__(self, client: MlflowClient, method: str, nth: int = 1):
        self._client, self._method, self._left = client, method, nth

    def __getattr__(self, attr):
        real = getattr(self._client, attr)
        if attr != self._method:
            return real

        def call(*args, **kwargs):
            out = real(*args, **kwargs)
            self._left -= 1
            if self._left == 0:
                raise Died(f"after {attr}")
            return out

        return call


def test_rollback_stays_right_after_promotions_and_rollbacks_that_died_mid_way(registry, dataset):
    """Two holes the bookkeeping had while it was written after the alias moved. (1) Two
    promotions die right after the alias move, the second putting the first production back:
    the pair still named the registry's first promotion, so rollback found "no previous
    production" (or an older one). (2) A rollback dies between its pair and the alias move: the
    pair no longer named production, and the version production was restored to had no tag
    saying what it replaced. Both fail on the old order and pass now."""
    client, uris = registry
    lenient = Gate(max_auc_drop=100, max_p_at_1_drop=100, min_auc=0)

    def version(name: str) -> str:
        return str(mlflow.register_model(uris["trained"], name).version)

    def production(name: str) -> str:
        return str(client.get_model_version_by_alias(name, PRODUCTION).version)

    name = "died-twice-after-the-move"
    v1, v2 = version(name), version(name)
    client.set_registered_model_alias(name, CANDIDATE, v1)
    assert promote(client, name, dataset, lenient).promoted
    for cand in (v2, v1):  # v2 over v1, then v1 back over v2: each dies after the move
        client.set_registered_model_alias(name, CANDIDATE, cand)
        with pytest.raises(Died):
            promote(DiesAfter(client, "set_registered_model_alias"), name, dataset, lenient)
        assert production(name) == cand
    assert rollback(client, name) == (v1, v2)  # what v1 replaced the second time

    name = "rollback-died-before-the-move"
    v1, v2 = version(name), version(name)
    for cand in (v1, v2):
        client.set_registered_model_alias(name, CANDIDATE, cand)
        assert promote(client, name, dataset, lenient).promoted
    assert rollback(client, name) == (v2, v1)  # v1 is production again, replacing v2
    with pytest.raises(Died):  # rolling forward to v2 dies after its pair, before the move
        rollback(DiesAfter(client, "set_registered_model_tag"), name)
    assert production(name) == v1
    assert rollback(client, name) == (v1, v2)  # v1's own tag: it replaced v2
    assert rollback(client, name) == (v2, v1)  # and back


def _contend(tracking_uri: str, lock_name: str, threads: int = 4) -> tuple[list[str], int]:
    """Start ``threads`` lock attempts at once; returns (unexpected errors, peak holders)."""
    state = {"holders": 0, "peak": 0}
    errors: list[str] = []
    guard, barrier = threading.Lock(), threading.Barrier(threads)

    def contend():
        barrier.wait()
        try:
            with PromotionLock(MlflowClient(tracking_uri), lock_name):
                with guard:
                    state["holders"] += 1
                    state["peak"] = max(state["peak"], state["holders"])
                time.sleep(0.2)
                with guard:
                    state["holders"] -= 1
        except MmlinksError as exc:
            if "another promotion" not in str(exc):
                errors.append(str(exc))
        except Exception as exc:  # anything else is a bug in the lock
            errors.append(repr(exc))

    workers = [threading.Thread(target=contend) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return errors, state["peak"]


def test_lock_admits_one_holder_under_contention(registry):
    """Threads racing for the lock: never two holders, and losers get the clear refusal (a
    create that loses the race can come back as 'not found' from SQL stores)."""
    client, _ = registry
    for round_ in range(3):
        errors, peak = _contend(client.tracking_uri, f"contend-{round_}")
        assert errors == [] and peak == 1, (errors, peak)


def test_stale_lock_is_broken_after_its_ttl(registry):
    client, _ = registry
    PromotionLock(client, "stale-test").__enter__()  # a crashed promotion never released it
    with pytest.raises(MmlinksError):
        PromotionLock(client, "stale-test").__enter__()
    with PromotionLock(client, "stale-test", ttl_s=0.0):
        pass


def test_model_trained_on_other_features_is_refused(registry, dataset, trained):
    client, _ = registry
    with mlflow.start_run(run_name="other-features"):
        mlflow.log_params({"feature_extractor": "densenet169@imagenet", "schema_version": "2"})
        uri = log_link_model(trained.checkpoint_path, trained.vocab)
    v = str(mlflow.register_model(uri, "compat-test").version)
    client.set_registered_model_alias("compat-test", CANDIDATE, v)
    with pytest.raises(MmlinksError, match="trained with feature_extractor=densenet169"):
        promote(client, "compat-test", dataset, Gate())
    assert client.get_registered_model("compat-test").aliases.get(PRODUCTION) is None


def test_model_without_compatibility_params_is_refused(registry, dataset, trained):
    """Issue #19: a version whose run lacks schema_version/feature_extractor used to be scored
    without any compatibility check."""
    client, _ = registry
    with mlflow.start_run(run_name="no-params"):
        mlflow.log_params({"schema_version": "2"})  # feature_extractor missing
        uri = log_link_model(trained.checkpoint_path, trained.vocab)
    v = str(mlflow.register_model(uri, "unchecked-test").version)
    client.set_registered_model_alias("unchecked-test", CANDIDATE, v)
    with pytest.raises(MmlinksError, match="has no feature_extractor parameter in its training run") as err:
        promote(client, "unchecked-test", dataset, Gate())
    assert "\n" not in str(err.value)
    assert client.get_registered_model("unchecked-test").aliases.get(PRODUCTION) is None


def test_model_trained_on_other_extractor_weights_is_refused(registry, dataset, trained):
    client, _ = registry
    from schemas.manifest import Manifest

    m = Manifest.read(dataset)
    with mlflow.start_run(run_name="other-weights"):
        other = f"{m.feature_extractor.name}@other-weights-0000"  # same name, other weights
        mlflow.log_params({"feature_extractor": other, "schema_version": str(m.schema_version)})
        uri = log_link_model(trained.checkpoint_path, trained.vocab)
    v = str(mlflow.register_model(uri, "weights-test").version)
    client.set_registered_model_alias("weights-test", CANDIDATE, v)
    with pytest.raises(MmlinksError, match=f"trained with feature_extractor={other}"):
        promote(client, "weights-test", dataset, Gate())


def test_promote_command_exit_codes_and_json(registry, dataset, monkeypatch, capfd):
    """The two gated promotions run the command in this process (``cli.main.main``, the
    entry point's own function: what it returns is the process's exit code); the rollback runs
    it as a process, so the installed command's exit code and stdout are checked end to end.
    Each command process pays ~6 CPU-s of imports before it does anything."""
    import json
    import os
    import subprocess

    from cli.main import main
    from tests.cli.test_cli import MMLINKS

    client, uris = registry
    name = "cli-test"
    for label in ("trained", "flipped"):
        v = str(mlflow.register_model(uris[label], name).version)
    client.set_registered_model_alias(name, PRODUCTION, "1")
    client.set_registered_model_alias(name, CANDIDATE, v)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
    base = ["promote", "--model-name", name, "--data", str(dataset), "--json"]
    assert main([*base, "--max-auc-drop", "-100"]) == 1  # refused
    assert json.loads(capfd.readouterr().out)["failures"]
    assert main([*base, "--max-auc-drop", "100", "--max-p1-drop", "100"]) == 0
    assert json.loads(capfd.readouterr().out)["promoted"]
    back = subprocess.run(
        [MMLINKS, "promote", "--model-name", name, "--rollback", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "MLFLOW_TRACKING_URI": client.tracking_uri},
        timeout=300,
    )
    assert back.returncode == 0 and json.loads(back.stdout)["to_version"] == "1"


def test_corrupt_model_artifact_is_a_clear_error(registry, dataset, trained, tmp_path):
    client, _ = registry
    broken = tmp_path / "broken"
    shutil.copytree(trained.checkpoint_path, broken)
    (broken / "state.pt").write_bytes(b"not a torch checkpoint")
    with mlflow.start_run(run_name="corrupt"):
        uri = log_compatible(str(broken), trained.vocab, dataset)
    v = str(mlflow.register_model(uri, "corrupt-test").version)
    client.set_registered_model_alias("corrupt-test", CANDIDATE, v)
    with pytest.raises(MmlinksError, match="cannot load models:/corrupt-test/"):
        promote(client, "corrupt-test", dataset, Gate())
    assert client.get_registered_model("corrupt-test").aliases.get(PRODUCTION) is None
