"""Training on a Ray cluster through the Ray Jobs API (docs/orchestration.md, "Training on a Ray
cluster"): submit ``python -m models.job``, stream its log, return its JSON result.

FAILED or STOPPED raises ``RayJobError`` with the log's cause; why the job is stopped on
interruption: a cancelled Dagster run must not leave training behind. No Dagster import.
``RAY_AUTH_TOKEN`` is a header, never logged or put into the runtime environment."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from schemas.errors import MmlinksError
from training.experiment import ExperimentResult

ADDRESS_ENV = "MMLINKS_RAY_ADDRESS"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
# Never uploaded with working_dir: environments, local stores, build outputs.
DEFAULT_EXCLUDES = [
    ".venv",
    ".git",
    ".dagster",
    "data",
    "mmlinks-demo",
    "mlruns",
    "mlartifacts",
    "ray_results",
    "*.db",
    "**/__pycache__",
    "*.egg-info",
]


@dataclass
class TrainingOutcome:
    """A training run's typed result, and the Ray job that ran it ("" when it ran in-process)."""

    result: ExperimentResult
    ray_job_id: str = ""


class RayJobError(MmlinksError):
    """A cluster job could not be submitted, or did not succeed. ``transient`` says whether a
    retry may help (an unreachable or restarting cluster, a crashed driver), as opposed to a
    refused configuration, credential or the command's own one-line error."""

    def __init__(self, message: str, transient: bool = False, job_id: str | None = None):
        super().__init__(message)
        self.transient = transient
        self.job_id = job_id


