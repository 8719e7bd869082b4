"""The seams: both session stores and both workspace databases keep the same rules, and the
agent runs end to end over the in-memory ones exactly as over the file store and SQLite.

* session stores (:mod:`tether._stores.file`, :mod:`tether._stores.memory`): commit,
  rejection without change, one writer, reopening reads back the committed transactions,
  the record kept beside the log, and the same bytes for the same facts;
* workspace databases (:class:`~tether._wsdb.sqlite.EffectsDB`,
  :class:`~tether._wsdb.memory.MemoryWorkspaceDB`): every table's first-record-wins and
  transition rules, orderings and errors, the identity and the sessions it holds;
* the agent (bash, write and edit through the journal, an effect tool with a lookup) with
  an in-process crash at ``journal.change_applied`` and another right after the effect
  committed, each resumed by a new agent over the same stores: the same transcript, journal,
  ledger and files over the memory seams as over the file store and ``effects.db``;
* recovery kinds: each tool declares its own, a kind's methods are checked when the tool is
  built, and a file-change tool the journal has never heard of is journaled and reconciled.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pgkit import pg_url  # noqa: F401 (the postgres workspace database's fixture)
from tether import _faults as faults
from tether._completion.check import CheckOutcome
from tether._effects.binding import SIDECAR_NAME, BindingState, check_session, ensure_binding
from tether._effects.contract import LookupResult, effect_tool
from tether._effects.journal import JournalStatus, is_journaled
from tether._effects.review import ReviewDecision
from tether._runtime import Agent, RunStatus
from tether._stores.file import Durability
from tether._stores.memory import MemorySessions
from tether._stores.opener import FileSessions
from tether._stores.protocol import SessionOpener, SessionStoreProtocol
from tether._tools.base import FunctionTool, RecoveryKind, Tool, ToolContext, ToolResult
from tether._tools.builtin import (
    ApplyOutcome,
    BashTool,
    EditTool,
    FileChangeTool,
    PlannedChange,
    ReadTool,
    WriteTool,
    builtin_tools,
    plan_write,
)
from tether._tools.workspace import ProtectedState
from tether._wsdb.memory import MemoryWorkspace
from tether._wsdb.protocol import WorkspaceDB
from tether._wsdb.sqlite import EffectsDB
from tether.core import facts
from tether.errors import (
    ConfigurationError,
    FactRejected,
    OperationIdConflict,
    ReviewItemNotFound,
    ReviewItemResolved,
    SessionBusy,
    SessionNotFound,
)
from tether.testing.scripted import ScriptedModel

# =========================================================================== session stores


class Ticks:
    """A clock and an id source that give the same values to both stores."""

    def __init__(self) -> None:
        self._ms = itertools.count(1_767_000_000_000, 7)
        self._ids = itertools.count(1)

    def clock(self) -> int:
        return next(self._ms)

    def ids(self) -> str:
        return f"018f0000-0000-7000-8000-{next(self._ids):012d}"


def _file_sessions(tmp_path: Path, ticks: Ticks) -> SessionOpener:
    return FileSessions(tmp_path, durability=Durability.PROCESS, clock=ticks.clock, ids=ticks.ids)


def _memory_sessions(tmp_path: Path, ticks: Ticks) -> SessionOpener:
    return MemorySessions(str(tmp_path), clock=ticks.clock, ids=ticks.ids)


STORES: dict[str, Callable[[Path, Ticks], SessionOpener]] = {
    "file": _file_sessions,
    "memory": _memory_sessions,
}


@pytest.fixture(params=sorted(STORES))
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> SessionOpener:
    return STORES[request.param](tmp_path, Ticks())


def _create(sessions: SessionOpener) -> SessionStoreProtocol:
    return sessions.create(provider="scripted", model="m", environment_identity="env")


def _prompt(store: SessionStoreProtocol, text: str = "hello") -> list[dict[str, Any]]:
    entry = f"018f0000-0000-7000-8000-1{len(store.state.transcript):011d}"
    return store.commit(
        [
            facts.user_entry(entry_id=entry, content=text),
            facts.run_started(operation_id=f"{entry[:-1]}9", input_entry_id=entry),
        ]
    )


def test_a_committed_transaction_is_in_the_state_and_survives_a_reopen(
    sessions: SessionOpener,
) -> None:
    with _create(sessions) as store:
        session = store.session_id
        committed = _prompt(store)
        assert [f["seq"] for f in committed] == [1, 2]
        assert committed[0]["timestamp"] == committed[1]["timestamp"]
        assert store.state.transcript[-1]["content"] == "hello"
        assert store.state.last_seq == 2
    with sessions.open(session) as again:
        assert again.state == store.state
        assert again.repaired == 0 and not again.read_only


def test_a_rejected_transaction_changes_nothing(sessions: SessionOpener) -> None:
    with _create(sessions) as store:
        _prompt(store)
        before = store.state
        with pytest.raises(FactRejected):  # a second run while one is active
            _prompt(store, "again")
        with pytest.raises(FactRejected, match="no facts"):
            store.commit([])
        assert store.state == before
        session = store.session_id
    with sessions.open(session) as again:
        assert again.state == before


def test_a_session_has_one_writer(sessions: SessionOpener) -> None:
    with _create(sessions) as store:
        with pytest.raises(SessionBusy):
            sessions.open(store.session_id)
    with sessions.open(store.session_id):
        pass
    with pytest.raises(SessionNotFound):
        sessions.open("018f0000-0000-7000-8000-999999999999")


def test_the_record_beside_the_log(sessions: SessionOpener) -> None:
    with _create(sessions) as store:
        record = store.sidecar(SIDECAR_NAME)
        assert not record.exists() and record.read() == (None, None)
        record.write(b'{"x":1}\n')
        assert record.exists() and record.read() == (b'{"x":1}\n', None)
        record.write(b"{}\n")
        assert store.sidecar(SIDECAR_NAME).read() == (b"{}\n", None)
        assert store.sidecar("other").read() == (None, None)


def test_both_stores_write_the_same_bytes(tmp_path: Path) -> None:
    """The same facts, clock and ids give the same log: one encoding for every store."""
    with _file_sessions(tmp_path, Ticks()).create(
        provider="scripted", model="m", environment_identity="env"
    ) as store:
        _prompt(store)
        path = store.path
    ticks = Ticks()
    memory = MemorySessions(str(tmp_path), clock=ticks.clock, ids=ticks.ids)
    with memory.create(provider="scripted", model="m", environment_identity="env") as store:
        _prompt(store)
        session = store.session_id
    assert memory.log_bytes(session) == path.read_bytes()


# =========================================================================== workspace databases


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_767_000_000.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float = 1.0) -> None:
        self.now += seconds


@pytest.fixture(params=["sqlite", "memory", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[WorkspaceDB]:
    clock = FakeClock()
    opened: WorkspaceDB
    if request.param == "sqlite":
        opened = EffectsDB.open_workspace(tmp_path, clock=clock)
    elif request.param == "postgres":  # a real server (tests/pgkit.py)
        from tether._wsdb.postgres import PostgresEffectsDB

        opened = PostgresEffectsDB.open_url(request.getfixturevalue("pg_url"), clock=clock)
    else:
        opened = MemoryWorkspace(clock=clock).open()
    yield opened
    opened.close()


def _outcome(version: str | None, exit_status: int | None, started: int) -> CheckOutcome:
    return CheckOutcome(
        command="pytest -q",
        exit_status=exit_status,
        timed_out=False,
        error=None,
        output_digest="sha256:" + "0" * 64,
        output_tail="ok",
        version_start=version,
        version_end=version,
        started_at_ms=started,
        duration_ms=5,
    )


def test_a_new_database_reports_itself(db: WorkspaceDB) -> None:
    assert not db.existed and db.fresh and not db.closed
    assert isinstance(db.identity, str) and len(db.identity) == 32
    assert db.now_ms() == 1_767_000_000_000
    assert not db.names_session("s")
    db.bind_session("s", None, 5)
    db.bind_session("s", "old-db", 9)  # idempotent; the earlier database is kept
    assert db.names_session("s")


def test_the_journal_rules(db: WorkspaceDB) -> None:
    journal = db.journal
    row, created = journal.insert(
        "s",
        "op",
        "a.txt",
        None,
        "sha256:a",
        "d",
        tool_name="write",
        planned_result="Wrote",
        status=JournalStatus.AUTHORIZED,
    )
    assert created and row.status is JournalStatus.AUTHORIZED and not row.result_is_error
    again, created = journal.insert(
        "s",
        "op",
        "a.txt",
        None,
        "sha256:a",
        "d",
        tool_name="write",
        planned_result="",
        status=JournalStatus.STARTED,
    )
    assert not created and again == row  # first record wins
    with pytest.raises(OperationIdConflict):
        journal.insert(
            "s",
            "op",
            "a.txt",
            None,
            "x",
            "other",
            tool_name="write",
            planned_result="",
            status=JournalStatus.STARTED,
        )
    with pytest.raises(ValueError, match="only a failed row"):
        journal.insert(
            "s",
            "op2",
            "a.txt",
            None,
            "x",
            "d",
            tool_name="write",
            planned_result="",
            status=JournalStatus.STARTED,
            result="boom",
        )
    started = journal.mark("op", JournalStatus.STARTED, "starting")
    done = journal.mark("op", JournalStatus.SUCCEEDED, "applied", result="Wrote 1 byte")
    assert started.status is JournalStatus.STARTED and done.result == "Wrote 1 byte"
    assert journal.mark("op", JournalStatus.SUCCEEDED, "again") == done  # terminal: once
    with pytest.raises(ValueError, match="cannot go from succeeded to started"):
        journal.mark("op", JournalStatus.STARTED)
    with pytest.raises(LookupError):
        journal.mark("nope", JournalStatus.STARTED)
    assert [s for s, _, _ in journal.history("op")] == [
        JournalStatus.AUTHORIZED,
        JournalStatus.STARTED,
        JournalStatus.SUCCEEDED,
    ]
    assert journal.get("op") == done and journal.get("nope") is None
    assert journal.rows("s") == [done] and journal.rows("other") == []
    kept = journal.keep_evidence("op", "conflict", path="a.txt", content=b"xyz", content_hash="h")
    evidence = journal.evidence(kept)
    assert evidence is not None and evidence.size == 3 and evidence.content == b"xyz"
    assert journal.evidence(kept + 100) is None


def test_the_review_rules(db: WorkspaceDB) -> None:
    reviews = db.reviews
    item = reviews.open_item("s", "op", "edit", "changed", {"path": "a.txt", "n": 1})
    assert item.is_open and item.evidence == {"path": "a.txt", "n": 1}
    assert reviews.open_item("s", "op", "edit", "again", {}) == item  # one open item per op
    assert reviews.get(item.id) == reviews.get(f"#{item.id}") == item
    with pytest.raises(ReviewItemNotFound):
        reviews.get(item.id + 1)
    resolved = reviews.resolve(item.id, ReviewDecision.APPLIED, "looked")
    assert not resolved.is_open and resolved.decision is ReviewDecision.APPLIED
    with pytest.raises(ReviewItemResolved):
        reviews.resolve(item.id, "abort")
    second = reviews.open_item("s", "op", "edit", "later", {})
    assert reviews.for_operation("op") == second  # the open item first
    reviews.resolve(second.id, "notApplied")
    assert reviews.for_operation("op") == reviews.get(second.id)  # else the latest
    assert reviews.for_operation("other") is None
    assert reviews.list_open() == [] and len(reviews.list_all("s")) == 2
    logged = reviews.log_reconciliation("s", "op", "applied", {"k": "v"}, tool_name="edit")
    assert logged.evidence == {"k": "v"}
    verdicts = [e.verdict for e in reviews.reconciliations(operation_id="op")]
    assert verdicts == [
        "reviewOpened",
        "review:applied",
        "reviewOpened",
        "review:notApplied",
        "applied",
    ]
    assert reviews.reconciliations(session_id="other") == []


def test_the_authorization_failure_and_verification_rules(db: WorkspaceDB) -> None:
    first = db.authorizations.record(
        session_id="s",
        call_key="e:0",
        tool_name="bash",
        arguments_digest="d",
        summary="x" * 600,
        decision="deny",
        who="user",
        rule="r",
        reason=None,
    )
    assert len(first.summary) == 500 and first.summary.endswith("…")
    again = db.authorizations.record(
        session_id="s",
        call_key="e:0",
        tool_name="bash",
        arguments_digest="d",
        summary="y",
        decision="allow",
        who="policy",
        rule="r",
        reason=None,
    )
    assert again == first and db.authorizations.get("s", "e:0") == first  # first wins
    assert db.authorizations.list("s") == [first] and db.authorizations.list("t") == []
    with pytest.raises(ValueError):
        db.authorizations.record(
            session_id="s",
            call_key="e:1",
            tool_name="bash",
            arguments_digest="d",
            summary="",
            decision="maybe",
            who="user",
            rule="r",
            reason=None,
        )

    db.failures.record(
        tool_started_id="t1",
        session_id="s",
        tool_name="bash",
        arguments_digest="d",
        artifact_version="v1",
        result_entry_id="r1",
    )
    db.failures.record(
        tool_started_id="t1",
        session_id="s",
        tool_name="bash",
        arguments_digest="other",
        artifact_version="v2",
        result_entry_id="r1",
    )
    failure = db.failures.get("t1")
    assert failure is not None and failure.arguments_digest == "d"  # the first record stays
    assert db.failures.by_result_entry("r1") == failure
    assert db.failures.by_result_entry("r2") is None

    verifications = db.verifications
    passed = verifications.record(
        session_id="s",
        tool_started_id="v",
        outcome=_outcome("sha256:v1", 0, 10),
        manifest=("sha256:v1", b"manifest"),
    )
    failed = verifications.record(
        session_id="s", tool_started_id=None, outcome=_outcome("sha256:v2", 1, 20)
    )
    assert passed.passed and not failed.passed
    assert verifications.latest() == failed and verifications.latest_passing() == passed
    assert verifications.latest_conclusive("sha256:v1") == passed
    assert verifications.latest_conclusive("sha256:v3") is None
    assert (
        verifications.by_tool_started_id("v") == passed and verifications.get(failed.id) == failed
    )
    assert verifications.list(1) == [failed] and verifications.list() == [failed, passed]
    verifications.save_manifest("sha256:v1", b"other")  # written once
    assert verifications.manifest("sha256:v1") == b"manifest"
    assert verifications.manifest("sha256:v2") is None


def test_binding_a_session_over_either_database(db: WorkspaceDB) -> None:
    sidecars = MemorySessions()
    with sidecars.create(provider="p", model="m", environment_identity="e") as store:
        record = store.sidecar(SIDECAR_NAME)
        assert check_session(db, record, store.session_id).state is BindingState.UNBOUND
        bound = ensure_binding(db, record, store.session_id)
        assert bound.state is BindingState.BOUND and db.names_session(store.session_id)
        assert check_session(db, record, store.session_id).state is BindingState.BOUND
        other = MemoryWorkspace().open()
        replaced = check_session(other, record, store.session_id)
        assert replaced.state is BindingState.MISSING and not replaced.known


# =========================================================================== the agent end to end


class SimulatedCrash(BaseException):
    """Raised where the process would die: nothing in the loop catches it."""


@dataclass
class Ledger:
    """An outside service that commits each operation id once."""

    committed: dict[str, str] = field(default_factory=dict)
    calls: int = 0
    crash_after_commit: bool = True

    def tool(self) -> Tool:
        ledger = self

        def lookup(operation_id: str) -> LookupResult:
            text = ledger.committed.get(operation_id)
            return LookupResult.not_found() if text is None else LookupResult.committed(text)

        @effect_tool(
            name="post",
            description="Post a note to the ledger.",
            parameters={
                "type": "object",
                "properties": {"note": {"type": "string"}},
                "required": ["note"],
                "additionalProperties": False,
            },
            lookup=lookup,
        )
        def post(arguments: Mapping[str, Any], operation_id: str) -> ToolResult:
            ledger.calls += 1
            text = f"posted {arguments['note']!r}"
            ledger.committed.setdefault(operation_id, text)
            if ledger.crash_after_commit:
                ledger.crash_after_commit = False
                raise SimulatedCrash("after the ledger committed")
            return ToolResult(text)

        return post


SCRIPT = {
    "model": "scripted/seams",
    "responses": [
        {
            "content": "Working.",
            "tool_calls": [
                {"id": "c_bash", "name": "bash", "arguments": {"command": "printf x >> count.txt"}},
                {
                    "id": "c_write",
                    "name": "write",
                    "arguments": {"path": "notes.txt", "content": "v1\n"},
                },
                {
                    "id": "c_edit",
                    "name": "edit",
                    "arguments": {"path": "notes.txt", "old_string": "v1", "new_string": "v2"},
                },
                {"id": "c_post", "name": "post", "arguments": {"note": "done"}},
            ],
        },
        {"content": "All done.", "finish_reason": "stop"},
    ],
}


def _drive_with_crashes(
    workspace: Path,
    make_agent: Callable[[Ledger], Agent],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[RunStatus], Ledger, str]:
    """Run; crash in process at journal.change_applied (the write); resume with a new agent,
    which crashes right after the ledger committed; resume with a third agent."""

    def crash(name: str) -> None:
        raise SimulatedCrash(name)

    monkeypatch.setattr(faults, "_crash", crash)
    faults.configure("journal.change_applied")
    ledger = Ledger()
    statuses: list[RunStatus] = []
    first = make_agent(ledger)
    try:
        with pytest.raises(SimulatedCrash, match=r"journal\.change_applied"):
            first.run("go")
        session = first.last_session
    finally:
        first.close()
        faults.configure(None)
    assert session is not None
    second = make_agent(ledger)
    try:
        with pytest.raises(SimulatedCrash, match="after the ledger committed"):
            second.resume(session)
    finally:
        second.close()
    third = make_agent(ledger)
    try:
        statuses.append(third.resume(session).status)
        statuses.append(third.resume(session).status)  # nothing left to do
    finally:
        third.close()
    return statuses, ledger, session


def _transcript(messages: Any) -> list[tuple[str, str | None]]:
    return [(m["role"], m.get("content")) for m in messages]


def test_the_agent_runs_over_the_memory_seams_as_over_the_file_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = ScriptedModel.from_json(SCRIPT, source="seams")
    outcomes = {}
    for name in ("file", "memory"):
        workspace = tmp_path / name
        workspace.mkdir()
        sessions = MemorySessions(str(workspace)) if name == "memory" else None
        database = MemoryWorkspace() if name == "memory" else None

        def make_agent(
            ledger: Ledger,
            workspace: Path = workspace,
            sessions: MemorySessions | None = sessions,
            database: MemoryWorkspace | None = database,
        ) -> Agent:
            return Agent(
                model,
                [*builtin_tools(), ledger.tool()],
                workspace=workspace,
                durability="process",
                environment="seams",
                read_agents_md=False,
                session_store=sessions,
                workspace_db=database,
            )

        statuses, ledger, session = _drive_with_crashes(workspace, make_agent, monkeypatch)
        if sessions is not None:
            reopened = sessions.open(session)
            assert not (workspace / ".tether" / "effects.db").exists()
            assert not (workspace / ".tether" / "sessions").exists()
        else:
            reopened = FileSessions(workspace).open(session)
        with reopened:
            state = reopened.state
        db = database.open() if database is not None else EffectsDB.open_workspace(workspace)
        try:
            journal = [(r.tool_name, r.status) for r in db.journal.rows(session)]
            reconciled = [(e.tool_name, e.verdict) for e in db.reviews.reconciliations()]
        finally:
            db.close()
        outcomes[name] = {
            "statuses": statuses,
            "transcript": _transcript(state.transcript),
            "journal": journal,
            "reconciled": reconciled,
            "ledger": (ledger.calls, sorted(ledger.committed.values())),
            "files": {p.name: p.read_text() for p in sorted(workspace.glob("*.txt"))},
        }
    expected = outcomes["file"]
    assert expected["statuses"] == [RunStatus.COMPLETED, RunStatus.IDLE]
    assert expected["files"] == {"count.txt": "x", "notes.txt": "v2\n"}  # bash ran once
    assert expected["ledger"] == (1, ["posted 'done'"])  # executed once, recovered from it
    assert expected["journal"] == [
        ("write", JournalStatus.SUCCEEDED),
        ("edit", JournalStatus.SUCCEEDED),
    ]
    assert expected["reconciled"] == [("write", "applied"), ("post", "committed")]
    results = [c for r, c in expected["transcript"] if r == "tool"]
    assert results[3] == "posted 'done'" and "reconciled after a crash" in results[1]
    assert expected["transcript"][-1] == ("assistant", "All done.")
    assert outcomes["memory"] == expected


def test_a_memory_session_is_resumed_with_its_evidence_bound(tmp_path: Path) -> None:
    """The binding's session side lives in the memory store: a new agent over the same
    stores finds the database it bound to (evidence known), one over another database
    sends the pending file change to review instead of redoing it."""
    sessions = MemorySessions(str(tmp_path))
    database = MemoryWorkspace()
    script = {
        "model": "scripted/bind",
        "responses": [
            {
                "tool_calls": [
                    {"id": "w", "name": "write", "arguments": {"path": "a.txt", "content": "1"}}
                ]
            },
            {"content": "ok", "finish_reason": "stop"},
        ],
    }
    model = ScriptedModel.from_json(script, source="bind")

    def agent(db: MemoryWorkspace) -> Agent:
        return Agent(
            model,
            workspace=tmp_path,
            read_agents_md=False,
            session_store=sessions,
            workspace_db=db,
        )

    first = agent(database)
    result = first.run("write it")
    first.close()
    assert result.status is RunStatus.COMPLETED and (tmp_path / "a.txt").read_text() == "1"
    assert str(result.session_path) == f"memory:/{result.session_id}.jsonl"
    record = json.loads(sessions.log_bytes(result.session_id).splitlines()[0])
    assert record["cwd"] == str(tmp_path)
    with sessions.open(result.session_id) as store:
        data, _ = store.sidecar(SIDECAR_NAME).read()
    assert data is not None and json.loads(data)["effectsDb"] == database.identity
    with database.open() as db, sessions.open(result.session_id) as store:
        check = check_session(db, store.sidecar(SIDECAR_NAME), store.session_id)
        assert check.state is BindingState.BOUND
    with MemoryWorkspace().open() as other, sessions.open(result.session_id) as store:
        lost = check_session(other, store.sidecar(SIDECAR_NAME), store.session_id)
        assert lost.state is BindingState.MISSING


# =========================================================================== recovery kinds


class AppendTool(FileChangeTool):
    """A tool kind the journal has never heard of: append a line to a file."""

    name = "append"
    description = "Append a line to a file."
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "line": {"type": "string"}},
        "required": ["path", "line"],
        "additionalProperties": False,
    }

    def plan_change(
        self,
        workspace: Path,
        arguments: Mapping[str, Any],
        *,
        protected: ProtectedState | None = None,
    ) -> PlannedChange:
        path = workspace / arguments["path"]
        old = path.read_text() if path.exists() else ""
        return PlannedChange(
            plan_write(
                workspace, arguments["path"], old + arguments["line"] + "\n", protected=protected
            )
        )

    def result_text(self, planned: PlannedChange, outcome: ApplyOutcome) -> str:
        return f"appended to {planned.change.path} ({outcome.value})"


def test_a_tool_declares_its_recovery_kind() -> None:
    assert ReadTool().recovery is RecoveryKind.NONE and BashTool().recovery is RecoveryKind.NONE
    assert WriteTool().recovery is EditTool().recovery is RecoveryKind.JOURNALED
    assert is_journaled(AppendTool()) and not is_journaled(
        FunctionTool(lambda a, c: "x", name="write", description="", parameters={"type": "object"})
    )

    def blind(arguments: Mapping[str, Any], operation_id: str) -> str:
        return "sent"

    looked = effect_tool(
        name="send",
        description="",
        parameters={"type": "object"},
        lookup=lambda op: LookupResult.not_found(),
    )(blind)
    plain = effect_tool(name="send", description="", parameters={"type": "object"})(blind)
    assert looked.recovery is RecoveryKind.LOOKUP and plain.recovery is RecoveryKind.NONE
    assert plain.failure_result("TimeoutError: slow") is None  # outcome unknown
    assert ReadTool().failure_result("OSError: x") == ToolResult.error(
        "Error: tool 'read' failed: OSError: x"
    )

    class Pretender(Tool):
        name = "pretend"
        description = ""
        parameters: Mapping[str, Any] = {"type": "object"}
        recovery = RecoveryKind.JOURNALED

        def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
            return ToolResult("")

    with pytest.raises(ConfigurationError, match="needs a plan_change"):
        Pretender()


def test_a_new_journaled_tool_is_recovered_without_touching_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FileChangeTool the journal does not know runs through it and is reconciled after
    a crash at journal.change_applied: applied once, its own reconciled text."""

    def crash(name: str) -> None:
        raise SimulatedCrash(name)

    script = {
        "model": "scripted/append",
        "responses": [
            {
                "tool_calls": [
                    {"id": "a", "name": "append", "arguments": {"path": "log.txt", "line": "one"}}
                ]
            },
            {"content": "ok", "finish_reason": "stop"},
        ],
    }
    model = ScriptedModel.from_json(script, source="append")
    sessions, database = MemorySessions(str(tmp_path)), MemoryWorkspace()

    def agent() -> Agent:
        return Agent(
            model,
            [AppendTool()],
            workspace=tmp_path,
            read_agents_md=False,
            session_store=sessions,
            workspace_db=database,
        )

    monkeypatch.setattr(faults, "_crash", crash)
    faults.configure("journal.change_applied")
    first = agent()
    try:
        with pytest.raises(SimulatedCrash):
            first.run("append")
    finally:
        first.close()
        faults.configure(None)
    session = first.last_session
    assert session is not None and (tmp_path / "log.txt").read_text() == "one\n"
    second = agent()
    result = second.resume(session)
    second.close()
    assert result.status is RunStatus.COMPLETED
    assert (tmp_path / "log.txt").read_text() == "one\n"  # applied exactly once
    with sessions.open(session) as store:
        answers = [m["content"] for m in store.state.transcript if m["role"] == "tool"]
    assert answers == [
        "appended to log.txt (applied) (reconciled after a crash: the change was already applied)"
    ]
