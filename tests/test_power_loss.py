"""The power-loss lab: the model's rules on hand-written traces, then the lab on real runs.

The model (:mod:`tether.testing.crashlab.power`) is pure, so its rules P1–P5 are checked on
small ``strace -f -y`` texts first. Then the lab itself: real scenario runs recorded with
strace, every distinct power-cut state recovered in real processes; the real store passes,
and both planted store bugs are caught (the lab is not a check that cannot fail).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stracekit import require_strace
from tether.testing.crashlab.power import (
    FileClass,
    Model,
    PowerState,
    TraceError,
    choices,
    explore,
)
from tether.testing.crashlab.powerlab import (
    PowerOptions,
    durable_acks,
    run_power_lab,
    world_after_disk,
)
from tether.testing.crashlab.scenarios import BUILTIN_SCENARIOS
from tether.testing.crashlab.strace import parse

ROOT = Path(__file__).resolve().parent.parent


def classify(path: str) -> FileClass:
    if path.startswith("/r/ws"):
        return FileClass.SUBJECT
    if path.startswith("/r/world"):
        return FileClass.WORLD
    return FileClass.IGNORED


def states(
    trace: str, *, full: bool = True, before: dict[str, bytes] | None = None
) -> list[tuple[str, list[PowerState]]]:
    """(call, states) per cut of a hand-written trace over /r/ws (subject), /r/world*."""
    model = Model(before or {}, ["/r", "/r/ws"], classify)
    calls = parse("\n".join(line.strip() for line in trace.strip().splitlines()))
    return [(cut.call, list(cut.states)) for cut in explore(model, calls, full=full, cap=64)]


def every_state(trace: str, **kwargs: object) -> list[PowerState]:
    return [s for _, group in states(trace, **kwargs) for s in group]  # type: ignore[arg-type]


def last_model(trace: str) -> Model:
    model = Model({}, ["/r", "/r/ws"], classify)
    for call in parse("\n".join(line.strip() for line in trace.strip().splitlines())):
        model.apply(call)
    return model


def last_minimal(trace: str) -> PowerState:
    return last_model(trace).state({}, "minimal")


def final_states(trace: str, *, full: bool = True) -> list[PowerState]:
    """Every state chosen at a cut after the trace's last call (none skipped as seen)."""
    model = last_model(trace)
    return [
        model.state(keep, model.label(kind))
        for keep, kind in choices(model.dimensions(), full=full, cap=64, tear=model.is_log)
    ]


CREATE = """
    1 openat(AT_FDCWD</r>, "/r/ws/log", O_WRONLY|O_CREAT|O_APPEND|O_CLOEXEC, 0600) = 3</r/ws/log>
    1 write(3</r/ws/log>, "one\\n", 4) = 4
    1 fdatasync(3</r/ws/log>) = 0
"""
DIR_SYNC = """
    1 openat(AT_FDCWD</r>, "/r/ws", O_RDONLY|O_DIRECTORY|O_CLOEXEC) = 4</r/ws>
    1 fsync(4</r/ws>) = 0
"""


def test_a_synced_file_without_a_synced_name_is_lost() -> None:
    # P3/P4: fdatasync made the data durable, but nothing made the name durable.
    state = last_minimal(CREATE)
    assert "/r/ws/log" not in state.files
    assert any("entry lost: create" in line for line in state.lost)


def test_a_synced_file_and_directory_stay() -> None:
    state = last_minimal(CREATE + DIR_SYNC)
    assert state.files["/r/ws/log"] == b"one\n"
    assert state.lost == ()


def test_an_unsynced_append_may_be_lost_kept_or_torn_at_any_byte() -> None:
    trace = (
        CREATE
        + DIR_SYNC
        + """
        1 write(3</r/ws/log>, "two two\\n", 8) = 8
    """
    )
    contents = {s.files["/r/ws/log"] for s in final_states(trace)}
    # P2: the synced line always; the unsynced one absent, whole, or cut (at its middle,
    # one byte short) — never anything that was not written.
    assert {b"one\n", b"one\ntwo two\n", b"one\ntwo ", b"one\ntwo two"} <= contents
    assert all(c.startswith(b"one\n") and b"one\ntwo two\n".startswith(c) for c in contents)


def test_bounded_exploration_keeps_the_minimal_state_and_tears_the_log() -> None:
    trace = (
        CREATE.replace("/r/ws/log", "/r/ws/s.jsonl")
        + DIR_SYNC
        + """
        1 write(3</r/ws/s.jsonl>, "two two\\n", 8) = 8
    """
    )
    last = final_states(trace, full=False)
    assert [s.files["/r/ws/s.jsonl"] for s in last] == [b"one\n", b"one\ntwo "]
    assert [s.kind for s in last] == ["minimal", "file r/ws/s.jsonl torn"]


