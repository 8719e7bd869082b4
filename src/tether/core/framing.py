"""Byte framing and strict JSON parsing of session logs (spec section 2). Pure.

The committed region is everything up to and including the last LF; what follows
is a torn tail that is never decoded. Each committed line must be exactly one
strict JSON value: no duplicate member names, no unpaired surrogates, no NaN or
Infinity, no control characters inside strings — and no deeper than
:data:`MAX_LINE_DEPTH` levels of arrays and objects.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from typing import Any

import orjson

from tether.core.depth import deeper_than
from tether.errors import SessionCorruption

MISSING_HEADER = "MISSING_HEADER"
INVALID_UTF8 = "INVALID_UTF8"
MALFORMED_JSON = "MALFORMED_JSON"
BLANK_LINE = "BLANK_LINE"
CRLF_NOT_ALLOWED = "CRLF_NOT_ALLOWED"

MAX_LINE_DEPTH = 254
"""Deepest nesting of arrays and objects in one line; deeper is ``MALFORMED_JSON``.

The spec sets no limit (RFC 8259 section 9 lets a parser set one), and JSON parsers
differ: Python's ``json`` gives up somewhere near 1,000 levels, depending on how deep the
caller's stack already is; orjson reads 1,024 levels but writes only 254. Without a limit
of its own the reducer's verdict on a deep line would depend on the parser and the call
stack; with it, the same bytes always get the same verdict, and every line it accepts can
be written out again. 254 is orjson's writing limit, so the fast path below gets the check
for free, and it is far more than tether ever writes (tool-call arguments are limited to
``MAX_ARGUMENT_DEPTH`` = 128 levels, plus 3 for transaction, fact and record).
"""


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _orjson_writes_max_depth() -> bool:
    """Whether orjson writes exactly :data:`MAX_LINE_DEPTH` levels and refuses one more."""
    try:
        orjson.dumps(_nested(MAX_LINE_DEPTH))
    except orjson.JSONEncodeError:
        return False
    try:
        orjson.dumps(_nested(MAX_LINE_DEPTH + 1))
    except orjson.JSONEncodeError:
        return True
    return False


# When true, a line that orjson parses and writes back unchanged is at most
# MAX_LINE_DEPTH deep, and a deeper one makes orjson.dumps raise: the fast path of
# parse_line needs no check of its own. (Checked once: another orjson could differ.)
_ORJSON_BOUNDS_DEPTH = _orjson_writes_max_depth()

_ENCODED_SURROGATE = re.compile(rb"\xed[\xa0-\xbf][\x80-\xbf]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# Small enough that each decoded chunk (up to 4 bytes per character) stays below
# glibc's mmap threshold (128 KiB): larger chunks cost a fresh mmap and page faults
# for every chunk, which made this check several times slower.
_UTF8_CHUNK = 1 << 13
_utf8_decoder = codecs.getincrementaldecoder("utf-8")


class MalformedJson(ValueError):
    """A line is not exactly one strict JSON value."""


def committed_length(data: bytes) -> int:
    """``repairedLength``: the byte length of the committed region (0 if no LF)."""
    return data.rfind(b"\n") + 1


def committed_lines(data: bytes, *, check_utf8: bool = True) -> tuple[Iterator[bytes], int]:
    """Framing checks 1-4 of spec 2.5, then the committed lines, one at a time.

    A list of all lines would copy the whole committed region into fresh memory at
    once (for a large log, tens of megabytes of page faults); slicing one line at a
    time keeps reusing the same few blocks.

    With ``check_utf8=False`` only checks 1 and 2 run here. This is for a caller that
    passes every line to :func:`parse_line`, which accepts only valid UTF-8 (so a log
    that reduces without error is valid UTF-8 as a whole), and that calls
    :func:`utf8_error` when anything fails, to report ``INVALID_UTF8`` in its place:
    check 3 outranks check 4 (an empty first line) and everything after it.
    """
    end = check_committed(data, check_utf8=check_utf8)
    return _slice_lines(data, end), end


def utf8_error(data: bytes, end: int) -> SessionCorruption | None:
    """The ``INVALID_UTF8`` error if ``data[:end]`` is not strict UTF-8 (spec 2.3)."""
    region = memoryview(data)[:end]
    if _is_utf8(region):
        return None
    try:
        str(region, "utf-8")
    except UnicodeDecodeError as exc:
        return SessionCorruption(INVALID_UTF8, 1, detail=str(exc))
    return SessionCorruption(INVALID_UTF8, 1)  # pragma: no cover - same verdict


def check_committed(data: bytes, *, check_utf8: bool = True) -> int:
    """Framing checks 1-4 of spec 2.5, in order; returns ``repairedLength``.

    ``check_utf8=False`` stops after check 2 (see :func:`committed_lines`).
    """
    end = committed_length(data)
    if end == 0:
        raise SessionCorruption(MISSING_HEADER, 1, detail="no complete line")
    if data.find(b"\xed", 0, end) != -1:
        match = _ENCODED_SURROGATE.search(data, 0, end)
        if match is not None:
            line = data.count(b"\n", 0, match.start()) + 1
            raise SessionCorruption(MALFORMED_JSON, line, detail="encoded surrogate")
    if not check_utf8:
        return end
    error = utf8_error(data, end)
    if error is not None:
        raise error
    if data[0] == 0x0A:
        raise SessionCorruption(MISSING_HEADER, 1, detail="first line is empty")
    return end


def _slice_lines(data: bytes, end: int) -> Iterator[bytes]:
    find = data.find
    start = 0
    while start < end:
        stop = find(b"\n", start, end)
        yield data[start:stop]
        start = stop + 1


def _is_utf8(region: memoryview) -> bool:
    """Strict UTF-8 validation in chunks, without building one huge ``str``.

    Decoding a whole multi-megabyte log at once allocates (and page-faults in) a
    string of up to four bytes per character only to throw it away; an incremental
    decoder fed small chunks gives the same verdict (sequences split across chunks are
    carried over, and the final call rejects a truncated sequence at the end).
    """
    decoder = _utf8_decoder()
    try:
        for start in range(0, len(region), _UTF8_CHUNK):
            decoder.decode(region[start : start + _UTF8_CHUNK])
        decoder.decode(b"", True)
    except UnicodeDecodeError:
        return False
    return True


def check_line(raw: bytes, line: int) -> None:
    """Per-line framing: blank lines and CRLF endings (spec 2.2)."""
    if not raw:
        raise SessionCorruption(BLANK_LINE, line)
    if raw[-1] == 0x0D:
        raise SessionCorruption(CRLF_NOT_ALLOWED, line)


def parse_line(raw: bytes, line: int) -> Any:
    """Frame-check and parse one committed line; ``MALFORMED_JSON`` on any violation."""
    if not raw or raw[-1] == 0x0D:
        check_line(raw, line)
    if not _ORJSON_BOUNDS_DEPTH:
        _check_depth(raw, line)
    # orjson is strict RFC 8259 (and rejects unpaired surrogate escapes) but keeps the
    # last of duplicate member names; when re-serialising the value reproduces the line
    # byte for byte, no member was dropped. Anything else takes the strict slow path.
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    else:
        try:
            if orjson.dumps(value) == raw:
                return value
        except orjson.JSONEncodeError:
            pass  # deeper than orjson writes: the depth check below reports it
    # Before the json module sees it: it would recurse into a deep line until
    # RecursionError, at a depth that depends on the caller's stack.
    _check_depth(raw, line)
    try:
        return _parse_strict(raw)
    except MalformedJson as exc:
        raise SessionCorruption(MALFORMED_JSON, line, detail=str(exc)) from None


def _check_depth(raw: bytes, line: int) -> None:
    if deeper_than(raw, MAX_LINE_DEPTH):
        raise SessionCorruption(
            MALFORMED_JSON, line, detail=f"nested deeper than {MAX_LINE_DEPTH} levels"
        )


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
