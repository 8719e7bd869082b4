"""The power-loss lab: every on-disk state a power cut could leave, recovered and checked.

A ``SIGKILL`` leaves the page cache: every write that returned is on disk. A power cut does
not. For each scenario the lab

1. prepares a run folder and notes every file and directory in it (rule P1 of
   :mod:`tether.testing.crashlab.power`: that much is durable);
2. runs the scenario once, to the end, under ``strace -f -y -xx`` recording every call that
   writes, syncs, creates, renames or removes a file, with the full bytes of every write
   (the store, the file-change journal, SQLite's ``effects.db`` and the tools' workspace
   writes all go through these calls, so nothing of tether's has to be instrumented);
3. feeds the trace to the model (:class:`~tether.testing.crashlab.power.Model`), which
   gives, after every call that changed something, the states a power cut there could
   leave (:func:`~tether.testing.crashlab.power.choices`: bounded or full);
4. for every distinct state: writes it into the run folder (the folder's own path: the
   session log names its workspace, so a state is recovered where it was made), resumes
   twice in a fresh process and checks it with the crash matrix's
   :func:`~tether.testing.crashlab.matrix.evaluate`: every commit acknowledged *durably*
   before the cut (a ``sync`` commit, and every commit before it) is in the log, no effect
   happened twice, the log reduces with every tool call answered once, recovery appended
   nothing on the second resume; recovery's decisions are the planner's, since the resume
   is the real executor.

The states of one scenario are recovered one after another in its folder; scenarios run in
parallel. A failing state keeps a copy of its folder (``state-N/``) and names what it lost.

Planted bugs (``TETHER_LAB_PLANT``, read by the child in ``run`` mode only) prove the lab
can fail: ``skip_dir_sync`` drops the directory ``fsync`` after the store creates a
session; ``skip_sync_before_effect`` drops the ``fdatasync`` of every commit (so the tool
intent is not durable when the tool runs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.testing.crashlab.child import (
    ACKS_FILE,
    EFFECTS_FILE,
    HITS_FILE,
    WORKSPACE,
    prepare_run_dir,
    session_log_bytes,
)
from tether.testing.crashlab.matrix import (
    DEFAULT_TIMEOUT,
    Case,
    CaseResult,
    ForkServerRunner,
    JobResult,
    Runner,
    SpawnRunner,
    child_environment,
    effects_integrated,
    fork_available,
    resume_and_evaluate,
)
from tether.testing.crashlab.power import (
    FileClass,
    Model,
    PowerState,
    TraceError,
    explore,
)
from tether.testing.crashlab.scenarios import BASH_RUNS, MCP_EFFECTS, Scenario
from tether.testing.crashlab.strace import Call, parse, strace_problem

__all__ = [
    "BOUNDED_CAP",
    "BOUNDED_SCENARIOS",
    "FULL_CAP",
    "FULL_SCENARIOS",
    "PLANTS",
    "PowerOptions",
    "PowerResult",
    "StateResult",
    "run_power_lab",
    "strace_problem",
    "world_after_disk",
]

BOUNDED_SCENARIOS = ("write", "publish-report")
FULL_SCENARIOS = ("write", "edit", "bash-counter", "publish-report", "multi-call")
BOUNDED_CAP = 2
"""States per cut in the bounded form: the minimal one and the log's tail torn."""
FULL_CAP = 64
PLANT_ENV = "TETHER_LAB_PLANT"
PLANTS = {
    "skip_dir_sync": "the store does not fsync the sessions directory after creating a session",
    "skip_sync_before_effect": "the store does not fdatasync its commits (a tool runs on an "
    "intent that is only in the page cache)",
}
TRACED = (
    "openat,write,pwrite64,writev,pwritev,pwritev2,ftruncate,truncate,fsync,fdatasync,"
    "rename,renameat,renameat2,link,linkat,unlink,unlinkat,rmdir,mkdir,mkdirat,"
    "close,dup,dup2,dup3,fcntl,lseek,clone,clone3,fork,vfork,sendfile,copy_file_range"
)
_WORLD_IN_WORKSPACE = (BASH_RUNS, MCP_EFFECTS)
_WORLD_IN_RUN_DIR = (ACKS_FILE, EFFECTS_FILE, HITS_FILE)


