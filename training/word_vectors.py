"""Pretrained word vectors from a file: word2vec/GloVe text, word2vec C binary, fastText binary.

Why streamed: GoogleNews (3.6 GB) or ``cc.en.300.bin`` (7 GB) must load without conversion or
that much memory, so word2vec binaries are read in chunks and fastText memory-mapped, keeping only
the vocabulary's rows. A spec's format prefix (``text:``, ``word2vec-bin:``, ``fasttext:``) is
optional (sniffed); fastText OOV words get n-gram vectors as ``FastText::getWordVector`` does;
non-UTF-8 words are skipped and counted. Why not gensim: it loads the whole file first
(docs/benchmarks.md, "Word-vector readers")."""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from schemas.errors import MmlinksError

FASTTEXT_MAGIC = 793712314  # FASTTEXT_FILEFORMAT_MAGIC_INT32 in fasttext.cc
FASTTEXT_VERSION = 12  # newest model format fastText itself loads (checkModel refuses newer)
FORMATS = ("text", "word2vec-bin", "fasttext")
CHUNK_BYTES = 1 << 20  # read size of the streaming readers; tests shrink it to cross chunk borders
_MAX_WORD_BYTES = 1 << 16  # a word longer than this means the file is not what it claims to be
_W2V_HEADER = re.compile(rb"(\d+) (\d+)[ \t\r]*\n")
_NUMERIC_TEXT = re.compile(rb"[0-9eE+\-.naifNAIF \t\r\n]*")  # what follows a word in a text vector file
_FT_WORD, _FT_SUP = 0, 3  # entry_type::word; model_name::sup


@dataclass
class VectorStats:
    """What a load found, for the training log (why a hit rate is low is otherwise guesswork)."""

    format: str
    path: str
    dim: int = 0
    words_in_file: int = 0
    found: int = 0  # wanted words present in the file's own vocabulary
    oov_from_ngrams: int = 0  # fastText only: wanted words absent from it, built from n-grams
    skipped_non_utf8: int = 0  # file words whose bytes are not UTF-8 (they can match no vocabulary word)

    def summary(self) -> str:
        text = f"{self.path} ({self.format}, {self.dim}-d, {self.words_in_file} words): {self.found} found"
        if self.format == "fasttext":
            text += f", {self.oov_from_ngrams} out-of-vocabulary from n-grams"
        if self.skipped_non_utf8:
            text += f", {self.skipped_non_utf8} non-UTF-8 words skipped"
        return text


def load_vectors(spec: str, wanted_words: Iterable[str]) -> tuple[dict[str, np.ndarray], int, VectorStats]:
    """(word -> float32 vector for the wanted words that got one, dim, stats) from a vectors file,
    or from several: ``A,B`` reads aligned vectors of several languages (MUSE ships one file per
    language), a word found in an earlier file keeps that vector."""
    if "," in spec:
        return _load_several(spec.split(","), set(wanted_words))
    fmt, path = resolve_spec(spec)
    wanted = set(wanted_words)
    stats = VectorStats(format=fmt, path=str(path))
    if fmt == "text":
        found = _read_text(path, wanted, stats)
    elif fmt == "word2vec-bin":
        found = _read_word2vec_bin(path, wanted, stats)
    else:
        found = _read_fasttext(path, wanted, stats)
    if not found:
        raise MmlinksError(f"no vocabulary word found in {path} (read as {fmt})")
    return found, stats.dim, stats


def _load_several(specs: list[str], wanted: set[str]) -> tuple[dict[str, np.ndarray], int, VectorStats]:
    found: dict[str, np.ndarray] = {}
    total = VectorStats(format="+".join(resolve_spec(s)[0] for s in specs), path=",".join(specs))
    for spec in specs:
        try:
            part, dim, stats = load_vectors(spec, wanted - set(found))
        except MmlinksError as exc:
            if "no vocabulary word found" not in str(exc):
                raise
            continue  # every word already found, or none of this language in the vocabulary
        if total.dim and dim != total.dim:
            raise MmlinksError(f"word vectors {spec} are {dim}-d, the files before it {total.dim}-d")
        total.dim = dim
        total.words_in_file += stats.words_in_file
        total.found += stats.found
        found.update(part)
    if not found:
        raise MmlinksError(f"no vocabulary word found in {','.join(specs)}")
    return found, total.dim, total


