"""Word vectors from word2vec C binary files and fastText binary models, written here in the real layouts.

The writers follow the original tools, not the reader under test: word2vec.c saves
``fprintf("%lld %lld\\n", words, size)`` then per word ``fprintf("%s ", word)``, ``size`` raw float32 and
``fprintf("\\n")``; fastText's ``FastText::saveModel`` writes magic + version (int32), ``Args::save``
(dim ws epoch minCount neg wordNgrams loss model bucket minn maxn lrUpdateRate as int32 -- the two enums
are int-sized -- then t as double), ``Dictionary::save`` (size nwords nlabels int32, ntokens and
pruneidx_size int64, per entry the word + NUL, int64 count, int8 type), the quant flag (bool), the input
DenseMatrix (int64 m, int64 n, float32 data), the qout flag and the output DenseMatrix.

Since a hand-written writer could share a misunderstanding with the reader, the n-gram hash is pinned
with values computed outside this code (see test_fasttext_hash_pinned_values).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import training.word_vectors as wv
from schemas.errors import MmlinksError
from training.text import Vocabulary, embedding_matrix
from training.word_vectors import fasttext_hash, load_vectors, resolve_spec, sniff_format, subword_rows

# ---------------------------------------------------------------- writers in the tools' own layouts


def write_word2vec_bin(path: Path, words: list[bytes], vectors: np.ndarray, newline: bool = True) -> Path:
    out = bytearray(f"{len(words)} {vectors.shape[1]}\n".encode())
    for word, vec in zip(words, vectors, strict=True):
        out += word + b" " + np.asarray(vec, dtype="<f4").tobytes() + (b"\n" if newline else b"")
    path.write_bytes(bytes(out))
    return path


def write_fasttext_bin(
    path: Path,
    words: list[bytes],
    input_matrix: np.ndarray,
    *,
    minn: int,
    maxn: int,
    bucket: int,
    version: int = 12,
    model: int = 2,  # model_name: cbow=1, sg=2, sup=3
    labels: list[bytes] = (),
    quant: bool = False,
) -> Path:
    dim = input_matrix.shape[1]
    assert input_matrix.shape[0] == len(words) + bucket
    out = bytearray(struct.pack("<ii", 793712314, version))
    # Args::save: 12 x int32, then t as double (loss_name::ns = 2)
    out += struct.pack("<12id", dim, 5, 5, 1, 5, 1, 2, model, bucket, minn, maxn, 100, 1e-4)
    entries = [(w, 0) for w in words] + [(lab, 1) for lab in labels]
    out += struct.pack("<3i", len(entries), len(words), len(labels))
    out += struct.pack("<qq", 1000, -1)  # ntokens, pruneidx_size = -1 (not pruned)
    for k, (word, kind) in enumerate(entries):
        out += word + b"\0" + struct.pack("<qb", 100 - k, kind)
    out += struct.pack("<?", quant)
    if quant:  # a QuantMatrix would follow; its content does not matter to a reader that refuses it
        out += b"\x00" * 64
    else:
        out += struct.pack("<qq", *input_matrix.shape) + input_matrix.astype("<f4").tobytes()
    out += struct.pack("<?", False)  # qout
    output = np.zeros((len(words), dim), dtype="<f4")
    out += struct.pack("<qq", *output.shape) + output.tobytes()
    path.write_bytes(bytes(out))
    return path


def distinct_rows(rows: int, dim: int) -> np.ndarray:
    """Row r holds r in column 0 (and noise elsewhere), so an average says which rows went into it."""
    rng = np.random.default_rng(rows * 31 + dim)
    mat = rng.normal(size=(rows, dim)).astype(np.float32)
    mat[:, 0] = np.arange(rows)
    return mat


# ---------------------------------------------------------------- the n-gram hash, pinned


def test_fasttext_hash_pinned_values():
    # fastText dictionary.cc: uint32_t h = 2166136261; for each byte: h = h ^ uint32_t(int8_t(str[i]));
    # h = h * 16777619. ASCII strings give textbook FNV-1a, so the published FNV-1a 32-bit test vectors
    # apply: "" -> 0x811c9dc5, "a" -> 0xe40c292c, "foobar" -> 0xbf9cf968.
    assert fasttext_hash(b"") == 0x811C9DC5
    assert fasttext_hash(b"a") == 0xE40C292C
    assert fasttext_hash(b"foobar") == 0xBF9CF968
    # Non-ASCII bytes are sign-extended before the xor, which textbook FNV-1a does not do. These values
    # came from compiling fastText's expression above with g++ (same output with -fsigned-char and
    # -funsigned-char, as the int8_t cast intends); textbook FNV-1a gives the second number.
    assert fasttext_hash("café".encode()) == 1970454601  # textbook FNV-1a: 2821410889
    assert fasttext_hash("<é>".encode()) == 1002806231  # textbook: 4222937559
    assert fasttext_hash("<日本>".encode()) == 3315313759  # textbook: 2370187871
    assert fasttext_hash(b"<red>") == 329009980


def test_subwords_count_utf8_characters_and_skip_lone_brackets():
    bucket, nwords = 2_000_000, 7
    rows = subword_rows("é".encode(), minn=1, maxn=3, bucket=bucket, nwords=nwords)
    # "<é>" is three characters; the lone "<" and ">" are no n-grams, "é" (two bytes) is one character.
    expected = ["<é", "<é>", "é", "é>"]
    assert rows == [nwords + fasttext_hash(s.encode()) % bucket for s in expected]
    ascii_rows = subword_rows(b"ab", minn=3, maxn=4, bucket=bucket, nwords=nwords)
    assert ascii_rows == [nwords + fasttext_hash(s.encode()) % bucket for s in ["<ab", "<ab>", "ab>"]]
    assert subword_rows(b"ab", minn=3, maxn=0, bucket=bucket, nwords=nwords) == []


# ---------------------------------------------------------------- word2vec binary


def test_word2vec_binary_keeps_only_wanted_words(tmp_path):
    vecs = np.arange(4 * 3, dtype=np.float32).reshape(4, 3) / 7
    path = write_word2vec_bin(tmp_path / "v.bin", [b"</s>", b"red", "café".encode(), b"star"], vecs)
    found, dim, stats = load_vectors(str(path), ["red", "café", "missing"])
    assert dim == 3 and set(found) == {"red", "café"}
    np.testing.assert_array_equal(found["red"], vecs[1])
    np.testing.assert_array_equal(found["café"], vecs[2])
    assert (stats.format, stats.words_in_file, stats.found) == ("word2vec-bin", 4, 2)


@pytest.mark.parametrize("newline", [True, False])
def test_word2vec_binary_streams_across_chunk_borders(tmp_path, monkeypatch, newline):
    monkeypatch.setattr(wv, "CHUNK_BYTES", 5)  # every word and vector straddles several reads
    words = [f"w{i}".encode() for i in range(40)]
    vecs = np.random.default_rng(0).normal(size=(40, 6)).astype(np.float32)
    # A vector whose bytes hold 0x0a (newline) and 0x20 (space) must not confuse the reader.
    vecs[3, :2] = np.frombuffer(b"\n\n\n\n    ", dtype="<f4")
    path = write_word2vec_bin(tmp_path / "v.bin", words, vecs, newline=newline)
    found, _, stats = load_vectors(f"word2vec-bin:{path}", [w.decode() for w in words])
    assert stats.found == 40
    for i, w in enumerate(words):
        np.testing.assert_array_equal(found[w.decode()], vecs[i])


def test_word2vec_binary_counts_non_utf8_words_and_skips_them(tmp_path):
    vecs = np.ones((3, 2), dtype=np.float32)
    path = write_word2vec_bin(tmp_path / "v.bin", [b"ok", b"caf\xe9", b"\xff\xfe"], vecs)
    found, _, stats = load_vectors(str(path), ["ok", "café"])
    assert set(found) == {"ok"} and stats.skipped_non_utf8 == 2


def test_word2vec_binary_truncated_file_errors_clearly(tmp_path):
    vecs = np.ones((3, 4), dtype=np.float32)
    path = write_word2vec_bin(tmp_path / "v.bin", [b"a", b"b", b"c"], vecs)
    data = path.read_bytes()
    path.write_bytes(data[:-6])  # cut inside the last vector
    with pytest.raises(MmlinksError, match=r"truncated word2vec binary file.*3 words.*ends in word 3"):
        load_vectors(str(path), ["a"])
    path.write_bytes(data.replace(b"3 4\n", b"5 4\n", 1))  # the header promises more words than follow
    with pytest.raises(MmlinksError, match=r"truncated.*ends in word 4"):
        load_vectors(f"word2vec-bin:{path}", ["a"])


def test_word2vec_prefix_on_a_text_file_fails_clearly(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("red 0.1 0.2\n")
    with pytest.raises(MmlinksError, match="not a word2vec binary file"):
        load_vectors(f"word2vec-bin:{path}", ["red"])


# ---------------------------------------------------------------- fastText binary model


def _fasttext_model(tmp_path: Path, **kw) -> tuple[Path, np.ndarray, list[bytes]]:
    words = [b"</s>", b"red", b"star", "café".encode()]
    bucket = kw.pop("bucket", 50)
    mat = distinct_rows(len(words) + bucket, 5)
    kw.setdefault("minn", 2)
    kw.setdefault("maxn", 3)
    return write_fasttext_bin(tmp_path / "m.bin", words, mat, bucket=bucket, **kw), mat, words


def test_fasttext_in_vocabulary_word_is_mean_of_its_row_and_ngram_rows(tmp_path):
    path, mat, words = _fasttext_model(tmp_path)
    found, dim, stats = load_vectors(str(path), ["red", "café"])
    assert dim == 5 and (stats.format, stats.words_in_file, stats.found) == ("fasttext", 4, 2)
    nwords, bucket = len(words), 50
    # n-grams of "<red>" with minn=2, maxn=3, listed by hand
    grams = ["<r", "<re", "re", "red", "ed", "ed>", "d>"]
    rows = [1] + [nwords + fasttext_hash(g.encode()) % bucket for g in grams]
    np.testing.assert_allclose(found["red"], mat[rows].mean(axis=0), rtol=1e-6)
    grams = ["<c", "<ca", "ca", "caf", "af", "afé", "fé", "fé>", "é>"]
    rows = [3] + [nwords + fasttext_hash(g.encode()) % bucket for g in grams]
    np.testing.assert_allclose(found["café"], mat[rows].mean(axis=0), rtol=1e-6)


def test_fasttext_out_of_vocabulary_words_come_from_ngrams_and_are_counted(tmp_path):
    path, mat, words = _fasttext_model(tmp_path)
    found, _, stats = load_vectors(f"fasttext:{path}", ["red", "reds", "né"])
    assert (stats.found, stats.oov_from_ngrams) == (1, 2)
    grams = ["<n", "<né", "né", "né>", "é>"]  # no word row: "né" is not in the dictionary
    rows = [len(words) + fasttext_hash(g.encode()) % 50 for g in grams]
    np.testing.assert_allclose(found["né"], mat[rows].mean(axis=0), rtol=1e-6)


def test_fasttext_eos_gets_only_its_own_row(tmp_path):
    path, mat, _ = _fasttext_model(tmp_path)
    found, _, _ = load_vectors(str(path), ["</s>"])
    np.testing.assert_array_equal(found["</s>"], mat[0])


def test_fasttext_old_supervised_models_use_no_ngrams(tmp_path):
    # FastText::loadModel: version 11 supervised models get maxn = 0, so an OOV word gets nothing.
    path, mat, _ = _fasttext_model(tmp_path, version=11, model=3, labels=[b"__label__x"])
    found, _, stats = load_vectors(str(path), ["red", "reds"])
    assert set(found) == {"red"} and stats.oov_from_ngrams == 0
    np.testing.assert_array_equal(found["red"], mat[1])


def test_fasttext_quantized_model_is_refused(tmp_path):
    path, _, _ = _fasttext_model(tmp_path, quant=True)
    with pytest.raises(MmlinksError, match=r"quantized fastText model \(\.ftz\)"):
        load_vectors(str(path), ["red"])


@pytest.mark.parametrize(
    ("keep", "where"),
    [
        (30, "model arguments"),
        (120, "dictionary entry"),
        (-100, "input matrix needs"),
        (-10, "output matrix"),
    ],
)
def test_fasttext_truncated_model_errors_clearly(tmp_path, keep, where):
    path, _, _ = _fasttext_model(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:keep])
    with pytest.raises(MmlinksError, match=f"truncated fastText model.*{where}"):
        load_vectors(f"fasttext:{path}", ["red"])


def test_fasttext_input_matrix_is_memory_mapped(tmp_path, monkeypatch):
    path, _, _ = _fasttext_model(tmp_path)
    opened = []
    real = np.memmap

    def spy(*args, **kwargs):
        opened.append(kwargs.get("offset"))
        return real(*args, **kwargs)

    monkeypatch.setattr(wv.np, "memmap", spy)
    load_vectors(str(path), ["red"])
    assert opened and opened[0] > 0


def test_fasttext_prefix_on_other_file_fails_clearly(tmp_path):
    path = write_word2vec_bin(tmp_path / "v.bin", [b"a"], np.ones((1, 2), dtype=np.float32))
    with pytest.raises(MmlinksError, match="not a fastText model"):
        load_vectors(f"fasttext:{path}", ["a"])


# ---------------------------------------------------------------- format detection and text files


def test_sniffing_tells_the_formats_apart(tmp_path):
    ft, _, _ = _fasttext_model(tmp_path)
    w2v = write_word2vec_bin(tmp_path / "v.bin", [b"a", b"b"], np.full((2, 3), 0.5, dtype=np.float32))
    glove = tmp_path / "glove.txt"
    glove.write_text("a 0.1 0.2 0.3\nb 1e-3 -2 3\n")
    vec = tmp_path / "ft.vec"  # word2vec / fastText text: same header as the binary, numbers after
    vec.write_text("2 3\na 0.1 0.2 0.3\nb 1 2 3\n")
    assert [sniff_format(p) for p in (ft, w2v, glove, vec)] == ["fasttext", "word2vec-bin", "text", "text"]


def test_prefix_overrides_sniffing_and_missing_files_error(tmp_path):
    w2v = write_word2vec_bin(tmp_path / "v.bin", [b"a"], np.full((1, 3), 0.5, dtype=np.float32))
    assert resolve_spec(str(w2v)) == ("word2vec-bin", w2v)
    assert resolve_spec(f"text:{w2v}") == ("text", w2v)
    with pytest.raises(MmlinksError, match="does not exist"):
        resolve_spec(f"fasttext:{tmp_path / 'nope.bin'}")


def test_gzipped_file_is_refused_with_a_hint(tmp_path):
    path = tmp_path / "GoogleNews-vectors-negative300.bin.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00" + b"\x00" * 20)
    with pytest.raises(MmlinksError, match="gzip"):
        load_vectors(str(path), ["a"])


def test_text_file_reader_keeps_its_behaviour(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("2 3\nred 0.1 0.2 0.3\nstar 1 2 3\n")
    found, dim, stats = load_vectors(str(path), ["red", "blue"])
    assert dim == 3 and set(found) == {"red"} and stats.words_in_file == 2
    np.testing.assert_allclose(found["red"], [0.1, 0.2, 0.3], rtol=1e-6)
    path.write_text("red 0.1 x 0.3\n")
    with pytest.raises(MmlinksError, match="not numeric"):
        load_vectors(str(path), ["red"])
    with pytest.raises(MmlinksError, match="no vocabulary word found"):
        load_vectors(str(path), ["blue"])


# ---------------------------------------------------------------- embedding_matrix


def test_embedding_matrix_from_word2vec_binary(tmp_path):
    vecs = np.full((2, 4), 0.9, dtype=np.float32)
    vecs[1] = -0.9
    path = write_word2vec_bin(tmp_path / "v.bin", [b"red", b"star"], vecs)
    vocab = Vocabulary(["<pad>", "<unk>", "red", "star", "blue", "circle"])
    mat, hit = embedding_matrix(vocab, str(path))
    assert mat.shape == (6, 4) and hit == 2 / 4
    np.testing.assert_array_equal(mat[2:4], vecs)
    assert not mat[0].any() and (np.abs(mat[4:]) <= 0.2).all()


def test_embedding_matrix_from_fasttext_counts_ngram_words_as_hits(tmp_path):
    path, mat_in, _ = _fasttext_model(tmp_path)
    vocab = Vocabulary(["<pad>", "<unk>", "red", "stars", "</s>"])
    mat, hit = embedding_matrix(vocab, f"fasttext:{path}")
    assert mat.shape == (5, 5) and hit == 1.0
    np.testing.assert_array_equal(mat[4], mat_in[0])
    assert mat[3, 0] > 4  # from n-gram rows (row index in column 0), not the U(-0.2, 0.2) init
    assert not mat[0].any()
