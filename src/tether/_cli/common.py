"""Shared plumbing of the command modules: error mapping, input reading, output.

Every command body runs inside :func:`handle_errors`, which turns the errors a user
can cause into one line on stderr and a distinct exit code:

* :class:`~tether.errors.TetherError` subclasses → ``error: <message>`` and the exit code
  of the error's row in :data:`tether.errors.EXIT_STATUSES`, the one table every command
  reads (the message is :func:`error_message`: a :class:`~tether.errors.SessionCorruption`
  reads ``error: session NAME is corrupt: CODE at line N …`` with what is still readable,
  and exits with its row's code; a session write that failed on a
  full disk says so; a :class:`~tether.errors.ConfigurationError` exits 2);
* unreadable, oversized or non-regular input files (:func:`read_input`, through
  :mod:`tether._inputs`) → exit 2;
* anything else is a bug in tether → one line naming the exception, exit
  :data:`EXIT_INTERNAL` (set ``TETHER_DEBUG=1`` to get the traceback instead).

Typer's own usage errors (unknown flag, missing argument) keep their exit code 2.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import orjson
import typer

from tether._credentials import Masker
from tether._inputs import MAX_JSON_DEPTH, deeper_than, read_file
from tether._project import find_workspace_root
from tether._stores.file import sessions_dir_for
from tether._text import printable as printable  # the commands take it from here
from tether.errors import EXIT_BROKEN_PIPE as EXIT_BROKEN_PIPE
from tether.errors import (
    EXIT_FAILED,
    ConfigurationError,
    CorruptSession,
    FactRejected,
    InputTooDeep,
    SessionCorruption,
    SessionWriteError,
    TetherError,
    UnsupportedSessionVersion,
    exit_code_of,
)
from tether.errors import EXIT_INTERNAL as EXIT_INTERNAL
from tether.errors import EXIT_OK as EXIT_OK
from tether.errors import EXIT_USAGE as EXIT_USAGE

# The codes the commands name come from the one table (tether.errors.EXIT_STATUSES); they
# are re-exported here for the command modules.
EXIT_CORRUPT = EXIT_FAILED

DEBUG_ENV = "TETHER_DEBUG"


class InputError(ConfigurationError):
    """A command-line input (a file, a flag value) is missing, unreadable or malformed.

    A :class:`~tether.errors.ConfigurationError`, so its exit status is the table's usage
    error (2), like every other input a user gives.
    """


def one_line(text: str) -> str:
    """Collapse whitespace runs (including newlines) and escape control characters."""
    return printable(" ".join(text.split()))


def fail(message: str, exit_code: int) -> NoReturn:
    """Print ``error: <message>`` as one line on stderr and exit with ``exit_code``.

    tether's credentials are masked in it, whatever the error quotes.
    """
    typer.echo(f"error: {one_line(Masker.for_process().text(message))}", err=True)
    raise typer.Exit(exit_code)


FULL_DISK: dict[int, str] = {
    errno.ENOSPC: "the disk is full; free some space on it first",
    errno.EDQUOT: "the disk quota is used up; free some space first",
}
"""What a session write failed with (its ``errno``) says to a user, beyond the OS's text."""


def corruption_message(
    exc: SessionCorruption, session: str | None = None, *, shown: bool = False
) -> str:
    """What every command says about a log that does not reduce: where, what, next step.

    One wording for ``inspect``, ``show``, ``plan``, ``resume`` and ``run --session``:
    ``session NAME is corrupt: CODE at line N, seq S (detail)``, then what is still
    readable. ``NAME`` is the file when the store names it (:class:`CorruptSession`), else
    ``session``, what the user named it by. The lines before line N reduced, and nothing
    repairs a bad line in the middle (a repair only cuts a torn last line), so the next
    step is to look at them: ``tether show`` draws them and marks where the log stops
    (``shown``: it just did).
    """
    if isinstance(exc, UnsupportedSessionVersion):
        return str(exc)  # not corrupt: written in a format this tether does not read
    if isinstance(exc, FactRejected):
        return f"session is corrupt: {exc}"  # a write refused before it reached the log
    name = exc.path if isinstance(exc, CorruptSession) else session
    where = f"line {exc.line}" + (f", seq {exc.seq}" if exc.seq is not None else "")
    text = f"session {name} is corrupt" if name else "session log is corrupt"
    text += f": {exc.code} at {where}" + (f" ({exc.detail})" if exc.detail else "")
    if exc.line <= 1:
        return text + "; its first line is no session header, so nothing in it can be read"
    before = (
        "the line before it is" if exc.line == 2 else f"the {exc.line - 1:,} lines before it are"
    )
    if shown:
        return f"{text}; {before} intact: the timeline shows them and nothing after it"
    return (
        f"{text}; {before} intact: `tether show {name or 'SESSION'}` shows them and where "
        "the log stops"
    )


