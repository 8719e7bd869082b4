"""One bounded connection pool per process and database: group commit, lease renewal, back-pressure.

A worker process drives many sessions, each through its own
:class:`~tether._stores.postgres.PostgresSessions` (one per agent) and
:class:`~tether._wsdb.postgres.PostgresEffectsDB`; they all share one :class:`StorePool` per
database URL (:func:`acquire`, reference-counted, closed with the last user). Rules of this
module (docs/scale-out.md "Connections and commits"):

* a connection is borrowed for one statement or one transaction (:meth:`StorePool.connection`,
  :meth:`StorePool.run`) and given back at once: never across a model call or a tool run,
  so ``pool_size`` connections serve any number of sessions;
* commits of different sessions that are ready at the same moment share one database
  transaction (:meth:`StorePool.commit`): the first committer with nobody committing ahead of
  it becomes the *leader*, takes every queued commit (its own included) and stores them in
  one fenced statement; each line lands only if its own session's count, epoch and owner
  match, so a fenced session's line never lands and the others still do. Each committer is
  answered only after the transaction committed. A lone commit is its own leader at once and
  runs the single-session statement: nothing waits for company;
* a connection lost or refused is **back-pressure**: the operation waits and tries again with
  backoff for up to :data:`RECONNECT_SECONDS`, then :class:`~tether.errors.StoreUnavailable`;
  a commit whose outcome was lost is read back (each line there, byte for byte, or not)
  before anything is sent again, so no line is lost or stored twice. Each outage is reported
  once through the process's hook (:func:`set_unavailable_hook`), and its end once;
* one lease-renewal loop per pool renews every lease the process holds in one statement;
* :meth:`StorePool.metrics` is a :class:`StoreMetrics` snapshot (a worker's status line).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar

try:  # the optional extra tether[postgres]; this module is imported without it too
    import psycopg
    from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]
    ConnectionPool = PoolClosed = PoolTimeout = None  # type: ignore[assignment,misc]

from tether._clock import SYSTEM_CLOCK, Clock
from tether._hub import Wake
from tether.errors import StoreUnavailable

__all__ = [
    "DEFAULT_POOL_SIZE",
    "RECONNECT_SECONDS",
    "CommitLost",
    "CommitRequest",
    "Lease",
    "StoreMetrics",
    "StorePool",
    "acquire",
    "installed",
    "pool_metrics",
    "say",
    "set_unavailable_hook",
]

DEFAULT_POOL_SIZE: Final = 10
RECONNECT_SECONDS: Final = 15.0
"""How long an operation keeps trying to reach the database before StoreUnavailable."""
CONNECT_TIMEOUT: Final = 5
MAX_BATCH: Final = 512
"""Commits one transaction takes at most (the rest are the next leader's)."""
MAX_BATCH_BYTES: Final = 8 << 20
"""And lines of at most this many bytes in all (one line alone may be longer)."""
_BACKOFF: Final = (0.05, 0.1, 0.2, 0.4, 0.8, 1.0)
QUIET_SECONDS = 1.0
"""An outage is over when an operation succeeds this long after the last failure: a restart
kills every pooled connection, and the borrowers find out one by one, so successes and
failures interleave for a moment; that is one outage, said once."""

T = TypeVar("T")
_log = logging.getLogger("tether.store")

SINGLE_COMMIT_SQL: Final = """
WITH advanced AS (
    UPDATE tether_sessions
       SET lines = lines + 1, operation = %(operation)s, pending = %(pending)s,
           blocked = false, updated_at = now(),
           lease_expires = now() + make_interval(secs => %(ttl)s)
     WHERE session_id = %(session)s AND lines = %(lines)s
       AND lease_epoch = %(epoch)s AND lease_owner = %(owner)s
    RETURNING session_id, lines
)
INSERT INTO tether_lines (session_id, line_no, data)
SELECT session_id, lines, %(data)b FROM advanced
"""
"""One session's commit: one statement (autocommit), so one transaction."""

GROUP_COMMIT_SQL: Final = """
WITH batch AS (
    SELECT * FROM unnest(%(sessions)s::text[], %(lines)s::bigint[], %(epochs)s::bigint[],
                         %(owners)s::text[], %(operations)s::text[], %(pendings)s::boolean[],
                         %(ttls)s::float8[], %(datas)b::bytea[])
        WITH ORDINALITY AS b(session_id, lines, epoch, owner, operation, pending, ttl, data, i)
),
advanced AS (
    UPDATE tether_sessions AS s
       SET lines = s.lines + 1, operation = b.operation, pending = b.pending,
           blocked = false, updated_at = now(),
           lease_expires = now() + make_interval(secs => b.ttl)
      FROM batch AS b
     WHERE s.session_id = b.session_id AND s.lines = b.lines
       AND s.lease_epoch = b.epoch AND s.lease_owner = b.owner
    RETURNING s.session_id, s.lines, b.data, b.i
),
stored AS (
    INSERT INTO tether_lines (session_id, line_no, data)
    SELECT session_id, lines, data FROM advanced
)
SELECT i FROM advanced
"""
"""Many sessions' commits in one statement, hence one transaction and one WAL flush. Each
row of the batch is fenced by its own session's count, epoch and owner (the join's
condition): a row that does not match advances nothing and inserts nothing. The answer is
the batch positions that landed (``i``: two writers of one session are told apart)."""

READ_BACK_SQL: Final = """
SELECT b.i, l.data FROM unnest(%(sessions)s::text[], %(line_nos)s::bigint[])
    WITH ORDINALITY AS b(session_id, line_no, i)
JOIN tether_lines AS l USING (session_id, line_no)
"""

RENEW_SQL: Final = """
WITH held AS (
    SELECT * FROM unnest(%(sessions)s::text[], %(owners)s::text[], %(ttls)s::float8[])
        AS h(session_id, owner, ttl)
),
free AS (
    SELECT s.session_id, h.ttl FROM tether_sessions AS s JOIN held AS h USING (session_id)
     WHERE s.lease_owner = h.owner
       FOR UPDATE OF s SKIP LOCKED
),
renewed AS (
    UPDATE tether_sessions AS s
       SET lease_expires = now() + make_interval(secs => f.ttl)
      FROM free AS f
     WHERE s.session_id = f.session_id
    RETURNING s.session_id
)
SELECT s.session_id, s.lease_owner, s.lease_epoch, r.session_id IS NOT NULL
  FROM tether_sessions AS s JOIN held AS h USING (session_id)
  LEFT JOIN renewed AS r USING (session_id)
 WHERE s.lease_owner = h.owner
"""
"""Every lease the process holds, of every opener (owner) and lease length, in one
statement: each row still ours, with whether it was renewed now.

A row another transaction holds is skipped, not waited for. That transaction is, in
practice, this process's own group commit, which renews the leases of its rows itself. A
group commit locks its rows in its batch's order and a renewal in its own: had the renewal
waited, the two could deadlock, and PostgreSQL would abort one of them (7 times in an hour
of the fleet tests with 1,000 sessions in flight). A skipped row still counts
as held, by its last committed owner and epoch: a lease another worker took is found lost
by the next renewal, and every commit is fenced by its epoch meanwhile."""


@dataclass(frozen=True, slots=True)
class StoreMetrics:
    """One snapshot of a process's pool (``PostgresSessions.metrics()``)."""

    pool_size: int
    """The most connections the pool opens (``pool_size``)."""
    connections_open: int
    """Connections open now (idle and in use)."""
    in_use: int
    """Connections borrowed now (a statement or transaction is running on each)."""
    waiting: int
    """Operations waiting for a connection now (back-pressure)."""
    commits: int
    """Session commits answered (stored or fenced) since the pool opened."""
    commit_transactions: int
    """Database transactions those commits took: ``commits / commit_transactions`` is the
    mean group-commit batch."""
    renewals: int
    """Lease-renewal statements run (each renews every lease of the process)."""
    retries: int
    """Operations tried again after a lost or refused connection."""


class CommitLost(Exception):
    """A commit's connection was lost and not regained in time: it was not stored."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(eq=False, slots=True)
class CommitRequest:
    """One session's line waiting for a transaction; answered with :attr:`stored`."""

    session_id: str
    lines: int
    """The session's line count this writer saw: the line becomes ``lines + 1``."""
    epoch: int
    owner: str
    operation: str
    pending: bool
    ttl: float
    data: bytes
    stored: bool | None = None
    error: BaseException | None = None
    done: bool = False
    wake: Wake | None = None
    """What the request waits on behind a leader; set to wake it alone (answered, or made
    the next leader). A session on a hub parks on it (tether._hub): its hub runs others."""
    leads: bool = False

    def params(self) -> dict[str, Any]:
        return {
            "operation": self.operation,
            "pending": self.pending,
            "ttl": self.ttl,
            "session": self.session_id,
            "lines": self.lines,
            "epoch": self.epoch,
            "owner": self.owner,
            "data": self.data,
        }


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease an opener holds: renewed by the pool's loop."""

    session_id: str
    owner: str
    ttl: float
    epoch: int


class LeaseHolder(Protocol):
    """An opener whose leases the pool renews."""

    lease_seconds: float

    def held_leases(self) -> list[Lease]: ...

    def leases_renewed(self, held: dict[tuple[str, str], int]) -> None:
        """After a renewal: ``held`` maps each (session, owner) still held to its epoch."""


def installed() -> bool:
    """Whether psycopg and psycopg-pool (the extra tether[postgres]) are installed."""
    return psycopg is not None and ConnectionPool is not None


def _batch_length(queue: Sequence[CommitRequest]) -> int:
    """How many of the queue's first requests one transaction takes (at least one)."""
    size = 0
    for n, request in enumerate(queue[:MAX_BATCH]):
        size += len(request.data)
        if size > MAX_BATCH_BYTES and n > 0:
            return n
    return min(len(queue), MAX_BATCH)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _log_hook(message: str) -> None:
    _log.warning("%s", message)


_hook: Callable[[str], None] = _log_hook


def say(message: str) -> None:
    """Tell the process's hook (see :func:`set_unavailable_hook`)."""
    _hook(message)


def set_unavailable_hook(hook: Callable[[str], None] | None) -> None:
    """Where the process's pools say "store unavailable, retrying …" (once per outage) and
    "store reachable again" (once at its end); ``None``: the ``tether.store`` logger."""
    global _hook
    _hook = hook or _log_hook


class GroupCommit:
    """Leader/follower group commit over one store function (:meth:`StorePool.commit`).

    The first committer with no leader ahead of it leads: it takes the queue's first
    requests (:func:`_batch_length`) and stores them with ``store``, which must answer each
    (``stored`` or ``error``). The others wait, each on a lock of its own: when a batch is
    answered, its members wake and the first request queued meanwhile is handed the lead, and
    nobody else wakes. (Waking every waiter after each transaction, as one condition does,
    cost a thread switch per waiter per commit: quadratic at a thousand sessions in flight.)
    A waiter that is a session on a worker's hub parks instead (:class:`tether._hub.Wake`):
    its hub goes on with its other sessions, so commits from every session of every hub
    queue up behind the leader and go in its next transaction.
    """

    def __init__(self, store: Callable[[list[CommitRequest]], None]) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._queue: list[CommitRequest] = []
        self._leading = False

    def commit(self, request: CommitRequest) -> bool:
        """Queue ``request``; lead or wait; whether it was stored. The leader's own
        exception (an interrupt, :class:`CommitLost`) is raised in every committer it
        answered with it."""
        wake: Wake | None = None
        with self._lock:
            self._queue.append(request)
            if self._leading:
                request.wake = wake = Wake()
            else:
                self._leading = request.leads = True
        if wake is not None:  # the wake as made: promotion clears the field
            try:
                wake.wait()
            except BaseException:
                self._give_up(request)
                raise
        if not request.done:
            with self._lock:
                taken = _batch_length(self._queue)
                batch, self._queue = self._queue[:taken], self._queue[taken:]
            try:
                self._store(batch)
            except BaseException as exc:  # an interrupt in the leader: nobody was answered
                for r in batch:
                    if r.stored is None and r.error is None:
                        r.error = exc
                raise
            finally:
                self._answer(batch)
        if request.error is not None:
            raise request.error
        return bool(request.stored)

    def _answer(self, batch: list[CommitRequest]) -> None:
        """Wake every request of ``batch`` but the leader's, and hand the lead to the first
        request queued meanwhile (or end it): each wakes alone."""
        with self._lock:
            for r in batch:
                r.done = True
            self._promote()
        for r in batch:
            if r.wake is not None:
                r.wake.set()

    def _promote(self) -> None:
        """(With the lock held) the first queued request leads next, woken; none: no leader."""
        if self._queue:
            first = self._queue[0]
            first.leads = True
            first.wake.set()  # type: ignore[union-attr]
            first.wake = None  # woken once: its batch's answer must not release it again
        else:
            self._leading = False

    def _give_up(self, request: CommitRequest) -> None:
        """A waiting committer was interrupted: out of the queue if it was still there (its
        line was never sent), and the lead passed on if it had just been handed it."""
        with self._lock:
            if request.done:
                return
            if request in self._queue:
                self._queue.remove(request)
            if request.leads:
                self._promote()


class StorePool:
    """The pool of one database in this process (see the module docstring)."""

    def __init__(self, url: str, where: str, size: int, waits: Clock, number: int) -> None:
        self.url = url
        self.where = where
        self.size = size
        self.waits = waits
        params = psycopg.conninfo.conninfo_to_dict(url)
        self.application_name = str(
            params.get("application_name") or f"tether-{os.getpid()}-{number}"
        )
        """How the pool's connections are named in ``pg_stat_activity`` (the URL's own
        ``application_name`` if it gives one)."""
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            url,
            min_size=1,
            max_size=size,
            kwargs={
                "autocommit": True,
                "connect_timeout": CONNECT_TIMEOUT,
                "application_name": self.application_name,
            },
            open=True,
            name=self.application_name,
            timeout=RECONNECT_SECONDS,
        )
        self.refs = 0
        self.migrated: set[int] = set()
        """The workspace-table schema versions already migrated through this pool."""
        self._counter_lock = threading.Lock()
        self.commits = 0
        self.transactions = 0
        self.renewals = 0
        self.retries = 0
        self._outage: float | None = None
        self._last_failure = 0.0
        self._outage_lock = threading.Lock()
        self._group = GroupCommit(self._store)
        self._renew_lock = threading.Lock()
        self._cursors: dict[int, tuple[psycopg.Connection[Any], psycopg.Cursor[Any]]] = {}
        """The leader's cursor on each pooled connection (only the leader uses them)."""
        # Lease renewal: one loop for every opener of the pool.
        self._holders: weakref.WeakSet[Any] = weakref.WeakSet()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    # ------------------------------------------------------------------ metrics

    def metrics(self) -> StoreMetrics:
        stats = self._pool.get_stats()
        open_now = int(stats.get("pool_size", 0))
        return StoreMetrics(
            pool_size=self.size,
            connections_open=open_now,
            in_use=open_now - int(stats.get("pool_available", 0)),
            waiting=int(stats.get("requests_waiting", 0)),
            commits=self.commits,
            commit_transactions=self.transactions,
            renewals=self.renewals,
            retries=self.retries,
        )

    def _count_retry(self) -> None:
        with self._counter_lock:  # any thread retries; only the leader counts commits
            self.retries += 1

    # ------------------------------------------------------------------ back-pressure

    def _unavailable(self, reason: str) -> None:
        """Say once per outage that the store is away and operations wait."""
        self._last_failure = time.monotonic()
        with self._outage_lock:  # held while saying it: the two messages alternate
            if self._outage is not None:
                return
            self._outage = time.monotonic()
            _hook(
                f"store {self.where} unavailable, retrying for up to {RECONNECT_SECONDS:g} s: "
                f"{reason}"
            )

    def _available(self) -> None:
        if self._outage is None or time.monotonic() - self._last_failure < QUIET_SECONDS:
            return
        with self._outage_lock:
            began, self._outage = self._outage, None
            if began is not None:
                _hook(f"store {self.where} reachable again after {time.monotonic() - began:.1f} s")

    def _lost(self, reason: str) -> None:
        """A connection failed: count it, say so, and drop the idle connections that died
        with it (a restart or ``pg_terminate_backend`` ends them all), so that the next
        borrowers get live ones."""
        self._count_retry()
        self._unavailable(reason)
        try:
            self._pool.check()
        except (psycopg.Error, PoolClosed):
            pass

    @contextmanager
    def connection(self, deadline: float | None = None) -> Iterator[psycopg.Connection[Any]]:
        """A connection for one statement or transaction; waits (back-pressure) while the
        pool is exhausted or the database refuses connections, until ``deadline``
        (monotonic; default :data:`RECONNECT_SECONDS` from now), then StoreUnavailable."""
        end = time.monotonic() + RECONNECT_SECONDS if deadline is None else deadline
        while True:
            try:
                conn = self._pool.getconn(timeout=max(0.05, min(2.0, end - time.monotonic())))
                break
            except PoolTimeout:
                if time.monotonic() >= end:
                    raise StoreUnavailable(
                        self.where, "no database connection could be had (refused or exhausted)"
                    ) from None
                self._count_retry()
                self._unavailable("no connection could be opened or borrowed")
            except PoolClosed:
                raise StoreUnavailable(self.where, "the store is closed") from None
        try:
            yield conn
        finally:
            self._pool.putconn(conn)

    def run(self, work: Callable[[psycopg.Connection[Any]], T], *, retry: bool = True) -> T:
        """``work(conn)`` on a borrowed connection. A lost connection: with ``retry`` (the
        work is idempotent) waits and runs it again until :data:`RECONNECT_SECONDS`, then
        (or at once without ``retry``) StoreUnavailable."""
        deadline = time.monotonic() + RECONNECT_SECONDS
        for attempt in range(1_000_000):
            try:
                with self.connection(deadline) as conn:
                    result = work(conn)
            except psycopg.OperationalError as exc:
                reason = _first_line(exc)
                self._lost(reason)
                if not retry or time.monotonic() >= deadline:
                    raise StoreUnavailable(self.where, reason) from None
                time.sleep(_BACKOFF[min(attempt, len(_BACKOFF) - 1)])
                continue
            self._available()
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    # ------------------------------------------------------------------ group commit

    def commit(self, request: CommitRequest) -> bool:
        """Store one session's line, in a transaction shared with every commit ready at the
        same moment: whether it was stored (``False``: fenced). :class:`CommitLost` when the
        database stayed away (nothing stored)."""
        return self._group.commit(request)

    def _store(self, batch: list[CommitRequest]) -> None:
        """Answer every request of ``batch``: stored, fenced, or the database stayed away."""
        # The common case first, with nothing around it: a connection is at hand and the
        # statement runs (a lone commit must cost what one statement costs).
        lost: str | None = None
        try:
            conn = self._pool.getconn(timeout=0.01)
        except (PoolTimeout, PoolClosed):
            pass
        else:
            try:
                landed = self._execute(conn, batch)
            except psycopg.Error as exc:  # the full path reads back, retries, answers each
                lost = _first_line(exc)
                if isinstance(exc, psycopg.OperationalError):
                    self._lost(lost)
            else:
                for i, r in enumerate(batch):
                    r.stored = i in landed
                self.commits += len(batch)  # only the leader counts these: no lock
                self.transactions += 1
                if self._outage is not None:
                    self._available()
                return
            finally:
                self._pool.putconn(conn)
        self._store_slowly(batch, lost)

    def _store_slowly(self, batch: list[CommitRequest], lost: str | None) -> None:
        """:meth:`_store` when a connection must be waited for or was lost: read back what
        may have landed, send the rest again, until the deadline."""
        pending = batch
        deadline = time.monotonic() + RECONNECT_SECONDS
        attempt = 0
        while pending:
            try:
                with self.connection(deadline) as conn:
                    if lost is not None:
                        pending = self._read_back(conn, pending)
                    if pending:
                        landed = self._execute(conn, pending)
                        for i, r in enumerate(pending):
                            r.stored = i in landed
                        self.commits += len(pending)
                        self.transactions += 1
                        pending = []
                self._available()
            except psycopg.OperationalError as exc:
                # Lost (or aborted: a deadlock with another process's batch): its outcome is
                # read back before anything is sent again.
                lost = _first_line(exc)
                self._lost(lost)
                if time.monotonic() >= deadline:
                    for r in pending:
                        r.error = CommitLost(lost)
                    return
                time.sleep(_BACKOFF[min(attempt, len(_BACKOFF) - 1)])
                attempt += 1
            except StoreUnavailable as exc:  # no connection at all until the deadline
                for r in pending:
                    r.error = CommitLost(lost or exc.why)
                return
            except psycopg.Error as exc:
                if len(pending) == 1:
                    pending[0].error = exc
                    return
                # Not the connection: one request's fault. Each alone, so that it is
                # answered with its own error and the others are stored.
                for r in pending:
                    self._store_slowly([r], lost=None)
                return

    def _execute(self, conn: psycopg.Connection[Any], batch: Sequence[CommitRequest]) -> set[int]:
        """The positions in ``batch`` that landed, in one statement (one transaction)."""
        if len(batch) == 1:
            cur = self._cursor(conn)
            cur.execute(SINGLE_COMMIT_SQL, batch[0].params(), prepare=True)
            return {0} if cur.rowcount == 1 else set()
        rows = conn.execute(
            GROUP_COMMIT_SQL,
            {
                "sessions": [r.session_id for r in batch],
                "lines": [r.lines for r in batch],
                "epochs": [r.epoch for r in batch],
                "owners": [r.owner for r in batch],
                "operations": [r.operation for r in batch],
                "pendings": [r.pending for r in batch],
                "ttls": [r.ttl for r in batch],
                "datas": [r.data for r in batch],
            },
            prepare=True,
        ).fetchall()
        return {int(row[0]) - 1 for row in rows}

    def _cursor(self, conn: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
        """The commit cursor of a pooled connection, made once: a cursor per statement
        costs more client time than the statement's own parameters (bench_postgres)."""
        known = self._cursors.get(id(conn))
        if known is not None and known[0] is conn:
            return known[1]
        if len(self._cursors) >= 2 * self.size:  # forget the connections the pool dropped
            self._cursors = {k: v for k, v in self._cursors.items() if not v[0].closed}
        cursor = conn.cursor()
        self._cursors[id(conn)] = (conn, cursor)
        return cursor

    def _read_back(
        self, conn: psycopg.Connection[Any], batch: list[CommitRequest]
    ) -> list[CommitRequest]:
        """Answer the requests whose line is in the database (stored if it is theirs byte
        for byte, fenced if another writer's); the rest, to be sent again."""
        rows = conn.execute(
            READ_BACK_SQL,
            {
                "sessions": [r.session_id for r in batch],
                "line_nos": [r.lines + 1 for r in batch],
            },
        ).fetchall()
        found = {int(i) - 1: bytes(data) for i, data in rows}
        rest = []
        for i, r in enumerate(batch):
            if i in found:
                r.stored = found[i] == r.data
                self.commits += 1
            else:
                rest.append(r)
        return rest

    # ------------------------------------------------------------------ lease renewal

    def hold_leases(self, holder: LeaseHolder) -> None:
        """Renew ``holder``'s leases from now on (the loop starts with the first)."""
        with self._renew_lock:
            self._holders.add(holder)
            if self._renewer is None or not self._renewer.is_alive():
                self._renewer = threading.Thread(
                    target=self._renew_loop, name="tether-lease-renewal", daemon=True
                )
                self._renewer.start()

    def _period(self) -> float:
        leases = [h.lease_seconds for h in list(self._holders)]
        return min(leases, default=30.0) / 3

    def _renew_loop(self) -> None:
        while not self.waits.wait(self._stop, self._period()):
            try:
                self.renew()
            except (StoreUnavailable, psycopg.Error):
                continue  # the database is away: the commits find out; try again later

    def renew(self, holders: Sequence[LeaseHolder] | None = None) -> int:
        """Renew every lease of ``holders`` (default: every opener of the pool) in one
        statement (:data:`RENEW_SQL`); how many were renewed now (the others a commit
        holds, or are lost)."""
        chosen = list(self._holders) if holders is None else list(holders)
        leases = [lease for h in chosen for lease in h.held_leases()]
        if not leases:
            return 0
        params = {
            "sessions": [x.session_id for x in leases],
            "owners": [x.owner for x in leases],
            "ttls": [x.ttl for x in leases],
        }
        rows = self.run(
            lambda conn: conn.execute(RENEW_SQL, params, prepare=True).fetchall(), retry=False
        )
        with self._counter_lock:
            self.renewals += 1
        held = {(str(sid), str(owner)): int(epoch) for sid, owner, epoch, _ in rows}
        for h in chosen:
            h.leases_renewed(held)
        return sum(1 for *_, now in rows if now)

    def forget(self, holder: LeaseHolder) -> None:
        self._holders.discard(holder)

    # ------------------------------------------------------------------ life

    def close(self) -> None:
        self._stop.set()
        renewer = self._renewer
        if renewer is not None and renewer is not threading.current_thread():
            renewer.join(timeout=5)
        self._pool.close(timeout=1.0)


# ---------------------------------------------------------------------- the process registry


@dataclass
class _Registry:
    lock: threading.Lock = field(default_factory=threading.Lock)
    pools: dict[tuple[int, str, int], StorePool] = field(default_factory=dict)
    made: int = 0


_REGISTRY: Final = _Registry()


def _key(url: str, waits: Clock) -> tuple[int, str, int]:
    # The pid: a forked child never uses its parent's connections. The clock: a test's fake
    # clock drives its own renewal loop.
    return (os.getpid(), url, id(waits))


def acquire(
    url: str,
    where: str,
    size: int | None = None,
    waits: Clock = SYSTEM_CLOCK,
    validate: Callable[[], None] | None = None,
) -> StorePool:
    """The process's pool of ``url`` (made now if there is none: ``validate`` first, to
    fail fast with one clear line on a bad URL or an unreachable server); give it back with
    :func:`release`. ``size`` (default :data:`DEFAULT_POOL_SIZE`) is the most connections;
    a later user asking for more grows it, never shrinks it."""
    key = _key(url, waits)
    with _REGISTRY.lock:
        pool = _REGISTRY.pools.get(key)
        if pool is None:
            if validate is not None:
                validate()
            _REGISTRY.made += 1
            pool = StorePool(url, where, size or DEFAULT_POOL_SIZE, waits, _REGISTRY.made)
            _REGISTRY.pools[key] = pool
        elif size is not None and size > pool.size:
            pool.size = size
            pool._pool.resize(min_size=1, max_size=size)
        pool.refs += 1
        return pool


def release(pool: StorePool) -> None:
    """Give back a pool from :func:`acquire`; the last user closes it."""
    with _REGISTRY.lock:
        pool.refs -= 1
        if pool.refs > 0:
            return
        for key, known in list(_REGISTRY.pools.items()):
            if known is pool:
                del _REGISTRY.pools[key]
    pool.close()


def pool_metrics(url: str) -> StoreMetrics | None:
    """The metrics of this process's pool of ``url`` (``None``: none is open)."""
    with _REGISTRY.lock:
        pool = _REGISTRY.pools.get(_key(url, SYSTEM_CLOCK))
    return None if pool is None else pool.metrics()
