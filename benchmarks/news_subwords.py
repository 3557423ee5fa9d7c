"""Subword n-gram hashing speed (issue #36): tokens/s of the character 3-5-gram buckets of a
news corpus's tokens, word by word in pure Python (the code before issue #34/#36:
``ngram_buckets_loop``) against the vectorised ``ngram_buckets``, and of the news model's
whole ``tokenize`` (vocabulary ids + per-source limits + n-grams, what every batch and served
article pays). The texts are a synthetic news corpus's (``data synth-news --names``); each
measurement is the best of ``--repeat`` runs over the same batches of ``--batch`` sentences.

One JSON object on stdout. Example::

    PYTHONPATH=. python benchmarks/news_subwords.py --articles 2000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--articles", type=int, default=2000)
    p.add_argument("--batch", type=int, default=128, help="sentences per call (a training batch's)")
    p.add_argument("--buckets", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)

    from pipelines.news_corpus import NewsSynthConfig, generate_article
    from schemas.news import NEWS_SOURCES
    from schemas.text import tokenize
    from training.news.model import NewsConfig, NewsRetrieval, ngram_buckets, ngram_buckets_loop
    from training.text import Vocabulary

    cfg = NewsSynthConfig(articles=args.articles, names=True, second_language_rate=0.0, image_size=32)
    texts, sources = [], []
    for i in range(args.articles):
        record, _ = generate_article(cfg, i)
        record["caption"] = record["images"][0]["caption"]
        for s in NEWS_SOURCES:
            if record.get(s):
                texts.append(record[s])
                sources.append(s)
    step = args.batch
    batches = [(texts[i : i + step], sources[i : i + step]) for i in range(0, len(texts), step)]
    tokens = sum(len(tokenize(t)) for t in texts)
    vocab = Vocabulary.build(texts, 1)
    net = NewsRetrieval(
        NewsConfig(
            vocab_size=len(vocab),
            word_dim=8,
            d=8,
            d_hidden=8,
            subword_buckets=args.buckets,
            words=vocab.words,
        )
    )

    def best(fn, inputs) -> float:
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            for b in inputs:
                fn(b)
            times.append(time.perf_counter() - t0)
        return min(times)

    # what tokenize hashes: each distinct word of the call once
    distinct = [list(dict.fromkeys(w for t in b[0] for w in tokenize(t))) for b in batches]
    loop = best(lambda words: ngram_buckets_loop(words, args.buckets), distinct)
    vec = best(lambda words: ngram_buckets(words, args.buckets), distinct)
    whole = best(lambda b: net.tokenize(*b), batches)
    return {
        "benchmark": "news_subwords",
        "sentences": len(texts),
        "tokens": tokens,
        "batch": args.batch,
        "buckets": args.buckets,
        "tokens_per_s": {
            "ngrams_loop": round(tokens / loop),
            "ngrams_vectorised": round(tokens / vec),
            "tokenize_with_ngrams": round(tokens / whole),
        },
        "speedup": round(loop / vec, 2),
        "load_1min": os.getloadavg()[0],
        "python": platform.python_version(),
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
