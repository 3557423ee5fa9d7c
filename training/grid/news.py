"""Liu et al.'s news image selection tables (issue #18) as grids: rows and columns as TrainConfig
overrides, one trial per row, column and seed, printed in the paper's layout (docs/retrieval-news.md).

Offline the embedding rows use the base's vectors; a cell is the mean over seeds, MedR's "±" their
sample standard deviation."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from schemas.errors import MmlinksError
from training.config import TrainConfig
from training.grid.layout import block_lines
from training.grid.results import TrialResult

NEWS_METRICS = ("r1", "r5", "r10", "medr")
DIRECTIONS = (("i2t", "image to text"), ("t2i", "text to image"))
SOURCES = ("caption", "body", "headline", "lead")  # Table 1's column order
FOUR = "headline,lead,body,caption"
DROP = 0.3  # the paper's random_drop


@dataclass(frozen=True)
class NewsLayout:
    """One of the paper's tables: rows and columns as TrainConfig overrides, and what it prints
    ("r10": R@10 per column and direction; "full": R@1/5/10 and MedR per direction)."""

    rows: tuple[tuple[str, str, dict], ...]  # (row id, the paper's row name, overrides)
    columns: tuple[tuple[str, dict], ...] = (("", {}),)  # (column id, overrides)
    metrics: str = "r10"
    base_line: str = ""  # the row the deltas are printed against (Tables 3 / 4)


def _fusion_rows() -> tuple:
    names = {"max": "Global Max Pooling", "add": "Element-wise Adding", "mlp": "Neural Net Fuser"}
    names["attention"] = "Attention Fuser"
    rows = []
    for fusion, name in names.items():
        common = {"news_sources": FOUR, "fusion": fusion}
        rows.append((f"{fusion}-drop", name, {**common, "random_drop": DROP}))
        rows.append((f"{fusion}-complete", f"{name} (w/o random drop)", {**common, "random_drop": 0.0}))
    scratch = {"news_sources": FOUR, "fusion": "attention", "random_drop": DROP, "init_from": ""}
    rows.insert(
        6, ("attention-scratch", "Attention Fuser (from scratch)", {**scratch, "fuser_warmup_epochs": 0})
    )
    return tuple(rows)


LAYOUTS: dict[str, NewsLayout] = {
    "news-table1": NewsLayout(
        rows=(
            ("vsepp", "VSE++", {"news_loss": "vsepp", "subword_buckets": 0}),
            ("vse", "VSE", {"news_loss": "vse", "subword_buckets": 0}),
            # Vendrov et al.'s order embeddings with their margin 0.05 (line 1.3)
            ("order", "ORDER", {"news_loss": "order", "margin": 0.05, "subword_buckets": 0}),
            # Wehrmann & Barros' character-level convolutions, no word embedding (line 1.4)
            ("chain", "CHAIN", {"news_encoder": "chain", "news_loss": "vse", "subword_buckets": 0}),
            ("hal", "HAL", {"news_loss": "hal", "subword_buckets": 0}),
            ("full", "Ours (full model: VSE + subword)", {"news_loss": "vse", "subword_buckets": 2000}),
        ),
        columns=tuple((s, {"news_sources": s, "random_drop": 0.0, "init_from": ""}) for s in SOURCES),
    ),
    "news-table2": NewsLayout(rows=_fusion_rows(), metrics="full"),
    "news-table34": NewsLayout(
        rows=(
            ("target-only", "target language only", {"multilingual": "none", "init_from": ""}),
            (
                "one-for-all",
                "one-for-all (aligned, frozen, mixed)",
                {"multilingual": "one-for-all", "init_from": ""},
            ),
            ("all-for-one", "all-for-one (from --init-from, fine-tuned)", {"multilingual": "all-for-one"}),
        ),
        base_line="target-only",
    ),
}
TITLES = {
    "news-table1": "Liu et al., Table 1: single textual source, R@10",
    "news-table2": "Liu et al., Table 2: multi-textual-source fusion methods",
    "news-table34": "Liu et al., Tables 3 / 4: multilingual recipes, R@10",
}


def layout_points(layout: NewsLayout) -> tuple[dict, ...]:
    """Every (row, column) of a table as one TrainConfig override dict, rows outer."""
    return tuple({**o, **c} for _, _, o in layout.rows for _, c in layout.columns)


def cell_of(layout: NewsLayout, point: dict) -> tuple[str, str, str]:
    """(row id, column id, row name) of a point (its seed aside)."""
    bare = {k: v for k, v in point.items() if k != "seed"}
    for rid, name, o in layout.rows:
        for cid, c in layout.columns:
            if bare == {**o, **c}:
                return rid, cid, name
    raise MmlinksError(f"{point} is no cell of this news table")


def news_keys(layout: NewsLayout, point: dict, base: TrainConfig) -> tuple[str, str, str]:
    """(trial key, row key, method) of a point: e.g. ('vse@caption-s0', 'vse@caption', 'VSE')."""
    rid, cid, name = cell_of(layout, point)
    row = f"{rid}@{cid}" if cid else rid
    return f"{row}-s{point.get('seed', base.seed)}", row, name


def check_base(name: str, layout: NewsLayout, base: TrainConfig, points: tuple[dict, ...]) -> None:
    """All-for-one needs a model to start from; say so before any trial runs."""
    if any(p.get("multilingual") == "all-for-one" for p in points) and not base.init_from:
        raise MmlinksError(
            f"grid {name}: the all-for-one row starts from a model of the other language: pass "
            "--init-from DIR (its checkpoint folder), or --grid-rows target-only,one-for-all"
        )


def flat_news_metrics(test: dict | None) -> dict:
    """A news run's test results as the flat scalars a Tune trial reports (test_t2i_r10, ...)."""
    test = test or {}
    out = {f"test_{d}_{k}": (test.get(d) or {}).get(k) for d, _ in DIRECTIONS for k in NEWS_METRICS}
    out["test_pairs"] = test.get("pairs")
    return out


