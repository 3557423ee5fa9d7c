"""Importing the authors' prebuilt datasets: real Beam build, shards compared with the inputs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pipelines.build import build_dataset
from pipelines.build_config import BuildConfig
from schemas.errors import MmlinksError
from schemas.manifest import Manifest
from schemas.shards import read_documents
from tests.conftest import dead_letters
from tests.fixtures.hessel import write_hessel


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = tmp_path_factory.mktemp("hessel")
    expect = write_hessel(root / "mscoco")
    out = root / "out"
    cfg = BuildConfig.for_source("hessel", str(root / "mscoco"), str(out), direct_workers=1)
    manifest = build_dataset(cfg)
    return root, out, expect, manifest


def _by_original(docs):
    return {(d.metadata["original_split"], int(d.metadata["original_index"])): d for d in docs}


def test_documents_links_and_features_match_the_published_files(imported):
    _, out, expect, manifest = imported
    docs = _by_original(read_documents(manifest.shard_paths(out)))
    n = expect["per_split"]
    # + the unlabelled, out-of-range and half-featured documents
    assert manifest.counts["splits"] == {"train": n + 3, "val": n, "test": n}
    assert manifest.feature_extractor.dim == 24
    assert manifest.feature_extractor.name == "hessel-prebuilt:mscoco"
    for (split, index), pairs in expect["links"].items():
        doc = docs[(split, index)]
        assert doc.split == split
        assert sorted(doc.links) == pairs
        for k, im in enumerate(doc.images):
            row = expect["id2row"][f"{split}{index:02d}{k:02d}"]
            np.testing.assert_allclose(im.features, expect["features"][row].astype(np.float32))
    assert docs[("train", 0)].metadata["original_id"] == "na"
    # null labels: an unlabelled corpus, not "no links"
    assert docs[("train", expect["unlabelled_index"])].links is None


def test_bad_documents_are_dead_lettered_not_lost(imported):
    _, out, expect, manifest = imported
    reasons = {(r["kind"], r["reason"]) for r in dead_letters(str(out))}
    assert ("document", "malformed_document") in reasons
    assert ("image", "missing_features") in reasons
    assert ("document", "no_valid_images") in reasons  # its only image had no feature row
    assert ("link", "out_of_range") in reasons
    kept = _by_original(read_documents(manifest.shard_paths(out)))
    oor = kept[("train", expect["out_of_range_index"])]  # the bad label is dropped, the document kept
    assert oor.links == []
    assert manifest.counts["dropped"]["document:malformed_document"] == 1
    half = kept[("train", expect["half_index"])]
    assert len(half.images) == 1 and half.links == [(0, 0)]  # the featureless image's link is gone
    assert ("link", "endpoint_dropped") in reasons
    assert half.sentences[1] == "caption \ufffd end"  # repaired and counted, not a crashed build
    assert manifest.counts["pipeline"]["text_repaired"] == 1


@pytest.mark.slow
def test_reimport_gives_the_same_version_and_the_cli_shortcut_agrees(imported, tmp_path):
    root, out, _, manifest = imported
    again = build_dataset(BuildConfig.for_source("hessel", str(root / "mscoco"), str(out), direct_workers=1))
    assert again.dataset_version == manifest.dataset_version
    src = root / "mscoco"
    proc = subprocess.run(
        [
            str(Path(__import__("sys").executable).parent / "mmlinks"),
            "data",
            "import-hessel",
            "--docs",
            str(src / "docs.json"),
            "--features",
            str(src / "features.npy"),
            "--id2row",
            str(src / "id2row.json"),
            "--out",
            str(tmp_path / "cli"),
            "--direct-workers",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["dataset_version"] == manifest.dataset_version
    assert Manifest.read(str(tmp_path / "cli")).source == "hessel"


def test_bad_id2row_or_feature_files_fail_with_one_clear_error(tmp_path):
    write_hessel(tmp_path / "d")
    (tmp_path / "d" / "id2row.json").write_text("[1, 2, 3]")
    with pytest.raises(MmlinksError, match="must map image ids to integer rows"):
        BuildConfig.for_source("hessel", str(tmp_path / "d"), str(tmp_path / "o")).check()
    write_hessel(tmp_path / "e")
    (tmp_path / "e" / "features.npy").write_bytes(b"not a numpy file at all")
    with pytest.raises(MmlinksError, match=r"not a readable \.npy matrix"):
        BuildConfig.for_source("hessel", str(tmp_path / "e"), str(tmp_path / "o")).check()
    write_hessel(tmp_path / "f")
    (tmp_path / "f" / "id2row.json").write_text('{"x": 100000}')
    with pytest.raises(MmlinksError, match="mismatched pair"):
        BuildConfig.for_source("hessel", str(tmp_path / "f"), str(tmp_path / "o")).check()


def test_a_missing_file_or_a_non_matrix_fails_before_the_build(tmp_path):
    write_hessel(tmp_path / "d")
    (tmp_path / "d" / "id2row.json").unlink()
    with pytest.raises(MmlinksError, match="id2row file"):
        BuildConfig.for_source("hessel", str(tmp_path / "d"), str(tmp_path / "o")).check()
    write_hessel(tmp_path / "e")
    np.save(tmp_path / "e" / "features.npy", np.zeros(5))
    with pytest.raises(MmlinksError, match="2-D float matrix"):
        BuildConfig.for_source("hessel", str(tmp_path / "e"), str(tmp_path / "o")).check()
