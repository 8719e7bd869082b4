"""Reducer checkpoints (``tether.core.checkpoint``, ``tether._stores.checkpoints``).

Properties of the pure half (hypothesis, random valid sessions of ``sessionkit``):

* for any valid log cut at any line boundary, the checkpoint of the prefix decoded and the
  rest reduced forward is exactly the full reduction: the same state, the same internal
  indexes (compared through the encoder), and the same verdict — accepted, or the same
  error code, line and seq — on candidate lines after the cut (the next line, mutations of
  it, earlier lines renumbered, late failures of a multi-fact transaction);
* any bytes offered as a checkpoint give a reducer or ``CheckpointMismatch``, never another
  exception (also for damaged checkpoints that pass the binding and integrity checks).

The file store's half, in-process: a long session's writer writes the sidecar when it
closes, the next open reduces only after it, a short one writes none; a log rewritten,
corrupted, truncated or replaced under a checkpoint, a checkpoint of another session, of an
older format or of another reducer, garbage, a symbolic link or a FIFO in its place: each
falls back to the full reduction, with the full reduction's verdict. The sidecar is 0600
in the sessions directory, which the file tools refuse.
"""

from __future__ import annotations

import ast
import hashlib
import os
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionkit import SessionKit, make_id
from test_cli_inputs import run_bounded
from test_reducer_properties import SETTINGS, _json_mutation, _late_failures, session_kits
from tether._loading import load_reducer
from tether._stores import checkpoints
from tether._stores.file import (
    SessionStore,
    list_sessions,
    reduce_log_file,
    session_file_name,
    sessions_dir_for,
)
from tether._stores.memory import MemorySessions
from tether._tools import ReadTool, ToolContext
from tether.core.checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointBinding,
    decode_checkpoint,
    encode_checkpoint,
    read_binding,
)
from tether.core.reducer import Reducer
from tether.errors import CheckpointMismatch, CorruptSession, SessionCorruption

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import sessiongen  # noqa: E402

IDENTITY = "test-reducer"
LONG_TURNS = 45  # ~290 kB: above CHECKPOINT_EVERY
assert LONG_TURNS * 6000 > checkpoints.CHECKPOINT_EVERY


# ---------------------------------------------------------------------- the pure half


def _binding(reducer: Reducer, digest: str = "sha256:prefix") -> CheckpointBinding:
    return CheckpointBinding(
        session_id=reducer.state.header.id,
        length=reducer.length,
        lines=reducer.line_count,
        digest=digest,
        reducer=IDENTITY,
    )


def _restored(reducer: Reducer) -> Reducer:
    binding = _binding(reducer)
    return decode_checkpoint(encode_checkpoint(reducer, binding), binding, _header_line_of(reducer))


_HEADERS: dict[str, bytes] = {}


def _header_line_of(reducer: Reducer) -> bytes:
    return _HEADERS[reducer.state.header.id]


def _load(lines: list[bytes]) -> Reducer:
    _HEADERS[orjson.loads(lines[0])["id"]] = lines[0]
    return Reducer.load(b"".join(line + b"\n" for line in lines))


def _internals(reducer: Reducer) -> bytes:
    """Everything a later check reads, through the encoder (which completes a deferred
    decode first)."""
    return encode_checkpoint(reducer, _binding(reducer)).split(b"\n", 1)[1]


def _verdict(reducer: Reducer, candidate: bytes) -> Any:
    try:
        reducer.check(candidate)
    except SessionCorruption as exc:
        return (exc.code, exc.line, exc.seq)
    return "accepted"


def _renumbered(line: bytes, seq: int) -> bytes:
    value = orjson.loads(line)
    facts = value if isinstance(value, list) else [value]
    for offset, fact in enumerate(facts):
        if isinstance(fact, dict):
            fact["seq"] = seq + offset
    return orjson.dumps(value)


