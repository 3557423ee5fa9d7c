"""Beam pipeline options for the runners the build supports, checked before anything starts
(docs/runners.md: one example command per runner).

Why checked up front: a missing required option is a one-line MmlinksError naming it, not a
failure inside the runner. The runner fields every Beam job config shares are declared once here,
their methods in ``BeamJob``."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Beam is imported where options are made: the CLI's parser imports this module
    from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.worker_tuning import short_state_sampling
from schemas.config_fields import option
from schemas.errors import MmlinksError

log = logging.getLogger(__name__)

DIRECT, DATAFLOW, FLINK, SPARK, DASK = (
    "DirectRunner",
    "DataflowRunner",
    "FlinkRunner",
    "SparkRunner",
    "DaskRunner",
)
KNOWN_RUNNERS = (DIRECT, DATAFLOW, FLINK, SPARK, DASK)
# Beam's DaskRunner with the translation the graphs need (pipelines/dask_runner.py says why) and
# Beam's DirectRunner that downloads nothing (pipelines/direct_runner.py); named by path so that
# this module stays cheap to import (the CLI's parser reads it).
DASK_RUNNER_PATH = "pipelines.dask_runner.DaskRunner"
DIRECT_RUNNER_PATH = "pipelines.direct_runner.DirectRunner"
RUNNER_PATHS = {DASK: DASK_RUNNER_PATH, DIRECT: DIRECT_RUNNER_PATH}
ENVIRONMENT_TYPES = ("DOCKER", "PROCESS", "EXTERNAL", "LOOPBACK")

# GPU workers for feature extraction on Dataflow (one T4 per worker, driver installed by Dataflow).
DATAFLOW_GPU_SERVICE_OPTION = "worker_accelerator=type:nvidia-tesla-t4;count:1;install-nvidia-driver"
DATAFLOW_GPU_ARGS = (
    f"--dataflow_service_options={DATAFLOW_GPU_SERVICE_OPTION}",
    "--experiments=use_runner_v2",
    "--machine_type=n1-standard-4",  # T4s attach to N1 machine types
)

_ALIASES = {name.lower(): name for name in KNOWN_RUNNERS} | {
    name.lower().removesuffix("runner"): name for name in KNOWN_RUNNERS
}


def canonical_runner(runner: str) -> str:
    """``DataflowRunner``/``dataflowrunner``/``dataflow`` -> ``DataflowRunner``; unknown: MmlinksError."""
    name = _ALIASES.get((runner or "").strip().lower())
    if name is None:
        raise MmlinksError(f"unknown Beam runner {runner!r}; known runners: {', '.join(KNOWN_RUNNERS)}")
    return name


def known_or_as_given(runner):
    """The canonical name of a known runner spelling (``dask`` -> ``DaskRunner``), else the value
    unchanged, so a config's validation names it among the choices."""
    return _ALIASES.get(runner.strip().lower(), runner) if isinstance(runner, str) else runner


def runner_option(group: str):
    """The ``runner`` field of a job config (BuildConfig, LinkConfig): one declaration."""
    return option(
        DIRECT,
        help="Beam runner (dask: a dask.distributed cluster, see --dask-address); Dataflow, Flink "
        "and Spark need their options after --",
        choices=KNOWN_RUNNERS,
        parse=canonical_runner,
        group=group,
    )


def _given(args: Sequence[str], option: str) -> bool:
    flag = f"--{option}"
    return any(a == flag or a.startswith(flag + "=") for a in args)


def dataflow_job_name(name: str) -> str:
    """A valid Dataflow job name ([a-z]([-a-z0-9]*[a-z0-9])?) derived from ``name``."""
    s = re.sub(r"[^a-z0-9-]+", "-", name.lower())
    s = re.sub(r"-{2,}", "-", s).strip("-")
    if not s or not s[0].isalpha():
        s = f"mmlinks-{s}".rstrip("-")
    return s[:63].rstrip("-")


DIRECT_WORKERS_ENV = "MMLINKS_DIRECT_WORKERS"


def default_direct_workers() -> int:
    """The DirectRunner's worker processes when a job names none: ``$MMLINKS_DIRECT_WORKERS``
    (a machine-wide choice, e.g. 1 on a shared laptop or in a test suite, where per-process
    start-up costs more than small inputs gain), else one per core."""
    raw = os.environ.get(DIRECT_WORKERS_ENV, "").strip()
    if not raw:
        return os.cpu_count() or 1
    if not raw.isdigit() or int(raw) < 1:
        raise MmlinksError(f"{DIRECT_WORKERS_ENV} must be a whole number >= 1, not {raw!r}")
    return int(raw)


