"""Fixed texts of the session format, shared by the reducer and the planner.

* :data:`SYNTHETIC_CONTENT` — the five fixed synthetic tool-result contents (spec 7.6),
  keyed by the ``result.reason`` string. Exact, byte for byte, no trailing newline.
* :func:`is_blank` — the spec's "blank" predicate (spec section 3).
* :data:`PERSON_DENIAL_PREFIX` — how a tool result says a *person* denied the call (a tether
  convention on top of the format, docs/completion.md "A person's denial sticks"): the
  reducer notes such
  results (:attr:`~tether.core.state.SessionState.person_denials`), so that a person's
  denial sticks to the tool for the rest of the session (:mod:`tether.core.policy`).
* :data:`SANDBOX_LINE` / :func:`sandbox_of` — how a tool result says its command ran in
  tether's sandbox (docs/sandbox.md).

Pure constants and functions only: no I/O, clock, environment or mutable globals.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

__all__ = [
    "ABORTED",
    "INTERRUPTED",
    "INVALID_ARGUMENTS",
    "PERSON_DENIAL_PREFIX",
    "PRE_EXECUTION_REASONS",
    "STARTED_REASONS",
    "SYNTHETIC_CONTENT",
    "TRUNCATED",
    "UNKNOWN_TOOL",
    "WHITESPACE",
    "is_blank",
]

PERSON_DENIAL_PREFIX: Final = "Error: permission denied by a person: "
"""The start of the error result of a call a person denied (at the terminal, or with
``tether deny``). The writer commits that result in the call's ``toolStarted`` transaction,
so it never ran; a tool's own output cannot be taken for one (see the reducer)."""

INVALID_ARGUMENTS: Final = "invalidArguments"
UNKNOWN_TOOL: Final = "unknownTool"
TRUNCATED: Final = "truncated"
ABORTED: Final = "aborted"
INTERRUPTED: Final = "interrupted"

SYNTHETIC_CONTENT: Final[Mapping[str, str]] = MappingProxyType(
    {
        INVALID_ARGUMENTS: "Error: Tool arguments were invalid; the tool was not executed.",
        UNKNOWN_TOOL: "Error: Unknown tool; the tool was not executed.",
        TRUNCATED: (
            "Error: Tool call arguments were truncated by the model token limit; "
            "the tool was not executed."
        ),
        ABORTED: "Operation aborted before execution.",
        INTERRUPTED: (
            "Operation interrupted after execution status became unknown; "
            "the tool was not replayed."
        ),
    }
)
"""reason → fixed ``content`` of the synthetic tool message (spec 7.6). Read-only."""

PRE_EXECUTION_REASONS: Final[frozenset[str]] = frozenset(
    {INVALID_ARGUMENTS, UNKNOWN_TOOL, TRUNCATED, ABORTED}
)
"""Reasons valid only on the pre-execution form of a synthetic result (spec 7.4)."""

STARTED_REASONS: Final[frozenset[str]] = frozenset({INTERRUPTED})
"""Reasons valid only on the started form of a tool result (spec 7.3)."""

WHITESPACE: Final[str] = (
    "\u0009\u000a\u000b\u000c\u000d"
    "\u001c\u001d\u001e\u001f"
    "\u0020\u0085\u00a0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
"""The spec's whitespace set (section 3). U+FEFF is *not* whitespace; U+001C–U+001F are."""


def is_blank(value: object) -> bool:
    """True when ``value`` is ``None`` or a string made only of :data:`WHITESPACE`.

    The empty string is blank. Any other value (not a string, not ``None``) is not
    blank: "blank" is only defined for message contents.
    """
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip(WHITESPACE)
    return False


SANDBOX_LINE: Final = "sandbox: "
"""How a tool result says its command ran in tether's sandbox: a line
``sandbox: MODE, network on|off`` after the command's output and exit code (the log keeps
it, so ``tether show`` can tell, docs/sandbox.md)."""


def sandbox_of(content: object) -> str | None:
    """The mode line's value of a tool result (``workspace-write, network off``), if any:
    the last line that starts with :data:`SANDBOX_LINE`, without a note in parentheses."""
    if not isinstance(content, str):
        return None
    start = content.rfind("\n" + SANDBOX_LINE)
    if start < 0:
        return None
    line = content[start + 1 + len(SANDBOX_LINE) :].split("\n", 1)[0]
    return line.split(" (", 1)[0].strip() or None
