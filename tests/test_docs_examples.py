"""The README's and docs' examples are run, so they cannot drift from the code.

* The README's Python blocks: "The pure core" runs against the conformance fixtures and
  every ``print(…)  # expected`` comment is compared with what it printed; "Running an
  agent" runs in a fresh workspace with a scripted model (every event it prints is one line
  of JSON); the effect tool example (it needs a billing service) is compiled.
* Every ``$ tether …`` line of a ``console`` block in README.md and docs/*.md is parsed by
  the real CLI (command, flags, argument count), so a renamed flag or command fails here.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import typer

from fixturekit import at_least
from test_cli_run import cli_env
from tether._cli import app

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path, language: str) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def python_block(containing: str) -> str:
    [block] = [b for b in blocks(ROOT / "README.md", "python") if containing in b]
    return block


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def expected_prints(code: str) -> list[str]:
    """The ``# expected`` comment of every top-level ``print(...)`` line."""
    out = []
    for line in code.splitlines():
        match = re.match(r"\s*print\(.*\)\s+#\s*(.+)$", line)
        if match:
            out.append(match.group(1).strip())
    return out


def matches(printed: str, expected: str) -> bool:
    """``expected`` as written in the README: ``...``/``…`` stand for anything."""
    parts = re.split(r"\.\.\.|…", expected)
    pattern = ".*".join(re.escape(part.strip()) for part in parts)
    return re.fullmatch(pattern, printed.strip(), flags=re.DOTALL) is not None or (
        len(parts) > 1 and printed.strip().startswith(parts[0].strip())
    )


def test_the_pure_core_example_prints_what_its_comments_say() -> None:
    code = python_block("from tether.core import")
    ran = run_python(code, ROOT)
    assert ran.returncode == 0, ran.stderr
    printed = ran.stdout.splitlines()
    expected = expected_prints(code)
    # The except branch does not run for a valid fixture: its comment is not printed.
    expected = [e for e in expected if not e.startswith('{"code"')]
    assert len(printed) == len(expected), (printed, expected)
    for got, want in zip(printed, expected, strict=True):
        assert matches(got.replace("'", '"'), want), (got, want)


def test_the_readme_library_examples_are_the_examples_scripts() -> None:
    """The README's "Running an agent" and effect-tool blocks are the code of
    examples/run_agent.py and examples/effect_tool.py, which tests/test_examples.py runs."""
    agent = (ROOT / "examples" / "run_agent.py").read_text(encoding="utf-8")
    assert python_block("from tether import Agent") in agent
    effect = (ROOT / "examples" / "effect_tool.py").read_text(encoding="utf-8")
    block = python_block("class SendInvoice")
    assert block.split("\n\n", 1)[1] in effect  # the class, as the README shows it
    compile(block, "README.md", "exec")
    for path in DOCS:
        for name in re.findall(r"scripted:(?:\.\./)*(examples/[\w./-]+\.json)", path.read_text()):
            assert (ROOT / name).is_file(), f"{path.name} names {name}, which is not there"


# --------------------------------------------------------------------------- the CLI lines


def tether_lines() -> list[tuple[str, str]]:
    """Every ``$ tether …`` line of the documents: 32 today; fewer than 25 fail the collection
    (fixturekit), e.g. when the documents are not where :data:`DOCS` looks."""
    found = []
    for path in DOCS:
        for block in blocks(path, "console"):
            for line in block.splitlines():
                if line.startswith("$ tether") or (line.startswith("$ cd") and "tether " in line):
                    command = line[line.index("tether ") :] if "tether " in line else line
                    found.append((path.name, command.split("  #")[0].split(" # ")[0]))
    return at_least(25, found, "documented command lines")


def parse(words: list[str]) -> None:
    """Parse ``tether WORDS`` with the real command tree (nothing runs)."""
    group = typer.main.get_command(app)
    ctx = group.make_context("tether", list(words), resilient_parsing=False)

    def rest_of(ctx: Any) -> list[str]:
        protected = getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", [])
        return [*protected, *ctx.args]

    while isinstance(ctx.command, typer.core.TyperGroup) and rest_of(ctx):
        rest = rest_of(ctx)
        name, sub, remaining = ctx.command.resolve_command(ctx, rest)
        assert sub is not None, name
        ctx = sub.make_context(name or "", remaining, parent=ctx)


@pytest.mark.parametrize(("document", "line"), tether_lines())
def test_every_documented_command_line_parses(document: str, line: str) -> None:
    words = shlex.split(textwrap.dedent(line))[1:]
    try:
        parse(words)
    except typer.Exit:
        pass  # --help and friends
    except Exception as exc:  # a usage error: the docs drifted
        pytest.fail(f"{document}: `{line}` does not parse: {exc}")
