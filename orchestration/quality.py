"""Data and model quality rules, as plain functions over a manifest or an evaluation.

Why not only Dagster's checks: a run started later cannot see their verdict, so the downstream
assets ``require`` the same rules before touching the data. No Dagster import."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from schemas.errors import MmlinksError
from schemas.manifest import Manifest

DUPLICATE_REASONS = ("near_duplicate", "duplicate_doc_id")


@dataclass
class Thresholds:
    """Limits the checks apply; every field can be set in the Dagster settings (``thresholds``)."""

    min_documents: int = 100  # kept documents over all splits
    min_split_documents: dict[str, int] = field(
        default_factory=lambda: {"train": 10, "val": 2, "test": 2}  # val >= 2: the validation loss needs 2
    )
    max_duplicate_rate: float = 0.25  # near-duplicate / duplicate-id drops per document seen
    max_dead_letter_rate: float = 0.25  # invalid input (not filtered by design) per record seen
    feature_dim: int | None = None  # required feature width; None: whatever the manifest declares
    min_test_auc: float = 55.0  # evaluation floor (metric points, x100 scale)
    min_test_p_at_1: float = 0.0
    min_auc_over_random: float = 0.0  # candidate AUC minus the Random baseline's
    max_medr: float = 0.0  # retrieval evaluation ceiling: MedR (a rank, lower is better); 0 = none
    min_r10: float = 0.0  # retrieval evaluation floor: R@10
    max_link_dead_letter_rate: float = 0.05  # linked_<obj>: documents the link job could not link
    min_link_rate: float = 0.05  # linked_<obj>: linked images per image, bounds of a sane model
    max_link_rate: float = 1.0

    @classmethod
    def from_dict(cls, data: dict | None) -> Thresholds:
        data = dict(data or {})
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise MmlinksError(
                f"unknown threshold(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}"
            )
        return cls(**data)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Outcome:
    """One rule's verdict: what was measured, against which limit."""

    name: str
    passed: bool
    description: str
    metadata: dict = field(default_factory=dict)


def _rate(num: int, den: int) -> float:
    return num / den if den else 0.0


def _document_drops(manifest: Manifest) -> dict[str, int]:
    return {k: v for k, v in manifest.counts.get("dropped", {}).items() if k.startswith("document:")}


def kept_documents(manifest: Manifest) -> int:
    return sum(manifest.counts.get("splits", {}).values())


def documents_seen(manifest: Manifest) -> int:
    """Kept + every document-level drop: each input document ends up in exactly one of them."""
    return kept_documents(manifest) + sum(_document_drops(manifest).values())


def check_schema_version(manifest: Manifest, dataset_dir: str | Path) -> Outcome:
    from schemas.document import SCHEMA_VERSION
    from schemas.shards import check_shards

    meta = {"schema_version": manifest.schema_version, "expected": SCHEMA_VERSION}
    if manifest.schema_version != SCHEMA_VERSION:
        return Outcome(
            "schema_version",
            False,
            f"manifest has schema version {manifest.schema_version}, this code reads {SCHEMA_VERSION}",
            meta,
        )
    try:
        check_shards(manifest.shard_paths(dataset_dir))  # each shard's footer, no data read
    except MmlinksError as exc:
        return Outcome("schema_version", False, str(exc), meta)
    return Outcome(
        "schema_version", True, f"schema v{SCHEMA_VERSION}, {len(manifest.shards)} shards agree", meta
    )


def check_min_documents(manifest: Manifest, t: Thresholds) -> Outcome:
    n = kept_documents(manifest)
    ok = n >= t.min_documents
    return Outcome(
        "min_documents",
        ok,
        f"{n} documents kept ({'>=' if ok else '<'} {t.min_documents})",
        {"documents": n, "min_documents": t.min_documents},
    )


