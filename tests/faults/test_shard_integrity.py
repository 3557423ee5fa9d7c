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


def _damaged_copy(dataset, to, damage: str):
    """A copy of ``dataset`` whose first test shard is damaged; (copy, that shard)."""
    shutil.copytree(dataset, to)
    shard = Manifest.read(to).shard_paths(to, "test")[0]
    body = bytearray(shard.read_bytes())
    if damage == "flip":
        body[len(body) // 2] ^= 0x01
        shard.write_bytes(bytes(body))
    elif damage == "truncate":
        shard.write_bytes(bytes(body[: len(body) - 100]))
    else:
        shard.unlink()
    return to, shard


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_every_reader_of_a_dataset_refuses_a_damaged_shard(dataset, tmp_path, damage, capsys, fault_stats):
    """Issue #46: each command and Dagster check that reads a dataset, with the shard damaged
    after the commit: `mmlinks train` and `mmlinks evaluate` (a checkpoint: no registry needed)
    exit 2 with one `mmlinks: error:` line naming the shard before any work; the Dagster dataset
    checks fail naming it (`mmlinks link`: tests/linking/test_link_integrity.py; the build reads
    no earlier version's shards, only its manifest)."""
    from cli.main import main
    from orchestration.quality import DATASET_CHECKS, Thresholds
    from schemas.shards import read_table
    from tests.linking.conftest import write_checkpoint
    from training.text import Vocabulary

    data, shard = _damaged_copy(dataset, tmp_path / "ds", damage)
    fault_stats.add(faults_injected=1)
    train = [
        "train",
        "--data",
        str(data),
        "--workdir",
        str(tmp_path / "w"),
        "--epochs",
        "1",
        "--workers",
        "0",
    ]
    sentences = read_table(Manifest.read(data).shard_paths(data, "train"), ["sentences"]).column("sentences")
    vocab = Vocabulary.build([s for doc in sentences.to_pylist() for s in doc], min_count=1)
    ckpt = write_checkpoint(tmp_path / "ckpt", vocab, Manifest.read(data).feature_extractor.dim, seed=0)
    evaluate = ["evaluate", "--data", str(data), "--checkpoint", str(ckpt), "--workdir", str(tmp_path / "w")]
    for args in (train, evaluate):
        assert main(args) == 2, args[0]
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert err[-1].startswith("mmlinks: error:") and shard.name in err[-1], (args[0], err)
        if args is train:
            assert not (tmp_path / "w" / "mlflow.db").exists()  # refused before a run was opened
        fault_stats.add(invariant_checks=1)
    manifest = Manifest.read(data)
    schema = DATASET_CHECKS["schema_version"](manifest, data, Thresholds())
    assert not schema.passed and shard.name in schema.description
    with pytest.raises(MmlinksError, match=shard.name):  # a failed check, its message the one line
        DATASET_CHECKS["feature_dim"](manifest, data, Thresholds())
    fault_stats.add(invariant_checks=2)
