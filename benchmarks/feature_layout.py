"""Decode cost of the shards' feature column, schema v2 (``list<float>``) vs v3 (bytes); JSON.

Usage: .venv/bin/python benchmarks/feature_layout.py [--docs 5000] [--rounds 5] [--workdir DIR]

The same documents (``link_throughput.write_dataset``'s: 5-8 images of 1,280 non-negative
floats per document) are written as v3 shards (``schemas.shards.write_shard``) and, for the
comparison, in v2's layout (the logical table written as is, with v2's codecs: LZ4 and no
dictionary on the features). Timed on one thread, best of ``--rounds`` passes (CPU seconds of
this process), batches of 64 documents as the link job reads them:

- ``read_features``: Parquet decode of the features column alone (``images.list.element.features``);
- ``to_matrices``: that, plus the per-document [m, D] matrices (``schemas.feature_bytes.feature_values``
  and the link job's slices; v2 goes through the same function's ``list<float>`` branch);
- ``documents``: the link job's whole per-table read (``linking.steps.documents_of_table`` on
  the columns it reads).

Also the bytes of the features column on disk. The decode of v3's bytes does not depend on the
values; LZ4's ratio does (real EfficientNet features compress better than these random ones:
docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

FEATURES_V2 = "images.list.element.features.list.element"


def write_v2_copy(v3_shard: Path, out: Path) -> None:
    """A v3 shard rewritten in v2's stored layout with v2's writer options."""
    import pyarrow.parquet as pq

    from schemas.shards import OTHER_CODEC, parquet_leaf_paths, read_table

    table = read_table([v3_shard])  # the logical layout = v2's stored one
    paths = parquet_leaf_paths(table.schema)
    buf = io.BytesIO()
    pq.write_table(
        table,
        buf,
        row_group_size=256,
        compression={p: "lz4" if p == FEATURES_V2 else OTHER_CODEC for p in paths},
        use_dictionary=[p for p in paths if p != FEATURES_V2],
    )
    out.write_bytes(buf.getvalue())


def features_bytes(path: Path) -> int:
    import pyarrow.parquet as pq

    md = pq.ParquetFile(path).metadata
    return sum(
        md.row_group(g).column(c).total_compressed_size
        for g in range(md.num_row_groups)
        for c in range(md.num_columns)
        if md.row_group(g).column(c).path_in_schema.startswith("images.list.element.features")
    )


def best_cpu(paths: list[Path], rounds: int, columns: list[str], work) -> tuple[float, int]:
    """(best CPU seconds of one pass over ``paths``, documents) with ``work(table)`` per batch."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    best, docs = float("inf"), 0
    for _ in range(rounds):
        t0, docs = time.process_time(), 0
        for p in paths:
            with pa.memory_map(str(p)) as fh:
                pf = pq.ParquetFile(fh)
                meta = pf.schema_arrow.metadata
                for rb in pf.iter_batches(batch_size=64, columns=columns, use_threads=False):
                    work(pa.Table.from_batches([rb]).replace_schema_metadata(meta))
                    docs += rb.num_rows
        best = min(best, time.process_time() - t0)
    return best, docs


def main() -> None:
    import torch
    from link_throughput import write_dataset

    from linking.steps import LINK_COLUMNS, documents_of_table, feature_matrices
    from schemas.manifest import Manifest

    torch.set_num_threads(1)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workdir", default="")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="mmlinks-layout-"))
    data = write_dataset(work / "ds", args.docs, seed=0)
    v3 = Manifest.read(data).shard_paths(data)
    v2 = []
    for p in v3:
        v2.append(work / "v2" / p.name)
        v2[-1].parent.mkdir(parents=True, exist_ok=True)
        write_v2_copy(p, v2[-1])
    columns = [c for c in LINK_COLUMNS if c != "links"]
    out: dict = {"docs": args.docs, "rounds": args.rounds, "cpu_us_per_doc": {}, "features_mb": {}}
    for name, paths in (("v2_list_float", v2), ("v3_bytes", v3)):
        timings = {
            "read_features": best_cpu(paths, args.rounds, ["images.list.element.features"], lambda t: None),
            "to_matrices": best_cpu(paths, args.rounds, ["images.list.element.features"], feature_matrices),
            "documents": best_cpu(paths, args.rounds, columns, lambda t: documents_of_table(t, "x")),
        }
        out["cpu_us_per_doc"][name] = {k: round(s / n * 1e6, 1) for k, (s, n) in timings.items()}
        out["features_mb"][name] = round(sum(features_bytes(p) for p in paths) / 1e6, 1)
    a, b = out["cpu_us_per_doc"]["v2_list_float"], out["cpu_us_per_doc"]["v3_bytes"]
    out["v2_over_v3"] = {k: round(a[k] / b[k], 2) for k in a}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
