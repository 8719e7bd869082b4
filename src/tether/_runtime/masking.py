"""The agent's masking layer: credentials never reach the session log or the event sink.

Every fact the executor commits passes through :meth:`SessionStore.commit`, and every
progress event through the agent's sink; :func:`mask_commits` and :func:`masked_sink` put a
:class:`~tether._credentials.Masker` in front of both, so the masking happens at one point
each instead of at every place a model answer, a tool result or an error is recorded.

Because the store validates and adopts the *masked* facts, the session state — and so the
context sent to the model, the arguments a tool call runs with, and what a replay after a
crash runs with — is the masked one: a call in which the model repeated the key runs with
``[redacted]`` in its place, the first time and on every replay alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tether._credentials import Masker
from tether._runtime.events import Event, masked
from tether._stores.file import SessionStore

__all__ = ["mask_commits", "masked_sink"]


def mask_commits(store: SessionStore, masker: Masker) -> SessionStore:
    """``store``, whose :meth:`~SessionStore.commit` masks every fact first.

    The executor is typed against :class:`SessionStore` and uses more of it than the
    commit seam, so this store's own ``commit`` is shadowed by an instance attribute
    instead of wrapping the store in a proxy. Without secrets the store is unchanged.
    """
    if not masker:
        return store
    commit = store.commit

    def masked_commit(facts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return commit([masker.value(fact) for fact in facts])

    store.commit = masked_commit  # type: ignore[method-assign]
    return store


def masked_sink(
    sink: Callable[[Event], None] | None, masker: Masker
) -> Callable[[Event], None] | None:
    """``sink``, receiving every event with its texts masked (``sink`` itself without
    secrets)."""
    if sink is None or not masker:
        return sink
    deliver = sink

    def masked_delivery(event: Event) -> None:
        deliver(masked(event, masker.text))

    return masked_delivery
