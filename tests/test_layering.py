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


def _pipelines_import_graph() -> dict[str, set[str]]:
    """module -> the pipelines modules it imports (lazy, in-function imports included)."""

    def name(p: Path) -> str:
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    mods = {name(p): p for p in (ROOT / "pipelines").rglob("*.py")}
    graph = {}
    for mod, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                deps.update({node.module} | {f"{node.module}.{a.name}" for a in node.names})
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[mod] = {d for d in deps if d in mods and d != mod}
    return graph


def test_pipelines_modules_import_each_other_without_cycles():
    graph = _pipelines_import_graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(mod: str, path: list[str]) -> None:
        state[mod] = 1
        for dep in sorted(graph[mod]):
            assert state.get(dep) != 1, "import cycle: " + " -> ".join([*path, mod, dep])
            if dep not in state:
                visit(dep, [*path, mod])
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [])


def test_generic_pipelines_modules_never_import_a_source():
    """Only the build (config and graph) looks sources up, and only through the registry."""
    registry_users = {"pipelines.build", "pipelines.build_config", "pipelines.graph"}
    for mod, deps in _pipelines_import_graph().items():
        if mod.startswith("pipelines.sources"):
            continue
        sources = {d for d in deps if d.startswith("pipelines.sources")}
        allowed = {"pipelines.sources"} if mod in registry_users else set()
        assert sources <= allowed, f"{mod} imports {sources - allowed}"
