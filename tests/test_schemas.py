import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas.document import META_VERSION_KEY, Document, ImageRecord, RegionFeatures, document_schema
from schemas.errors import MmlinksError
from schemas.manifest import Manifest
from schemas.shards import read_documents, read_table, write_shard


def make_doc(doc_id="d1", links=((0, 1),)):
    return Document(
        doc_id=doc_id,
        source="synthetic",
        split="train",
        sentences=["a red star", "a blue ring"],
        images=[
            ImageRecord("a" * 64, "file:///x/0.png", 64, 48, 2**63 + 5, [0.5, 1.5]),
            ImageRecord(
                "b" * 64,
                "file:///x/1.png",
                64,
                48,
                7,
                [1.0, 2.0],
                RegionFeatures([[0, 0, 10, 10]], [[0.25, 0.75]], ["cat"]),
            ),
        ],
        links=None if links is None else list(links),
        metadata={"k": "v"},
    )


def test_document_round_trips_through_a_shard(tmp_path):
    docs = [make_doc("d1"), make_doc("d2", links=None), make_doc("d3", links=())]
    rows, size, sha = write_shard(tmp_path / "s.parquet", docs)
    assert rows == 3 and size > 0 and len(sha) == 64
    assert read_documents([tmp_path / "s.parquet"]) == docs


def test_writing_twice_is_byte_identical(tmp_path):
    a = write_shard(tmp_path / "a.parquet", [make_doc()])
    b = write_shard(tmp_path / "b.parquet", [make_doc()])
    assert a == b


def test_reader_refuses_unknown_schema_version(tmp_path):
    schema = document_schema()
    future = schema.with_metadata({**schema.metadata, META_VERSION_KEY: b"99"})
    pq.write_table(pa.Table.from_pylist([make_doc().to_row()], schema=future), tmp_path / "f.parquet")
    with pytest.raises(MmlinksError, match="schema version 99"):
        read_table([tmp_path / "f.parquet"])


def test_reader_refuses_foreign_parquet(tmp_path):
    pq.write_table(pa.table({"x": [1]}), tmp_path / "x.parquet")
    with pytest.raises(MmlinksError, match="not an mmlinks document shard"):
        read_table([tmp_path / "x.parquet"])


def test_manifest_errors_are_one_line_messages(tmp_path):
    with pytest.raises(MmlinksError, match="no manifest"):
        Manifest.read(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(MmlinksError, match="cannot read manifest"):
        Manifest.read(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": 1}))
    with pytest.raises(MmlinksError, match="malformed"):
        Manifest.read(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": 7}))
    with pytest.raises(MmlinksError, match="schema version 7"):
        Manifest.read(tmp_path)


def test_manifest_round_trip(dataset):
    m = Manifest.read(dataset)
    assert Manifest.from_dict(json.loads(m.to_json())) == m
    assert m.dataset_version == Manifest.version_id(m.shards, m.build_params)
