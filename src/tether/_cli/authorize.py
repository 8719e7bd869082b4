"""Asking a person at the terminal whether a tool call may run (policy ``ask``)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from tether._cli.common import one_line

if TYPE_CHECKING:
    from tether._cli.progress import Progress
    from tether._runtime.guards import AuthorizationRequest, Authorizer

YES = frozenset({"y", "yes"})


def question(request: AuthorizationRequest) -> str:
    """``allow bash: rm -rf build? [y/N] `` (control characters escaped)."""
    why = f" ({one_line(request.reason)})" if request.reason else ""
    return f"allow {request.tool_name}: {one_line(request.summary)}{why}? [y/N] "


def terminal_authorizer(progress: Progress) -> Authorizer:
    """An :data:`~tether._runtime.guards.Authorizer` that asks on stderr and reads one
    line from stdin; anything but ``y``/``yes`` (end of input included) is a no. The
    answer is recorded by the runtime before the call runs."""

    def ask(request: AuthorizationRequest) -> bool:
        progress.pause()
        sys.stderr.write(question(request))
        sys.stderr.flush()
        try:
            answer = sys.stdin.readline()
        except (EOFError, KeyboardInterrupt, OSError):
            answer = ""
        return answer.strip().lower() in YES

    return ask
