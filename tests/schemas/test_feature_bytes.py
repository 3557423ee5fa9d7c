"""Feature vectors stored as bytes (schema v3): the conversions against a per-vector oracle."""

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.errors import MmlinksError
from schemas.feature_bytes import bytes_to_vectors, decode_features, encode_features, vectors_to_bytes

NP = {"float32": np.float32, "float16": np.float16}
ARROW = {"float32": pa.float32(), "float16": pa.float16()}

floats = st.floats(-1e4, 1e4, allow_nan=False, width=16)  # exact in float16 and float32
vectors = st.lists(st.none() | st.lists(floats, max_size=5), max_size=8)


def sliced(arr: pa.Array, data) -> pa.Array:
    """``arr`` or a slice of it: readers meet arrays with offsets (table slices, batches)."""
    start = data.draw(st.integers(0, len(arr)))
    return arr.slice(start, data.draw(st.integers(0, len(arr) - start)))


@settings(max_examples=150, deadline=None)
@given(vectors, st.sampled_from(["float32", "float16"]), st.data())
def test_vectors_to_bytes_stores_each_vector_as_its_little_endian_values(rows, dtype, data):
    arr = sliced(pa.array(rows, pa.list_(ARROW[dtype])), data)
    stored = vectors_to_bytes(arr, dtype)
    oracle = [
        None if v is None else np.asarray(v, np.dtype(NP[dtype]).newbyteorder("<")).tobytes()
        for v in arr.to_pylist()
    ]
    assert stored.type == pa.binary() and stored.to_pylist() == oracle


@settings(max_examples=150, deadline=None)
@given(vectors, st.sampled_from(["float32", "float16"]), st.data())
def test_bytes_to_vectors_inverts_it_on_sliced_arrays(rows, dtype, data):
    oracle = [None if v is None else np.asarray(v, NP[dtype]).tobytes() for v in rows]
    stored = sliced(pa.array(oracle, pa.binary()), data)
    back = bytes_to_vectors(stored, dtype)
    expected = [None if b is None else np.frombuffer(b, NP[dtype]).tolist() for b in stored.to_pylist()]
    assert back.to_pylist() == expected
    assert back.type.value_type == ARROW[dtype]


def _images_table(docs: list[list[list[float] | None]], dtype: str) -> pa.Table:
    image = pa.struct(
        [pa.field("content_id", pa.string(), nullable=False), pa.field("features", pa.list_(ARROW[dtype]))]
    )
    rows = [[{"content_id": f"c{i}", "features": f} for i, f in enumerate(doc)] for doc in docs]
    return pa.table({"doc_id": [str(i) for i in range(len(docs))], "images": pa.array(rows, pa.list_(image))})


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(st.none() | st.lists(floats, max_size=4), max_size=3), max_size=6),
    st.sampled_from(["float32", "float16"]),
    st.data(),
)
def test_a_table_round_trips_through_the_stored_layout(docs, dtype, data):
    table = _images_table(docs, dtype)
    start = data.draw(st.integers(0, table.num_rows))
    table = table.slice(start, data.draw(st.integers(0, table.num_rows - start)))
    stored = encode_features(table, dtype)
    assert stored.schema.field("images").type.value_type.field("features").type == pa.binary()
    back = decode_features(stored, dtype)
    assert back.column("images").to_pylist() == table.column("images").to_pylist()
    assert back.column("doc_id").equals(table.column("doc_id"))
    assert decode_features(back, dtype) is back  # already logical: unchanged


def test_tables_without_image_features_pass_through():
    t = pa.table({"doc_id": ["a"], "sentences": [["x"]]})
    assert decode_features(t) is t and encode_features(t, "float32") is t


def test_a_byte_string_that_is_not_whole_values_is_refused():
    with pytest.raises(MmlinksError, match="not a whole number of float32 values"):
        bytes_to_vectors(pa.array([b"\x00" * 6], pa.binary()), "float32")


def test_a_null_inside_a_vector_is_refused():
    with pytest.raises(MmlinksError, match="null value"):
        vectors_to_bytes(pa.array([[1.0, None]], pa.list_(pa.float32())), "float32")


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(st.none() | st.lists(floats, min_size=2, max_size=3), max_size=3), max_size=6),
    st.sampled_from(["float32", "float16"]),
    st.booleans(),
    st.data(),
)
def test_feature_values_reads_both_layouts_as_the_per_image_oracle(docs, dtype, stored, data):
    from schemas.feature_bytes import feature_values

    table = _images_table(docs, dtype)
    start = data.draw(st.integers(0, table.num_rows))
    table = table.slice(start, data.draw(st.integers(0, table.num_rows - start)))
    if stored:
        table = encode_features(table, dtype)
    images = [
        im
        for doc in _images_table(docs, dtype).slice(start, table.num_rows).column("images").to_pylist()
        for im in doc
    ]
    vectors = [im["features"] for im in images]
    if vectors and (None in vectors or len({len(v) for v in vectors}) > 1):
        with pytest.raises(ValueError):
            feature_values(table, dtype)
        return
    values, counts = feature_values(table, dtype)
    assert counts.tolist() == [len(d) for d in table.column("images").to_pylist()]
    oracle = np.asarray(vectors, NP[dtype]).reshape(len(vectors), -1) if vectors else np.zeros((0, 0))
    assert values.shape == oracle.shape and (values == oracle).all()


