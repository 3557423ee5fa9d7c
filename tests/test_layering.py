"""The layers stay layers: schemas <- features <- pipelines <- training <- archive <- models <- linking
<- orchestration <- cli.

A package never imports one above it (Dagster code never calls the CLI; library code never
imports the orchestrator), and inside a package no two modules import each other, directly or
through others: an import cycle means one of them reaches upward. Over the whole tree no
modules import each other in a circle either, and training's model families (``FAMILIES``) stand
side by side over one core: a family never imports another.

Every top-level package is a layer (``LAYERS``): a new one fails ``test_every_package_is_a_layer``
until it is placed. The alias modules issue #61 left at the old paths of what moved into
``models/`` (``ALIASES``) are the one exception to the layer order: they only re-export.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = [
    "schemas",
    "features",
    "pipelines",
    "training",
    "archive",  # reads a news model's image tower (training); the served news model reads it
    "models",  # packaging, registration, the promotion gate, serving
    "linking",
    "orchestration",
    "cli",
]
# top-level folders with Python files that are no layer of the library
NOT_LAYERS = {"tests", "benchmarks", "docs", "infra", "mlruns", "bench_tmp"}
# Thin modules at the old paths of what moved into models/ (issue #61), each re-exporting its new
# module: MLflow pickled a registered model's pyfunc class by module path (training.packaging.
# LinkModel, ...), so versions registered before the move load only while these paths exist
# (tests/models/test_models_before_61.py); training.job is the documented `python -m training.job`.
# They import a layer above by design and nothing in the tree imports them.
ALIASES = {
    "training/packaging.py": "models.packaging",
    "training/retrieval/serving.py": "models.retrieval_serving",
    "training/news/serving.py": "models.news_serving",
    "training/job.py": "models.job",
}
EXTERNAL_ABOVE = {"orchestration": {"dagster"}}  # libraries that belong to one layer only
# training's model families: each registers itself with the core's registries (training/families.py)
FAMILIES = ["training.link", "training.retrieval", "training.news"]
TREE = [*LAYERS, "benchmarks"]


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """Ids of the nodes inside ``if TYPE_CHECKING:`` blocks: imports made only for annotations."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                inside.update(id(n) for n in ast.walk(stmt))
    return inside


def imported_modules(path: Path, runtime_only: bool = False) -> set[str]:
    """Every module a file imports; with ``runtime_only``, not those imported for type hints only."""
    names = set()
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_files(package: str, aliases: bool = True) -> list[Path]:
    files = sorted((ROOT / package).rglob("*.py"))
    if aliases:
        return files
    return [f for f in files if f.relative_to(ROOT).as_posix() not in ALIASES]


def test_every_package_is_a_layer():
    """A top-level folder with Python files is a layer (placed in LAYERS) or named in NOT_LAYERS:
    a new package cannot go unchecked."""
    found = {
        d.name
        for d in ROOT.iterdir()
        if d.is_dir()
        and not d.name.startswith(".")
        and not d.name.endswith(".egg-info")
        and next(d.rglob("*.py"), None) is not None
    }
    unplaced = sorted(found - set(LAYERS) - NOT_LAYERS)
    assert not unplaced, f"top-level packages missing from LAYERS (tests/test_layering.py): {unplaced}"
    assert not set(LAYERS) & NOT_LAYERS


def test_the_aliases_only_re_export_and_nothing_imports_them():
    """Each alias imports its new module and nothing else of the tree; no module of the tree (tests
    apart: they load the old models) imports an alias."""
    alias_modules = {module_name(ROOT / path) for path in ALIASES}
    for path, target in ALIASES.items():
        ours = {m for m in imported_modules(ROOT / path) if m.split(".")[0] in LAYERS}
        assert ours and all(m == target or m.startswith(target + ".") for m in ours), (path, ours)
    for package in TREE:
        for f in package_files(package, aliases=False):
            bad = {m for m in imported_modules(f) if m in alias_modules}
            assert not bad, f"{f.relative_to(ROOT)} imports the alias {sorted(bad)}: import the new module"


@pytest.mark.parametrize("package", LAYERS)
def test_no_package_imports_a_layer_above_it(package):
    if not (ROOT / package).is_dir():
        pytest.skip(f"{package}/ does not exist yet")
    above = set(LAYERS[LAYERS.index(package) + 1 :])
    for name, libs in EXTERNAL_ABOVE.items():
        if name in above:
            above |= libs
    files = package_files(package, aliases=False)
    assert files
    for f in files:
        bad = {m for m in imported_modules(f) if m.split(".")[0] in above}
        assert not bad, f"{f.relative_to(ROOT)} imports {sorted(bad)} from a layer above {package}/"


def test_orchestration_never_imports_the_cli():
    for f in package_files("orchestration"):
        bad = {m for m in imported_modules(f) if m.split(".")[0] == "cli"}
        assert not bad, f"{f.relative_to(ROOT)} imports the CLI: {sorted(bad)}"


