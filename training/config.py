"""Training configuration: one dataclass, paper defaults, every field logged to MLflow.

About 500 lines on purpose: it is one thing, the ~60 options of ``TrainConfig`` with each one's
default, help and allowed values (``schemas.config_fields.option``), which the CLI, the Dagster
settings and the Ray job payloads are generated from, plus their validation and presets. Split
up, a reader would lose the one place that lists every training option."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from schemas.config_fields import option
from training.backbone import DEFAULT_BACKBONE, backbone_names
from training.objectives.registry import DEFAULT_OBJECTIVE, LI2021_PARTS, get_objective, objective_names
from training.text_pooling import TEXT_POOLING

# The registries define the names (objective_names(), backbone_names()): no copy is kept here,
# so an objective or backbone registered later is a valid choice too.
__all__ = [
    "LI2021_PARTS",
    "MODEL_FIELDS",
    "PRESETS",
    "SELECTION_ORDER",
    "TrainConfig",
    "preset_values",
]


def news_names(name: str) -> tuple[str, ...]:
    """The fusers / losses of the news objective (``training/news/__init__.py``, no torch)."""
    import training.news

    return getattr(training.news, name)


def li2021_part_choices() -> tuple[str, ...]:
    """C alone or with any of the other Li 2021 parts, in their order: C, C+I, C+D, C+I+D."""
    from itertools import combinations

    rest = LI2021_PARTS[1:]
    return tuple("+".join(("C", *c)) for r in range(len(rest) + 1) for c in combinations(rest, r))


# --select-by: which epoch's checkpoint becomes the model, and whether its metric is minimised.
SELECTION_ORDER = {"val_loss": "min", "val_within": "max", "val_medr": "min"}
PRETRAINED = "pretrained towers (--backbone minilm|clip, issue #20)"
RETRIEVAL = "coherence retrieval (Alikhani et al.; --objective cmca|cmcm|cmcm-c)"
NEWS = "news image selection (Liu et al.; --objective news)"

# --preset: named bundles of TrainConfig values, under the flags a user gives. "paper" is Hessel
# et al. 2019 as published where mmlinks' defaults deviate from it (docs/training.md,
# "Confounded documents": the paper's GRU final state learns nothing inside documents that share
# a style, and its checkpoint choice by validation loss cannot see that).
PRESETS: dict[str, dict] = {
    "paper": {"text_pooling": "last", "select_by": "val_loss"},
}


def preset_values(name: str | None) -> dict:
    """The values of preset ``name`` (none for "" or None); a clear error for an unknown one."""
    if not name:
        return {}
    if name not in PRESETS:
        from schemas.errors import MmlinksError

        raise MmlinksError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return dict(PRESETS[name])


MODEL = "model and objective (defaults: Hessel et al. 2019 unless noted)"
RAY = "Ray Train"
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
    "text_pooling",
    "transformer_layers",
    "transformer_heads",
    "max_regions",
    "tower_tuning",
    "unfreeze_blocks",
    "clip_model",
    "relation",
    "retrieval_pooling",
    "d_shared",
    "cam_hidden",
    "news_sources",
    "fusion",
    "news_loss",
    "news_encoder",
    "subword_buckets",
    "news_heads",
    "multilingual",
    "init_from",
    "seed",
)


@dataclass
class TrainConfig:
    """Every training option: its default, help and allowed values live here and nowhere else
    (the CLI flags, the Dagster settings and a Ray job's ``--config`` JSON are derived from it)."""

    data: str = option("", help="dataset directory (holds manifest.json)", flag="")
    objective: str = option(
        DEFAULT_OBJECTIVE,
        help="training objective: the NoStruct baseline, Hessel 2019's DC, TK or AP (assignment) "
        "document similarity, or Li et al. 2021",
        choices=objective_names,
        group=MODEL,
    )
    k: str = option("full", help="k for TK/AP", choices=("full", "half"), group=MODEL)
    negatives: str = option(
        "hard", help="pool in-batch negatives by max (hard) or mean", choices=("hard", "mean"), group=MODEL
    )
    objectives: str = option(
        "C",
        help="li2021 terms: C cross-document, I intra-document NegTK, D dropout sub-document",
        choices=lambda: li2021_part_choices(),
        group=MODEL,
    )
    backbone: str = option(
        DEFAULT_BACKBONE,
        help="text/image encoders: GRU + projected CNN feature (Hessel 2019); Transformers over words "
        "and over region features + concept tokens (Li 2021; needs a dataset built with --regions); "
        "minilm = the pretrained all-MiniLM-L6-v2 sentence encoder + projected CNN feature; clip = CLIP's "
        "text tower + the dataset's CLIP image embeddings (--clip-weights, a clip-vit-b32 dataset)",
        choices=backbone_names,
        group=MODEL,
    )
    sub_fraction: float = option(
        0.8,
        help="li2021 D: share of sentences and images kept in a sub-document (paper: 0.6 DII/SIS)",
        check=lambda v: 0 < v <= 1,
        rule="in (0, 1]",
        group=MODEL,
    )
    margin: float = option(
        0.2, help="hinge margin", check=lambda v: v >= 0, rule=">= 0", flag="", group=MODEL
    )
    batch_docs: int = option(
        11, help="documents per batch, B", check=lambda v: v >= 2, rule=">= 2", group=MODEL
    )
    lr: float = option(1e-4, help="Adam learning rate", check=lambda v: v > 0, rule="> 0", group=MODEL)
    warmup_steps: int = option(
        0,
        help="linear learning-rate warm-up steps from lr/1000 (Li et al. 2021: 3000)",
        check=lambda v: v >= 0,
        rule=">= 0",
        group=MODEL,
    )
    epochs: int = option(50, help="epochs", check=lambda v: v >= 1, rule=">= 1", group=MODEL)
    plateau_patience: int = option(
        3, help="epochs without val-loss improvement before lr x plateau_factor", flag="", group=MODEL
    )
    plateau_factor: float = option(0.2, help="learning-rate factor on a plateau", flag="", group=MODEL)
    max_tokens: int = option(
        20, help="tokens kept per sentence", check=lambda v: v >= 1, rule=">= 1", group=MODEL
    )
    min_word_count: int = option(
        5, help="vocabulary min count", check=lambda v: v >= 1, rule=">= 1", group=MODEL
    )
    word_vectors: str = option(
        "glove",
        help="'glove' (offline GloVe 6B 50-d), 'random', or a file: word2vec/GloVe/fastText text, word2vec "
        "binary (.bin) or a fastText model (.bin); force a format with text:, word2vec-bin: or fasttext:; "
        "several files comma-separated (aligned vectors, one per language; an earlier file wins a word)",
        group=MODEL,
    )
    d_multi: int = option(
        1024,
        help="joint space width = GRU units (paper: 1024)",
        check=lambda v: v >= 1,
        rule=">= 1",
        group=MODEL,
    )
    select_by: str = option(
        "val_within",
        help="which epoch's checkpoint is the model: val_loss = lowest validation loss (paper); "
        "val_within = widest within-document gap on validation documents (label-free; a model that "
        "only tells documents apart by their style keeps it near 0); val_medr = lowest validation MedR "
        "(the retrieval objectives' default, Alikhani et al.)",
        choices=lambda: tuple(SELECTION_ORDER),
        group=MODEL,
    )
    text_pooling: str = option(
        "max",
        help="how a sentence becomes one vector (gru backbone): last = the GRU's final state (paper), "
        "mean / max over its states, bigru = bidirectional, bag = mean word embedding + linear",
        choices=lambda: tuple(TEXT_POOLING),
        group=MODEL,
    )
    image_dropout: float = option(
        0.4,
        help="dropout on the image feature",
        check=lambda v: 0 <= v < 1,
        rule="in [0, 1)",
        flag="",
        group=MODEL,
    )
    transformer_layers: int = option(
        3, help="transformer layers", check=lambda v: v >= 1, rule=">= 1", group=MODEL
    )
    transformer_heads: int = option(
        8, help="attention heads", check=lambda v: v >= 1, rule=">= 1", group=MODEL
    )
    max_regions: int = option(
        36, help="regions per image, by score", check=lambda v: v >= 1, rule=">= 1", group=MODEL
    )
    tower_tuning: str = option(
        "heads",
        help="pretrained towers (minilm, clip): frozen = the encoder as is, only the image side learns "
        "its space; heads = frozen encoder + trained text and image heads; last-blocks = heads + the "
        "encoder's last --unfreeze-blocks blocks at lr x --encoder-lr-scale",
        choices=("frozen", "heads", "last-blocks"),
        group=PRETRAINED,
    )
    unfreeze_blocks: int = option(
        2,
        help="last-blocks: how many of the encoder's last transformer blocks train",
        check=lambda v: v >= 1,
        rule=">= 1",
        group=PRETRAINED,
    )
    encoder_lr_scale: float = option(
        0.1,
        help="last-blocks: the unfrozen blocks' learning rate as a fraction of --lr",
        check=lambda v: 0 < v <= 1,
        rule="in (0, 1]",
        group=PRETRAINED,
    )
    clip_model: str = option(
        "ViT-B-32",
        help="--backbone clip: the open_clip architecture of the weights (ViT-B-32-quickgelu for "
        "OpenAI's release file) or an open_clip JSON config file",
        group=PRETRAINED,
    )
    clip_weights: str = option(
        "",
        help="--backbone clip: the CLIP weight file the dataset's clip-vit-b32 features were built "
        "with (default: $MMLINKS_WEIGHTS_DIR/clip-vit-b32.pt or the torch cache; nothing is downloaded)",
        group=PRETRAINED,
    )
    relation: str = option(
        "",
        help="cmcm-c: the one relation its Coherence Aware Module predicts (a name of the dataset's "
        "relation vocabulary, e.g. Action)",
        group=RETRIEVAL,
    )
    hard_negative_warmup: int = option(
        1,
        help="retrieval: first epochs with the hinge averaged over every in-batch negative before the "
        "hardest one (from random weights the hardest-negative loss collapses)",
        check=lambda v: v >= 0,
        rule=">= 0",
        group=RETRIEVAL,
    )
    lambda_cls: float = option(
        0.1,
        help="weight of the coherence loss (paper: 0.1)",
        check=lambda v: v >= 0,
        rule=">= 0",
        group=RETRIEVAL,
    )
    retrieval_pooling: str = option(
        "attention",
        help="text pooling of the retrieval backbone: word attention (paper) or mean / last (NoAttn)",
        choices=("attention", "mean", "last"),
        group=RETRIEVAL,
    )
    d_shared: int = option(
        300,
        help="the shared text-image space of the retrieval models",
        check=lambda v: v >= 1,
        rule=">= 1",
        group=RETRIEVAL,
    )
    cam_hidden: int = option(
        0,
        help="cmcm / cmcm-c: width of a ReLU hidden layer in the Coherence Aware Module (0 = one linear "
        "layer on concat(text, image), the paper's; a hidden layer can model the agreement of the two "
        "sides, which a linear layer, a sum of one term per side, cannot)",
        check=lambda v: v >= 0,
        rule=">= 0",
        group=RETRIEVAL,
    )
    refine_lambda: float = option(
        0.12,
        help="selective refinement: lambda of the confidence exp(lambda |p - 0.5|) "
        "(paper: 0.13 CITE++, 0.12 Clue)",
        check=lambda v: v >= 0,
        rule=">= 0",
        group=RETRIEVAL,
    )
    refine_threshold: float = option(
        0.1,
        help="selective refinement: queries whose top-2 similarity gap is below this are refined "
        "(paper: 0.1)",
        check=lambda v: v >= 0,
        rule=">= 0",
        group=RETRIEVAL,
    )
    pool_size: int = option(
        500,
        help="retrieval candidates per pool (paper: 500)",
        check=lambda v: v >= 2,
        rule=">= 2",
        group=RETRIEVAL,
    )
    n_pools: int = option(
        10,
        help="random pools the retrieval metrics average over",
        check=lambda v: v >= 1,
        rule=">= 1",
        group=RETRIEVAL,
    )
    news_sources: str = option(
        "headline,lead,body,caption",
        help="news: the text sources the model reads, comma-separated (one: a single-source model)",
        group=NEWS,
    )
    fusion: str = option(
        "attention",
        help="news: how the sources' vectors become one: element-wise max, add, mlp (two Linear+ReLU "
        "blocks) or attention (the paper's Feature Fuser)",
        choices=lambda: news_names("FUSERS"),
        group=NEWS,
    )
    random_drop: float = option(
        0.0,
        help="news: per training sample keep one random source and drop each other one with this "
        "probability (paper: 0.3; 0 = complete inputs)",
        check=lambda v: 0 <= v < 1,
        rule="in [0, 1)",
        group=NEWS,
    )
    news_loss: str = option(
        "vse",
        help="news: vse = sum of hinges over all in-batch negatives (the paper's choice for weak labels), "
        "vsepp = hardest negative, hal = Liu et al. 2020 (Eq. 5), order = ORDER (Vendrov et al. 2016: "
        "non-negative order embeddings scored by the negative order violation, vse's hinges; "
        "paper margin 0.05)",
        choices=lambda: news_names("LOSSES"),
        group=NEWS,
    )
    news_encoder: str = option(
        "attention",
        help="news: the per-source text encoder: attention = the paper's self-attention + point-wise CNN "
        "over word vectors; chain = CHAIN (Wehrmann & Barros 2018): characters -> 1-D convolutions -> "
        "max pool, no word embedding (Table 1's baseline)",
        choices=lambda: news_names("ENCODERS"),
        group=NEWS,
    )
    subword_buckets: int = option(
        0,
        help="news: fastText-style character 3-6-gram buckets added to the word vectors (0 = words only; "
        "fastText: 2000000)",
        check=lambda v: v >= 0,
        rule=">= 0",
        group=NEWS,
    )
    news_heads: int = option(
        2,
        help="news: self-attention heads per source encoder (the word vector size must divide by it; "
        "paper: 6)",
        check=lambda v: v >= 1,
        rule=">= 1",
        group=NEWS,
    )
    multilingual: str = option(
        "none",
        help="news, Liu et al. Sect. 5.2: one-for-all = one model over every language of the dataset "
        "(mixed in a batch) on FROZEN aligned word vectors (--word-vectors text:en.vec,text:de.vec); "
        "all-for-one = start from a language-A model (--init-from DIR), swap in this dataset's "
        "language-B vectors plus its out-of-vocabulary words, fine-tune everything",
        choices=("none", "one-for-all", "all-for-one"),
        group=NEWS,
    )
    init_from: str = option(
        "",
        help="news: start from trained weights: DIR (a checkpoint folder with state.pt and meta.json: "
        "every weight but the word embeddings for all-for-one, all of them otherwise) or divide and "
        "conquer's SOURCE=DIR,... (each source encoder from its single-source model; word embeddings "
        "and image tower from the first listed, the fuser fresh)",
        group=NEWS,
    )
    fuser_warmup_epochs: int = option(
        0,
        help="news, divide and conquer: epochs in which only the fuser trains (the loaded encoders "
        "and image tower get zero gradients; paper: 1)",
        check=lambda v: v >= 0,
        rule=">= 0",
        group=NEWS,
    )
    seed: int = option(0, help="random seed", group=MODEL)
    num_workers: int = option(
        2,
        help="Ray Train workers, each one process; 0 runs the loop in this process (no worker "
        "processes to start: for debugging, small data and grids of small runs)",
        flag="--workers",
        check=lambda v: v >= 0,
        rule=">= 0",
        group=RAY,
    )
    use_gpu: bool = option(False, help="one GPU per worker", flag="--gpu", group=RAY)
    threads_per_worker: int = option(1, help="torch threads per worker", flag="", group=RAY)
    max_failures: int = option(
        0,
        help="worker failures to retry from the last checkpoint",
        check=lambda v: v >= 0,
        rule=">= 0",
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

    def __post_init__(self) -> None:
        # The retrieval objectives pick the epoch by validation MedR (the paper); val_within,
        # the link default, has no meaning for pairs.
        if self.select_by == "val_within" and self._family() == "retrieval":
            self.select_by = "val_medr"
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
        to ``python -m training.job --config`` (a hand-written file, a job submitted by hand): an
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
        if self.num_workers == 0 and self.use_gpu:
            bad.append("use_gpu (--gpu needs --workers >= 1: --workers 0 runs on this process's CPU)")
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