def check_split_sizes(manifest: Manifest, t: Thresholds) -> Outcome:
    splits = manifest.counts.get("splits", {})
    short = {s: (splits.get(s, 0), n) for s, n in t.min_split_documents.items() if splits.get(s, 0) < n}
    text = ", ".join(f"{s}={splits.get(s, 0)}" for s in sorted(set(splits) | set(t.min_split_documents)))
    if short:
        why = "; ".join(f"{s} has {have} < {need}" for s, (have, need) in sorted(short.items()))
        return Outcome("split_sizes", False, f"split sizes {text}: {why}", {"splits": dict(splits)})
    return Outcome("split_sizes", True, f"split sizes {text}", {"splits": dict(splits)})


def check_duplicate_rate(manifest: Manifest, t: Thresholds) -> Outcome:
    drops = _document_drops(manifest)
    dups = sum(v for k, v in drops.items() if k.split(":", 1)[1] in DUPLICATE_REASONS)
    seen = documents_seen(manifest)
    rate = _rate(dups, seen)
    ok = rate <= t.max_duplicate_rate
    return Outcome(
        "duplicate_rate",
        ok,
        f"{dups} of {seen} documents dropped as duplicates ({rate:.1%}, limit {t.max_duplicate_rate:.1%})",
        {"duplicates": dups, "documents_seen": seen, "rate": rate, "limit": t.max_duplicate_rate},
    )


def check_dead_letter_rate(manifest: Manifest, t: Thresholds) -> Outcome:
    """Invalid input per record seen. Filter drops (the paper's rules, most DIY posts) and
    duplicates are choices, not defects, so they are left out; malformed lines count."""

    def invalid(key: str) -> bool:
        kind, _, reason = key.partition(":")
        if kind == "line":
            return True
        return kind == "document" and not reason.startswith("filter_") and reason not in DUPLICATE_REASONS

    bad = {k: v for k, v in manifest.counts.get("dropped", {}).items() if invalid(k)}
    n_bad = sum(bad.values())
    seen = documents_seen(manifest) + sum(v for k, v in bad.items() if k.startswith("line:"))
    rate = _rate(n_bad, seen)
    ok = rate <= t.max_dead_letter_rate
    top = dict(sorted(bad.items(), key=lambda kv: -kv[1])[:5])
    return Outcome(
        "dead_letter_rate",
        ok,
        f"{n_bad} of {seen} input records dead-lettered ({rate:.1%}, limit {t.max_dead_letter_rate:.1%})",
        {"dead_letters": n_bad, "records_seen": seen, "rate": rate, "top_reasons": top},
    )


def check_feature_dim(manifest: Manifest, dataset_dir: str | Path, t: Thresholds) -> Outcome:
    """The declared width against the configured one and against a vector actually stored."""
    from schemas.shards import read_table

    declared = manifest.feature_extractor.dim
    meta = {"declared": declared, "extractor": manifest.feature_extractor.name, "required": t.feature_dim}
    if t.feature_dim is not None and declared != t.feature_dim:
        return Outcome("feature_dim", False, f"features are {declared}-d, {t.feature_dim}-d required", meta)
    for path in manifest.shard_paths(dataset_dir):
        images = read_table([path], columns=["images"]).column("images").to_pylist()
        for doc in images:
            for im in doc or []:
                stored = len(im["features"] or [])
                meta["stored"] = stored
                if stored != declared:
                    return Outcome(
                        "feature_dim",
                        False,
                        f"manifest declares {declared}-d features but {path.name} stores {stored}-d",
                        meta,
                    )
                return Outcome("feature_dim", True, f"{declared}-d {manifest.feature_extractor.name}", meta)
    return Outcome("feature_dim", False, "no stored image feature to compare with the manifest", meta)


def dataset_outcomes(manifest: Manifest, dataset_dir: str | Path, t: Thresholds) -> list[Outcome]:
    return [
        check_schema_version(manifest, dataset_dir),
        check_min_documents(manifest, t),
        check_split_sizes(manifest, t),
        check_duplicate_rate(manifest, t),
        check_dead_letter_rate(manifest, t),
        check_feature_dim(manifest, dataset_dir, t),
    ]


