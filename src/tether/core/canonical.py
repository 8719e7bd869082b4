"""Canonical JSON and the digests built on it (spec section 10).

The canonical form coincides with RFC 8785 (JCS) for a closed JSON subset: objects
with members sorted by name compared as UTF-16 code units, arrays in order, strings
escaped exactly as spec 10.1 says, ``null``, no whitespace, UTF-8. Booleans and
numbers are admitted only with ``allow_scalars=True`` (tool definitions and output
options, spec 10.5).

:func:`_reference` is the straightforward implementation. :func:`canonical_json`
uses the standard library's C encoder (``json``, sorted keys, no ASCII escaping) instead
when the value provably serializes identically (see :func:`_fast_path_applies`);
``tests/test_canonical.py`` checks the equivalence. Not ``orjson``, though it is 2-10x
faster on the same values: the digests of an agent's configuration are taken when the agent
is built, and importing ``orjson`` (~18 ms: it loads ``dataclasses``, ``inspect``,
``uuid``, ``datetime`` and ``json``) was half of the start-up budget (issue 31); what
goes through here is small (a configuration snapshot: ~6 us; a tool call's arguments:
~1 us), and the session log, where volume is, is encoded with ``orjson`` elsewhere.

Everything here is pure: no I/O, clock, environment, randomness or mutable globals.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, Protocol

from tether.errors import CanonicalizationError

__all__ = [
    "DIGEST_PREFIX",
    "MAX_SAFE_INTEGER",
    "HexHasher",
    "SourceDigestBuilder",
    "arguments_digest",
    "canonical_json",
    "configuration_digest",
    "has_unpaired_surrogate",
    "hasher_digest",
    "output_options_digest",
    "sha256_digest",
    "source_digest",
    "system_prompt_digest",
    "tool_definition_digest",
]

# --------------------------------------------------------------------------- reference

_ESCAPES: dict[str, str] = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}
_ESCAPES.update({chr(c): f"\\u{c:04x}" for c in range(0x20) if chr(c) not in _ESCAPES})
_NEEDS_ESCAPE = re.compile('["\\\\\x00-\x1f]')

MAX_SAFE_INTEGER: Final = 2**53 - 1
"""The largest integer every JSON reader represents exactly (spec 3): the bound of every
integer of the session format (``seq``, timestamps, ``toolIndex``, usage counters) and of
the integers canonical JSON admits. The one constant of this value in tether."""


class _Reject(Exception):
    """Internal: a value is not canonicalizable; ``path`` is filled in innermost-first."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.path: list[str] = []


