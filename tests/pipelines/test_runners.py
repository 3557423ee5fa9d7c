"""Runner options: each supported runner's options parse into Beam's views; mistakes are clear
errors. One real multi-process DirectRunner run checks that counters come back."""

from __future__ import annotations

import json
import logging
import os
import shlex

import apache_beam as beam
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import (
    DebugOptions,
    DirectOptions,
    FlinkRunnerOptions,
    GoogleCloudOptions,
    PortableOptions,
    SetupOptions,
    SparkRunnerOptions,
    StandardOptions,
    WorkerOptions,
)

from pipelines.runners import (
    DASK_RUNNER_PATH,
    DATAFLOW_GPU_ARGS,
    DATAFLOW_GPU_SERVICE_OPTION,
    DIRECT_RUNNER_PATH,
    KNOWN_RUNNERS,
    advisories,
    canonical_runner,
    dataflow_job_name,
    example_beam_args,
    example_command,
    pipeline_options,
)
from pipelines.worker_tuning import short_state_sampling
from schemas.errors import MmlinksError

DATAFLOW_REQUIRED = ["--project=proj", "--region=europe-west4", "--temp_location=gs://bkt/tmp"]


def test_direct_runner_defaults_and_workers():
    opts = pipeline_options("DirectRunner", ["--save_main_session"])
    assert opts.view_as(StandardOptions).runner == DIRECT_RUNNER_PATH  # the one without Prism
    assert opts.view_as(SetupOptions).save_main_session is False  # always, whatever was passed
    assert opts.view_as(DirectOptions).direct_num_workers == 1

    direct = pipeline_options("direct", [], direct_workers=2).view_as(DirectOptions)
    assert (direct.direct_num_workers, direct.direct_running_mode) == (2, "multi_processing")
    mine = pipeline_options("DirectRunner", ["--direct_running_mode=multi_threading"], direct_workers=3)
    assert mine.view_as(DirectOptions).direct_running_mode == "multi_threading"
    assert pipeline_options("DirectRunner", [], direct_workers=1).view_as(
        DirectOptions
    ).direct_running_mode == ("in_memory")
    with pytest.raises(MmlinksError, match="DirectRunner only"):
        pipeline_options("DataflowRunner", DATAFLOW_REQUIRED, direct_workers=2)
    with pytest.raises(MmlinksError, match=">= 1"):
        pipeline_options("DirectRunner", [], direct_workers=0)
    with pytest.raises(
        MmlinksError,
        match="invalid Beam options for DirectRunner: argument --direct_running_mode: invalid choice",
    ):
        pipeline_options("DirectRunner", ["--direct_running_mode=bogus"])


def test_direct_options_shorten_the_state_sampler_that_ends_every_bundle(monkeypatch):
    from apache_beam.runners.worker import statesampler
    from apache_beam.utils.counters import CounterFactory

    # Beam's default, put back after the test whatever it was
    monkeypatch.setattr(statesampler.StateSampler.__init__, "__defaults__", (200,))
    assert statesampler.StateSampler("s", CounterFactory()).sampling_period_ms == 200
    pipeline_options("DirectRunner", [])
    sampler = statesampler.StateSampler("s", CounterFactory())
    assert sampler.sampling_period_ms == 10  # a bundle's end waits for the sampler's sleep
    assert short_state_sampling() is True  # applied already: nothing to do
    monkeypatch.setattr(statesampler.StateSampler.__init__, "__defaults__", (50,))
    assert short_state_sampling() is False  # not Beam's default as we know it: left alone
    sampler.start()  # a sampler with the short period still samples and stops
    sampler.stop()


def test_dataflow_options_parse_into_their_views(caplog):
    extra = ["--sdk_container_image=europe-docker.pkg.dev/proj/mmlinks/worker:1", *DATAFLOW_GPU_ARGS]
    with caplog.at_level(logging.WARNING, logger="pipelines.runners"):
        opts = pipeline_options(
            "DataflowRunner", [*DATAFLOW_REQUIRED, *extra, "--my_custom_flag=7"], job_name="MMLinks Build_v2"
        )
    gcp = opts.view_as(GoogleCloudOptions)
    assert (gcp.project, gcp.region, gcp.temp_location) == ("proj", "europe-west4", "gs://bkt/tmp")
    assert gcp.job_name == "mmlinks-build-v2"
    assert gcp.dataflow_service_options == [DATAFLOW_GPU_SERVICE_OPTION]
    assert "use_runner_v2" in opts.view_as(DebugOptions).experiments
    workers = opts.view_as(WorkerOptions)
    assert workers.sdk_container_image == "europe-docker.pkg.dev/proj/mmlinks/worker:1"
    assert workers.machine_type == "n1-standard-4"
    assert opts.get_all_options(retain_unknown_options=True)["my_custom_flag"] == "7"  # passed through
    assert not caplog.records  # container and GPU given: no advice
    assert (
        pipeline_options("dataflow", [*DATAFLOW_REQUIRED, "--job_name=mine"], job_name="x")
        .view_as(GoogleCloudOptions)
        .job_name
        == "mine"
    )


