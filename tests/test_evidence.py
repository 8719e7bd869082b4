"""Evidence that must exist is proven present (in-process; real crashes are in
``test_evidence_crash.py``).

* the identity of ``effects.db`` (schema version 3) and the session's sidecar naming it;
* :func:`judge_binding`, the pure decision whether a database holds a session's evidence;
* the recovery decision for unknown evidence and for a missing journal row (pure);
* the journal's intent recorded before ``toolStarted`` (:func:`prepare_journaled`,
  :func:`run_prepared`, :func:`journaled_resume`);
* authorization of a call a crashed process may have decided (``EarlierDecision``);
* the corrupt-database message.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tether import _faults as faults
from tether._effects.authorization import AuthorizationStore, call_key
from tether._effects.binding import (
    BINDING_FORMAT,
    BindingState,
    EvidenceCheck,
    SessionBinding,
    bind_session,
    binding_path,
    check_session,
    ensure_binding,
    judge_binding,
    read_binding,
    write_binding,
)
from tether._effects.contract import LookupResult
from tether._effects.journal import (
    ActionJournal,
    FileVerdict,
    JournalRow,
    JournalStatus,
    Verdict,
    journaled_resume,
    prepare_journaled,
    reconcile_file,
    run_prepared,
)
from tether._effects.recovery import (
    EVIDENCE_UNKNOWN,
    PendingObservation,
    RecoveryAction,
    decide_pending,
    observe_pending,
    reconcile_pending,
)
from tether._effects.review import ReviewDecision, ReviewStore
from tether._project import load_project_config
from tether._runtime.guards import LOST_RECORD_RULE, EarlierDecision, Guards
from tether._stores.file import SessionStore, list_sessions
from tether._tools import EditTool, ToolContext, WriteTool
from tether._tools.builtin import BashTool, content_hash
from tether._wsdb.sqlite import (
    CORRUPT_ADVICE,
    EFFECTS_MIGRATIONS,
    EFFECTS_SCHEMA_VERSION,
    EffectsDB,
    effects_db_path,
)
from tether.errors import EffectsDatabaseError

SESSION = "018f0000-0000-7000-8000-000000000001"
H_A = "sha256:" + "a" * 64
H_B = "sha256:" + "b" * 64


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


@pytest.fixture
def sessions(tmp_path: Path) -> Path:
    path = tmp_path / "sessions"
    path.mkdir(mode=0o700)
    return path


# =========================================================================== identity


def test_every_database_gets_its_own_identity_with_the_schema(tmp_path: Path) -> None:
    with EffectsDB.open(tmp_path / "a.db") as a, EffectsDB.open(tmp_path / "b.db") as b:
        assert a.identity is not None and len(a.identity) == 32
        assert int(a.identity, 16) >= 0  # hex
        assert a.identity != b.identity
        assert not a.existed and a.fresh
        first = a.identity
    with EffectsDB.open(tmp_path / "a.db") as again:
        assert again.identity == first  # stable
        assert again.existed and not again.fresh


def test_a_version_2_database_gets_an_identity_and_keeps_its_rows(ws: Path) -> None:
    path = effects_db_path(ws)
    with EffectsDB.open(path, EFFECTS_MIGRATIONS[:2]) as old:
        assert old.user_version == 2 and old.identity is None
        ActionJournal(old).record_intent("s", "op-1", "a.txt", None, H_A, "d")
    with EffectsDB.open(path) as db:
        assert db.user_version == EFFECTS_SCHEMA_VERSION and db.identity is not None
        assert not db.fresh and db.existed
        assert ActionJournal(db).get("op-1") is not None
        identity = db.identity
    # Every statement again (version forgotten): the identity stays what it was.
    con = sqlite3.connect(path)
    con.execute("PRAGMA user_version = 0")
    con.commit()
    con.close()
    with EffectsDB.open(path) as db:
        assert db.identity == identity


@pytest.mark.parametrize("round_", range(30))
def test_concurrent_openers_agree_on_one_identity(tmp_path: Path, round_: int) -> None:
    # Thirty fresh workspaces: the race below (six first opens switching a new file to WAL
    # together) lost about one round in twenty before the switch was retried, so one round
    # would rarely catch it.
    ws = tmp_path / f"ws{round_}"
    ws.mkdir()
    seen: list[str | None] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def opener() -> None:
        barrier.wait()
        # Six first opens each migrate under BEGIN IMMEDIATE, one after another: on a loaded
        # machine the default 5 s wait may not be enough for the last one; the point is the id.
        try:
            with EffectsDB.open_workspace(ws, busy_timeout=60) as db:
                seen.append(db.identity)
        except BaseException as exc:  # reported below, with the message
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, [str(exc) for exc in errors]
    assert len(seen) == 6 and len(set(seen)) == 1 and seen[0] is not None


def test_corrupt_database_message_advises_what_is_safe(ws: Path) -> None:
    path = effects_db_path(ws)
    path.parent.mkdir(mode=0o700)
    path.write_bytes(os.urandom(8192))
    with pytest.raises(EffectsDatabaseError) as info:
        EffectsDB.open_workspace(ws)
    message = str(info.value)
    assert "corrupt" in message and CORRUPT_ADVICE in message
    assert "afresh" not in message
    assert "backup" in message and "tether review" in message


# =========================================================================== judge_binding


def _binding(db_id: str = "x" * 32) -> SessionBinding:
    return SessionBinding(SESSION, db_id, "/w/.tether/effects.db", 1_700_000_000_000)


@pytest.mark.parametrize(
    ("recorded", "db_id", "names", "existed", "fresh", "unreadable", "state"),
    [
        (None, "n" * 32, False, True, False, None, BindingState.UNBOUND),
        (None, "n" * 32, True, True, False, None, BindingState.BOUND),  # sidecar lost
        (_binding(), "x" * 32, True, True, False, None, BindingState.BOUND),
        (_binding(), "n" * 32, False, False, True, None, BindingState.MISSING),
        (_binding(), "n" * 32, False, True, False, None, BindingState.REPLACED),
        (_binding(), "n" * 32, False, True, True, None, BindingState.REPLACED),
        (_binding(), "n" * 32, True, True, False, None, BindingState.REPLACED),
        (_binding(), "x" * 32, False, True, False, None, BindingState.NOT_NAMED),
        (None, "x" * 32, True, True, False, "garbage", BindingState.UNREADABLE),
    ],
)
def test_judge_binding(
    recorded: SessionBinding | None,
    db_id: str,
    names: bool,
    existed: bool,
    fresh: bool,
    unreadable: str | None,
    state: BindingState,
) -> None:
    check = judge_binding(
        SESSION,
        recorded,
        database="/w/.tether/effects.db",
        db_id=db_id,
        names_session=names,
        db_existed=existed,
        db_fresh=fresh,
        unreadable=unreadable,
    )
    assert check.state is state
    assert check.known is (state in (BindingState.UNBOUND, BindingState.BOUND))
    assert check.found_db == db_id
    assert check.expected_db == (recorded.effects_db if recorded is not None else None)
    assert check.reason
    if state is not BindingState.UNBOUND:
        assert "/w/.tether/effects.db" in check.reason
    if state is BindingState.MISSING:
        assert "did not exist" in check.reason
    if state is BindingState.REPLACED and fresh:
        assert "freshly created" in check.reason
    assert check.to_json()["state"] == state.value


# =========================================================================== the sidecar


def test_sidecar_round_trip_is_private_and_hidden(sessions: Path, ws: Path) -> None:
    binding = SessionBinding(SESSION, "x" * 32, "/w/db", 5, ({"effectsDb": "y", "state": "lost"},))
    path = write_binding(sessions, binding)
    assert path == binding_path(sessions, SESSION) == sessions / f".{SESSION}.evidence.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert not [p for p in sessions.iterdir() if p.name.endswith(".tmp")]
    raw = json.loads(path.read_text())
    assert raw["format"] == BINDING_FORMAT and raw["sessionId"] == SESSION
    assert read_binding(sessions, SESSION) == (binding, None)
    assert read_binding(sessions, "018f0000-0000-7000-8000-000000000002") == (None, None)
    # Session listings ignore it (a hidden name), next to a real log.
    store = SessionStore.create(
        ws, provider="p", model="m", environment_identity="e", sessions_dir=sessions
    )
    store.close()
    assert [s.id for s in list_sessions(sessions)] == [store.session_id]


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda p: p.write_text("not json"), "Expecting value"),
        (lambda p: p.write_text('{"format": "other"}'), "not a tether evidence record"),
        (lambda p: p.symlink_to(p.parent / "elsewhere"), "symbolic link"),
        (lambda p: p.mkdir(), "not a regular file"),
        (
            lambda p: p.write_text(
                json.dumps({**_binding().to_json(), "sessionId": "someone else"})
            ),
            "names session",
        ),
    ],
)
def test_an_unreadable_sidecar_is_reported_not_ignored(
    sessions: Path, make: Callable[[Path], Any], why: str
) -> None:
    make(binding_path(sessions, SESSION))
    binding, problem = read_binding(sessions, SESSION)
    assert binding is None and problem is not None and why in problem


def test_sidecar_write_failure_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EffectsDatabaseError) as info:
        write_binding(tmp_path / "no-such-dir", _binding())
    assert "session evidence record" in str(info.value)


# =========================================================================== binding I/O


def test_ensure_binding_binds_an_unbound_session_and_repairs_a_lost_sidecar(
    ws: Path, sessions: Path
) -> None:
    with EffectsDB.open_workspace(ws) as db:
        assert check_session(db, sessions, SESSION).state is BindingState.UNBOUND
        bound = ensure_binding(db, sessions, SESSION)
        assert bound.state is BindingState.BOUND and bound.expected_db == db.identity
        row = db.query_one("SELECT * FROM sessions WHERE session_id = ?", (SESSION,))
        assert row is not None and row["previous_db"] is None
        assert check_session(db, sessions, SESSION).state is BindingState.BOUND
        binding_path(sessions, SESSION).unlink()
        repaired = ensure_binding(db, sessions, SESSION)  # the database names the session
        assert repaired.state is BindingState.BOUND
        assert binding_path(sessions, SESSION).exists()


def test_missing_replaced_and_restored_databases_are_unknown(
    ws: Path, sessions: Path, tmp_path: Path
) -> None:
    path = effects_db_path(ws)
    with EffectsDB.open(path) as db:
        ensure_binding(db, sessions, SESSION)
        original = db.identity
    backup = tmp_path / "backup.db"
    with EffectsDB.open(path) as db:
        db.query("PRAGMA wal_checkpoint(TRUNCATE)")
        backup.write_bytes(path.read_bytes())
    for extra in path.parent.glob("effects.db*"):
        extra.unlink()
    with EffectsDB.open(path) as db:  # created afresh by this open
        check = ensure_binding(db, sessions, SESSION)
        assert check.state is BindingState.MISSING and not check.known
        assert check.expected_db == original != check.found_db
    with EffectsDB.open(path) as db:  # the same new one, opened again: not the session's
        assert ensure_binding(db, sessions, SESSION).state is BindingState.REPLACED
    # A restored copy of the right database without the session's row.
    for extra in path.parent.glob("effects.db*"):
        extra.unlink()
    path.write_bytes(backup.read_bytes())
    with EffectsDB.open(path) as db:
        assert check_session(db, sessions, SESSION).state is BindingState.BOUND
        with db.transaction() as conn:
            conn.execute("DELETE FROM sessions")
        assert check_session(db, sessions, SESSION).state is BindingState.NOT_NAMED


def test_rebinding_keeps_the_history(ws: Path, sessions: Path) -> None:
    EffectsDB.open_workspace(ws).close()  # exists: another database, not a missing one
    write_binding(sessions, _binding("o" * 32))
    with EffectsDB.open_workspace(ws) as db:
        lost = check_session(db, sessions, SESSION)
        assert lost.state is BindingState.REPLACED
        rebound = bind_session(db, sessions, SESSION, previous=lost)
        assert rebound.known and rebound.expected_db == db.identity
        row = db.query_one("SELECT previous_db FROM sessions WHERE session_id = ?", (SESSION,))
        assert row is not None and row[0] == "o" * 32
        binding, _ = read_binding(sessions, SESSION)
        assert binding is not None and binding.effects_db == db.identity
        assert binding.replaced[0]["effectsDb"] == "o" * 32
        assert binding.replaced[0]["state"] == "replaced"
        assert check_session(db, sessions, SESSION).state is BindingState.BOUND


# =========================================================================== decisions (pure)


def _unknown(state: BindingState = BindingState.MISSING) -> EvidenceCheck:
    return EvidenceCheck(state, SESSION, "/w/.tether/effects.db", "o" * 32, "n" * 32, "gone")


def _row(status: JournalStatus = JournalStatus.SUCCEEDED) -> JournalRow:
    return JournalRow(
        "op", SESSION, "edit", "a.txt", H_A, H_B, "d", status, None, "Edited", None, False, 0, 0
    )


def test_unknown_evidence_of_a_file_tool_is_a_review_with_the_evidence() -> None:
    observation = PendingObservation(
        "op", "edit", evidence=_unknown(), path="a.txt", current_hash=H_B
    )
    decision = decide_pending(observation)
    assert decision.action is RecoveryAction.REVIEW and decision.verdict == EVIDENCE_UNKNOWN
    evidence = dict(decision.evidence)
    assert evidence["missing"] == "effectsDatabase"
    assert evidence["expectedDb"] == "o" * 32 and evidence["foundDb"] == "n" * 32
    assert evidence["path"] == "a.txt" and evidence["currentHash"] == H_B
    assert evidence["effectsDatabase"]["state"] == "missing"
    assert "gone" in decision.reason
    assert decide_pending(observation) == decision  # pure: same observation, same decision


@pytest.mark.parametrize(
    "state", [BindingState.REPLACED, BindingState.NOT_NAMED, BindingState.UNREADABLE]
)
def test_every_unknown_state_reviews_even_with_a_journal_verdict(state: BindingState) -> None:
    applied = FileVerdict(Verdict.APPLIED, _row(), H_B, "journal says so")
    observation = PendingObservation("op", "edit", file=applied, evidence=_unknown(state))
    assert decide_pending(observation).action is RecoveryAction.REVIEW
    known = PendingObservation(
        "op",
        "edit",
        file=applied,
        evidence=EvidenceCheck(BindingState.BOUND, SESSION, "", "i", "i", ""),
    )
    assert decide_pending(known).action is RecoveryAction.COMPLETE


def test_unknown_evidence_of_an_effect_tool_keeps_the_service_answer() -> None:
    from tether._tools.base import ToolResult

    committed = LookupResult.committed(ToolResult("Published"))
    observation = PendingObservation("op", "publish", lookup=committed, evidence=_unknown())
    decision = decide_pending(observation)
    assert decision.action is RecoveryAction.REVIEW
    assert decision.evidence["lookup"]["status"] == "committed"
    # Known evidence: the service's answer decides, as before.
    assert decide_pending(PendingObservation("op", "publish", lookup=committed)).action is (
        RecoveryAction.COMPLETE
    )


def test_a_reviewers_decision_stands_over_unknown_evidence(ws: Path) -> None:
    with EffectsDB.open_workspace(ws) as db:
        reviews = ReviewStore(db)
        item = reviews.open_item(SESSION, "op", "edit", "why", {})
        opened = PendingObservation("op", "edit", review=item, evidence=_unknown())
        assert decide_pending(opened).verdict == "reviewOpen"
        resolved = reviews.resolve(item.id, ReviewDecision.NOT_APPLIED)
        decision = decide_pending(
            PendingObservation("op", "edit", review=resolved, evidence=_unknown())
        )
        assert decision.action is RecoveryAction.COMPLETE and decision.is_error


def test_no_journal_row_is_a_review_not_an_execution() -> None:
    verdict = reconcile_file(None, H_A, path="a.txt")
    assert verdict.verdict is Verdict.NO_RECORD and "lost" in verdict.reason
    decision = decide_pending(PendingObservation("op", "edit", file=verdict))
    assert decision.action is RecoveryAction.REVIEW and decision.verdict == "noRecord"
    assert decision.evidence["missing"] == "journalRow"
    assert decision.evidence["path"] == "a.txt" and decision.evidence["currentHash"] == H_A


def test_observe_with_unknown_evidence_does_not_trust_the_journal(ws: Path) -> None:
    (ws / "a.txt").write_text("new\n")
    with EffectsDB.open_workspace(ws) as db:
        journal, reviews = ActionJournal(db), ReviewStore(db)
        journal.record_intent(SESSION, "op", "a.txt", H_A, H_B, "d", status=JournalStatus.STARTED)
        observation = observe_pending(
            EditTool(),
            "op",
            workspace=ws,
            journal=journal,
            reviews=reviews,
            arguments={"path": "a.txt", "old_string": "x", "new_string": "y"},
            evidence=_unknown(),
        )
        assert observation is not None and observation.file is None
        assert observation.current_hash == content_hash(b"new\n")
        decision, item = reconcile_pending(
            EditTool(),
            "op",
            SESSION,
            workspace=ws,
            journal=journal,
            reviews=reviews,
            arguments={"path": "a.txt"},
            evidence=_unknown(),
        )
        assert decision.action is RecoveryAction.REVIEW and item is not None
        assert item.evidence["currentHash"] == content_hash(b"new\n")
        row = journal.get("op")
        assert row is not None and row.status is JournalStatus.STARTED  # untouched


# =========================================================================== prepare / run


def _tool_text(tool: Any, ws: Path, arguments: dict[str, Any]) -> tuple[str, bool]:
    result = tool.run(arguments, ToolContext(ws, "plain"))
    return result.content, result.is_error


def test_prepare_records_the_intent_before_anything_is_touched(ws: Path) -> None:
    (ws / "a.txt").write_text("one\n")
    arguments = {"path": "a.txt", "old_string": "one", "new_string": "two"}
    with EffectsDB.open_workspace(ws) as db:
        journal = ActionJournal(db)
        prepared = prepare_journaled("edit", ws, journal, SESSION, "op", arguments)
        assert prepared.row.status is JournalStatus.AUTHORIZED
        assert (ws / "a.txt").read_text() == "one\n"  # untouched
        result = run_prepared(ws, journal, prepared)
        assert result.content == "Edited a.txt: replaced 1 occurrence" and not result.is_error
        assert (ws / "a.txt").read_text() == "two\n"
        assert [h[0].value for h in journal.history("op")] == [
            "authorized",
            "started",
            "succeeded",
        ]


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        (EditTool(), {"path": "a.txt", "old_string": "absent", "new_string": "x"}),
        (EditTool(), {"path": "missing.txt", "old_string": "a", "new_string": "x"}),
        (WriteTool(), {"path": "../outside.txt", "content": "x"}),
        (WriteTool(), {"path": "dir/", "content": "x"}),
    ],
)
def test_a_planning_error_is_recorded_failed_with_the_same_text(
    ws: Path, tool: Any, arguments: dict[str, Any]
) -> None:
    (ws / "a.txt").write_text("one\n")
    expected = _tool_text(tool, ws, arguments)
    assert expected[1]
    with EffectsDB.open_workspace(ws) as db:
        journal = ActionJournal(db)
        prepared = prepare_journaled(tool.name, ws, journal, SESSION, "op", arguments)
        assert prepared.row.status is JournalStatus.FAILED
        assert prepared.row.result == expected[0] and prepared.row.result_is_error
        result = run_prepared(ws, journal, prepared)
        assert (result.content, result.is_error) == expected
        # After a crash, the replay path gives the model the very same text.
        again = journaled_resume(tool.name, ws, journal, SESSION, "op", arguments)
        assert again is not None and (again.content, again.is_error) == expected
        verdict = reconcile_file(journal.get("op"), None)
        assert (
            decide_pending(PendingObservation("op", tool.name, file=verdict)).content
            == (expected[0])
        )
    assert not (ws.parent / "outside.txt").exists()


def test_a_prepared_call_reexecuted_after_a_crash_reports_like_a_first_run(ws: Path) -> None:
    """Crash at before_effect: the row is authorized, the file untouched; the re-execution
    gives the normal texts (also for a write that changes nothing)."""
    (ws / "a.txt").write_text("same\n")
    with EffectsDB.open_workspace(ws) as db:
        journal = ActionJournal(db)
        for op, arguments, text in [
            (
                "op-1",
                {"path": "a.txt", "content": "same\n"},
                "(unchanged: it already had this content)",
            ),
            ("op-2", {"path": "b.txt", "content": "new\n"}, "(created)"),
        ]:
            prepare_journaled("write", ws, journal, SESSION, op, arguments)
            result = journaled_resume("write", ws, journal, SESSION, op, arguments)
            assert result is not None and result.content.endswith(text), result.content
            assert "reconciled" not in result.content
        assert (ws / "b.txt").read_text() == "new\n"


def test_journaled_resume_never_plans_a_call_without_its_intent(ws: Path) -> None:
    (ws / "a.txt").write_text("one\n")
    with EffectsDB.open_workspace(ws) as db:
        arguments = {"path": "a.txt", "old_string": "one", "new_string": "two"}
        assert journaled_resume("edit", ws, ActionJournal(db), SESSION, "op", arguments) is None
    assert (ws / "a.txt").read_text() == "one\n"


def test_the_new_journal_boundary_is_registered() -> None:
    assert "journal.intent_prepared" in faults.BOUNDARIES
    assert "toolStarted not committed" in faults.BOUNDARIES["journal.intent_prepared"]


# =========================================================================== authorization


class _Deny:
    """A person at a terminal who answers no and counts the questions."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, request: Any) -> bool:
        self.asked.append(request.rule)
        return False


