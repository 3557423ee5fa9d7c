"""The names of an archive index's rows at tens of millions of images (issue #38).

Why flat files: 10M content ids as Python strings cost ~1 GB and a JSON file must be parsed whole.
A column is ``NAME.bin`` (rows' UTF-8 bytes) and ``NAME.offsets`` (int64, rows + 1), memory-mapped
and decoded per hit, shared by serving processes, append-only so a resumed build cuts them back.
``IdLookup`` searches sorted 64-bit id hashes and confirms each hit on the string, so a collision
costs a comparison, never a wrong row; ``chained`` hashes the build and every add and delete."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from schemas.errors import MmlinksError

OFFSET_DTYPE = np.dtype("<i8")


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` through a temporary file and a rename: a process killed mid-write leaves
    the previous file (or none), never half of the new one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_json_atomic(path: Path, obj) -> None:
    write_atomic(path, json.dumps(obj, indent=1).encode())


def save_npy_atomic(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        np.save(fh, array)
    os.replace(tmp, path)


def table_files(folder: Path, name: str) -> tuple[Path, Path]:
    return folder / f"{name}.bin", folder / f"{name}.offsets"


def _encoded(strings: Iterable[str]) -> tuple[bytes, np.ndarray]:
    """(the strings' UTF-8 bytes back to back, each string's byte length)."""
    parts = [str(s).encode() for s in strings]
    return b"".join(parts), np.fromiter((len(p) for p in parts), np.int64, len(parts))


def _map(path: Path, dtype) -> np.ndarray:
    """A read-only memory map of a raw file (numpy refuses to map an empty file)."""
    if path.stat().st_size == 0:
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r")


class StringTable(Sequence):
    """Row i's string, read lazily: the rows of the files it was opened from (memory-mapped),
    then the rows appended since (in memory, written by ``write``)."""

    def __init__(self, strings: Iterable[str] = ()) -> None:
        self._data = np.zeros(0, np.uint8)
        self._offsets = np.zeros(1, OFFSET_DTYPE)
        self._tail: list[str] = [str(s) for s in strings]

    @classmethod
    def open(cls, folder: str | Path, name: str, rows: int | None = None) -> StringTable:
        """The table ``name`` of ``folder``; ``rows``: its first rows only (what a checkpoint
        recorded; the files may hold more)."""
        data_path, offsets_path = table_files(Path(folder), name)
        if not offsets_path.is_file() or not data_path.is_file():
            raise MmlinksError(f"archive index {folder}: the {name} table is missing ({offsets_path.name})")
        table = cls()
        offsets = _map(offsets_path, OFFSET_DTYPE)
        if not len(offsets) or (rows is not None and len(offsets) < rows + 1):
            raise MmlinksError(f"archive index {folder}: the {name} table is cut short")
        table._offsets = offsets[: None if rows is None else rows + 1]
        table._data = _map(data_path, np.uint8)
        if len(table._data) < int(table._offsets[-1]):
            raise MmlinksError(f"archive index {folder}: the {name} table's data is cut short")
        return table

    def __len__(self) -> int:
        return len(self._offsets) - 1 + len(self._tail)

    def mapped_ranges(self) -> list[tuple[int, int]]:
        """(address, bytes) of the memory-mapped file rows this table reads (``open``); none
        for rows held in memory."""
        arrays = (self._offsets, self._data)
        return [(int(a.ctypes.data), int(a.nbytes)) for a in arrays if isinstance(a, np.memmap) and a.nbytes]

    def _row(self, i: int) -> str:
        base = len(self._offsets) - 1
        if i < base:
            return bytes(self._data[int(self._offsets[i]) : int(self._offsets[i + 1])]).decode()
        return self._tail[i - base]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._row(j) for j in range(*i.indices(len(self)))]
        i = int(i)
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"row {i} of a table of {n}")
        return self._row(i % n if i < 0 else i)

    def __iter__(self) -> Iterator[str]:
        return (self._row(i) for i in range(len(self)))

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and list(self) == list(other)

    __hash__ = None  # mutable

    def extend(self, strings: Iterable[str]) -> None:
        self._tail.extend(str(s) for s in strings)

    def write(self, folder: Path, name: str) -> None:
        """Write every row to ``folder`` as the table ``name`` (through temporary files and
        renames; the mapped files of a table opened from the same folder stay valid)."""
        data_path, offsets_path = table_files(folder, name)
        tail, lengths = _encoded(self._tail)
        base_bytes = int(self._offsets[-1])
        offsets = np.concatenate([self._offsets, base_bytes + np.cumsum(lengths)]).astype(OFFSET_DTYPE)
        tmp = data_path.with_name(data_path.name + ".tmp")
        with tmp.open("wb") as fh:
            for start in range(0, base_bytes, 1 << 26):  # the mapped base, 64 MB at a time
                fh.write(memoryview(self._data[start : min(base_bytes, start + (1 << 26))]))
            fh.write(tail)
        write_atomic(offsets_path, offsets.tobytes())
        os.replace(tmp, data_path)


def append_table(folder: Path, name: str, strings: Sequence[str]) -> None:
    """Append rows to the files of table ``name`` (created empty first): the streamed build's
    way to write names without holding them."""
    data_path, offsets_path = table_files(folder, name)
    if not offsets_path.is_file():
        data_path.write_bytes(b"")
        offsets_path.write_bytes(np.zeros(1, OFFSET_DTYPE).tobytes())
    data, lengths = _encoded(strings)
    with offsets_path.open("rb") as fh:
        fh.seek(-OFFSET_DTYPE.itemsize, os.SEEK_END)
        end = int(np.frombuffer(fh.read(OFFSET_DTYPE.itemsize), OFFSET_DTYPE)[0])
    with data_path.open("ab") as fh:
        fh.write(data)
    with offsets_path.open("ab") as fh:
        fh.write((end + np.cumsum(lengths)).astype(OFFSET_DTYPE).tobytes())


def truncate_table(folder: Path, name: str, rows: int) -> None:
    """Cut table ``name`` back to its first ``rows`` rows (a resumed build drops the rows it
    appended after its last checkpoint)."""
    data_path, offsets_path = table_files(folder, name)
    if not offsets_path.is_file():
        if rows:
            raise MmlinksError(f"archive build in {folder}: the {name} table is missing")
        return
    offsets = _map(offsets_path, OFFSET_DTYPE)
    if len(offsets) < rows + 1:
        raise MmlinksError(f"archive build in {folder}: the {name} table holds fewer than {rows} rows")
    end = int(offsets[rows])
    del offsets
    if not data_path.is_file() or data_path.stat().st_size < end:  # truncate would pad with NULs
        raise MmlinksError(f"archive build in {folder}: the {name} table's data is cut short")
    os.truncate(offsets_path, (rows + 1) * OFFSET_DTYPE.itemsize)
    os.truncate(data_path, end)


def hash_ids(ids: Iterable[str]) -> np.ndarray:
    """64-bit hashes (BLAKE2b) of the ids, as unsigned integers."""
    return np.fromiter(
        (int.from_bytes(hashlib.blake2b(str(i).encode(), digest_size=8).digest(), "little") for i in ids),
        np.uint64,
    )


class IdLookup:
    """id -> rows through a sorted hash column; the rows of one id (a withdrawn image added
    again) are all kept, the caller picks the live one."""

    def __init__(self, hashes: np.ndarray | None = None, rows: np.ndarray | None = None) -> None:
        self.hashes = np.zeros(0, np.uint64) if hashes is None else hashes
        self.rows = np.zeros(0, np.int64) if rows is None else rows

    @classmethod
    def of(cls, table: StringTable, chunk: int = 1 << 20) -> IdLookup:
        """The look-up of every row of ``table`` (hashed ``chunk`` rows at a time)."""
        out = cls()
        for start in range(0, len(table), chunk):
            names = table[start : start + chunk]
            out.insert(hash_ids(names), np.arange(start, start + len(names), dtype=np.int64))
        return out

    def insert(self, hashes: np.ndarray, rows: np.ndarray) -> None:
        """Merge new (hash, row) pairs in: the batch sorted, then inserted at its places (one
        pass over the column, not a sort of all of it: a build inserts ~150 chunks at 10M)."""
        order = np.argsort(hashes.astype(np.uint64), kind="stable")
        h, r = hashes.astype(np.uint64)[order], rows.astype(np.int64)[order]
        at = np.searchsorted(self.hashes, h, "right")
        self.hashes, self.rows = np.insert(self.hashes, at, h), np.insert(self.rows, at, r)

    def candidates(self, hashes: np.ndarray) -> list[np.ndarray]:
        """The rows stored under each hash (usually none or one)."""
        lo = np.searchsorted(self.hashes, hashes, "left")
        hi = np.searchsorted(self.hashes, hashes, "right")
        return [self.rows[a:b] for a, b in zip(lo.tolist(), hi.tolist(), strict=True)]

    def find(
        self, ids: Sequence[str], table: StringTable, alive=None, hashes: np.ndarray | None = None
    ) -> np.ndarray:
        """Each id's row (-1: none), the string confirmed in ``table``; ``alive(row)``: only a
        row it accepts (the live one) counts."""
        hashes = hash_ids(ids) if hashes is None else hashes
        out = np.full(len(ids), -1, np.int64)
        for j, (name, rows) in enumerate(zip(ids, self.candidates(hashes), strict=True)):
            for r in rows.tolist():
                if (alive is None or alive(r)) and table[r] == name:
                    out[j] = r
        return out

    def save(self, folder: Path, name: str = "ids") -> None:
        save_npy_atomic(folder / f"{name}.hash.npy", self.hashes)
        save_npy_atomic(folder / f"{name}.hash_rows.npy", self.rows)

    @classmethod
    def load(cls, folder: Path, rows: int, name: str = "ids") -> IdLookup | None:
        """The saved look-up when it covers exactly ``rows`` rows (else None: rebuild it)."""
        paths = folder / f"{name}.hash.npy", folder / f"{name}.hash_rows.npy"
        if not all(p.is_file() for p in paths):
            return None
        hashes, r = (np.load(p, mmap_mode="r") for p in paths)
        if len(hashes) != rows or len(r) != rows:
            return None
        return cls(np.asarray(hashes), np.asarray(r))


def chained(previous: str, operation: str, ids: Sequence[str], vectors: np.ndarray | None = None) -> str:
    """The fingerprint after ``operation`` ("build", "add", "delete") of ``ids`` (and their
    vectors) on an index whose fingerprint was ``previous``: SHA-256 over the previous value,
    the operation, the ids (length-prefixed) and the vectors' float32 bytes."""
    h = hashlib.sha256()
    h.update(previous.encode() + b"\0" + operation.encode() + b"\0")
    data, lengths = _encoded(ids)
    h.update(lengths.astype("<i8").tobytes())
    h.update(data)
    if vectors is not None:
        h.update(np.ascontiguousarray(vectors, dtype="<f4").tobytes())
    return h.hexdigest()


