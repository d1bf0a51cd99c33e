"""The user documentation (README.md and docs/*.md) is executed, so that it says what the code does.

Conventions of the Markdown files:

* A ```` ```python ```` block runs. The blocks of one page run in order as one script, in a fresh
  interpreter, so a later block may use what an earlier one defined. The script must exit 0.
* A ```` ```console ```` block holds commands: each line that starts with ``$ `` (continued by a
  trailing backslash) runs in bash, ``checkmate`` and ``python`` being this checkout's. Lines
  without ``$ `` are sample output and are not compared (they hold timings). A command must exit 0,
  or with the code that a trailing ``# exit N`` comment names.
* A ```` ```json ```` block must parse as JSON.
* An HTML comment on the line just before a fence marks the block: ``<!-- docs-test: skip -->``
  (never run here: minutes of work, or a GPU), ``<!-- docs-test: slow -->`` (runs only in the slow
  test, e.g. for TensorFlow).

Everything runs in a temporary folder holding links to this checkout's ``checkmate/``,
``experiments/`` and ``notebooks/``, so paths as a clone has them work and outputs land there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
# the design document is the product's specification, not a user page with examples to run
USER_PAGES = [p for p in PAGES if p.name != "design.md"]

_FENCE = re.compile(r"^(`{3,})([\w-]*)[^\n]*$")
_MARK = re.compile(r"^<!--\s*docs-test:\s*(skip|slow)\b.*-->\s*$")
_EXIT = re.compile(r"#\s*exit\s+(\d+)\s*$")

# A page's examples run in seconds; a TensorFlow page in under a minute or two on a loaded machine.
PAGE_TIMEOUT_S = 900


@dataclass(frozen=True)
class Block:
    page: Path
    line: int            # 1-based line of the opening fence
    language: str
    mark: str | None     # None, "skip" or "slow"
    text: str

    def where(self) -> str:
        name = self.page.relative_to(REPO) if self.page.is_relative_to(REPO) else self.page.name
        return f"{name}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, with the mark of the comment line before each."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, language = match.group(1), match.group(2).lower()
        previous = lines[i - 1] if i > 0 else ""
        mark = _MARK.match(previous.strip())
        end = i + 1
        while end < len(lines) and not lines[end].startswith(fence):
            end += 1
        assert end < len(lines), f"{page.name}:{i + 1}: code block never closed"
        found.append(Block(page, i + 1, language, mark.group(1) if mark else None, "\n".join(lines[i + 1:end])))
        i = end + 1
    return found


def commands(block: Block) -> list[str]:
    """The ``$ `` commands of a console block, continuation lines joined."""
    result: list[str] = []
    current: list[str] | None = None
    for raw in block.text.splitlines():
        if current is not None:
            current.append(raw)
        elif raw.startswith("$ "):
            current = [raw[2:]]
        else:
            continue
        if not raw.rstrip().endswith("\\"):
            result.append("\n".join(current))
            current = None
    assert current is None, f"{block.where()}: a command ends with a line continuation"
    return result


def _runs(block: Block, slow: bool) -> bool:
    return block.mark is None or (slow and block.mark == "slow")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    for name in ("checkmate", "experiments", "notebooks"):
        (tmp_path / name).symlink_to(REPO / name)
    return tmp_path


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.pop("CHECKMATE_PROGRESS", None)
    return env


def _run_python(page: Path, selected: list[Block], workdir: Path) -> None:
    script = workdir / f"{page.stem}_examples.py"
    parts = []
    for block in selected:
        parts.append(f"# --- {block.where()}\n{block.text}\n")
    script.write_text("\n".join(parts))
    proc = subprocess.run([sys.executable, str(script)], cwd=workdir, env=_env(), capture_output=True, text=True,
                          timeout=PAGE_TIMEOUT_S)
    assert proc.returncode == 0, (f"the Python examples of {page.name} failed (exit {proc.returncode}):\n"
                                  f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")


def _run_console(block: Block, workdir: Path) -> None:
    python = sys.executable
    prelude = (f'checkmate() {{ "{python}" -m checkmate "$@"; }}\n'
               f'python() {{ "{python}" "$@"; }}\n')
    for command in commands(block):
        expected = _EXIT.search(command.splitlines()[-1])
        want = int(expected.group(1)) if expected else 0
        proc = subprocess.run(["bash", "-c", prelude + command], cwd=workdir, env=_env(), capture_output=True,
                              text=True, timeout=PAGE_TIMEOUT_S)
        assert proc.returncode == want, (f"{block.where()}: `{command}` exited {proc.returncode}, the page says "
                                         f"{want}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        if " --json" in command and proc.returncode == 0:
            json.loads(proc.stdout)  # --json promises JSON alone on stdout


def _run_page(page: Path, workdir: Path, *, slow: bool) -> int:
    """Run a page's examples (those marked slow too when ``slow``); the number of blocks run."""
    page_blocks = [b for b in blocks(page) if _runs(b, slow)]
    # the slow test runs a page only if it has slow blocks: its other blocks ran in the default test
    if slow and not any(b.mark == "slow" for b in page_blocks):
        return 0
    python_blocks = [b for b in page_blocks if b.language == "python"]
    if python_blocks:
        _run_python(page, python_blocks, workdir)
    for block in page_blocks:
        if block.language == "console":
            _run_console(block, workdir)
    return len(python_blocks) + sum(1 for b in page_blocks if b.language == "console")


