"""The registered model: an ``mlflow.pyfunc`` wrapper, so downstream stages call one ``predict``.

Loading it needs the installed ``mmlinks`` package (the wrapper class is pickled by reference),
not this repository's source tree.

Input: one row per document with ``sentences`` (list of strings) and ``image_features`` (list of
CNN feature vectors, same extractor as the training data). Output per document: the sentence x
image cosine matrix and the predicted links (the max-weight assignment, kept where the score is
at least ``threshold``), as in the paper's qualitative examples.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import torch
from mlflow.models import ModelSignature
from mlflow.types.schema import Array, ColSpec, DataType, ParamSchema, ParamSpec, Schema

from training.data import make_batch
from training.objectives.assignment import max_weight_matching
from training.text import Vocabulary

SIGNATURE = ModelSignature(
    inputs=Schema(
        [
            ColSpec(Array(DataType.string), "sentences"),
            ColSpec(Array(Array(DataType.double)), "image_features"),
        ]
    ),
    outputs=Schema(
        [ColSpec(Array(Array(DataType.double)), "scores"), ColSpec(Array(Array(DataType.long)), "links")]
    ),
    params=ParamSchema([ParamSpec("threshold", DataType.double, 0.0)]),
)


MAX_SENTENCES = 200  # per document; a serving request beyond this is refused with HTTP 400
MAX_IMAGES = 200


def _bad_request(message: str) -> Exception:
    """MLflow's scoring server answers an MlflowException with its own status code (400 here)
    and message; any other exception becomes an opaque 'unexpected error'."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


class LinkModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context) -> None:
        from training.train import load_checkpoint_model

        self.model, meta = load_checkpoint_model(context.artifacts["checkpoint"])
        self.vocab = Vocabulary.load(context.artifacts["vocab"])
        self.max_tokens = int(meta["train"]["max_tokens"])

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        import pyarrow as pa

        threshold = float((params or {}).get("threshold", 0.0))
        rows = []
        missing = {"sentences", "image_features"} - set(model_input.columns)
        if missing:
            raise _bad_request(f"input is missing column(s) {sorted(missing)}")
        width = self.model.cfg.image_dim
        for row, (sentences, feats) in enumerate(
            zip(model_input["sentences"], model_input["image_features"], strict=True)
        ):
            if sentences is None or feats is None or isinstance(sentences, str):
                raise _bad_request(f"document {row}: sentences and image_features must be lists")
            sentences = [str(s) for s in sentences]
            if not sentences or len(feats) == 0:
                raise _bad_request(f"document {row}: needs >= 1 sentence and >= 1 image")
            if len(sentences) > MAX_SENTENCES or len(feats) > MAX_IMAGES:
                raise _bad_request(
                    f"document {row}: at most {MAX_SENTENCES} sentences and {MAX_IMAGES} images per document"
                )
            try:
                feats = np.asarray([np.asarray(f, dtype=np.float32) for f in feats])
            except (TypeError, ValueError) as exc:
                raise _bad_request(f"document {row}: image_features must be numbers: {exc}") from None
            if feats.ndim != 2 or feats.shape[1] != width:
                raise _bad_request(f"document {row}: each image feature vector must have {width} numbers")
            if not np.isfinite(feats).all():
                raise _bad_request(f"document {row}: image_features contain NaN or infinity")
            table = pa.table(
                {
                    "doc_id": ["input"],
                    "sentences": [sentences],
                    "images": [[{"features": f.tolist()} for f in feats]],
                }
            )
            batch = make_batch(table, self.vocab, self.max_tokens)
            with torch.no_grad():
                scores = self.model.score_matrix(batch.tokens, batch.lengths, batch.features)
            r, c = max_weight_matching(scores)
            links = [[int(a), int(b)] for a, b in zip(r, c, strict=True) if scores[a, b] >= threshold]
            rows.append({"scores": scores.astype(float).tolist(), "links": links})
        return pd.DataFrame(rows, columns=["scores", "links"])


def log_link_model(checkpoint_dir: str, vocab: Vocabulary, example: dict | None = None) -> str:
    """Log the pyfunc model into the active run; returns its model URI."""
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "checkpoint"
        shutil.copytree(checkpoint_dir, ckpt)
        vocab_path = Path(tmp) / "vocab.json"
        vocab.save(vocab_path)
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=LinkModel(),
            artifacts={"checkpoint": str(ckpt), "vocab": str(vocab_path)},
            signature=SIGNATURE,
            input_example=pd.DataFrame([example]) if example else None,
        )
    return info.model_uri


def example_document(sentences: list[str], features: list[list[float]]) -> dict:
    return {"sentences": list(sentences), "image_features": [list(map(float, f)) for f in features]}


__all__ = ["SIGNATURE", "LinkModel", "example_document", "log_link_model"]
