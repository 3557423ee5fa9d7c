"""CHAIN (Wehrmann & Barros, CVPR 2018), Liu et al.'s Table 1 line 1.4: a character-level
convolutional text encoder with no word embedding. Pure torch.

Why one inception-like block, not Wehrmann's stack: the baseline's point is that it reads
characters, not word vectors. A text is its words' characters joined by spaces; an unknown word
is one UNK character."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

CHAR_VOCAB = 256  # 0 padding, 1 space, 2 unknown word, 3.. characters (code point mod 253)
SPACE, UNKNOWN = 1, 2
MAX_WORD_CHARS = 20  # characters kept of a word (its trailing space included)
MAX_CHARS = 512  # characters kept of a text
CHAR_DIM = 32
KERNELS = (3, 5, 7)


def char_id(c: str) -> int:
    return 3 + ord(c) % (CHAR_VOCAB - 3)


def char_table(words: list[str]) -> np.ndarray:
    """[V, MAX_WORD_CHARS] character ids of every vocabulary word followed by a space (0 =
    padding); PAD (row 0) has none, UNK (row 1) is the one UNKNOWN character."""
    out = np.zeros((len(words), MAX_WORD_CHARS), dtype=np.int64)
    for i, w in enumerate(words):
        ids = [] if i == 0 else [UNKNOWN] if i == 1 else [char_id(c) for c in w]
        ids = [*ids[: MAX_WORD_CHARS - 1], SPACE] if ids else []
        out[i, : len(ids)] = ids
    return out


def char_sequences(table: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [N, T] (word ids) -> (characters [N, C], mask [N, C]): each row's words' characters
    in order, padding moved to the end (a stable sort on "is padding"), C <= MAX_CHARS; a row
    without any character keeps one (padding) position so the max pool has something to read."""
    chars = table[tokens].flatten(1)  # [N, T * MAX_WORD_CHARS]
    order = torch.sort((chars == 0).to(torch.int8), dim=1, stable=True).indices
    chars = chars.gather(1, order)
    width = int((chars != 0).sum(1).max()) if chars.numel() else 0
    chars = chars[:, : min(MAX_CHARS, max(1, width))]
    mask = chars != 0
    mask[:, 0] = True
    return chars, mask


class CharConvEncoder(nn.Module):
    """Word ids [N, T] -> [N, d]: characters -> embedding [N, C, CHAR_DIM] -> parallel
    convolutions (widths 3/5/7, ``d`` channels each, ReLU) -> concatenation [N, 3d, C] ->
    convolution (width 3, ``d_hidden`` channels, ReLU) -> max over the real characters -> linear."""

    def __init__(self, d: int, d_hidden: int, words: list[str]):
        super().__init__()
        self.register_buffer("char_ids", torch.from_numpy(char_table(words)), persistent=False)
        self.chars = nn.Embedding(CHAR_VOCAB, CHAR_DIM, padding_idx=0)
        self.branches = nn.ModuleList(nn.Conv1d(CHAR_DIM, d, k, padding=k // 2) for k in KERNELS)
        self.mix = nn.Conv1d(len(KERNELS) * d, d_hidden, 3, padding=1)
        self.out = nn.Linear(d_hidden, d)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        chars, mask = char_sequences(self.char_ids, tokens)
        x = self.chars(chars).transpose(1, 2)  # [N, CHAR_DIM, C]
        x = torch.cat([torch.relu(b(x)) for b in self.branches], 1)  # [N, 3d, C]
        # padding positions hold ReLU(bias) after the branches; zeroed, the width-3 mix reads
        # past a row's end what its own zero padding would give, so a row's vector does not
        # depend on the longer rows of its batch
        x = x.masked_fill(~mask[:, None, :], 0.0)
        h = torch.relu(self.mix(x)).transpose(1, 2)  # [N, C, d_hidden]
        return self.out(h.masked_fill(~mask[..., None], float("-inf")).amax(1))
