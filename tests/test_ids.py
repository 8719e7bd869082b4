"""UUIDv7 formatting and the monotonic per-process generator."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid

import pytest

from tether import _ids as ids
from tether._ids import UUID7_PATTERN, is_uuid7, new_uuid7, uuid7


def test_uuid7_is_pure_and_lays_out_the_fields() -> None:
    rand = bytes(range(10))
    value = uuid7(0x0123_4567_89AB, rand)
    assert value == uuid7(0x0123_4567_89AB, rand)
    assert UUID7_PATTERN.match(value)
    parsed = uuid.UUID(value)
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122
    assert parsed.int >> 80 == 0x0123_4567_89AB
    assert (parsed.int >> 64) & 0xFFF == int.from_bytes(rand[0:2], "big") & 0xFFF
    assert parsed.int & ((1 << 62) - 1) == int.from_bytes(rand[2:10], "big") & ((1 << 62) - 1)


def test_uuid7_extremes_match_the_session_format_rule() -> None:
    assert uuid7(0, bytes(10)) == "00000000-0000-7000-8000-000000000000"
    top = uuid7((1 << 48) - 1, b"\xff" * 10)
    assert top == "ffffffff-ffff-7fff-bfff-ffffffffffff"
    assert UUID7_PATTERN.match(top)


@pytest.mark.parametrize(("ms", "rand"), [(-1, bytes(10)), (1 << 48, bytes(10)), (0, bytes(9))])
def test_uuid7_rejects_bad_input(ms: int, rand: bytes) -> None:
    with pytest.raises(ValueError):
        uuid7(ms, rand)


def test_new_uuid7_is_valid_unique_and_strictly_increasing() -> None:
    values = [new_uuid7() for _ in range(20_000)]
    assert all(is_uuid7(v) for v in values)
    assert len(set(values)) == len(values)
    assert values == sorted(values)
    assert [uuid.UUID(v).int for v in values] == sorted(uuid.UUID(v).int for v in values)


def test_new_uuid7_timestamp_is_the_wall_clock() -> None:
    import time

    before = time.time_ns() // 1_000_000
    value = new_uuid7()
    after = time.time_ns() // 1_000_000
    # may run ahead by the counter-overflow borrowing, never behind
    assert before <= uuid.UUID(value).int >> 80 <= after + 5


def test_new_uuid7_counter_overflow_borrows_the_next_millisecond(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gen = ids._Generator()
    monkeypatch.setattr(ids.time, "time_ns", lambda: 1_000_000 * 1_000_000)  # frozen clock
    values = [gen() for _ in range(5000)]  # > 4096 - 2048: must overflow at least once
    assert values == sorted(values) and len(set(values)) == len(values)
    stamps = {uuid.UUID(v).int >> 80 for v in values}
    assert min(stamps) == 1_000_000 and max(stamps) >= 1_000_001


def test_new_uuid7_survives_a_clock_step_backwards(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = ids._Generator()
    clock = iter([5_000, 5_000, 4_000, 3_000, 5_000, 6_000])
    monkeypatch.setattr(ids.time, "time_ns", lambda: next(clock) * 1_000_000)
    values = [gen() for _ in range(6)]
    assert values == sorted(values) and len(set(values)) == 6


def test_new_uuid7_is_thread_safe() -> None:
    out: list[list[str]] = [[] for _ in range(4)]

    def work(i: int) -> None:
        out[i].extend(new_uuid7() for _ in range(5000))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [v for chunk in out for v in chunk]
    assert len(set(flat)) == len(flat)
    for chunk in out:
        assert chunk == sorted(chunk)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_children_do_not_repeat_the_parents_randomness() -> None:
    new_uuid7()  # fill the parent's random buffer
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(read)
        os.write(write, "\n".join(new_uuid7() for _ in range(50)).encode())
        os._exit(0)
    os.close(write)
    mine = {new_uuid7() for _ in range(50)}
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    theirs = set(b"".join(chunks).decode().split("\n"))
    assert len(theirs) == 50
    # different rand_b even when timestamp and counter coincide
    assert {v[19:] for v in mine}.isdisjoint({v[19:] for v in theirs})


def test_two_processes_never_collide() -> None:
    code = "from tether._ids import new_uuid7\nprint('\\n'.join(new_uuid7() for _ in range(2000)))"
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    a, b = (set(r.stdout.split()) for r in runs)
    assert len(a) == len(b) == 2000
    assert a.isdisjoint(b)
