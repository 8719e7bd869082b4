"""The PostgreSQL session store: one shared session log for many workers, leased and fenced.

:class:`PostgresSessions` is the :class:`~tether._stores.protocol.SessionOpener` over one
database (``postgresql://…``); :class:`PostgresSessionStore` is one open session. The rules
of :mod:`tether._stores.protocol` hold as in the file store, with a lease in place of the
``flock`` (the full protocol, with the SQL, is in ``docs/scale-out.md``):

* every committed line is stored exactly as the file store writes it (without its LF), one
  row of ``tether_lines`` per line, so a session exports to a session-v2 file
  (:func:`export_session`) and a file imports into a session (:func:`import_session`);
* a writer holds the session's **lease**: an owner, an **epoch** that only grows and an
  expiry computed from the database's clock (``now()``), never the worker's. Opening a
  session takes its lease when it is free or expired (incrementing the epoch); the
  process renews every lease it holds in the background (one ``UPDATE`` per renewal
  period for all of them, :mod:`tether._stores.pgpool`); closing the store releases it;
* every opener of one database in a process shares one bounded connection pool
  (``pool_size``, :mod:`tether._stores.pgpool`): a connection is borrowed for one statement
  or transaction, never held by an open session;
* a commit appends the line and advances the session's line count only if the count and
  the lease epoch are those this writer last saw; otherwise
  :class:`~tether.errors.SessionFenced` (exit 11) and nothing is stored. The store is
  unusable after that. Commits of different sessions ready at the same moment share one
  transaction (group commit), each fenced on its own;
* a connection lost during a commit is replaced and the commit's outcome read back
  from the database (the line is there, byte for byte, or it is not): a commit is never
  half-known. If the database stays away, :class:`~tether.errors.StoreUnavailable`;
* the schema has a version (``tether_meta``); a database without it or with a newer one is
  one clear line (:class:`~tether.errors.StoreSchemaError`, exit 12). ``tether store init``
  creates it.
"""

from __future__ import annotations

import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import unquote

from tether._clock import SYSTEM_CLOCK, Clock
from tether._ids import new_uuid7
from tether._loading import load_reducer
from tether._stores import pgpool
from tether._stores.pgpool import (
    DEFAULT_POOL_SIZE,
    RECONNECT_SECONDS,
    CommitLost,
    CommitRequest,
    Lease,
    StoreMetrics,
    StorePool,
)
from tether._stores.pgpool import SINGLE_COMMIT_SQL as COMMIT_SQL
from tether._stores.pgpool import acquire as acquire_pool
from tether._stores.pgpool import release as release_pool
from tether._stores.protocol import ClosesOnExit
from tether._stores.transaction import encode_header, encode_transaction
from tether.core.reducer import Reducer
from tether.core.state import IdleOperation, SessionState
from tether.errors import (
    AmbiguousSessionId,
    ConfigurationError,
    CorruptSession,
    FactRejected,
    SessionBusy,
    SessionCorruption,
    SessionFenced,
    SessionNotFound,
    StoreSchemaError,
    StoreUnavailable,
)

try:  # the optional extra tether[postgres]
    import psycopg
    from psycopg import errors as pg_errors
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]
    pg_errors = None  # type: ignore[assignment]

__all__ = [
    "COMMIT_SQL",
    "DEFAULT_LEASE_SECONDS",
    "DEFAULT_POOL_SIZE",
    "SCHEMA_VERSION",
    "STORE_URL_ENV",
    "PostgresSessionStore",
    "PostgresSessions",
    "SessionRow",
    "StoreMetrics",
    "display_url",
    "export_session",
    "import_session",
    "init_schema",
    "is_store_url",
]

_T = TypeVar("_T")

SCHEMA_VERSION: Final = 1
"""The version of the tables below; a database with a higher one is refused."""
STORE_URL_ENV: Final = "TETHER_STORE_URL"
DEFAULT_LEASE_SECONDS: Final = 30.0
CONNECT_TIMEOUT: Final = 5
PROOF_SHARE: Final = 0.5
"""For how much of its length a lease renewed by a commit is held without asking again
before an effect (:meth:`PostgresSessionStore.check_lease`)."""

SCHEMA_SQL: Final = """
CREATE TABLE IF NOT EXISTS tether_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);
CREATE TABLE IF NOT EXISTS tether_sessions (
    session_id    text PRIMARY KEY,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    environment   text NOT NULL,
    lines         bigint NOT NULL,
    operation     text NOT NULL,
    pending       boolean NOT NULL,
    blocked       boolean NOT NULL DEFAULT false,
    lease_owner   text,
    lease_epoch   bigint NOT NULL DEFAULT 0,
    lease_expires timestamptz
) WITH (fillfactor = 50);
-- No index holds a column every commit changes (lines, updated_at, lease_expires), so a
-- commit's UPDATE of the session row is a heap-only (HOT) update: no index is written.
CREATE INDEX IF NOT EXISTS tether_sessions_queue
    ON tether_sessions (environment) WHERE pending AND NOT blocked;
-- No foreign key to tether_sessions: a line is only ever inserted by the commit statement,
-- which needs the session's row, and the key check would lock that row a second time.
CREATE TABLE IF NOT EXISTS tether_lines (
    session_id text NOT NULL,
    line_no    bigint NOT NULL,
    data       bytea NOT NULL,
    PRIMARY KEY (session_id, line_no)
);
CREATE TABLE IF NOT EXISTS tether_sidecars (
    session_id text NOT NULL REFERENCES tether_sessions ON DELETE CASCADE,
    name       text NOT NULL,
    data       bytea NOT NULL,
    PRIMARY KEY (session_id, name)
);
"""

