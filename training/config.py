"""Training configuration: one dataclass, paper defaults, every field logged to MLflow."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from training.backbone import backbone_names
from training.objectives.registry import LI2021_PARTS, get_objective, objective_names

# The registries define the names; these are their values at import (see objective_names()).
OBJECTIVES = objective_names()
BACKBONES = backbone_names()
__all__ = ["BACKBONES", "LI2021_PARTS", "MODEL_FIELDS", "OBJECTIVES", "TrainConfig"]
# Fields a resumed run must share with its checkpoint: they define the model or the loss.
MODEL_FIELDS = (
    "data",
    "objective",
    "k",
    "negatives",
    "objectives",
    "backbone",
    "max_tokens",
    "min_word_count",
    "word_vectors",
    "d_multi",
    "transformer_layers",
    "transformer_heads",
    "max_regions",
    "seed",
)


@dataclass
class TrainConfig:
    data: str = ""  # dataset directory (holds manifest.json)
    objective: str = "ap"  # nostruct | dc | tk | ap | li2021
    k: str = "full"  # full | half (TK and AP)
    negatives: str = "hard"  # hard | mean
    objectives: str = "C"  # li2021 parts: C, C+I, C+D, C+I+D
    backbone: str = "gru"  # gru | transformer
    sub_fraction: float = 0.8  # li2021 D: share of sentences and images kept (paper: 0.6 DII/SIS)
    margin: float = 0.2
    batch_docs: int = 11  # B documents per batch -> B - 1 in-batch negatives
    lr: float = 1e-4
    warmup_steps: int = 0  # linear warm-up from lr/1000 (Li et al. 2021 use 3000-4000)
    epochs: int = 50
    plateau_patience: int = 3  # epochs without val-loss improvement before lr x plateau_factor
    plateau_factor: float = 0.2
    max_tokens: int = 20
    min_word_count: int = 5
    word_vectors: str = "glove"  # glove | random | word2vec/GloVe text file | word2vec/fastText .bin
    d_multi: int = 1024
    image_dropout: float = 0.4
    transformer_layers: int = 3
    transformer_heads: int = 8
    max_regions: int = 36
    seed: int = 0
    num_workers: int = 2  # Ray Train workers (1 = a single worker process)
    use_gpu: bool = False
    threads_per_worker: int = 1
    max_failures: int = 0
    cache_data: str = "auto"  # auto | yes | no: keep the decoded training shards in Ray's object store
    storage_path: str = ""  # Ray Train run storage (local path or a shared URI)
    run_name: str = ""  # Ray Train run name; empty = a fresh unique name (reuse one to resume)
    ray_address: str = ""  # empty: start or reuse a local Ray
    ray_logs: bool = False  # forward worker logs to this console

    @property
    def similarity(self) -> str:
        """The document similarity the objective trains: NoStruct is DC on 1 x 1 documents and
        Li et al. 2021 use TK with k = min(n, m) (``ObjectiveSpec.similarity``)."""
        spec = self._objective()
        return spec.similarity if spec else self.objective

    @property
    def parts(self) -> tuple[str, ...]:
        spec = self._objective()
        return spec.parts(self) if spec else ("C",)

    @property
    def label(self) -> str:
        """A short run name, e.g. ``ap-full-hard`` or ``li2021-C+I+D-transformer``."""
        spec = self._objective()
        return spec.label(self) if spec else f"{self.objective}-{self.k}-{self.negatives}"

    def _objective(self):
        """The registered spec of ``objective``; None for an unknown name (``validate`` refuses it)."""
        return get_objective(self.objective) if self.objective in objective_names() else None

    def to_dict(self) -> dict:
        return asdict(self)

    def public_dict(self) -> dict:
        """The config minus fields that may carry hosts or credentials (cluster address, a
        storage URI with keys); this is what goes into params, artifacts and checkpoints."""
        out = {k: v for k, v in asdict(self).items() if k not in ("ray_address", "storage_path")}
        out["similarity"] = self.similarity
        return out

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        if "objective" not in values and data.get("similarity"):  # configs written before objectives
            values["objective"] = data["similarity"]
        return cls(**values)

    def validate(self) -> None:
        from schemas.errors import MmlinksError

        objectives, backbones = objective_names(), backbone_names()
        known = self.objective in objectives
        checks = {
            f"objective (one of {', '.join(objectives)})": known,
            "k (full or half)": self.k in ("full", "half"),
            "negatives (hard or mean)": self.negatives in ("hard", "mean"),
            f"backbone (one of {', '.join(backbones)})": self.backbone in backbones,
            "sub_fraction (in (0, 1])": 0 < self.sub_fraction <= 1,
            "batch_docs (>= 2)": self.batch_docs >= 2,
            "epochs (>= 1)": self.epochs >= 1,
            "num_workers (>= 1)": self.num_workers >= 1,
            "warmup_steps (>= 0)": self.warmup_steps >= 0,
            "cache_data (auto, yes or no)": self.cache_data in ("auto", "yes", "no"),
        }
        bad = [name for name, ok in checks.items() if not ok]
        if self.backbone in backbones:
            from training.backbone import get_backbone

            check = get_backbone(self.backbone).check
            bad += check(self) if check else []
        if known:
            check = get_objective(self.objective).check
            bad += check(self) if check else []
        if bad:
            raise MmlinksError(f"invalid training config: {', '.join(bad)}")
