"""Every module the tree imports is the standard library's, the project's, or provided by a
distribution pyproject.toml declares. The installed packages (``[tool.setuptools.packages.find]``:
``cli``, ``pipelines``, ``training``, ...) are what a user runs, so they may import only runtime
``dependencies``; tests, benchmarks and scripts may also import the ``optional-dependencies``
(dev). Before issue #46 both counted alike, and ``mmlinks data confound`` imported scikit-image,
a dev extra, at run time.

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


def _names(requirements: list[str]) -> set[str]:
    names = set()
    for requirement in requirements:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
        assert match, f"unreadable requirement {requirement!r} in pyproject.toml"
        names.add(_normalize(match.group(1)))
    return names


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def runtime_distributions() -> set[str]:
    """What ``pip install mmlinks`` installs: ``[project] dependencies``."""
    return _names(list(_project()["project"].get("dependencies", [])))


def declared_distributions() -> set[str]:
    """Runtime dependencies and every ``optional-dependencies`` group."""
    groups = _project()["project"].get("optional-dependencies", {}).values()
    return runtime_distributions() | _names([r for group in groups for r in group])


def runtime_packages() -> set[str]:
    """The top-level packages a wheel ships (``cli*`` -> ``cli``)."""
    include = _project()["tool"]["setuptools"]["packages"]["find"]["include"]
    return {pattern.rstrip("*").rstrip(".") for pattern in include}


def is_runtime(path: Path) -> bool:
    return path.relative_to(ROOT).parts[0] in runtime_packages()


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


def undeclared_imports(
    files: list[Path], root: Path, runtime: set[str], declared: set[str], providers: dict[str, list[str]]
) -> dict[str, set[str]]:
    """{module: files} of imports no allowed distribution provides: a runtime file (under one of
    the shipped packages) is allowed ``runtime`` distributions, any other file ``declared``
    ones."""
    undeclared: dict[str, set[str]] = {}
    for path in files:
        own = own_modules(path)
        allowed = runtime if is_runtime(path) else declared
        for name in top_level_imports(path):
            if name in sys.stdlib_module_names or name in own or name == "__future__":
                continue
            if not any(_normalize(dist) in allowed for dist in providers.get(name, [])):
                undeclared.setdefault(name, set()).add(str(path.relative_to(root)))
    return undeclared


def _report(undeclared: dict[str, set[str]], providers: dict[str, list[str]]) -> str:
    return "; ".join(
        f"{name} (from {', '.join(sorted(providers.get(name, ['nothing installed'])))}) in "
        f"{', '.join(sorted(paths)[:3])}{' ...' if len(paths) > 3 else ''}"
        for name, paths in sorted(undeclared.items())
    )


def test_every_import_is_stdlib_own_or_declared():
    """Runtime code imports runtime dependencies only; the rest may use dev extras too."""
    providers = packages_distributions()
    files = python_files()
    assert len(files) > 100, f"found only {len(files)} Python files under {ROOT}"
    assert sum(map(is_runtime, files)) > 100, "the shipped packages were not found"
    undeclared = undeclared_imports(files, ROOT, runtime_distributions(), declared_distributions(), providers)
    assert not undeclared, (
        f"imported but not declared in pyproject.toml (runtime code: in dependencies): "
        f"{_report(undeclared, providers)}"
    )


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


def test_the_checker_fails_on_real_undeclared_modules():
    """Detection itself, fed real installed modules: ``tifffile`` (installed, as a dependency of
    scikit-image, but declared nowhere) is reported anywhere; ``hypothesis`` (a dev extra) is
    reported in a shipped package and allowed in a test; ``requests`` (runtime) passes both.
    The files are written inside the tree (a runtime package, tests/) because where a file
    lives decides what it may import; they are removed at once."""
    providers = packages_distributions()
    assert "tifffile" in providers and "hypothesis" in providers, "the probe modules are not installed"
    body = "def f():\n    import tifffile\n    from hypothesis import given\n    import requests\n"
    files = [ROOT / "pipelines" / "_probe_undeclared.py", ROOT / "tests" / "_probe_undeclared.py"]
    try:
        for path in files:
            path.write_text(body)
        found = undeclared_imports(files, ROOT, runtime_distributions(), declared_distributions(), providers)
    finally:
        for path in files:
            path.unlink(missing_ok=True)
    assert found == {
        "tifffile": {"pipelines/_probe_undeclared.py", "tests/_probe_undeclared.py"},
        "hypothesis": {"pipelines/_probe_undeclared.py"},
    }, found


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
