"""The authorization policy: may this tool call run, must a human approve it, or is it denied?

This module is **pure**: no I/O, no clock, no environment. :func:`decide` turns a
:class:`Policy` (the ``[policy]`` table of ``tether.toml``, parsed by
:func:`policy_from_mapping`) and one tool call into a :class:`PolicyVerdict`.

Decision rules of :func:`decide`, in order:

1. A **read-only** tool (``kind=ToolKind.READ_ONLY``: ``read``, the verify tool, replay-safe
   tools) is ALLOWed (rule ``"read-only tool"``) — unless ``[policy.tools]`` names it
   explicitly; then that decision applies (a user may deny even reading).
2. For the tool ``bash``: the first ``[[policy.bash]]`` rule (file order) whose ``pattern``
   matches ``arguments["command"]`` decides. The command must be a ``str``; it is matched
   whole, after stripping leading and trailing whitespace, with :func:`fnmatch.fnmatchcase`
   (``*`` matches anything, including spaces and ``/``). Any other value matches no pattern.
3. Otherwise ``[policy.tools][tool_name]`` decides; otherwise ``[policy] default``; otherwise
   the built-in default: ASK when ``interactive`` (the REPL asks before ``bash``, ``write``,
   ``edit`` and effect tools), ALLOW when not (a batch ``tether run`` works without prompts).
4. Then the caller's situation is applied to that decision:

   * ASK with ``assume_yes`` (``--yes``) becomes ALLOW;
   * ASK without a terminal (``interactive=False``) becomes DENY, with the reason
     :data:`NO_TERMINAL_REASON`;
   * DENY always stays DENY, even with ``--yes``;
   * ASK when interactive stays ASK: the caller prompts the user.

Consequently a non-interactive call never yields ASK, and ``assume_yes`` never turns a DENY
into an ALLOW.

**Denials that stick.** Once a person denied a call of a tool (at the terminal, or with
``tether deny``), later calls of that tool in the session need a person again, so rewording a
command cannot route around the denial: :func:`standing_denial` finds such a denial in the
reduced log (:attr:`~tether.core.state.SessionState.person_denials`) and the decisions the
shell looked up, and :func:`decide` with ``person_denied=True`` then turns every verdict but
DENY into ASK, whatever allow rule, pattern or default matched (the verdict keeps the rule
that matched, and says why in its reason, :data:`PERSON_DENIED_REASON`). ``assume_yes`` does
not answer that question (``--yes`` was given before the person said no); without a
terminal it becomes DENY with :data:`NO_PERSON_REASON` (a caller that can park the call does).
A later approval of that tool by a person (an ``allow`` decided by anyone but the policy or
``--yes``) lifts the denial; a later denial by a person sets it again.

Bash patterns are a convenience for approving or denying common commands, **not a sandbox**:
a command can always be disguised (``sh -c '…'``, variables, aliases, scripts). What a
command can do is bounded by the operating system's sandbox (``tether._sandbox``).
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
from collections.abc import Iterable, Mapping
from enum import StrEnum
from functools import cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from tether.core.contents import PERSON_DENIAL_PREFIX
from tether.core.records import field, record
from tether.errors import ProjectConfigError

if TYPE_CHECKING:  # an annotation only: the value types (~5 ms) wait for their first user
    from tether.core.state import PersonDenial, SessionState
    from tether.core.values import Authorization

__all__ = [
    "MACHINE_DECIDERS",
    "NOBODY_REASONS",
    "NO_PERSON_REASON",
    "NO_TERMINAL_REASON",
    "PERSON_DENIAL_PREFIX",
    "PERSON_DENIED_REASON",
    "BashRule",
    "Decision",
    "Policy",
    "PolicyVerdict",
    "ToolKind",
    "check_known",
    "decide",
    "decided_by_person",
    "policy_from_mapping",
    "show_value",
    "standing_denial",
    "toml_key",
]

NO_TERMINAL_REASON: Final = (
    "approval needed but there is no terminal to ask; pass --yes or add a policy rule"
)
"""The reason of a verdict whose ASK became DENY because there is no terminal."""

PERSON_DENIED_REASON: Final = (
    "a person denied an earlier call of this tool in this session; only a person can allow it again"
)
"""The reason of a verdict that asks because a person denied the tool earlier."""

NO_PERSON_REASON: Final = (
    f"{PERSON_DENIED_REASON} (answer at a terminal, or approve the parked call with "
    "`tether approve`)"
)
"""The reason of such a verdict where there is no terminal to ask."""

NOBODY_REASONS: Final = frozenset({NO_TERMINAL_REASON, NO_PERSON_REASON})
"""The reasons of a DENY that only says nobody can be asked here (the call may be parked
for a person instead, and a person's earlier decision on the same call stands)."""

MACHINE_DECIDERS: Final = frozenset({"policy", "--yes"})
"""Who decided a call when no person did (the ``who`` of a recorded decision)."""

_CONFIG: Final = "tether.toml"
_RULE_READ_ONLY: Final = "read-only tool"
_RULE_REPL_DEFAULT: Final = "default for side-effecting tools in the REPL"
_RULE_BATCH_DEFAULT: Final = "default for side-effecting tools outside the REPL"
_RULE_POLICY_DEFAULT: Final = f"{_CONFIG} [policy] default"


class Decision(StrEnum):
    """What happens to a tool call."""

    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


class ToolKind(StrEnum):
    """Whether a tool only observes (read-only) or may change the world (side effect)."""

    READ_ONLY = "read_only"
    SIDE_EFFECT = "side_effect"


@record
class BashRule:
    """One ``[[policy.bash]]`` entry: commands matching ``pattern`` get ``decision``."""

    pattern: str
    decision: Decision
    reason: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "decision", Decision(self.decision))

    def matches(self, command: object) -> bool:
        """Whether ``command`` (stripped) matches the pattern; a non-``str`` never matches."""
        if not isinstance(command, str):
            return False
        return fnmatch.fnmatchcase(command.strip(), self.pattern)

    @property
    def label(self) -> str:
        """Where the rule comes from, for :attr:`PolicyVerdict.rule`."""
        return f"{_CONFIG} [[policy.bash]] pattern {_quote_single(self.pattern)}"