def pipeline_options(
    runner: str = DIRECT,
    beam_args: Sequence[str] = (),
    *,
    job_name: str | None = None,
    direct_workers: int | None = None,
    dask_address: str | None = None,
) -> PipelineOptions:
    """Checked PipelineOptions for ``runner`` (see KNOWN_RUNNERS) plus pass-through ``beam_args``.

    ``job_name`` is used unless ``beam_args`` name one (sanitised for Dataflow).
    ``direct_workers`` > 1 runs the DirectRunner with that many worker processes
    (``--direct_num_workers=N --direct_running_mode=multi_processing``; a running mode given in
    ``beam_args`` wins). ``dask_address`` is the Dask scheduler (``--dask_client_address``);
    without it a Dask job runs on the local cluster ``runner_cluster`` starts. Raises
    MmlinksError for an unknown runner, a conflicting ``--runner`` in ``beam_args`` or a missing
    required option.
    """
    from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions

    name = canonical_runner(runner)
    beam_args = [str(a) for a in beam_args]
    for a in beam_args:
        if a == "--runner" or a.startswith("--runner="):
            given = a.partition("=")[2]
            if not given or canonical_runner(given) != name:
                raise MmlinksError(
                    f"pass the runner once, with --runner ({name}), not in the Beam options ({a})"
                )
    # the same runner named again in beam_args: dropped, or Beam would take its own class by name
    beam_args = [a for a in beam_args if not a.startswith("--runner=")]
    args = [f"--runner={RUNNER_PATHS.get(name, name)}", *beam_args]
    if job_name and not _given(beam_args, "job_name"):
        args.append(f"--job_name={dataflow_job_name(job_name) if name == DATAFLOW else job_name}")
    if direct_workers is not None:
        if name != DIRECT:
            raise MmlinksError(f"direct_workers applies to the DirectRunner only, not {name}")
        if direct_workers < 1:
            raise MmlinksError(f"direct_workers must be >= 1, not {direct_workers}")
        if direct_workers > 1:
            args.append(f"--direct_num_workers={direct_workers}")
            if not _given(beam_args, "direct_running_mode"):
                args.append("--direct_running_mode=multi_processing")
    if dask_address is not None:
        if name != DASK:
            raise MmlinksError(f"dask_address applies to the Dask runner only, not {name}")
        if not _given(beam_args, "dask_client_address"):
            args.append(f"--dask_client_address={dask_address}")
    if name == DASK:
        dask_options()  # registers Beam's --dask_* options before they are parsed
    options = PipelineOptions(args, save_main_session=False)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            options.get_all_options(retain_unknown_options=True)  # every view parsed: bad values fail now
    except SystemExit as exc:  # argparse rejected a value (e.g. a bad --direct_running_mode)
        lines = [ln for ln in stderr.getvalue().splitlines() if "error:" in ln]
        why = lines[-1].split("error:", 1)[1].strip() if lines else " ".join(beam_args)
        raise MmlinksError(f"invalid Beam options for {name}: {why}") from exc
    options.view_as(SetupOptions).save_main_session = False
    _check(name, options, beam_args)
    if name == DIRECT:
        short_state_sampling()  # the in-process DirectRunner runs its bundles here
    for advice in advisories(name, beam_args):
        log.warning("%s: %s", name, advice)
    return options


def dask_options():
    try:
        from apache_beam.runners.dask.dask_runner import DaskOptions
    except ImportError as exc:  # dask or distributed missing: pyproject.toml declares both
        raise MmlinksError(f"the Dask runner needs dask and distributed installed ({exc})") from None
    return DaskOptions


DASK_ADDRESS = re.compile(r"^(tcp|tls|inproc|ucx|ws|wss)://\S+$|^[\w.\-\[\]:]+:\d+$")


def dask_address_option(group: str):
    """The ``dask_address`` field of a job config: one declaration for every Beam job."""
    return option(
        None,
        help="--runner dask: a running Dask scheduler (tcp://host:8786); without it the command "
        "starts a local cluster of --dask-workers processes and stops it after the job",
        check=lambda v: v is None or bool(DASK_ADDRESS.match(str(v))),
        rule="a scheduler address like tcp://host:8786",
        metavar="ADDRESS",
        group=group,
    )


def direct_workers_option(group: str):
    """The ``direct_workers`` field of a job config (the DirectRunner's local worker processes)."""
    return option(
        None,
        help="DirectRunner: N local worker processes (default: $MMLINKS_DIRECT_WORKERS, else one"
        " per core; 1 = in-process)",
        at_least=1,
        group=group,
    )


def dask_workers_option(group: str):
    """The ``dask_workers`` field of a job config (the local cluster's worker processes)."""
    return option(
        None,
        help="--runner dask without --dask-address: worker processes of the local cluster, one "
        "thread each (default: one per core)",
        at_least=1,
        group=group,
    )


