"""The Beam build on a real corpus with planted bad records (tests/conftest.py)."""

import json
from collections import Counter

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pipelines.build import build_dataset
from pipelines.build_config import BuildConfig
from pipelines.splits import assign_split
from schemas.manifest import Manifest
from schemas.shards import read_documents, read_table
from tests.conftest import dead_letters


def test_manifest_accounts_for_every_input_document(dataset, corpus):
    m = Manifest.read(dataset)
    raw_lines = len((corpus / "documents.jsonl").read_bytes().splitlines())
    dropped = m.counts["dropped"]
    doc_drops = sum(v for k, v in dropped.items() if k.startswith(("document:", "line:")))
    assert sum(m.counts["splits"].values()) + doc_drops == raw_lines
    assert m.counts["pipeline"]["lines_in"] == raw_lines
    assert dropped["line:malformed_record"] == 3
    assert dropped["line:not_utf8"] == 1
    assert dropped["document:empty_document"] == 1
    assert dropped["document:no_valid_images"] == 1
    assert dropped["document:no_sentences"] == 1
    assert dropped["link:out_of_range"] == 1
    assert dropped["link:endpoint_dropped"] == 1  # mixed: (0, 0) lost its token-less sentence
    assert dropped["image:undecodable"] == 3  # two truncated copies + one text file
    assert dropped["image:fetch_failed"] == 1  # missing file
    assert dropped["document:near_duplicate"] == 2  # dup-a and dup-b (drop_all policy)
    assert dropped["image:too_small"] == 1
    assert dropped["sentence:no_tokens"] == 3


def test_dead_letter_file_matches_the_counters(dataset):
    m = Manifest.read(dataset)
    records = dead_letters(dataset)
    counted = Counter(f"{r['kind']}:{r['reason']}" for r in records)
    assert dict(counted) == m.counts["dropped"]
    assert all(r["source_id"] for r in records)
    assert {"bad-empty", "bad-noimg", "bad-nosent"} <= {r["source_id"] for r in records}


def test_mixed_document_keeps_good_items_and_remaps_links(dataset, corpus):
    docs = {d.doc_id: d for d in read_documents(Manifest.read(dataset).shard_paths(dataset))}
    mixed = docs["mixed"]
    assert mixed.sentences == ["the big blue square", "a small red star"]
    assert len(mixed.images) == 2  # inputs 1 and 3 survive, now 0 and 1
    assert mixed.links == [(0, 0), (1, 1)]  # (1,1)->(0,0), (2,3)->(1,1); (0,0) lost its sentence
    assert mixed.images[0].uri.endswith("images/bad/mixed-0.png")


def test_every_image_has_features_phash_and_content_id(dataset):
    m = Manifest.read(dataset)
    docs = read_documents(m.shard_paths(dataset))
    assert len(docs) == sum(m.counts["splits"].values())
    for d in docs:
        assert d.split == assign_split(d.doc_id, {"train": 0.6, "val": 0.2, "test": 0.2})
        assert d.links is not None
        for im in d.images:
            assert len(im.features) == m.feature_extractor.dim == 1280
            assert len(im.content_id) == 64 and 0 <= im.phash < 2**64


def test_shards_are_sorted_and_readable_without_mmlinks(dataset):
    m = Manifest.read(dataset)
    for s in m.shards:
        ids = pq.read_table(dataset / s.path, columns=["doc_id"]).column("doc_id").to_pylist()
        assert ids == sorted(ids) and len(ids) == s.rows
    glob = str(dataset / "versions" / m.dataset_version / "*.parquet")
    n_duck = duckdb.sql(f"select count(*) from read_parquet('{glob}')").fetchall()[0][0]
    n_images = duckdb.sql(f"select sum(len(images)) from read_parquet('{glob}')").fetchall()[0][0]
    assert n_duck == sum(m.counts["splits"].values())
    frame = pl.read_parquet(glob)
    assert frame.height == n_duck
    assert frame.select(pl.col("images").list.len().sum()).item() == n_images


