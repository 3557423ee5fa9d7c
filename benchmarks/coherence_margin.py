"""Coherence retrieval (issue #17): a feature-level synthetic setting meant to favour CMCM, and
one CMCA vs CMCM (+ refinement) comparison on it. One JSON object on stdout.

Why a feature-level corpus: the rendered corpus (``mmlinks data synth-coherence``) needs a Beam
build through the CNN (minutes per thousand images on the shared 2 cores), which left no room to
try settings. Here the pair dataset is written directly (real shards and manifest, relations in
the vocabulary, as a build writes them) with image "features" whose structure is set exactly:

- ``--objects`` objects (a colour word x a shape word), each in two states, the relation
  ``Visible`` (result) or ``Action`` (in progress); image feature = the object's random vector +
  ``--state-scale`` x (+-1) x one shared state direction + Gaussian noise (``--noise``);
- text = "<colour> <shape> <cue>", the cue one of ``--cue-words`` words of its state.

The retrieval loss sees the state only when the same object in the other state is in the batch
(about batch / (2 x objects) of the negatives), while the relation label names it on every pair;
a pool of 500 holds about 500 / (2 x objects) images of the query's object in the other state,
which only the state separates. So R@1 (not MedR, which stays small) is where a difference shows.

Where the relation carries what retrieval alone cannot use (``--confound 1.0``): every object
appears in ONE state in training (odd objects in progress, even ones as results), both states
in validation and test. Training pairs are then told apart by the object alone, so the
retrieval loss never needs the (weak: ``--state-scale 0.3``) state and CMCA learns to ignore it;
the relation label still names the state on every training pair, so CMCM's coherence loss
makes both encoders carry it, and the positive pairs (whose states always agree) align the two
sides. At test, a pool of 500 holds ~12 images of the query's object in each state: a model
that matches the state ranks among ~12 (MedR ~7, R@10 ~80), one that does not among ~25
(MedR ~13, R@10 ~40). With ``--confound 0.5`` (the default; no confound) both models learn the
state from the in-batch negatives and reach that ceiling together (docs/benchmarks.md).

    PYTHONPATH=. python benchmarks/coherence_margin.py --workdir /tmp/cohd --objects 20 \
        --confound 1.0 --state-scale 0.3 --cue-words 10 --train 1000 --epochs 8

Training is ``benchmarks/retrieval_step.py``'s train mode (the library's model, loss, validation
MedR, refinement tuned on validation, test metrics), random word vectors, one seed::

    PYTHONPATH=. python benchmarks/coherence_margin.py --workdir /tmp/cohm --epochs 8
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

COLOURS = ("red", "blue", "green", "yellow", "purple", "orange", "black", "white", "pink", "brown")
SHAPES = ("circle", "square", "star", "ring", "cross", "heart", "moon", "arrow", "kite", "drop")
RELATIONS = ["Visible", "Action"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--objects", type=int, default=100, help="colour x shape objects (<= 100)")
    p.add_argument("--train", type=int, default=1500)
    p.add_argument("--val", type=int, default=300)
    p.add_argument("--test", type=int, default=500)
    p.add_argument("--dim", type=int, default=32, help="image feature width")
    p.add_argument("--state-scale", type=float, default=1.0)
    p.add_argument("--noise", type=float, default=0.3)
    p.add_argument("--cue-words", type=int, default=3)
    p.add_argument(
        "--confound",
        type=float,
        default=0.5,
        help="share of an object's training pairs in its usual state (0.5: none; validation and test "
        "stay 50/50): above 0.5 the object name predicts the state in training, so retrieval can "
        "match training pairs by object alone, while the relation label still names the state",
    )
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cam-hidden", type=int, default=0, help="CMCM's CAM with a ReLU layer of this width")
    p.add_argument("--lambda-cls", type=float, default=0.1, help="weight of CMCM's coherence loss")
    return p.parse_args(argv)


def write_dataset(args, out: Path) -> Path:
    """The pair dataset: one shard per split, a manifest with the relation vocabulary."""
    from schemas.document import SCHEMA_VERSION, Document, ImageRecord
    from schemas.manifest import FeatureExtractorInfo, Manifest, ShardInfo
    from schemas.shards import write_shard

    rng = np.random.default_rng(args.seed)
    objects = [(c, s) for c in COLOURS for s in SHAPES][: args.objects]
    obj_vec = rng.normal(size=(len(objects), args.dim))
    state_dir = rng.normal(size=args.dim)
    state_dir /= np.linalg.norm(state_dir) / np.sqrt(args.dim)  # per-dimension scale ~1
    cues = {rel: [f"{rel.lower()}cue{k}" for k in range(args.cue_words)] for rel in RELATIONS}
    shards, n = [], 0
    for split, count in (("train", args.train), ("val", args.val), ("test", args.test)):
        docs = []
        usual = args.confound if split == "train" else 0.5
        for _ in range(count):
            o = int(rng.integers(len(objects)))
            if usual == 0.5:  # the draw of the unconfounded corpus (its earlier figures reproduce)
                action = bool(rng.integers(2))
            else:
                action = bool(o % 2) if rng.random() < usual else not bool(o % 2)
            rel = RELATIONS[int(action)]
            f = obj_vec[o] + args.state_scale * (1 if action else -1) * state_dir
            f = f + args.noise * rng.normal(size=args.dim)
            colour, shape = objects[o]
            text = f"{colour} {shape} {rng.choice(cues[rel])}"
            docs.append(
                Document(
                    doc_id=f"{split}-{n:06d}",
                    source="synthetic",
                    split=split,
                    sentences=[text],
                    images=[ImageRecord(f"img{n}", f"mem://{n}", 64, 64, n, f.astype(np.float32).tolist())],
                    links=[(0, 0)],
                    metadata={"relations": rel},
                )
            )
            n += 1
        rel_path = f"shards/{split}-00000.parquet"
        rows, size, sha = write_shard(out / rel_path, docs)
        shards.append(ShardInfo(rel_path, split, rows, size, sha))
    counts = {"splits": {s.split: s.rows for s in shards}, "dropped": {}}
    extractor = FeatureExtractorInfo("synthetic-features", "v1", args.dim)
    Manifest(
        SCHEMA_VERSION, f"cohm-{args.seed}", "synthetic", counts, extractor, shards, relations=RELATIONS
    ).write(out)
    return out


def main(argv=None) -> None:
    import retrieval_step
    import torch

    args = parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    data = write_dataset(args, Path(args.workdir) / "ds")
    flags = ["--data", str(data), "--mode", "train", "--word-vectors", "random", "--objectives", "cmca,cmcm"]
    flags += ["--epochs", str(args.epochs), "--batch", str(args.batch), "--lr", str(args.lr)]
    flags += ["--cam-hidden", str(args.cam_hidden), "--lambda-cls", str(args.lambda_cls)]
    targs = retrieval_step.parse_args([*flags, "--seed", str(args.seed)])
    loaded = retrieval_step.load(str(data), "random", args.seed)
    results = retrieval_step.train_mode(targs, *loaded)
    summary = {}
    for obj, r in results.items():
        test = r["test"]
        row = {k: test["t2i"][k] for k in ("medr", "r1", "r5", "r10")}
        row["best_epoch"], row["train_s"] = r["best_epoch"], round(r["train_s"], 1)
        for key in ("t2i_refined", "t2i_refined_tuned"):
            if key in test:
                keep = ("medr", "r1", "r5", "r10", "refine_lambda", "refine_threshold")
                row[key] = {k: test[key][k] for k in keep if k in test[key]}
        summary[obj] = row
    out = {
        "benchmark": "coherence_margin",
        "settings": vars(args),
        "summary": summary,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
