"""The effects layer: effects.db, the action journal, the effect contract, the report ledger,
review items and the recovery decision (in-process; real-process crashes are in
``test_effects_crash.py``)."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import pytest

from tether import _faults as faults
from tether._effects import journal as journal_module
from tether._effects.contract import (
    EffectTool,
    LookupResult,
    LookupStatus,
    effect_tool,
    has_lookup,
    safe_lookup,
)
from tether._effects.journal import (
    ActionJournal,
    FileVerdict,
    JournalRow,
    JournalStatus,
    Verdict,
    arguments_digest,
    is_journaled,
    journaled_edit,
    journaled_run,
    journaled_write,
    observe_file,
    reconcile_file,
    reconciled_text,
    stale_text,
)
from tether._effects.recovery import (
    PendingObservation,
    RecoveryAction,
    decide_pending,
    decision_for_review,
    observe_pending,
    reconcile_pending,
    record_decision,
    review_result_text,
)
from tether._effects.review import ReviewDecision, ReviewStatus, ReviewStore
from tether._runtime.guards import arguments_digest as guards_arguments_digest
from tether._tools import EditTool, ToolContext, ToolRegistry, ToolResult, WriteTool
from tether._tools.base import FunctionTool, ValidatedCall
from tether._tools.builtin import content_hash
from tether._wsdb.sqlite import (
    EFFECTS_SCHEMA_VERSION,
    EffectsDB,
    effects_db_path,
    format_ms,
)
from tether.core.state import Replay
from tether.errors import (
    ConfigurationError,
    EffectsDatabaseError,
    OperationIdConflict,
    ReviewItemNotFound,
    ReviewItemResolved,
    TetherError,
)
from tether.testing.ledger import (
    PublishReportTool,
    ReportLedger,
    default_ledger_path,
    publication_text,
)

H_A = content_hash(b"a")
H_B = content_hash(b"b")
H_C = content_hash(b"c")


class FakeClock:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float = 1.0) -> None:
        self.now += seconds


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db(ws: Path, clock: FakeClock) -> Iterator[EffectsDB]:
    with EffectsDB.open_workspace(ws, clock=clock) as opened:
        yield opened


@pytest.fixture
def journal(db: EffectsDB) -> ActionJournal:
    return ActionJournal(db)


@pytest.fixture
def reviews(db: EffectsDB) -> ReviewStore:
    return ReviewStore(db)


# =========================================================================== effects.db


def test_open_creates_private_files_in_wal_mode(ws: Path) -> None:
    with EffectsDB.open_workspace(ws) as db:
        assert db.path == ws / ".tether" / "effects.db" == effects_db_path(ws)
        assert db.query_one("PRAGMA journal_mode")[0] == "wal"  # type: ignore[index]
        assert db.query_one("PRAGMA synchronous")[0] == 2  # type: ignore[index]  # FULL
        assert db.query_one("PRAGMA busy_timeout")[0] == 5000  # type: ignore[index]
        assert db.user_version == EFFECTS_SCHEMA_VERSION
        ActionJournal(db).record_intent("s", "op", "a", None, H_A, "d")
        assert stat.S_IMODE(os.stat(ws / ".tether").st_mode) == 0o700
        for name in ("effects.db", "effects.db-wal", "effects.db-shm"):
            assert stat.S_IMODE(os.stat(ws / ".tether" / name).st_mode) == 0o600, name


def test_reopen_and_migrations_are_idempotent(ws: Path) -> None:
    with EffectsDB.open_workspace(ws) as db:
        ActionJournal(db).record_intent("s", "op", "a", None, H_A, "d")
    # Pretend the version was never written: every statement runs again, harmlessly.
    con = sqlite3.connect(effects_db_path(ws))
    con.execute("PRAGMA user_version = 0")
    con.commit()
    con.close()
    with EffectsDB.open_workspace(ws) as db:
        assert db.user_version == EFFECTS_SCHEMA_VERSION
        row = ActionJournal(db).get("op")
        assert row is not None and row.after_hash == H_A


def test_concurrent_openers_migrate_once(ws: Path) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def opener() -> None:
        try:
            barrier.wait()
            EffectsDB.open_workspace(ws).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with EffectsDB.open_workspace(ws) as db:
        assert db.user_version == EFFECTS_SCHEMA_VERSION


def test_newer_schema_is_refused(ws: Path) -> None:
    EffectsDB.open_workspace(ws).close()
    con = sqlite3.connect(effects_db_path(ws))
    con.execute(f"PRAGMA user_version = {EFFECTS_SCHEMA_VERSION + 1}")
    con.commit()
    con.close()
    with pytest.raises(EffectsDatabaseError, match="newer than this tether supports"):
        EffectsDB.open_workspace(ws)


def test_garbage_file_is_a_clear_error(ws: Path) -> None:
    path = effects_db_path(ws)
    path.parent.mkdir(mode=0o700)
    path.write_bytes(os.urandom(8192))
    with pytest.raises(EffectsDatabaseError) as info:
        EffectsDB.open_workspace(ws)
    message = str(info.value)
    assert str(path) in message and "corrupt" in message
    assert isinstance(info.value, TetherError) and info.value.exit_code == 20
    assert info.value.path == str(path)


def test_damaged_pages_are_a_clear_error(ws: Path) -> None:
    with EffectsDB.open_workspace(ws) as db, db.transaction() as conn:
        conn.executemany(
            "INSERT INTO evidence (operation_id, kind, content, created_at_ms) VALUES (?,?,?,0)",
            [(f"op-{i}", "test", os.urandom(300)) for i in range(300)],
        )
    path = effects_db_path(ws)
    data = bytearray(path.read_bytes())
    assert len(data) > 5 * 4096
    data[2 * 4096 : 4 * 4096] = os.urandom(2 * 4096)  # smash pages 3-4, keep the header
    path.write_bytes(bytes(data))
    with pytest.raises(EffectsDatabaseError, match="corrupt") as info:
        EffectsDB.open_workspace(ws)
    assert str(path) in str(info.value)


def test_locked_database_is_a_clear_error(ws: Path) -> None:
    EffectsDB.open_workspace(ws).close()
    holder = sqlite3.connect(effects_db_path(ws), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with EffectsDB.open_workspace(ws, busy_timeout=0.2) as db:
            started = time.monotonic()
            with pytest.raises(EffectsDatabaseError, match="locked") as info:
                ActionJournal(db).record_intent("s", "op", "a", None, H_A, "d")
            assert time.monotonic() - started < 3
            assert str(effects_db_path(ws)) in str(info.value)
            assert ActionJournal(db).get("op") is None  # reads still work in WAL mode
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_exclusively_locked_database_cannot_even_be_opened(ws: Path) -> None:
    EffectsDB.open_workspace(ws).close()
    holder = sqlite3.connect(effects_db_path(ws), isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("CREATE TABLE IF NOT EXISTS x (y)")
    holder.execute("COMMIT")  # keeps the exclusive lock (locking_mode)
    try:
        with pytest.raises(EffectsDatabaseError, match="locked"):
            EffectsDB.open_workspace(ws, busy_timeout=0.2)
    finally:
        holder.close()


def test_symlink_in_place_of_the_database_is_refused(ws: Path, tmp_path: Path) -> None:
    (ws / ".tether").mkdir()
    target = tmp_path / "elsewhere.db"
    target.write_bytes(b"")
    (ws / ".tether" / "effects.db").symlink_to(target)
    with pytest.raises(EffectsDatabaseError, match="symbolic link"):
        EffectsDB.open_workspace(ws)


def test_closed_database_is_a_clear_error(ws: Path) -> None:
    db = EffectsDB.open_workspace(ws)
    db.close()
    db.close()
    with pytest.raises(EffectsDatabaseError, match="closed"):
        ActionJournal(db).get("op")


def test_format_ms() -> None:
    assert format_ms(None) is None
    assert format_ms(1_700_000_000_123) == "2023-11-14T22:13:20.123Z"


# =========================================================================== journal


def test_record_intent_is_idempotent_for_identical_arguments(
    journal: ActionJournal, clock: FakeClock
) -> None:
    first = journal.record_intent("s1", "op1", "a.txt", None, H_A, "sha256:args")
    clock.tick()
    again = journal.record_intent("s1", "op1", "a.txt", H_B, H_C, "sha256:args")
    assert again == first  # unchanged: the first intent stands
    assert first.status is JournalStatus.STARTED
    assert journal.history("op1") == [
        (JournalStatus.STARTED, "intent recorded", first.created_at_ms)
    ]


def test_record_intent_refuses_a_reused_operation_id(journal: ActionJournal) -> None:
    journal.record_intent("s1", "op1", "a.txt", None, H_A, "sha256:one")
    with pytest.raises(OperationIdConflict, match="op1") as info:
        journal.record_intent("s1", "op1", "a.txt", None, H_A, "sha256:two")
    assert info.value.exit_code == 21
    with pytest.raises(OperationIdConflict, match="session"):
        journal.record_intent("s2", "op1", "a.txt", None, H_A, "sha256:one")
    row = journal.get("op1")
    assert row is not None and row.arguments_digest == "sha256:one" and row.session_id == "s1"


def test_mark_transitions_and_history(journal: ActionJournal, clock: FakeClock) -> None:
    journal.record_intent("s", "op", "a", None, H_A, "d", status=JournalStatus.PROPOSED)
    clock.tick()
    journal.mark("op", JournalStatus.AUTHORIZED)
    journal.mark("op", JournalStatus.STARTED)
    row = journal.mark("op", JournalStatus.SUCCEEDED, "applied", result="done")
    assert row.status is JournalStatus.SUCCEEDED and row.result == "done"
    assert journal.get("op") == row
    assert journal.mark("op", JournalStatus.SUCCEEDED) == row  # terminal: idempotent
    with pytest.raises(ValueError, match="cannot go from succeeded to failed"):
        journal.mark("op", JournalStatus.FAILED)
    with pytest.raises(LookupError):
        journal.mark("nope", JournalStatus.FAILED)
    assert [s for s, _, _ in journal.history("op")] == [
        JournalStatus.PROPOSED,
        JournalStatus.AUTHORIZED,
        JournalStatus.STARTED,
        JournalStatus.SUCCEEDED,
    ]
    assert [r.operation_id for r in journal.rows()] == ["op"]
    assert journal.rows("other") == []
    assert {s.value for s in JournalStatus} == {
        "proposed",
        "authorized",
        "started",
        "succeeded",
        "failed",
        "unknown",
    }


def test_arguments_digest_is_canonical() -> None:
    # The journal records the one arguments digest of tether (tether.core.canonical), with
    # the tool's name in its own column (see the tests of records_call below).
    one = arguments_digest({"path": "a", "content": "x"})
    assert one == arguments_digest({"content": "x", "path": "a"})
    assert one != arguments_digest({"path": "a", "content": "y"})
    assert one == guards_arguments_digest({"path": "a", "content": "x"})


def _legacy_digest(tool_name: str, arguments: Mapping[str, Any]) -> str:
    """The digest journal rows held before tether had one arguments digest (spelled out
    here, independently of the code under test)."""
    text = json.dumps(
        {"arguments": dict(arguments), "tool": tool_name},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_a_row_of_an_older_database_is_still_recognised(ws: Path, journal: ActionJournal) -> None:
    arguments = _started_edit(ws, journal, digest=_legacy_digest("edit", _EDIT))
    row = journal.get("op")
    assert row is not None and row.arguments_digest != arguments_digest(arguments)
    assert row.records_call("edit", arguments)
    assert not row.records_call("write", arguments)  # the legacy digest covers the tool too
    assert not row.records_call("edit", {**arguments, "new_string": "other"})
    result = journaled_edit(ws, journal, "s", "op", arguments)  # resumed, not a conflict
    assert result.content == "Edited a.txt: replaced 1 occurrence"
    assert (ws / "a.txt").read_text() == "counter=1+1\n"
    with pytest.raises(OperationIdConflict):
        journaled_write(ws, journal, "s", "op", arguments)


def test_an_operation_id_recorded_for_another_tool_conflicts(
    ws: Path, journal: ActionJournal
) -> None:
    arguments = {"path": "a.txt", "content": "x"}
    journaled_write(ws, journal, "s", "op", arguments)
    row = journal.get("op")
    assert row is not None and row.arguments_digest == arguments_digest(arguments)
    with pytest.raises(OperationIdConflict, match="tool write"):
        journal_module.journaled_resume("edit", ws, journal, "s", "op", arguments)
    nameless = replace(row, tool_name="")  # a row recorded without a tool's name
    assert nameless.records_call("edit", arguments) and row.records_call("write", arguments)


def _builtin_result(tool: WriteTool | EditTool, ws: Path, arguments: Mapping[str, Any]) -> str:
    return tool.run(arguments, ToolContext(ws, "builtin")).content


def test_journaled_write_and_edit_match_the_builtin_texts(
    ws: Path, tmp_path: Path, journal: ActionJournal
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    calls: list[tuple[str, dict[str, Any]]] = [
        ("write", {"path": "d/a.txt", "content": "one two two\n"}),
        ("write", {"path": "d/a.txt", "content": "one two two\n"}),
        ("edit", {"path": "d/a.txt", "old_string": "one", "new_string": "1"}),
        ("edit", {"path": "d/a.txt", "old_string": "two", "new_string": "2", "replace_all": True}),
        ("write", {"path": "d/a.txt", "content": "fresh\n"}),
    ]
    for index, (name, arguments) in enumerate(calls):
        result = journaled_run(name, ws, journal, "s", f"op{index}", arguments)
        tool = WriteTool() if name == "write" else EditTool()
        assert result.content == _builtin_result(tool, other.resolve(), arguments)
        assert not result.is_error
        row = journal.get(f"op{index}")
        assert row is not None and row.status is JournalStatus.SUCCEEDED
        assert row.result == result.content and row.tool_name == name
        assert result.metadata["journaled"] is True
    assert (ws / "d/a.txt").read_text() == "fresh\n"
    assert journal.get("op0").before_hash is None  # type: ignore[union-attr]


@pytest.mark.parametrize("path", ["\udc80x.txt", "d/\ud800.txt", "a\udcff"])
def test_a_path_that_is_not_utf8_is_refused_alike_before_anything_is_written(
    path: str, ws: Path, tmp_path: Path, journal: ActionJournal
) -> None:
    """Issue 32, 12: the journaled write once raised UnicodeEncodeError at the SQLite insert
    while the plain tool wrote the file. One rule for both: refused with one line."""
    other = tmp_path / "other"
    other.mkdir()
    calls: list[tuple[str, dict[str, Any]]] = [
        ("write", {"path": path, "content": "x\n"}),
        ("edit", {"path": path, "old_string": "x", "new_string": "y"}),
    ]
    for index, (name, arguments) in enumerate(calls):
        tool = WriteTool() if name == "write" else EditTool()
        plain = _builtin_result(tool, other.resolve(), arguments)
        journaled = journaled_run(name, ws, journal, "s", f"run{index}", arguments)
        assert journaled.is_error and journaled.content == plain
        assert "not valid UTF-8" in plain and "\n" not in plain
        plain.encode("utf-8")  # the message itself is printable text
        assert journal.get(f"run{index}") is None  # a planning error records nothing
        prepared = journal_module.prepare_journaled(
            name, ws, journal, "s", f"prep{index}", arguments
        )
        assert prepared.error is not None and prepared.error.content == plain
        row = journal.get(f"prep{index}")
        assert row is not None and row.status is JournalStatus.FAILED
    assert sorted(os.listdir(ws)) == [".tether"] and os.listdir(other) == []


def test_journaled_wrappers(ws: Path, journal: ActionJournal) -> None:
    assert not journaled_write(ws, journal, "s", "w", {"path": "f", "content": "x"}).is_error
    result = journaled_edit(
        ws, journal, "s", "e", {"path": "f", "old_string": "x", "new_string": "y"}
    )
    assert result.content == "Edited f: replaced 1 occurrence"
    assert (ws / "f").read_text() == "y"
    with pytest.raises(ValueError):
        journaled_run("bash", ws, journal, "s", "b", {"command": "true"})


def test_planning_errors_are_results_and_record_nothing(ws: Path, journal: ActionJournal) -> None:
    result = journaled_edit(
        ws, journal, "s", "op", {"path": "missing.txt", "old_string": "a", "new_string": "b"}
    )
    assert result.is_error and result.content.startswith("Error: ")
    escape = journaled_write(ws, journal, "s", "op2", {"path": "../x", "content": "x"})
    assert escape.is_error and "escapes the workspace" in escape.content
    assert journal.rows() == []


def test_reused_operation_id_with_other_arguments_writes_nothing(
    ws: Path, journal: ActionJournal
) -> None:
    journaled_write(ws, journal, "s", "op", {"path": "a.txt", "content": "first"})
    with pytest.raises(OperationIdConflict):
        journaled_write(ws, journal, "s", "op", {"path": "a.txt", "content": "second"})
    with pytest.raises(OperationIdConflict):
        journaled_write(ws, journal, "s", "op", {"path": "b.txt", "content": "first"})
    assert (ws / "a.txt").read_text() == "first"
    assert not (ws / "b.txt").exists()


def test_compare_and_swap_stale_content_writes_nothing(
    ws: Path, journal: ActionJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ws / "a.txt").write_text("original\n")
    real_apply = journal_module.apply_change

    def interfering_apply(workspace: Path, change: Any, **options: Any) -> Any:
        (ws / "a.txt").write_text("someone else\n")  # between plan and apply
        return real_apply(workspace, change, **options)

    monkeypatch.setattr(journal_module, "apply_change", interfering_apply)
    result = journaled_edit(
        ws, journal, "s", "op", {"path": "a.txt", "old_string": "original", "new_string": "mine"}
    )
    assert result.is_error
    assert result.content == "Error: a.txt changed since it was read; read it again."
    assert result.content == stale_text("a.txt")
    assert (ws / "a.txt").read_text() == "someone else\n"
    assert sorted(p.name for p in ws.iterdir()) == [".tether", "a.txt"]  # no temp file left
    row = journal.get("op")
    assert row is not None and row.status is JournalStatus.FAILED
    assert row.result == result.content and row.result_is_error
    assert result.metadata["found_hash"] == content_hash(b"someone else\n")
    # Running the same call again gives the same recorded error and writes nothing.
    monkeypatch.setattr(journal_module, "apply_change", real_apply)
    again = journaled_edit(
        ws, journal, "s", "op", {"path": "a.txt", "old_string": "original", "new_string": "mine"}
    )
    assert again.is_error and again.content == result.content
    assert (ws / "a.txt").read_text() == "someone else\n"


def test_io_error_before_the_rename_marks_failed(
    ws: Path, journal: ActionJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_apply(workspace: Path, change: Any, **options: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(journal_module, "apply_change", failing_apply)
    result = journaled_write(ws, journal, "s", "op", {"path": "a.txt", "content": "x"})
    assert result.is_error and "no space left" in result.content.lower()
    row = journal.get("op")
    assert row is not None and row.status is JournalStatus.FAILED


def test_io_error_after_the_rename_marks_unknown(
    ws: Path, journal: ActionJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_apply = journal_module.apply_change

    def apply_then_fail(workspace: Path, change: Any, **options: Any) -> Any:
        real_apply(workspace, change, **options)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(journal_module, "apply_change", apply_then_fail)
    result = journaled_write(ws, journal, "s", "op", {"path": "a.txt", "content": "x"})
    assert result.is_error and "in place but could not be made durable" in result.content
    row = journal.get("op")
    assert row is not None and row.status is JournalStatus.UNKNOWN


def _row(
    status: JournalStatus = JournalStatus.STARTED,
    before: str | None = H_A,
    after: str = H_B,
    result: str | None = None,
) -> JournalRow:
    return JournalRow(
        "op",
        "s",
        "edit",
        "a.txt",
        before,
        after,
        "d",
        status,
        None,
        "Edited a.txt: replaced 1 occurrence",
        result,
        result is not None,
        0,
        0,
    )


@pytest.mark.parametrize(
    ("row", "current", "verdict"),
    [
        (None, H_A, Verdict.NO_RECORD),
        (None, None, Verdict.NO_RECORD),
        (_row(), H_B, Verdict.APPLIED),
        (_row(), H_A, Verdict.NOT_APPLIED),
        (_row(), H_C, Verdict.CONFLICT),
        (_row(), None, Verdict.CONFLICT),
        (_row(before=None), None, Verdict.NOT_APPLIED),
        (_row(before=None), H_B, Verdict.APPLIED),
        (_row(before=None), H_C, Verdict.CONFLICT),
        (_row(before=H_B, after=H_B), H_B, Verdict.APPLIED),
        (_row(JournalStatus.UNKNOWN), H_B, Verdict.APPLIED),
        (_row(JournalStatus.UNKNOWN), H_A, Verdict.NOT_APPLIED),
        (_row(JournalStatus.UNKNOWN), H_C, Verdict.CONFLICT),
        (_row(JournalStatus.SUCCEEDED), H_C, Verdict.APPLIED),
        (_row(JournalStatus.SUCCEEDED), H_A, Verdict.APPLIED),
        (_row(JournalStatus.FAILED, result="Error: x"), H_C, Verdict.FAILED),
        (_row(JournalStatus.FAILED, result="Error: x"), H_B, Verdict.FAILED),
        (_row(JournalStatus.PROPOSED), H_C, Verdict.NOT_APPLIED),
        (_row(JournalStatus.AUTHORIZED), H_B, Verdict.NOT_APPLIED),
    ],
)
def test_reconcile_file_verdicts(
    row: JournalRow | None, current: str | None, verdict: Verdict
) -> None:
    found = reconcile_file(row, current)
    assert found.verdict is verdict
    assert found.row is row and found.current_hash == current
    evidence = found.evidence()
    assert evidence["verdict"] == verdict.value and evidence["currentHash"] == current
    if row is not None:
        assert evidence["beforeHash"] == row.before_hash and evidence["afterHash"] == row.after_hash


def test_reconcile_file_unreadable_is_a_conflict() -> None:
    found = reconcile_file(_row(), None, unreadable="permission denied")
    assert found.verdict is Verdict.CONFLICT and "permission denied" in found.reason


_EDIT: Final = {"path": "a.txt", "old_string": "counter=1", "new_string": "counter=1+1"}


def _started_edit(
    ws: Path, journal: ActionJournal, op: str = "op", *, digest: str | None = None
) -> dict[str, Any]:
    """Record an edit's intent the way journaled_run does, then 'crash' (do not apply)."""
    (ws / "a.txt").write_text("counter=1\n")
    arguments = dict(_EDIT)
    journal.record_intent(
        "s",
        op,
        "a.txt",
        content_hash(b"counter=1\n"),
        content_hash(b"counter=1+1\n"),
        digest if digest is not None else arguments_digest(arguments),
        tool_name="edit",
        planned_result="Edited a.txt: replaced 1 occurrence",
    )
    return arguments


