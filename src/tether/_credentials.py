"""tether's own credentials: kept out of child processes, masked wherever tether writes.

Three tools, one list of secrets (see ``docs/models.md``, "Credentials"):

* :func:`register_secret` — every credential value tether is configured with (the API
  key the model adapter uses) is registered once, process-wide, by whoever receives it.
* :func:`child_environment` — the environment for commands tether starts (``bash``, the
  check command, and any later child such as an MCP server): tether's own, minus its
  credential variables (:data:`CREDENTIAL_VARIABLES`, plus names a configuration adds)
  and minus any variable whose value contains a registered secret. ``[tools] pass_env``
  in ``tether.toml`` names variables that are passed through anyway, on purpose.
* :class:`Masker` — replaces every exact occurrence of a secret by :data:`MASK`. The
  agent puts one in front of the session store and the event sink; the CLI masks what it
  prints. Secrets shorter than :data:`MIN_SECRET_LENGTH` are never masked: masking a
  four-letter "key" would rewrite ordinary words.

:func:`hide_from_process_listing` overwrites the secrets in this process's own command
line and initial environment as the kernel shows them (``/proc/PID/cmdline``, readable by
every local user, and ``/proc/PID/environ``, readable by the user's other processes, e.g.
a ``bash`` command reading its parent's), so ``--api-key KEY`` is visible only until
tether has started.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any, Final

from tether.core.records import field, record

__all__ = [
    "CREDENTIAL_VARIABLES",
    "MASK",
    "MIN_SECRET_LENGTH",
    "Masker",
    "child_environment",
    "hide_from_process_listing",
    "register_secret",
    "registered_secrets",
]

CREDENTIAL_VARIABLES: Final = frozenset(
    {
        "TETHER_API_KEY",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "OPENROUTER_API_KEY",
        "TETHER_STORE_URL",
    }
)
"""Variables never handed to a child process (unless passed through by name): tether's
key, the well-known provider keys (the ``openai`` SDK reads ``OPENAI_API_KEY`` itself) and
the shared store's URL (it may carry the database password)."""

MASK: Final = "[redacted]"
"""What an exact occurrence of a secret is replaced with."""

MIN_SECRET_LENGTH: Final = 8
"""Shorter values are not treated as secrets: they would mask ordinary text."""

_ALNUM_RUN: Final = re.compile(r"[A-Za-z0-9]+")
_MIN_PROBE: Final = 4
"""A secret whose longest run of ASCII letters and digits is shorter makes :class:`Masker`
walk every value instead of probing its encoding first."""

_lock = threading.Lock()
_registered: list[str] = []


def register_secret(value: str) -> None:
    """Remember ``value`` as a credential of this process (ignored when too short)."""
    value = value.strip()
    if len(value) < MIN_SECRET_LENGTH:
        return
    with _lock:
        if value not in _registered:
            _registered.append(value)


def registered_secrets() -> tuple[str, ...]:
    """Every secret registered so far, in registration order."""
    with _lock:
        return tuple(_registered)


def child_environment(
    pass_env: Iterable[str] = (),
    *,
    drop: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
    secrets: Iterable[str] | None = None,
) -> dict[str, str]:
    """The environment for a command tether starts: ``environ`` (default: this process's)
    without credentials.

    Removed: :data:`CREDENTIAL_VARIABLES`, the names in ``drop`` (key sources a
    configuration names), and every variable whose value contains one of ``secrets``
    (default: :func:`registered_secrets`) — so a key given as ``--api-key "$MY_KEY"`` does
    not reach the command as ``MY_KEY`` either. Names in ``pass_env`` are kept whatever
    the rules say.
    """
    source = os.environ if environ is None else environ
    keep = frozenset(pass_env)
    names = CREDENTIAL_VARIABLES | frozenset(drop)
    values = [
        s
        for s in (registered_secrets() if secrets is None else secrets)
        if len(s) >= MIN_SECRET_LENGTH
    ]
    return {
        name: value
        for name, value in source.items()
        if name in keep or (name not in names and not any(s in value for s in values))
    }


