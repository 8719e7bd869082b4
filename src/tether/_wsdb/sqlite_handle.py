"""What the SQLite tables need of their database: :class:`SQLiteDatabase`.

The tables (:mod:`tether._wsdb.sqlite_journal`, ...) are typed against this protocol rather
than :class:`tether._wsdb.sqlite.EffectsDB`, which makes them on first use: so the database
module imports the tables and never the other way round (no import cycle).
:class:`~tether._wsdb.sqlite.EffectsDB` and its PostgreSQL subclass implement it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

__all__ = ["SQLiteDatabase"]


class SQLiteDatabase(Protocol):
    """One open database: its path, its clock, a write transaction and reads."""

    @property
    def path(self) -> Path: ...

    def now_ms(self) -> int: ...

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]: ...

    def query(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]: ...

    def query_one(self, sql: str, parameters: Sequence[Any] = ()) -> Any | None: ...