ACQUIRE_SQL: Final = """
UPDATE tether_sessions
   SET lease_owner = %(owner)s, lease_epoch = lease_epoch + 1,
       lease_expires = now() + make_interval(secs => %(ttl)s)
 WHERE session_id = %(session)s
   AND (lease_owner IS NULL OR lease_expires <= now())
RETURNING lease_epoch, lines
"""

CLAIM_SQL: Final = """
WITH candidate AS (
    SELECT session_id FROM tether_sessions
     WHERE pending AND NOT blocked AND environment = %(environment)s
       AND (lease_owner IS NULL OR lease_expires <= now())
     ORDER BY updated_at
     LIMIT %(limit)s
     FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE tether_sessions AS s
       SET lease_owner = %(owner)s, lease_epoch = s.lease_epoch + 1,
           lease_expires = now() + make_interval(secs => %(ttl)s)
      FROM candidate
     WHERE s.session_id = candidate.session_id
    RETURNING s.session_id, s.lease_epoch, s.lines, s.updated_at
)
SELECT c.session_id, c.lease_epoch, c.lines, l.data
  FROM claimed AS c
  LEFT JOIN tether_lines AS l ON l.session_id = c.session_id AND l.line_no <= c.lines
 ORDER BY c.updated_at, c.session_id, l.line_no
"""
"""The queue: up to ``limit`` unfinished sessions of this environment whose leases are free or
expired, oldest first, with their logs (a row per line): opening a claimed session then
needs no statement of its own (:meth:`PostgresSessions.open_claimed`)."""


def is_store_url(value: str) -> bool:
    """Whether ``value`` names a PostgreSQL store (``postgresql://`` or ``postgres://``)."""
    return value.startswith(("postgresql://", "postgres://"))


def display_url(url: str) -> str:
    """``url`` as the user gave it, minus any password, for messages and printed commands.

    Only the password goes (the one after ``user:`` in the authority, and a ``password``
    query parameter); everything else stays as written, so a printed ``--store`` still
    names the same server, socket, database and options: ``postgresql:///db?host=/sock``
    stays a Unix-socket URL (rebuilding it from its parts gave
    ``postgresql://postgres@/sock/db``, which does not connect), and ``options=`` (a
    ``search_path``) is kept. A URL libpq cannot parse is not shown at all (it may hold a
    password in a form this cannot find).
    """
    if psycopg is None:  # pragma: no cover - without the extra
        return url.split("@")[-1]  # type: ignore[unreachable]
    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql://(unparsable URL)"
    scheme, sep, rest = url.partition("://")
    if not sep:  # a key=value conninfo string: never printed as it is
        return "postgresql://(not a URL)"
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    if "@" in authority:
        userinfo, _, hostport = authority.rpartition("@")
        user = userinfo.partition(":")[0]
        authority = f"{user}@{hostport}" if user else hostport
    path, qmark, query = tail.partition("?")
    if qmark:
        query, hash_, fragment = query.partition("#")
        kept = [
            pair
            for pair in query.split("&")
            if unquote(pair.partition("=")[0]).strip().lower() != "password"
        ]
        query = "&".join(kept)
        tail = f"{path}?{query}{hash_}{fragment}" if query else f"{path}{hash_}{fragment}"
    return f"{scheme}://{authority}{tail}"


def _elapsed() -> float:
    """Seconds on a clock that counts a suspend and a stopped process (``CLOCK_BOOTTIME``),
    or ``-inf`` where there is none: then no commit proves a lease (see
    :meth:`PostgresSessionStore.check_lease`). Not the injected clock: this measures how
    long the real world may have gone on, as the lease's expiry (the database's clock) does."""
    return time.clock_gettime(_BOOTTIME) if _BOOTTIME is not None else -math.inf


_BOOTTIME: Final = getattr(time, "CLOCK_BOOTTIME", None)


def _proof_until(sent: float, lease_seconds: float) -> float:
    """Until when (on :func:`_elapsed`) a lease renewed by a statement sent at ``sent``
    proves itself held (:data:`PROOF_SHARE` of it)."""
    return sent + lease_seconds * PROOF_SHARE


def _require_driver() -> None:
    if psycopg is None or not pgpool.installed():
        raise ConfigurationError(
            "a postgresql:// store needs psycopg and psycopg-pool: install tether[postgres]"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def connect(url: str) -> psycopg.Connection[Any]:
    """An autocommit connection to ``url``; one clear error when that is not possible."""
    _require_driver()
    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"store URL is malformed: {_first_line(exc)}") from None
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT)
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"store URL {display_url(url)}: {_first_line(exc)}") from None
    except psycopg.Error as exc:
        error = StoreUnavailable(display_url(url), f"cannot connect: {_first_line(exc)}")
        error.args = (f"store {display_url(url)}: cannot connect: {_first_line(exc)}",)
        raise error from None


