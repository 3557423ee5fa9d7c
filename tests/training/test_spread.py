"""Spread, content and the OLS R^2 against closed forms and independent computations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import stats

from training.link.baselines import WordVectors
from training.link.spread import DocSpread, document_spread, ols_r2, pca_scores, spread, spread_regressions

FINITE = st.floats(-10, 10, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 8), st.integers(1, 5)), elements=FINITE))
def test_spread_equals_half_the_mean_pairwise_squared_distance(x):
    keep = np.linalg.norm(x, axis=1) > 1e-6
    assume(keep.any() and (x[~keep] == 0).all())  # dropped rows are exactly zero, not subnormal
    u = [row / np.linalg.norm(row) for row in x[keep]]
    n = len(u)
    # mean squared distance to the centroid = sum_ij ||u_i - u_j||^2 / (2 n^2), and for unit
    # vectors = 1 - ||centroid||^2
    pairwise = sum(float(np.sum((a - b) ** 2)) for a in u for b in u) / (2 * n * n)
    assert spread(x) == pytest.approx(pairwise, abs=1e-9)
    assert spread(x) == pytest.approx(1 - float(np.sum(np.mean(u, 0) ** 2)), abs=1e-9)
    assert spread(3.5 * x) == pytest.approx(spread(x), abs=1e-9)  # only directions count


def test_spread_of_known_configurations():
    assert spread(np.eye(4)) == pytest.approx(1 - 1 / 4)  # orthonormal: 1 - 1/n
    assert spread(np.array([[1.0, 0.0], [-2.0, 0.0]])) == pytest.approx(1.0)  # opposite: the maximum
    assert spread(np.array([[1.0, 2.0], [2.0, 4.0], [0.0, 0.0]])) == 0.0  # same direction; zero row skipped
    assert np.isnan(spread(np.zeros((2, 3))))


def test_ols_with_one_regressor_is_the_squared_correlation_and_its_t_test():
    rng = np.random.default_rng(0)
    x = rng.normal(size=40)
    y = 0.3 * x + rng.normal(size=40)
    fit, ref = ols_r2(y, x[:, None]), stats.linregress(x, y)
    assert fit.r2 == pytest.approx(ref.rvalue**2)
    assert fit.f_pvalue == pytest.approx(ref.pvalue)  # F(1, n-2) = t^2
    assert fit.adj_r2 == pytest.approx(1 - (1 - ref.rvalue**2) * 39 / 38)
    assert (fit.n_docs, fit.n_regressors, fit.saturated) == (40, 1, False)


@settings(max_examples=100, deadline=None)
@given(st.integers(6, 30), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_ols_matches_the_normal_equations(n, p, seed):
    assume(n > p + 1)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, p))
    y = x @ rng.normal(size=p) + rng.normal(size=n)
    design = np.column_stack([np.ones(n), x])
    beta = np.linalg.solve(design.T @ design, design.T @ y)
    ssr = np.sum((y - design @ beta) ** 2)
    sst = np.sum((y - y.mean()) ** 2)
    f = ((sst - ssr) / p) / (ssr / (n - p - 1))
    fit = ols_r2(y, x)
    assert fit.r2 == pytest.approx(1 - ssr / sst, abs=1e-9)
    assert fit.f_pvalue == pytest.approx(stats.f.sf(f, p, n - p - 1), rel=1e-6, abs=1e-12)
    # a duplicated column adds no information and no degree of freedom
    again = ols_r2(y, np.column_stack([x, x[:, :1]]))
    assert again.r2 == pytest.approx(fit.r2, abs=1e-9) and again.n_regressors == p


def test_saturated_and_degenerate_fits_report_no_adjusted_r2():
    y = np.array([0.2, 0.5, 0.9])
    fit = ols_r2(y, np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    assert fit.saturated and fit.adj_r2 is None and fit.f_pvalue is None
    assert fit.r2 == pytest.approx(1.0)
    assert np.isnan(ols_r2(np.ones(5), np.arange(5.0)[:, None]).r2)  # constant AUC: nothing to explain


def test_pca_scores_are_projections_on_the_top_eigenvectors():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(30, 6)) @ rng.normal(size=(6, 6))
    got = pca_scores(x, 3)
    evals, evecs = np.linalg.eigh(np.cov(x.T))
    order = np.argsort(evals)[::-1][:3]
    want = (x - x.mean(0)) @ evecs[:, order]
    for j in range(3):  # an eigenvector's sign is arbitrary
        assert np.allclose(got[:, j], want[:, j], atol=1e-8) or np.allclose(got[:, j], -want[:, j], atol=1e-8)
    assert pca_scores(x[:4], 20).shape == (4, 3)  # at most n - 1 components


def test_regressions_recover_a_planted_spread_effect():
    rng = np.random.default_rng(2)
    n = 30
    img, txt = rng.random(n), rng.random(n)
    spreads = [DocSpread(f"d{i}", img[i], txt[i], rng.normal(size=5), rng.normal(size=4)) for i in range(n)]
    auc = 0.4 + 0.5 * img  # AUC depends on image spread only
    out = spread_regressions(list(auc), spreads)
    assert out["n_docs"] == n
    assert out["spread"]["r2"] == pytest.approx(1.0)
    assert out["image_spread_only"]["r2"] == pytest.approx(1.0)
    assert out["text_spread_only"]["r2"] == pytest.approx(stats.pearsonr(txt, auc)[0] ** 2)
    assert out["content_components"] == {"image": 5, "text": 4}  # min(20, n - 1, dim) per modality
    assert out["spread_content"]["n_regressors"] == 2 + 5 + 4
    noisy = spread_regressions(list(auc + rng.normal(0, 0.2, n)), spreads)
    assert noisy["spread"]["r2"] <= noisy["spread_content"]["r2"] + 1e-12  # nested models
    skipped = [*spreads[:3], DocSpread("x", 0.1, float("nan"), np.zeros(5), np.zeros(4))]
    assert spread_regressions([0.5, 0.6, 0.7, 0.8], skipped)["n_docs"] == 3


def test_document_spread_uses_cnn_features_and_mean_word_vectors():
    words = WordVectors(["dog", "cat", "car"], np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    features = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    d = document_spread("d", ["dog dog", "cat", "car", "??"], features, words)
    assert d.image_spread == pytest.approx(0.5)  # two orthogonal images
    s = np.array([[1, 0], [0, 1], [1, 1]]) / np.array([[1], [1], [np.sqrt(2)]])
    assert d.text_spread == pytest.approx(np.mean(np.sum((s - s.mean(0)) ** 2, 1)))  # "??" left out
    np.testing.assert_allclose(d.image_content, [0.5, 0.5, 0.0])
    np.testing.assert_allclose(d.text_content, s.mean(0))
