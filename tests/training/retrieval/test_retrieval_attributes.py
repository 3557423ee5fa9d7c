"""The per-attribute retrieval report (issue #45): top-5 match per named attribute, the attribute
oracle and the linear-probe ceiling, on made-up scores and features."""

from __future__ import annotations

import numpy as np

from training.ranking import retrieval_metrics
from training.retrieval.attributes import (
    add_probe,
    attribute_metrics,
    oracle_scores,
    pair_truth,
    probe_oracle_scores,
    top_match,
)


def _meta(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        named = ["digit", "ink"] if i % 4 else ["ink"]
        out.append(
            {
                "attr.digit": str(rng.integers(10)),
                "attr.ink": ["red", "blue"][int(rng.integers(2))],
                "named": ",".join(named),
                "relations": "Visible",
            }
        )
    return out


def test_a_model_that_ranks_by_ink_alone_leaves_the_digit_at_chance():
    meta = _meta(400)
    values, named, names = pair_truth(meta)
    assert names == ["digit", "ink"]
    ink = np.asarray([v["ink"] for v in values])
    rng = np.random.default_rng(1)
    scores = (ink[:, None] == ink[None, :]).astype(float) + rng.uniform(0, 0.1, (400, 400))
    out = top_match(scores, values, named, names)
    assert out["ink"]["top5_match"] == 1.0 and out["ink"]["queries"] == 400
    assert out["digit"]["queries"] == 300
    assert abs(out["digit"]["top5_match"] - out["digit"]["chance"]) < 0.05
    assert abs(out["digit"]["chance"] - 0.1) < 0.03


def test_the_oracle_ranks_images_by_the_named_attributes():
    meta = _meta(200)
    values, named, _ = pair_truth(meta)
    scores = oracle_scores(values, named, seed=0)
    out = top_match(scores, values, named, ["digit", "ink"])
    assert out["digit"]["top5_match"] > 0.95 and out["ink"]["top5_match"] == 1.0
    report = attribute_metrics(scores, meta, pool_size=200, n_pools=1, seed=0)
    assert report["oracle"]["medr"] < 15  # ~200 / 20 images share digit and ink: MedR about 5
    assert attribute_metrics(scores, [{"relations": "Visible"}] * 200, 200, 1, 0) is None


def test_the_probe_finds_what_the_features_carry_and_only_that():
    """A feature that encodes the ink (and noise for the digit): probe ~1 for the ink, ~chance
    for the digit; match / probe divides the two."""
    train_meta, meta = _meta(300, 0), _meta(200, 1)
    rng = np.random.default_rng(2)

    def features(rows):
        ink = np.asarray([[float(r["attr.ink"] == "red")] for r in rows])
        return np.hstack([ink + 0.05 * rng.normal(size=ink.shape), rng.normal(size=(len(rows), 5))])

    report = {"attributes": {"digit": {"top5_match": 0.1}, "ink": {"top5_match": 0.9}}}
    add_probe(report, features(train_meta), train_meta, features(meta), meta)
    assert report["attributes"]["ink"]["probe"] > 0.95
    assert report["attributes"]["digit"]["probe"] < 0.3
    assert (
        abs(report["attributes"]["ink"]["match_over_probe"] - 0.9 / report["attributes"]["ink"]["probe"])
        < 1e-9
    )


def _attribute_features(rows, rng, digit: bool) -> np.ndarray:
    """One-hot ink, one-hot digit (or noise in its place), a little noise on both."""
    ink = np.asarray([[float(r["attr.ink"] == "red")] for r in rows])
    if digit:
        d = np.eye(10)[[int(r["attr.digit"]) for r in rows]]
    else:
        d = rng.normal(size=(len(rows), 10))
    return np.hstack([ink, d]) + 0.05 * rng.normal(size=(len(rows), 11))


def test_the_probe_oracle_is_the_oracle_where_the_features_carry_everything_and_worse_where_not():
    """Features that carry ink and digit: the probe oracle ranks as the attribute oracle does
    (MedR within one rank); features without the digit: its MedR is worse, as the features allow."""
    train_meta, meta = _meta(400, 0), _meta(200, 1)
    train_values, _, _ = pair_truth(train_meta)
    values, named, _ = pair_truth(meta)
    rng = np.random.default_rng(3)

    def medr(scores):
        return retrieval_metrics(scores, pool_size=200, n_pools=1, seed=0)["t2i"]["medr"]

    def probe_oracle(digit: bool):
        train, test = (_attribute_features(rows, rng, digit) for rows in (train_meta, meta))
        return probe_oracle_scores(train, train_values, test, values, named)

    oracle = medr(oracle_scores(values, named, seed=0))
    full, ink_only = probe_oracle(True), probe_oracle(False)
    assert full.shape == (200, 200)
    assert abs(medr(full) - oracle) <= 1  # images that match all named values tie: order by chance
    assert medr(ink_only) > 2 * oracle
    # text i's row ranks the images by the summed probabilities of i's named values
    out = top_match(full, values, named, ["digit", "ink"])
    assert out["digit"]["top5_match"] > 0.95 and out["ink"]["top5_match"] > 0.98


def test_the_probe_oracle_is_oriented_text_by_image():
    """Row i is text i, column j image j: a text that names nothing scores every image at the
    tie-break alone, while its image still scores against the texts naming what it shows (a
    transposed matrix swaps the two)."""
    train_meta, meta = _meta(400, 0), _meta(40, 1)
    train_values, _, _ = pair_truth(train_meta)
    values, named, _ = pair_truth(meta)
    named = [set(), *named[1:]]  # text 0 names nothing
    rng = np.random.default_rng(4)
    train, test = (_attribute_features(rows, rng, digit=True) for rows in (train_meta, meta))
    out = probe_oracle_scores(train, train_values, test, values, named)
    assert out[0].max() < 1e-5
    assert out[1:, 0].max() > 0.5


def test_evaluate_prints_the_attribute_table(capsys):
    """`mmlinks evaluate`'s table for a retrieval model with attribute truth (--json carries the
    same dict)."""
    from cli.evaluate import show_evaluation

    cells = {"medr": 3.0, "r1": 20.0, "r5": 50.0, "r10": 70.0, "pool_size": 500}
    attrs = {
        "digit": {"queries": 400, "top5_match": 0.55, "chance": 0.1, "probe": 0.68, "match_over_probe": 0.81},
        "ink": {"queries": 500, "top5_match": 0.99, "chance": 0.25, "probe": 1.0, "match_over_probe": 0.99},
    }
    m = {"t2i": cells, "i2t": cells, "attributes": attrs, "oracle": {"medr": 4.0}}
    show_evaluation({"family": "retrieval", "split": "test", "models": {"CMCA": m}})
    out = capsys.readouterr().out
    assert "attribute oracle MedR 4.0" in out
    assert "digit" in out and "55.0" in out and "68.0" in out and "0.81" in out
