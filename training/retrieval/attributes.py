"""Per-attribute retrieval report (issue #45; docs/evaluation.md, "Per attribute").

Why: does a model rank by what a text names, or only by what dominates the image features? Top-5
match over the linear probe says how much of what the features carry the model uses; the probe
oracle is a model with a linear read-out image side and a perfect text side."""

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


def _probes(train_features: np.ndarray, train_values: list[dict], names: list[str]) -> dict:
    """{attribute: logistic regression on standardised features, fitted on the training pairs}
    (attributes with fewer than 2 training values left out)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    out = {}
    for a in names:
        y_train = np.asarray([v.get(a, "") for v in train_values])
        if len(set(y_train)) >= 2:
            probe = make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=2000))
            out[a] = probe.fit(train_features, y_train)
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
    probes = _probes(train_features, train_values, names)
    out: dict[str, float | None] = {}
    for a in names:
        y = np.asarray([v.get(a, "") for v in values])
        out[a] = float(probes[a].score(features, y)) if a in probes and len(y) else None
    return out


def probe_oracle_scores(
    train_features: np.ndarray,
    train_values: list[dict],
    features: np.ndarray,
    values: list[dict],
    named: list[set],
    seed: int = 0,
) -> np.ndarray:
    """[Q, Q]: the attribute oracle with its image side read from the frozen features: text i
    against image j scores the summed probability, by the linear probes, that image j shows each
    value text i names (a tie-break far below one probability step).

    Why: the oracle knows every image's attributes; a model sees only the features. This ranks
    as well as the features allow a linear read-out to (with a perfect text side), so a model's
    MedR between the two oracles' says how much of the gap is the features' (issue #45)."""
    names = sorted({a for v in train_values for a in v})
    out = np.random.default_rng(seed).uniform(0, 1e-6, size=(len(values), len(values)))
    for a, probe in _probes(np.asarray(train_features), train_values, names).items():
        classes = list(probe.classes_)
        proba = probe.predict_proba(np.asarray(features))  # [images, classes]
        col = np.asarray([classes.index(v[a]) if v.get(a) in classes else -1 for v in values])
        names_it = np.asarray([a in s and c >= 0 for s, c in zip(named, col, strict=True)])
        out += names_it[:, None] * proba[:, col.clip(0)].T  # [text i, image j] = p_j(value of i)
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
