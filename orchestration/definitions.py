"""The mmlinks Dagster code location (``dagster dev``, or ``dagster api grpc -m
orchestration.definitions``): ``defs``, from the environment's settings and resources; tests call
``build_definitions``. Library logs go to a file before anything imports Beam."""

import dagster as dg

from orchestration.library_logs import route_library_logs

route_library_logs()  # first: the imports below load Beam, which logs its optional-dependency checks

from orchestration.asset_support import source_partitions  # noqa: E402
from orchestration.assets import build_assets  # noqa: E402
from orchestration.automation import build_automation, build_jobs  # noqa: E402
from orchestration.checks import build_checks  # noqa: E402
from orchestration.resources import resources_from_env  # noqa: E402
from orchestration.settings import Settings  # noqa: E402


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
