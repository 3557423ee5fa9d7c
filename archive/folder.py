"""An archive index's folder read back (``ArchiveIndex.load``): ``index.json``'s state, the
FAISS files (memory-mapped on request), the name tables (or issue #18's ``ids.json``), the
withdrawn rows and ivfpq's float32 vectors, refused when they do not belong together."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from archive.faiss_kinds import HNSW_EF_SEARCH, PQ_REFINE_FACTOR, ivf_nprobe, read_index_files
from archive.store import StringTable, VectorFile
from schemas.errors import MmlinksError

FORMAT = 2  # 1: ids.json (issue #18); 2: string tables, tombstones, version, fingerprint
# index.json keys that are the index's own state, not provenance (``info``)
STATE_KEYS = ("kind", "dim", "size", "rows", "deleted", "version", "fingerprint", "search")
STATE_KEYS += ("refine_factor", "format", "build", "calibration")


def read_folder(folder: Path, mmap: bool) -> tuple[dict, bool]:
    """(``ArchiveIndex``'s keyword arguments, whether the names came from issue #18's
    ``ids.json``) of the index saved in ``folder``; ``mmap``: the FAISS arrays mapped."""
    if not (folder / "index.faiss").is_file() or not (folder / "index.json").is_file():
        unfinished = (folder / "build.json").is_file()
        why = "an unfinished build: run it again to resume" if unfinished else "index.faiss missing"
        raise MmlinksError(f"no archive index in {folder} ({why})")
    meta = json.loads((folder / "index.json").read_text())
    kind = meta.get("kind", "flat")
    index = read_index_files(kind, folder, "index", mmap)
    state = {key: meta.pop(key) for key in STATE_KEYS if key in meta}
    if (folder / "ids.json").is_file():  # issue #18's folders
        names = json.loads((folder / "ids.json").read_text())
        ids, uris = names["ids"], names["uris"]
    else:
        ids = StringTable.open(folder, "ids", int(index.ntotal))
        uris = StringTable.open(folder, "uris", int(index.ntotal))
    deleted = np.load(folder / "deleted.npy") if (folder / "deleted.npy").is_file() else None
    _check_folder(folder, kind, index, state, deleted)
    exact = None
    if kind == "ivfpq" and (folder / "vectors.f32").is_file():
        exact = VectorFile.open(folder, "vectors", int(index.d), int(index.ntotal))
    elif kind == "ivfpq" and int(state.get("search", {}).get("exact_factor", 0)):
        raise MmlinksError(
            f"archive index {folder}: vectors.f32 is missing (its search re-ranks on it; copy the "
            "whole folder)"
        )
    if kind == "hnsw":
        index.hnsw.efSearch = HNSW_EF_SEARCH
    elif kind == "ivf":
        index.nprobe = ivf_nprobe(int(index.nlist))
    elif kind == "pq":  # indexes saved before the factor was saved: the old default
        index.k_factor = int(state.get("refine_factor", PQ_REFINE_FACTOR))
    args = dict(
        index=index,
        ids=ids,
        uris=uris,
        kind=kind,
        info=meta,
        deleted=np.zeros(0, np.int64) if deleted is None else deleted.astype(np.int64),
        version=int(state.get("version", 1)),
        fingerprint=str(state.get("fingerprint", "")),
        search_settings=dict(state.get("search", {})),
        mmapped=mmap,
        build_settings=dict(state.get("build", {})),
        exact=exact,
        calibration=dict(state.get("calibration", {})),
    )
    return args, isinstance(ids, list)


def _check_folder(folder: Path, kind: str, index, state: dict, deleted: np.ndarray | None) -> None:
    """Refuse a folder whose files do not belong together (a save or copy cut short): the rows
    index.json counts, the IVF codes' and the re-rank store's rows, the withdrawn rows."""
    rows = int(index.ntotal)
    problems = []
    if "rows" in state and int(state["rows"]) != rows:
        problems.append(f"index.json counts {state['rows']} rows, index.faiss holds {rows}")
    base, store = (
        (int(index.base_index.ntotal), int(index.refine_index.ntotal)) if kind == "ivfpq" else (0, 0)
    )
    if base != store:
        problems.append(f"index.faiss holds {base} rows, index.refine.faiss {store}")
    if deleted is not None and len(deleted):
        if "deleted" in state and int(state["deleted"]) != len(deleted):
            problems.append(
                f"index.json counts {state['deleted']} withdrawn rows, deleted.npy {len(deleted)}"
            )
        if int(np.max(deleted)) >= rows:
            problems.append("deleted.npy names rows past the end")
    if problems:
        raise MmlinksError(
            f"archive index {folder} is inconsistent: {'; '.join(problems)} (rebuild or re-copy it)"
        )