_BUSY_SERVER: Final = (
    "too many clients",
    "remaining connection slots are reserved",
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
)
"""What a server says when it refuses connections for now (full, restarting): waited out."""


def _validate(url: str) -> None:
    """Connect once before a pool is made: a bad URL or an unreachable server is one clear
    line at once (a pool would only keep trying in the background). A server that is full
    or restarting is waited for (back-pressure, said once) until the reconnect deadline."""
    deadline = time.monotonic() + RECONNECT_SECONDS
    said = False
    while True:
        try:
            connect(url).close()
            return
        except StoreUnavailable as exc:
            busy = any(text in str(exc) for text in _BUSY_SERVER)
            if not busy or time.monotonic() >= deadline:
                raise
            if not said:
                said = True
                pgpool.say(f"store {display_url(url)} unavailable, retrying: {exc.why}")
            time.sleep(0.5)


def check_schema(conn: psycopg.Connection[Any], url: str) -> None:
    """Refuse a database without tether's schema or with a newer one."""
    try:
        row = conn.execute("SELECT value FROM tether_meta WHERE key = 'schema_version'").fetchone()
    except pg_errors.UndefinedTable:
        row = None
    if row is None:
        raise StoreSchemaError(
            f"database {display_url(url)} has no tether schema: create it with "
            "`tether store init --store URL`"
        )
    try:
        version = int(row[0])
    except ValueError:
        version = -1
    if version > SCHEMA_VERSION:
        raise StoreSchemaError(
            f"database {display_url(url)} has tether schema version {row[0]}, newer than this "
            f"tether supports ({SCHEMA_VERSION}): upgrade tether"
        )
    if version < 1:
        raise StoreSchemaError(
            f"database {display_url(url)} has an unknown tether schema version {row[0]!r}"
        )


def init_schema(url: str) -> bool:
    """Create tether's tables in the database (idempotent); whether they were created now."""
    with connect(url) as conn:
        try:
            row = conn.execute(
                "SELECT value FROM tether_meta WHERE key = 'schema_version'"
            ).fetchone()
        except pg_errors.UndefinedTable:
            row = None
        if row is not None:
            check_schema(conn, url)
            return False
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(7403121)")  # one initializer at a time
            conn.execute(SCHEMA_SQL)
            conn.execute(
                "INSERT INTO tether_meta (key, value) VALUES ('schema_version', %s) "
                "ON CONFLICT (key) DO NOTHING",
                (str(SCHEMA_VERSION),),
            )
        return True


def _operation(state: SessionState) -> tuple[str, bool]:
    operation = state.operation
    return operation.kind, not isinstance(operation, IdleOperation)


def _operation_after(
    before: tuple[str, bool], committed: Sequence[Mapping[str, Any]]
) -> tuple[str, bool]:
    """The current operation's kind and whether one is unfinished, after ``committed``
    (a validated transaction: only these records start or finish an operation)."""
    kind, pending = before
    for fact in committed:
        record = fact.get("record")
        if not isinstance(record, Mapping):
            continue
        if record.get("type") in ("runStarted", "compactionStarted"):
            kind, pending = str(record.get("operationKind")), True
        elif record.get("type") == "operationFinished":
            kind, pending = "idle", False
    return kind, pending


@dataclass(frozen=True, slots=True)
class SessionRow:
    """One line of ``tether sessions --store URL``."""

    session_id: str
    created_at: str
    operation: str
    pending: bool
    lines: int
    environment: str
    lease_owner: str | None
    lease_epoch: int
    lease_expires: str | None
    lease_live: bool
    blocked: bool = False

    @property
    def status(self) -> str:
        """``idle``, ``queued`` (unfinished, no live lease), ``running`` or ``blocked``."""
        if not self.pending:
            return "idle"
        if self.blocked:
            return "blocked"
        return "running" if self.lease_live else "queued"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.session_id,
            "created": self.created_at,
            "status": self.status,
            "operation": self.operation,
            "lines": self.lines,
            "environment": self.environment,
            "leaseOwner": self.lease_owner,
            "leaseEpoch": self.lease_epoch,
            "leaseExpires": self.lease_expires,
        }


@dataclass
class _Held:
    epoch: int
    lines: int
    fetched: list[Any] | None = None
    """A claimed session's lines as the claim read them, until it is opened."""
    fresh_until: float = -math.inf
    """Until when (on ``_elapsed``) the claim's lease proves that nobody else wrote since."""


