"""Training configuration: one dataclass, paper defaults, every field logged to MLflow."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass
class TrainConfig:
    data: str = ""  # dataset directory (holds manifest.json)
    similarity: str = "ap"  # dc | tk | ap
    k: str = "full"  # full | half
    negatives: str = "hard"  # hard | mean
    margin: float = 0.2
    batch_docs: int = 11  # B documents per batch -> B - 1 in-batch negatives
    lr: float = 1e-4
    epochs: int = 50
    plateau_patience: int = 3  # epochs without val-loss improvement before lr x plateau_factor
    plateau_factor: float = 0.2
    max_tokens: int = 20
    min_word_count: int = 5
    word_vectors: str = "glove"  # glove | random | path to a word2vec/GloVe text file
    d_multi: int = 1024
    image_dropout: float = 0.4
    seed: int = 0
    num_workers: int = 2  # Ray Train workers (1 = a single worker process)
    use_gpu: bool = False
    threads_per_worker: int = 1
    max_failures: int = 0
    storage_path: str = ""  # Ray Train run storage (local path or a shared URI)
    run_name: str = ""  # Ray Train run name; empty = a fresh unique name (reuse one to resume)
    ray_address: str = ""  # empty: start or reuse a local Ray
    ray_logs: bool = False  # forward worker logs to this console

    def to_dict(self) -> dict:
        return asdict(self)

    def public_dict(self) -> dict:
        """The config minus fields that may carry hosts or credentials (cluster address, a
        storage URI with keys); this is what goes into params, artifacts and checkpoints."""
        return {k: v for k, v in asdict(self).items() if k not in ("ray_address", "storage_path")}

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def validate(self) -> None:
        from schemas.errors import MmlinksError

        checks = {
            "similarity": self.similarity in ("dc", "tk", "ap"),
            "k": self.k in ("full", "half"),
            "negatives": self.negatives in ("hard", "mean"),
            "batch_docs (>= 2)": self.batch_docs >= 2,
            "epochs (>= 1)": self.epochs >= 1,
            "num_workers (>= 1)": self.num_workers >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise MmlinksError(f"invalid training config: {', '.join(bad)}")
