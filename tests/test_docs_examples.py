"""The README's and docs' examples are run, so they cannot drift from the code.

* The README's Python blocks: "The pure core" runs against the conformance fixtures and
  every ``print(…)  # expected`` comment is compared with what it printed; "Running an
  agent" and the effect tool are the code of ``examples/run_agent.py`` and
  ``examples/effect_tool.py``, which ``tests/test_examples.py`` runs.
* Every ``console`` block of README.md and docs/*.md is run, command by command, in a fresh
  workspace (a copy of ``examples/``, the README and the conformance fixtures, or the
  example workspace an ``<!-- workspace: examples/NAME -->`` comment before the block
  names): each ``$ tether …`` line in this process through typer's runner (a line with an
  environment prefix or a crash in a subprocess), a shell line (``cat``, ``echo``) with
  bash. The exit status must be the one a ``# exit N`` / ``# killed`` comment names (else
  non-zero where the output shown starts with ``error:``/``blocked:``, else 0), and every
  output line shown must be printed, up to ids, digests, paths, durations, sizes and numbers
  (``…`` stands for anything). Lines at the REPL's ``› `` prompt are its stdin. A block
  marked ``<!-- not-run: REASON -->`` (a provider key, strace, minutes of crash lab) is
  listed and counted in :data:`NOT_RUN`, never skipped silently.
* Every ``$ tether …`` line, run or not, is also parsed by the real CLI.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

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


# --------------------------------------------------------------------------- the CLI blocks, run

# The console blocks not run here, each with the reason the document gives in an HTML comment
# right before the block (``<!-- not-run: REASON -->``): listed and counted, so none is left
# out silently. A new one must be added here too.
NOT_RUN = {
    ("cli.md", "needs a provider key"),
    ("crashlab.md", "the whole lab takes minutes: make crashlab; tests/test_crashlab.py"),
    ("crashlab.md", "a failing lab of 40 runs: tests/test_crashlab.py runs it"),
    ("crashlab.md", "needs strace and a minute: tests/test_io_errors.py runs it"),
    ("crashlab.md", "needs strace and a minute: tests/test_power_loss.py runs it"),
    ("crashlab.md", "needs strace: tests/test_power_loss.py runs the planted bug"),
}
_MARK = re.compile(r"<!--\s*(not-run|workspace):\s*(.*?)\s*-->")
_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
_HEX = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{8,}\b")
_PATH = re.compile(r"(?<![\w.])/[^\s`'\"():,;]*")


@dataclass
class Command:
    line: str
    """The command as the document shows it (after ``$ ``, without its comment)."""
    output: list[str] = field(default_factory=list)
    """The output lines the document shows (without their comments)."""
    status: int | None = None
    """The exit status a comment names (``exit 75``, ``killed``), if one does."""
    stdin: list[str] = field(default_factory=list)
    """The lines typed at the REPL's ``› `` prompt (fed on stdin; not printed from a pipe)."""


@dataclass
class ConsoleBlock:
    document: str
    line: int
    commands: list[Command]
    workspace: str | None = None
    not_run: str | None = None

    @property
    def name(self) -> str:
        return f"{self.document}:{self.line}"


def _comment(text: str) -> tuple[str, str | None]:
    """``text`` without a trailing ``  # comment`` (outside quotes), and the comment."""
    match = re.search(r"\s#\s(.*)$", text)
    if match is None or text[: match.start()].count('"') % 2 or text.startswith("#"):
        return text.rstrip(), None
    return text[: match.start()].rstrip(), match.group(1)


def _status(comment: str | None) -> int | None:
    if comment is None:
        return None
    found = re.search(r"\bexit(?: status)? (\d+)", comment)
    if found:
        return int(found.group(1))
    return -signal.SIGKILL if re.search(r"\bkilled\b", comment, flags=re.IGNORECASE) else None


def console_blocks() -> list[ConsoleBlock]:
    """Every ``console`` block of README.md and docs/*.md, with the marks before it."""
    found = []
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        index = 0
        while index < len(lines):
            if lines[index].strip() != "```console":
                index += 1
                continue
            marks: dict[str, str] = {}
            back = index - 1
            while back >= 0 and (not lines[back].strip() or _MARK.search(lines[back])):
                for kind, value in _MARK.findall(lines[back]):
                    marks[kind] = value
                back -= 1
            block = ConsoleBlock(
                path.name, index + 1, [], marks.get("workspace"), marks.get("not-run")
            )
            index += 1
            while lines[index].strip() != "```":
                text, comment = _comment(lines[index])
                if text.startswith("$ "):
                    block.commands.append(Command(text[2:], status=_status(comment)))
                elif block.commands and text.startswith("› "):
                    block.commands[-1].stdin.append(text[2:])
                elif block.commands and comment != "on a terminal only":
                    command = block.commands[-1]
                    command.status = _status(comment) if comment else command.status
                    command.output.append(text)
                index += 1
            found.append(block)
            index += 1
    return found


