"""What a batch-linking job is asked to do: :class:`LinkConfig`, the one source of its options.

The ``mmlinks link`` flags are generated from it and Dagster's linked asset makes one; every
field rule is checked when a config is made. Cheap to import (no Beam, torch or MLflow): the
CLI's parser reads it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pipelines.runners import (
    BeamJob,
    dask_address_option,
    dask_workers_option,
    device_option,
    direct_workers_option,
    known_or_as_given,
    runner_option,
)
from schemas.config_fields import OFF, option, validate
from schemas.errors import MmlinksError

ASSIGN_MODES = ("matching", "argmax")
ALL_SPLITS = "all"
INPUT, MODEL, OUTPUT, RUNNER = "input", "model and links", "output", "runner"


def _min_score(text: str) -> float | str:
    if str(text).strip().lower() == OFF:
        return OFF
    try:
        return float(text)
    except ValueError:
        raise MmlinksError(f"--min-score wants a cosine score like 0.2 or 'off', not {text!r}") from None


@dataclass
class LinkConfig(BeamJob):
    """Every option of a batch-linking job (`mmlinks link` flags; Dagster's linked asset)."""

    model: str = option(
        help="MLflow model to link with, e.g. models:/mmlinks-ap@production, models:/NAME/3, "
        "runs:/RUN/model (an alias is resolved once, before the job, to a concrete version)",
        group=MODEL,
    )
    out: str = option(help="output folder for link shards + manifest.json", group=OUTPUT)
    data: str | None = option(
        None, help="built dataset directory (holds manifest.json)", metavar="DATASET_DIR", group=INPUT
    )
    input: str | None = option(
        None,
        help="raw documents instead of --data: read, validated and featurised by the build's own "
        "stages (pipelines/graph.py) with the model's feature extractor; needs --source",
        metavar="RAW",
        group=INPUT,
    )
    source: str | None = option(
        None, help="raw source format of --input (see `mmlinks data sources`)", group=INPUT
    )
    split: str = option(
        ALL_SPLITS, help="link only this split of --data (train, val, test) or all", group=INPUT
    )
    assign: str = option(
        "matching",
        help="matching: one-to-one maximum-weight matching of sentences and images (exact); "
        "argmax: each image to its best sentence (mmc4's way)",
        choices=ASSIGN_MODES,
        group=MODEL,
    )
    min_score: float | str = option(
        OFF,
        help="leave an image unlinked when its link scores below this cosine, or 'off'",
        parse=_min_score,
        check=lambda v: v == OFF or (isinstance(v, int | float) and -1.0 <= float(v) <= 1.0),
        rule="a cosine in [-1, 1] or 'off'",
        metavar="SCORE|off",
        group=MODEL,
    )
    keep_scores: bool = option(
        False, help="also write each document's sentence x image score matrix", group=OUTPUT
    )
    eval: bool = option(
        False,
        help="where documents have ground-truth links: link precision/recall/F1 of the predicted "
        "links and AUC, p@1, p@5 of the scores (the numbers `mmlinks evaluate` gives)",
        group=OUTPUT,
    )
    batch_docs: int = option(64, help="documents scored per padded forward pass", at_least=1, group=MODEL)
    max_sentences: int = option(
        200,
        help="dead-letter documents with more sentences (too large)",
        at_least=1,
        group=MODEL,
    )
    max_images: int = option(
        200,
        help="dead-letter documents with more images (too large)",
        at_least=1,
        group=MODEL,
    )
    image_store: str | None = option(
        None,
        help="with --input: the content-addressed image store (default: OUT/image-store); pass the "
        "build's to reuse its images and cached features",
        group=INPUT,
    )
    runner: str = runner_option(RUNNER)
    direct_workers: int | None = direct_workers_option(RUNNER)
    dask_address: str | None = dask_address_option(RUNNER)
    dask_workers: int | None = dask_workers_option(RUNNER)
    device: str = device_option("scoring device (cuda where a GPU exists)", RUNNER)
    cpu_threads: int | None = option(
        None,
        help="torch threads per worker (default: cores / workers); recorded with the links, since "
        "CPU scores differ in the last bits with the thread count",
        at_least=1,
        group=RUNNER,
    )
    beam_args: list[str] = option(help="extra Beam pipeline options", flag="", default_factory=list)
    tracking_uri: str | None = option(
        None,
        help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else WORKDIR/mlflow.db)",
        flag="",
        secret=True,
    )
    workdir: str = option(
        ".", help="where the default mlflow.db lives (MLFLOW_TRACKING_URI wins)", group=MODEL
    )

    def __post_init__(self) -> None:
        self.runner = known_or_as_given(self.runner)  # "dask" in a settings file, as on the CLI
        validate(self, "link config")
        if (self.data is None) == (self.input is None):
            raise MmlinksError("give exactly one of --data DATASET_DIR or --input RAW (with --source)")
        if self.input is not None and not self.source:
            raise MmlinksError("--input needs --source (the raw format, see `mmlinks data sources`)")
        if self.input is not None and self.split != ALL_SPLITS:
            raise MmlinksError(
                "--split selects shards of --data; raw --input documents are linked as they come"
            )
        if self.data is not None and self.source:
            raise MmlinksError("--source goes with --input; a --data dataset names its own source")

    def threshold(self) -> float:
        return float("-inf") if self.min_score == OFF else float(self.min_score)

    def identity(self) -> dict:
        """What, with the model version and the input, defines the links (the version id)."""
        return {
            "assign": self.assign,
            "min_score": None if self.min_score == OFF else float(self.min_score),
            "keep_scores": self.keep_scores,
            "split": self.split,
            "batch_docs": self.batch_docs,  # padded batches change CPU scores in the last bits
            "max_sentences": self.max_sentences,
            "max_images": self.max_images,
            "device": "cuda" if self.device.startswith("cuda") else "cpu",
            "cpu_threads": self.threads(),
        }

    def to_dict(self) -> dict:
        return asdict(self)
