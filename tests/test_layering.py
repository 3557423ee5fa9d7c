"""pipelines/ and training/ stay plain Python: no orchestrator or CLI imports inside them."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("orchestration", "dagster")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", ["pipelines", "training", "schemas"])
def test_library_packages_do_not_import_the_orchestrator(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    for f in files:
        bad = {m for m in imported_modules(f) if m.split(".")[0] in FORBIDDEN}
        assert not bad, f"{f.relative_to(ROOT)} imports {bad}"


def test_features_never_import_pipelines_or_beam():
    files = sorted((ROOT / "features").rglob("*.py"))
    assert files
    for f in files:
        bad = {m for m in imported_modules(f) if m.split(".")[0] in ("pipelines", "apache_beam", "training")}
        assert not bad, f"{f.relative_to(ROOT)} imports {bad}"
