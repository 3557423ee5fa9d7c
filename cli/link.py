"""`mmlinks link`: a registered model over every document of a dataset (or raw documents), as a
Beam job writing versioned link shards; its flags are generated from ``LinkConfig``."""

from __future__ import annotations

import sys
from pathlib import Path

from cli.common import EPILOG, add_beam_args, add_common, beam_args_of, existing_dir, writable_dir
from schemas import config_fields
from schemas.errors import MmlinksError

LINK_LOG = "link.log"


def add_parsers(sub) -> None:
    from linking.config import LinkConfig

    link = sub.add_parser(
        "link",
        help="link the sentences and images of every document with a registered model (Beam)",
        description="Score every document of a built dataset (--data) or of raw documents "
        "(--input, --source: read and featurised by the build's own stages) with an MLflow model, "
        "predict its links (one-to-one matching, or each image's best sentence) and write one "
        "Parquet row per document to OUT/versions/<link_version>/ with OUT/manifest.json last. "
        "Documents that cannot be linked (empty, too large, wrong feature width) go to the dead "
        "letter with a reason. --eval compares the links with the ground truth where there is one.",
        epilog=EPILOG,
    )
    config_fields.add_arguments(link, LinkConfig)
    add_beam_args(link)
    add_common(link)
    link.set_defaults(func=cmd_link, show=show_link)


def cmd_link(args) -> dict:
    from linking.config import LinkConfig
    from linking.job import link_documents

    data, raw = getattr(args, "data", None), getattr(args, "input", None)  # absent when not given
    if data is not None:
        existing_dir(data)
    if raw is not None and "://" not in raw and not Path(raw).exists():
        raise MmlinksError(f"--input {raw} does not exist")
    writable_dir(args.out)
    cfg = config_fields.from_args(LinkConfig, args, beam_args=beam_args_of(args))
    where = cfg.data if cfg.data is not None else f"{cfg.input} ({cfg.source})"
    # Beam's workers log INFO/WARNING lines by the dozen: to WORKDIR/link.log (the last link
    # job's), as the build sends them to its build.log; --debug leaves them on the terminal
    log_path = None if args.debug else Path(cfg.workdir) / LINK_LOG
    shown = f" (library logs: {log_path})" if log_path else ""
    print(f"linking {where} with {cfg.model} ({cfg.runner}) -> {cfg.out}{shown}", file=sys.stderr)
    from cli.output import heartbeat
    from schemas.library_output import library_output_to

    with library_output_to(log_path), heartbeat("beam link"):
        result = link_documents(cfg)
    return result.summary()


def show_link(r: dict) -> None:
    from cli.output import table

    m = r["model"]
    print(f"model: {m['uri']} -> {m['name'] or m['run_id']} version {m['version'] or '-'}")
    print(
        f"{r['documents_linked']} of {r['documents_read']} documents linked, "
        f"{r['documents_dead_lettered']} dead-lettered; {r['images_linked']} of {r['images']} images "
        f"linked ({100 * r['link_rate']:.1f}%) in {r['seconds']:.1f} s ({r['docs_per_s']} docs/s)"
    )
    for reason, n in r["dropped"].items():
        print(f"  dropped {reason}: {n}")
    ev = r.get("evaluation")
    if ev:

        def cell(v) -> str:
            return "-" if v is None else f"{v:.1f}"

        links, scores = ev["links"], ev["scores"]
        print(f"evaluation on {ev['labelled_documents']} labelled documents:")
        rows = [["links", cell(links["precision"]), cell(links["recall"]), cell(links["f1"])]]
        print(table(rows, ["", "precision", "recall", "F1"]))
        rows = [["scores", cell(scores["auc"]), cell(scores["p_at_1"]), cell(scores["p_at_5"])]]
        print(table(rows, ["", "AUC", "p@1", "p@5"]))
    print(f"manifest: {r['manifest']}   link version: {r['link_version']}")
