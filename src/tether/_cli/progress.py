"""Progress rendering for ``tether run``, ``tether resume`` and the REPL.

Two renderers consume the agent's progress events (:mod:`tether._runtime.events`):

* :class:`HumanProgress` — rich output on **stderr**: a spinner while the model works
  (only on a terminal), one line per tool call (``✓ read README.md → 1.2 KB``), skipped
  calls, usage at the end; the final answer goes to **stdout**.
* :class:`JsonProgress` — one JSON object per line on **stdout** (``event.to_dict()``),
  closed by a ``{"event": "result", …}`` line. Nothing else is written to stdout.

Both also print the interrupt notices of the SIGINT handler and the closing
"how to continue" lines (on stderr, never on stdout).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from rich.console import Console
from rich.status import Status
from rich.text import Text

from tether._cli.common import one_line, printable
from tether._loading import reduce_session

if TYPE_CHECKING:  # the runtime pulls in the model SDKs: import it only when an agent runs
    from tether._runtime import events
    from tether._runtime.executor import RunResult

ABORTING_NOTICE = "aborting… (press Ctrl+C again to exit now; the session stays resumable)"
"""What the first Ctrl+C prints."""

ARGUMENT_WIDTH = 60
"""Maximum characters of the argument summary in a tool line."""

_SKIP_TEXT = {
    "invalidArguments": "invalid arguments",
    "unknownTool": "unknown tool",
    "truncated": "truncated answer",
    "aborted": "aborted, not run",
    "interrupted": "interrupted",
    "denied": "denied by the policy, not run",
    "declined": "declined by a person, not run",
}


def format_size(size: int) -> str:
    """``12 B``, ``1.2 KB``, ``3.4 MB`` (1 KB = 1024)."""
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KB"
    return f"{size / (1024 * 1024):.1f} MB"


def summarize_arguments(name: str, raw: str | None) -> str:
    """A short one-line description of a call's arguments (path, command, …)."""
    if raw is None:
        return ""
    try:
        value = json.loads(raw)
    except ValueError:
        text = one_line(raw)
    else:
        if isinstance(value, Mapping):
            key = "command" if name == "bash" else "path"
            chosen = value.get(key)
            if not isinstance(chosen, str):
                chosen = next((v for v in value.values() if isinstance(v, str)), None)
            text = one_line(chosen) if isinstance(chosen, str) else ""
        else:
            text = one_line(raw)
    if len(text) > ARGUMENT_WIDTH:
        text = text[: ARGUMENT_WIDTH - 1] + "…"
    return text


def usage_text(result: RunResult) -> str:
    """``usage: input 10, output 3, cache read 0, cache write 0 (session: …)``."""
    run = result.usage
    total = result.session_usage
    return (
        f"usage: input {run.input}, output {run.output}, cache read {run.cache_read}, "
        f"cache write {run.cache_write} (session total: input {total.input}, "
        f"output {total.output}{_cost_text(result.session_cost_usd)})"
    )


def _cost_text(usd: float | None) -> str:
    """``, $0.0123`` when the session's cost is known (a price or a reported cost)."""
    return f", ${usd:.4f}" if usd else ""


def resume_command(session_id: str, location: str = "") -> str:
    """``tether resume ID`` (plus the ``--workspace``/``--sessions-dir`` flags it needs)."""
    return f"tether resume {session_id}{location}"


# The closing lines after a call, by the status it ended with: whether ``tether resume``
# has anything left to do (a completed, aborted, failed or idle session has not: following
# it would only say "nothing to do"), and whether the conversation can go on. A parked call
# names its ``tether resume`` in its own message, so it is not repeated; ``None`` (the REPL
# before any call ended, or after an error) may have left an operation unfinished.
_CLOSING: dict[str | None, tuple[str | None, bool]] = {
    # status: (the first line, or None; whether "continue with" follows)
    "completed": (None, True),
    "aborted": (None, True),
    "idle": (None, True),
    "failed": ("retry with: tether retry {session}{location}", True),
    "blocked": ("resume with: tether resume {session}{location}", False),
    "awaiting_approval": (None, False),
    "stopped": ("resume with: tether resume {session}{location}", True),
    None: ("resume with: tether resume {session}{location}", True),
}


