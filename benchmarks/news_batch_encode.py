"""CPU time an article of the served news model's two encoders, by request size.

Usage: PYTHONPATH=. .venv/bin/python benchmarks/news_batch_encode.py [--sizes 1,8,64] [--repeats 5]

``NewsModel.predict`` encodes a request of one article through ``encode_article`` (the lean
single-article path) and a request of several through ``encode_articles`` (the batch encoder);
this measures both at each size on the paper-sized random model of ``news_serving_latency.py``
(50k words, word_dim 300, d_hidden 600, d 256), one torch thread, best of ``--repeats``.
Prints one JSON object (docs/benchmarks.md, issue #18, "Requests of several articles").
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,8,64", help="articles per request, comma-separated")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    import news_serving_latency as bench
    import torch

    from training.news.encode import encode_article, encode_articles
    from training.news.model import NewsConfig, NewsRetrieval

    torch.set_num_threads(1)
    words, max_tokens = 50_000, 100
    folder, vocab = bench.news_checkpoint(Path(tempfile.mkdtemp()) / "m", words, 256, max_tokens, 0)
    net = NewsRetrieval(NewsConfig(**json.loads((folder / "meta.json").read_text())["model"])).eval()
    sizes = [int(n) for n in args.sizes.split(",")]
    arts = bench.articles(max(sizes), words, 0)
    out = {"threads": 1, "repeats": args.repeats, "ms_cpu_per_article": {}}
    for n in sizes:
        batch = arts[:n]
        ways = {
            "batch_encoder": lambda b=batch: encode_articles(net, vocab, max_tokens, b),
            "one_by_one": lambda b=batch: [encode_article(net, vocab, max_tokens, a) for a in b],
        }
        row = {}
        for name, run in ways.items():
            run()  # warm-up
            best = min(_cpu(run) for _ in range(args.repeats))
            row[name] = round(best / n * 1000, 2)
        out["ms_cpu_per_article"][str(n)] = row
    print(json.dumps(out))
    return out


def _cpu(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


if __name__ == "__main__":
    main()
