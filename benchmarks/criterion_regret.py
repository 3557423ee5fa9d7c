"""The image side's label-free criterion against the trials' own labels (issue #60): regret.

Per cell and seed (``benchmarks/link_family.py``'s cells, corpora and settings), the choice of
``--image-centring auto`` runs here, its trials in this process, and each candidate's last trial
scores the validation split: its labelled AUC, which the criterion stands in for, and the
criterion, as shipped (``link_structure``), in the double-centred cells' units alone (before
issue #60's offsets fix) and ``consensus`` (each candidate against the links the others agree
on). All read the same trials (the rounds the shipped one ran; ``--trial-share 1``: every
candidate trained for the run's epochs). ``--trials`` keeps the trials' scores, so that a
criterion changed here re-reads them without training. Prints one
JSON object: per corpus each candidate's validation AUC and criterion means, each criterion's pick
and regret (the best candidate's AUC less the pick's); per criterion the mean and max regret and
the corpora above 1 AUC. docs/benchmarks-linking-criteria.md holds the figures and the commands.

    python benchmarks/criterion_regret.py --cells topic+document:40:added:4.1:looks=2:share=0.5 --seeds 0,1
    python benchmarks/criterion_regret.py --cells ... --trials /tmp/trials   # again: no training
"""

from __future__ import annotations

import argparse
import json
import logging
import pickle
import sys
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import link_family  # the cells, corpora and settings of the family (beside this script, on its path)


def trial_scores(data: str, seed: int, share: float | None = None) -> dict[str, list]:
    """{candidate: [(scores, links)] of its last trial, per validation document (<= VAL_DOCS)};
    ``share``: the trials' share of the run's epochs in place of the choice's own."""
    from training.config import TrainConfig
    from training.driver import check_trainable, train_trial
    from training.link import image_side
    from training.run_inputs import read_inputs

    inp = check_trainable(read_inputs(TrainConfig(data=data, seed=seed, **link_family.BASE)))
    models = {}

    def trial(cfg, limit, folder, stop):  # the choice's own first-round trial (its folder: the candidate)
        name = Path(folder).name
        if name not in models:  # the finalists' second round is what --designs reads in full: not trained
            models[name] = train_trial(inp, cfg, limit, folder, stop)
        return models[name]

    shipped_share = image_side.TRIAL_SHARE
    image_side.TRIAL_SHARE = share or shipped_share
    try:
        image_side.choose(inp.cfg, inp.train_paths, inp.val_paths, trial, jobs=1)
    finally:
        image_side.TRIAL_SHARE = shipped_share
    max_tokens = inp.cfg.max_tokens
    return {n: image_side.validation_scores(m, v, inp.val_paths, max_tokens) for n, (m, v) in models.items()}


# What the cached trials were trained with: the choice's settings and what its first round is. A
# pickle written under other ones (before 4cfa465 the cache held the choice's last round) is stale.
TRIALS_FORMAT = "first-round-1"


def trials_fingerprint() -> dict:
    from training.link import image_side

    names = ("TRIAL_DOCS", "TRIAL_SHARE", "TRIAL_MIN_EPOCHS", "VAL_DOCS")  # its choice has no keep
    return {
        "format": TRIALS_FORMAT,
        "base": link_family.BASE,
        "candidates": image_side.CANDIDATES,
        **{n.lower(): getattr(image_side, n) for n in names},
    }


def cached_trials(folder: str | None, key: str, train) -> dict[str, list]:
    """``train()``'s trial scores, read from ``folder``/``key``.pkl where an earlier run left them
    under the same settings (``trials_fingerprint``; then written there); a stale or unreadable
    pickle is trained again, said on stderr; no folder: trained every time."""
    if folder is None:
        return train()
    path = Path(folder) / f"{key}.pkl"
    if path.exists():
        try:
            cached = pickle.loads(path.read_bytes())
        except Exception as exc:  # a pickle of other code, or cut short: trained again
            cached, why = None, f"unreadable ({type(exc).__name__})"
        else:
            why = "written under other settings"
        if isinstance(cached, dict) and cached.get("fingerprint") == trials_fingerprint():
            return cached["trials"]
        print(f"criterion_regret: {path} {why}: training its trials again", file=sys.stderr, flush=True)
    kept = train()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps({"fingerprint": trials_fingerprint(), "trials": kept}))
    tmp.replace(path)  # whole or absent: a killed run leaves no half pickle to read
    return kept