@pytest.mark.parametrize("missing", ["project", "region", "temp_location"])
def test_dataflow_missing_required_option_is_named(missing):
    args = [a for a in DATAFLOW_REQUIRED if not a.startswith(f"--{missing}=")]
    with pytest.raises(MmlinksError, match=f"DataflowRunner needs --{missing}"):
        pipeline_options("DataflowRunner", args)


def test_dataflow_rejects_local_temp_location_and_bad_job_name():
    with pytest.raises(MmlinksError, match="gs://"):
        pipeline_options("DataflowRunner", ["--project=p", "--region=r", "--temp_location=/tmp/x"])
    with pytest.raises(MmlinksError, match="invalid Dataflow --job_name"):
        pipeline_options("DataflowRunner", [*DATAFLOW_REQUIRED, "--job_name=Bad_Name"])
    assert dataflow_job_name("2024 build!") == "mmlinks-2024-build"


def test_dataflow_advice_for_container_and_gpu(caplog):
    advice = advisories("DataflowRunner", DATAFLOW_REQUIRED)
    assert any("--sdk_container_image" in a for a in advice)
    assert any(DATAFLOW_GPU_SERVICE_OPTION in a for a in advice)
    with caplog.at_level(logging.WARNING, logger="pipelines.runners"):
        pipeline_options("DataflowRunner", DATAFLOW_REQUIRED)
    assert len(caplog.records) == 2


def test_flink_options_parse_into_their_views():
    opts = pipeline_options(
        "FlinkRunner",
        [
            "--flink_master=jm:8081",
            "--flink_version=1.20",
            "--environment_type=EXTERNAL",
            "--environment_config=localhost:50000",
            "--parallelism=4",
        ],
    )
    flink, portable = opts.view_as(FlinkRunnerOptions), opts.view_as(PortableOptions)
    assert (flink.flink_master, flink.flink_version, flink.parallelism) == ("jm:8081", "1.20", 4)
    assert (portable.environment_type, portable.environment_config) == ("EXTERNAL", "localhost:50000")
    assert opts.view_as(StandardOptions).runner == "FlinkRunner"
    # A running job server instead of a Flink master.
    assert pipeline_options("flink", ["--job_endpoint=js:8099", "--environment_type=LOOPBACK"])

    with pytest.raises(MmlinksError, match="FlinkRunner needs --flink_master"):
        pipeline_options("FlinkRunner", ["--environment_type=LOOPBACK"])
    with pytest.raises(MmlinksError, match="EXTERNAL needs --environment_config"):
        pipeline_options("FlinkRunner", ["--flink_master=jm:8081", "--environment_type=EXTERNAL"])
    with pytest.raises(MmlinksError, match="unknown --environment_type 'KUBERNETES'"):
        pipeline_options("FlinkRunner", ["--flink_master=jm:8081", "--environment_type=KUBERNETES"])
    assert any("--environment_config" in a for a in advisories("FlinkRunner", ["--flink_master=jm:8081"]))


def test_spark_options_parse_into_their_views():
    opts = pipeline_options(
        "SparkRunner",
        ["--spark_master_url=spark://m:7077", "--environment_type=DOCKER", "--environment_config=reg/img:1"],
    )
    assert opts.view_as(SparkRunnerOptions).spark_master_url == "spark://m:7077"
    assert opts.view_as(PortableOptions).environment_config == "reg/img:1"
    with pytest.raises(MmlinksError, match="SparkRunner needs --spark_master_url"):
        pipeline_options("SparkRunner", [])
    with pytest.raises(MmlinksError, match="--spark_rest_url"):
        pipeline_options("SparkRunner", ["--spark_master_url=spark://m:7077", "--spark_submit_uber_jar"])


def test_unknown_and_conflicting_runners():
    with pytest.raises(
        MmlinksError, match="known runners: DirectRunner, DataflowRunner, FlinkRunner, SparkRunner"
    ):
        pipeline_options("SamzaRunner", [])
    with pytest.raises(MmlinksError, match="pass the runner once"):
        pipeline_options("DirectRunner", ["--runner=DataflowRunner"])
    again = pipeline_options("DirectRunner", ["--runner=DirectRunner"])  # not Beam's own class by name
    assert again.view_as(StandardOptions).runner == DIRECT_RUNNER_PATH
    dask = pipeline_options("dask", ["--runner=dask"])  # the last --runner would otherwise be Beam's own
    assert dask.view_as(StandardOptions).runner == DASK_RUNNER_PATH
    assert [canonical_runner(r) for r in ("spark", "FLINKRUNNER", "Dataflow")] == [
        "SparkRunner",
        "FlinkRunner",
        "DataflowRunner",
    ]


