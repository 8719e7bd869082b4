"""The PostgreSQL session store on a real server: the seam's rules, leases and fencing, the
schema checks, export/import, and an agent run with in-process crashes over it.

Every test gets a schema of its own (tests/pgkit.py); without a server they skip with one
line, except under ``CI=true``.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgkit import pg_store, pg_url  # noqa: F401 (fixtures)
from tether._runtime import Agent, RunStatus
from tether._stores import postgres
from tether._stores.memory import MemorySessions
from tether._stores.postgres import (
    SCHEMA_VERSION,
    PostgresSessions,
    init_schema,
)
from tether._tools.builtin import builtin_tools
from tether.core import facts
from tether.core.reducer import Reducer
from tether.errors import (
    AmbiguousSessionId,
    ConfigurationError,
    FactRejected,
    SessionBusy,
    SessionFenced,
    SessionNotFound,
    StoreSchemaError,
    StoreUnavailable,
)
from tether.testing.clock import FakeClock
from tether.testing.scripted import ScriptedModel


class Ticks:
    def __init__(self, prefix: str = "018f0000-0000-7000-8000-") -> None:
        self._ms = itertools.count(1_767_000_000_000, 7)
        self._ids = itertools.count(1)
        self.prefix = prefix

    def clock(self) -> int:
        return next(self._ms)

    def ids(self) -> str:
        return f"{self.prefix}{next(self._ids):012d}"


@pytest.fixture
def sessions(pg_store: str) -> Iterator[PostgresSessions]:  # noqa: F811
    ticks = Ticks()
    opener = PostgresSessions(pg_store, "/w", lease_seconds=2, clock=ticks.clock, ids=ticks.ids)
    yield opener
    opener.close()


def _create(sessions: PostgresSessions) -> Any:
    return sessions.create(provider="scripted", model="m", environment_identity="env")


def _prompt(store: Any, text: str = "hello") -> list[dict[str, Any]]:
    entry = f"018f0000-0000-7000-8000-1{len(store.state.transcript):011d}"
    result: list[dict[str, Any]] = store.commit(
        [
            facts.user_entry(entry_id=entry, content=text),
            facts.run_started(operation_id=f"{entry[:-1]}9", input_entry_id=entry),
        ]
    )
    return result


def _expire(url: str, session: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE tether_sessions SET lease_expires = now() - interval '1 second' "
            "WHERE session_id = %s",
            (session,),
        )


# =========================================================================== the seam's rules


def test_a_commit_survives_a_reopen_and_is_stored_as_the_file_store_writes_it(
    sessions: PostgresSessions, tmp_path: Path
) -> None:
    with _create(sessions) as store:
        session = store.session_id
        committed = _prompt(store)
        assert [f["seq"] for f in committed] == [1, 2]
        state = store.state
        assert store.fencing_token == 1
    with sessions.open(session) as again:
        assert again.state == state
        assert again.fencing_token == 2  # every lease taken raises the epoch
        held = again.log_bytes()  # what the active time budget reads, from the writer
    ticks = Ticks()
    memory = MemorySessions("/w", clock=ticks.clock, ids=ticks.ids)
    with memory.create(provider="scripted", model="m", environment_identity="env") as mem:
        _prompt(mem)
        assert mem.log_bytes() == memory.log_bytes(session)
    assert sessions.log_bytes(session) == memory.log_bytes(session) == held
    assert Reducer.load(sessions.log_bytes(session)).state == state


def test_a_commit_whose_connection_was_killed_reconnects_and_stores_each_line_once(
    sessions: PostgresSessions,
    pg_store: str,  # noqa: F811
) -> None:
    def say(store: Any, text: str) -> None:
        entry = f"018f0000-0000-7000-8000-2{len(store.state.transcript):011d}"
        store.commit([facts.user_entry(entry_id=entry, content=text)])

    with _create(sessions) as store:
        session = store.session_id
        say(store, "before")
        # The server ends the pool's connections (an operator, a failover): the next commit
        # finds its connection gone, takes a new one, reads back that its line is not
        # there, and sends it again.
        with psycopg.connect(pg_store, autocommit=True) as admin:
            pool = (sessions.application_name,)
            find = "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
            before = {r[0] for r in admin.execute(find, pool).fetchall()}
            assert before
            admin.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
                "WHERE application_name = %s",
                pool,
            )
            say(store, "after")
            after = {r[0] for r in admin.execute(find, pool).fetchall()}
            assert after and after.isdisjoint(before)
        say(store, "again")  # and the new connection's prepared statement serves on
        state = store.state
    data = sessions.log_bytes(session)
    assert Reducer.load(data).state == state
    texts = [m["content"] for m in state.transcript]
    assert texts == ["before", "after", "again"]


def test_a_rejected_transaction_changes_nothing(sessions: PostgresSessions) -> None:
    with _create(sessions) as store:
        _prompt(store)
        before = store.state
        with pytest.raises(FactRejected):
            _prompt(store, "again")  # a second run while one is active
        with pytest.raises(FactRejected, match="no facts"):
            store.commit([])
        assert store.state == before
        session = store.session_id
    with sessions.open(session) as again:
        assert again.state == before


def test_one_writer_unknown_and_ambiguous_ids_and_the_sidecar(sessions: PostgresSessions) -> None:
    with _create(sessions) as store, _create(sessions) as other:
        with pytest.raises(SessionBusy, match="leased by"):
            sessions.open(store.session_id)
        record = store.sidecar("binding")
        assert record.read() == (None, None)
        record.write(b"{}\n")
        assert store.sidecar("binding").read() == (b"{}\n", None)
        store.sidecar("reasoning.a").write(b"{}")
        other.sidecar("reasoning.b").write(b"{}")
        assert store.sidecar_names("reasoning.") == {"reasoning.a"}
        assert store.sidecar_names("") == {"binding", "reasoning.a"}
        with pytest.raises(AmbiguousSessionId):
            sessions.open("018f0000")
        assert other.session_id != store.session_id
    with psycopg.connect(sessions.url, autocommit=True) as conn:
        conn.execute("DELETE FROM tether_sessions WHERE session_id = %s", (other.session_id,))
        conn.execute("DELETE FROM tether_lines WHERE session_id = %s", (other.session_id,))
    with sessions.open(store.session_id[:-1]):  # a unique prefix
        pass
    with pytest.raises(SessionNotFound):
        sessions.open("018f0000-0000-7000-8000-999999999999")


# =========================================================================== leases and fencing


def test_an_expired_lease_is_taken_over_and_the_old_writer_is_fenced(
    sessions: PostgresSessions,
    pg_store: str,  # noqa: F811
) -> None:
    zombie = _create(sessions)
    session = zombie.session_id
    _expire(pg_store, session)
    rival = PostgresSessions(pg_store, "/w", lease_seconds=2)
    try:
        with rival.open(session) as taker:
            assert taker.fencing_token == 2
            before = sessions.log_bytes(session)
            with pytest.raises(SessionFenced, match=r"epoch 1.*taken over by .*epoch 2"):
                _prompt(zombie)
            assert sessions.log_bytes(session) == before  # nothing of it was stored
            with pytest.raises(StoreUnavailable, match="fenced"):
                _prompt(zombie)  # the fenced writer stays stopped
            with pytest.raises(SessionFenced):
                zombie.check_lease()
            _prompt(taker)  # the new writer commits
        zombie.close()  # releases nothing: the lease is not its own
        with sessions.open(session) as after:
            assert after.fencing_token == 3
            assert after.state.transcript[-1]["content"] == "hello"
    finally:
        rival.close()


def _lease_left(url: str, session: str) -> float:
    """Seconds the session's lease has left by the database's clock (which leases use)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM lease_expires - now()) FROM tether_sessions "
            "WHERE session_id = %s",
            (session,),
        ).fetchone()
    assert row is not None
    return float(row[0])


