"""``benchmarks/suite_profile.py`` (issue #63): a real pytest run's JUnit report read back per file
and per folder, outcomes counted, nothing lost."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "suite_profile.py"
_spec = importlib.util.spec_from_file_location("suite_profile", _PATH)
suite_profile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suite_profile)

# a test tree shaped like this repository's: packages, a module fixture, a class, every outcome
FILES = {
    "tests/__init__.py": "",
    "tests/a/__init__.py": "",
    "tests/a/test_one.py": """
import time, pytest

@pytest.fixture(scope="module")
def slow_fixture():
    time.sleep(0.2)

def test_first(slow_fixture): pass
def test_second(slow_fixture): pass
def test_fails(): assert False
@pytest.mark.skip(reason="not here")
def test_skipped(): pass
""",
    "tests/b/__init__.py": "",
    "tests/b/test_two.py": """
import pytest

class TestGroup:
    def test_in_a_class(self): pass
    @pytest.mark.parametrize("n", [1, 2])
    def test_param(self, n): pass

@pytest.fixture
def broken(): raise RuntimeError("setup breaks")
def test_error(broken): pass

@pytest.fixture
def breaks_after():
    yield
    raise RuntimeError("teardown breaks")
def test_fails_then_errors(breaks_after): assert False
""",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tree")
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    junit = root / "junit.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider"]
    # without PYTEST_ADDOPTS: under suite_profile.py it names the outer run's own report
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    args = [*cmd, f"--junitxml={junit}", "--rootdir", str(root), "tests"]
    subprocess.run(args, cwd=root, env=env, timeout=120)
    return root, junit


def test_every_test_is_counted_in_its_file_with_its_outcome(report):
    root, junit = report
    got = suite_profile.profile(junit, root=root)
    # a test that fails and errors in teardown has two report entries: one test, its worse outcome
    assert got["tests"] == 9
    assert got["outcomes"] == {"error": 2, "failed": 1, "passed": 5, "skipped": 1}
    files = {r["file"]: r for r in got["files"]}
    assert {f: r["tests"] for f, r in files.items()} == {"tests/a/test_one.py": 4, "tests/b/test_two.py": 5}
    # the module fixture's 0.2 s is in its file's time
    assert files["tests/a/test_one.py"]["seconds"] >= 0.2
    # the files' and the folders' sums are the report's own times, to rounding
    cases = sum(float(c.get("time")) for c in ET.parse(junit).getroot().iter("testcase"))
    assert got["test_seconds"] == pytest.approx(cases, abs=0.1)
    assert set(got["folders"]) == {"tests/a", "tests/b"}
    assert sum(got["folders"].values()) == pytest.approx(cases, abs=0.1)
    # the longest test first, named by file and test; its time is the longest case's
    longest = got["longest_tests"][0]
    assert longest["test"] == "tests/a/test_one.py::test_first"  # it sets up the module fixture
    assert longest["seconds"] == round(
        max(float(c.get("time")) for c in ET.parse(junit).getroot().iter("testcase")), 1
    )
    assert len(got["longest_tests"]) == 9 and "tests/b/test_two.py::test_param[2]" in str(
        got["longest_tests"]
    )


def test_a_class_name_maps_to_its_file_and_the_list_is_cut_at_top(report):
    root, junit = report
    assert suite_profile.file_of("tests.b.test_two.TestGroup", root) == "tests/b/test_two.py"
    assert suite_profile.file_of("tests.b.test_two", root) == "tests/b/test_two.py"
    assert suite_profile.file_of("", root) == "(collection)"  # a module skipped at collection
    cut = suite_profile.profile(junit, root=root, top=1)
    assert len(cut["files"]) == len(cut["longest_tests"]) == 1


def test_the_command_reads_a_report_or_says_there_is_none(report, tmp_path, capsys):
    _, junit = report
    assert suite_profile.main(["--junit", str(junit)]) == 0
    assert json.loads(capsys.readouterr().out)["tests"] == 9
    assert suite_profile.main(["--junit", str(tmp_path / "missing.xml")]) == 1
    assert "no JUnit report" in capsys.readouterr().err
    cut = tmp_path / "cut.xml"  # a report a killed run left half written
    cut.write_text(junit.read_text()[:200])
    assert suite_profile.main(["--junit", str(cut)]) == 1
    assert "is not a JUnit XML report" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        suite_profile.main(["--junit", str(junit), "--top", "0"])
    assert "--top must be at least 1" in capsys.readouterr().err
