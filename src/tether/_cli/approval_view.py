"""What a person sees before deciding on a call: the command in full, or the diff a
``write``/``edit`` would make to the file as it is now (shared by the terminal question
and ``tether approvals``).

Every line is escaped (:func:`~tether._cli.common.printable`): the arguments come from the
model and must not drive the terminal.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from tether._cli.common import printable
from tether._tools.workspace import resolve_in_workspace
from tether.errors import TetherError

__all__ = ["MAX_SHOWN_BYTES", "call_details"]

MAX_SHOWN_BYTES: Final = 1024 * 1024
"""A file larger than this is not diffed (the question says so instead)."""


def _current_text(workspace: Path, relative: str) -> str | None:
    """The file's text now (``None``: it does not exist); raises ``ValueError`` with the
    reason when it cannot be shown."""
    try:
        path = resolve_in_workspace(workspace, relative, must_exist=False, for_write=True)
    except (OSError, TetherError) as exc:
        raise ValueError(f"cannot show {relative}: {exc}") from None
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_SHOWN_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"cannot read {relative}: {exc.strerror or exc}") from None
    if len(data) > MAX_SHOWN_BYTES:
        raise ValueError(f"{relative} is larger than {MAX_SHOWN_BYTES} bytes; not shown")
    return data.decode("utf-8", errors="replace")


def _diff(relative: str, before: str | None, after: str) -> list[str]:
    old = [] if before is None else before.splitlines(keepends=True)
    new = after.splitlines(keepends=True)
    lines = list(
        difflib.unified_diff(
            old,
            new,
            fromfile="/dev/null" if before is None else f"a/{relative}",
            tofile=f"b/{relative}",
        )
    )
    if not lines:
        return [f"(no change to {relative})"]
    return [line.rstrip("\n") for line in lines]


def call_details(tool_name: str, arguments: Mapping[str, Any], workspace: Path) -> list[str]:
    """The lines that show what the call would do, in full."""
    path = arguments.get("path")
    try:
        if tool_name == "bash" and isinstance(arguments.get("command"), str):
            lines = [f"$ {line}" for line in str(arguments["command"]).splitlines() or [""]]
        elif tool_name == "write" and isinstance(path, str):
            content = arguments.get("content")
            after = content if isinstance(content, str) else ""
            lines = _diff(path, _current_text(workspace, path), after)
        elif tool_name == "edit" and isinstance(path, str):
            before = _current_text(workspace, path)
            old = arguments.get("old_string")
            new = arguments.get("new_string")
            if before is None:
                lines = [f"{path} does not exist (the edit will fail)"]
            elif not isinstance(old, str) or not isinstance(new, str) or old not in before:
                lines = [f"old_string is not in {path} (the edit will fail)"]
            else:
                count = -1 if arguments.get("replace_all") is True else 1
                lines = _diff(path, before, before.replace(old, new, count))
        else:
            text = json.dumps(dict(arguments), indent=2, ensure_ascii=False, default=repr)
            lines = text.splitlines()
    except ValueError as exc:
        lines = [str(exc)]
    return [printable(line) for line in lines]
