"""Per-attribute retrieval report (issue #45): does a retrieval model rank by what a text names,
or only by what dominates the image features?

For pairs that carry attribute truth (``schemas.manifest.pair_attributes``: a graded-salience
corpus of ``mmlinks data synth-coherence --salience graded``):

- top-5 match of attribute a: among the queries whose text names a, the share of their top-5
  images (ranked among every image of the split) whose value of a is the query's own, next to
  chance (the share of the split's images with the query's value, averaged over those queries).
  A model that ranks by colour alone matches the ink and backdrop and leaves the digit at chance.
- linear-probe ceiling: a logistic regression on the frozen image features (fitted on the
  training split, scored on the evaluated one) for the same attribute; what the features carry,
  so top-5 match / probe says how much of it the model uses.
- attribute oracle: a ranking by the number of named attributes an image matches (ties broken at
  random), scored over the same pools as the model: the MedR an attribute-perfect model reaches.
"""

from __future__ import annotations

import numpy as np

from schemas.manifest import pair_attributes
from training.ranking import retrieval_metrics

TOP = 5


def pair_truth(metadata: list) -> tuple[list[dict[str, str]], list[set[str]], list[str]]:
    """(values per pair, named attributes per pair, every attribute name in order of first
    appearance) of a split's metadata rows; names [] when no pair carries attribute truth."""
    values, named, names = [], [], []
    for meta in metadata:
        v, n = pair_attributes(meta)
        values.append(v)
        named.append(n)
        names += [a for a in v if a not in names]
    return values, named, names


def top_match(
    scores: np.ndarray, values: list[dict], named: list[set], names: list[str], k: int = TOP
) -> dict:
    """{attribute: {queries, top5_match, chance}} from text x image ``scores`` [Q, Q] (pair i's
    text is row i, its image column i)."""
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    out = {}
    for a in names:
        column = np.asarray([v.get(a, "") for v in values], dtype=object)
        queries = [i for i in range(len(values)) if a in named[i]]
        if not queries:
            out[a] = {"queries": 0, "top5_match": None, "chance": None}
            continue
        match = [float(np.mean(column[top[i]] == column[i])) for i in queries]
        chance = [float(np.mean(column == column[i])) for i in queries]
        out[a] = {
            "queries": len(queries),
            "top5_match": float(np.mean(match)),
            "chance": float(np.mean(chance)),
        }
    return out


def oracle_scores(values: list[dict], named: list[set], seed: int = 0) -> np.ndarray:
    """[Q, Q]: how many of text i's named attributes image j shows, plus a tie-break below 1."""
    n = len(values)
    out = np.random.default_rng(seed).uniform(0, 0.5, size=(n, n))
    for a in sorted({a for v in values for a in v}):
        column = np.asarray([v.get(a, "") for v in values], dtype=object)
        names_it = np.asarray([a in s for s in named])
        out += names_it[:, None] & (column[:, None] == column[None, :])
    return out


def linear_probe(
    train_features: np.ndarray,
    train_values: list[dict],
    features: np.ndarray,
    values: list[dict],
    names: list[str],
) -> dict[str, float | None]:
    """{attribute: accuracy} of a logistic regression on standardised frozen image features,
    fitted on the training pairs and scored on ``features`` (None: fewer than 2 values)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    out: dict[str, float | None] = {}
    for a in names:
        y_train = np.asarray([v.get(a, "") for v in train_values])
        y = np.asarray([v.get(a, "") for v in values])
        if len(set(y_train)) < 2 or not len(y):
            out[a] = None
            continue
        probe = make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=2000))
        probe.fit(train_features, y_train)
        out[a] = float(probe.score(features, y))
    return out


def attribute_metrics(
    scores: np.ndarray, metadata: list, pool_size: int, n_pools: int, seed: int
) -> dict | None:
    """{"attributes": top_match's dict, "oracle": the oracle's t2i metrics} of a split (None when
    its pairs carry no attribute truth)."""
    values, named, names = pair_truth(metadata)
    if not names:
        return None
    oracle = retrieval_metrics(
        oracle_scores(values, named, seed), pool_size=pool_size, n_pools=n_pools, seed=seed
    )
    return {"attributes": top_match(scores, values, named, names), "oracle": oracle["t2i"]}


def add_probe(report: dict, train_features, train_metadata: list, features, metadata: list) -> dict:
    """``report`` (evaluate_pairs' dict with "attributes") with each attribute's probe accuracy
    and top5_match / probe."""
    train_values, _, _ = pair_truth(train_metadata)
    values, _, names = pair_truth(metadata)
    probe = linear_probe(np.asarray(train_features), train_values, np.asarray(features), values, names)
    for a, m in report["attributes"].items():
        m["probe"] = probe.get(a)
        ok = m["probe"] and m["top5_match"] is not None
        m["match_over_probe"] = m["top5_match"] / m["probe"] if ok else None
    return report
