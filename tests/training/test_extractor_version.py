"""``check_extractor_version`` (issue #19): a served model refuses raw images unless the feature
extractor it was trained on, name and version, is the one this server runs; a model packaged
with no extractor version (before #19) is refused for images in one line, not scored unchecked."""

from __future__ import annotations

import json

import pytest
from mlflow.exceptions import MlflowException

from models.packaging import ImageFeaturizer, check_extractor_version

NAME = "efficientnet-lite0"


def _refusal(call) -> str:
    """The one-line HTTP 400 message a refusal carries (MLflow's scoring server sends it)."""
    with pytest.raises(MlflowException) as err:
        call()
    assert err.value.get_http_status_code() == 400, err.value
    message = err.value.message
    assert "\n" not in message and "send image_features" in message
    return message


def test_the_same_version_passes_another_is_refused_naming_both():
    check_extractor_version(NAME, "effnet-sha-1", "effnet-sha-1")
    message = _refusal(lambda: check_extractor_version(NAME, "effnet-sha-1", "effnet-sha-2"))
    assert f"trained on {NAME}@effnet-sha-1 features, but this server has {NAME}@effnet-sha-2" in message


def test_a_model_packaged_without_an_extractor_version_is_refused_for_images():
    message = _refusal(lambda: check_extractor_version(NAME, None, "effnet-sha-1"))
    assert f"names the feature extractor {NAME} but not its version" in message


def test_a_versionless_extractor_record_refuses_images_before_loading_anything(tmp_path):
    """``extractor.json`` as packaged before #19 (a name, no version): the featurizer refuses
    the first request with images; it never loads a CNN it cannot check."""
    record = tmp_path / "extractor.json"
    record.write_text(json.dumps({"name": NAME}))
    featurizer = ImageFeaturizer(str(record))
    assert (featurizer.name, featurizer.version) == (NAME, None)
    message = _refusal(lambda: featurizer.features(["aGVsbG8="], "document 0"))
    assert "but not its version" in message
    assert featurizer._extractor is None and featurizer._cnn is None