def test_rerun_of_a_started_change_applies_it_once(ws: Path, journal: ActionJournal) -> None:
    arguments = _started_edit(ws, journal)
    first = journaled_edit(ws, journal, "s", "op", arguments)
    assert first.content == "Edited a.txt: replaced 1 occurrence"
    assert (ws / "a.txt").read_text() == "counter=1+1\n"
    again = journaled_edit(ws, journal, "s", "op", arguments)
    assert "reconciled after a crash" in again.content and not again.is_error
    assert (ws / "a.txt").read_text() == "counter=1+1\n"  # never counter=1+1+1
    statuses = [s for s, _, _ in journal.history("op")]
    assert statuses == [JournalStatus.STARTED, JournalStatus.STARTED, JournalStatus.SUCCEEDED]


def test_rerun_of_an_applied_but_unmarked_change_does_not_write(
    ws: Path, journal: ActionJournal
) -> None:
    arguments = _started_edit(ws, journal)
    (ws / "a.txt").write_text("counter=1+1\n")  # applied, crash before the journal update
    result = journaled_edit(ws, journal, "s", "op", arguments)
    assert result.content == (
        "Edited a.txt: replaced 1 occurrence (reconciled after a crash: the change was "
        "already applied)"
    )
    assert (ws / "a.txt").read_text() == "counter=1+1\n"
    row = journal.get("op")
    assert row is not None and row.status is JournalStatus.SUCCEEDED


