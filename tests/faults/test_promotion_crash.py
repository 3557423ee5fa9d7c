"""The tracking server dies in the middle of a promotion (issue #19, hole 6), and several
trainings register and promote one model name at once.

A real ``mlflow server`` on PostgreSQL is killed (SIGKILL) between the steps of a promotion and
started again on the same store; the registry must then be consistent: production names a
version that passed the gate, no version is lost, and rollback goes to the version production
really replaced. The steps are not listed by hand: a fault-free promotion is recorded call by
call, and one promotion per step (each of its own model) is stopped right after that step when
the server is killed, so a step added to ``training/registry.promote`` is covered without
touching this file, and all the steps cost one kill and one restart.

Cost: one PostgreSQL and one server serve the module (only the server process is killed and
started again, without MLflow's job runner, which the registry does not use: it halves a
start), and each model's metrics are computed once (``evaluated_once``); nothing is trained
here (the ``trained`` fixture's model is logged twice, once with its scores flipped)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
import time
from collections import Counter

import mlflow
import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

import models.registry as registry
from models.gate import Gate
from models.promotion_lock import LOCK_SUFFIX, PromotionLock
from models.registry import (
    CANDIDATE,
    PRODUCTION,
    _version_by_alias,
    evaluate_model_uri,
    promote,
    rollback,
)
from schemas.errors import MmlinksError
from tests.conftest import free_port, start_http_server, stop_http_server, venv_env
from tests.models.test_registry import log_trained_and_flipped
from tests.training.test_mlflow_server import MLFLOW, postgres  # noqa: F401 - the PostgreSQL fixture
from training.tracking import register as register_trained

pytestmark = [pytest.mark.faults, pytest.mark.slow]
NAME = "crash-model"
LENIENT = Gate(max_auc_drop=100, max_p_at_1_drop=100, min_auc=0)
WRITES = ("set_", "delete_", "create_")  # the client calls that change the registry
FAILURES = (MlflowException, MmlinksError, OSError)  # what a call to a dead server may raise


class Server:
    """``mlflow server`` on a fixed port and store, which a test may kill and start again."""

    def __init__(self, store: str, root):
        self.store, self.root, self.port = store, root, free_port()
        self.url, self.proc, self.starts = f"http://127.0.0.1:{self.port}", None, 0

    def start(self) -> None:
        cmd = [MLFLOW, "server", "--backend-store-uri", self.store, "--serve-artifacts"]
        cmd += ["--artifacts-destination", (self.root / "artifacts").as_uri(), "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--workers", "1"]
        self.starts += 1
        log = self.root / f"server-{self.starts}.log"
        env = {**venv_env(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.proc = start_http_server(cmd, f"{self.url}/health", log, env)

    def kill(self) -> None:
        os.killpg(self.proc.pid, 9)
        self.proc.wait(timeout=30)

    def dead(self) -> bool:
        return self.proc.poll() is not None


class StepClient(MlflowClient):
    """A client that records the public methods called, in order (a fault-free run lists the
    steps a faulty run can stop at), and runs ``then`` right after the ``nth`` call of ``call``
    succeeds."""

    def __init__(self, url: str, call: str | None = None, nth: int = 1, then=None):
        super().__init__(url)
        self.calls: list[str] = []
        self._fault = {"call": call, "left": nth, "then": then}

    def __getattribute__(self, attr):
        value = super().__getattribute__(attr)
        state = super().__getattribute__("__dict__")
        fault = state.get("_fault")
        if fault is None or attr.startswith("_") or not callable(value):
            return value

        def recorded(*args, **kwargs):
            out = value(*args, **kwargs)
            state["calls"].append(attr)
            if attr == fault["call"]:
                fault["left"] -= 1
                if fault["left"] == 0:
                    fault["then"]()
            return out

        return recorded


class DiesAfter(StepClient):
    """A client whose server is SIGKILLed right after the ``nth`` call of ``call`` succeeds."""

    def __init__(self, url: str, server: Server, call: str, nth: int = 1):
        super().__init__(url, call, nth, then=server.kill)


@contextlib.contextmanager
def fail_fast(monkeypatch):
    """MLflow's client gives up at once while the server is down (only then: with nothing
    injected, a request on 2 busy cores can take longer than 10 s, before and after a restart)."""
    with monkeypatch.context() as m:
        m.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        m.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        yield


def _age_lock(client: MlflowClient, name: str = NAME) -> None:
    """What the lock's TTL does with time: the dead promotion's lock is now stale."""
    client.set_registered_model_tag(name + LOCK_SUFFIX, "acquired_at", str(time.time() - 3600))


def _lock_held(client: MlflowClient, name: str) -> bool:
    try:
        client.get_registered_model(name + LOCK_SUFFIX)
        return True
    except MlflowException:
        return False


def _verdict(client: MlflowClient, name: str, version: str) -> list[str]:
    """The gate's failures recorded on ``version`` by the last promotion that evaluated it."""
    return json.loads(client.get_model_version(name, version).tags["mmlinks.promotion_check"])["failures"]