def _empty_tools() -> Mapping[str, Decision]:
    return MappingProxyType({})


@record
class Policy:
    """The ``[policy]`` table: a default, decisions by tool name, and bash command rules.

    ``tools`` is stored as a read-only mapping; plain strings are accepted wherever a
    :class:`Decision` is expected (``Policy(tools={"bash": "ask"})``).
    """

    default: Decision | None = None
    tools: Mapping[str, Decision] = field(default_factory=_empty_tools)
    bash: tuple[BashRule, ...] = ()

    def __post_init__(self) -> None:
        if self.default is not None:
            object.__setattr__(self, "default", Decision(self.default))
        tools = {str(name): Decision(value) for name, value in self.tools.items()}
        object.__setattr__(self, "tools", MappingProxyType(tools))
        object.__setattr__(self, "bash", tuple(self.bash))

    def __hash__(self) -> int:
        return hash((self.default, frozenset(self.tools.items()), self.bash))


@record
class PolicyVerdict:
    """The outcome of :func:`decide`.

    ``decision`` is final (``--yes`` and the absence of a terminal already applied); ``rule``
    says in words which rule decided; ``reason`` is the rule's reason or an explanation.
    """

    decision: Decision
    rule: str
    reason: str | None = None
    after_denial: bool = False
    """A person denied the tool earlier in the session: only a person may allow this call
    (no "always" grant, no ``--yes``)."""


def decided_by_person(who: str) -> bool:
    """Whether a recorded decision's ``who`` is a person (not the policy, not ``--yes``)."""
    return who not in MACHINE_DECIDERS


def standing_denial(
    state: SessionState, tool_name: str, decisions: Iterable[Authorization]
) -> PersonDenial | None:
    """The person's denial of ``tool_name`` that still stands in the session, if any.

    ``state.person_denials`` are the calls a person denied (from the log itself);
    ``decisions`` the recorded decisions of the session (the shell looks them up; any
    subset is safe: a decision missing here only leaves a denial standing). A denial stands
    unless a person allowed a call of the same tool that comes after it in the session's
    order of calls (assistant entry, then tool index). Pure; costs the calls since the
    denial, not the session.
    """
    last: PersonDenial | None = None
    for denial in reversed(state.person_denials):
        if denial.tool_name == tool_name:
            last = denial
            break
    if last is None:
        return None
    approved: dict[str, list[int]] = {}
    for decision in decisions:
        if (
            decision.tool_name != tool_name
            or not decision.allowed
            or not decided_by_person(decision.who)
        ):
            continue
        entry_id, _, digits = decision.call_key.rpartition(":")
        if digits.isascii() and digits.isdigit():
            approved.setdefault(entry_id, []).append(int(digits))
    if not approved:
        return last
    ids = state.transcript_ids
    for position in range(len(ids) - 1, last.position - 1, -1):
        for index in approved.get(ids[position], ()):
            if (position, index) > last.order:
                return None
    return last