def centred_units(scores, rng) -> float | None:
    """``link_structure`` before the offsets' dilution: undone by its factor (the same draws)."""
    from training.link.image_side import CRITERION_SHUFFLES
    from training.metrics import link_structure

    value = link_structure(scores, rng, CRITERION_SHUFFLES)
    s = np.asarray(scores, dtype=np.float64)
    centred = (s - s.mean(0) - s.mean(1, keepdims=True) + s.mean()).std()
    return value * s.std() / centred if value is not None and centred > 1e-12 else value


def shipped(scores, rng) -> float | None:
    from training.link.image_side import CRITERION_SHUFFLES
    from training.metrics import link_structure

    return link_structure(scores, rng, CRITERION_SHUFFLES)


def consensus(kept: dict[str, list]) -> dict[str, list[float | None]]:
    """Each candidate's within-document AUC (less 0.5) against the links the other candidates agree on.

    Per document, the others' double-centred scores, each in its own spread's units, are averaged
    and their maximum-weight matching taken as links; the candidate's raw scores (offsets and
    all, as the labelled AUC reads them) are ranked against them. Leave-one-out, so a candidate
    scoring at random lands at 0 whatever the others agree on (its own matching would reward
    it for agreeing with itself). Scores every candidate jointly: not a per-model criterion the
    trials could compute on their own. None where ``link_structure`` has none."""
    from training.metrics import STRUCTURE_MIN_SIDE, roc_auc
    from training.objectives.assignment import max_weight_matching

    names = list(kept)
    out: dict[str, list[float | None]] = {n: [] for n in names}
    for docs in zip(*(kept[n] for n in names), strict=True):
        raw = [np.asarray(s, dtype=np.float64) for s, _ in docs]
        if min(raw[0].shape) < STRUCTURE_MIN_SIDE or not all(np.isfinite(x).all() for x in raw):
            for n in names:
                out[n].append(None)
            continue
        z = []
        for x in raw:
            c = x - x.mean(0) - x.mean(1, keepdims=True) + x.mean()
            sd = c.std()
            z.append(c / sd if sd > 1e-12 else np.zeros_like(c))
        for i, n in enumerate(names):
            agreed = np.mean([zj for j, zj in enumerate(z) if j != i], axis=0)
            links = np.zeros(agreed.shape, dtype=bool)
            links[max_weight_matching(agreed)] = True
            out[n].append(roc_auc(raw[i], links) - 0.5)
    return out


CRITERIA = {"shipped": shipped, "centred_units": centred_units}
JOINT = {"consensus": consensus}  # criteria that read every candidate's scores at once


def labelled_auc(kept: dict[str, list]) -> dict[str, float]:
    """Each candidate's macro validation AUC (x100) by the links the criteria do not read."""
    from training.metrics import document_metrics

    auc = {}
    for name, rows in kept.items():
        docs = [document_metrics(str(i), s, links) for i, (s, links) in enumerate(rows)]
        labelled = [d.auc for d in docs if d is not None]
        if not labelled:  # no validation document with a link and a non-link: nothing to regret
            raise SystemExit(f"criterion_regret: candidate {name} scored no labelled validation document")
        auc[name] = 100 * float(np.mean(labelled))
    return auc


def criterion_values(kept: dict[str, list], seed: int, fn=shipped) -> dict[str, list[float | None]]:
    """Each candidate's per-document values of the per-model criterion ``fn``."""
    per = {}
    for n, rows in kept.items():
        rng = np.random.default_rng(seed)  # a generator per candidate, seeded as the choice seeds it
        per[n] = [fn(s, rng) for s, _ in rows]
    return per


def designs(trials: dict[str, list], full: dict[str, list], seed: int) -> dict:
    """How ways of choosing would fare, read on one corpus's candidates trained briefly (``trials``,
    the choice's own rounds) and for the run's epochs (``full``): each design's pick and its regret
    against the best candidate in full (labelled validation AUC). ``today``: the choice up to
    0717774, the shipped criterion on the trials (the bag on top: the second round, in full);
    ``top2_shipped``: the choice since (``image_side.choose``), the trials' two best by the shipped
    criterion (``finalists_of``; all where none links on the trials; the bag too where neither links in
    full), continued to the run's length and read there by it; ``top2_consensus``
    and ``all_consensus``: those two, or every candidate, in full by ``consensus`` (the bag where no
    candidate's shipped value beats chance)."""
    from training.link.image_side import beats_chance, finalists_of, needs_floor, pick

    auc = labelled_auc(full)
    brief, ended = criterion_values(trials, seed), criterion_values(full, seed)
    today = pick(brief).name
    if today == "bag":  # the choice never takes the bag on its first round: the candidates in full decide
        today = pick(ended).name
    top2 = finalists_of(brief)  # every candidate where none links on the trials
    # the chance test reads only the candidates a design trains in full
    top2_links, all_link = any(beats_chance(ended[k]) for k in top2), any(map(beats_chance, ended.values()))
    finals = {k: ended[k] for k in top2}
    if needs_floor(finals):  # the choice's floor: the bag too
        finals["bag"] = ended["bag"]
    picks = {
        "today": today,
        "top2_shipped": pick(finals).name,
        "top2_consensus": pick(consensus({k: full[k] for k in top2})).name if top2_links else "bag",
        "all_consensus": pick(consensus(full)).name if all_link else "bag",
    }
    best = max(auc.values())
    return {"top2": top2, **{d: {"pick": n, "regret": round(best - auc[n], 1)} for d, n in picks.items()}}