@settings(SETTINGS, max_examples=120)
@given(session_kits(max_ops=4), st.data())
def test_checkpoint_of_any_prefix_plus_the_rest_is_the_full_reduction(
    kit: SessionKit, data: st.DataObject
) -> None:
    lines = kit.lines()
    cut = data.draw(st.integers(1, len(lines)), label="cut")
    prefix = _load(lines[:cut])
    restored = _restored(prefix)
    assert restored.state == prefix.state
    assert restored.state.to_json() == prefix.state.to_json()
    assert (restored.length, restored.line_count, restored.next_seq) == (
        prefix.length,
        prefix.line_count,
        prefix.next_seq,
    )
    # The same verdict on what could come next (each check leaves both unchanged).
    candidates: list[bytes] = []
    if cut < len(lines):
        following = lines[cut]
        candidates.append(following)
        for _ in range(data.draw(st.integers(0, 3), label="mutations")):
            candidates.append(orjson.dumps(_json_mutation(data, orjson.loads(following))))
        candidates.extend(bad for bad, _, _ in _late_failures(following))
    if cut > 1:
        earlier = lines[data.draw(st.integers(1, cut - 1), label="earlier")]
        candidates.append(earlier)
        candidates.append(_renumbered(earlier, prefix.next_seq))
    for candidate in candidates:
        assert _verdict(restored, candidate) == _verdict(prefix, candidate)
    assert _internals(restored) == _internals(prefix)
    # The rest of the log, reduced forward from the checkpoint: the full reduction.
    full = _load(lines)
    forward = _restored(prefix)
    for line in lines[cut:]:
        forward.apply(line)
    assert forward.state == full.state
    assert forward.state.to_json() == full.state.to_json()
    assert _internals(forward) == _internals(full)


def _rich_kit() -> SessionKit:
    """Tools, a denial-free failure, a compaction and a run left open: every table used."""
    kit = SessionKit(tools=("read", "write"))
    kit.tool_run()
    kit.compact(keep=kit.legal_keeps()[-1], summary="so far")
    kit.simple_run("again", "fine")
    kit.start_run("open one")
    return kit


def test_a_compaction_after_the_checkpoint_has_the_full_reductions_digest() -> None:
    kit = SessionKit(tools=("read", "write"))
    kit.tool_run()
    kit.simple_run()
    cut = len(kit.lines())
    kit.compact(keep=0)
    lines = kit.lines()
    forward = _restored(_load(lines[:cut]))
    for line in lines[cut:]:
        forward.apply(line)
    assert _internals(forward) == _internals(_load(lines))


def _valid_checkpoint() -> tuple[bytes, CheckpointBinding, bytes]:
    lines = _rich_kit().lines()
    reducer = _load(lines)
    binding = _binding(reducer)
    return encode_checkpoint(reducer, binding), binding, lines[0]


def _reseal(head: dict[str, Any], view: bytes, checks: bytes) -> bytes:
    import zlib

    head = {**head, "view": len(view), "checks": len(checks), "checksCrc32": zlib.crc32(checks)}
    return b"\n".join((orjson.dumps(head), view, checks))


def _decode_or_refuse(raw: bytes, binding: CheckpointBinding, header: bytes) -> None:
    try:
        reducer = decode_checkpoint(raw, binding, header)
        reducer._complete()
        reducer.state  # noqa: B018
    except CheckpointMismatch:
        pass


@settings(SETTINGS, max_examples=300)
@given(st.binary(max_size=300))
def test_any_bytes_as_a_checkpoint_give_a_reducer_or_the_typed_error(raw: bytes) -> None:
    _, binding, header = _valid_checkpoint()
    _decode_or_refuse(raw, binding, header)


@settings(SETTINGS, max_examples=300)
@given(st.data())
def test_damaged_checkpoints_that_pass_the_integrity_checks_are_refused_cleanly(
    data: st.DataObject,
) -> None:
    raw, binding, header = _valid_checkpoint()
    head_line, view, checks = raw.split(b"\n")
    head = orjson.loads(head_line)
    which = data.draw(st.sampled_from(["view", "checks", "bytes"]), label="which")
    if which == "bytes":
        pos = data.draw(st.integers(0, len(raw) - 1), label="pos")
        damaged = raw[:pos] + bytes([data.draw(st.integers(0, 255))]) + raw[pos + 1 :]
    elif which == "view":
        view = orjson.dumps(_json_mutation(data, orjson.loads(view)))
        damaged = _reseal(head, view, checks)
    else:
        checks = orjson.dumps(_json_mutation(data, orjson.loads(checks)))
        damaged = _reseal(head, view, checks)
    _decode_or_refuse(damaged, binding, header)


