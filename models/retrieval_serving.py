"""The registered retrieval model (CMCA / CMCM / CMCM_c): an ``mlflow.pyfunc`` wrapper that
ranks candidate images for a text, and the evaluation promotion applies to it (its input, output
and params: docs/retrieval-news.md).

Without candidates a query ranks the packaged gallery, so a served model answers a bare text.
Why refinement is per row: a query ranks the same alone as in a batch. Promotion scores over fixed
pools (``GATE_POOL_SIZE`` x ``GATE_POOLS``, seed 0), so candidate and production are measured
alike whatever their training configs said."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from mlflow.models import ModelSignature
from mlflow.types.schema import Array, ColSpec, DataType, ParamSchema, ParamSpec, Schema

from models.packaging import CheckpointPyfunc, ImageFeaturizer, _bad_request, _empty, feature_matrix
from schemas.errors import MmlinksError
from training.data import encode_sentences
from training.ranking import GATE_POOL_SIZE, GATE_POOLS, retrieval_metrics
from training.retrieval.pairs import ranking_scores, split_pairs
from training.text import Vocabulary

SIGNATURE = ModelSignature(
    inputs=Schema(
        [
            ColSpec(DataType.string, "text"),
            ColSpec(Array(Array(DataType.double)), "image_features", required=False),
            ColSpec(Array(DataType.string), "images", required=False),
            ColSpec(Array(DataType.string), "candidate_ids", required=False),
        ]
    ),
    outputs=Schema(
        [
            ColSpec(Array(DataType.string), "candidates"),
            ColSpec(Array(DataType.double), "scores"),
            ColSpec(Array(Array(DataType.double)), "relation_probs"),
        ]
    ),
    params=ParamSchema([ParamSpec("top_k", DataType.long, 10), ParamSpec("refine", DataType.boolean, True)]),
)

MAX_CANDIDATES = 10_000  # per query in a request; beyond it the request is refused (HTTP 400)
MAX_IMAGES = 200  # raw candidate images per query (each runs the CNN on the server)
GALLERY_MAX = 5_000  # packaged test-split images


class RetrievalModel(CheckpointPyfunc):
    family = "retrieval"  # what promotion and evaluation dispatch on (LinkModel has none)

    def load_context(self, context) -> None:
        self._load_checkpoint(context)
        self.relations = list(self.model.cfg.relations)
        refine = json.loads(Path(context.artifacts["refine"]).read_text())
        self.refine_lambda = float(refine["refine_lambda"])
        self.refine_threshold = float(refine["refine_threshold"])
        gallery = np.load(context.artifacts["gallery"], allow_pickle=False)
        self.gallery_ids = [str(i) for i in gallery["ids"]]
        self.gallery = gallery["features"].astype(np.float32)
        self.images = ImageFeaturizer(context.artifacts.get("extractor"))

    @torch.no_grad()
    def encode_texts(self, texts: list[str]) -> torch.Tensor:
        """[Q] texts -> [Q, d] unit vectors."""
        tokens, lengths = encode_sentences([list(texts)], self.vocab, self.max_tokens)
        return self.model.text(tokens, lengths)

    @torch.no_grad()
    def encode_images(self, features: np.ndarray) -> torch.Tensor:
        """[N, image_dim] CNN features -> [N, d] unit vectors."""
        return self.model.image(torch.as_tensor(np.asarray(features, dtype=np.float32)))

    def score(
        self, s: torch.Tensor, v: torch.Tensor, refine: bool = True, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """texts [Q, d] x images [N, d] -> [Q, N]: cosine (less the query bank's image term),
        refined for CMCM's difficult queries."""
        lam = self.refine_lambda if refine else 0.0
        return ranking_scores(self.model, s, v, lam, self.refine_threshold, bias)

    @torch.no_grad()
    def gallery_side(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(gallery embeddings [N, d], their query-bank term [N]), computed once: every bare-text
        query ranks the same packaged gallery."""
        if getattr(self, "_gallery_side", None) is None:
            v = self.encode_images(self.gallery)
            self._gallery_side = (v, self.model.image_bias(v))
        return self._gallery_side

    def _candidates(self, row: int, feats, ids, images=None) -> tuple[np.ndarray, list[str]]:
        width = self.model.cfg.image_dim
        if not _empty(images):
            if not _empty(feats):
                raise _bad_request(f"query {row}: send image_features or images, not both")
            if isinstance(images, str) or len(images) > MAX_IMAGES:
                raise _bad_request(f"query {row}: images must be a list of at most {MAX_IMAGES} images")
            feats = self.images.features(list(images), f"query {row}")
            if feats.shape[1] != width:  # another extractor than the model's image tower takes
                raise _bad_request(
                    f"query {row}: the extractor {self.images.name} gives {feats.shape[1]}-d features, "
                    f"this model takes {width}-d; send image_features"
                )
        if _empty(feats):
            return self.gallery, self.gallery_ids
        if len(feats) > MAX_CANDIDATES:
            raise _bad_request(f"query {row}: at most {MAX_CANDIDATES} candidate images")
        feats = feature_matrix(feats, width, f"query {row}")
        ids = [str(i) for i in ids] if not _empty(ids) else [str(i) for i in range(len(feats))]
        if len(ids) != len(feats):
            raise _bad_request(f"query {row}: {len(ids)} candidate_ids for {len(feats)} image_features")
        return feats, ids

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        params = params or {}
        top_k, refine = int(params.get("top_k", 10)), bool(params.get("refine", True))
        if "text" not in model_input.columns:
            raise _bad_request("input needs a text column (and optionally image_features)")
        n = len(model_input)
        feats_col = model_input["image_features"] if "image_features" in model_input else [None] * n
        ids_col = model_input["candidate_ids"] if "candidate_ids" in model_input else [None] * n
        image_col = model_input["images"] if "images" in model_input else [None] * n
        rows = []
        for row, (text, feats, ids, images) in enumerate(
            zip(model_input["text"], feats_col, ids_col, image_col, strict=True)
        ):
            if not isinstance(text, str) or not text.strip():
                raise _bad_request(f"query {row}: text must be a non-empty string")
            feats, ids = self._candidates(row, feats, ids, images)
            s, bias = self.encode_texts([text]), None
            if feats is self.gallery:
                v, bias = self.gallery_side()
            else:
                v = self.encode_images(feats)
            scores = self.score(s, v, refine, bias)[0]
            k = len(ids) if top_k <= 0 else min(top_k, len(ids))
            best = torch.topk(scores, k).indices
            probs = [] if self.model.cam is None else self.model.relation_probs(s, v[best])[0].tolist()
            rows.append(
                {
                    "candidates": [ids[i] for i in best.tolist()],
                    "scores": scores[best].double().tolist(),
                    "relation_probs": probs,
                }
            )
        return pd.DataFrame(rows, columns=["candidates", "scores", "relation_probs"])


def evaluate_retrieval(model: RetrievalModel, paths: list, refine: bool = True) -> dict:
    """MedR, R@1/5/10 text-to-image (and i2t_medr, i2t_r10) of a loaded retrieval model on the
    pairs of ``paths``, over the gate's fixed pools."""
    _, texts, feats = split_pairs(paths)
    if len(texts) < 2:
        raise MmlinksError("retrieval evaluation needs at least 2 pairs")
    if feats.shape[1] != model.model.cfg.image_dim:
        raise MmlinksError(
            f"the model takes {model.model.cfg.image_dim}-d image features, the data has {feats.shape[1]}-d"
        )
    s, v = model.encode_texts(texts), model.encode_images(feats)

    def score_pool(idx: np.ndarray) -> np.ndarray:
        t = torch.as_tensor(idx)
        return model.score(s[t], v[t], refine).numpy()

    m = retrieval_metrics(n=len(texts), score_pool=score_pool, pool_size=GATE_POOL_SIZE, n_pools=GATE_POOLS)
    out = {k: m["t2i"][k] for k in ("medr", "medr_std", "r1", "r5", "r10", "pool_size", "pools")}
    out.update({"i2t_medr": m["i2t"]["medr"], "i2t_r10": m["i2t"]["r10"], "pairs": len(texts)})
    return out


def log_retrieval_model(
    checkpoint_dir: str,
    vocab: Vocabulary,
    gallery_ids: list[str],
    gallery_features: np.ndarray,
    refine: dict,
    extractor: str | None = None,
    extractor_version: str | None = None,
    query_bank: torch.Tensor | None = None,
) -> str:
    """Log the pyfunc retrieval model into the active run; returns its model URI. ``refine``:
    {"refine_lambda", "refine_threshold"} used when a request asks for refinement;
    ``query_bank`` (the trained net's, filled after its last epoch) goes into the packaged
    checkpoint's model state."""
    from training.checkpoints import store_model_buffer

    ids = np.asarray([str(i) for i in gallery_ids[:GALLERY_MAX]])
    feats = np.asarray(gallery_features, dtype=np.float32)[:GALLERY_MAX]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shutil.copytree(checkpoint_dir, root / "checkpoint")
        if query_bank is not None:
            store_model_buffer(root / "checkpoint", "query_bank", query_bank)
        vocab.save(root / "vocab.json")
        np.savez(root / "gallery.npz", ids=ids, features=feats)
        (root / "refine.json").write_text(
            json.dumps({k: float(refine[k]) for k in ("refine_lambda", "refine_threshold")})
        )
        (root / "extractor.json").write_text(json.dumps({"name": extractor, "version": extractor_version}))
        artifacts = {
            name: str(root / file)
            for name, file in (
                ("checkpoint", "checkpoint"),
                ("vocab", "vocab.json"),
                ("gallery", "gallery.npz"),
                ("refine", "refine.json"),
                ("extractor", "extractor.json"),
            )
        }
        return RetrievalModel()._log(artifacts, SIGNATURE, pd.DataFrame([{"text": "an example query"}]))
