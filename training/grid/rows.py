"""The grid's rows: the paper's variants of each objective, named from the objective registry.

Hessel et al. 2019 train each objective with a ``table_name`` with mean or hard negatives (TK, AP
also with half k); supplement Tables S1-S4 list ten rows per b, the main Tables 2-3 one variant
each (``ObjectiveSpec.main_negatives``) plus the 1/2 k rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from training.config import TrainConfig
from training.grid.news import LAYOUTS, TITLES, layout_points
from training.grid.retrieval import PAPER_REPEATS, RETRIEVAL_ROWS
from training.objectives.registry import get_objective, objective_names

Variant = tuple[str, str, str]  # (objective, k, negatives)
PAPER_B = (10, 20, 30)


def _paper_objectives() -> list:
    """Hessel et al. 2019's objectives (the retrieval family's table names are Alikhani et al.'s)."""
    specs = [get_objective(o) for o in objective_names()]
    return [s for s in specs if s.table_name and s.family == "link"]


def row_label(v: Variant) -> str:
    """The supplement's row name, e.g. "AP + hard neg + 1/2 k"."""
    o, k, n = v
    name = get_objective(o).table_name if o in objective_names() and get_objective(o).family == "link" else ""
    if not name:
        return "-".join(v)
    return name + (" + hard neg" if n == "hard" else "") + (" + 1/2 k" if k == "half" else "")


def all_rows() -> tuple[tuple[Variant, str], ...]:
    """Every variant of the paper's objectives, in the supplement's row order, with its name
    (TK/AP + 1/2 k with mean negatives is not in the paper's grid; named for custom grids)."""
    out = []
    for spec in _paper_objectives():
        ks = ("full", "half") if spec.uses_k else ("full",)
        out += [((spec.name, k, n), row_label((spec.name, k, n))) for k in ks for n in ("mean", "hard")]
    return tuple(out)


def main_rows() -> tuple[tuple[Variant, str], ...]:
    """The main paper's Tables 2 and 3 (b = 10): which trained variant each printed row is."""
    out = []
    for spec in _paper_objectives():
        out.append(((spec.name, "full", spec.main_negatives), spec.table_name))
        if spec.uses_k:
            out.append(((spec.name, "half", "hard"), "  + 1/2 k"))
    return tuple(out)


def paper_variants() -> tuple[Variant, ...]:
    """The ten trained rows of supplement Tables S1-S4 (each b): 1/2 k only with hard negatives."""
    return tuple(v for v, _ in all_rows() if not (v[1] == "half" and v[2] == "mean"))


MAIN_ROWS = main_rows()
PAPER_VARIANTS = paper_variants()


def paper_points(b_values: Sequence[int] = PAPER_B) -> tuple[dict, ...]:
    """TrainConfig overrides of the paper's grid: ten variants for each b (B = b + 1 documents)."""
    return tuple(
        {"objective": o, "k": k, "negatives": n, "batch_docs": b + 1}
        for b in b_values
        for o, k, n in paper_variants()
    )


@dataclass(frozen=True)
class GridSpec:
    """One paper table: the datasets it reports and the TrainConfig overrides of its grid."""

    name: str
    title: str
    datasets: tuple[str, ...]  # the paper's column order
    points: tuple[dict, ...]  # TrainConfig overrides, one trial per point and dataset
    base_overrides: dict = field(default_factory=dict)  # the table's protocol (e.g. max_tokens)
    main_b: int = 10  # the b of the main-paper table
    # "link" (Hessel et al.'s tables), "retrieval" (Alikhani et al.'s: ``training/grid/retrieval.py``,
    # whose points are templates expanded per dataset and repeated over ``repeats`` seeds) or "news"
    # (Liu et al.'s: ``training/grid/news.py``, each point a (row, column) cell, repeated over seeds)
    family: str = "link"
    repeats: int = 1
    rows: tuple[str, ...] = ()  # only the points of these rows (``row_of``); () = every point


GRIDS: dict[str, GridSpec] = {
    "paper-table2": GridSpec(
        name="paper-table2",
        title="Hessel et al. 2019, Table 2: crowdlabeled datasets",
        datasets=("MSCOCO", "Story-DII", "Story-SIS", "DII-Stress"),
        points=paper_points(),
    ),
    "paper-table3": GridSpec(
        name="paper-table3",
        title="Hessel et al. 2019, Table 3: organically-multimodal datasets",
        datasets=("RQA", "DIY"),
        points=paper_points(),
        base_overrides={"max_tokens": 50},  # Sec. 5: sentences up to 50 tokens for RQA and DIY
    ),
    # Alikhani et al.: one dataset per table; every row 3 times (seeds), MedR with its sd
    "coherence-table4": GridSpec(
        name="coherence-table4",
        title="Alikhani et al., Table 4: text-to-image retrieval on CITE++",
        datasets=("CITE++",),
        points=tuple(p for p, _ in RETRIEVAL_ROWS),
        base_overrides={"max_tokens": 200},  # appendix: length 200 is best for CITE++
        family="retrieval",
        repeats=PAPER_REPEATS,
    ),
    "coherence-table5": GridSpec(
        name="coherence-table5",
        title="Alikhani et al., Table 5: text-to-image retrieval on Clue",
        datasets=("Clue",),
        points=tuple(p for p, _ in RETRIEVAL_ROWS),
        base_overrides={"max_tokens": 40},  # appendix: length 40 for Clue
        family="retrieval",
        repeats=PAPER_REPEATS,
    ),
}
# Liu et al.: the news tables; datasets are the user's (NAME=DIR), one block each
GRIDS.update(
    {
        name: GridSpec(
            name=name,
            title=TITLES[name],
            datasets=(),
            points=layout_points(layout),
            # a trial is one cell of the table, trained as its row says (never the staged recipe)
            base_overrides={"objective": "news", "news_recipe": "joint"},
            family="news",
            repeats=1,
        )
        for name, layout in LAYOUTS.items()
    }
)


def variant(point: dict) -> Variant:
    """(objective, k, negatives) of a grid point; k does not apply to NoStruct and DC."""
    objective = point["objective"]
    uses_k = objective in objective_names() and get_objective(objective).uses_k
    k = point.get("k", "full") if uses_k else "full"
    return objective, k, point.get("negatives", "hard")


def point_b(point: dict, base: TrainConfig) -> int:
    return int(point.get("batch_docs", base.batch_docs)) - 1


def point_key(point: dict, base: TrainConfig) -> str:
    o, k, n = variant(point)
    return f"{o}-{k}-{n}-b{point_b(point, base)}"


def row_name(v: Variant) -> str:
    return row_label(v)


def link_row(point: dict) -> str:
    """The row a linking grid's point fills, without its b: e.g. ap-full-hard."""
    return "-".join(variant(point))