def test_rerun_with_foreign_content_writes_nothing(ws: Path, journal: ActionJournal) -> None:
    arguments = _started_edit(ws, journal)
    (ws / "a.txt").write_text("counter=1 and a human edit\n")
    result = journaled_edit(ws, journal, "s", "op", arguments)
    assert result.is_error and result.content == stale_text("a.txt")
    assert (ws / "a.txt").read_text() == "counter=1 and a human edit\n"
    row = journal.get("op")
    assert row is not None and row.status is JournalStatus.UNKNOWN


def test_observe_file_keeps_a_copy_of_conflicting_content(ws: Path, journal: ActionJournal) -> None:
    _started_edit(ws, journal)
    (ws / "a.txt").write_bytes(b"\x00binary and foreign\xff")
    verdict = observe_file(ws, journal, "op")
    assert verdict.verdict is Verdict.CONFLICT
    assert verdict.evidence_id is not None
    kept = journal.evidence(verdict.evidence_id)
    assert kept is not None
    assert kept.content == b"\x00binary and foreign\xff"
    assert kept.content_hash == content_hash(kept.content) == verdict.current_hash
    assert kept.path == "a.txt" and kept.kind == "conflict" and not kept.truncated
    assert verdict.evidence()["evidenceId"] == kept.id
    assert kept.to_json()["size"] == len(kept.content)
    assert journal.evidence(9999) is None


