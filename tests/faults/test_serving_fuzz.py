"""The served model under bad requests and under load, over real HTTP on loopback (issue #19).

A seeded link model (no training: ``tests/linking/conftest.py``) is registered in a SQLite
MLflow store and served by ``mlflow models serve`` with ``MMLINKS_IMAGE_ROOT`` set, so requests
may name image files. A hypothesis fuzzer sends request bodies of wrong shapes and types,
NaN/infinity, lists past the limits, base64 garbage, image paths that climb out of the root, and
bytes that are not JSON. Invariant: every answer comes within the timeout, is never a 5xx, and a
4xx carries a message; the server still scores a good document afterwards. The load test then
sends a fixed number of good requests (4 at a time) and reports p50/p99 latency and errors.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from models.packaging import IMAGE_ROOT_ENV, MAX_IMAGES, MAX_SENTENCES
from tests.conftest import free_port, start_http_server, stop_http_server, venv_env
from tests.faults.conftest import FUZZ
from tests.models.test_serving import MLFLOW

pytestmark = [pytest.mark.faults, pytest.mark.slow]

NAME = "fuzz-served"
TIMEOUT_S = 60  # a request unanswered by then is a hang
LOAD_REQUESTS = 200
LOAD_CONCURRENCY = 4


@pytest.fixture(scope="module")
def served(dataset, tmp_path_factory):
    from schemas.manifest import Manifest
    from tests.linking.conftest import register_model

    root = tmp_path_factory.mktemp("serve-fuzz")
    register_model(root, dataset, seed=0, name=NAME)
    images = root / "images"
    images.mkdir()
    (images / "not-an-image.png").write_text("text, not pixels")
    (root / "secret.txt").write_text("outside the image root")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [MLFLOW, "models", "serve", "-m", f"models:/{NAME}@production", "--env-manager", "local"]
    cmd += ["-h", "127.0.0.1", "-p", str(port)]
    env = venv_env(MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}", **{IMAGE_ROOT_ENV: str(images)})
    proc = start_http_server(cmd, f"{base}/ping", root / "server.log", env)
    yield base, Manifest.read(dataset).feature_extractor.dim
    stop_http_server(proc)


def post(url: str, body: bytes, content_type: str = "application/json") -> tuple[int, dict, float]:
    """(status, JSON body or {}, seconds)."""
    req = urllib.request.Request(url, body, {"Content-Type": content_type})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    seconds = time.perf_counter() - t0
    try:
        parsed = json.loads(raw or b"{}")
    except ValueError:
        parsed = {"unparsed": raw[:200].decode(errors="replace")}
    return status, parsed if isinstance(parsed, dict) else {"body": parsed}, seconds


def good_doc(width: int, n_sent: int = 2, n_img: int = 3) -> dict:
    return {
        "sentences": [f"a big red star number {i}" for i in range(n_sent)],
        "image_features": [[0.1 * (j + 1)] * width for j in range(n_img)],
    }


numbers = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**70), 2**70)
scalars = st.none() | st.booleans() | numbers | st.text(max_size=20)
junk = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
)
image_items = (
    st.sampled_from(
        [
            "../secret.txt",
            "../../../../etc/passwd",
            "/etc/passwd",
            "not-an-image.png",
            ".",
            "sub/../../secret.txt",
            "a\x00b.png",
            "data:image/png;base64,!!!!",
            "data:image/png;base64",
            "data:,",
            "bm90IGFuIGltYWdl",  # base64 of "not an image"
            "////",
            "",
        ]
    )
    | st.text(max_size=40)
    | st.binary(max_size=60).map(lambda b: b.hex())
)


def feature_lists(width: int):
    row = st.lists(numbers, min_size=width, max_size=width)  # the right width, any numbers
    wrong = st.lists(numbers, max_size=8)
    return st.lists(row | wrong | junk, max_size=3) | junk


def documents(width: int):
    sentences = st.lists(st.text(max_size=30) | scalars, max_size=4) | junk
    doc = st.fixed_dictionaries(
        {},
        optional={
            "sentences": sentences,
            "image_features": feature_lists(width),
            "images": st.lists(image_items, max_size=3) | junk,
            "extra": junk,
        },
    )
    return doc


def bodies(width: int):
    """Request bodies: bytes, as a client would send them (NaN/Infinity as Python's json writes)."""
    docs = st.lists(documents(width), min_size=0, max_size=3)
    framed = st.one_of(
        docs.map(lambda d: {"dataframe_records": d}),
        docs.map(lambda d: {"dataframe_records": d, "params": {"threshold": "high"}}),
        st.tuples(
            st.lists(st.text(max_size=15), max_size=3), st.lists(st.lists(junk, max_size=3), max_size=2)
        ).map(lambda t: {"dataframe_split": {"columns": t[0], "data": t[1]}}),
        junk.map(lambda j: {"inputs": j}),
        junk.map(lambda j: {"instances": j}),
        junk,
    )
    as_json = framed.map(lambda b: json.dumps(b).encode())
    return as_json | st.binary(max_size=200)


def _huge(width: int) -> list[bytes]:
    """Explicit examples past every limit (hypothesis rarely draws lists this long)."""
    many_sentences = good_doc(width, n_sent=MAX_SENTENCES + 1)
    many_images = {"sentences": ["x"], "images": ["bm90IGFuIGltYWdl"] * (MAX_IMAGES + 1)}
    long_vector = {"sentences": ["x"], "image_features": [[0.5] * (width * 50)]}
    nan_doc = good_doc(width)
    nan_doc["image_features"][0][0] = math.nan
    inf_doc = good_doc(width)
    inf_doc["image_features"][1][5] = math.inf
    traversal = {"sentences": ["x"], "images": ["../secret.txt"]}
    return [json.dumps({"dataframe_records": [d]}).encode() for d in (
        many_sentences, many_images, long_vector, nan_doc, inf_doc, traversal
    )]  # fmt: skip


def test_fuzzed_requests_get_a_4xx_with_a_reason_never_a_5xx_or_a_hang(served, fault_stats):
    base, width = served
    url = f"{base}/invocations"
    seen = {"n": 0, "4xx": 0}

    def check(body: bytes) -> None:
        status, answer, _ = post(url, body)
        seen["n"] += 1
        assert status < 500, (status, answer, body[:300])
        if status >= 400:
            seen["4xx"] += 1
            assert str(answer.get("message", "")).strip(), (status, answer, body[:300])
        fault_stats.add(inputs_fuzzed=1, invariant_checks=1)

    for body in _huge(width):
        status, answer, _ = post(url, body)
        assert 400 <= status < 500 and answer.get("message"), (status, answer)
        fault_stats.add(inputs_fuzzed=1, invariant_checks=1)
    traversal = post(url, _huge(width)[-1])[1]["message"]
    assert "outside" in traversal and "outside the image root" not in traversal  # the file was not read

    @FUZZ
    @given(body=bodies(width))
    @example(body=b"")
    @example(body=b"{")
    @example(
        body=json.dumps({"dataframe_records": [{"sentences": ["x"], "images": ["../secret.txt"]}]}).encode()
    )
    def fuzz(body: bytes) -> None:
        check(body)

    fuzz()
    status, answer, _ = post(url, json.dumps({"dataframe_records": [good_doc(width)]}).encode())
    assert status == 200, answer  # the server survived
    assert seen["4xx"] > seen["n"] // 2  # the fuzzer mostly sent bad requests, as meant
    fault_stats.add(invariant_checks=2)


def test_load_fixed_request_count_on_loopback(served, fault_stats):
    base, width = served
    rng = np.random.default_rng(0)
    bodies_ = [
        json.dumps(
            {"dataframe_records": [{
                "sentences": [f"sentence {i} of request {k}" for i in range(4)],
                "image_features": rng.normal(size=(5, width)).round(4).tolist(),
            }]}
        ).encode()
        for k in range(LOAD_REQUESTS)
    ]  # fmt: skip
    post(f"{base}/invocations", bodies_[0])  # warm-up, not counted
    t0 = time.perf_counter()
    with ThreadPoolExecutor(LOAD_CONCURRENCY) as pool:
        answers = list(pool.map(lambda b: post(f"{base}/invocations", b), bodies_))
    wall = time.perf_counter() - t0
    errors = [(s, a) for s, a, _ in answers if s != 200]
    latencies_ms = np.array([sec * 1000 for _, _, sec in answers])
    fault_stats.add(
        requests_served=len(answers) - len(errors), request_errors=len(errors), invariant_checks=1
    )
    fault_stats.measured(
        p50_ms=round(float(np.percentile(latencies_ms, 50)), 1),
        p99_ms=round(float(np.percentile(latencies_ms, 99)), 1),
        requests_per_s=round(len(answers) / wall, 1),
    )
    assert errors == [], errors[:3]
    assert all(len(a["predictions"][0]["scores"]) == 4 for _, a, _ in answers)