def _page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


@pytest.mark.parametrize("page", USER_PAGES, ids=_page_id)
def test_examples_run(page: Path, workdir: Path) -> None:
    _run_page(page, workdir, slow=False)


@pytest.mark.slow
@pytest.mark.tf
@pytest.mark.parametrize("page", USER_PAGES, ids=_page_id)
def test_slow_examples_run(page: Path, workdir: Path) -> None:
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("the slow examples train Keras models: TensorFlow is not installed")
    _run_page(page, workdir, slow=True)


def test_every_page_has_examples_that_run() -> None:
    """A page of the user documentation shows what it describes, and its examples are checked."""
    for page in USER_PAGES:
        runnable = [b for b in blocks(page) if b.language in ("python", "console") and b.mark != "skip"]
        assert runnable, f"{page.name} has no example that the tests run"


def test_json_blocks_parse() -> None:
    for page in USER_PAGES:
        for block in blocks(page):
            if block.language == "json" and block.mark != "skip":
                try:
                    json.loads(block.text)
                except json.JSONDecodeError as exc:
                    pytest.fail(f"{block.where()}: not JSON: {exc}")


def test_code_blocks_name_their_language() -> None:
    """An unlabelled fence would be silently skipped; every block says what it is."""
    for page in USER_PAGES:
        for block in blocks(page):
            assert block.language, f"{block.where()}: a code block without a language (python, console, text, json)"


def test_relative_links_resolve() -> None:
    link = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")
    for page in USER_PAGES:
        for match in link.finditer(page.read_text()):
            target = match.group(1)
            if re.match(r"^[a-z]+:", target):
                continue  # http(s), mailto
            assert (page.parent / target).exists(), f"{page.name}: the link {target!r} leads nowhere"


def test_the_front_page_links_every_docs_page() -> None:
    readme = (REPO / "README.md").read_text()
    for page in USER_PAGES:
        if page.parent.name == "docs" and page.name != "README.md":
            assert f"docs/{page.name}" in readme, f"README.md does not link docs/{page.name}"


def test_the_front_page_keeps_the_two_commands() -> None:
    readme = (REPO / "README.md").read_text()
    for target in ("make demo", "make test"):
        assert target in readme
        assert re.search(rf"^{target.split()[1]}:", (REPO / "Makefile").read_text(), re.M)