def test_observe_file_without_conflict_keeps_no_copy(ws: Path, journal: ActionJournal) -> None:
    _started_edit(ws, journal)
    assert observe_file(ws, journal, "op").verdict is Verdict.NOT_APPLIED
    (ws / "a.txt").write_text("counter=1+1\n")
    assert observe_file(ws, journal, "op").verdict is Verdict.APPLIED
    (ws / "a.txt").unlink()
    deleted = observe_file(ws, journal, "op")
    assert deleted.verdict is Verdict.CONFLICT and deleted.current_hash is None
    assert observe_file(ws, journal, "unknown-op").verdict is Verdict.NO_RECORD
    assert journal.db.query_one("SELECT COUNT(*) FROM evidence")[0] == 1  # type: ignore[index]


def test_is_journaled() -> None:
    assert is_journaled(WriteTool()) and is_journaled(EditTool())
    user_write = FunctionTool(
        lambda a, c: "x",
        name="write",
        description="",
        parameters={"type": "object"},
    )
    assert not is_journaled(user_write)


def test_journal_boundaries_are_registered() -> None:
    for name in (
        "journal.intent_recorded",
        "journal.change_applied",
        "ledger.committed",
        "tools.apply.before_replace",
        "tools.apply.after_replace",
    ):
        assert name in faults.BOUNDARIES


