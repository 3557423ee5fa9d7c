"""Source connectors: each a Beam PTransform from a raw source to RawDocument records.

Each module below exposes ``SPEC`` (a ``pipelines.sources.base.SourceSpec``); modules are
imported on first use so that, say, a RecipeQA build never imports praw.
"""

from __future__ import annotations

import importlib

from pipelines.sources.base import SourceContext, SourceOption, SourceSpec, source_outputs
from schemas.errors import MmlinksError

# name -> module holding SPEC. The order is the order of --help.
SOURCE_MODULES = {
    "synthetic": "pipelines.sources.synthetic",
    "diy": "pipelines.sources.diy",
    "recipeqa": "pipelines.sources.recipeqa",
    "wiki": "pipelines.sources.wiki",
    "mscoco": "pipelines.sources.mscoco",
    "story-dii": "pipelines.sources.vist",
    "story-sis": "pipelines.sources.vist",
    "dii-stress": "pipelines.sources.vist",
    "hessel": "pipelines.sources.hessel",
    "clue": "pipelines.sources.clue",
    "news-jsonl": "pipelines.sources.news_jsonl",
    "goodnews": "pipelines.sources.goodnews",
    "nytimes800k": "pipelines.sources.nytimes800k",
    "wit": "pipelines.sources.wit",
    "cite": "pipelines.sources.cite",
}


def source_names() -> list[str]:
    return list(SOURCE_MODULES)


def get_spec(name: str) -> SourceSpec:
    if name not in SOURCE_MODULES:
        raise MmlinksError(f"unknown source {name!r}; known: {source_names()}")
    module = importlib.import_module(SOURCE_MODULES[name])
    specs = getattr(module, "SPECS", None) or {module.SPEC.name: module.SPEC}
    return specs[name]


__all__ = ["SourceContext", "SourceOption", "SourceSpec", "get_spec", "source_names", "source_outputs"]
