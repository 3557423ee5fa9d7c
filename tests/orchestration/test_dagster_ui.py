"""The Dagster UI as a newcomer meets it (issue #46): a run made the way a user makes one
(``dagster asset materialize``: a process per step, Beam with two worker processes), then a real
``dagster-webserver`` on loopback over the same instance, read and photographed by headless
Chromium: the asset graph's boxes can be told apart, the run shows its steps (the dataset checks
as one), and neither the command's output nor the run is flooded by library chatter.

The screenshots go to the test's folder, and also to ``$MMLINKS_UI_SCREENSHOTS`` when it is set.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import free_port, missing_tool

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LOCATION = "mmlinks"
MATERIALIZE = (str(BIN / "dagster"), "asset", "materialize", "-m", "orchestration.definitions")
SPLITS = {"train": 0.6, "val": 0.2, "test": 0.2}
OBJECTIVE_BOXES = ("model_ap", "evaluation_ap", "model_nostruct", "evaluation_nostruct")

# A Beam build by the real CLI and a webserver start: minutes on a quiet 2-core machine, more under load
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        missing_tool("chromium is not installed; .ci/run installs it")
    return exe


def headless(url: str, folder: Path, *, screenshot: Path | None = None) -> str:
    """The page's DOM after its scripts ran (``--dump-dom``), or a PNG of it (``screenshot``).
    The UI fetches everything from /graphql after load: virtual time waits for those fetches."""
    args = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={folder / 'chrome-profile'}",
        "--window-size=1600,1000",
        "--virtual-time-budget=60000",
    ]
    args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    proc = subprocess.run([*args, url], capture_output=True, text=True, timeout=240)
    if screenshot:
        assert screenshot.exists(), proc.stderr[-2000:]
        return ""
    assert proc.stdout.strip(), proc.stderr[-2000:]
    return proc.stdout


def graphql(port: int, query: str) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["data"]


def wait_for_location(port: int, server: subprocess.Popen, timeout_s: float = 600) -> None:
    query = "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus } } } }"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, "dagster-webserver exited"
        try:
            entries = graphql(port, query)["workspaceOrError"]["locationEntries"]
            if any(e["name"] == LOCATION and e["loadStatus"] == "LOADED" for e in entries):
                return
        except OSError:
            pass
        time.sleep(2)
    raise AssertionError(f"code location {LOCATION} did not load in {timeout_s} s")


def assert_real_picture(path: Path) -> None:
    """A PNG of the page: full size, and not a blank or single-colour frame."""
    img = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32)
    assert img.shape == (1000, 1600, 3)
    assert path.stat().st_size > 20_000
    assert img.std() > 10 and len(np.unique(img.reshape(-1, 3)[::97], axis=0)) > 20


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """A run of raw_snapshot + dataset (+ checks) by the real CLI, then the webserver over it."""
    chromium()  # skip (or fail under CI) before minutes of work when there is no browser
    tmp = tmp_path_factory.mktemp("dagster-ui")
    home = tmp / "home"
    home.mkdir()
    shutil.copy(ROOT / "orchestration" / "dagster-local.yaml", home / "dagster.yaml")  # as `make dagster`
    config = tmp / "dagster.json"
    config.write_text(
        json.dumps(
            {
                "sources": ["synthetic", "diy"],
                "objectives": {"ap": {"objective": "ap"}, "nostruct": {"objective": "nostruct"}},
                "synthetic": {"docs": 12, "seed": 0, "image_size": 48},
                "build_options": {
                    "*": {"direct_workers": 2, "split_ratios": {"train": 0.6, "val": 0.2, "test": 0.2}}
                },
                "thresholds": {"min_documents": 5, "min_split_documents": {"train": 3, "val": 1, "test": 1}},
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MMLINKS_", "DAGSTER_"))}
    env.update(
        DAGSTER_HOME=str(home),
        MMLINKS_DAGSTER_CONFIG=str(config),
        MMLINKS_DATASETS_URI=str(tmp / "data"),
        MLFLOW_TRACKING_URI=f"sqlite:///{tmp / 'mlflow.db'}",
        PYTHONPATH=str(ROOT),
    )
    run = subprocess.run(
        [*MATERIALIZE, "--select", "raw_snapshot,dataset", "--partition", "synthetic"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]

    port = free_port()
    server = subprocess.Popen(
        # no -m: pyproject.toml's [tool.dagster] names the module and the location, as for `make dagster`
        [str(BIN / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "webserver.log", "w"),
        start_new_session=True,
    )
    try:
        wait_for_location(port, server)
        yield {"tmp": tmp, "port": port, "run": run, "data": tmp / "data"}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def keep(path: Path) -> None:
    if os.environ.get("MMLINKS_UI_SCREENSHOTS"):
        out = Path(os.environ["MMLINKS_UI_SCREENSHOTS"])
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, out / path.name)


def test_the_run_printed_no_library_chatter(ui):
    """Beam's import warnings (GCS, apitools) were printed by every process that loaded the code
    location, and its worker harness by every step that ran Beam: now they are in log files."""
    out = (ui["run"].stdout + ui["run"].stderr).splitlines()
    chatter = [line for line in out if "apache_beam" in line or "GCSFileSystem" in line or "apitools" in line]
    assert not chatter, chatter[:20]
    build_log = (ui["data"] / "datasets" / "synthetic" / "build.log").read_text()
    assert "apache_beam" in build_log  # the workers' harness lines went there


def test_the_asset_graph_tells_model_and_evaluation_apart(ui):
    url = f"http://127.0.0.1:{ui['port']}/locations/{LOCATION}/asset-groups/training"
    dom = headless(url, ui["tmp"])
    missing = [name for name in OBJECTIVE_BOXES if name not in dom]
    assert not missing, f"the training group's graph does not show {missing}"
    png = ui["tmp"] / "dagster-asset-graph.png"
    headless(url, ui["tmp"], screenshot=png)
    assert_real_picture(png)
    keep(png)


def test_the_run_page_shows_its_steps_and_the_checks_as_one(ui):
    runs = graphql(ui["port"], "{ runsOrError { ... on Runs { results { runId status } } } }")
    [run] = runs["runsOrError"]["results"]
    assert run["status"] == "SUCCESS"
    url = f"http://127.0.0.1:{ui['port']}/runs/{run['runId']}"
    dom = headless(url, ui["tmp"])
    for step in ("raw_snapshot", "dataset", "dataset_checks"):
        assert step in dom, f"the run page does not show step {step}"
    png = ui["tmp"] / "dagster-run.png"
    headless(url, ui["tmp"], screenshot=png)
    assert_real_picture(png)
    keep(png)
