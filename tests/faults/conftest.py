"""What the fault scenarios report: each test adds its counts to ``$MMLINKS_FAULTS_STATS`` (a JSON
lines file) when that is set, so ``benchmarks/faults.py`` can total them.

Fuzzers run ``FUZZ`` examples each: ``$MMLINKS_FUZZ_EXAMPLES`` (default 60, what the test suite
can afford; ``benchmarks/faults.py`` sets 300)."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, settings

FUZZ_EXAMPLES = int(os.environ.get("MMLINKS_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


class Stats:
    def __init__(self, scenario: str):
        self.scenario = scenario
        self.counts = {"faults_injected": 0, "inputs_fuzzed": 0, "invariant_checks": 0}
        self.figures: dict[str, float] = {}  # measured, not summed (latency percentiles)

    def add(self, **counts: int) -> None:
        for key, n in counts.items():
            self.counts[key] = self.counts.get(key, 0) + n

    def measured(self, **figures: float) -> None:
        self.figures.update(figures)


@pytest.fixture
def fault_stats(request):
    stats = Stats(request.node.nodeid)
    yield stats
    target = os.environ.get("MMLINKS_FAULTS_STATS")
    if target:
        with open(target, "a") as fh:
            fh.write(
                json.dumps({"scenario": stats.scenario, **stats.counts, "figures": stats.figures}) + "\n"
            )


def tiny_cfg(corpus, out, **kw):
    """The fault scenarios' cheap build: one CPU thread, in-process DirectRunner unless
    ``direct_workers`` says otherwise."""
    from pipelines.build_config import BuildConfig

    kw = {
        "split_ratios": {"train": 0.5, "val": 0.25, "test": 0.25},
        "direct_workers": 1,
        "cpu_threads": 1,
        **kw,
    }
    return BuildConfig(source="synthetic", input=str(corpus), out=str(out), **kw)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """(corpus, out): 8 synthetic documents and their fault-free build, the reference bytes."""
    from pipelines.build import build_dataset
    from pipelines.synthetic_corpus import SynthConfig, write_corpus

    root = tmp_path_factory.mktemp("tiny-build")
    write_corpus(root / "corpus", SynthConfig(docs=8, seed=11, image_size=32))
    build_dataset(tiny_cfg(root / "corpus", root / "reference"))
    return root / "corpus", root / "reference"


@pytest.fixture(scope="session")
def tiny_train(tiny, tmp_path_factory):
    """The tiny corpus rebuilt with splits a training run accepts (3 train, 2 val, 3 test
    documents: ``tiny``'s have one validation document); features from ``tiny``'s cache."""
    import shutil

    from pipelines.build import build_dataset

    corpus, reference = tiny
    out = tmp_path_factory.mktemp("tiny-train") / "data"
    shutil.copytree(reference, out)
    build_dataset(tiny_cfg(corpus, out, split_ratios={"train": 0.4, "val": 0.3, "test": 0.3}))
    return out
