"""Asking a person at the terminal whether a tool call may run (policy ``ask``).

The question shows the call in full first (the command of ``bash``, the diff a ``write`` or
``edit`` would make) and takes yes, no or always (this call and every later call of the
tool under the same rule in the session). Ctrl+C at the question decides nothing: tether
exits at once (130) and ``tether resume`` asks again.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from tether._cli.approval_view import call_details
from tether._cli.common import one_line
from tether.errors import EXIT_ABORTED

if TYPE_CHECKING:
    from tether._cli.progress import Progress
    from tether._runtime.guards import AuthorizationRequest, Authorizer

YES = frozenset({"y", "yes"})
ALWAYS_ANSWERS = frozenset({"a", "always"})


def question(request: AuthorizationRequest) -> str:
    """``allow bash: rm -rf build? [y]es/[n]o/[a]lways `` (control characters escaped)."""
    why = f" ({one_line(request.reason)})" if request.reason else ""
    return (
        f"allow {request.tool_name}: {one_line(request.summary)}{why}? "
        "[y]es / [n]o / [a]lways for this rule: "
    )


class _Interrupted(Exception):
    pass


def _raise(signum: int, frame: FrameType | None) -> None:
    raise _Interrupted


def terminal_authorizer(progress: Progress, workspace: Path | None = None) -> Authorizer:
    """An :data:`~tether._runtime.guards.Authorizer` that shows the call on stderr and reads
    one line from stdin: ``y``/``yes`` allows, ``a``/``always`` allows for the rule,
    anything else (end of input included) declines. The answer is recorded by the runtime
    before the call runs."""
    from tether._runtime.guards import ALWAYS

    root = workspace if workspace is not None else Path.cwd()

    def ask(request: AuthorizationRequest) -> bool | str:
        progress.pause()
        lines = call_details(request.tool_name, request.arguments, root)
        sys.stderr.write("".join(f"  {line}\n" for line in lines))
        sys.stderr.write(question(request))
        sys.stderr.flush()
        in_main = signal.getsignal(signal.SIGINT) is not None
        previous = None
        try:
            if in_main:
                try:
                    previous = signal.signal(signal.SIGINT, _raise)
                except ValueError:  # not the main thread
                    in_main = False
            answer = sys.stdin.readline()
        except _Interrupted:
            # Nothing was decided: exit like a second Ctrl+C, the session stays resumable.
            sys.stderr.write("\n")
            progress.exit_now(progress.opened)
            os._exit(EXIT_ABORTED)
        except (EOFError, KeyboardInterrupt, OSError):
            answer = ""
        finally:
            if in_main and previous is not None:
                signal.signal(signal.SIGINT, previous)
        choice = answer.strip().lower()
        if choice in ALWAYS_ANSWERS:
            return ALWAYS
        return choice in YES

    return ask