def resolve_spec(spec: str) -> tuple[str, Path]:
    """(format, path) from ``FORMAT:PATH`` or a bare path whose format is sniffed."""
    fmt, sep, rest = spec.partition(":")
    if sep and fmt in FORMATS:
        path = Path(rest)
    else:
        fmt, path = "", Path(spec)
    if not path.is_file():
        raise MmlinksError(f"word vectors file {path} does not exist")
    return fmt or sniff_format(path), path


def sniff_format(path: Path) -> str:
    """The format of a vectors file from its first bytes (see the module docstring)."""
    with path.open("rb") as fh:
        head = fh.read(4096)
    if head[:2] == b"\x1f\x8b":
        raise MmlinksError(f"{path} is gzip-compressed; decompress it first (gunzip -k)")
    if len(head) >= 4 and struct.unpack("<i", head[:4])[0] == FASTTEXT_MAGIC:
        return "fasttext"
    header = _W2V_HEADER.match(head)
    if header:
        record = head[header.end() :].lstrip(b"\n")
        space = record.find(b" ")
        if space > 0:
            body = record[space + 1 : space + 1 + 4 * int(header.group(2))]
            if body and not _NUMERIC_TEXT.fullmatch(body):
                return "word2vec-bin"
    return "text"


class _ByteStream:
    """Chunked reads with the few primitives both binary formats need (and the offset, for memmap)."""

    def __init__(self, fh: BinaryIO):
        self.fh, self.buf, self.pos, self.base = fh, b"", 0, 0

    def offset(self) -> int:
        return self.base + self.pos

    def _fill(self) -> bool:
        chunk = self.fh.read(CHUNK_BYTES)
        self.base += self.pos
        self.buf, self.pos = self.buf[self.pos :] + chunk, 0
        return bool(chunk)

    def exact(self, n: int) -> bytes | None:
        """The next n bytes, or None where the file ends first."""
        while len(self.buf) - self.pos < n:
            if not self._fill():
                return None
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def until(self, delim: bytes) -> bytes | None:
        """Bytes up to (not including) delim, which is consumed; None where the file ends first."""
        start = self.pos
        while (end := self.buf.find(delim, start)) < 0:
            if len(self.buf) - self.pos > _MAX_WORD_BYTES:
                raise _NoDelimiter
            start = len(self.buf) - self.pos
            if not self._fill():
                return None
            start += self.pos
        out = self.buf[self.pos : end]
        self.pos = end + len(delim)
        return out

    def skip(self, byte: bytes) -> None:
        while True:
            if self.pos == len(self.buf) and not self._fill():
                return
            if self.buf[self.pos : self.pos + 1] != byte:
                return
            self.pos += 1


class _NoDelimiter(Exception):
    """A word ran past _MAX_WORD_BYTES: the file is not in the format it was read as."""


def _utf8(word: bytes) -> str | None:
    try:
        return word.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _read_text(path: Path, wanted: set[str], stats: VectorStats) -> dict[str, np.ndarray]:
    """``word v1 v2 ...`` lines (GloVe; word2vec/fastText ``.vec`` whose ``n dim`` header is skipped)."""
    found: dict[str, np.ndarray] = {}
    with path.open("rb") as fh:
        for raw in fh:
            line = _utf8(raw)
            if line is None:
                stats.skipped_non_utf8 += 1
                continue
            parts = line.rstrip().split(" ")
            if len(parts) <= 2:
                continue  # the header line, or a blank one
            stats.words_in_file += 1
            if parts[0] in wanted:
                try:
                    found[parts[0]] = np.asarray(parts[1:], dtype=np.float32)
                except ValueError:
                    raise MmlinksError(f"{path}: the vector of {parts[0]!r} is not numeric") from None
    if found:
        stats.dim = len(next(iter(found.values())))
        if any(len(v) != stats.dim for v in found.values()):
            raise MmlinksError(f"{path}: word vectors have different lengths")
    stats.found = len(found)
    return found


