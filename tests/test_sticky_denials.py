"""Denials that stick (issue 30): after a person denies a call of a tool, later calls of
that tool in the session need a person again, whatever allow rule or bash pattern matches.

Pure parts: the reducer notes a person's denial only where the writer put it (the denial's
error result in the transaction of its ``toolStarted``), :func:`standing_denial` folds the
log's denials and the recorded decisions, :func:`decide` never allows a denied tool. Then the
shell: a terminal's "no" through the library, and ``tether deny``/``approve`` through the CLI
with a reworded command that the policy would allow.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionkit import SessionKit
from test_approvals import DONE, bash_call, parked, session_of
from test_cli_run import run_cli, script, tool_results
from test_completion import bash, calls, done, effects_db, run, tool_messages
from test_policy import _arguments, _kinds, _names, _policies
from tether._effects.authorization import AuthorizationStore
from tether._runtime.guards import AuthorizationRequest
from tether.core import Reducer
from tether.core.contents import PERSON_DENIAL_PREFIX
from tether.core.policy import (
    NO_PERSON_REASON,
    NO_TERMINAL_REASON,
    PERSON_DENIED_REASON,
    Decision,
    Policy,
    ToolKind,
    decide,
    standing_denial,
)
from tether.core.state import SessionState
from tether.core.values import Authorization

DENIAL = f"{PERSON_DENIAL_PREFIX}this call was not authorized (alice, rule). It did not run."


def authorization(entry_id: str, index: int, tool: str, decision: str, who: str) -> Authorization:
    return Authorization(
        id=1,
        session_id="s",
        call_key=f"{entry_id}:{index}",
        tool_name=tool,
        arguments_digest="sha256:" + "0" * 64,
        summary="",
        decision=decision,
        who=who,
        rule="rule",
        reason=None,
        decided_at_ms=0,
    )


# --------------------------------------------------------------------------- the reducer


def _one_call(kit: SessionKit, tool: str = "bash") -> dict[str, Any]:
    kit.step_attempt()
    return kit.assistant(None, [(tool, '{"command":"rm -rf /"}')])


def test_the_reducer_notes_a_denial_committed_with_its_tool_started() -> None:
    kit = SessionKit(tools=("bash", "read"))
    kit.start_run()
    call = _one_call(kit)
    with kit.tx():
        started = kit.tool_started(0, replay="never")
        result = kit.tool_result(started, content=DENIAL, result="error")
    [denial] = Reducer.load(kit.bytes()).state.person_denials
    assert (denial.tool_name, denial.assistant_entry_id, denial.tool_index) == (
        "bash",
        call["id"],
        0,
    )
    assert denial.result_entry_id == result["id"]
    assert denial.position == 1  # the user entry, then the assistant entry


def test_a_tools_own_output_never_passes_for_a_persons_denial() -> None:
    """A call that ran has its result in a later transaction than its toolStarted: even an
    error whose text mimics a denial is the tool's output, not a person's answer."""
    kit = SessionKit(tools=("bash",))
    kit.start_run()
    _one_call(kit)
    started = kit.tool_started(0, replay="never")
    kit.tool_result(started, content=DENIAL, result="error")
    assert list(Reducer.load(kit.bytes()).state.person_denials) == []


def test_only_an_error_result_with_the_prefix_is_a_denial() -> None:
    for content, result in ((DENIAL, "success"), ("Error: permission denied: x", "error")):
        kit = SessionKit(tools=("bash",))
        kit.start_run()
        _one_call(kit)
        with kit.tx():
            started = kit.tool_started(0, replay="never")
            kit.tool_result(started, content=content, result=result)
        assert list(Reducer.load(kit.bytes()).state.person_denials) == []


def test_a_rolled_back_transaction_leaves_no_denial() -> None:
    kit = SessionKit(tools=("bash",))
    kit.start_run()
    _one_call(kit)
    lines = kit.lines()
    with kit.tx():
        started = kit.tool_started(0, replay="never")
        kit.tool_result(started, content=DENIAL, result="error")
    reducer = Reducer.load(b"".join(line + b"\n" for line in lines))
    reducer.begin(kit.lines()[-1]).rollback()
    assert list(reducer.state.person_denials) == []
    reducer.apply(kit.lines()[-1])
    assert len(reducer.state.person_denials) == 1


# --------------------------------------------------------------------------- standing_denial

# One call: (tool, outcome). Outcomes: a person denies or allows it, the policy allows or
# denies it (a policy denial has no person prefix).
OUTCOMES = ("person_deny", "person_allow", "policy_allow", "policy_deny")
TOOLS = ("bash", "write")


def _session(
    groups: Sequence[Sequence[tuple[str, str]]],
) -> tuple[SessionState, list[Authorization]]:
    """A log with one assistant message per group (its calls in order) and the decisions
    recorded for them, as the runtime writes both."""
    kit = SessionKit(tools=TOOLS)
    kit.start_run()
    decisions: list[Authorization] = []
    for group in groups:
        kit.step_attempt()
        entry = kit.assistant(None, [(tool, "{}") for tool, _ in group])
        for index, (tool, outcome) in enumerate(group):
            person = outcome.startswith("person")
            allowed = outcome.endswith("allow")
            who = "alice" if person else "policy"
            decisions.append(
                authorization(entry["id"], index, tool, "allow" if allowed else "deny", who)
            )
            if allowed:
                started = kit.tool_started(index, replay="never")
                kit.tool_result(started, content="ran")
            else:
                with kit.tx():
                    started = kit.tool_started(index, replay="never")
                    text = DENIAL if person else "Error: permission denied: policy"
                    kit.tool_result(started, content=text, result="error")
    return Reducer.load(kit.bytes()).state, decisions


calls_strategy = st.lists(
    st.lists(st.tuples(st.sampled_from(TOOLS), st.sampled_from(OUTCOMES)), min_size=1, max_size=3),
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(calls_strategy)
def test_a_denial_stands_until_a_person_allows_the_tool_again(
    groups: list[list[tuple[str, str]]],
) -> None:
    state, decisions = _session(groups)
    for tool in TOOLS:
        persons = [o for group in groups for t, o in group if t == tool and o.startswith("person")]
        expected = bool(persons) and persons[-1] == "person_deny"
        assert (standing_denial(state, tool, decisions) is not None) is expected
        # Without the recorded decisions (a lost effects.db) every denial in the log stands.
        denied = "person_deny" in persons
        assert (standing_denial(state, tool, ()) is not None) is denied


def test_an_approval_of_another_tool_or_by_the_policy_lifts_nothing() -> None:
    state, decisions = _session([[("bash", "person_deny")], [("write", "person_allow")]])
    later = decisions[-1]
    assert standing_denial(state, "bash", decisions) is not None
    forged = authorization(later.call_key.split(":")[0], 0, "bash", "allow", "--yes")
    assert standing_denial(state, "bash", [*decisions, forged]) is not None
    odd = authorization("x", 0, "bash", "allow", "alice")
    odd = Authorization(**{**odd.__dict__, "call_key": "no-index"})
    assert standing_denial(state, "bash", [*decisions, odd]) is not None


# --------------------------------------------------------------------------- decide


@settings(max_examples=300, deadline=None)
@given(_policies, _names, _arguments, _kinds, st.booleans(), st.booleans())
def test_decide_never_allows_a_tool_a_person_denied(
    policy: Policy,
    tool: str,
    arguments: Mapping[str, Any],
    kind: ToolKind,
    interactive: bool,
    assume_yes: bool,
) -> None:
    verdict = decide(
        policy,
        tool,
        arguments,
        kind=kind,
        interactive=interactive,
        assume_yes=assume_yes,
        person_denied=True,
    )
    plain = decide(
        policy, tool, arguments, kind=kind, interactive=interactive, assume_yes=assume_yes
    )
    assert verdict.decision is not Decision.ALLOW
    if plain.decision is Decision.DENY and plain.reason != NO_TERMINAL_REASON:
        assert verdict == plain  # the policy's own deny stays as it was
    elif interactive:
        assert (verdict.decision, verdict.reason) == (Decision.ASK, PERSON_DENIED_REASON)
        assert verdict.after_denial
    else:
        assert (verdict.decision, verdict.reason) == (Decision.DENY, NO_PERSON_REASON)


# --------------------------------------------------------------------------- the shell

ALLOW_ECHO = '[[policy.bash]]\npattern = "echo *"\ndecision = "allow"\n'


def test_a_terminals_no_makes_the_next_call_of_the_tool_ask_again(tmp_path: Path) -> None:
    """Library, with a terminal: the person declines ``rm``; the reworded ``echo`` would be
    allowed by a pattern, yet the person is asked; their yes lifts the denial, so the
    next ``echo`` runs under the pattern again without a question."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "tether.toml").write_text(ALLOW_ECHO)
    asked: list[AuthorizationRequest] = []

    def answer(request: AuthorizationRequest) -> bool:
        asked.append(request)
        return not request.summary.startswith("rm")

    result = run(
        root,
        {
            "model": "scripted/sticky",
            "responses": [
                calls(bash("b1", "rm -rf data")),
                calls(bash("b2", "echo one >> out.txt")),
                calls(bash("b3", "echo two >> out.txt")),
                done(),
            ],
        },
        authorize=answer,
    )
    assert [q.summary for q in asked] == ["rm -rf data", "echo one >> out.txt"]
    assert asked[1].reason == PERSON_DENIED_REASON
    assert (root / "out.txt").read_text() == "one\ntwo\n"
    assert tool_messages(result)[0].startswith(PERSON_DENIAL_PREFIX)
    db = effects_db(root)
    try:
        decided = [(d.decision, d.who) for d in AuthorizationStore(db).list(result.session_id)]
    finally:
        db.close()
    assert decided == [("deny", "user"), ("allow", "user"), ("allow", "policy")]


