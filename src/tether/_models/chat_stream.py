"""Reassembling a streamed chat completion (``stream: true``) into one answer.

:class:`ChatStreamAccumulator` takes the decoded ``chat.completion.chunk`` objects in order
and produces the equivalent non-streamed ``chat.completion`` object, which the ordinary
parser (:func:`tether._models.openai_compat.parse_chat_completion`) validates. So a streamed
answer and the same answer sent whole give the same :class:`~tether._models.base.
ModelResponse`. Pure: no I/O.

Understood per choice-0 delta: ``content``, ``refusal``, ``tool_calls`` fragments (merged by
``index``; ``id``/``name`` set once, ``arguments`` concatenated), reasoning text as
``reasoning`` (OpenRouter) or ``reasoning_content`` (DeepSeek, vLLM), and OpenRouter's
``reasoning_details`` (merged by ``index``, string members concatenated). ``usage`` comes
from the chunk that carries it (usually a last chunk with no choices).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tether._models.streaming import Delta
from tether.errors import ModelError

__all__ = ["ChatStreamAccumulator"]


def _bad(message: str) -> ModelError:
    return ModelError("bad_response", message)


class ChatStreamAccumulator:
    """Feed chunks with :meth:`feed`; :meth:`completion` is the reassembled answer."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.refusal: list[str] = []
        self.reasoning: list[str] = []
        self.details: list[dict[str, Any]] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.error: Any = None
        self.model: str | None = None
        self.chunks = 0

    def feed(self, chunk: object) -> list[Delta]:
        """Take one chunk; the text and reasoning deltas it carried.

        Runs once per chunk of every answer, so its checks test concrete types: a chunk is
        decoded JSON, whose objects are dicts (another mapping is copied into one first)."""
        if type(chunk) is not dict:
            if not isinstance(chunk, Mapping):
                raise _bad("a streamed chunk is not a JSON object")
            chunk = dict(chunk)
        self.chunks += 1
        get = chunk.get
        error = get("error")
        if error is not None:
            self.error = error
        model = get("model")
        if isinstance(model, str):
            self.model = model
        usage = get("usage")
        if usage is not None:
            self.usage = usage
        choices = get("choices")
        if not choices:
            return []
        if not isinstance(choices, list):
            raise _bad("a streamed chunk's choices is not a list")
        first = choices[0]
        choice: Mapping[str, Any]
        if type(first) is dict and first.get("index", 0) == 0:
            choice = first
        else:
            found = next(
                (c for c in choices if isinstance(c, Mapping) and c.get("index", 0) == 0), None
            )
            if found is None:
                return []
            choice = found
        if choice.get("error") is not None:
            self.error = choice.get("error")
        finish = choice.get("finish_reason")
        if finish is not None:
            if not isinstance(finish, str):
                raise _bad("a streamed finish_reason is not a string")
            self.finish_reason = finish
        delta = choice.get("delta")
        if delta is None:
            return []
        if type(delta) is not dict and not isinstance(delta, Mapping):
            raise _bad("a streamed delta is not an object")
        field = delta.get
        out: list[Delta] = []
        for name in ("reasoning", "reasoning_content"):
            piece = field(name)
            if isinstance(piece, str) and piece:
                self.reasoning.append(piece)
                out.append(Delta("reasoning", piece))
                break
        details = field("reasoning_details")
        if isinstance(details, list):
            for item in details:
                self._merge_detail(item)
        text = field("content")
        if isinstance(text, str) and text:
            self.content.append(text)
            out.append(Delta("text", text))
        refusal = field("refusal")
        if isinstance(refusal, str) and refusal:
            self.refusal.append(refusal)
        calls = field("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise _bad("a streamed tool_calls is not a list")
            for position, fragment in enumerate(calls):
                self._merge_call(position, fragment)
        return out

    def _merge_detail(self, item: object) -> None:
        if not isinstance(item, Mapping):
            return
        index = item.get("index")
        for known in self.details:
            if (
                index is not None
                and known.get("index") == index
                and known.get("type") == item.get("type")
            ):
                for key, value in item.items():
                    if (
                        isinstance(value, str)
                        and isinstance(known.get(key), str)
                        and key
                        not in (
                            "type",
                            "id",
                            "format",
                        )
                    ):
                        known[key] += value
                    elif key not in known or known[key] is None:
                        known[key] = value
                return
        self.details.append(dict(item))

    def _merge_call(self, position: int, fragment: object) -> None:
        if not isinstance(fragment, Mapping):
            raise _bad("a streamed tool call is not an object")
        index = fragment.get("index", position)
        if isinstance(index, bool) or not isinstance(index, int):
            raise _bad("a streamed tool call has no integer index")
        call = self.calls.setdefault(index, {"id": None, "name": None, "arguments": []})
        if isinstance(fragment.get("id"), str) and fragment["id"]:
            call["id"] = call["id"] or fragment["id"]
        function = fragment.get("function")
        if isinstance(function, Mapping):
            name = function.get("name")
            if isinstance(name, str) and name:
                call["name"] = name if call["name"] is None else call["name"]
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                call["arguments"].append(arguments)
            elif isinstance(arguments, (Mapping, list)):
                call["arguments"] = [arguments]

    @property
    def reasoning_text(self) -> str:
        return "".join(self.reasoning)

    def completion(self) -> dict[str, Any]:
        """The equivalent non-streamed ``chat.completion`` object."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.content) if self.content else None,
        }
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        if self.reasoning:
            message["reasoning"] = self.reasoning_text
        if self.details:
            message["reasoning_details"] = self.details
        if self.calls:
            wire = []
            for index in sorted(self.calls):
                call = self.calls[index]
                parts = call["arguments"]
                arguments: Any = (
                    parts[0]
                    if len(parts) == 1 and not isinstance(parts[0], str)
                    else "".join(p for p in parts if isinstance(p, str))
                )
                item: dict[str, Any] = {
                    "type": "function",
                    "function": {"name": call["name"], "arguments": arguments},
                }
                if call["id"]:
                    item["id"] = call["id"]
                wire.append(item)
            message["tool_calls"] = wire
        body: dict[str, Any] = {
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}],
        }
        if self.model is not None:
            body["model"] = self.model
        if self.usage is not None:
            body["usage"] = self.usage
        if self.error is not None:
            body["error"] = self.error
            body["choices"] = []
        return body
