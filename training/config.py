"""Training configuration: one dataclass users, the CLI and a Ray job see, declared in parts.

``TrainConfig`` joins the core's options (``CoreFields``) with each family's
(``training.families.FIELDS``). Why declared once per field (``option``): the CLI, the Dagster
settings and the Ray job payloads are generated from it, ``--help`` grouped core first."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

from schemas.config_fields import option
from training.backbone import DEFAULT_BACKBONE, backbone_names
from training.families import family_fields
from training.objectives.registry import DEFAULT_OBJECTIVE, get_objective, objective_names

# The registries define the names (objective_names(), backbone_names()): no copy is kept here,
# so an objective or backbone registered later is a valid choice too.


def workers_or_auto(text: str) -> int:
    """``--workers``: a number >= 0, or ``auto`` (-1, resolved in ``TrainConfig.__post_init__``)."""
    from schemas.errors import MmlinksError

    word = str(text).strip().lower()
    if word == "auto":
        return -1
    if not word.isdigit():
        raise MmlinksError(f"wants a number of workers (0 or more) or 'auto', not {text!r}")
    return int(word)


# --select-by: which epoch's checkpoint becomes the model, and whether its metric is minimised.
SELECTION_ORDER = dict(val_loss="min", val_within="max", val_structure="max", val_medr="min", last="max")
WITHIN_SIGNALS = ("val_within", "val_structure")  # label-free, read inside documents: the link family's

# Options whose "auto" value ``TrainConfig.__post_init__`` resolves by objective and backbone
# (select_by's default, val_within, becomes val_medr for the retrieval objectives).
AUTO_VALUES: dict[str, Any] = {
    "batch_sampling": "auto",
    "word_vectors": "auto",
    "image_dropout": -1,
    "select_by": "val_within",
    "num_workers": -1,
}


# --preset: named bundles of TrainConfig values, under the flags a user gives. "paper" is Hessel
# et al. 2019 as published where mmlinks' defaults deviate from it (docs/training.md,
# "Confounded documents": the paper's GRU final state learns nothing inside documents that share
# a style, and its checkpoint choice by validation loss cannot see that; issue #33: when a
# document's images share a strong look, the raw image feature and hard negatives from the first
# step leave the model at chance, so images are also read centred on their document and the
# first epochs use mean negatives). For the retrieval objectives it is Alikhani et al. as published:
# TrainConfig's core values, a linear image bottleneck, the coherence loss into the shared
# encoders, instead of their own defaults (``ObjectiveSpec.train_defaults``, issue #45).
PRESETS: dict[str, dict] = {
    "paper": {
        "text_pooling": "last",
        "select_by": "val_loss",
        "image_centring": "none",
        "negatives_warmup": 0,
        "image_dropout": 0.4,
        "batch_sampling": "random",
        "word_vectors": "glove",  # pretrained vectors (the papers': word2vec; GloVe offline here)
        # Alikhani et al. (the retrieval objectives; issue #45 changed their defaults)
        "image_layers": 0,
        "cam_gradient": "shared",
        "cam_hidden": 0,
        "retrieval_margin": 0.3,
        "query_bank": 0,
    },
}


def preset_values(name: str | None, objective: str | None = None) -> dict:
    """The values of preset ``name``; for no preset ("" or None), ``objective``'s own training
    defaults (``ObjectiveSpec.train_defaults``; the paper preset keeps the published settings
    instead); a clear error for an unknown preset."""
    if not name:
        spec = get_objective(objective) if objective in objective_names() else None
        return dict(spec.train_defaults) if spec else {}
    if name not in PRESETS:
        from schemas.errors import MmlinksError

        raise MmlinksError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return dict(PRESETS[name])


CORE = "training, every family (defaults: Hessel et al. 2019 unless noted)"
SHARED = "the shared text-image space and its ranking pools (coherence retrieval and news)"
RAY = "Ray Train"
# The core's fields a resumed run must share with its checkpoint: they define the model or the
# loss, or which negatives the loss sees (the batches); each family's own are its fields class's
# MODEL_FIELDS.
CORE_MODEL_FIELDS = (
    "data",
    "objective",
    "backbone",
    "batch_sampling",
    "max_tokens",
    "min_word_count",
    "word_vectors",
    "max_regions",
    "d_shared",
    "seed",
)


@dataclass
class CoreFields:
    """The options every family trains with, and the ones the core itself reads (the loop, the
    data, checkpoint selection, the shared space and ranking pools, Ray Train)."""

    data: str = option("", help="dataset directory (holds manifest.json)", flag="")
    objective: str = option(
        DEFAULT_OBJECTIVE,
        help="training objective: the NoStruct baseline, Hessel 2019's DC, TK or AP (assignment) "
        "document similarity, or Li et al. 2021",
        choices=objective_names,
        group=CORE,
    )
    backbone: str = option(
        DEFAULT_BACKBONE,
        help="text/image encoders: GRU + projected CNN feature (Hessel 2019); bag = the simplest model "
        "(mean word embedding + linear, linear image projection: the baseline every default must "
        "beat); Transformers over words and over region features + concept tokens (Li 2021; needs a "
        "dataset built with --regions); "
        "minilm = the pretrained all-MiniLM-L6-v2 sentence encoder + projected CNN feature; clip = CLIP's "
        "text tower + the dataset's CLIP image embeddings (--clip-weights, a clip-vit-b32 dataset)",
        choices=backbone_names,
        group=CORE,
    )
    margin: float = option(0.2, help="hinge margin", at_least=0, flag="", group=CORE)
    batch_docs: int = option(11, help="documents per batch, B", at_least=2, group=CORE)
    lr: float = option(1e-4, help="Adam learning rate", check=lambda v: v > 0, rule="> 0", group=CORE)
    warmup_steps: int = option(
        0,
        help="linear learning-rate warm-up steps from lr/1000 (Li et al. 2021: 3000)",
        at_least=0,
        group=CORE,
    )
    batch_sampling: str = option(
        "auto",
        help="how training batches are drawn: random, or similar = each batch a document and its "
        "nearest neighbours by mean image feature and words (--near-share of it), the rest random, so "
        "in-batch negatives share the topic's look and words and only the content tells them apart "
        "(issue #44, Li et al. 2021's sampling bias: AUC 60 -> 98 where 200 topics share a clipped "
        "look); auto = similar for the link and the coherence retrieval objectives (issue #45: CMCA MedR "
        "9.0 -> 8.1 on the graded corpus), random for --backbone bag (the plain baseline) and the news "
        "family",
        choices=("auto", "random", "similar"),
        group=CORE,
    )
    near_share: float = option(
        0.5,
        help="--batch-sampling similar: share of a batch (after its first document) taken from its "
        "nearest neighbours",
        within=(0, 1),
        group=CORE,
    )
    epochs: int = option(50, help="epochs", at_least=1, group=CORE)
    plateau_patience: int = option(
        3, help="epochs without val-loss improvement before lr x plateau_factor", flag="", group=CORE
    )
    plateau_factor: float = option(0.2, help="learning-rate factor on a plateau", flag="", group=CORE)
    max_tokens: int = option(20, help="tokens kept per sentence", at_least=1, group=CORE)
    min_word_count: int = option(5, help="vocabulary min count", at_least=1, group=CORE)
    word_vectors: str = option(
        "auto",
        help="the words' starting vectors: auto = random for the link and coherence objectives (ap, "
        "cmca, cmcm...), glove for news. GloVe starts the words that tell images apart (numbers, "
        "tools, colours) nearly parallel: where topics share a look and words the link default "
        "stayed at AUC 63 with GloVe and reached 98 with random vectors (issue #44); coherence "
        "retrieval put a caption's small digit in its top 5 for 26.8 percent of captions with GloVe, 59.2 "
        "with random (issue #45; docs/benchmarks.md). "
        "'glove' (offline GloVe 6B 50-d), 'random', or a file: word2vec/GloVe/fastText text, word2vec "
        "binary (.bin) or a fastText model (.bin); force a format with text:, word2vec-bin: or fasttext:; "
        "several files comma-separated (aligned vectors, one per language; an earlier file wins a word)",
        group=CORE,
    )
    select_by: str = option(
        "val_within",
        help="which epoch's checkpoint is the model: val_loss = lowest validation loss (paper); "
        "val_within = widest within-document gap on validation documents (label-free; a model that "
        "only tells documents apart by their style keeps it near 0); val_structure = most link "
        "structure (the gap double-centred, in units of its spread, minus chance: scale-free); "
        "val_medr = lowest validation MedR (the retrieval objectives' default, Alikhani et al.); "
        "last = the last epoch (what --image-centring auto sets where its trials ran the run's epochs, "
        "unless a rule other than val_within is given here)",
        choices=lambda: tuple(SELECTION_ORDER),
        group=CORE,
    )
    image_dropout: float = option(
        -1.0,
        help="dropout on the image feature; -1 = auto: with the gru backbone's --image-centring auto, "
        "measured with the image side (0 or 0.4, issue #60: 0.4 left topics photographed in several looks "
        "at AUC 77 where 0 reached 98; 0 left issue #33's per-document looks at 68 where 0.4 reached "
        "90), else the paper's 0.4",
        check=lambda v: 0 <= v < 1 or v == -1,
        rule="in [0, 1), or -1 (auto)",
        group=CORE,
    )
    max_regions: int = option(36, help="regions per image, by score", at_least=1, group=CORE)
    seed: int = option(0, help="random seed", group=CORE)
    d_shared: int = option(
        300,
        help="the shared text-image space of the retrieval models",
        at_least=1,
        group=SHARED,
    )
    pool_size: int = option(
        500,
        help="retrieval candidates per pool (paper: 500)",
        at_least=2,
        group=SHARED,
    )
    n_pools: int = option(
        10,
        help="disjoint pools the retrieval metrics average over, at most (as many as the split "
        "holds: 600 pairs hold one pool of 500)",
        at_least=1,
        group=SHARED,
    )
    num_workers: int = option(
        -1,
        help="Ray Train workers, each one process; 0 runs the loop in this process (no worker "
        "processes to start). auto (-1, the default): 0 on one machine, as fast a step and no Ray "
        "to start (docs/benchmarks-training.md); 2 where Ray's workers do what this process "
        "cannot: a cluster (--ray-address), a remote --storage-path, retries (--max-failures)",
        flag="--workers",
        parse=workers_or_auto,
        metavar="N|auto",
        check=lambda v: v >= -1,
        rule=">= 0, or -1 (auto)",
        group=RAY,
    )
    use_gpu: bool = option(
        False,
        help="one GPU per worker (with --workers 0: this process trains on its first GPU)",
        flag="--gpu",
        group=RAY,
    )
    threads_per_worker: int = option(
        0,
        help="torch threads per worker; 0 = auto: OMP_NUM_THREADS where set (Ray sets it in its "
        "workers to the CPUs it gave them, 1), else every core this process may use (--workers 0)",
        flag="",
        at_least=0,
        group=RAY,
    )
    max_failures: int = option(
        0,
        help="worker failures to retry from the last checkpoint",
        at_least=0,
        group=RAY,
    )
    cache_data: str = option(
        "auto",
        help="keep the training shards in Ray's object store between epochs (auto: if <= 2 GiB on "
        "disk) or stream them from the shards every epoch (no: for data larger than memory)",
        choices=("auto", "yes", "no"),
        group=RAY,
    )
    storage_path: str = option(
        "", help="Ray Train storage (path or URI; default: next to the data)", secret=True, group=RAY
    )
    run_name: str = option(
        "", help="Ray Train run name; reuse one (with the same --storage-path) to resume it", group=RAY
    )
    ray_address: str = option(
        "", help="existing Ray cluster address (default: local Ray)", secret=True, group=RAY
    )
    ray_logs: bool = option(False, help="forward worker logs to this console", flag="", group=RAY)


# The families' options, in training.families.FIELDS order. A dataclass takes its bases' fields
# from the last base to the first, so the reversed families come before CoreFields: the core's
# fields first, then each family's in order (asdict, --help, the Dagster settings).
FAMILY_FIELDS = family_fields()
# Fields a resumed run must share with its checkpoint: they define the model or the loss.
MODEL_FIELDS = (*CORE_MODEL_FIELDS, *(name for cls in FAMILY_FIELDS for name in cls.MODEL_FIELDS))


@dataclass
class TrainConfig(*reversed(FAMILY_FIELDS), CoreFields):
    """Every training option, the core's and each family's: its default, help and allowed values
    live in its fields class and nowhere else (the CLI flags, the Dagster settings and a Ray
    job's ``--config`` JSON are derived from this class)."""

    MODEL_FIELDS: ClassVar[tuple[str, ...]] = MODEL_FIELDS  # all of them, not one family's

    def __post_init__(self) -> None:
        # the fields resolved below from their "auto" value, by objective: ``given_dict`` puts
        # them back, so a grid trial of another objective resolves them for its own
        self._resolved: dict[str, Any] = {
            name: auto for name, auto in AUTO_VALUES.items() if getattr(self, name) == auto
        }
        # The retrieval objectives pick the epoch by validation MedR (the paper); val_within,
        # the link default, has no meaning for pairs.
        if self.select_by == "val_within" and self._family() == "retrieval":
            self.select_by = "val_medr"
        # issue #44: the link family starts its words random and draws batches of similar
        # documents (docs/benchmarks-linking.md)
        link = self._family() == "link"
        if self.batch_sampling == "auto":
            # similar for linking and coherence retrieval (issue #45: CMCA MedR 9.0 -> 8.1, CMCM
            # 9.4 -> 8.5, at a cost to CMCM's relation head: mAP 0.94 -> 0.78, docs/benchmarks.md);
            # the bag backbone is the floor the default may not fall below: trained plainly
            coherence = self.model_backbone == "coherence"
            self.batch_sampling = "similar" if (link and self.backbone != "bag") or coherence else "random"
        split_decides = link and self.backbone == "gru" and self.image_centring == "auto"
        if self.image_dropout == -1 and not split_decides:  # else measured: training/link/image_side.py
            self.image_dropout = 0.4
        if (
            self.word_vectors == "auto"
        ):  # issue #45: coherence retrieval too (GloVe's digits are near-parallel)
            self.word_vectors = "random" if link or self.model_backbone == "coherence" else "glove"
        if self.num_workers == -1:  # issue #63: one machine trains in this process
            remote = self.ray_address or "://" in (self.storage_path or "") or self.max_failures > 0
            self.num_workers = 2 if remote else 0
        self.validate()

    def _family(self) -> str:
        spec = self._objective()
        return spec.family if spec else "link"

    @property
    def model_backbone(self) -> str:
        """The backbone that is trained: the objective's own (retrieval: coherence) or --backbone."""
        spec = self._objective()
        return (spec.backbone if spec else None) or self.backbone

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

    @property
    def objective_spec(self):
        """The registered ``ObjectiveSpec`` of ``objective``, for code the objective plugs in
        (``training/retrieval/objective.py``) that reads its spec without importing the registry."""
        return get_objective(self.objective)

    def _objective(self):
        """The registered spec of ``objective``; None for an unknown name (``validate`` refuses it)."""
        return get_objective(self.objective) if self.objective in objective_names() else None

    def to_dict(self) -> dict:
        return asdict(self)

    def given_dict(self) -> dict:
        """``to_dict`` with the fields this config resolved from "auto" (``AUTO_VALUES``) as
        given: the base of a grid's trials, each of which names its own objective, so the news
        rows start from GloVe and random batches, not from what ``ap`` resolved them to."""
        return {**asdict(self), **getattr(self, "_resolved", {})}

    def public_dict(self) -> dict:
        """The config minus fields that may carry hosts or credentials (cluster address, a
        storage URI with keys); this is what goes into params, artifacts and checkpoints."""
        out = {k: v for k, v in asdict(self).items() if k not in ("ray_address", "storage_path")}
        out["similarity"] = self.similarity
        return out

    @classmethod
    def from_dict(cls, data: dict, *, strict: bool = False) -> TrainConfig:
        """A config from its dict. Saved configs (checkpoints, an older version's run) are read
        leniently: keys this version no longer has are dropped. ``strict`` is for a config given
        to ``python -m models.job --config`` (a hand-written file, a job submitted by hand): an
        unknown key there is a typo, refused by name, not a setting silently left at its
        default. A Ray job that ``orchestration.ray_jobs`` submits sends every field of the
        submitter's TrainConfig, so a cluster running an older mmlinks than the submitter's
        refuses the fields it does not know (the message says why) instead of training without
        them."""
        from schemas.config_fields import refuse_unknown

        names = {f.name for f in fields(cls)}
        if strict:  # similarity: public_dict's alias of objective
            note = "or is this mmlinks older than the one that wrote the config?"
            refuse_unknown(
                cls, data, what="training config", ignore={"similarity"}, show_known=False, note=note
            )
        values = {k: v for k, v in data.items() if k in names}
        if "objective" not in values and data.get("similarity"):  # configs written before objectives
            values["objective"] = data["similarity"]
        return cls(**values)

    def validate(self) -> None:
        """Every field's own rule (``option``), then what the objective and backbone add."""
        from schemas.config_fields import problems
        from schemas.errors import MmlinksError

        bad = problems(self)
        if self.select_by == "val_medr" and self._family() != "retrieval":
            bad.append("select_by (val_medr: only the retrieval objectives report it)")
        if self.select_by in WITHIN_SIGNALS and self._family() == "retrieval":
            bad.append(f"select_by ({self.select_by} measures inside documents; pairs have none: val_medr)")
        if self.num_workers == 0 and "://" in (self.storage_path or ""):
            bad.append("storage_path (--workers 0 keeps its checkpoints on local disk, not at a URI)")
        if self.model_backbone in backbone_names():
            from training.backbone import get_backbone

            check = get_backbone(self.model_backbone).check
            bad += check(self) if check else []
        if self.objective in objective_names():
            check = get_objective(self.objective).check
            bad += check(self) if check else []
        if bad:
            raise MmlinksError(f"invalid training config: {'; '.join(bad)}")
