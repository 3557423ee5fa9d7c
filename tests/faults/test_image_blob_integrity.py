"""A damaged image-store blob whose cached features are gone (issue #46): the rebuild fetches the
image again from its intact raw file instead of decoding the damaged bytes, so no good document
is dropped (or featurised from changed pixels) and nothing blames the raw file; the rebuilt
shards are the reference build's, byte for byte."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipelines.build import build_dataset
from schemas.manifest import Manifest
from tests.faults.conftest import tiny_cfg

pytestmark = [pytest.mark.faults, pytest.mark.slow]


def test_a_damaged_blob_is_fetched_again_and_the_rebuild_keeps_every_document(tiny, tmp_path, fault_stats):
    corpus, reference = tiny
    out = tmp_path / "data"
    shutil.copytree(reference, out)
    store = out / "image-store"
    shutil.rmtree(store / "features")  # the cached features are gone: the blobs are read
    blobs = sorted(p for p in (store / "blobs").rglob("*") if p.is_file())
    blob = blobs[0]
    intact = blob.read_bytes()
    body = bytearray(intact)
    body[len(body) // 2] ^= 0x01
    blob.write_bytes(bytes(body))
    fault_stats.add(faults_injected=1)

    build_dataset(tiny_cfg(corpus, out))
    want, got = Manifest.read(reference), Manifest.read(out)
    assert got.counts == want.counts  # no document fewer, no dead letter more
    assert got.dataset_version == want.dataset_version
    for a, b in zip(want.shard_paths(reference), got.shard_paths(out), strict=True):
        assert Path(a).read_bytes() == Path(b).read_bytes(), b.name  # features of the intact image
    assert blob.read_bytes() == intact  # the blob was rewritten from its source
    fault_stats.add(invariant_checks=4)
