"""The HTML evaluation report: content, re-rendering from a run, and a real headless-Chromium render."""

import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from tests.conftest import missing_tool
from training.report import document_card, learning_curve_png, render_report


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        missing_tool("chromium is not installed; .ci/run installs it")
    return exe


def screenshot(html_path, png_path, height=2400):
    proc = subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={png_path.parent / 'chrome-profile'}",
            f"--window-size=1200,{height}",
            f"--screenshot={png_path}",
            html_path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert png_path.exists(), proc.stderr[-2000:]
    return Image.open(png_path).convert("RGB")


def test_document_card_marks_predicted_true_and_both():
    scores = np.array([[0.9, 0.1], [0.2, 0.8], [0.3, 0.4]])
    card = document_card(
        "d1",
        ["a red star", "a blue ring", "thanks <b>all</b>"],
        ["/nope/0.png", "/nope/1.png"],
        scores,
        [(0, 0), (2, 1)],
        0.75,
    )
    assert "AUC 75.0" in card
    assert "#0 0.90" in card  # predicted and true
    assert "#1 (true)" in card  # true link the model missed
    assert "#1 0.80" in card  # predicted, not true
    assert "&lt;b&gt;all&lt;/b&gt;" in card  # text is escaped
    assert card.count("class=noimg") == 2  # unreadable images get a placeholder, not a crash


def test_a_flat_within_document_signal_shows_as_a_warning_with_its_curve():
    m = {"auc": 51.0, "p_at_1": 14.0, "p_at_5": 18.0, "n_docs": 3}
    history = [{"epoch": e, "val_loss": 0.4, "val_auc": 50.0, "val_within": 0.01} for e in range(3)]
    page = render_report("t", m, m, history, [], [], {}, ["the within-document signal stayed <flat>"])
    assert "<p class=warning>warning: the within-document signal stayed &lt;flat&gt;</p>" in page
    assert "data:image/png;base64," in page  # the curve, with the gap, rendered
    assert "class=warning" not in render_report("t", m, m, history, [], [], {})
    # the AUC with its standard error where the summary has one (none here: no `auc_se`)
    assert "<td>51.0 &plusmn; 0.25</td>" in render_report("t", {**m, "auc_se": 0.251}, m, history, [], [], {})
    assert "&plusmn; nan" not in page and "<td>51.0</td>" in page
    # the link structure (--select-by val_structure's signal) is drawn where it was logged
    structure = [{**h, "val_structure": 0.1 * h["epoch"]} for h in history]
    assert learning_curve_png(history) == learning_curve_png(history) != learning_curve_png(structure)


@pytest.mark.slow
def test_report_renders_in_headless_chromium(trained, dataset, tmp_path):
    from schemas.manifest import Manifest
    from training.evaluate import evaluate
    from training.report import document_cards

    scores = evaluate(trained.model, trained.vocab, dataset)
    test_paths = Manifest.read(dataset).shard_paths(dataset, "test")
    cards = document_cards(trained.model, trained.vocab, test_paths, 20, scores["per_doc"], limit=4)
    assert 1 <= len(cards) <= 4
    html = render_report(
        "test report",
        scores["model"],
        scores["random"],
        trained.history,
        scores["per_doc"],
        cards,
        {"run": "r1"},
    )
    assert html.count("data:image/png;base64") == 2  # learning curves + histogram
    assert html.count("data:image/jpeg;base64") >= 3  # thumbnails of real images
    path = tmp_path / "report.html"
    path.write_text(html)
    img = np.asarray(screenshot(path, tmp_path / "report.png"))
    assert img.shape[0] >= 1000
    non_white = (img < 240).any(axis=2).mean()
    assert 0.02 < non_white < 0.9, non_white  # text, charts and thumbnails were drawn
