"""The planner's ``current`` input (spec 14.1): the runtime's configuration as the planner
sees it, and its validation from JSON (``current-configuration.schema.json``).

Pure. :class:`CurrentConfiguration` is what :func:`tether.core.planner.plan_recovery`
compares a session's recorded configuration and started tools with; the shell builds it
from its tool registry (:class:`tether.core.configuration.AgentConfiguration`) or reads it
from a file (``tether plan --current``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar, NoReturn

from tether.core.kinds import Replay
from tether.core.records import record
from tether.errors import ConfigurationError

__all__ = ["CurrentConfiguration", "ToolDeclaration"]

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _short(value: str, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bad(path: str, problem: str) -> NoReturn:
    raise ConfigurationError(f"invalid current configuration: {path}: {problem}")


def _closed_object(value: object, path: str, members: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        _bad(path, f"expected an object, got {_json_kind(value)}")
    for name in value:
        if name not in members:
            shown = _short(name) if isinstance(name, str) else repr(name)
            _bad(path, f"unexpected member {shown}")
    for name in members:
        if name not in value:
            _bad(f"{path}.{name}", "missing required member")
    return value


def _text_member(obj: Mapping[str, Any], path: str, name: str) -> str:
    value = obj[name]
    if not isinstance(value, str):
        _bad(f"{path}.{name}", f"expected a non-empty string, got {_json_kind(value)}")
    if not value:
        _bad(f"{path}.{name}", "expected a non-empty string, got an empty string")
    return value


def _digest_member(obj: Mapping[str, Any], path: str, name: str) -> str:
    value = obj[name]
    if not isinstance(value, str):
        _bad(f"{path}.{name}", f"expected a digest string, got {_json_kind(value)}")
    if _DIGEST.fullmatch(value) is None:
        _bad(
            f"{path}.{name}",
            f"expected 'sha256:' followed by 64 lower-case hex digits, got {_short(value)}",
        )
    return value


@record(slots=True)
class ToolDeclaration:
    """One trusted, pre-classified tool of the runtime (an item of ``current.tools``)."""

    name: str
    definition_digest: str
    replay: Replay
    replay_key: str

    _MEMBERS: ClassVar[tuple[str, ...]] = ("name", "definitionDigest", "replay", "replayKey")

    @classmethod
    def from_json(cls, data: object, path: str = "tool") -> ToolDeclaration:
        """Validate one ``current.tools`` item; :class:`ConfigurationError` if malformed."""
        obj = _closed_object(data, path, cls._MEMBERS)
        name = _text_member(obj, path, "name")
        definition_digest = _digest_member(obj, path, "definitionDigest")
        replay = obj["replay"]
        if not isinstance(replay, str) or replay not in (Replay.SAFE.value, Replay.NEVER.value):
            shown = _short(replay) if isinstance(replay, str) else _json_kind(replay)
            _bad(f"{path}.replay", f'expected "safe" or "never", got {shown}')
        replay_key = _text_member(obj, path, "replayKey")
        return cls(name, definition_digest, Replay(replay), replay_key)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "definitionDigest": self.definition_digest,
            "replay": self.replay.value,
            "replayKey": self.replay_key,
        }


@record(slots=True)
class CurrentConfiguration:
    """The planner's ``current`` input (spec 14.1).

    The constructor does not validate (tests build deliberately odd values); use
    :meth:`from_json` for untrusted input.
    """

    configuration_digest: str
    environment_identity: str
    tools: tuple[ToolDeclaration, ...] = ()

    _MEMBERS: ClassVar[tuple[str, ...]] = ("configurationDigest", "environmentIdentity", "tools")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CurrentConfiguration:
        """Validate the shape of ``current-configuration.schema.json`` and build the value.

        Raises :class:`~tether.errors.ConfigurationError` with a one-line message naming
        the offending member (e.g. ``current.tools[1].replay``).
        """
        obj = _closed_object(data, "current", cls._MEMBERS)
        digest = _digest_member(obj, "current", "configurationDigest")
        environment = _text_member(obj, "current", "environmentIdentity")
        tools = obj["tools"]
        if not isinstance(tools, (list, tuple)):
            _bad("current.tools", f"expected an array, got {_json_kind(tools)}")
        return cls(
            configuration_digest=digest,
            environment_identity=environment,
            tools=tuple(
                ToolDeclaration.from_json(item, f"current.tools[{index}]")
                for index, item in enumerate(tools)
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "configurationDigest": self.configuration_digest,
            "environmentIdentity": self.environment_identity,
            "tools": [tool.to_json() for tool in self.tools],
        }

    def declaration(self, name: str) -> ToolDeclaration | None:
        """The *first* declaration named ``name`` (spec 14.3), or ``None``."""
        for tool in self.tools:
            if tool.name == name:
                return tool
        return None