DATASET_CHECKS: dict[str, Callable[..., Outcome]] = {
    "schema_version": lambda m, d, t: check_schema_version(m, d),
    "min_documents": lambda m, d, t: check_min_documents(m, t),
    "split_sizes": lambda m, d, t: check_split_sizes(m, t),
    "duplicate_rate": lambda m, d, t: check_duplicate_rate(m, t),
    "dead_letter_rate": lambda m, d, t: check_dead_letter_rate(m, t),
    "feature_dim": lambda m, d, t: check_feature_dim(m, d, t),
}


def check_evaluation_floor(evaluation: dict, t: Thresholds) -> Outcome:
    """Written as "passes when value >= limit" so that a NaN metric (a broken model) fails.
    A retrieval evaluation (a "medr" key) takes the retrieval rules."""
    if "medr" in evaluation:
        return check_retrieval_floor(evaluation, t)
    auc, p1 = evaluation.get("auc", math.nan), evaluation.get("p_at_1", math.nan)
    random_auc = evaluation.get("random_auc", math.nan)
    failures = []
    if not auc >= t.min_test_auc:
        failures.append(f"auc {auc:.2f} is below the floor {t.min_test_auc:.2f}")
    if not p1 >= t.min_test_p_at_1:
        failures.append(f"p_at_1 {p1:.2f} is below the floor {t.min_test_p_at_1:.2f}")
    if not math.isnan(random_auc) and not auc - random_auc >= t.min_auc_over_random:
        failures.append(f"auc {auc:.2f} is not {t.min_auc_over_random:g} above Random's {random_auc:.2f}")
    meta = {"auc": auc, "p_at_1": p1, "random_auc": random_auc, "min_test_auc": t.min_test_auc}
    if failures:
        return Outcome("metrics_above_floor", False, "; ".join(failures), meta)
    return Outcome("metrics_above_floor", True, f"auc {auc:.2f}, p@1 {p1:.2f} above the floors", meta)


def check_retrieval_floor(evaluation: dict, t: Thresholds) -> Outcome:
    """A retrieval model's MedR at most ``max_medr`` (when set) and R@10 at least ``min_r10``;
    written so that a NaN metric fails."""
    medr, r10 = evaluation.get("medr", math.nan), evaluation.get("r10", math.nan)
    failures = []
    if not medr <= (t.max_medr if t.max_medr > 0 else math.inf):
        failures.append(f"medr {medr:.1f} is above the ceiling {t.max_medr:.1f} (lower is better)")
    if not r10 >= t.min_r10:
        failures.append(f"r10 {r10:.1f} is below the floor {t.min_r10:.1f}")
    meta = {"medr": medr, "r10": r10, "max_medr": t.max_medr, "min_r10": t.min_r10}
    if failures:
        return Outcome("metrics_above_floor", False, "; ".join(failures), meta)
    return Outcome("metrics_above_floor", True, f"medr {medr:.1f}, r@10 {r10:.1f} within the limits", meta)


def check_links(linked: dict, t: Thresholds) -> Outcome:
    """A link job's dead-letter rate and link rate (linked images per image) within bounds:
    a model or dataset gone wrong links nothing, everything, or drops what it cannot read."""
    dead, rate = linked.get("dead_letter_rate", math.nan), linked.get("link_rate", math.nan)
    failures = []
    if not dead <= t.max_link_dead_letter_rate:
        failures.append(f"dead-letter rate {dead:.1%} above {t.max_link_dead_letter_rate:.1%}")
    if not t.min_link_rate <= rate <= t.max_link_rate:
        failures.append(f"link rate {rate:.1%} outside [{t.min_link_rate:.1%}, {t.max_link_rate:.1%}]")
    meta = {
        "dead_letter_rate": dead,
        "link_rate": rate,
        "documents_linked": linked.get("documents_linked", 0),
    }
    if failures:
        return Outcome("link_quality", False, "; ".join(failures), meta)
    return Outcome("link_quality", True, f"link rate {rate:.1%}, dead-letter rate {dead:.1%}", meta)


def require(outcomes: list[Outcome], what: str) -> None:
    """Raise one line naming every failing rule; the guard downstream assets run before work."""
    failed = [o for o in outcomes if not o.passed]
    if failed:
        raise MmlinksError(
            f"{what} fails its checks: " + "; ".join(f"{o.name}: {o.description}" for o in failed)
        )