def test_the_binding_must_be_the_expected_one() -> None:
    raw, binding, header = _valid_checkpoint()
    decode_checkpoint(raw, binding, header)._complete()  # the control: accepted
    others = [
        CheckpointBinding(binding.session_id, binding.length, binding.lines, "sha256:x", IDENTITY),
        CheckpointBinding(make_id(77), binding.length, binding.lines, binding.digest, IDENTITY),
        CheckpointBinding(binding.session_id, binding.length - 1, binding.lines, "d", IDENTITY),
        CheckpointBinding(binding.session_id, binding.length, binding.lines, binding.digest, "y"),
    ]
    for other in others:
        with pytest.raises(CheckpointMismatch):
            decode_checkpoint(raw, other, header)
    head, rest = raw.split(b"\n", 1)
    old = orjson.dumps({**orjson.loads(head), "checkpoint": CHECKPOINT_FORMAT - 1})
    with pytest.raises(CheckpointMismatch, match="format"):
        decode_checkpoint(old + b"\n" + rest, binding, header)
    with pytest.raises(CheckpointMismatch, match="view does not match its CRC"):
        decode_checkpoint(raw.replace(b'"role":"user"', b'"role":"usex"', 1), binding, header)
    idle_kit = SessionKit(first_id=300)
    idle_kit.tool_run()
    idle = _load(idle_kit.lines())
    raw_idle = encode_checkpoint(idle, _binding(idle))
    damaged = decode_checkpoint(raw_idle[:-2] + b"0]", _binding(idle), idle_kit.lines()[0])
    assert damaged.state == idle.state  # the view is whole; the checks are seen when used
    with pytest.raises(CheckpointMismatch, match="checks do not match their CRC"):
        damaged.check(idle_kit.lines()[-1])
    with pytest.raises(CheckpointMismatch):  # and again: nothing was half-built
        damaged._complete()
    with pytest.raises(CheckpointMismatch, match="lengths"):
        decode_checkpoint(raw[:-1], binding, header)
    # The header comes from the log: another session's header is refused.
    other_header = SessionKit(first_id=500).lines()[0]
    with pytest.raises(CheckpointMismatch, match="another session"):
        decode_checkpoint(raw, binding, other_header)


def test_encoding_refuses_a_binding_of_another_state_and_a_pending_transaction() -> None:
    kit = _rich_kit()
    reducer = _load(kit.lines())
    wrong = CheckpointBinding(
        reducer.state.header.id, reducer.length + 1, reducer.line_count, "d", IDENTITY
    )
    with pytest.raises(CheckpointMismatch):
        encode_checkpoint(reducer, wrong)
    kit = SessionKit()
    kit.user("hi")
    reducer = _load(kit.lines()[:1])
    binding = _binding(reducer)
    pending = reducer.begin(kit.lines()[1])
    with pytest.raises(CheckpointMismatch, match="pending"):
        encode_checkpoint(reducer, binding)
    pending.rollback()