def test_an_unsynced_rename_may_be_undone_and_a_synced_one_stays() -> None:
    trace = """
        1 openat(AT_FDCWD</r>, "/r/ws/f", O_WRONLY|O_CREAT|O_TRUNC, 0644) = 3</r/ws/f>
        1 write(3</r/ws/f>, "old", 3) = 3
        1 fsync(3</r/ws/f>) = 0
        1 openat(AT_FDCWD</r>, "/r/ws", O_RDONLY|O_DIRECTORY) = 4</r/ws>
        1 fsync(4</r/ws>) = 0
        1 openat(4</r/ws>, ".f.tmp", O_WRONLY|O_CREAT|O_EXCL, 0644) = 5</r/ws/.f.tmp>
        1 write(5</r/ws/.f.tmp>, "new", 3) = 3
        1 fsync(5</r/ws/.f.tmp>) = 0
        1 renameat(4</r/ws>, ".f.tmp", 4</r/ws>, "f") = 0
    """
    final = {s.files.get("/r/ws/f") for s in final_states(trace)}
    assert final == {b"old", b"new"}  # the rename undone or kept, never a mix
    synced = last_minimal(trace + "\n1 fsync(4</r/ws>) = 0")
    assert synced.files == {"/r/ws/f": b"new"}


def test_a_directory_whose_entry_is_lost_takes_its_files_with_it() -> None:
    trace = """
        1 mkdirat(AT_FDCWD</r>, "/r/ws/sub", 0777) = 0
        1 openat(AT_FDCWD</r>, "/r/ws/sub/x", O_WRONLY|O_CREAT, 0600) = 3</r/ws/sub/x>
        1 write(3</r/ws/sub/x>, "x", 1) = 1
        1 fsync(3</r/ws/sub/x>) = 0
        1 openat(AT_FDCWD</r>, "/r/ws/sub", O_RDONLY|O_DIRECTORY) = 4</r/ws/sub>
        1 fsync(4</r/ws/sub>) = 0
    """
    state = last_minimal(trace)  # sub's own entry in ws was never synced (P4)
    assert "/r/ws/sub" not in state.dirs and "/r/ws/sub/x" not in state.files
    kept = last_minimal(trace + DIR_SYNC)
    assert kept.files == {"/r/ws/sub/x": b"x"} and "/r/ws/sub" in kept.dirs


def test_world_files_are_never_lost_and_pwrite_lands_at_its_offset() -> None:
    trace = """
        1 openat(AT_FDCWD</r>, "/r/world.log", O_WRONLY|O_CREAT|O_APPEND, 0644) = 3</r/world.log>
        1 write(3</r/world.log>, "effect\\n", 7) = 7
        1 openat(AT_FDCWD</r>, "/r/ws/db", O_RDWR|O_CREAT, 0644) = 5</r/ws/db>
        1 pwrite64(5</r/ws/db>, "AAAA", 4, 0) = 4
        1 pwrite64(5</r/ws/db>, "B", 1, 2) = 1
        1 fdatasync(5</r/ws/db>) = 0
    """
    for state in final_states(trace):
        assert state.world == {"/r/world.log": b"effect\n"}
    assert {s.files.get("/r/ws/db") for s in final_states(trace + DIR_SYNC)} == {b"AABA"}
    # Before the write, the world had not seen the effect either: a cut holds it as it was
    # (not there, created empty, written).
    seen = {bytes(s.world.get("/r/world.log", b"-")) for s in every_state(trace)}
    assert seen == {b"-", b"", b"effect\n"}


def test_descriptors_follow_dup2_close_and_reuse() -> None:
    trace = """
        1 openat(AT_FDCWD</r>, "/r/ws/a", O_WRONLY|O_CREAT|O_TRUNC, 0644) = 3</r/ws/a>
        1 write(3</r/ws/a>, "aa", 2) = 2
        1 dup2(3</r/ws/a>, 7) = 7</r/ws/a>
        1 close(3</r/ws/a>) = 0
        1 openat(AT_FDCWD</r>, "/r/ws/b", O_WRONLY|O_CREAT|O_TRUNC, 0644) = 3</r/ws/b>
        1 write(7</r/ws/a>, "AA", 2) = 2
        1 write(3</r/ws/b>, "b", 1) = 1
        1 fsync(7</r/ws/a>) = 0
        1 fsync(3</r/ws/b>) = 0
    """
    state = last_minimal(trace + DIR_SYNC)
    assert state.files == {"/r/ws/a": b"aaAA", "/r/ws/b": b"b"}


