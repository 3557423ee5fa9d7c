"""The asset graph (docs/orchestration.md, "Asset graph"): raw snapshots -> dataset versions ->
models -> evaluations -> the production alias, then linked corpora and news archives.

Each asset calls what the CLI calls and returns a small dict pointing at the data. Why two kinds
of failure: expected ones raise ``dg.Failure`` with the one-line cause and no retry; flaky ones
(networks, the cluster) are retried by the step's RetryPolicy."""

import dagster as dg

from orchestration.asset_support import month_partitions, retry_policy, source_partitions
from orchestration.data_assets import data_assets
from orchestration.link_assets import linked_asset
from orchestration.model_assets import objective_assets
from orchestration.news_assets import archive_index_asset, is_news_objective
from orchestration.settings import Settings


def build_assets(settings: Settings) -> list[dg.AssetsDefinition]:
    sources = source_partitions(settings)
    out = data_assets(settings, sources, month_partitions(settings), retry_policy(settings))
    for objective in settings.objectives:
        out += objective_assets(settings, objective, sources, retry_policy(settings))
    for objective in settings.link_objectives():  # coherence retrieval models have no link job
        out.append(linked_asset(settings, objective, sources, retry_policy(settings)))
    for objective in settings.objectives:
        if is_news_objective(settings, objective):  # ranks an archive's images; links nothing
            out.append(archive_index_asset(settings, objective, sources, retry_policy(settings)))
    return out
