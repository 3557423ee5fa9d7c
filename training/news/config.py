"""The news family's training options (Liu et al.; --objective news): sources, fuser, loss,
encoder, subwords, token limits, the multilingual recipes, --init-from and the staged recipe.
Joined into ``TrainConfig`` (``training.families.FIELDS``). No torch: the CLI imports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from schemas.config_fields import option
from training.news import AUTO_SUBWORD_BUCKETS, DEFAULT_NEWS_MAX_TOKENS

NEWS = "news image selection (Liu et al.; --objective news)"
PAPER_RANDOM_DROP = 0.3  # Liu et al. Sect. 6.2
NEWS_RECIPES = ("staged", "joint")


def drop_rate(cfg) -> float:
    """``--random-drop`` resolved: -1 (auto) is ``PAPER_RANDOM_DROP`` for a model of 2+ sources
    (the paper's fused models; complete inputs measured worse, docs/benchmarks.md) and 0 for a
    single-source one (nothing to drop)."""
    if cfg.random_drop >= 0:
        return float(cfg.random_drop)
    from schemas.news import parse_sources

    try:
        several = len(parse_sources(cfg.news_sources)) > 1
    except ValueError:  # news_sources' own check reports it
        several = False
    return PAPER_RANDOM_DROP if several else 0.0


def staged_recipe(cfg) -> bool:
    """Whether ``cfg`` trains by the staged recipe (``training/news/staged.py``): ``news_recipe``
    staged, 2+ sources, nothing loaded (``--init-from`` is a stage of its own: divide and
    conquer or all-for-one) and no multilingual recipe."""
    from schemas.news import parse_sources

    try:
        several = len(parse_sources(cfg.news_sources)) > 1
    except ValueError:
        return False
    return (
        cfg.news_recipe == "staged" and several and not cfg.init_from.strip() and cfg.multilingual == "none"
    )


def warmup_epochs(cfg) -> int:
    """``--fuser-warmup-epochs`` resolved: -1 (auto) is 1 (the paper's) for divide and conquer
    (``--init-from SOURCE=DIR,...``), else 0."""
    if cfg.fuser_warmup_epochs >= 0:
        return int(cfg.fuser_warmup_epochs)
    return 1 if "=" in (cfg.init_from or "") else 0


def news_names(name: str) -> tuple[str, ...]:
    """The fusers / losses of the news objective (``training/news/__init__.py``, no torch)."""
    import training.news

    return getattr(training.news, name)


def _token_limits_ok(text: str) -> bool:
    from schemas.news import parse_token_limits

    try:
        parse_token_limits(text)
    except ValueError:
        return False
    return True


@dataclass
class NewsFields:
    """The options of the ``news`` objective and backbone."""

    # the fields a resumed run must share with its checkpoint (``training.config.MODEL_FIELDS``)
    MODEL_FIELDS: ClassVar[tuple[str, ...]] = (
        "news_sources",
        "fusion",
        "news_loss",
        "news_encoder",
        "subword_buckets",
        "subword_pooling",
        "news_max_tokens",
        "news_heads",
        "multilingual",
        "init_from",
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
        -1.0,
        help="news: per training sample keep one random source and drop each other one with this "
        f"probability (0 = complete inputs); -1 = auto: {PAPER_RANDOM_DROP} (the paper's) for a model "
        "of 2+ sources, 0 for one",
        check=lambda v: v == -1 or 0 <= v < 1,
        rule="-1 or in [0, 1)",
        group=NEWS,
    )
    news_recipe: str = option(
        "staged",
        help="news, a model of 2+ sources without --init-from or --multilingual: staged = Liu et al. "
        "Sect. 6.2 in one command (one MLflow parent run, a nested run per stage): a single-source "
        "model per source, then their encoders + a fresh fuser (--fuser-warmup-epochs, auto 1, alone, "
        "then everything) with --random-drop, registered; each stage trains --epochs (t2i R@10 "
        "above joint on all five synthetic corpora measured, docs/benchmarks.md); joint = one run "
        "from scratch (before issue #46; its old defaults: --random-drop 0)",
        choices=NEWS_RECIPES,
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
        -1,
        help="news: buckets of the character 3-5-gram vectors pooled with each word's vector "
        "(--subword-pooling), unseen words included (Liu et al. Sect. 4.3.1; fastText: 2000000); "
        "-1 = auto: the --init-from "
        f"model's, else {AUTO_SUBWORD_BUCKETS} for the word encoder (fast on CPU), 0 for chain and "
        "one-for-all; 0 = words only",
        at_least=-1,
        group=NEWS,
    )
    subword_pooling: str = option(
        "sum-sqrt",
        help="news: how a word's vector and its n-gram vectors become one: sum-sqrt = their sum / "
        "sqrt(count) (a mean that keeps a random-initialised vector's length; measured better, "
        "docs/benchmarks.md), mean = their plain average (the paper's, on pre-trained fastText)",
        choices=lambda: news_names("SUBWORD_POOLINGS"),
        group=NEWS,
    )
    news_max_tokens: str = option(
        DEFAULT_NEWS_MAX_TOKENS,
        help="news: tokens kept per source, SOURCE=N,... (replaces --max-tokens for news; a source left "
        "out keeps the default); how many training texts were cut is logged and in the report",
        check=lambda v: _token_limits_ok(v),
        rule="SOURCE=N,... with N >= 1, SOURCE among headline, lead, body, caption",
        group=NEWS,
    )
    news_heads: int = option(
        2,
        help="news: self-attention heads per source encoder (the word vector size must divide by it; "
        "paper: 6)",
        at_least=1,
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
        -1,
        help="news, divide and conquer: epochs in which only the fuser trains (the loaded encoders "
        "and image tower get zero gradients; paper: 1); -1 = auto: 1 with --init-from SOURCE=DIR,... "
        "and in the staged recipe's fusion stage, else 0",
        at_least=-1,
        group=NEWS,
    )