def _versions(client: MlflowClient, name: str) -> list[str]:
    return sorted((str(v.version) for v in client.search_model_versions(f"name='{name}'")), key=int)


@pytest.fixture(scope="module")
def store(postgres, trained, dataset, tmp_path_factory):  # noqa: F811
    """(server, model URIs, gate, metrics by model URI): one server on one PostgreSQL for the
    module, a logged model ("good") and the same model with its scores flipped ("bad"), every
    version registered from these two runs, and a gate whose AUC floor lies between their AUCs
    (it passes "good" and fails "bad" whatever production is)."""
    root = tmp_path_factory.mktemp("promotion-crash")
    server = Server(postgres, root)
    server.start()
    try:
        mlflow.set_tracking_uri(server.url)
        mlflow.set_experiment("crash")
        uris = log_trained_and_flipped(trained, dataset, root)
        metrics = {u: evaluate_model_uri(u, dataset, "test", server.url) for u in uris.values()}
        auc = {k: metrics[u]["auc"] for k, u in uris.items()}
        good, bad = sorted(auc, key=auc.get, reverse=True)
        assert auc[good] > auc[bad]  # flipping scores flips AUC around 50
        gate = Gate(min_auc=(auc[good] + auc[bad]) / 2, max_auc_drop=100, max_p_at_1_drop=100)
        yield server, {"good": uris[good], "bad": uris[bad]}, gate, metrics
    finally:
        mlflow.set_tracking_uri(None)
        if server.proc is not None and not server.dead():
            stop_http_server(server.proc)


@pytest.fixture(autouse=True)
def evaluated_once(store, dataset, monkeypatch):
    """Promotions here score a version with the metrics its model got once (``store``): every
    version is registered from one of two logged models, and scoring is deterministic, so only
    the registry's steps are repeated. The version's source is still read from the server, so a
    promotion evaluating while the server is down fails as a real evaluation would."""
    metrics, real = store[3], registry.evaluate_model_uri

    def evaluate(model_uri, data, split="test", tracking_uri=None):
        name, version = model_uri.removeprefix("models:/").rsplit("/", 1)
        source = MlflowClient(tracking_uri).get_model_version(name, version).source
        if source in metrics and split == "test" and str(data) == str(dataset):
            return dict(metrics[source])
        return real(model_uri, data, split, tracking_uri)

    monkeypatch.setattr(registry, "evaluate_model_uri", evaluate)


