"""The installed ``mmlinks`` console script, run as a user runs it."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas.document import SCHEMA_VERSION

MMLINKS = shutil.which("mmlinks", path=str(Path(sys.executable).parent)) or "mmlinks"


def run(*args, timeout=300):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.run([MMLINKS, *args], capture_output=True, text=True, timeout=timeout, env=env)


def run_here(capfd, *args) -> subprocess.CompletedProcess:
    """``mmlinks ARGS`` in this process, its stdout and stderr captured at the file descriptors.

    A fresh ``mmlinks`` process pays ~6 CPU-s of imports (torch, Beam) before a late error; the
    tests below that check the same path once more run it here. What only a fresh process can
    show (a library's import-time noise on the terminal) stays with the ``run`` tests."""
    from cli.main import main

    capfd.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(list(args), code, out, err)


@pytest.mark.parametrize(
    "cmd",
    [
        [],
        ["demo"],
        ["data"],
        ["data", "synth"],
        ["data", "build"],
        ["data", "inspect"],
        ["data", "migrate"],
        ["data", "sources"],
        ["data", "crawl"],
        ["data", "import-hessel"],
        ["train"],
    ],
)
def test_every_command_has_help(cmd):
    proc = run(*cmd, "--help")
    assert proc.returncode == 0
    assert "usage: mmlinks" in proc.stdout
    assert "--json" in proc.stdout or cmd in ([], ["data"])


def test_synth_json_output_is_one_object(tmp_path):
    proc = run("data", "synth", "--out", str(tmp_path / "c"), "--docs", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["documents"] == 3
    assert len((tmp_path / "c" / "documents.jsonl").read_text().splitlines()) == 3


@pytest.mark.parametrize(
    "args",
    [
        ["data", "inspect", "/nonexistent/ds", "--json"],
        ["data", "build", "--source", "synthetic", "--input", "/nonexistent/raw", "--out", "OUT", "--json"],
        ["link", "--data", "/nonexistent/ds", "--model", "models:/m@production", "--out", "OUT", "--json"],
    ],
    ids=["inspect", "build", "link"],
)
def test_a_failure_with_json_prints_one_error_object(capfd, tmp_path, args):
    """``--json`` promises one JSON object on stdout, a failure's too (issue #62)."""
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    proc = run_here(capfd, *args)
    assert proc.returncode == 2
    out = json.loads(proc.stdout)
    assert out["exit_code"] == 2 and "nonexistent" in out["error"]
    assert proc.stderr.strip().splitlines()[-1] == f"mmlinks: error: {out['error']}"


def test_inspect_prints_the_manifest(dataset):
    proc = run("data", "inspect", str(dataset), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads((dataset / "manifest.json").read_text())
    m = json.loads(proc.stdout)
    human = run("data", "inspect", str(dataset)).stdout
    assert f"dataset {m['dataset_version']} (schema v{SCHEMA_VERSION})" in human
    for split, n in m["counts"]["splits"].items():  # the split table: name, documents, shards
        assert any(line.split()[:2] == [split, str(n)] for line in human.splitlines())
    for reason, n in m["counts"]["dropped"].items():
        assert any(line.split() == [reason, str(n)] for line in human.splitlines())


def _one_line_error(proc, fragment):
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("mmlinks: error:") and fragment in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_missing_path_is_a_one_line_error(tmp_path):
    _one_line_error(run("data", "inspect", str(tmp_path / "nope")), "does not exist")
    _one_line_error(
        run("data", "build", "--input", str(tmp_path / "nope"), "--out", str(tmp_path)), "does not exist"
    )
    _one_line_error(run("train", "--data", str(tmp_path / "nope")), "does not exist")


@pytest.mark.slow
def test_unreadable_manifest_is_a_one_line_error(tmp_path):
    (tmp_path / "manifest.json").write_text("{oops")
    _one_line_error(run("data", "inspect", str(tmp_path)), "cannot read manifest")
    _one_line_error(run("train", "--data", str(tmp_path)), "cannot read manifest")


@pytest.mark.slow
def test_unknown_schema_version_shards_are_refused(dataset, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(dataset, copy)
    shard = next((copy / "versions").glob("*/train-*.parquet"))
    table = pq.read_table(shard)
    meta = {**table.schema.metadata, b"mmlinks.schema_version": str(SCHEMA_VERSION + 1).encode()}
    pq.write_table(pa.Table.from_batches(table.to_batches(), table.schema.with_metadata(meta)), shard)
    _one_line_error(
        run("train", "--data", str(copy), "--epochs", "1"), f"schema version {SCHEMA_VERSION + 1}"
    )


@pytest.mark.slow
def test_build_option_errors_are_one_line(tmp_path, corpus, capfd):
    base = ["data", "build", "--input", str(corpus), "--out", str(tmp_path / "o")]
    # the deepest of them (after torch and Beam are imported) in a fresh process, as a user sees it
    _one_line_error(run(*base, "--device", "cuda"), "CUDA is not available")
    _one_line_error(run_here(capfd, *base, "--split-sizes", "val=x"), "--split-sizes")
    _one_line_error(run_here(capfd, *base, "--dedupe-threshold", "three"), "--dedupe-threshold")
    _one_line_error(run_here(capfd, *base, "--filter-option", "max_imgs=3"), "unknown filter option")
    _one_line_error(run_here(capfd, *base, "--extractor", "resnet9000"), "unknown feature extractor")
    _one_line_error(run_here(capfd, *base, "--regions", "efficientnet-lite0"), "region extractor")
    _one_line_error(run_here(capfd, *base, "--extractor", "densenet169"), "densenet169")  # no weights
    _one_line_error(run_here(capfd, *base, "--runner", "DataflowRunner"), "--project")


@pytest.mark.slow
def test_bad_split_and_output_paths_are_one_line_errors(tmp_path, corpus):
    for split in ("0.8,0.2", "a,b,c", "0,0,0", "-1,1,1"):
        _one_line_error(
            run("data", "build", "--input", str(corpus), "--out", str(tmp_path / "o"), f"--split={split}"),
            "--split",
        )
    (tmp_path / "file").write_text("x")
    _one_line_error(run("data", "synth", "--out", str(tmp_path / "file"), "--docs", "1"), "not a directory")
    _one_line_error(run("demo", "--workdir", str(tmp_path / "file")), "not a directory")


def test_build_refuses_non_corpus_directory(tmp_path, capfd):
    _one_line_error(
        run_here(capfd, "data", "build", "--input", str(tmp_path), "--out", str(tmp_path / "o")),
        "not a synthetic corpus",
    )


def test_data_sources_lists_every_source_with_options_and_credentials():
    proc = run("data", "sources", "--json")
    assert proc.returncode == 0, proc.stderr
    sources = json.loads(proc.stdout)["sources"]
    expected = {"diy", "recipeqa", "wiki", "mscoco", "story-dii", "story-sis", "dii-stress", "hessel"}
    assert set(sources) >= expected
    assert "praw_client_id" in sources["diy"]["credentials"]
    assert sources["mscoco"]["build_defaults"]["dedupe_threshold"] == "off"
    assert sources["diy"]["options"]["min_score"]["default"] == "25"


@pytest.mark.slow
def test_source_option_errors_are_one_line(tmp_path, capfd):
    out = str(tmp_path / "o")
    proc = run_here(capfd, "data", "build", "--source", "recipeqa", "--input", str(tmp_path), "--out", out,
               "--source-option", "no_such=1")  # fmt: skip
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("mmlinks: error: source 'recipeqa' has no option no_such")


def test_crawl_without_credentials_names_the_variables(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("praw_")}
    proc = subprocess.run(
        [MMLINKS, "data", "crawl", "diy", "--out", str(tmp_path / "o"), "--state", str(tmp_path / "s")],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "praw_client_id" in proc.stderr and "Traceback" not in proc.stderr


def test_building_the_parser_imports_no_heavy_library():
    """Every command builds the whole parser first: torch, Beam, MLflow, Ray or Dagster there
    cost every `mmlinks` call seconds before it starts (``--help`` took ~8 s of CPU)."""
    code = (
        "import sys; from cli.main import build_parser; build_parser(); "
        "print(sorted(m for m in ('torch', 'apache_beam', 'mlflow', 'ray', 'dagster', 'scipy', 'praw') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_build_that_keeps_nothing_fails_and_keeps_the_current_version(dataset, tmp_path):
    """Issue #19: `data build --source diy` on a folder of other JSON files used to read them all as
    dumps, filter every line and commit an empty version as current, exiting 0."""
    from tests.pipelines.test_reddit import _not_reddit_folder

    out = tmp_path / "ds"
    shutil.copytree(dataset, out)  # a non-empty current version
    before = (out / "manifest.json").read_bytes()
    src = _not_reddit_folder(tmp_path / "in")
    env_free = {"praw_client_id": "", "praw_client_secret": ""}
    proc = subprocess.run(
        [
            MMLINKS,
            "data",
            "build",
            "--source",
            "diy",
            "--input",
            str(src),
            "--out",
            str(out),
            "--direct-workers",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**{k: v for k, v in os.environ.items() if k not in env_free}},
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    # which files were taken as dumps, before the build starts
    assert f"reading 3 files under {src} as Reddit submission dumps: " in proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("mmlinks: error: the diy build of ") and "kept no document" in error
    assert "file:not_submissions=3" in error and "reddit_files_read=3" in error
    version = json.loads(before)["dataset_version"]
    assert f"the current version {version} (" in error and "--allow-empty" in error
    assert (out / "manifest.json").read_bytes() == before  # nothing committed
    assert sorted(p.name for p in (out / "versions").iterdir()) == [version]


def test_train_prints_the_test_auc_with_its_standard_error(capsys):
    """A run's AUC is read against the split's noise: `mmlinks train` says the standard error over
    the test documents (``summarize``'s ``auc_se``), and nothing where there is none (one document)."""
    from cli.train import show_train

    result = {
        "test": {"auc": 99.1, "p_at_1": 98.2, "p_at_5": 60.0, "n_docs": 56, "auc_se": 0.2234},
        "random": {"auc": 50.0, "p_at_1": 30.0, "p_at_5": 40.0, "n_docs": 56, "auc_se": 3.1},
        "best_epoch": 9,
        "model_uri": "models:/mmlinks-ap@candidate",
        "run_id": "r",
        "tracking_uri": "sqlite:///x",
    }
    show_train(result)
    assert "test split, 56 documents (best epoch 9; AUC standard error 0.22):" in capsys.readouterr().out
    show_train({**result, "test": {**result["test"], "n_docs": 1, "auc_se": float("nan")}})
    assert "test split, 1 documents (best epoch 9):" in capsys.readouterr().out


def test_a_promotions_metrics_line_names_the_standard_error():
    from cli.models import _metrics_text

    metrics = {"auc": 61.23, "p_at_1": 40.0, "n_docs": 12, "auc_se": 2.104}
    assert _metrics_text(metrics) == "AUC 61.2, p@1 40.0, AUC standard error 2.10 (12 docs)"
    one = {"auc": 61.23, "n_docs": 1, "auc_se": float("nan")}
    assert _metrics_text(one) == "AUC 61.2 (1 docs)"
