"""Reading the rows of a released CSV table (Clue's per-split files, CITE's ``data.csv``) so that
no byte sequence stops a build with a csv traceback.

Why the csv module with ``newline=""``: it reads pandas-quoted tables exactly and a lone carriage
return is a line break; any ``csv.Error`` ends the file with one ``malformed_csv`` record. Every
table reader sets the process-wide ``FIELD_LIMIT`` first, so a field reads the same whichever
reader ran first."""

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
