"""`mmlinks link` end to end with real Beam (DirectRunner, in-process) and a real MLflow SQLite
registry: outputs, the dead letter, refusals before any work, agreement with `mmlinks evaluate`,
byte-identical reruns, raw input through the build's stages, and an imported hessel dataset."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cli.main import main
from linking.config import LinkConfig
from linking.job import link_documents
from pipelines.direct_runner import DirectRunner
from schemas.document import ImageRecord
from schemas.links import LinkManifest
from schemas.manifest import Manifest, ShardInfo
from schemas.shards import read_documents, write_shard
from tests.linking.conftest import NAME, read_links, register_model

pytestmark = pytest.mark.slow  # every test here shares a registered model and real Beam link jobs

PRODUCTION = f"models:/{NAME}@production"


def link_args(dataset: Path, workdir: Path, out: Path, *extra: str) -> list[str]:
    args = ["link", "--data", str(dataset), "--model", PRODUCTION, "--out", str(out)]
    return [*args, "--workdir", str(workdir), "--direct-workers", "1", *extra]


@pytest.fixture(scope="module")
def linked(dataset, link_workdir, tmp_path_factory):
    """The test split linked through the CLI with --eval and --keep-scores."""
    out = tmp_path_factory.mktemp("linked") / "out"
    assert main(link_args(dataset, link_workdir, out, "--split", "test", "--eval", "--keep-scores")) == 0
    return out


@pytest.mark.slow
def test_the_cli_writes_one_row_per_document_and_a_manifest_naming_its_inputs(linked, dataset):
    manifest = LinkManifest.read(linked)
    data = Manifest.read(dataset)
    assert manifest.model.name == NAME and manifest.model.version == "1" and manifest.model.run_id
    assert manifest.model.uri == PRODUCTION  # what was asked; the version is what it meant
    assert manifest.dataset_version == data.dataset_version
    assert manifest.feature_extractor == data.feature_extractor
    table = read_links(manifest.shard_paths(linked))
    want = sorted(d.doc_id for d in read_documents(data.shard_paths(dataset, "test")))
    assert table.column("doc_id").to_pylist() == want
    c = manifest.counts
    assert c["documents_read"] == c["documents_linked"] + c["documents_dead_lettered"] == len(want)
    for row in table.to_pylist():  # matching: one-to-one, min(n, m) links, scores from the matrix
        linked_to = [s for s in row["sentence"] if s is not None]
        assert len(linked_to) == len(set(linked_to)) == min(row["n_sentences"], row["n_images"])
        scores = np.asarray(row["scores"], np.float32)
        assert scores.shape == (row["n_sentences"], row["n_images"])
        for j, (s, x) in enumerate(zip(row["sentence"], row["score"], strict=True)):
            assert (x is None) == (s is None) and (s is None or x == scores[s, j])
    assert c["images_linked"] == sum(
        len([s for s in r if s is not None]) for r in table.column("sentence").to_pylist()
    )


def test_eval_agrees_with_mmlinks_evaluate(linked, dataset, link_workdir, tmp_path):
    per_doc = tmp_path / "per-doc.jsonl"
    args = ["evaluate", "--data", str(dataset), "--model-uri", PRODUCTION, "--workdir", str(link_workdir)]
    assert main([*args, "--per-doc-out", str(per_doc)]) == 0
    rows = [json.loads(x) for x in per_doc.read_text().splitlines()]
    ev = LinkManifest.read(linked).evaluation
    assert ev["scores"]["n_docs"] == len(rows) > 0
    for key in ("auc", "p_at_1", "p_at_5"):
        assert ev["scores"][key] == pytest.approx(100 * np.mean([r[key] for r in rows]), abs=1e-6)
    links = ev["links"]
    assert links["predicted"] > 0 and links["gold"] > 0
    assert links["precision"] == pytest.approx(100 * links["true_positives"] / links["predicted"])
    assert links["recall"] == pytest.approx(100 * links["true_positives"] / links["gold"])


def test_a_rerun_writes_byte_identical_shards(linked, dataset, link_workdir, tmp_path):
    again = tmp_path / "again"
    cfg = LinkConfig(
        model=PRODUCTION,
        out=str(again),
        data=str(dataset),
        split="test",
        eval=True,
        keep_scores=True,
        direct_workers=1,
        workdir=str(link_workdir),
    )
    result = link_documents(cfg)
    first = LinkManifest.read(linked)
    assert result.manifest.link_version == first.link_version
    for a, b in zip(first.shard_paths(linked), result.manifest.shard_paths(again), strict=True):
        assert a.read_bytes() == b.read_bytes()
    assert (again / "manifest.json").read_bytes() == (linked / "manifest.json").read_bytes()


def _dataset_of(dataset: Path, out: Path, docs) -> Path:
    """A dataset folder holding ``docs`` in one test shard, with the fixture's extractor."""
    manifest = Manifest.read(dataset)
    rows, size, sha = write_shard(out / "versions" / "v" / "test-00000-000.parquet", docs)
    manifest.shards = [ShardInfo("versions/v/test-00000-000.parquet", "test", rows, size, sha)]
    manifest.dataset_version = "handmade"
    manifest.write(out)
    return out


