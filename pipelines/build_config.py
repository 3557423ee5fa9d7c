"""What a dataset build is asked to do: :class:`BuildConfig`, its source defaults and its checks.

``params()`` is the part of the config that defines the dataset version (paths, runner and
batching do not); ``check()`` raises every option error before a folder is created.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import asdict, dataclass

from features.registry import (
    DEFAULT_EXTRACTOR,
    describe_extractors,
    global_extractor_names,
    region_extractor_names,
)
from pipelines import fileio
from pipelines.filters import PRESETS, DocumentFilter, filter_for
from pipelines.image_store import Placeholders
from pipelines.runners import (
    BeamJob,
    dask_address_option,
    dask_workers_option,
    device_option,
    direct_workers_option,
    known_or_as_given,
    runner_option,
)
from pipelines.sources import SourceContext, SourceSpec, get_spec, source_names
from pipelines.splits import DEFAULT_RATIOS, parse_split_sizes
from schemas.config_fields import OFF, from_dict, int_or_off, is_int_or_off, option, validate
from schemas.document import FEATURE_DTYPES
from schemas.errors import MmlinksError

# Options given as KEY=VALUE maps: what the user says is laid over the source's defaults.
MERGED_OPTIONS = ("filter_options", "source_options", "extractor_options", "region_options")
NONE = "none"  # --regions none: no region features
FEATURES, DOCUMENTS, SHARDS = "features", "documents", "shards and runner"


def _ratios(text: str) -> dict[str, float]:
    try:
        values = [float(v) for v in str(text).split(",")]
    except ValueError:
        raise MmlinksError(f"--split wants three numbers like 0.8,0.1,0.1, not {text!r}") from None
    if len(values) != 3 or min(values) < 0 or sum(values) <= 0:
        raise MmlinksError(f"--split wants three non-negative numbers with a positive sum, not {text!r}")
    return dict(zip(("train", "val", "test"), values, strict=True))


def _ratios_ok(r: dict) -> bool:
    return bool(r) and min(r.values()) >= 0 and sum(r.values()) > 0


@dataclass
class BuildConfig(BeamJob):
    """Every option of a dataset build (the `data build` flags and Dagster's build_options).

    Field rules are checked when a config is made; :meth:`check` adds what needs the outside
    world (the source's options and inputs, extractor weights, runner options)."""

    source: str = option(help="raw source format (see `mmlinks data sources`)", choices=source_names)
    input: str = option(help="raw source folder or file (per source)")
    out: str = option(help="dataset output directory or URI (gs://..., s3://...)")
    extractor: str = option(
        DEFAULT_EXTRACTOR,
        help="global CNN features: " + describe_extractors("global"),
        choices=global_extractor_names,
        rule="unknown feature extractor; known:",
        cli_choices=False,
        group=FEATURES,
    )
    regions: str = option(
        NONE,
        help="region features for the Li et al. 2021 model: " + describe_extractors("regions"),
        choices=lambda: (NONE, *region_extractor_names()),
        rule="not a region extractor; region extractors:",
        cli_choices=False,
        group=FEATURES,
    )
    extractor_options: dict[str, str] = option(
        help="--extractor options, e.g. weights=PATH", flag="", default_factory=dict
    )
    region_options: dict[str, str] = option(
        help="--regions options, e.g. grid=6, num_regions=36", flag="", default_factory=dict
    )
    precision: str = option(
        "float32", help="feature storage dtype", choices=lambda: sorted(FEATURE_DTYPES), group=FEATURES
    )
    split_ratios: dict[str, float] = option(
        help="train,val,test ratios for documents the source leaves unsplit",
        flag="--split",
        parse=_ratios,
        check=_ratios_ok,
        rule="non-negative with a positive sum",
        metavar="TRAIN,VAL,TEST",
        group=DOCUMENTS,
        default_factory=lambda: dict(DEFAULT_RATIOS),
    )
    split_sizes: dict[str, int] | None = option(
        None,
        help="fixed split sizes instead of ratios, e.g. val=500,test=1000 (rest: train)",
        parse=parse_split_sizes,
        check=lambda v: v is None or min(v.values(), default=0) >= 0,
        rule="non-negative counts",
        metavar="SPLIT=N,...",
        group=DOCUMENTS,
    )
    dedupe_threshold: int | str = option(
        3,
        help="near-duplicate Hamming distance in bits, or 'off' (sources whose images recur across "
        "documents on purpose, e.g. the crowd-labelled sets, default to off)",
        parse=int_or_off(0, 16),
        check=is_int_or_off(0, 16),
        rule="0 to 16 bits or 'off'",
        metavar="BITS|off",
        group=DOCUMENTS,
    )
    dedupe_policy: str = option(
        "drop_all",
        help="drop every document with a near-duplicate image (paper), or keep the earliest",
        choices=("drop_all", "keep_first"),
        group=DOCUMENTS,
    )
    filter_preset: str | None = option(
        None,
        help="filter preset (default: the source's own)",
        flag="--filter",
        choices=lambda: (None, *sorted(PRESETS)),
        group=DOCUMENTS,
    )
    filter_options: dict[str, str] = option(help="filter rule overrides", flag="", default_factory=dict)
    max_shard_rows: int = option(1000, help="documents per shard at most", at_least=1, group=SHARDS)
    max_shard_mb: float = option(
        256.0, help="estimated MB per shard at most", check=lambda v: v > 0, rule="> 0", group=SHARDS
    )
    image_store: str | None = option(
        None,
        help="content-addressed image store root (default: OUT/image-store); share it between builds",
        group=FEATURES,
    )
    placeholder_images: str | None = option(
        None,
        help="folder of example 'image removed' pictures; images within 2 phash bits are rejected",
        metavar="DIR",
        group=FEATURES,
    )
    placeholder_distance: int = option(
        2, help="phash bits within which an image counts as a placeholder", flag="", group=FEATURES
    )
    runner: str = runner_option(SHARDS)
    direct_workers: int | None = direct_workers_option(SHARDS)
    dask_address: str | None = dask_address_option(SHARDS)
    dask_workers: int | None = dask_workers_option(SHARDS)
    device: str = device_option("feature extraction device", FEATURES)
    cpu_threads: int | None = option(
        None,
        help="torch threads per worker (default: cores / workers); recorded with the dataset, "
        "since CPU features differ in the last bits with the thread count",
        at_least=1,
        group=FEATURES,
    )
    batch_size: int = option(32, help="images per inference batch", at_least=1, group=FEATURES)
    beam_args: list[str] = option(help="extra Beam pipeline options", flag="", default_factory=list)
    source_options: dict[str, str] = option(
        help="--source-option KEY=VALUE settings of the source", flag="", default_factory=dict
    )
    crawl_state: str | None = option(
        None,
        help="where the source keeps crawl progress and its HTTP cache between builds "
        "(default: OUT/crawl-state/SOURCE)",
        metavar="URI",
    )
    allow_empty: bool = option(
        False,
        help="commit a version with no document (by default a build that keeps nothing fails, "
        "naming what it read and why each part was dropped, and the current version stays)",
        group=DOCUMENTS,
    )

    def __post_init__(self) -> None:
        self.runner = known_or_as_given(self.runner)  # "dask" in a settings file, as on the CLI
        validate(self, "build config")

    @classmethod
    def for_source(cls, source: str, input: str, out: str, **explicit) -> BuildConfig:
        """A config with the source's own defaults (filter preset, dedupe, split ratios) under
        the options given explicitly (pass only those: every value given is used, and a value
        that is not allowed, ``None`` for a threshold say, is refused, not ignored)."""
        if source not in source_names():
            raise MmlinksError(f"unknown source {source!r}; known: {', '.join(source_names())}")
        values = copy.deepcopy(get_spec(source).build_defaults)
        for key, value in explicit.items():
            if key in MERGED_OPTIONS and isinstance(values.get(key), dict) and isinstance(value, dict):
                values[key] = {**values[key], **value}  # e.g. --filter-option on the source's rules
            else:
                values[key] = value
        return from_dict(cls, {"source": source, "input": input, "out": out, **values}, what="build option")

    def region_extractor(self) -> str | None:
        """The region extractor's name, or None for ``--regions none``."""
        return None if self.regions == NONE else self.regions

    def spec(self) -> SourceSpec:
        return get_spec(self.source)

    def crawl_state_root(self) -> str:
        return self.crawl_state or fileio.join(self.out, "crawl-state", self.source)

    def source_context(self) -> SourceContext:
        return self.spec().context(self.input, self.source_options, self.crawl_state_root())

    def document_filter(self) -> DocumentFilter:
        return filter_for(self.source, self.filter_preset, self.filter_options)

    def store_root(self) -> str:
        return self.image_store or fileio.join(self.out, "image-store")

    def params(self) -> dict:
        """Parameters that define the dataset version (paths, runner and batching do not)."""
        p = asdict(self)
        for k in (
            "input",
            "out",
            "runner",
            "beam_args",
            "batch_size",
            "image_store",
            "direct_workers",
            "dask_address",
            "dask_workers",
            "crawl_state",
            "allow_empty",
        ):
            p.pop(k)
        # Politeness, caches and endpoints do not change the documents; credentials never get here.
        p["source_options"] = self.spec().data_options(self.source_options)
        ph = self.placeholders()
        p["placeholder_images"] = None if ph is None else _placeholder_digest(ph)
        for k in ("extractor_options", "region_options"):  # weight paths are named by the versions
            p[k] = {name: v for name, v in sorted(p[k].items()) if name != "weights"}
        p["device"] = "cuda" if self.device.startswith("cuda") else "cpu"  # kernels differ in the last bits
        p["cpu_threads"] = self.threads()  # so do CPU reductions split over a different thread count
        p["filter"] = self.document_filter().params()
        # "off"/"none" are recorded as null, as before they were values of their own, so
        # rebuilding an existing dataset keeps its version id.
        p["dedupe_threshold"] = None if self.dedupe_threshold == OFF else self.dedupe_threshold
        p["regions"] = self.region_extractor()
        return p

    def check(self) -> None:
        """What the field rules cannot see: the source's options and inputs, the extractors
        (weights present, the right kind), the device and the runner's options."""
        spec = self.spec()
        ctx = self.source_context()  # unknown source options fail here
        if spec.check is not None:
            spec.check(ctx)
        self.document_filter()
        from features import get_extractor, resolve_device  # torch: imported when a build is checked

        resolve_device(self.device)
        ext = get_extractor(self.extractor, **self.extractor_options)
        if ext.kind != "global":
            raise MmlinksError(f"--extractor must be a global (CNN) extractor; {ext.name} gives regions")
        if self.region_extractor():
            reg = get_extractor(self.regions, **self.region_options)
            if reg.kind != "regions":
                raise MmlinksError(f"--regions must be a region extractor; {reg.name} is global")
        self.pipeline_options()

    def placeholders(self) -> Placeholders | None:
        if not self.placeholder_images:
            return None
        return Placeholders.from_dir(self.placeholder_images, self.placeholder_distance)


def _placeholder_digest(ph: Placeholders) -> str:
    """The placeholder set as part of the dataset's identity (it decides which images survive)."""
    text = json.dumps([sorted(ph.sha256s), sorted(ph.phashes), ph.max_distance])
    return hashlib.sha256(text.encode()).hexdigest()[:16]
