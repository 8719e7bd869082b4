"""effects.db schema v2: verifications, artifact manifests, authorizations, tool failures."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest

from tether._completion.check import CheckOutcome
from tether._completion.evidence import (
    Verification,
    VerificationStatus,
    VerificationStore,
    verification_status,
)
from tether._completion.failures import FailureStore
from tether._effects.authorization import AuthorizationStore, call_key
from tether._effects.journal import ActionJournal
from tether._ids import is_uuid7
from tether._wsdb.sqlite import (
    EFFECTS_MIGRATIONS,
    EFFECTS_SCHEMA_VERSION,
    EffectsDB,
    effects_db_path,
)

V2_TABLES = {"verifications", "artifact_manifests", "authorizations", "tool_failures"}


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


def tables(db: EffectsDB) -> set[str]:
    return {str(r[0]) for r in db.query("SELECT name FROM sqlite_master WHERE type = 'table'")}


def outcome(
    *,
    exit_status: int | None = 0,
    timed_out: bool = False,
    error: str | None = None,
    version_start: str | None = "v1",
    version_end: str | None = "v1",
    started_at_ms: int = 1_000,
    command: str = "pytest -q",
) -> CheckOutcome:
    return CheckOutcome(
        command=command,
        exit_status=exit_status,
        timed_out=timed_out,
        error=error,
        output_digest="sha256:" + "0" * 64,
        output_tail="ok\n",
        version_start=version_start,
        version_end=version_end,
        started_at_ms=started_at_ms,
        duration_ms=12,
    )


# ============================================================================ migration


def test_schema_version_is_4_and_tables_exist(db: EffectsDB) -> None:
    # Version 3 (the database's identity, tether._effects.binding) came after these tables,
    # version 4 (parked approvals, tether._effects.approvals) after that.
    assert EFFECTS_SCHEMA_VERSION == len(EFFECTS_MIGRATIONS) == 4
    assert db.user_version == 4
    assert V2_TABLES <= tables(db)
    assert {"approval_requests", "approval_grants"} <= tables(db)
    indexes = {str(r[0]) for r in db.query("SELECT name FROM sqlite_master WHERE type='index'")}
    assert "verifications_status" in indexes


def test_v1_database_upgrades_in_place(ws: Path) -> None:
    path = effects_db_path(ws)
    with EffectsDB.open(path, EFFECTS_MIGRATIONS[:1]) as old:
        assert old.user_version == 1
        assert not (V2_TABLES & tables(old))
        ActionJournal(old).record_intent("s", "op-1", "a.txt", None, "sha256:aa", "d")
    with EffectsDB.open(path) as db:
        assert db.user_version == EFFECTS_SCHEMA_VERSION == 4
        assert V2_TABLES <= tables(db)
        row = ActionJournal(db).get("op-1")
        assert row is not None and row.path == "a.txt" and row.after_hash == "sha256:aa"
        VerificationStore(db).record(session_id="s", tool_started_id=None, outcome=outcome())
    # Running every statement again (version forgotten) is harmless.
    con = sqlite3.connect(path)
    con.execute("PRAGMA user_version = 1")
    con.commit()
    con.close()
    with EffectsDB.open(path) as db:
        assert db.user_version == 4
        assert len(VerificationStore(db).list()) == 1


def test_status_check_constraints(db: EffectsDB) -> None:
    with pytest.raises(Exception, match="CHECK"), db.transaction() as conn:
        conn.execute(
            "INSERT INTO authorizations (session_id, call_key, tool_name, arguments_digest, "
            "summary, decision, who, rule, reason, decided_at_ms) "
            "VALUES ('s','k','bash','d','x','maybe','user','r',NULL,1)"
        )


# ============================================================================ status


@pytest.mark.parametrize(
    ("exit_status", "timed_out", "error", "start", "end", "expected"),
    [
        (0, False, None, "v1", "v1", VerificationStatus.PASSED),
        (1, False, None, "v1", "v1", VerificationStatus.FAILED),
        (3, False, None, "v1", "v1", VerificationStatus.FAILED),
        (None, True, None, "v1", "v1", VerificationStatus.FAILED),
        (0, True, None, "v1", "v1", VerificationStatus.FAILED),
        (0, False, None, "v1", "v2", VerificationStatus.VOID),
        (1, False, None, "v1", "v2", VerificationStatus.VOID),
        (None, True, None, "v1", "v2", VerificationStatus.VOID),
        (0, False, "cancelled", "v1", "v1", VerificationStatus.ERROR),
        (127, False, "check command not found: x", "v1", "v1", VerificationStatus.ERROR),
        (0, False, None, None, "v1", VerificationStatus.ERROR),
        (0, False, None, "v1", None, VerificationStatus.ERROR),
        (None, False, "unreadable", None, None, VerificationStatus.ERROR),
        (0, False, "x", "v1", "v2", VerificationStatus.ERROR),
    ],
)
def test_verification_status_table(
    exit_status: int | None,
    timed_out: bool,
    error: str | None,
    start: str | None,
    end: str | None,
    expected: VerificationStatus,
) -> None:
    assert verification_status(exit_status, timed_out, error, start, end) is expected
    assert (
        outcome(
            exit_status=exit_status,
            timed_out=timed_out,
            error=error,
            version_start=start,
            version_end=end,
        ).status
        is expected
    )


# ============================================================================ verifications


def test_record_and_get_roundtrip(db: EffectsDB) -> None:
    store = VerificationStore(db)
    made = store.record(session_id="sess", tool_started_id="tool-1", outcome=outcome(exit_status=0))
    assert is_uuid7(made.id)
    assert made.status is VerificationStatus.PASSED and made.passed
    assert store.get(made.id) == made
    assert store.get("nope") is None
    assert store.by_tool_started_id("tool-1") == made
    assert store.by_tool_started_id("tool-2") is None
    data = made.to_json()
    assert data["status"] == "passed"
    assert data["sessionId"] == "sess" and data["toolStartedId"] == "tool-1"
    assert data["timedOut"] is False and data["exitStatus"] == 0
    assert data["startedAt"] == "1970-01-01T00:00:01.000Z"
    assert data["outputDigest"].startswith("sha256:")


def test_cli_verification_without_session(db: EffectsDB) -> None:
    store = VerificationStore(db)
    made = store.record(
        session_id=None, tool_started_id=None, outcome=outcome(exit_status=None, timed_out=True)
    )
    got = store.get(made.id)
    assert got is not None
    assert got.session_id is None and got.tool_started_id is None
    assert got.exit_status is None and got.timed_out is True
    assert got.status is VerificationStatus.FAILED and not got.passed


def test_latest_and_latest_passing_ordering(db: EffectsDB) -> None:
    store = VerificationStore(db)
    assert store.latest() is None and store.latest_passing() is None and store.list() == []
    passed_old = store.record(
        session_id="s", tool_started_id=None, outcome=outcome(started_at_ms=1_000)
    )
    passed_new = store.record(
        session_id="s", tool_started_id=None, outcome=outcome(started_at_ms=3_000)
    )
    failed = store.record(
        session_id="s", tool_started_id=None, outcome=outcome(exit_status=1, started_at_ms=4_000)
    )
    void = store.record(
        session_id="s",
        tool_started_id=None,
        outcome=outcome(version_end="v2", started_at_ms=2_000),
    )
    # Recorded later but started earlier: ordering is by start time.
    assert store.latest() == failed
    assert store.latest_passing() == passed_new
    assert [v.id for v in store.list()] == [failed.id, passed_new.id, void.id, passed_old.id]
    assert [v.id for v in store.list(limit=2)] == [failed.id, passed_new.id]
    # Same start time: the later id (uuid7) wins.
    tie = store.record(session_id="s", tool_started_id=None, outcome=outcome(started_at_ms=4_000))
    assert store.latest() == tie
    assert store.latest_passing() == tie
    assert void.status is VerificationStatus.VOID


def test_void_is_never_latest_passing(db: EffectsDB) -> None:
    store = VerificationStore(db)
    store.record(session_id=None, tool_started_id=None, outcome=outcome(version_end="v2"))
    store.record(session_id=None, tool_started_id=None, outcome=outcome(error="cancelled"))
    assert store.latest_passing() is None
    latest = store.latest()
    assert latest is not None and latest.status is VerificationStatus.ERROR


def test_manifest_roundtrip_and_written_once(db: EffectsDB, clock: FakeClock) -> None:
    store = VerificationStore(db)
    assert store.manifest("v1") is None
    blob = bytes(range(256)) * 4
    store.save_manifest("v1", blob)
    assert store.manifest("v1") == blob
    store.save_manifest("v1", b"other")
    assert store.manifest("v1") == blob
    made = store.record(
        session_id="s",
        tool_started_id="t",
        outcome=outcome(version_start="v9"),
        manifest=("v9", b"\x00manifest\xff"),
    )
    assert store.manifest("v9") == b"\x00manifest\xff"
    assert made.version_start == "v9"


def test_latest_conclusive_skips_void_and_other_versions(db: EffectsDB) -> None:
    store = VerificationStore(db)
    assert store.latest_conclusive("v1") is None
    passed = store.record(
        session_id="s", tool_started_id=None, outcome=outcome(started_at_ms=1_000)
    )
    assert store.latest_conclusive("v1") == passed
    store.record(
        session_id="s",
        tool_started_id=None,
        outcome=outcome(version_end="v2", started_at_ms=2_000),
    )
    assert store.latest_conclusive("v1") == passed  # void proves nothing
    failed = store.record(
        session_id="s", tool_started_id=None, outcome=outcome(exit_status=1, started_at_ms=3_000)
    )
    assert store.latest_conclusive("v1") == failed  # a newer failure beats an older pass
    errored = store.record(
        session_id="s",
        tool_started_id=None,
        outcome=outcome(error="cancelled", started_at_ms=4_000),
    )
    assert store.latest_conclusive("v1") == errored
    store.record(
        session_id="s",
        tool_started_id=None,
        outcome=outcome(version_start="v3", version_end="v3", started_at_ms=5_000),
    )
    assert store.latest_conclusive("v1") == errored
    assert store.latest_passing() is not None and store.latest_passing() != passed


def test_record_with_manifest_is_one_transaction(db: EffectsDB) -> None:
    store = VerificationStore(db)
    with pytest.raises(Exception):  # noqa: B017 - the type does not matter, only atomicity
        store.record(
            session_id="s",
            tool_started_id="t",
            outcome=outcome(),
            manifest=("v1", cast(bytes, None)),  # bytes(None) fails inside the transaction
        )
    assert store.list() == []
    assert store.manifest("v1") is None


def test_verifications_persist_across_reopen(ws: Path, clock: FakeClock) -> None:
    with EffectsDB.open_workspace(ws, clock=clock) as db:
        made = VerificationStore(db).record(session_id="s", tool_started_id="t", outcome=outcome())
    with EffectsDB.open_workspace(ws, clock=clock) as db:
        got = VerificationStore(db).by_tool_started_id("t")
    assert got == made
    assert isinstance(got, Verification)
    assert replace(got, status=VerificationStatus.FAILED) != made


# ============================================================================ authorizations


def test_call_key() -> None:
    assert call_key("0190-abc", 0) == "0190-abc:0"
    assert call_key("e", 12) == "e:12"
    with pytest.raises(ValueError):
        call_key("e", -1)


def test_authorization_first_decision_wins_and_persists(ws: Path, clock: FakeClock) -> None:
    key = call_key("entry-1", 0)
    with EffectsDB.open_workspace(ws, clock=clock) as db:
        store = AuthorizationStore(db)
        assert store.get("s1", key) is None
        first = store.record(
            session_id="s1",
            call_key=key,
            tool_name="bash",
            arguments_digest="sha256:d1",
            summary="rm -rf build",
            decision="allow",
            who="user",
            rule="ask",
            reason=None,
        )
        assert first.allowed and first.decided_at_ms == 1_700_000_000_000
        clock.tick()
        again = store.record(
            session_id="s1",
            call_key=key,
            tool_name="bash",
            arguments_digest="sha256:d2",
            summary="something else",
            decision="deny",
            who="policy",
            rule="deny-all",
            reason="no",
        )
        assert again == first
        assert store.get("s1", key) == first
        other = store.record(
            session_id="s2",
            call_key=key,
            tool_name="bash",
            arguments_digest="sha256:d1",
            summary="x",
            decision="deny",
            who="policy",
            rule="r",
            reason="because",
        )
        assert other.id != first.id and not other.allowed
    with EffectsDB.open_workspace(ws, clock=clock) as db:
        store = AuthorizationStore(db)
        assert store.get("s1", key) == first
        assert store.list() == [first, other]
        assert store.list("s2") == [other]
        assert store.list("s3") == []
    data = first.to_json()
    assert data["callKey"] == key and data["decision"] == "allow" and data["who"] == "user"
    assert data["decidedAt"] == "2023-11-14T22:13:20.000Z"


def test_authorization_summary_truncated_and_decision_checked(db: EffectsDB) -> None:
    store = AuthorizationStore(db)
    made = store.record(
        session_id="s",
        call_key="e:0",
        tool_name="bash",
        arguments_digest="d",
        summary="x" * 2000,
        decision="deny",
        who="--yes",
        rule="r",
        reason="r",
    )
    assert len(made.summary) == 500
    assert store.get("s", "e:0") == made
    with pytest.raises(ValueError):
        store.record(
            session_id="s",
            call_key="e:1",
            tool_name="bash",
            arguments_digest="d",
            summary="x",
            decision="maybe",
            who="user",
            rule="r",
            reason=None,
        )


# ============================================================================ failures


def test_failures_insert_or_ignore(db: EffectsDB, clock: FakeClock) -> None:
    store = FailureStore(db)
    assert store.get("t1") is None
    store.record(
        tool_started_id="t1",
        session_id="s",
        tool_name="bash",
        arguments_digest="sha256:a",
        artifact_version="v1",
    )
    clock.tick()
    store.record(
        tool_started_id="t1",
        session_id="s",
        tool_name="edit",
        arguments_digest="sha256:b",
        artifact_version="v2",
    )
    store.record(
        tool_started_id="t2",
        session_id="s",
        tool_name="edit",
        arguments_digest="sha256:b",
        artifact_version=None,
    )
    first = store.get("t1")
    assert first is not None
    assert (first.tool_name, first.arguments_digest, first.artifact_version) == (
        "bash",
        "sha256:a",
        "v1",
    )
    assert first.at_ms == 1_700_000_000_000
    second = store.get("t2")
    assert second is not None and second.artifact_version is None
    assert second.to_json()["artifactVersion"] is None
    assert second.result_entry_id is None


def test_failures_by_result_entry(db: EffectsDB) -> None:
    store = FailureStore(db)
    assert store.by_result_entry("r1") is None
    store.record(
        tool_started_id="t1",
        session_id="s",
        tool_name="bash",
        arguments_digest="sha256:a",
        artifact_version="v1",
        result_entry_id="r1",
    )
    found = store.by_result_entry("r1")
    assert found is not None and found.tool_started_id == "t1"
    assert found == store.get("t1")
    assert found.to_json()["resultEntryId"] == "r1"
    assert store.by_result_entry("r2") is None
