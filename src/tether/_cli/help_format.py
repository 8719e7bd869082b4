"""Help text without type placeholders.

Typer renders ``PROMPT <str>`` in the arguments list and ``{PROMPT}`` in the usage line;
tether's arguments all carry a metavar that says what they are, so the type is noise. The
two rendering hooks of :class:`typer.core.TyperArgument` are replaced (if this Typer has
them; otherwise its own rendering stays, which is only cosmetic).
"""

from __future__ import annotations

from typing import Any


def plain_argument_help() -> None:
    """Show arguments as their metavar only: ``PROMPT`` (required) or ``[SESSION]``."""
    try:
        from typer.core import TyperArgument
    except ImportError:  # pragma: no cover - another Typer layout
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        return None

    def usage_display_name(self: Any) -> str:
        name = str(self.metavar or self.name).upper()
        return name if self.required else f"[{name}]"

    if hasattr(TyperArgument, "display_type_rich"):
        setattr(TyperArgument, "display_type_rich", display_type_rich)  # noqa: B010
    if hasattr(TyperArgument, "_usage_display_name"):
        setattr(TyperArgument, "_usage_display_name", usage_display_name)  # noqa: B010