def device_option(help: str, group: str):
    """The ``device`` field of a job config: where its model runs."""
    return option(
        "cpu",
        help=help,
        check=lambda v: v in ("cpu", "cuda") or (str(v).startswith("cuda:") and str(v)[5:].isdigit()),
        rule="cpu, cuda or cuda:N",
        group=group,
    )


def job_workers(runner: str, direct_workers: int | None, dask_address, dask_workers) -> int | None:
    """Worker processes on this machine that a job's CPU threads are divided among: the
    DirectRunner's, or the local Dask cluster's; None for a cluster somewhere else. A Dask
    option with another runner is refused (it would be ignored silently)."""
    name = canonical_runner(runner)
    if name != DASK and (dask_address is not None or dask_workers is not None):
        raise MmlinksError(f"--dask-address and --dask-workers go with --runner dask, not {name}")
    if name == DIRECT:
        return direct_workers or default_direct_workers()
    if name == DASK and dask_address is None:
        if dask_workers is None:
            return os.cpu_count() or 1
        return dask_workers
    return None


class BeamJob:
    """The runner methods of a Beam job config (BuildConfig, LinkConfig). Each config declares
    its own fields (``runner``, ``direct_workers``, ``dask_address``, ``dask_workers``,
    ``device``, ``cpu_threads``, ``beam_args``), so they keep their place among its flags."""

    def workers(self) -> int | None:
        """Worker processes on this machine: the DirectRunner's or the local Dask cluster's
        (None for a cluster elsewhere)."""
        return job_workers(self.runner, self.direct_workers, self.dask_address, self.dask_workers)

    def threads(self) -> int | None:
        """Torch intra-op threads per worker process (None on GPU).

        CPU results change in the last bits with the thread count, so it is fixed per job and
        recorded with the dataset (the links): the same inputs, parameters and thread count give
        the same bytes on any machine of the same architecture.
        """
        if self.device.startswith("cuda"):
            return None
        if self.cpu_threads:
            return self.cpu_threads
        workers = self.workers()
        if workers is None:
            return None  # a cluster runner: the workers' own default (say --cpu-threads to pin it)
        return max(1, (os.cpu_count() or 1) // workers)

    def pipeline_options(self):
        direct = self.workers() if self.runner == DIRECT else None
        return pipeline_options(
            self.runner, self.beam_args, direct_workers=direct, dask_address=self.dask_address
        )


def _require(name: str, value, option: str, what: str) -> None:
    if value in (None, "", []):
        raise MmlinksError(f"{name} needs --{option} ({what}), a Beam option")


def _check(name: str, options: PipelineOptions, beam_args: list[str]) -> None:
    from apache_beam.options.pipeline_options import GoogleCloudOptions, PortableOptions, SparkRunnerOptions

    gcp = options.view_as(GoogleCloudOptions)
    if name == DATAFLOW:
        _require(name, gcp.project, "project", "the Google Cloud project id")
        _require(name, gcp.region, "region", "e.g. us-central1")
        _require(name, gcp.temp_location, "temp_location", "a gs:// folder for temporary files")
        for opt in ("temp_location", "staging_location"):
            value = getattr(gcp, opt)
            if value and not value.startswith("gs://"):
                raise MmlinksError(f"{name} needs --{opt} on Cloud Storage (gs://...), not {value}")
        if gcp.job_name and gcp.job_name != dataflow_job_name(gcp.job_name):
            raise MmlinksError(
                f"invalid Dataflow --job_name {gcp.job_name!r} (lower-case letters, digits and '-', "
                f"starting with a letter), e.g. {dataflow_job_name(gcp.job_name)!r}"
            )
    if name in (FLINK, SPARK):
        portable = options.view_as(PortableOptions)
        if name == FLINK and not (_given(beam_args, "flink_master") or portable.job_endpoint):
            raise MmlinksError(
                f"{name} needs --flink_master (the Flink REST address, host:8081; [local] for an "
                "embedded cluster) or --job_endpoint (a running Beam Flink job server)"
            )
        if name == SPARK:
            if not (_given(beam_args, "spark_master_url") or portable.job_endpoint):
                raise MmlinksError(
                    f"{name} needs --spark_master_url (spark://host:7077; local[N] for an embedded "
                    "Spark) or --job_endpoint (a running Beam Spark job server)"
                )
            spark = options.view_as(SparkRunnerOptions)
            if spark.spark_submit_uber_jar and not spark.spark_rest_url:
                raise MmlinksError(
                    f"{name} with --spark_submit_uber_jar needs --spark_rest_url (http://host:6066)"
                )
        env = (portable.environment_type or "").upper()
        if env and env not in ENVIRONMENT_TYPES:
            raise MmlinksError(
                f"unknown --environment_type {portable.environment_type!r}; use one of "
                f"{', '.join(ENVIRONMENT_TYPES)}"
            )
        if env in ("PROCESS", "EXTERNAL") and not (
            portable.environment_config or portable.environment_options
        ):
            raise MmlinksError(
                f"--environment_type={env} needs --environment_config "
                + ("(a worker pool address, host:50000)" if env == "EXTERNAL" else "('{\"command\": ...}')")
            )


def advisories(runner: str, beam_args: Sequence[str]) -> list[str]:
    """Non-fatal advice for a runner's options (logged as warnings by pipeline_options)."""
    from apache_beam.options.pipeline_options import (
        GoogleCloudOptions,
        PipelineOptions,
        PortableOptions,
        SetupOptions,
        WorkerOptions,
    )

    name = canonical_runner(runner)
    options = PipelineOptions(list(beam_args))
    out = []
    if name == DATAFLOW:
        setup = options.view_as(SetupOptions)
        if not options.view_as(WorkerOptions).sdk_container_image:
            out.append(
                "no --sdk_container_image: Dataflow workers then lack mmlinks and torch "
                "(build a worker image with them, or at least pass --setup_file=./pyproject.toml)"
                if not (setup.setup_file or setup.requirements_file)
                else "no --sdk_container_image: workers install dependencies at start-up (slow for torch)"
            )
        services = options.view_as(GoogleCloudOptions).dataflow_service_options or []
        if not any(s.startswith("worker_accelerator=") for s in services):
            out.append(f"CPU workers; for GPU feature extraction add {' '.join(DATAFLOW_GPU_ARGS)}")
    if name in (FLINK, SPARK):
        portable = options.view_as(PortableOptions)
        if (portable.environment_type or "DOCKER").upper() == "DOCKER" and not portable.environment_config:
            out.append(
                "DOCKER environment with Beam's default SDK image: it lacks mmlinks and torch; pass "
                "--environment_config=<your image> (or --environment_type=EXTERNAL with a worker pool)"
            )
    return out


_EXAMPLES: dict[str, list[str]] = {
    DIRECT: ["--direct_num_workers=2", "--direct_running_mode=multi_processing"],
    DASK: ["--dask_client_address=tcp://dask-scheduler:8786"],
    DATAFLOW: [
        "--project=my-project",
        "--region=us-central1",
        "--temp_location=gs://my-bucket/tmp",
        "--sdk_container_image=us-central1-docker.pkg.dev/my-project/mmlinks/beam-worker:0.1",
        *DATAFLOW_GPU_ARGS,
        "--max_num_workers=8",
    ],
    FLINK: [
        "--flink_master=flink-jobmanager:8081",
        "--flink_version=1.20",
        "--environment_type=EXTERNAL",
        "--environment_config=localhost:50000",
        "--parallelism=8",
    ],
    SPARK: [
        "--spark_master_url=spark://spark-master:7077",
        "--environment_type=DOCKER",
        "--environment_config=registry.example.com/mmlinks/beam-worker:0.1",
    ],
}

_EXAMPLE_IO = {
    DIRECT: ("raw/", "data/mmlinks"),
    DASK: ("raw/", "data/mmlinks"),
    DATAFLOW: ("gs://my-bucket/raw", "gs://my-bucket/datasets/mmlinks"),
    FLINK: ("s3://my-bucket/raw", "s3://my-bucket/datasets/mmlinks"),
    SPARK: ("s3://my-bucket/raw", "s3://my-bucket/datasets/mmlinks"),
}


def example_beam_args(runner: str) -> list[str]:
    """The Beam options of the documented example for ``runner`` (they pass pipeline_options)."""
    return list(_EXAMPLES[canonical_runner(runner)])


def example_command(runner: str, *, beam_arg_flag: bool = False) -> str:
    """One example ``mmlinks data build`` command for ``runner``.

    Beam options follow ``--`` (the proposed CLI surface); with ``beam_arg_flag`` each is given as
    ``--beam-arg=OPTION`` instead, which the current CLI already accepts.
    """
    name = canonical_runner(runner)
    src, out = _EXAMPLE_IO[name]
    cmd = ["mmlinks", "data", "build", "--source", "synthetic"]
    cmd += ["--input", src, "--out", out, "--runner", name]
    if name == DATAFLOW:
        cmd += ["--device", "cuda"]
    extra = example_beam_args(name)
    cmd += [f"--beam-arg={a}" for a in extra] if beam_arg_flag else ["--", *extra]
    return shlex.join(cmd)