def continue_lines(
    session_id: str, status: str | None, *, repl: bool = False, location: str = ""
) -> list[str]:
    """The closing lines: the commands that resume, retry or continue the session.

    ``status`` is the :class:`~tether._runtime.results.RunStatus` value of the last call
    (``None``: not known); ``location`` the flags that find the session from the current
    directory.
    """
    first, goes_on = _CLOSING.get(status, _CLOSING[None])
    lines = [] if first is None else [first.format(session=session_id, location=location)]
    if goes_on:
        lines.append(f'continue with: tether run --session {session_id}{location} "…"')
        if repl:
            lines.append(f"          or: tether repl --session {session_id}{location}")
    return lines


class CallArguments:
    """Remembers the raw arguments of tool calls by call id, for the progress lines.

    Fresh calls are learnt from the model's answers (:meth:`remember`); calls the agent
    replays or answers after a resume are looked up once in the session log.
    """

    def __init__(self) -> None:
        self._known: dict[str, str] = {}
        self._path: str | None = None
        self._scanned_size = -1

    def session(self, path: str) -> None:
        self._path = path

    def remember(self, call_id: str, arguments: str) -> None:
        self._known[call_id] = arguments

    def get(self, call_id: str) -> str | None:
        if call_id not in self._known:
            self._scan()
        return self._known.get(call_id)

    def _scan(self) -> None:
        if self._path is None:
            return
        try:
            data = Path(self._path).read_bytes()
            if len(data) == self._scanned_size:
                return
            self._scanned_size = len(data)
            state = reduce_session(data)
        except Exception:  # best effort: progress lines never break a run
            return
        for message in state.transcript:
            for call in message.get("tool_calls") or ():
                try:
                    self._known.setdefault(str(call["id"]), str(call["function"]["arguments"]))
                except (KeyError, TypeError):
                    continue


class Progress(Protocol):
    """What the commands need from a renderer."""

    calls: CallArguments
    opened: str | None
    """The id of the session the current agent call opened (``None`` before it did)."""
    location: str
    """Flags the printed commands need to find the session (``--workspace DIR``, …)."""

    def begin(self) -> None:
        """A new agent call starts (forgets :attr:`opened`)."""

    def on_event(self, event: events.Event) -> None: ...

    def aborting(self) -> None: ...

    def exit_now(self, session_id: str | None) -> None: ...

    def notice(self, text: str) -> None: ...

    def pause(self) -> None:
        """Stop any spinner: the terminal is about to ask a question."""

    def result(self, result: RunResult, *, closing: bool = True) -> None: ...

    def close(self) -> None: ...


def _stderr_raw(text: str) -> None:
    """Write to fd 2 without locks (safe from a signal handler right before ``_exit``)."""
    try:
        os.write(2, text.encode("utf-8", errors="replace"))
    except OSError:
        pass


