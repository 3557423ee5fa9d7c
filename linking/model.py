"""The link model inside Beam: resolve the MLflow model once, check it fits the data, score
padded batches of documents in a ``RunInference`` ModelHandler loaded once per worker.

Why padded batches: all of a batch's sentence x image cosines come from one batched product, not
a Python loop over documents."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from apache_beam.ml.inference.base import ModelHandler, PredictionResult

from linking.steps import Chunk
from schemas.errors import MmlinksError
from schemas.links import ModelInfo
from schemas.manifest import Manifest


@dataclass
class ResolvedModel:
    """A model URI pinned to what it meant when the job started (an alias may move later)."""

    info: ModelInfo
    load_uri: str  # models:/NAME/VERSION (or the runs:/ URI as given)
    params: dict = field(default_factory=dict)  # the training run's params (extractor, schema)


def resolve_model(uri: str, tracking_uri: str) -> ResolvedModel:
    """``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` -> its concrete version and run, read
    once through MlflowClient; ``runs:/RUN/PATH`` as it is."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    try:
        if uri.startswith("models:/"):
            rest = uri[len("models:/") :]
            if "@" in rest:
                name, alias = rest.split("@", 1)
                mv = client.get_model_version_by_alias(name, alias)
            elif "/" in rest:
                name, version = rest.split("/", 1)
                mv = client.get_model_version(name, version)
            else:
                raise MmlinksError(f"{uri}: name a version or an alias (models:/NAME@ALIAS, models:/NAME/N)")
            info = ModelInfo(uri, name, str(mv.version), mv.run_id)
            load_uri = f"models:/{name}/{mv.version}"
        elif uri.startswith("runs:/"):
            info = ModelInfo(uri, None, None, uri[len("runs:/") :].split("/", 1)[0])
            load_uri = uri
        else:
            raise MmlinksError(
                f"--model wants models:/NAME@ALIAS, models:/NAME/VERSION or runs:/RUN/PATH, not {uri!r}"
            )
        params = client.get_run(info.run_id).data.params if info.run_id else {}
    except MlflowException as exc:
        raise MmlinksError(f"cannot resolve {uri}: {exc.message}") from exc
    return ResolvedModel(info, load_uri, dict(params))


def check_model_fits(model: ResolvedModel, manifest: Manifest) -> None:
    """Refuse, before any work, a model trained on another feature extractor or schema version."""
    from models.registry import check_run_params

    what = f"{model.info.uri} (version {model.info.version})" if model.info.version else model.info.uri
    check_run_params(model.params, manifest, what)


class LinkScorer:
    """A loaded link model: documents -> their sentence x image cosine matrices, in batches."""

    def __init__(self, linker, device: str = "cpu"):
        from training.backbone import needs_regions

        if needs_regions(linker.model.cfg.to_dict()):
            raise MmlinksError(
                "batch linking scores global image features; this model's backbone reads regions"
            )
        self.model = linker.model.to(device).eval()
        self.vocab, self.max_tokens = linker.vocab, int(linker.max_tokens)
        self.device = device
        self.image_dim = int(linker.model.cfg.image_dim)

    def score(self, docs: Sequence[dict]) -> list[np.ndarray]:
        """One padded forward pass: every sentence and image of ``docs`` encoded at once, then
        all [n, m] cosine matrices from one batched product of the padded encodings."""
        import torch

        from training.data import DocBatch, encode_sentences, pad_documents

        sentences = [d["sentences"] for d in docs]
        tokens, lengths = encode_sentences(sentences, self.vocab, self.max_tokens)
        n = [len(s) for s in sentences]
        m = [len(d["features"]) for d in docs]
        batch = DocBatch(
            doc_ids=[d["doc_id"] for d in docs],
            tokens=tokens.to(self.device),
            lengths=lengths,
            features=torch.from_numpy(np.concatenate([d["features"] for d in docs])).to(self.device),
            n_sentences=n,
            n_images=m,
            links=[None] * len(docs),
            sentences=[s for doc in sentences for s in doc],
        )
        with torch.no_grad():
            s, v = self.model.encode(batch)
            s_pad, _ = pad_documents(s, n)
            v_pad, _ = pad_documents(v, m)
            padded = torch.bmm(s_pad, v_pad.transpose(1, 2)).cpu().numpy()
        return [padded[b, : n[b], : m[b]] for b in range(len(docs))]


def load_scorer(load_uri: str, tracking_uri: str, device: str = "cpu") -> LinkScorer:
    """The scorer of a model URI. MLflow resolves ``models:/`` URIs against its global tracking
    URI, which ``set_tracking_uri`` also exports as MLFLOW_TRACKING_URI; both are put back after
    loading, so one job in a long-lived process (Dagster, tests) does not redirect the next."""
    return LinkScorer(load_linker_at(load_uri, tracking_uri), device)


def load_linker_at(load_uri: str, tracking_uri: str):
    """The packaged model behind ``load_uri`` in ``tracking_uri``'s registry, leaving MLflow's
    global tracking URI (and MLFLOW_TRACKING_URI) as they were."""
    import os

    import mlflow

    from training.evaluate import load_linker

    before = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        return load_linker(load_uri, tracking_uri)
    finally:
        mlflow.set_tracking_uri(before)


class LinkModelHandler(ModelHandler[Chunk, PredictionResult, LinkScorer]):
    """Loads the link model once per worker and scores chunks of documents.

    An element is a ``linking.steps.Chunk`` of at most ``batch_docs`` documents,
    cut deterministically from the input (``linking.steps``), so a document's scores never
    depend on which other documents a runner happened to batch with it; Beam batches are one
    chunk (min = max = 1).
    """

    def __init__(self, load_uri: str, tracking_uri: str, device: str = "cpu", cpu_threads: int | None = None):
        super().__init__(min_batch_size=1, max_batch_size=1)
        self._load_uri, self._tracking_uri = load_uri, tracking_uri
        self._device, self._cpu_threads = device, cpu_threads
        self._trim = None

    def load_model(self) -> LinkScorer:
        import torch

        if self._device == "cpu":
            from features.cpu_heap import tune_cpu_heap

            # once per worker: freed activations stay in the heap (see its docstring), and what
            # it keeps is given back after each chunk once the worker has grown by the slack
            self._trim = tune_cpu_heap()
            if self._cpu_threads:
                torch.set_num_threads(self._cpu_threads)
        return load_scorer(self._load_uri, self._tracking_uri, self._device)

    def run_inference(
        self, batch: Sequence[Chunk], model: LinkScorer, inference_args: dict[str, Any] | None = None
    ) -> list[PredictionResult]:
        # the scored chunk goes on without its features: Beam would size them again downstream
        out = [
            PredictionResult(chunk.without_features(), model.score(chunk.docs), self._load_uri)
            for chunk in batch
        ]
        if self._trim is not None:
            self._trim()
        return out

    def get_num_bytes(self, batch: Sequence[Chunk]) -> int:
        return sum(int(d["features"].nbytes) for chunk in batch for d in chunk.docs)

    def get_metrics_namespace(self) -> str:
        return "mmlinks.link"