def regret(kept: dict[str, list], seed: int) -> dict:
    """Each candidate's validation AUC; per criterion its means, pick and regret."""
    from training.link.image_side import mean_score, pick

    auc = labelled_auc(kept)
    out: dict = {"auc": {k: round(v, 1) for k, v in auc.items()}}
    for crit in [*CRITERIA, *JOINT]:
        per = JOINT[crit](kept) if crit in JOINT else criterion_values(kept, seed, CRITERIA[crit])
        chosen = pick(per).name
        means = {n: mean_score(v) for n, v in per.items()}
        out[crit] = {
            "pick": chosen,
            "regret": round(max(auc.values()) - auc[chosen], 1),
            "means": {n: None if m is None else round(m, 3) for n, m in means.items()},
        }
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", required=True, help="comma-separated cells (link_family.py syntax)")
    p.add_argument("--seeds", default="0", help="seeds: corpus and training")
    p.add_argument("--docs", type=int, default=1500, help="training documents (val and test: a tenth)")
    p.add_argument("--dim", type=int, default=256, help="feature width of the corpora")
    p.add_argument("--corpora", default="/tmp/mmlinks-link-family", help="folder caching the corpora")
    p.add_argument(
        "--trial-share",
        type=float,
        help="the trials' share of the run's epochs (the choice's TRIAL_SHARE; 1: every candidate trained "
        "in full, so a criterion reads the models a run would end with)",
    )
    p.add_argument(
        "--designs",
        action="store_true",
        help="also train every candidate in full and compare ways of choosing (designs(): today's, the "
        "trials' top two continued, consensus) by their regret in full",
    )
    p.add_argument(
        "--trials",
        help="folder caching each corpus's trial scores (a pickle per cell and seed): a second run re-scores "
        "them without training, so criteria compare on the same trials",
    )
    args = p.parse_args(argv)
    cells, seeds = [c for c in args.cells.split(",") if c], [int(s) for s in args.seeds.split(",") if s]
    if not cells or not seeds:
        p.error("--cells and --seeds must each name at least one")
    if args.trial_share is not None and not 0 < args.trial_share <= 1:
        p.error("--trial-share must be in (0, 1]")
    if args.designs and args.trial_share is not None:
        p.error("--designs reads the choice's own trials and the candidates in full: no --trial-share")
    logging.disable(logging.WARNING)
    sizes = link_family.corpus_sizes(args.docs, args.dim)
    Path(args.corpora).mkdir(parents=True, exist_ok=True)
    out: dict = {"base": link_family.BASE, "sizes": sizes, "corpora": []}
    for seed in seeds:
        for cell in cells:
            data, _ = link_family.make_corpus(Path(args.corpora), cell, sizes, seed)
            key = Path(data).name + (f"-share{args.trial_share:g}" if args.trial_share else "")
            kept = cached_trials(args.trials, key, partial(trial_scores, data, seed, args.trial_share))
            out["corpora"].append({"cell": cell, "seed": seed, **regret(kept, seed)})
            if args.designs:
                full = cached_trials(
                    args.trials, f"{Path(data).name}-share1", partial(trial_scores, data, seed, 1.0)
                )
                out["corpora"][-1]["designs"] = designs(kept, full, seed)
            print(json.dumps(out["corpora"][-1]), file=sys.stderr, flush=True)
    for crit in [*CRITERIA, *JOINT]:
        r = np.array([c[crit]["regret"] for c in out["corpora"]])
        out[crit] = {"mean_regret": round(float(r.mean()), 2), "max_regret": float(r.max())}
        out[crit]["above_1"] = int((r > 1).sum())
    for design in ("today", "top2_shipped", "top2_consensus", "all_consensus") if args.designs else ():
        r = np.array([c["designs"][design]["regret"] for c in out["corpora"]])
        out[design] = {"mean_regret": round(float(r.mean()), 2), "max_regret": float(r.max())}
        out[design]["above_1"] = int((r > 1).sum())
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
