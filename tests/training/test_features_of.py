"""``training.data.features_of``: a batch it cannot read is refused in one line."""

import pyarrow as pa
import pytest

from schemas.errors import MmlinksError
from training.data import features_of


def test_a_batch_with_a_missing_or_mixed_width_vector_is_refused_in_one_line():
    """Before schema v3 a missing vector could shift vectors between the documents of a batch."""
    image = pa.struct([pa.field("features", pa.list_(pa.float32()))])
    for vectors in ([[1.0, 2.0]], [None]), ([[1.0, 2.0]], [[1.0]]):
        rows = [[{"features": v} for v in doc] for doc in vectors]
        table = pa.table({"doc_id": ["a", "b"], "images": pa.array(rows, pa.list_(image))})
        with pytest.raises(MmlinksError, match=r"^cannot read the image features of these documents: "):
            features_of(table)
    feats, counts = features_of(
        pa.table({"doc_id": ["a"], "images": pa.array([[{"features": [1.0, 2.0]}]], pa.list_(image))})
    )
    assert counts == [1] and feats[0].tolist() == [[1.0, 2.0]]