def _guards(ws: Path, db_factory: Callable[[], EffectsDB], **options: Any) -> Guards:
    return Guards(ws, load_project_config(ws), db_factory, **options)


def _no_db() -> EffectsDB:
    raise AssertionError("effects.db must not be opened for this decision")


def test_a_new_call_allowed_by_default_needs_no_record(ws: Path) -> None:
    guards = _guards(ws, _no_db)
    assert guards.authorize(SESSION, "entry", 0, BashTool(), {"command": "true"}) == (None, None)


def test_a_call_a_crashed_process_may_have_decided_is_looked_up(ws: Path) -> None:
    with EffectsDB.open_workspace(ws) as db:
        guards = _guards(ws, lambda: db)
        bash = BashTool()
        # Nothing recorded: allowed by default, still without a record.
        allowed = guards.authorize(
            SESSION, "e", 0, bash, {"command": "x"}, earlier_decision=EarlierDecision.RECORDED
        )
        assert allowed == (None, None)
        AuthorizationStore(db).record(
            session_id=SESSION,
            call_key=call_key("e", 1),
            tool_name="bash",
            arguments_digest="d",
            summary="x",
            decision="deny",
            who="user",
            rule="default for side-effecting tools in the REPL",
            reason="declined at the terminal",
        )
        recorded, denial = guards.authorize(
            SESSION, "e", 1, bash, {"command": "x"}, earlier_decision=EarlierDecision.RECORDED
        )
        assert recorded is not None and recorded.decision == "deny"
        assert denial is not None and "declined at the terminal" in denial