def normalized(line: str) -> str:
    """A line with what differs between runs made alike: ids, digests, paths, durations,
    sizes, numbers."""
    line = _UUID.sub("ID", line.rstrip())
    line = re.sub(r"\b[0-9a-f]{4,8}-?…", "…", line)  # an id or digest cut short: 01a2…
    line = _HEX.sub("HEX", line)
    line = _PATH.sub("PATH", line)
    line = re.sub(r"\b\d+(?:\.\d+)? (?:ms|s|min)\b", "DURATION", line)  # 345 ms, 2.5 s
    line = re.sub(r"\b\d+(?:\.\d+)? (?:B|KB|MB|GB)\b", "SIZE", line)  # 24 B, 6.3 KB
    return re.sub(r"\d+", "N", line)


def shown(expected: str, printed: list[str]) -> bool:
    """Whether the document's output line ``expected`` is one of the ``printed`` lines
    (``…`` stands for anything; a line of only ``…`` for lines left out)."""
    want = normalized(expected)
    if want.strip("… ") == "":
        return True
    pattern = ".*".join(re.escape(part) for part in want.split("…"))
    return any(re.fullmatch(pattern, normalized(line)) for line in printed)


def _workspace(block: ConsoleBlock, into: Path) -> Path:
    if block.workspace is not None:
        shutil.copytree(ROOT / block.workspace, into, dirs_exist_ok=True)
        return into
    shutil.copytree(ROOT / "examples", into / "examples")
    shutil.copytree(ROOT / "tests" / "conformance", into / "tests" / "conformance")
    shutil.copy(ROOT / "README.md", into / "README.md")
    return into


def _in_process(words: list[str], cwd: Path, env: dict[str, str], stdin: str) -> tuple[int, str]:
    """``tether WORDS`` in this process (typer's runner): no interpreter start-up."""
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, words, input=stdin, env=env, catch_exceptions=False)
    finally:
        os.chdir(previous)
    return result.exit_code, result.stdout + result.stderr


def run_command(command: Command, cwd: Path) -> tuple[int, str, Path]:
    """Run one documented command in ``cwd``: the exit status, what it printed (stdout and
    stderr) and the directory the next command runs in."""
    line = command.line
    here = cwd
    cd = re.match(r"cd (\S+) && (.*)$", line)
    if cd is not None:
        here, line = (cwd / cd.group(1)).resolve(), cd.group(2)
    words = shlex.split(line)
    env: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    stdin = "".join(f"{typed}\n" for typed in command.stdin)
    bin_dir = str(Path(sys.executable).parent)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    if words[:1] == ["tether"] and not env and "--crash-at" not in words:
        status, out = _in_process(words[1:], here, {"PATH": path, "COLUMNS": "200"}, stdin)
        return status, out, cwd
    if words[:1] == ["tether"]:
        line = shlex.join([sys.executable, "-m", "tether", *words[1:]])
    ran = subprocess.run(
        ["bash", "-c", line],
        cwd=here,
        env=cli_env(PATH=path, COLUMNS="200", **env),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return ran.returncode, ran.stdout + ran.stderr, cwd


def runnable_blocks() -> list[ConsoleBlock]:
    return [block for block in console_blocks() if block.not_run is None]


def test_the_console_blocks_not_run_are_listed_and_counted() -> None:
    skipped = {(b.document, b.not_run) for b in console_blocks() if b.not_run is not None}
    for block in console_blocks():
        if block.not_run is not None:
            print(f"not run: {block.name}: {block.not_run}")
    assert skipped == NOT_RUN
    runnable = runnable_blocks()
    assert len(runnable) >= 12, [b.name for b in runnable]
    assert sum(len(b.commands) for b in runnable) >= 30


@pytest.mark.parametrize("block", runnable_blocks(), ids=lambda block: block.name)
def test_every_console_block_runs_as_shown(block: ConsoleBlock, tmp_path: Path) -> None:
    cwd = _workspace(block, tmp_path / "ws")
    for command in block.commands:
        status, out, cwd = run_command(command, cwd)
        printed = out.splitlines()
        errors = bool(command.output) and command.output[0].startswith(("error:", "blocked:"))
        if command.status is not None:
            assert status == command.status, (command.line, status, out)
        elif errors:
            assert status not in (0, None), (command.line, out)
        else:
            assert status == 0, (command.line, status, out)
        for expected in command.output:
            assert shown(expected, printed), f"`{command.line}` did not print {expected!r}:\n{out}"
