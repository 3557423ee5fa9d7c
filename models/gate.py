"""The promotion gate's thresholds (linking: AUC, p@1, higher is better; retrieval: MedR,
lower is better, and R@10) (``mmlinks promote``, the demo, Dagster's promotion).

Its own module, with no MLflow or torch, so that building the CLI's parser (the gate's flags are
generated from these fields) stays cheap; ``models.registry`` applies it.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.config_fields import option, validate

GATE_GROUP = "promotion gate (metric points, x100 scale)"


@dataclass
class Gate:
    """How much worse than production a candidate may be, in metric points (x100 scale).

    The one definition of the gate's defaults: ``mmlinks promote``, the demo (which loosens it
    by its own command defaults) and the Dagster promotion settings all start from these."""

    max_auc_drop: float = option(
        0.5,
        help="refuse if candidate AUC is more than this below production's "
        "(negative: it must beat production by that much)",
        group=GATE_GROUP,
    )
    max_p_at_1_drop: float = option(
        0.0,
        help="refuse if candidate p@1 is more than this below production's "
        "(negative: it must beat production by that much)",
        flag="--max-p1-drop",
        group=GATE_GROUP,
    )
    min_auc: float = option(
        0.0, help="absolute AUC floor, also applied when there is no production yet", group=GATE_GROUP
    )
    # retrieval models (training/retrieval/): MedR is a rank, lower is better
    max_medr_rise: float = option(
        0.0,
        help="retrieval: refuse if candidate MedR (a rank, lower is better) is more than this above "
        "production's (negative: it must beat production by that much)",
        group=GATE_GROUP,
    )
    max_r10_drop: float = option(
        0.0,
        help="retrieval: refuse if candidate R@10 is more than this below production's",
        group=GATE_GROUP,
    )
    max_medr: float = option(
        0.0,
        help="retrieval: absolute MedR ceiling, also applied when there is no production yet (0: none)",
        at_least=0,
        group=GATE_GROUP,
    )

    # not a threshold: how long a promotion waits for another one of the same model to finish
    # (promotions are serialised by a lock, ``models.registry.PromotionLock``)
    lock_wait_s: float = option(
        120.0,
        help="seconds to wait for another promotion of the same model to finish before giving up "
        "(exit code 75: run it again later)",
        at_least=0,
        group="promotion",
    )

    def __post_init__(self) -> None:
        validate(self, "promotion gate")
