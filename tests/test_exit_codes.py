"""One table of exit statuses (``tether.errors.EXIT_STATUSES``), and nothing beside it.

* the table itself: one row per code, each error type and run outcome in one row, every
  error of ``tether.errors`` and every ``RunStatus`` covered, no class writing its own code;
* the README's and ``docs/cli.md``'s exit-status tables list exactly the table's codes;
* no command module (``src/tether/_cli``) writes an exit status as a number other than 0:
  it names a constant of the table or raises an error the table maps (the checker is tested
  on small sources, so that a walk that saw nothing cannot pass).
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import tether._cli
import tether.errors as errors
from tether._cli.common import InputError
from tether._cli.run_cmd import (
    EXIT_ABORTED,
    EXIT_AWAITING_APPROVAL,
    EXIT_BLOCKED,
    EXIT_FAILED,
    EXIT_UNVERIFIED,
)
from tether._runtime.results import RunStatus
from tether.errors import EXIT_STATUSES, exit_code_of, outcome_exit_code

ROOT = Path(__file__).resolve().parent.parent
CLI_DIR = Path(tether._cli.__file__).parent
CODES = {row.code for row in EXIT_STATUSES}


# =========================================================================== the table


def test_each_code_has_one_row_with_a_one_line_meaning() -> None:
    codes = [row.code for row in EXIT_STATUSES]
    assert codes == sorted(set(codes))
    for row in EXIT_STATUSES:
        assert row.meaning.strip() and "\n" not in row.meaning, row.code


def test_each_error_type_and_outcome_is_in_one_row() -> None:
    listed = [error for row in EXIT_STATUSES for error in row.errors]
    assert len(listed) == len(set(listed))
    outcomes = [outcome for row in EXIT_STATUSES for outcome in row.outcomes]
    assert len(outcomes) == len(set(outcomes))


def _error_classes() -> list[type[errors.TetherError]]:
    return [
        value
        for value in vars(errors).values()
        if inspect.isclass(value) and issubclass(value, errors.TetherError)
    ]


def test_every_error_reads_its_code_from_the_table() -> None:
    classes = [*_error_classes(), InputError]
    assert len(classes) > 30
    for cls in classes:
        # A class that wrote `exit_code = N` would be a second table.
        assert cls is errors.TetherError or "exit_code" not in vars(cls), cls.__name__
        assert cls.exit_code == exit_code_of(cls) in CODES, cls.__name__


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.TetherError, 1),
        (errors.SessionCorruption, 1),
        (errors.ConfigurationError, 2),
        (InputError, 2),
        (errors.InputTooLarge, 2),
        (errors.SessionNotFound, 3),
        (errors.CorruptSession, 5),
        (errors.UnsupportedSessionVersion, 6),
        (errors.SessionCreateError, 9),
        (errors.SessionFenced, 11),
        (errors.StoreSchemaError, 12),
        (errors.ProtectedPath, 1),
        (errors.ApprovalNotFound, 25),
        (errors.ApprovalDecided, 26),
        (errors.CheckCommandError, 31),
        (ValueError, 70),
        (KeyError, 70),
    ],
)
def test_an_error_has_the_code_of_its_nearest_listed_base(
    error: type[BaseException], code: int
) -> None:
    assert exit_code_of(error) == code


def test_an_instance_reads_the_table_too() -> None:
    assert errors.SessionNotFound("x").exit_code == 3
    assert errors.ReviewRequired(1, "t", "op", "why").exit_code == 24


def test_every_run_outcome_has_a_code() -> None:
    assert {status.value: outcome_exit_code(status.value) for status in RunStatus} == {
        "completed": 0,
        "idle": 0,
        "failed": EXIT_FAILED,
        "blocked": EXIT_BLOCKED,
        "awaiting_approval": EXIT_AWAITING_APPROVAL,
        "aborted": EXIT_ABORTED,
        "stopped": EXIT_ABORTED,
    }
    assert (EXIT_FAILED, EXIT_BLOCKED, EXIT_UNVERIFIED, EXIT_AWAITING_APPROVAL) == (1, 65, 66, 67)
    with pytest.raises(ValueError, match="no exit status"):
        outcome_exit_code("bogus")


# =========================================================================== the documents


def _section_codes(text: str, heading: str) -> set[int]:
    """The codes in the first column of the tables under ``heading`` (until the next
    heading of the same or a higher level): ``3``, ``25 / 26``, ``20–24``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip("#").strip() == heading)
    level = len(lines[start]) - len(lines[start].lstrip("#"))
    codes: set[int] = set()
    rows = 0
    for line in lines[start + 1 :]:
        if line.startswith("#") and len(line) - len(line.lstrip("#")) <= level:
            break
        if not line.startswith("|"):
            continue
        cell = line.split("|")[1].strip()
        if cell in ("status", "") or set(cell) <= {"-", ":"}:
            continue
        rows += 1
        for part in re.split(r"\s*[/,]\s*", cell):
            bounds = re.fullmatch(r"(\d+)\s*[–-]\s*(\d+)", part)
            if bounds:
                codes.update(range(int(bounds[1]), int(bounds[2]) + 1))
            else:
                assert part.isdigit(), f"not a status: {cell!r}"
                codes.add(int(part))
    assert rows > 5, f"no exit-status table under {heading!r}"
    return codes


