"""A pair dataset's texts and images (``split_pairs``) and how a retrieval net ranks them
(``ranking_scores``): shared by the test evaluation, its report and the served model."""

from __future__ import annotations

import numpy as np
import torch

from schemas.errors import MmlinksError
from training.data import features_of
from training.retrieval.losses import selective_refinement


@torch.no_grad()
def ranking_scores(
    net, s: torch.Tensor, v: torch.Tensor, lam: float, threshold: float, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """texts [Q, d] x images [N, d] -> [Q, N]: ``net.score`` (the cosine less the query bank's
    image term, ``bias`` [N] when computed before), with the selective refinement of lambda
    ``lam`` and gap ``threshold`` for a model with a CAM (``lam`` 0: unrefined; a news ORDER
    model: its negative order violation)."""
    theta = net.score(s, v) if bias is None else net.score(s, v, bias)
    if lam == 0 or net.cam is None or theta.shape[1] < 2:
        return theta
    return selective_refinement(theta, net.relation_probs(s, v), lam, threshold)[0]


def split_pairs(paths: list) -> tuple[list[str], list[str], np.ndarray]:
    """(doc ids, texts, image features [M, D]) of a pair dataset's shards, by doc id; refuses
    documents that are not one sentence and one image."""
    from schemas.shards import read_table

    table = read_table(paths, columns=["doc_id", "sentences", "images"]).sort_by("doc_id")
    sentences = table.column("sentences").to_pylist()
    feats, n_img = features_of(table)
    bad = sum(1 for s, m in zip(sentences, n_img, strict=True) if len(s) != 1 or m != 1)
    if bad:
        raise MmlinksError(
            f"retrieval models are evaluated on pair datasets (one sentence and one image per "
            f"document); {bad} document(s) are not pairs"
        )
    features = np.concatenate(feats) if feats else np.zeros((0, 0), np.float32)
    return table.column("doc_id").to_pylist(), [s[0] for s in sentences], features
