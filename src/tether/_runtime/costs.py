"""What a run or a session cost in money (:class:`Cost`) and the side records of a session
read so far to price it (:class:`Answers`, :class:`~tether._runtime.spend.Spending`'s
cache).

``Cost`` is :mod:`tether._runtime.spend`'s name (import it from there or from here): both
live in a module of their own so that building an agent, which builds its ``Spending``,
does not create their classes; pricing the first run loads them (start-up,
``bench/README.md``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether.core.records import field, record

if TYPE_CHECKING:
    from tether._stores.reasoning import ReportedCost

__all__ = ["Answers", "Cost"]


@record(slots=True)
class Cost:
    """US dollars spent; ``known`` is false when some tokens had neither a reported cost
    nor a price (``usd`` then counts only what is known)."""

    usd: float = 0.0
    known: bool = True

    def to_json(self) -> float | None:
        """The figure ``--json`` reports: ``null`` when it is not known."""
        return round(self.usd, 9) if self.known else None

    def text(self) -> str:
        """``$0.0123``, or ``≥ $0.0123 (some tokens have no price)``."""
        if self.known:
            return f"${self.usd:.4f}"
        return f"≥ ${self.usd:.4f} (some tokens have no price: add [prices] to tether.toml)"


@record(frozen=False, slots=True)
class Answers:
    """The side records of one session read so far (the transcript only grows)."""

    scanned: int = 0
    reported: list[ReportedCost] = field(default_factory=list)
