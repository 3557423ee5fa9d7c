"""The news family's part of a run's end (the retrieval family's run finish ends a news run,
through the core's hooks: ``training.family_hooks``, ``BackboneSpec.run_warnings``): the
warning about training texts cut by ``--news-max-tokens``. (The "news-archive" packaging of the
run is ``models/``'s: ``models.experiment``.)"""

from __future__ import annotations

import mlflow


def cut_warnings(model) -> list[str]:
    """A news model's count of training texts cut by ``--news-max-tokens`` (issue #34): logged as
    metrics ``news_cut_<source>`` and, if any was cut, as the run's warning tag; [] otherwise."""
    truncated = getattr(getattr(model, "cfg", None), "truncated", None)
    if not truncated:
        return []
    from training.news.objective import truncation_warning

    mlflow.log_metrics({f"news_cut_{name}": n for name, (n, _) in truncated.items()})
    warning = truncation_warning(truncated)
    if warning:
        mlflow.set_tag("mmlinks.warning", warning)
    return [warning] if warning else []