@pytest.mark.parametrize("runner", KNOWN_RUNNERS)
def test_examples_are_valid(runner):
    pipeline_options(runner, example_beam_args(runner))  # passes the checks
    words = shlex.split(example_command(runner))
    assert words[:3] == ["mmlinks", "data", "build"] and words[words.index("--runner") + 1] == runner
    assert words[words.index("--") + 1 :] == example_beam_args(runner)
    legacy = shlex.split(example_command(runner, beam_arg_flag=True))
    assert "--" not in legacy
    assert [
        w.removeprefix("--beam-arg=") for w in legacy if w.startswith("--beam-arg=")
    ] == example_beam_args(runner)


# ---------------------------------------------------------------- a real multi-process run


def _count(x: int) -> int:
    beam.metrics.Metrics.counter("mmlinks.test", "seen").inc()
    beam.metrics.Metrics.counter("mmlinks.test", "seen_even").inc(x % 2 == 0)
    return x


def test_multiprocessing_direct_runner_reports_counters():
    opts = pipeline_options("DirectRunner", [], direct_workers=2)
    p = beam.Pipeline(options=opts)
    _ = p | beam.Create(list(range(50))) | beam.Reshuffle() | beam.Map(_count)
    result = p.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_namespace("mmlinks.test"))["counters"]
    values = {c.key.metric.name: (c.committed, c.attempted) for c in counters}
    assert values == {"seen": (50, 50), "seen_even": (25, 25)}


def test_the_direct_worker_default_comes_from_the_environment_else_the_cores(monkeypatch):
    from pipelines.build_config import BuildConfig
    from pipelines.runners import DIRECT_WORKERS_ENV, default_direct_workers

    monkeypatch.delenv(DIRECT_WORKERS_ENV, raising=False)
    assert default_direct_workers() == (os.cpu_count() or 1)
    monkeypatch.setenv(DIRECT_WORKERS_ENV, "3")
    assert BuildConfig(source="synthetic", input="i", out="o").workers() == 3
    assert BuildConfig(source="synthetic", input="i", out="o", direct_workers=2).workers() == 2  # named wins
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(DIRECT_WORKERS_ENV, bad)
        with pytest.raises(
            MmlinksError, match=f"MMLINKS_DIRECT_WORKERS must be a whole number >= 1, not '{bad}'"
        ):
            default_direct_workers()


class _ReportWorkerTuning(beam.DoFn):
    """Calls ``tune_worker_process`` in its setup, as the jobs' DoFns do, and writes what it
    found to ``out`` (one JSON line per worker process)."""

    def __init__(self, out: str):
        self.out = out

    def setup(self):
        import atexit

        from apache_beam.runners.worker import statesampler

        from pipelines.worker_tuning import in_sdk_worker, tune_worker_process

        before = atexit._ncallbacks()
        applied = tune_worker_process()
        self.report = {
            "worker": in_sdk_worker(),
            "applied": applied,
            "again": tune_worker_process(),
            "exit_hooks_added": atexit._ncallbacks() - before,
            "sampling_ms": statesampler.StateSampler.__init__.__defaults__[0],
        }

    def process(self, x):
        with open(self.out, "a") as fh:
            fh.write(json.dumps(self.report) + "\n")
        yield x


@pytest.mark.slow
def test_worker_processes_are_tuned_and_the_pipelines_own_process_is_not(tmp_path):
    """In a real multi-processing DirectRunner worker: the short state sampler and one exit
    hook (``gc.freeze``), once; in this process (in-process runner, tests, Dagster) nothing."""
    import atexit

    from pipelines.worker_tuning import tune_worker_process

    before = atexit._ncallbacks()
    assert tune_worker_process() is False and atexit._ncallbacks() == before
    out = tmp_path / "report.jsonl"
    options = pipeline_options("DirectRunner", ["--direct_running_mode=multi_processing"], direct_workers=1)
    with beam.Pipeline(options=options) as p:
        _ = p | beam.Create([1, 2, 3]) | beam.ParDo(_ReportWorkerTuning(str(out)))
    reports = [json.loads(line) for line in out.read_text().splitlines()]
    assert reports and all(
        r == {"worker": True, "applied": True, "again": False, "exit_hooks_added": 1, "sampling_ms": 10}
        for r in reports
    ), reports
