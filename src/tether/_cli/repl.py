"""``tether`` / ``tether repl``: an interactive session, one prompt after another.

Every prompt is a run in the same session. ``/compact`` summarises the history,
``/exit`` (or Ctrl+D) leaves and prints the command that resumes the session. Ctrl+C at
the prompt clears the line; during a run the first Ctrl+C aborts it durably and the
second exits at once (the session stays resumable).

Works without a terminal too: lines are read from stdin and no prompt is shown, so
``printf 'hello\\n/exit\\n' | tether repl`` is a script.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from tether._cli.agent_flags import Flags, Interaction, agent_command
from tether._cli.common import EXIT_USAGE, fail
from tether._cli.progress import Progress, continue_lines
from tether._cli.run_cmd import JsonOption, agent_errors, call_agent, prepare_agent
from tether._cli.session_pick import LastOption

if TYPE_CHECKING:
    from tether._runtime import Agent, RunResult

PROMPT = "› "
MAX_LINE_CHARS = 1 << 20
"""Longest prompt line read from a pipe (1 Mi characters); a longer line ends the REPL with
one error line, so input without line breaks (``< /dev/zero``) never grows without bound."""

HELP = """commands:
  /help            show this help
  /compact         summarise the history so far (keeps the latest turn)
  /session         show the session id and how to resume it
  /rewind N        put back the files this session's tools changed after turn N
                   (/rewind N --dry-run shows the plan; docs/rewind.md)
  /exit, /quit     leave (Ctrl+D too); the session stays resumable
