"""What a run and a session have spent, from the log: tokens, time and money.

The budgets (``[budget]``, :func:`tether.core.stops.budget_exhausted`) count every process
that drove a run, so a resume continues the spend instead of starting over:

* tokens — the log's usage ledger, which the reducer keeps exactly once: the run's share is
  the session's total minus the total when its ``runStarted`` was accepted
  (:meth:`~tether.core.state.RunOperation.spent`);
* time — ``[budget] time = "wall"``: from the ``timestamp`` of the run's ``runStarted``
  (its first start, whichever process wrote it) to now, on the composition's clock;
  ``"active"`` (the default): the time processes drove the run, the timeline's rule
  (:func:`tether.core.timeline.active_ms`: the log's gaps — a crash's downtime, a wait for
  a person — do not count), plus this process's own time since it took the run over;
* money — per answer, the price the provider reported (kept in the answer's side record,
  :mod:`tether._stores.reasoning`, durable before the entry), and for every token no
  report covers, the price table (:mod:`tether._models.prices`). A record lost to a crash
  only means its tokens are priced from the table.

Rules of this module:

* it reads the log (its state, and its facts for active time), the side records and what
  the caller hands over (the workspace database's reconciliations), never the model or
  the network;
* a side record never changes once its entry is committed, so each is read once per
  process (:class:`Spending` keeps what it found, by session and entry).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tether._models.prices import Price, cost_of, price_for
from tether._project import find_workspace_root, load_project_config
from tether.core.kinds import Usage
from tether.core.stops import BudgetTime
from tether.errors import TetherError

if TYPE_CHECKING:
    from tether._runtime.costs import Answers
    from tether._runtime.costs import Cost as Cost
    from tether._stores.protocol import SessionStoreProtocol
    from tether._stores.reasoning import ReportedCost, SideRecord
    from tether.core.state import RunOperation, SessionState

__all__ = [
    "Cost",
    "Spending",
    "cost_of_answers",
    "log_cost",
    "run_seconds",
    "workspace_prices",
]


def __getattr__(name: str) -> Any:
    # A run's cost is a call's value: its class lives in tether._runtime.costs, loaded on
    # first use (PEP 562), so building an agent (which builds its Spending) does not create
    # it.
    if name == "Cost":
        from tether._runtime.costs import Cost

        return Cost
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def cost_of_answers(
    reported: Sequence[ReportedCost], usage: Usage, price: Price | None, *, start: int = 0
) -> Cost:
    """The cost of the answers from transcript index ``start`` on, which used ``usage``:
    what their providers reported, plus the tokens no report covers at ``price``."""
    from tether._runtime.costs import Cost  # see __getattr__

    paid = 0.0
    covered = Usage()
    reasoning = 0
    for answer in reported:
        if answer.index < start:
            continue
        if answer.cost is not None and answer.usage is not None:
            paid += answer.cost
            covered += answer.usage
        else:
            reasoning += answer.reasoning_tokens
    rest = _clamped(usage, covered)
    if rest == Usage():
        return Cost(paid)
    if price is None:
        return Cost(paid, known=False)
    return Cost(paid + cost_of(rest, price, reasoning_tokens=reasoning))


class Spending:
    """The money side of the spend, for one model and price table."""

    def __init__(self, model: str, prices: Mapping[str, Price] | None = None) -> None:
        self.model = model
        self.price = price_for(model, prices)
        self._sessions: dict[str, Answers] = {}
        self.without_side_records: set[str] = set()
        """Sessions known to have no side record: none when opened, none written since
        (kept by the model steps, :class:`tether._runtime.model_steps.ModelSteps`). Their
        cost asks the store for none: a worker's every session ended with that question, a
        statement on a shared store."""

    def forget(self, session_id: str) -> None:
        """Read the side records of ``session_id`` anew (another process may have written)."""
        self._sessions.pop(session_id, None)
        self.without_side_records.discard(session_id)

    def cost(
        self, store: SessionStoreProtocol, state: SessionState, *, start: int, usage: Usage
    ) -> Cost:
        """The cost of the transcript's entries from index ``start`` on, which used
        ``usage`` (the run's share of the ledger, or the session's total with ``start=0``)."""
        from tether._runtime.costs import Answers  # see __getattr__

        answers = self._sessions.setdefault(store.session_id, Answers())
        scanned = len(state.transcript_ids)
        if answers.scanned < scanned:
            if store.session_id not in self.without_side_records:
                # Imported here: a run's, not an agent's construction (which builds Spending).
                from tether._stores.reasoning import reported_costs, side_record_reader

                read = side_record_reader(store)  # None: the session has no side records
                if read is not None:
                    answers.reported += reported_costs(state, read, start=answers.scanned)
            answers.scanned = scanned
        return cost_of_answers(answers.reported, usage, self.price, start=start)


def _clamped(usage: Usage, covered: Usage) -> Usage:
    """``usage - covered``, no counter below zero (a record may outlive a rolled-back
    commit: its tokens are then not in the ledger)."""
    return Usage(
        max(usage.input - covered.input, 0),
        max(usage.output - covered.output, 0),
        max(usage.cache_read - covered.cache_read, 0),
        max(usage.cache_write - covered.cache_write, 0),
    )


def workspace_prices(workspace: str | None = None) -> dict[str, Price]:
    """``[prices]`` of the workspace's ``tether.toml`` for a read-only report (``inspect``,
    ``sessions``, ``show``): a missing or unreadable file means tether's table alone — a
    report never fails over the price table."""
    try:
        root = find_workspace_root(workspace).path
        return dict(load_project_config(Path(root)).prices)
    except TetherError:
        return {}


def log_cost(
    state: SessionState,
    read: Callable[[str], SideRecord | None],
    prices: Mapping[str, Price],
) -> Cost:
    """The cost of a whole session read back from its log and side records (``read``),
    the model priced as its header names it."""
    from tether._stores.reasoning import reported_costs  # see Spending.cost

    reported = reported_costs(state, read)
    return cost_of_answers(reported, state.usage, price_for(state.header.model, prices))


def run_seconds(
    store: SessionStoreProtocol,
    operation: RunOperation,
    time: BudgetTime,
    *,
    now_ms: int,
    reconciliations: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> float:
    """The time ``operation`` (the store's active run) has taken so far, as ``time``
    counts it, when a process takes it over at ``now_ms``.

    ``active``: the log's facts as the timeline reads them (``reconciliations``, the
    workspace database's decisions keyed by ``toolStarted`` id, tell a crash inside a tool
    from a slow tool). No authorizations are passed: a pause before a call a person
    allowed is then a gap, so a parked call's wait never counts. The pause from the last
    fact to ``now_ms`` is not counted either: no process drove the run then (this one
    counts its own time from now on)."""
    started = operation.started_ms if operation.started_ms is not None else now_ms
    if time is BudgetTime.WALL:
        return max(now_ms - started, 0) / 1000.0
    # Imported here: the timeline (~10 ms to load) serves only an active-time budget taken
    # over by another process, never the construction of an agent (which loads this module).
    import orjson

    from tether.core.timeline import Evidence, active_ms, build_timeline

    loads = orjson.loads
    transactions: list[tuple[Mapping[str, Any], ...]] = []
    for raw in store.log_bytes().split(b"\n")[1:]:
        if raw.strip():
            value = loads(raw)
            transactions.append(tuple(value) if isinstance(value, list) else (value,))
    evidence = Evidence(reconciliations=reconciliations or {})
    timeline = build_timeline(store.state, transactions, evidence)
    return active_ms(timeline, operation.operation_id) / 1000.0
