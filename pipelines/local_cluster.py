"""The local Dask cluster of a ``--runner dask`` job that names no scheduler: ``runner_cluster``
starts it for the job (a real scheduler and nanny-watched worker processes, without a dashboard)
and stops it after; ``prestart_local_workers`` starts the fork server its workers come from
while the command builds its graph."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING

from pipelines.runners import DASK, DASK_RUNNER_PATH, dask_options, known_or_as_given

if TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions


# A local cluster has no dashboard, so nobody reads what its workers' statistical profiler (a
# stack walk every 10 ms while a task runs) and disk monitor record; off, a 5,000-document Dask
# build took 238 s instead of 277 (the DirectRunner's 238; docs/benchmarks-scale.md). Its event
# loops' latency check (every 20 ms), memory monitor (100 ms) and system monitor (500 ms) wake
# less often: an idle 2-worker cluster spent 1.3 % of a core per worker and 2.5 % in the
# command's scheduler, 0.2 % and 0.6 % so (a worker past its memory limit is still stopped, a
# second later at most). The Dask runner's shuffle pieces and tag selections are known to take
# microseconds: the scheduler's work stealing would otherwise take them for 0.5 s tasks until the
# first one finished, and move one (and the whole split it reads) to an idle worker. A cluster
# that names its scheduler keeps its own configuration (infra/k8s/dask sets the same durations).
LOCAL_CLUSTER_CONFIG = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.system-monitor.disk": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.worker.memory.monitor-interval": "1s",
    "distributed.admin.system-monitor.interval": "2s",
    "distributed.scheduler.default-task-durations.groupby-piece": "1us",
    "distributed.scheduler.default-task-durations.select": "1us",
}


@contextlib.contextmanager
def runner_cluster(options: PipelineOptions, workers: int | None):
    """The job's options, with a local Dask cluster of ``workers`` processes (one thread each)
    started for a Dask job that names no scheduler, and closed after it; other jobs: as given.

    A real scheduler and real worker processes (dask.distributed's LocalCluster with a nanny
    per worker, which restarts a worker that dies), the same software as a cluster on
    Kubernetes; only its address is local."""
    from apache_beam.options.pipeline_options import StandardOptions

    if options.view_as(StandardOptions).runner != DASK_RUNNER_PATH:
        yield options
        return
    view = options.view_as(dask_options())
    if view.address or view.scheduler_file:
        yield options
        return
    import dask
    from dask.distributed import LocalCluster

    # Workers come from this process's fork server (prestart_local_workers), or are spawned.
    method = "forkserver" if _forkserver_started[0] else "spawn"
    with dask.config.set({"distributed.worker.multiprocessing-method": method, **LOCAL_CLUSTER_CONFIG}):
        cluster = LocalCluster(
            n_workers=workers or os.cpu_count() or 1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.ERROR,
        )
        try:
            view.address = cluster.scheduler_address
            yield options
        finally:
            view.address = None
            cluster.close()


# What prestart_local_workers' fork server imports before it forks a worker, with the job's module.
LOCAL_WORKER_PRELOAD = ("distributed", "apache_beam", "torch")


_forkserver_started = [False]


def prestart_local_workers(runner: str, dask_address: str | None, job_module: str) -> bool:
    """For a Dask job on a local cluster: start, now, the fork server its workers will be forked
    from, importing Beam, torch and ``job_module`` while this process does its own imports and builds
    the graph (spawned workers import all that on their first task: ~3 s of a build on 2 cores,
    docs/runners.md; starting it with the cluster only moved the imports). Not a plain fork of this
    process: it may have run torch ops by then, and a child forked after OpenMP's thread pool started
    hangs in its first parallel region. Returns whether it started one (once per process)."""
    if known_or_as_given(runner) != DASK or dask_address or _forkserver_started[0]:
        return False
    import multiprocessing
    import multiprocessing.forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload([*LOCAL_WORKER_PRELOAD, job_module])
    multiprocessing.forkserver.ensure_running()
    _forkserver_started[0] = True
    return True
