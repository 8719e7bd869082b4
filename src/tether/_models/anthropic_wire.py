"""The Anthropic Messages API request body in O(new bytes).

:class:`MessagesBody` builds the bytes :class:`~tether._models.anthropic_native.AnthropicModel`
sends, from context messages encoded once (:class:`~tether._models.encoded.EncodedPrefix`).
What a message *becomes* is decided in one place only, the adapter's ``build_messages``
(called here on the one message, when it is first seen); this module only joins the
results:

* **Turns.** The API wants alternating turns, and ``build_messages`` merges consecutive
  user-side messages (user text, tool results, a compaction summary) into one user turn.
  So the piece of a message is its blocks, preceded by ``,`` when it continues the open
  user turn, or by the end of the open turn and the start of its own; the open turn's
  role is the state a piece leaves for the next (a piece depends on its predecessor only,
  which the identical prefix fixes).
* **The cache breakpoint** (``cache_control`` on the last block of the last message, unless
  that block is thinking) is spliced into the copy that makes the body, before the last
  block's closing brace: the cached pieces never carry it.
* **A failed tool result** (``ModelRequest.failed_results``, sent with ``is_error``) is
  keyed like a side record: a tool message has none, so its slot carries a marker, and the
  same message failed or not is a different piece.
* **Everything else** (model, ``max_tokens``, system prompt, tools, output options) is the
  adapter's ``build_request`` of the request without its messages, encoded per request (a
  few kilobytes); its ``extra_body`` is merged at the top level, as the SDK does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import islice
from typing import Any, Final

from tether._models.base import ModelRequest
from tether._models.encoded import EncodedPrefix, dumps

__all__ = ["NOT_BODY", "MessagesBody"]

_CACHE_MARK: Final = b',"cache_control":{"type":"ephemeral"}}'
_UNCACHED_LAST: Final = frozenset({"thinking", "redacted_thinking"})
NOT_BODY: Final = frozenset({"extra_headers", "extra_query", "timeout"})
"""``messages.create`` arguments that are not members of the body."""

Translate = Callable[[ModelRequest], list[dict[str, Any]]]
"""The adapter's ``build_messages`` without cache breakpoints."""

_State = tuple[str, Any] | None
"""What a piece leaves: the open turn's role and the type of its last block."""

_FAILED: Final = object()
"""The side slot of a tool result recorded as failed (tool messages have no side record)."""


class MessagesBody:
    """Request bodies of one adapter; see the module."""

    def __init__(self, translate: Translate) -> None:
        self._translate = translate
        self._history = EncodedPrefix(self._encode, separator=b"")

    @property
    def encoded_messages(self) -> int:
        return self._history.encoded_messages

    @property
    def encoded_bytes(self) -> int:
        return self._history.encoded_bytes

    def body(self, shell: Mapping[str, Any], request: ModelRequest, *, cache: bool) -> bytes:
        """The body: ``shell`` (``build_request`` of the request without messages) with
        the request's messages; ``cache`` puts the breakpoint on the last block."""
        members = {k: v for k, v in shell.items() if k not in NOT_BODY and k != "messages"}
        extra = members.pop("extra_body", None) or {}
        members["stream"] = True
        members.update(extra)
        head = dumps(members)[:-1] + b',"messages":['

        def finish(state: _State) -> tuple[int, bytes]:
            if state is None:
                return 0, b"]}"
            if cache and state[1] not in _UNCACHED_LAST:
                return 1, _CACHE_MARK + b"]}]}"
            return 0, b"]}]}"

        sides: Any = request.reasoning
        count = len(request.messages)
        if request.failed_results:  # one step per failure, and a copy of the side list
            sides = [*islice(sides, count), *([None] * (count - len(sides)))]
            for index in request.failed_results:
                if 0 <= index < count:
                    sides[index] = _FAILED
        return self._history.join(head, request.messages, sides, finish)

    def _encode(self, message: Mapping[str, Any], side: Any, state: _State) -> tuple[bytes, Any]:
        failed = side is _FAILED
        turns = self._translate(
            ModelRequest(
                system_prompt="",
                messages=(message,),
                reasoning=(side,) if side is not None and not failed else (),
                failed_results=frozenset({0}) if failed else frozenset(),
            )
        )
        if not turns or not turns[0].get("content"):
            return b"", state  # a message the API has no place for (none today)
        (turn,) = turns  # one message is one turn
        role = turn["role"]
        blocks = turn["content"]
        pieces = b",".join(dumps(block) for block in blocks)
        if state is None:
            start = b'{"role":' + dumps(role) + b',"content":['
        elif role == "user" and state[0] == "user":
            start = b","  # the open user turn goes on (tool results, parallel calls)
        else:
            start = b']},{"role":' + dumps(role) + b',"content":['
        return start + pieces, (role, blocks[-1].get("type"))
