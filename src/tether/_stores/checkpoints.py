"""The file store's reducer checkpoints: a sidecar that spares a long log its full reduction.

The pure half is :mod:`tether.core.checkpoint` (the state as explicit JSON, and its
binding); this module is the shell's half, for :mod:`tether._stores.file`:

* **Where.** ``.<session id>.checkpoint.json`` beside the log (:mod:`tether._stores.sidecar`):
  in the sessions directory, mode ``0600``, which the file tools never touch
  (:class:`~tether._tools.workspace.ProtectedState`) and the command sandbox hides. It is a
  cache: deleting it changes nothing but the time of the next open.
* **When it is used** (:func:`load`): its binding must name this session, the running
  reducer (:func:`reducer_identity`) and the current checkpoint format, and a prefix of
  the committed log that ends at a line boundary and whose SHA-256 is the recorded one
  (the line count recorded with it is the reducer's own, not recounted). Then the state
  is decoded and only the lines after the prefix are reduced. Anything else — no
  checkpoint, an unreadable one, another version, a log rewritten, truncated or replaced
  under it, a tail line the reducer rejects — and the whole log is reduced exactly as
  without a checkpoint (so its errors are the reducer's own, never the checkpoint's).
* **When it is written** (:func:`save`): by a writer that holds the session's lock, when
  it closes a store that reduced or committed at least :data:`CHECKPOINT_EVERY` bytes
  beyond the checkpoint it opened with — never on a commit, so turn 2,000 costs what turn 2
  does. Atomically and durably (temporary name, ``fsync``, rename), so a checkpoint is
  whole or absent; its sections' lengths and CRC-32s are recorded and checked too.
* **The reducer's identity** is the SHA-256 of the sources of the :mod:`tether.core`
  modules the reducer is made of (:data:`REDUCER_MODULES`, checked against the reducer's
  imports by ``tests/test_checkpoint.py``), computed once per process. Chosen over a
  hand-bumped constant: no edit of the reducer can forget it, and an edit that changes
  nothing costs only one full reduction per session. A reducer whose sources cannot be
  read (no ``.py`` files installed) writes and uses no checkpoints.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Iterator
from functools import cache
from typing import Any, Final

from tether._loading import gc_paused, load_reducer
from tether._stores.sidecar import DEFAULT_LIMIT, FileSidecar
from tether.core.checkpoint import (
    CheckpointBinding,
    decode_checkpoint,
    encode_checkpoint,
    read_binding,
)
from tether.core.reducer import Reducer
from tether.errors import CheckpointMismatch, SessionCorruption

__all__ = [
    "CHECKPOINT_EVERY",
    "CHECKPOINT_NAME",
    "REDUCER_MODULES",
    "load",
    "reducer_identity",
    "save",
]

CHECKPOINT_NAME: Final = "checkpoint"
"""The sidecar's name: ``.<session id>.checkpoint.json``."""

CHECKPOINT_EVERY: Final = 256 * 1024
"""Bytes of log reduced or committed beyond the last checkpoint after which a closing
writer writes a new one: an open reduces at most about this much (a few milliseconds)
after the checkpoint, and a checkpoint (tens of milliseconds for a thousand turns) is
written at most once per this much log."""

REDUCER_MODULES: Final = (
    "tether.core.canonical",
    "tether.core.checkpoint",
    "tether.core.contents",
    "tether.core.depth",
    "tether.core.facts",
    "tether.core.framing",
    "tether.core.kinds",
    "tether.core.records",
    "tether.core.reducer",
    "tether.core.state",
    "tether.errors",
)
"""The modules whose code decides what the reducer's state is after a log prefix."""


@cache
def reducer_identity() -> str | None:
    """The SHA-256 of the sources of :data:`REDUCER_MODULES`, or ``None`` if one cannot be
    read (then no checkpoint is written or used)."""
    digest = hashlib.sha256()
    for name in REDUCER_MODULES:
        path = getattr(importlib.import_module(name), "__file__", None)
        if not path or not path.endswith(".py"):
            return None
        try:
            with open(path, "rb") as f:
                source = f.read()
        except OSError:
            return None
        digest.update(name.encode() + b"\0" + len(source).to_bytes(8, "big") + source)
    return digest.hexdigest()


def load(
    data: bytes, sidecar: FileSidecar | None, *, running_hash: bool = False
) -> tuple[Reducer, int, Any]:
    """``(reducer, covered, hash)`` of the log ``data`` (a torn tail after the last LF is
    ignored, as by :meth:`~tether.core.reducer.Reducer.load`):
    ``covered`` is the length of the prefix the checkpoint used covered (``0``: none was
    used, the whole log was reduced) and ``hash`` (when ``running_hash``) a ``hashlib``
    SHA-256 object over ``data``, to be continued with the lines committed later.

    Raises :class:`~tether.errors.SessionCorruption` exactly as a full reduction does.
    """
    if sidecar is not None:
        found = _from_checkpoint(data, sidecar)
        if found is not None:
            reducer, covered, hasher = found
            if running_hash:
                hasher.update(memoryview(data)[covered:])
            return reducer, covered, hasher if running_hash else None
    reducer = load_reducer(data)
    return reducer, 0, hashlib.sha256(data) if running_hash else None


def save(reducer: Reducer, hasher: Any, sidecar: FileSidecar) -> bool:
    """Write the checkpoint of ``reducer``, whose whole committed log hashes to ``hasher``
    (a ``hashlib`` SHA-256 object); ``False`` if it could not be (nothing is raised: a
    checkpoint is an optimisation)."""
    identity = reducer_identity()
    if identity is None:
        return False
    binding = CheckpointBinding(
        session_id=reducer.state.header.id,
        length=reducer.length,
        lines=reducer.line_count,
        digest="sha256:" + hasher.hexdigest(),
        reducer=identity,
    )
    try:
        sidecar.write(encode_checkpoint(reducer, binding))
    except (CheckpointMismatch, OSError):
        return False
    return True


def _from_checkpoint(data: bytes, sidecar: FileSidecar) -> tuple[Reducer, int, Any] | None:
    identity = reducer_identity()
    if identity is None:
        return None
    # A checkpoint is never much larger than the log it describes (each ID, message and
    # snapshot once); anything larger is not one.
    raw, _ = FileSidecar(sidecar.path, limit=2 * len(data) + DEFAULT_LIMIT).read()
    if not raw:
        return None
    try:
        claimed = read_binding(raw)
    except CheckpointMismatch:
        return None
    length = claimed.length
    if claimed.reducer != identity or length > len(data) or data[length - 1] != 0x0A:
        return None
    prefix = memoryview(data)[:length]
    hasher = hashlib.sha256(prefix)
    first = data.index(b"\n")
    expected = CheckpointBinding(
        session_id=claimed.session_id,
        length=length,
        lines=claimed.lines,
        digest="sha256:" + hasher.hexdigest(),
        reducer=identity,
    )
    try:
        with gc_paused():
            reducer = decode_checkpoint(raw, expected, data[:first])
            for line in _lines(data, length):
                reducer.feed(line)
    except (CheckpointMismatch, SessionCorruption):
        # A rejected tail line is reported by the full reduction, with its own verdict.
        return None
    return reducer, length, hasher


def _lines(data: bytes, start: int) -> Iterator[bytes]:
    """The LF-terminated lines of ``data`` from ``start`` (which follows an LF), without
    their LF."""
    find = data.find
    end = find(b"\n", start)
    while end >= 0:
        yield data[start:end]
        start = end + 1
        end = find(b"\n", start)