def test_stored_bytes_without_their_dtype_are_refused_not_guessed():
    """float16 bytes read as float32 would be vectors half as wide, of garbage: a table (or a
    record batch) without the dtype metadata and without an explicit dtype is refused."""
    from schemas.feature_bytes import feature_values

    stored = encode_features(_images_table([[[1.0, 2.0, 3.0, 4.0]]], "float16"), "float16")
    assert stored.schema.metadata is None
    with pytest.raises(MmlinksError, match="without their dtype"):
        decode_features(stored)
    with pytest.raises(MmlinksError, match="without their dtype"):
        feature_values(stored)
    values, _ = feature_values(stored, "float16")
    assert values.tolist() == [[1.0, 2.0, 3.0, 4.0]]
    tagged = stored.replace_schema_metadata({b"mmlinks.feature_dtype": b"float16"})
    assert feature_values(tagged)[0].tolist() == [[1.0, 2.0, 3.0, 4.0]]


def test_more_bytes_than_a_binary_chunk_holds_are_refused(monkeypatch):
    """int32 offsets: past 2 GiB in one chunk they would wrap and write a corrupt shard."""
    import schemas.feature_bytes as fb

    monkeypatch.setattr(fb, "MAX_CHUNK_BYTES", 15)
    with pytest.raises(MmlinksError, match="more than 2 GiB"):
        vectors_to_bytes(pa.array([[1.0, 2.0, 3.0, 4.0]], pa.list_(pa.float32())), "float32")
    assert (
        len(vectors_to_bytes(pa.array([[1.0, 2.0, 3.0]], pa.list_(pa.float32())), "float32")[0].as_py()) == 12
    )


def test_a_null_image_or_a_damaged_vector_sends_feature_values_row_by_row():
    from schemas.feature_bytes import feature_values

    table = _images_table([[[1.0, 2.0]], [[3.0, 4.0]]], "float32")
    images = table.column("images").chunk(0)
    struct = images.values
    nulled = pa.StructArray.from_arrays(
        [struct.field(0), struct.field(1)], fields=list(struct.type), mask=pa.array([False, True])
    )
    with_null = table.set_column(1, "images", pa.ListArray.from_arrays(images.offsets, nulled))
    with pytest.raises(ValueError, match="no feature vector"):
        feature_values(with_null, "float32")
    damaged = encode_features(table, "float32")
    feats = damaged.column("images").chunk(0).values.field("features")
    cut = pa.BinaryArray.from_buffers(
        pa.binary(), 2, [None, pa.array([0, 8, 14], pa.int32()).buffers()[1], feats.buffers()[2]]
    )
    rebuilt = pa.StructArray.from_arrays(
        [struct.field(0), cut], fields=[struct.type[0], pa.field("features", pa.binary())]
    )
    damaged = damaged.set_column(1, "images", pa.ListArray.from_arrays(images.offsets, rebuilt))
    with pytest.raises(ValueError, match="whole number"):
        feature_values(damaged, "float32")


def test_read_table_names_the_shard_whose_feature_bytes_are_damaged(tmp_path):
    import pyarrow.parquet as pq

    from schemas.document import META_DTYPE_KEY, META_NAME_KEY, META_VERSION_KEY, SCHEMA_NAME, SCHEMA_VERSION
    from schemas.shards import read_table

    stored = encode_features(_images_table([[[1.0, 2.0]]], "float32"), "float32")
    images = stored.column("images").chunk(0)
    cut = pa.BinaryArray.from_buffers(
        pa.binary(), 1, [None, pa.array([0, 6], pa.int32()).buffers()[1], pa.py_buffer(b"\x00" * 8)]
    )
    column = pa.ListArray.from_arrays(
        images.offsets,
        pa.StructArray.from_arrays([images.values.field(0), cut], fields=list(images.type.value_type)),
    )
    meta = {
        META_NAME_KEY: SCHEMA_NAME.encode(),
        META_VERSION_KEY: str(SCHEMA_VERSION).encode(),
        META_DTYPE_KEY: b"float32",
    }
    pq.write_table(
        stored.set_column(1, "images", column).replace_schema_metadata(meta), tmp_path / "bad.parquet"
    )
    with pytest.raises(MmlinksError, match=r"cannot read shard .*bad\.parquet: .*whole number of float32"):
        read_table([tmp_path / "bad.parquet"])