def test_unlinkable_documents_go_to_the_dead_letter_with_a_reason(dataset, link_workdir, tmp_path):
    """The graph on a TestPipeline: inputs = linked + dead-lettered, by reason."""
    from apache_beam.testing.test_pipeline import TestPipeline

    from linking.graph import link_pipeline
    from linking.model import resolve_model
    from pipelines.commit import DEAD_LETTER_FILE, open_staging, read_shard_index
    from training.tracking import tracking_uri

    good = read_documents(Manifest.read(dataset).shard_paths(dataset, "test"))[:3]
    empty = good[0].__class__(**{**good[0].__dict__, "doc_id": "empty", "images": []})
    width = good[1].__class__(**{**good[1].__dict__, "doc_id": "width"})
    width.images = [ImageRecord(**{**im.__dict__, "features": [0.5] * 7}) for im in width.images]
    large = good[2].__class__(**{**good[2].__dict__, "doc_id": "large", "images": good[2].images * 8})
    nan = good[0].__class__(**{**good[0].__dict__, "doc_id": "nan"})
    nan.images = [
        ImageRecord(**{**im.__dict__, "features": [float("nan")] * len(im.features)}) for im in nan.images
    ]
    data = _dataset_of(dataset, tmp_path / "bad", [*good, empty, width, large, nan])
    cfg = LinkConfig(
        model=PRODUCTION, out=str(tmp_path / "o"), data=str(data), max_images=20, workdir=str(link_workdir)
    )
    uri = tracking_uri(link_workdir)
    model = resolve_model(PRODUCTION, uri)
    job = {
        "load_uri": model.load_uri,
        "tracking_uri": uri,
        "dim": 1280,
        "shards": [("versions/v/test-00000-000.parquet", "t.parquet")],
    }
    staging = open_staging(cfg.out)
    with TestPipeline(runner=DirectRunner()) as p:
        link_pipeline(p, cfg, job, staging)
    rows = read_links([Path(staging) / "shards" / s.path for s in read_shard_index(staging)]).to_pylist()
    assert sorted(r["doc_id"] for r in rows) == sorted(d.doc_id for d in good)
    dead = [json.loads(x) for x in (Path(staging) / DEAD_LETTER_FILE).read_text().splitlines()]
    assert {d["source_id"]: d["reason"] for d in dead} == {
        "empty": "empty_document",
        "width": "wrong_feature_width",
        "large": "too_large",
        "nan": "non_finite_features",
    }
    assert len(rows) + len(dead) == 7  # every input is linked or dead-lettered


def test_refusals_come_before_any_work(dataset, link_workdir, tmp_path, capsys):
    v_other = register_model(link_workdir, dataset, seed=5, alias=None, feature_extractor="densenet169@x")
    v_narrow = register_model(link_workdir, dataset, seed=6, alias=None, image_dim=7)
    cases = {
        f"models:/{NAME}/{v_other}": "trained with feature_extractor=densenet169@x, but the dataset has",
        f"models:/{NAME}/{v_narrow}": "takes 7-d image features, but the data has 1280-d",
        f"models:/{NAME}@nosuch": "cannot resolve models:/link-test@nosuch",
        "link-test": "--model wants models:/NAME@ALIAS",
    }
    for k, (uri, why) in enumerate(cases.items()):
        out = tmp_path / f"o{k}"
        args = [
            "link",
            "--data",
            str(dataset),
            "--model",
            uri,
            "--out",
            str(out),
            "--workdir",
            str(link_workdir),
        ]
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert why in err[-1] and err[-1].startswith("mmlinks: error:"), err
        assert not out.exists()  # refused before the output folder was made
    import torch

    if not torch.cuda.is_available():  # the GPU path is taken only where one exists
        assert main(link_args(dataset, link_workdir, tmp_path / "g", "--device", "cuda")) == 2
        assert "device 'cuda' requested but CUDA is not available" in capsys.readouterr().err
    # nothing to read: a split without shards, and a dataset whose shards hold no document
    assert main(link_args(dataset, link_workdir, tmp_path / "n", "--split", "nosuch")) == 2
    assert "has no 'nosuch' shards: nothing to link" in capsys.readouterr().err
    empty = _dataset_of(dataset, tmp_path / "empty", [])
    assert main(link_args(empty, link_workdir, tmp_path / "e")) == 2
    assert "read no documents from" in capsys.readouterr().err
    assert not (tmp_path / "e" / "manifest.json").exists()


