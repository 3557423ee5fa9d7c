"""`mmlinks evaluate` for retrieval models, and their HTML report (the paper's Figure 6;
docs/evaluation.md): the test metrics plus each query's rank among all the split's images and its
top 5. Images are data URIs, so remotely named ones show as grey boxes."""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from schemas.manifest import Manifest
from training.report import CSS, thumbnail
from training.retrieval.pairs import ranking_scores
from training.text import Vocabulary

TOP = 5


@dataclass
class LoadedRetrieval:
    """A retrieval model ready to evaluate: the network, its text side and its refinement."""

    name: str
    net: torch.nn.Module
    vocab: Vocabulary
    max_tokens: int
    refine_lambda: float
    refine_threshold: float


def load_registered(name: str, model_uri: str, tracking_uri: str | None = None) -> LoadedRetrieval | None:
    """A logged or registered retrieval model with its packaged refinement; None when the URI
    holds a linking model."""
    from training.evaluate import load_linker

    linker = load_linker(model_uri, tracking_uri)
    if getattr(linker, "family", "link") != "retrieval":
        return None
    return LoadedRetrieval(
        name,
        linker.model,
        linker.vocab,
        int(linker.max_tokens),
        linker.refine_lambda,
        linker.refine_threshold,
    )


def _batches(paths: list, vocab: Vocabulary, max_tokens: int, batch_docs: int = 256):
    from training.data import make_batch
    from training.epoch_batches import validation_batches

    tables = validation_batches([str(p) for p in paths], batch_docs, 0, 1, ("metadata",))
    return [make_batch(t, vocab, max_tokens) for t in tables]


def evaluate_retrieval_split(
    model: LoadedRetrieval,
    data: str | Path,
    split: str = "test",
    pool_size: int | None = None,
    n_pools: int | None = None,
    seed: int = 0,
) -> dict:
    """{"metrics": evaluate_pairs' dict, "per_query": [{doc_id, relations, rank, top5}]}; pools
    of ``pool_size`` candidates averaged over ``n_pools`` (None: TrainConfig's defaults)."""
    from training.config import TrainConfig
    from training.retrieval.objective import evaluate_pairs

    manifest = Manifest.read(data)
    paths = manifest.shard_paths(data, split)
    batches = _batches(paths, model.vocab, model.max_tokens)
    pools = {k: v for k, v in (("pool_size", pool_size), ("n_pools", n_pools)) if v is not None}
    # evaluate_pairs reads only the pool, seed and refinement settings of the config
    cfg = TrainConfig(
        **pools, seed=seed, refine_lambda=model.refine_lambda, refine_threshold=model.refine_threshold
    )
    metrics = evaluate_pairs(model.net, batches, cfg, list(manifest.relations or []))
    if "attributes" in metrics:  # the linear-probe ceiling on the frozen features of this split
        _probe(metrics, data, manifest, batches)
    return {"metrics": metrics, "per_query": per_query(model, batches)}


def training_truth(data, manifest: Manifest) -> tuple[np.ndarray, list[dict]]:
    """(frozen image features [M, D], metadata rows) of the training split: what the linear
    probes are fitted on."""
    from schemas.shards import read_table
    from training.data import features_of

    train = read_table([str(p) for p in manifest.shard_paths(data, "train")], columns=["images", "metadata"])
    metadata = [dict(m or []) for m in train.column("metadata").to_pylist()]
    return np.concatenate(features_of(train)[0]), metadata


def batch_features(batches) -> np.ndarray:
    """[M, D] frozen image features of every pair in ``batches``, in order."""
    return torch.cat([b.features.float().reshape(len(b.doc_ids), -1) for b in batches]).numpy()


def _probe(metrics: dict, data, manifest: Manifest, batches) -> None:
    """Adds each attribute's linear-probe accuracy (fitted on the training split's frozen image
    features) to ``metrics["attributes"]``."""
    from training.retrieval.attributes import add_probe

    train_features, train_meta = training_truth(data, manifest)
    metadata = [m for b in batches for m in b.metadata]
    add_probe(metrics, train_features, train_meta, batch_features(batches), metadata)


def per_query(model: LoadedRetrieval, batches) -> list[dict]:
    """[{doc_id, relations, rank, top5}] of every pair of ``batches``: rank among all of them
    (pessimistic ties) and the top-5 doc ids, by the served ranking."""
    from training.retrieval.objective import encode_pairs

    s, v, _ = encode_pairs(model.net, batches)
    scores = ranking_scores(model.net, s, v, model.refine_lambda, model.refine_threshold).numpy()
    ids = [d for b in batches for d in b.doc_ids]
    relations = [(m or {}).get("relations", "") for b in batches for m in b.metadata]
    true = np.diag(scores)[:, None]
    rank = 1 + (scores > true).sum(1) + (scores == true).sum(1) - 1  # pessimistic ties
    top = np.argsort(-scores, axis=1, kind="stable")[:, :TOP]
    return [
        {"doc_id": d, "relations": r, "rank": int(k), "top5": [ids[j] for j in t]}
        for d, r, k, t in zip(ids, relations, rank, top, strict=True)
    ]