def has_unpaired_surrogate(text: str) -> bool:
    """Whether ``text`` holds a surrogate code point, which UTF-8 cannot encode (a Python
    string holds a pair as two unpaired ones): the codec's C loop finds it. Not a regex over
    the surrogate range, which took ~0.4 ms to compile when the module was imported."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _string(text: str) -> str:
    if has_unpaired_surrogate(text):
        raise _Reject("string contains an unpaired surrogate")
    return '"' + _NEEDS_ESCAPE.sub(lambda m: _ESCAPES[m.group()], text) + '"'


def _utf16_units(name: str) -> bytes:
    # Big-endian UTF-16 bytes compare exactly like sequences of UTF-16 code units.
    return name.encode("utf-16-be")


def _number(value: int | float) -> str:
    """RFC 8785 number: ECMAScript ``Number.prototype.toString``."""
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise _Reject(f"integer {value} is outside the safe range ±(2**53-1)")
        return str(value)
    if not math.isfinite(value):
        raise _Reject(f"number {value!r} is not finite")
    if value == 0:
        return "0"  # also -0.0
    sign = "-" if value < 0 else ""
    # repr() yields the shortest round-tripping digits, as ECMAScript requires.
    mantissa, _, exponent = repr(abs(value)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    n = len(whole) + int(exponent or "0")  # value = 0.<digits> * 10**n
    stripped = digits.lstrip("0")
    n -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * -n + digits
    else:
        e = n - 1
        text = (
            digits[0]
            + ("." + digits[1:] if k > 1 else "")
            + ("e+" if e > 0 else "e-")
            + str(abs(e))
        )
    return sign + text


def _encode(value: Any, scalars: bool) -> str:
    if isinstance(value, str):
        return _string(value)
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        members = []
        for name in value:
            if not isinstance(name, str):
                raise _Reject(f"object member name {name!r} is not a string")
            try:
                members.append((_utf16_units(name), _string(name), name))
            except (_Reject, UnicodeEncodeError):
                raise _Reject(f"member name {name!r} contains an unpaired surrogate") from None
        members.sort()
        parts = []
        for _, encoded_name, name in members:
            try:
                parts.append(encoded_name + ":" + _encode(value[name], scalars))
            except _Reject as exc:
                exc.path.append(f".{name}")
                raise
        return "{" + ",".join(parts) + "}"
    if isinstance(value, list | tuple):
        items = []
        for index, item in enumerate(value):
            try:
                items.append(_encode(item, scalars))
            except _Reject as exc:
                exc.path.append(f"[{index}]")
                raise
        return "[" + ",".join(items) + "]"
    if isinstance(value, bool):
        if not scalars:
            raise _Reject("booleans are not admitted here")
        return "true" if value else "false"
    if isinstance(value, int | float):
        if not scalars:
            raise _Reject("numbers are not admitted here")
        return _number(value)
    raise _Reject(f"value of type {type(value).__name__} is not canonical JSON")


def _reference(value: Any, allow_scalars: bool) -> bytes:
    try:
        return _encode(value, allow_scalars).encode("utf-8")
    except _Reject as exc:
        where = "$" + "".join(reversed(exc.path))
        raise CanonicalizationError(f"cannot canonicalize {where}: {exc.message}") from None
    except RecursionError:
        raise CanonicalizationError("cannot canonicalize: nesting too deep or cyclic") from None


# --------------------------------------------------------------------------- fast path


def _fast_path_applies(value: Any) -> bool:
    """True if ``value`` is built only of dict/list/tuple/str/None with ASCII keys.

    For such values :data:`_FAST` (``json`` with sorted keys, no ASCII escaping, no
    spaces) gives the canonical form: ASCII names sort identically by code point and by
    UTF-16 code unit, and ``json`` escapes strings exactly as spec 10.1 (checked once at
    import, see ``_FAST_MATCHES``). Unpaired surrogates fail the UTF-8 encoding; the
    caller then falls back to the reference, which reports them.
    """
    kind = type(value)
    if kind is str or value is None:
        return True
    if kind is dict:
        for name, item in value.items():
            if type(name) is not str or not name.isascii():
                return False
            if type(item) is not str and not _fast_path_applies(item):
                return False
        return True
    if kind is list or kind is tuple:
        for item in value:
            if type(item) is not str and not _fast_path_applies(item):
                return False
        return True
    return False


_FAST: Final = json.JSONEncoder(
    ensure_ascii=False, sort_keys=True, separators=(",", ":"), check_circular=False
)


def _fast(value: Any) -> bytes:
    return _FAST.encode(value).encode("utf-8")


def _fast_matches() -> bool:
    """Whether the fast encoder escapes and sorts exactly as the reference does."""
    text = "".join(map(chr, range(0x80))) + "\x80\xa0\xe9\u2028\u2029\ufeff\ue000\U0001f600"
    probe: dict[str, Any] = {text: [text, None, {}], "b": "", "B": (), "a_": "/", "a": [], "": "z"}
    try:
        return _fast(probe) == _reference(probe, False)
    except (ValueError, CanonicalizationError):
        return False


_FAST_MATCHES = _fast_matches()


def canonical_json(value: Any, *, allow_scalars: bool = False) -> bytes:
    """The canonical UTF-8 serialization of ``value`` (spec 10.1).

    Admits ``dict`` (any ``Mapping``) with ``str`` keys, ``list``/``tuple``, ``str``
    and ``None``; with ``allow_scalars`` also ``bool``, ``int`` within ±(2**53-1) and
    finite ``float`` (RFC 8785 / ECMAScript number formatting). Anything else, and any
    string or member name containing an unpaired surrogate, raises
    :class:`~tether.errors.CanonicalizationError`.
    """
    try:
        plain = _FAST_MATCHES and _fast_path_applies(value)
    except RecursionError:
        plain = False
    if plain:
        try:
            return _fast(value)
        except (UnicodeEncodeError, RecursionError):
            pass  # a surrogate, or too deep: the reference decides and says which
    return _reference(value, allow_scalars)


# --------------------------------------------------------------------------- digests


DIGEST_PREFIX: Final = "sha256:"
"""What every digest text of tether starts with: the algorithm, then the lower-case hex."""


class HexHasher(Protocol):
    """A finished hash object (``hashlib.sha256()`` after its updates)."""

    def hexdigest(self) -> str: ...


def hasher_digest(hasher: HexHasher) -> str:
    """The digest text of a SHA-256 ``hasher`` fed incrementally: :data:`DIGEST_PREFIX` +
    its lower-case hex. The one place the prefix is put on (files hashed in chunks, the
    artifact scanner, check output, :func:`sha256_digest`)."""
    return DIGEST_PREFIX + hasher.hexdigest()


def sha256_digest(data: bytes) -> str:
    """``"sha256:"`` + lower-case hex SHA-256 of ``data``."""
    return hasher_digest(hashlib.sha256(data))


def arguments_digest(arguments: Mapping[str, Any]) -> str:
    """The digest of a tool call's arguments: same arguments, same digest, whatever the
    order of members at any depth (``10`` and ``10.0`` are the same number).

    The one arguments digest of tether: the action journal, authorizations and the tool
    failures that feed the stop conditions all record it (each next to the tool's name,
    which is not part of it). ``sha256`` of the canonical JSON of ``arguments``; for
    arguments canonical JSON does not admit (an integer beyond :data:`MAX_SAFE_INTEGER`;
    a non-finite number, which parsed tool-call arguments never hold) the digest of a
    stable, sorted ``json.dumps`` of the same value.
    """
    try:
        return sha256_digest(canonical_json(dict(arguments), allow_scalars=True))
    except CanonicalizationError:  # a stable, sorted fallback
        text = json.dumps(arguments, sort_keys=True, default=repr, allow_nan=True)
        return sha256_digest(text.encode("utf-8", "surrogatepass"))


def configuration_digest(snapshot: Mapping[str, Any]) -> str:
    """``configurationDigest`` of a configuration snapshot (spec 10.3)."""
    return sha256_digest(canonical_json(snapshot))


def system_prompt_digest(text: str) -> str:
    """``systemPromptDigest``: SHA-256 over the UTF-8 bytes of the prompt (spec 10.5)."""
    try:
        return sha256_digest(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise CanonicalizationError("system prompt contains an unpaired surrogate") from None


def output_options_digest(options: Mapping[str, Any]) -> str:
    """``outputOptionsDigest``: canonical form with RFC 8785 numbers (spec 10.5)."""
    if not isinstance(options, Mapping):
        raise CanonicalizationError("output options must be an object")
    return sha256_digest(canonical_json(options, allow_scalars=True))


_SCHEMA_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_SCHEMA_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "enum", "const",
    "oneOf", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "minLength", "maxLength", "pattern", "minItems", "maxItems", "description", "title",
})  # fmt: skip


def _check_schema(schema: Any, where: str) -> None:
    if not isinstance(schema, Mapping):
        raise CanonicalizationError(f"{where} must be a JSON Schema object")
    for keyword, value in schema.items():
        if keyword not in _SCHEMA_KEYWORDS:
            raise CanonicalizationError(f"unsupported JSON Schema keyword {keyword!r} at {where}")
        if keyword == "type":
            names = value if isinstance(value, list | tuple) else [value]
            if not names or not all(isinstance(n, str) and n in _SCHEMA_TYPES for n in names):
                raise CanonicalizationError(f"unsupported JSON Schema type {value!r} at {where}")
        elif keyword == "properties":
            if not isinstance(value, Mapping):
                raise CanonicalizationError(f"{where}.properties must be an object")
            for name, sub in value.items():
                _check_schema(sub, f"{where}.properties.{name}")
        elif keyword == "items" or (
            keyword == "additionalProperties" and not isinstance(value, bool)
        ):
            _check_schema(value, f"{where}.{keyword}")
        elif keyword == "oneOf":
            if not isinstance(value, list | tuple) or not value:
                raise CanonicalizationError(f"{where}.oneOf must be a non-empty array")
            for index, sub in enumerate(value):
                _check_schema(sub, f"{where}.oneOf[{index}]")


def tool_definition_digest(definition: Mapping[str, Any]) -> str:
    """``definitionDigest`` of a model-facing tool definition (spec 10.5).

    The digest covers the canonical form (booleans and numbers admitted) of
    ``{"name", "description", "parameters"}``; other members of ``definition`` are
    ignored. ``name`` and ``description`` must be strings, ``parameters`` a JSON Schema
    object using only these keywords, checked recursively through ``properties``,
    ``items``, ``additionalProperties`` (when a schema) and ``oneOf``:

    * structure: ``type`` (one of object, array, string, number, integer, boolean,
      null, or a non-empty array of them), ``properties``, ``required``,
      ``additionalProperties``, ``items``, ``enum``, ``const``, ``oneOf``;
    * numeric bounds: ``minimum``, ``maximum``, ``exclusiveMinimum``,
      ``exclusiveMaximum``, ``multipleOf``;
    * string length/pattern: ``minLength``, ``maxLength``, ``pattern``;
    * array length bounds: ``minItems``, ``maxItems``;
    * annotations (model-facing text): ``description``, ``title``.

    Any other keyword raises :class:`~tether.errors.CanonicalizationError` naming it.
    """
    try:
        name, description, parameters = (
            definition["name"],
            definition["description"],
            definition["parameters"],
        )
    except (KeyError, TypeError):
        raise CanonicalizationError(
            "a tool definition needs name, description and parameters"
        ) from None
    if not isinstance(name, str) or not isinstance(description, str):
        raise CanonicalizationError("tool name and description must be strings")
    _check_schema(parameters, "parameters")
    model_facing = {"name": name, "description": description, "parameters": parameters}
    return sha256_digest(canonical_json(model_facing, allow_scalars=True))


def source_digest(items: Iterable[tuple[str, Mapping[str, Any]]]) -> str:
    """``sourceDigest`` over ``(entry id, message)`` pairs in acceptance order (spec 10.4)."""
    array = [{"sourceEntryId": entry_id, "message": message} for entry_id, message in items]
    return sha256_digest(canonical_json(array))


class SourceDigestBuilder:
    """Running :func:`source_digest`: ``add`` message entries, ask ``digest`` any time.

    ``digest()`` answers in time independent of the number of entries added and does
    not consume the builder; it equals ``source_digest`` over the same pairs.
    """

    __slots__ = ("_count", "_hash")

    def __init__(self) -> None:
        self._hash = hashlib.sha256(b"[")
        self._count = 0

    def add(self, entry_id: str, message: Mapping[str, Any]) -> None:
        """Append one message entry (canonicalized now; errors raise here)."""
        item = canonical_json({"sourceEntryId": entry_id, "message": message})
        self._hash.update(b"," + item if self._count else item)
        self._count += 1

    def digest(self) -> str:
        """The digest of the entries added so far."""
        final = self._hash.copy()
        final.update(b"]")
        return hasher_digest(final)

    def copy(self) -> SourceDigestBuilder:
        """An independent builder in the same state."""
        twin = SourceDigestBuilder.__new__(SourceDigestBuilder)
        twin._hash = self._hash.copy()
        twin._count = self._count
        return twin

    def __len__(self) -> int:
        return self._count
