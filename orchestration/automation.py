"""Jobs, the weekly schedule and the sensors that chain them (docs/orchestration.md, "Automation").

Why a sensor waits for the run to finish: a dataset whose checks are running is not trained on,
one whose checks failed never is; run keys carry versions, so none is trained or promoted twice."""

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from orchestration.asset_support import DIY, EVALUATION, MODEL, PRODUCTION, objective_key, objective_of
from orchestration.news_assets import served_objectives, serving_key
from orchestration.settings import Settings

FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def build_jobs(settings: Settings) -> dict[str, Any]:
    objectives = list(settings.objectives)
    served = served_objectives(settings)
    return {
        "diy_crawl_job": dg.define_asset_job(
            "diy_crawl_job",
            selection=dg.AssetSelection.assets("diy_submissions"),
            description="One month of r/DIY: the dump (historical months, backfills) or the incremental "
            "crawl (the current month).",
        ),
        "rebuild_job": dg.define_asset_job(
            "rebuild_job",
            selection=dg.AssetSelection.assets("raw_snapshot", "dataset"),
            description="Snapshot a source's raw input, build its dataset version with Beam, check it.",
        ),
        "train_job": dg.define_asset_job(
            "train_job",
            selection=dg.AssetSelection.assets(
                *[objective_key(MODEL, o) for o in objectives],
                *[objective_key(EVALUATION, o) for o in objectives],
            ),
            description="Train and evaluate every configured objective on a source's current dataset.",
        ),
        "link_job": dg.define_asset_job(
            "link_job",
            selection=dg.AssetSelection.assets(*[serving_key(settings, o) for o in served]),
            description="Link every document of a source's current dataset with each objective's "
            "production model (news objectives: rebuild its image archive index).",
        ),
        "promote_job": dg.define_asset_job(
            "promote_job",
            selection=dg.AssetSelection.assets(*[objective_key(PRODUCTION, o) for o in objectives]),
            description="Move 'production' to each objective's candidate if models.registry's gate passes.",
        ),
    }


def current_month(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m")


def _status(settings: Settings) -> dg.DefaultScheduleStatus:
    return (
        dg.DefaultScheduleStatus.RUNNING if settings.automation_running else dg.DefaultScheduleStatus.STOPPED
    )


def _sensor_status(settings: Settings) -> dg.DefaultSensorStatus:
    return dg.DefaultSensorStatus.RUNNING if settings.automation_running else dg.DefaultSensorStatus.STOPPED


def _finished_materializations(
    context: dg.SensorEvaluationContext, keys: Iterable[dg.AssetKey]
) -> tuple[list, int, str | None]:
    """New materializations of ``keys`` in storage order, up to the first whose run is still
    going; returns (records with their run's status, the new cursor, why it stopped early)."""
    after = int(context.cursor or 0)
    records = []
    for key in keys:
        result = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, after_storage_id=after), limit=500, ascending=True
        )
        records.extend(result.records)
    records.sort(key=lambda r: r.storage_id)
    done, cursor, waiting = [], after, None
    for record in records:
        run = context.instance.get_run_by_id(record.run_id)
        if run is not None and run.status not in FINISHED:
            asset = record.asset_key.to_user_string()
            waiting = f"run {record.run_id[:8]} that materialized {asset} is still going"
            break
        done.append((record, run.status if run is not None else None))
        cursor = record.storage_id
    return done, cursor, waiting


def checks_passed(instance: dg.DagsterInstance, record, check_names: list[str]) -> tuple[bool, str]:
    """Whether every named check of the materialized asset passed for that partition in that run
    (a run holds several assets: its overall status would let one objective's failure hold back
    another's promotion, or a failed step elsewhere hide a good dataset)."""
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

    for name in check_names:
        key = dg.AssetCheckKey(record.asset_key, name)
        history = instance.event_log_storage.get_asset_check_execution_history(key, limit=50)
        mine = [h for h in history if h.run_id == record.run_id and h.partition == record.partition_key]
        if not mine:
            return False, f"check {name} did not run"
        if mine[0].status != AssetCheckExecutionRecordStatus.SUCCEEDED:
            return False, f"check {name} {mine[0].status.value.lower()}"
    return True, "all checks passed"