def error_message(exc: TetherError, session: str | None = None) -> str:
    """The text after ``error:`` for ``exc``, the same for every command.

    A log that does not reduce is worded by :func:`corruption_message` (``session``: what
    the user named the session by, when the error does not carry its file). A session log
    that could not be written or created on a full disk (``ENOSPC``, ``EDQUOT``) gets
    :data:`FULL_DISK`'s explanation appended; the exit code stays the exception's (9).
    """
    if isinstance(exc, SessionCorruption):
        return corruption_message(exc, session)
    message = str(exc)
    if isinstance(exc, SessionWriteError) and exc.errno in FULL_DISK:
        message += f" ({FULL_DISK[exc.errno]})"
    return message


@contextmanager
def handle_errors(session: str | None = None) -> Iterator[None]:
    """Map every error raised by a command body to one stderr line and an exit code
    (``session``: what the user named the session by, for :func:`error_message`)."""
    try:
        yield
    except typer.Exit:
        raise
    except TetherError as exc:
        fail(error_message(exc, session), exit_code_of(type(exc)))
    except BrokenPipeError:
        # The reader went away (e.g. `| head`); silence the flush at interpreter exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise typer.Exit(EXIT_BROKEN_PIPE) from None
    except Exception as exc:
        if os.environ.get(DEBUG_ENV):
            raise
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        fail(f"internal error: {what} (set {DEBUG_ENV}=1 for a traceback)", EXIT_INTERNAL)


def read_input(path: Path, what: str = "file", *, limit: int) -> bytes:
    """Read a whole input file as raw bytes, at most ``limit`` of them.

    Goes through :func:`tether._inputs.read_file`: only a regular file is read (a FIFO or
    a device is refused without blocking), and one over ``limit`` is refused before it is
    read. Every problem is an :class:`~tether.errors.InputFileError` (exit 2) naming
    ``what`` and ``path``.
    """
    return read_file(path, f"{what} {path}", limit=limit)


def load_json_object(
    path: Path, what: str, *, limit: int, max_depth: int = MAX_JSON_DEPTH
) -> dict[str, Any]:
    """Read ``path`` and parse it as a JSON object (exit 2 on any failure).

    Nesting deeper than ``max_depth`` is refused before parsing
    (:class:`~tether.errors.InputTooDeep`).
    """
    data = read_input(path, what, limit=limit)
    if deeper_than(data, max_depth):
        raise InputTooDeep(f"{what} {path}", max_depth)
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{what} {path} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InputError(f"{what} {path} must contain a JSON object")
    return value


def _json_default(value: Any) -> Any:
    """Serialize the read-only containers and enums the core hands out."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps_json(value: Any) -> bytes:
    """The indented JSON text of ``value`` (UTF-8, LF, trailing newline)."""
    try:
        return orjson.dumps(
            value, default=_json_default, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE
        )
    except orjson.JSONEncodeError as exc:
        error = exc
    # orjson writes at most 254 levels. A session line may hold values that deep (the
    # reducer's MAX_LINE_DEPTH), and a document around them, such as inspect's
    # {"ok", "state": {"operation": …}}, adds a few more. The json module writes those;
    # for anything else orjson refused it fails too, and orjson's error stands.
    try:
        text = json.dumps(value, default=_json_default, indent=2, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        raise error from None
    return text.encode("utf-8") + b"\n"


def emit_json(value: Any) -> None:
    """Write ``value`` as one JSON document to stdout."""
    data = dumps_json(value)
    stream = sys.stdout
    buffer = getattr(stream, "buffer", None)
    if buffer is None:
        stream.write(data.decode("utf-8"))
        stream.flush()
        return
    stream.flush()
    buffer.write(data)
    buffer.flush()


SessionsDirOption = Annotated[
    Path | None,
    typer.Option(
        "--sessions-dir",
        help="Folder of session logs (default: .tether/sessions of the workspace: the "
        "nearest folder at or above the current one with tether.toml or .tether/, see "
        "docs/config.md). Logs written by other implementations of the format, e.g. "
        ".tiny-agent/sessions, are read too.",
        metavar="DIR",
    ),
]

WORKSPACE_HELP = (
    "Workspace folder; no search then (default: the nearest folder at or above the current "
    "one holding tether.toml or .tether/, not above a git top level; else the current "
    "directory)."
)


def workspace_root(workspace: Path | None) -> Path:
    """The workspace of a command: ``--workspace DIR`` as given, else the one found.

    One function for every command (see :func:`tether._project.find_workspace_root` for
    the search). When the search found a root above the current directory, one line on
    stderr says which (never on stdout: ``--json`` output stays one document).
    """
    root = find_workspace_root(workspace)
    if root.notice is not None:
        typer.echo(printable(root.notice), err=True)
    return root.path


def resolve_sessions_dir(sessions_dir: Path | None) -> Path:
    """The folder named by ``--sessions-dir``, or the workspace's default."""
    if sessions_dir is not None:
        return sessions_dir
    return sessions_dir_for(workspace_root(None))