@pytest.mark.slow
def test_rebuild_is_byte_identical(corpus, dataset, tmp_path):
    m1 = Manifest.read(dataset)
    # A different inference batch size must not change a single byte (see fixed_chunk_inference).
    m2 = build_dataset(
        BuildConfig(
            source="synthetic",
            input=str(corpus),
            out=str(tmp_path),
            split_ratios={"train": 0.6, "val": 0.2, "test": 0.2},
            batch_size=5,
        )
    )
    assert [(s.path, s.sha256) for s in m1.shards] == [(s.path, s.sha256) for s in m2.shards]
    assert m1.dataset_version == m2.dataset_version
    assert m1.to_json() == m2.to_json()


class ExplodingModel(torch.nn.Module):
    """Stands in for a CNN whose forward pass fails (out of memory, bad weights, ...)."""

    def forward(self, x):
        raise RuntimeError("simulated inference failure")


def test_inference_failure_dead_letters_instead_of_crashing(tmp_path, monkeypatch):
    from features.lite0 import EfficientNetLite0Extractor
    from pipelines.synthetic_corpus import SynthConfig, write_corpus

    monkeypatch.setattr(EfficientNetLite0Extractor, "load_model", lambda self, device="cpu": ExplodingModel())
    write_corpus(tmp_path / "c", SynthConfig(docs=4, seed=9, image_size=48))
    # in-process (direct_workers=1): worker processes would not see the monkeypatch
    m = build_dataset(
        BuildConfig(
            source="synthetic",
            input=str(tmp_path / "c"),
            out=str(tmp_path / "d"),
            direct_workers=1,
            allow_empty=True,  # every document fails here: the empty version is what is asserted
        )
    )
    assert sum(m.counts["splits"].values()) == 0
    assert m.counts["dropped"]["document:feature_extraction_failed"] == 4
    assert m.counts["dropped"]["image:inference_failed"] >= 1
    records = dead_letters(tmp_path / "d")
    assert any("simulated inference failure" in r["detail"] for r in records)
    # Each document's record names the exception of each failed image, not just its URI.
    docs = [r for r in records if r["reason"] == "feature_extraction_failed"]
    assert len(docs) == 4
    for r in docs:
        assert r["detail"].startswith("cnn: RuntimeError: simulated inference failure: "), r
    # nothing was cached for the failed images: a rerun with a working model computes them
    assert not list((tmp_path / "d" / "image-store").glob("features/*/*/*.npz"))


def _cfg(corpus, out, **kw):
    return BuildConfig(
        source="synthetic",
        input=str(corpus),
        out=str(out),
        split_ratios={"train": 0.6, "val": 0.2, "test": 0.2},
        **kw,
    )


@pytest.mark.slow
def test_rebuild_from_the_store_fetches_decodes_and_infers_nothing(corpus, dataset, tmp_path):
    from pipelines.commit import last_build

    m1 = Manifest.read(dataset)
    first = last_build(str(dataset))
    m2 = build_dataset(_cfg(corpus, tmp_path, image_store=str(dataset / "image-store")))
    again = last_build(str(tmp_path))
    assert first["images_fetched"] > 0 and first["features_computed"] > 0
    assert again["images_fetched"] == 0 and again["features_computed"] == 0
    assert again["images_from_store"] == first["images_fetched"] + first["images_from_store"]
    assert again["features_cached"] == first["features_computed"]
    assert m2.to_json() == m1.to_json()  # same version, same shards, same counts of drops