# =========================================================================== effect contract


class Recorder(EffectTool):
    name = "recorder"
    description = "Records calls."
    parameters: Mapping[str, Any] = {"type": "object", "properties": {"x": {"type": "integer"}}}

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, Any], str]] = []
        super().__init__()

    def execute(self, arguments: Mapping[str, Any], operation_id: str) -> ToolResult:
        self.calls.append((dict(arguments), operation_id))
        return ToolResult(f"done {operation_id}")


class Looking(Recorder):
    name = "looking"

    def __init__(self, answer: Any = None, delay: float = 0.0, exc: Exception | None = None):
        self.answer = answer
        self.delay = delay
        self.exc = exc
        super().__init__()

    def lookup(self, operation_id: str) -> LookupResult:
        if self.delay:
            time.sleep(self.delay)
        if self.exc is not None:
            raise self.exc
        return self.answer  # type: ignore[no-any-return]


def test_effect_tool_runs_execute_with_the_operation_id(ws: Path) -> None:
    tool = Recorder()
    assert tool.replay is Replay.NEVER and tool.declaration().replay is Replay.NEVER
    assert tool.replay_key == "user:recorder:v1"
    result = tool.run({"x": 1}, ToolContext(ws, "op-123"))
    assert result.content == "done op-123"
    assert tool.calls == [({"x": 1}, "op-123")]
    assert not tool.has_lookup and not has_lookup(tool)
    with pytest.raises(TypeError):
        safe_lookup(tool, "op", 1.0)
    registry = ToolRegistry([tool])
    assert isinstance(registry.validate("recorder", '{"x": 2}'), ValidatedCall)


def test_effect_tools_cannot_be_replay_safe() -> None:
    class Safe(Recorder):
        name = "safe"
        replay = Replay.SAFE

    with pytest.raises(ConfigurationError, match="never replay-safe"):
        Safe()


def test_effect_tool_decorator(ws: Path) -> None:
    seen: list[str] = []

    @effect_tool(
        name="ping",
        description="Ping.",
        parameters={"type": "object"},
        lookup=lambda op: (
            LookupResult.committed(f"pong {op}") if op in seen else LookupResult.not_found()
        ),
    )
    def ping(arguments: Mapping[str, Any], operation_id: str) -> str:
        seen.append(operation_id)
        return f"pong {operation_id}"

    assert ping.has_lookup and has_lookup(ping)
    assert safe_lookup(ping, "a", 1.0).status is LookupStatus.NOT_FOUND
    assert ping.run({}, ToolContext(ws, "a")).content == "pong a"
    found = safe_lookup(ping, "a", 1.0)
    assert found.status is LookupStatus.COMMITTED and found.result is not None
    assert found.result.content == "pong a"

    @effect_tool(name="blind", description="", parameters={"type": "object"})
    def blind(arguments: Mapping[str, Any], operation_id: str) -> ToolResult:
        return ToolResult("ok")

    assert not blind.has_lookup and not has_lookup(blind)
    with pytest.raises(NotImplementedError):
        blind.lookup("x")


def test_safe_lookup_times_out() -> None:
    tool = Looking(LookupResult.not_found(), delay=5.0)
    started = time.monotonic()
    answer = safe_lookup(tool, "op", 0.2)
    assert time.monotonic() - started < 2.0
    assert answer.status is LookupStatus.UNKNOWABLE
    assert "did not answer within 0.2 s" in answer.reason


def test_safe_lookup_turns_exceptions_into_unknowable() -> None:
    answer = safe_lookup(Looking(exc=ConnectionError("service down\nreally")), "op", 1.0)
    assert answer.status is LookupStatus.UNKNOWABLE
    assert answer.reason == "the lookup of looking failed: ConnectionError: service down really"
    wrong = safe_lookup(Looking("committed"), "op", 1.0)
    assert wrong.status is LookupStatus.UNKNOWABLE and "not a LookupResult" in wrong.reason
    passed = safe_lookup(Looking(LookupResult.unknowable("no idea")), "op", 1.0)
    assert passed == LookupResult.unknowable("no idea")
    with pytest.raises(ValueError):
        safe_lookup(Looking(LookupResult.not_found()), "op", 0)