def test_the_front_page_names_every_install_extra() -> None:
    """The front page says how to install the core and each extra that setup.py offers."""
    import ast

    tree = ast.parse((REPO / "setup.py").read_text())
    extras: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "extras_require" and isinstance(node.value, ast.Dict):
            extras = [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
    assert "tf" in extras and "test" in extras, "setup.py's extras were not found"
    readme = (REPO / "README.md").read_text()
    assert "pip install ." in readme
    for extra in extras:
        assert f".[{extra}]" in readme, f"README.md does not say how to install the extra {extra!r}"


# ------------------------------------------------------------------------------------ the CLI page
def _subcommands() -> dict:
    from checkmate.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return dict(sub.choices)


def _cli_sections(text: str) -> dict[str, str]:
    """The text of each ``## `checkmate NAME` `` section of the CLI page, by command name."""
    parts = re.split(r"^## `checkmate ([a-z-]+)`\s*$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_cli_page_documents_every_command_and_flag() -> None:
    sections = _cli_sections((REPO / "docs" / "cli.md").read_text())
    for name, parser in _subcommands().items():
        assert name in sections, f"docs/cli.md has no section for `checkmate {name}`"
        for action in parser._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    assert f"`{flag}" in sections[name], \
                        f"docs/cli.md does not document `checkmate {name} {flag}` in its section"


def test_cli_page_documents_the_exit_codes_and_json_fields() -> None:
    from checkmate.cli import _common
    from checkmate.solvers import SolveResult

    text = (REPO / "docs" / "cli.md").read_text()
    for code in (_common.EXIT_OK, _common.EXIT_BAD_INPUT, _common.EXIT_INFEASIBLE, _common.EXIT_SOLVER,
                 _common.EXIT_INTERRUPTED):
        assert re.search(rf"^\|\s*{code}\s*\|", text, re.M), f"docs/cli.md has no row for exit code {code}"
    fields = SolveResult.__dataclass_fields__
    json_fields = ("graph, nodes, strategy, solver, budget_bytes, feasible, optimal, compute_cost, baseline_cost, "
                   "overhead, peak_memory_bytes, lower_bound, gap, solve_seconds, status").split(", ")
    for field in json_fields:
        assert f"`{field}`" in text, f"docs/cli.md does not describe the JSON field {field}"
    assert set(json_fields) - {"overhead", "gap"} <= set(fields)


def test_cli_page_documents_every_environment_variable() -> None:
    """Every CHECKMATE_* variable the package reads is in the CLI page's table of them."""
    names: set[str] = set()
    for path in (REPO / "checkmate").rglob("*.py"):
        names |= set(re.findall(r"[\"'](CHECKMATE_[A-Z_]+)[\"']", path.read_text()))
    assert {"CHECKMATE_DEBUG", "CHECKMATE_PROGRESS"} <= names, "the package's variables were not found"
    text = (REPO / "docs" / "cli.md").read_text()
    table = text.split("## Environment variables", 1)[1]
    for name in sorted(names):
        assert f"`{name}" in table, f"docs/cli.md's environment variables do not include {name}"


def test_solvers_page_names_every_strategy() -> None:
    from checkmate.solvers import STRATEGIES

    text = (REPO / "docs" / "solvers.md").read_text()
    for name in STRATEGIES:
        assert f"`{name}`" in text, f"docs/solvers.md does not describe the strategy {name}"


def test_papers_page_names_every_experiment_script() -> None:
    text = (REPO / "docs" / "papers.md").read_text()
    for script in sorted((REPO / "experiments").glob("*.py")):
        if script.name in ("common.py",):
            continue  # helpers of the scripts, not one of them
        assert script.name in text, f"docs/papers.md does not mention experiments/{script.name}"


# ------------------------------------------------------------------------------------ the checker itself
def test_block_parser_reads_marks_languages_and_commands(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n\n<!-- docs-test: slow -->\n```python\nx = 1\n```\n\n```console\n$ checkmate a \\\n"
                    "    --b 1   # exit 3\noutput\n$ checkmate c\n```\n<!-- docs-test: skip (needs a GPU) -->\n"
                    "````text\n```\n````\n")
    found = blocks(page)
    assert [(b.language, b.mark, b.line) for b in found] == [("python", "slow", 4), ("console", None, 8),
                                                              ("text", "skip", 15)]
    assert commands(found[1]) == ["checkmate a \\\n    --b 1   # exit 3", "checkmate c"]
    assert _EXIT.search(commands(found[1])[0]).group(1) == "3"
    assert not _runs(found[0], slow=False) and _runs(found[0], slow=True) and not _runs(found[2], slow=True)


def test_a_failing_example_fails_its_page(tmp_path: Path, workdir: Path) -> None:
    page = tmp_path / "broken.md"
    page.write_text("```python\nraise SystemExit(1)\n```\n")
    with pytest.raises(AssertionError, match="failed"):
        _run_page(page, workdir, slow=False)
    page.write_text("```console\n$ checkmate solve missing.json --budget 1GiB\n```\n")
    with pytest.raises(AssertionError, match="exited 2, the page says 0"):
        _run_page(page, workdir, slow=False)
