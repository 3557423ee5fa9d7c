"""Pretrained text towers' inference throughput (issue #20): sentences/s through all-MiniLM-L6-v2
and CLIP's text tower, batched, on ``--device`` (cpu, cuda).

Pure PyTorch (``training.link.towers``, ``features.clip``; never Ray, Beam or MLflow), so a GPU
image without the pipeline stack runs it from a checkout::

    PYTHONPATH=. python benchmarks/tower_inference.py --towers clip --clip-weights FILE --device cuda

Sentences are distinct synthetic ones, so nothing is cached; each tower is warmed up, the best of
``--rounds`` kept (synchronised on a GPU). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import time

WORDS = (
    "a the red blue green yellow big small tiny square circle star triangle dog cat house tree "
    "sits next to above below left right of on near with and beside"
).split()


def sentences(n: int, seed: int = 0) -> list[str]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [f"{i} " + " ".join(rng.choice(WORDS, size=int(rng.integers(6, 16)))) for i in range(n)]


def tower(name: str, device: str, clip_model: str, clip_weights: str | None):
    from training.link.towers import build_tower

    if name == "clip":
        from features.clip import find_clip_weights

        clip_weights = str(find_clip_weights(clip_weights))  # a one-line error when absent
    return build_tower(name, clip_model, clip_weights or "").eval().to(device)


def throughput(model, texts: list[str], batch: int, rounds: int, device: str) -> float:
    """Best sentences/s over ``rounds`` passes of ``texts`` in batches of ``batch``."""
    import torch

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    best = float("inf")
    with torch.no_grad():
        model(texts[:batch])  # warm-up
        for _ in range(rounds):
            sync()
            t0 = time.perf_counter()
            for start in range(0, len(texts), batch):
                model(texts[start : start + batch])
            sync()
            best = min(best, time.perf_counter() - t0)
    return len(texts) / best


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--towers", default="minilm", help="comma list of minilm, clip")
    ap.add_argument("--sentences", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: default)")
    ap.add_argument("--clip-model", default="ViT-B-32", help="open_clip architecture or JSON config")
    ap.add_argument("--clip-weights", default=None, help="CLIP weight file (default: the lookup)")
    args = ap.parse_args(argv)
    import torch

    from features.base import resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    texts = sentences(args.sentences)
    load0 = os.getloadavg()[0]
    rows = []
    for name in args.towers.split(","):
        t0 = time.perf_counter()
        model = tower(name, device, args.clip_model, args.clip_weights)
        load_s = time.perf_counter() - t0
        rows.append(
            {
                "tower": name,
                "dim": model.dim,
                "load_s": round(load_s, 2),
                "sentences_per_s": round(throughput(model, texts, args.batch, args.rounds, device), 1),
            }
        )
    out = {
        "device": device,
        "gpu": torch.cuda.get_device_name(device) if device.startswith("cuda") else None,
        "sentences": len(texts),
        "batch": args.batch,
        "rounds": args.rounds,
        "torch_threads": torch.get_num_threads(),
        "loadavg_1m_before": round(load0, 2),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
        "rows": rows,
    }
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