def _figure(uri: str | None, caption: str, true: bool) -> str:
    src = thumbnail(uri) if uri else None
    body = f'<img src="{src}" alt="{html.escape(caption)}">' if src else "<div class=noimg></div>"
    style = ' style="outline:3px solid #2b8a3e"' if true else ""
    return f"<figure{style}>{body}<figcaption>{html.escape(caption)}</figcaption></figure>"


def query_cards(data: str | Path, split: str, results: dict[str, dict], limit: int = 6) -> list[str]:
    """One card per query (the first ``limit`` by doc id): text, true image, each model's top 5."""
    from schemas.shards import read_table

    manifest = Manifest.read(data)
    table = read_table(manifest.shard_paths(data, split), columns=["doc_id", "sentences", "images"])
    text = dict(zip(table.column("doc_id").to_pylist(), table.column("sentences").to_pylist(), strict=True))
    image = {
        d: (ims[0]["uri"] if ims else None)
        for d, ims in zip(table.column("doc_id").to_pylist(), table.column("images").to_pylist(), strict=True)
    }
    first = next(iter(results.values()))["per_query"][:limit]
    by_model = {name: {q["doc_id"]: q for q in r["per_query"]} for name, r in results.items()}
    cards = []
    for q in first:
        doc = q["doc_id"]
        rows = [f"<div class=thumbs><b>true</b>{_figure(image.get(doc), doc, True)}</div>"]
        for name, queries in by_model.items():
            mine = queries[doc]
            figs = "".join(
                _figure(image.get(j), f"{k + 1}. {j}", j == doc) for k, j in enumerate(mine["top5"])
            )
            rows.append(f"<div class=thumbs><b>{html.escape(name)} (rank {mine['rank']})</b>{figs}</div>")
        head = f"{html.escape(text[doc][0])} <small>({html.escape(q['relations'] or 'no relation')})</small>"
        cards.append(f"<section class=card><h3>{head}</h3>{''.join(rows)}</section>")
    return cards


def _metric_rows(name: str, m: dict) -> str:
    def row(label, x):
        return (
            f"<tr><td>{html.escape(label)}</td><td>{x['medr']:.1f}</td><td>{x['r1']:.1f}</td>"
            f"<td>{x['r5']:.1f}</td><td>{x['r10']:.1f}</td></tr>"
        )

    out = [row(f"{name} text->image", m["t2i"]), row(f"{name} image->text", m["i2t"])]
    if "t2i_refined" in m:
        out.append(row(f"{name} text->image refined", m["t2i_refined"]))
    out += [row(f"{name} {rel}", x) for rel, x in (m.get("relations") or {}).items() if x.get("pools")]
    return "".join(out)


def retrieval_report(title: str, data: str | Path, split: str, results: dict[str, dict], meta: dict) -> str:
    """The HTML page: metrics per model (Table 7 rows per relation), relation AP (Table 8) and
    the query cards (Figure 6)."""
    meta_rows = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>" for k, v in meta.items()
    )
    tables = "".join(_metric_rows(name, r["metrics"]) for name, r in results.items())
    ap = "".join(
        f"<tr><td>{html.escape(name)}</td>"
        + "".join(f"<td>{html.escape(rel)} {v:.2f}</td>" for rel, v in r["metrics"]["relation_ap"].items())
        + "</tr>"
        for name, r in results.items()
        if r["metrics"].get("relation_ap")
    )
    pool = next(iter(results.values()))["metrics"]["t2i"].get("pool_size")
    cards = "".join(query_cards(data, split, results))
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{CSS}</style></head><body>
<h1>{html.escape(title)}</h1><table>{meta_rows}</table>
<h2>Retrieval ({html.escape(split)} split, pools of {pool}; MedR lower is better)</h2>
<table><tr><th>model / queries</th><th>MedR</th><th>R@1</th><th>R@5</th><th>R@10</th></tr>{tables}</table>
{f"<h2>Relation prediction: average precision</h2><table>{ap}</table>" if ap else ""}
<h2>Queries: the true image and each model's top {TOP} (true image outlined; rank among the whole split)</h2>
{cards}
</body></html>"""
