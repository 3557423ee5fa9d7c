"""The docs stay true and short: architecture.md names every module; README and pages keep their limits."""

import re
from pathlib import Path

from tests.test_layering import LAYERS as PACKAGES

ROOT = Path(__file__).resolve().parents[1]


def test_architecture_lists_every_module():
    text = (ROOT / "docs" / "architecture.md").read_text()
    modules = [
        p.relative_to(ROOT).as_posix()
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if not (p.name == "__init__.py" and p.parent.name == pkg)
    ]
    missing = [m for m in modules if f"`{m}`" not in text]
    assert not missing, f"docs/architecture.md does not list {missing}"


# A newcomer reads the README in minutes and each docs page in one sitting (issue #46): the command reference
# lives in docs/commands.md, and benchmarks.md keeps current figures only (older ones: `git log -p`).
README_MAX_LINES = 150
BENCHMARKS_MAX_LINES = 400
DOCS_PAGE_MAX_LINES = 300


def _line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_readme_is_short():
    assert _line_count(ROOT / "README.md") <= README_MAX_LINES, "README.md: move detail to docs/"


def test_docs_pages_are_short():
    too_long = {}
    for page in sorted((ROOT / "docs").glob("*.md")):
        limit = BENCHMARKS_MAX_LINES if page.name == "benchmarks.md" else DOCS_PAGE_MAX_LINES
        if _line_count(page) > limit:
            too_long[page.name] = (_line_count(page), limit)
    assert not too_long, f"docs pages over their line limit (lines, limit): {too_long}"


def test_readme_keeps_what_a_newcomer_needs():
    """The set-up and demo commands, the test command, the folder map and the command reference's page."""
    text = (ROOT / "README.md").read_text()
    for needle in ("make setup", "mmlinks demo", "make test", "## Folders", "docs/commands.md"):
        assert needle in text, f"README.md lost {needle!r}"
    folders = [p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    missing = [f for f in folders if f"`{f}/`" not in text]
    assert not missing, f"README.md's folder map lacks {missing}"


def test_relative_links_resolve():
    """Pages were split and moved: every relative Markdown link must still name a file that exists."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, f"broken relative links: {broken}"
