"""The durable session store: create/open/commit/close, repair, locking, lookup and listing.

Crash consistency with real killed subprocesses lives in ``test_store_crash.py``.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tether._ids import is_uuid7
from tether._stores import file as store_module
from tether._stores.file import (
    Durability,
    SessionStore,
    SessionStoreProtocol,
    find_session,
    list_sessions,
    session_file_name,
    sessions_dir_for,
)
from tether.core import reduce_session
from tether.errors import (
    AmbiguousSessionId,
    ConfigurationError,
    CorruptSession,
    FactRejected,
    SessionBusy,
    SessionCorruption,
    SessionCreateError,
    SessionNotFound,
    SessionWriteError,
    StoreUnavailable,
    TetherError,
    UnsafeSessionPath,
    UnsupportedSessionVersion,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "tests" / "conformance" / "fixtures"


def user(text: str = "hello") -> dict[str, Any]:
    return {
        "kind": "entry",
        "entry": {"type": "message", "message": {"role": "user", "content": text}},
    }


def make(workspace: Path, durability: str = "process", **kw: Any) -> SessionStore:
    return SessionStore.create(
        workspace,
        provider="openrouter",
        model="test/model",
        environment_identity="test-env",
        durability=durability,
        **kw,
    )


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def store(workspace: Path) -> Iterator[SessionStore]:
    s = make(workspace)
    yield s
    s.close()


def snapshot(s: SessionStore) -> tuple[bytes, dict[str, Any], int]:
    return s.path.read_bytes(), s.state.to_json(), s.length


def lines_of(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_bytes().split(b"\n")[:-1]]


# --------------------------------------------------------------------------- create


def test_create_writes_exactly_the_header_with_safe_modes(workspace: Path) -> None:
    s = make(workspace)
    try:
        sdir = sessions_dir_for(workspace)
        assert s.path.parent == sdir
        assert stat.S_IMODE(os.stat(sdir).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(sdir.parent).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(s.path).st_mode) == 0o600
        assert is_uuid7(s.session_id)
        [header] = lines_of(s.path)
        assert header == {
            "kind": "header",
            "version": 2,
            "id": s.session_id,
            "createdAt": header["createdAt"],
            "cwd": str(workspace),
            "provider": "openrouter",
            "model": "test/model",
            "environmentIdentity": "test-env",
        }
        assert s.path.name == session_file_name(header["createdAt"], s.session_id)
        assert s.path.read_bytes().endswith(b"}\n")
        assert s.state.operation.kind == "idle" and s.state.last_seq == 0
        assert s.repaired == 0 and not s.read_only
        names = sorted(os.listdir(sdir))
        assert names == [s.path.name, s.path.name + ".lock"]  # no temporary left behind
        st = os.stat(s.path)
        record = (sdir / (s.path.name + ".lock")).read_text()
        assert record == f"{os.getpid()} {st.st_dev} {st.st_ino}\n"  # pid, and which log
    finally:
        s.close()
    assert sorted(os.listdir(sessions_dir_for(workspace))) == [s.path.name]


def test_create_with_pinned_clock_and_ids(workspace: Path) -> None:
    counter = iter(range(1, 1000))

    def ids() -> str:
        return f"018f0000-0000-7000-8000-{next(counter):012x}"

    with make(workspace, clock=lambda: 1_710_000_000_000, ids=ids) as s:
        assert s.session_id == "018f0000-0000-7000-8000-000000000001"
        assert s.path.name == "1710000000000_018f0000-0000-7000-8000-000000000001.jsonl"
        [fact] = s.commit([user()])
        assert fact == {
            "kind": "entry",
            "seq": 1,
            "id": "018f0000-0000-7000-8000-000000000002",
            "timestamp": 1_710_000_000_000,
            "entry": user()["entry"],
        }


def test_create_refuses_an_invalid_header_and_leaves_nothing(workspace: Path) -> None:
    with pytest.raises(FactRejected) as info:
        SessionStore.create(workspace, provider="", model="m", environment_identity="e")
    assert info.value.code == "INVALID_HEADER"
    assert os.listdir(sessions_dir_for(workspace)) == []


def test_create_in_an_explicit_sessions_dir(tmp_path: Path) -> None:
    sdir = tmp_path / "a" / "b" / "sessions"
    with make(tmp_path, sessions_dir=sdir) as s:
        assert s.path.parent == sdir
        assert stat.S_IMODE(os.stat(sdir).st_mode) == 0o700


def test_durable_create_syncs_file_and_directory(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(store_module, "_fdatasync", lambda fd: calls.append("file"))
    monkeypatch.setattr(store_module, "_fsync_dir", lambda fd: calls.append("dir"))
    make(workspace, "durable").close()
    assert calls == ["file", "dir"]
    calls.clear()
    make(workspace, "process").close()
    assert calls == []


# --------------------------------------------------------------------------- commit


def test_commit_assigns_seq_ids_and_timestamps(store: SessionStore) -> None:
    [a] = store.commit([user("one")])
    b, c = store.commit(
        [user("two"), {**user("three"), "id": "018f0000-0000-7000-8000-0000000000aa"}]
    )
    assert (a["seq"], b["seq"], c["seq"]) == (1, 2, 3)
    assert is_uuid7(a["id"]) and is_uuid7(b["id"])
    assert c["id"] == "018f0000-0000-7000-8000-0000000000aa"  # provisioned id kept
    assert b["timestamp"] == c["timestamp"]  # one timestamp per transaction
    _header, first, second = lines_of(store.path)
    assert first == a  # a single fact is a bare object
    assert second == [b, c]  # several facts are one array line
    assert store.state.last_seq == 3
    assert store.state.to_json() == reduce_session(store.path.read_bytes()).to_json()
    assert store.length == store.path.stat().st_size == store.state.repaired_length


def test_commit_does_not_mutate_the_input(store: SessionStore) -> None:
    fact = user()
    store.commit([fact])
    assert fact == user()


def test_caller_supplied_seq_and_timestamp_are_overridden(store: SessionStore) -> None:
    [fact] = store.commit([{**user(), "seq": 99, "timestamp": 5}])
    assert fact["seq"] == 1 and fact["timestamp"] != 5


@pytest.mark.parametrize(
    ("facts", "code"),
    [
        ([], "EMPTY_TRANSACTION"),
        (
            [{"kind": "entry", "entry": {"type": "message", "message": {"role": "bogus"}}}],
            "INVALID_FACT",
        ),
        ([{"entry": user()["entry"]}], "INVALID_FACT"),
        ([{**user(), "id": "not-an-id"}], "INVALID_FACT"),
        ([{**user(), "extra": 1}], "INVALID_FACT"),
        ([user(), {**user(), "unexpected": True}], "INVALID_FACT"),
        (
            [
                {
                    **user(),
                    "entry": {
                        "type": "message",
                        "message": {"role": "user", "content": "x"},
                        "n": 2**60,
                    },
                }
            ],
            "INVALID_FACT",
        ),
        ([{**user(), "entry": {"x": {1, 2}}}], "INVALID_FACT"),
        ([user("\ud800 lone surrogate")], "INVALID_FACT"),
        ([["not", "a", "mapping"]], "INVALID_FACT"),
        (
            [
                {
                    "kind": "record",
                    "record": {
                        "type": "operationFinished",
                        "operationId": "018f0000-0000-7000-8000-0000000000ff",
                        "operationKind": "run",
                        "outcome": "completed",
                    },
                }
            ],
            "INVALID_REFERENCE",
        ),
    ],
)
def test_a_rejected_candidate_changes_nothing(
    store: SessionStore, facts: list[Any], code: str
) -> None:
    store.commit([user("before")])
    before = snapshot(store)
    with pytest.raises(FactRejected) as info:
        store.commit(facts)
    assert isinstance(info.value, SessionCorruption)
    assert info.value.code == code
    assert info.value.line == 3
    assert snapshot(store) == before
    [fact] = store.commit([user("after")])
    assert fact["seq"] == 2


def test_rejection_reports_the_seq_of_the_offending_fact(store: SessionStore) -> None:
    store.commit([user()])
    with pytest.raises(FactRejected) as info:
        store.commit([user("ok"), user("ok too"), {**user(), "bad": 1}])
    assert (info.value.code, info.value.line, info.value.seq) == ("INVALID_FACT", 3, 4)


def test_duplicate_provisioned_id_is_rejected(store: SessionStore) -> None:
    [fact] = store.commit([user()])
    before = snapshot(store)
    with pytest.raises(FactRejected) as info:
        store.commit([{**user(), "id": fact["id"]}])
    assert info.value.code == "DUPLICATE_ID"
    assert snapshot(store) == before


def test_a_realistic_run_round_trips(store: SessionStore) -> None:
    """Prompt, runStarted, attempt, answer, finish: the shapes a real run commits."""
    from tether._ids import new_uuid7

    entry_id, op_id, step_id, attempt_id, answer_id = (new_uuid7() for _ in range(5))
    snapshot_cfg = {
        "model": "test/model",
        "systemPromptDigest": "sha256:" + "0" * 64,
        "tools": [],
        "adapterIdentity": "openrouter:chat-completions:v1",
        "routingIdentity": "openrouter:test/model",
        "outputOptionsDigest": "sha256:" + "0" * 64,
    }
    from tether.core.canonical import configuration_digest

    store.commit(
        [
            {**user("hi"), "id": entry_id},
            {
                "kind": "record",
                "record": {
                    "type": "runStarted",
                    "operationId": op_id,
                    "operationKind": "run",
                    "inputEntryId": entry_id,
                },
            },
        ]
    )
    store.commit(
        [
            {
                "kind": "record",
                "record": {
                    "type": "stepAttempt",
                    "operationId": op_id,
                    "stepId": step_id,
                    "attemptId": attempt_id,
                    "attempt": 1,
                    "stepKind": "assistant",
                    "contextThroughEntryId": entry_id,
                    "configurationSnapshot": snapshot_cfg,
                    "configurationDigest": configuration_digest(snapshot_cfg),
                },
            }
        ]
    )
    assert store.state.operation.kind == "run"
    store.commit(
        [
            {
                "id": answer_id,
                "kind": "entry",
                "entry": {
                    "type": "message",
                    "stepId": step_id,
                    "attemptId": attempt_id,
                    "stopReason": "stop",
                    "message": {"role": "assistant", "content": "hello"},
                },
            },
            {
                "kind": "record",
                "record": {
                    "type": "operationFinished",
                    "operationId": op_id,
                    "operationKind": "run",
                    "outcome": "completed",
                    "completion": "normal",
                    "finalEntryId": answer_id,
                },
            },
        ]
    )
    assert store.state.operation.kind == "idle"
    store.close()
    with SessionStore.open(store.path, sessions_dir=store.path.parent) as again:
        assert again.state.to_json() == store.state.to_json()
        assert again.state.last_seq == 5


# --------------------------------------------------------------------------- write seam


def chunked_write(size: int) -> Callable[[int, bytes | memoryview], int]:
    def write(fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, bytes(data[:size]))

    return write


@pytest.mark.parametrize("size", [1, 7, 100])
def test_short_writes_are_continued(store: SessionStore, size: int) -> None:
    store._write = chunked_write(size)
    store.commit([user("x" * 300)])
    store.commit([user("y"), user("z")])
    assert store.state.last_seq == 3
    assert store.state.to_json() == reduce_session(store.path.read_bytes()).to_json()


def failing_write(
    code: int, *, first: int = 0, exc: type[BaseException] = OSError
) -> Callable[[int, bytes | memoryview], int]:
    """Write ``first`` bytes (a short write), then fail with ``code``."""
    calls = [0]

    def write(fd: int, data: bytes | memoryview) -> int:
        calls[0] += 1
        if calls[0] == 1 and first:
            return os.write(fd, bytes(data[:first]))
        if exc is OSError:
            raise OSError(code, os.strerror(code))
        raise exc()

    return write


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO, errno.EDQUOT])
@pytest.mark.parametrize("first", [0, 1, 50])
@pytest.mark.parametrize("durability", ["process", "durable"])
def test_write_errors_leave_file_and_state_unchanged(
    workspace: Path, code: int, first: int, durability: str
) -> None:
    with make(workspace, durability) as s:
        s.commit([user("committed")])
        before = snapshot(s)
        s._write = failing_write(code, first=first)
        with pytest.raises(SessionWriteError) as info:
            s.commit([user("x" * 200), user("y")])
        err = info.value
        assert err.errno == code and not err.failed and err.exit_code == 9
        assert isinstance(err, OSError) and isinstance(err, TetherError)
        assert snapshot(s) == before
        s._write = os.write
        [again] = s.commit([user("later")])  # still usable, same seq
        assert again["seq"] == 2
        assert s.state.to_json() == reduce_session(s.path.read_bytes()).to_json()


def test_a_write_that_makes_no_progress_is_an_error(store: SessionStore) -> None:
    before = snapshot(store)
    store._write = lambda fd, data: 0
    with pytest.raises(SessionWriteError) as info:
        store.commit([user()])
    assert info.value.errno == errno.EIO
    assert snapshot(store) == before


def test_an_interrupt_mid_write_is_undone(store: SessionStore) -> None:
    before = snapshot(store)
    store._write = failing_write(0, first=10, exc=KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        store.commit([user("x" * 100)])
    assert snapshot(store) == before
    store._write = os.write
    assert store.commit([user()])[0]["seq"] == 1


@pytest.mark.parametrize("code", [errno.EIO, errno.ENOSPC])
def test_a_failed_sync_undoes_the_write_and_fails_the_store(workspace: Path, code: int) -> None:
    s = make(workspace, "durable")
    s.commit([user("committed")])
    before = snapshot(s)

    def bad_sync(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    s._sync = bad_sync
    with pytest.raises(SessionWriteError) as info:
        s.commit([user("lost")])
    assert info.value.failed and info.value.op == "fdatasync"
    assert snapshot(s) == before
    with pytest.raises(StoreUnavailable) as unavailable:
        s.commit([user("refused")])
    assert unavailable.value.exit_code == 10
    assert s.path.read_bytes() == before[0]
    s.close()
    with SessionStore.open(s.path, sessions_dir=s.path.parent) as again:
        assert again.state.last_seq == 1 and again.repaired == 0
        again.commit([user("after reopen")])


def test_failed_truncate_after_a_write_error_fails_the_store(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store._write = failing_write(errno.EIO, first=5)

    def bad_truncate(fd: int, length: int) -> None:
        raise OSError(errno.EIO, "truncate failed")

    monkeypatch.setattr(store_module.os, "ftruncate", bad_truncate)
    with pytest.raises(SessionWriteError) as info:
        store.commit([user()])
    assert info.value.failed
    assert store.state.last_seq == 0  # memory never adopted the fact
    monkeypatch.undo()
    with pytest.raises(StoreUnavailable):
        store.commit([user()])
    store.close()
    # On reopen the partial line is a torn tail and is repaired.
    with SessionStore.open(store.path, sessions_dir=store.path.parent) as again:
        assert again.repaired == 5 and again.state.last_seq == 0


def test_process_mode_never_syncs(store: SessionStore) -> None:
    def no_sync(fd: int) -> None:
        raise AssertionError("process mode must not sync")

    store._sync = no_sync
    store.commit([user()])


def test_durable_mode_syncs_every_commit(workspace: Path) -> None:
    with make(workspace, "durable") as s:
        synced: list[int] = []
        s._sync = synced.append
        s.commit([user()])
        s.commit([user(), user()])
        assert len(synced) == 2


# --------------------------------------------------------------------------- open / repair


def test_open_repairs_a_torn_tail_and_reports_it(workspace: Path) -> None:
    s = make(workspace)
    s.commit([user("kept")])
    s.close()
    committed = s.path.read_bytes()
    with open(s.path, "ab") as fh:
        fh.write(b'{"kind":"entry","seq":2,"id":"0')
    with SessionStore.open(s.session_id, workspace=workspace) as again:
        assert again.repaired == again.torn_tail == 31
        assert s.path.read_bytes() == committed
        assert again.state.last_seq == 1
        [fact] = again.commit([user("appended after repair")])
        assert fact["seq"] == 2
    assert reduce_session(s.path.read_bytes()).last_seq == 2


def test_durable_repair_syncs_file_and_directory(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make(workspace)
    s.close()
    with open(s.path, "ab") as fh:
        fh.write(b"torn")
    calls: list[str] = []
    monkeypatch.setattr(store_module, "_fdatasync", lambda fd: calls.append("file"))
    monkeypatch.setattr(store_module, "_fsync_dir", lambda fd: calls.append("dir"))
    SessionStore.open(s.path, sessions_dir=s.path.parent, durability="durable").close()
    assert calls == ["file", "dir"]


def test_durable_open_syncs_what_it_read(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log left by a process-mode writer is made durable before a durable writer uses it."""
    s = make(workspace, "process")
    s.commit([user()])
    s.close()
    calls: list[str] = []
    monkeypatch.setattr(store_module, "_fdatasync", lambda fd: calls.append("file"))
    monkeypatch.setattr(store_module, "_fsync_dir", lambda fd: calls.append("dir"))
    SessionStore.open(s.path, sessions_dir=s.path.parent, durability="process").close()
    assert calls == []
    SessionStore.open(s.path, sessions_dir=s.path.parent, durability="durable").close()
    assert calls == ["file", "dir"]