def test_a_call_the_model_cannot_follow_is_refused_not_guessed() -> None:
    trace = """
        1 openat(AT_FDCWD</r>, "/r/ws/a", O_WRONLY|O_CREAT, 0644) = 3</r/ws/a>
        1 sendfile(3</r/ws/a>, 4</etc/hosts>, NULL, 10) = 10
    """
    with pytest.raises(TraceError, match="sendfile"):
        states(trace)


def test_only_durable_acknowledgements_count() -> None:
    acks = "\n".join(
        json.dumps(line)
        for line in (
            {"seqs": [1, 2], "ids": ["a", "b"], "sync": False},
            {"seqs": [3], "ids": ["c"], "sync": True},
            {"seqs": [4], "ids": ["d"], "sync": False},
        )
    )
    state = PowerState({}, frozenset(), {"/run/acks.jsonl": acks.encode() + b"\n{"}, (), "x")
    # seq 4 was written, not synced: a power cut may take it, and nobody was promised it.
    assert durable_acks(state, Path("/run")) == [(1, "a"), (2, "b"), (3, "c")]


def test_a_file_effect_counts_as_applied_exactly_when_the_disk_holds_it() -> None:
    scenario = BUILTIN_SCENARIOS["write"]
    spec = next(s for s in scenario.effects if s.kind == "file")
    assert spec.path is not None and spec.after is not None
    run = Path("/run")
    target = str(run / "ws" / spec.path)
    log = str(run / "effects.log")

    def applies(content: bytes | None, effects: bytes) -> list[str]:
        files = {} if content is None else {target: content}
        state = PowerState(files, frozenset(), {log: effects}, (), "x")
        lines = world_after_disk(state, scenario, run).world[log].decode().splitlines()
        return [line for line in lines if line.startswith("apply ")]

    # The rename survived but the cut came before the lab logged it: applied once.
    assert applies(spec.after.encode(), b"") == [f"apply {spec.path}"]
    # The lab logged it but the cut undid the rename: not applied.
    assert applies(None, f"apply {spec.path}\n".encode()) == []
    assert applies(spec.after.encode(), f"apply {spec.path}\ncall x\n".encode()) == [
        f"apply {spec.path}"
    ]


# =========================================================================== the lab


def tether(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tether", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_the_bounded_lab_passes_on_the_real_store(tmp_path: Path) -> None:
    require_strace()
    run = tether("crashlab", "--power-loss", "--json", "--workdir", str(tmp_path), cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads(run.stdout)
    assert report["verdict"] == "PASS" and report["mode"] == "bounded"
    assert report["lostAcknowledged"] == 0 and report["duplicateEffects"] == 0
    by_name = {s["scenario"]: s for s in report["scenarios"]}
    assert set(by_name) == {"write", "publish-report"}
    for summary in by_name.values():
        # Every scenario is cut after every call that changed the disk: dozens of states.
        assert summary["error"] is None and summary["cuts"] > 50 and summary["states"] > 30


@pytest.mark.parametrize(
    ("plant", "lost"),
    [
        ("skip_dir_sync", "directory ws/.tether/sessions not synced"),
        ("skip_sync_before_effect", "unsynced operation(s) lost"),
    ],
)
def test_a_planted_store_bug_is_reported_as_losing_acknowledged_facts(
    plant: str, lost: str, tmp_path: Path
) -> None:
    require_strace()
    options = PowerOptions(
        [BUILTIN_SCENARIOS["write"]], plant=plant, workdir=tmp_path, stop_at_failure=True
    )
    result = run_power_lab(options)
    assert result.verdict == "FAIL"
    first = result.failures[0]
    assert any(
        "was acknowledged before the power cut but is not in the log" in f
        for f in first.result.failures
    ), first.result.failures
    assert any(lost in line for line in first.lost), first.lost
    assert result.lost_acknowledged >= 1
    assert result.summary().startswith("FAIL power_loss states=")
    # The failing state is kept as it was recovered, with what it lost.
    assert first.copy is not None
    saved = json.loads((Path(first.copy) / "state.json").read_text())
    assert saved["lost"] == list(first.lost)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--full"], "--full goes with --power-loss or --io-errors"),
        (["--power-loss", "--io-errors"], "two labs: run one at a time"),
        (["--plant", "skip_dir_sync"], "--plant goes with --power-loss"),
        (["--power-loss", "--plant", "nope"], "unknown --plant 'nope'"),
        (["--power-loss", "-s", "conflict"], "cannot run under --power-loss"),
        (["--power-loss", "-s", "bogus"], "unknown scenario 'bogus'"),
        (["--power-loss", "--boundary", "store.after_write"], "cannot be combined with --boundary"),
    ],
)
def test_bad_power_loss_options_are_one_line_usage_errors(
    args: list[str], message: str, tmp_path: Path
) -> None:
    run = tether("crashlab", *args, cwd=tmp_path)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [run.stderr.strip()]
    assert message in run.stderr and "Traceback" not in run.stderr
