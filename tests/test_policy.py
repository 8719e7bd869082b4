"""The pure authorization policy: :func:`tether.core.policy.decide`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.core.policy import (
    NO_TERMINAL_REASON,
    BashRule,
    Decision,
    Policy,
    PolicyVerdict,
    ToolKind,
    decide,
    policy_from_mapping,
)
from tether.errors import ProjectConfigError

ALLOW, ASK, DENY = Decision.ALLOW, Decision.ASK, Decision.DENY
RO, SE = ToolKind.READ_ONLY, ToolKind.SIDE_EFFECT

GIT_PUSH = BashRule("*git push*", DENY, "pushing is for humans")
PYTEST = BashRule("pytest*", ALLOW)
RM = BashRule("rm *", ASK, "deleting files")

FULL = Policy(
    default=DENY,
    tools={"bash": ASK, "write": ALLOW, "publish_report": DENY, "read": DENY},
    bash=(GIT_PUSH, PYTEST, RM),
)
TOOLS_ONLY = Policy(tools={"bash": ALLOW, "edit": ASK})
EMPTY = Policy()


def verdict(
    policy: Policy,
    tool: str,
    arguments: Mapping[str, Any] | None = None,
    *,
    kind: ToolKind = SE,
    interactive: bool = True,
    assume_yes: bool = False,
) -> PolicyVerdict:
    return decide(
        policy,
        tool,
        arguments or {},
        kind=kind,
        interactive=interactive,
        assume_yes=assume_yes,
    )


# --------------------------------------------------------------------------- rule 1


@pytest.mark.parametrize("interactive", [True, False])
@pytest.mark.parametrize("assume_yes", [True, False])
def test_read_only_tools_are_allowed(interactive: bool, assume_yes: bool) -> None:
    for policy in (EMPTY, FULL, Policy(default=DENY)):
        got = verdict(policy, "verify", kind=RO, interactive=interactive, assume_yes=assume_yes)
        assert got == PolicyVerdict(ALLOW, "read-only tool", None)


def test_read_only_tool_named_in_tools_is_decided_by_it() -> None:
    assert verdict(FULL, "read", kind=RO) == PolicyVerdict(
        DENY, "tether.toml [policy.tools] read", None
    )
    asks = Policy(tools={"read": ASK})
    assert verdict(asks, "read", kind=RO).decision is ASK
    assert verdict(asks, "read", kind=RO, interactive=False).decision is DENY
    assert verdict(asks, "read", kind=RO, assume_yes=True).decision is ALLOW


def test_read_only_bash_ignores_bash_rules() -> None:
    policy = Policy(bash=(BashRule("*", DENY),))
    assert verdict(policy, "bash", {"command": "ls"}, kind=RO).decision is ALLOW


# --------------------------------------------------------------------------- rule 2

BASH_CASES = [
    # (command, expected raw decision, expected rule, expected reason)
    (
        "git push origin main",
        DENY,
        "tether.toml [[policy.bash]] pattern '*git push*'",
        "pushing is for humans",
    ),
    (
        "cd x && git push",
        DENY,
        "tether.toml [[policy.bash]] pattern '*git push*'",
        "pushing is for humans",
    ),
    (
        "   git push   ",
        DENY,
        "tether.toml [[policy.bash]] pattern '*git push*'",
        "pushing is for humans",
    ),
    ("pytest -q", ALLOW, "tether.toml [[policy.bash]] pattern 'pytest*'", None),
    ("\tpytest\n", ALLOW, "tether.toml [[policy.bash]] pattern 'pytest*'", None),
    (
        "pytest -q && git push",
        DENY,
        "tether.toml [[policy.bash]] pattern '*git push*'",
        "pushing is for humans",
    ),
    ("rm -rf build", ASK, "tether.toml [[policy.bash]] pattern 'rm *'", "deleting files"),
    ("PYTEST", ASK, "tether.toml [policy.tools] bash", None),  # case-sensitive
    ("ls", ASK, "tether.toml [policy.tools] bash", None),
    ("", ASK, "tether.toml [policy.tools] bash", None),
]


@pytest.mark.parametrize(("command", "decision", "rule", "reason"), BASH_CASES)
def test_bash_rules_first_match_wins(
    command: str, decision: Decision, rule: str, reason: str | None
) -> None:
    assert verdict(FULL, "bash", {"command": command}) == PolicyVerdict(decision, rule, reason)


def test_bash_rule_order_matters() -> None:
    first = Policy(bash=(BashRule("git *", ALLOW), BashRule("*git push*", DENY)))
    assert verdict(first, "bash", {"command": "git push"}).decision is ALLOW
    second = Policy(bash=(BashRule("*git push*", DENY), BashRule("git *", ALLOW)))
    assert verdict(second, "bash", {"command": "git push"}).decision is DENY


@pytest.mark.parametrize("command", [None, 3, ["git", "push"], {"x": 1}, b"git push", True])
def test_non_str_command_matches_no_pattern(command: object) -> None:
    policy = Policy(bash=(BashRule("*", DENY),), tools={"bash": ALLOW})
    assert verdict(policy, "bash", {"command": command}) == PolicyVerdict(
        ALLOW, "tether.toml [policy.tools] bash", None
    )
    assert verdict(policy, "bash", {}).decision is ALLOW


def test_bash_rules_apply_only_to_bash() -> None:
    policy = Policy(bash=(BashRule("*", DENY),))
    assert verdict(policy, "write", {"command": "x"}, interactive=False).decision is ALLOW


# --------------------------------------------------------------------------- rule 3

FALLBACK_CASES = [
    # (policy, tool, interactive, decision, rule)
    (FULL, "write", True, ALLOW, "tether.toml [policy.tools] write"),
    (FULL, "publish_report", True, DENY, "tether.toml [policy.tools] publish_report"),
    (FULL, "edit", True, DENY, "tether.toml [policy] default"),
    (Policy(default=ALLOW), "edit", True, ALLOW, "tether.toml [policy] default"),
    (TOOLS_ONLY, "bash", True, ALLOW, "tether.toml [policy.tools] bash"),
    (TOOLS_ONLY, "edit", True, ASK, "tether.toml [policy.tools] edit"),
    (TOOLS_ONLY, "write", True, ASK, "default for side-effecting tools in the REPL"),
    (EMPTY, "bash", True, ASK, "default for side-effecting tools in the REPL"),
    (EMPTY, "publish_report", True, ASK, "default for side-effecting tools in the REPL"),
    (EMPTY, "bash", False, ALLOW, "default for side-effecting tools outside the REPL"),
    (EMPTY, "write", False, ALLOW, "default for side-effecting tools outside the REPL"),
]


@pytest.mark.parametrize(("policy", "tool", "interactive", "decision", "rule"), FALLBACK_CASES)
def test_tools_then_default_then_built_in(
    policy: Policy, tool: str, interactive: bool, decision: Decision, rule: str
) -> None:
    assert verdict(policy, tool, interactive=interactive) == PolicyVerdict(decision, rule, None)


def test_odd_tool_names_are_quoted_in_the_rule() -> None:
    policy = Policy(tools={"my tool": DENY})
    assert verdict(policy, "my tool").rule == 'tether.toml [policy.tools] "my tool"'


# --------------------------------------------------------------------------- rule 4


def test_ask_with_yes_becomes_allow() -> None:
    for interactive in (True, False):
        got = verdict(
            FULL, "bash", {"command": "rm -r x"}, interactive=interactive, assume_yes=True
        )
        assert got == PolicyVerdict(
            ALLOW,
            "--yes (instead of ask from tether.toml [[policy.bash]] pattern 'rm *')",
            "deleting files",
        )
    built_in = verdict(EMPTY, "bash", {"command": "ls"}, assume_yes=True)
    assert built_in.decision is ALLOW
    assert built_in.rule.startswith("--yes")
    assert "default for side-effecting tools in the REPL" in built_in.rule


def test_ask_without_terminal_becomes_deny() -> None:
    got = verdict(FULL, "bash", {"command": "ls"}, interactive=False)
    assert got == PolicyVerdict(DENY, "tether.toml [policy.tools] bash", NO_TERMINAL_REASON)
    assert NO_TERMINAL_REASON == (
        "approval needed but there is no terminal to ask; pass --yes or add a policy rule"
    )


@pytest.mark.parametrize("interactive", [True, False])
def test_deny_survives_yes(interactive: bool) -> None:
    got = verdict(FULL, "bash", {"command": "git push"}, interactive=interactive, assume_yes=True)
    assert got == PolicyVerdict(
        DENY, "tether.toml [[policy.bash]] pattern '*git push*'", "pushing is for humans"
    )
    assert (
        verdict(FULL, "publish_report", interactive=interactive, assume_yes=True).decision is DENY
    )


def test_ask_interactive_stays_ask() -> None:
    assert verdict(FULL, "bash", {"command": "ls"}).decision is ASK


def test_allow_is_unchanged_by_flags() -> None:
    for interactive in (True, False):
        for yes in (True, False):
            got = verdict(FULL, "write", interactive=interactive, assume_yes=yes)
            assert got == PolicyVerdict(ALLOW, "tether.toml [policy.tools] write", None)


# --------------------------------------------------------------------------- the types


def test_policy_coerces_and_freezes() -> None:
    raw: dict[str, Any] = {
        "default": "deny",
        "tools": {"bash": "ask"},
        "bash": [BashRule("x", "allow")],  # type: ignore[arg-type]
    }
    policy = Policy(**raw)
    assert policy.default is DENY
    assert policy.tools["bash"] is ASK
    assert policy.bash == (BashRule("x", ALLOW),)
    assert policy.bash[0].decision is ALLOW
    with pytest.raises(TypeError):
        policy.tools["write"] = ALLOW  # type: ignore[index]
    assert hash(policy) == hash(
        Policy(default=DENY, tools={"bash": ASK}, bash=(BashRule("x", ALLOW),))
    )
    assert Policy() == Policy(tools={})


def test_policy_does_not_alias_the_callers_dict() -> None:
    tools = {"bash": DENY}
    policy = Policy(tools=tools)
    tools["bash"] = ALLOW
    assert policy.tools["bash"] is DENY


def test_enums_are_str() -> None:
    assert isinstance(Decision.ASK, str) and str(Decision.DENY) == "deny"
    assert [d.value for d in Decision] == ["allow", "ask", "deny"]
    assert [k.value for k in ToolKind] == ["read_only", "side_effect"]
    assert Decision("ask") is ASK and ToolKind("read_only") is RO


# --------------------------------------------------------------------------- parsing


def test_policy_from_mapping() -> None:
    policy = policy_from_mapping(
        {
            "default": "allow",
            "tools": {"bash": "ask"},
            "bash": [{"pattern": "ls*", "decision": "allow", "reason": "harmless"}],
        },
        "proj.toml",
    )
    assert policy == Policy(
        default=ALLOW, tools={"bash": ASK}, bash=(BashRule("ls*", ALLOW, "harmless"),)
    )
    assert policy_from_mapping({}, "proj.toml") == Policy()


def test_policy_from_mapping_names_the_source() -> None:
    with pytest.raises(ProjectConfigError, match=r"^proj\.toml: \[policy\] default: "):
        policy_from_mapping({"default": 1}, "proj.toml")
    with pytest.raises(ProjectConfigError, match=r"^proj\.toml: \[policy.tools\] \"\": "):
        policy_from_mapping({"tools": {"": "ask"}}, "proj.toml")


# --------------------------------------------------------------------------- properties

_decisions = st.sampled_from(list(Decision))
_names = st.sampled_from(["bash", "write", "edit", "read", "verify", "publish_report"]) | st.text(
    max_size=12
)
_patterns = st.sampled_from(["*", "git push*", "*git push*", "[", "[!a]*", "?", "**", "ls"]) | (
    st.text(max_size=12)
)
_rules = st.builds(
    BashRule, pattern=_patterns, decision=_decisions, reason=st.none() | st.text(max_size=10)
)
_policies = st.builds(
    Policy,
    default=st.none() | _decisions,
    tools=st.dictionaries(_names, _decisions, max_size=5),
    bash=st.lists(_rules, max_size=5).map(tuple),
)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
_commands = (
    st.text(max_size=30)
    | st.sampled_from(["git push", "  git push --force ", "ls -la", "rm -rf /", "pytest -q"])
    | _json
    | st.binary(max_size=5)
)
_arguments = st.fixed_dictionaries({}, optional={"command": _commands}) | st.dictionaries(
    st.text(max_size=8), _json, max_size=3
)
_kinds = st.sampled_from(list(ToolKind))


@settings(max_examples=1000, deadline=None)
@given(
    policy=_policies,
    tool=_names,
    arguments=_arguments,
    kind=_kinds,
    interactive=st.booleans(),
    assume_yes=st.booleans(),
)
def test_decide_properties(
    policy: Policy,
    tool: str,
    arguments: dict[str, Any],
    kind: ToolKind,
    interactive: bool,
    assume_yes: bool,
) -> None:
    got = decide(policy, tool, arguments, kind=kind, interactive=interactive, assume_yes=assume_yes)
    assert isinstance(got, PolicyVerdict)
    assert isinstance(got.decision, Decision)
    assert isinstance(got.rule, str) and got.rule
    assert got.reason is None or isinstance(got.reason, str)
    # pure: the same inputs give the same verdict
    assert got == decide(
        policy, tool, arguments, kind=kind, interactive=interactive, assume_yes=assume_yes
    )
    # non-interactive never yields ASK
    if not interactive:
        assert got.decision is not ASK
    # --yes never yields ASK either
    if assume_yes:
        assert got.decision is not ASK
    # the raw decision (interactive, no --yes) is never weakened from DENY by --yes
    raw = decide(policy, tool, arguments, kind=kind, interactive=True, assume_yes=False)
    if raw.decision is DENY:
        assert got.decision is DENY
    if got.decision is ALLOW:
        assert (
            raw.decision is ALLOW
            or (assume_yes and raw.decision is ASK)
            or (not interactive and raw.rule == "default for side-effecting tools in the REPL")
        )
    # --yes only ever changes ASK into ALLOW
    without_yes = decide(
        policy, tool, arguments, kind=kind, interactive=interactive, assume_yes=False
    )
    if assume_yes and got != without_yes:
        assert got.decision is ALLOW
        assert without_yes.decision in (ASK, DENY)
        assert got.rule.startswith("--yes")
