"""What every source connector provides, so ``mmlinks data build --source NAME`` can run it: a
Beam ``PTransform`` to ``RawDocument`` records (plus ``dead_letter``) described by a ``SourceSpec``.

Why credentials never travel in options: read from the environment on the workers, they stay
out of the manifest, build parameters, logs and MLflow. ``SourceContext`` parses the string
options with one clear error per bad value."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from schemas.errors import MmlinksError

if TYPE_CHECKING:  # Beam is imported lazily: `mmlinks --help` lists sources without loading it
    import apache_beam as beam


@dataclass(frozen=True)
class SourceOption:
    name: str
    default: str | None  # None: unset (the connector decides); the string form of the default
    help: str
    # Options that do not change which documents come out (politeness, caches, concurrency)
    # are left out of the dataset version's parameters.
    defines_data: bool = True


@dataclass(frozen=True)
class SourceContext:
    """Everything a connector gets: the input URI, the parsed options and its state folder."""

    source: str
    input: str
    options: dict[str, str]
    # Crawl state that outlives a build (album results, checkpoints, the HTTP cache): by
    # default OUT/crawl-state/<source>; any Beam FileSystems URI.
    state_dir: str
    spec_options: tuple[SourceOption, ...] = ()

    def raw(self, name: str) -> str | None:
        if name in self.options:
            return self.options[name]
        for opt in self.spec_options:
            if opt.name == name:
                return opt.default
        raise MmlinksError(f"source {self.source!r} has no option {name!r}")

    def str(self, name: str) -> str | None:
        return self.raw(name)

    def int(self, name: str) -> int | None:
        value = self.raw(name)
        if value is None or value.lower() in ("", "none"):
            return None
        try:
            return int(value)
        except ValueError:
            raise MmlinksError(f"--source-option {name} wants an integer, not {value!r}") from None

    def float(self, name: str) -> float | None:
        value = self.raw(name)
        if value is None or value.lower() in ("", "none"):
            return None
        try:
            out = float(value)
        except ValueError:
            raise MmlinksError(f"--source-option {name} wants a number, not {value!r}") from None
        if not math.isfinite(out):
            raise MmlinksError(f"--source-option {name} wants a finite number, not {value!r}")
        return out

    def bool(self, name: str) -> bool:
        value = (self.raw(name) or "false").lower()
        if value in ("1", "true", "yes", "on"):
            return True
        if value in ("0", "false", "no", "off"):
            return False
        raise MmlinksError(f"--source-option {name} wants true or false, not {value!r}")

    def state(self, *parts: str) -> str:
        """A path under this source's state folder."""
        from pipelines import fileio

        return fileio.join(self.state_dir, *parts) if parts else self.state_dir


class PrebuiltFeatures(Protocol):
    """A source whose documents arrive with image features already computed."""

    def extractor_info(self, ctx: SourceContext) -> tuple[Any, Any]:
        """(FeatureExtractorInfo of the global features, of the regions or None), read up front."""
        ...

    def documents(self, p: beam.Pipeline, ctx: SourceContext) -> tuple[beam.PCollection, beam.PCollection]:
        """(PCollection of schemas.document.Document with split set, PCollection of DeadLetter)."""
        ...


@dataclass(frozen=True)
class SourceSpec:
    name: str
    summary: str  # one line for --help
    # (context) -> PTransform whose expand(pbegin) returns outputs with ``documents``
    # (RawDocument) and ``dead_letter`` (DeadLetter); see ``source_outputs``. None for
    # ``prebuilt`` sources.
    make: Callable[[SourceContext], beam.PTransform] | None = None
    options: tuple[SourceOption, ...] = ()
    # Environment variables the connector reads (documented; values are never logged).
    credentials: tuple[str, ...] = ()
    # BuildConfig defaults for this source: e.g. {"filter_preset": "diy"},
    # {"dedupe_threshold": "off"} (sets whose images recur across documents on purpose),
    # {"split_ratios": {"train": 0.9, "val": 0.1}} (for documents the source leaves unsplit).
    build_defaults: dict[str, Any] = field(default_factory=dict)
    # (context) -> the image store's fetcher for this source's image URIs; None: by scheme.
    fetcher: Callable[[SourceContext], Any] | None = None
    # (context) -> None, raising MmlinksError for a bad input or option before Beam starts.
    check: Callable[[SourceContext], None] | None = None
    # Sources that ship their own features (the authors' prebuilt datasets) skip the image,
    # near-duplicate, filter and feature stages; see ``PrebuiltFeatures``.
    prebuilt: PrebuiltFeatures | None = None
    # (context) -> one line naming what the source will read (e.g. which files it takes as
    # dumps), printed before the build starts; None: nothing to say.
    describe: Callable[[SourceContext], str] | None = None
    # (context) -> the coherence-relation vocabulary of a labelled pair corpus (goes into the
    # manifest's ``relations``), or None; see pipelines/coherence_corpus.py.
    relations: Callable[[SourceContext], list[str] | None] | None = None

    def context(self, input: str, options: dict[str, str] | None, state_dir: str) -> SourceContext:
        options = dict(options or {})
        known = {o.name for o in self.options}
        unknown = sorted(set(options) - known)
        if unknown:
            raise MmlinksError(
                f"source {self.name!r} has no option {', '.join(unknown)}; known: {sorted(known) or 'none'}"
            )
        return SourceContext(self.name, str(input), options, state_dir, self.options)

    def data_options(self, options: dict[str, str]) -> dict[str, str]:
        """The options that define the documents (part of the dataset version)."""
        keep = {o.name for o in self.options if o.defines_data}
        return {k: v for k, v in sorted(options.items()) if k in keep}


def source_outputs(result) -> tuple[beam.PCollection, beam.PCollection]:
    """(documents, dead letters) from a source transform's result (tagged outputs or a dict)."""
    from pipelines.records import DEAD_LETTER

    if isinstance(result, dict):
        return result["documents"], result[DEAD_LETTER]
    return result.documents, result[DEAD_LETTER]


def env_credential(name: str) -> str | None:
    """A credential from the environment ('' counts as unset). Never log the value."""
    value = os.environ.get(name, "").strip()
    return value or None
