"""The objective registry: ``--objective`` names a loss over a batch of encoded documents.

Every objective sees the same padded [B, n, d] sentence and [B, m, d] image tensors:
- ``dc``, ``tk``, ``ap``: the cross-document in-batch hinge on sim(S_a, V_b) (Hessel 2019).
- ``nostruct``: the same loss with DC on 1 x 1 documents; the batch was reduced to one random
  sentence and one random image per document before encoding (``training/data.py``).
- ``li2021``: cross (TK, k = min) plus the intra-document and dropout sub-document terms that
  ``--objectives`` selects (Li et al. 2021, ``training/objectives/li2021.py``).
"""

from __future__ import annotations

import torch

from training.config import TrainConfig
from training.data import DocBatch, pad_documents
from training.objectives.loss import in_batch_loss
from training.objectives.similarity import document_similarity


def padded(model, batch: DocBatch):
    s, v = model(batch)  # through forward: under DDP that is what syncs the gradients
    s_pad, s_mask = pad_documents(s, batch.n_sentences)
    v_pad, v_mask = pad_documents(v, batch.n_images)
    return s_pad, s_mask, v_pad, v_mask


def objective_loss(
    model, batch: DocBatch, cfg: TrainConfig, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """(loss, its named parts) for ``cfg.objective``; ``generator`` drives the random
    sub-documents of li2021 (a fixed one on validation batches keeps that loss comparable)."""
    s_pad, s_mask, v_pad, v_mask = padded(model, batch)
    if cfg.objective == "li2021":
        from training.objectives.li2021 import li2021_loss

        return li2021_loss(
            s_pad,
            s_mask,
            v_pad,
            v_mask,
            parts=cfg.parts,
            margin=cfg.margin,
            negatives=cfg.negatives,
            sub_fraction=cfg.sub_fraction,
            generator=generator,
        )
    sims = document_similarity(cfg.similarity, s_pad, s_mask, v_pad, v_mask, cfg.k)
    loss = in_batch_loss(sims, cfg.margin, cfg.negatives)
    return loss, {"C": float(loss.detach())}
