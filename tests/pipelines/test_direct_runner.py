"""``--runner DirectRunner`` never tries Prism, which Beam's own DirectRunner downloads from GitHub at
run time (pipelines/direct_runner.py): checked in a fresh interpreter, where nothing else has
imported Beam's Prism module, with Prism's job server made to fail instead of reaching the network."""

from __future__ import annotations

import json
import subprocess
import sys

from pipelines.direct_runner import RUNNER_PATH, DirectRunner
from pipelines.runners import DIRECT_RUNNER_PATH

# One graph on mmlinks' DirectRunner (the build's options), then on Beam's: prints what each
# returned, whether Beam imported its Prism runner, how often Prism's job server was started, and
# the beam-temp folders left in the temp directory.
PROBE = """
import json, os, sys, tempfile
import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to
from pipelines.runners import pipeline_options

PRISM = "apache_beam.runners.portability.prism_runner"
starts = []

def run(options):
    with beam.Pipeline(options=options) as p:
        assert_that(p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * 10), equal_to([10, 20, 30]))
    left = [n for n in os.listdir(tempfile.gettempdir()) if n.startswith("beam-temp")]
    return {"prism_imported": PRISM in sys.modules, "prism_starts": len(starts), "beam_temp": len(left)}

mine = run(pipeline_options("DirectRunner", direct_workers=int(sys.argv[1])))
# Beam's own DirectRunner: its Prism job server records the attempt and fails before any download
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability import prism_runner
def no_download(self):
    starts.append(1)
    raise RuntimeError("the test allows no Prism download")
prism_runner.PrismJobServer.start = no_download
beams = run(PipelineOptions(["--runner=DirectRunner"]))
print(json.dumps({"mine": mine, "beams": beams}))
"""


def _probe(tmp_path, workers: int) -> dict:
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), "PYTHONPATH": "."}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(workers)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_direct_runner_runs_a_prism_ready_graph_without_trying_prism(tmp_path):
    seen = _probe(tmp_path, workers=1)
    assert seen["mine"] == {"prism_imported": False, "prism_starts": 0, "beam_temp": 0}
    # the same graph is one Beam's own DirectRunner offers to Prism (so this test can fail)
    assert seen["beams"]["prism_imported"] and seen["beams"]["prism_starts"] == 1


def test_two_direct_workers_run_without_prism_too(tmp_path):
    seen = _probe(tmp_path, workers=2)
    assert seen["mine"] == {"prism_imported": False, "prism_starts": 0, "beam_temp": 0}


def test_the_runner_is_beams_direct_runner_named_by_its_path():
    from apache_beam.runners.direct.direct_runner import DirectRunner as BeamDirectRunner

    assert issubclass(DirectRunner, BeamDirectRunner)
    assert DIRECT_RUNNER_PATH == RUNNER_PATH == f"{DirectRunner.__module__}.{DirectRunner.__name__}"