def test_tracking_server_killed_mid_promotion_leaves_a_consistent_registry(
    store, dataset, monkeypatch, fault_stats
):
    """The two crashes first found by hand: after the alias moved, and before it moves."""
    server, uris, *_ = store
    mlflow.set_tracking_uri(server.url)
    client = MlflowClient(server.url)
    versions = [str(mlflow.register_model(uris["good"], NAME).version) for _ in range(3)]
    v1, v2, v3 = versions
    client.set_registered_model_alias(NAME, CANDIDATE, v1)
    assert promote(client, NAME, dataset, LENIENT).promoted  # v1: production, nothing before it

    # Crash 1: the alias moved to v2, then the server died before the previous-version tag.
    client.set_registered_model_alias(NAME, CANDIDATE, v2)
    with pytest.raises(FAILURES), fail_fast(monkeypatch):
        promote(DiesAfter(server.url, server, "set_registered_model_alias"), NAME, dataset, LENIENT)
    server.start()
    assert str(client.get_model_version_by_alias(NAME, PRODUCTION).version) == v2
    check = json.loads(client.get_model_version(NAME, v2).tags["mmlinks.promotion_check"])
    assert check["failures"] == []  # production is a version that passed the gate
    assert sorted(str(v.version) for v in client.search_model_versions(f"name='{NAME}'")) == versions
    # The dead promotion's lock blocks others with a clear error until its TTL passes.
    with pytest.raises(MmlinksError, match="another promotion of this model is in progress"):
        rollback(client, NAME, wait_s=0)
    _age_lock(client)
    assert rollback(client, NAME) == (v2, v1)  # to the version v2 really replaced
    assert str(client.get_model_version_by_alias(NAME, PRODUCTION).version) == v1
    assert rollback(client, NAME) == (v1, v2)  # and a second rollback undoes it

    # Crash 2: the server dies after the candidate's bookkeeping, before the alias moves.
    client.set_registered_model_alias(NAME, CANDIDATE, v3)
    with pytest.raises(FAILURES), fail_fast(monkeypatch):
        # the 1st such call records the gate's verdict, the 2nd what v3 replaces (both under the lock)
        promote(DiesAfter(server.url, server, "set_model_version_tag", nth=2), NAME, dataset, LENIENT)
    server.start()
    assert str(client.get_model_version_by_alias(NAME, PRODUCTION).version) == v2  # unmoved
    assert str(client.get_model_version_by_alias(NAME, CANDIDATE).version) == v3
    _age_lock(client)
    assert client.get_model_version(NAME, v3).tags["mmlinks.replaced_version"] == v2  # written, unused
    assert rollback(client, NAME) == (v2, v1)  # v3's unused bookkeeping changes nothing
    fault_stats.add(faults_injected=2, invariant_checks=11)


def _numbered(calls: list[str]) -> list[tuple[str, int]]:
    """Each recorded call as (call, nth): the nth call of that method in the promotion."""
    seen: Counter = Counter()
    numbered = []
    for call in calls:
        seen[call] += 1
        numbered.append((call, seen[call]))
    return numbered


