"""What a Beam process tunes in itself: the state sampler's shorter period
(``short_state_sampling``, for the process that runs a pipeline) and, in an SDK worker process,
that plus a frozen heap at exit (``tune_worker_process``, called from the jobs' DoFn setups)."""

from __future__ import annotations

import sys

STATE_SAMPLING_MS = 10  # Beam's default is 200 (see short_state_sampling)


def short_state_sampling(period_ms: int = STATE_SAMPLING_MS) -> bool:
    """Make Beam's per-bundle state sampler wake every ``period_ms`` instead of every 200 ms.

    Stopping a bundle's sampler thread *joins* it, and Beam's own comment says a bundle "may have
    to wait up to sampling_period_ms": for a pipeline run in this process that wait lands on the
    job's end (the link job's 5,000 documents ended 0.05 s after their last chunk with 10 ms,
    0.06-0.23 s with 200). Beam has no option for the period, so its constructor's default is
    changed, once per process (worker processes: ``tune_worker_process``); waking every 10 ms costs
    nothing measurable. Returns whether the default is now ``period_ms``: False when it is neither
    Beam's 200 ms nor ``period_ms`` (another Beam version, or an earlier call), then left alone."""
    from apache_beam.runners.worker import statesampler

    init = statesampler.StateSampler.__init__
    if init.__defaults__ != (statesampler.DEFAULT_SAMPLING_PERIOD_MS,):
        return init.__defaults__ == (period_ms,)
    init.__defaults__ = (period_ms,)
    return True


SDK_WORKER_MAIN = "apache_beam.runners.worker.sdk_worker_main"


_worker_tuned = False


def in_sdk_worker() -> bool:
    """Whether this process is a Beam SDK worker (``python -m ...sdk_worker_main``): the
    DirectRunner's multi-processing workers, and a cluster runner's Python workers."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == SDK_WORKER_MAIN


def tune_worker_process() -> bool:
    """Called from DoFn ``setup``s: in a Beam SDK worker process, once, the state sampler's shorter
    period (``pipeline_options`` applies it only to the process that runs the pipeline) and
    ``gc.freeze`` at exit: a worker that has loaded torch, MLflow and Beam spends ~1 s of its exit in
    the final garbage collection, and the DirectRunner stops its workers one after another (the
    2-worker link job ended 2.2 s after its last shard, 0.4 s frozen: docs/benchmarks.md). Elsewhere
    (the in-process DirectRunner, Dagster, tests) nothing changes: a long-lived process must keep
    collecting. Returns whether it applied now."""
    global _worker_tuned
    if _worker_tuned or not in_sdk_worker():
        return False
    import atexit
    import gc

    short_state_sampling()
    atexit.register(gc.freeze)
    _worker_tuned = True
    return True
