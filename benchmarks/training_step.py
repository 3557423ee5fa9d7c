"""Time one training step of the default MulLink model per objective, split into its parts.

Why: issue #5 asks that AP cost about what DC costs (AP step <= 1.15x DC step at B = 11,
documents of 16 images x 16 sentences) and that similarity + assignment stay <= 15 % of the step.
Both are ratios, so every figure comes from one process, the objectives interleaved per repeat so
a busy neighbour slows all alike, and medians are compared.

The model is the default (GRU, d_multi 1024, 50-d word vectors, 1280-d features, image dropout
0.4) on one fixed random batch. A step = encode -> pad_documents -> document_similarity ->
in_batch_loss -> backward -> Adam; the backward runs in two calls (to the encoded vectors, then
through the encoders: the same arithmetic) so the similarity's share includes its backward.
Objectives: dc, tk, ap (k full and half), AP solved where it trains (the Triton solver on CUDA);
each solver alone is ``benchmarks/assignment.py``'s. ``--clock cpu`` leaves out time spent
descheduled on an oversubscribed machine. Issue #61 retired the rows against replaced solvers
(docs/benchmarks.md). ``--retrieval-data DS`` (issue #17: a CMCM step <= 1.2x CMCA's) times each
``--objectives`` entry's whole step on a pair dataset's first training pairs, alternated, and the
ratio of the medians (it was ``retrieval_step.py --mode step``). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

PARTS = ("encode_fwd", "similarity_fwd", "loss_fwd", "similarity_loss_bwd", "encoder_bwd", "optimizer")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-docs", type=int, default=11)
    parser.add_argument("--sentences", type=int, default=16)
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=12, help="mean tokens per sentence (range +-4)")
    parser.add_argument("--vocab", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 or 2 here)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--seed", type=int, default=0)
    retrieval = parser.add_argument_group("--retrieval-data: the coherence objectives' step")
    retrieval.add_argument("--retrieval-data", help="a pair dataset: time its objectives' steps instead")
    retrieval.add_argument("--objectives", default="cmca,cmcm", help="comma-separated (cmcm-c:RELATION)")
    retrieval.add_argument("--word-vectors", default="glove")
    retrieval.add_argument("--lambda-cls", type=float, default=0.1, help="the coherence loss's weight")
    retrieval.add_argument("--cam-hidden", type=int, default=0, help="the CAM's ReLU layer (0: linear)")
    return parser


def summarise(times: dict, whole: dict, config: dict) -> dict:
    """Medians, ratios to DC and the targets, as the printed JSON."""
    med = statistics.median
    objectives = {}
    for name, parts in times.items():
        totals = [sum(vals) for vals in zip(*parts.values())]
        sim = [parts["similarity_fwd"][i] + parts["similarity_loss_bwd"][i] for i in range(len(totals))]
        objectives[name] = {
            "step_ms": round(med(totals), 2),
            "whole_step_ms": round(med(whole[name]), 3),
            "parts_ms": {p: round(med(v), 2) for p, v in parts.items()},
            "similarity_share": round(med(a / t for a, t in zip(sim, totals)), 4),
            "similarity_fwd_share": round(med(a / t for a, t in zip(parts["similarity_fwd"], totals)), 4),
        }
    dc_step, dc_whole = objectives["dc"]["step_ms"], objectives["dc"]["whole_step_ms"]
    ratios = {name: round(o["step_ms"] / dc_step, 4) for name, o in objectives.items() if name != "dc"}
    whole_ratios = {
        name: round(o["whole_step_ms"] / dc_whole, 4) for name, o in objectives.items() if name != "dc"
    }
    out = {
        "config": config,
        "objectives": objectives,
        "step_ratio_to_dc": ratios,
        "whole_step_ratio_to_dc": whole_ratios,
        "targets": {
            "ap_step_le_1.15x_dc": all(ratios[f"ap-{m}"] <= 1.15 for m in ("full", "half")),
            "ap_whole_step_le_1.15x_dc": all(whole_ratios[f"ap-{m}"] <= 1.15 for m in ("full", "half")),
            "similarity_share_le_0.15": all(
                objectives[n]["similarity_share"] <= 0.15 for n in ("dc", "tk-full", "ap-full", "ap-half")
            ),
        },
    }
    return out


def make_inputs(args, rng, device):
    """The default model and one batch of random tokens and CNN features of the asked size."""
    import torch

    from training.model import ModelConfig, MulLink

    B, n_s, n_i = args.batch_docs, args.sentences, args.images
    cfg = ModelConfig(vocab_size=args.vocab, word_dim=50)  # the rest are the paper's defaults
    model = MulLink(cfg).to(device).train()
    lengths = torch.as_tensor(rng.integers(args.tokens - 4, args.tokens + 5, B * n_s))
    tokens = torch.as_tensor(rng.integers(1, args.vocab, (B * n_s, int(lengths.max()))))
    tokens[torch.arange(tokens.shape[1])[None, :] >= lengths[:, None]] = 0
    tokens = tokens.to(device)
    features = torch.as_tensor(rng.normal(size=(B * n_i, cfg.image_dim)), dtype=torch.float32).to(device)
    return cfg, model, tokens, lengths, features


def run_config(args, cfg, device) -> dict:
    """What was measured, and on what (recorded with the figures)."""
    import torch

    return {
        "batch_docs": args.batch_docs,
        "sentences": args.sentences,
        "images": args.images,
        "mean_tokens": args.tokens,
        "vocab": args.vocab,
        "model": cfg.to_dict(),
        "threads": args.threads,
        "device": str(device),
        "clock": args.clock,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def retrieval_steps(args) -> dict:
    """Median whole-step seconds of each coherence objective on one batch of the dataset's pairs,
    the objectives alternated round by round so that load drifts hit them alike."""
    import numpy as np
    import torch

    from schemas.manifest import Manifest
    from schemas.shards import read_table
    from training.config import TrainConfig
    from training.data import features_of, make_batch
    from training.retrieval.objective import build, model_config, model_loss
    from training.text import Vocabulary, embedding_matrix

    data, device = args.retrieval_data, torch.device(args.device)
    manifest = Manifest.read(data)
    paths = [str(p) for p in manifest.shard_paths(data, "train")]
    cols = ["doc_id", "sentences", "images", "links", "metadata"]
    train = read_table(paths, columns=cols).sort_by("doc_id")
    vocab = Vocabulary.build([x for d in train.column("sentences").to_pylist() for x in d], 5)
    emb, _ = embedding_matrix(vocab, args.word_vectors, seed=args.seed)
    feats = np.concatenate(features_of(train)[0])
    stats = (feats.mean(0), feats.std(0))
    batch = make_batch(train.slice(0, args.batch_docs), vocab, 20)
    batch.tokens, batch.features = batch.tokens.to(device), batch.features.to(device)
    runs = {}
    for obj in args.objectives.split(","):
        name, _, relation = obj.partition(":")
        cfg = TrainConfig(
            objective=name,
            relation=relation,
            data="-",
            seed=args.seed,
            lambda_cls=args.lambda_cls,
            cam_hidden=args.cam_hidden,
        )
        torch.manual_seed(args.seed)
        model = build(model_config(cfg, manifest, len(vocab), emb.shape[1], paths), emb, stats)
        model.to(device).train()
        runs[obj] = (cfg, model, torch.optim.Adam(model.parameters(), lr=1e-3), [])

    def step(cfg, model, opt):
        loss, _ = model_loss(model, batch, cfg)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()

    for r in range(args.warmup + args.repeats):
        for cfg, model, opt, times in runs.values() if r % 2 == 0 else list(runs.values())[::-1]:
            t = time.perf_counter()
            step(cfg, model, opt)
            if r >= args.warmup:
                times.append(time.perf_counter() - t)
    med = {obj: float(np.median(v[3])) for obj, v in runs.items()}
    out = {"dataset": manifest.dataset_version, "train_pairs": train.num_rows, "median_step_s": med}
    if "cmca" in med and "cmcm" in med:
        out["ratio_cmcm_over_cmca"] = med["cmcm"] / med["cmca"]
    return {**out, "config": vars(args), "torch": torch.__version__, "cpus": os.cpu_count()}


def main(argv: list[str] | None = None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    if args.retrieval_data:
        import torch

        torch.set_num_threads(args.threads)
        out = retrieval_steps(args)
        print(json.dumps(out, indent=1))
        return out

    import numpy as np
    import torch

    import training.link.similarity as similarity
    from training.data import pad_documents
    from training.link.loss import in_batch_loss

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    device = torch.device(args.device)

    if args.clock == "cpu" and device.type != "cpu":
        parser.error("--clock cpu measures host CPU time; use it with --device cpu")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    def sync() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        return clock()

    B, n_s, n_i = args.batch_docs, args.sentences, args.images
    cfg, model, tokens, lengths, features = make_inputs(args, rng, device)
    counts_s, counts_i = [n_s] * B, [n_i] * B

    ap = similarity.SIMILARITIES["ap"]  # AP as trained: on a CUDA device its Triton solver
    variants = {
        "dc": ("dc", "full", ap),
        "tk-full": ("tk", "full", ap),
        "ap-full": ("ap", "full", ap),
        "ap-half": ("ap", "half", ap),
    }
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    times: dict[str, dict[str, list[float]]] = {name: {p: [] for p in PARTS} for name in variants}
    whole: dict[str, list[float]] = {name: [] for name in variants}

    def step(name: str, split: bool = True) -> None:
        """One training step; ``split`` times its parts (a sync after each), else the whole step
        with one sync at its end (on a GPU the parts' syncs cost time of their own)."""
        kind, k_mode, ap_impl = variants[name]
        similarity.SIMILARITIES["ap"] = ap_impl  # document_similarity looks ap up at call time
        mark = sync if split else clock
        opt.zero_grad(set_to_none=True)
        t0 = sync()
        s, v = model.text(tokens, lengths), model.image(features, counts_i)
        t1 = mark()
        s_leaf, v_leaf = s.detach().requires_grad_(), v.detach().requires_grad_()
        s_pad, s_mask = pad_documents(s_leaf, counts_s)
        v_pad, v_mask = pad_documents(v_leaf, counts_i)
        doc_sims = similarity.document_similarity(kind, s_pad, s_mask, v_pad, v_mask, k_mode)
        t2 = mark()
        loss = in_batch_loss(doc_sims, 0.2, "hard")
        t3 = mark()
        loss.backward()
        t4 = mark()
        torch.autograd.backward([s, v], [s_leaf.grad, v_leaf.grad])
        t5 = mark()
        opt.step()
        t6 = sync()
        if split:
            for part, dt in zip(PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)):
                times[name][part].append(dt * 1e3)
        else:
            whole[name].append((t6 - t0) * 1e3)

    for _ in range(args.warmup):
        for name in variants:
            step(name)
    for name in times:
        for part in PARTS:
            times[name][part].clear()
    for _ in range(args.repeats):
        for name in variants:
            step(name)
            step(name, split=False)
    similarity.SIMILARITIES["ap"] = ap

    out = summarise(times, whole, run_config(args, cfg, device))
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
