"""What a dataset build is asked to do: :class:`BuildConfig`, its source defaults and its checks.

``params()`` is the part of the config that defines the dataset version (paths, runner and
batching do not); ``check()`` raises every option error before a folder is created.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field

from features import get_extractor, resolve_device
from features.registry import DEFAULT_EXTRACTOR
from pipelines import fileio
from pipelines.filters import DocumentFilter, filter_for
from pipelines.image_store import Placeholders
from pipelines.runners import canonical_runner, pipeline_options
from pipelines.sources import SourceContext, SourceSpec, get_spec
from pipelines.splits import DEFAULT_RATIOS
from schemas.document import FEATURE_DTYPES
from schemas.errors import MmlinksError

# Options given as KEY=VALUE maps: what the user says is laid over the source's defaults.
MERGED_OPTIONS = ("filter_options", "source_options", "extractor_options", "region_options")


@dataclass
class BuildConfig:
    source: str
    input: str
    out: str
    extractor: str = DEFAULT_EXTRACTOR  # a global extractor of features.registry
    regions: str | None = None  # a region extractor of features.registry, or none
    extractor_options: dict[str, str] = field(default_factory=dict)  # e.g. weights=PATH
    region_options: dict[str, str] = field(default_factory=dict)  # e.g. grid=6, num_regions=36
    precision: str = "float32"  # storage dtype of feature vectors: float32 | float16
    split_ratios: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_RATIOS))
    split_sizes: dict[str, int] | None = None  # fixed-size splits (rest -> train) instead of ratios
    dedupe_threshold: int | None = 3  # Hamming distance; None switches near-duplicate removal off
    dedupe_policy: str = "drop_all"  # drop_all | keep_first
    filter_preset: str | None = None  # default: the source's preset (see pipelines.filters)
    filter_options: dict[str, str] = field(default_factory=dict)
    max_shard_rows: int = 1000
    max_shard_mb: float = 256.0
    image_store: str | None = None  # default OUT/image-store
    placeholder_images: str | None = None  # folder of example "image removed" pictures to reject
    placeholder_distance: int = 2  # phash bits within which an image counts as such a placeholder
    runner: str = "DirectRunner"
    direct_workers: int | None = None  # DirectRunner processes; None: one per CPU core, 1: in-process
    device: str = "cpu"
    cpu_threads: int | None = None  # torch threads per worker; default: this machine's cores / workers
    batch_size: int = 32
    beam_args: list[str] = field(default_factory=list)
    source_options: dict[str, str] = field(default_factory=dict)  # --source-option KEY=VALUE
    crawl_state: str | None = None  # the source's crawl state (default OUT/crawl-state/<source>)

    @classmethod
    def for_source(cls, source: str, input: str, out: str, **explicit) -> BuildConfig:
        """A config with the source's own defaults (filter preset, dedupe, split ratios) under
        the options the user gave explicitly (pass only those; None counts as not given)."""
        values = copy.deepcopy(get_spec(source).build_defaults)
        for key, value in explicit.items():
            if value is None:
                continue
            if key in MERGED_OPTIONS and isinstance(values.get(key), dict):
                values[key] = {**values[key], **value}  # e.g. --filter-option on the source's rules
            else:
                values[key] = value
        return cls(source=source, input=input, out=out, **values)

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
            "crawl_state",
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
        return p

    def check(self) -> None:
        spec = self.spec()
        ctx = self.source_context()  # unknown source options fail here
        if spec.check is not None:
            spec.check(ctx)
        if self.precision not in FEATURE_DTYPES:
            raise MmlinksError(f"--precision must be one of {sorted(FEATURE_DTYPES)}, not {self.precision!r}")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise MmlinksError("--cpu-threads must be >= 1")
        if self.max_shard_rows < 1 or self.max_shard_mb <= 0:
            raise MmlinksError("--max-shard-rows must be >= 1 and --max-shard-mb > 0")
        if self.dedupe_policy not in ("drop_all", "keep_first"):
            raise MmlinksError(f"--dedupe-policy must be drop_all or keep_first, not {self.dedupe_policy!r}")
        if self.dedupe_threshold is not None and not 0 <= self.dedupe_threshold <= 16:
            raise MmlinksError("--dedupe-threshold must be between 0 and 16 bits")
        if self.split_sizes is not None:
            if any(n < 0 for n in self.split_sizes.values()):
                raise MmlinksError(f"split sizes must be non-negative: {self.split_sizes}")
        elif (
            not self.split_ratios
            or any(v < 0 for v in self.split_ratios.values())
            or not sum(self.split_ratios.values())
        ):
            raise MmlinksError(f"split ratios must be non-negative with a positive sum: {self.split_ratios}")
        self.document_filter()
        resolve_device(self.device)
        ext = get_extractor(self.extractor, **self.extractor_options)
        if ext.kind != "global":
            raise MmlinksError(f"--extractor must be a global (CNN) extractor; {ext.name} gives regions")
        if self.regions:
            reg = get_extractor(self.regions, **self.region_options)
            if reg.kind != "regions":
                raise MmlinksError(f"--regions must be a region extractor; {reg.name} is global")
        self.pipeline_options()

    def threads(self) -> int | None:
        """Torch intra-op threads per worker process (None on GPU).

        CPU results change in the last bits with the thread count, so it is fixed per build and
        recorded with the dataset: the same inputs, parameters and thread count give the same
        bytes on any machine of the same architecture.
        """
        if self.device.startswith("cuda"):
            return None
        if self.cpu_threads:
            return self.cpu_threads
        workers = self.workers()
        if workers is None:
            return None  # a cluster runner: the workers' own default (say --cpu-threads to pin it)
        return max(1, (os.cpu_count() or 1) // workers)

    def workers(self) -> int | None:
        """DirectRunner worker processes (None for cluster runners)."""
        if canonical_runner(self.runner) != "DirectRunner":
            return None
        return self.direct_workers or (os.cpu_count() or 1)

    def placeholders(self) -> Placeholders | None:
        if not self.placeholder_images:
            return None
        return Placeholders.from_dir(self.placeholder_images, self.placeholder_distance)

    def pipeline_options(self):
        return pipeline_options(self.runner, self.beam_args, direct_workers=self.workers())


def _placeholder_digest(ph: Placeholders) -> str:
    """The placeholder set as part of the dataset's identity (it decides which images survive)."""
    text = json.dumps([sorted(ph.sha256s), sorted(ph.phashes), ph.max_distance])
    return hashlib.sha256(text.encode()).hexdigest()[:16]