def test_durable_open_and_create_sync_the_directories_that_hold_the_log(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parents of .tether and of the sessions dir, even if an earlier process made them
    (it may have been killed between its mkdir and its fsync); process mode syncs nothing."""
    made = make(workspace, "process")
    made.close()
    synced: list[Path] = []
    monkeypatch.setattr(store_module, "sync_directory", synced.append)
    sdir = sessions_dir_for(workspace)
    SessionStore.open(made.path, workspace=workspace, durability="process").close()
    make(workspace, "process").close()
    assert synced == []
    SessionStore.open(made.path, workspace=workspace, durability="durable").close()
    assert synced == [workspace, sdir.parent]
    synced.clear()
    make(workspace, "durable").close()
    assert synced == [workspace, sdir.parent]
    synced.clear()
    SessionStore.open(made.path, sessions_dir=sdir, durability="durable").close()
    assert synced == [sdir.parent]  # an explicit sessions dir: its ancestors are the caller's


def test_open_of_a_clean_log_repairs_nothing(workspace: Path) -> None:
    s = make(workspace)
    s.commit([user()])
    s.close()
    mtime = s.path.stat().st_mtime_ns
    with SessionStore.open(s.session_id, workspace=workspace) as again:
        assert again.repaired == 0
    assert s.path.stat().st_mtime_ns == mtime


def test_read_only_open_never_repairs(workspace: Path) -> None:
    s = make(workspace)
    s.close()
    with open(s.path, "ab") as fh:
        fh.write(b"torn")
    data = s.path.read_bytes()
    ro = SessionStore.open_read_only(s.session_id, workspace=workspace)
    assert ro.read_only and ro.torn_tail == 4 and ro.repaired == 0
    assert ro.state.last_seq == 0
    assert s.path.read_bytes() == data
    with pytest.raises(StoreUnavailable):
        ro.commit([user()])
    ro.close()


def corrupt_copy(workspace: Path, data: bytes, name: str = "1_bad.jsonl") -> Path:
    sdir = sessions_dir_for(workspace)
    sdir.mkdir(parents=True, exist_ok=True)
    path = sdir / name
    path.write_bytes(data)
    return path


def assert_refused_unchanged(
    path: Path, opener: Callable[[], object], error: type[TetherError]
) -> TetherError:
    data, mtime = path.read_bytes(), path.stat().st_mtime_ns
    with pytest.raises(error) as info:
        opener()
    assert path.read_bytes() == data and path.stat().st_mtime_ns == mtime
    assert "\n" not in str(info.value)
    return info.value


@pytest.mark.parametrize("tail", [b"", b'{"torn'])
def test_a_corrupt_complete_line_is_reported_and_nothing_is_cut(
    workspace: Path, tail: bytes
) -> None:
    good = make(workspace)
    good.commit([user("one")])
    good.commit([user("two")])
    good.close()
    lines = good.path.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"seq":1', b'"seq":7')
    data = b"\n".join(lines) + tail
    path = corrupt_copy(workspace, data, good.path.name)
    for opener in (
        lambda: SessionStore.open(path, sessions_dir=path.parent),
        lambda: SessionStore.open_read_only(path, sessions_dir=path.parent),
    ):
        err = assert_refused_unchanged(path, opener, CorruptSession)
        assert isinstance(err, CorruptSession)
        assert (err.code, err.line, err.seq, err.exit_code) == ("SEQ_MISMATCH", 2, 7, 5)
        assert str(path) in str(err)
    # the failed writer released its lock and left no pid record behind
    assert not (path.parent / (path.name + ".lock")).exists()
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_foreign_version_is_its_own_error(workspace: Path) -> None:
    header = {
        "kind": "header",
        "version": 3,
        "id": "018f0000-0000-7000-8000-000000000001",
        "createdAt": 1,
        "cwd": "/w",
        "provider": "p",
        "model": "m",
        "environmentIdentity": "e",
    }
    path = corrupt_copy(workspace, json.dumps(header).encode() + b"\n")
    err = assert_refused_unchanged(
        path, lambda: SessionStore.open(path, sessions_dir=path.parent), UnsupportedSessionVersion
    )
    assert err.exit_code == 6 and "version" in str(err)


@pytest.mark.parametrize("data", [b"", b"no newline at all", b"\n"])
def test_a_log_without_a_header_is_corrupt_and_untouched(workspace: Path, data: bytes) -> None:
    path = corrupt_copy(workspace, data)
    err = assert_refused_unchanged(
        path, lambda: SessionStore.open(path, sessions_dir=path.parent), CorruptSession
    )
    assert isinstance(err, CorruptSession) and err.code == "MISSING_HEADER"


def test_missing_session(workspace: Path) -> None:
    make(workspace).close()
    for query in ("0123abcd", "ffffffff-ffff-7fff-bfff-ffffffffffff", "nothex!"):
        with pytest.raises(SessionNotFound) as info:
            SessionStore.open(query, workspace=workspace)
        assert info.value.exit_code == 3
    with pytest.raises(SessionNotFound):
        SessionStore.open("anything", workspace=workspace / "nowhere")
    with pytest.raises(SessionNotFound):
        SessionStore.open(sessions_dir_for(workspace) / "1_gone.jsonl", workspace=workspace)


def test_distinct_exit_codes() -> None:
    codes = {
        cls.exit_code
        for cls in (
            SessionNotFound,
            SessionBusy,
            CorruptSession,
            UnsupportedSessionVersion,
            AmbiguousSessionId,
            UnsafeSessionPath,
            SessionWriteError,
            StoreUnavailable,
        )
    }
    assert len(codes) == 8 and 0 not in codes and 1 not in codes and 2 not in codes


# --------------------------------------------------------------------------- hostile paths


def test_symlinks_are_refused(workspace: Path, tmp_path: Path) -> None:
    s = make(workspace)
    s.close()
    sdir = s.path.parent
    link = sdir / "1_link.jsonl"
    link.symlink_to(s.path)
    for opener in (SessionStore.open, SessionStore.open_read_only):
        for target in (link, "1_link.jsonl"):
            with pytest.raises(UnsafeSessionPath) as info:
                opener(target, sessions_dir=sdir)
            assert "symbolic link" in str(info.value) and info.value.exit_code == 8


def test_files_outside_the_sessions_dir_are_refused(workspace: Path, tmp_path: Path) -> None:
    s = make(workspace)
    s.close()
    outside = tmp_path / s.path.name
    outside.write_bytes(s.path.read_bytes())
    for opener in (SessionStore.open, SessionStore.open_read_only):
        with pytest.raises(UnsafeSessionPath):
            opener(outside, workspace=workspace)
        with pytest.raises(UnsafeSessionPath):
            opener(s.path.parent / ".." / s.path.name, workspace=workspace)


def test_a_symlinked_parent_directory_cannot_smuggle_a_file_in(
    workspace: Path, tmp_path: Path
) -> None:
    s = make(workspace)
    s.close()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / s.path.name).write_bytes(s.path.read_bytes())
    (s.path.parent / "sub").symlink_to(elsewhere)
    with pytest.raises(UnsafeSessionPath):
        SessionStore.open(s.path.parent / "sub" / s.path.name, workspace=workspace)


def test_non_regular_files_are_refused_without_hanging(workspace: Path) -> None:
    sdir = sessions_dir_for(workspace)
    sdir.mkdir(parents=True)
    os.mkfifo(sdir / "1_fifo.jsonl")
    (sdir / "2_dir.jsonl").mkdir()
    for name in ("1_fifo.jsonl", "2_dir.jsonl"):
        for opener in (SessionStore.open, SessionStore.open_read_only):
            with pytest.raises(UnsafeSessionPath):
                opener(name, sessions_dir=sdir)
            with pytest.raises(UnsafeSessionPath):
                opener(sdir / name, sessions_dir=sdir)


def test_a_hard_linked_log_is_refused_for_writing(workspace: Path, tmp_path: Path) -> None:
    s = make(workspace)
    s.close()
    os.link(s.path, tmp_path / "victim")
    with pytest.raises(UnsafeSessionPath) as info:
        SessionStore.open(s.path, workspace=workspace)
    assert "hard link" in str(info.value)
    SessionStore.open_read_only(s.path, workspace=workspace)  # reading is harmless


def test_leftover_of_an_interrupted_create_is_cleaned_up(workspace: Path) -> None:
    s = make(workspace)
    s.close()
    leftover = s.path.parent / f".{s.path.name}.creating"
    os.link(s.path, leftover)  # crash between link() and unlink() in create
    with SessionStore.open(s.path, workspace=workspace) as again:
        assert not leftover.exists()
        again.commit([user()])


def test_a_symlinked_lock_sidecar_is_not_followed(workspace: Path, tmp_path: Path) -> None:
    s = make(workspace)
    s.close()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (s.path.parent / (s.path.name + ".lock")).symlink_to(victim)
    with SessionStore.open(s.path, workspace=workspace):
        pass
    assert victim.read_text() == "precious"


# --------------------------------------------------------------------------- single writer


def test_second_writer_in_the_same_process_is_busy(workspace: Path) -> None:
    s = make(workspace)
    for query in (s.session_id, s.session_id[:13], s.path):
        with pytest.raises(SessionBusy) as info:
            SessionStore.open(query, workspace=workspace)
        assert info.value.pid == os.getpid() and info.value.exit_code == 4
        assert f"pid {os.getpid()}" in str(info.value)
    with SessionStore.open_read_only(s.session_id, workspace=workspace) as ro:
        assert ro.state.header.id == s.session_id
    s.commit([user()])
    s.close()
    with SessionStore.open(s.session_id, workspace=workspace) as again:
        assert again.state.last_seq == 1


def test_a_finalizer_releasing_a_lock_inside_an_acquire_does_not_deadlock(
    workspace: Path,
) -> None:
    """The garbage collector may finalize a dropped store (releasing its lock) while this
    thread is inside another acquire, holding the lock registry: that must not block. Run
    in a thread with a deadline, so a deadlock fails instead of hanging the suite."""
    import threading

    from tether._stores import locking

    dropped = make(workspace)
    done = threading.Event()

    def inside_an_acquire() -> None:
        with locking._registry_lock:  # as WriterLock.acquire holds it
            dropped.close()  # what SessionStore.__del__ does
        done.set()

    worker = threading.Thread(target=inside_an_acquire, daemon=True)
    worker.start()
    assert done.wait(10), "releasing a lock inside an acquire deadlocked"
    with SessionStore.open(dropped.session_id, workspace=workspace) as again:
        assert again.session_id == dropped.session_id


def test_flock_alone_excludes_a_second_descriptor_in_this_process(workspace: Path) -> None:
    """The in-process registry is a second line of defence; flock alone must suffice."""
    s = make(workspace)
    fd = os.open(s.path, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
        s.close()


HOLDER = textwrap.dedent(
    """
    import sys, time
    from tether._stores.file import SessionStore
    from tether.errors import SessionBusy
    try:
        store = SessionStore.open(sys.argv[1], sessions_dir=sys.argv[2])
    except SessionBusy as exc:
        print(f"busy {exc.pid}", flush=True)
        sys.exit(4)
    print("writer", flush=True)
    sys.stdin.read()  # hold the lock until the parent closes our stdin
    store.commit([{"kind": "entry", "entry": {"type": "message",
                  "message": {"role": "user", "content": "from child"}}}])
    store.close()
    """
)


def spawn_holder(path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), str(path.parent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_writer_in_another_process_is_named(workspace: Path) -> None:
    s = make(workspace)
    s.close()
    child = spawn_holder(s.path)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "writer"
        with pytest.raises(SessionBusy) as info:
            SessionStore.open(s.session_id, workspace=workspace)
        assert info.value.pid == child.pid
        assert f"pid {child.pid}" in str(info.value)
        with SessionStore.open_read_only(s.session_id, workspace=workspace) as ro:
            assert ro.state.last_seq == 0
    finally:
        child.communicate("", timeout=30)
    assert child.returncode == 0
    with SessionStore.open(s.session_id, workspace=workspace) as again:
        assert again.state.last_seq == 1


FLOCK_HOLDER = textwrap.dedent(
    """
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the writer lock, taken by a process that is no writer
    print("locked", flush=True)
    sys.stdin.read()
    """
)


def dead_pid() -> int:
    """The pid of a process that has ended (as a killed writer's pid record names)."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(done.stdout)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    return pid


def stopped_writer(path: Path) -> subprocess.Popen[str]:
    """A real writer frozen after taking the lock, before recording its pid."""
    env = {**os.environ, "TETHER_CRASH_AT": "store.locked", "TETHER_CRASH_MODE": "stop"}
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), str(path.parent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    _, status = os.waitpid(child.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), status
    return child


def test_a_crash_left_pid_record_is_never_named(workspace: Path) -> None:
    s = make(workspace)
    s.close()
    dead = dead_pid()
    sidecar = s.path.parent / (s.path.name + ".lock")
    sidecar.write_text(f"{dead}\n")  # what a SIGKILLed writer leaves behind
    child = stopped_writer(s.path)
    try:
        # The new writer holds the lock; the sidecar still names the dead writer.
        with pytest.raises(SessionBusy) as info:
            SessionStore.open(s.session_id, workspace=workspace)
        assert info.value.pid is None, f"named pid {info.value.pid}, which holds nothing"
        assert str(dead) not in str(info.value)
        assert str(info.value).endswith("already open for writing by another process")
        os.kill(child.pid, signal.SIGCONT)
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "writer"
        # Now the holder has recorded itself: it is named, because it provably holds it.
        with pytest.raises(SessionBusy) as info:
            SessionStore.open(s.session_id, workspace=workspace)
        assert info.value.pid == child.pid
        assert f"by pid {child.pid}" in str(info.value)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
        child.communicate("", timeout=30)
    assert child.returncode == 0


def test_a_pid_record_naming_an_unrelated_live_process_is_not_believed(
    workspace: Path,
) -> None:
    s = make(workspace)
    s.close()
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", FLOCK_HOLDER, str(s.path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        sidecar = s.path.parent / (s.path.name + ".lock")
        sidecar.write_text(f"{bystander.pid}\n")  # a reused pid: alive, but no writer
        with pytest.raises(SessionBusy) as info:
            SessionStore.open(s.session_id, workspace=workspace)
        assert info.value.pid is None and str(bystander.pid) not in str(info.value)
        # The same through the CLI: one line, exit 4, nobody named who might be killed.
        (workspace / "script.json").write_text(
            json.dumps({"model": "scripted/test", "responses": [{"content": "done"}]})
        )
        result = subprocess.run(
            [
                *(sys.executable, "-m", "tether", "resume", s.session_id),
                *("--model", "scripted:script.json"),
            ],
            cwd=workspace,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 4, result.stderr
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
        assert "already open for writing by another process" in result.stderr
        assert str(bystander.pid) not in result.stderr
    finally:
        holder.communicate("", timeout=30)
        bystander.communicate(b"", timeout=30)


def test_the_writer_of_an_earlier_file_of_the_same_name_is_not_named(workspace: Path) -> None:
    """The record names a live writer, but of a log since replaced behind tether's back."""
    s = make(workspace)
    s.close()
    first = spawn_holder(s.path)
    second: subprocess.Popen[str] | None = None
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "writer"
        moved = s.path.with_name("moved-away")
        os.rename(s.path, moved)
        s.path.write_bytes(moved.read_bytes())  # a new file under the old name
        second = spawn_holder(s.path)  # really holds it; cannot rewrite first's record
        assert second.stdout is not None and second.stdout.readline().strip() == "writer"
        with pytest.raises(SessionBusy) as info:
            SessionStore.open(s.session_id, workspace=workspace)
        assert info.value.pid is None, f"named {info.value.pid} (first is {first.pid})"
    finally:
        for child in (first, second):
            if child is not None:
                child.communicate("", timeout=30)


def test_two_processes_racing_for_one_session_get_exactly_one_writer(workspace: Path) -> None:
    s = make(workspace)
    s.close()
    for _ in range(5):
        children = [spawn_holder(s.path) for _ in range(2)]
        outcomes = []
        for child in children:
            assert child.stdout is not None
            outcomes.append(child.stdout.readline().split())
        writers = [c for c, o in zip(children, outcomes, strict=True) if o == ["writer"]]
        busy = [o for o in outcomes if o[0] == "busy"]
        assert len(writers) == 1 and len(busy) == 1
        assert busy[0][1] in (str(writers[0].pid), "None")
        for child in children:
            child.communicate("", timeout=30)
    assert reduce_session(s.path.read_bytes()).last_seq == 5


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_can_neither_write_nor_unlock(workspace: Path) -> None:
    s = make(workspace)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        status = 0
        try:
            try:
                s.commit([user("from the child")])
                status = 1
            except StoreUnavailable:
                pass
            s.close()  # must not release the parent's flock
            os.write(write, b"done")
        finally:
            os._exit(status)
    os.close(write)
    assert os.read(read, 16) == b"done"
    os.close(read)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    fd = os.open(s.path, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):  # the parent still holds the lock
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    assert (s.path.parent / (s.path.name + ".lock")).exists()
    s.commit([user("from the parent")])
    assert s.state.last_seq == 1
    s.close()


def test_create_needs_an_existing_workspace(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError):
        make(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()


def oserror(code: int) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise OSError(code, os.strerror(code))

    return fail


@pytest.mark.parametrize(
    ("seam", "code", "step"),
    [
        ("_fdatasync", errno.EIO, "fdatasync of the header"),
        ("_link", errno.ENOSPC, "link to the final name"),
        ("_fsync_dir", errno.EIO, "fsync of the sessions directory"),
        ("sync_directory", errno.EIO, "fsync"),
    ],
)
def test_a_failing_create_is_a_write_error_and_leaves_nothing(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, seam: str, code: int, step: str
) -> None:
    """The same as tests/test_store_syscalls.py, through the module's seams (no strace)."""
    sdir = sessions_dir_for(workspace)
    with make(workspace, "durable") as first:
        pass
    failure = oserror(code)
    if seam == "sync_directory":
        original = store_module.sync_directory

        def failure(path: Path) -> None:
            original(path)
            raise store_module.DirectoryError("fsync", path, OSError(code, os.strerror(code)))

    monkeypatch.setattr(store_module, seam, failure)
    with pytest.raises(SessionCreateError) as info:
        make(workspace, "durable")
    error = info.value
    assert error.exit_code == 9 and error.errno == code and isinstance(error, SessionWriteError)
    assert str(error).startswith(f"cannot create a session in {sdir}: {step}")
    assert str(error).endswith(f"{os.strerror(code)}; no session was created")
    assert sorted(os.listdir(sdir)) == [first.path.name]  # nothing half-made


def test_create_where_a_file_blocks_the_sessions_dir_is_a_write_error(workspace: Path) -> None:
    (workspace / ".tether").write_text("not a directory")
    with pytest.raises(SessionCreateError) as info:
        make(workspace)
    assert f"mkdir {workspace / '.tether'} failed: File exists" in str(info.value)


def test_closing_is_idempotent_and_blocks_commits(workspace: Path) -> None:
    with make(workspace) as s:
        pass
    assert s.closed
    s.close()
    with pytest.raises(StoreUnavailable) as info:
        s.commit([user()])
    assert "closed" in str(info.value)


def test_the_store_satisfies_the_protocol(store: SessionStore) -> None:
    def use(backend: SessionStoreProtocol) -> int:
        backend.commit([user()])
        return backend.state.last_seq

    assert use(store) == 1
    assert store.durability is Durability.PROCESS


# --------------------------------------------------------------------------- lookup


def fixed_ids(*values: str) -> Callable[[], str]:
    it = iter(values)
    return lambda: next(it)


def test_lookup_by_full_id_prefix_name_and_path(workspace: Path) -> None:
    a = make(workspace, ids=fixed_ids("018f0000-0000-7000-8000-00000000000a"))
    b = make(workspace, ids=fixed_ids("018f0000-0000-7000-8000-00000000000b"))
    a.close()
    b.close()
    sdir = sessions_dir_for(workspace)
    assert find_session(sdir, a.session_id) == a.path
    assert find_session(sdir, "018F0000-0000-7000-8000-00000000000B") == b.path
    assert find_session(sdir, "018f0000-0000-7000-8000-00000000000a"[:-1] + "a") == a.path
    assert find_session(sdir, b.path.name) == b.path
    assert find_session(sdir, b.path) == b.path
    with pytest.raises(AmbiguousSessionId) as info:
        find_session(sdir, "018f")
    assert info.value.exit_code == 7
    assert a.session_id in str(info.value) and b.session_id in str(info.value)
    with pytest.raises(SessionNotFound):
        find_session(sdir, "019")
    with pytest.raises(SessionNotFound):
        find_session(sdir, "")


def test_lookup_in_a_foreign_sessions_dir_reads_the_header_id(tmp_path: Path) -> None:
    sdir = tmp_path / ".tiny-agent" / "sessions"
    sdir.mkdir(parents=True)
    data = (FIXTURES / "completed-tool-run.jsonl").read_bytes()
    (sdir / "some-foreign-name.jsonl").write_bytes(data)
    path = find_session(sdir, "018f0000-0000-7000-8000-000000000001")
    assert path == sdir / "some-foreign-name.jsonl"
    with SessionStore.open(path, sessions_dir=sdir) as s:
        assert s.session_id == "018f0000-0000-7000-8000-000000000001"
        assert s.state.last_seq == 10
        s.commit([user("continuing a foreign log")])
    assert reduce_session((sdir / "some-foreign-name.jsonl").read_bytes()).last_seq == 11


# --------------------------------------------------------------------------- listing


def test_list_sessions_summarises_without_touching(workspace: Path) -> None:
    clock = iter([1_000, 2_000, 3_000, 4_000, 5_000])
    a = make(workspace, clock=lambda: next(clock))
    a.commit([user()])
    a.commit([user(), user()])
    b = make(workspace, clock=lambda: 9_000)
    sdir = sessions_dir_for(workspace)
    bad = sdir / "5000_018f0000-0000-7000-8000-0000000000cc.jsonl"
    bad.write_bytes(b'{"kind":"nope"}\n')
    a.close()
    with open(a.path, "ab") as fh:
        fh.write(b"torn")
    before = {p.name: p.read_bytes() for p in sdir.iterdir()}
    summaries = list_sessions(sdir)
    assert {p.name: p.read_bytes() for p in sdir.iterdir()} == before
    assert [s.path for s in summaries] == [a.path, bad, b.path]
    sa, sbad, sb = summaries
    assert (sa.id, sa.created, sa.model, sa.operation, sa.last_activity) == (
        a.session_id,
        1_000,
        "test/model",
        "idle",
        3_000,
    )
    assert sa.torn_tail == 4 and sa.size == a.path.stat().st_size and not sa.corrupt
    assert sbad.corrupt and sbad.error is not None and sbad.error.code == "INVALID_HEADER"
    assert sbad.id == "018f0000-0000-7000-8000-0000000000cc" and sbad.created == 5000
    assert sb.last_activity == b.path.stat().st_mtime_ns // 1_000_000  # header only
    as_json = json.loads(json.dumps([s.to_json() for s in summaries]))
    assert as_json[1]["error"] == {"code": "INVALID_HEADER", "line": 1}
    assert as_json[0]["operation"] == "idle" and as_json[0]["lastActivity"] == 3_000
    b.close()
    assert list_sessions(workspace / "nowhere") == []


def test_list_sessions_reads_logs_of_other_implementations(tmp_path: Path) -> None:
    """The conformance fixtures stand in for a ``.tiny-agent/sessions`` folder."""
    sdir = tmp_path / ".tiny-agent" / "sessions"
    sdir.mkdir(parents=True)
    for fixture in FIXTURES.glob("*.jsonl"):
        (sdir / fixture.name).write_bytes(fixture.read_bytes())
    summaries = {s.path.name: s for s in list_sessions(sdir)}
    assert len(summaries) == len(list(FIXTURES.glob("*.jsonl")))
    for name, summary in summaries.items():
        expected = json.loads((FIXTURES / name.replace(".jsonl", ".expected.json")).read_text())
        if expected["ok"]:
            assert summary.error is None, name
            assert summary.operation == expected["state"]["operation"]["kind"]
            assert summary.model == expected["state"]["header"]["model"]
            assert summary.size - summary.torn_tail == expected["state"]["repairedLength"]
        else:
            assert summary.error is not None and summary.error.to_json() == expected["error"], name
    assert summaries["torn-tail.jsonl"].torn_tail > 0


def test_list_ignores_sidecars_and_temporaries(workspace: Path) -> None:
    s = make(workspace)
    (s.path.parent / ".1_x.jsonl.creating").write_bytes(b"")
    assert [x.path for x in list_sessions(s.path.parent)] == [s.path]
    s.close()


def test_list_flags_a_symlink_instead_of_following_it(workspace: Path, tmp_path: Path) -> None:
    s = make(workspace)
    s.close()
    (s.path.parent / "7_link.jsonl").symlink_to(s.path)
    summaries = list_sessions(s.path.parent)
    flagged = [x for x in summaries if x.path.name == "7_link.jsonl"]
    assert len(flagged) == 1 and flagged[0].error is not None
    assert flagged[0].error.code == "UNSAFE_PATH"


def test_fixture_logs_open_for_writing_and_match_the_expected_state(tmp_path: Path) -> None:
    sdir = tmp_path / "sessions"
    sdir.mkdir()
    for fixture in sorted(FIXTURES.glob("*.jsonl")):
        expected = json.loads(
            (FIXTURES / fixture.name.replace(".jsonl", ".expected.json")).read_text()
        )
        path = sdir / fixture.name
        path.write_bytes(fixture.read_bytes())
        if expected["ok"]:
            with SessionStore.open(path, sessions_dir=sdir) as s:
                assert s.state.to_json() == expected["state"], fixture.name
                assert path.stat().st_size == expected["state"]["repairedLength"]
        else:
            with pytest.raises(CorruptSession) as info:
                SessionStore.open(path, sessions_dir=sdir)
            assert info.value.to_json() == expected["error"], fixture.name
            assert path.read_bytes() == fixture.read_bytes()


def test_commit_cost_does_not_grow_with_the_session(workspace: Path) -> None:
    """A coarse guard against O(session) work on the hot path (the benchmark is precise).

    Two views of one commit, early in a session and after 20,000 more:

    * the Python functions and builtins it calls, counted: exact, so any loop over the
      history in Python shows, whatever else runs on the machine;
    * its CPU time on this thread (``time.thread_time``), which also sees work inside a
      builtin (a copy or a scan of a list) and, unlike the wall clock, not the time the
      thread waits for a core: in a parallel suite the wall clock of the same loop
      varied by 6x while the other worker ran a crash lab.
    """
    with make(workspace) as s:
        facts = [user("x" * 200)]

        def calls_per_commit(n: int) -> float:
            calls = 0

            def count(frame: object, event: str, arg: object) -> None:
                nonlocal calls
                if event in ("call", "c_call"):
                    calls += 1

            sys.setprofile(count)
            try:
                for _ in range(n):
                    s.commit(facts)
            finally:
                sys.setprofile(None)
            return calls / n

        def cpu_per_commit(n: int) -> float:
            t0 = time.thread_time()
            for _ in range(n):
                s.commit(facts)
            return (time.thread_time() - t0) / n

        early_calls = calls_per_commit(200)
        early = min(cpu_per_commit(200) for _ in range(5))
        for _ in range(20_000):
            s.commit(facts)
        late_calls = calls_per_commit(200)
        late = min(cpu_per_commit(200) for _ in range(5))
        # ids and timestamps call a little more in some milliseconds than in others
        assert late_calls < early_calls * 1.1, (early_calls, late_calls)
        assert late < early * 3, (early, late)


def test_uuid_of_session_matches_the_file_name(store: SessionStore) -> None:
    assert uuid.UUID(store.session_id).version == 7
    assert store.session_id in store.path.name
