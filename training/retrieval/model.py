"""CMCA and CMCM (Alikhani et al.): text and image encoders into a shared cosine space, plus
CMCM's Coherence Aware Module (CAM). Pure torch.

Text: word embeddings -> BiLSTM -> word attention (``pooling`` mean/last: NoAttn; bag: no LSTM,
the floor) -> linear -> L2; image: standardised CNN feature -> linear -> L2. Why ``pair_logits``
needs no [Q, N, 2d] concatenation: a layer on concat(text, image) is a sum of one term per side."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from training.joint_space import BottleneckImageEncoder
from training.retrieval.config import POOLINGS  # torch-free there: the CLI's choices read it


@dataclass
class RetrievalConfig:
    vocab_size: int
    word_dim: int = 300
    image_dim: int = 1280
    hidden: int = 256  # LSTM units per direction
    d_shared: int = 300  # the shared space (paper: 300 in its method section)
    pooling: str = "attention"  # one of POOLINGS; mean/last = NoAttn
    relations: tuple[str, ...] = ()  # what the CAM predicts; () = CMCA (no CAM)
    # w_c of the coherence loss (1 / positive rate in the training set), one per relation
    relation_weights: tuple[float, ...] = ()
    cam_hidden: int = 0  # 0 = one linear layer (paper)
    cam_gradient: str = "shared"  # "stopped": the CAM reads detached embeddings (issue #45)
    image_layers: int = 0  # ReLU hidden layers of the image encoder before its projection (0: paper)
    image_dropout: float = 0.0
    # training captions kept to normalise image scores (training/retrieval/query_bank.py; 0: off)
    query_bank: int = 0
    bank_temperature: float = 0.1
    backbone: str = "coherence"  # the backbone registry name (training/backbone.py)

    def __post_init__(self) -> None:
        self.relations = tuple(self.relations)
        self.relation_weights = tuple(float(w) for w in self.relation_weights) or (1.0,) * len(self.relations)
        if len(self.relation_weights) != len(self.relations):
            raise ValueError("one relation weight per relation is needed")

    @property
    def n_relations(self) -> int:
        return len(self.relations)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["relations"], out["relation_weights"] = list(self.relations), list(self.relation_weights)
        return out


class AttnTextEncoder(nn.Module):
    def __init__(self, cfg: RetrievalConfig, embeddings: np.ndarray | None = None):
        super().__init__()
        if cfg.pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {cfg.pooling!r}; known: {', '.join(POOLINGS)}")
        self.pooling = cfg.pooling
        self.embed = nn.Embedding(cfg.vocab_size, cfg.word_dim, padding_idx=0)
        if embeddings is not None:
            self.embed.weight.data.copy_(torch.from_numpy(np.asarray(embeddings, dtype=np.float32)))
        if self.pooling == "bag":  # no recurrent layer: the embeddings' mean goes to the projection
            self.lstm = self.attn = None
            self.proj = nn.Linear(cfg.word_dim, cfg.d_shared)
            return
        self.lstm = nn.LSTM(cfg.word_dim, cfg.hidden, batch_first=True, bidirectional=True)
        self.attn = nn.Linear(2 * cfg.hidden, 1)  # the word score: a learned query . h_t
        self.proj = nn.Linear(2 * cfg.hidden, cfg.d_shared)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor, return_attention: bool = False):
        """tokens [N, T] (0-padded), lengths [N] -> unit vectors [N, d_shared]
        (and the attention weights [N, T] when asked; uniform over the tokens for mean)."""
        T = tokens.shape[1]
        lengths = lengths.clamp(min=1)
        mask = torch.arange(T, device=tokens.device)[None, :] < lengths[:, None]  # [N, T]
        if self.pooling == "bag":
            alpha = mask.float() / mask.sum(1, keepdim=True)  # [N, T]
            z = F.normalize(self.proj((alpha[..., None] * self.embed(tokens)).sum(1)), dim=-1)
            return (z, alpha) if return_attention else z
        packed = pack_padded_sequence(
            self.embed(tokens), lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        states, (h, _) = self.lstm(packed)
        out, _ = pad_packed_sequence(states, batch_first=True, total_length=T)  # [N, T, 2h]
        if self.pooling == "attention":
            scores = self.attn(out).squeeze(-1).masked_fill(~mask, float("-inf"))  # [N, T]
            alpha = scores.softmax(-1)
        elif self.pooling == "mean":
            alpha = mask.float() / mask.sum(1, keepdim=True)
        else:  # last: the forward direction's final state and the backward one's first
            alpha = None
        pooled = torch.cat([h[-2], h[-1]], -1) if alpha is None else (alpha[..., None] * out).sum(1)
        z = F.normalize(self.proj(pooled), dim=-1)
        return (z, alpha) if return_attention else z


class DeepImageEncoder(BottleneckImageEncoder):
    """The bottleneck with ``image_layers`` ReLU layers (width d_shared) before the projection
    into the shared space: a linear projection can only weigh each feature direction once,
    which a small object's shape, spread thinly over many directions, may need more than."""

    def __init__(self, cfg: RetrievalConfig):
        super().__init__(cfg)
        layers: list[nn.Module] = []
        width = cfg.image_dim
        for _ in range(cfg.image_layers):
            layers += [nn.Linear(width, cfg.d_shared), nn.ReLU()]
            width = cfg.d_shared
        self.hidden = nn.Sequential(*layers)
        self.proj = nn.Linear(width, cfg.d_shared)

    def forward(self, feats: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        x = (feats - self.feature_mean) / self.feature_std
        return F.normalize(self.proj(self.hidden(self.dropout(x))), dim=-1)


class CoherenceAwareModule(nn.Module):
    """concat(text [.., d], image [.., d]) -> relation logits [.., C]."""

    def __init__(self, d: int, n_relations: int, hidden: int = 0):
        super().__init__()
        width = hidden or n_relations
        self.text_part = nn.Linear(d, width)
        self.image_part = nn.Linear(d, width, bias=False)
        self.out = nn.Linear(hidden, n_relations) if hidden else None

    def _finish(self, z: torch.Tensor) -> torch.Tensor:
        return z if self.out is None else self.out(torch.relu(z))

    def forward(self, t: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Matched pairs: t, v [B, d] -> logits [B, C]."""
        return self._finish(self.text_part(t) + self.image_part(v))

    def pair_logits(self, t: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Every pair: t [Q, d], v [N, d] -> logits [Q, N, C]."""
        return self._finish(self.text_part(t)[:, None, :] + self.image_part(v)[None, :, :])


class CoherenceRetrieval(nn.Module):
    """CMCA (``n_relations`` 0) or CMCM / CMCM_c (a CAM over ``n_relations`` outputs)."""

    def __init__(
        self,
        cfg: RetrievalConfig,
        embeddings: np.ndarray | None = None,
        feature_stats: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        super().__init__()
        self.cfg = cfg
        self.text = AttnTextEncoder(cfg, embeddings)
        self.image = BottleneckImageEncoder(cfg) if not cfg.image_layers else DeepImageEncoder(cfg)
        if feature_stats is not None:
            self.image.set_feature_stats(*feature_stats)
        self.cam = (
            CoherenceAwareModule(cfg.d_shared, cfg.n_relations, cfg.cam_hidden) if cfg.n_relations else None
        )
        # w_c of the coherence loss: a buffer, so it travels with the checkpoint
        self.register_buffer("relation_weights", torch.tensor(cfg.relation_weights, dtype=torch.float32))
        # [Q, d] embeddings of training captions, filled after training (``set_query_bank``);
        # empty = rank by the plain cosine
        self.register_buffer("query_bank", torch.zeros(0, cfg.d_shared))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "query_bank"
        here = self.query_bank
        if key in state_dict:  # the bank's size is the checkpoint's, not the config's
            if state_dict[key].shape != here.shape:
                self.query_bank = torch.empty(state_dict[key].shape, device=here.device, dtype=here.dtype)
        else:  # a checkpoint from before the bank: the plain cosine
            self.query_bank = here.new_zeros(0, here.shape[1])
            state_dict[key] = self.query_bank
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def set_query_bank(self, texts: torch.Tensor) -> None:
        """Keep ``texts`` [Q, d] (unit caption embeddings) as the bank ``score`` normalises by."""
        self.query_bank = texts.detach().to(self.query_bank.device, torch.float32).clone()

    def forward(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """A batch of pairs (``DocBatch`` of one-sentence, one-image documents) -> (text [B, d],
        image [B, d], CAM logits of the matched pairs [B, C] or None). The CAM runs inside
        forward so DDP syncs its gradients too."""
        s, v = self.text(batch.tokens, batch.lengths), self.image(batch.features)
        if self.cam is None:
            return s, v, None
        if self.cfg.cam_gradient == "stopped":  # the relation loss trains the CAM alone
            return s, v, self.cam(s.detach(), v.detach())
        return s, v, self.cam(s, v)

    def encode(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        s, v, _ = self(batch)
        return s, v

    def score(self, s: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """texts [Q, d] x images [N, d] -> [Q, N]: the cosine minus each image's ``image_bias``
        (``bias`` [N]: computed before, e.g. for a served gallery) (the unrefined ranking score;
        the news model's ``score`` is ORDER's order violation where it trains one)."""
        return s @ v.T - (self.image_bias(v) if bias is None else bias)[None, :]

    def image_bias(self, v: torch.Tensor) -> torch.Tensor:
        """images [N, d] -> [N]: the soft maximum of each image's cosines to the query bank,
        t * log(mean_q exp(cos(q, v) / t)) at temperature t = ``bank_temperature`` (zeros
        with an empty bank). Subtracted from every text's cosine, it is querybank
        normalisation's inverted softmax (training/retrieval/query_bank.py)."""
        if not len(self.query_bank):
            return v.new_zeros(len(v))
        t = self.cfg.bank_temperature
        logits = (self.query_bank.to(v) @ v.T) / t  # [Q, N]
        return t * (torch.logsumexp(logits, dim=0) - math.log(len(self.query_bank)))

    @torch.no_grad()
    def relation_probs(self, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
        """The CAM's probabilities for every pair: s [Q, d], v [N, d] -> [Q, N, C] (None: CMCA)."""
        return None if self.cam is None else torch.sigmoid(self.cam.pair_logits(s, v))
