"""What the fault scenarios report: each test adds its counts to ``$MMLINKS_FAULTS_STATS`` (a JSON
lines file) when that is set, so ``benchmarks/faults.py`` can total them."""

from __future__ import annotations

import json
import os

import pytest


class Stats:
    def __init__(self, scenario: str):
        self.scenario = scenario
        self.counts = {"faults_injected": 0, "inputs_fuzzed": 0, "invariant_checks": 0}

    def add(self, **counts: int) -> None:
        for key, n in counts.items():
            self.counts[key] = self.counts.get(key, 0) + n


@pytest.fixture
def fault_stats(request):
    stats = Stats(request.node.nodeid)
    yield stats
    target = os.environ.get("MMLINKS_FAULTS_STATS")
    if target:
        with open(target, "a") as fh:
            fh.write(json.dumps({"scenario": stats.scenario, **stats.counts}) + "\n")