def _steps(numbered: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Every write of a recorded promotion, and the read just before its first write (the
    server then dies while the candidate is evaluated). A kill after any other read leaves the
    registry as the kill after the write before it."""
    first_write = next(i for i, (call, _) in enumerate(numbered) if call.startswith(WRITES))
    return [s for i, s in enumerate(numbered) if i == first_write - 1 or s[0].startswith(WRITES)]


def test_tracking_server_killed_after_each_step_of_a_promotion(store, dataset, monkeypatch, fault_stats):
    """One promotion per step of a recorded promotion (lock, gate verdict, what the candidate
    replaces, the rollback pair, the alias move, the previous-version tag, the candidate alias,
    the promotion time, the lock's release; and before the evaluation), each of its own model
    with production v1 and candidate v2, stops right after its step; the server is then
    SIGKILLed and each goes on against the dead server. So does a gate-failing candidate's
    promotion, stopped after its verdict. After one restart, for each: production is where the
    steps reached (v2 once the alias moved, else v1) and on a version that passed the gate, a
    promotion that returned success really moved it, no version is lost, a dead promotion's
    lock is held exactly when it died holding it and refuses others clearly until its TTL,
    rollback goes to the version production replaced and back, and a promotion that died
    before the alias moved can be run again (the gate-failing one is refused again)."""
    server, uris, gate, _ = store
    client = MlflowClient(server.url)

    def register(name: str, kind: str = "good") -> str:
        return register_trained(uris[kind], name, CANDIDATE, server.url)

    register("step-record")
    assert promote(client, "step-record", dataset, gate).promoted
    register("step-record")
    recorder = StepClient(server.url)
    assert promote(recorder, "step-record", dataset, gate).promoted  # the steps, recorded
    numbered = _numbered(recorder.calls)
    alias_move = numbered.index(("set_registered_model_alias", 1))
    lock_taken = numbered.index(("create_registered_model", 1))
    lock_released = numbered.index(("delete_registered_model", 1))
    steps = _steps(numbered)
    assert lock_taken < alias_move < lock_released and len(steps) >= 9, recorder.calls
    cases = [(f"step-{i}", call, nth, "good") for i, (call, nth) in enumerate(steps)]
    cases.append(("step-gate-fails", "set_model_version_tag", 1, "bad"))  # its one write
    before = {}
    for name, _, _, kind in cases:
        v1 = register(name)
        assert promote(client, name, dataset, gate).promoted
        before[name] = (v1, register(name, kind))

    paused, go = threading.Barrier(len(cases) + 1, timeout=600), threading.Event()
    results, errors = {}, {}

    def pause() -> None:
        paused.wait()  # every promotion stands right after its step
        go.wait(timeout=600)  # the server is dead

    def run(name: str, call: str, nth: int) -> None:
        try:
            results[name] = promote(StepClient(server.url, call, nth, pause), name, dataset, gate)
        except threading.BrokenBarrierError:
            raise
        except FAILURES as exc:
            errors[name] = exc
        finally:
            if name not in results and name not in errors:
                paused.abort()  # it died before its step: fail the test, not hang it

    threads = [threading.Thread(target=run, args=case[:3], daemon=True) for case in cases]
    for t in threads:
        t.start()
    paused.wait()
    with fail_fast(monkeypatch):  # from here on: requests before the kill kept their retries
        server.kill()
        go.set()
        for t in threads:
            t.join()
    fault_stats.add(faults_injected=len(cases))  # one SIGKILL, that many promotions cut
    assert set(results) | set(errors) == {c[0] for c in cases}, (results, errors)
    server.start()

    for name, call, nth, kind in cases:
        step = f"{name}: killed after {call} #{nth}"
        v1, v2 = before[name]
        at = numbered.index((call, nth))  # the bad one's verdict: the same step as the good one's
        moved = at >= alias_move
        prod, other = (v2, v1) if moved else (v1, v2)
        result = results.get(name)
        assert result is None or result.promoted == moved, (step, result)  # success is real
        assert kind == "good" or (result is not None and result.failures), (step, result)
        assert _version_by_alias(client, name, PRODUCTION) == prod, step
        assert _verdict(client, name, prod) == [], step  # production passed the gate
        assert _versions(client, name) == [v1, v2], step  # no version lost
        held = _lock_held(client, name)
        assert held == (lock_taken <= at < lock_released), step
        if held:  # refused with a clear error until the TTL says the holder is dead
            with pytest.raises(MmlinksError, match="another promotion of this model is in progress"):
                rollback(client, name, wait_s=0)
            _age_lock(client, name)
        if not moved:  # run it again: the good candidate goes through, the bad one does not
            again = promote(client, name, dataset, gate)
            assert again.promoted == (kind == "good"), (step, again)
            assert not _lock_held(client, name), step
            if kind == "bad":
                assert _verdict(client, name, v2) and _version_by_alias(client, name, PRODUCTION) == v1
                with pytest.raises(MmlinksError, match="no previous production"):
                    rollback(client, name)
                fault_stats.add(invariant_checks=8)
                continue
            prod, other = v2, v1
        assert rollback(client, name) == (prod, other), step  # to the version production replaced
        assert rollback(client, name) == (other, prod), step  # and back
        assert not _lock_held(client, name), step
        fault_stats.add(invariant_checks=8)


def test_concurrent_registrations_and_promotions_of_one_name(store, dataset, monkeypatch, fault_stats):
    """Four trainings register versions of one model name at once (one of them versions the
    gate fails) through ``training.tracking.register``, three rounds, each making its version
    the candidate (all at the same moment, with no candidate alias: MLflow's SQL stores read,
    then insert an alias row, so a training could fail with a unique-key violation after its
    version was registered), and each then promotes at once, over a production version
    registered before. Every version is kept with its own number, the lock never has two
    holders, the promotions that moved production form one chain (each replaced the version the
    one before it left), production is a version that passed the gate, and rollback goes to the
    version it replaced."""
    server, uris, gate, _ = store
    name, n, rounds = "race-model", 4, 3
    mlflow.set_tracking_uri(server.url)
    client = MlflowClient(server.url)
    first = register_trained(uris["good"], name, CANDIDATE, server.url)
    assert promote(client, name, dataset, gate).promoted

    holders = {"now": 0, "peak": 0}
    guard, barrier = threading.Lock(), threading.Barrier(n, timeout=600)
    enter, leave = PromotionLock.__enter__, PromotionLock.__exit__

    def counted_enter(lock):
        taken = enter(lock)
        with guard:
            holders["now"] += 1
            holders["peak"] = max(holders["peak"], holders["now"])
        return taken

    def counted_exit(lock, *exc):
        with guard:
            holders["now"] -= 1
        return leave(lock, *exc)

    monkeypatch.setattr(PromotionLock, "__enter__", counted_enter)
    monkeypatch.setattr(PromotionLock, "__exit__", counted_exit)

    def no_candidate() -> None:  # as after a promotion: the alias row is gone, each set inserts it
        with contextlib.suppress(MlflowException):
            client.delete_registered_model_alias(name, CANDIDATE)

    registered_all = threading.Barrier(n, action=no_candidate, timeout=600)
    register_model = mlflow.register_model

    def register_then_wait(*args, **kwargs):  # the aliases are set at once: the race held open
        version = register_model(*args, **kwargs)
        registered_all.wait()
        return version

    monkeypatch.setattr(mlflow, "register_model", register_then_wait)
    registered, outcomes, errors = {}, {}, []
    refusals = ("another promotion", "moved from", "already production", "no 'candidate' version")

    def training(k: int) -> None:
        kind = "bad" if k == 0 else "good"
        try:
            barrier.wait()
            for r in range(rounds):
                registered[k, r] = (register_trained(uris[kind], name, CANDIDATE, server.url), kind)
            outcomes[k] = promote(MlflowClient(server.url), name, dataset, gate)
        except MmlinksError as exc:  # the refusals a lost race may get
            outcomes[k] = str(exc)
            if not any(m in str(exc) for m in refusals):
                errors.append(str(exc))
        except Exception as exc:  # anything else is a bug
            errors.append(repr(exc))
            registered_all.abort()  # the others fail fast instead of waiting for this one

    threads = [threading.Thread(target=training, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(registered) == n * rounds, (errors, registered, outcomes)
    numbers = [v for v, _ in registered.values()]
    assert len(set(numbers)) == n * rounds and _versions(client, name) == sorted([first, *numbers], key=int)
    assert holders["peak"] == 1 and not _lock_held(client, name), holders
    bad = {v for v, kind in registered.values() if kind == "bad"}
    # Serialised, none lost: the moves, in some order, form one chain from the first production,
    # each replacing the version the one before it left. Found among the orders (<= 4 moves), not
    # sorted by the versions' ``promoted_at`` tags: a version can be made production twice (two
    # promotions read the same candidate; the second, gated again after a newer version moved in,
    # moved production back to it: 1 -> 10 -> 11 -> 10), and its second move overwrote the tag.
    moves = [
        (r.production_version, r.candidate_version)
        for r in outcomes.values()
        if not isinstance(r, str) and r.promoted
    ]
    moved = len(moves)
    chains = [
        [first, *(to for _, to in order)]
        for order in itertools.permutations(moves)
        if [fro for fro, _ in order] == [first, *(to for _, to in order)][:-1]
    ]
    assert chains, (moves, outcomes)
    chain = chains[0]  # every chain through the same moves from one start ends at the same version
    prod = _version_by_alias(client, name, PRODUCTION)
    assert prod == chain[-1] and prod not in bad and _verdict(client, name, prod) == []
    if moved:
        assert rollback(client, name) == (prod, chain[-2])
    fault_stats.add(invariant_checks=6)
