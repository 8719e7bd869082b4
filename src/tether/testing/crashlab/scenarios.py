"""The crash lab's scenarios: a workspace, a scripted model, tools, a driver and effect probes.

A :class:`Scenario` is plain data, shared by the parent (which prepares run folders and
checks the outcome) and the child process (:mod:`tether.testing.crashlab.child`, which builds the
agent and drives it). Every scenario runs the real :class:`~tether._runtime.Agent` with the
scripted model (``docs/models.md``), so it needs no API key and is fully deterministic:
the same run hits the same crash boundaries in the same order every time.

Each effectful tool call of a scenario has an :class:`EffectSpec` saying how the lab counts
what really happened outside the session log:

``bash``     the command appends its own tool call id to ``bash-runs.txt``; the effect count
             is the number of lines holding that id (the command counts its own runs);
``file``     ``write``/``edit`` of a path; the count is the number of times a new content
             was renamed over the path (the child logs every ``os.replace`` of
             :func:`tether._tools.builtin.apply_change`), and the file must hold exactly the
             before- or the after-content (``twice`` is what applying the change twice gives);
``ledger``   ``publish_report``: rows of the report ledger for the call's operation ids;
``calls``    a user's effect tool (``--tool``): the number of ``execute`` calls per operation
             id (or the tool's own ``effect_count(operation_id)`` when it has one);
``replayed`` a read-only, replay-safe call: it has no effect to count but must end with a
             successful result (recovery replays it instead of giving up on it);
``denied``   a counting ``bash`` call the policy of ``tether.toml`` denies: it must never
             run (no line with its id) and end with an error result, or not start at all;
``mcp``      a tool of the MCP server :mod:`tether.testing.mcp_notes`: the lines of
             ``mcp-effects.txt`` (the server writes the operation id of every line it
             really adds) holding the call's operation ids.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from tether._tools.base import Tool

__all__ = [
    "BASH_RUNS",
    "BUILTIN_SCENARIOS",
    "EFFECT_KINDS",
    "EffectSpec",
    "Scenario",
    "ScenarioUnavailable",
    "Step",
    "ToolSpec",
    "builtin_scenario",
    "load_user_tool",
    "scenario_names",
    "user_tool_scenario",
]

BASH_RUNS: Final = "bash-runs.txt"
"""The file every counting ``bash`` command of the lab appends its call id to."""

EFFECT_KINDS: Final = frozenset({"bash", "file", "ledger", "calls", "replayed", "denied", "mcp"})

EffectKind = Literal["bash", "file", "ledger", "calls", "replayed", "denied", "mcp"]

MCP_EFFECTS: Final = "mcp-effects.txt"
"""Where :mod:`tether.testing.mcp_notes` records the operation id of every real append."""


class ScenarioUnavailable(Exception):
    """A scenario cannot run here (e.g. the effects subsystem is not importable)."""


@dataclass(frozen=True, slots=True)
class EffectSpec:
    """How the lab counts the effect of one tool call (see the module docstring)."""

    call_id: str
    tool: str
    kind: EffectKind
    path: str | None = None
    before: str | None = None
    after: str | None = None
    twice: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "callId": self.call_id,
            "tool": self.tool,
            "kind": self.kind,
            "path": self.path,
            "before": self.before,
            "after": self.after,
            "twice": self.twice,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EffectSpec:
        kind = data["kind"]
        if kind not in EFFECT_KINDS:
            raise ValueError(f"unknown effect kind {kind!r}")
        return cls(
            call_id=data["callId"],
            tool=data["tool"],
            kind=kind,
            path=data.get("path"),
            before=data.get("before"),
            after=data.get("after"),
            twice=data.get("twice"),
        )


@dataclass(frozen=True, slots=True)
class Step:
    """One driver action: ``run`` a prompt, or ``compact`` the session."""

    action: Literal["run", "compact"]
    prompt: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "prompt": self.prompt}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Step:
        action = data["action"]
        if action not in ("run", "compact"):
            raise ValueError(f"unknown step action {action!r}")
        return cls(action, str(data.get("prompt", "")))


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """An extra tool the child builds: ``publish_report`` or a user's ``MODULE:NAME``."""

    ref: str
    """``publish_report`` (the reference effect tool) or ``MODULE:NAME``."""
    sys_path: tuple[str, ...] = ()
    """Folders put in front of ``sys.path`` before importing ``MODULE``."""

    def to_json(self) -> dict[str, Any]:
        return {"ref": self.ref, "sysPath": list(self.sys_path)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ToolSpec:
        return cls(str(data["ref"]), tuple(str(p) for p in data.get("sysPath", ())))


@dataclass(frozen=True, slots=True)
class Scenario:
    """One crash-lab scenario (plain data, JSON round-trippable for the child)."""

    name: str
    title: str
    script: Mapping[str, Any]
    """The scripted model's JSON (``docs/models.md``)."""
    files: Mapping[str, str] = field(default_factory=dict)
    """Workspace files created before the first run."""
    effects: tuple[EffectSpec, ...] = ()
    setup: tuple[Step, ...] = ()
    """Steps run before crash injection is armed (their boundaries are not in the matrix)."""
    steps: tuple[Step, ...] = (Step("run", "Do the task."),)
    """Steps run with crash injection armed."""
    abort_on: str | None = None
    """Abort the operation as soon as the ``bash`` call with this id has started (its line
    appears in ``bash-runs.txt``), from a second thread, like a user pressing Ctrl-C."""
    extra_tools: tuple[ToolSpec, ...] = ()
    knowable: frozenset[str] = frozenset()
    """Tools whose outcome recovery can always establish once the effects layer is wired
    into the executor (journal for write/edit, a lookup for effect tools)."""
    reviewable: frozenset[str] = frozenset()
    """Tools for which a review item (an outcome nobody can establish) is acceptable."""
    user_tool: bool = False
    """A ``--tool`` scenario: unknown outcomes make the verdict REVIEW, never PASS."""
    tamper: Mapping[str, str] = field(default_factory=dict)
    """Workspace files someone else overwrites after the crash, before recovery."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "script": dict(self.script),
            "files": dict(self.files),
            "effects": [e.to_json() for e in self.effects],
            "setup": [s.to_json() for s in self.setup],
            "steps": [s.to_json() for s in self.steps],
            "abortOn": self.abort_on,
            "extraTools": [t.to_json() for t in self.extra_tools],
            "knowable": sorted(self.knowable),
            "reviewable": sorted(self.reviewable),
            "userTool": self.user_tool,
            "tamper": dict(self.tamper),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Scenario:
        return cls(
            name=str(data["name"]),
            title=str(data.get("title", "")),
            script=dict(data["script"]),
            files={str(k): str(v) for k, v in dict(data.get("files", {})).items()},
            effects=tuple(EffectSpec.from_json(e) for e in data.get("effects", ())),
            setup=tuple(Step.from_json(s) for s in data.get("setup", ())),
            steps=tuple(Step.from_json(s) for s in data.get("steps", ())),
            abort_on=data.get("abortOn"),
            extra_tools=tuple(ToolSpec.from_json(t) for t in data.get("extraTools", ())),
            knowable=frozenset(data.get("knowable", ())),
            reviewable=frozenset(data.get("reviewable", ())),
            user_tool=bool(data.get("userTool", False)),
            tamper={str(k): str(v) for k, v in dict(data.get("tamper", {})).items()},
        )

    @property
    def tool_of_call(self) -> dict[str, str]:
        """Tool name of every scripted tool call id."""
        names: dict[str, str] = {}
        for response in self.script.get("responses", ()):
            for call in response.get("tool_calls", ()) or ():
                names[str(call["id"])] = str(call["name"])
        return names

    def write_script(self, path: Path) -> None:
        path.write_text(json.dumps(self.script, indent=1, sort_keys=True) + "\n")


# =========================================================================== built-ins


def _count_cmd(call_id: str, extra: str = "") -> str:
    """A bash command that counts its own runs: one line with its id per run."""
    return f"echo {call_id} >> {BASH_RUNS}; {extra}grep -c '^{call_id}$' {BASH_RUNS}"


def _bash(call_id: str, extra: str = "") -> dict[str, Any]:
    return {"id": call_id, "name": "bash", "arguments": {"command": _count_cmd(call_id, extra)}}


def _done(text: str = "Done.") -> dict[str, Any]:
    return {"content": text, "finish_reason": "stop", "usage": {"input": 40, "output": 3}}


def _script(*responses: Mapping[str, Any]) -> dict[str, Any]:
    return {"model": "scripted/crashlab", "responses": [dict(r) for r in responses]}


def _calls(text: str, *calls: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "content": text,
        "tool_calls": [dict(c) for c in calls],
        "usage": {"input": 30, "output": 9},
    }


README: Final = "# Demo workspace\n\nThe crash lab reads, runs, writes and edits in here.\n"
NOTES: Final = "notes: nothing to see\n"
COUNTER_BEFORE: Final = "counter=1\n"
COUNTER_AFTER: Final = "counter=1+1\n"
COUNTER_TWICE: Final = "counter=1+1+1\n"  # what applying the edit twice gives
COUNTER_TAMPERED: Final = "counter=7 (changed by someone else while the agent was down)\n"
OUT_PATH: Final = "out/result.txt"
OUT_CONTENT: Final = "written exactly once\n"
_EDIT_ARGS: Final = {"path": "counter.txt", "old_string": "counter=1", "new_string": "counter=1+1"}


def _edit_effect(call_id: str) -> EffectSpec:
    return EffectSpec(
        call_id,
        "edit",
        "file",
        path="counter.txt",
        before=COUNTER_BEFORE,
        after=COUNTER_AFTER,
        twice=COUNTER_TWICE,
    )


def _write_effect(call_id: str) -> EffectSpec:
    return EffectSpec(call_id, "write", "file", path=OUT_PATH, before=None, after=OUT_CONTENT)


_KNOWABLE: Final = frozenset({"write", "edit", "publish_report"})


POLICY_TOML: Final = """\
# The crash lab's authorization policy: every decision is recorded before the call starts.
[policy.tools]
bash = "allow"

[[policy.bash]]
pattern = "*call_denied*"
decision = "deny"
reason = "the crash lab denies this call"
"""


MCP_TOML: Final = f"""\
# The crash lab's MCP server (tether.testing.mcp_notes), started in the workspace.
[mcp.servers.notes]
command = {json.dumps(sys.executable)}
args = ["-m", "tether.testing.mcp_notes"]
trusted_read_only = ["count_lines"]

[mcp.servers.notes.tools.append_once]
lookup = "find_append"
"""


def _builtins() -> dict[str, Scenario]:
    scenarios = [
        Scenario(
            name="read-only",
            title="two read-only read calls: replay-safe, replayed after a crash",
            files={"README.md": README, "notes.txt": NOTES},
            script=_script(
                _calls(
                    "Let me read both files.",
                    {"id": "call_read_1", "name": "read", "arguments": {"path": "README.md"}},
                    {"id": "call_read_2", "name": "read", "arguments": {"path": "notes.txt"}},
                ),
                _done("Both files are short."),
            ),
            effects=(
                EffectSpec("call_read_1", "read", "replayed"),
                EffectSpec("call_read_2", "read", "replayed"),
            ),
        ),
        Scenario(
            name="bash-counter",
            title="a dangerous bash command that counts its own runs (never replayed)",
            script=_script(_calls("Running it.", _bash("call_bash")), _done()),
            effects=(EffectSpec("call_bash", "bash", "bash"),),
        ),
        Scenario(
            name="write",
            title="write creates a file (the file ends before or after, never torn)",
            script=_script(
                _calls(
                    "Writing the file.",
                    {
                        "id": "call_write",
                        "name": "write",
                        "arguments": {"path": OUT_PATH, "content": OUT_CONTENT},
                    },
                ),
                _done(),
            ),
            effects=(_write_effect("call_write"),),
            knowable=_KNOWABLE,
        ),
        Scenario(
            name="edit",
            title="edit counter=1 to counter=1+1 (applied twice it would read counter=1+1+1)",
            files={"counter.txt": COUNTER_BEFORE},
            script=_script(
                _calls("Editing.", {"id": "call_edit", "name": "edit", "arguments": _EDIT_ARGS}),
                _done(),
            ),
            effects=(_edit_effect("call_edit"),),
            knowable=_KNOWABLE,
        ),
        Scenario(
            name="conflict",
            title="edit; after the crash someone else changes the file: review, no overwrite",
            files={"counter.txt": COUNTER_BEFORE},
            script=_script(
                _calls("Editing.", {"id": "call_edit", "name": "edit", "arguments": _EDIT_ARGS}),
                _done(),
            ),
            effects=(_edit_effect("call_edit"),),
            tamper={"counter.txt": COUNTER_TAMPERED},
            knowable=_KNOWABLE,
            reviewable=frozenset({"edit"}),
        ),
        Scenario(
            name="publish-report",
            title="the publish_report effect: one ledger row per operation id",
            script=_script(
                _calls(
                    "Publishing the report.",
                    {
                        "id": "call_publish",
                        "name": "publish_report",
                        "arguments": {"title": "Crash lab", "body": "Zero duplicate effects."},
                    },
                ),
                _done("Published."),
            ),
            effects=(EffectSpec("call_publish", "publish_report", "ledger"),),
            extra_tools=(ToolSpec("publish_report"),),
            knowable=_KNOWABLE,
        ),
        Scenario(
            name="multi-call",
            title="five tool calls in one response: bash, read, write, bash, edit",
            files={"README.md": README, "counter.txt": COUNTER_BEFORE},
            script=_script(
                _calls(
                    "Several things at once.",
                    _bash("call_bash_a"),
                    {"id": "call_read", "name": "read", "arguments": {"path": "README.md"}},
                    {
                        "id": "call_write",
                        "name": "write",
                        "arguments": {"path": OUT_PATH, "content": OUT_CONTENT},
                    },
                    _bash("call_bash_b"),
                    {"id": "call_edit", "name": "edit", "arguments": _EDIT_ARGS},
                ),
                _done("All five done."),
            ),
            effects=(
                EffectSpec("call_bash_a", "bash", "bash"),
                EffectSpec("call_read", "read", "replayed"),
                _write_effect("call_write"),
                EffectSpec("call_bash_b", "bash", "bash"),
                _edit_effect("call_edit"),
            ),
            knowable=_KNOWABLE,
        ),
        Scenario(
            name="abort",
            title="the user aborts while a long bash command runs",
            script=_script(
                _calls("This takes a while.", _bash("call_slow", "sleep 30; ")), _done("Stopped.")
            ),
            effects=(EffectSpec("call_slow", "bash", "bash"),),
            abort_on="call_slow",
        ),
        Scenario(
            name="compaction",
            title="compacting a two-turn session (the history is built first, uncrashed)",
            files={"README.md": README},
            setup=(Step("run", "What does the README say?"), Step("run", "Thanks.")),
            steps=(Step("compact"),),
            script=_script(
                _calls(
                    "Let me read it.",
                    {"id": "call_read", "name": "read", "arguments": {"path": "README.md"}},
                ),
                _done("It describes the demo workspace."),
                _done("You are welcome."),
                _done("Summary: the user asked about the README; it describes the demo workspace."),
            ),
            effects=(EffectSpec("call_read", "read", "replayed"),),
        ),
        Scenario(
            name="policy",
            title="tether.toml allows one bash command and denies another (never runs)",
            files={"tether.toml": POLICY_TOML},
            script=_script(
                _calls("Running both.", _bash("call_allowed"), _bash("call_denied")),
                _done("One ran, one was denied."),
            ),
            effects=(
                EffectSpec("call_allowed", "bash", "bash"),
                EffectSpec("call_denied", "bash", "denied"),
            ),
        ),
        Scenario(
            name="mcp",
            title="an MCP server's tools: append (untrusted), append_once (with a lookup), "
            "count_lines (trusted read-only)",
            files={"tether.toml": MCP_TOML},
            script=_script(
                _calls(
                    "Using the notes server.",
                    {
                        "id": "call_mcp_once",
                        "name": "notes__append_once",
                        "arguments": {"line": "exactly once"},
                    },
                    {
                        "id": "call_mcp_append",
                        "name": "notes__append",
                        "arguments": {"line": "at most once"},
                    },
                    {"id": "call_mcp_count", "name": "notes__count_lines", "arguments": {}},
                ),
                _done("Noted."),
            ),
            effects=(
                EffectSpec("call_mcp_once", "notes__append_once", "mcp"),
                EffectSpec("call_mcp_append", "notes__append", "mcp"),
                EffectSpec("call_mcp_count", "notes__count_lines", "replayed"),
            ),
            knowable=frozenset({"notes__append_once"}),
        ),
        Scenario(
            name="provider-failure",
            title="the provider fails (rate limited) after a counting bash call",
            script=_script(
                _calls("Counting first.", _bash("call_bash")),
                {"error": {"code": "rate_limited", "message": "slow down (scripted)"}},
            ),
            effects=(EffectSpec("call_bash", "bash", "bash"),),
        ),
    ]
    return {s.name: s for s in scenarios}


BUILTIN_SCENARIOS: Final[Mapping[str, Scenario]] = _builtins()


def scenario_names() -> list[str]:
    return list(BUILTIN_SCENARIOS)


def builtin_scenario(name: str) -> Scenario:
    try:
        return BUILTIN_SCENARIOS[name]
    except KeyError:
        known = ", ".join(BUILTIN_SCENARIOS)
        raise KeyError(f"unknown scenario {name!r} (known: {known})") from None


def publish_report_unavailable() -> str | None:
    """Why the reference effect tool cannot be used here, or ``None`` when it can."""
    try:
        module = importlib.import_module("tether.testing.ledger")
        importlib.import_module("tether._effects.contract")
    except Exception as exc:  # any import problem means: skip, with the reason
        return f"tether.testing.ledger is not importable ({type(exc).__name__}: {exc})"
    if not hasattr(module, "PublishReportTool"):
        return "tether.testing.ledger has no PublishReportTool"
    return None


def mcp_unavailable() -> str | None:
    """Why the MCP scenario cannot run here, or ``None`` when it can."""
    try:
        importlib.import_module("mcp")
    except Exception as exc:  # any import problem means: skip, with the reason
        return f"the mcp package is not installed ({type(exc).__name__}: {exc})"
    return None


def scenario_unavailable(scenario: Scenario) -> str | None:
    """Why ``scenario`` cannot run here (a missing optional part), or ``None``."""
    if any(t.ref == "publish_report" for t in scenario.extra_tools):
        return publish_report_unavailable()
    if any(e.kind == "mcp" for e in scenario.effects):
        return mcp_unavailable()
    return None


# =========================================================================== user tools

USER_CALL_ID: Final = "call_user_tool"


def _split_ref(ref: str) -> tuple[str, str]:
    module, sep, name = ref.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"--tool must be MODULE:NAME, got {ref!r}")
    return module, name


def load_user_tool(ref: str, workspace: Path, sys_path: Sequence[str] = ()) -> Tool:
    """Build the tool named by ``MODULE:NAME`` for ``workspace``.

    ``NAME`` may be a :class:`~tether._tools.base.Tool` instance (used as is), a ``Tool``
    subclass (``NAME.for_workspace(workspace)`` when it has that class method, else
    ``NAME()``), or a factory function (called with the workspace path when it takes an
    argument, else with none) returning a ``Tool``.
    """
    module_name, attribute = _split_ref(ref)
    for entry in reversed(sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    module = importlib.import_module(module_name)
    try:
        target = getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attribute!r}") from None
    built: object
    if isinstance(target, Tool):
        built = target
    elif isinstance(target, type) and issubclass(target, Tool):
        factory = getattr(target, "for_workspace", None)
        built = factory(workspace) if callable(factory) else target()
    elif callable(target):
        try:
            wants_arg = bool(inspect.signature(target).parameters)
        except (TypeError, ValueError):
            wants_arg = False
        built = target(workspace) if wants_arg else target()
    else:
        raise ValueError(f"{ref} is neither a Tool, a Tool class nor a factory")
    if not isinstance(built, Tool):
        raise ValueError(f"{ref} did not give a Tool (got {type(built).__name__})")
    return built


def user_tool_scenario(
    ref: str, arguments: Mapping[str, Any], tool_name: str, *, has_lookup: bool
) -> Scenario:
    """The one-call scenario of ``--tool MODULE:NAME --args JSON``."""
    lookup_note = "with a lookup" if has_lookup else "without a lookup"
    return Scenario(
        name="user-tool",
        title=f"{ref} ({tool_name}, {lookup_note}) called once with the given arguments",
        script=_script(
            _calls(
                f"Calling {tool_name}.",
                {"id": USER_CALL_ID, "name": tool_name, "arguments": dict(arguments)},
            ),
            _done(),
        ),
        effects=(EffectSpec(USER_CALL_ID, tool_name, "calls"),),
        extra_tools=(ToolSpec(ref, (os.getcwd(),)),),
        knowable=frozenset({tool_name}) if has_lookup else frozenset(),
        reviewable=frozenset({tool_name}),
        user_tool=True,
    )