def test_leases_are_renewed_while_the_store_is_open(pg_store: str) -> None:  # noqa: F811
    # The renewal's period is waited on the opener's clock: a fake one here, advanced by a
    # third of the lease instead of sleeping past the lease.
    clock = FakeClock()
    sessions = PostgresSessions(pg_store, "/w", lease_seconds=2, waits=clock)
    try:
        with _create(sessions) as store:
            with psycopg.connect(pg_store, autocommit=True) as conn:
                conn.execute(  # about to expire: only a renewal saves it
                    "UPDATE tether_sessions SET lease_expires = now() + interval '0.5 second' "
                    "WHERE session_id = %s",
                    (store.session_id,),
                )
            assert clock.waiting_for(1)
            assert clock.waits == [pytest.approx(2 / 3)]  # renewed every third of the lease
            clock.advance(2 / 3)
            assert clock.waiting_for(2)  # the renewer renewed and waits for the next period
            assert sessions.renewals == 1
            assert _lease_left(pg_store, store.session_id) > 1.5  # a whole lease ahead again
            with pytest.raises(SessionBusy):
                PostgresSessions(pg_store).open(store.session_id)
            store.check_lease()
            _prompt(store)
    finally:
        sessions.close()


def _shorten_lease(url: str, session: str, seconds: float) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE tether_sessions SET lease_expires = now() + make_interval(secs => %s) "
            "WHERE session_id = %s",
            (seconds, session),
        )