def _read_word2vec_bin(path: Path, wanted: set[str], stats: VectorStats) -> dict[str, np.ndarray]:
    """The C tool's binary layout: ``"<n> <dim>\\n"``, then per word its bytes, a space, dim float32
    (little-endian) and usually a newline. Streamed; only wanted words' vectors are kept."""
    wanted_bytes = {w.encode("utf-8"): w for w in wanted}
    found: dict[str, np.ndarray] = {}
    with path.open("rb") as fh:
        header = _W2V_HEADER.match(fh.readline(256))
        if not header:
            raise MmlinksError(f"{path}: not a word2vec binary file (no '<words> <dim>' header line)")
        n_words, dim = int(header.group(1)), int(header.group(2))
        stats.dim, record = dim, 4 * dim
        stream = _ByteStream(fh)
        stream.base = header.end()
        for i in range(n_words):
            stream.skip(b"\n")  # the C tool ends each vector with a newline; some writers do not
            try:
                word = stream.until(b" ")
            except _NoDelimiter:
                raise MmlinksError(
                    f"{path}: word {i + 1} has no space after it within {_MAX_WORD_BYTES} bytes "
                    "(not a word2vec binary file, or a corrupt one)"
                ) from None
            vec = stream.exact(record) if word is not None else None
            if vec is None:
                raise MmlinksError(
                    f"{path}: truncated word2vec binary file: the header promises {n_words} words, "
                    f"the file ends in word {i + 1}"
                )
            stats.words_in_file += 1
            name = wanted_bytes.get(word)
            if name is not None:
                found[name] = np.frombuffer(vec, dtype="<f4").astype(np.float32)
            elif not word.isascii() and _utf8(word) is None:
                stats.skipped_non_utf8 += 1
    stats.found = len(found)
    return found


@dataclass
class _FastTextHeader:
    dim: int
    model: int
    bucket: int
    minn: int
    maxn: int
    nwords: int
    ids: dict[bytes, int]  # the wanted words in the model's dictionary -> their row


def _read_fasttext(path: Path, wanted: set[str], stats: VectorStats) -> dict[str, np.ndarray]:
    """Vectors from a ``FastText::saveModel`` file: header parsed by streaming, input matrix memmapped."""
    wanted_bytes = {w.encode("utf-8"): w for w in wanted}
    with path.open("rb") as fh:
        stream = _ByteStream(fh)
        head, matrix_offset, rows = _read_fasttext_header(path, stream, set(wanted_bytes))
    size = path.stat().st_size
    end = matrix_offset + rows * head.dim * 4
    if size < end:
        raise MmlinksError(
            f"{path}: truncated fastText model: the input matrix needs {end} bytes, the file has {size}"
        )
    _check_output_matrix(path, end, size)
    table = np.memmap(path, dtype="<f4", mode="r", offset=matrix_offset, shape=(rows, head.dim))
    stats.dim, stats.words_in_file = head.dim, head.nwords
    found: dict[str, np.ndarray] = {}
    for raw, word in wanted_bytes.items():
        row = head.ids.get(raw)
        ids = [] if row is None else [row]
        if raw != b"</s>":  # fastText gives EOS no subwords, in or out of the vocabulary
            ids += subword_rows(raw, head.minn, head.maxn, head.bucket, head.nwords)
        if not ids:
            continue
        found[word] = np.asarray(table[ids], dtype=np.float64).mean(axis=0).astype(np.float32)
        if row is None:
            stats.oov_from_ngrams += 1
        else:
            stats.found += 1
    del table
    return found