@record
class Masker:
    """Replaces exact occurrences of secrets with :data:`MASK`.

    A secret is also found in its JSON-escaped forms, so a tool call's ``arguments`` text
    (JSON inside a string) is masked like plain text. Empty (no secret of at least
    :data:`MIN_SECRET_LENGTH` characters), it is falsy and returns everything unchanged.
    """

    secrets: tuple[str, ...] = ()
    _pattern: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)
    _probes: tuple[bytes, ...] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        forms: set[str] = set()
        probes: list[bytes] | None = []
        for secret in self.secrets:
            if len(secret) < MIN_SECRET_LENGTH:
                continue
            run = max(_ALNUM_RUN.findall(secret), key=len, default="")
            if probes is not None and len(run) >= _MIN_PROBE:
                probes.append(run.encode())
            else:
                probes = None  # a secret without a long plain run: always walk
            forms.update(
                (
                    secret,
                    json.dumps(secret, ensure_ascii=False)[1:-1],
                    json.dumps(secret)[1:-1],
                )
            )
        if forms:
            # Longest first: a secret that contains another is masked whole.
            alternatives = "|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True))
            object.__setattr__(self, "_pattern", re.compile(alternatives))
            object.__setattr__(self, "_probes", tuple(probes) if probes is not None else None)

    @classmethod
    def for_process(cls, extra: Iterable[str] = ()) -> Masker:
        """A masker of the registered secrets (and ``extra``)."""
        return cls(tuple(dict.fromkeys((*registered_secrets(), *extra))))

    def __bool__(self) -> bool:
        return self._pattern is not None

    def text(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(MASK, text)

    def contains(self, value: Any) -> bool:
        """Whether a secret occurs in ``value`` (a string, or JSON-like data).

        Walks ``value`` without :meth:`value`'s encoded probe: this is asked once an agent,
        of its small configuration snapshot, and the probe's encoder (``orjson``, ~18 ms to
        import) need not be loaded before the first fact."""
        return self._pattern is not None and self._found(value)

    def _found(self, value: Any) -> bool:
        # A search, not "masking changes it": a secret that reads like the mask itself
        # would leave the value equal.
        if isinstance(value, str):
            return self._pattern is not None and self._pattern.search(value) is not None
        if isinstance(value, Mapping):
            return any(self._found(k) or self._found(v) for k, v in value.items())
        if isinstance(value, list | tuple):
            return any(self._found(item) for item in value)
        return False

    def value(self, value: Any) -> Any:
        """``value`` with every string in it masked (dict keys included); JSON-like data
        (dicts, lists, tuples, scalars) is copied only where something changed."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if self._probes is not None and isinstance(value, Mapping | list | tuple):
            # Every commit passes here: encoding it once and looking for each secret's
            # longest run of letters and digits (which no form of the secret and no JSON
            # escaping splits) is ~10x cheaper than walking it, and nearly every fact holds
            # no secret. Data orjson cannot encode is walked.
            import orjson  # loaded by the first fact, not by building an agent

            try:
                blob = orjson.dumps(value)
            except TypeError:
                pass
            else:
                if not any(probe in blob for probe in self._probes):
                    return value
        return self._walk(value)

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            items = [(self._walk(k), self._walk(v)) for k, v in value.items()]
            if all(a is k and b is v for (a, b), (k, v) in zip(items, value.items(), strict=True)):
                return value
            return dict(items)
        if isinstance(value, list | tuple):
            masked = [self._walk(item) for item in value]
            if all(a is b for a, b in zip(masked, value, strict=True)):
                return value
            return type(value)(masked) if isinstance(value, tuple) else masked
        return value


_HIDDEN: set[tuple[frozenset[bytes], frozenset[bytes]]] = set()
"""The (secrets, variables) :func:`hide_from_process_listing` has already hidden."""


def hide_from_process_listing(
    secrets: Iterable[str], variables: Iterable[str] = CREDENTIAL_VARIABLES
) -> bool:
    """Overwrite ``secrets``, and the values of the environment ``variables``, with ``*``
    in this process's ``/proc/self/cmdline`` and ``/proc/self/environ`` (Linux; best
    effort). ``True`` when the memory was rewritten.

    The kernel shows the original argument and environment strings straight from the
    process's memory (``arg_start..arg_end`` and ``env_start..env_end`` of
    ``/proc/self/stat``); writing through ``/proc/self/mem`` changes what it shows, with
    every string keeping its length. Python's ``sys.argv`` and ``os.environ`` are copies
    made at start-up and keep the real values; children get their environment from
    :func:`child_environment`.
    """
    wanted = [s.encode() for s in secrets if len(s) >= MIN_SECRET_LENGTH]
    prefixes = tuple(f"{name}=".encode() for name in variables)
    # Nothing else writes these strings: once hidden, the same secrets are hidden for good,
    # and a worker builds an agent per session in flight (reading both regions each time
    # cost ~0.2 ms an agent).
    done = (frozenset(wanted), frozenset(prefixes))
    if done in _HIDDEN:
        return False
    try:
        with open("/proc/self/stat", "rb") as handle:
            stat = handle.read()
        fields = stat[stat.rfind(b")") + 2 :].split()

        def field(number: int) -> int:  # proc(5) numbers from 1; ``fields`` starts at 3
            return int(fields[number - 3])

        # (48) arg_start, (49) arg_end, (50) env_start, (51) env_end
        regions = [(field(48), field(49), False), (field(50), field(51), True)]
        changed = False
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            for start, end, is_environ in regions:
                if not 0 < start < end:
                    continue
                mem.seek(start)
                data = mem.read(end - start)
                masked = data
                if is_environ and prefixes:
                    masked = b"\0".join(
                        _blank_value(entry, prefixes) for entry in masked.split(b"\0")
                    )
                for secret in wanted:
                    masked = masked.replace(secret, b"*" * len(secret))
                if masked != data:
                    mem.seek(start)
                    mem.write(masked)
                    changed = True
        _HIDDEN.add(done)
        return changed
    except (OSError, ValueError, IndexError):
        return False


def _blank_value(entry: bytes, prefixes: tuple[bytes, ...]) -> bytes:
    """``NAME=value`` with the value overwritten when ``NAME=`` is one of ``prefixes``."""
    for prefix in prefixes:
        if entry.startswith(prefix):
            return prefix + b"*" * (len(entry) - len(prefix))
    return entry
