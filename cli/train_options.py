"""The training flags shared by `train`, `demo` and the grid: generated from ``TrainConfig``."""

from __future__ import annotations

import argparse

from schemas import config_fields


def add_train_args(p, **defaults) -> None:
    """The TrainConfig flags (``defaults``: this command's own, e.g. the demo's 20 epochs)."""
    from training.config import PRESETS, TrainConfig
    from training.objectives.registry import get_objective, objective_names

    config_fields.add_arguments(p, TrainConfig, defaults=defaults)
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="start from a named configuration; flags you give still win. paper = Hessel et al. "
        "2019 as published (GRU final state, checkpoint by validation loss), where mmlinks' defaults "
        "deviate from it for documents with a style of their own (docs/training.md); for cmca, cmcm "
        "and cmcm-c, Alikhani et al. as published instead of their own defaults",
    )
    # the pre-#5 spelling of --objective, still accepted
    p.add_argument(
        "--similarity",
        dest="objective",
        choices=sorted(n for n in objective_names() if get_objective(n).similarity == n),  # dc, tk, ap
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )


def add_registration_args(p) -> None:
    t = p.add_argument_group("MLflow")
    t.add_argument(
        "--model-name",
        help="registered model name (default: mmlinks-OBJECTIVE, e.g. mmlinks-ap; '' = do not register)",
    )
    t.add_argument(
        "--alias",
        default="candidate",
        help="alias for the new version (default: candidate; `mmlinks promote` moves production)",
    )


def demo_workers(args) -> dict:
    """The demos show the Ray Train path: two CPU workers unless ``--workers`` says otherwise
    (``mmlinks train``'s auto trains a one-machine run in its own process)."""
    return {} if hasattr(args, "num_workers") else {"num_workers": 2}


def train_config_from_args(args, **overrides):
    """The TrainConfig that `train`, `demo` and the grid build from their flags."""
    from training.config import TrainConfig, preset_values

    values = {"data": getattr(args, "data", None) or "", "ray_logs": bool(getattr(args, "debug", False))}
    objective = overrides.get("objective") or getattr(args, "objective", None)
    # the preset's values, or the objective's own defaults: under the flags given
    preset = preset_values(getattr(args, "preset", None), objective)
    return TrainConfig(**{**preset, **config_fields.given(args, TrainConfig), **values, **overrides})
