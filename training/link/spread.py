"""Error analysis of Hessel et al. 2019 (section 4.1): is a document hard because of its spread
or its content? (docs/evaluation.md, "Spread and content").

As in the paper, the vectors describe the dataset, not a model. Why adjusted R^2 and the F-test:
R^2 alone grows with every regressor; a saturated fit gives null for both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy import stats

from training.link.baselines import WordVectors, unit_rows

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

CONTENT_COMPONENTS = 20


def directions(vectors: np.ndarray) -> np.ndarray:
    """Unit rows of the non-zero rows. Each row is first divided by its largest magnitude, so a
    row of tiny values (whose squares underflow to subnormals) keeps its exact direction."""
    x = np.asarray(vectors, dtype=np.float64)
    scale = np.abs(x).max(axis=1) if x.size else np.zeros(len(x))
    keep = scale > 0
    return unit_rows(x[keep] / scale[keep, None])


def spread(vectors: np.ndarray) -> float:
    """Mean squared distance of the L2-normalised rows to their centroid (zero rows skipped);
    NaN without any non-zero row."""
    x = directions(vectors)
    if not len(x):
        return float("nan")
    return float(np.mean(np.sum((x - x.mean(0)) ** 2, axis=1)))


def mean_direction(vectors: np.ndarray) -> np.ndarray:
    """Mean of the L2-normalised non-zero rows (zeros when there is none): the content vector."""
    x = directions(vectors)
    return x.mean(0) if len(x) else np.zeros(np.asarray(vectors).shape[1])


def pca_scores(x: np.ndarray, n_components: int = CONTENT_COMPONENTS) -> np.ndarray:
    """Rows of ``x`` projected on its first principal components (at most n - 1 and dim)."""
    x = np.asarray(x, dtype=np.float64)
    k = max(0, min(n_components, x.shape[0] - 1, x.shape[1]))
    if k == 0:
        return np.zeros((x.shape[0], 0))
    centred = x - x.mean(0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    return centred @ vt[:k].T


@dataclass
class OLSFit:
    r2: float
    adj_r2: float | None
    f_pvalue: float | None
    n_docs: int
    n_regressors: int  # rank of the regressors, intercept not counted
    saturated: bool

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def ols_r2(y: np.ndarray, x: np.ndarray) -> OLSFit:
    """R^2 of the OLS fit of ``y`` on the columns of ``x`` plus an intercept (numpy lstsq).

    The regressor count is the rank of the centred ``x``, so duplicate or constant columns do
    not inflate the degrees of freedom. NaN R^2 when ``y`` is constant.
    """
    y = np.asarray(y, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64).reshape(len(y), -1)
    n = len(y)
    design = np.column_stack([np.ones(n), x])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    ssr = float(np.sum((y - design @ coef) ** 2))
    sst = float(np.sum((y - y.mean()) ** 2))
    p = int(np.linalg.matrix_rank(x - x.mean(0))) if x.shape[1] and n > 1 else 0
    r2 = 1.0 - ssr / sst if sst > 0 else float("nan")
    dof = n - p - 1
    if dof <= 0 or p == 0 or not np.isfinite(r2):
        return OLSFit(r2, None, None, n, p, dof <= 0)
    adj = 1.0 - (1.0 - r2) * (n - 1) / dof
    if r2 >= 1.0:
        pvalue = 0.0
    else:
        f = (r2 / p) / ((1.0 - r2) / dof)
        pvalue = float(stats.f.sf(f, p, dof))
    return OLSFit(r2, adj, pvalue, n, p, False)


@dataclass
class DocSpread:
    doc_id: str
    image_spread: float
    text_spread: float
    image_content: np.ndarray  # mean normalised CNN feature
    text_content: np.ndarray  # mean normalised sentence vector


def document_spread(doc_id: str, sentences: list[str], features: np.ndarray, words: WordVectors) -> DocSpread:
    s = words.sentence_matrix(sentences)
    return DocSpread(doc_id, spread(features), spread(s), mean_direction(features), mean_direction(s))


def spread_regressions(aucs: list[float], spreads: list[DocSpread]) -> dict:
    """OLS of per-document AUC on spread, and on spread + content (see the module docstring).

    Documents whose text spread is undefined (no sentence with a known word) are left out.
    """
    keep = [
        i
        for i, d in enumerate(spreads)
        if np.isfinite(aucs[i]) and np.isfinite(d.image_spread) and np.isfinite(d.text_spread)
    ]
    y = np.array([aucs[i] for i in keep], dtype=np.float64)
    sp = np.array([[spreads[i].image_spread, spreads[i].text_spread] for i in keep]).reshape(len(keep), 2)
    if len(keep) < 3:
        return {"n_docs": len(keep), "spread": None, "spread_content": None, "content_components": None}
    img = pca_scores(np.stack([spreads[i].image_content for i in keep]))
    txt = pca_scores(np.stack([spreads[i].text_content for i in keep]))
    both = np.column_stack([sp, img, txt])
    return {
        "n_docs": len(keep),
        "spread": ols_r2(y, sp).to_dict(),
        "image_spread_only": ols_r2(y, sp[:, :1]).to_dict(),
        "text_spread_only": ols_r2(y, sp[:, 1:]).to_dict(),
        "spread_content": ols_r2(y, both).to_dict(),
        "content_components": {"image": int(img.shape[1]), "text": int(txt.shape[1])},
    }


def add_spread(rows: list[dict], data: str | Path, split: str, word_vectors: str = "glove") -> dict:
    """Add image_spread / text_spread to each per-document row of ``training.evaluate.evaluate``
    on ``split`` of ``data``; returns the OLS analysis (``mmlinks evaluate --spread``). Here, not
    in the core's evaluation: spread is the link family's error analysis."""
    from schemas.manifest import Manifest
    from schemas.shards import read_table
    from training.data import TRAINING_COLUMNS, features_of

    table = read_table(Manifest.read(data).shard_paths(data, split), columns=TRAINING_COLUMNS)
    sentences = table.column("sentences").to_pylist()
    words = WordVectors.load(word_vectors, (s for doc in sentences for s in doc))
    feats, _ = features_of(table)
    by_id = {
        d: document_spread(d, s, f, words)
        for d, s, f in zip(table.column("doc_id").to_pylist(), sentences, feats, strict=True)
    }
    spreads = [by_id[r["doc_id"]] for r in rows]
    for r, sp in zip(rows, spreads, strict=True):
        r["image_spread"], r["text_spread"] = sp.image_spread, sp.text_spread
    return {"word_vectors": words.name, **spread_regressions([r["auc"] for r in rows], spreads)}