def _read_fasttext_header(
    path: Path, stream: _ByteStream, wanted: set[bytes]
) -> tuple[_FastTextHeader, int, int]:
    """(header, byte offset of the input matrix data, its rows), following FastText::loadModel."""

    def take(fmt: str, where: str) -> tuple:
        data = stream.exact(struct.calcsize(fmt))
        if data is None:
            raise MmlinksError(f"{path}: truncated fastText model (the file ends in the {where})")
        return struct.unpack(fmt, data)

    magic, version = take("<ii", "header")
    if magic != FASTTEXT_MAGIC:
        raise MmlinksError(
            f"{path}: not a fastText model (magic number {magic}, expected {FASTTEXT_MAGIC}; "
            "models saved before the magic number existed are not supported, as by fastText itself)"
        )
    if version > FASTTEXT_VERSION:
        raise MmlinksError(f"{path}: fastText model version {version} is newer than {FASTTEXT_VERSION}")
    # Args::save: dim ws epoch minCount neg wordNgrams loss model bucket minn maxn lrUpdateRate (int32), t
    args = take("<12id", "model arguments")
    dim, model, bucket, minn, maxn = args[0], args[7], args[8], args[9], args[10]
    if version == 11 and model == _FT_SUP:
        maxn = 0  # FastText::loadModel: old supervised models do not use character n-grams
    size, nwords, _nlabels = take("<3i", "dictionary header")
    _ntokens, pruneidx_size = take("<2q", "dictionary header")
    ids: dict[bytes, int] = {}
    for i in range(size):
        try:
            word = stream.until(b"\0")
        except _NoDelimiter:
            raise MmlinksError(
                f"{path}: dictionary entry {i + 1} is not NUL-terminated (corrupt model)"
            ) from None
        if word is None:
            raise MmlinksError(
                f"{path}: truncated fastText model (the file ends in dictionary entry {i + 1})"
            )
        _count, kind = take("<qb", "dictionary")
        if kind == _FT_WORD and i < nwords and word in wanted:
            ids[word] = i
    if pruneidx_size > 0:
        take(f"<{2 * pruneidx_size}i", "pruned n-gram index")
    (quant,) = take("<?", "quantization flag")
    if quant:
        raise MmlinksError(
            f"{path}: a quantized fastText model (.ftz) has no dense vectors to read; use the full .bin model"
        )
    if pruneidx_size >= 0:
        raise MmlinksError(f"{path}: a pruned fastText model must be quantized; this file is invalid")
    rows, cols = take("<2q", "input matrix header")
    if dim <= 0 or cols != dim or rows != nwords + max(bucket, 0):
        raise MmlinksError(
            f"{path}: the input matrix is {rows}x{cols}, expected {nwords + bucket}x{dim} "
            "(words + buckets by dim); corrupt model"
        )
    head = _FastTextHeader(dim=dim, model=model, bucket=bucket, minn=minn, maxn=maxn, nwords=nwords, ids=ids)
    return head, stream.offset(), rows


def _check_output_matrix(path: Path, start: int, size: int) -> None:
    """A download cut short in the output matrix is still a broken file: say so rather than guess."""
    with path.open("rb") as fh:
        fh.seek(start)
        head = fh.read(17)  # qout flag, then int64 rows, int64 cols
    if len(head) < 17:
        raise MmlinksError(f"{path}: truncated fastText model (the file ends before the output matrix)")
    rows, cols = struct.unpack("<2q", head[1:])
    if size < start + 17 + rows * cols * 4:
        raise MmlinksError(f"{path}: truncated fastText model (the file ends in the output matrix)")


def fasttext_hash(data: bytes) -> int:
    """fastText's FNV-1a variant (dictionary.cc ``hash``): each byte is sign-extended as int8 before
    the xor (``h ^= uint32_t(int8_t(c))``), so bytes >= 0x80 differ from textbook FNV-1a."""
    h = 2166136261
    for byte in data:
        h ^= (byte | 0xFFFFFF00) if byte & 0x80 else byte
        h = (h * 16777619) & 0xFFFFFFFF
    return h


def subword_rows(word: bytes, minn: int, maxn: int, bucket: int, nwords: int) -> list[int]:
    """Input-matrix rows of the character n-grams of ``<word>`` (Dictionary::computeSubwords).

    n counts UTF-8 characters (continuation bytes never start an n-gram nor end one), and the lone
    ``<`` and ``>`` are not n-grams. Duplicates (hash collisions) are kept: fastText averages them too.
    """
    if maxn <= 0 or bucket <= 0:
        return []
    text = b"<" + word + b">"
    size, rows = len(text), []
    for i in range(size):
        if text[i] & 0xC0 == 0x80:
            continue
        j, n = i, 1
        while j < size and n <= maxn:
            j += 1
            while j < size and text[j] & 0xC0 == 0x80:
                j += 1
            if n >= minn and not (n == 1 and (i == 0 or j == size)):
                rows.append(nwords + fasttext_hash(text[i:j]) % bucket)
            n += 1
    return rows