def classifier(run_dir: Path) -> Callable[[str], FileClass]:
    """Which files of a run folder are under test, which are the lab's record of the world."""
    root = str(run_dir)
    workspace = f"{root}/{WORKSPACE}"
    world = {f"{root}/{name}" for name in _WORLD_IN_RUN_DIR}
    world |= {f"{workspace}/{name}" for name in _WORLD_IN_WORKSPACE}
    ledger = f"{workspace}/.tether/ledger.db"

    def classify(path: str) -> FileClass:
        if path in world or path.startswith(ledger):
            return FileClass.WORLD  # the reference ledger is an outside service
        if path == workspace or path.startswith(workspace + "/"):
            if path.endswith("-shm"):
                return FileClass.IGNORED  # SQLite rebuilds its wal-index on first open
            return FileClass.SUBJECT
        return FileClass.IGNORED

    return classify


# =========================================================================== recording


@dataclass
class Recording:
    scenario: Scenario
    run_dir: Path
    files: dict[str, bytes]
    dirs: list[str]
    calls: list[Call]
    run: JobResult
    seconds: float


def _snapshot(run_dir: Path) -> tuple[dict[str, bytes], list[str]]:
    files: dict[str, bytes] = {}
    dirs = [str(run_dir)]
    for root, subdirs, names in os.walk(run_dir):
        dirs += [os.path.join(root, d) for d in subdirs]
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                files[path] = handle.read()
    return files, dirs