def test_the_reducer_identity_covers_every_core_module_the_reducer_is_made_of() -> None:
    """REDUCER_MODULES is closed under the tether.core imports of its modules."""
    src = REPO / "src"
    listed = set(checkpoints.REDUCER_MODULES)
    for name in checkpoints.REDUCER_MODULES:
        tree = ast.parse((src / (name.replace(".", "/") + ".py")).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                module = node.module
            elif isinstance(node, ast.Import):
                module = node.names[0].name
            else:
                continue
            if module.startswith("tether.core") or module == "tether.errors":
                assert module in listed, f"{name} imports {module}, missing from the identity"
    assert checkpoints.reducer_identity() is not None


# ---------------------------------------------------------------------- the file store


def _session(tmp_path: Path, turns: int, seed: int = 0) -> tuple[Path, str, bytes]:
    workspace = tmp_path / "ws"
    sessions = sessions_dir_for(workspace)
    sessions.mkdir(parents=True, exist_ok=True)
    data = sessiongen.generate(turns, seed=seed)
    header = orjson.loads(data[: data.index(b"\n")])
    (sessions / session_file_name(header["createdAt"], header["id"])).write_bytes(data)
    return workspace, header["id"], data


def _paths(workspace: Path, session_id: str) -> tuple[Path, Path]:
    sessions = sessions_dir_for(workspace)
    (log,) = sessions.glob(f"*_{session_id}.jsonl")
    return log, sessions / f".{session_id}.checkpoint.json"


def _open(workspace: Path, session_id: str) -> SessionStore:
    return SessionStore.open(session_id, workspace=workspace)


def _checkpointed(workspace: Path, session_id: str) -> SessionStore:
    """A closed writer of a long session wrote its checkpoint."""
    _open(workspace, session_id).close()
    store = _open(workspace, session_id)
    assert store._checkpointed == store.length
    return store


def test_a_long_session_opens_from_its_checkpoint_and_goes_on(tmp_path: Path) -> None:
    workspace, session_id, data = _session(tmp_path, LONG_TURNS)
    log, sidecar = _paths(workspace, session_id)
    first = _open(workspace, session_id)
    assert first._checkpointed == 0 and not sidecar.exists()
    first.close()
    assert sidecar.stat().st_mode & 0o777 == 0o600
    store = _open(workspace, session_id)
    assert store._checkpointed == len(data)
    assert store.state == load_reducer(data).state
    # Commit a whole turn after the checkpoint, then open again: the same as a full reduce.
    for line in sessiongen.turn_lines(LONG_TURNS):
        value = orjson.loads(line)
        store.commit(value if isinstance(value, list) else [value])
    store.close()  # 7 lines beyond the checkpoint: none written
    assert read_binding(sidecar.read_bytes()).length == len(data)
    again = _open(workspace, session_id)
    assert again._checkpointed == len(data)
    assert again.state == load_reducer(log.read_bytes()).state
    assert _internals(again._reducer) == _internals(load_reducer(log.read_bytes()))
    again.close()
    read_only = SessionStore.open_read_only(session_id, workspace=workspace)
    assert read_only._checkpointed == len(data)
    assert read_only.state == load_reducer(log.read_bytes()).state
    (summary,) = list_sessions(sessions_dir_for(workspace))  # tether sessions
    assert summary.error is None and summary.id == session_id


def test_a_short_session_and_a_read_only_open_write_no_checkpoint(tmp_path: Path) -> None:
    workspace, session_id, _ = _session(tmp_path, 3)
    _, sidecar = _paths(workspace, session_id)
    _open(workspace, session_id).close()
    assert not sidecar.exists()
    workspace, session_id, _ = _session(tmp_path / "long", LONG_TURNS)
    _, sidecar = _paths(workspace, session_id)
    SessionStore.open_read_only(session_id, workspace=workspace).close()
    assert not sidecar.exists()


def test_the_checkpoint_is_out_of_the_file_tools_reach(tmp_path: Path) -> None:
    workspace, session_id, _ = _session(tmp_path, LONG_TURNS)
    _checkpointed(workspace, session_id).close()
    _, sidecar = _paths(workspace, session_id)
    context = ToolContext(workspace.resolve(), "op")
    relative = str(sidecar.relative_to(workspace))
    result = ReadTool().run({"path": relative}, context)
    assert result.is_error and "tether's own state" in result.content, result.content


def _rewrite_content(data: bytes, old: bytes, new: bytes) -> bytes:
    assert len(old) == len(new) and data.count(old) >= 1
    return data.replace(old, new, 1)


def test_a_log_rewritten_under_the_checkpoint_is_reduced_in_full(tmp_path: Path) -> None:
    workspace, session_id, data = _session(tmp_path, LONG_TURNS)
    _checkpointed(workspace, session_id).close()
    log, _ = _paths(workspace, session_id)
    # Still a valid log, same length: only the prefix digest tells.
    marker = b'"content":"'
    at = data.index(marker, data.index(b'"role":"user"')) + len(marker)
    rewritten = data[:at] + b"Z" + data[at + 1 :]
    assert rewritten != data
    log.write_bytes(rewritten)
    store = _open(workspace, session_id)
    assert store._checkpointed == 0
    assert store.state == load_reducer(rewritten).state
    store.close()


def test_a_corrupt_line_under_the_checkpoint_is_named_as_without_it(tmp_path: Path) -> None:
    workspace, session_id, data = _session(tmp_path, LONG_TURNS)
    _checkpointed(workspace, session_id).close()
    log, _ = _paths(workspace, session_id)
    lines = data.split(b"\n")
    lines[10] = lines[10].replace(b'"seq":', b'"seq":9', 1)
    corrupt = b"\n".join(lines)
    log.write_bytes(corrupt)
    with pytest.raises(SessionCorruption) as expected:
        load_reducer(corrupt)
    with pytest.raises(CorruptSession) as got:
        _open(workspace, session_id)
    assert (got.value.code, got.value.line, got.value.seq) == (
        expected.value.code,
        expected.value.line,
        expected.value.seq,
    )


def test_a_rejected_line_after_the_checkpoint_is_named_as_without_it(tmp_path: Path) -> None:
    workspace, session_id, data = _session(tmp_path, LONG_TURNS)
    _checkpointed(workspace, session_id).close()
    log, _ = _paths(workspace, session_id)
    corrupt = data + data.split(b"\n")[5] + b"\n"  # an old line again: SEQ_MISMATCH
    log.write_bytes(corrupt)
    with pytest.raises(SessionCorruption) as expected:
        load_reducer(corrupt)
    with pytest.raises(CorruptSession) as got:
        SessionStore.open_read_only(session_id, workspace=workspace)
    assert (got.value.code, got.value.line) == (expected.value.code, expected.value.line)


def test_a_truncated_log_shorter_than_the_prefix_is_reduced_in_full(tmp_path: Path) -> None:
    workspace, session_id, data = _session(tmp_path, LONG_TURNS)
    _checkpointed(workspace, session_id).close()
    log, _ = _paths(workspace, session_id)
    short = data[: data.index(b"\n", len(data) // 2) + 1]
    log.write_bytes(short)
    store = _open(workspace, session_id)
    assert store._checkpointed == 0 and store.state == load_reducer(short).state
    store.close()


def test_a_checkpoint_of_another_session_is_not_used(tmp_path: Path) -> None:
    workspace, first, _ = _session(tmp_path, LONG_TURNS, seed=0)
    _checkpointed(workspace, first).close()
    _, second, data = _session(tmp_path, LONG_TURNS, seed=1)
    (_, forged), (_, target) = _paths(workspace, first), _paths(workspace, second)
    target.write_bytes(forged.read_bytes())
    store = _open(workspace, second)
    assert store._checkpointed == 0 and store.state == load_reducer(data).state
    store.close()


@pytest.mark.parametrize("change", ["older format", "other reducer", "garbage", "empty"])
def test_a_checkpoint_of_another_version_or_none_at_all_is_not_used(
    tmp_path: Path, change: str
) -> None:
    workspace, session_id, data = _session(tmp_path, LONG_TURNS)
    _checkpointed(workspace, session_id).close()
    _, sidecar = _paths(workspace, session_id)
    raw = sidecar.read_bytes()
    head, rest = raw.split(b"\n", 1)
    value = orjson.loads(head)
    replaced = {
        "older format": lambda: (
            orjson.dumps({**value, "checkpoint": CHECKPOINT_FORMAT - 1}) + b"\n" + rest
        ),
        "other reducer": lambda: orjson.dumps({**value, "reducer": "0" * 64}) + b"\n" + rest,
        "garbage": lambda: b"\x00garbage" * 100,
        "empty": lambda: b"",
    }[change]()
    sidecar.write_bytes(replaced)
    store = SessionStore.open_read_only(session_id, workspace=workspace)
    assert store._checkpointed == 0 and store.state == load_reducer(data).state


def test_a_link_or_fifo_in_place_of_the_checkpoint_is_ignored_without_blocking(
    tmp_path: Path,
) -> None:
    workspace, session_id, data = _session(tmp_path, LONG_TURNS)
    _checkpointed(workspace, session_id).close()
    _, sidecar = _paths(workspace, session_id)
    saved = sidecar.with_name("saved")
    sidecar.rename(saved)
    sidecar.symlink_to(saved)
    store = SessionStore.open_read_only(session_id, workspace=workspace)
    assert store._checkpointed == 0 and store.state == load_reducer(data).state
    sidecar.unlink()
    os.mkfifo(sidecar)
    done: list[int] = []
    worker = threading.Thread(
        target=lambda: done.append(
            SessionStore.open_read_only(session_id, workspace=workspace)._checkpointed
        ),
        daemon=True,
    )
    worker.start()
    worker.join(timeout=20)
    assert done == [0]


def test_sidecar_names_lists_a_sessions_records_by_prefix(tmp_path: Path) -> None:
    workspace, session_id, _ = _session(tmp_path, 2)
    store = _open(workspace, session_id)
    for name in ("reasoning.a", "reasoning.b", "other"):
        store.sidecar(name).write(b"{}")
    sessions = sessions_dir_for(workspace)
    (sessions / ".another-session.reasoning.c.json").write_bytes(b"{}")
    assert store.sidecar_names("reasoning.") == {"reasoning.a", "reasoning.b"}
    store.close()
    memory = MemorySessions()
    mstore = memory.create(provider="p", model="m", environment_identity="e")
    mstore.sidecar("reasoning.x").write(b"{}")
    mstore.sidecar("binding").write(b"{}")
    assert mstore.sidecar_names("reasoning.") == {"reasoning.x"}


def test_a_checkpoint_binds_the_bytes_the_writer_reduced(tmp_path: Path) -> None:
    """The running hash is of the lines the writer committed, not of the file read back."""
    workspace, session_id, data = _session(tmp_path, LONG_TURNS)
    store = _open(workspace, session_id)
    store.close()
    _, sidecar = _paths(workspace, session_id)
    binding = read_binding(sidecar.read_bytes())
    assert binding.digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert binding.lines == data.count(b"\n") and binding.length == len(data)


def test_inspect_reads_a_long_session_from_its_checkpoint(tmp_path: Path) -> None:
    workspace, session_id, data = _session(tmp_path, LONG_TURNS)
    log, sidecar = _paths(workspace, session_id)
    without = run_bounded("inspect", log, "--json", cwd=tmp_path)
    _checkpointed(workspace, session_id).close()
    assert sidecar.exists()
    torn = data + b'[{"kind":'  # a torn tail is ignored, as without a checkpoint
    log.write_bytes(torn)
    assert reduce_log_file(log, torn) == load_reducer(torn).state
    log.write_bytes(data)
    with_checkpoint = run_bounded("inspect", log, "--json", cwd=tmp_path)
    assert with_checkpoint.returncode == without.returncode == 0, with_checkpoint.stderr
    assert orjson.loads(with_checkpoint.stdout) == orjson.loads(without.stdout)
    corrupt = data + data.split(b"\n")[3] + b"\n"
    log.write_bytes(corrupt)
    with pytest.raises(SessionCorruption) as expected:
        load_reducer(corrupt)
    with pytest.raises(SessionCorruption) as got:
        reduce_log_file(log, corrupt)
    assert (got.value.code, got.value.line) == (expected.value.code, expected.value.line)


@pytest.mark.parametrize("resealed", [False, True], ids=["bad-crc", "crc-ok-bad-shape"])
def test_checks_that_fail_at_the_first_commit_fall_back_to_the_log(
    tmp_path: Path, resealed: bool
) -> None:
    """Checks damaged on disk (their CRC-32 fails) or that pass it but do not decode (a bug)
    are found at the first commit; the writer reduces its log in full and commits."""
    workspace, session_id, data = _session(tmp_path, LONG_TURNS)
    _checkpointed(workspace, session_id).close()
    log, sidecar = _paths(workspace, session_id)
    head, view, checks = sidecar.read_bytes().split(b"\n")
    broken = orjson.loads(checks)
    broken["attempts"] = [["not", "an", "attempt"]]
    if resealed:
        sidecar.write_bytes(_reseal(orjson.loads(head), view, orjson.dumps(broken)))
    else:
        sidecar.write_bytes(b"\n".join((head, view, checks.replace(b'"', b"'", 1))))
    store = _open(workspace, session_id)
    assert store._checkpointed == len(data)  # the view was fine
    value = orjson.loads(sessiongen.turn_lines(LONG_TURNS)[0])
    store.commit(value if isinstance(value, list) else [value])
    assert _internals(store._reducer) == _internals(load_reducer(log.read_bytes()))
    store.close()
