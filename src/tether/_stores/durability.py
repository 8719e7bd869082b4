"""The file store's durability modes (the ``durability`` setting), in a module of their own.

Rules: the settings table checks a ``durability`` value and building an agent makes the
file store's opener (:mod:`tether._stores.opener`), neither of which loads the store; the
store (:mod:`tether._stores.file`, which re-exports :class:`Durability`) and the opener both
import it from here. Nothing of tether's is imported.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Durability"]


class Durability(StrEnum):
    """What a returned :meth:`SessionStore.commit` guarantees (see ``docs/store.md``)."""

    DURABLE = "durable"
    """``fdatasync`` after every commit: survives power loss (given honest storage)."""
    PROCESS = "process"
    """Write only, no sync: survives a crash of this process, not of the machine."""