class PostgresSessions(ClosesOnExit):
    """The opener over one database: creates, opens (leases) and lists sessions.

    ``cwd`` is the header's ``cwd`` of the sessions it creates; ``owner`` names this writer
    in leases (default: host, pid and a random suffix); ``lease_seconds`` is the lease's
    length, renewed every third of it while the store is open; ``clock`` gives the log's
    timestamps and ``waits`` the renewal's pauses (a test's
    :class:`~tether.testing.clock.FakeClock` renews when it is advanced; the lease's expiry
    itself is always the database's clock).

    Every opener of the same URL (and ``waits``) in a process shares one connection pool of
    at most ``pool_size`` connections, one group committer and one lease-renewal loop
    (:mod:`tether._stores.pgpool`): a worker builds one opener per agent and still holds
    ``pool_size`` connections in all. The pool is closed with its last opener. A larger
    ``pool_size`` than the pool's grows it.
    """

    def __init__(
        self,
        url: str,
        cwd: str = "/",
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        owner: str | None = None,
        clock: Callable[[], int] = SYSTEM_CLOCK.now_ms,
        ids: Callable[[], str] = new_uuid7,
        waits: Clock = SYSTEM_CLOCK,
        pool_size: int | None = None,
    ) -> None:
        if not lease_seconds > 0:
            raise ConfigurationError(f"lease seconds must be positive, got {lease_seconds!r}")
        if pool_size is not None and (isinstance(pool_size, bool) or not pool_size >= 1):
            raise ConfigurationError(f"pool size must be a positive integer, got {pool_size!r}")
        self.url = url
        self.where = display_url(url)
        self.cwd = cwd
        self.lease_seconds = float(lease_seconds)
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.clock = clock
        self.ids = ids
        self.waits = waits
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}
        self._claimed: set[str] = set()
        self._lost: set[str] = set()
        self.renewals = 0
        """Renewal statements that renewed a lease of this opener."""
        self._pool: StorePool = acquire_pool(
            url, self.where, pool_size, waits, validate=lambda: _validate(url)
        )
        self._closed = False
        try:
            self._pool.run(lambda conn: check_schema(conn, url))
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ plumbing

    @property
    def pool(self) -> StorePool:
        """The process's pool of this database, shared with every opener of the URL."""
        return self._pool

    @property
    def application_name(self) -> str:
        """How this process's connections to the store appear in ``pg_stat_activity``."""
        return self._pool.application_name

    def metrics(self) -> StoreMetrics:
        """The process's pool, commits, renewals and retries now (shared by every opener
        of the database in the process: a worker's status line)."""
        return self._pool.metrics()

    @contextmanager
    def _db(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection of the pool for one statement or transaction (not retried: for
        statements that must not run twice); a lost connection is StoreUnavailable."""
        try:
            with self._pool.connection() as conn:
                yield conn
        except psycopg.OperationalError as exc:
            self._pool._lost(_first_line(exc))
            raise StoreUnavailable(self.where, _first_line(exc)) from None

    def _run(self, work: Callable[[psycopg.Connection[Any]], _T]) -> _T:
        """``work`` on a connection of the pool, run again after a lost connection (it
        must be idempotent: a read, a release) until the database is back or the deadline."""
        return self._pool.run(work)

    def _start_renewer(self) -> None:
        self._pool.hold_leases(self)

    def held_leases(self) -> list[Lease]:
        """The leases this opener holds (the pool's renewal loop renews them)."""
        with self._lock:
            return [
                Lease(sid, self.owner, self.lease_seconds, held.epoch)
                for sid, held in self._held.items()
            ]

    def leases_renewed(self, held: dict[tuple[str, str], int]) -> None:
        """After a renewal: a lease not held at its epoch is lost."""
        with self._lock:
            mine = False
            for sid, lease in self._held.items():
                epoch = held.get((sid, self.owner))
                mine = mine or epoch is not None
                if epoch != lease.epoch:
                    self._lost.add(sid)
            if mine:
                self.renewals += 1

    def renew_now(self) -> int:
        """Renew every lease this opener holds now (the benchmark's unit); how many."""
        return self._pool.renew([self])

    def lease_lost(self, session_id: str) -> bool:
        """Whether the renewal found this opener's lease on the session gone."""
        with self._lock:
            return session_id in self._lost

    def _release(self, session_id: str, epoch: int) -> None:
        with self._lock:
            self._held.pop(session_id, None)
            self._lost.discard(session_id)
            self._claimed.discard(session_id)
        try:
            self._run(
                lambda conn: conn.execute(
                    "UPDATE tether_sessions SET lease_owner = NULL, lease_expires = NULL "
                    "WHERE session_id = %s AND lease_epoch = %s AND lease_owner = %s",
                    (session_id, epoch, self.owner),
                )
            )
        except (StoreUnavailable, ConfigurationError, psycopg.Error):
            pass  # else the lease expires on its own

    # ------------------------------------------------------------------ opener

    def _new_header(
        self, provider: str, model: str, environment_identity: str
    ) -> tuple[str, bytes, Reducer]:
        """A new session's id, its header line and the reducer that accepted it."""
        session_id = self.ids()
        data, reducer = encode_header(
            session_id=session_id,
            created_at=self.clock(),
            cwd=self.cwd,
            provider=provider,
            model=model,
            environment_identity=environment_identity,
        )
        return session_id, data, reducer

    def create(
        self, *, provider: str, model: str, environment_identity: str
    ) -> PostgresSessionStore:
        session_id, data, reducer = self._new_header(provider, model, environment_identity)
        self._insert(session_id, environment_identity, [data.rstrip(b"\n")], reducer.state)
        return self._adopt(reducer, epoch=1, lines=1)

    def _insert(
        self, session_id: str, environment: str, lines: list[bytes], state: SessionState
    ) -> None:
        operation, pending = _operation(state)
        with self._db() as conn, conn.transaction():
            try:
                conn.execute(
                    "INSERT INTO tether_sessions (session_id, environment, lines, operation, "
                    "pending, lease_owner, lease_epoch, lease_expires) VALUES "
                    "(%s, %s, %s, %s, %s, %s, 1, now() + make_interval(secs => %s))",
                    (
                        session_id,
                        environment,
                        len(lines),
                        operation,
                        pending,
                        self.owner,
                        self.lease_seconds,
                    ),
                )
            except pg_errors.UniqueViolation:
                raise ConfigurationError(
                    f"session {session_id} already exists in {self.where}"
                ) from None
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO tether_lines (session_id, line_no, data) VALUES (%s, %s, %s)",
                    [(session_id, n, line) for n, line in enumerate(lines, start=1)],
                )

    def create_queued(
        self,
        runs: Sequence[Sequence[Mapping[str, Any]]],
        *,
        provider: str,
        model: str,
        environment_identity: str,
    ) -> list[str]:
        """New sessions in one database transaction (``tether submit --from``): each holds
        its header and one transaction of the facts of ``runs[i]`` (a user entry and
        ``runStarted``), validated by the reducer before anything is sent, and no lease
        (queued for any worker at once, as a single submit leaves it). All of them are
        committed or none; their ids, in order. The rows and lines go by ``COPY`` (one
        round trip per table, one WAL flush for the batch)."""
        rows: list[tuple[str, str, int, str, bool, int]] = []
        lines: list[tuple[str, int, bytes]] = []
        for facts in runs:
            session_id, data, reducer = self._new_header(provider, model, environment_identity)
            _, line = encode_transaction(reducer, facts, clock=self.clock, new_id=self.ids)
            try:
                reducer.apply(line)
            except SessionCorruption as exc:
                raise FactRejected(exc.code, exc.line, exc.seq, exc.detail) from None
            operation, pending = _operation(reducer.state)
            rows.append((session_id, environment_identity, 2, operation, pending, 1))
            lines.append((session_id, 1, data.rstrip(b"\n")))
            lines.append((session_id, 2, line))
        if not rows:
            return []
        with self._db() as conn, conn.transaction(), conn.cursor() as cur:
            with cur.copy(
                "COPY tether_sessions (session_id, environment, lines, operation, pending, "
                "lease_epoch) FROM STDIN"
            ) as copy:
                for row in rows:
                    copy.write_row(row)
            with cur.copy("COPY tether_lines (session_id, line_no, data) FROM STDIN") as copy:
                for item in lines:
                    copy.write_row(item)
        return [row[0] for row in rows]

    def _adopt(self, reducer: Reducer, *, epoch: int, lines: int) -> PostgresSessionStore:
        session_id = reducer.state.header.id
        with self._lock:
            self._held[session_id] = _Held(epoch, lines)
            self._lost.discard(session_id)
        self._start_renewer()
        try:
            return PostgresSessionStore(self, reducer, epoch=epoch, lines=lines)
        except BaseException:
            self._release(session_id, epoch)
            raise

    def resolve(self, session: str) -> str:
        """The id of the session ``session`` names (its id or a unique prefix of it)."""
        pattern = session.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self._run(
            lambda conn: conn.execute(
                "SELECT session_id FROM tether_sessions WHERE session_id LIKE %s "
                "ORDER BY session_id LIMIT 6",
                (pattern,),
            ).fetchall()
        )
        ids = [str(r[0]) for r in rows]
        if session in ids:
            return session
        if not ids:
            raise SessionNotFound(session, self.where)
        if len(ids) > 1:
            raise AmbiguousSessionId(session, ids)
        return ids[0]

    def open(self, session: str) -> PostgresSessionStore:
        """Take the session's lease (free or expired: the epoch grows) and read its log;
        a session this opener claimed (:meth:`claim`) is opened under the claim's lease."""
        with self._lock:
            claimed = session in self._claimed  # a full id: no query to resolve it
        session_id = session if claimed else self.resolve(session)
        with self._lock:
            claimed = session_id in self._claimed
            self._claimed.discard(session_id)
        if claimed:
            return self.open_claimed(session_id)
        with self._db() as conn:
            row = conn.execute(
                ACQUIRE_SQL,
                {"owner": self.owner, "ttl": self.lease_seconds, "session": session_id},
            ).fetchone()
            if row is None:
                holder = conn.execute(
                    "SELECT lease_owner, lease_expires FROM tether_sessions WHERE session_id = %s",
                    (session_id,),
                ).fetchone()
        if row is None:
            busy = SessionBusy(f"{self.where}/{session_id}", None)
            if holder is not None:
                busy.args = (
                    f"session {session_id} is leased by {holder[0]} until {holder[1]} "
                    "(database clock); it can be taken over once the lease expires",
                )
            raise busy
        epoch, lines = int(row[0]), int(row[1])
        return self._load(session_id, epoch, lines)

    def open_claimed(self, session_id: str) -> PostgresSessionStore:
        """Open a session this opener claimed (:meth:`claim`), keeping the claim's lease."""
        with self._lock:
            held = self._held.get(session_id)
            fetched = None if held is None else held.fetched
            if held is not None:
                held.fetched = None
        if held is None:
            return self.open(session_id)
        if fetched is not None and _elapsed() < held.fresh_until:
            # Read by the claim, under a lease it took less than half a lease ago: no other
            # writer can have committed since (each commit is fenced by the lease's epoch).
            return self._load(session_id, held.epoch, held.lines, fetched)
        try:
            # The lease check and the log in one round trip: no row means fenced.
            rows = self._run(
                lambda conn: conn.execute(
                    "SELECT s.lines, l.data FROM tether_sessions s LEFT JOIN tether_lines l "
                    "ON l.session_id = s.session_id AND l.line_no <= s.lines "
                    "WHERE s.session_id = %s AND s.lease_owner = %s AND s.lease_epoch = %s "
                    "ORDER BY l.line_no",
                    (session_id, self.owner, held.epoch),
                ).fetchall()
            )
        except BaseException:
            self._release(session_id, held.epoch)
            raise
        if not rows:
            with self._lock:
                self._held.pop(session_id, None)
            raise SessionFenced(session_id, held.epoch, "was taken over before the session opened")
        lines = int(rows[0][0])
        return self._load(session_id, held.epoch, lines, [r[1] for r in rows if r[1] is not None])

    def _load(
        self, session_id: str, epoch: int, lines: int, fetched: list[Any] | None = None
    ) -> PostgresSessionStore:
        """Reduce the session's first ``lines`` lines (``fetched``: already read, in order)."""
        try:
            data_rows = fetched
            if data_rows is None:
                rows = self._run(
                    lambda conn: conn.execute(
                        "SELECT line_no, data FROM tether_lines WHERE session_id = %s "
                        "AND line_no <= %s ORDER BY line_no",
                        (session_id, lines),
                    ).fetchall()
                )
                data_rows = [r[1] for r in rows]
            data = b"".join(bytes(r) + b"\n" for r in data_rows)
            if len(data_rows) != lines:
                raise CorruptSession(
                    f"{self.where}/{session_id}",
                    "MISSING_LINES",
                    len(data_rows) + 1,
                    detail=f"{len(data_rows)} of {lines} lines present",
                )
            try:
                reducer = load_reducer(data)
            except SessionCorruption as exc:
                raise CorruptSession.wrap(f"{self.where}/{session_id}", exc) from None
        except BaseException:
            self._release(session_id, epoch)
            raise
        return self._adopt(reducer, epoch=epoch, lines=lines)

    def claim(self, environment: str) -> str | None:
        """Lease the oldest unfinished session of ``environment`` whose lease is free or
        expired (``FOR UPDATE SKIP LOCKED``: concurrent workers never claim the same one);
        its id, or ``None`` when there is none. Open it with :meth:`open_claimed`."""
        claimed = self.claim_many(environment, 1)
        return claimed[0] if claimed else None

    def claim_many(self, environment: str, limit: int) -> list[str]:
        """:meth:`claim` of up to ``limit`` sessions in one statement (a worker filling
        many free slots; one round trip each made its dispatcher the bottleneck)."""
        sent = _elapsed()
        with self._db() as conn:
            rows = conn.execute(
                CLAIM_SQL,
                {
                    "environment": environment,
                    "owner": self.owner,
                    "ttl": self.lease_seconds,
                    "limit": max(1, limit),
                },
            ).fetchall()
        fresh_until = _proof_until(sent, self.lease_seconds)
        claimed: dict[str, _Held] = {}
        for session_id, epoch, lines, data in rows:
            held = claimed.get(session_id)
            if held is None:
                held = claimed[session_id] = _Held(int(epoch), int(lines), [], fresh_until)
            if data is not None:
                assert held.fetched is not None
                held.fetched.append(data)
        with self._lock:
            for session_id, held in claimed.items():
                if held.fetched is not None and len(held.fetched) != held.lines:
                    held.fetched = None  # (a commit that raced the claim's lock) read again
                self._held[session_id] = held
                self._claimed.add(session_id)
        if claimed:
            self._start_renewer()
        return list(claimed)

    def waiting(self, environment: str) -> int:
        """How many unfinished, unblocked sessions of ``environment`` there are (leased or
        not): a worker told to stop when the queue is empty waits while any is left."""
        row = self._run(
            lambda conn: conn.execute(
                "SELECT count(*) FROM tether_sessions WHERE pending AND NOT blocked "
                "AND environment = %s",
                (environment,),
            ).fetchone()
        )
        return 0 if row is None else int(row[0])

    def park(self, session_id: str) -> None:
        """Take a session whose recovery is blocked (a gate, a review) out of the queue
        until its next commit (a person resolving it, ``tether resume``); only while
        nobody holds its lease."""
        self._run(
            lambda conn: conn.execute(
                "UPDATE tether_sessions SET blocked = true WHERE session_id = %s "
                "AND (lease_owner IS NULL OR lease_expires <= now())",
                (session_id,),
            )
        )

    def release_claim(self, session_id: str) -> None:
        """Give back a claimed session that will not be opened."""
        with self._lock:
            held = self._held.get(session_id)
        if held is not None:
            self._release(session_id, held.epoch)

    def sessions(self) -> list[SessionRow]:
        """Every session, oldest first, with its status and lease."""
        rows = self._run(
            lambda conn: conn.execute(
                "SELECT session_id, created_at, operation, pending, lines, "
                "environment, lease_owner, lease_epoch, lease_expires, "
                "(lease_owner IS NOT NULL AND lease_expires > now()), blocked "
                "FROM tether_sessions ORDER BY created_at, session_id"
            ).fetchall()
        )
        return [
            SessionRow(
                session_id=str(r[0]),
                created_at=r[1].isoformat(),
                operation=str(r[2]),
                pending=bool(r[3]),
                lines=int(r[4]),
                environment=str(r[5]),
                lease_owner=None if r[6] is None else str(r[6]),
                lease_epoch=int(r[7]),
                lease_expires=None if r[8] is None else r[8].isoformat(),
                lease_live=bool(r[9]),
                blocked=bool(r[10]),
            )
            for r in rows
        ]

    def log_bytes(self, session: str) -> bytes:
        """The committed lines of a session as the file store holds them (LF after each)."""
        session_id = self.resolve(session)
        rows = self._run(
            lambda conn: conn.execute(
                "SELECT data FROM tether_lines l JOIN tether_sessions s USING (session_id) "
                "WHERE session_id = %s AND line_no <= s.lines ORDER BY line_no",
                (session_id,),
            ).fetchall()
        )
        return b"".join(bytes(r[0]) + b"\n" for r in rows)

    def import_log(self, data: bytes) -> str:
        """Store a session-v2 log as a new session (idle or not); its id."""
        try:
            reducer = load_reducer(data)
        except SessionCorruption as exc:
            raise CorruptSession.wrap("the imported file", exc) from None
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        if len(lines) != reducer.line_count:
            raise CorruptSession("the imported file", "TORN_LINE", len(lines), detail="no LF")
        header = reducer.state.header
        self._insert(header.id, header.environment_identity, lines, reducer.state)
        self._release(header.id, 1)
        return header.id

    def close(self) -> None:
        """Stop renewing this opener's leases and give its share of the pool back (the
        last opener of the database closes the pool; open stores should be closed first).
        Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.forget(self)
        release_pool(self._pool)


@dataclass(frozen=True, slots=True)
class PostgresSidecar:
    """A session's record in ``tether_sidecars``."""

    sessions: PostgresSessions
    session_id: str
    name: str

    @property
    def location(self) -> str:
        return f"{self.sessions.where} tether_sidecars ({self.session_id}, {self.name})"

    def exists(self) -> bool:
        return self.read()[0] is not None

    def read(self) -> tuple[bytes | None, str | None]:
        try:
            row = self.sessions._run(
                lambda conn: conn.execute(
                    "SELECT data FROM tether_sidecars WHERE session_id = %s AND name = %s",
                    (self.session_id, self.name),
                ).fetchone()
            )
        except (StoreUnavailable, psycopg.Error) as exc:
            return None, str(exc)
        return (None if row is None else bytes(row[0])), None

    def write(self, data: bytes) -> None:
        try:  # an upsert of the whole record: run again after a lost connection
            self.sessions._run(
                lambda conn: conn.execute(
                    "INSERT INTO tether_sidecars (session_id, name, data) VALUES (%s, %s, %s) "
                    "ON CONFLICT (session_id, name) DO UPDATE SET data = EXCLUDED.data",
                    (self.session_id, self.name, data),
                )
            )
        except (StoreUnavailable, psycopg.Error) as exc:
            raise OSError(str(exc)) from None


class PostgresSessionStore(ClosesOnExit):
    """One session of a :class:`PostgresSessions`, open for writing under its lease."""

    read_only: bool = False
    repaired: int = 0

    def __init__(
        self, sessions: PostgresSessions, reducer: Reducer, *, epoch: int, lines: int
    ) -> None:
        self._sessions = sessions
        self._reducer = reducer
        self.session_id = reducer.state.header.id
        self.path = Path(f"{sessions.where}/{self.session_id}")
        self.fencing_token = epoch
        """The lease epoch: checked in every commit, passed to effect tools."""
        self._lines = lines
        self._mutex = threading.Lock()
        self._closed = False
        self._failed: str | None = None
        # The session row's operation columns as of the last commit, carried forward by
        # _operation_after: reading them off the reduced state would build a state
        # snapshot for every commit.
        self._operation = _operation(reducer.state)
        # Until when (on _elapsed) a commit of this writer proves its lease held: see
        # check_lease. Never, until a commit succeeds.
        self._proven_until = -math.inf

    @property
    def state(self) -> SessionState:
        with self._mutex:
            return self._reducer.state

    @property
    def closed(self) -> bool:
        return self._closed

    def commit(
        self, facts: Sequence[Mapping[str, Any]], *, sync: bool = True
    ) -> list[dict[str, Any]]:
        """Encode, validate, then store one transaction in one fenced statement.

        ``sync`` changes nothing: every commit is a synchronous database commit, shared with
        the commits of other sessions of the process ready at the same moment (group
        commit, :mod:`tether._stores.pgpool`); it returns once that transaction committed."""
        with self._mutex:
            if self._closed:
                raise StoreUnavailable(str(self.path), "the store is closed")
            if self._failed is not None:
                raise StoreUnavailable(str(self.path), self._failed)
            reducer = self._reducer
            before = self._operation
            committed, line = encode_transaction(
                reducer, facts, clock=self._sessions.clock, new_id=self._sessions.ids
            )
            try:
                pending = reducer.begin(line)
            except SessionCorruption as exc:
                raise FactRejected(exc.code, exc.line, exc.seq, exc.detail) from None
            try:
                operation, busy = _operation_after(before, committed)
                sent = _elapsed()  # before the statement: its now() is later
                stored = self._store(line, operation, busy)
            except BaseException:
                pending.rollback()
                raise
            if not stored:
                pending.rollback()
                self._failed = "fenced: this writer lost its lease"
                raise self._fenced()
            pending.commit()
            self._lines += 1
            self._operation = (operation, busy)
            self._proven_until = _proof_until(sent, self._sessions.lease_seconds)
            return committed

    def _store(self, line: bytes, operation: str, pending: bool) -> bool:
        """Whether the line was stored (``False``: fenced). A connection lost during the
        statement is replaced and the outcome read back (:meth:`StorePool.commit`)."""
        sessions = self._sessions
        request = CommitRequest(
            session_id=self.session_id,
            lines=self._lines,
            epoch=self.fencing_token,
            owner=sessions.owner,
            operation=operation,
            pending=pending,
            ttl=sessions.lease_seconds,
            data=line,
        )
        try:
            return sessions.pool.commit(request)
        except CommitLost as exc:
            self._failed = f"the database connection was lost ({exc.reason})"
            raise StoreUnavailable(
                str(self.path),
                f"the database connection was lost ({exc.reason}) and not regained; "
                "the transaction was not committed",
            ) from None

    def _fenced(self) -> SessionFenced:
        try:
            row = self._sessions._run(
                lambda conn: conn.execute(
                    "SELECT lease_owner, lease_epoch, lines FROM tether_sessions "
                    "WHERE session_id = %s",
                    (self.session_id,),
                ).fetchone()
            )
        except (StoreUnavailable, psycopg.Error):
            row = None
        if row is None:
            detail = "is gone; nothing was committed"
        elif int(row[1]) != self.fencing_token:
            detail = (
                f"was taken over by {row[0] or 'another writer'} (epoch {row[1]}); "
                "nothing was committed"
            )
        else:
            detail = f"is stale: the log has {row[2]} lines, this writer saw {self._lines}"
        return SessionFenced(self.session_id, self.fencing_token, detail)

    def check_lease(self) -> int:
        """Before an effect: renew the lease, or raise :class:`SessionFenced` if it is lost
        or expired (a service without fencing then never sees this writer again); the
        lease epoch is the fencing token.

        A commit of this writer sent less than :data:`PROOF_SHARE` of the lease ago proves
        it without a statement: the commit renewed the lease to the database's ``now()``
        plus its length, and no lease is taken before it expires (``claim``), so more than
        half of it is left. The time since is measured on ``CLOCK_BOOTTIME``, which goes on
        while the machine is suspended and the process stopped (SIGSTOP); where there is
        none, every check asks the database. One statement less for nearly every tool call
        of a worker (the call's intent was committed just before)."""
        with self._mutex:
            if (
                self._failed is None
                and _elapsed() < self._proven_until
                and not self._sessions.lease_lost(self.session_id)
            ):
                return self.fencing_token
            sent = _elapsed()
            params = (
                self._sessions.lease_seconds,
                self.session_id,
                self.fencing_token,
                self._sessions.owner,
            )
            try:  # idempotent: run again on a new connection when one is lost
                row = self._sessions._run(
                    lambda conn: conn.execute(
                        "UPDATE tether_sessions SET lease_expires = now() + "
                        "make_interval(secs => %s) WHERE session_id = %s AND lease_epoch = %s "
                        "AND lease_owner = %s AND lease_expires > now() RETURNING 1",
                        params,
                    ).fetchone()
                )
            except StoreUnavailable as exc:
                raise StoreUnavailable(str(self.path), exc.why) from None
            if row is None:
                self._failed = "fenced: this writer lost its lease"
                raise SessionFenced(
                    self.session_id,
                    self.fencing_token,
                    "expired or was taken over before the effect; the effect was not started",
                )
            self._proven_until = _proof_until(sent, self._sessions.lease_seconds)
        return self.fencing_token

    def flush(self) -> None:
        """Nothing is left unsynced: every commit was durable when it returned."""

    def log_bytes(self) -> bytes:
        return self._sessions.log_bytes(self.session_id)

    def sidecar(self, name: str) -> PostgresSidecar:
        return PostgresSidecar(self._sessions, self.session_id, name)

    def sidecar_names(self, prefix: str) -> frozenset[str] | None:
        try:
            with self._sessions._db() as conn:
                rows = conn.execute(
                    "SELECT name FROM tether_sidecars WHERE session_id = %s "
                    "AND left(name, %s) = %s",
                    (self.session_id, len(prefix), prefix),
                ).fetchall()
        except (StoreUnavailable, psycopg.Error):
            return None
        return frozenset(row[0] for row in rows)

    def close(self) -> None:
        """Release the lease (a fenced writer has none left). Idempotent."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
        self._sessions._release(self.session_id, self.fencing_token)

    def __repr__(self) -> str:
        return f"PostgresSessionStore({str(self.path)!r}, epoch={self.fencing_token})"


def export_session(sessions: PostgresSessions, session: str) -> bytes:
    """The session-v2 file of a session (its committed lines, LF after each)."""
    return sessions.log_bytes(session)


def import_session(sessions: PostgresSessions, data: bytes) -> str:
    """Load a session-v2 file as a new session; its id."""
    return sessions.import_log(data)
