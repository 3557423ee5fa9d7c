"""AP's exact k-edge matching: a loop of SciPy calls vs the batched solver on the host, and with
``--device cuda`` the Triton kernel on the GPU; prints JSON.

Why: ``solve_matchings`` picks one of two exact host solvers per call, and this measurement is
what the choice rests on (docs/benchmarks.md, "AP's exact solver"). Each of the B^2 problems is an
n x m block (padded to 16 x 16) of random float64 weights, n and m all 16 (``--sizes fixed``, the
training-step benchmark's documents) or drawn from 1..16 (``mixed``); medians of ``--repeats``
calls after a warm-up, synchronised on the device. ``same_optimum``: every solver's total weight
equals the batched solver's.
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
    p.add_argument("--device", default="cpu", help="cpu, or cuda to time the Triton kernel too")
    p.add_argument("--num-warps", type=int, nargs="+", default=[1], help="the kernel's warps per problem")
    args = p.parse_args(argv)

    import numpy as np

    from training.objectives.assignment import SOLVERS, pick_solver

    host = dict(SOLVERS)
    gpu = None
    if args.device != "cpu":
        import torch

        from training.objectives import assignment_triton

        if not assignment_triton.available(args.device):
            p.error(f"--device {args.device}: the Triton solver needs a CUDA device and Triton")
        gpu = torch.device(args.device)

    rng = np.random.default_rng(args.seed)
    rows = []
    for sizes in args.sizes:
        for B in args.batch:
            for k_mode in ("full", "half"):
                w, n, m, k = problems(B, sizes, k_mode, rng)
                picks = {name: fn(w, n, m, k) for name, fn in host.items()}
                ms = {
                    name: median_ms(lambda f=fn, a=(w, n, m, k): f(*a), args.repeats)
                    for name, fn in host.items()
                }
                if gpu is not None:
                    dev_args = [torch.as_tensor(x, device=gpu) for x in (w, n, m, k)]
                    for warps in args.num_warps:
                        assignment_triton.NUM_WARPS = warps

                        def solve(a=dev_args):
                            out = assignment_triton.triton_max_weight_matching(*a)
                            torch.cuda.synchronize()
                            return out

                        picks[f"triton-w{warps}"] = solve().cpu().numpy()
                        ms[f"triton-w{warps}"] = median_ms(solve, args.repeats)
                weight = {name: float((w * c).sum()) for name, c in picks.items()}
                counts_ok = all(
                    (c.sum(axis=(1, 2)) == k).all() and (c.sum(1) <= 1).all() and (c.sum(2) <= 1).all()
                    for c in picks.values()
                )
                row = {"sizes": sizes, "B": B, "problems": B * B, "k": k_mode}
                row.update({f"{name}_ms": t for name, t in ms.items()})
                row["batched_speedup"] = round(ms["loop"] / ms["batched"], 2)
                row["same_optimum"] = bool(
                    counts_ok and all(np.isclose(v, weight["batched"]) for v in weight.values())
                )
                row["picked"] = pick_solver(n, m, k, "cpu")
                rows.append(row)
    out = {"device": args.device, "repeats": args.repeats, "rows": rows}
    if gpu is not None:
        out["gpu"] = torch.cuda.get_device_name(gpu)
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
