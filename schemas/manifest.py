"""Dataset manifest: the JSON file that names a dataset version and everything in it.

A manifest is what downstream stages (training, MLflow, Dagster) pin: its ``dataset_version`` is
a hash of the shard checksums and the build parameters, so identical inputs and parameters give
the same id, and any change in data or parameters gives a new one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from schemas.document import SCHEMA_VERSION
from schemas.errors import MmlinksError

MANIFEST_NAME = "manifest.json"


@dataclass
class ShardInfo:
    path: str  # relative to the dataset directory
    split: str
    rows: int
    bytes: int
    sha256: str


@dataclass
class FeatureExtractorInfo:
    name: str
    version: str
    dim: int


@dataclass
class Manifest:
    schema_version: int
    dataset_version: str
    source: str
    counts: dict[str, dict[str, int]]  # {"splits", "dropped" (kind:reason), "pipeline" counters}
    feature_extractor: FeatureExtractorInfo
    shards: list[ShardInfo]
    build_params: dict = field(default_factory=dict)
    dead_letter: str | None = None  # relative path of the dead-letter file
    region_extractor: FeatureExtractorInfo | None = None  # region features, when built
    feature_dtype: str = "float32"  # storage dtype of feature vectors in the shards
    # Coherence-relation label vocabulary of a pair dataset (Alikhani et al., issue #17): each
    # document is one sentence + one image, its relations in metadata["relations"]
    # (comma-separated names of this list). None: not a labelled pair dataset.
    relations: list[str] | None = None

    @staticmethod
    def version_id(shards: list[ShardInfo], build_params: dict) -> str:
        """Hash of shard file names, their checksums, and the parameters (not of directories)."""
        h = hashlib.sha256()
        for s in sorted(shards, key=lambda s: s.path):
            h.update(f"{s.path.rsplit('/', 1)[-1]}:{s.sha256}\n".encode())
        h.update(json.dumps(build_params, sort_keys=True).encode())
        return h.hexdigest()[:16]

    def to_json(self) -> str:
        data = asdict(self)
        if data["relations"] is None:  # link datasets keep the manifest they always had
            del data["relations"]
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    def write(self, directory: str | Path) -> Path:
        path = Path(directory) / MANIFEST_NAME
        path.write_text(self.to_json())
        return path

    def shard_paths(self, directory: str | Path, split: str | None = None, verify: bool = True) -> list[Path]:
        """The shards of ``split`` (all: None), each checked against its size and sha256 here
        (``schemas.shards.verify_shard``: a changed shard is refused, naming the file)."""
        from schemas.shards import verify_shard

        out = []
        for s in self.shards:
            if split is None or s.split == split:
                path = Path(directory) / s.path
                if verify and s.sha256:
                    verify_shard(path, s.sha256, s.bytes)
                out.append(path)
        return out

    @classmethod
    def from_dict(cls, data: dict, allow_older: bool = False) -> Manifest:
        """Parse a manifest; older schema versions only with ``allow_older`` (for migration)."""
        try:
            version = int(data["schema_version"])
            if version < SCHEMA_VERSION and not allow_older and version >= 1:
                raise MmlinksError(
                    f"dataset has schema version {version}; this mmlinks reads version {SCHEMA_VERSION} "
                    "(run `mmlinks data migrate DATASET_DIR` to upgrade it)"
                )
            if version > SCHEMA_VERSION or version < 1:
                raise MmlinksError(
                    f"manifest has schema version {version}; this mmlinks reads version "
                    f"{SCHEMA_VERSION} (upgrade mmlinks or rebuild the dataset)"
                )
            return cls(
                schema_version=version,
                dataset_version=str(data["dataset_version"]),
                source=str(data["source"]),
                counts=dict(data["counts"]),
                feature_extractor=FeatureExtractorInfo(**data["feature_extractor"]),
                shards=[ShardInfo(**s) for s in data["shards"]],
                build_params=dict(data.get("build_params", {})),
                dead_letter=data.get("dead_letter"),
                region_extractor=FeatureExtractorInfo(**data["region_extractor"])
                if data.get("region_extractor")
                else None,
                feature_dtype=str(data.get("feature_dtype", "float32")),
                relations=_relations(data.get("relations")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MmlinksError(f"manifest is malformed: {type(exc).__name__}: {exc}") from exc

    def relation_names(self, purpose: str) -> list[str]:
        """The label vocabulary, or a clear error for a dataset without one."""
        if not self.relations:
            raise MmlinksError(
                f"{purpose} needs a coherence-labelled pair dataset (a manifest with 'relations'); "
                f"this {self.source!r} dataset has none (build one from `mmlinks data synth-coherence`)"
            )
        return list(self.relations)

    @classmethod
    def read(cls, path: str | Path, allow_older: bool = False) -> Manifest:
        """Read ``path`` (a manifest file or the dataset directory holding one)."""
        path = Path(path)
        if path.is_dir():
            path = path / MANIFEST_NAME
        if not path.exists():
            raise MmlinksError(f"no manifest at {path}")
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise MmlinksError(f"cannot read manifest {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise MmlinksError(f"manifest {path} is not a JSON object")
        return cls.from_dict(data, allow_older=allow_older)


def _relations(value) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v and "," not in v for v in value):
        raise ValueError("relations must be a list of non-empty names without commas")
    if len(set(value)) != len(value):
        raise ValueError("relations repeat a name")
    return list(value)


# A pair's attribute truth (graded-salience corpora, issue #45): metadata["attr.<name>"] is the
# value of attribute <name> in the image, metadata["named"] the comma-separated attributes the
# text names. Written by the generator, read by the per-attribute evaluation.
ATTRIBUTE_PREFIX = "attr."
NAMED_KEY = "named"


def pair_attributes(metadata: dict | None) -> tuple[dict[str, str], set[str]]:
    """(attribute -> value in the image, the attributes the text names) of one pair's metadata;
    ({}, set()) for a pair without attribute truth."""
    meta = dict(metadata or {})
    values = {k[len(ATTRIBUTE_PREFIX) :]: str(v) for k, v in meta.items() if k.startswith(ATTRIBUTE_PREFIX)}
    named = {n for n in str(meta.get(NAMED_KEY) or "").split(",") if n}
    return values, named & set(values)


def pair_relations(metadata_value: str | None, vocabulary: list[str]) -> list[int]:
    """metadata["relations"] of one pair -> 0/1 per vocabulary entry; an unknown name is an error."""
    names = [n for n in (metadata_value or "").split(",") if n]
    unknown = sorted(set(names) - set(vocabulary))
    if unknown:
        raise MmlinksError(f"relation(s) {', '.join(unknown)} not in the dataset's vocabulary {vocabulary}")
    return [int(v in names) for v in vocabulary]
