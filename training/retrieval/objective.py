"""The retrieval objectives in the training stack: what ``--objective cmca|cmcm|cmcm-c`` plugs
into the registries, the loop and the experiment.

Data: pair datasets (docs/design.md); validation: text-to-image MedR and R@K over pools, as the
test's, so ``val_medr`` picks the paper's best epoch. What the test reports: docs/evaluation.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from schemas.errors import MmlinksError
from schemas.manifest import pair_relations
from training.ranking import relation_average_precision, retrieval_metrics
from training.retrieval.attributes import attribute_metrics
from training.retrieval.losses import cmcm_loss, selective_refinement
from training.retrieval.model import CoherenceRetrieval, RetrievalConfig

if TYPE_CHECKING:  # pragma: no cover
    from training.config import TrainConfig


def cam_relations(cfg: TrainConfig, vocabulary: list[str] | None) -> list[str]:
    """What the CAM predicts: nothing (cmca), the dataset's relations (cmcm), ``--relation``
    (cmcm-c, which must be one of them): ``ObjectiveSpec.cam`` and ``per_relation``."""
    spec = cfg.objective_spec
    if not spec.cam:
        return []
    if not vocabulary:
        raise MmlinksError(
            f"--objective {cfg.objective} needs a coherence-labelled pair dataset (a manifest with "
            f"'relations'); {cfg.data} has none (build one from `mmlinks data synth-coherence`)"
        )
    if spec.per_relation:
        if cfg.relation not in vocabulary:
            raise MmlinksError(
                f"--relation {cfg.relation!r} is not a relation of {cfg.data}: one of {', '.join(vocabulary)}"
            )
        return [cfg.relation]
    return list(vocabulary)


def pair_table_labels(table, vocabulary: list[str], relations: list[str]) -> np.ndarray:
    """[rows, len(relations)] 0/1 labels of a pair table; refuses documents that are not pairs
    and relation names outside ``vocabulary``."""
    import pyarrow.compute as pc

    n_s = pc.list_value_length(table.column("sentences")).to_numpy(zero_copy_only=False)
    n_i = pc.list_value_length(table.column("images")).to_numpy(zero_copy_only=False)
    if ((n_s != 1) | (n_i != 1)).any():
        raise MmlinksError(
            "the retrieval objectives train on pair datasets (one sentence and one image per document); "
            f"{int(((n_s != 1) | (n_i != 1)).sum())} document(s) are not pairs"
        )
    cols = [vocabulary.index(r) for r in relations]
    full = [
        pair_relations(dict(m or []).get("relations"), vocabulary)
        for m in table.column("metadata").to_pylist()
    ]
    return np.asarray(full, dtype=np.int64).reshape(len(full), len(vocabulary))[:, cols]


def model_config(cfg: TrainConfig, manifest, vocab_size: int, word_dim: int, train_paths: list[str]) -> dict:
    """The backbone registry's config builder for the ``coherence`` backbone."""
    from schemas.shards import read_table
    from training.retrieval.losses import relation_weights

    vocabulary = manifest.relations
    relations = cam_relations(cfg, vocabulary)
    table = read_table(train_paths, columns=["sentences", "images", "metadata"])
    labels = pair_table_labels(table, list(vocabulary or []), relations)
    weights = relation_weights(labels).tolist() if relations else []
    return RetrievalConfig(
        vocab_size=vocab_size,
        word_dim=word_dim,
        image_dim=manifest.feature_extractor.dim,
        hidden=cfg.d_shared,
        d_shared=cfg.d_shared,
        pooling=cfg.retrieval_pooling,
        relations=tuple(relations),
        relation_weights=tuple(weights),
        image_dropout=cfg.image_dropout,
        cam_hidden=cfg.cam_hidden if relations else 0,
        cam_gradient=cfg.cam_gradient,
        image_layers=cfg.image_layers,
        query_bank=cfg.query_bank,
        bank_temperature=cfg.query_bank_temperature,
    ).to_dict()


def build(model_cfg: dict, embeddings=None, feature_stats=None) -> CoherenceRetrieval:
    return CoherenceRetrieval(RetrievalConfig(**model_cfg), embeddings, feature_stats)


def _net(model) -> CoherenceRetrieval:
    return getattr(model, "module", model)  # DDP wraps the module


def batch_labels(batch, relations) -> torch.Tensor:
    """[B, C] from the batch's per-document metadata."""
    rows = []
    for meta in batch.metadata:
        names = set((meta or {}).get("relations", "").split(","))
        rows.append([float(r in names) for r in relations])
    return torch.tensor(rows, dtype=torch.float32).reshape(len(rows), len(relations))


def negatives_at(cfg: TrainConfig, epoch: int | None) -> str:
    """ "mean" during the hard-negative warm-up epochs, else ``cfg.negatives`` (None: after it)."""
    if epoch is not None and epoch < cfg.hard_negative_warmup:
        return "mean"
    return cfg.negatives


