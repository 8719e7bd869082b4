"""``publish_report``: the reference external system and the example effect tool.

:class:`ReportLedger` stands in for a remote service: a SQLite ledger (default
``<workspace>/.tether/ledger.db``) with one table::

    reports(operation_id TEXT PRIMARY KEY, title, body, published_at_ms, receipt UNIQUE)

:meth:`ReportLedger.publish` is idempotent on the operation id: ``INSERT OR IGNORE`` and then
``SELECT`` in one ``BEGIN IMMEDIATE`` transaction, so any number of concurrent publishes
with one operation id — threads or processes — commit exactly one row, and every caller
gets that row's receipt. Right after the commit, before returning to the harness, it passes
the crash boundary ``ledger.committed``.

:class:`PublishReportTool` is the effect tool over it: ``execute`` publishes with the
call's operation id as the idempotency key; ``lookup`` finds the committed row and answers
with the same result text ``execute`` returns.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tether import _faults as faults
from tether._effects.contract import EffectTool, LookupResult
from tether._tools.base import ToolResult
from tether._wsdb.sqlite import DEFAULT_BUSY_TIMEOUT, Clock, EffectsDB, format_ms
from tether.errors import OperationIdConflict

__all__ = [
    "LEDGER_COMMITTED",
    "LEDGER_DB_NAME",
    "LEDGER_MIGRATIONS",
    "Publication",
    "PublishReportTool",
    "ReportLedger",
    "default_ledger_path",
    "publication_text",
]

LEDGER_COMMITTED = faults.register(
    "ledger.committed",
    "publish_report: the ledger row is committed; the harness has not heard back yet",
)

LEDGER_DB_NAME: Final = "ledger.db"

LEDGER_MIGRATIONS: Final = (
    (
        """CREATE TABLE IF NOT EXISTS reports (
            operation_id    TEXT NOT NULL PRIMARY KEY,
            title           TEXT NOT NULL,
            body            TEXT NOT NULL,
            published_at_ms INTEGER NOT NULL,
            receipt         TEXT NOT NULL UNIQUE
        )""",
    ),
)


def default_ledger_path(workspace: str | os.PathLike[str]) -> Path:
    """``<workspace>/.tether/ledger.db``."""
    return Path(os.path.abspath(workspace)) / ".tether" / LEDGER_DB_NAME


@dataclass(frozen=True, slots=True)
class Publication:
    """One committed report. ``created`` is true only for the publish that committed it."""

    operation_id: str
    title: str
    body: str
    published_at_ms: int
    receipt: str
    created: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "operationId": self.operation_id,
            "title": self.title,
            "receipt": self.receipt,
            "publishedAt": format_ms(self.published_at_ms),
        }


def publication_text(publication: Publication) -> str:
    """The tool result text of a publication (the same for ``execute`` and ``lookup``)."""
    return f'Published report "{publication.title}" (receipt {publication.receipt})'


class ReportLedger:
    """The ledger of published reports; the database is opened on first use."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        clock: Clock = time.time,
    ) -> None:
        self.path = Path(os.path.abspath(path))
        self.busy_timeout = busy_timeout
        self.clock = clock
        self._db: EffectsDB | None = None
        self._lock = threading.Lock()

    @classmethod
    def for_workspace(cls, workspace: str | os.PathLike[str]) -> ReportLedger:
        return cls(default_ledger_path(workspace))

    def db(self) -> EffectsDB:
        """The open database (opened and migrated on first use)."""
        with self._lock:
            if self._db is None or self._db.closed:
                self._db = EffectsDB.open(
                    self.path,
                    LEDGER_MIGRATIONS,
                    busy_timeout=self.busy_timeout,
                    clock=self.clock,
                    what="report ledger",
                )
            return self._db

    def publish(self, operation_id: str, title: str, body: str) -> Publication:
        """Commit the report for ``operation_id`` once; later calls return the same row.

        The same operation id with another title or body raises
        :class:`~tether.errors.OperationIdConflict` (nothing is changed).
        """
        if not operation_id:
            raise ValueError("publish needs a non-empty operation id")
        db = self.db()
        receipt = "rcpt-" + secrets.token_hex(8)
        with db.transaction() as conn:
            cursor = conn.execute(
                "INSERT OR IGNORE INTO reports "
                "(operation_id, title, body, published_at_ms, receipt) VALUES (?,?,?,?,?)",
                (operation_id, title, body, db.now_ms(), receipt),
            )
            created = cursor.rowcount == 1
            row = conn.execute(
                "SELECT operation_id, title, body, published_at_ms, receipt FROM reports "
                "WHERE operation_id = ?",
                (operation_id,),
            ).fetchone()
        faults.hit(LEDGER_COMMITTED)
        publication = _publication(row, created)
        if (publication.title, publication.body) != (title, body):
            raise OperationIdConflict(
                operation_id,
                f"report {publication.title!r}",
                f"report {title!r}",
                str(self.path),
            )
        return publication

    def find(self, operation_id: str) -> Publication | None:
        """The committed report of ``operation_id``, or ``None``."""
        row = self.db().query_one(
            "SELECT operation_id, title, body, published_at_ms, receipt FROM reports "
            "WHERE operation_id = ?",
            (operation_id,),
        )
        return None if row is None else _publication(row, False)

    def effect_count(self, operation_id: str) -> int:
        """How many rows ``operation_id`` has (0 or 1; the crash lab checks it)."""
        row = self.db().query_one(
            "SELECT COUNT(*) FROM reports WHERE operation_id = ?", (operation_id,)
        )
        return int(row[0]) if row is not None else 0

    def count_all(self) -> int:
        """How many reports are committed."""
        row = self.db().query_one("SELECT COUNT(*) FROM reports")
        return int(row[0]) if row is not None else 0

    def duplicate_effects(self) -> int:
        """Rows beyond the first per operation id (always 0: the crash lab's invariant)."""
        row = self.db().query_one("SELECT COUNT(*) - COUNT(DISTINCT operation_id) FROM reports")
        return int(row[0]) if row is not None else 0

    def publications(self) -> list[Publication]:
        """Every committed report, oldest first."""
        rows = self.db().query(
            "SELECT operation_id, title, body, published_at_ms, receipt FROM reports "
            "ORDER BY published_at_ms, rowid"
        )
        return [_publication(row, False) for row in rows]

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