class HumanProgress:
    """rich progress on stderr; the final answer on stdout."""

    def __init__(self, *, err: Console | None = None, out: Console | None = None) -> None:
        self.err = err if err is not None else Console(stderr=True, highlight=False)
        self.out = out if out is not None else Console(highlight=False, soft_wrap=True)
        self.calls = CallArguments()
        self.opened: str | None = None
        self.location = ""
        self._status: Status | None = None
        self._skipped: set[str] = set()
        self._announced: str | None = None
        self._live: str | None = None  # the channel being streamed live, if any

    # -------------------------------------------------------------- spinner

    def _spin(self, text: str) -> None:
        self._stop()
        if not self.err.is_terminal:
            return
        self._status = self.err.status(Text(text, style="cyan"), spinner="dots")
        self._status.start()

    def _stop(self) -> None:
        if self._status is not None:
            status, self._status = self._status, None
            status.stop()

    def _line(self, text: Text | str, style: str = "") -> None:
        # Session content is untrusted: never interpret it as rich markup or emoji codes.
        self.err.print(
            text, style=style, soft_wrap=True, highlight=False, markup=False, emoji=False
        )

    # -------------------------------------------------------------- events

    def begin(self) -> None:
        self.opened = None

    def on_event(self, event: events.Event) -> None:
        from tether._runtime import events

        if isinstance(event, events.SessionOpened):
            self.opened = event.session_id
            self.calls.session(event.path)
            self._skipped.clear()
            if event.session_id != self._announced:
                self._announced = event.session_id
                verb = "new session" if event.created else "session"
                self._line(f"{verb} {printable(event.session_id)}", style="dim")
            if event.repaired:
                self._line(f"repaired a torn tail ({event.repaired} bytes cut)", style="yellow")
        elif isinstance(event, events.ModelStarted):
            compacting = event.operation == "compaction"
            what = "compacting the history…" if compacting else "model working…"
            if event.attempt > 1:
                # Attempt 2 exists only because a crash left attempt 1 open (the runtime
                # never retries a model call in the same process): say so on every stream,
                # not only in a spinner a pipe never sees.
                self._stop()
                request = "compaction request" if compacting else "model call"
                self._line(
                    f"↻ the {request} interrupted by the crash is sent again "
                    f"(attempt {event.attempt}, same context and configuration)",
                    style="yellow",
                )
                what += f" (attempt {event.attempt}, retried after a crash)"
            self._spin(what)
        elif isinstance(event, events.ModelDelta):
            self._delta(event.channel, event.text)
        elif isinstance(event, events.ModelFinished):
            was_live = self._live is not None
            self._end_live()
            self._stop()
            if not was_live and event.tool_calls and event.text and event.text.strip():
                self._line(printable_block(event.text.strip()), style="dim")
        elif isinstance(event, events.ModelFailed):
            self._end_live()
            self._stop()
            if event.code == "aborted":
                self._line("✗ model request aborted", style="yellow")
            # Other failures end the run: the result line says what happened.
        elif isinstance(event, events.ToolStarted):
            label = self._call_label(event.name, event.call_id)
            self._spin(f"{'replaying' if event.replay else 'running'} {label}…")
        elif isinstance(event, events.ToolFinished):
            self._stop()
            label = self._call_label(event.name, event.call_id)
            line = Text()
            if event.is_error:
                line.append("✗ ", style="bold red")
                line.append(f"{label} → {format_size(event.size)} (error)")
            else:
                line.append("✓ ", style="bold green")
                line.append(f"{label} → {format_size(event.size)}")
            self._line(line)
        elif isinstance(event, events.ToolSkipped):
            self._stop()
            if event.call_id in self._skipped:
                return  # the executor reports an interrupted call twice; show it once
            self._skipped.add(event.call_id)
            label = self._call_label(event.name, event.call_id)
            reason = _SKIP_TEXT.get(event.reason, event.reason)
            self._line(Text(f"↷ {label} ({printable(reason)})", style="yellow"))
        elif isinstance(event, events.RetryScheduled):
            self._stop()
            self._line(
                f"retrying after {printable(event.reason)} in {event.wait:.3g} s "
                f"(retry {event.retry} of {event.retries}; every request stays in the log)",
                style="yellow",
            )
        elif isinstance(event, events.FollowUpStarted):
            self._stop()
            self._line(
                f"not verified yet: follow-up run {event.number} asks the model to verify",
                style="yellow",
            )
        elif isinstance(event, events.ApprovalParked):
            self._stop()
            label = self._call_label(event.name, event.call_id)
            self._line(
                Text(f"⏸ {label} (parked for approval as #{event.request_id})", style="yellow")
            )
        elif isinstance(event, events.Blocked):
            self._stop()
        elif isinstance(event, events.OperationFinished):
            self._stop()

    def _delta(self, channel: str, text: str) -> None:
        """Stream the answer (and reasoning, dim italic) live on a terminal's stderr."""
        if not self.err.is_terminal or not text:
            return
        self._stop()
        if self._live is not None and self._live != channel:
            self.err.file.write("\n")
        if self._live != channel and channel == "reasoning":
            self.err.print("thinking: ", style="dim", end="", highlight=False, markup=False)
        self._live = channel
        style = "dim italic" if channel == "reasoning" else "dim"
        self.err.print(
            printable_block(text), style=style, end="", highlight=False, markup=False, emoji=False
        )
        self.err.file.flush()

    def _end_live(self) -> None:
        if self._live is not None:
            self._live = None
            self.err.file.write("\n")
            self.err.file.flush()

    def _call_label(self, name: str, call_id: str) -> str:
        summary = summarize_arguments(name, self.calls.get(call_id))
        label = printable(name)
        return f"{label} {summary}" if summary else label

    # -------------------------------------------------------------- notices

    def aborting(self) -> None:
        self._stop()
        self._line(ABORTING_NOTICE, style="yellow")

    def exit_now(self, session_id: str | None) -> None:
        text = "\nexiting now; the session stays resumable"
        if session_id is not None:
            text += f"\nresume with: {resume_command(session_id, self.location)}"
        if self.err.is_terminal:
            text = "\r\x1b[2K\x1b[?25h" + text  # clear the spinner line, show the cursor
        _stderr_raw(text + "\n")

    def notice(self, text: str) -> None:
        self._stop()
        self._line(text)

    def pause(self) -> None:
        self._stop()

    def result(self, result: RunResult, *, closing: bool = True) -> None:
        self._stop()
        status = result.status.value
        if status == "completed":
            if result.text:
                self._answer(result.text)
            if result.completion not in (None, "normal"):
                self._line(f"completed ({result.completion})", style="yellow")
            if result.message:
                self._line(printable(result.message), style="dim")
            self._verification(result)
        elif status == "failed":
            reason = result.message or (
                f"{result.error['code']}: {result.error['message']}" if result.error else ""
            )
            self._line(f"run failed: {one_line(reason)}" if reason else "run failed", style="red")
        elif status == "aborted":
            self._line("aborted", style="yellow")
        elif status == "blocked":
            self._line(
                f"blocked: {printable(result.message or result.blocked_reason or '')}", style="red"
            )
        elif status == "awaiting_approval":
            self._line(printable(result.message or "awaiting approval"), style="yellow")
        elif result.message:
            self._line(printable(result.message), style="dim")
        else:
            self._line("nothing to do: the session has no unfinished operation", style="dim")
        quiet = ("blocked", "awaiting_approval")
        if status not in quiet and (result.usage.input or result.usage.output):
            self._line(usage_text(result), style="dim")
        if closing:
            for line in continue_lines(result.session_id, status, location=self.location):
                self._line(line, style="bold" if "resume with" in line else "")

    def _verification(self, result: RunResult) -> None:
        check = result.verification
        if check is None:
            return
        style = "green" if check.verified else ("red" if result.unverified else "yellow")
        self._line(printable(check.message), style=style)
        if result.follow_ups:
            runs = "run" if result.follow_ups == 1 else "runs"
            self._line(f"after {result.follow_ups} follow-up {runs} asking to verify", style="dim")
        if result.unverified:
            self._line("not verified: --require-verified fails this run (exit 66)", style="red")

    def _answer(self, text: str) -> None:
        """The final answer on stdout: verbatim into a pipe, control characters escaped on
        a terminal (the text comes from the model)."""
        if self.out.is_terminal:
            self.out.print(
                printable_block(text), markup=False, highlight=False, emoji=False, soft_wrap=True
            )
            return
        stream = self.out.file
        stream.write(text if text.endswith("\n") else text + "\n")
        stream.flush()

    def close(self) -> None:
        self._stop()


