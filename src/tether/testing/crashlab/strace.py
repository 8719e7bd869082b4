"""Parse ``strace -f -y`` output into completed system calls (pure: text in, calls out).

``strace -y`` prints the path behind every file descriptor argument and result (the
kernel's answer from ``/proc/PID/fd``), so a recorded call says which file or directory it
touched without replaying ``openat`` results by hand. With ``-xx`` every byte of a string
argument is printed as ``\\xNN``, so :meth:`Call.data` gives back the exact bytes a
``write`` carried (the power-loss lab rebuilds files from them).

:func:`strace_problem` is the one impure helper here: it probes whether strace can run.

Used by the crash lab's power-loss and I/O-error modes and by the durability tests
(``tests/stracekit.py`` re-exports it with the pytest helpers).
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from dataclasses import dataclass

__all__ = ["Call", "parse", "split_args", "strace_problem", "unescape", "unescape_bytes"]


@functools.cache
def strace_problem() -> str | None:
    """Why strace cannot trace (and inject into) processes here; ``None`` when it can."""
    exe = shutil.which("strace")
    if exe is None:
        return "strace is not installed (apt-get install -y strace)"
    probe = subprocess.run(
        [exe, "-f", "-qq", "-e", "trace=none", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines()
        return f"strace cannot trace here: {lines[-1] if lines else probe.returncode}"
    return None


_LINE = re.compile(r"^(?P<pid>\d+)\s+(?P<body>.*)$")
_RESUMED = re.compile(r"^<\.\.\. (?P<name>\w+) resumed>(?P<rest>.*)$")
_CALL = re.compile(
    r"^(?P<name>\w+)\((?P<args>.*)\)\s+=\s+(?P<ret>-?\d+|\?)(?P<after>.*)$", re.DOTALL
)
_FD = re.compile(r"^(?P<fd>-?\d+|AT_FDCWD)<(?P<path>.*?)>(?P<deleted>\(deleted\))?$")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ERRNO = re.compile(r"^\s*(?P<errno>E[A-Z0-9]+)\b")


def split_args(args: str) -> list[str]:
    """strace's argument text split at top-level commas (not inside strings or brackets)."""
    out: list[str] = []
    depth = 0
    quoted = False
    escaped = False
    start = 0
    for i, char in enumerate(args):
        if quoted:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
            continue
        if char == '"':
            quoted = True
        elif char in "[{(<":
            depth += 1
        elif char in "]})>":
            depth -= 1
        elif char == "," and depth == 0:
            out.append(args[start:i].strip())
            start = i + 1
    tail = args[start:].strip()
    if tail:
        out.append(tail)
    return out


def unescape(text: str) -> str:
    """Undo strace's C-style string escapes (enough for paths and JSON text)."""
    return re.sub(
        r"\\(x[0-9a-fA-F]{2}|[0-7]{1,3}|.)",
        lambda m: _unescape_one(m.group(1)),
        text,
    )


def unescape_bytes(text: str) -> bytes:
    """Undo strace's escapes to the exact bytes (``-xx`` prints every byte as ``\\xNN``)."""
    out = bytearray()
    i = 0
    simple = {"n": 10, "t": 9, "r": 13, '"': 34, "\\": 92, "v": 11, "f": 12}
    while i < len(text):
        char = text[i]
        if char != "\\" or i + 1 >= len(text):
            out += char.encode("utf-8")
            i += 1
            continue
        code = text[i + 1]
        if code == "x" and i + 4 <= len(text):
            out.append(int(text[i + 2 : i + 4], 16))
            i += 4
        elif code in "01234567":
            j = i + 1
            while j < len(text) and j < i + 4 and text[j] in "01234567":
                j += 1
            out.append(int(text[i + 1 : j], 8) & 0xFF)
            i = j
        else:
            out.append(simple.get(code, ord(code) & 0xFF))
            i += 2
    return bytes(out)


