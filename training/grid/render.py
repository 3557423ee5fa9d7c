"""The grid's table in the paper's layout: as data (``build_table``) and as text or markdown
(``format_table``)."""

from __future__ import annotations

import math
import re

from training.config import TrainConfig
from training.grid.news import build_news_table, format_news_table
from training.grid.results import METRICS, GridResult, TrialResult
from training.grid.retrieval import build_retrieval_table, format_retrieval_table
from training.grid.rows import GridSpec, all_rows, main_rows


def _metrics_cell(values: dict | None) -> dict | None:
    return None if values is None else {**{k: values.get(k) for k in METRICS}, "run_id": None}


def _cell(t: TrialResult | None, source: str = "test") -> dict | None:
    if t is None:
        return None
    if t.status != "ok":
        return {"error": t.error, "run_id": t.run_id}
    values = t.test if source == "test" else t.random
    return {**{k: values.get(k) for k in METRICS}, "run_id": t.run_id if source == "test" else None}


def build_table(
    spec: GridSpec,
    trials: list[TrialResult],
    base: TrainConfig,
    baselines: dict[str, dict[str, dict]] | None = None,
) -> dict:
    """The paper's layout as data: the main-paper block (b = spec.main_b) when its rows were
    run, then one block per b with every variant (the supplement's Tables S1-S4 layout)."""
    if spec.family == "retrieval":  # Alikhani et al.'s Tables 4 / 5
        return build_retrieval_table(spec, trials)
    if spec.family == "news":  # Liu et al.'s Tables 1-4
        return build_news_table(spec, trials, base)
    names = list(dict.fromkeys(t.dataset for t in trials))
    paper = [d for d in spec.datasets if d in names]
    columns = paper + [d for d in names if d not in paper]
    cell = {(t.dataset, t.key): t for t in trials}
    random: dict[str, dict | None] = {}
    for d in columns:  # the random baseline depends only on the test split and the seed
        ok = next((t for t in trials if t.dataset == d and t.status == "ok"), None)
        random[d] = _cell(ok, "random")
    b_values = sorted({t.b for t in trials})

    def rows_for(b: int, layout) -> list[dict]:
        rows = [{"method": "Random", "key": "random", "cells": dict(random)}]
        for method, values in (baselines or {}).items():
            cells = {d: _metrics_cell(values.get(d)) for d in columns}
            rows.append({"method": method, "key": re.sub(r"\W+", "-", method.lower()), "cells": cells})
        for v, label in layout:
            key = f"{v[0]}-{v[1]}-{v[2]}-b{b}"
            if not any((d, key) in cell for d in columns):
                continue
            rows.append(
                {"method": label, "key": key, "cells": {d: _cell(cell.get((d, key))) for d in columns}}
            )
        return rows

    blocks = []
    if spec.main_b in b_values:
        rows = rows_for(spec.main_b, main_rows())
        if len(rows) > 1:
            blocks.append(
                {
                    "title": f"{spec.title} (b = {spec.main_b}; main-paper rows)",
                    "b": spec.main_b,
                    "layout": "main",
                    "rows": rows,
                }
            )
    for b in b_values:
        blocks.append(
            {
                "title": f"All configurations, b = {b} (supplement layout, cf. Tables S1-S4)",
                "b": b,
                "layout": "all",
                "rows": rows_for(b, all_rows()),
            }
        )
    return {
        "grid": spec.name,
        "title": spec.title,
        "datasets": columns,
        "metrics": list(METRICS),
        "blocks": blocks,
        "notes": [
            "test-set macro averages x100; each run's checkpoint is its lowest-validation-loss epoch",
            *(
                []
                if "Obj Detect" in (baselines or {})
                else ["Obj Detect (paper row) is not part of this grid"]
            ),
        ],
    }


def _fmt(x) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.1f}"


def _cells_text(c: dict | None) -> tuple[str, str]:
    if c is None:
        return "", ""
    if "error" in c:
        return "failed", ""
    return _fmt(c.get("auc")), f"{_fmt(c.get('p_at_1'))}/{_fmt(c.get('p_at_5'))}"


def format_table(result: GridResult | dict, markdown: bool = False) -> str:
    """The table in the paper's layout: per dataset "AUC" and "p@1/p@5" columns, one row per
    method; plain text for the console, or markdown for the MLflow artifact."""
    table = result.table if isinstance(result, GridResult) else result.get("table", result)
    if table.get("family") == "retrieval":
        return format_retrieval_table(table, markdown)
    if table.get("family") == "news":
        return format_news_table(table, markdown)
    columns = table["datasets"]
    out: list[str] = []
    for block in table["blocks"]:
        header1 = ["", *[x for d in columns for x in (d, "")]]
        header2 = ["method", *["AUC", "p@1/p@5"] * len(columns)]
        body = [
            [row["method"], *[x for d in columns for x in _cells_text(row["cells"].get(d))]]
            for row in block["rows"]
        ]
        if markdown:
            out.append(f"### {block['title']}\n")
            head = ["method", *[f"{d} {m}" for d in columns for m in ("AUC", "p@1/p@5")]]
            out.append("| " + " | ".join(head) + " |")
            out.append("|" + "---|" * len(head))
            out += ["| " + " | ".join(r) + " |" for r in body]
        else:
            out.append(block["title"])
            widths = [max(len(r[i]) for r in [header2, *body]) for i in range(len(header2))]
            for i in range(1, len(header1), 2):  # a dataset name spans its two columns
                span = widths[i] + 2 + widths[i + 1]
                if len(header1[i]) > span:
                    widths[i + 1] += len(header1[i]) - span
            line1 = widths[0] * " "
            for i in range(1, len(header1), 2):
                line1 += "  " + header1[i].ljust(widths[i] + 2 + widths[i + 1])
            out.append(line1.rstrip())
            rule = ["-" * w for w in widths]
            for r in [header2, rule, *body]:
                cells = [r[0].ljust(widths[0])] + [
                    r[i].rjust(widths[i]) if i % 2 else r[i].ljust(widths[i]) for i in range(1, len(r))
                ]
                out.append("  ".join(cells).rstrip())
        out.append("")
    out += [f"{'- ' if markdown else ''}{n}" for n in table.get("notes", [])]
    return "\n".join(out).rstrip() + "\n"
