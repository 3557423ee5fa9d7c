"""Feature-extraction throughput: bare batched forward vs. the same model inside a Beam pipeline.

CLIP ViT-B/32 (issue #20's GPU target): ``--extractor clip-vit-b32 --option weights=FILE --device
cuda``. The bare forward needs only torch: ``--beam auto`` skips the Beam half, and says so, where
apache_beam is not installed (a GPU image without the pipeline stack).

(a) bare: images/s of ``extractor.forward`` (the fixed-chunk forward RunInference runs) and of a
plain ``model(batch)``; (b) Beam: DirectRunner, (key, tensor) -> RunInference -> count, start-up
separated by also running ``--batch-size`` images: steady = (images - batch) / (t_full -
t_small); (c) ratio = (b) / (a), target >= 0.8; plus RunInference's batch sizes, to show the
batches are full. Rounds are interleaved so a busy neighbour affects all alike; the best of each
is kept. ``--threads 1`` avoids OpenMP spin-wait thrashing on a shared machine; the handler's
malloc tuning applies to both sides (``--no-malloc-tuning``: neither). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time

from PIL import Image


def _photos() -> list[Image.Image]:
    from skimage import data

    names = ("chelsea", "astronaut", "coffee", "rocket", "cat", "hubble_deep_field", "immunohistochemistry")
    photos = [Image.fromarray(getattr(data, n)()).convert("RGB") for n in names]
    return [*photos, photos[0].transpose(Image.FLIP_LEFT_RIGHT)]  # 8 distinct images


def _photos_or_noise() -> list[Image.Image]:
    """The 8 photos, or 8 seeded noise images where scikit-image is not installed."""
    try:
        return _photos()
    except ImportError:
        import numpy as np

        rng = np.random.default_rng(0)
        return [Image.fromarray((rng.random((300, 400, 3)) * 255).astype("uint8")) for _ in range(8)]


def _sync(device: str) -> None:
    """Wait for queued GPU kernels, so a timer measures the work and not its launch."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bare_forward(
    ext, model, tensors: list, batch_size: int, plain: bool = False, device: str = "cpu"
) -> float:
    """Seconds to run ``tensors`` through the model in batches of ``batch_size`` (``plain``:
    ``model(batch)`` on a stacked batch moved to ``device``; else the extractor's forward)."""
    import torch

    _sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        for start in range(0, len(tensors), batch_size):
            batch = tensors[start : start + batch_size]
            if not plain:
                ext.forward(model, batch, device)
            elif ext.forward_chunk:
                model(torch.stack(batch).to(device))
            else:  # detectors: one image per forward is the plain way too
                for x in batch:
                    model(x.to(device))
    _sync(device)
    return time.perf_counter() - t0


def beam_available() -> bool:
    try:
        import apache_beam  # noqa: F401  (the Beam half imports it anyway)
    except ImportError:
        return False
    return True


def beam_run(ext, base: list, n: int, batch_size: int, device: str = "cpu") -> tuple[float, dict]:
    """(seconds for the whole pipeline, RunInference batch-size distribution)."""
    import apache_beam as beam
    from apache_beam.metrics.metric import MetricsFilter
    from apache_beam.ml.inference.base import RunInference

    from pipelines.direct_runner import DirectRunner
    from pipelines.inference import model_handler

    k = len(base)

    def check(total):
        if total != n:
            raise RuntimeError(f"counted {total} results, expected {n}")

    t0 = time.perf_counter()
    p = beam.Pipeline(runner=DirectRunner())
    _ = (
        p
        | "Keys" >> beam.Create(range(n))
        | "Tensors" >> beam.Map(lambda i: (i, base[i % k]))
        | "Infer" >> RunInference(model_handler(ext, device, batch_size=batch_size))
        | "One" >> beam.Map(lambda _: 1)
        | "Count" >> beam.CombineGlobally(sum)
        | "Check" >> beam.Map(check)
    )
    result = p.run()
    result.wait_until_finish()
    seconds = time.perf_counter() - t0
    batches = {}
    query = MetricsFilter().with_name("inference_request_batch_size")
    for d in result.metrics().query(query)["distributions"]:
        v = d.committed or d.attempted
        if v is not None and v.count:
            batches = {"count": v.count, "mean": round(v.sum / v.count, 2), "min": v.min, "max": v.max}
    return seconds, batches