def record(scenario: Scenario, run_dir: Path, *, plant: str | None, timeout: float) -> Recording:
    """Prepare ``run_dir``, run the scenario to the end under strace (steps 1 and 2)."""
    prepare_run_dir(run_dir, scenario, "durable")
    files, dirs = _snapshot(run_dir)
    trace = run_dir.parent / f"{run_dir.name}.strace"
    env = child_environment()
    # Deterministic start-up: the same calls in the same order on every recording.
    env.update(PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1")
    env.pop(PLANT_ENV, None)
    if plant is not None:
        env[PLANT_ENV] = plant
    exe = shutil.which("strace") or "strace"
    argv = [
        exe,
        "-f",
        "-qq",
        "-y",
        "-xx",
        "-s",
        str(1 << 24),
        "-e",
        "signal=none",
        "-e",
        f"trace={TRACED}",
        "-o",
        str(trace),
        "--",
        sys.executable,
        "-m",
        "tether.testing.crashlab.child",
        scenario.name,
        str(run_dir),
        "run",
    ]
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            argv,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        run = JobResult(
            proc.returncode, time.perf_counter() - started, False, proc.stdout, proc.stderr
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        run = JobResult(-9, time.perf_counter() - started, True, out, "")
    text = trace.read_text(encoding="utf-8", errors="surrogateescape") if trace.exists() else ""
    trace.unlink(missing_ok=True)
    return Recording(
        scenario, run_dir, files, dirs, parse(text), run, time.perf_counter() - started
    )


# =========================================================================== states


def materialise(state: PowerState, run_dir: Path) -> None:
    """Make the run folder's workspace and the world files exactly ``state``."""
    workspace = run_dir / WORKSPACE
    shutil.rmtree(workspace, ignore_errors=True)
    for name in _WORLD_IN_RUN_DIR:
        (run_dir / name).unlink(missing_ok=True)
    for directory in sorted(state.dirs, key=len):
        if directory == str(workspace) or directory.startswith(f"{workspace}/"):
            os.makedirs(directory, exist_ok=True)
    for path, data in sorted(state.files.items()):
        _put(path, data, private=f"/{WORKSPACE}/.tether/" in path)
    for path, data in sorted(state.world.items()):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _put(path, data, private=False)


def _put(path: str, data: bytes, *, private: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def durable_acks(state: PowerState, run_dir: Path) -> list[tuple[int, str]]:
    """The commits acknowledged *durably* before the cut: up to the last ``sync`` commit.

    A commit with ``sync=False`` is written but not synced; the next synced commit's
    ``fdatasync`` makes it durable too (the log is one file), so it counts from then on.
    """
    text = state.world.get(str(run_dir / ACKS_FILE), b"").decode("utf-8", "replace")
    pending: list[tuple[int, str]] = []
    durable: list[tuple[int, str]] = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        pending.extend(zip((int(s) for s in value["seqs"]), map(str, value["ids"]), strict=True))
        if value.get("sync", True):
            durable.extend(pending)
            pending.clear()
    return durable


def world_after_disk(state: PowerState, scenario: Scenario, run_dir: Path) -> PowerState:
    """The ``apply PATH`` lines of ``effects.log`` as the disk of ``state`` tells them.

    The lab logs an apply right after the rename that makes it. A cut between the two, or
    one that undid the rename, would leave the log and the disk disagreeing; for a file
    the disk is the truth. So a file the run changes counts as applied once when it holds
    its after-content, and not at all otherwise (recovery applying it then is not a
    second effect; applied twice, it would hold the spec's ``twice`` content instead).
    """
    effects_path = str(run_dir / EFFECTS_FILE)
    raw = state.world.get(effects_path, b"").decode("utf-8", "replace")
    files = {s.path: s for s in scenario.effects if s.kind == "file" and s.path is not None}
    kept = [
        line
        for line in raw.splitlines(keepends=True)
        if not (line.startswith("apply ") and line[len("apply ") :].strip() in files)
    ]
    for relative, spec in files.items():
        content = state.files.get(str(run_dir / WORKSPACE / relative))
        if spec.after is not None and content == spec.after.encode():
            kept.append(f"apply {relative}\n")
    if not kept and effects_path not in state.world:
        return state
    world = dict(state.world)
    world[effects_path] = "".join(kept).encode()
    return PowerState(state.files, state.dirs, world, state.lost, state.kind)


# =========================================================================== the lab


@dataclass
class PowerOptions:
    scenarios: Sequence[Scenario]
    full: bool = False
    jobs: int = 0
    timeout: float = DEFAULT_TIMEOUT
    workdir: Path | None = None
    keep: bool = False
    fork: bool = True
    plant: str | None = None
    cap: int | None = None
    stop_at_failure: bool = False
    """Stop a scenario at its first failing state (to show a planted bug quickly)."""


@dataclass
class StateResult:
    scenario: str
    number: int
    cut: int
    call: str
    kind: str
    lost: tuple[str, ...]
    result: CaseResult
    copy: str | None = None

    @property
    def failed(self) -> bool:
        return self.result.verdict == "fail"

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "state": self.number,
            "cutAfterCall": self.cut,
            "call": self.call,
            "kind": self.kind,
            "lost": list(self.lost),
            "verdict": self.result.verdict,
            "failures": list(self.result.failures),
            "duplicateEffects": self.result.duplicates,
            "copy": self.copy,
        }


@dataclass
class ScenarioPower:
    scenario: str
    calls: int
    cuts: int
    states: int
    record_seconds: float
    error: str | None = None


@dataclass
class PowerResult:
    options: PowerOptions
    scenarios: list[ScenarioPower]
    results: list[StateResult]
    seconds: float
    workdir: Path

    @property
    def failures(self) -> list[StateResult]:
        return [r for r in self.results if r.failed]

    @property
    def lost_acknowledged(self) -> int:
        return sum(
            1
            for r in self.results
            if any("acknowledged before the power cut" in f for f in r.result.failures)
        )

    @property
    def duplicate_effects(self) -> int:
        return sum(r.result.duplicates for r in self.results)

    @property
    def verdict(self) -> str:
        if self.failures or any(s.error for s in self.scenarios):
            return "FAIL"
        return "PASS"

    def summary(self) -> str:
        return (
            f"{self.verdict} power_loss states={len(self.results)} "
            f"cuts={sum(s.cuts for s in self.scenarios)} scenarios={len(self.scenarios)} "
            f"lost_acknowledged={self.lost_acknowledged} "
            f"duplicate_effects={self.duplicate_effects} seconds={self.seconds:.0f}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "mode": "full" if self.options.full else "bounded",
            "model": "POSIX, ext4 data=ordered (tether.testing.crashlab.power, rules P1-P5)",
            "plant": self.options.plant,
            "states": len(self.results),
            "lostAcknowledged": self.lost_acknowledged,
            "duplicateEffects": self.duplicate_effects,
            "seconds": round(self.seconds, 1),
            "workdir": str(self.workdir),
            "scenarios": [
                {
                    "scenario": s.scenario,
                    "tracedCalls": s.calls,
                    "cuts": s.cuts,
                    "states": s.states,
                    "recordSeconds": round(s.record_seconds, 1),
                    "error": s.error,
                }
                for s in self.scenarios
            ],
            "failures": [r.to_json() for r in self.failures],
        }


Progress = Callable[[str, Any], None]


def _runner(fork: bool) -> Runner:
    return ForkServerRunner() if fork and fork_available() else SpawnRunner()


def _explore_one(
    scenario: Scenario, base: Path, options: PowerOptions, strict: bool, progress: Progress | None
) -> tuple[ScenarioPower, list[StateResult]]:
    run_dir = base / scenario.name / "run"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    recording = record(scenario, run_dir, plant=options.plant, timeout=options.timeout * 4)
    summary = ScenarioPower(scenario.name, len(recording.calls), 0, 0, recording.seconds)
    if recording.run.returncode != 0:
        summary.error = (
            f"the recorded run failed (exit status {recording.run.returncode}): "
            f"{recording.run.stderr_tail()}"
        )
        return summary, []
    cap = options.cap or (FULL_CAP if options.full else BOUNDED_CAP)
    model = Model(recording.files, recording.dirs, classifier(run_dir))
    results: list[StateResult] = []
    runner = _runner(options.fork)
    try:
        for cut in explore(model, recording.calls, full=options.full, cap=cap, describe=_text):
            summary.cuts += 1
            for state in cut.states:
                summary.states += 1
                results.append(
                    _recover(
                        scenario,
                        run_dir,
                        state,
                        cut.index,
                        cut.call,
                        summary.states,
                        recording.run,
                        runner,
                        options,
                        strict,
                    )
                )
                if progress is not None:
                    progress("state", results[-1])
                if options.stop_at_failure and results[-1].failed:
                    return summary, results
    except TraceError as exc:
        summary.error = f"the trace cannot be followed: {exc}"
    finally:
        runner.close()
    if not options.keep and not any(r.failed for r in results) and summary.error is None:
        shutil.rmtree(run_dir.parent, ignore_errors=True)
    return summary, results


def _recover(
    scenario: Scenario,
    run_dir: Path,
    state: PowerState,
    cut: int,
    call: str,
    number: int,
    recorded: JobResult,
    runner: Runner,
    options: PowerOptions,
    strict: bool,
) -> StateResult:
    state = world_after_disk(state, scenario, run_dir)
    materialise(state, run_dir)
    (run_dir / "out").mkdir(exist_ok=True)
    pre_log = session_log_bytes(run_dir)
    acks = durable_acks(state, run_dir)
    name = scenario.name
    result = CaseResult(
        Case(name, f"power:{cut}", number), crashed=False, run_dir=str(run_dir), power=state.kind
    )
    resume_and_evaluate(
        runner,
        scenario,
        result,
        run_dir,
        strict=strict,
        run=recorded,
        pre_log=pre_log,
        acks=acks,
        timeout=options.timeout,
    )
    out = StateResult(name, number, cut, call, state.kind, state.lost, result)
    if out.failed:
        # The folder is reused by the next state: keep this one's as it was recovered.
        copy = run_dir.parent / f"state-{number}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(run_dir, copy, symlinks=True)
        (copy / "state.json").write_text(json.dumps(out.to_json(), indent=1) + "\n")
        out.copy = str(copy)
    return out


def _text(call: Call) -> str:
    path = call.path_arg() or call.fd_path(0) or ""
    parts = path.split("/")
    short = "/".join(parts[-2:]) if len(parts) > 2 else path
    return f"#{call.index} {call.name}({short})"


def run_power_lab(options: PowerOptions, progress: Progress | None = None) -> PowerResult:
    """Record, explore and recover every scenario (in parallel: one scenario per job)."""
    started = time.perf_counter()
    if options.workdir is not None:
        options.workdir.mkdir(parents=True, exist_ok=True)
        base = Path(tempfile.mkdtemp(prefix="powerlab-", dir=options.workdir))
    else:
        base = Path(tempfile.mkdtemp(prefix="tether-powerlab-"))
    base = base.resolve()
    strict = effects_integrated()
    jobs = options.jobs if options.jobs > 0 else (os.cpu_count() or 1)
    summaries: list[ScenarioPower] = []
    results: list[StateResult] = []
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(options.scenarios)))) as pool:
        futures = [
            pool.submit(_explore_one, s, base, options, strict, progress) for s in options.scenarios
        ]
        for future in futures:
            summary, states = future.result()
            summaries.append(summary)
            results.extend(states)
    if not options.keep:
        try:
            base.rmdir()
        except OSError:
            pass
    return PowerResult(options, summaries, results, time.perf_counter() - started, base)
