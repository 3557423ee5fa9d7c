"""The registered model: an ``mlflow.pyfunc`` wrapper, so downstream stages call one ``predict``.

Input per document: ``sentences`` and ``image_features`` (same extractor as the training data) or
raw ``images``, run through the extractor the model recorded (``served_extractor``); output: the
cosine matrix and the links kept at ``threshold``. Loading needs the installed ``mmlinks``
package (the wrapper class is pickled by reference)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import torch
from mlflow.models import ModelSignature
from mlflow.types.schema import Array, ColSpec, DataType, ParamSchema, ParamSpec, Schema

from features.registry import DEFAULT_EXTRACTOR
from models import integrity
from training.data import make_batch
from training.objectives.assignment import max_weight_matching
from training.text import Vocabulary

SIGNATURE = ModelSignature(
    inputs=Schema(
        [
            ColSpec(Array(DataType.string), "sentences"),
            # either precomputed CNN features (same extractor as the training data) ...
            ColSpec(Array(Array(DataType.double)), "image_features", required=False),
            # ... or the images themselves: base64 bytes, data: URIs or local file paths, run
            # through the packaged feature extractor
            ColSpec(Array(DataType.string), "images", required=False),
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


IMAGE_ROOT_ENV = "MMLINKS_IMAGE_ROOT"  # set it to let requests name image files under this folder
MAX_IMAGE_BYTES = 32 * 1024 * 1024


def _looks_like_base64(item: str) -> bool:
    return len(item) > 256 or ("/" not in item and "." not in item)


def _read_under_root(item: str, root: Path) -> bytes:
    """Read a named image file, only inside the configured root (a served model must not read
    arbitrary server files)."""
    path = (root / item).resolve()
    if not path.is_relative_to(root.resolve()):
        raise ValueError(f"path outside {IMAGE_ROOT_ENV}")
    with path.open("rb") as fh:
        return fh.read(MAX_IMAGE_BYTES + 1)


def _empty(value) -> bool:
    """None, a pandas NaN filler (a column another record set), or an empty list."""
    return value is None or isinstance(value, float) or (not isinstance(value, str) and len(value) == 0)


def feature_matrix(feats, width: int, where: str) -> np.ndarray:
    """A request's image features as a [N, width] float32 matrix of finite numbers, or a 400
    naming ``where`` (``document 3``, ``query 0``) and what is wrong."""
    try:
        feats = np.asarray([np.asarray(f, dtype=np.float32) for f in feats])
    except (TypeError, ValueError) as exc:
        raise _bad_request(f"{where}: image_features must be numbers: {exc}") from None
    if feats.ndim != 2 or feats.shape[1] != width:
        raise _bad_request(f"{where}: each image feature vector must have {width} numbers")
    if not np.isfinite(feats).all():
        raise _bad_request(f"{where}: image_features contain NaN or infinity")
    return feats


def check_extractor_version(name: str, packaged: str | None, installed: str) -> None:
    """Refuse images when this server's extractor is not the one the model was trained on: same
    name, other weights give other features, and the scores would be silently meaningless."""
    if packaged is None:
        raise _bad_request(
            f"this model names the feature extractor {name} but not its version, so images cannot "
            "be checked against the training features; send image_features"
        )
    if packaged != installed:
        raise _bad_request(
            f"this model was trained on {name}@{packaged} features, but this server has "
            f"{name}@{installed}; send image_features computed with {name}@{packaged}"
        )


def served_extractor(name: str, version: str | None, options: dict | None = None, weights: str | None = None):
    """The extractor a packaged model recorded, configured as at build time, for raw images.

    ``options``: the build's extractor options without the weight path (the manifest's
    ``build_params``, e.g. a CLIP ``model=``); ``weights``: the file used at training time, tried
    first where this machine has it, then the extractor's own lookup (``$MMLINKS_WEIGHTS_DIR``,
    the torch cache). Only an extractor whose version equals the recorded one is returned: same
    name, other weights or architecture give other features and meaningless scores. Anything
    else is a one-line HTTP 400 that says what to send instead.
    """
    return _resolve_served(name, version, options, weights)[0]


def served_extractor_options(
    name: str, version: str | None, options: dict | None = None, weights: str | None = None
) -> dict:
    """The extractor options (with ``weights`` where the recorded file was the one that matched)
    that rebuild ``served_extractor``'s extractor: what a Beam job that featurises raw documents
    for this model passes as ``BuildConfig.extractor_options``."""
    return _resolve_served(name, version, options, weights)[1]


def _resolve_served(name: str, version: str | None, options: dict | None, weights: str | None):
    from features import get_extractor
    from schemas.errors import MmlinksError

    if version is None:
        check_extractor_version(name, None, "")
    opts = {k: v for k, v in (options or {}).items() if k != "weights"}
    tries = ([{"weights": weights}] if weights and Path(weights).is_file() else []) + [{}]
    found, failure = None, None
    for extra in tries:
        try:
            extractor = get_extractor(name, **opts, **extra)
            installed = extractor.version
        except MmlinksError as exc:
            failure = failure or str(exc)
            continue
        if installed == version:
            return extractor, {**opts, **extra}
        found = found or installed
    if found is not None:
        check_extractor_version(name, version, found)  # raises: another file or architecture
    raise _bad_request(
        f"this model reads images with {name}@{version}, which this server cannot load ({failure}); "
        f"send image_features computed with {name}@{version}"
    )


class ImageFeaturizer:
    """Images in a request -> the CNN features the training data was built with: the extractor
    named by the model's ``extractor.json`` artifact, refused when this machine's weights version
    differs, loaded on the first request that sends images. Shared by the linking pyfunc and the
    retrieval pyfunc (``models/retrieval_serving.py``).

    An item is base64 bytes, a ``data:`` URI, or (only when ``MMLINKS_IMAGE_ROOT`` is set) a
    file path inside that folder; an unreadable one is a 400 naming the item."""

    def __init__(self, artifact: str | None, weights: str | None = None):
        packaged = json.loads(Path(artifact).read_text()) if artifact else {}
        self.name = packaged.get("name")
        self.version = packaged.get("version")  # absent in models packaged before #19
        self.options = packaged.get("options") or {}  # the build's extractor options (absent before #20)
        # the weight file used at training time: recorded, else ``weights`` (the CLIP backbone's own)
        self.weights = packaged.get("weights") or weights
        self._extractor = None  # resolved and loaded on the first request that sends images
        self._cnn = None

    def features(self, images: list, what: str) -> np.ndarray:
        """[N] images -> [N, D] float32 features; ``what`` names the request row in errors."""
        import base64
        import binascii

        from features.images import InvalidImage, decode
        from schemas.errors import MmlinksError

        if self.name is None:
            raise _bad_request("this model was packaged without a feature extractor; send image_features")
        if self._extractor is None:
            extractor = served_extractor(self.name, self.version, self.options, self.weights)
            try:
                self._cnn = extractor.load_model()
            except MmlinksError as exc:  # the file has the right digest but does not load here
                raise _bad_request(f"{exc}; send image_features") from None
            self._extractor = extractor
        extractor = self._extractor
        batch = []
        for k, item in enumerate(images):
            item = str(item)
            try:
                if item.startswith("data:"):
                    data = base64.b64decode(item.split(",", 1)[1], validate=True)
                elif IMAGE_ROOT_ENV in os.environ and not _looks_like_base64(item):
                    data = _read_under_root(item, Path(os.environ[IMAGE_ROOT_ENV]))
                else:
                    data = base64.b64decode(item, validate=True)
                if len(data) > MAX_IMAGE_BYTES:
                    raise ValueError(f"larger than {MAX_IMAGE_BYTES} bytes")
                batch.append(extractor.preprocess(decode(data)))
            except (binascii.Error, IndexError, ValueError, OSError, InvalidImage) as exc:
                raise _bad_request(f"{what}: image {k} is not a readable image ({exc})") from None
        outs = extractor.forward(self._cnn, batch)  # the build's forward: same features as the shards
        return np.stack([extractor.postprocess(o).features for o in outs]).astype(np.float32)


class CheckpointPyfunc(mlflow.pyfunc.PythonModel):
    """The part every family's pyfunc shares: ``_load_checkpoint`` checks the artifacts against
    the digests packaged with them (issue #62), then loads the trained model, its vocabulary and
    token budget; ``_log`` logs (or with ``path`` saves) the pyfunc with those digests and the
    stated requirements."""

    def _load_checkpoint(self, context) -> dict:
        from training.checkpoints import load_checkpoint_model

        integrity.verify_artifacts(context.artifacts, context.model_config)
        self.model, meta = load_checkpoint_model(context.artifacts["checkpoint"])
        self.vocab = Vocabulary.load(context.artifacts["vocab"])
        self.max_tokens = int(meta["train"]["max_tokens"])
        return meta

    def _log(self, artifacts: dict, signature, example, extra: tuple = (), path=None) -> str:
        kwargs = {
            "python_model": self,
            "artifacts": artifacts,
            "model_config": integrity.model_config(artifacts),
            "signature": signature,
            "input_example": example,
            "pip_requirements": [*pip_requirements(), *extra],
        }
        if path is None:
            return mlflow.pyfunc.log_model(name="model", **kwargs).model_uri
        mlflow.pyfunc.save_model(path=str(path), **kwargs)
        return str(path)


class LinkModel(CheckpointPyfunc):
    def load_context(self, context) -> None:
        from training.backbone import needs_regions

        meta = self._load_checkpoint(context)
        self.regions = needs_regions(meta["model"])
        self.max_regions = int(meta["train"].get("max_regions", 36))
        # the CLIP backbone's own weight file, for models packaged without a recorded one
        self.images = ImageFeaturizer(context.artifacts.get("extractor"), meta["model"].get("clip_weights"))

    def _featurize(self, row: int, images: list[str]) -> np.ndarray:
        """Decode images and run the extractor the training data was built with."""
        return self.images.features(images, f"document {row}")

    def score(self, sentences: list[str], features: np.ndarray) -> np.ndarray:
        """The sentence x image cosine matrix of one document (no request limits)."""
        import pyarrow as pa

        from training.data import link_scores

        table = pa.table(
            {
                "doc_id": ["input"],
                "sentences": [list(sentences)],
                # Served documents carry global features only: a region-reading backbone then
                # sees each image as its global feature (training/regions.py).
                "images": [
                    [
                        {"features": np.asarray(f, dtype=np.float32).tolist(), "regions": None}
                        for f in features
                    ]
                ],
            }
        )
        batch = make_batch(
            table, self.vocab, self.max_tokens, regions=self.regions, max_regions=self.max_regions
        )
        with torch.no_grad():
            return link_scores(self.model, batch)[0]

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        threshold = float((params or {}).get("threshold", 0.0))
        rows = []
        if self.regions:
            # Requests carry global features only; this backbone was trained on region features
            # and would score every image through its untrained fallback token.
            raise _bad_request(
                "this model's backbone (transformer) reads region features, which served requests "
                "cannot carry yet; evaluate it with `mmlinks evaluate --checkpoint` on region-bearing shards"
            )
        if "sentences" not in model_input.columns or not (
            {"image_features", "images"} & set(model_input.columns)
        ):
            raise _bad_request("input needs a sentences column and image_features or images")
        width = self.model.cfg.image_dim
        n = len(model_input)
        feature_col = model_input["image_features"] if "image_features" in model_input else [None] * n
        image_col = model_input["images"] if "images" in model_input else [None] * n
        for row, (sentences, feats, images) in enumerate(
            zip(model_input["sentences"], feature_col, image_col, strict=True)
        ):
            if _empty(feats) and not _empty(images):
                if len(images) > MAX_IMAGES:
                    raise _bad_request(f"document {row}: at most {MAX_IMAGES} images per document")
                feats = self._featurize(row, list(images))
            if _empty(feats):
                raise _bad_request(f"document {row}: send image_features or images")
            if sentences is None or isinstance(sentences, str | float):
                raise _bad_request(f"document {row}: sentences must be a list of strings")
            sentences = [str(s) for s in sentences]
            if not sentences or len(feats) == 0:
                raise _bad_request(f"document {row}: needs >= 1 sentence and >= 1 image")
            if len(sentences) > MAX_SENTENCES or len(feats) > MAX_IMAGES:
                raise _bad_request(
                    f"document {row}: at most {MAX_SENTENCES} sentences and {MAX_IMAGES} images per document"
                )
            feats = feature_matrix(feats, width, f"document {row}")
            scores = self.score(sentences, feats)
            r, c = max_weight_matching(scores)
            links = [[int(a), int(b)] for a, b in zip(r, c, strict=True) if scores[a, b] >= threshold]
            rows.append({"scores": scores.astype(float).tolist(), "links": links})
        return pd.DataFrame(rows, columns=["scores", "links"])


# The models' pip requirements, stated instead of inferred: MLflow's inference re-imports the
# model in a subprocess (10-30 s per logged model on 2 cores) and finds this same list (the
# wrapper classes need the installed mmlinks package, which brings torch; the assignment solver
# needs scipy). Pinned to the versions installed where the model is logged.
REQUIREMENTS = ("mlflow", "cloudpickle", "mmlinks", "numpy", "pandas", "pyarrow", "scipy", "torch")


def pip_requirements() -> list[str]:
    """``name==version`` of each of ``REQUIREMENTS`` as installed here (bare name if absent)."""
    from importlib import metadata

    out = []
    for name in REQUIREMENTS:
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(name)
    return out


def log_link_model(
    checkpoint_dir: str,
    vocab: Vocabulary,
    example: dict | None = None,
    extractor: str | None = DEFAULT_EXTRACTOR,
    extractor_version: str | None = None,
    extractor_options: dict | None = None,
    extractor_weights: str | None = None,
) -> str:
    """Log the pyfunc model into the active run; returns its model URI.

    ``extractor`` names the feature extractor of the training data, so requests may send
    images instead of features (None: features only); ``extractor_version`` (default: the
    installed extractor's) is checked against the serving machine's before images are scored.
    ``extractor_options`` (the build's, without the weight path) and ``extractor_weights`` (the
    file it read, a hint tried first) configure the extractor the server runs on raw images.
    """
    options = {k: v for k, v in (extractor_options or {}).items() if k != "weights"}
    if extractor and extractor_version is None:
        from features import get_extractor

        hint = {"weights": extractor_weights} if extractor_weights else {}
        extractor_version = get_extractor(extractor, **options, **hint).version
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "checkpoint"
        shutil.copytree(checkpoint_dir, ckpt)
        vocab_path = Path(tmp) / "vocab.json"
        vocab.save(vocab_path)
        artifacts = {"checkpoint": str(ckpt), "vocab": str(vocab_path)}
        if extractor:
            (Path(tmp) / "extractor.json").write_text(
                json.dumps(
                    {
                        "name": extractor,
                        "version": extractor_version,
                        "options": options,
                        "weights": str(extractor_weights) if extractor_weights else None,
                    }
                )
            )
            artifacts["extractor"] = str(Path(tmp) / "extractor.json")
        return LinkModel()._log(artifacts, SIGNATURE, pd.DataFrame([example]) if example else None)