def _graph(package: str | list[str]) -> dict[str, set[str]]:
    """module -> the modules of ``package`` (or of several) it imports when it runs."""
    packages = [package] if isinstance(package, str) else package
    modules = {module_name(f): f for p in packages if (ROOT / p).is_dir() for f in package_files(p)}
    graph: dict[str, set[str]] = {}
    for name, f in modules.items():
        targets = set()
        # A type-only import never runs, so it cannot close a cycle: a registry may annotate its
        # callbacks with the config class whose choices it defines. Across layers it still counts.
        for m in imported_modules(f, runtime_only=True):
            # `from pkg import mod` names a module; `from pkg.mod import f` its module
            while m and m not in modules:
                m = m.rpartition(".")[0]
            if m and m != name and not name.startswith(m + ".") and m not in packages:
                targets.add(m)
        graph[name] = targets
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


@pytest.mark.parametrize("package", LAYERS)
def test_no_import_cycle_inside_a_package(package):
    if not (ROOT / package).is_dir():
        pytest.skip(f"{package}/ does not exist yet")
    cycle = _cycle(_graph(package))
    assert cycle is None, "modules import each other (one reaches upward): " + " -> ".join(cycle)


def test_the_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_type_only_imports_are_runtime_free_but_still_seen(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from typing import TYPE_CHECKING\nimport os\nif TYPE_CHECKING:\n    import json\n")
    assert "json" in imported_modules(f)
    assert "json" not in imported_modules(f, runtime_only=True)
    assert "os" in imported_modules(f, runtime_only=True)


def test_features_never_import_pipelines_or_beam():
    for f in package_files("features"):
        bad = {m for m in imported_modules(f) if m.split(".")[0] in ("pipelines", "apache_beam", "training")}
        assert not bad, f"{f.relative_to(ROOT)} imports {bad}"


def test_generic_pipelines_modules_never_import_a_source():
    """Only the build (config and graph) looks sources up, and only through the registry."""
    registry_users = {"pipelines.build", "pipelines.build_config", "pipelines.graph"}
    for mod, deps in _graph("pipelines").items():
        if mod.startswith("pipelines.sources"):
            continue
        sources = {d for d in deps if d.startswith("pipelines.sources")}
        allowed = {"pipelines.sources"} if mod in registry_users else set()
        assert sources <= allowed, f"{mod} imports {sources - allowed}"


def test_no_import_cycle_anywhere():
    """Across packages too: benchmarks, the CLI and every layer in one graph."""
    cycle = _cycle(_graph(TREE))
    assert cycle is None, "modules import each other: " + " -> ".join(cycle)


def test_the_tree_wide_graph_sees_imports_across_packages():
    """The tree-wide graph holds the edges between packages, so a circle through two packages
    shows, not only one inside a package."""
    graph = _graph(TREE)
    assert "schemas.config_fields" in graph["training.config"]
    assert "training.objectives.registry" in graph["training.link.registration"]


@pytest.mark.parametrize("family", FAMILIES)
def test_no_family_imports_another(family):
    """A family reads the core, never another family (type-only imports and imports inside
    functions included): what two families share belongs in the core."""
    others = [f for f in FAMILIES if f != family]
    files = package_files(family.replace(".", "/"))
    assert files
    for f in files:
        bad = {m for m in imported_modules(f) if any(m == o or m.startswith(o + ".") for o in others)}
        assert not bad, f"{f.relative_to(ROOT)} imports {sorted(bad)} from another family"


def test_every_family_registers_itself():
    """training.families names one registration module inside each family package."""
    from training.families import FAMILIES as REGISTRATIONS

    assert {r.rpartition(".")[0] for r in REGISTRATIONS} == set(FAMILIES)


# What the core still imports from a family: nothing. The experiment and the promotion gate
# reach the retrieval and news families through the core's hooks (training/family_hooks.py, filled
# by each family's registration). May stay empty, never grow.
CORE_READS_FAMILY: dict[str, set[str]] = {}


def _family_of(module: str) -> str | None:
    return next((f for f in FAMILIES if module == f or module.startswith(f + ".")), None)


def test_the_core_imports_no_family():
    """training's core names its families only as strings (training/families.py: registrations
    and options, loaded by name) and reaches them through the hooks they register
    (training/family_hooks.py); a core module importing a family (every import counted) fails,
    beyond what CORE_READS_FAMILY lists (nothing)."""
    core = [f for f in package_files("training") if _family_of(module_name(f)) is None]
    assert core
    for f in core:
        allowed = CORE_READS_FAMILY.get(module_name(f), set())
        # `from models.news_serving import x` names models.news_serving.x too: its module is allowed
        bad = {
            m
            for m in imported_modules(f)
            if _family_of(m) and not any(m == a or m.startswith(a + ".") for a in allowed)
        }
        assert not bad, f"{f.relative_to(ROOT)} imports {sorted(bad)} from a model family"
