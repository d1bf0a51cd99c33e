"""docs/design.md's package layout (its section 2) names every module of the package, and only modules
that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
# An entry: a name (a file, a folder ending in "/", or a comma-separated list of files), then two or
# more spaces and its description, or the end of the line. Description lines that continue an entry
# start deeper and with a word that is none of these.
ENTRY = re.compile(r"^(?P<indent> *)(?P<names>[\w.-]+(?:/[\w.-]+)*/?(?:, [\w.-]+)*)(?: {2,}|$)")


def layout_block(text: str) -> list[str]:
    """The lines of the code block in section 2."""
    section = text.split("\n## 2.", 1)[1].split("\n## 3.", 1)[0]
    return section.split("```", 2)[1].splitlines()[1:]


def listed_paths(lines: list[str]) -> set[str]:
    """The paths the layout names, relative to the repository root (folders end in "/")."""
    out: set[str] = set()
    parents: list[tuple[int, str]] = []     # (indent, folder) of the enclosing folders
    for line in lines:
        match = ENTRY.match(line)
        if not match or not line.strip():
            continue
        if not _is_entry_name(match.group("names")):
            continue   # a description line of the entry above, starting with a word
        indent = len(match.group("indent"))
        while parents and indent <= parents[-1][0]:
            parents.pop()
        prefix = "".join(folder for _, folder in parents)
        names = [name.strip() for name in match.group("names").split(",")]
        out.update(prefix + name for name in names)
        if len(names) == 1 and names[0].endswith("/"):
            parents.append((indent, names[0]))
    return out


def _is_entry_name(names: str) -> bool:
    return all(re.fullmatch(r"[\w.-]+(/[\w.-]+)*(/|\.\w+)|Makefile", name.strip()) for name in names.split(","))


def package_paths() -> set[str]:
    """Every module of the package as the layout names it: a package by its folder, a module by its file."""
    out = set()
    for path in (ROOT / "checkmate").rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        out.add(rel[: -len("__init__.py")] if path.name == "__init__.py" else rel)
    return out


def test_the_layout_names_every_module_and_nothing_else():
    listed = listed_paths(layout_block(DESIGN.read_text()))
    in_package = {p for p in listed if p.startswith("checkmate/")}
    missing = sorted(package_paths() - in_package)
    assert not missing, f"docs/design.md section 2 leaves out: {', '.join(missing)}"
    stale = sorted(p for p in listed if not (ROOT / p).exists())
    assert not stale, f"docs/design.md section 2 names what does not exist: {', '.join(stale)}"


def test_the_layout_reader_follows_nesting_and_skips_descriptions():
    lines = ["top/",
             "  a.py                 one; it goes on",
             "                       continued/ here, b.py",
             "  sub/                 a package",
             "    c.py, d.py         two",
             "  e.py",
             "other.md               a file"]
    assert listed_paths(lines) == {"top/", "top/a.py", "top/sub/", "top/sub/c.py", "top/sub/d.py", "top/e.py",
                                   "other.md"}


@pytest.mark.parametrize("line", ["setup.py                 package metadata", "Makefile  targets"])
def test_top_level_files_are_entries(line):
    assert listed_paths([line]) == {line.split()[0]}
