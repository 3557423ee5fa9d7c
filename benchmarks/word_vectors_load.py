"""Loading pretrained word vectors for a vocabulary: ``training/word_vectors.py`` vs gensim; JSON.

Usage: PYTHONPATH=.:GENSIM_DIR .venv/bin/python benchmarks/word_vectors_load.py [--words 200000]
       [--dim 300] [--wanted 10000] [--workdir DIR]

gensim is not a project dependency; install it aside to compare, e.g. ``pip install --no-deps
--target GENSIM_DIR gensim==4.4.0 smart_open wrapt`` (numpy and scipy come from the venv).

Writes a word2vec C binary file of ``--words`` x ``--dim`` float32 vectors and a fastText binary
model (``--words / 4`` words, ``--words`` n-gram buckets, the same dim), then loads the vectors
of ``--wanted`` of its words (a training vocabulary) in a fresh child process per reader:

- ``mmlinks``: ``training.word_vectors.load_vectors`` (streams word2vec, memory-maps fastText);
- ``gensim``: ``KeyedVectors.load_word2vec_format(binary=True)`` / ``load_facebook_vectors``,
  then the wanted words' vectors.

Per reader: wall and CPU seconds of the load, and the child's peak resident memory above what
it held after its imports (``ru_maxrss``), in MB.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import json, resource, sys, time
reader, fmt, path, wanted_file = sys.argv[1:5]
wanted = open(wanted_file).read().split()
if reader == "mmlinks":
    from training.word_vectors import load_vectors
else:
    from gensim.models import KeyedVectors
    from gensim.models.fasttext import load_facebook_vectors
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
wall, cpu = time.perf_counter(), time.process_time()
if reader == "mmlinks":
    vectors, dim, _stats = load_vectors(f"{fmt}:{path}", wanted)
    got = len(vectors)
else:
    if fmt == "word2vec-bin":
        kv = KeyedVectors.load_word2vec_format(path, binary=True)
        vectors = {w: kv[w] for w in wanted if w in kv.key_to_index}
    else:
        kv = load_facebook_vectors(path)
        vectors = {w: kv[w] for w in wanted}
    got = len(vectors)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                  "peak_mb_above_imports": round((peak - base) / 1024, 1), "vectors": got}))
"""


def write_word2vec_bin(path: Path, words: list[str], dim: int, rng: np.random.Generator) -> None:
    with path.open("wb") as fh:
        fh.write(f"{len(words)} {dim}\n".encode())
        for start in range(0, len(words), 10_000):
            block = rng.standard_normal((min(10_000, len(words) - start), dim)).astype("<f4")
            for word, vec in zip(words[start : start + len(block)], block, strict=True):
                fh.write(word.encode() + b" " + vec.tobytes() + b"\n")


def write_fasttext_bin(path: Path, words: list[str], bucket: int, dim: int, rng: np.random.Generator) -> None:
    """fastText's binary model layout (version 12, skipgram, not quantised), as
    ``tests/training/test_word_vectors.py`` writes it, streamed block by block."""
    with path.open("wb") as fh:
        fh.write(struct.pack("<ii", 793712314, 12))
        fh.write(struct.pack("<12id", dim, 5, 5, 1, 5, 1, 2, 2, bucket, 3, 6, 100, 1e-4))
        fh.write(struct.pack("<3i", len(words), len(words), 0))
        fh.write(struct.pack("<qq", 1000, -1))
        for k, word in enumerate(words):
            fh.write(word.encode() + b"\0" + struct.pack("<qb", len(words) - k, 0))
        fh.write(struct.pack("<?", False))
        rows = len(words) + bucket
        fh.write(struct.pack("<qq", rows, dim))
        for start in range(0, rows, 20_000):
            fh.write(rng.standard_normal((min(20_000, rows - start), dim)).astype("<f4").tobytes())
        fh.write(struct.pack("<?", False))
        fh.write(struct.pack("<qq", len(words), dim))
        fh.write(np.zeros((len(words), dim), dtype="<f4").tobytes())


def run_child(reader: str, fmt: str, path: Path, wanted_file: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, reader, fmt, str(path), str(wanted_file)],
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode != 0:
        return {
            "error": done.stderr.strip().splitlines()[-1][:200] if done.stderr else f"exit {done.returncode}"
        }
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=300)
    parser.add_argument("--wanted", type=int, default=10_000)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    words = [f"w{i:07d}" for i in range(args.words)]
    ft_words = words[: args.words // 4]
    out: dict = {"words": args.words, "dim": args.dim, "wanted": args.wanted}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        w2v, ft, wanted_file = Path(tmp) / "vectors.bin", Path(tmp) / "model.bin", Path(tmp) / "wanted.txt"
        write_word2vec_bin(w2v, words, args.dim, rng)
        write_fasttext_bin(ft, ft_words, args.words, args.dim, rng)
        picks = rng.choice(len(ft_words), size=min(args.wanted, len(ft_words)), replace=False)
        wanted_file.write_text("\n".join(ft_words[i] for i in picks))
        out["word2vec_file_mb"] = round(w2v.stat().st_size / 1e6, 1)
        out["fasttext_file_mb"] = round(ft.stat().st_size / 1e6, 1)
        for fmt, path in (("word2vec-bin", w2v), ("fasttext", ft)):
            out[fmt] = {reader: run_child(reader, fmt, path, wanted_file) for reader in ("mmlinks", "gensim")}
    try:
        out["gensim"] = metadata.version("gensim")
    except metadata.PackageNotFoundError:
        out["gensim"] = "not installed (see the docstring)"
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
