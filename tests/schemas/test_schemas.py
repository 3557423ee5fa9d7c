import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.document import (
    META_VERSION_KEY,
    SCHEMA_VERSION,
    Document,
    ImageRecord,
    RegionFeatures,
    document_schema,
)
from schemas.errors import MmlinksError
from schemas.manifest import Manifest
from schemas.migrate import migrate_dataset
from schemas.shards import documents_to_table, read_documents, read_table, write_shard


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


def test_every_column_is_compressed_and_the_features_decode_without_a_dictionary(tmp_path):
    """The per-column writer options name every leaf column (the oracle: the written file's own
    paths; a column left out of a codec dict would be written uncompressed)."""
    from schemas.shards import FEATURES_CODEC, FEATURES_COLUMN, OTHER_CODEC, parquet_leaf_paths

    for dtype in ("float32", "float16"):
        write_shard(tmp_path / f"{dtype}.parquet", [make_doc()], feature_dtype=dtype)
        meta = pq.ParquetFile(tmp_path / f"{dtype}.parquet").metadata
        cols = {c.path_in_schema: c for c in (meta.row_group(0).column(i) for i in range(meta.num_columns))}
        assert list(cols) == parquet_leaf_paths(pq.read_schema(tmp_path / f"{dtype}.parquet"))
        for path, col in cols.items():
            want = FEATURES_CODEC if path == FEATURES_COLUMN else OTHER_CODEC
            assert col.compression.lower().startswith(want), (path, col.compression)
        assert "RLE_DICTIONARY" not in cols[FEATURES_COLUMN].encodings
        assert "RLE_DICTIONARY" in cols["doc_id"].encodings


