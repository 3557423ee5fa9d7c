"""The recipes of Liu et al. that start a news model from other weights (issue #18): one for all,
all for one and divide and conquer (docs/retrieval-news.md).

A word without an aligned vector keeps a fixed random vector (the paper maps it to <unk>), which
keeps two such words apart. Why loaded only at build time (``apply_init``): a checkpoint read
back later holds the trained weights and needs no files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from schemas.errors import MmlinksError
from schemas.news import parse_sources

# training.checkpoints.CHECKPOINT_FILE (not imported: checkpoints -> backbone -> news would be a
# cycle; tests/training/news/test_news_recipes.py checks they agree)
CHECKPOINT_FILE = "state.pt"
WORD_KEYS = ("embed.words.weight",)  # rows follow the vocabulary: never copied across vocabularies
if TYPE_CHECKING:  # pragma: no cover
    import torch

ARCH_KEYS = (
    "word_dim",
    "d",
    "d_hidden",
    "heads",
    "image_dim",
    "subword_buckets",
    "subword_pooling",
    "encoder",
    "score",
)
# checkpoints from before these keys
ARCH_DEFAULTS = {"encoder": "attention", "score": "cosine", "subword_pooling": "sum-sqrt"}


def parse_init(text: str) -> dict[str, str]:
    """'' -> {}; 'DIR' -> {'': DIR} (the whole model); 'caption=DIR,headline=DIR2' -> per source,
    in the order given. ValueError for an unknown source or a mix of the two forms."""
    text = text.strip()
    if not text:
        return {}
    if "=" not in text:
        return {"": text}
    out: dict[str, str] = {}
    for part in text.split(","):
        name, sep, path = part.partition("=")
        if not sep or not path.strip():
            raise ValueError(f"{part!r} is not SOURCE=CHECKPOINT")
        parse_sources(name)  # ValueError for an unknown source name
        if name.strip() in out:
            raise ValueError(f"source {name.strip()!r} is given twice")
        out[name.strip()] = path.strip()
    return out


def read_checkpoint(folder: str | Path) -> tuple[dict, dict]:
    """(model config dict, state dict) of a training checkpoint folder."""
    import torch

    from training.news.model import NewsConfig

    folder = Path(folder)
    if not (folder / CHECKPOINT_FILE).is_file() or not (folder / "meta.json").is_file():
        raise MmlinksError(
            f"--init-from {folder}: not a checkpoint folder (needs {CHECKPOINT_FILE} and meta.json)"
        )
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise MmlinksError(f"--init-from {folder}: meta.json is not JSON ({e})") from None
    if meta.get("model", {}).get("backbone") != NewsConfig.backbone:  # the news backbone's name
        raise MmlinksError(f"--init-from {folder}: not a news model checkpoint")
    state = torch.load(folder / CHECKPOINT_FILE, map_location="cpu", weights_only=False)["model"]
    return meta["model"], state


def _check_arch(mine: dict, theirs: dict, where: str) -> None:
    bad = [k for k in ARCH_KEYS if mine.get(k, ARCH_DEFAULTS.get(k)) != theirs.get(k, ARCH_DEFAULTS.get(k))]
    if bad:
        diff = ", ".join(f"{k} {theirs.get(k)} there, {mine.get(k)} here" for k in bad)
        raise MmlinksError(f"--init-from {where}: a different architecture ({diff})")


def _copy(net: torch.nn.Module, state: dict, keep) -> list[str]:
    """Copy the entries of ``state`` whose name ``keep`` accepts into ``net``; their names."""
    own = net.state_dict()
    taken = {k: v for k, v in state.items() if keep(k) and k in own}
    for k, v in taken.items():
        if own[k].shape != v.shape:
            raise MmlinksError(
                f"--init-from: {k} has shape {tuple(v.shape)} there, {tuple(own[k].shape)} here"
            )
    own.update(taken)
    net.load_state_dict(own)
    return sorted(taken)


def apply_init(net, init_from: str, same_vocabulary: bool) -> list[str]:
    """Load ``init_from`` (``parse_init``'s forms) into ``net`` (a fresh ``NewsRetrieval``); the
    names of the loaded tensors. ``same_vocabulary``: the word embedding rows may be copied (divide
    and conquer on one dataset); False for all-for-one, where the rows are language B's."""
    plan = parse_init(init_from)
    mine = net.cfg.to_dict()
    loaded: list[str] = []
    if "" in plan:  # the whole model but the word embeddings (all for one)
        theirs, state = read_checkpoint(plan[""])
        _check_arch(mine, theirs, plan[""])
        if tuple(theirs["sources"]) != net.cfg.sources or theirs["fusion"] != net.cfg.fusion:
            raise MmlinksError(
                f"--init-from {plan['']}: sources {theirs['sources']} / fusion {theirs['fusion']} there, "
                f"{list(net.cfg.sources)} / {net.cfg.fusion} here"
            )
        return _copy(net, state, lambda k: same_vocabulary or k not in WORD_KEYS)
    for i, (source, folder) in enumerate(plan.items()):  # divide and conquer
        if source not in net.cfg.sources:
            raise MmlinksError(f"--init-from {source}=...: this model does not read {source}")
        theirs, state = read_checkpoint(folder)
        _check_arch(mine, theirs, folder)
        if source not in theirs["sources"]:
            raise MmlinksError(f"--init-from {source}={folder}: that model does not read {source}")
        prefix = f"encoders.{source}."
        loaded += _copy(net, state, lambda k, p=prefix: k.startswith(p))
        if i == 0:  # the shared parts from the first model (paper: the caption model)
            shared = ("embed.", "image.") if same_vocabulary else ("image.", "embed.ngrams.")
            loaded += _copy(net, state, lambda k, s=shared: k.startswith(s))
    return loaded


def check(cfg) -> list[str]:
    """The TrainConfig rules of the recipes (``ObjectiveSpec.check`` of ``news``; no torch)."""
    from training.news.config import staged_recipe

    bad = []
    try:
        plan = parse_init(cfg.init_from)
    except ValueError as exc:
        return [f"init_from ({exc})"]
    sources = parse_sources(cfg.news_sources)
    if cfg.multilingual == "all-for-one" and "" not in plan:
        bad.append("init_from (all-for-one starts from a language-A checkpoint: --init-from DIR)")
    if cfg.news_encoder == "chain" and cfg.multilingual != "none":
        bad.append("news_encoder (chain has no word vectors for a multilingual recipe to align or swap)")
    if cfg.news_encoder == "chain" and cfg.subword_buckets > 0:
        bad.append("subword_buckets (chain reads characters: no word vectors to add n-grams to)")
    if cfg.multilingual == "one-for-all":
        if cfg.word_vectors in ("random", "glove"):
            bad.append("word_vectors (one-for-all freezes aligned vectors: text:A.vec,text:B.vec)")
        if cfg.subword_buckets > 0:
            bad.append("subword_buckets (one-for-all: trained n-grams would move the frozen aligned space)")
    if plan and "" not in plan and len(sources) < 2:
        bad.append("init_from (SOURCE=DIR loads the encoders of a fused model: --news-sources with 2+)")
    if cfg.fuser_warmup_epochs > 0 and (not plan or "" in plan) and not staged_recipe(cfg):
        bad.append("fuser_warmup_epochs (divide and conquer only: --init-from SOURCE=DIR,...)")
    return bad