@pytest.mark.parametrize(
    ("document", "heading"), [("README.md", "Exit status"), ("docs/cli.md", "Exit status")]
)
def test_the_documents_list_exactly_the_codes_of_the_table(document: str, heading: str) -> None:
    listed = _section_codes((ROOT / document).read_text(encoding="utf-8"), heading)
    assert sorted(listed - CODES) == [], f"{document} lists codes the table lacks"
    assert sorted(CODES - listed) == [], f"{document} lacks codes of the table"


def test_the_section_reader_expands_ranges_and_alternatives() -> None:
    text = "## Exit status\n\n| status | meaning |\n|---|---|\n" + "".join(
        f"| {cell} | x |\n" for cell in ("0", "3 / 4", "20–22", "6-7", "9", "70")
    )
    assert _section_codes(text + "## Next\n| 99 | y |\n", "Exit status") == {
        0,
        3,
        4,
        6,
        7,
        9,
        20,
        21,
        22,
        70,
    }


# =========================================================================== no literal codes

EXIT_CALLS = frozenset({"Exit", "SystemExit", "exit", "_exit"})
"""``typer.Exit(n)``, ``raise SystemExit(n)``, ``sys.exit(n)``, ``os._exit(n)``."""
CODE_NAMES = re.compile(r"(?i)^(exit_\w+|exit_code|code|status)$")
"""Names an exit status is kept in before it is used."""


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _literals(node: ast.AST | None) -> list[int]:
    """The int literals other than 0 (and not bools) anywhere in ``node``."""
    if node is None:
        return []
    return [
        sub.value
        for sub in ast.walk(node)
        if isinstance(sub, ast.Constant)
        and isinstance(sub.value, int)
        and not isinstance(sub.value, bool)
        and sub.value != 0
    ]


def literal_exit_codes(source: str) -> list[str]:
    """``line: what`` for each exit status written as a number other than 0 in ``source``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        values: list[int] = []
        if isinstance(node, ast.Call):
            name = _name(node.func)
            if name in EXIT_CALLS:
                values = [v for arg in node.args for v in _literals(arg)]
                values += [v for kw in node.keywords for v in _literals(kw.value)]
            elif name == "fail":  # fail(message, exit_code)
                values = _literals(node.args[1]) if len(node.args) > 1 else []
                values += [
                    v for kw in node.keywords if kw.arg == "exit_code" for v in _literals(kw.value)
                ]
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(CODE_NAMES.match(_name(target)) for target in targets):
                values = _literals(node.value)
        elif isinstance(node, ast.FunctionDef) and re.search(r"exit|code", node.name):
            values = [
                v
                for sub in ast.walk(node)
                if isinstance(sub, ast.Return)
                for v in _literals(sub.value)
            ]
        found += [f"{getattr(node, 'lineno', 0)}: {value}" for value in values]
    return found


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ("raise typer.Exit(3)", True),
        ("raise typer.Exit(0)", False),
        ("raise typer.Exit()", False),
        ("raise typer.Exit(EXIT_FAILED)", False),
        ("raise SystemExit(130) from None", True),
        ("sys.exit(2)", True),
        ("os._exit(75)", True),
        ("raise typer.Exit(0 if ok else 1)", True),
        ("raise typer.Exit(OK if ok else FAIL)", False),
        ("fail('x', 2)", True),
        ("fail(f'{a[1]}', EXIT_USAGE)", False),
        ("fail('x', exit_code=65)", True),
        ("EXIT_PASS = 0", False),
        ("EXIT_FAIL = 1", True),
        ("code = 130", True),
        ("class E(TetherError):\n    exit_code = 5", True),
        ("def exit_status(r):\n    return 0 if r else 1", True),
        ("def size(r):\n    return 1", False),
        ("x = [1, 2][1]", False),
    ],
)
def test_the_literal_checker(source: str, bad: bool) -> None:
    assert bool(literal_exit_codes(source)) is bad


def test_no_command_module_writes_an_exit_status_as_a_number() -> None:
    modules = sorted(CLI_DIR.glob("*.py"))
    assert len(modules) > 15
    found = {
        path.name: hits
        for path in modules
        if (hits := literal_exit_codes(path.read_text(encoding="utf-8")))
    }
    assert found == {}, "use a constant of tether.errors.EXIT_STATUSES instead"
