"""The news image selection model of Liu et al. ("Upgrading the Newsroom", Sect. 4.3 and 5.1).
Pure torch; its parts and fusers: docs/retrieval-news.md.

Why the model tokenises its own text (the vocabulary and token limits live in its config): a
served model encodes exactly as training did. ``NewsRetrieval.score`` is the one place a text x
image score is computed (loss, validation, test, serving)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from schemas.news import NEWS_SOURCES, sources_of
from schemas.text import first_tokens
from training.joint_space import BottleneckConfig, BottleneckImageEncoder
from training.news import ENCODERS, FUSERS, SCORES, SUBWORD_POOLINGS
from training.news.chain import CharConvEncoder
from training.news.losses import order_scores

NGRAM_MIN, NGRAM_MAX = 3, 5  # Liu et al. Sect. 4.3.1 (fastText's default 3-6 reads 3-5 there)
FNV_OFFSET, FNV_PRIME = 2166136261, 16777619
NO_LIMIT = 1_000_000  # tokens kept of a source without a limit in the config
PAD_ID, UNK_ID = 0, 1  # training/text.py's PAD and UNK (the vocabulary's first two entries)


def ngram_buckets(words: list[str], buckets: int, nmin: int = NGRAM_MIN, nmax: int = NGRAM_MAX) -> np.ndarray:
    """[W, G] bucket + 1 of every character n-gram of each ``<word>`` (fastText's subwords: the
    n-grams of ``<word>``, n in [nmin, nmax], by n then start; 0 = padding; G = the most n-grams
    of any word): ``1 + FNV-1a-32(n-gram's code points) % buckets``, fastText's n-gram hash (which
    runs over UTF-8 bytes: the same number for ASCII); the test's word-by-word loop is its oracle.

    Vectorised (issue #36): the words become one [W, L] array of code points, and each n-gram
    position's FNV-1a is n array operations over all W words at once, so the cost is ~3 L (n, i)
    positions of numpy work instead of a Python loop over every byte of every n-gram
    (``benchmarks/news_subwords.py``, retired in issue #61 at cb91417: tokens/s before and after)."""
    W = len(words)
    if W == 0:
        return np.zeros((0, 1), dtype=np.int64)
    marked = [f"<{w}>" for w in words]
    lens = np.fromiter((len(m) for m in marked), dtype=np.int64, count=W)
    L = int(lens.max())
    flat = np.frombuffer("".join(marked).encode("utf-32-le"), dtype=np.uint32)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    cols = np.arange(L)
    inside = cols[None, :] < lens[:, None]  # [W, L]
    cps = np.zeros((W, L), dtype=np.uint32)
    cps[inside] = flat[(starts[:, None] + cols[None, :])[inside]]
    prime = np.uint32(FNV_PRIME)
    out = []
    for n in range(nmin, nmax + 1):
        if n > L:
            break
        h = np.full((W, L - n + 1), FNV_OFFSET, dtype=np.uint32)
        for k in range(n):  # every start position of every word at once; uint32 wraps mod 2**32
            h = (h ^ cps[:, k : k + L - n + 1]) * prime
        ids = (h % np.uint32(buckets)).astype(np.int64) + 1
        ids[np.arange(L - n + 1)[None, :] + n > lens[:, None]] = 0  # past the word's end
        out.append(ids)
    if not out:  # every word shorter than nmin with its marks
        return np.zeros((W, 1), dtype=np.int64)
    ids = np.concatenate(out, axis=1)  # [W, sum_n (L - n + 1)], padding scattered
    # move each word's n-grams to the front (a stable sort on "is padding" keeps their order)
    order = np.argsort(ids == 0, axis=1, kind="stable")
    ids = np.take_along_axis(ids, order, axis=1)
    width = max(1, int((ids > 0).sum(1).max()))
    return ids[:, :width]


@dataclass
class NewsConfig:
    vocab_size: int
    word_dim: int = 300
    image_dim: int = 1280
    d: int = 300  # the shared space (paper: 1024)
    d_hidden: int = 600  # point-wise CNN width (paper: 2048)
    heads: int = 2  # paper: 6
    sources: tuple[str, ...] = ("headline", "lead", "body", "caption")
    fusion: str = "attention"
    subword_buckets: int = 0  # 0: words only
    # SUBWORD_POOLINGS; "sum-sqrt" for configs from before the field (what they were trained with)
    subword_pooling: str = "sum-sqrt"
    # the training vocabulary (index -> word): the model tokenises its own text with it, so a
    # served model encodes exactly as in training, n-grams of unseen words included; empty in
    # checkpoints from before issue #34 (the batch's token ids are used then)
    words: list[str] = field(default_factory=list)
    max_tokens: dict[str, int] = field(default_factory=dict)  # per source; {} = the batch's tokens
    truncated: dict[str, list[int]] = field(default_factory=dict)  # training: {source: [cut, total]}
    image_dropout: float = 0.0
    backbone: str = "news"  # the backbone registry name (training/backbone.py)
    encoder: str = "attention"  # ENCODERS: attention (the paper's) or chain (characters)
    score: str = "cosine"  # SCORES: cosine, or order (ORDER's non-negative order embeddings)

    def __post_init__(self) -> None:
        self.sources = tuple(self.sources)
        if self.fusion not in FUSERS:
            raise ValueError(f"unknown fusion {self.fusion!r}; known: {', '.join(FUSERS)}")
        if self.encoder not in ENCODERS:
            raise ValueError(f"unknown text encoder {self.encoder!r}; known: {', '.join(ENCODERS)}")
        if self.subword_pooling not in SUBWORD_POOLINGS:
            raise ValueError(
                f"unknown subword pooling {self.subword_pooling!r}; known: {', '.join(SUBWORD_POOLINGS)}"
            )
        if self.score not in SCORES:
            raise ValueError(f"unknown score {self.score!r}; known: {', '.join(SCORES)}")
        if self.word_dim % self.heads:
            raise ValueError(f"word_dim {self.word_dim} is not divisible by heads {self.heads}")
        if (self.subword_buckets or self.encoder == "chain") and len(self.words) != self.vocab_size:
            raise ValueError("subword n-grams and CHAIN need the vocabulary's words in the model config")
        if self.words and len(self.words) != self.vocab_size:
            raise ValueError(f"{len(self.words)} vocabulary words for vocab_size {self.vocab_size}")
        unknown = set(self.max_tokens) - set(NEWS_SOURCES)
        if unknown or any(int(v) < 1 for v in self.max_tokens.values()):
            raise ValueError(f"max_tokens {self.max_tokens}: sources of {NEWS_SOURCES}, >= 1 token each")

    @property
    def relations(self) -> tuple[str, ...]:
        """No coherence relations: the retrieval family's evaluation reads this (CMCA has none)."""
        return ()

    def to_dict(self) -> dict:
        out = asdict(self)
        out["sources"] = list(self.sources)
        return out


class WordEmbedding(nn.Module):
    """tokens [N, T] (+ n-gram buckets [N, T, G], 0 = padding) -> [N, T, w].

    With subwords (Liu et al. Sect. 4.3.1, fastText): a vocabulary word pools its word vector
    and its n-gram vectors; an unknown word (``<unk>``) its n-gram vectors alone, so a misspelt
    or inflected name lands near the trained name it shares n-grams with instead of on the one
    ``<unk>`` vector. Without n-grams: the word vector.

    ``cfg.subword_pooling``: "sum-sqrt" (the default) = the sum / sqrt(count), i.e. the mean
    scaled by sqrt(count); "mean" = the plain mean (the paper's). The paper averages pre-trained
    fastText vectors, whose mean keeps a word vector's size; ours start random, and the mean of
    ~25 independent random vectors is ~5x shorter than one, which costs the fused model R@10 on
    seen and on unseen name forms, both ways (docs/benchmarks.md, issues #34 and #46). The
    scale does not change the mix: each vector still weighs 1/count of the direction, and a long
    word does not outweigh a short one by its n-gram count as a plain sum would."""

    def __init__(self, cfg: NewsConfig, embeddings: np.ndarray | None = None):
        super().__init__()
        self.words = nn.Embedding(cfg.vocab_size, cfg.word_dim, padding_idx=0)
        if embeddings is not None:
            self.words.weight.data.copy_(torch.from_numpy(np.asarray(embeddings, dtype=np.float32)))
        self.ngrams = None
        self.pooling = cfg.subword_pooling
        if cfg.subword_buckets:
            self.ngrams = nn.Embedding(cfg.subword_buckets + 1, cfg.word_dim, padding_idx=0)
            nn.init.uniform_(self.ngrams.weight, -0.2, 0.2)  # the random word vectors' range
            with torch.no_grad():
                self.ngrams.weight[0].zero_()

    def forward(self, tokens: torch.Tensor, ngrams: torch.Tensor | None = None) -> torch.Tensor:
        e = self.words(tokens)
        if self.ngrams is None or ngrams is None:
            return e
        own = (tokens > UNK_ID).unsqueeze(-1).to(e.dtype)  # [N, T, 1]: a vocabulary word's own vector
        count = own + (ngrams > 0).sum(-1, keepdim=True).to(e.dtype)  # [N, T, 1]
        total = e * own + self.ngrams(ngrams).sum(-2)  # [N, T, G, w] -> [N, T, w]
        count = count.clamp(min=1.0)
        return total / (count if self.pooling == "mean" else count.sqrt())  # see the class doc


class SourceEncoder(nn.Module):
    """Word embeddings [N, T, w] + mask [N, T] -> [N, d]: self-attention (+ residual) ->
    point-wise CNN -> max over the real words."""

    def __init__(self, cfg: NewsConfig):
        super().__init__()
        self.attn = nn.MultiheadAttention(cfg.word_dim, cfg.heads, batch_first=True)
        self.ffn = nn.Sequential(
            nn.Linear(cfg.word_dim, cfg.d_hidden), nn.ReLU(), nn.Linear(cfg.d_hidden, cfg.d)
        )  # kernel-1 convolutions are position-wise linear layers

    def forward(self, e: torch.Tensor, mask: torch.Tensor, return_attention: bool = False):
        a, maps = self.attn(e, e, e, key_padding_mask=~mask, need_weights=return_attention)
        h = self.ffn(e + a).masked_fill(~mask[..., None], float("-inf"))  # [N, T, d]
        out = h.amax(1)
        return (out, maps) if return_attention else out

    def encode_one(self, e: torch.Tensor) -> torch.Tensor:
        """One unpadded sentence's embeddings [1, T, w] -> [1, d], in eval mode without autograd:
        ``forward`` with every position real, minus its Python (``nn.MultiheadAttention``'s
        checks and mask conversion, the masking around the point-wise CNN: part of what
        ``encode_article`` saves a served article, docs/benchmarks.md issue #18); this calls the
        attention kernel its fast path calls, with the float key-padding mask an all-True mask
        becomes, so the result is bit-identical to ``forward`` (tested). Odd head counts (no fast
        path), training or autograd: ``forward`` itself."""
        at = self.attn
        if self.training or torch.is_grad_enabled() or at.num_heads % 2 or at.in_proj_bias is None:
            return self(e, torch.ones(e.shape[:2], dtype=torch.bool, device=e.device))
        no_pad = e.new_zeros(1, e.shape[1])  # forward's ~mask as _canonical_mask makes it
        args = (at.embed_dim, at.num_heads, at.in_proj_weight, at.in_proj_bias, at.out_proj.weight)
        a = torch._native_multi_head_attention(e, e, e, *args, at.out_proj.bias, no_pad, False, True, 1)[0]
        return self.ffn(e + a).amax(1)


class Fuser(nn.Module):
    """Source vectors x [B, S, d] and presence mask [B, S] (at least one True per row) -> [B, d]."""

    def __init__(self, kind: str, n_sources: int, d: int):
        super().__init__()
        self.kind = kind
        if kind == "mlp":
            self.net = nn.Sequential(nn.Linear(n_sources * d, d), nn.ReLU(), nn.Linear(d, d), nn.ReLU())
        elif kind == "attention":
            self.attn = nn.MultiheadAttention(d, 1, batch_first=True)
            self.net = nn.Sequential(
                nn.Linear(n_sources * d, n_sources * d), nn.ReLU(), nn.Linear(n_sources * d, d)
            )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x.masked_fill(~mask[..., None], 0.0)
        if self.kind == "max":
            return x.masked_fill(~mask[..., None], float("-inf")).amax(1)
        if self.kind == "add":
            return x.sum(1)
        if self.kind == "attention":
            x, _ = self.attn(x, x, x, key_padding_mask=~mask, need_weights=False)
            x = x.masked_fill(~mask[..., None], 0.0)
        return self.net(x.flatten(1))


class OrderImageEncoder(BottleneckImageEncoder):
    """The bottleneck image tower with non-negative outputs (ORDER): features [N, D] -> [N, d]
    unit vectors, absolute values. The same parameters (and state-dict names) as the cosine one,
    so every caller of ``net.image`` (archive index, evaluation) gets the order embedding."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).abs()


class NewsRetrieval(nn.Module):
    """Articles (a ``DocBatch`` of news samples: each row's sentences are its present sources,
    named by ``slots``) x images -> unit vectors in one space (non-negative for ORDER)."""

    cam = None  # no Coherence Aware Module: the retrieval family's test evaluation checks this

    def __init__(
        self,
        cfg: NewsConfig,
        embeddings: np.ndarray | None = None,
        feature_stats: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        super().__init__()
        self.cfg = cfg
        chain = cfg.encoder == "chain"  # no word embedding at all (DDP: no unused parameters)
        self.embed = None if chain else WordEmbedding(cfg, embeddings)
        self.encoders = nn.ModuleDict(
            {
                s: CharConvEncoder(cfg.d, cfg.d_hidden, cfg.words) if chain else SourceEncoder(cfg)
                for s in cfg.sources
            }
        )
        self.fuser = Fuser(cfg.fusion, len(cfg.sources), cfg.d)
        image_cfg = BottleneckConfig(image_dim=cfg.image_dim, d_shared=cfg.d, image_dropout=cfg.image_dropout)
        self.image = (OrderImageEncoder if cfg.score == "order" else BottleneckImageEncoder)(image_cfg)
        if feature_stats is not None:
            self.image.set_feature_stats(*feature_stats)
        self._index: dict[str, int] | None = None  # word -> id, built on first use

    def tokenize(
        self, texts: list[str], sources: list[str]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Sentences and the source each one is (a name this model does not read: 1 token, it is
        dropped anyway) -> (tokens [N, T] 0-padded, lengths [N], n-gram buckets [N, T, G] or None
        without subwords). Each source keeps its first ``cfg.max_tokens[source]`` tokens; ids
        from the vocabulary in the model config, so training, evaluation and serving encode the
        same way; every token's n-grams (in the vocabulary or not) are hashed here, once per
        distinct word of the call, by the vectorised ``ngram_buckets``. A sentence without a
        token is one ``<unk>`` without n-grams (``Vocabulary.encode``'s rule)."""
        if self._index is None:
            self._index = {w: i for i, w in enumerate(self.cfg.words)}
        index, limits = self._index, self.cfg.max_tokens
        kept = [
            first_tokens(t, limits.get(s, NO_LIMIT) if s in self.cfg.sources else 1)
            for t, s in zip(texts, sources, strict=True)
        ]
        N, T = len(kept), max([len(k) for k in kept] + [1])
        tokens = np.zeros((N, T), dtype=np.int64)
        lengths = np.ones(N, dtype=np.int64)
        for i, words in enumerate(kept):
            if words:
                tokens[i, : len(words)] = [index.get(w, UNK_ID) for w in words]
                lengths[i] = len(words)
            else:
                tokens[i, 0] = UNK_ID
        ngrams = None
        if self.cfg.subword_buckets:
            distinct: dict[str, int] = {}
            where = np.zeros((N, T), dtype=np.int64)  # 1 + the word's row in the table, 0 = none
            for i, words in enumerate(kept):
                where[i, : len(words)] = [distinct.setdefault(w, len(distinct)) + 1 for w in words]
            table = ngram_buckets(list(distinct), self.cfg.subword_buckets)  # [U, G]
            table = np.concatenate([np.zeros((1, table.shape[1]), dtype=np.int64), table])
            ngrams = torch.from_numpy(table[where])  # [N, T, G]
        return torch.from_numpy(tokens), torch.from_numpy(lengths), ngrams

    def encode_text(
        self,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        slots: torch.Tensor,
        rows: torch.Tensor,
        keep: torch.Tensor,
        fuser_only: bool = False,
        ngrams: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tokens [N, T], lengths [N], n-gram buckets [N, T, G] (None: words only); sentence n
        is source ``slots[n]`` (an index into ``cfg.sources``, -1: a source this model does not
        read) of sample ``rows[n]``; keep [B, S] the (sample, source) cells to use -> [B, d]
        unit vectors (zeros for a sample with no cell left: it scores 0 against every image)."""
        B, S = keep.shape
        known = slots >= 0
        tokens, lengths, slots, rows = tokens[known], lengths[known], slots[known], rows[known]
        ngrams = ngrams[known] if ngrams is not None else None
        present = torch.zeros(B, S, dtype=torch.bool, device=keep.device)
        present[rows, slots] = True
        use = keep & present
        x = torch.zeros(B, S, self.cfg.d, device=keep.device)
        mask = torch.arange(tokens.shape[1], device=keep.device)[None, :] < lengths.clamp(min=1)[:, None]
        embedded = False
        for j, name in enumerate(self.cfg.sources):
            sel = (slots == j) & use[rows, slots]
            enc = self.encoders[name]
            if not sel.any():
                if torch.is_grad_enabled():  # DDP all-reduces every parameter's gradient in every
                    # step: a source absent from this worker's batch joins the graph with 0
                    x = x + 0.0 * sum(p.sum() for p in enc.parameters())
                continue
            embedded = True
            if self.embed is None:  # CHAIN reads characters
                x[rows[sel], j] = enc(tokens[sel])
                continue
            # cut this source's rows to its own longest sentence: a batch pads every
            # sentence to the longest of any source (a 100-token body), and a 12-word
            # headline's 88 padding positions, masked out of attention and max pooling,
            # would still cost attention + point-wise CNN work (2.4x the encoder's
            # arithmetic for one served article; docs/benchmarks.md, issue #18)
            t = int(lengths[sel].max().clamp(min=1))
            g = ngrams[sel][:, :t] if ngrams is not None else None
            x[rows[sel], j] = enc(self.embed(tokens[sel][:, :t], g), mask[sel][:, :t])
        if not embedded and self.embed is not None and torch.is_grad_enabled():
            # a batch with no sentence left (a worker's share of empty articles): the word
            # embedding joins the graph with 0 too, or DDP waits for its gradient forever
            x = x + 0.0 * sum(p.sum() for p in self.embed.parameters())
        if fuser_only:  # divide and conquer's warm-up: the loaded encoders get zero gradients
            x = zero_grad(x)
        some = use.any(1)
        fused = self.fuser(x, use | ~some[:, None])  # rows without a source: masked out below
        fused = F.normalize(fused, dim=-1)
        return (fused.abs() if self.cfg.score == "order" else fused) * some[:, None]

    def encode_article(
        self, sources: dict[str, torch.Tensor], ngrams: dict[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """One article's sources ({name: tokens [1, T], no padding; at least one, all read by
        this model}; ``ngrams`` {name: [1, T, G]} with subwords) -> [1, d]: ``encode_text`` of a one-article
        batch with complete inputs, bit-identical to it (tested), without the batch machinery
        (boolean row selection, index puts, padding masks: ~1.5 ms of a served article's ~10 ms
        on one core). Serving encodes each article of a request this way, so an article's vector
        never depends on the other rows of its request. A CHAIN model (one encoder over the
        concatenated sources) has no per-source path: ``serving.encode_article`` sends it
        through the batch encoder.
        """
        if self.embed is None:
            raise ValueError("a CHAIN model encodes articles through encode_text")
        present = [name in sources for name in self.cfg.sources]
        zero = torch.zeros(1, self.cfg.d)
        if not any(present):  # what encode_text gives a sample without a source
            return zero
        x = torch.stack(
            [
                self.encoders[name].encode_one(self.embed(sources[name], (ngrams or {}).get(name)))
                if here
                else zero
                for name, here in zip(self.cfg.sources, present, strict=True)
            ],
            1,
        )  # [1, S, d]
        fused = F.normalize(self.fuser(x, torch.tensor([present])), dim=-1)
        return fused.abs() if self.cfg.score == "order" else fused

    def score(self, text: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        """text [Q, d] x image [N, d] -> [Q, N]: the cosine, or for ORDER the negative order
        violation (``losses.order_scores``); higher is a better match either way."""
        return order_scores(text, image) if self.cfg.score == "order" else text @ image.T

    def forward(
        self, batch, keep: torch.Tensor | None = None, fuser_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch of news samples -> (text [B, d], image [B, d]); ``keep`` [B, S] bool says
        which sources to use (None: every present one, the complete inputs of validation);
        ``fuser_only``: every part but the fuser gets zero gradients."""
        slots, rows = sentence_slots(batch.metadata, batch.n_sentences, self.cfg.sources)
        device = batch.tokens.device
        if keep is None:
            keep = torch.ones(len(batch), len(self.cfg.sources), dtype=torch.bool, device=device)
        tokens, lengths, ngrams = batch.tokens, batch.lengths, None
        if self.cfg.words and batch.sentences is not None:  # the model's own tokens (per-source limits)
            names = [self.cfg.sources[j] if j >= 0 else "" for j in slots.tolist()]
            tokens, lengths, ngrams = self.tokenize(batch.sentences, names)
            tokens, lengths = tokens.to(device), lengths.to(device)
            ngrams = ngrams.to(device) if ngrams is not None else None
        text = self.encode_text(tokens, lengths, slots.to(device), rows.to(device), keep, fuser_only, ngrams)
        image = self.image(batch.features)
        return text, (zero_grad(image) if fuser_only else image)

    def encode(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        return self(batch)


def zero_grad(t: torch.Tensor) -> torch.Tensor:
    """``t`` forward, a zero gradient backward, still in the graph (DDP sees every parameter
    used; Adam's step on a zero gradient is 0)."""
    return t.detach() + 0.0 * t


def sentence_slots(
    metadata: list[dict] | None, n_sentences: list[int], sources: tuple[str, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(slot [N], row [N]) of every sentence of a batch: its source's index in ``sources``
    (-1 for a source the model does not read) and its sample, from ``metadata["news_sources"]``
    (``schemas/news.py``); ValueError when a row's names do not match its sentences."""
    if metadata is None:
        raise ValueError("news samples need their metadata (news_sources) in the batch")
    slots, rows = [], []
    for b, (meta, n) in enumerate(zip(metadata, n_sentences, strict=True)):
        names = sources_of(meta)
        if len(names) != n:
            raise ValueError(f"sample {b}: {len(names)} source names for {n} sentences")
        slots += [sources.index(s) if s in sources else -1 for s in names]
        rows += [b] * n
    return torch.tensor(slots, dtype=torch.long), torch.tensor(rows, dtype=torch.long)
