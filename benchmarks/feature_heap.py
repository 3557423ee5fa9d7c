"""How a feature worker's memory grows with the images it has run (issue #47); prints JSON.

Usage: env PYTHONPATH=. .venv/bin/python benchmarks/feature_heap.py --store OUT/image-store
       [--images 1600] [--trim slack|off|every-batch] [--extractor efficientnet-lite0]

Runs the build's own RunInference handler (``pipelines.inference.stored_image_handler``: read,
decode, preprocess, forward) over the first ``--images`` images of a build's image store, in this
one process with one torch thread, as one feature worker runs them, and keeps every image's
features as a feature task does. Samples RSS every 10 batches.

``--trim``: ``slack`` is what the handler does (``features.base.HeapTrim``: ``malloc_trim`` after
256 MiB of growth), ``off`` never trims (the handler before it), ``every-batch`` trims after
each batch (the memory floor, and what that costs in time).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import psutil
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True, help="an image store (a build's OUT/image-store)")
    ap.add_argument("--images", type=int, default=1600, help="how many of its images to run")
    ap.add_argument("--trim", choices=("slack", "off", "every-batch"), default="slack")
    ap.add_argument("--extractor", default="efficientnet-lite0")
    ap.add_argument("--batch", type=int, default=32, help="the build's --batch-size")
    args = ap.parse_args()

    import features.base as base
    from features import get_extractor
    from pipelines.inference import stored_image_handler

    blobs = os.path.join(args.store, "blobs")
    if not os.path.isdir(blobs):
        raise SystemExit(f"no image store at {args.store} (expected {blobs})")
    ids = sorted(f for d in sorted(os.listdir(blobs)) for f in os.listdir(os.path.join(blobs, d)))
    ids = ids[: args.images]
    if not ids:
        raise SystemExit(f"{args.store} holds no images")
    torch.set_num_threads(1)
    ext = get_extractor(args.extractor)
    slack = {"slack": base.HEAP_TRIM_SLACK, "off": None, "every-batch": 0}[args.trim]
    handler = stored_image_handler(ext, args.store, "cpu", args.batch, 1, trim_slack=slack)
    model = handler.load_model()  # applies tune_cpu_malloc and makes the handler's HeapTrim
    proc = psutil.Process()
    kept, samples = [], []
    start = time.perf_counter()
    for n, i in enumerate(range(0, len(ids), args.batch)):
        for r in handler.run_inference(ids[i : i + args.batch], model):
            kept.append(ext.postprocess(r.inference, r.example[1]))
        if n % 10 == 0 or i + args.batch >= len(ids):
            samples.append([min(i + args.batch, len(ids)), proc.memory_info().rss >> 20])
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "trim": args.trim,
                "images": len(ids),
                "seconds": round(seconds, 1),
                "images_per_s": round(len(ids) / seconds, 1),
                "trims": handler.heap_trims,
                "rss_mib_first_batch": samples[0][1],
                "rss_mib_peak_sampled": max(s[1] for s in samples),
                "rss_mib_last": samples[-1][1],
                "kb_per_image_growth": round((samples[-1][1] - samples[0][1]) * 1024 / len(ids), 1),
                "slack_mib": base.HEAP_TRIM_SLACK >> 20,
                "samples": samples,
            }
        )
    )


if __name__ == "__main__":
    sys.exit(main())