def _unescape_one(code: str) -> str:
    simple = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "v": "\v", "f": "\f"}
    if code in simple:
        return simple[code]
    if code.startswith("x"):
        return chr(int(code[1:], 16))
    if code.isdigit():
        return chr(int(code, 8))
    return code


@dataclass(frozen=True)
class Call:
    """One completed system call of a traced process."""

    index: int
    """Position of the line that *completed* the call."""
    start: int
    """Position of the line where the call began (equals ``index`` unless interrupted)."""
    pid: int
    name: str
    args: tuple[str, ...]
    ret: int | None
    ret_path: str | None
    errno: str | None
    injected: bool

    def fd_path(self, position: int = 0) -> str | None:
        """The path behind the file descriptor argument at ``position`` (``-y``)."""
        if position >= len(self.args):
            return None
        m = _FD.match(self.args[position])
        return unescape(m.group("path")) if m else None

    def string(self, position: int) -> str | None:
        """The string argument at ``position``, unescaped (``None`` if it is not one)."""
        if position >= len(self.args):
            return None
        m = _STRING.match(self.args[position])
        return unescape(m.group(1)) if m else None

    def data(self, position: int) -> bytes | None:
        """The string argument at ``position`` as the exact bytes (``None`` if not one).

        A string strace cut short (``-s``) ends in ``...`` after the closing quote: that is
        not the whole buffer, so it is refused rather than returned in part.
        """
        if position >= len(self.args):
            return None
        arg = self.args[position]
        m = _STRING.match(arg)
        if m is None or arg[m.end() :].startswith("..."):
            return None
        return unescape_bytes(m.group(1))

    @property
    def ok(self) -> bool:
        return self.ret is not None and self.ret >= 0

    def path_arg(self) -> str | None:
        """The file a path-taking call names (for ``linkat``/``renameat*``: the old name),
        made absolute against its directory descriptor."""
        if self.name in ("mkdir", "unlink", "link", "rename"):
            return self.string(0)
        if self.name not in ("mkdirat", "openat", "unlinkat", "linkat", "renameat", "renameat2"):
            return self.fd_path(0)
        name = self.string(1)
        if name is None or name.startswith("/"):
            return name
        base = self.fd_path(0)
        return f"{base}/{name}" if base is not None else name


def parse(text: str, *, default_pid: int = 0) -> list[Call]:
    """The completed calls of an ``strace -y`` log (``-f`` prefixes lines with the pid)."""
    calls: list[Call] = []
    pending: dict[int, tuple[int, str]] = {}
    for position, raw in enumerate(text.splitlines()):
        m = _LINE.match(raw)
        if m is not None and not raw.startswith(tuple("<-+")):
            pid, body = int(m.group("pid")), m.group("body")
        else:
            pid, body = default_pid, raw
        if body.startswith(("---", "+++")):
            continue
        if body.endswith("<unfinished ...>"):
            pending[pid] = (position, body[: -len("<unfinished ...>")].rstrip())
            continue
        resumed = _RESUMED.match(body)
        start = position
        if resumed is not None:
            begun = pending.pop(pid, None)
            if begun is None:
                continue
            start, head = begun
            body = head + resumed.group("rest")
        call = _CALL.match(body)
        if call is None:
            continue
        ret_text = call.group("ret")
        after = call.group("after")
        ret = None if ret_text == "?" else int(ret_text)
        ret_path = None
        path_match = re.match(r"^<(.*?)>", after)
        if path_match is not None:
            ret_path = unescape(path_match.group(1))
        errno_match = _ERRNO.match(after)
        calls.append(
            Call(
                index=position,
                start=start,
                pid=pid,
                name=call.group("name"),
                args=tuple(split_args(call.group("args"))),
                ret=ret,
                ret_path=ret_path,
                errno=errno_match.group("errno") if errno_match and ret == -1 else None,
                injected="(INJECTED)" in after,
            )
        )
    return calls
