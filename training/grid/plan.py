"""What a grid will run, before Ray or MLflow is touched: the grid spec chosen (rows, b,
repeats), its points per dataset, one trial spec per (dataset, point), the inputs checked,
and Table 2's encoders from a Table 1 grid (``--init-from-grid``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from schemas.errors import MmlinksError
from training.config import TrainConfig
from training.grid.news import LAYOUTS, check_base, news_keys
from training.grid.retrieval import expand_points, method_name, row_key, trial_key
from training.grid.rows import GRIDS, GridSpec, link_row, point_b, point_key, row_name, variant


def dataset_points(spec: GridSpec, base: TrainConfig, data: str) -> tuple[dict, ...]:
    """The points trained on one dataset: the spec's own (linking grids), or its templates with
    one CMCM_c per relation of the dataset and every point repeated over seeds (retrieval)."""
    points = spec.points
    if spec.family == "retrieval":
        from schemas.manifest import Manifest

        points = expand_points(spec.points, base, Manifest.read(data).relations or [], spec.repeats)
    if spec.family == "news":
        points = expand_points(spec.points, base, [], spec.repeats)
    if spec.rows:  # news: a row id keeps every column of it (vse = vse@caption, vse@body, ...)
        points = tuple(
            p for p in points if {(k := _keys(spec, p, base)[1]), k.split("@")[0]} & set(spec.rows)
        )
        if not points:
            raise MmlinksError(f"no point of grid {spec.name} is one of the rows {', '.join(spec.rows)}")
    return points


def _keys(spec: GridSpec, point: dict, base: TrainConfig) -> tuple[str, str, str]:
    """(trial key, row key, row name) of a point."""
    if spec.family == "retrieval":
        return trial_key(point, base), row_key(point, base), method_name(point)
    if spec.family == "news":
        return news_keys(LAYOUTS[spec.name], point, base)
    return point_key(point, base), link_row(point), row_name(variant(point))


def trial_specs(
    spec: GridSpec, base: TrainConfig, datasets: dict[str, str], inits: dict[str, dict] | None = None
) -> list[dict]:
    """One spec per (dataset, point); ``inits``: per dataset, overrides under the point's own
    (Table 2's divide and conquer from a Table 1 grid, ``training/grid/init_grid.py``)."""
    specs = []
    for name, data in datasets.items():
        for point in dataset_points(spec, base, data):
            key, row, method = _keys(spec, point, base)
            specs.append(
                {
                    "dataset": name,
                    "data": data,
                    "key": key,
                    "row": row,
                    "method": method,
                    "overrides": {**spec.base_overrides, **(inits or {}).get(name, {}), **point},
                }
            )
    return specs


def check_inputs(
    spec: GridSpec, base: TrainConfig, datasets: dict[str, str], inits: dict[str, dict] | None = None
) -> dict[str, str]:
    """Refuse a bad grid or dataset before any Ray or MLflow state is created."""
    from schemas.manifest import Manifest

    if not datasets:
        raise MmlinksError("a grid needs at least one dataset (NAME=DIR)")
    if not spec.points:
        raise MmlinksError(f"grid {spec.name} has no points")
    out = {}
    for name, data in datasets.items():
        if not name or not re.fullmatch(r"[\w.+-]+", name):
            raise MmlinksError(f"dataset name {name!r}: use letters, digits, '.', '_', '+' or '-'")
        if "://" not in data:
            if not Path(data).is_dir():
                raise MmlinksError(f"dataset {name}: {data} is not a directory")
            data = str(Path(data).resolve())  # trials run in their own working directories
        Manifest.read(data)
        out[name] = data
        points = dataset_points(spec, base, data)
        if spec.family == "news":
            check_base(spec.name, LAYOUTS[spec.name], base, points)
        for point in points:  # before the keys: a bad objective name is a config error
            init = (inits or {}).get(name, {})
            TrainConfig.from_dict({**base.given_dict(), **spec.base_overrides, **init, **point}).validate()
        keys = [_keys(spec, p, base)[0] for p in points]
        if len(set(keys)) != len(keys):
            raise MmlinksError(
                f"grid {spec.name} repeats a point: {sorted(k for k in keys if keys.count(k) > 1)}"
            )
    return out


def select_spec(
    name: str | GridSpec,
    base_cfg: TrainConfig,
    b_values: Sequence[int] | None,
    rows: Sequence[str] | None = None,
    repeats: int | None = None,
) -> GridSpec:
    spec = GRIDS.get(name) if isinstance(name, str) else name
    if spec is None:
        raise MmlinksError(f"unknown grid {name!r} (one of {', '.join(GRIDS)})")
    if rows:
        spec = replace(spec, rows=tuple(rows))
    if repeats is not None:
        if spec.family not in ("retrieval", "news"):
            raise MmlinksError(f"grid {spec.name} trains each point once (repeats: the retrieval grids)")
        if repeats < 1:
            raise MmlinksError("repeats must be >= 1")
        spec = replace(spec, repeats=repeats)
    if b_values and spec.family in ("retrieval", "news"):
        raise MmlinksError(f"grid {spec.name} has no b (in-batch negatives: the linking grids)")
    if b_values:
        keep = {int(b) for b in b_values}
        spec = replace(spec, points=tuple(p for p in spec.points if point_b(p, base_cfg) in keep))
        if not spec.points:
            raise MmlinksError(f"no point of grid {spec.name} has b in {sorted(keep)}")
    return spec


def ray_storage(storage_path: str | None, base_cfg: TrainConfig, datasets: dict[str, str]) -> str:
    first_data = next(iter(datasets.values()))
    storage = storage_path or base_cfg.storage_path or str(Path(first_data).resolve().parent / "ray_results")
    return storage if "://" in storage else str(Path(storage).resolve())


def grid_inits(spec: GridSpec, base: TrainConfig, datasets, tracking_uri, storage_path, run_id) -> dict:
    """Per dataset, the divide-and-conquer overrides resolved from Table 1's grid ``run_id``
    (none without it); checkpoints are downloaded next to the Ray results."""
    if not run_id or not datasets:  # no dataset: check_inputs says so
        return {}
    if spec.name != "news-table2":
        raise MmlinksError(f"--init-from-grid: only news-table2 loads Table 1's encoders, not {spec.name}")
    if base.init_from:
        raise MmlinksError("give --init-from or --init-from-grid, not both")
    storage = ray_storage(storage_path, base, datasets)
    if "://" in storage:
        raise MmlinksError(
            "--init-from-grid downloads checkpoints next to the Ray results: use a local --storage-path"
        )
    from training.grid.init_grid import table1_encoders

    return table1_encoders(tracking_uri, run_id, datasets, base, Path(storage) / "init-from-grid")