@pytest.mark.slow
def test_raw_documents_get_the_builds_features_and_the_same_links(
    corpus, dataset, link_workdir, linked, tmp_path
):
    """--input through the build's read/validate/features stages (features from the build's
    cache): the documents the build kept get the same links as from the dataset."""
    cfg = LinkConfig(
        model=PRODUCTION,
        out=str(tmp_path / "raw"),
        input=str(corpus),
        source="synthetic",
        image_store=str(dataset / "image-store"),
        direct_workers=1,
        cpu_threads=1,
        workdir=str(link_workdir),
    )
    result = link_documents(cfg)
    raw = {r["doc_id"]: r for r in read_links(result.manifest.shard_paths(cfg.out)).to_pylist()}
    from_data = read_links(LinkManifest.read(linked).shard_paths(linked)).to_pylist()
    assert from_data and all(r["doc_id"] in raw for r in from_data)
    for r in from_data:  # same features, same model: the same links
        assert raw[r["doc_id"]]["sentence"] == r["sentence"]
        assert raw[r["doc_id"]]["score"] == pytest.approx(r["score"], abs=1e-5)
    dropped = result.manifest.counts["dropped"]
    assert dropped.get("document:empty_document", 0) + dropped.get("document:no_valid_images", 0) >= 1


@pytest.mark.slow
def test_an_imported_hessel_dataset_links_end_to_end(tmp_path):
    from pipelines.build import build_dataset
    from pipelines.build_config import BuildConfig
    from tests.fixtures.hessel import write_hessel

    write_hessel(tmp_path / "published", dim=24)
    data = tmp_path / "ds"
    build_dataset(BuildConfig.for_source("hessel", str(tmp_path / "published"), str(data), direct_workers=1))
    workdir = tmp_path / "wd"
    workdir.mkdir()
    register_model(workdir, data, seed=2)
    out = tmp_path / "links"
    assert main(link_args(data, workdir, out, "--assign", "argmax", "--min-score", "-0.5", "--eval")) == 0
    manifest = LinkManifest.read(out)
    c = manifest.counts
    assert c["documents_read"] == sum(Manifest.read(data).counts["splits"].values())
    assert c["documents_read"] == c["documents_linked"] + c["documents_dead_lettered"]
    assert manifest.feature_extractor.dim == 24 and manifest.params["assign"] == "argmax"
    assert manifest.evaluation["labelled_documents"] > 0 and manifest.evaluation["links"]["gold"] > 0
    rows = read_links(manifest.shard_paths(out)).to_pylist()
    for r in rows:  # argmax: any sentence may take several images; -0.5 cuts only weak links
        assert all(s is None or 0 <= s < r["n_sentences"] for s in r["sentence"])
        assert all(x is None or x >= -0.5 for x in r["score"])
    shutil.rmtree(tmp_path / "published")


def _features(doc) -> np.ndarray:
    return np.stack([np.asarray(im.features, dtype=np.float32) for im in doc.images])


def test_a_cpu_link_worker_checks_its_heap_after_each_chunk(dataset, link_workdir):
    """The link handler tunes malloc as a feature worker does, so it gives back what that keeps
    the same way (features.cpu_heap.HeapTrim, checked after every scored chunk)."""
    import os
    import platform

    from features.cpu_heap import MALLOC_TUNING_ENV, HeapTrim
    from linking.model import LinkModelHandler
    from linking.steps import Chunk

    uri = f"sqlite:///{link_workdir / 'mlflow.db'}"
    handler = LinkModelHandler(PRODUCTION, uri, "cpu")  # no thread count: this process keeps its own
    scorer = handler.load_model()
    if platform.libc_ver()[0] == "glibc" and os.environ.get(MALLOC_TUNING_ENV, "1") != "0":
        assert isinstance(handler._trim, HeapTrim)
    calls = []
    handler._trim = lambda: calls.append(1)
    docs = read_documents(Manifest.read(dataset).shard_paths(dataset, "test"))[:4]
    chunks = [
        Chunk(f"c{i}", [{"doc_id": d.doc_id, "sentences": d.sentences, "features": _features(d)}])
        for i, d in enumerate(docs)
    ]
    for chunk in chunks[:2], chunks[2:]:
        out = handler.run_inference(chunk, scorer)
        assert [r.example.key for r in out] == [c.key for c in chunk]
    assert len(calls) == 2
