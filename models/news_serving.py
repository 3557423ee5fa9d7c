"""The registered news image selection model (issue #18): an ``mlflow.pyfunc`` that ranks the
archive's images for an article.

- Input: one row per article with ``language`` (required) and any of ``headline``, ``lead``,
  ``body``, ``caption`` (strings; a missing or empty one is fine, random_drop trained the model
  for that). At least one source the model reads must have words.
- Output per article: ``image_ids`` (archive content ids, best first), ``scores`` (cosines; an
  ORDER model's negative order violations, ``archive_search``) and
  ``uris`` (where the build read each image).
- Params: ``top_k`` (default 10, at most ``MAX_TOP_K``).
- Errors are MLflow ``INVALID_PARAMETER_VALUE`` exceptions, which ``mlflow models serve``
  answers with HTTP 400 and the reason: an article in a language the model was not trained on
  (its vocabulary and embeddings do not cover it, so its ranking would be noise), an article
  without any source the model reads, a bad ``top_k``.

The archive is an ``ArchiveIndex`` (``archive/index.py``) packaged with the model: every
distinct image of the training dataset, embedded by this model's image tower. The environment
variable ``MMLINKS_NEWS_ARCHIVE`` names a newer index folder built for the same model (the
Dagster asset ``news_archive_index`` writes one when the archive grows); it must have been built
from this model's run, or the model refuses to load it.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import torch
from mlflow.models import ModelSignature
from mlflow.types.schema import Array, ColSpec, DataType, ParamSchema, ParamSpec, Schema

from schemas.errors import MmlinksError
from schemas.news import NEWS_SOURCES, SOURCES_KEY, sources_of
from schemas.text import has_tokens
from training import integrity
from training.data import encode_sentences
from archive.index import ArchiveIndex
from archive.build import build_archive_index
from training.news.model import NewsRetrieval, sentence_slots
from training.packaging import _bad_request, pip_requirements
from training.text import Vocabulary

ARCHIVE_ENV = "MMLINKS_NEWS_ARCHIVE"
MAX_TOP_K = 1000
# threads a served article is encoded (torch) and searched (FAISS) on; packaged in news.json
# (``save_news_model(threads=...)``), None: the libraries' defaults. torch and faiss-cpu each
# ship their own OpenMP runtime with its own spinning worker pool; measured on 2 cores in
# docs/benchmarks.md (issue #18, ``benchmarks/news_serving_latency.py --thread-sweep``)
SERVE_THREADS = {"encode": 1, "search": 1}

# set by `mlflow models serve` in the process that loads the model to serve it
# (mlflow.pyfunc.scoring_server._SERVER_MODEL_PATH; not imported: that module imports FastAPI)
SCORING_SERVER_ENV = "__pyfunc_model_path__"

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


def _text(value) -> str:
    """A cell as text: None / NaN filler (a column another row set) -> ''."""
    return value if isinstance(value, str) else ""


@torch.inference_mode()
def encode_articles(
    net: NewsRetrieval, vocab: Vocabulary, max_tokens: int, articles: list[dict]
) -> torch.Tensor:
    """Articles ({source: text}) -> [Q, d] fused unit vectors, complete inputs (every present
    source). An article without any source the model reads gets a zero vector.

    ``inference_mode`` rather than ``no_grad``: the same numbers without autograd's version
    counting, a few ms less a served article (docs/benchmarks.md, issue #18); the result is an
    inference tensor (read it, do not train through it)."""
    sentences, metadata = [], []
    for a in articles:
        names = [s for s in NEWS_SOURCES if has_tokens(_text(a.get(s)))]
        sentences.append([a[s] for s in names])
        metadata.append({SOURCES_KEY: ",".join(names)})
    n = [len(s) for s in sentences]
    slots, rows = sentence_slots(metadata, n, net.cfg.sources)
    ngrams = None
    if net.cfg.words:  # the model's own vocabulary, per-source limits and n-grams (as in training)
        names = [name for m in metadata for name in m[SOURCES_KEY].split(",") if name]
        tokens, lengths, ngrams = net.tokenize([t for doc in sentences for t in doc], names)
    else:  # a model from before issue #34: the packaged vocabulary, one limit
        tokens, lengths = encode_sentences(sentences, vocab, max_tokens)
    keep = torch.ones(len(articles), len(net.cfg.sources), dtype=torch.bool)
    if net.training:  # eval() walks every module: ~1 ms a served article when done each time
        net.eval()
    return net.encode_text(tokens, lengths, slots, rows, keep, ngrams=ngrams)


@torch.inference_mode()
def encode_article(net: NewsRetrieval, vocab: Vocabulary, max_tokens: int, article: dict) -> torch.Tensor:
    """One article ({source: text}, at least one source the model reads with words) -> [1, d]:
    what ``encode_articles`` gives for it alone, bit-identical (tested), through
    ``NewsRetrieval.encode_article``: each source tokenised once and encoded unpadded, without
    the batch machinery. The served model's path for a request of one article. A CHAIN model
    (one encoder over the concatenated sources, a Table 1 baseline) has no per-source path and
    goes through ``encode_articles``."""
    if net.embed is None:
        return encode_articles(net, vocab, max_tokens, [article])
    sources, ngrams = {}, {}
    present = [(s, _text(article.get(s))) for s in net.cfg.sources]
    present = [(s, text) for s, text in present if has_tokens(text)]
    if net.cfg.words:  # as encode_articles: the model's own tokens, in one call, so the n-gram
        # width G is the batch's (a narrower table sums its zero padding in another order)
        tokens, lengths, g = net.tokenize([text for _, text in present], [s for s, _ in present])
        for i, (s, _) in enumerate(present):
            sources[s] = tokens[i : i + 1, : lengths[i]]
            if g is not None:
                ngrams[s] = g[i : i + 1, : lengths[i]]
    else:
        for s, text in present:
            sources[s] = torch.tensor([vocab.encode(text, max_tokens)], dtype=torch.long)
    if net.training:
        net.eval()
    return net.encode_article(sources, ngrams or None)


class NewsModel(mlflow.pyfunc.PythonModel):
    family = "news"

    def load_context(self, context) -> None:
        from training.checkpoints import load_checkpoint_model

        integrity.verify_artifacts(context.artifacts, context.model_config)
        self.model, meta = load_checkpoint_model(context.artifacts["checkpoint"])
        self.vocab = Vocabulary.load(context.artifacts["vocab"])
        self.max_tokens = int(meta["train"]["max_tokens"])
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
            lang = _text(rec.get("language")).strip()
            if lang not in self.languages:
                raise _bad_request(
                    f"article {row}: unsupported language {lang!r}; this model was trained on "
                    f"{', '.join(self.languages)}"
                )
            art = {s: _text(rec.get(s)) for s in NEWS_SOURCES}
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
        CPU an article at 8-64 articles (``benchmarks/news_batch_encode.py``, docs/benchmarks.md
        issue #18). Both give the article's top 10; the batch's vectors may differ from the
        single path's in the last bits, as any batched matrix product's do."""
        if not articles:
            return np.zeros((0, self.model.cfg.d), np.float32)
        if len(articles) == 1:
            return encode_article(self.model, self.vocab, self.max_tokens, articles[0]).numpy()
        return encode_articles(self.model, self.vocab, self.max_tokens, articles).numpy()


def freeze_gc() -> int:
    """Collect, then move every object alive (the loaded libraries, model and archive: ~350k
    tracked objects) to the garbage collector's permanent generation (``gc.freeze``); how many.
    Without it, a full collection traverses them all in the middle of some request: 180 ms of
    CPU once in 200 served articles, a gen-1 pass up to 19 ms (docs/benchmarks.md, issue #18).
    Reference counting still frees them; only cycles among them are never collected, so this
    is for a process that loads the model to serve it (``NewsModel.load_context`` calls it
    under ``mlflow models serve``), not for a test or training process."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def checked_threads(threads) -> dict | None:
    """``threads`` as packaged: None (the libraries' defaults) or ``{"encode": n, "search": m}``
    with positive integers; anything else is refused in one line when a model is packaged or
    loaded, not on every request (torch refuses 0 threads mid-predict)."""
    if threads is None:
        return None
    ok = isinstance(threads, dict) and set(threads) == {"encode", "search"}
    if not ok or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in threads.values()):
        raise MmlinksError(
            f'serving threads must be {{"encode": n, "search": m}} with n, m >= 1, got {threads!r}'
        )
    return dict(threads)


@contextmanager
def serving_threads(threads: dict | None):
    """Run a predict call with ``threads["encode"]`` torch and ``threads["search"]`` FAISS
    threads, restored afterwards (a process that loaded the model to embed an archive keeps its
    own settings). OpenMP thread counts are per calling thread, so setting them per call also
    covers a server that predicts on pool threads."""
    if not threads:
        yield
        return
    import faiss

    before = torch.get_num_threads(), faiss.omp_get_max_threads()
    torch.set_num_threads(threads["encode"])
    faiss.omp_set_num_threads(threads["search"])
    try:
        yield
    finally:
        torch.set_num_threads(before[0])
        faiss.omp_set_num_threads(before[1])


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
    same run (another model's image vectors live in another space). An ``ivfpq`` index (issue
    #38) is memory-mapped (``ArchiveIndex.load(mmap=True)``): the workers of ``mlflow models
    serve -w N`` that load the same folder share one copy of its re-rank store in the page
    cache (a model loaded from a tracking store is downloaded per worker, so point
    ``MMLINKS_NEWS_ARCHIVE`` at the built folder, or serve a local model folder, to share it).
    ``serving``: a server that searches another kind on every request backs it with huge pages
    (~5 s a GB at load, so not for an evaluation or a test that loads the model once); a mapped
    one it reads into memory and keeps there (``ArchiveIndex.hold_resident``: its 8-bit store
    and names, shared by the workers; else each page's first touch is a disk read inside some
    request)."""
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


def train_languages(paths: list) -> list[str]:
    """The languages of the training samples (what the served model accepts)."""
    from schemas.shards import read_table

    meta = read_table(paths, columns=["metadata"]).column("metadata").to_pylist()
    return sorted({dict(m or {}).get("language", "") for m in meta} - {""})


def _model_kwargs(
    root: Path,
    checkpoint_dir: str,
    vocab: Vocabulary,
    index: ArchiveIndex,
    languages,
    run_id,
    threads: dict | None = SERVE_THREADS,
) -> dict:
    """The pyfunc's files under ``root`` and the arguments ``log_model`` / ``save_model`` take."""
    if not languages:
        raise MmlinksError("the training split names no language (metadata 'language')")
    shutil.copytree(checkpoint_dir, root / "checkpoint")
    vocab.save(root / "vocab.json")
    index.save(root / "archive")
    info = {"languages": list(languages), "run_id": run_id, "threads": checked_threads(threads)}
    (root / "news.json").write_text(json.dumps(info))
    artifacts = {
        "checkpoint": str(root / "checkpoint"),
        "vocab": str(root / "vocab.json"),
        "archive": str(root / "archive"),
        "news": str(root / "news.json"),
    }
    return {
        "python_model": NewsModel(),
        "artifacts": artifacts,
        "model_config": integrity.model_config(artifacts),  # verified by every load (issue #62)
        "signature": SIGNATURE,
        "input_example": pd.DataFrame([{"language": languages[0], "headline": "an example headline"}]),
        "pip_requirements": [*pip_requirements(), "faiss-cpu"],
    }


def log_news_model(
    checkpoint_dir: str, vocab: Vocabulary, index: ArchiveIndex, languages: list[str], run_id: str
) -> str:
    """Log the news pyfunc (checkpoint, vocabulary, archive index, languages) into the active
    run; its model URI."""
    with tempfile.TemporaryDirectory() as tmp:
        kwargs = _model_kwargs(Path(tmp), checkpoint_dir, vocab, index, languages, run_id)
        return mlflow.pyfunc.log_model(name="model", **kwargs).model_uri


def save_news_model(
    path: str | Path,
    checkpoint_dir: str,
    vocab: Vocabulary,
    index: ArchiveIndex,
    languages: list[str],
    run_id: str,
    threads: dict | None = SERVE_THREADS,
) -> Path:
    """The same pyfunc written to a local folder (no tracking store): ``mlflow models serve -m
    PATH`` serves it, ``mlflow.pyfunc.load_model(PATH)`` loads it. ``threads``: the serving
    threads (``SERVE_THREADS``; None: the libraries' defaults)."""
    with tempfile.TemporaryDirectory() as tmp:
        kwargs = _model_kwargs(Path(tmp), checkpoint_dir, vocab, index, languages, run_id, threads)
        mlflow.pyfunc.save_model(path=str(path), **kwargs)
    return Path(path)


def package_news_run(
    checkpoint_dir: str, net: NewsRetrieval, vocab: Vocabulary, data: str, manifest, run_id: str
) -> str:
    """What the experiment calls for a news run: the archive index of every image of the
    dataset (all splits: the newsroom's archive), then the packaged model; its URI."""
    paths = [str(p) for p in manifest.shard_paths(data)]
    info = {"run_id": run_id, "dataset_version": manifest.dataset_version}
    index = build_archive_index(net, paths, "flat", info)
    languages = train_languages([str(p) for p in manifest.shard_paths(data, "train")])
    return log_news_model(checkpoint_dir, vocab, index, languages, run_id)


def news_split_metrics(
    net: NewsRetrieval,
    vocab: Vocabulary,
    max_tokens: int,
    paths: list,
    pool_size: int,
    n_pools: int,
    seed: int = 0,
) -> dict:
    """R@1/5/10 and MedR, text-to-image ("t2i") and image-to-text ("i2t"), of a news model on
    the samples of ``paths`` (complete inputs: every present source), averaged over ``n_pools``
    random pools of ``pool_size`` samples (ties pessimistic); plus ``ranks``, each sample's
    text-to-image rank among all the samples (1 = its own image first), and ``doc_ids``."""
    from schemas.shards import read_table
    from training.data import features_of
    from training.ranking import retrieval_metrics

    if not paths:
        raise MmlinksError("news evaluation needs at least 2 samples; no shard given")
    table = read_table(paths, columns=["doc_id", "sentences", "images", "metadata"]).sort_by("doc_id")
    articles = [
        dict(zip(sources_of(dict(m or {})), s, strict=True))
        for s, m in zip(
            table.column("sentences").to_pylist(), table.column("metadata").to_pylist(), strict=True
        )
    ]
    feats, _ = features_of(table)
    if len(articles) < 2:
        raise MmlinksError("news evaluation needs at least 2 samples")
    s = encode_articles(net, vocab, max_tokens, articles)
    with torch.no_grad():
        v = net.image(torch.as_tensor(np.stack([f[0] for f in feats])))

    def score_pool(idx: np.ndarray) -> np.ndarray:
        t = torch.as_tensor(idx)
        return net.score(s[t], v[t]).numpy()

    m = retrieval_metrics(
        n=len(articles), score_pool=score_pool, pool_size=pool_size, n_pools=n_pools, seed=seed
    )
    with torch.no_grad():
        ranks = torch.cat([_chunk_ranks(net.score(s[i : i + 1024], v), i) for i in range(0, len(s), 1024)])
    return {
        **m,
        "pairs": len(articles),
        "ranks": ranks.tolist(),
        "doc_ids": table.column("doc_id").to_pylist(),
    }


def _chunk_ranks(sim: torch.Tensor, start: int) -> torch.Tensor:
    """Rows ``start..`` of the text x image scores -> each text's rank of its own image among all
    images, pessimistic (a tied image counts as ranked above; the own image itself once)."""
    own = sim[torch.arange(len(sim)), start + torch.arange(len(sim))][:, None]
    return (sim >= own).sum(1)


def evaluate_news(model: NewsModel, paths: list) -> dict:
    """MedR, R@1/5/10 text-to-image (and i2t_medr, i2t_r10) of a loaded news model on the
    samples of ``paths`` (complete inputs), over the promotion gate's fixed pools, as
    ``evaluate_retrieval`` scores pair models: what the gate and ``metrics_above_floor`` read."""
    from training.ranking import GATE_POOL_SIZE, GATE_POOLS

    m = news_split_metrics(model.model, model.vocab, model.max_tokens, paths, GATE_POOL_SIZE, GATE_POOLS)
    out = {k: m["t2i"][k] for k in ("medr", "medr_std", "r1", "r5", "r10", "pool_size", "pools")}
    out.update({"i2t_medr": m["i2t"]["medr"], "i2t_r10": m["i2t"]["r10"], "pairs": m["pairs"]})
    return out


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
        if any(has_tokens(_text(art.get(src))) for src in model.model.cfg.sources):
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
