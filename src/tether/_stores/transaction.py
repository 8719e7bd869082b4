"""What every session store does to a transaction before it stores it (steps T1–T4).

Both stores (:mod:`tether._stores.file`, :mod:`tether._stores.memory`) build the header
line and every transaction line here, so a session is encoded the same way whatever holds
it: the store assigns ``seq`` (consecutive), one ``timestamp`` per transaction (from its
clock) and an ``id`` to facts that carry none (a provisioned ``id`` is kept); the line is
one JSON value (the fact itself, or a list of them) serialized with strict integers. The
reducer validates the line next (T5, :meth:`tether.core.reducer.Reducer.begin`), in the
store, before anything is stored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from tether._loading import load_reducer
from tether.core import facts as fact_kinds
from tether.core.reducer import Reducer
from tether.errors import FactRejected, SessionCorruption

__all__ = ["encode_header", "encode_transaction"]


def encode_header(
    *,
    session_id: str,
    created_at: int,
    cwd: str,
    provider: str,
    model: str,
    environment_identity: str,
) -> tuple[bytes, Reducer]:
    """The header line (with its LF) of a new session and the reducer that accepted it;
    :class:`~tether.errors.FactRejected` when the values make no valid header."""
    header = fact_kinds.header(
        session_id=session_id,
        created_at=created_at,
        cwd=cwd,
        provider=provider,
        model=model,
        environment_identity=environment_identity,
    )
    try:
        line = orjson.dumps(header, option=orjson.OPT_STRICT_INTEGER)
    except orjson.JSONEncodeError as exc:
        raise FactRejected("INVALID_HEADER", 1, None, str(exc)) from None
    data = line + b"\n"
    try:
        reducer = load_reducer(data)
    except SessionCorruption as exc:
        raise FactRejected(exc.code, exc.line, exc.seq, exc.detail) from None
    return data, reducer


def encode_transaction(
    reducer: Reducer,
    facts: Sequence[Mapping[str, Any]],
    *,
    clock: Callable[[], int],
    new_id: Callable[[], str],
) -> tuple[list[dict[str, Any]], bytes]:
    """T1–T4: the facts as they will be committed and their line (without the LF).

    An empty transaction or one that is not JSON raises
    :class:`~tether.errors.FactRejected`; nothing is validated against the log yet.
    """
    count = len(facts)
    if count == 0:
        raise FactRejected("EMPTY_TRANSACTION", reducer.line_count + 1, None, "no facts")
    # T1–T3: seq (consecutive), one timestamp, ids for facts without one.
    now = clock()
    seq = reducer.next_seq
    committed: list[dict[str, Any]] = []
    try:
        for fact in facts:
            out: dict[str, Any] = {"kind": None, "seq": seq, "id": None, **fact}
            out["seq"] = seq
            out["timestamp"] = now
            if out["id"] is None:
                out["id"] = new_id()
            committed.append(out)
            seq += 1
        # T4: one line.
        line = orjson.dumps(
            committed[0] if count == 1 else committed, option=orjson.OPT_STRICT_INTEGER
        )
    except (TypeError, ValueError) as exc:  # not a mapping / not JSON-serializable
        raise FactRejected(
            "INVALID_FACT", reducer.line_count + 1, None, f"not serializable: {exc}"
        ) from None
    return committed, line