def _publication(row: Any, created: bool) -> Publication:
    return Publication(
        operation_id=row["operation_id"],
        title=row["title"],
        body=row["body"],
        published_at_ms=int(row["published_at_ms"]),
        receipt=row["receipt"],
        created=created,
    )


class PublishReportTool(EffectTool):
    """``publish_report`` {title, body}: publish a report to the ledger, once per call."""

    name = "publish_report"
    description = (
        "Publish a report with a title and a body. Publishing is an external effect: each "
        "call publishes one report and returns its receipt."
    )
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "title": {"type": "string", "description": "The report's title.", "minLength": 1},
            "body": {"type": "string", "description": "The report's text."},
        },
        "required": ["title", "body"],
        "additionalProperties": False,
    }
    replay_key = "user:publish_report:v1"

    def __init__(self, ledger: ReportLedger | str | os.PathLike[str]) -> None:
        self.ledger = ledger if isinstance(ledger, ReportLedger) else ReportLedger(ledger)
        super().__init__()

    @classmethod
    def for_workspace(cls, workspace: str | os.PathLike[str]) -> PublishReportTool:
        """The tool over ``<workspace>/.tether/ledger.db``."""
        return cls(ReportLedger.for_workspace(workspace))

    def execute(self, arguments: Mapping[str, Any], operation_id: str) -> ToolResult:
        """Publish with ``operation_id`` as the idempotency key.

        Ledger errors propagate (the outcome of a failed commit is not known to the caller;
        recovery asks :meth:`lookup`).
        """
        publication = self.ledger.publish(operation_id, arguments["title"], arguments["body"])
        return ToolResult(publication_text(publication), metadata=_metadata(publication))

    def lookup(self, operation_id: str) -> LookupResult:
        publication = self.ledger.find(operation_id)
        if publication is None:
            return LookupResult.not_found()
        return LookupResult.committed(
            ToolResult(publication_text(publication), metadata=_metadata(publication))
        )


def _metadata(publication: Publication) -> dict[str, Any]:
    return {
        "operation_id": publication.operation_id,
        "receipt": publication.receipt,
        "published_at_ms": publication.published_at_ms,
    }
