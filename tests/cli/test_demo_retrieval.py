"""`mmlinks demo --family retrieval --json` end to end (issue #34): synth-coherence -> Beam build
-> CMCA and CMCM trained -> test metrics -> report -> CMCM promoted -> a text queried against the
production model; at the demo's default training settings, on fewer pairs to keep it short, both
models beat chance by a clear margin (the same bars as
tests/training/retrieval/test_retrieval_learns.py; measured: MedR 5-6 of 76, R@10 63-68)."""

import json
import os
import subprocess

import pytest

from tests.cli.test_cli import MMLINKS


@pytest.mark.slow
def test_retrieval_demo_learns_and_promotes(tmp_path):
    work = tmp_path / "demo"
    proc = subprocess.run(
        [
            MMLINKS,
            "demo",
            "--family",
            "retrieval",
            "--workdir",
            str(work),
            # the demo's own training defaults (cli/demo.py FAMILY_DEFAULTS), on 400 pairs
            # instead of 1,000: 240 train, 80 val, ~76 test (one pool)
            "--pairs",
            "400",
            # the loop in the demo's process: no Ray Train workers to start (tested elsewhere)
            "--workers",
            "0",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=1200,
        env={k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert set(out["test"]) == {"CMCA", "CMCM"}
    for name, m in out["test"].items():
        t2i = m["t2i"]
        pool = t2i["pool_size"]
        assert pool == m["pairs"] >= 60, (name, m["pairs"])
        assert t2i["medr"] <= pool / 4, (name, t2i)  # chance: (pool + 1) / 2
        assert t2i["r10"] >= 2.5 * 100 * 10 / pool, (name, t2i)  # 2.5x chance
    assert out["promoted"], out["promotion_failures"]
    assert "[7/7] queried models:/mmlinks-cmcm@production" in proc.stderr
    assert out["production_query"]["top5"] and os.path.exists(out["report"])
