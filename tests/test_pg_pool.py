"""The shared store's pool on a real server (tether._stores.pgpool): many sessions on a few
connections, group commit across sessions with each line fenced on its own, and commits
that survive their connections being killed without losing or doubling a line.

Every test gets a schema of its own (tests/pgkit.py); without a server they skip with one
line, except under ``CI=true``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

from pgkit import pg_store, pg_url  # noqa: F401 (fixtures)
from tether._runtime.compose import _shared_sessions
from tether._settings import Settings
from tether._stores import pgpool
from tether._stores.postgres import PostgresSessions, PostgresSessionStore
from tether._wsdb.postgres import PostgresEffectsDB
from tether.core import facts
from tether.core.reducer import Reducer
from tether.errors import ConfigurationError, SessionFenced
from tether.testing.clock import FakeClock

_IDS = itertools.count(1)


def _say(store: PostgresSessionStore, text: str) -> None:
    entry = f"018f0000-0000-7000-8000-{next(_IDS):012d}"
    store.commit([facts.user_entry(entry_id=entry, content=text)])


def _create(sessions: PostgresSessions) -> PostgresSessionStore:
    return sessions.create(provider="scripted", model="m", environment_identity="env")


def _texts(url: str, session: str) -> list[str]:
    """The user entries of a session as the database holds them (a fresh opener)."""
    opener = PostgresSessions(url, waits=FakeClock())
    try:
        state = Reducer.load(opener.log_bytes(session)).state
    finally:
        opener.close()
    return [str(m["content"]) for m in state.transcript]


def _backends(admin: psycopg.Connection[Any], name: str) -> int:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def _gone(admin: psycopg.Connection[Any], name: str) -> bool:
    """Whether no backend of the pool ``name`` is left (a closed client's backend takes a
    moment to exit on the server)."""
    deadline = time.monotonic() + 5
    while _backends(admin, name) and time.monotonic() < deadline:
        time.sleep(0.01)
    return _backends(admin, name) == 0


@pytest.fixture
def admin(pg_store: str) -> Iterator[psycopg.Connection[Any]]:  # noqa: F811
    with psycopg.connect(pg_store, autocommit=True) as conn:
        yield conn


def test_two_hundred_sessions_share_pool_size_connections_and_their_commits_are_batched(
    pg_store: str,  # noqa: F811
    admin: psycopg.Connection[Any],
) -> None:
    # A worker's shape: one opener per agent, all of one URL, each driving its session from
    # its own thread. The process holds the pool's connections and no more, and commits
    # that are ready together share a transaction.
    openers = [PostgresSessions(pg_store, "/w", pool_size=4) for _ in range(20)]
    try:
        pool = openers[0].pool
        assert all(o.pool is pool for o in openers)  # one pool per process and URL
        stores = [_create(openers[i % 20]) for i in range(200)]
        peak = 0
        done = threading.Event()

        def watch() -> None:
            nonlocal peak
            with psycopg.connect(pg_store, autocommit=True) as conn:
                while not done.is_set():
                    peak = max(peak, _backends(conn, pool.application_name))
                    time.sleep(0.005)

        def drive(mine: list[PostgresSessionStore]) -> None:
            for round_ in range(3):
                for store in mine:
                    _say(store, f"{store.session_id} {round_}")

        watcher = threading.Thread(target=watch)
        watcher.start()
        before = openers[0].metrics()
        threads = [threading.Thread(target=drive, args=(stores[i::40],)) for i in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done.set()
        watcher.join()
        metrics = openers[0].metrics()
        commits = metrics.commits - before.commits
        batches = metrics.commit_transactions - before.commit_transactions
        assert commits == 600
        assert batches < commits / 2, metrics  # grouped: far fewer transactions than commits
        assert 1 <= peak <= 4 and metrics.connections_open <= 4 and metrics.pool_size == 4
        # The database agrees: the 600 lines were written by fewer transactions.
        row = admin.execute(
            "SELECT count(*), count(DISTINCT xmin::text) FROM tether_lines WHERE line_no > 1"
        ).fetchone()
        assert row is not None and row[0] == 600 and row[1] < 300
        for store in stores[:5]:
            sid = store.session_id
            assert _texts(pg_store, sid) == [f"{sid} {r}" for r in range(3)]
        for store in stores:
            store.close()
    finally:
        for o in openers:
            o.close()
    assert _gone(admin, pool.application_name)  # the last opener closed the pool


def test_a_fenced_session_in_a_batch_stores_nothing_and_the_others_commit(
    pg_store: str,  # noqa: F811
    admin: psycopg.Connection[Any],
) -> None:
    sessions = PostgresSessions(pg_store, "/w", lease_seconds=30, waits=FakeClock())
    rival = PostgresSessions(pg_store, "/w", waits=FakeClock())
    try:
        first, fenced, *others = [_create(sessions) for _ in range(4)]
        # The fenced writer's lease is taken over (it expired; a rival leased it).
        admin.execute(
            "UPDATE tether_sessions SET lease_expires = now() - interval '1 second' "
            "WHERE session_id = %s",
            (fenced.session_id,),
        )
        taken = rival.open(fenced.session_id)
        # Hold the first session's row so that its commit (the leader) waits in the
        # database, and the other three queue behind it: the next leader takes them in one
        # transaction.
        admin.execute("BEGIN")
        admin.execute(
            "SELECT 1 FROM tether_sessions WHERE session_id = %s FOR UPDATE", (first.session_id,)
        )
        errors: dict[str, BaseException] = {}

        def commit(store: PostgresSessionStore) -> None:
            try:
                _say(store, f"from {store.session_id}")
            except BaseException as exc:
                errors[store.session_id] = exc

        leader = threading.Thread(target=commit, args=(first,))
        leader.start()
        deadline = time.monotonic() + 10
        while not sessions.pool._group._leading and time.monotonic() < deadline:
            time.sleep(0.001)
        followers = [threading.Thread(target=commit, args=(s,)) for s in (fenced, *others)]
        for t in followers:
            t.start()
        while len(sessions.pool._group._queue) < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert len(sessions.pool._group._queue) == 3
        before = sessions.metrics()
        admin.execute("COMMIT")
        for t in (leader, *followers):
            t.join()
        after = sessions.metrics()
        assert after.commits - before.commits == 4
        assert after.commit_transactions - before.commit_transactions == 2  # leader, then 3
        assert list(errors) == [fenced.session_id]
        assert isinstance(errors[fenced.session_id], SessionFenced)
        assert _texts(pg_store, fenced.session_id) == []  # its line never landed
        rows = admin.execute(
            "SELECT session_id, xmin::text FROM tether_lines WHERE line_no = 2"
        ).fetchall()
        xmins = {str(sid): x for sid, x in rows}
        assert set(xmins) == {first.session_id, *(s.session_id for s in others)}
        assert xmins[others[0].session_id] == xmins[others[1].session_id]  # one transaction
        assert xmins[first.session_id] != xmins[others[0].session_id]
        for store in others:
            assert _texts(pg_store, store.session_id) == [f"from {store.session_id}"]
        _say(taken, "the rival writes on")  # the rival's lease is untouched
        for store in (first, fenced, *others, taken):
            store.close()
    finally:
        sessions.close()
        rival.close()


def test_killing_the_pools_connections_mid_commit_loses_and_doubles_nothing(
    pg_store: str,  # noqa: F811
    admin: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pgpool, "QUIET_SECONDS", 0.05)
    said: list[str] = []
    pgpool.set_unavailable_hook(said.append)
    sessions = PostgresSessions(pg_store, "/w", pool_size=3, waits=FakeClock())
    try:
        stores = [_create(sessions) for _ in range(12)]
        acknowledged: dict[str, list[str]] = {s.session_id: [] for s in stores}
        kills = 0

        def kill() -> None:  # an operator, a failover: every connection of the pool ends
            nonlocal kills
            with psycopg.connect(pg_store, autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (sessions.application_name,),
                )
            kills += 1

        def drive(store: PostgresSessionStore) -> None:
            for n in range(40):
                if store is stores[0] and n % 8 == 4:
                    kill()  # while the other sessions' commits are in flight
                text = f"{store.session_id} {n}"
                _say(store, text)  # raises if it was not stored: the test fails
                acknowledged[store.session_id].append(text)

        threads = [threading.Thread(target=drive, args=(s,)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        metrics = sessions.metrics()
        assert kills == 5 and metrics.retries >= 1, (kills, metrics)
        # Every acknowledged line is there, once, in order; nothing else is.
        for sid, texts in acknowledged.items():
            assert len(texts) == 40
            assert _texts(pg_store, sid) == texts
        row = admin.execute("SELECT count(*) FROM tether_lines WHERE line_no > 1").fetchone()
        assert row is not None and row[0] == 12 * 40
        # The outage was said once per outage (and its end), not once per retry.
        assert said and said[0].startswith("store ") and "unavailable, retrying" in said[0]
        assert len(said) <= 2 * kills  # at most once per outage and its end
        for a, b in itertools.pairwise(said):
            assert ("unavailable" in a) != ("unavailable" in b)  # alternating
        for store in stores:
            store.close()
    finally:
        pgpool.set_unavailable_hook(None)
        sessions.close()


def test_the_workspace_tables_and_the_sessions_share_the_pool_of_the_setting(
    pg_store: str,  # noqa: F811
    admin: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    # Through the one composition: the pool_size setting sizes the process's pool, and the
    # workspace tables opened afterwards borrow from it (no connection of their own).
    from tether._clock import SYSTEM_CLOCK

    opener = _shared_sessions(Settings(pool_size=2), pg_store, tmp_path, SYSTEM_CLOCK, str)
    assert isinstance(opener, PostgresSessions)
    db = PostgresEffectsDB.open_url(pg_store)
    try:
        assert opener.pool.size == 2 and opener.metrics().pool_size == 2
        assert db.identity is not None
        with db.transaction() as conn:
            conn.execute("SELECT 1")
            assert opener.metrics().in_use == 1  # borrowed for the transaction only
        assert opener.metrics().in_use == 0
        assert _backends(admin, opener.application_name) <= 2
    finally:
        db.close()
        opener.close()
    assert _gone(admin, opener.application_name)
    with pytest.raises(ConfigurationError, match="pool size must be a positive integer"):
        PostgresSessions(pg_store, pool_size=0)


def test_the_pool_size_setting_reads_its_sources_and_refuses_bad_values_in_one_line() -> None:
    from tether._project import parse_project_config
    from tether._settings import resolve_settings
    from tether.errors import ProjectConfigError

    project = parse_project_config("[store]\npool_size = 4\n")
    assert resolve_settings({}, environ={}, project=None).pool_size is None  # 10 by default
    assert resolve_settings({}, environ={}, project=project).pool_size == 4
    env = {"TETHER_STORE_POOL_SIZE": "6"}
    assert resolve_settings({}, environ=env, project=project).pool_size == 6
    assert resolve_settings({"pool_size": 8}, environ=env, project=project).pool_size == 8
    for bad in ("0", "ten", "-3", "2.5"):
        with pytest.raises(ConfigurationError) as caught:
            resolve_settings({}, environ={"TETHER_STORE_POOL_SIZE": bad}, project=None)
        assert str(caught.value) == (
            f"TETHER_STORE_POOL_SIZE must be a positive whole number, got {bad!r}"
        )
    with pytest.raises(ProjectConfigError, match=r"\[store\] pool_size: expected a positive"):
        parse_project_config("[store]\npool_size = 0\n")


class _Gate:
    """A loopback TCP proxy to the test server that can refuse every connection, as a full
    or restarting server does (accept, then close at once), and cut those it forwarded."""

    def __init__(self, host: str, port: int) -> None:
        import socket

        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.refusing = False
        self._open: list[Any] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            server = socket.create_connection(self._target)
            with self._lock:
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: Any, dst: Any) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def refuse(self) -> None:
        import socket

        self.refusing = True
        with self._lock:
            for s in self._open:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._open.clear()

    def close(self) -> None:
        self.refuse()
        self._listener.close()


def test_a_server_that_refuses_connections_is_waited_for_not_failed(
    pg_store: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pgpool, "QUIET_SECONDS", 0.2)
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(pg_store)
    gate = _Gate(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
    url = make_conninfo(pg_store, host="127.0.0.1", port=str(gate.port))
    url = "postgresql://?" + "&".join(
        f"{k}={quote(str(v))}" for k, v in conninfo_to_dict(url).items()
    )
    said: list[str] = []
    pgpool.set_unavailable_hook(said.append)
    sessions = PostgresSessions(url, "/w", waits=FakeClock())
    try:
        store = _create(sessions)
        _say(store, "before")
        gate.refuse()  # every connection cut, every new one refused: a restart under way
        outcome: list[BaseException | None] = []

        def commit() -> None:
            try:
                _say(store, "during")
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        committer = threading.Thread(target=commit)
        committer.start()
        deadline = time.monotonic() + 10
        while not said and time.monotonic() < deadline:
            time.sleep(0.01)
        assert said and "unavailable, retrying" in said[0]  # said at once, once
        time.sleep(0.3)
        assert committer.is_alive() and outcome == []  # waiting, not failed
        gate.refusing = False  # the server is back
        committer.join(timeout=20)
        assert outcome == [None]
        time.sleep(0.2)  # quiet: the next success ends the outage
        _say(store, "after")
        assert "reachable again" in said[-1] and len(said) == 2
        assert _texts(pg_store, store.session_id) == ["before", "during", "after"]  # once each
        store.close()
    finally:
        pgpool.set_unavailable_hook(None)
        sessions.close()
        gate.close()
