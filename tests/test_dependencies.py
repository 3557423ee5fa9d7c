"""Every module the tree imports is the standard library's, the project's, or provided by a
distribution pyproject.toml declares (``dependencies`` or an ``optional-dependencies`` group).

An import that only works because some other package happens to pull its distribution in
breaks on the day that package drops it (``sqlalchemy`` came with MLflow, ``filelock`` with
torch). Imports are read with ``ast`` from every ``.py`` file outside hidden folders (the
virtualenv), including those inside functions and ``try`` blocks: an optional import that
succeeds here is a dependency here. Which distribution provides a module comes from the
installed metadata (``importlib.metadata.packages_distributions``).
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_distributions() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project.get("dependencies", []))
    for group in project.get("optional-dependencies", {}).values():
        requirements.extend(group)
    names = set()
    for requirement in requirements:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
        assert match, f"unreadable requirement {requirement!r} in pyproject.toml"
        names.add(_normalize(match.group(1)))
    return names


def python_files() -> list[Path]:
    return sorted(
        path
        for path in ROOT.rglob("*.py")
        if not any(part.startswith(".") for part in path.relative_to(ROOT).parts[:-1])
    )


def top_level_imports(path: Path) -> set[str]:
    """The top-level names of every absolute import in ``path`` (``a.b.c`` -> ``a``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def own_modules(path: Path) -> set[str]:
    """The project's top-level packages and modules, and the modules beside ``path`` (a script
    run from its folder imports its siblings: benchmarks' helpers, conftest)."""
    names = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    names.update(p.stem for p in ROOT.glob("*.py"))
    names.update(p.stem for p in path.parent.glob("*.py"))
    names.update(p.name for p in path.parent.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    return names


def test_every_import_is_stdlib_own_or_declared():
    declared = declared_distributions()
    providers = packages_distributions()
    undeclared: dict[str, set[str]] = {}
    files = python_files()
    assert len(files) > 100, f"found only {len(files)} Python files under {ROOT}"
    for path in files:
        own = own_modules(path)
        for name in top_level_imports(path):
            if name in sys.stdlib_module_names or name in own or name == "__future__":
                continue
            if not any(_normalize(dist) in declared for dist in providers.get(name, [])):
                undeclared.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    report = "; ".join(
        f"{name} (from {', '.join(sorted(providers.get(name, ['nothing installed'])))}) in "
        f"{', '.join(sorted(paths)[:3])}{' ...' if len(paths) > 3 else ''}"
        for name, paths in sorted(undeclared.items())
    )
    assert not undeclared, f"imported but not declared in pyproject.toml: {report}"


def test_the_checker_sees_an_undeclared_import(tmp_path):
    """The parts the test relies on, on known cases: nested and ``from`` imports are read,
    relative imports are not, and a declared distribution's module is recognised."""
    source = tmp_path / "mod.py"
    source.write_text(
        "import os.path\nfrom . import sibling\n\ndef f():\n    from requests.adapters import HTTPAdapter\n"
        "    import yaml, numpy.linalg\n"
    )
    assert top_level_imports(source) == {"os", "requests", "yaml", "numpy"}
    assert {"requests", "numpy", "pyyaml"} <= declared_distributions()
    assert "PyYAML" in packages_distributions()["yaml"]


def _pins(lines: list[str]) -> dict[str, str]:
    pins = {}
    for line in lines:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;,#]+)", line)
        if match:
            pins[_normalize(match.group(1))] = match.group(2)
    return pins


def test_pyproject_pins_agree_with_the_lock():
    """constraints.txt is the resolved set ``make setup`` installs under: an exact pin in
    pyproject.toml that the lock lacks or pins to another version cannot be installed."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for group in project.get("optional-dependencies", {}).values():
        requirements.extend(group)
    declared = _pins(requirements)
    lock = _pins((ROOT / "constraints.txt").read_text().splitlines())
    wrong = {
        name: (version, lock.get(name)) for name, version in declared.items() if lock.get(name) != version
    }
    assert not wrong, f"pyproject pin != constraints.txt (pyproject, lock): {wrong}"
