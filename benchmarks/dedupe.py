"""Benchmark exact near-duplicate hash search (pipelines/near_duplicates.py) and print one JSON object.

Random 64-bit hashes with ``--planted`` copies at distance 1..threshold: time for n and for the
first ``--small`` and their ratio, a scaling ``--series``, the share of planted pairs found (must
be 1.0), equality with chunked brute force on a ``--check`` subset, and, unless ``--beam-docs 0``,
DirectRunner throughput of FindDuplicateDocuments checked against the NumPy core's verdicts.
Issue #61 retired the "two levels always" timings, whose figures chose ``TWO_LEVEL_MIN_GROUP`` and
stand in ``pipelines/near_duplicates.py``'s docstring (last version: commit 7c1b8d6).

Timings are wall clock, best of ``--repeats`` in one process: on a shared 2-core VM the 1M/100K
ratio of one unchanged build ranged from ~9 to ~27 with other processes' load, so compare
numbers from one run.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

import pipelines.near_duplicates as dedupe
from pipelines.dedupe import FindDuplicateDocuments
from pipelines.near_duplicates import brute_force_pairs, degenerate_mask, near_duplicate_pairs


def flip_bits(rng: np.random.Generator, h: np.uint64, k: int) -> np.uint64:
    for b in rng.choice(64, size=k, replace=False):
        h ^= np.uint64(1) << np.uint64(b)
    return h


def planted_hashes(n: int, planted: int, t: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n hashes, ``planted`` of them copies of others at distance 1..t; returns (hashes, pairs [P, 2])."""
    base = rng.integers(0, 2**64, n - planted, dtype=np.uint64)
    src = rng.choice(base.size, planted, replace=False)
    copies = np.array(
        [flip_bits(rng, base[s], 1 + k % max(t, 1)) for k, s in enumerate(src)], dtype=np.uint64
    )
    perm = rng.permutation(n)  # perm[new position] = old position
    where = np.empty(n, np.int64)
    where[perm] = np.arange(n)  # old position -> new position
    hashes = np.concatenate([base, copies])[perm]
    pairs = np.sort(np.stack([where[src], where[base.size + np.arange(planted)]], axis=1), axis=1)
    return hashes, pairs


def best_time(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def bench_beam(n_docs: int, t: int, rng: np.random.Generator) -> dict:
    import apache_beam as beam

    from pipelines.direct_runner import DirectRunner

    docs, owner, hashes = [], [], []
    for k in range(n_docs):
        imgs = rng.integers(0, 2**64, int(rng.integers(1, 5)), dtype=np.uint64)
        if k and rng.random() < 0.02:  # copy an earlier document's image, a few bits off
            j = int(rng.integers(0, len(hashes)))
            imgs[0] = flip_bits(rng, hashes[j], int(rng.integers(0, t + 1)))
        docs.append(
            {
                "doc_id": f"doc{k:06d}",
                "images": [{"phash": int(h)} for h in imgs],
                "metadata": {"created_utc": str(1_500_000_000 + k)},
            }
        )
        owner += [k] * imgs.size
        hashes += list(imgs)
    h, owner_arr = np.array(hashes, dtype=np.uint64), np.array(owner)
    usable = ~degenerate_mask(h)
    pairs = near_duplicate_pairs(h[usable], t)
    own = owner_arr[usable][pairs]
    own = own[own[:, 0] != own[:, 1]]
    want = {f"doc{k:06d}" for k in np.unique(own)}

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        with beam.Pipeline(runner=DirectRunner()) as p:
            (
                p
                | beam.Create(docs)
                | FindDuplicateDocuments(threshold=t, policy="drop_all")
                | beam.Map(lambda v: v.doc_id)
                | beam.io.WriteToText(f"{tmp}/flagged")
            )
        secs = time.perf_counter() - t0
        got = {line for f in Path(tmp).glob("flagged*") for line in f.read_text().split()}
    return {
        "docs": n_docs,
        "images": int(h.size),
        "seconds": round(secs, 2),
        "docs_per_s": round(n_docs / secs, 1),
        "flagged": len(got),
        "matches_numpy": got == want,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=100_000)
    ap.add_argument("--check", type=int, default=50_000)
    ap.add_argument("--planted", type=int, default=1000)
    ap.add_argument("--threshold", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--beam-docs", type=int, default=20_000)
    ap.add_argument("--series", default="100000,1000000,4000000", help="comma-separated sizes ('' for none)")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    t = args.threshold

    hashes, planted = planted_hashes(args.n, args.planted, t, rng)
    near_duplicate_pairs(hashes[:1000], t)  # warm-up
    t_small, _ = best_time(lambda: near_duplicate_pairs(hashes[: args.small], t), args.repeats)
    t_n, pairs = best_time(lambda: near_duplicate_pairs(hashes, t), args.repeats)
    found = {tuple(p) for p in pairs.tolist()}
    planted_found = sum(tuple(p) in found for p in planted.tolist())

    sizes = [int(s) for s in args.series.split(",") if s.strip()]
    extra_rng = np.random.default_rng(args.seed + 1)  # leaves ``rng`` (check subset, Beam docs) as before
    more = max(sizes, default=0) - args.n
    series_hashes = (
        hashes if more <= 0 else np.concatenate([hashes, extra_rng.integers(0, 2**64, more, dtype=np.uint64)])
    )
    series = []
    for size in sizes:
        secs, _ = best_time(lambda prefix=series_hashes[:size]: near_duplicate_pairs(prefix, t), args.repeats)
        series.append({"n": size, "seconds": round(secs, 4), "ns_per_hash": round(secs / size * 1e9, 1)})

    # Brute-force subset: both ends of planted pairs (up to half the subset), filled with random others.
    ends = np.unique(planted[: args.check // 4].ravel())
    rest = np.setdiff1d(rng.choice(args.n, min(args.n, args.check), replace=False), ends)
    subset = hashes[np.concatenate([ends, rest])[: args.check]]
    t_brute, want = best_time(lambda: brute_force_pairs(subset, t), 1)
    got = near_duplicate_pairs(subset, t)

    out = {
        "n": args.n,
        "threshold": t,
        "seconds_n": round(t_n, 4),
        "small": args.small,
        "seconds_small": round(t_small, 4),
        "ratio": round(t_n / t_small, 2),
        "two_level_min_group": dedupe.TWO_LEVEL_MIN_GROUP,
        "series": series,
        "pairs_found": len(found),
        "planted": int(planted.shape[0]),
        "planted_found": planted_found,
        "planted_recall": planted_found / max(1, planted.shape[0]),
        "check_n": int(subset.size),
        "check_pairs": len(want),
        "check_equal_brute_force": bool(np.array_equal(got, want)),
        "check_brute_force_seconds": round(t_brute, 2),
        "repeats": args.repeats,
        "peak_rss_mb_before_beam": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    if args.beam_docs:
        out["beam"] = bench_beam(args.beam_docs, t, rng)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
