"""Alikhani et al.'s Tables 4 (CITE++) and 5 (Clue) as a grid: the retrieval family's rows, one
trial per model and seed, printed in the paper's layout (docs/retrieval-news.md).

CMCM_c's rows come from the manifest's relations (``"relation": "*"``); a cell is the mean over
seeds, MedR's "±" their sample standard deviation (ddof 1). The "+ SSR" rows need no trial:
refinement is applied at inference to every CAM model's trial."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from schemas.errors import MmlinksError
from training.config import TrainConfig
from training.grid.layout import block_lines
from training.grid.results import TrialResult
from training.objectives.registry import get_objective, objective_names

RETRIEVAL_METRICS = ("medr", "r1", "r5", "r10")


def retrieval_paper_points() -> tuple[dict, ...]:
    """Alikhani et al.'s rows (Tables 4 and 5) as template points (the Hessel grid's are
    ``training.grid.rows.paper_points``), from the objective registry: every retrieval
    objective with a table name, in registration order, after its ablation rows
    (``ObjectiveSpec.ablations``); a per-relation objective's point has ``"relation": "*"``, one
    point per relation of the dataset (``expand_points``)."""
    out = []
    for spec in (get_objective(o) for o in objective_names()):
        if spec.family != "retrieval" or not spec.table_name:
            continue
        point = {"objective": spec.name, **({"relation": "*"} if spec.per_relation else {})}
        out += [{**point, **ablation} for ablation in spec.ablations] + [point]
    return tuple(out)


RETRIEVAL_POINTS = retrieval_paper_points()  # what GRIDS holds (built at import, like every grid)
# the test results' refined variants: (key in ``evaluate_pairs``' output, flat prefix, row suffix)
REFINED = (("t2i_refined", "ssr", " + SSR"), ("t2i_refined_tuned", "ssr_tuned", " + SSR (val-tuned)"))
PAPER_REPEATS = 3


def expand_points(points: Sequence[dict], base: TrainConfig, relations: Sequence[str], repeats: int) -> tuple:
    """The trained points of one dataset: ``"relation": "*"`` becomes one point per relation of
    ``relations`` (the dataset's vocabulary), and every point one per seed (base.seed + r)."""
    if repeats < 1:
        raise MmlinksError("repeats must be >= 1")
    out = []
    for point in points:
        if point.get("relation") == "*":
            if not relations:
                raise MmlinksError(
                    f"the {point['objective']} rows need a coherence-labelled pair dataset (a manifest "
                    "with 'relations'); build one from `mmlinks data synth-coherence`"
                )
            concrete = [{**point, "relation": r} for r in relations]
        else:
            concrete = [dict(point)]
        out += [{**p, "seed": base.seed + r} for p in concrete for r in range(repeats)]
    return tuple(out)


def _config(point: dict, base: TrainConfig) -> TrainConfig:
    return TrainConfig.from_dict({**base.given_dict(), **point})


def row_key(point: dict, base: TrainConfig) -> str:
    """The model a point trains, without its seed (the registry's run label), e.g. cmcm-c-Action."""
    cfg = _config(point, base)
    return get_objective(cfg.objective).label(cfg)


def trial_key(point: dict, base: TrainConfig) -> str:
    return f"{row_key(point, base)}-s{point.get('seed', base.seed)}"


def method_name(point: dict) -> str:
    """The paper's row name of a point: CMCA, CMCM-NoAttn, CMCM, CMCM_Action, ... (the objective's
    ``ObjectiveSpec.table_name``, its relation for a per-relation objective; the objective's own
    name when it is not one of Alikhani et al.'s)."""
    o = point["objective"]
    spec = get_objective(o) if o in objective_names() else None
    if spec is None or spec.family != "retrieval":
        spec = None
    name = (spec.table_name if spec else "") or o
    if spec is not None and spec.per_relation:
        return f"{name}_{point.get('relation', '')}"
    pooling = point.get("retrieval_pooling", "attention")
    return name if pooling == "attention" else f"{name}-NoAttn"


# (template point, the paper's row name; "{relation}" is filled per relation of the dataset)
RETRIEVAL_ROWS: tuple[tuple[dict, str], ...] = tuple(
    (p, method_name({**p, "relation": "{relation}"} if p.get("relation") == "*" else p))
    for p in RETRIEVAL_POINTS
)


def flat_test_metrics(test: dict | None) -> dict:
    """``evaluate_pairs``' nested test results as the flat scalars a Tune trial reports
    (test_medr, test_r10, test_ssr_medr, test_ssr_tuned_lambda, ...)."""
    test = test or {}
    out = {f"test_{k}": test.get("t2i", {}).get(k) for k in (*RETRIEVAL_METRICS, "medr_std")}
    out["test_i2t_medr"] = test.get("i2t", {}).get("medr")
    out["test_pairs"] = test.get("pairs")
    for key, prefix, _ in REFINED:
        if key in test:
            out.update({f"test_{prefix}_{k}": test[key].get(k) for k in RETRIEVAL_METRICS})
            if "refine_lambda" in test[key]:
                out[f"test_{prefix}_lambda"] = test[key]["refine_lambda"]
                out[f"test_{prefix}_threshold"] = test[key]["refine_threshold"]
    return out


def _finite(values) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def _summary(trials: list[TrialResult], prefix: str = "") -> dict | None:
    """Mean of each metric over the repeats, the MedR's sample standard deviation over them."""
    ok = [t for t in trials if t.status == "ok" and t.test.get(f"{prefix}medr") is not None]
    if not ok:
        return None
    cell: dict = {"repeats": len(ok), "seeds": [t.seed for t in ok], "run_ids": [t.run_id for t in ok]}
    for k in RETRIEVAL_METRICS:
        vals = _finite(t.test.get(f"{prefix}{k}") for t in ok)
        cell[k] = statistics.fmean(vals) if vals else None
    medrs = _finite(t.test.get(f"{prefix}medr") for t in ok)
    cell["medr_sd"] = statistics.stdev(medrs) if len(medrs) > 1 else None
    if prefix and ok[0].test.get(f"{prefix}lambda") is not None:
        cell["refine"] = [(t.test.get(f"{prefix}lambda"), t.test.get(f"{prefix}threshold")) for t in ok]
    return cell


def build_retrieval_table(spec, trials: list[TrialResult]) -> dict:
    """Tables 4 / 5 as data: one block per dataset, the rows in the paper's order (a "+ SSR" and
    a "+ SSR (val-tuned)" row after each CAM model), failed repeats counted per row."""
    names = list(dict.fromkeys(t.dataset for t in trials))
    columns = [d for d in spec.datasets if d in names] + [d for d in names if d not in spec.datasets]
    blocks = []
    for d in columns:
        mine = [t for t in trials if t.dataset == d]
        groups: dict[str, list[TrialResult]] = {}
        for t in mine:
            groups.setdefault(t.row or t.key, []).append(t)
        rows = []
        for key, group in groups.items():
            failed = [t for t in group if t.status != "ok"]
            base_row = {
                "method": group[0].method,
                "key": key,
                "cell": _summary(group),
                "failed": len(failed),
                "errors": sorted({t.error for t in failed}),
            }
            rows.append(base_row)
            for _, prefix, suffix in REFINED:  # only CAM models report refined metrics
                cell = _summary(group, f"{prefix}_")
                if cell is not None:
                    rows.append({"method": group[0].method + suffix, "key": key + suffix, "cell": cell})
        # the paper's title on its own dataset; otherwise say which data fills the layout
        own = columns == [d] and d in spec.datasets
        title = spec.title if own else f"{spec.title.split(':')[0]} layout, on {d}"
        blocks.append({"title": title, "dataset": d, "rows": rows})
    return {
        "grid": spec.name,
        "family": "retrieval",
        "title": spec.title,
        "datasets": columns,
        "metrics": list(RETRIEVAL_METRICS),
        "blocks": blocks,
        "notes": [
            "text -> image on the test split; MedR in candidates (1 = first), R@K in %; pools of "
            "pool_size candidates averaged over n_pools random pools (docs/evaluation.md, Retrieval)",
            "each cell: mean over the repeats (seeds); MedR ± their sample standard deviation; "
            "each run's checkpoint is its best-validation-MedR epoch",
            "+ SSR: selective similarity refinement with the configured lambda and T; "
            "(val-tuned): lambda and T chosen on validation; CMCA has no CAM to refine with",
            "the paper's Base row has no counterpart here",
        ],
    }


def _num(x, fmt: str = "{:.1f}") -> str:
    return "-" if x is None or not math.isfinite(float(x)) else fmt.format(x)


def _row_text(row: dict) -> list[str]:
    c = row["cell"]
    fail = f" ({row['failed']} failed)" if row.get("failed") else ""
    if c is None:
        return [row["method"] + fail, "failed", "", "", "", ""]
    sd = f" ± {_num(c['medr_sd'], '{:.2f}')}" if c.get("medr_sd") is not None else ""
    medr = _num(c["medr"], "{:.2f}") + sd
    return [row["method"] + fail, medr, *(_num(c[k]) for k in ("r1", "r5", "r10")), str(c["repeats"])]


def format_retrieval_table(table: dict, markdown: bool = False) -> str:
    """Tables 4 / 5 as text (console) or markdown (the MLflow artifact)."""
    head = ["", "MedR↓", "R@1↑", "R@5↑", "R@10↑", "repeats"]
    out: list[str] = []
    for block in table["blocks"]:
        body = [_row_text(r) for r in block["rows"]]
        out += block_lines(block["title"], head, body, markdown)
        out.append("")
    out += [f"{'- ' if markdown else ''}{n}" for n in table.get("notes", [])]
    return "\n".join(out).rstrip() + "\n"
