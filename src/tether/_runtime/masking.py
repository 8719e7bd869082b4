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

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from tether._credentials import Masker

if TYPE_CHECKING:  # types only: the seams' protocols load with what implements them
    from tether._runtime.events import Event, EventSink
    from tether._stores.protocol import SessionStoreProtocol

__all__ = ["mask_commits", "masked_sink"]

_Store = TypeVar("_Store", bound="SessionStoreProtocol")


def mask_commits(store: _Store, masker: Masker) -> _Store:
    """``store``, whose ``commit`` masks every fact first.

    The executor uses more of the store than its commit (state, sidecar, path), so this
    store's own ``commit`` is shadowed by an instance attribute instead of wrapping the
    store in a proxy: every implementation of the seam gets it the same way. Without
    secrets the store is unchanged.
    """
    if not masker:
        return store
    commit = store.commit

    def masked_commit(
        facts: Sequence[Mapping[str, Any]], *, sync: bool = True
    ) -> list[dict[str, Any]]:
        return commit([masker.value(fact) for fact in facts], sync=sync)

    store.commit = masked_commit  # type: ignore[method-assign]
    return store


def masked_sink(sink: EventSink | None, masker: Masker) -> EventSink | None:
    """``sink``, receiving every event with its texts masked (``sink`` itself without
    secrets)."""
    if sink is None or not masker:
        return sink
    deliver = sink
    # Imported here: the event types' module is loaded by whoever makes an event (the
    # executor), not by building an agent, which only wraps its sink.
    from tether._runtime.events import masked

    def masked_delivery(event: Event) -> None:
        deliver(masked(event, masker.text))

    return masked_delivery
