"""Reading the rows of a released CSV table (Clue's per-split files, CITE's ``data.csv``) so that
no byte sequence stops a build with a csv traceback.

The csv module itself: the tables are small (a few MB), quoted the way pandas writes them, and
``csv.DictReader`` reads that exactly; what it lacks is turning its two failure modes into dead
letters. A text read through a plain ``StringIO`` splits lines on ``\\n`` only, and csv then
refuses a lone carriage return with ``csv.Error``; ``newline=""`` (what the csv docs ask of every
file it reads) lets csv treat it as the line break it is. A field over csv's size limit, or any
other ``csv.Error``, ends the file with one ``malformed_csv`` record after the rows before it.
The limit is csv's one process-wide setting: every table reader (WIT's too) sets ``FIELD_LIMIT``
before it reads, so a field is refused or read the same whichever reader ran first.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Sequence

FIELD_LIMIT = 1 << 24  # characters; a WIT context description can exceed csv's 128 KiB default


def csv_rows(
    text: str, name: str, columns: Sequence[str], delimiter: str = ","
) -> Iterator[dict | tuple[str, str, str]]:
    """The rows of ``text`` as dicts, or (source id, reason, detail) tuples: one ``bad_header``
    (instead of any row) when the header lacks one of ``columns`` (the unnamed first column of
    the writer's row numbers is not required), one ``malformed_csv`` last when csv cannot read
    on. Extra fields land under the key None, missing ones are None (DictReader's defaults)."""
    csv.field_size_limit(FIELD_LIMIT)
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        missing = [c for c in columns if c and c not in (reader.fieldnames or [])]
        if missing:
            yield (name, "bad_header", f"missing columns {missing}")
            return
        yield from reader
    except csv.Error as exc:
        yield (name, "malformed_csv", f"line {reader.line_num}: {exc}")
