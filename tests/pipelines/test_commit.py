"""The versioned commit (``pipelines/commit.py``): a rerun of the version already committed keeps
its folder in place only while that folder still holds the committed bytes (issue #46: every
reader of a dataset verifies what it reads; the build's commit is the reader of the version it
would keep)."""

import json
import os

import pytest

from pipelines.commit import DEAD_LETTER_FILE, commit_files

SHARDS = {"train-00000.parquet": b"train bytes " * 50, "test-00000.parquet": b"test bytes " * 40}
MANIFEST = json.dumps({"dataset_version": "v1", "shards": sorted(SHARDS)})


def _stage(root) -> str:
    staging = root / "staging"
    (staging / "shards").mkdir(parents=True)
    for name, data in SHARDS.items():
        (staging / "shards" / name).write_bytes(data)
    (staging / DEAD_LETTER_FILE).write_bytes(b'{"reason": "x"}\n')
    return str(staging)


def _commit(out, root) -> None:
    out.mkdir(exist_ok=True)  # the build makes its output folder before it commits
    staging = _stage(root)
    commit_files(str(out), staging, "v1", sorted(SHARDS), MANIFEST)


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_rerun_of_the_committed_version_replaces_a_shard_damaged_since_its_commit(tmp_path, damage):
    out = tmp_path / "out"
    _commit(out, tmp_path / "first")
    shard = out / "versions" / "v1" / "train-00000.parquet"
    if damage == "flip":
        data = bytearray(shard.read_bytes())
        data[7] ^= 0xFF
        shard.write_bytes(bytes(data))
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:100])
    else:
        shard.unlink()
    _commit(out, tmp_path / "rerun")
    for name, data in SHARDS.items():
        assert (out / "versions" / "v1" / name).read_bytes() == data
    assert json.loads((out / "manifest.json").read_text())["dataset_version"] == "v1"


def test_a_rerun_of_an_intact_committed_version_leaves_its_folder_in_place(tmp_path):
    out = tmp_path / "out"
    _commit(out, tmp_path / "first")
    shard = out / "versions" / "v1" / "train-00000.parquet"
    before = os.stat(shard).st_ino
    _commit(out, tmp_path / "rerun")
    assert os.stat(shard).st_ino == before  # not deleted and moved again: readers never miss it
    assert shard.read_bytes() == SHARDS["train-00000.parquet"]
