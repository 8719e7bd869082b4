"""SQLite databases of the effects layer: ``<workspace>/.tether/effects.db`` and ledgers.

:class:`EffectsDB` is one SQLite connection, opened the same way for every database of this
package:

* the parent directory is created with mode ``0700`` and the database file with ``0600``
  (SQLite gives its ``-wal`` and ``-shm`` files the database file's mode); a symbolic link
  or a non-regular file in the database's place is refused;
* ``journal_mode=WAL``, ``synchronous=FULL`` (every commit is fsynced before it returns),
  ``busy_timeout`` (waiting for another writer, default 5 s), ``foreign_keys=ON``;
* ``PRAGMA quick_check`` on open (the databases are small);
* the schema is versioned with ``PRAGMA user_version``: a list of migrations, each a list of
  statements, applied in one ``BEGIN IMMEDIATE`` transaction that re-reads the version first,
  so concurrent openers migrate exactly once. Every statement is also idempotent
  (``IF NOT EXISTS``). A database with a newer version than this tether knows is refused;
* ``effects.db`` has an identity: a random id in table ``meta``, created with the schema
  (:attr:`EffectsDB.identity`). Sessions record it on their side before their first
  evidence is written (:mod:`tether._effects.binding`), so a deleted, recreated or replaced
  database is recognised as *evidence unknown*, never read as "nothing happened".

Every :class:`sqlite3.Error` is turned into one :class:`~tether.errors.EffectsDatabaseError`
naming the file and the cause (corrupt, locked, read-only, I/O error, ...).

The connection may be used from several threads: every use holds the object's lock.

:class:`EffectsDB` is the SQLite implementation of the workspace-database seam
(:class:`tether._wsdb.protocol.WorkspaceDB`): its tables are reached as :attr:`~EffectsDB.journal`,
:attr:`~EffectsDB.reviews`, :attr:`~EffectsDB.authorizations`, :attr:`~EffectsDB.verifications`
and :attr:`~EffectsDB.failures`.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from tether._dirs import DirectoryError, ignore_in_git, make_directories, sync_directory
from tether._wsdb.sqlite_approvals import ApprovalStore
from tether._wsdb.sqlite_authorization import AuthorizationStore
from tether._wsdb.sqlite_failures import FailureStore
from tether._wsdb.sqlite_journal import ActionJournal
from tether._wsdb.sqlite_review import ReviewStore
from tether._wsdb.sqlite_verification import VerificationStore
from tether.core.values import format_ms
from tether.errors import EffectsDatabaseError

__all__ = [
    "CORRUPT_ADVICE",
    "DEFAULT_BUSY_TIMEOUT",
    "EFFECTS_DB_NAME",
    "EFFECTS_MIGRATIONS",
    "EFFECTS_SCHEMA_VERSION",
    "Clock",
    "EffectsDB",
    "effects_db_path",
    "format_ms",
]

EFFECTS_DB_NAME: Final = "effects.db"
DEFAULT_BUSY_TIMEOUT: Final = 5.0
"""Seconds to wait for another connection's write lock before giving up."""

Clock = Callable[[], float]
"""Seconds since the epoch (``time.time``); injected in tests."""

Migration = Sequence[str]

