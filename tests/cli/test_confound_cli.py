"""`mmlinks data inspect --confounds` and `mmlinks data confound` (issue #33) on the session's
real Beam-built fixture dataset."""

import json

import pytest

from pipelines.confounds import dataset_confounds
from schemas.manifest import Manifest
from schemas.shards import read_documents
from tests.cli.test_cli import run_here


def test_inspect_measures_the_confounds_of_every_split(capfd, dataset):
    proc = run_here(capfd, "data", "inspect", str(dataset), "--confounds", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    splits = Manifest.read(dataset).counts["splits"]
    assert set(out["confounds"]) == set(splits)
    for split, figures in out["confounds"].items():
        assert figures["documents"] == splits[split]
        assert figures == dataset_confounds(dataset, [split])[split].to_dict()
        # the residual ratio (issue #44) that --image-centring auto reads: none on a split this
        # small (too few documents for 16 directions; tests/pipelines/test_confounds.py has one)
        assert figures["image_residual"] is None
    human = run_here(capfd, "data", "inspect", str(dataset), "--confounds").stdout
    assert "image ratio" in human and "residual" in human and "text share" in human
    assert "corrected" in human and "similarity gap" in human  # issue #60: a look of any form


@pytest.mark.slow
def test_inspect_choose_runs_the_image_side_choice_train_makes(capfd, tmp_path, monkeypatch):
    """``--choose`` trains the default's candidates briefly and names the pick with every score,
    as a ``--workers 0`` run chooses: its trials on all its documents up to ``KEPT_TRIAL_DOCS``,
    not the first ``TRIAL_DOCS`` (made smaller than the corpus here)."""
    from pipelines.feature_corpus import FeatureCorpusConfig, write_feature_corpus
    from training.link import image_side

    monkeypatch.setattr(image_side, "TRIAL_DOCS", 30)
    data = tmp_path / "ds"
    write_feature_corpus(data, FeatureCorpusConfig(docs=60, val_docs=12, test_docs=12, topics=4, dim=16))
    proc = run_here(capfd, "data", "inspect", str(data), "--confounds", "--choose", "--json")
    assert proc.returncode == 0, proc.stderr
    choice = json.loads(proc.stdout)["image_side_choice"]
    assert set(choice["scores"]) == {"none", "balanced", "balanced+dropout", "bag"}
    assert choice["name"] in choice["scores"] and choice["trial_docs"] == 60 and not choice["trial_kept"]
    human = run_here(capfd, "data", "inspect", str(data), "--choose").stdout
    assert "image side train's default picks: " in human


@pytest.mark.slow
def test_confound_writes_a_new_dataset_whose_images_share_their_documents_look(capfd, dataset, tmp_path):
    before = sorted(p.name for p in dataset.rglob("*"))
    out = tmp_path / "looked"
    proc = run_here(
        capfd, "data", "confound", str(dataset), "--out", str(out), "--image-look", "0.8", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert sorted(p.name for p in dataset.rglob("*")) == before  # the source is left alone
    plain, looked = dataset_confounds(dataset, ["train"])["train"], dataset_confounds(out, ["train"])["train"]
    assert looked.image_ratio > 10 * plain.image_ratio and looked.image_ratio > 5
    assert result["confounds"]["train"] == looked.to_dict()
    m = Manifest.read(out)
    assert m.build_params["image_look"] == {
        "from": Manifest.read(dataset).dataset_version,
        "weight": 0.8,
        "seed": 0,
    }
    a = {d.doc_id: d for d in read_documents(Manifest.read(dataset).shard_paths(dataset))}
    b = {d.doc_id: d for d in read_documents(m.shard_paths(out))}
    assert a.keys() == b.keys()
    for doc_id, doc in b.items():  # everything but the features is the source's
        assert doc.sentences == a[doc_id].sentences and doc.links == a[doc_id].links
    again = run_here(capfd, "data", "confound", str(dataset), "--out", str(out), "--image-look", "0.8")
    assert again.returncode == 2 and "already holds a dataset" in again.stderr


def test_confound_refuses_a_weight_outside_0_1(capfd, dataset, tmp_path):
    proc = run_here(
        capfd, "data", "confound", str(dataset), "--out", str(tmp_path / "x"), "--image-look", "1"
    )
    assert proc.returncode == 2 and "[0, 1)" in proc.stderr
