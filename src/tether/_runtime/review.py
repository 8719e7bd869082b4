"""Applying a review decision to the session log (``tether review resolve``).

The decision is recorded in ``effects.db`` first (durable), then the result it
implies is appended to the session: ``applied``/``notApplied`` → the started call's
result entry (spec 7.3); ``abort`` → ``abortRequested`` (the next resume records the
call as interrupted and finishes the run as aborted). A crash between the two steps
is harmless: the next resume finds the resolved item and appends the same result.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether._effects.recovery import RecoveryAction, RecoveryDecision, decision_for_review
from tether._effects.review import ReviewDecision, ReviewItem
from tether._stores.file import Durability, SessionStore
from tether._wsdb.sqlite import EffectsDB
from tether.core import facts
from tether.core.state import RunOperation, ToolStatus


@dataclass(frozen=True)
class ReviewOutcome:
    item: ReviewItem
    appended: str  # "result", "abortRequested" or "nothing" (the call was no longer pending)


def resolve_review(
    workspace: str | os.PathLike[str],
    item_id: int | str,
    decision: ReviewDecision | str,
    note: str | None = None,
    *,
    sessions_dir: str | os.PathLike[str] | None = None,
    durability: Durability | str = Durability.DURABLE,
    store_url: str | None = None,
) -> ReviewOutcome:
    """Record a reviewer's decision and append the result it implies.

    With ``store_url`` the review items and the session are in the shared store's database
    (``docs/scale-out.md``); the session's lease is taken as the file store's lock is."""
    root = Path(os.path.realpath(workspace))
    db, opener = _open_databases(root, store_url)
    try:
        reviews = db.reviews
        item = reviews.get(item_id)
        # Take the session's writer lock before deciding, so no run is mid-flight.
        session_store: Any = (
            opener.open(item.session_id)
            if opener is not None
            else SessionStore.open(
                item.session_id, workspace=root, sessions_dir=sessions_dir, durability=durability
            )
        )
        with session_store as store:
            item = reviews.resolve(item.id, decision, note)
            implied = decision_for_review(item, db.journal.get(item.operation_id))
            return ReviewOutcome(item, _append_implied(store, item, implied))
    finally:
        db.close()
        if opener is not None:
            opener.close()


def _open_databases(root: Path, store_url: str | None) -> tuple[Any, Any]:
    """The workspace database and, with ``store_url``, the shared store's session opener
    (``None`` for the file store)."""
    if store_url is None:
        return EffectsDB.open_workspace(root), None
    from tether._stores.postgres import PostgresSessions
    from tether._wsdb.postgres import PostgresEffectsDB, SplitWorkspaceDB

    shared = PostgresEffectsDB.open_url(store_url)
    db = SplitWorkspaceDB(EffectsDB.open_workspace(root), shared)
    try:
        return db, PostgresSessions(store_url, str(root))
    except BaseException:
        db.close()
        raise


def _append_implied(store: Any, item: ReviewItem, implied: RecoveryDecision) -> str:
    """Append what the decision implies for the item's call, if it is still pending: what
    was appended (see :attr:`ReviewOutcome.appended`)."""
    operation = store.state.operation
    if not isinstance(operation, RunOperation):  # narrowing: only a run has tool calls
        return "nothing"
    try:
        pending = operation.tool_call(item.operation_id)
    except LookupError:
        return "nothing"
    if pending.status is not ToolStatus.PENDING:
        return "nothing"
    if implied.action is RecoveryAction.COMPLETE and implied.content is not None:
        store.commit(
            [
                facts.started_result_entry(
                    result_entry_id=pending.result_entry_id,
                    step_id=pending.step_id,
                    tool_started_id=pending.tool_started_id,
                    tool_name=pending.tool_name,
                    call_id=pending.tool_call_id,
                    content=implied.content,
                    is_error=implied.is_error,
                )
            ]
        )
        return "result"
    if implied.action is RecoveryAction.ABORT and not operation.abort_requested:
        store.commit(
            [
                facts.abort_requested(
                    operation_id=operation.operation_id,
                    operation_kind="run",
                    tool_call_id=pending.tool_call_id,
                )
            ]
        )
        return "abortRequested"
    return "nothing"