EFFECTS_MIGRATIONS: Final[tuple[Migration, ...]] = (
    # ---- version 1
    (
        # The action journal of write/edit (tether._effects.journal).
        """CREATE TABLE IF NOT EXISTS journal (
            operation_id     TEXT PRIMARY KEY,
            session_id       TEXT NOT NULL,
            tool_name        TEXT NOT NULL,
            path             TEXT NOT NULL,
            before_hash      TEXT,
            after_hash       TEXT NOT NULL,
            arguments_digest TEXT NOT NULL,
            status           TEXT NOT NULL CHECK (status IN
                ('proposed','authorized','started','succeeded','failed','unknown')),
            detail           TEXT,
            planned_result   TEXT NOT NULL DEFAULT '',
            result           TEXT,
            result_is_error  INTEGER NOT NULL DEFAULT 0,
            created_at_ms    INTEGER NOT NULL,
            updated_at_ms    INTEGER NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS journal_session ON journal (session_id)",
        # Every status a journal row went through, with time and detail.
        """CREATE TABLE IF NOT EXISTS journal_history (
            id           INTEGER PRIMARY KEY AUTOINCREMENT,
            operation_id TEXT NOT NULL REFERENCES journal (operation_id),
            status       TEXT NOT NULL,
            detail       TEXT,
            at_ms        INTEGER NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS journal_history_op ON journal_history (operation_id)",
        # Copies of file content kept as evidence (e.g. the current content on a conflict).
        """CREATE TABLE IF NOT EXISTS evidence (
            id            INTEGER PRIMARY KEY AUTOINCREMENT,
            operation_id  TEXT NOT NULL,
            kind          TEXT NOT NULL,
            path          TEXT,
            content_hash  TEXT,
            size          INTEGER,
            truncated     INTEGER NOT NULL DEFAULT 0,
            content       BLOB,
            created_at_ms INTEGER NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS evidence_op ON evidence (operation_id)",
        # Review items (tether._effects.review): at most one open item per operation id.
        """CREATE TABLE IF NOT EXISTS review_items (
            id             INTEGER PRIMARY KEY AUTOINCREMENT,
            session_id     TEXT NOT NULL,
            operation_id   TEXT NOT NULL,
            tool_name      TEXT NOT NULL,
            reason         TEXT NOT NULL,
            evidence       TEXT NOT NULL,
            status         TEXT NOT NULL CHECK (status IN ('open','resolved')),
            decision       TEXT CHECK (decision IS NULL OR decision IN
                ('applied','notApplied','abort')),
            note           TEXT,
            opened_at_ms   INTEGER NOT NULL,
            resolved_at_ms INTEGER
        )""",
        """CREATE UNIQUE INDEX IF NOT EXISTS review_open_op
            ON review_items (operation_id) WHERE status = 'open'""",
        "CREATE INDEX IF NOT EXISTS review_op ON review_items (operation_id)",
        # Every reconciliation and review decision, with time and evidence.
        """CREATE TABLE IF NOT EXISTS reconciliations (
            id           INTEGER PRIMARY KEY AUTOINCREMENT,
            session_id   TEXT NOT NULL,
            operation_id TEXT NOT NULL,
            tool_name    TEXT NOT NULL,
            verdict      TEXT NOT NULL,
            action       TEXT NOT NULL,
            evidence     TEXT NOT NULL,
            at_ms        INTEGER NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS reconciliations_op ON reconciliations (operation_id)",
    ),
    # ---- version 2: durable records of honest completion
    (
        # Results of the check command (tether._completion.evidence); only 'passed' verifies.
        """CREATE TABLE IF NOT EXISTS verifications (
            id              TEXT PRIMARY KEY,
            session_id      TEXT,
            tool_started_id TEXT,
            command         TEXT NOT NULL,
            exit_status     INTEGER,
            timed_out       INTEGER NOT NULL,
            error           TEXT,
            output_digest   TEXT NOT NULL,
            output_tail     TEXT NOT NULL,
            version_start   TEXT,
            version_end     TEXT,
            started_at_ms   INTEGER NOT NULL,
            duration_ms     INTEGER NOT NULL,
            status          TEXT NOT NULL CHECK (status IN ('passed','failed','void','error'))
        )""",
        """CREATE INDEX IF NOT EXISTS verifications_status
            ON verifications (status, started_at_ms)""",
        """CREATE INDEX IF NOT EXISTS verifications_started
            ON verifications (started_at_ms, id)""",
        """CREATE INDEX IF NOT EXISTS verifications_tool
            ON verifications (tool_started_id)""",
        """CREATE INDEX IF NOT EXISTS verifications_version
            ON verifications (version_start, started_at_ms)""",
        # Opaque manifests of artifact versions (tether._completion.artifact.to_manifest()).
        """CREATE TABLE IF NOT EXISTS artifact_manifests (
            version       TEXT PRIMARY KEY,
            manifest      BLOB NOT NULL,
            created_at_ms INTEGER NOT NULL
        )""",
        # Authorization decisions of tool calls, one per call (tether._effects.authorization).
        """CREATE TABLE IF NOT EXISTS authorizations (
            id               INTEGER PRIMARY KEY AUTOINCREMENT,
            session_id       TEXT NOT NULL,
            call_key         TEXT NOT NULL,
            tool_name        TEXT NOT NULL,
            arguments_digest TEXT NOT NULL,
            summary          TEXT NOT NULL,
            decision         TEXT NOT NULL CHECK (decision IN ('allow','deny')),
            who              TEXT NOT NULL,
            rule             TEXT NOT NULL,
            reason           TEXT,
            decided_at_ms    INTEGER NOT NULL,
            UNIQUE (session_id, call_key)
        )""",
        # Tool calls that failed, with the artifact version they failed at
        # (tether._completion.failures).
        """CREATE TABLE IF NOT EXISTS tool_failures (
            tool_started_id  TEXT PRIMARY KEY,
            session_id       TEXT NOT NULL,
            tool_name        TEXT NOT NULL,
            arguments_digest TEXT NOT NULL,
            artifact_version TEXT,
            result_entry_id  TEXT,
            at_ms            INTEGER NOT NULL
        )""",
        """CREATE INDEX IF NOT EXISTS tool_failures_result
            ON tool_failures (result_entry_id)""",
    ),
    # ---- version 3: the database's identity and the sessions it holds evidence for
    (
        # One random id per database, created with the schema (tether._effects.binding): a
        # session records it on its own side, so a database that was deleted, recreated or
        # replaced by another one is recognised instead of read as "nothing happened".
        """CREATE TABLE IF NOT EXISTS meta (
            key   TEXT PRIMARY KEY,
            value TEXT NOT NULL
        )""",
        "INSERT OR IGNORE INTO meta (key, value) VALUES ('db_id', lower(hex(randomblob(16))))",
        """INSERT OR IGNORE INTO meta (key, value) VALUES ('created_at_ms',
            CAST(CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) AS TEXT))""",
        # The sessions whose evidence this database holds (bound before their first record).
        """CREATE TABLE IF NOT EXISTS sessions (
            session_id  TEXT PRIMARY KEY,
            bound_at_ms INTEGER NOT NULL,
            previous_db TEXT
        )""",
    ),
    # ---- version 4: calls parked until a person decides (tether._effects.approvals)
    (
        """CREATE TABLE IF NOT EXISTS approval_requests (
            id               INTEGER PRIMARY KEY AUTOINCREMENT,
            session_id       TEXT NOT NULL,
            call_key         TEXT NOT NULL,
            tool_name        TEXT NOT NULL,
            arguments        TEXT NOT NULL,
            arguments_digest TEXT NOT NULL,
            artifact_version TEXT,
            touched          TEXT NOT NULL,
            summary          TEXT NOT NULL,
            rule             TEXT NOT NULL,
            status           TEXT NOT NULL
                CHECK (status IN ('proposed','approved','denied','void')),
            always           INTEGER NOT NULL DEFAULT 0,
            decided_by       TEXT,
            reason           TEXT,
            proposed_at_ms   INTEGER NOT NULL,
            decided_at_ms    INTEGER
        )""",
        """CREATE INDEX IF NOT EXISTS approval_requests_call
            ON approval_requests (session_id, call_key)""",
        """CREATE TABLE IF NOT EXISTS approval_grants (
            session_id    TEXT NOT NULL,
            tool_name     TEXT NOT NULL,
            rule          TEXT NOT NULL,
            granted_by    TEXT NOT NULL,
            granted_at_ms INTEGER NOT NULL,
            PRIMARY KEY (session_id, tool_name, rule)
        )""",
    ),
)
"""The schema of ``effects.db``: migration *i* brings ``user_version`` from *i* to *i + 1*."""

EFFECTS_SCHEMA_VERSION: Final = len(EFFECTS_MIGRATIONS)

CORRUPT_ADVICE: Final = (
    "keep the file and restore it from a backup; without a backup, move it aside and decide "
    "the calls it held evidence for with `tether review` (recovery never re-runs them on a guess)"
)
"""What a corrupt-database message advises. Never "start afresh": recovery must not read a
database without the records as proof that nothing happened (see docs/effects.md)."""


def effects_db_path(workspace: str | os.PathLike[str]) -> Path:
    """``<workspace>/.tether/effects.db``."""
    return Path(os.path.abspath(workspace)) / ".tether" / EFFECTS_DB_NAME


def _is_busy(exc: sqlite3.Error) -> bool:
    lowered = str(exc).lower()
    return "locked" in lowered or "busy" in lowered


def _describe(exc: sqlite3.Error, busy_timeout: float) -> str:
    text = str(exc) or type(exc).__name__
    lowered = text.lower()
    if _is_busy(exc):
        return (
            f"database is locked by another process or connection (waited {busy_timeout:g} s); "
            "try again when it is done"
        )
    if "not a database" in lowered or "malformed" in lowered or "corrupt" in lowered:
        return f"the database is corrupt ({text}); {CORRUPT_ADVICE}"
    if "readonly" in lowered or "read-only" in lowered:
        return f"the database is read-only ({text})"
    if "unable to open" in lowered:
        return f"cannot open the database ({text})"
    return text


def _prepare_file(path: Path) -> None:
    """Create the parent directory (0700) and the file (0600); refuse links and oddities.

    Every directory made is followed by ``fsync`` of its parent, and a new file by ``fsync``
    of its directory, before SQLite writes anything: a commit SQLite reports as durable must
    not sit in a file or directory whose own name a power cut could still take away.
    """
    parent = path.parent
    try:
        ignore_in_git(make_directories(parent, mode=0o700, durable=True))
    except DirectoryError as exc:
        raise EffectsDatabaseError(
            str(path), f"cannot {exc.op} directory {exc.path}: {exc.strerror or exc}"
        ) from None
    # O_NONBLOCK: a FIFO or device put in the database's place must not block the open (it
    # is refused by the fstat below); it has no effect on a regular file.
    base = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    created = False
    try:
        try:
            fd = os.open(path, base | os.O_CREAT | os.O_EXCL, 0o600)
            created = True
        except FileExistsError:
            fd = os.open(path, base)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise EffectsDatabaseError(str(path), "is a symbolic link; refusing it") from None
        raise EffectsDatabaseError(
            str(path), f"cannot open the database ({exc.strerror or exc})"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise EffectsDatabaseError(str(path), "is not a regular file; refusing it")
        if created:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    if created:
        try:
            sync_directory(parent)
        except DirectoryError as exc:
            raise EffectsDatabaseError(
                str(path), f"cannot sync directory {parent}: {exc.strerror or exc}"
            ) from None


class EffectsDB:
    """One open SQLite database with a versioned schema; see the module docstring.

    Use :meth:`open` (or :meth:`open_workspace` for ``.tether/effects.db``). Reads go
    through :meth:`query`/:meth:`query_one`, writes through :meth:`transaction`
    (``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on any exception).
    """

    def __init__(
        self,
        path: Path,
        connection: sqlite3.Connection,
        *,
        busy_timeout: float,
        clock: Clock,
        what: str,
    ) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self.clock = clock
        self.what = what
        self._connection: sqlite3.Connection | None = connection
        self._lock = threading.RLock()
        self.existed = True
        """Whether the file existed before :meth:`open` (``False``: created by this open)."""
        self.fresh = False
        """Whether this open created the schema (the file was new or empty)."""
        self._identity: str | None = None
        self._tables: dict[str, Any] = {}

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        migrations: Sequence[Migration] = EFFECTS_MIGRATIONS,
        *,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        clock: Clock = time.time,
        check: bool = True,
        what: str = "effects database",
    ) -> EffectsDB:
        """Open (creating if needed) the database at ``path`` and bring its schema up to date.

        Raises :class:`~tether.errors.EffectsDatabaseError` when the file is corrupt, locked
        for longer than ``busy_timeout`` seconds, has a newer schema, or cannot be opened.
        """
        if not busy_timeout >= 0:
            raise ValueError(f"busy_timeout must be >= 0, got {busy_timeout!r}")
        target = Path(os.path.abspath(path))
        existed = os.path.lexists(target)
        _prepare_file(target)
        try:
            connection = sqlite3.connect(
                str(target),
                timeout=busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise EffectsDatabaseError(str(target), _describe(exc, busy_timeout), what) from None
        connection.row_factory = sqlite3.Row
        db = cls(target, connection, busy_timeout=busy_timeout, clock=clock, what=what)
        db.existed = existed
        try:
            db._configure(check)
            db._migrate(migrations)
        except BaseException:
            db.close()
            raise
        return db

    @classmethod
    def open_workspace(
        cls,
        workspace: str | os.PathLike[str],
        *,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        clock: Clock = time.time,
        check: bool = True,
    ) -> EffectsDB:
        """Open ``<workspace>/.tether/effects.db``."""
        return cls.open(
            effects_db_path(workspace), busy_timeout=busy_timeout, clock=clock, check=check
        )

    def _error(self, exc: sqlite3.Error) -> EffectsDatabaseError:
        return EffectsDatabaseError(str(self.path), _describe(exc, self.busy_timeout), self.what)

    def _configure(self, check: bool) -> None:
        conn = self._require()
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            mode = self._switch_to_wal(conn)
            if str(mode).lower() != "wal":
                raise EffectsDatabaseError(
                    str(self.path),
                    f"cannot use write-ahead logging (journal mode {mode})",
                    self.what,
                )
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
            if check:
                problems = [str(row[0]) for row in conn.execute("PRAGMA quick_check(5)")]
                if problems != ["ok"]:
                    raise EffectsDatabaseError(
                        str(self.path),
                        "the database is corrupt (integrity check: "
                        + "; ".join(problems)
                        + f"); {CORRUPT_ADVICE}",
                        self.what,
                    )
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def _switch_to_wal(self, conn: sqlite3.Connection) -> object:
        """``PRAGMA journal_mode = WAL``, retried while another connection holds the file.

        On a new database (still in rollback mode) the switch reads the header under a
        shared lock and then needs an exclusive one. When several connections switch at
        once, each holding its shared lock, SQLite answers ``SQLITE_BUSY`` at once instead
        of calling the busy handler (waiting could deadlock), so ``busy_timeout`` does not
        cover it: several tether processes opening a fresh workspace together would fail
        with "database is locked". The retry drops the shared lock between attempts (the
        statement is over), so one of them wins, and the others then find WAL already set.
        """
        deadline = time.monotonic() + self.busy_timeout
        pause = 0.001
        while True:
            try:
                return conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _migrate(self, migrations: Sequence[Migration]) -> None:
        target = len(migrations)
        version = self.user_version
        if version == target:
            return
        if version > target:
            raise EffectsDatabaseError(
                str(self.path),
                f"schema version {version} is newer than this tether supports ({target}); "
                "upgrade tether",
                self.what,
            )
        with self.transaction() as conn:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version > target:
                raise EffectsDatabaseError(
                    str(self.path),
                    f"schema version {version} is newer than this tether supports ({target})",
                    self.what,
                )
            self.fresh = version == 0
            for migration in migrations[version:]:
                for statement in migration:
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {target}")

    # ------------------------------------------------------------------ use

    def _require(self) -> sqlite3.Connection:
        if self._connection is None:
            raise EffectsDatabaseError(str(self.path), "the database is closed", self.what)
        return self._connection

    @property
    def closed(self) -> bool:
        return self._connection is None

    @property
    def user_version(self) -> int:
        """The schema version stored in the file."""
        row = self.query_one("PRAGMA user_version")
        assert row is not None
        return int(row[0])

    @property
    def identity(self) -> str | None:
        """The database's random id (table ``meta``, created with the schema); ``None`` for
        a database without one (a ledger, or a schema older than version 3)."""
        if self._identity is None:
            table = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
            if self.query_one(table) is None:
                return None
            row = self.query_one("SELECT value FROM meta WHERE key = 'db_id'")
            self._identity = None if row is None else str(row[0])
        return self._identity

    def now_ms(self) -> int:
        """The injected clock, in integer milliseconds since the epoch."""
        return round(self.clock() * 1000)

    @property
    def location(self) -> str:
        """The database's path, as text."""
        return str(self.path)

    # ------------------------------------------------------------------ tables
    #
    # Each table's SQL is in its own module beside this one (tether._wsdb.sqlite_journal, …),
    # typed against tether._wsdb.sqlite_handle.SQLiteDatabase, so they never import this
    # module; the table objects are made on first use.

    def _table(self, name: str, make: Callable[[EffectsDB], Any]) -> Any:
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = make(self)
        return table

    @property
    def journal(self) -> ActionJournal:
        table: ActionJournal = self._table("journal", ActionJournal)
        return table

    @property
    def reviews(self) -> ReviewStore:
        table: ReviewStore = self._table("reviews", ReviewStore)
        return table

    @property
    def authorizations(self) -> AuthorizationStore:
        table: AuthorizationStore = self._table("authorizations", AuthorizationStore)
        return table

    @property
    def approvals(self) -> ApprovalStore:
        table: ApprovalStore = self._table("approvals", ApprovalStore)
        return table

    @property
    def verifications(self) -> VerificationStore:
        table: VerificationStore = self._table("verifications", VerificationStore)
        return table

    @property
    def failures(self) -> FailureStore:
        table: FailureStore = self._table("failures", FailureStore)
        return table

    # ------------------------------------------------------------------ sessions

    def names_session(self, session_id: str) -> bool:
        """Whether table ``sessions`` names ``session_id``."""
        found = self.query_one("SELECT 1 FROM sessions WHERE session_id = ?", (session_id,))
        return found is not None

    def bind_session(self, session_id: str, previous_db: str | None, at_ms: int) -> None:
        """Name ``session_id`` in table ``sessions`` (the first binding time stays)."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO sessions (session_id, bound_at_ms, previous_db) VALUES (?,?,?) "
                "ON CONFLICT (session_id) DO UPDATE SET previous_db = "
                "COALESCE(excluded.previous_db, previous_db)",
                (session_id, at_ms, previous_db),
            )

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` (``synchronous=FULL``: durable on return).

        Any exception in the block rolls back; SQLite errors become
        :class:`~tether.errors.EffectsDatabaseError`.
        """
        with self._lock:
            conn = self._require()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self._error(exc) from None
            try:
                yield conn
            except sqlite3.Error as exc:
                self._rollback(conn)
                raise self._error(exc) from None
            except BaseException:
                self._rollback(conn)
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback(conn)
                raise self._error(exc) from None

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass

    def query(self, sql: str, parameters: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """Run one read statement (its own snapshot) and return every row."""
        with self._lock:
            conn = self._require()
            try:
                return list(conn.execute(sql, tuple(parameters)).fetchall())
            except sqlite3.Error as exc:
                raise self._error(exc) from None

    def query_one(self, sql: str, parameters: Sequence[Any] = ()) -> sqlite3.Row | None:
        """Run one read statement and return its first row (``None`` if there is none)."""
        with self._lock:
            conn = self._require()
            try:
                row: sqlite3.Row | None = conn.execute(sql, tuple(parameters)).fetchone()
                return row
            except sqlite3.Error as exc:
                raise self._error(exc) from None

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            if self._connection is not None:
                try:
                    self._connection.close()
                finally:
                    self._connection = None

    def __enter__(self) -> EffectsDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<EffectsDB {str(self.path)!r} {state}>"