def test_lookup_result_shapes() -> None:
    committed = LookupResult.committed(ToolResult("x"))
    assert committed.to_json() == {
        "status": "committed",
        "result": {"content": "x", "isError": False},
    }
    assert LookupResult.not_found().to_json() == {"status": "notFound"}
    assert LookupResult.unknowable("").reason
    with pytest.raises(ValueError):
        LookupResult(LookupStatus.COMMITTED)
    with pytest.raises(ValueError):
        LookupResult(LookupStatus.NOT_FOUND, ToolResult("x"))


# =========================================================================== report ledger


def test_publish_is_idempotent_per_operation_id(ws: Path) -> None:
    ledger = ReportLedger.for_workspace(ws)
    assert ledger.path == default_ledger_path(ws) == ws / ".tether" / "ledger.db"
    first = ledger.publish("op1", "Title", "Body")
    again = ledger.publish("op1", "Title", "Body")
    assert first.created and not again.created
    assert first.receipt == again.receipt and first.published_at_ms == again.published_at_ms
    assert ledger.effect_count("op1") == 1 and ledger.count_all() == 1
    with pytest.raises(OperationIdConflict):
        ledger.publish("op1", "Other", "Body")
    assert ledger.find("op1") == again
    assert ledger.find("op2") is None and ledger.effect_count("op2") == 0
    assert ledger.duplicate_effects() == 0
    assert [p.operation_id for p in ledger.publications()] == ["op1"]
    assert stat.S_IMODE(os.stat(ledger.path).st_mode) == 0o600
    ledger.close()


def test_publish_report_tool_and_lookup_agree(ws: Path) -> None:
    tool = PublishReportTool.for_workspace(ws)
    assert tool.name == "publish_report" and tool.replay is Replay.NEVER
    assert tool.has_lookup
    registry = ToolRegistry([tool])
    call = registry.validate("publish_report", '{"title": "Q3", "body": "all good"}')
    assert isinstance(call, ValidatedCall)
    assert safe_lookup(tool, "op", 2.0) == LookupResult.not_found()
    result = tool.run(call.arguments, ToolContext(ws, "op"))
    assert result.content.startswith('Published report "Q3" (receipt rcpt-')
    found = safe_lookup(tool, "op", 2.0)
    assert found.status is LookupStatus.COMMITTED and found.result is not None
    assert found.result.content == result.content
    assert tool.run(call.arguments, ToolContext(ws, "op")).content == result.content
    assert tool.ledger.count_all() == 1
    publication = tool.ledger.find("op")
    assert publication is not None and publication_text(publication) == result.content