def test_reader_refuses_unknown_schema_version(tmp_path):
    schema = document_schema()
    future = schema.with_metadata({**schema.metadata, META_VERSION_KEY: b"99"})
    pq.write_table(pa.Table.from_pylist([_row(make_doc())], schema=future), tmp_path / "f.parquet")
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
    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION}))
    with pytest.raises(MmlinksError, match="malformed"):
        Manifest.read(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": 7}))
    with pytest.raises(MmlinksError, match="schema version 7"):
        Manifest.read(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": 1}))
    with pytest.raises(MmlinksError, match="mmlinks data migrate"):
        Manifest.read(tmp_path)


def test_manifest_round_trip(dataset):
    m = Manifest.read(dataset)
    assert Manifest.from_dict(json.loads(m.to_json())) == m
    assert m.dataset_version == Manifest.version_id(m.shards, m.build_params)


def _row(d) -> dict:
    """One document as a shard row, field by field (the oracle ``documents_to_table`` must equal)."""
    return {
        "doc_id": d.doc_id,
        "source": d.source,
        "split": d.split,
        "sentences": list(d.sentences),
        "images": [
            {
                "content_id": im.content_id,
                "uri": im.uri,
                "width": im.width,
                "height": im.height,
                "phash": im.phash,
                "features": im.features,
                "regions": None
                if im.regions is None
                else {
                    "boxes": im.regions.boxes,
                    "vectors": im.regions.vectors,
                    "labels": im.regions.labels,
                    "scores": im.regions.scores,
                },
            }
            for im in d.images
        ],
        "links": None if d.links is None else [{"sentence": s, "image": i} for s, i in d.links],
        "metadata": sorted(d.metadata.items()),
    }


def _oracle_table(docs, dtype):
    """The obvious row-by-row conversion, with vectors rounded to the storage dtype."""
    rows = [_row(d) for d in docs]
    for r in rows:
        for im in r["images"]:
            if im["features"] is not None:
                im["features"] = np.asarray(im["features"], dtype).tolist()
            if im["regions"]:
                im["regions"]["vectors"] = [np.asarray(v, dtype).tolist() for v in im["regions"]["vectors"]]
    return pa.Table.from_pylist(rows, schema=document_schema(dtype))


floats = st.floats(-1e3, 1e3, width=32)
regions = st.none() | st.integers(0, 3).flatmap(
    lambda n: st.builds(
        RegionFeatures,
        boxes=st.lists(st.lists(floats, min_size=4, max_size=4), min_size=n, max_size=n),
        vectors=st.lists(st.lists(floats, min_size=2, max_size=2), min_size=n, max_size=n),
        labels=st.lists(st.text(max_size=5), min_size=n, max_size=n),
        scores=st.none() | st.lists(floats, min_size=n, max_size=n),
    )
)
images = st.builds(
    ImageRecord,
    content_id=st.text(min_size=1, max_size=4),
    uri=st.text(max_size=4),
    width=st.integers(1, 5000),
    height=st.integers(1, 5000),
    phash=st.integers(0, 2**64 - 1),
    features=st.none() | st.lists(floats, min_size=3, max_size=3),
    regions=regions,
)
documents = st.builds(
    Document,
    doc_id=st.text(min_size=1, max_size=6),
    source=st.just("s"),
    split=st.sampled_from(["train", "val", "test"]),
    sentences=st.lists(st.text(max_size=10), max_size=3),
    images=st.lists(images, max_size=3),
    links=st.none() | st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=3),
    metadata=st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(documents, max_size=5), st.sampled_from(["float32", "float16"]))
def test_columnar_conversion_matches_the_row_by_row_oracle(docs, dtype):
    assert documents_to_table(docs, dtype).equals(_oracle_table(docs, dtype))


def test_float16_storage_is_read_back_as_float32_by_training(tmp_path):
    from training.data import features_of

    doc = make_doc()
    doc.images[0].features = [0.1, 1 / 3]
    write_shard(tmp_path / "h.parquet", [doc], feature_dtype="float16")
    stored = pq.read_table(tmp_path / "h.parquet").column("images")[0][0]["features"]
    assert stored.type == pa.binary() and len(stored.as_py()) == 2 * 2  # two float16 values
    features_type = (
        read_table([tmp_path / "h.parquet"]).schema.field("images").type.value_type.field("features")
    )
    assert features_type.type.value_type == pa.float16()
    feats, counts = features_of(read_table([tmp_path / "h.parquet"]))
    assert counts == [2] and feats[0].dtype == np.float32
    np.testing.assert_array_equal(feats[0][0], np.asarray([0.1, 1 / 3], np.float16).astype(np.float32))


def _old_manifest(version: int, directory, shard: str, rows: int) -> dict:
    """The manifest an older mmlinks wrote for one train shard ``shard`` of ``directory``."""
    import hashlib

    data = (directory / shard).read_bytes()
    return {
        "schema_version": version,
        "source": "synthetic",
        "counts": {"splits": {"train": rows}},
        "feature_extractor": {"name": "efficientnet-lite0", "version": "imagenet-57934424", "dim": 2},
        "shards": [
            {
                "path": shard,
                "split": "train",
                "rows": rows,
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        ],
        "build_params": {"source": "synthetic"},
    }


def _write_v1_dataset(directory, docs):
    """A dataset exactly as mmlinks 0.1 (schema v1) wrote it: OUT/shards + manifest.json."""
    v1_region = pa.struct(
        [
            pa.field("boxes", pa.list_(pa.list_(pa.float32(), 4))),
            pa.field("vectors", pa.list_(pa.list_(pa.float32()))),
            pa.field("labels", pa.list_(pa.string())),
        ]
    )
    v2 = document_schema()
    image_fields = [
        f if f.name != "regions" else pa.field("regions", v1_region)
        for f in v2.field("images").type.value_type
    ]
    fields = [
        f if f.name != "images" else pa.field("images", pa.list_(pa.struct(image_fields)), nullable=False)
        for f in v2
    ]
    schema = pa.schema(fields, metadata={**v2.metadata, META_VERSION_KEY: b"1"})
    rows = [_row(d) for d in docs]
    for r in rows:
        for im in r["images"]:
            if im["regions"]:
                im["regions"].pop("scores")
    (directory / "shards").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), directory / "shards" / "train-00000.parquet")
    manifest = _old_manifest(1, directory, "shards/train-00000.parquet", len(docs))
    manifest.update(dataset_version="0123456789abcdef", dead_letter="dead_letter.jsonl")
    (directory / "manifest.json").write_text(json.dumps(manifest))
    (directory / "dead_letter.jsonl").write_text('{"kind": "image", "reason": "corrupt"}\n')