def _one_line(text: object, limit: int = 400) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def auth_headers() -> dict[str, str]:
    """The Authorization header for a token-authenticated cluster, from the environment only."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    path = os.environ.get(TOKEN_PATH_ENV, "").strip()
    if not token and path:
        try:
            token = Path(path).read_text().strip()
        except OSError as exc:
            raise RayJobError(
                f"{TOKEN_PATH_ENV}={path}: cannot read the Ray token file: {exc.strerror}"
            ) from exc
    return {"Authorization": f"Bearer {token}"} if token else {}


def _scrub(text: str) -> str:
    """Drop the token from a message, whatever a library put into it."""
    token = auth_headers().get("Authorization", "")[len("Bearer ") :]
    return text.replace(token, "***") if token else text


def connect(address: str):
    """A ``JobSubmissionClient`` for ``address`` (http://head:8265, or ray://head:10001, which
    Ray resolves to the dashboard through a Ray Client connection), or one clear error."""
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    address = (address or "").strip()
    if not address:
        raise RayJobError(f"no Ray cluster address: set {ADDRESS_ENV} (e.g. http://ray-head:8265)")
    for var in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"):
        other = os.environ.get(var, "").strip()
        if other and other != address:  # Ray's client silently prefers these over its argument
            raise RayJobError(
                f"{var}={other} is set in this environment and Ray would use it instead of "
                f"{ADDRESS_ENV}={address}; unset one of them"
            )
    headers = auth_headers()
    try:
        return JobSubmissionClient(address, headers=headers or None)
    except ConnectionError as exc:
        raise RayJobError(
            f"cannot reach the Ray cluster at {address} ({ADDRESS_ENV}): {_one_line(_scrub(str(exc)))}",
            transient=True,
        ) from exc
    except (ValueError, RuntimeError) as exc:  # a malformed address, or the server refused us
        text = _one_line(_scrub(str(exc)))
        if "401" in text or "Missing authentication token" in text:
            hint = f"the cluster requires a token: set {TOKEN_ENV} (or {TOKEN_PATH_ENV}) in this environment"
        elif "403" in text or "Invalid authentication token" in text:
            hint = f"the cluster refused the token in {TOKEN_ENV}"
        else:
            hint = text
        raise RayJobError(f"Ray cluster at {address} ({ADDRESS_ENV}): {hint}") from exc
    except AuthenticationError as exc:
        raise RayJobError(
            f"Ray cluster at {address} ({ADDRESS_ENV}) refused the connection: set a valid {TOKEN_ENV} "
            f"(or {TOKEN_PATH_ENV}) in this environment"
        ) from exc


# ------------------------------------------------------------------------------ the command


def train_command(cfg, model_name: str | None, alias: str | None, python: str = "python") -> list[str]:
    """``python -m models.job --config '{...}'``: the config itself travels as JSON.

    Every field goes into the JSON, so the job trains exactly ``cfg`` (nothing is re-derived
    from CLI defaults); the job's driver joins the cluster it runs on (``ray_address: auto``).
    The JSON is an argument rather than a file because the cluster cannot read this machine's
    disk; the config holds no credential (the tracking URI is refused when it carries one).
    """
    # from the values as given, so what "auto" resolves to (``--workers auto``: Ray Train workers
    # on a cluster, not the job's driver process) is resolved for the cluster, not for here
    job_cfg = type(cfg)(**{**cfg.given_dict(), "ray_address": "auto", "ray_logs": False})
    config = json.dumps(job_cfg.to_dict(), sort_keys=True, separators=(",", ":"))
    return [
        python,
        "-m",
        "models.job",
        "--config",
        config,
        "--model-name",
        model_name or "",
        "--alias",
        alias or "",
    ]


def parse_result(logs: str) -> dict | None:
    """The command's JSON result: the last log line that is a JSON object with a run id."""
    for line in reversed(logs.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and "run_id" in obj:
                return obj
    return None


def failure_cause(logs: str, message: str | None) -> str:
    """The most telling line: the CLI's one-line error, else a Python exception, else Ray's word."""
    lines = [ln.strip() for ln in logs.splitlines() if ln.strip()]
    for line in reversed(lines):
        if line.startswith("mmlinks: error:"):
            return line
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head:
            return line
    return _one_line(message or "no log and no message from Ray")


class LineBuffer:
    """Log chunks -> whole lines; a progress bar's carriage-return updates collapse to the last."""

    def __init__(self, emit: Callable[[str], None]):
        self.emit, self.pending = emit, ""

    def feed(self, chunk: str) -> None:
        self.pending += chunk
        *done, self.pending = self.pending.split("\n")
        for line in done:
            self._emit(line)

    def close(self) -> None:
        if self.pending:
            self._emit(self.pending)
            self.pending = ""

    def _emit(self, line: str) -> None:
        line = line.rsplit("\r", 1)[-1].rstrip()
        if line:
            self.emit(line)


# ----------------------------------------------------------------------------- submission


@dataclass
class JobSettings:
    address: str
    runtime_env: dict | None = None  # Ray runtime_env (working_dir, py_modules, pip, env_vars, ...)
    python: str = "python"  # the interpreter on the cluster that has mmlinks' dependencies
    timeout_s: float = 12 * 3600.0
    poll_s: float = 2.0


def _runtime_env(settings: JobSettings, tracking_uri: str | None) -> dict:
    env = json.loads(json.dumps(settings.runtime_env or {}))
    if env.get("working_dir") and "excludes" not in env:
        env["excludes"] = list(DEFAULT_EXCLUDES)
    if tracking_uri:
        parts = urlsplit(tracking_uri)
        if parts.username or parts.password:
            raise RayJobError(
                "the MLflow tracking URI carries credentials; give the cluster MLFLOW_TRACKING_USERNAME/"
                "PASSWORD (or a token) in its own environment and a URI without them here"
            )
        env.setdefault("env_vars", {})["MLFLOW_TRACKING_URI"] = tracking_uri
    for key in env.get("env_vars", {}):
        if key in (TOKEN_ENV, "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "AWS_SECRET_ACCESS_KEY"):
            raise RayJobError(
                f"runtime_env env_vars must not carry the credential {key} (the dashboard shows them)"
            )
    return env


def _follow(client, job_id: str, on_log: Callable[[str], None], deadline: float, poll_s: float) -> str:
    """Stream the driver's log until the job ends; return its final status."""
    buf = LineBuffer(on_log)

    async def tail() -> None:
        async for chunk in client.tail_job_logs(job_id):
            buf.feed(chunk)

    streamed = False
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread: stream over the websocket
        try:
            asyncio.run(asyncio.wait_for(tail(), timeout=max(1.0, deadline - time.monotonic())))
            streamed = True
        except TimeoutError:
            pass
        except (RuntimeError, OSError) as exc:  # the websocket dropped: fall back to polling
            on_log(f"[log stream interrupted ({_one_line(exc, 200)}); polling]")
    buf.close()
    seen = 0
    while True:
        status = str(client.get_job_status(job_id)).rsplit(".", 1)[-1]  # JobStatus.X or "X"
        if not streamed:  # polling: pass on what is new in the full log
            logs = client.get_job_logs(job_id)
            buf.feed(logs[seen:])
            seen = len(logs)
        if status in TERMINAL:
            buf.close()
            return status
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(poll_s)


def submit_training(
    settings: JobSettings,
    cfg,
    *,
    model_name: str | None,
    alias: str | None,
    tracking_uri: str | None,
    on_log: Callable[[str], None] = print,
    submission_id: str | None = None,
    metadata: dict[str, str] | None = None,
) -> TrainingOutcome:
    """Train ``cfg`` as a Ray job (``python -m models.job``); its typed result and job id."""
    entrypoint = shlex.join(train_command(cfg, model_name, alias, settings.python))
    runtime_env = _runtime_env(settings, tracking_uri)
    client = connect(settings.address)
    job_id = submission_id or f"mmlinks-train-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    try:
        job_id = client.submit_job(
            entrypoint=entrypoint, runtime_env=runtime_env, submission_id=job_id, metadata=metadata or {}
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayJobError(
            f"the Ray cluster at {settings.address} refused the job: {_one_line(_scrub(str(exc)))}",
            transient=isinstance(exc, ConnectionError),
        ) from exc
    on_log(f"submitted Ray job {job_id} to {settings.address}: {entrypoint}")
    status = None
    try:
        status = _follow(client, job_id, on_log, time.monotonic() + settings.timeout_s, settings.poll_s)
    except TimeoutError:
        raise RayJobError(
            f"Ray job {job_id} did not finish within {settings.timeout_s:.0f} s; it was stopped",
            job_id=job_id,
        ) from None
    finally:
        if status is None:  # interrupted, timed out or the cluster went away: do not leave it running
            try:
                client.stop_job(job_id)
            except (ConnectionError, RuntimeError) as exc:
                on_log(f"could not stop Ray job {job_id}: {_one_line(exc, 200)}")
    logs = client.get_job_logs(job_id)
    if status != "SUCCEEDED":
        info = client.get_job_info(job_id)
        cause = failure_cause(logs, getattr(info, "message", None))
        # The command's own one-line errors (bad data, bad config) do not go away on a retry.
        transient = not cause.startswith("mmlinks: error:") and status == "FAILED"
        raise RayJobError(f"Ray job {job_id} {status}: {cause}", transient=transient, job_id=job_id)
    result = parse_result(logs)
    if result is None:
        raise RayJobError(f"Ray job {job_id} succeeded but printed no JSON result", job_id=job_id)
    try:
        return TrainingOutcome(ExperimentResult.from_dict(result), job_id)
    except MmlinksError as exc:
        raise RayJobError(f"Ray job {job_id}: {exc}", job_id=job_id) from exc
