"""Byte framing and strict JSON parsing of session logs (spec section 2). Pure.

The committed region is everything up to and including the last LF; what follows
is a torn tail that is never decoded. Each committed line must be exactly one
strict JSON value: no duplicate member names, no unpaired surrogates, no NaN or
Infinity, no control characters inside strings.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import orjson

from tether.errors import SessionCorruption

MISSING_HEADER = "MISSING_HEADER"
INVALID_UTF8 = "INVALID_UTF8"
MALFORMED_JSON = "MALFORMED_JSON"
BLANK_LINE = "BLANK_LINE"
CRLF_NOT_ALLOWED = "CRLF_NOT_ALLOWED"

_ENCODED_SURROGATE = re.compile(rb"\xed[\xa0-\xbf][\x80-\xbf]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class MalformedJson(ValueError):
    """A line is not exactly one strict JSON value."""


def committed_length(data: bytes) -> int:
    """``repairedLength``: the byte length of the committed region (0 if no LF)."""
    return data.rfind(b"\n") + 1


def split_committed(data: bytes) -> tuple[list[bytes], int]:
    """Check the framing of a whole file and return its committed lines.

    Applies the framing checks 1-4 of spec 2.5 (missing LF, encoded surrogate bytes,
    invalid UTF-8, empty first line). Returns the lines of the committed region
    without their LFs, and ``repairedLength``. Per-line checks (blank, CRLF, JSON)
    are left to :func:`parse_line` so that they run in line order with the
    transaction rules.
    """
    end = committed_length(data)
    if end == 0:
        raise SessionCorruption(MISSING_HEADER, 1, detail="no complete line")
    region = memoryview(data)[:end]
    if data.find(b"\xed", 0, end) != -1:
        match = _ENCODED_SURROGATE.search(data, 0, end)
        if match is not None:
            line = data.count(b"\n", 0, match.start()) + 1
            raise SessionCorruption(MALFORMED_JSON, line, detail="encoded surrogate")
    try:
        str(region, "utf-8")
    except UnicodeDecodeError as exc:
        raise SessionCorruption(INVALID_UTF8, 1, detail=str(exc)) from None
    lines = data[: end - 1].split(b"\n")
    if not lines[0]:
        raise SessionCorruption(MISSING_HEADER, 1, detail="first line is empty")
    return lines, end


def iter_lines(data: bytes) -> Iterator[bytes]:
    """The committed lines of ``data`` (no framing checks)."""
    end = committed_length(data)
    if end:
        yield from data[: end - 1].split(b"\n")


def check_line(raw: bytes, line: int) -> None:
    """Per-line framing: blank lines and CRLF endings (spec 2.2)."""
    if not raw:
        raise SessionCorruption(BLANK_LINE, line)
    if raw[-1] == 0x0D:
        raise SessionCorruption(CRLF_NOT_ALLOWED, line)


def parse_line(raw: bytes, line: int) -> Any:
    """Frame-check and parse one committed line; ``MALFORMED_JSON`` on any violation."""
    check_line(raw, line)
    try:
        return parse_json(raw)
    except MalformedJson as exc:
        raise SessionCorruption(MALFORMED_JSON, line, detail=str(exc)) from None


def parse_json(raw: bytes) -> Any:
    """Parse one strict JSON value from UTF-8 bytes.

    Fast path: orjson is strict RFC 8259 (and rejects unpaired surrogate escapes),
    but silently keeps the last of duplicate member names. When re-serialising the
    parsed value reproduces the input byte for byte, no member was dropped, so the
    input had no duplicates. Anything else (other writers' formatting, huge
    numbers, errors) takes the slow path, which decides authoritatively.
    """
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _parse_strict(raw)
    if orjson.dumps(value) == raw:
        return value
    return _parse_strict(raw)


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise MalformedJson(f"duplicate member name {key!r}")
            seen.add(key)
    return obj


def _reject_constant(token: str) -> Any:
    raise MalformedJson(f"non-standard token {token}")


_DECODER = json.JSONDecoder(object_pairs_hook=_reject_duplicates, parse_constant=_reject_constant)


def _parse_strict(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedJson(str(exc)) from None
    try:
        value = _DECODER.decode(text)
    except MalformedJson:
        raise
    except (ValueError, RecursionError) as exc:
        raise MalformedJson(str(exc).split(":")[0]) from None
    if _SURROGATE_ESCAPE.search(text) is not None:
        _check_surrogates(value)
    return value


def _check_surrogates(value: Any) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, dict):
            for key, member in item.items():
                _check_text(key)
                stack.append(member)
        elif isinstance(item, list):
            stack.extend(item)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise MalformedJson("unpaired surrogate in string") from None
