"""The archive index of a dataset under a registered news model (issue #38): the Dagster asset
``archive_index_<objective>``'s library call, streamed and resumable, calibrated on the
dataset's articles for ivfpq, and recorded on the model version as tags."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from archive.build import build_archive_index
from models.news_serving import NewsModel
from schemas.errors import MmlinksError
from schemas.news import sources_of
from schemas.text import has_tokens
from training.news.encode import encode_articles, text_of


def build_model_archive(
    model_uri: str, data: str, out_root: str, tracking_uri: str | None = None, kind: str = "flat"
) -> dict:
    """The archive index of dataset ``data`` (every split) under the registered news model
    ``model_uri`` (``models:/NAME@ALIAS`` or ``/VERSION``), saved to
    ``out_root/<model version>@<dataset version>``: what the Dagster asset
    ``archive_index_<objective>`` materialises. The index carries the model's run id, so the
    served model accepts it as ``MMLINKS_NEWS_ARCHIVE``. The build is streamed and
    checkpointed in that folder (``archive_build``): a retried materialisation resumes it, and
    one whose folder already holds the finished index of the same kind returns it. With a
    tracking URI, the registered model version gets the index's version and fingerprint as
    tags (``archive_index_version``, ``archive_index_fingerprint``, and the folder and dataset
    version; the latest build wins). A summary dict."""
    from schemas.manifest import Manifest
    from training.evaluate import load_linker

    model = load_linker(model_uri, tracking_uri)
    if not isinstance(model, NewsModel):
        raise MmlinksError(f"{model_uri} is not a news image selection model")
    version = _model_version(model_uri, tracking_uri)
    manifest = Manifest.read(data)
    paths = [str(p) for p in manifest.shard_paths(data)]
    info = {
        "run_id": model.run_id,
        "model_uri": model_uri,
        "model_version": version,
        "dataset_version": manifest.dataset_version,
    }
    folder = Path(out_root) / f"{version}@{manifest.dataset_version}"
    queries = None
    if kind == "ivfpq" and model.model.cfg.score != "order":  # ORDER models scan exactly
        queries = article_vectors(model, [str(p) for p in manifest.shard_paths(data, "train")])
    index = build_archive_index(
        model.model, paths, kind, info, folder=folder, replace=True, calibration_queries=queries
    )
    summary = {**info, "path": str(folder), "images": len(index), "kind": kind}
    summary.update(
        index_version=index.version,
        fingerprint=index.fingerprint,
        search_fingerprint=index.search_fingerprint,
        deleted=len(index.deleted),
        index_bytes=sum(f.stat().st_size for f in folder.iterdir() if f.is_file()),
    )
    if tracking_uri and version:
        _tag_model_version(model_uri, version, tracking_uri, summary)
    return summary


def article_vectors(model: NewsModel, paths: list, count: int = 200) -> np.ndarray | None:
    """The fused text vectors of the first ``count`` articles of ``paths`` that have a source
    the model reads: the queries an ivfpq archive calibrates its probes on (the served queries
    are articles, whose neighbours spread unlike an image's own; docs/benchmarks.md, #38)."""
    from schemas.shards import read_table

    table = read_table(paths, columns=["sentences", "metadata"])
    articles = []
    for s, m in zip(table.column("sentences").to_pylist(), table.column("metadata").to_pylist(), strict=True):
        art = dict(zip(sources_of(dict(m or {})), s, strict=True))
        if any(has_tokens(text_of(art.get(src))) for src in model.model.cfg.sources):
            articles.append(art)
        if len(articles) == count:
            break
    if not articles:
        return None
    return encode_articles(model.model, model.vocab, model.max_tokens, articles).numpy()


def _tag_model_version(model_uri: str, version: str, tracking_uri: str, summary: dict) -> None:
    """The archive index next to the model in the registry: tags on its model version."""
    from mlflow.tracking import MlflowClient

    name = model_uri[len("models:/") :].split("@", 1)[0].rsplit("/", 1)[0]
    client = MlflowClient(tracking_uri)
    tags = {
        "archive_index_version": summary["index_version"],
        "archive_index_fingerprint": summary["fingerprint"],
        "archive_index_search_fingerprint": summary["search_fingerprint"],
        "archive_index_path": summary["path"],
        "archive_index_dataset_version": summary["dataset_version"],
    }
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, str(value))


def _model_version(model_uri: str, tracking_uri: str | None) -> str:
    """The registry version behind ``models:/NAME@ALIAS`` / ``models:/NAME/VERSION`` ("" for
    another URI)."""
    from mlflow.tracking import MlflowClient

    if not model_uri.startswith("models:/"):
        return ""
    name_ref = model_uri[len("models:/") :]
    if "@" in name_ref:
        name, alias = name_ref.split("@", 1)
        return str(MlflowClient(tracking_uri).get_model_version_by_alias(name, alias).version)
    return name_ref.rsplit("/", 1)[-1]