def _version(record) -> str:
    mat = record.asset_materialization
    meta = mat.metadata if mat is not None else {}
    value = meta.get("dataset_version") or meta.get("model_version")
    return str(getattr(value, "value", value) or record.storage_id)


def build_automation(
    settings: Settings, jobs: dict[str, Any]
) -> tuple[list[dg.ScheduleDefinition], list[dg.SensorDefinition]]:
    schedules, sensors = [], []
    objectives = list(settings.objectives)

    if DIY in settings.sources:
        crawl, rebuild = _diy_automation(settings, jobs)
        schedules.append(crawl)
        sensors.append(rebuild)

    from orchestration.quality import DATASET_CHECKS

    sensors.append(
        _chain_sensor(
            settings,
            name="training_sensor",
            job=jobs["train_job"],
            watched={dg.AssetKey("dataset"): list(DATASET_CHECKS)},
            request=lambda record: dg.RunRequest(
                run_key=f"train-{record.partition_key}-{_version(record)}",
                partition_key=record.partition_key,
                tags={"mmlinks/dataset_version": _version(record)},
            ),
            description="Train the configured objectives ("
            + ", ".join(objectives)
            + ") when a new dataset version lands in a run whose checks passed.",
        )
    )
    sensors.append(
        _chain_sensor(
            settings,
            name="promotion_sensor",
            job=jobs["promote_job"],
            watched={objective_key(EVALUATION, o): ["metrics_above_floor"] for o in objectives},
            request=lambda record: dg.RunRequest(
                run_key=f"promote-{objective_of(record.asset_key, EVALUATION)}-{record.partition_key}-"
                f"{_version(record)}",
                partition_key=record.partition_key,
                asset_selection=[objective_key(PRODUCTION, objective_of(record.asset_key, EVALUATION))],
                tags={"mmlinks/model_version": _version(record)},
            ),
            description="Promote a candidate through the registry's gate once its evaluation passed.",
        )
    )
    sensors.append(_linking_sensor(settings, jobs["link_job"]))
    return schedules, sensors


def _linking_sensor(settings: Settings, job) -> dg.SensorDefinition:
    """Polls what linked_<obj> depends on: each source's dataset version (its manifest) and each
    objective's production version (the registry alias, which promotion and rollback move).
    The cursor remembers the pair last asked for, per (objective, source)."""
    import json

    from orchestration.resources import MlflowResource, StorageResource

    @dg.sensor(
        name="linking_sensor",
        job=job,
        minimum_interval_seconds=120,
        default_status=_sensor_status(settings),
        description="Link a source again when a new dataset version lands or an objective's "
        "'production' alias moves (promotion, rollback).",
    )
    def linking_sensor(context: dg.SensorEvaluationContext, storage: StorageResource, mlflow: MlflowResource):
        from orchestration.asset_support import alias_version
        from schemas.errors import MmlinksError
        from schemas.manifest import Manifest

        seen = json.loads(context.cursor) if context.cursor else {}
        client = mlflow.client()
        requests = []
        for source in settings.sources:
            try:
                dataset_version = Manifest.read(storage.dataset_path(source)).dataset_version
            except MmlinksError:
                continue  # no dataset yet
            for objective in served_objectives(settings):
                version = alias_version(
                    client, settings.registered_model_name(source, objective), "production"
                )
                state = f"{version}@{dataset_version}"
                key = f"{objective}/{source}"
                if version is None or seen.get(key) == state:
                    continue
                seen[key] = state
                requests.append(
                    dg.RunRequest(
                        run_key=f"link-{objective}-{source}-{state}",
                        partition_key=source,
                        asset_selection=[serving_key(settings, objective)],
                        tags={"mmlinks/model_version": version, "mmlinks/dataset_version": dataset_version},
                    )
                )
        cursor = json.dumps(seen, sort_keys=True)
        if not requests:
            return dg.SensorResult(skip_reason="no dataset version or production alias moved", cursor=cursor)
        return dg.SensorResult(run_requests=requests, cursor=cursor)

    return linking_sensor