anything else is a prompt for the agent. Ctrl+C at the prompt clears the line; during a
run the first Ctrl+C aborts it, the second exits at once."""


def register(app: typer.Typer) -> None:
    app.command("repl")(repl)


@agent_command
def repl(
    session: Annotated[
        str | None,
        typer.Option(
            "--session",
            "-s",
            help="Continue this session (id, unique id prefix or path), with the model, "
            "endpoint and options it was run with unless given.",
            metavar="ID",
            show_default=False,
        ),
    ] = None,
    last: LastOption = False,
    json_output: JsonOption = False,
    *,
    flags: Flags,
) -> None:
    """Chat with the agent: each line is a prompt, all in one session.

    Commands: /help, /compact, /session, /rewind N, /exit (or Ctrl+D). `tether` without
    arguments starts this with the defaults ($TETHER_MODEL, the current
    directory). Without a terminal, lines are read from stdin.

    Examples:

        tether repl --model scripted:demo.json

        tether repl --last

        echo 'read the readme' | tether repl --model scripted:demo.json

    Exit status: 0 left normally, 2 usage error (e.g. no model), 130 a second
    Ctrl+C during a run.
    """
    start_repl(flags, json_output=json_output, session=session, last=last)


def start_repl(
    flags: Flags, *, json_output: bool = False, session: str | None = None, last: bool = False
) -> None:
    """Build the agent (errors exit as usual) and run the read-eval loop."""
    # With a terminal a person answers the policy's questions (ask is the REPL's default
    # for bash, write, edit and effect tools); piped input is a script, never asked.
    interaction = Interaction(interactive=sys.stdin.isatty(), ask_by_default=True)
    with agent_errors():
        agent, progress, session = prepare_agent(
            flags, json_output=json_output, interaction=interaction, session=session, last=last
        )
    Repl(agent, progress, session=session).loop()
    raise typer.Exit(0)


class Repl:
    """The read-eval loop around one agent and one (eventually created) session."""

    def __init__(self, agent: Agent, progress: Progress, *, session: str | None) -> None:
        self.agent = agent
        self.progress = progress
        self.session = session
        self.status: str | None = None
        """How the last call ended (``None``: no call yet, or it raised): the closing lines
        offer ``tether resume`` only where something may be unfinished."""
        self.interactive = sys.stdin.isatty()

    def say(self, text: str) -> None:
        self.progress.notice(text)

    def read(self) -> str | None:
        """The next line, ``None`` at end of input; Ctrl+C gives an empty line."""
        try:
            if not self.interactive:
                line = sys.stdin.readline(MAX_LINE_CHARS + 1)
                if len(line) > MAX_LINE_CHARS:
                    self.leave()
                    fail(
                        f"a line of the input is longer than {MAX_LINE_CHARS} characters; "
                        "put long prompts in a file and pass it as `tether run PROMPT`",
                        EXIT_USAGE,
                    )
                return line.rstrip("\r\n") if line else None
            return input(PROMPT)
        except EOFError:
            sys.stdout.write("\n")
            return None
        except KeyboardInterrupt:
            if self.interactive:
                sys.stdout.write("^C\n")  # clear the line, keep going
                sys.stdout.flush()
            return ""

    def loop(self) -> None:
        if self.interactive:
            try:
                import readline  # noqa: F401  (line editing and history for input())
            except ImportError:  # pragma: no cover - platform without readline
                pass
            self.say(
                f"tether — model {self.agent.model.model}, workspace {self.agent.workspace}. "
                "/help for commands, /exit to leave."
            )
        while True:
            line = self.read()
            if line is None:
                break
            text = line.strip()
            if not text:
                continue
            if text.startswith("/"):
                if not self.command(text):
                    break
                continue
            self.prompt(text)
        self.leave()

    def prompt(self, text: str) -> None:
        session = self.session
        self.call(lambda: self.agent.run(text, session=session))

    def command(self, text: str) -> bool:
        """Carry out a slash command; ``False`` means leave."""
        name = text.split()[0].lower()
        if name in ("/exit", "/quit"):
            return False
        if name == "/help":
            self.say(HELP)
        elif name == "/session":
            if self.session is None:
                self.say("no session yet: it starts with the first prompt")
            else:
                self.say(f"session {self.session}")
                for line in continue_lines(
                    self.session, self.status, repl=True, location=self.progress.location
                ):
                    self.say(line)
        elif name == "/compact":
            session = self.session
            if session is None:
                self.say("nothing to compact yet")
            else:
                self.call(lambda: self.agent.compact(session))
        elif name == "/rewind":
            self.rewind(text.split()[1:])
        else:
            self.say(f"unknown command {name!r}; /help lists the commands")
        return True

    def rewind(self, words: list[str]) -> None:
        """``/rewind N [--dry-run]``: ``tether rewind`` of this session, reported here."""
        from tether._cli.rewind_cmd import describe
        from tether._effects.rewind import rewind_session
        from tether.errors import TetherError

        dry_run = "--dry-run" in words
        numbers = [w for w in words if w != "--dry-run"]
        if len(numbers) != 1 or not numbers[0].isdigit():
            self.say("usage: /rewind N [--dry-run] (N: the turn to go back to, 0 = the start)")
            return
        if self.session is None:
            self.say("no session yet: nothing to rewind")
            return
        parts = self.agent.parts
        self.agent.release()  # the rewind takes the session's writer lock itself
        try:
            plan = rewind_session(
                parts.workspace,
                self.session,
                int(numbers[0]),
                dry_run=dry_run,
                sessions_dir=parts.sessions_dir,
            )
        except TetherError as exc:
            self.say(f"error: {exc}")
            return
        for line in describe(plan, dry_run=dry_run):
            self.say(line)
        if plan.review and not dry_run:
            paths = ", ".join(step.path for step in plan.review)
            self.say(f"left for review (changed since the session): {paths}; see tether review")

    def call(self, action: Callable[[], RunResult]) -> RunResult | None:
        """Run one agent call; errors are reported and the loop goes on."""
        try:
            with agent_errors():
                result: RunResult = call_agent(self.agent, self.progress, action)
        except typer.Exit:
            self.status = None
            # The error line was printed; a session opened before the error is kept.
            if self.agent.last_session is not None and self.session is None:
                self.session = self.agent.last_session
            return None
        self.session = result.session_id
        self.status = result.status.value
        self.progress.result(result, closing=False)
        return result

    def leave(self) -> None:
        if self.session is None:
            self.say("no session was started")
            return
        self.say(f"session {self.session}")
        lines = continue_lines(
            self.session, self.status, repl=True, location=self.progress.location
        )
        for line in lines:
            self.say(line)