def test_a_deny_from_another_terminal_sticks_across_processes(tmp_path: Path) -> None:
    """CLI, nobody at a terminal: ``tether deny`` on a parked ``rm``; on resume the model
    rewords it as an ``echo`` the pattern allows: parked again, not run (also with
    ``--yes``); ``tether approve`` runs it and lifts the denial for the next ``echo``."""
    ws = tmp_path
    (ws / "tether.toml").write_text('[policy.tools]\nbash = "ask"\n' + ALLOW_ECHO)
    model = script(
        ws,
        [
            bash_call("rm -rf data"),
            bash_call("echo one >> out.txt"),
            bash_call("echo two >> out.txt"),
            DONE,
        ],
    )
    assert run_cli("run", "go", "--model", model, cwd=ws).returncode == 67
    session_id, path = session_of(ws)
    assert run_cli("deny", "1", "--why", "no deleting", "--as", "bob", cwd=ws).returncode == 0
    again = run_cli("resume", session_id, "--model", model, cwd=ws)
    assert again.returncode == 67, again.stderr
    assert "call #2 (bash: echo one >> out.txt)" in again.stderr
    assert not (ws / "out.txt").exists()
    yes = run_cli("resume", session_id, "--model", model, "--yes", cwd=ws)
    assert yes.returncode == 67, yes.stderr
    assert not (ws / "out.txt").exists()
    [request] = [r for r in parked(ws) if r["status"] == "proposed"]
    assert request["id"] == 2
    assert run_cli("approve", "2", "--as", "bob", cwd=ws).returncode == 0
    resumed = run_cli("resume", session_id, "--model", model, cwd=ws)
    assert resumed.returncode == 0, resumed.stderr
    assert (ws / "out.txt").read_text() == "one\ntwo\n"
    results = [r["message"]["content"] for r in tool_results(path)]
    assert results[0].startswith(PERSON_DENIAL_PREFIX) and "no deleting" in results[0]
    listed = json.loads(run_cli("authorizations", "--json", cwd=ws).stdout)
    assert [(d["decision"], d["who"]) for d in listed] == [
        ("deny", "bob"),
        ("allow", "bob"),
        ("allow", "policy"),
    ]
