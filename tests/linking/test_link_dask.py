"""`mmlinks link` on a real dask.distributed cluster (a scheduler and two worker processes,
``--runner dask``): the same link shards, manifest and dead letter as the DirectRunner's job
(issue #35). RunInference loads the link model once per worker process (Beam's Shared handle)."""

from __future__ import annotations

from pathlib import Path

import pytest

from linking.config import LinkConfig
from linking.job import link_documents
from schemas.links import LinkManifest
from tests.linking.conftest import NAME

pytestmark = pytest.mark.slow

PRODUCTION = f"models:/{NAME}@production"


def committed(out: Path) -> dict[str, bytes]:
    """The manifest and every file of the current link version, by name."""
    version = LinkManifest.read(out).link_version
    files = {p.name: p.read_bytes() for p in sorted((out / "versions" / version).iterdir())}
    return {"manifest.json": (out / "manifest.json").read_bytes(), **files}


def test_the_link_job_on_two_dask_workers_gives_the_direct_runners_bytes(
    dataset, link_workdir, dask_cluster, tmp_path
):
    common = {
        "model": PRODUCTION,
        "data": str(dataset),
        "eval": True,
        "keep_scores": True,
        "max_images": 6,  # some documents go to the dead letter (too many images)
        "batch_docs": 4,  # several chunks per row group: batches cross bundles
        "cpu_threads": 1,
        "workdir": str(link_workdir),
    }
    direct = link_documents(LinkConfig(out=str(tmp_path / "direct"), direct_workers=1, **common))
    dask = link_documents(
        LinkConfig(out=str(tmp_path / "dask"), runner="dask", dask_address=dask_cluster, **common)
    )
    assert direct.manifest.counts["documents_dead_lettered"] > 0  # the dead letter has lines
    assert dask.manifest.counts == direct.manifest.counts  # from the Dask workers' counters
    assert committed(tmp_path / "dask") == committed(tmp_path / "direct")
