"""An article's text through a news net (issue #18): the batch encoder (``encode_articles``,
complete inputs: every present source) and the single-article path a served request of one
article takes (``encode_article``, bit-identical to the batch's vector for it). What the served
news model (``models/news_serving.py``), the news evaluation (``training/news/evaluation.py``)
and the archive's calibration queries (``models/news_archive.py``) encode articles with."""

from __future__ import annotations

import torch

from schemas.news import NEWS_SOURCES, SOURCES_KEY
from schemas.text import has_tokens
from training.data import encode_sentences
from training.news.model import NewsRetrieval, sentence_slots
from training.text import Vocabulary


def text_of(value) -> str:
    """A cell as text: None / NaN filler (a column another row set) -> ''."""
    return value if isinstance(value, str) else ""


@torch.inference_mode()
def encode_articles(
    net: NewsRetrieval, vocab: Vocabulary, max_tokens: int, articles: list[dict]
) -> torch.Tensor:
    """Articles ({source: text}) -> [Q, d] fused unit vectors, complete inputs (every present
    source). An article without any source the model reads gets a zero vector.

    ``inference_mode`` rather than ``no_grad``: the same numbers without autograd's version
    counting, a few ms less a served article (docs/benchmarks.md, issue #18); the result is an
    inference tensor (read it, do not train through it)."""
    sentences, metadata = [], []
    for a in articles:
        names = [s for s in NEWS_SOURCES if has_tokens(text_of(a.get(s)))]
        sentences.append([a[s] for s in names])
        metadata.append({SOURCES_KEY: ",".join(names)})
    n = [len(s) for s in sentences]
    slots, rows = sentence_slots(metadata, n, net.cfg.sources)
    ngrams = None
    if net.cfg.words:  # the model's own vocabulary, per-source limits and n-grams (as in training)
        names = [name for m in metadata for name in m[SOURCES_KEY].split(",") if name]
        tokens, lengths, ngrams = net.tokenize([t for doc in sentences for t in doc], names)
    else:  # a model from before issue #34: the packaged vocabulary, one limit
        tokens, lengths = encode_sentences(sentences, vocab, max_tokens)
    keep = torch.ones(len(articles), len(net.cfg.sources), dtype=torch.bool)
    if net.training:  # eval() walks every module: ~1 ms a served article when done each time
        net.eval()
    return net.encode_text(tokens, lengths, slots, rows, keep, ngrams=ngrams)


@torch.inference_mode()
def encode_article(net: NewsRetrieval, vocab: Vocabulary, max_tokens: int, article: dict) -> torch.Tensor:
    """One article ({source: text}, at least one source the model reads with words) -> [1, d]:
    what ``encode_articles`` gives for it alone, bit-identical (tested), through
    ``NewsRetrieval.encode_article``: each source tokenised once and encoded unpadded, without
    the batch machinery. The served model's path for a request of one article. A CHAIN model
    (one encoder over the concatenated sources, a Table 1 baseline) has no per-source path and
    goes through ``encode_articles``."""
    if net.embed is None:
        return encode_articles(net, vocab, max_tokens, [article])
    sources, ngrams = {}, {}
    present = [(s, text_of(article.get(s))) for s in net.cfg.sources]
    present = [(s, text) for s, text in present if has_tokens(text)]
    if net.cfg.words:  # as encode_articles: the model's own tokens, in one call, so the n-gram
        # width G is the batch's (a narrower table sums its zero padding in another order)
        tokens, lengths, g = net.tokenize([text for _, text in present], [s for s, _ in present])
        for i, (s, _) in enumerate(present):
            sources[s] = tokens[i : i + 1, : lengths[i]]
            if g is not None:
                ngrams[s] = g[i : i + 1, : lengths[i]]
    else:
        for s, text in present:
            sources[s] = torch.tensor([vocab.encode(text, max_tokens)], dtype=torch.long)
    if net.training:
        net.eval()
    return net.encode_article(sources, ngrams or None)