def decide(
    policy: Policy,
    tool_name: str,
    arguments: Mapping[str, Any],
    *,
    kind: ToolKind,
    interactive: bool,
    assume_yes: bool,
    ask_by_default: bool | None = None,
    person_denied: bool = False,
) -> PolicyVerdict:
    """Decide whether a call of ``tool_name`` with ``arguments`` may run.

    ``ask_by_default`` (default: ``interactive``) selects the built-in default of rule 3:
    the REPL asks by default; ``tether run`` on a terminal can ask (for ``ask`` rules) but
    allows by default.

    Rules (see the module docstring for details):

    1. ``kind`` READ_ONLY → ALLOW (``"read-only tool"``), unless ``[policy.tools]`` names
       the tool (then that decision).
    2. ``bash``: the first ``[[policy.bash]]`` rule whose pattern matches the (stripped,
       ``str``) ``command`` argument decides.
    3. Otherwise ``[policy.tools][tool_name]``, otherwise ``[policy] default``, otherwise
       ASK when ``interactive`` and ALLOW when not.
    4. ASK + ``assume_yes`` → ALLOW (rule ``"--yes (…)"``); ASK + not ``interactive`` →
       DENY (reason :data:`NO_TERMINAL_REASON`); DENY stays DENY; ASK + ``interactive``
       stays ASK (the caller prompts).

    With ``person_denied`` (a person denied the tool earlier in the session,
    :func:`standing_denial`), every verdict of rules 1–3 but DENY becomes ASK (reason
    :data:`PERSON_DENIED_REASON`, ``after_denial``), which ``assume_yes`` does not answer;
    without a terminal it is DENY with :data:`NO_PERSON_REASON`.

    Never raises for any policy, tool name or arguments; never returns ASK when not
    ``interactive``.
    """
    asks = interactive if ask_by_default is None else ask_by_default
    raw = _raw_verdict(policy, tool_name, arguments, kind=kind, ask_by_default=asks)
    if person_denied and raw.decision is not Decision.DENY:
        if not interactive:
            return PolicyVerdict(Decision.DENY, raw.rule, NO_PERSON_REASON, after_denial=True)
        return PolicyVerdict(Decision.ASK, raw.rule, PERSON_DENIED_REASON, after_denial=True)
    if raw.decision is not Decision.ASK:
        return raw
    if assume_yes:
        return PolicyVerdict(Decision.ALLOW, f"--yes (instead of ask from {raw.rule})", raw.reason)
    if not interactive:
        return PolicyVerdict(Decision.DENY, raw.rule, NO_TERMINAL_REASON)
    return raw


def _raw_verdict(
    policy: Policy,
    tool_name: str,
    arguments: Mapping[str, Any],
    *,
    kind: ToolKind,
    ask_by_default: bool,
) -> PolicyVerdict:
    """Rules 1–3: the decision before ``--yes`` and the terminal are taken into account."""
    named = policy.tools.get(tool_name)
    tool_rule = f"{_CONFIG} [policy.tools] {toml_key(str(tool_name))}"
    if kind == ToolKind.READ_ONLY:
        if named is not None:
            return PolicyVerdict(named, tool_rule, None)
        return PolicyVerdict(Decision.ALLOW, _RULE_READ_ONLY, None)
    if tool_name == "bash":
        command = arguments.get("command") if isinstance(arguments, Mapping) else None
        for rule in policy.bash:
            if rule.matches(command):
                return PolicyVerdict(rule.decision, rule.label, rule.reason)
    if named is not None:
        return PolicyVerdict(named, tool_rule, None)
    if policy.default is not None:
        return PolicyVerdict(policy.default, _RULE_POLICY_DEFAULT, None)
    if ask_by_default:
        return PolicyVerdict(Decision.ASK, _RULE_REPL_DEFAULT, None)
    return PolicyVerdict(Decision.ALLOW, _RULE_BATCH_DEFAULT, None)


# --------------------------------------------------------------------------- parsing

_POLICY_KEYS: Final = ("default", "tools", "bash")
_RULE_KEYS: Final = ("pattern", "decision", "reason")
_DECISIONS: Final = ", ".join(f'"{d.value}"' for d in Decision)


