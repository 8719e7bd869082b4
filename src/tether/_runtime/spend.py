"""What a run and a session have spent, from the log: tokens, time and money.

The budgets (``[budget]``, :func:`tether.core.stops.budget_exhausted`) count every process
that drove a run, so a resume continues the spend instead of starting over:

* tokens — the log's usage ledger, which the reducer keeps exactly once: the run's share is
  the session's total minus the total when its ``runStarted`` was accepted
  (:meth:`~tether.core.state.RunOperation.spent`);
* time — from the ``timestamp`` of the run's ``runStarted`` (its first start, whichever
  process wrote it) to now, on the composition's clock;
* money — per answer, the price the provider reported (kept in the answer's side record,
  :mod:`tether._stores.reasoning`, durable before the entry), and for every token no
  report covers, the price table (:mod:`tether._models.prices`). A record lost to a crash
  only means its tokens are priced from the table.

Rules of this module:

* it reads the log's state and the side records only, never the model or the network;
* a side record never changes once its entry is committed, so each is read once per
  process (:class:`Spending` keeps what it found, by session and entry).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tether._models.prices import Price, cost_of, price_for
from tether._stores.protocol import SessionStoreProtocol
from tether._stores.reasoning import read_side_record
from tether.core.state import SessionState, Usage

__all__ = ["Cost", "Spending"]


@dataclass(frozen=True, slots=True)
class Cost:
    """US dollars spent; ``known`` is false when some tokens had neither a reported cost
    nor a price (``usd`` then counts only what is known)."""

    usd: float = 0.0
    known: bool = True


@dataclass(slots=True)
class _Answers:
    """The costs the side records of one session report, in transcript order."""

    scanned: int = 0
    """Transcript entries looked at so far (the transcript only grows)."""
    reports: list[tuple[int, float, Usage, int]] = field(default_factory=list)
    """``(index, reported cost, tokens it covers, reasoning tokens)`` per reporting answer."""
    reasoning: list[tuple[int, int]] = field(default_factory=list)
    """``(index, reasoning tokens)`` of answers without a reported cost."""


class Spending:
    """The money side of the spend, for one model and price table."""

    def __init__(self, model: str, prices: Mapping[str, Price] | None = None) -> None:
        self.model = model
        self.price = price_for(model, prices)
        self._sessions: dict[str, _Answers] = {}

    def forget(self, session_id: str) -> None:
        """Read the side records of ``session_id`` anew (another process may have written)."""
        self._sessions.pop(session_id, None)

    def cost(
        self, store: SessionStoreProtocol, state: SessionState, *, start: int, usage: Usage
    ) -> Cost:
        """The cost of the transcript's entries from index ``start`` on, which used
        ``usage`` (the run's share of the ledger, or the session's total with ``start=0``)."""
        answers = self._scan(store, state)
        reported = 0.0
        covered = Usage()
        for index, usd, tokens, _reasoning in answers.reports:
            if index >= start:
                reported += usd
                covered += tokens
        reasoning = sum(tokens for index, tokens in answers.reasoning if index >= start)
        rest = _clamped(usage, covered)
        if rest == Usage():
            return Cost(reported)
        if self.price is None:
            return Cost(reported, known=False)
        return Cost(reported + cost_of(rest, self.price, reasoning_tokens=reasoning))

    def _scan(self, store: SessionStoreProtocol, state: SessionState) -> _Answers:
        answers = self._sessions.setdefault(store.session_id, _Answers())
        ids = state.transcript_ids
        transcript = state.transcript
        for index in range(answers.scanned, len(ids)):
            if transcript[index].get("role") != "assistant":
                continue
            record = read_side_record(store, ids[index])
            if record is None:
                continue
            if record.cost is not None and record.usage is not None:
                answers.reports.append(
                    (index, record.cost, record.usage, record.reasoning_tokens or 0)
                )
            elif record.reasoning_tokens:
                answers.reasoning.append((index, record.reasoning_tokens))
        answers.scanned = len(ids)
        return answers


def _clamped(usage: Usage, covered: Usage) -> Usage:
    """``usage - covered``, no counter below zero (a record may outlive a rolled-back
    commit: its tokens are then not in the ledger)."""
    return Usage(
        max(usage.input - covered.input, 0),
        max(usage.output - covered.output, 0),
        max(usage.cache_read - covered.cache_read, 0),
        max(usage.cache_write - covered.cache_write, 0),
    )
