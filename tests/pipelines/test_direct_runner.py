"""``--runner DirectRunner`` runs a graph as Beam's own DirectRunner does once Prism is out of the
way (pipelines/direct_runner.py): no Prism, no runner-API round trip. Checked in a fresh
interpreter whose Prism job server records each start and fails it, so nothing reaches the network."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pipelines.direct_runner import RUNNER_PATH, DirectRunner
from pipelines.runners import DIRECT_RUNNER_PATH

ROOT = Path(__file__).resolve().parents[2]

# One graph on mmlinks' DirectRunner (the build's options), then on Beam's own: prints, for each,
# how often Prism's job server was started and how often Beam rebuilt the graph from its proto.
PROBE = """
import json, sys
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability import prism_runner
from apache_beam.testing.util import assert_that, equal_to
from pipelines.runners import pipeline_options

seen = {"prism_starts": 0, "round_trips": 0}

def no_download(self):
    seen["prism_starts"] += 1
    raise RuntimeError("the test allows no Prism download")

prism_runner.PrismJobServer.start = no_download
rebuild = beam.Pipeline.from_runner_api

def counted(*args, **kwargs):
    seen["round_trips"] += 1
    return rebuild(*args, **kwargs)

beam.Pipeline.from_runner_api = staticmethod(counted)

def run(options):
    seen.update(prism_starts=0, round_trips=0)
    with beam.Pipeline(options=options) as p:
        assert_that(p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * 10), equal_to([10, 20, 30]))
    return dict(seen)

mine = run(pipeline_options("DirectRunner", direct_workers=int(sys.argv[1])))
beams = run(PipelineOptions(["--runner=DirectRunner"]))
print(json.dumps({"mine": mine, "beams": beams}))
"""


def _probe(workers: int) -> dict:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(workers)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_direct_runner_runs_a_prism_ready_graph_without_trying_prism():
    seen = _probe(workers=1)
    assert seen["mine"] == {"prism_starts": 0, "round_trips": 0}
    # the same graph is one Beam's own DirectRunner offers to Prism (so this test can fail)
    assert seen["beams"] == {"prism_starts": 1, "round_trips": 0}


def test_two_direct_workers_run_without_prism_too():
    assert _probe(workers=2)["mine"] == {"prism_starts": 0, "round_trips": 0}


def test_the_runner_is_beams_direct_runner_named_by_its_path():
    from apache_beam.runners.direct.direct_runner import DirectRunner as BeamDirectRunner

    assert issubclass(DirectRunner, BeamDirectRunner)
    assert DIRECT_RUNNER_PATH == RUNNER_PATH == f"{DirectRunner.__module__}.DirectRunner"
