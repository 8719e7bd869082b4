"""Deterministic generator of valid session v2 logs for benchmarks and tests.

Every turn follows the writer sequence of spec 15.2 ("run with one tool call, then an
answer"), as seven transactions:

1. [user entry E1, ``runStarted`` R]
2. ``stepAttempt`` (step S1, attempt A1, attempt 1, ``contextThroughEntryId`` = E1)
3. [assistant entry E2 (``toolUse``, one ``read`` call), usage for A1]
4. ``toolStarted`` T1 (replay ``safe``, ``builtin:read:v1``, ``resultEntryId`` E3)
5. tool result entry E3 (started form, ``success``) with source-code-like content
6. ``stepAttempt`` (step S2, attempt A2, attempt 1, ``contextThroughEntryId`` = E3)
7. [assistant entry E4 (``stop``, text), usage for A2, ``operationFinished`` completed/normal]

IDs are UUIDv7-shaped (lower-case hex, version 7, variant 8-b) and come from a counter;
the clock is fixed. A turn's IDs, ``seq`` values and content depend only on the seed
and the turn number, so any turn can be produced on its own (:func:`turn_lines`), and
:func:`next_transaction` gives the first transaction of the turn after the last one —
a valid candidate to apply to the state reduced from :func:`generate`.

Lines are serialized with ``orjson.dumps`` (compact, non-ASCII raw, members in the
order written), the way tether's writer does. Nothing runs at import time; tests may
import this module after putting the repo's ``bench/`` folder on ``sys.path``.

API: :func:`generate` (whole file), :func:`session_lines` (header + transaction
lines), :func:`next_transaction`, :func:`turn_lines`, plus the constants describing
the shape of a turn.
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any

import orjson

from tether.core.canonical import configuration_digest

__all__ = [
    "CONTENT_CHARS",
    "FACTS_PER_TURN",
    "IDS_PER_TURN",
    "MESSAGES_PER_TURN",
    "TRANSACTIONS_PER_TURN",
    "generate",
    "header_line",
    "next_transaction",
    "session_lines",
    "turn_lines",
]

TRANSACTIONS_PER_TURN = 7
FACTS_PER_TURN = 11
MESSAGES_PER_TURN = 4
IDS_PER_TURN = 16  # 11 fact IDs + operation, 2 steps, 2 attempts (E3 is a fact ID)

CLOCK_MS = 1_760_000_000_000  # fixed clock (2025-10-09T08:53:20Z)
_ENVIRONMENT = "/workspace/tether-bench"
_ZERO_DIGEST = "sha256:" + "0" * 64

# Default size of the tool output per turn (characters, +-10% per turn). A turn's other
# facts (11 envelopes, ~40 IDs, two full configuration snapshots, usage) take ~5.6 KB
# on their own, so 10,000 turns cannot get below ~56 MB; with 1 KB of tool output a
# 10,000-turn session is ~67 MB, with 4 KB ~96 MB.
CONTENT_CHARS = 1000


def _id(seed: int, counter: int) -> str:
    """UUIDv7 text form: fixed 48-bit timestamp, version 7, variant 8-b, seed and counter."""
    head = f"{CLOCK_MS:012x}"
    rand_a = (counter >> 48) & 0xFFF
    variant = 0x8 | ((seed >> 12) & 0x3)
    return (
        f"{head[:8]}-{head[8:12]}-7{rand_a:03x}-"
        f"{variant:x}{seed & 0xFFF:03x}-{counter & 0xFFFF_FFFF_FFFF:012x}"
    )


@cache
def _snapshot() -> tuple[dict[str, Any], str]:
    snapshot: dict[str, Any] = {
        "model": "bench/model-large",
        "systemPromptDigest": "sha256:" + "1" * 64,
        "tools": [
            {"name": "read", "definitionDigest": "sha256:" + "2" * 64},
            {"name": "bash", "definitionDigest": "sha256:" + "3" * 64},
        ],
        "adapterIdentity": "openrouter:chat-completions:v1",
        "routingIdentity": "openrouter:bench/model-large",
        "outputOptionsDigest": _ZERO_DIGEST,
    }
    return snapshot, configuration_digest(snapshot)


def header_line(*, seed: int = 0) -> bytes:
    """Line 1 (without its LF)."""
    return orjson.dumps(
        {
            "kind": "header",
            "version": 2,
            "id": _id(seed, 0),
            "createdAt": CLOCK_MS,
            "cwd": "/workspace/tether-bench",
            "provider": "openrouter",
            "model": "bench/model-large",
            "environmentIdentity": _ENVIRONMENT,
        }
    )


# ----------------------------------------------------------------------------- content

_WORDS = (
    "session", "reducer", "state", "entry", "record", "usage", "digest", "buffer",
    "offset", "parser", "writer", "lock", "commit", "header", "result", "value",
    "config", "tool", "step", "attempt", "cursor", "index", "payload", "message",
)  # fmt: skip
_NOTES = (
    "naïve fallback — keep in sync with the spec",
    "café-style retry (≤ 2 attempts)",
    "über-fast path: größer als 4 KiB → stream",
    "TODO(josé): handle the ½-written tail",
    "résumé of the état: see §11.3",
    "±1 ms clock skew is fine, 10 µs is not",
    "ok ✓ — verified on 日本語 paths too",
    "emoji in prompts 🚀 must round-trip",
)
_PATHS = (
    "src/app/main.py", "src/app/io/reader.py", "lib/util/strings.ts",
    "cmd/server/main.go", "src/core/session.rs", "docs/guide.md",
    "tests/test_reader.py", "scripts/release.sh",
)  # fmt: skip


def _code_line(rng: random.Random) -> str:
    a, b, c = rng.choice(_WORDS), rng.choice(_WORDS), rng.choice(_WORDS)
    n = rng.randrange(1000)
    pick = rng.randrange(10)
    indent = "    " * rng.randrange(3)
    if pick == 0:
        return f"{indent}# {rng.choice(_NOTES)}"
    if pick == 1:
        return f'{indent}{a}_path = "C:\\\\Users\\\\{b}\\\\{c}_{n}.json"'
    if pick == 2:
        return f'{indent}pattern = re.compile(r"^{a}\\s*=\\s*\\"(\\d+)\\"$")'
    if pick == 3:
        return f"{indent}def {a}_{b}(self, {c}: int = {n}) -> str:"
    if pick == 4:
        return f'{indent}raise ValueError(f"bad {a}: {{{b}!r}} (expected \\"{c}\\")")'
    if pick == 5:
        return f"{indent}return {{'{a}': {b}_{n}, \"{c}\": [{n}, {n + 1}]}}"
    if pick == 6:
        return f"{indent}if {a}.{b} is None and len({c}) > {n}:"
    if pick == 7:
        return f"{indent}{a}.{b}({c}, timeout={n / 10:.1f})\t# tab-separated"
    if pick == 8:
        return ""
    return f"{indent}self.{a}_{b} = {c}_{n}  # {a} → {b}"


def _content(rng: random.Random, path: str, chars: int) -> str:
    lines = [f'"""{path}: generated fixture, do not edit."""', "from __future__ import annotations"]
    size = sum(len(line) + 1 for line in lines)
    target = chars + rng.randrange(-chars // 10, chars // 10 + 1)
    while size < target:
        line = _code_line(rng)
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- turns


def _fact(kind: str, seq: int, ident: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "seq": seq, "id": ident, "timestamp": CLOCK_MS + seq, **body}


def _turn_facts(turn: int, seed: int, chars: int) -> list[list[dict[str, Any]]]:
    """The seven transactions of ``turn`` (0-based), each a list of facts."""
    rng = random.Random(seed * 1_000_003 + turn)
    base = 1 + turn * IDS_PER_TURN
    ids = [_id(seed, base + i) for i in range(IDS_PER_TURN)]
    (e1, f_run, run, f_step1, step1, attempt1, e2, u1, f_tool, e3) = ids[:10]
    (f_step2, step2, attempt2, e4, u2, f_fin) = ids[10:16]
    seq = 1 + turn * FACTS_PER_TURN
    snapshot, digest = _snapshot()
    path = rng.choice(_PATHS)
    call_id = f"call_{turn:06d}_{rng.randrange(1 << 32):08x}"
    arguments = {"path": path, "offset": rng.randrange(200), "limit": 400}
    user_text = (
        f"Turn {turn}: please read {path} and explain the {rng.choice(_WORDS)} "
        f'handling (résumé ≤ 3 lines, "quoted" terms ok).'
    )
    answer = (
        f"{path} builds the {rng.choice(_WORDS)} from the {rng.choice(_WORDS)}; "
        f'the {rng.choice(_WORDS)} path escapes \\"quotes\\" and keeps naïve text. '
        f"Nothing to change in turn {turn}."
    )

    def usage(fact_seq: int, ident: str, attempt_id: str) -> dict[str, Any]:
        counters = {
            "input": 1000 + rng.randrange(9000),
            "output": 10 + rng.randrange(500),
            "cacheRead": rng.randrange(5000),
            "cacheWrite": 0,
        }
        body = {"operationId": run, "attemptId": attempt_id, "usage": counters}
        return _fact("usage", fact_seq, ident, body)

    def step(fact_seq: int, ident: str, step_id: str, attempt_id: str, through: str) -> Any:
        record = {
            "type": "stepAttempt",
            "operationId": run,
            "stepId": step_id,
            "attemptId": attempt_id,
            "stepKind": "assistant",
            "attempt": 1,
            "contextThroughEntryId": through,
            "configurationSnapshot": snapshot,
            "configurationDigest": digest,
        }
        return _fact("record", fact_seq, ident, {"record": record})

    return [
        [
            _fact(
                "entry",
                seq,
                e1,
                {"entry": {"type": "message", "message": {"role": "user", "content": user_text}}},
            ),
            _fact(
                "record",
                seq + 1,
                f_run,
                {
                    "record": {
                        "type": "runStarted",
                        "operationId": run,
                        "operationKind": "run",
                        "inputEntryId": e1,
                    }
                },
            ),
        ],
        [step(seq + 2, f_step1, step1, attempt1, e1)],
        [
            _fact(
                "entry",
                seq + 3,
                e2,
                {
                    "entry": {
                        "type": "message",
                        "stepId": step1,
                        "attemptId": attempt1,
                        "stopReason": "toolUse",
                        "message": {
                            "role": "assistant",
                            "content": None if turn % 3 else "Let me look at the file.",
                            "tool_calls": [
                                {
                                    "id": call_id,
                                    "type": "function",
                                    "function": {
                                        "name": "read",
                                        "arguments": orjson.dumps(arguments).decode(),
                                    },
                                }
                            ],
                        },
                    }
                },
            ),
            usage(seq + 4, u1, attempt1),
        ],
        [
            _fact(
                "record",
                seq + 5,
                f_tool,
                {
                    "record": {
                        "type": "toolStarted",
                        "operationId": run,
                        "stepId": step1,
                        "assistantEntryId": e2,
                        "toolIndex": 0,
                        "toolCallId": call_id,
                        "toolName": "read",
                        "arguments": arguments,
                        "replay": "safe",
                        "replayKey": "builtin:read:v1",
                        "environmentIdentity": _ENVIRONMENT,
                        "resultEntryId": e3,
                    }
                },
            )
        ],
        [
            _fact(
                "entry",
                seq + 6,
                e3,
                {
                    "entry": {
                        "type": "message",
                        "stepId": step1,
                        "message": {
                            "role": "tool",
                            "content": _content(rng, path, chars),
                            "tool_call_id": call_id,
                        },
                        "toolName": "read",
                        "toolStartedId": f_tool,
                        "result": {"type": "success"},
                    }
                },
            )
        ],
        [step(seq + 7, f_step2, step2, attempt2, e3)],
        [
            _fact(
                "entry",
                seq + 8,
                e4,
                {
                    "entry": {
                        "type": "message",
                        "stepId": step2,
                        "attemptId": attempt2,
                        "stopReason": "stop",
                        "message": {"role": "assistant", "content": answer},
                    }
                },
            ),
            usage(seq + 9, u2, attempt2),
            _fact(
                "record",
                seq + 10,
                f_fin,
                {
                    "record": {
                        "type": "operationFinished",
                        "operationId": run,
                        "operationKind": "run",
                        "outcome": "completed",
                        "completion": "normal",
                        "finalEntryId": e4,
                    }
                },
            ),
        ],
    ]


def _line(facts: list[dict[str, Any]]) -> bytes:
    line: bytes = orjson.dumps(facts[0] if len(facts) == 1 else facts)
    return line


def turn_lines(turn: int, *, seed: int = 0, content_chars: int = CONTENT_CHARS) -> list[bytes]:
    """The seven transaction lines (without LF) of ``turn`` (0-based)."""
    return [_line(facts) for facts in _turn_facts(turn, seed, content_chars)]


def session_lines(
    turns: int, *, seed: int = 0, content_chars: int = CONTENT_CHARS
) -> tuple[bytes, list[bytes]]:
    """The header line and the ``7 * turns`` transaction lines, all without LF."""
    lines: list[bytes] = []
    for turn in range(turns):
        lines.extend(turn_lines(turn, seed=seed, content_chars=content_chars))
    return header_line(seed=seed), lines


def generate(turns: int, *, seed: int = 0, content_chars: int = CONTENT_CHARS) -> bytes:
    """A complete session file of ``turns`` turns (every line LF-terminated)."""
    header, lines = session_lines(turns, seed=seed, content_chars=content_chars)
    return b"\n".join([header, *lines, b""])


def next_transaction(turns: int, *, seed: int = 0, content_chars: int = CONTENT_CHARS) -> bytes:
    """The first transaction of the turn after ``turns`` complete turns.

    [user entry, ``runStarted``]: valid to apply (or ``check``) against the state
    reduced from ``generate(turns, seed=seed)``.
    """
    return turn_lines(turns, seed=seed, content_chars=content_chars)[0]


def _main() -> None:
    """``python bench/sessiongen.py [TURNS] [OUT]``: generate, verify and report."""
    import sys

    from tether.core.reducer import reduce_session

    turns = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    data = generate(turns)
    state = reduce_session(data)
    assert state.operation.kind == "idle", state.operation
    assert len(state.transcript) == MESSAGES_PER_TURN * turns
    assert state.last_seq == FACTS_PER_TURN * turns
    print(
        f"{turns} turns: {len(data) / 1e6:.2f} MB, {TRANSACTIONS_PER_TURN * turns + 1} lines, "
        f"{len(state.transcript)} messages, reduced OK"
    )
    if len(sys.argv) > 2:
        with open(sys.argv[2], "wb") as out:
            out.write(data)


if __name__ == "__main__":
    _main()
