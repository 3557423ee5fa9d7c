"""The tracking server dies in the middle of a promotion (issue #19, hole 6).

A real ``mlflow server`` on PostgreSQL is killed (SIGKILL) right after the production alias
moved, before the rollback bookkeeping is written; after a restart on the same store the
registry must be consistent: production names a version that passed the gate, no version is
lost, and rollback goes to the version production really replaced. A second crash, before the
alias moves, must leave production where it was."""

from __future__ import annotations

import contextlib
import json
import os
import time

import mlflow
import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from schemas.errors import MmlinksError
from tests.conftest import free_port, start_http_server, stop_http_server, venv_env
from tests.training.test_mlflow_server import MLFLOW, postgres  # noqa: F401 - the PostgreSQL fixture
from tests.training.test_registry import log_compatible
from training.gate import Gate
from training.registry import CANDIDATE, LOCK_SUFFIX, PRODUCTION, promote, rollback

pytestmark = [pytest.mark.faults, pytest.mark.slow]
NAME = "crash-model"
LENIENT = Gate(max_auc_drop=100, max_p_at_1_drop=100, min_auc=0)


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
        self.proc = start_http_server(cmd, f"{self.url}/health", log, venv_env())

    def kill(self) -> None:
        os.killpg(self.proc.pid, 9)
        self.proc.wait(timeout=30)


class DiesAfter(MlflowClient):
    """A client whose server is SIGKILLed right after the ``nth`` call of ``call`` succeeds."""

    def __init__(self, url: str, server: Server, call: str, nth: int = 1):
        super().__init__(url)
        self._fault = {"server": server, "call": call, "left": nth}

    def __getattribute__(self, attr):
        value = super().__getattribute__(attr)
        fault = super().__getattribute__("__dict__").get("_fault")
        if fault is None or attr != fault["call"]:
            return value

        def then_die(*args, **kwargs):
            out = value(*args, **kwargs)
            fault["left"] -= 1
            if fault["left"] == 0:
                fault["server"].kill()
            return out

        return then_die


@contextlib.contextmanager
def fail_fast(monkeypatch):
    """MLflow's client gives up at once while the server is down (only then: with nothing
    injected, a request on 2 busy cores can take longer than 10 s, before and after a restart)."""
    with monkeypatch.context() as m:
        m.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        m.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        yield


def _age_lock(client: MlflowClient) -> None:
    """What the lock's TTL does with time: the dead promotion's lock is now stale."""
    client.set_registered_model_tag(NAME + LOCK_SUFFIX, "acquired_at", str(time.time() - 3600))


def test_tracking_server_killed_mid_promotion_leaves_a_consistent_registry(
    postgres,  # noqa: F811
    trained,
    dataset,
    tmp_path,
    monkeypatch,
):
    server = Server(postgres, tmp_path)
    server.start()
    try:
        mlflow.set_tracking_uri(server.url)
        mlflow.set_experiment("crash")
        client = MlflowClient(server.url)
        versions = []
        for k in range(3):
            with mlflow.start_run(run_name=f"v{k + 1}"):
                uri = log_compatible(trained.checkpoint_path, trained.vocab, dataset)
            versions.append(str(mlflow.register_model(uri, NAME).version))
        v1, v2, v3 = versions
        client.set_registered_model_alias(NAME, CANDIDATE, v1)
        assert promote(client, NAME, dataset, LENIENT).promoted  # v1: production, nothing before it

        # Crash 1: the alias moved to v2, then the server died before the rollback tags.
        client.set_registered_model_alias(NAME, CANDIDATE, v2)
        with pytest.raises((MlflowException, MmlinksError, OSError)), fail_fast(monkeypatch):
            promote(DiesAfter(server.url, server, "set_registered_model_alias"), NAME, dataset, LENIENT)
        server.start()
        assert str(client.get_model_version_by_alias(NAME, PRODUCTION).version) == v2
        check = json.loads(client.get_model_version(NAME, v2).tags["mmlinks.promotion_check"])
        assert check["failures"] == []  # production is a version that passed the gate
        assert sorted(str(v.version) for v in client.search_model_versions(f"name='{NAME}'")) == versions
        # The dead promotion's lock blocks others with a clear error until its TTL passes.
        with pytest.raises(MmlinksError, match="another promotion of this model is in progress"):
            rollback(client, NAME)
        _age_lock(client)
        assert rollback(client, NAME) == (v2, v1)  # to the version v2 really replaced
        assert str(client.get_model_version_by_alias(NAME, PRODUCTION).version) == v1
        assert rollback(client, NAME) == (v1, v2)  # and a second rollback undoes it

        # Crash 2: the server dies after the candidate's bookkeeping, before the alias moves.
        client.set_registered_model_alias(NAME, CANDIDATE, v3)
        with pytest.raises((MlflowException, MmlinksError, OSError)), fail_fast(monkeypatch):
            # the 1st such call records the gate's verdict; the 2nd, under the lock, what v3 replaces
            promote(DiesAfter(server.url, server, "set_model_version_tag", nth=2), NAME, dataset, LENIENT)
        server.start()
        assert str(client.get_model_version_by_alias(NAME, PRODUCTION).version) == v2  # unmoved
        assert str(client.get_model_version_by_alias(NAME, CANDIDATE).version) == v3
        _age_lock(client)
        assert client.get_model_version(NAME, v3).tags["mmlinks.replaced_version"] == v2  # written, unused
        assert rollback(client, NAME) == (v2, v1)  # v3's unused bookkeeping changes nothing
    finally:
        mlflow.set_tracking_uri(None)
        if server.proc is not None and server.proc.poll() is None:
            stop_http_server(server.proc)
