"""The Dagster layer's settings: which sources and objectives exist, and the knobs of each step
(from ``MMLINKS_DAGSTER_CONFIG``, then ``MMLINKS_SOURCES``, ``MMLINKS_OBJECTIVES``,
``MMLINKS_AUTOMATION``; docs/orchestration.md).

Why read and checked once, at load: they shape the asset graph, and a typo then fails
``dagster definitions validate`` instead of a training run hours later. Endpoints are resources;
credentials are in neither."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from schemas.config_fields import from_dict
from schemas.errors import MmlinksError

CONFIG_ENV = "MMLINKS_DAGSTER_CONFIG"
SOURCES_ENV = "MMLINKS_SOURCES"
OBJECTIVES_ENV = "MMLINKS_OBJECTIVES"
AUTOMATION_ENV = "MMLINKS_AUTOMATION"

# What `beam_runner` may set: the runner fields BuildConfig and LinkConfig share.
BEAM_RUNNER_KEYS = ("runner", "dask_address", "dask_workers", "direct_workers", "cpu_threads", "beam_args")

# One registered model per (source, objective); the CLI's single default is "mmlinks-ap".
DEFAULT_OBJECTIVES: dict[str, dict] = {"ap": {"objective": "ap"}, "nostruct": {"objective": "nostruct"}}


@dataclass
class Settings:
    sources: list[str] = field(default_factory=list)  # partitions; empty = every registered source
    objectives: dict[str, dict] = field(default_factory=lambda: json.loads(json.dumps(DEFAULT_OBJECTIVES)))
    train_base: dict = field(default_factory=dict)  # TrainConfig overrides shared by every objective
    train_preset: str = ""  # a training.config.PRESETS name ("paper"), under train_base and the objective's
    build_options: dict[str, dict] = field(default_factory=dict)  # BuildConfig options; "*" = all sources
    raw_inputs: dict[str, str] = field(default_factory=dict)  # source -> input (default ROOT/raw/<source>)
    synthetic: dict = field(default_factory=dict)  # SynthConfig overrides for the synthetic source
    thresholds: dict = field(default_factory=dict)  # orchestration.quality.Thresholds overrides
    gate: dict = field(default_factory=dict)  # models.gate.Gate overrides of its defaults
    promotion_split: str = "test"  # linking models
    retrieval_promotion_split: str = "val"  # retrieval models gate on validation MedR / R@10 (the paper)
    link: dict = field(default_factory=dict)  # linking.config.LinkConfig overrides for linked_<obj>
    # The Beam runner of every Beam job (dataset builds, link jobs), under build_options and link:
    # e.g. {"runner": "dask", "dask_address": "tcp://mmlinks-dask-scheduler:8786"}
    beam_runner: dict = field(default_factory=dict)
    # archive_index_<news objective>: archive.index.KINDS ("ivfpq" for millions of images:
    # compressed, streamed and resumable, memory-mapped when served; issue #38)
    archive_index_kind: str = "flat"
    model_name: str = "mmlinks-{source}-{objective}"
    diy_first_month: str = "2013-01"  # first partition of the monthly r/DIY snapshots (the paper's)
    weekly_cron: str = "0 3 * * 1"  # Mondays 03:00 UTC: incremental DIY crawl, then the rebuild
    max_retries: int = 3  # flaky steps (crawl, builds, cluster jobs): retries with backoff
    retry_delay_s: float = 60.0  # first delay; doubled each retry, +-50 % jitter
    automation_running: bool = False  # schedules and sensors start running (else: turn them on in the UI)

    @classmethod
    def from_dict(cls, data: dict) -> Settings:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise MmlinksError(
                f"unknown Dagster setting(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}"
            )
        settings = cls(**data)
        settings.check()
        return settings

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        data: dict = {}
        path = env.get(CONFIG_ENV, "").strip()
        if path:
            try:
                data = json.loads(Path(path).read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise MmlinksError(f"{CONFIG_ENV}={path}: cannot read the settings: {exc}") from exc
            if not isinstance(data, dict):
                raise MmlinksError(f"{CONFIG_ENV}={path}: the settings must be a JSON object")
        if env.get(SOURCES_ENV, "").strip():
            data["sources"] = [s.strip() for s in env[SOURCES_ENV].split(",") if s.strip()]
        if env.get(OBJECTIVES_ENV, "").strip():
            try:
                data["objectives"] = json.loads(env[OBJECTIVES_ENV])
            except json.JSONDecodeError as exc:
                raise MmlinksError(f"{OBJECTIVES_ENV} is not JSON: {exc}") from exc
        if env.get(AUTOMATION_ENV, "").strip():
            data["automation_running"] = env[AUTOMATION_ENV].strip().lower() in ("1", "true", "yes", "on")
        return cls.from_dict(data)

    def to_dict(self) -> dict:
        return asdict(self)

    def check(self) -> None:
        """Every setting that can be checked without running anything, as one-line errors."""
        from pipelines.sources import source_names
        from training.config import TrainConfig

        known = source_names()
        if not self.sources:
            self.sources = list(known)
        bad = [s for s in self.sources if s not in known]
        if bad:
            raise MmlinksError(
                f"unknown source(s) {', '.join(bad)} in the Dagster settings; known: {', '.join(known)}"
            )
        bad_runner = sorted(set(self.beam_runner) - set(BEAM_RUNNER_KEYS))
        if bad_runner:
            raise MmlinksError(
                f"beam_runner may set {', '.join(BEAM_RUNNER_KEYS)}, not {', '.join(bad_runner)}"
            )
        self.check_build_options()
        if not self.objectives or not isinstance(self.objectives, dict):
            raise MmlinksError(
                "the Dagster settings need at least one objective, e.g. {'ap': {'objective': 'ap'}}"
            )
        train_fields = {f.name for f in fields(TrainConfig)}
        for name, overrides in {"train_base": self.train_base, **self.objectives}.items():
            if not isinstance(overrides, dict):
                raise MmlinksError(
                    f"objective {name!r}: overrides must be a JSON object of TrainConfig fields"
                )
            unknown = sorted(set(overrides) - train_fields)
            if unknown:
                raise MmlinksError(f"{name}: unknown TrainConfig field(s) {', '.join(unknown)}")
        for name in self.objectives:
            if not re.fullmatch(r"[A-Za-z0-9_]+", name):
                raise MmlinksError(f"objective name {name!r}: use letters, digits and '_' (it names assets)")
            self.train_config(name, data="-").validate()
        from models.gate import Gate
        from orchestration.quality import Thresholds

        Thresholds.from_dict(self.thresholds)
        from pipelines.synthetic_corpus import SynthConfig

        from_dict(SynthConfig, self.synthetic, what="synthetic setting")
        from_dict(Gate, self.gate, what="gate")
        self.link_config("-", "-", "-")  # unknown or bad link options fail here
        from archive.index import KINDS

        if self.archive_index_kind not in KINDS:
            raise MmlinksError(
                f"archive_index_kind {self.archive_index_kind!r} in the Dagster settings; "
                f"known: {', '.join(KINDS)}"
            )
        if len(self.diy_first_month) != 7 or self.diy_first_month[4] != "-":
            raise MmlinksError(f"diy_first_month wants YYYY-MM, not {self.diy_first_month!r}")
        if self.max_retries < 0 or self.retry_delay_s < 0:
            raise MmlinksError("max_retries and retry_delay_s must be >= 0")

    def train_config(self, objective: str, data: str, **defaults):
        """TrainConfig: ``defaults`` (cluster facts from resources) < train_preset < train_base <
        the objective's."""
        from training.config import TrainConfig, preset_values

        name = {**self.train_base, **self.objectives[objective]}.get("objective", objective)
        values = {
            **defaults,
            **preset_values(self.train_preset, name),
            **self.train_base,
            **self.objectives[objective],
            "data": data,
        }
        return TrainConfig.from_dict(values)

    def gate_config(self):
        from models.gate import Gate

        return Gate(**self.gate)  # Gate's own defaults, as `mmlinks promote`

    def link_config(self, data: str, model: str, out: str, **defaults):
        """LinkConfig for linked_<obj>: ``defaults`` (resources) < the ``link`` settings."""
        from linking.config import LinkConfig

        fixed = {"data": data, "model": model, "out": out}
        bad = sorted(set(self.link) & set(fixed))
        if bad:
            raise MmlinksError(f"link settings may not set {', '.join(bad)}: the assets choose them")
        options = {**defaults, **self.beam_runner, **self.link, **fixed}
        return from_dict(LinkConfig, options, what="link setting")

    def thresholds_config(self):
        from orchestration.quality import Thresholds

        return Thresholds.from_dict(self.thresholds)

    def family(self, objective: str) -> str:
        """ "link" or "retrieval": the family of the objective an objective entry trains."""
        from training.objectives.registry import get_objective

        return get_objective(self.train_config(objective, data="-").objective).family

    def link_objectives(self) -> list[str]:
        """The entries whose models link documents (they get ``linked_<obj>``; retrieval models
        rank images for a text and have no link job)."""
        return [o for o in self.objectives if self.family(o) == "link"]

    def split_for(self, objective: str) -> str:
        """The split an objective's evaluation and promotion score on."""
        return (
            self.retrieval_promotion_split if self.family(objective) == "retrieval" else self.promotion_split
        )

    def registered_model_name(self, source: str, objective: str) -> str:
        return self.model_name.format(source=source, objective=objective)

    def check_build_options(self) -> None:
        """Each source's build options make a valid BuildConfig (so a typo or a null threshold
        fails `dagster definitions validate`, not a build hours later)."""
        from pipelines.build_config import BuildConfig
        from pipelines.sources import source_names

        bad = sorted(set(self.build_options) - {"*", *source_names()})
        if bad:
            raise MmlinksError(f"build_options for unknown source(s) {', '.join(bad)}")
        for source in self.sources:
            try:
                BuildConfig.for_source(source, "-", "-", **self.build_config_options(source))
            except MmlinksError as exc:
                raise MmlinksError(f"build_options for {source}: {exc}") from exc

    def build_config_options(self, source: str) -> dict:
        return {**self.beam_runner, **self.build_options.get("*", {}), **self.build_options.get(source, {})}