def test_concurrent_publishes_with_one_operation_id_commit_once(ws: Path) -> None:
    path = default_ledger_path(ws)
    ReportLedger(path).publish("warm-up", "t", "b")  # create the schema first
    threads = 12
    ids = [f"op-{i}" for i in range(10)]
    receipts: dict[str, list[str]] = {op: [] for op in ids}
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads)
    lock = threading.Lock()

    def publisher() -> None:
        ledger = ReportLedger(path)  # its own connection: real SQLite concurrency
        try:
            barrier.wait()
            for op in ids:
                receipt = ledger.publish(op, f"title {op}", "body").receipt
                with lock:
                    receipts[op].append(receipt)
        except BaseException as exc:
            errors.append(exc)
        finally:
            ledger.close()

    workers = [threading.Thread(target=publisher) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    ledger = ReportLedger(path)
    assert ledger.count_all() == len(ids) + 1
    assert ledger.duplicate_effects() == 0
    for op in ids:
        assert ledger.effect_count(op) == 1
        found = ledger.find(op)
        assert found is not None
        assert receipts[op] == [found.receipt] * threads


def test_shared_ledger_object_across_threads(ws: Path) -> None:
    ledger = ReportLedger.for_workspace(ws)
    out: list[str] = []
    barrier = threading.Barrier(8)

    def publish() -> None:
        barrier.wait()
        out.append(ledger.publish("same", "t", "b").receipt)

    workers = [threading.Thread(target=publish) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(set(out)) == 1 and len(out) == 8
    assert ledger.count_all() == 1


def test_corrupt_ledger_makes_lookup_unknowable_and_execute_raise(ws: Path) -> None:
    path = default_ledger_path(ws)
    path.parent.mkdir(mode=0o700)
    path.write_bytes(b"garbage" * 1000)
    tool = PublishReportTool(path)
    answer = safe_lookup(tool, "op", 2.0)
    assert answer.status is LookupStatus.UNKNOWABLE
    assert "EffectsDatabaseError" in answer.reason and "corrupt" in answer.reason
    with pytest.raises(EffectsDatabaseError, match="report ledger"):
        tool.run({"title": "t", "body": "b"}, ToolContext(ws, "op"))


# =========================================================================== review


def test_review_lifecycle(reviews: ReviewStore, clock: FakeClock) -> None:
    item = reviews.open_item("s", "op", "edit", "file changed", {"path": "a.txt", "hash": H_C})
    assert item.is_open and item.id >= 1 and item.status is ReviewStatus.OPEN
    assert item.evidence == {"path": "a.txt", "hash": H_C}
    clock.tick(5)
    assert reviews.open_item("s", "op", "edit", "again", {}) == item  # idempotent while open
    assert reviews.list_open() == [item] and reviews.list_open("s") == [item]
    assert reviews.list_open("other") == []
    assert reviews.get(item.id) == item == reviews.get(str(item.id)) == reviews.get(f"#{item.id}")
    assert reviews.for_operation("op") == item and reviews.for_operation("x") is None
    clock.tick(60)
    resolved = reviews.resolve(item.id, ReviewDecision.NOT_APPLIED, note="I reverted it")
    assert resolved.status is ReviewStatus.RESOLVED
    assert resolved.decision is ReviewDecision.NOT_APPLIED and resolved.note == "I reverted it"
    assert resolved.resolved_at_ms == resolved.opened_at_ms + 65_000
    assert reviews.get(item.id) == resolved
    assert reviews.list_open() == []
    assert reviews.for_operation("op") == resolved
    with pytest.raises(ReviewItemResolved, match="already resolved") as info:
        reviews.resolve(item.id, "applied")
    assert info.value.exit_code == 23
    as_json = resolved.to_json()
    assert as_json["decision"] == "notApplied" and as_json["resolvedAt"].endswith("Z")
    # The log kept the opening and the decision, with times and evidence.
    log = reviews.reconciliations(operation_id="op")
    assert [e.verdict for e in log] == ["reviewOpened", "review:notApplied"]
    assert log[0].at_ms == item.opened_at_ms and log[1].at_ms == resolved.resolved_at_ms
    assert log[1].evidence["note"] == "I reverted it"
    assert log[1].evidence["evidence"] == {"path": "a.txt", "hash": H_C}
    # A new problem with the same operation id opens a new item.
    newer = reviews.open_item("s", "op", "edit", "again", {})
    assert newer.id != item.id and newer.is_open
    assert reviews.for_operation("op") == newer
    assert [i.id for i in reviews.list_all()] == [item.id, newer.id]


def test_review_item_not_found(reviews: ReviewStore) -> None:
    for bad in (42, "42", "abc", "", True):
        with pytest.raises(ReviewItemNotFound, match="tether review") as info:
            reviews.get(bad)  # type: ignore[arg-type]
        assert info.value.exit_code == 22
    with pytest.raises(ReviewItemNotFound):
        reviews.resolve(42, ReviewDecision.ABORT)
    with pytest.raises(ValueError):
        reviews.resolve(42, "maybe")


def test_log_reconciliation(reviews: ReviewStore, clock: FakeClock) -> None:
    entry = reviews.log_reconciliation(
        "s", "op", "applied", {"afterHash": H_B}, tool_name="write", action="complete"
    )
    assert entry.at_ms == round(clock.now * 1000)
    assert reviews.reconciliations() == [entry]
    assert reviews.reconciliations(session_id="s", operation_id="op") == [entry]
    assert reviews.reconciliations(session_id="t") == []
    assert entry.to_json()["evidence"] == {"afterHash": H_B}


# =========================================================================== recovery decision


def _verdict(kind: Verdict, row: JournalRow | None = None) -> FileVerdict:
    return FileVerdict(kind, row, H_C, "test")


def test_decide_without_observations_is_the_spec() -> None:
    assert decide_pending(None).action is RecoveryAction.SPEC
    assert decide_pending(PendingObservation("op", "tool")).action is RecoveryAction.SPEC


@pytest.mark.parametrize(
    ("observation", "action", "is_error"),
    [
        (
            PendingObservation("op", "edit", file=_verdict(Verdict.APPLIED, _row())),
            RecoveryAction.COMPLETE,
            False,
        ),
        (
            PendingObservation("op", "edit", file=_verdict(Verdict.NOT_APPLIED, _row())),
            RecoveryAction.EXECUTE,
            None,
        ),
        (
            # The intent is recorded before toolStarted: no row means lost evidence.
            PendingObservation("op", "edit", file=_verdict(Verdict.NO_RECORD)),
            RecoveryAction.REVIEW,
            None,
        ),
        (
            PendingObservation("op", "edit", file=_verdict(Verdict.CONFLICT, _row())),
            RecoveryAction.REVIEW,
            None,
        ),
        (
            PendingObservation(
                "op",
                "edit",
                file=_verdict(
                    Verdict.FAILED, _row(JournalStatus.FAILED, result="Error: a.txt changed")
                ),
            ),
            RecoveryAction.COMPLETE,
            True,
        ),
        (
            PendingObservation("op", "t", lookup=LookupResult.committed("done")),
            RecoveryAction.COMPLETE,
            False,
        ),
        (
            PendingObservation(
                "op", "t", lookup=LookupResult.committed(ToolResult.error("Error: no"))
            ),
            RecoveryAction.COMPLETE,
            True,
        ),
        (
            PendingObservation("op", "t", lookup=LookupResult.not_found()),
            RecoveryAction.EXECUTE,
            None,
        ),
        (
            PendingObservation("op", "t", lookup=LookupResult.unknowable("down")),
            RecoveryAction.REVIEW,
            None,
        ),
    ],
)
def test_decision_table(
    observation: PendingObservation, action: RecoveryAction, is_error: bool | None
) -> None:
    decision = decide_pending(observation)
    assert decision.action is action
    if is_error is not None:
        assert decision.content is not None and decision.is_error is is_error
    else:
        assert decision.content is None
    if action is RecoveryAction.REVIEW:
        assert decision.reason and decision.evidence
    assert decision.to_json()["action"] == action.value


def test_decision_texts() -> None:
    applied = decide_pending(
        PendingObservation("op", "edit", file=_verdict(Verdict.APPLIED, _row()))
    )
    assert applied.content == reconciled_text(_row())
    assert "reconciled after a crash" in (applied.content or "")
    committed = decide_pending(PendingObservation("op", "t", lookup=LookupResult.committed("done")))
    assert committed.content == "done" and committed.recovered_from_ledger
    assert committed.to_json()["recoveredFromLedger"] is True
    conflict = decide_pending(
        PendingObservation("op", "edit", file=_verdict(Verdict.CONFLICT, _row()))
    )
    assert conflict.evidence["beforeHash"] == H_A and conflict.evidence["afterHash"] == H_B
    assert conflict.evidence["currentHash"] == H_C
    assert "nothing was overwritten" in conflict.reason
    unknowable = decide_pending(
        PendingObservation("op", "t", lookup=LookupResult.unknowable("down"))
    )
    assert "down" in unknowable.reason
    with pytest.raises(ValueError):
        PendingObservation(
            "op", "t", file=_verdict(Verdict.APPLIED, _row()), lookup=LookupResult.not_found()
        )


def test_review_decisions_take_precedence(reviews: ReviewStore) -> None:
    item = reviews.open_item("s", "op", "edit", "conflict", {"x": 1})
    observation = PendingObservation(
        "op", "edit", file=_verdict(Verdict.APPLIED, _row()), review=item
    )
    blocked = decide_pending(observation)
    assert blocked.action is RecoveryAction.REVIEW and blocked.review_item == item.id
    for decision, action, error in [
        (ReviewDecision.APPLIED, RecoveryAction.COMPLETE, False),
        (ReviewDecision.NOT_APPLIED, RecoveryAction.COMPLETE, True),
        (ReviewDecision.ABORT, RecoveryAction.ABORT, None),
    ]:
        current = reviews.open_item("s", f"op-{decision}", "edit", "conflict", {})
        resolved = reviews.resolve(current.id, decision, note="checked")
        result = decide_pending(
            PendingObservation(
                resolved.operation_id,
                "edit",
                file=_verdict(Verdict.CONFLICT, _row()),
                review=resolved,
            )
        )
        assert result.action is action and result.review_item == resolved.id
        if error is not None:
            assert result.is_error is error
            assert result.content is not None and "Reviewer's note: checked" in result.content
    assert review_result_text(ReviewDecision.APPLIED, None, _row()) == (
        "Edited a.txt: replaced 1 occurrence (confirmed as applied in review after a crash)."
    )
    with pytest.raises(ValueError):
        review_result_text(ReviewDecision.ABORT, None)


def test_reconcile_pending_end_to_end_conflict(
    ws: Path, journal: ActionJournal, reviews: ReviewStore, clock: FakeClock
) -> None:
    arguments = _started_edit(ws, journal)
    (ws / "a.txt").write_text("human\n")
    edit = EditTool()
    decision, item = reconcile_pending(
        edit, "op", "s", workspace=ws, journal=journal, reviews=reviews
    )
    assert decision.action is RecoveryAction.REVIEW and item is not None
    assert decision.review_item == item.id
    assert item.evidence["currentHash"] == content_hash(b"human\n")
    evidence = journal.evidence(item.evidence["evidenceId"])
    assert evidence is not None and evidence.content == b"human\n"
    # Resuming again while the item is open: same item, no new evidence, no new log line.
    clock.tick()
    again, same = reconcile_pending(edit, "op", "s", workspace=ws, journal=journal, reviews=reviews)
    assert again.action is RecoveryAction.REVIEW and same == item
    assert len(reviews.reconciliations(operation_id="op")) == 2  # conflict + reviewOpened
    assert journal.db.query_one("SELECT COUNT(*) FROM evidence")[0] == 1  # type: ignore[index]
    # The reviewer decides; the next recovery fills in the implied result, nothing is written.
    reviews.resolve(item.id, ReviewDecision.APPLIED)
    final, none = reconcile_pending(edit, "op", "s", workspace=ws, journal=journal, reviews=reviews)
    assert none is None and final.action is RecoveryAction.COMPLETE and not final.is_error
    assert final.content == (
        "Edited a.txt: replaced 1 occurrence (confirmed as applied in review after a crash)."
    )
    assert (ws / "a.txt").read_text() == "human\n"
    verdicts = [e.verdict for e in reviews.reconciliations(operation_id="op")]
    assert verdicts == ["conflict", "reviewOpened", "review:applied", "review:applied"]
    del arguments


def test_reconcile_pending_effect_tools(
    ws: Path, journal: ActionJournal, reviews: ReviewStore
) -> None:
    tool = PublishReportTool.for_workspace(ws)
    decision, item = reconcile_pending(
        tool, "op", "s", workspace=ws, journal=journal, reviews=reviews
    )
    assert decision.action is RecoveryAction.EXECUTE and item is None
    published = tool.run({"title": "T", "body": "B"}, ToolContext(ws, "op"))
    decision, item = reconcile_pending(
        tool, "op", "s", workspace=ws, journal=journal, reviews=reviews
    )
    assert decision.action is RecoveryAction.COMPLETE and decision.recovered_from_ledger
    assert decision.content == published.content
    log = reviews.reconciliations(operation_id="op")
    assert [(e.verdict, e.action) for e in log] == [
        ("notFound", "execute"),
        ("committed", "complete"),
    ]
    assert log[1].evidence["decision"]["recoveredFromLedger"] is True
    # A hanging lookup goes to review, bounded by the timeout.
    hanging = Looking(LookupResult.not_found(), delay=5.0)
    decision, item = reconcile_pending(
        hanging, "op-h", "s", workspace=ws, journal=journal, reviews=reviews, lookup_timeout=0.1
    )
    assert decision.action is RecoveryAction.REVIEW and item is not None
    assert "did not answer" in item.reason
    # No lookup: exactly the spec (interrupted); nothing logged.
    decision, item = reconcile_pending(
        Recorder(), "op-r", "s", workspace=ws, journal=journal, reviews=reviews
    )
    assert decision.action is RecoveryAction.SPEC and item is None
    assert reviews.reconciliations(operation_id="op-r") == []
    assert observe_pending(None, "op-x", workspace=ws, journal=journal, reviews=reviews) is None


def test_record_decision_for_spec_logs_nothing(reviews: ReviewStore) -> None:
    observation = PendingObservation("op", "t")
    assert record_decision(reviews, "s", observation, decide_pending(observation)) is None
    assert reviews.reconciliations() == []


def test_locked_journal_before_the_intent_writes_nothing(ws: Path) -> None:
    EffectsDB.open_workspace(ws).close()
    holder = sqlite3.connect(effects_db_path(ws), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with EffectsDB.open_workspace(ws, busy_timeout=0.1) as db:
            with pytest.raises(EffectsDatabaseError, match="locked"):
                journaled_write(ws, ActionJournal(db), "s", "op", {"path": "a", "content": "x"})
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert not (ws / "a").exists()


def test_locked_journal_after_the_change_still_reports_success(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    EffectsDB.open_workspace(ws).close()
    holder = sqlite3.connect(effects_db_path(ws), isolation_level=None)
    real_mark = ActionJournal.mark

    def mark_while_locked(self: ActionJournal, *args: Any, **kwargs: Any) -> JournalRow:
        holder.execute("BEGIN IMMEDIATE")
        try:
            return real_mark(self, *args, **kwargs)
        finally:
            holder.execute("ROLLBACK")

    with EffectsDB.open_workspace(ws, busy_timeout=0.1) as db:
        journal = ActionJournal(db)
        monkeypatch.setattr(ActionJournal, "mark", mark_while_locked)
        result = journaled_write(ws, journal, "s", "op", {"path": "a", "content": "x"})
        monkeypatch.undo()
        assert not result.is_error and result.content == "Wrote 1 bytes to a (created)"
        assert "locked" in result.metadata["journal_error"]
        row = journal.get("op")
        assert row is not None and row.status is JournalStatus.STARTED
        assert observe_file(ws, journal, "op").verdict is Verdict.APPLIED  # recovery agrees
    holder.close()


def test_decision_for_review(reviews: ReviewStore) -> None:
    item = reviews.open_item("s", "op", "publish_report", "lookup failed", {})
    assert decision_for_review(item).action is RecoveryAction.REVIEW
    resolved = reviews.resolve(item.id, ReviewDecision.APPLIED)
    decision = decision_for_review(resolved)
    assert decision.action is RecoveryAction.COMPLETE and not decision.is_error
    assert (
        decision.content == "The call took effect (confirmed as applied in review after a crash)."
    )