class VectorFile:
    """Row i's float32 vector: the rows of ``NAME.f32`` (raw little-endian [rows, d]) read with
    ``os.pread``, then the rows appended since (in memory, written by ``write``). ``pread``
    rather than a memory map: the pages a query reads stay in the OS page cache, not in the
    serving process's resident memory, so a 10 GB file at 10M images costs the process only
    the few rows of each query (ivfpq's final exact re-rank, ``archive.index``)."""

    def __init__(self, d: int, rows: np.ndarray | None = None) -> None:
        self.d = d
        self._path: Path | None = None
        self._base = 0
        self._tail: list[np.ndarray] = [] if rows is None or not len(rows) else [rows]
        # Opened once, at ``open``: a file replaced at the same path later (a rebuild of the
        # folder) does not change what this index reads; ``pread`` keeps no file offset, so
        # forked serving workers share the descriptor safely.
        self._fd: int | None = None

    @classmethod
    def open(cls, folder: str | Path, name: str, d: int, rows: int) -> VectorFile:
        path = Path(folder) / f"{name}.f32"
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise MmlinksError(f"archive index {folder}: {path.name} is missing") from None
        if os.fstat(fd).st_size < rows * d * 4:
            os.close(fd)
            raise MmlinksError(f"archive index {folder}: {path.name} is cut short")
        out = cls(d)
        out._path, out._base, out._fd = path, rows, fd
        return out

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()

    def __len__(self) -> int:
        return self._base + sum(len(t) for t in self._tail)

    def extend(self, rows: np.ndarray) -> None:
        if len(rows):
            self._tail.append(np.ascontiguousarray(rows, dtype=np.float32))

    def _descriptor(self) -> int:
        if self._fd is None:
            raise MmlinksError(f"archive index: {self._path} was closed")
        return self._fd

    def _read_rows(self, start: int, n: int) -> np.ndarray:
        """Rows [start, start + n) of the file, read with ``pread``."""
        size = n * self.d * 4
        data = os.pread(self._descriptor(), size, start * self.d * 4)
        if len(data) != size:
            raise MmlinksError(f"archive index: {self._path} is cut short")
        return np.frombuffer(data, "<f4").reshape(n, self.d)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """[len(rows), d] float32, in the order given. The file's rows are first announced to
        the kernel all at once (``POSIX_FADV_WILLNEED``: a no-op for rows in the page cache), so
        that the reads of rows it has dropped run side by side: 40 rows (ivfpq's exact re-rank of
        a top 10) not in the page cache took p50 / p99 2.2 / 2.7-3.0 ms read one after another,
        0.47 / 0.6-1.0 ms announced first; +0.015 ms when cached (docs/benchmarks.md, issue #38)."""
        out = np.empty((len(rows), self.d), np.float32)
        size = self.d * 4
        if len(self._tail) > 1:
            self._tail = [np.concatenate(self._tail)]
        rows = np.asarray(rows, np.int64).tolist()
        on_disk = [r for r in rows if r < self._base]
        if len(on_disk) > 1 and hasattr(os, "posix_fadvise"):
            fd = self._descriptor()
            for r in on_disk:
                os.posix_fadvise(fd, r * size, size, os.POSIX_FADV_WILLNEED)
        for j, r in enumerate(rows):
            if r < self._base:
                out[j] = np.frombuffer(os.pread(self._descriptor(), size, r * size), np.float32)
            else:
                out[j] = self._tail[0][r - self._base]
        return out

    def blocks(self, rows: int = 1 << 16) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, [<= rows, d] float32) over every row, in order: a pass over the file that
        holds one block in memory (an exact search, ivfpq's calibration)."""
        start = 0
        while start < self._base:
            n = min(rows, self._base - start)
            yield start, self._read_rows(start, n)
            start += n
        for t in self._tail:
            for s in range(0, len(t), rows):
                yield start, t[s : s + rows]
                start += len(t[s : s + rows])

    def write(self, folder: Path, name: str) -> None:
        """Every row to ``folder/NAME.f32`` (through a temporary file and a rename)."""
        path = folder / f"{name}.f32"
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as out:
            step = max(1, (1 << 26) // (self.d * 4))  # 64 MB at a time
            for start in range(0, self._base, step):
                out.write(self._read_rows(start, min(step, self._base - start)).tobytes())
            for t in self._tail:
                out.write(np.ascontiguousarray(t, dtype="<f4").tobytes())
        os.replace(tmp, path)


def append_vectors(folder: Path, name: str, rows: np.ndarray) -> None:
    with (folder / f"{name}.f32").open("ab") as fh:
        fh.write(np.ascontiguousarray(rows, dtype="<f4").tobytes())


def truncate_vectors(folder: Path, name: str, rows: int, d: int) -> None:
    path = folder / f"{name}.f32"
    if path.is_file():
        if path.stat().st_size < rows * d * 4:
            raise MmlinksError(f"archive build in {folder}: {path.name} holds fewer than {rows} rows")
        os.truncate(path, rows * d * 4)
    elif rows:
        raise MmlinksError(f"archive build in {folder}: {path.name} is missing")
