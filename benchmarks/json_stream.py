"""Streaming a big JSON file's top-level arrays: ``pipelines/sources/jsonstream.py`` vs ijson; JSON.

Usage: .venv/bin/python benchmarks/json_stream.py [--items 40000] [--rounds 3] [--workdir DIR]

The file is RecipeQA-shaped (``{"version": ..., "data": [item, ...]}``, each item a recipe with a
few steps of text, image names and a question): the shape the file sources stream. Each reader
yields every item of ``data`` once; the figure is the best of ``--rounds`` passes (CPU seconds
of this process, one thread), and MB/s of file bytes:

- ``jsonstream``: ``stream_arrays(text_chunks(fh), {"data"})``, the project's reader;
- ``ijson_yajl2_c``: ``ijson.items(fh, "data.item", use_float=True)`` on ijson's C backend;
- ``json_load``: ``json.load`` of the whole file (not streaming: the floor, and its memory is
  the whole file's objects).

Also whether each of ijson's behaviours on bad input matches what the sources rely on
(``bad_input``): an invalid UTF-8 byte inside one item, a byte-order mark, and an integer past
Python's 4,300-digit limit (run in a child process: it may crash), with ``use_float=True`` as
timed and with ijson's default ``Decimal`` numbers (``ijson_yajl2_c_decimal``).
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def write_file(path: Path, items: int) -> None:
    words = "stir the flour into the butter until it smells of toasted nuts then add milk".split()
    with path.open("w") as fh:
        fh.write('{"version": "1.0", "data": [')
        for i in range(items):
            steps = [
                {
                    "id": f"{i}-{s}",
                    "body": " ".join(words[(i + s + k) % len(words)] for k in range(40)),
                    "images": [f"{i}_{s}_{m}.jpg" for m in range(3)],
                }
                for s in range(4)
            ]
            item = {
                "recipe_id": f"recipe-{i}",
                "title": f"Recipe number {i}",
                "context": steps,
                "question": [f"{i}_q{m}.jpg" for m in range(4)],
                "choice_list": [f"{i}_c{m}.jpg" for m in range(4)],
                "answer": i % 4,
                "score": i / 7,
            }
            fh.write(("," if i else "") + json.dumps(item))
        fh.write("]}")


def best_of(rounds: int, run) -> tuple[float, int]:
    best, count = float("inf"), 0
    for _ in range(rounds):
        start = time.process_time()
        count = run()
        best = min(best, time.process_time() - start)
    return best, count


def readers(path: Path) -> dict:
    import ijson

    from pipelines.sources.jsonstream import stream_arrays, text_chunks

    def jsonstream() -> int:
        with path.open("rb") as fh:
            return sum(1 for _ in stream_arrays(text_chunks(fh), {"data"}))

    def ijson_yajl2_c() -> int:
        with path.open("rb") as fh:
            return sum(1 for _ in ijson.items(fh, "data.item", use_float=True))

    def json_load() -> int:
        with path.open("rb") as fh:
            return len(json.load(fh)["data"])

    assert ijson.backend == "yajl2_c", f"ijson's C backend is not installed (got {ijson.backend})"
    return {"jsonstream": jsonstream, "ijson_yajl2_c": ijson_yajl2_c, "json_load": json_load}


_CHILD = """
import io, sys, ijson
data = sys.stdin.buffer.read()
try:
    items = list(ijson.items(io.BytesIO(data), "data.item", use_float=sys.argv[1] == "float"))
    print("items", len(items))
except Exception as exc:
    print("error", type(exc).__name__)
"""


def ijson_on(data: bytes, numbers: str = "float") -> str:
    """What ijson makes of ``data``: ``items N``, ``error NAME`` or ``crashed (signal N)``;
    ``numbers``: ``float`` (``use_float=True``, as timed) or ``decimal`` (ijson's default)."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, numbers], input=data, capture_output=True, timeout=60
    )
    if done.returncode < 0:
        return f"crashed (signal {-done.returncode})"
    return done.stdout.decode().strip() or f"exit {done.returncode}"


def bad_input() -> dict:
    from pipelines.sources.jsonstream import MalformedJson, has_invalid_utf8, stream_arrays, text_chunks

    cases = {
        "invalid_utf8_in_one_of_3_items": b'{"data": [{"a": "x"}, {"a": "\xff"}, {"a": "y"}]}',
        "byte_order_mark": b'\xef\xbb\xbf{"data": [1, 2]}',
        "integer_of_5000_digits": b'{"data": [' + b"9" * 5000 + b"]}",
    }
    out = {}
    for name, data in cases.items():
        try:
            items = list(stream_arrays(text_chunks(io.BytesIO(data)), {"data"}))
            ours = f"items {len(items)}, {sum(has_invalid_utf8(v) for _, v in items)} flagged invalid"
        except MalformedJson as exc:
            ours = f"MalformedJson: {str(exc)[:60]}"
        out[name] = {
            "jsonstream": ours,
            "ijson_yajl2_c": ijson_on(data),
            "ijson_yajl2_c_decimal": ijson_on(data, "decimal"),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        path = Path(tmp) / "recipeqa_like.json"
        write_file(path, args.items)
        mb = path.stat().st_size / 1e6
        results = {}
        for name, run in readers(path).items():
            seconds, count = best_of(args.rounds, run)
            assert count == args.items, (name, count)
            results[name] = {"cpu_s": round(seconds, 3), "mb_per_s": round(mb / seconds, 1)}
    import ijson

    print(
        json.dumps(
            {
                "file_mb": round(mb, 1),
                "items": args.items,
                "rounds": args.rounds,
                "ijson": f"{ijson.__version__} ({ijson.backend})",
                "readers": results,
                "ijson_speedup_over_jsonstream": round(
                    results["jsonstream"]["cpu_s"] / results["ijson_yajl2_c"]["cpu_s"], 2
                ),
                "bad_input": bad_input(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