def test_a_renewal_never_waits_for_a_row_a_commit_holds(pg_store: str) -> None:  # noqa: F811
    # A group commit locks its rows in its batch's order, a renewal every lease of the
    # process in its own: waiting for each other they deadlocked (PostgreSQL aborted one,
    # in the fleet tests' server log). A transaction holds one session's row here, as a
    # commit in flight does: the renewal renews the others at once, leaves that one to
    # the commit, and does not call it lost; a lease another owner took still is.
    sessions = PostgresSessions(pg_store, "/w", lease_seconds=30, waits=FakeClock())
    try:
        with _create(sessions) as busy, _create(sessions) as free:
            for store in (busy, free):
                _shorten_lease(pg_store, store.session_id, 5)
            with psycopg.connect(pg_store) as commit:  # a transaction, open until the end
                commit.execute(
                    "SELECT 1 FROM tether_sessions WHERE session_id = %s FOR UPDATE",
                    (busy.session_id,),
                )
                renewed: list[int] = []
                renewal = threading.Thread(target=lambda: renewed.append(sessions.renew_now()))
                renewal.start()
                renewal.join(timeout=10)
                waited = renewal.is_alive()
                commit.rollback()  # lets a renewal that waited finish, so the test ends
                renewal.join()
            assert not waited, "the renewal waited for the row the commit holds"
            assert renewed == [1]
            assert _lease_left(pg_store, free.session_id) > 25
            assert _lease_left(pg_store, busy.session_id) < 6  # the commit's to renew
            assert not sessions.lease_lost(busy.session_id)
            busy.check_lease()
            _prompt(busy)  # still its writer

            with psycopg.connect(pg_store, autocommit=True) as conn:
                conn.execute(
                    "UPDATE tether_sessions SET lease_owner = 'rival', lease_epoch = "
                    "lease_epoch + 1 WHERE session_id = %s",
                    (free.session_id,),
                )
            assert sessions.renew_now() == 1  # busy's; free's is no longer held
            assert sessions.lease_lost(free.session_id)
            assert not sessions.lease_lost(busy.session_id)
    finally:
        sessions.close()