def model_loss(
    model, batch, cfg: TrainConfig, generator=None, epoch: int | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """Eq. 3 on a batch of B pairs (through the model's forward, so DDP syncs the CAM too);
    ``epoch`` decides the warm-up (None: validation, after it)."""
    net = _net(model)
    s, v, logits = model(batch)
    negatives = negatives_at(cfg, epoch)
    if logits is None:
        return cmcm_loss(s, v, None, None, None, cfg.retrieval_margin, negatives=negatives)
    labels = batch_labels(batch, net.cfg.relations).to(logits.device)
    return cmcm_loss(
        s, v, logits, labels, net.relation_weights, cfg.retrieval_margin, cfg.lambda_cls, negatives
    )


@torch.no_grad()
def encode_pairs(net: CoherenceRetrieval, batches) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(texts [M, d], images [M, d], CAM labels [M, C]) of every pair in ``batches``."""
    ss, vs, ys = [], [], []
    for b in batches:
        s, v = net.encode(b)
        ss.append(s.float().cpu())
        vs.append(v.float().cpu())
        ys.append(batch_labels(b, net.cfg.relations))
    return torch.cat(ss), torch.cat(vs), torch.cat(ys)


def val_metrics(model, batches, cfg: TrainConfig) -> dict[str, float]:
    """val_medr and val_r10 (text-to-image, unrefined) over every validation pair."""
    net = _net(model)
    s, v, _ = encode_pairs(net, batches)
    if len(s) < 2:
        return {"val_medr": float("nan"), "val_r10": float("nan")}
    out = retrieval_metrics(
        net.score(s, v).numpy(), pool_size=cfg.pool_size, n_pools=cfg.n_pools, seed=cfg.seed
    )
    return {"val_medr": out["t2i"]["medr"], "val_r10": out["t2i"]["r10"]}


REFINE_LAMBDAS = (0.0, 0.05, 0.12, 0.13, 0.25, 0.5, 1.0)
REFINE_THRESHOLDS = (0.05, 0.1, 0.2, 0.3)


def _refined_scorer(net: CoherenceRetrieval, s, v, theta, lam: float, threshold: float):
    def score(idx: np.ndarray) -> np.ndarray:
        t = torch.as_tensor(idx)
        probs = net.relation_probs(s[t], v[t])
        return selective_refinement(theta[t][:, t], probs, lam, threshold)[0].numpy()

    return score


@torch.no_grad()
def tune_refinement(net: CoherenceRetrieval, batches, cfg: TrainConfig) -> dict | None:
    """lambda and T of the selective refinement chosen on ``batches`` (validation): the lowest
    text-to-image MedR, then the highest R@1, over REFINE_LAMBDAS x REFINE_THRESHOLDS (lambda 0
    leaves every ranking as it is). None for CMCA."""
    if net.cam is None:
        return None
    net.eval()
    s, v, _ = encode_pairs(net, batches)
    theta = net.score(s, v)
    common = {"pool_size": cfg.pool_size, "n_pools": cfg.n_pools, "seed": cfg.seed}
    grid = []
    for lam in REFINE_LAMBDAS:
        for threshold in REFINE_THRESHOLDS:
            m = retrieval_metrics(
                n=len(s), score_pool=_refined_scorer(net, s, v, theta, lam, threshold), **common
            )
            grid.append(
                {
                    "refine_lambda": lam,
                    "refine_threshold": threshold,
                    "medr": m["t2i"]["medr"],
                    "r1": m["t2i"]["r1"],
                }
            )
    best = min(grid, key=lambda g: (g["medr"], -g["r1"], g["refine_lambda"]))
    return {**best, "grid": grid}


def evaluate_pairs(
    net: CoherenceRetrieval, batches, cfg: TrainConfig, vocabulary: list[str], tuned: dict | None = None
) -> dict:
    """Test metrics: t2i/i2t MedR and R@K, refined t2i (CMCM), per relation subset (labels of the
    dataset's whole vocabulary), relation AP of the CAM on the true pairs."""
    net.eval()
    s, v, y = encode_pairs(net, batches)
    theta = net.score(s, v)  # the cosine; ORDER's negative order violation for a news ORDER model
    full = np.asarray(
        [pair_relations((b or {}).get("relations"), vocabulary) for bt in batches for b in bt.metadata]
    ).reshape(len(s), len(vocabulary))
    common = {"pool_size": cfg.pool_size, "n_pools": cfg.n_pools, "seed": cfg.seed}
    out = retrieval_metrics(theta.numpy(), labels=full, relation_names=vocabulary, **common)
    out["pairs"] = len(s)
    # graded-salience pairs: the top-5 match per named attribute (unrefined ranking) and the oracle
    found = attribute_metrics(theta.numpy(), [m for bt in batches for m in bt.metadata], **common)
    if found is not None:
        out.update(found)
    if net.cam is not None:
        refined = _refined_scorer(net, s, v, theta, cfg.refine_lambda, cfg.refine_threshold)
        out["t2i_refined"] = retrieval_metrics(n=len(s), score_pool=refined, **common)["t2i"]
        if tuned is not None:  # lambda and T chosen on validation (``tune_refinement``)
            lam, threshold = tuned["refine_lambda"], tuned["refine_threshold"]
            scorer = _refined_scorer(net, s, v, theta, lam, threshold)
            out["t2i_refined_tuned"] = {
                **retrieval_metrics(n=len(s), score_pool=scorer, **common)["t2i"],
                "refine_lambda": lam,
                "refine_threshold": threshold,
            }
        with torch.no_grad():
            true_probs = torch.sigmoid(net.cam(s, v)).numpy()
        out["relation_ap"] = relation_average_precision(true_probs, y.numpy(), list(net.cfg.relations))
    return out
