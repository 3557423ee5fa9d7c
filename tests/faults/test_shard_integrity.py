"""A shard changed after its commit is refused by readers, naming the file (issue #19)."""

from __future__ import annotations

import shutil

import pytest

from schemas.errors import MmlinksError
from schemas.manifest import Manifest
from training.link.baselines import random_scores_baseline

pytestmark = [pytest.mark.faults, pytest.mark.slow]


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_shard_damaged_after_commit_is_refused_naming_it(dataset, tmp_path, damage, fault_stats):
    data = tmp_path / "ds"
    shutil.copytree(dataset, data)
    manifest = Manifest.read(data)
    assert len(manifest.shard_paths(data)) == len(manifest.shards)  # intact: all verified
    shard = manifest.shard_paths(data, "val")[0]
    body = bytearray(shard.read_bytes())
    if damage == "flip":
        body[len(body) // 2] ^= 0x01  # one bit inside a data page: same size, other bytes
        shard.write_bytes(bytes(body))
    elif damage == "truncate":
        shard.write_bytes(bytes(body[: len(body) - 100]))
    else:
        shard.unlink()
    fault_stats.add(faults_injected=1)
    for read in (
        lambda: Manifest.read(data).shard_paths(data, "val"),
        lambda: Manifest.read(data).shard_paths(data),
        lambda: random_scores_baseline(data, "val"),  # a training-layer reader
    ):
        with pytest.raises(MmlinksError, match=str(shard.name)) as err:
            read()
        assert "\n" not in str(err.value)
        fault_stats.add(invariant_checks=1)
    assert Manifest.read(data).shard_paths(data, "train")  # the other splits still read