def printable_block(text: str) -> str:
    """``text`` with control characters escaped line by line (newlines and tabs kept)."""
    return "\n".join(printable(line.replace("\t", "    ")) for line in text.split("\n"))


class JsonProgress:
    """One JSON object per line on stdout; notices on stderr."""

    def __init__(self) -> None:
        self.calls = CallArguments()
        self.opened: str | None = None
        self.location = ""

    @staticmethod
    def _emit(value: Mapping[str, Any]) -> None:
        data = orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE)
        buffer = getattr(sys.stdout, "buffer", None)
        if buffer is None:
            sys.stdout.write(data.decode("utf-8"))
            sys.stdout.flush()
            return
        sys.stdout.flush()
        buffer.write(data)
        buffer.flush()

    def begin(self) -> None:
        self.opened = None

    def on_event(self, event: events.Event) -> None:
        if event.kind == "session":
            self.opened = getattr(event, "session_id", None)
            self.calls.session(getattr(event, "path", ""))
        self._emit(event.to_dict())

    def aborting(self) -> None:
        _stderr_raw(ABORTING_NOTICE + "\n")

    def exit_now(self, session_id: str | None) -> None:
        text = "exiting now; the session stays resumable"
        if session_id is not None:
            text += f"\nresume with: {resume_command(session_id, self.location)}"
        _stderr_raw(text + "\n")

    def notice(self, text: str) -> None:
        _stderr_raw(text + "\n")

    def pause(self) -> None:
        pass

    def result(self, result: RunResult, *, closing: bool = True) -> None:
        self._emit({"event": "result", **result.to_dict()})

    def close(self) -> None:
        pass


def make_progress(json_output: bool) -> Progress:
    return JsonProgress() if json_output else HumanProgress()


__all__ = [
    "ABORTING_NOTICE",
    "CallArguments",
    "HumanProgress",
    "JsonProgress",
    "Progress",
    "continue_lines",
    "format_size",
    "make_progress",
    "resume_command",
    "summarize_arguments",
    "usage_text",
]
