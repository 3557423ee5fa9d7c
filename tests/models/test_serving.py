"""The registered model behind `mlflow models serve`: real HTTP over loopback."""

import base64
import json
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from models.packaging import MAX_SENTENCES, log_link_model
from tests.conftest import free_port, start_http_server, stop_http_server, tracking_uri, venv_env
from training.tracking import configure

MLFLOW = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or "mlflow"


def post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


@pytest.fixture(scope="module")
def served_model(trained, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    uri = tracking_uri(root)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=configure(uri, "serving-tests"))  # artifacts beside the db
    with mlflow.start_run():
        model_uri = log_link_model(trained.checkpoint_path, trained.vocab)
    version = mlflow.register_model(model_uri, "served").version
    MlflowClient(uri).set_registered_model_alias("served", "production", version)
    mlflow.set_tracking_uri(None)

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [
        MLFLOW,
        "models",
        "serve",
        "-m",
        "models:/served@production",
        "--env-manager",
        "local",
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    proc = start_http_server(cmd, f"{base}/ping", root / "server.log", venv_env(MLFLOW_TRACKING_URI=uri))
    yield base
    stop_http_server(proc)


def doc(n_sent=2, n_img=3, width=1280):
    return {
        "sentences": [f"a big red star number {i}" for i in range(n_sent)],
        "image_features": [[0.1 * (j + 1)] * width for j in range(n_img)],
    }


@pytest.mark.slow
def test_served_model_scores_a_document(served_model):
    status, body = post(f"{served_model}/invocations", {"dataframe_records": [doc()]})
    assert status == 200, body
    pred = body["predictions"][0]
    assert len(pred["scores"]) == 2 and len(pred["scores"][0]) == 3
    assert all(-1.0001 <= v <= 1.0001 for row in pred["scores"] for v in row)
    assert all(len(link) == 2 for link in pred["links"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "bad, fragment",
    [
        (doc(width=7), "1280 numbers"),
        (doc(n_sent=MAX_SENTENCES + 1), f"at most {MAX_SENTENCES} sentences"),
        ({"sentences": ["x"], "image_features": [["a", "b"]]}, "image_features"),  # the signature catches it
    ],
)
def test_bad_requests_get_a_4xx_with_a_reason_and_the_server_survives(served_model, bad, fragment):
    status, body = post(f"{served_model}/invocations", {"dataframe_records": [bad]})
    assert 400 <= status < 500, body
    assert fragment in body.get("message", ""), body
    status, _ = post(f"{served_model}/invocations", {"dataframe_records": [doc()]})
    assert status == 200


@pytest.mark.slow
def test_served_model_accepts_images_instead_of_features(served_model, corpus):
    import base64

    pngs = sorted((corpus / "images").glob("synth-*/*.png"))[:3]
    images = [base64.b64encode(p.read_bytes()).decode() for p in pngs[:2]]
    images.append("data:image/png;base64," + base64.b64encode(pngs[2].read_bytes()).decode())
    status, body = post(
        f"{served_model}/invocations",
        {"dataframe_records": [{"sentences": ["a red star", "a blue ring"], "images": images}]},
    )
    assert status == 200, body
    assert len(body["predictions"][0]["scores"][0]) == 3
    status, body = post(
        f"{served_model}/invocations",
        {"dataframe_records": [{"sentences": ["x"], "images": ["bm90IGFuIGltYWdl"]}]},
    )
    assert status == 400 and "not a readable image" in body["message"]


def test_served_model_refuses_images_for_other_extractor_weights(trained, corpus, tmp_path):
    """Issue #19: the served model checked the extractor's name, not its version (weights)."""
    from mlflow.exceptions import MlflowException

    png = base64.b64encode(sorted((corpus / "images").glob("synth-*/*.png"))[0].read_bytes()).decode()
    request = pd.DataFrame([{"sentences": ["a red star"], "images": [png]}])
    uri = tracking_uri(tmp_path)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=configure(uri, "extractor-version-tests"))  # artifacts in tmp_path
    try:
        with mlflow.start_run():
            stale = log_link_model(
                trained.checkpoint_path, trained.vocab, extractor_version="old-weights-0000"
            )
            current = log_link_model(trained.checkpoint_path, trained.vocab)
        with pytest.raises(MlflowException, match=r"trained on efficientnet-lite0@old-weights-0000 features"):
            mlflow.pyfunc.load_model(stale).predict(request)
        out = mlflow.pyfunc.load_model(current).predict(request)  # the installed weights: scored
        assert np.asarray(out["scores"][0]).shape == (1, 1)
    finally:
        mlflow.set_tracking_uri(None)