def test_v1_datasets_are_refused_then_migrated(tmp_path):
    docs = [make_doc("d1"), make_doc("d2", links=None)]
    _write_v1_dataset(tmp_path, docs)
    with pytest.raises(MmlinksError, match=r"schema version 1.*mmlinks data migrate"):
        read_table([tmp_path / "shards" / "train-00000.parquet"])
    with pytest.raises(MmlinksError, match="mmlinks data migrate"):
        Manifest.read(tmp_path)
    m, changed = migrate_dataset(tmp_path)
    assert changed and m.schema_version == SCHEMA_VERSION
    assert Manifest.read(tmp_path) == m
    assert read_documents(m.shard_paths(tmp_path)) == docs  # scores were absent in v1: null now
    assert (tmp_path / m.dead_letter).read_text().startswith('{"kind": "image"')
    assert migrate_dataset(tmp_path) == (m, False)  # idempotent


def _write_v2_dataset(directory, docs, dtype):
    """A dataset exactly as mmlinks wrote schema v2: features as ``list<float>`` (float16 ones
    too), one shard under versions/."""
    table = documents_to_table(docs, dtype)  # the logical layout is v2's stored one
    table = table.replace_schema_metadata({**table.schema.metadata, META_VERSION_KEY: b"2"})
    shard = directory / "versions" / "old" / "train-00000.parquet"
    shard.parent.mkdir(parents=True)
    pq.write_table(table, shard)
    manifest = _old_manifest(2, directory, "versions/old/train-00000.parquet", len(docs))
    manifest.update(dataset_version="old", feature_dtype=dtype)
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return shard


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_v2_datasets_are_refused_then_migrated_to_feature_bytes(tmp_path, dtype):
    docs = [make_doc("d1"), make_doc("d2", links=None)]
    docs[1].images[0].features = None  # an image without features stays without
    old_shard = _write_v2_dataset(tmp_path, docs, dtype)
    with pytest.raises(MmlinksError, match=r"schema version 2.*mmlinks data migrate"):
        read_table([old_shard])
    m, changed = migrate_dataset(tmp_path)
    assert changed and m.schema_version == SCHEMA_VERSION and m.feature_dtype == dtype
    assert m.build_params["migrated_from"] == {"schema_version": 2, "dataset_version": "old"}
    (path,) = m.shard_paths(tmp_path)
    assert pq.read_schema(path).field("images").type.value_type.field("features").type == pa.binary()
    assert pq.read_schema(path).metadata[b"mmlinks.feature_dtype"] == dtype.encode()
    # the same values (float16 ones as stored), whichever layout they came from
    assert read_documents([path]) == read_documents_as_v2(old_shard)
    assert read_table([path]).equals(read_table_as_v2(old_shard))
    assert old_shard.exists()  # the old version stays for old code until a build prunes it
    assert migrate_dataset(tmp_path) == (m, False)


def read_table_as_v2(path):
    """A v2 shard read with no version check: what v2 code read."""
    t = pq.read_table(path)
    return t.replace_schema_metadata({**t.schema.metadata, META_VERSION_KEY: str(SCHEMA_VERSION).encode()})


def read_documents_as_v2(path):
    return [Document.from_row(r) for r in read_table_as_v2(path).to_pylist()]
