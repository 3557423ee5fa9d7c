"""A self-contained HTML report of one evaluation: metrics against Random, the paper's Figure 3
curves, the per-document AUC histogram and Figure 4's document cards. Why images as data URIs:
the file attaches to MLflow and opens anywhere."""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path

import numpy as np

from training.backbone import DEFAULT_BACKBONE, needs_regions
from training.objectives.assignment import max_weight_matching

PREDICTED, TRUE, BOTH = "#d9480f", "#1971c2", "#2b8a3e"


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def learning_curve_png(history: list[dict]) -> str | None:
    epochs = [h["epoch"] for h in history]
    if not epochs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot(epochs, [h["val_loss"] for h in history], color=PREDICTED, marker="o", label="val loss")
    ax.set_xlabel("epoch")
    ax.set_ylabel("inter-document val loss", color=PREDICTED)
    ax2 = ax.twinx()
    ax2.plot(epochs, [h.get("val_auc") for h in history], color=TRUE, marker="s", label="val AUC")
    ax2.set_ylabel("intra-document val AUC", color=TRUE)
    signals = {"val_within": (BOTH, "within-document gap"), "val_structure": ("#862e9c", "link structure")}
    for key, (color, what) in signals.items():  # label-free (--select-by): x100 on the AUC axis
        if any(np.isfinite(h[key]) for h in history if h.get(key) is not None):  # NaN: not measured
            values = [100 * h[key] if h.get(key) is not None else None for h in history]
            ax2.plot(epochs, values, color=color, marker="^", label=f"{what} x100 (no labels)")
            ax2.legend(loc="lower right", fontsize=8)
    ax.set_title("Validation loss, link AUC and the label-free signals by epoch")
    return _png(fig)


def auc_histogram_png(per_doc: list[dict]) -> str | None:
    if not per_doc:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.0))
    ax.hist([100 * d["auc"] for d in per_doc], bins=20, range=(0, 100), color=TRUE)
    ax.axvline(50, color="gray", linestyle="--", linewidth=1)
    ax.set_xlabel("per-document AUC")
    ax.set_ylabel("documents")
    return _png(fig)


def thumbnail(uri: str, size: int = 96) -> str | None:
    """A data-URI thumbnail of a local image, or None when it cannot be read (URI elsewhere)."""
    from PIL import Image, UnidentifiedImageError

    path = uri[len("file://") :] if uri.startswith("file://") else uri
    try:
        img = Image.open(path)
        img.thumbnail((size, size))
        buf = io.BytesIO()
        img.convert("RGB").save(buf, format="JPEG", quality=80)
    except (OSError, UnidentifiedImageError):
        return None
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def document_card(
    doc_id: str,
    sentences: list[str],
    image_uris: list[str],
    scores: np.ndarray,
    links: list[tuple[int, int]] | None,
    auc: float | None,
) -> str:
    rows, cols = max_weight_matching(scores)
    predicted = {(int(r), int(c)): float(scores[r, c]) for r, c in zip(rows, cols, strict=True)}
    truth = set(links or [])
    thumbs = []
    for j, uri in enumerate(image_uris):
        src = thumbnail(uri)
        body = f'<img src="{src}" alt="image {j}">' if src else f"<div class=noimg>image {j}</div>"
        thumbs.append(f"<figure>{body}<figcaption>#{j}</figcaption></figure>")
    items = []
    for i, text in enumerate(sentences):
        marks = []
        for j in range(scores.shape[1]):
            p, t = (i, j) in predicted, (i, j) in truth
            if p or t:
                colour = BOTH if p and t else PREDICTED if p else TRUE
                label = f"#{j}" + (f" {predicted[(i, j)]:.2f}" if p else "") + ("" if p else " (true)")
                marks.append(f'<span class=link style="border-color:{colour};color:{colour}">{label}</span>')
        items.append(f"<li>{html.escape(text)} {' '.join(marks)}</li>")
    head = html.escape(doc_id) + (f" &middot; AUC {100 * auc:.1f}" if auc is not None else "")
    return (
        f"<section class=card><h3>{head}</h3><div class=thumbs>{''.join(thumbs)}</div>"
        f"<ol start=0>{''.join(items)}</ol></section>"
    )


CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}
th:first-child,td:first-child{text-align:left}.card{border:1px solid #ddd;border-radius:6px;
padding:8px 12px;margin:12px 0}.thumbs{display:flex;flex-wrap:wrap;gap:6px}figure{margin:0;
text-align:center;font-size:12px}img{border:1px solid #ccc}.noimg{width:96px;height:96px;
background:#eee}.link{border:1.5px solid;border-radius:4px;padding:0 4px;margin-left:4px;
font-size:12px}.legend span{margin-right:16px}
.warning{background:#fff3cd;border:1px solid #d39e00;padding:8px}
"""


def render_report(
    title: str,
    metrics: dict,
    random: dict,
    history: list[dict],
    per_doc: list[dict],
    cards: list[str],
    meta: dict[str, str],
    warnings: list[str] = (),
) -> str:
    def row(name, m):
        se = m.get("auc_se", float("nan"))  # the AUC's standard error over the documents
        known = isinstance(se, float) and math.isfinite(se)
        auc = f"{m['auc']:.1f}" + (f" &plusmn; {se:.2f}" if known else "")
        return (
            f"<tr><td>{html.escape(name)}</td><td>{auc}</td><td>{m['p_at_1']:.1f}</td>"
            f"<td>{m['p_at_5']:.1f}</td><td>{m['n_docs']}</td></tr>"
        )

    curve, hist = learning_curve_png(history), auc_histogram_png(per_doc)
    meta_rows = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>" for k, v in meta.items()
    )
    legend = (
        f'<p class=legend><span style="color:{PREDICTED}">predicted link (score)</span>'
        f'<span style="color:{TRUE}">true link missed</span>'
        f'<span style="color:{BOTH}">predicted and true</span></p>'
    )
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{CSS}</style></head><body>
<h1>{html.escape(title)}</h1>
<table>{meta_rows}</table>
{"".join(f"<p class=warning>warning: {html.escape(w)}</p>" for w in warnings)}
<h2>Test metrics (macro-averaged over documents, x100; AUC &plusmn; its standard error)</h2>
<table><tr><th>method</th><th>AUC</th><th>p@1</th><th>p@5</th><th>documents</th></tr>
{row("model", metrics)}{row("Random", random)}</table>
<h2>Learning curves</h2>{f'<img src="{curve}" alt="learning curves">' if curve else "<p>no history</p>"}
<h2>Per-document AUC</h2>{f'<img src="{hist}" alt="AUC histogram">' if hist else "<p>no documents</p>"}
<h2>Documents</h2>{legend}{"".join(cards)}
</body></html>"""


def write_report(path: str | Path, html_text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html_text, encoding="utf-8")
    return path


def document_cards(
    model, vocab, paths: list, max_tokens: int, per_doc: list[dict], limit: int = 8
) -> list[str]:
    """Cards for the best and worst documents by AUC (half each), as the paper shows both, from
    the split's shards (``paths``)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import torch

    from schemas.shards import iter_tables
    from training.data import link_scores, make_batch

    by_auc = sorted(per_doc, key=lambda d: d["auc"])
    chosen = {d["doc_id"]: d["auc"] for d in by_auc[-(limit - limit // 2) :] + by_auc[: limit // 2]}
    # the chosen few rows, kept batch by batch: the split itself is never read whole
    wanted = pa.array(sorted(chosen), pa.string())
    parts = [
        t.filter(pc.is_in(t.column("doc_id"), value_set=wanted))
        for t in iter_tables(paths, 1024, ["doc_id", "sentences", "images", "links"])
    ]
    parts = [t for t in parts if t.num_rows]
    if not parts:
        return []
    table = pa.concat_tables(parts).sort_by("doc_id")
    batch = make_batch(
        table,
        vocab,
        max_tokens,
        regions=needs_regions({"backbone": getattr(model.cfg, "backbone", DEFAULT_BACKBONE)}),
    )
    with torch.no_grad():
        scores = link_scores(model.eval(), batch)
    cards = []
    for row, s in zip(table.to_pylist(), scores, strict=True):
        links = None if row["links"] is None else [(lk["sentence"], lk["image"]) for lk in row["links"]]
        uris = [im["uri"] for im in row["images"]]
        cards.append(document_card(row["doc_id"], row["sentences"], uris, s, links, chosen[row["doc_id"]]))
    return cards


def _json_artifact(run_id: str, path: str, tracking_uri: str, tmp: str):
    import json

    import mlflow

    local = mlflow.artifacts.download_artifacts(
        run_id=run_id, artifact_path=path, dst_path=tmp, tracking_uri=tracking_uri
    )
    return json.loads(Path(local).read_text())


def report_for_run(tracking_uri: str, run_ref: str, data: str | None = None) -> tuple[str, str]:
    """Render the report of a finished run from what it logged; returns (run_id, html).

    ``run_ref`` is a run id or a model URI (``models:/name@alias``, ``models:/name/3``). The
    document cards need the registered model; MLflow 3 keeps logged models apart from run
    artifacts, so it is loaded through the registry.
    """
    import tempfile

    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from schemas.errors import MmlinksError

    client = MlflowClient(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    try:
        if run_ref.startswith("models:/"):
            name, _, alias = run_ref[len("models:/") :].partition("@")
            if alias:
                version = client.get_model_version_by_alias(name, alias)
            else:
                name, _, num = run_ref[len("models:/") :].partition("/")
                version = client.get_model_version(name, num)
        else:
            versions = client.search_model_versions(f"run_id = '{run_ref}'")
            if not versions:
                raise MmlinksError(f"run {run_ref} registered no model to draw document cards with")
            version = versions[0]
        run_id = version.run_id
        run = client.get_run(run_id)
        with tempfile.TemporaryDirectory() as tmp:
            history = _json_artifact(run_id, "training_history.json", tracking_uri, tmp)["history"]
            per_doc = _json_artifact(run_id, "test_per_document.json", tracking_uri, tmp)
        linker = mlflow.pyfunc.load_model(f"models:/{version.name}/{version.version}").unwrap_python_model()
    except (MlflowException, OSError, KeyError, ValueError) as exc:  # ValueError: corrupt JSON
        raise MmlinksError(f"cannot build a report for {run_ref}: {exc}") from exc
    m, p = run.data.metrics, run.data.params
    keys = ("auc", "p_at_1", "p_at_5", "n_docs", "auc_se")
    metrics = {k: m.get(f"test_{k}", float("nan")) for k in keys}
    rand = {k: m.get(f"random_{k}", float("nan")) for k in keys}
    data = data or p.get("data")
    try:
        cards = []
        if data:
            from schemas.manifest import Manifest

            test_paths = Manifest.read(data).shard_paths(data, "test")
            cards = document_cards(linker.model, linker.vocab, test_paths, linker.max_tokens, per_doc)
    except (OSError, ValueError) as exc:  # the dataset moved or changed since the run
        raise MmlinksError(f"cannot draw document cards from {data}: {exc}") from exc
    info = {
        "run": run_id,
        "model": f"{version.name} version {version.version}",
        "objective": f"{p.get('similarity')} k={p.get('k')} negatives={p.get('negatives')}",
        "dataset": f"{p.get('dataset_source')} {p.get('dataset_version')}",
        "features": p.get("feature_extractor", "?"),
        "best epoch": str(int(m.get("best_epoch", -1))),
    }
    title = f"mmlinks evaluation: {run.info.run_name}"
    return run_id, render_report(title, metrics, rand, history, per_doc, cards, info)