def main(argv: list[str] | None = None) -> None:
    from features.registry import DEFAULT_EXTRACTOR  # light: no torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--extractor", default=DEFAULT_EXTRACTOR)
    ap.add_argument("--option", action="append", default=[], help="extractor option key=value")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved repeats; the best of each is kept")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch default)")
    ap.add_argument(
        "--no-malloc-tuning", action="store_true", help="leave glibc malloc as is (see tune_cpu_malloc)"
    )
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument(
        "--beam", default="auto", choices=("auto", "on", "off"), help="the Beam half (auto: if installed)"
    )
    ap.add_argument("--json", action="store_true", help="print only the JSON object")
    args = ap.parse_args(argv)
    if args.no_malloc_tuning:
        os.environ["MMLINKS_CPU_MALLOC_TUNING"] = "0"
    if args.threads:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    import torch

    from features import get_extractor, resolve_device, tune_cpu_malloc

    device = resolve_device(args.device)
    beam = args.beam == "on" or (args.beam == "auto" and beam_available())
    if args.beam == "on" and not beam_available():
        raise SystemExit("--beam on: apache_beam is not installed")
    # what the Beam handler does on a CPU worker, so (a) and (b) match
    malloc_tuned = tune_cpu_malloc() if device == "cpu" else False

    if args.threads:
        torch.set_num_threads(args.threads)
    logging.getLogger("apache_beam").setLevel(logging.ERROR)
    options = dict(o.split("=", 1) for o in args.option)
    ext = get_extractor(args.extractor, **options)
    model = ext.load_model(device)
    base = [ext.preprocess(im) for im in _photos_or_noise()]
    tensors = [base[i % len(base)] for i in range(args.images)]
    bs = args.batch_size
    load0 = os.getloadavg()[0]

    bare_forward(ext, model, tensors[:bs], bs, device=device)  # warm-up (allocator, kernels)
    bare, plain, small, full, batches = [], [], [], [], {}
    for _ in range(args.rounds):
        bare.append(bare_forward(ext, model, tensors, bs, device=device))
        plain.append(bare_forward(ext, model, tensors, bs, plain=True, device=device))
        if beam:
            small.append(beam_run(ext, base, bs, bs, device)[0])
            seconds, batches = beam_run(ext, base, args.images, bs, device)
            full.append(seconds)
    bare, plain = min(bare), min(plain)
    bare_ips = args.images / bare
    out = {
        "extractor": ext.name,
        "version": ext.version,
        "options": ext.options,
        "device": device,
        "gpu": torch.cuda.get_device_name(device) if device.startswith("cuda") else None,
        "images": args.images,
        "batch_size": bs,
        "forward_chunk": ext.chunk_for(device),
        "torch_threads": torch.get_num_threads(),
        "malloc_tuned": malloc_tuned,
        "cpu_count": os.cpu_count(),
        "loadavg_1m_before": round(load0, 2),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
        "bare_forward_images_per_s": round(bare_ips, 2),
        "bare_plain_model_images_per_s": round(args.images / plain, 2),
        "rounds": args.rounds,
    }
    if beam:
        out.update(_beam_figures(ext, device, args.images, bs, min(small), min(full), batches, bare_ips))
    else:
        out["beam"] = (
            "skipped: apache_beam is not installed" if args.beam == "auto" else "skipped: --beam off"
        )
    if not args.json:
        print(__doc__.splitlines()[0], file=sys.stderr)
    print(json.dumps(out, indent=None if args.json else 2))


def _beam_figures(ext, device, images, bs, small, full, batches, bare_ips) -> dict:
    from pipelines.inference import model_handler

    handler_bs = model_handler(ext, device, batch_size=bs).batch_elements_kwargs()["max_batch_size"]
    steady_ips = (images - bs) / (full - small) if full > small else float("nan")
    return {
        "handler_batch_size": handler_bs,
        "beam_total_s": round(full, 3),
        "beam_images_per_s_including_startup": round(images / full, 2),
        "beam_small_run_s": round(small, 3),
        "beam_startup_s_estimate": round(full - images / steady_ips, 3)
        if math.isfinite(steady_ips)
        else None,
        "beam_images_per_s_steady": round(steady_ips, 2),
        "beam_inference_batches": batches,
        "ratio_steady": round(steady_ips / bare_ips, 3),
        "ratio_including_startup": round((images / full) / bare_ips, 3),
    }


if __name__ == "__main__":
    main()
