"""The registered news image selection model (issue #18): an ``mlflow.pyfunc`` that ranks the
archive's images for an article: a row of ``language`` and any of ``headline``, ``lead``,
``body``, ``caption`` in; ``image_ids``, ``scores`` and ``uris`` out, best first (``top_k``).

Why a language the model was not trained on is refused (HTTP 400 through
``INVALID_PARAMETER_VALUE``): its vocabulary does not cover it, so the ranking would be noise.
The archive (``archive/index.py``) is packaged with the model; ``MMLINKS_NEWS_ARCHIVE`` names a
newer index built from this model's run (the Dagster asset writes one), or the model refuses it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from mlflow.models import ModelSignature
from mlflow.types.schema import Array, ColSpec, DataType, ParamSchema, ParamSpec, Schema

from archive.index import ArchiveIndex
from models.news_threads import SCORING_SERVER_ENV, checked_threads, freeze_gc, serving_threads
from models.packaging import CheckpointPyfunc, _bad_request
from schemas.errors import MmlinksError
from schemas.news import NEWS_SOURCES
from schemas.text import has_tokens
from training.news.encode import encode_article, encode_articles, text_of
from training.news.model import NewsRetrieval

ARCHIVE_ENV = "MMLINKS_NEWS_ARCHIVE"
MAX_TOP_K = 1000

SIGNATURE = ModelSignature(
    inputs=Schema(
        [
            ColSpec(DataType.string, "language"),
            *(ColSpec(DataType.string, s, required=False) for s in NEWS_SOURCES),
        ]
    ),
    outputs=Schema(
        [
            ColSpec(Array(DataType.string), "image_ids"),
            ColSpec(Array(DataType.double), "scores"),
            ColSpec(Array(DataType.string), "uris"),
        ]
    ),
    params=ParamSchema([ParamSpec("top_k", DataType.long, 10)]),
)


class NewsModel(CheckpointPyfunc):
    family = "news"

    def load_context(self, context) -> None:
        self._load_checkpoint(context)
        info = json.loads(Path(context.artifacts["news"]).read_text())
        self.languages = tuple(info["languages"])
        self.run_id = info.get("run_id")
        self.threads = checked_threads(info.get("threads"))  # None in models packaged before
        serving = bool(os.environ.get(SCORING_SERVER_ENV))  # under `mlflow models serve`
        self.archive = load_archive(context.artifacts["archive"], self.model.cfg.d, self.run_id, serving)
        if serving:
            self.warm_up()
            freeze_gc()

    def warm_up(self) -> None:
        """One article through the served path (encode on the serving threads, search) before
        the first request: a process's first encode pays torch's one-off set-up (~180-200 ms on
        machine C), which otherwise lands on each serving worker's first request
        (docs/benchmarks.md, issue #38)."""
        article = {s: "news" for s in self.model.cfg.sources}
        with serving_threads(self.threads):
            archive_search(self.model, self.archive, self._vectors([article]), 10)

    def _articles(self, model_input: pd.DataFrame) -> list[dict]:
        if "language" not in model_input.columns:
            raise _bad_request("input needs a language column (and any of headline, lead, body, caption)")
        articles = []
        columns = list(model_input.columns)
        # rows as dicts via one object array: half the cost of to_dict("records") (~0.3 ms a
        # served article); cells are the same objects (str, None or NaN, which _text reads as "")
        records = (dict(zip(columns, r)) for r in model_input.to_numpy(dtype=object).tolist())
        for row, rec in enumerate(records):
            lang = text_of(rec.get("language")).strip()
            if lang not in self.languages:
                raise _bad_request(
                    f"article {row}: unsupported language {lang!r}; this model was trained on "
                    f"{', '.join(self.languages)}"
                )
            art = {s: text_of(rec.get(s)) for s in NEWS_SOURCES}
            if not any(has_tokens(art[s]) for s in self.model.cfg.sources):
                reads = ", ".join(self.model.cfg.sources)
                raise _bad_request(f"article {row}: no words in any source this model reads ({reads})")
            articles.append(art)
        return articles

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        top_k = int((params or {}).get("top_k", 10))
        if not 1 <= top_k <= MAX_TOP_K:
            raise _bad_request(f"top_k must be between 1 and {MAX_TOP_K}")
        articles = self._articles(model_input)
        with serving_threads(self.threads):
            scores, hits = archive_search(self.model, self.archive, self._vectors(articles), top_k)
        ids, uris = self.archive.ids, self.archive.uris
        return pd.DataFrame(
            {
                "image_ids": [[ids[r] for r in row] for row in hits],
                "scores": [s[: len(row)].astype(float).tolist() for s, row in zip(scores, hits, strict=True)],
                "uris": [[uris[r] for r in row] for row in hits],
            }
        )

    def _vectors(self, articles: list[dict]) -> np.ndarray:
        """[Q, d]: one article (a photo editor's query) through the lean single-article path;
        several (a downstream job's batch) through the batch encoder, which costs 1.3-1.7x less
        CPU an article at 8-64 articles (``benchmarks/news_batch_encode.py``, retired in issue #61 at
        d839ce0; docs/benchmarks.md issue #18). Both give the article's top 10; the batch's vectors
        may differ from the single path's in the last bits, as any batched matrix product's do."""
        if not articles:
            return np.zeros((0, self.model.cfg.d), np.float32)
        if len(articles) == 1:
            return encode_article(self.model, self.vocab, self.max_tokens, articles[0]).numpy()
        return encode_articles(self.model, self.vocab, self.max_tokens, articles).numpy()


@torch.no_grad()
def archive_search(net: NewsRetrieval, archive: ArchiveIndex, q: np.ndarray, top_k: int):
    """queries [Q, d] -> (scores [Q, k], archive rows per query), best first: the FAISS
    inner-product search for cosine models; for an ORDER model (its score is no inner product) an exact scan
    of the archive's vectors by ``net.score``, ties to the lower row (ORDER is a Table 1
    baseline: a brute-force scan is its honest serving path, not a fast one)."""
    if net.cfg.score != "order":
        return archive.search_rows(q, top_k)
    k = min(int(top_k), len(archive))
    live = archive.live_rows()  # withdrawn images are skipped here too
    v = torch.from_numpy(archive.vectors(live)) if k else torch.zeros(0, net.cfg.d)
    sim = net.score(torch.as_tensor(q, dtype=torch.float32), v)
    order = torch.sort(-sim, dim=1, stable=True).indices[:, :k]
    return sim.gather(1, order).numpy(), live[order.numpy()].tolist()


def load_archive(packaged: str, d: int, run_id: str | None, serving: bool = False) -> ArchiveIndex:
    """The packaged index, or the one ``MMLINKS_NEWS_ARCHIVE`` names when it was built from the
    same run (another model's image vectors live in another space). An ``ivfpq`` index is
    memory-mapped, so the workers of ``mlflow models serve -w N`` that load the same folder share one
    copy of its re-rank store (a model loaded from a tracking store is downloaded per worker: point
    ``MMLINKS_NEWS_ARCHIVE`` at the built folder to share it). ``serving``: a server backs another
    kind with huge pages (~5 s a GB at load, so not for a process that loads the model once) and
    holds a mapped one resident (``ArchiveIndex.hold_resident``)."""
    folder = os.environ.get(ARCHIVE_ENV) or packaged
    meta = Path(folder) / "index.json"
    mapped = meta.is_file() and json.loads(meta.read_text()).get("kind") == "ivfpq"
    index = ArchiveIndex.load(folder, huge_pages=serving and not mapped, mmap=mapped)
    built_from = index.info.get("run_id")
    if folder != packaged and run_id and built_from != run_id:
        raise MmlinksError(
            f"{ARCHIVE_ENV}={folder} was built from run {built_from}, this model is run {run_id}"
        )
    if index.dim != d:
        raise MmlinksError(f"archive index {folder} holds {index.dim}-d vectors, the model makes {d}-d ones")
    if serving and mapped:
        index.hold_resident()
    return index


def evaluate_news(model: NewsModel, paths: list) -> dict:
    """MedR, R@1/5/10 text-to-image (and i2t_medr, i2t_r10) of a loaded news model on the
    samples of ``paths`` (complete inputs), over the promotion gate's fixed pools, as
    ``evaluate_retrieval`` scores pair models: what the gate and ``metrics_above_floor`` read."""
    from training.news.evaluation import news_split_metrics
    from training.ranking import GATE_POOL_SIZE, GATE_POOLS

    m = news_split_metrics(model.model, model.vocab, model.max_tokens, paths, GATE_POOL_SIZE, GATE_POOLS)
    out = {k: m["t2i"][k] for k in ("medr", "medr_std", "r1", "r5", "r10", "pool_size", "pools")}
    out.update({"i2t_medr": m["i2t"]["medr"], "i2t_r10": m["i2t"]["r10"], "pairs": m["pairs"]})
    return out
