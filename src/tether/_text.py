"""Text from sessions, made safe to show on a terminal.

Session content (model answers, tool output, file names, ids a user typed) is untrusted: an
escape sequence in it must not drive the terminal that shows it. Every place that prints
such text — the commands (:mod:`tether._cli`) and ``tether show`` (:mod:`tether._show`) —
escapes it with :func:`printable`, the one rule.
"""

from __future__ import annotations

__all__ = ["printable"]


def printable(text: str) -> str:
    """``text`` with every non-printable character (ESC, C1 controls, …) escaped; a space
    stays a space."""
    if text.isprintable():
        return text
    out = []
    for char in text:
        if char.isprintable() or char == " ":
            out.append(char)
        elif ord(char) <= 0xFF:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(f"\\u{ord(char):04x}")
    return "".join(out)
