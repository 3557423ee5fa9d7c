"""`--dedupe-threshold off` means off for every source, through the CLI and through Dagster's
build options; a null threshold is refused instead of silently keeping the default."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli.data_build import _explicit_build_options
from cli.main import build_parser
from orchestration.settings import Settings
from pipelines.build_config import BuildConfig
from pipelines.sources import source_names
from schemas.errors import MmlinksError

MMLINKS = str(Path(sys.executable).parent / "mmlinks")


def cli_config(*argv: str) -> BuildConfig:
    args = build_parser().parse_args(["data", "build", *argv])
    return BuildConfig.for_source(args.source, args.input, args.out, **_explicit_build_options(args))


@pytest.mark.parametrize("source", source_names())
def test_off_turns_dedupe_off_for_every_source_from_the_cli(source):
    cfg = cli_config("--source", source, "--input", "in", "--out", "out", "--dedupe-threshold", "off")
    assert cfg.dedupe_threshold == "off"
    assert (
        cli_config(
            "--source", source, "--input", "in", "--out", "out", "--dedupe-threshold", "5"
        ).dedupe_threshold
        == 5
    )


@pytest.mark.parametrize("source", source_names())
def test_off_turns_dedupe_off_for_every_source_from_dagster_settings(source):
    for options in ({"*": {"dedupe_threshold": "off"}}, {source: {"dedupe_threshold": "off"}}):
        s = Settings.from_dict({"sources": [source], "build_options": options})
        cfg = BuildConfig.for_source(source, "in", "out", **s.build_config_options(source))
        assert cfg.dedupe_threshold == "off"


def test_a_null_threshold_is_refused_not_ignored():
    with pytest.raises(MmlinksError, match=r"build_options for diy: .*dedupe_threshold None"):
        Settings.from_dict({"sources": ["diy"], "build_options": {"diy": {"dedupe_threshold": None}}})
    with pytest.raises(MmlinksError, match="unknown build option"):
        Settings.from_dict({"sources": ["diy"], "build_options": {"*": {"dedupe_treshold": 3}}})
    with pytest.raises(MmlinksError, match="0 to 16 bits or 'off'"):
        BuildConfig.for_source("synthetic", "in", "out", dedupe_threshold=17)


def test_off_is_recorded_as_before_so_dataset_versions_do_not_move():
    cfg = BuildConfig.for_source("mscoco", "in", "out")  # the source's own default: off
    assert cfg.dedupe_threshold == "off" and cfg.params()["dedupe_threshold"] is None


@pytest.mark.slow
def test_a_build_with_dedupe_off_keeps_documents_that_share_an_image(tmp_path, corpus):
    """Two documents share an image: the default build drops both (drop_all), `off` keeps them."""
    work = tmp_path / "c"
    shutil.copytree(corpus, work)
    lines = (work / "documents.jsonl").read_bytes().splitlines()  # the corpus holds a bad-bytes line
    first, second = json.loads(lines[0]), json.loads(lines[1])
    shutil.copy(work / first["images"][0], work / second["images"][0])
    base = ["data", "build", "--input", str(work), "--direct-workers", "1", "--json"]

    def dropped(out: Path, *extra: str) -> dict:
        proc = subprocess.run([MMLINKS, *base, "--out", str(out), *extra], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["dropped"]

    assert dropped(tmp_path / "default").get("document:near_duplicate", 0) >= 2
    assert "document:near_duplicate" not in dropped(tmp_path / "off", "--dedupe-threshold", "off")
