"""The feature-level generator at scale (issue #47): its fixed layer is drawn once per width."""

from __future__ import annotations

import numpy as np

from pipelines.feature_corpus import content_features, extractor_layer


def test_the_extractor_layer_is_drawn_once_per_width_and_cannot_be_changed():
    w, b = extractor_layer(32)
    assert extractor_layer(32)[0] is w  # drawn per document before: ~40 % of a 1M corpus's time
    assert not w.flags.writeable and not b.flags.writeable  # a cached layer nobody may modify
    rng = np.random.default_rng(1234 + 32)  # the same values as the per-call draw gave
    np.testing.assert_array_equal(w, rng.normal(0, 1 / 8, (32, 64)))
    np.testing.assert_array_equal(b, rng.normal(0, 0.25, 32))
    x = np.random.default_rng(0).random((3, 64))
    np.testing.assert_array_equal(content_features(x, 32), np.maximum(x @ w.T + b, 0.0))