def policy_from_mapping(data: Mapping[str, Any], source: str) -> Policy:
    """The :class:`Policy` of a parsed ``[policy]`` table (pure; no I/O).

    ``source`` names the file in error messages. Raises :class:`ProjectConfigError` with one
    line naming the file and the setting for any unknown key or bad value.
    """
    if not isinstance(data, Mapping):
        raise _error(source, "[policy]", f"expected a table, got {show_value(data)}")
    check_known(source, "[policy]", data, _POLICY_KEYS)
    default = None
    if "default" in data:
        default = _decision(source, "[policy] default", data["default"])
    tools = _tools(source, data.get("tools", {}))
    bash = _bash_rules(source, data.get("bash", []))
    return Policy(default=default, tools=tools, bash=bash)


def _tools(source: str, value: object) -> dict[str, Decision]:
    if not isinstance(value, Mapping):
        raise _error(source, "[policy] tools", f"expected a table, got {show_value(value)}")
    tools: dict[str, Decision] = {}
    for name, decision in value.items():
        setting = f"[policy.tools] {toml_key(str(name))}"
        if not name:
            raise _error(source, setting, "expected a tool name, got an empty key")
        tools[str(name)] = _decision(source, setting, decision)
    return tools


def _bash_rules(source: str, value: object) -> tuple[BashRule, ...]:
    if not isinstance(value, list):
        hint = ""
        if isinstance(value, str):
            hint = (
                f" (to decide for every bash call, write [policy.tools] bash = {show_value(value)})"
            )
        raise _error(
            source,
            "[policy] bash",
            f"expected an array of tables [[policy.bash]], got {show_value(value)}{hint}",
        )
    return tuple(
        _bash_rule(source, f"[[policy.bash]] #{i}", item) for i, item in enumerate(value, 1)
    )


def _bash_rule(source: str, where: str, item: object) -> BashRule:
    if not isinstance(item, Mapping):
        raise _error(source, where, f"expected a table, got {show_value(item)}")
    check_known(source, where, item, _RULE_KEYS)
    for required in ("pattern", "decision"):
        if required not in item:
            raise _error(
                source, f"{where} {required}", "missing (every rule needs a pattern and a decision)"
            )
    pattern = item["pattern"]
    if not isinstance(pattern, str) or not pattern.strip():
        raise _error(
            source,
            f"{where} pattern",
            f"expected a non-empty pattern string, got {show_value(pattern)}",
        )
    decision = _decision(source, f"{where} decision", item["decision"])
    reason = item.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise _error(source, f"{where} reason", f"expected a string, got {show_value(reason)}")
    return BashRule(pattern=pattern, decision=decision, reason=reason or None)


def _decision(source: str, setting: str, value: object) -> Decision:
    if isinstance(value, str):
        try:
            return Decision(value)
        except ValueError:
            pass
    raise _error(source, setting, f"expected one of {_DECISIONS}, got {show_value(value)}")


# --------------------------------------------------------------------------- messages
#
# Shared with tether._project: every message is one line, whatever the file contains.


@cache
def _bare_key() -> re.Pattern[str]:
    """A TOML bare key (compiled for the first message that names a key)."""
    return re.compile(r"[A-Za-z0-9_-]+")


_MAX_SHOWN: Final = 60


def _error(source: str, setting: str, problem: str) -> ProjectConfigError:
    return ProjectConfigError(f"{source}: {setting}: {problem}")


def check_known(source: str, where: str, table: Mapping[str, Any], known: Iterable[str]) -> None:
    """Raise :class:`ProjectConfigError` for the first key of ``table`` not in ``known``."""
    known = tuple(known)
    for name in table:
        if name not in known:
            shown = f"{where} {toml_key(str(name))}"
            raise ProjectConfigError(
                f"{source}: unknown setting {shown} (known: {', '.join(known)})"
            )


def show_value(value: object) -> str:
    """A TOML-like, single-line, bounded rendering of a parsed TOML value."""
    text = _render(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 1] + "…"


def _render(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _quote_double(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list):
        inner = ", ".join(_render(item) for item in value[:10])
        return f"[{inner}{', …' if len(value) > 10 else ''}]"
    isoformat = getattr(value, "isoformat", None)
    if callable(isoformat):
        return _one_line(str(isoformat()))
    return _one_line(type(value).__name__)


def _quote_double(text: str) -> str:
    return _one_line(json.dumps(text, ensure_ascii=False))


def _quote_single(text: str) -> str:
    return _one_line(repr(text))


def _one_line(text: str) -> str:
    """Escape every non-printable character (line breaks included)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)


def toml_key(name: str) -> str:
    """A TOML key as written in the file: bare when possible, else double-quoted."""
    return name if _bare_key().fullmatch(name) else _quote_double(name)
