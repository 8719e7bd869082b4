"""What a tool call produced: :class:`ToolResult` (re-exported by :mod:`tether.core.values`).

On its own because every tool module needs it while nothing else of the value types is
needed to build an agent: importing it does not load the journal, review, verification
and authorization values (about twenty classes).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from tether.core.records import field, record

__all__ = ["ToolResult"]


@record(slots=True)
class ToolResult:
    """What a tool call produced.

    ``content`` is the tool message the model sees. ``is_error`` selects the result type of
    the entry (``{"type":"error"}`` instead of ``{"type":"success"}``, spec 7.3).
    ``metadata`` is for tether itself (bytes written, exit code, hashes, …); it is never sent
    to the model. It is copied into a read-only mapping.
    """

    content: str
    is_error: bool = False
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.content, str):
            raise TypeError(f"ToolResult.content must be str, got {type(self.content).__name__}")
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))

    @classmethod
    def error(cls, content: str, **metadata: Any) -> ToolResult:
        """An expected failure reported to the model (``is_error=True``)."""
        return cls(content, is_error=True, metadata=metadata)
