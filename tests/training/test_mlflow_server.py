"""MLflow as on a cluster: `mlflow server` over a real PostgreSQL on loopback, used over HTTP
for training, registration, promotion and loading the production model back."""

import glob
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import free_port, missing_tool, start_http_server, stop_http_server, venv_env

MLFLOW = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or "mlflow"


def pg_bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))), None)
    if not found:
        missing_tool(f"PostgreSQL server binaries ({name}) are not installed; .ci/run installs them")
    return found


def run_pg(*cmd: str) -> None:
    # PostgreSQL refuses to run as root; CI runs as root, so drop to the postgres user there.
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    subprocess.run([*prefix, *cmd], check=True, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def postgres():
    data = tempfile.mkdtemp(prefix="mmlinks-pg-")  # directly under /tmp: postgres must reach it
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
    port = free_port()
    run_pg(pg_bin("initdb"), "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
    opts = f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={data}"
    run_pg(pg_bin("pg_ctl"), "-D", data, "-o", opts, "-l", f"{data}/server.log", "-w", "start")
    try:
        run_pg(pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "mlflow")
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/mlflow"
    finally:
        run_pg(pg_bin("pg_ctl"), "-D", data, "-m", "fast", "-w", "stop")
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def mlflow_server(postgres, tmp_path_factory):
    artifacts = tmp_path_factory.mktemp("artifacts")
    port = free_port()
    cmd = [
        MLFLOW,
        "server",
        "--backend-store-uri",
        postgres,
        "--serve-artifacts",
        "--artifacts-destination",
        artifacts.as_uri(),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    url = f"http://127.0.0.1:{port}"
    proc = start_http_server(cmd, f"{url}/health", artifacts.parent / "mlflow-server.log", venv_env())
    yield url
    stop_http_server(proc)


@pytest.mark.slow
def test_train_register_promote_and_load_through_a_postgres_backed_server(
    mlflow_server, postgres, dataset, tmp_path, ray_local, monkeypatch
):
    import mlflow
    import psycopg2
    from mlflow.tracking import MlflowClient

    from models.experiment import run_experiment
    from models.registry import Gate, promote
    from tests.conftest import small_train_config

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    cfg = small_train_config(dataset, tmp_path / "ray", epochs=2)
    res = run_experiment(cfg, mlflow_server, model_name="pg-model", alias="candidate")
    client = MlflowClient(mlflow_server)
    assert [m.step for m in client.get_metric_history(res.run_id, "val_loss")] == [0, 1]

    promotion = promote(client, "pg-model", dataset, Gate())
    assert promotion.promoted
    model = mlflow.pyfunc.load_model("models:/pg-model@production")
    out = model.predict(pd.DataFrame([{"sentences": ["a red star"], "image_features": [[0.2] * 1280] * 2}]))
    assert np.asarray(out["scores"][0]).shape == (1, 2)

    # The runs and the registry really live in PostgreSQL, not in a local file.
    with psycopg2.connect(postgres.replace("+psycopg2", "")) as conn, conn.cursor() as cur:
        cur.execute("select count(*) from runs where run_uuid = %s", (res.run_id,))
        assert cur.fetchone()[0] == 1
        cur.execute("select alias, version from registered_model_aliases where name = 'pg-model'")
        assert cur.fetchall() == [("production", int(promotion.candidate_version))]
    mlflow.set_tracking_uri(None)
