"""The file store's opener, without the store itself.

Rules: building an agent makes a :class:`FileSessions` but opens no session; the store
(:mod:`tether._stores.file`) brings the loader, the reducer, the checkpoints and the side
records, so it is imported by the first :meth:`FileSessions.create` or
:meth:`FileSessions.open`. This module imports nothing else of tether's that a construction
does not already load (``tests/test_startup_imports.py``), and the store does not import it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tether._clock import SYSTEM_CLOCK
from tether._ids import new_uuid7
from tether._stores.durability import Durability
from tether.core.records import record

if TYPE_CHECKING:
    from tether._stores.file import SessionStore

__all__ = ["FileSessions"]


@record
class FileSessions:
    """The file store's :class:`~tether._stores.protocol.SessionOpener`: the sessions of
    one workspace (``sessions_dir``, default ``<workspace>/.tether/sessions``)."""

    workspace: Path
    sessions_dir: Path | None = None
    durability: Durability = Durability.DURABLE
    clock: Callable[[], int] = SYSTEM_CLOCK.now_ms
    ids: Callable[[], str] = new_uuid7

    def create(self, *, provider: str, model: str, environment_identity: str) -> SessionStore:
        # Imported here: the store loads the reducer; a construction opens no session.
        from tether._stores.file import SessionStore

        return SessionStore.create(
            self.workspace,
            provider=provider,
            model=model,
            environment_identity=environment_identity,
            durability=self.durability,
            sessions_dir=self.sessions_dir,
            clock=self.clock,
            ids=self.ids,
        )

    def open(self, session: str) -> SessionStore:
        # Imported here: see create.
        from tether._stores.file import SessionStore

        return SessionStore.open(
            session,
            workspace=self.workspace,
            sessions_dir=self.sessions_dir,
            durability=self.durability,
            clock=self.clock,
            ids=self.ids,
        )
