"""The mmlinks Dagster code location: ``dagster dev`` (pyproject [tool.dagster]) and the
Kubernetes code-location pod (``dagster api grpc -m orchestration.definitions``) load ``defs``.

Settings come from the environment when the module loads (``orchestration/settings.py``),
resources too (``orchestration/resources.py``); tests call ``build_definitions`` with their own.
"""

import dagster as dg

from orchestration.asset_support import source_partitions
from orchestration.assets import build_assets
from orchestration.automation import build_automation, build_jobs
from orchestration.checks import build_checks
from orchestration.resources import resources_from_env
from orchestration.settings import Settings


def build_definitions(settings: Settings | None = None, resources: dict | None = None) -> dg.Definitions:
    settings = settings or Settings.from_env()
    assets = build_assets(settings)
    checks = build_checks(settings, source_partitions(settings))
    jobs = build_jobs(settings)
    schedules, sensors = build_automation(settings, jobs)
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=list(jobs.values()),
        schedules=schedules,
        sensors=sensors,
        resources={**resources_from_env(), **(resources or {})},
    )


defs = build_definitions()
