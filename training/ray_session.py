"""Joining Ray for a training run: ``connect_ray`` joins ``--ray-address`` (refused in one
line where nothing answers or the token is wrong) or starts a local Ray; ``failure_message``
is the one line that says why its workers failed."""

from __future__ import annotations

import logging
import os
import re
import socket

from training.config import TrainConfig


def connect_ray(cfg: TrainConfig) -> bool:
    """Join ``cfg.ray_address`` or start a local Ray, unless one is running; True if started."""
    import ray

    if ray.is_initialized():
        return False
    if not cfg.ray_logs:  # importing Ray set its logger to INFO: keep its banners off the terminal
        logging.getLogger("ray").setLevel(logging.ERROR)
    if cfg.ray_address:
        probe_ray_address(cfg.ray_address)
        try:
            ray.init(address=cfg.ray_address, log_to_driver=cfg.ray_logs)
        except (ConnectionError, RuntimeError) as exc:
            raise _join_error(cfg.ray_address, exc) from exc
    else:
        # Logical CPUs above the core count leave room for Ray Data's read tasks next to the
        # training workers (otherwise two workers on two cores starve the data pipeline).
        # address="local" always starts a fresh instance, never attaches to a stray cluster.
        # One machine has no preemptible nodes: Ray Train's preemption watcher (an actor process
        # per run, ~2 CPU-s to start) has nothing to watch. Its processes inherit this at start.
        os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
        # Ray starts idle workers for this driver ahead of any task (~1 CPU-s each, 2-3 here);
        # Ray Train's actors run in workers of their own, so those would only wait and exit.
        os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
        ray.init(
            address="local",
            num_cpus=max(4, (os.cpu_count() or 1) * 2),
            include_dashboard=False,
            log_to_driver=cfg.ray_logs,
            configure_logging=cfg.ray_logs,
        )
    return True


def probe_ray_address(address: str, timeout_s: float = 10.0) -> None:
    """Refuse, in one line, a ``host:port`` (or ``ray://host:port``) where nothing listens.

    Ray itself waits minutes on such an address, then may exit the process from C++ without an
    exception to catch (its GCS client's reconnect timeout); a TCP connect answers in seconds.
    ``auto`` and other forms are left to Ray."""
    from schemas.errors import MmlinksError

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        raise MmlinksError(
            f"cannot join the Ray cluster at {address}: nothing answers there ({why})"
        ) from None


def _join_error(address: str, exc: BaseException):
    """One line for a cluster that cannot be joined (Ray raises a chain of tracebacks, and
    says only at their bottom when the cause is a missing or wrong token)."""
    from schemas.errors import MmlinksError, exception_chain

    chain = [str(cause) for cause in exception_chain(exc)]
    if any("InvalidAuthToken" in text or "AuthenticationError" in text for text in chain):
        why = "it refused this process's token (set RAY_AUTH_TOKEN or ~/.ray/auth_token to the cluster's)"
    else:
        lines = [ln.strip() for ln in chain[0].splitlines() if ln.strip()]
        why = lines[0] if lines else type(exc).__name__
    return MmlinksError(f"cannot join the Ray cluster at {address}: {why}")


def failure_message(exc: BaseException) -> str:
    """The one line that says why workers failed: our own errors first, then the last
    ``SomeError: message`` line of the workers' tracebacks, else the first line."""
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for marker in ("loss diverged", "validation loss diverged", "cannot resume run"):
        for line in lines:
            if marker in line:
                return line[line.index(marker) :]
    errors = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b.*:", ln)]
    if errors:
        return errors[-1]
    return lines[0] if lines else type(exc).__name__