@pytest.mark.slow
def test_bounded_float16_fixed_size_build_and_version_retention(corpus, dataset, tmp_path):
    from pipelines.splits import split_rank_key

    store = str(dataset / "image-store")
    m = build_dataset(
        _cfg(
            corpus,
            tmp_path,
            image_store=store,
            precision="float16",
            max_shard_rows=3,
            split_sizes={"test": 4, "val": 3},
            dedupe_policy="keep_first",
        )
    )
    assert m.feature_dtype == "float16" and m.counts["splits"] == {
        "test": 4,
        "val": 3,
        "train": m.counts["splits"]["train"],
    }
    assert all(s.rows <= 3 for s in m.shards) and len(m.shards) >= sum(m.counts["splits"].values()) / 3
    docs = read_documents(m.shard_paths(tmp_path))
    ranked = sorted((d.doc_id for d in docs), key=split_rank_key)
    assert {d.doc_id for d in docs if d.split == "test"} == set(ranked[:4])
    assert {d.doc_id for d in docs if d.split == "val"} == set(ranked[4:7])
    # keep_first: dup-a (earlier id) stays, dup-b goes
    assert m.counts["dropped"]["document:near_duplicate"] == 1
    assert "dup-a" in {d.doc_id for d in docs} and "dup-b" not in {d.doc_id for d in docs}
    field = pq.read_schema(tmp_path / m.shards[0].path).field("images").type.value_type.field("features")
    assert field.type == pa.binary()  # float16 values as bytes (schema v3); read as float16 lists
    field = read_table([tmp_path / m.shards[0].path]).schema.field("images").type.value_type.field("features")
    assert str(field.type) == "list<element: halffloat>"

    # Versions: a rebuild with other parameters keeps the version it replaced; one more prunes.
    m2 = build_dataset(_cfg(corpus, tmp_path, image_store=store, max_shard_rows=5))
    assert Manifest.read(tmp_path) == m2
    assert {p.name for p in (tmp_path / "versions").iterdir()} == {m.dataset_version, m2.dataset_version}
    # ... and a placeholder picture given by example is rejected wherever it appears
    examples = tmp_path / "placeholders"
    examples.mkdir()
    first = json.loads((corpus / "documents.jsonl").read_bytes().splitlines()[0])
    (examples / "removed.png").write_bytes((corpus / first["images"][0]).read_bytes())
    m3 = build_dataset(
        _cfg(corpus, tmp_path, image_store=store, max_shard_rows=7, placeholder_images=str(examples))
    )
    assert m3.counts["dropped"]["image:placeholder"] >= 1
    assert m3.build_params["placeholder_images"] and m3.dataset_version != m2.dataset_version
    assert {p.name for p in (tmp_path / "versions").iterdir()} == {m2.dataset_version, m3.dataset_version}
    assert not list(tmp_path.glob(".staging-*"))


@pytest.mark.slow
def test_a_killed_build_resumes_without_repeating_work(corpus, dataset, tmp_path):
    """SIGKILL a real `mmlinks data build` mid-inference, run it again: same dataset, no rework."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from pipelines.commit import last_build
    from tests.conftest import venv_env

    out = tmp_path / "out"
    cmd = [str(Path(sys.executable).parent / "mmlinks"), "data", "build", "--input", str(corpus)]
    cmd += ["--out", str(out), "--split", "0.6,0.2,0.2", "--batch-size", "8"]
    tmp = tmp_path / "child-tmp"  # a SIGKILL skips the cleanup of the temporary folder Beam makes
    tmp.mkdir()
    proc = subprocess.Popen(
        cmd,
        env=venv_env(TMPDIR=str(tmp)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    cached = []
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and len(cached) < 16:
        time.sleep(0.2)
        cached = list(out.glob("image-store/features/*/*/*.npz"))
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert len(cached) >= 16 and not (out / "manifest.json").exists()
    assert list(out.glob(".staging-*"))  # the killed build's leftovers

    m = build_dataset(_cfg(corpus, out, batch_size=8))
    log = last_build(str(out))
    total = last_build(str(dataset))["features_computed"]
    assert log["features_cached"] >= len(cached)
    assert log["features_cached"] + log["features_computed"] == total  # nothing computed twice
    assert m.to_json() == Manifest.read(dataset).to_json()  # the very dataset an unbroken build gives
    assert not list(out.glob(".staging-*"))  # the dead build's staging folder was cleaned up


@pytest.mark.slow
def test_multiprocess_build_matches_the_in_process_one(corpus, dataset, tmp_path):
    """The fixture ran in-process (the suite's MMLINKS_DIRECT_WORKERS=1); two worker processes
    (the default on 2 cores) with a fresh store must give the same bytes. The torch thread count
    is part of the dataset's parameters (CPU reductions change the last bits with it), so it is
    pinned to the fixture's."""
    reference = Manifest.read(dataset)
    threads = reference.build_params["cpu_threads"]
    m = build_dataset(_cfg(corpus, tmp_path, direct_workers=2, cpu_threads=threads))
    assert m.to_json() == reference.to_json()
