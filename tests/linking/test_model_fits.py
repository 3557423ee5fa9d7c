"""``check_model_fits`` (`mmlinks link`): a model whose training run lacks the compatibility
params is refused before any work, naming what is missing, not linked unchecked (issue #19)."""

from __future__ import annotations

import pytest

from linking.model import ResolvedModel, check_model_fits
from schemas.document import SCHEMA_VERSION
from schemas.errors import MmlinksError
from schemas.links import ModelInfo
from schemas.manifest import Manifest

URI = "models:/mmlinks-ap@production"


def _manifest() -> Manifest:
    """A dataset manifest in the format ``Manifest.read`` parses (no shards are needed)."""
    return Manifest.from_dict(
        {
            "schema_version": SCHEMA_VERSION,
            "dataset_version": "0123456789abcdef",
            "source": "synthetic",
            "counts": {"splits": {"train": 3}},
            "feature_extractor": {"name": "efficientnet-lite0", "version": "effnet-sha-1", "dim": 1280},
            "shards": [],
        }
    )


def _model(params: dict[str, str], version: str | None = "7") -> ResolvedModel:
    """A resolved model as ``resolve_model`` returns it: the run's params are MLflow's strings."""
    return ResolvedModel(ModelInfo(URI, "mmlinks-ap", version, "run-1"), "models:/mmlinks-ap/7", params)


FITS = {"schema_version": str(SCHEMA_VERSION), "feature_extractor": "efficientnet-lite0@effnet-sha-1"}


def test_a_model_trained_on_the_same_extractor_and_schema_fits():
    check_model_fits(_model({**FITS, "lr": "0.001"}), _manifest())


@pytest.mark.parametrize(
    "params, missing",
    [
        ({}, "schema_version or feature_extractor"),
        ({"feature_extractor": FITS["feature_extractor"]}, "schema_version"),
        ({"schema_version": FITS["schema_version"], "lr": "0.001"}, "feature_extractor"),
    ],
)
def test_a_run_without_the_compatibility_params_is_refused_naming_them(params, missing):
    with pytest.raises(MmlinksError) as err:
        check_model_fits(_model(params), _manifest())
    message = str(err.value)
    assert f"{URI} (version 7) has no {missing} parameter" in message, message
    assert "cannot be checked" in message and "\n" not in message


def test_a_runs_uri_is_named_as_given_when_there_is_no_version():
    with pytest.raises(MmlinksError, match=r"^runs:/run-1/model has no schema_version"):
        check_model_fits(
            ResolvedModel(ModelInfo("runs:/run-1/model", None, None, "run-1"), "runs:/run-1/model", {}),
            _manifest(),
        )


def test_another_extractor_or_schema_is_refused_naming_both():
    with pytest.raises(
        MmlinksError, match="trained with feature_extractor=densenet169@d-1, but the dataset has"
    ):
        check_model_fits(_model({**FITS, "feature_extractor": "densenet169@d-1"}), _manifest())
    with pytest.raises(
        MmlinksError, match=f"trained with schema_version=1, but the dataset has {SCHEMA_VERSION}"
    ):
        check_model_fits(_model({**FITS, "schema_version": "1"}), _manifest())


def test_a_model_trained_on_v2_features_fits_a_v3_dataset():
    """Schema v3 stores v2's feature values as bytes: a production model trained before the
    change links migrated datasets; v1 (another region layout) stays refused."""
    assert SCHEMA_VERSION == 3
    check_model_fits(_model({**FITS, "schema_version": "2"}), _manifest())
    with pytest.raises(MmlinksError, match="trained with schema_version=1"):
        check_model_fits(_model({**FITS, "schema_version": "1"}), _manifest())
    with pytest.raises(MmlinksError, match="trained with schema_version=4"):
        check_model_fits(_model({**FITS, "schema_version": "4"}), _manifest())