@pytest.mark.skipif(
    not hasattr(__import__("time"), "CLOCK_BOOTTIME"), reason="needs CLOCK_BOOTTIME (Linux)"
)
def test_a_fresh_commit_proves_the_lease_and_an_old_one_does_not(
    pg_store: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # check_lease asks the database unless a commit of this writer renewed the lease less
    # than half a lease ago. Told apart by a lease shortened by hand (as no worker would):
    # the database's answer renews it; a commit's proof leaves it short.
    sessions = PostgresSessions(pg_store, "/w", lease_seconds=30)
    try:
        with _create(sessions) as store:
            session = store.session_id
            _prompt(store)
            _shorten_lease(pg_store, session, 5)
            assert store.check_lease() == store.fencing_token
            assert _lease_left(pg_store, session) < 6  # no statement was sent

            # Half a lease after that commit (the boot-time clock moved on; a suspend or a
            # SIGSTOP moves it alike), the database is asked again and renews.
            real = postgres._elapsed
            monkeypatch.setattr(postgres, "_elapsed", lambda: real() + 15.0)
            assert store.check_lease() == store.fencing_token
            assert _lease_left(pg_store, session) > 25
            monkeypatch.setattr(postgres, "_elapsed", real)

            # The statement's renewal proves the lease in turn; a lease found lost by the
            # renewal proves nothing, and an expired lease then fences.
            _shorten_lease(pg_store, session, 5)
            store.check_lease()
            assert _lease_left(pg_store, session) < 6
            _shorten_lease(pg_store, session, -1)
            sessions._lost.add(session)
            with pytest.raises(SessionFenced, match="expired or was taken over"):
                store.check_lease()
            sessions._lost.discard(session)
            with pytest.raises(StoreUnavailable, match="fenced"):
                _prompt(store)  # a writer fenced before an effect stays stopped
    finally:
        sessions.close()


def test_the_queue_hands_each_session_to_one_worker(
    sessions: PostgresSessions,
    pg_store: str,  # noqa: F811
) -> None:
    ids = []
    for _ in range(6):
        with _create(sessions) as store:
            _prompt(store)  # an unfinished run: work for a worker
            ids.append(store.session_id)
    with _create(sessions):
        pass  # idle: not work
    claimed: list[str] = []
    lock = threading.Lock()

    batches: list[int] = []

    def worker(batch: int) -> None:
        opener = PostgresSessions(pg_store, lease_seconds=2)
        while True:
            if batch == 1:
                one = opener.claim("env")
                got = [] if one is None else [one]
            else:  # several in one statement (a worker filling its free slots)
                got = opener.claim_many("env", batch)
                batches.append(len(got))
            if not got:
                break
            with lock:
                claimed.extend(got)
        opener.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in (1, 2, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(claimed) == sorted(ids)  # each exactly once, by one worker
    assert all(0 <= n <= 4 for n in batches) and batches[-1] == 0
    assert sessions.claim("other-env") is None and sessions.claim_many("other-env", 9) == []


def test_a_claimed_session_opens_without_a_statement_unless_it_may_have_been_taken_over(
    sessions: PostgresSessions,
    pg_store: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with _create(sessions) as store:
        _prompt(store)
        session, lines = store.session_id, store.state.last_seq
    worker = PostgresSessions(pg_store, lease_seconds=2)
    statements: list[str] = []
    try:
        assert worker.claim("env") == session
        run = worker._run

        def counted(work: Any) -> Any:
            def spy(conn: Any) -> Any:
                execute = conn.execute

                def record(query: Any, *args: Any, **kwargs: Any) -> Any:
                    statements.append(str(query))
                    return execute(query, *args, **kwargs)

                conn.execute = record
                try:
                    return work(conn)
                finally:
                    del conn.execute

            return run(spy)

        worker._run = counted  # type: ignore[method-assign]
        # The claim read the log with the lease, and its full id needs no prefix lookup:
        # opening sends nothing, and the state is the whole log.
        with worker.open(session) as opened:
            assert opened.state.last_seq == lines and opened.fencing_token >= 1
            assert statements == []
        # Half a lease after the claim (a slow start, a SIGSTOP), the lease check and the log
        # are read again, together: one statement.
        real = postgres._elapsed
        assert worker.claim("env") == session
        monkeypatch.setattr(postgres, "_elapsed", lambda: real() + 1.0)
        statements.clear()  # (the release of the lease, as the store closed)
        with worker.open(session) as opened:
            assert opened.state.last_seq == lines
            assert len(statements) == 1 and "JOIN tether_lines" in statements[0]
        # Claimed again, then taken over once its lease expired, before it is opened: fenced.
        monkeypatch.setattr(postgres, "_elapsed", real)
        assert worker.claim("env") == session
        monkeypatch.setattr(postgres, "_elapsed", lambda: real() + 2.0)
        _expire(pg_store, session)
        with sessions.open(session):
            pass
        with pytest.raises(SessionFenced, match="taken over before the session opened"):
            worker.open(session)
        # A prefix still resolves (a person typing part of an id).
        monkeypatch.setattr(postgres, "_elapsed", real)
        assert worker.claim("env") == session
        with worker.open(session[:-3]) as opened:
            assert opened.session_id == session
    finally:
        worker.close()


def test_many_claims_bring_their_logs_oldest_first(
    sessions: PostgresSessions,
    pg_store: str,  # noqa: F811
) -> None:
    made = []
    for n in range(5):
        with _create(sessions) as store:
            _prompt(store, f"prompt {n}")
            made.append((store.session_id, store.state.last_seq))
    worker = PostgresSessions(pg_store, lease_seconds=5)
    try:
        assert worker.claim_many("env", 10) == [session for session, _ in made]
        for session, last in made:
            with worker.open_claimed(session) as opened:
                assert opened.state.last_seq == last
                number = made.index((session, last))
                assert opened.state.transcript[-1]["content"] == f"prompt {number}"
    finally:
        worker.close()


# =========================================================================== bad input


def test_schema_missing_newer_and_unreachable(pg_url: str) -> None:  # noqa: F811
    with pytest.raises(StoreSchemaError, match="has no tether schema: create it with"):
        PostgresSessions(pg_url)
    assert init_schema(pg_url) is True
    assert init_schema(pg_url) is False
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE tether_meta SET value = %s WHERE key = 'schema_version'",
            (str(SCHEMA_VERSION + 1),),
        )
    with pytest.raises(StoreSchemaError, match="newer than this tether supports"):
        PostgresSessions(pg_url)
    with pytest.raises(StoreUnavailable, match="cannot connect"):
        PostgresSessions("postgresql://nobody:pw@127.0.0.1:1/none")


# =========================================================================== export / import


def test_export_and_import(sessions: PostgresSessions, pg_url: str) -> None:  # noqa: F811
    with _create(sessions) as store:
        _prompt(store)
        session, state = store.session_id, store.state
    data = sessions.log_bytes(session)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DELETE FROM tether_sessions")
        conn.execute("DELETE FROM tether_lines")
    assert sessions.import_log(data) == session
    assert sessions.log_bytes(session) == data
    with sessions.open(session) as again:
        assert again.state == state
    with pytest.raises(ConfigurationError, match="already exists"):
        sessions.import_log(data)


# =========================================================================== an agent over it


SCRIPT = {
    "model": "scripted/pg",
    "responses": [
        {
            "content": "Working.",
            "tool_calls": [
                {"id": "c_bash", "name": "bash", "arguments": {"command": "printf x >> count.txt"}},
                {"id": "c_write", "name": "write", "arguments": {"path": "n.txt", "content": "v"}},
            ],
        },
        {"content": "All done.", "finish_reason": "stop"},
    ],
}


def test_the_agent_runs_and_resumes_over_postgres(
    pg_store: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    model = ScriptedModel.from_json(SCRIPT, source="pg")
    opener = PostgresSessions(pg_store, str(tmp_path), lease_seconds=2)
    try:
        agent = Agent(
            model,
            builtin_tools(),
            workspace=tmp_path,
            environment="pg",
            read_agents_md=False,
            session_store=opener,
        )
        result = agent.run("go")
        agent.close()
        assert result.status is RunStatus.COMPLETED
        assert (tmp_path / "count.txt").read_text() == "x"
        again = Agent(
            model,
            builtin_tools(),
            workspace=tmp_path,
            environment="pg",
            read_agents_md=False,
            session_store=opener,
        )
        before = opener.log_bytes(result.session_id)
        assert again.resume(result.session_id).status is RunStatus.IDLE
        again.close()
        assert opener.log_bytes(result.session_id) == before  # a second drive appends nothing
        assert opener.sessions()[0].pending is False
    finally:
        opener.close()