def _diy_automation(settings: Settings, jobs: dict[str, Any]):
    """The weekly crawl of r/DIY and the sensor that rebuilds the diy dataset after it."""

    @dg.schedule(
        name="weekly_diy_crawl",
        cron_schedule=settings.weekly_cron,
        job=jobs["diy_crawl_job"],
        execution_timezone="UTC",
        default_status=_status(settings),
        description="Weekly: crawl new r/DIY posts into the current month; diy_rebuild_sensor then "
        "rebuilds the diy dataset, and training_sensor trains on the new version.",
    )
    def weekly_diy_crawl(context: dg.ScheduleEvaluationContext):
        month = current_month(context.scheduled_execution_time or datetime.now(UTC))
        stamp = (context.scheduled_execution_time or datetime.now(UTC)).strftime("%Y%m%dT%H%M")
        return dg.RunRequest(
            run_key=f"diy-crawl-{stamp}", partition_key=month, tags={"mmlinks/trigger": "weekly"}
        )

    @dg.sensor(
        name="diy_rebuild_sensor",
        job=jobs["rebuild_job"],
        minimum_interval_seconds=120,
        default_status=_sensor_status(settings),
        description="Rebuild the diy dataset once new r/DIY months have landed and no crawl run or "
        "diy_submissions backfill is still adding to them.",
    )
    def diy_rebuild_sensor(context: dg.SensorEvaluationContext):
        busy = context.instance.get_runs(dg.RunsFilter(job_name="diy_crawl_job", statuses=IN_FLIGHT), limit=1)
        if busy:
            return dg.SkipReason("a diy_crawl_job run is still going")
        from dagster._core.execution.backfill import BulkActionStatus  # not re-exported by dagster

        for backfill in context.instance.get_backfills(status=BulkActionStatus.REQUESTED):
            if dg.AssetKey("diy_submissions") in (backfill.asset_selection or []) or (
                backfill.job_name == "diy_crawl_job"
            ):
                return dg.SkipReason(f"backfill {backfill.backfill_id} of diy_submissions is still going")
        done, cursor, waiting = _finished_materializations(context, [dg.AssetKey("diy_submissions")])
        landed = [r for r, status in done if status == dg.DagsterRunStatus.SUCCESS]
        if not landed:
            return dg.SensorResult(skip_reason=waiting or "no new r/DIY month", cursor=str(cursor))
        months = sorted({r.partition_key for r in landed if r.partition_key})
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(
                    run_key=f"diy-rebuild-{landed[-1].storage_id}",
                    partition_key=DIY,
                    tags={"mmlinks/months": ",".join(months)[:200]},
                )
            ],
            cursor=str(cursor),
        )

    return weekly_diy_crawl, diy_rebuild_sensor


def _chain_sensor(
    settings: Settings,
    *,
    name: str,
    job,
    watched: dict[dg.AssetKey, list[str]],
    request: Callable,
    description: str,
) -> dg.SensorDefinition:
    @dg.sensor(
        name=name,
        job=job,
        minimum_interval_seconds=60,
        default_status=_sensor_status(settings),
        description=description,
    )
    def chain(context: dg.SensorEvaluationContext):
        done, cursor, waiting = _finished_materializations(context, list(watched))
        requests = []
        for record, _status in done:
            ok, why = checks_passed(context.instance, record, watched[record.asset_key])
            if not ok:
                context.log.info(
                    f"not acting on {record.asset_key.to_user_string()}[{record.partition_key}] of run "
                    f"{record.run_id[:8]}: {why}"
                )
                continue
            if record.partition_key:
                requests.append(request(record))
        if not requests:
            return dg.SensorResult(skip_reason=waiting or "nothing new", cursor=str(cursor))
        return dg.SensorResult(run_requests=requests, cursor=str(cursor))

    return chain
