"""AP's exact k-edge matching: a loop of lapjv calls vs the batched solver, on CPU; prints JSON.

Why: ``training/objectives/assignment.py`` has two exact solvers and ``solve_matchings`` picks
one per call; this measurement is what the choice rests on (docs/benchmarks.md, "AP's exact
solver"). For B documents the similarity has B^2 problems; each problem here is an n x m block
(padded to 16 x 16) of random float64 weights, n and m either all 16 (``--sizes fixed``, the
training-step benchmark's documents) or drawn from 1..16 (``mixed``). Timings are the median of
``--repeats`` calls after one warm-up, single-threaded process, CPU.

    python benchmarks/assignment.py [--batch 11 64] [--repeats 7] [--sizes fixed mixed]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def problems(B: int, sizes: str, k_mode: str, rng):
    import numpy as np

    from training.objectives.assignment import choose_k

    P, N = B * B, 16
    if sizes == "fixed":
        n_doc, m_doc = np.full(B, N), np.full(B, N)
    else:
        n_doc, m_doc = rng.integers(1, N + 1, B), rng.integers(1, N + 1, B)
    n = np.repeat(n_doc, B)  # problem (a, b): sentences of a x images of b
    m = np.tile(m_doc, B)
    k = np.array([choose_k(int(a), int(b), k_mode) for a, b in zip(n, m, strict=True)])
    return rng.standard_normal((P, N, N)), n, m, k


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(1000 * statistics.median(times), 3)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="+", default=[11, 64])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--sizes", nargs="+", default=["fixed", "mixed"], choices=["fixed", "mixed"])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import numpy as np

    from training.objectives.assignment import SOLVERS, pick_solver

    rng = np.random.default_rng(args.seed)
    rows = []
    for sizes in args.sizes:
        for B in args.batch:
            for k_mode in ("full", "half"):
                w, n, m, k = problems(B, sizes, k_mode, rng)
                picks = {name: fn(w, n, m, k) for name, fn in SOLVERS.items()}
                weight = {name: float((w * c).sum()) for name, c in picks.items()}
                ms = {
                    name: median_ms(lambda f=fn, a=(w, n, m, k): f(*a), args.repeats)
                    for name, fn in SOLVERS.items()
                }
                rows.append(
                    {
                        "sizes": sizes,
                        "B": B,
                        "problems": B * B,
                        "k": k_mode,
                        "lapjv_loop_ms": ms["lapjv-loop"],
                        "batched_ms": ms["batched"],
                        "batched_speedup": round(ms["lapjv-loop"] / ms["batched"], 2),
                        "same_optimum": bool(np.isclose(weight["lapjv-loop"], weight["batched"])),
                        "picked": pick_solver(n, m, k, "cpu"),
                    }
                )
    out = {"device": "cpu", "repeats": args.repeats, "rows": rows}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