def _finite(values) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def _cell(trials: list[TrialResult]) -> dict | None:
    ok = [t for t in trials if t.status == "ok"]
    if not ok:
        return None
    cell: dict = {"repeats": len(ok), "run_ids": [t.run_id for t in ok]}
    for d, _ in DIRECTIONS:
        for k in NEWS_METRICS:
            vals = _finite(t.test.get(f"{d}_{k}") for t in ok)
            cell[f"{d}_{k}"] = statistics.fmean(vals) if vals else None
        medrs = _finite(t.test.get(f"{d}_medr") for t in ok)
        cell[f"{d}_medr_sd"] = statistics.stdev(medrs) if len(medrs) > 1 else None
    return cell


def build_news_table(spec, trials: list[TrialResult], base: TrainConfig | None = None) -> dict:
    """The table as data: per dataset a block of rows (the paper's order), each with one cell per
    column (Table 1: per source), failed repeats counted."""
    layout = LAYOUTS[spec.name]
    datasets = list(dict.fromkeys(t.dataset for t in trials))
    blocks = []
    for d in datasets:
        mine = [t for t in trials if t.dataset == d]
        rows = []
        for rid, name, _ in layout.rows:
            cells, failed, errors = {}, 0, set()
            for cid, _ in layout.columns:
                group = [t for t in mine if t.row == (f"{rid}@{cid}" if cid else rid)]
                if group:
                    cells[cid] = _cell(group)
                    bad = [t for t in group if t.status != "ok"]
                    failed += len(bad)
                    errors |= {t.error for t in bad}
            if cells:
                rows.append(
                    {"id": rid, "method": name, "cells": cells, "failed": failed, "errors": sorted(errors)}
                )
        blocks.append({"title": f"{TITLES[spec.name]}, on {d}", "dataset": d, "rows": rows})
    notes = [
        "test split, complete inputs; R@K in %, MedR in candidates (1 = first); pools of pool_size "
        "candidates averaged over n_pools random pools (docs/evaluation.md, Retrieval)",
        "each cell: mean over the repeats (seeds); MedR ± their sample standard deviation",
    ]
    loaded = (base is not None and base.init_from) or any(t.overrides.get("init_from") for t in trials)
    if spec.name == "news-table2" and base is not None and not loaded:
        notes.append(
            "no --init-from / --init-from-grid: every fuser row trained jointly from scratch (no divide "
            "and conquer)"
        )
    if layout.base_line:
        notes.append(f"(+x): difference to the '{layout.base_line}' row of the block")
    return {
        "grid": spec.name,
        "family": "news",
        "title": TITLES[spec.name],
        "layout": layout.metrics,
        "columns": [c for c, _ in layout.columns],
        "datasets": datasets,
        "blocks": blocks,
        "notes": notes,
    }


def _num(x, fmt: str = "{:.1f}") -> str:
    return "-" if x is None or not math.isfinite(float(x)) else fmt.format(x)


def _header(table: dict) -> list[str]:
    if table["layout"] == "full":
        return ["", *(f"{d} {m}" for d, _ in DIRECTIONS for m in ("R@1", "R@5", "R@10", "MedR"))]
    cols = [c for c in table["columns"] if c] or ["R@10"]
    return ["", *(f"{d} {c}" if c != "R@10" else f"{d} R@10" for d, _ in DIRECTIONS for c in cols)]


def _row_cells(table: dict, row: dict, base_row: dict | None) -> list[str]:
    fail = f" ({row['failed']} failed)" if row.get("failed") else ""
    if table["layout"] == "full":
        c = row["cells"].get("")
        out = []
        for d, _ in DIRECTIONS:
            for m in NEWS_METRICS:
                v = None if c is None else c[f"{d}_{m}"]
                sd = c.get(f"{d}_medr_sd") if c is not None and m == "medr" else None
                out.append(_num(v) + (f" ± {_num(sd)}" if sd is not None else ""))
        return [row["method"] + fail, *out]
    out = []
    for d, _ in DIRECTIONS:
        for col in table["columns"]:
            c = row["cells"].get(col)
            v = None if c is None else c[f"{d}_r10"]
            text = _num(v)
            b = base_row["cells"].get(col) if base_row is not None and base_row is not row else None
            if b is not None and v is not None and b.get(f"{d}_r10") is not None:
                text += f" ({v - b[f'{d}_r10']:+.1f})"
            out.append(text if col in row["cells"] else "")
    return [row["method"] + fail, *out]


def format_news_table(table: dict, markdown: bool = False) -> str:
    """The table as text (console) or markdown (the MLflow artifact), in the paper's layout."""
    head = _header(table)
    base_id = next((r for r in LAYOUTS[table["grid"]].rows if r[0] == LAYOUTS[table["grid"]].base_line), None)
    out: list[str] = []
    for block in table["blocks"]:
        base_row = next((r for r in block["rows"] if base_id and r["id"] == base_id[0]), None)
        body = [_row_cells(table, r, base_row) for r in block["rows"]]
        out += block_lines(block["title"], head, body, markdown)
        out.append("")
    out += [f"{'- ' if markdown else ''}{n}" for n in table.get("notes", [])]
    return "\n".join(out).rstrip() + "\n"