@pytest.mark.parametrize(
    ("options", "toml", "decision", "asked"),
    [
        ({}, None, "deny", False),  # nobody to ask: denied
        ({"authorize": "deny"}, None, "deny", True),  # asked again, says no
        ({"assume_yes": True}, None, "allow", False),  # --yes answers
        ({}, '[policy.tools]\nbash = "allow"\n', "allow", False),  # an explicit rule
        ({}, '[policy.tools]\nbash = "deny"\n', "deny", False),
    ],
)
def test_a_possibly_lost_record_never_counts_as_allowed_by_default(
    ws: Path, options: dict[str, Any], toml: str | None, decision: str, asked: bool
) -> None:
    if toml is not None:
        (ws / "tether.toml").write_text(toml)
    person = _Deny()
    if options.get("authorize") == "deny":
        options = {**options, "authorize": person, "ask_by_default": False}
    with EffectsDB.open_workspace(ws) as db:
        guards = _guards(ws, lambda: db, **options)
        recorded, denial = guards.authorize(
            SESSION, "e", 0, BashTool(), {"command": "x"}, earlier_decision=EarlierDecision.UNKNOWN
        )
        assert recorded is not None and recorded.decision == decision
        assert (denial is None) is (decision == "allow")
        assert bool(person.asked) is asked
        if asked:
            assert person.asked == [LOST_RECORD_RULE]
        if decision == "deny" and toml is None and not asked:
            assert recorded.rule == LOST_RECORD_RULE
