"""The boundary matrix: discover, crash, resume twice, check.

For every scenario the lab first runs it once without a crash (``discover``), logging each
boundary hit; the matrix is every ``(boundary, N)`` seen — the N-th hit of a boundary that
repeats is its own case. For each case it then

1. prepares a fresh run folder and runs the scenario in a child process with
   ``TETHER_CRASH_AT=BOUNDARY@N`` (``SIGKILL`` there);
2. keeps the log bytes and the acknowledged commits left by the dead process;
3. resumes in a new child process, then resumes once more;
4. checks (:func:`evaluate`): the crash happened; every acknowledged commit and every
   complete line from before the crash is still in the log, byte for byte; the log reduces,
   without a torn tail; every tool call has exactly one result; the session is idle (or
   blocked on a review item); every never-replay effect happened at most once, and exactly
   once where the log records its outcome; a replay-safe call was replayed; review items
   only where allowed, each with a reason; the second resume appended nothing and changed
   no effect.

``sample=True`` (``tether crashlab --sample``, what ``make demo`` runs) narrows the matrix
to a representative sample (:func:`sample_cases`): every boundary at least once, the crash
points around an effect in every scenario, every scenario at least once.

Child processes come from a fork server per worker (:mod:`tether.testing.crashlab.child` ``serve``)
unless ``fork=False``: a forked job is a real process killed by a real ``SIGKILL``, it only
skips the interpreter start-up and the imports.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from tether._loading import reduce_session
from tether.errors import SessionCorruption
from tether.testing.crashlab.child import (
    ACKS_FILE,
    EXIT_TETHER_ERROR,
    HITS_FILE,
    LogFacts,
    apply_tamper,
    prepare_run_dir,
    session_log_bytes,
    session_log_path,
)
from tether.testing.crashlab.scenarios import EffectSpec, Scenario

__all__ = [
    "SAMPLE_IN_EVERY_SCENARIO",
    "Case",
    "CaseResult",
    "Discovery",
    "LabOptions",
    "LabResult",
    "effects_integrated",
    "evaluate",
    "judge_faulted_run",
    "parse_boundary_filter",
    "prepare_run_dir",
    "resume_and_evaluate",
    "run_lab",
    "sample_cases",
    "session_log_path",
]

DEFAULT_TIMEOUT = 120.0
KILLED = -signal.SIGKILL


# =========================================================================== runners


@dataclass(frozen=True, slots=True)
class JobResult:
    returncode: int
    elapsed: float
    timed_out: bool
    stdout: str
    stderr: str

    def json(self) -> dict[str, Any] | None:
        """The child's JSON line, if it printed one."""
        for line in reversed(self.stdout.splitlines()):
            if line.startswith("{"):
                try:
                    value = json.loads(line)
                except ValueError:
                    return None
                return value if isinstance(value, dict) else None
        return None

    def stderr_tail(self, lines: int = 3) -> str:
        tail = [line for line in self.stderr.splitlines() if line.strip()][-lines:]
        return " | ".join(tail)


class Runner(Protocol):
    def run(
        self, argv: Sequence[str], *, env: Mapping[str, str], out: Path, timeout: float
    ) -> JobResult: ...

    def close(self) -> None: ...


def child_environment() -> dict[str, str]:
    """Our environment without crash settings, with ``tether`` importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_CRASH")}
    source = str(Path(__file__).resolve().parents[2])
    parts = [source, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


class SpawnRunner:
    """One fresh ``python -m tether.testing.crashlab.child`` per job."""

    def run(
        self, argv: Sequence[str], *, env: Mapping[str, str], out: Path, timeout: float
    ) -> JobResult:
        full_env = {**child_environment(), **env}
        stdout, stderr = out.with_suffix(".stdout"), out.with_suffix(".stderr")
        started = time.perf_counter()
        with open(stdout, "wb") as o, open(stderr, "wb") as e:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tether.testing.crashlab.child", *argv],
                stdin=subprocess.DEVNULL,
                stdout=o,
                stderr=e,
                env=full_env,
            )
            timed_out = False
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                proc.kill()
                code = proc.wait()
        return JobResult(
            code, time.perf_counter() - started, timed_out, _read(stdout), _read(stderr)
        )

    def close(self) -> None:
        return None


class ForkServerRunner:
    """Jobs forked from a ``tether.testing.crashlab.child serve`` process (all imported)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tether.testing.crashlab.child", "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**child_environment(), **(env or {})},
            text=True,
            bufsize=1,
        )

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        out: Path,
        timeout: float,
        strace: Sequence[str] | None = None,
    ) -> JobResult:
        """``strace``: run the job under this strace command (``-p JOB`` is appended); the
        return code is then strace's, the job's own is in strace's log."""
        stdout, stderr = out.with_suffix(".stdout"), out.with_suffix(".stderr")
        job: dict[str, Any] = {
            "argv": list(argv),
            "env": dict(env),
            "stdout": str(stdout),
            "stderr": str(stderr),
            "timeout": timeout,
        }
        if strace is not None:
            job["strace"] = list(strace)
        pipe_in: IO[str] | None = self._proc.stdin
        pipe_out: IO[str] | None = self._proc.stdout
        assert pipe_in is not None and pipe_out is not None
        pipe_in.write(json.dumps(job) + "\n")
        pipe_in.flush()
        line = pipe_out.readline()
        if not line:
            raise RuntimeError("the crash lab's fork server died")
        answer = json.loads(line)
        return JobResult(
            int(answer["returncode"]),
            float(answer["elapsed"]),
            bool(answer.get("timedOut")),
            _read(stdout),
            _read(stderr),
        )

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


def fork_available() -> bool:
    return hasattr(os, "fork") and sys.platform.startswith("linux")


# =========================================================================== run folders


def _acks(run_dir: Path) -> list[tuple[int, str]]:
    acks: list[tuple[int, str]] = []
    for line in _read(run_dir / ACKS_FILE).splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue  # a line cut by the kill was never acknowledged to anyone
        acks.extend(
            zip((int(s) for s in value["seqs"]), (str(i) for i in value["ids"]), strict=True)
        )
    return acks


# =========================================================================== cases


@dataclass(frozen=True, slots=True)
class Case:
    scenario: str
    boundary: str
    hit: int

    @property
    def spec(self) -> str:
        return f"{self.boundary}@{self.hit}"

    @property
    def key(self) -> str:
        return f"{self.scenario}:{self.spec}"


@dataclass
class CaseResult:
    """One crash run and its checks."""

    case: Case
    verdict: str = "pass"  # pass | review | fail
    failures: list[str] = field(default_factory=list)
    duplicates: int = 0
    unknown: int = 0
    unknown_knowable: int = 0
    reviews: list[dict[str, Any]] = field(default_factory=list)
    reconciled: list[dict[str, Any]] = field(default_factory=list)
    """What the first resume's reconciliation decided (journal / lookup / review)."""
    effects: dict[str, Any] = field(default_factory=dict)
    recovery_ms: float | None = None
    recovery_wall_ms: float | None = None
    facts_appended: int | None = None
    resume_status: str | None = None
    run_dir: str | None = None
    reproduce: str = ""
    child_command: str = ""
    crashed: bool = True
    power: str | None = None
    """A power-loss state (:mod:`~tether.testing.crashlab.powerlab`): no process was
    killed, the disk was set to what a power cut leaves; the run is not judged."""
    fault: str | None = None
    """An injected I/O error (``SYSCALL@N:ERRNO path``) instead of a crash: the run is
    judged by :func:`judge_faulted_run` rather than required to have been killed."""
    lost_acknowledged: int = 0
    """Commits the faulted run acknowledged that its log (or the recovered log) lacks."""

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.case.scenario,
            "boundary": self.case.boundary,
            "hit": self.case.hit,
            "crashed": self.crashed,
            "verdict": self.verdict,
            "failures": list(self.failures),
            "duplicateEffects": self.duplicates,
            "unknownOutcomes": self.unknown,
            "reviews": list(self.reviews),
            "reconciled": list(self.reconciled),
            "effects": self.effects,
            "recoveryMs": _round(self.recovery_ms),
            "recoveryWallMs": _round(self.recovery_wall_ms),
            "factsAppended": self.facts_appended,
            "resumeStatus": self.resume_status,
            "runDir": self.run_dir,
            "reproduce": self.reproduce,
            "childCommand": self.child_command,
            **(
                {"fault": self.fault, "lostAcknowledged": self.lost_acknowledged}
                if self.fault is not None
                else {}
            ),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _fail(result: CaseResult, message: str) -> None:
    result.failures.append(" ".join(message.split()))


def evaluate(
    scenario: Scenario,
    result: CaseResult,
    *,
    strict: bool,
    run: JobResult,
    pre_log: bytes,
    acks: Sequence[tuple[int, str]],
    resume1: JobResult,
    log1: bytes,
    resume2: JobResult,
    log2: bytes,
) -> CaseResult:
    """Check one case (see the module docstring); fills in ``result`` and returns it."""
    case = result.case
    if result.power is not None:
        pass  # the recorded run finished; its disk was cut back to a power-loss state
    elif result.fault is not None:
        judge_faulted_run(result, run, pre_log, acks)
    elif result.crashed:
        if run.returncode != KILLED:
            why = "timed out" if run.timed_out else f"exit status {run.returncode}"
            _fail(
                result,
                f"the run did not crash at {case.spec} ({why}) {run.stderr_tail()}",
            )
    elif run.returncode != 0:
        _fail(
            result, f"the uncrashed run failed (exit status {run.returncode}) {run.stderr_tail()}"
        )
    out1 = resume1.json()
    if resume1.returncode != 0 or out1 is None:
        why = "timed out" if resume1.timed_out else f"exit status {resume1.returncode}"
        _fail(result, f"the first resume failed ({why}): {resume1.stderr_tail()}")
        return _finish(result, scenario)
    result.recovery_ms = float(out1.get("elapsedMs") or 0.0)
    result.recovery_wall_ms = resume1.elapsed * 1000.0
    result.reconciled = [dict(r) for r in out1.get("reconciled", ())]
    resumed = out1.get("result")
    result.resume_status = None if resumed is None else str(resumed.get("status"))

    before = LogFacts(pre_log)
    after = LogFacts(log1)
    result.facts_appended = after.last_seq - before.last_seq
    for facts, when in ((before, "before the crash"), (after, "after recovery")):
        if facts.error is not None:
            _fail(result, f"the log {when} cannot be parsed: {facts.error}")
    state = None
    try:
        state = reduce_session(after.complete) if after.complete else None
    except SessionCorruption as exc:
        _fail(result, f"the log after recovery does not reduce: {exc}")
    if after.torn:
        _fail(result, f"the log still ends in a torn tail of {after.torn} bytes after recovery")
    if not log1.startswith(before.complete):
        _fail(result, "a complete line written before the crash was changed or lost by recovery")
    ids = after.ids_by_seq()
    for seq, fact_id in acks:
        if ids.get(seq) != fact_id:
            if result.fault is not None and not result.lost_acknowledged:
                result.lost_acknowledged += 1  # lost by recovery (not already by the run)
            event = "fault" if result.fault else "power cut" if result.power else "crash"
            _fail(
                result,
                f"the commit of seq {seq} was acknowledged before the {event} "
                "but is not in the log",
            )
            break

    probe1 = out1.get("probeAfter") or {}
    reviews = [dict(r) for r in probe1.get("reviews", ())]
    open_reviews = {str(r["operationId"]) for r in reviews if r.get("status") == "open"}
    result.reviews = reviews
    known_states = {
        op: (spec, effect.get("content"))
        for spec in scenario.effects
        for effect in probe1.get("effects", ())
        if effect.get("callId") == spec.call_id and spec.kind == "file"
        for op in effect.get("operationIds", ())
    }
    for item in reviews:
        if not str(item.get("reason", "")).strip():
            _fail(result, f"review item #{item.get('id')} has no reason")
        state_of = known_states.get(str(item.get("operationId")))
        if state_of is not None and state_of[1] in (state_of[0].before, state_of[0].after):
            _fail(
                result,
                f"review item #{item.get('id')} although {state_of[0].path} holds its "
                f"{'before' if state_of[1] == state_of[0].before else 'after'} content: "
                "the outcome was knowable",
            )
        if item.get("tool") not in scenario.reviewable:
            _fail(
                result,
                f"review item #{item.get('id')} for {item.get('tool')}, whose outcome recovery "
                f"can establish: {item.get('reason')}",
            )

    # Transcript legality: every call exactly one result, no result without a call.
    for call in after.calls:
        count = len(after.results.get(call, ()))
        if count > 1:
            _fail(result, f"tool call {call} has {count} results")
        elif count == 0 and not (set(after.started.get(call, ())) & open_reviews):
            _fail(result, f"tool call {call} has no result after recovery")
    for call in after.results:
        if call not in after.calls:
            _fail(result, f"a tool result answers the unknown call {call}")
    if state is not None and state.operation.kind != "idle" and not open_reviews:
        detail = ""
        if resumed is not None:
            detail = f" (resume: {resumed.get('status')}"
            if resumed.get("blockedReason"):
                detail += f", {resumed.get('blockedReason')}: {resumed.get('message')}"
            detail += ")"
        _fail(result, f"the session was left with an unfinished {state.operation.kind}{detail}")

    _check_effects(scenario, result, probe1, after, strict=strict)

    out2 = resume2.json()
    if resume2.returncode != 0 or out2 is None:
        _fail(
            result,
            f"the second resume failed (exit status {resume2.returncode}): {resume2.stderr_tail()}",
        )
    else:
        if log2 != log1:
            _fail(
                result,
                f"the second resume appended {len(log2) - len(log1)} bytes "
                f"({LogFacts(log2).last_seq - after.last_seq} facts)",
            )
        if _counts(out2.get("probeAfter") or {}) != _counts(probe1):
            _fail(result, "the second resume changed an effect count")
    return _finish(result, scenario)


def judge_faulted_run(
    result: CaseResult, run: JobResult, pre_log: bytes, acks: Sequence[tuple[int, str]]
) -> None:
    """A run that got an injected I/O error must end one of two ways.

    Either it finished normally (exit 0: the error was absorbed or retried), or it stopped
    with a typed :class:`~tether.errors.TetherError`, reported in one line (exit status 3
    and ``{"error": {"type", "message"}}``). A traceback, a hang, a crash or any other exit
    is a failure. And what it acknowledged is what it left on disk: every acknowledged
    commit is in the log as the faulted run left it (memory never ran ahead of the disk).
    """
    if run.timed_out:
        _fail(result, f"the run with {result.fault} hung (timed out) {run.stderr_tail()}")
    elif run.returncode == EXIT_TETHER_ERROR:
        error = (run.json() or {}).get("error")
        if not isinstance(error, dict) or not error.get("type") or not error.get("message"):
            _fail(result, f"the run with {result.fault} exited 3 without a typed error line")
        elif "\n" in str(error["message"]) or "Traceback" in run.stderr:
            _fail(result, f"the run with {result.fault} printed a traceback for its error")
    elif run.returncode == 0:
        if "Traceback (most recent call last)" in run.stderr:
            _fail(result, f"the run with {result.fault} printed a traceback {run.stderr_tail()}")
    elif run.returncode != 0:
        why = "was killed" if run.returncode < 0 else f"exit status {run.returncode}"
        _fail(
            result,
            f"the run with {result.fault} did not stop with a typed error ({why}) "
            f"{run.stderr_tail()}",
        )
    ids = LogFacts(pre_log).ids_by_seq()
    missing = [seq for seq, fact_id in acks if ids.get(seq) != fact_id]
    if missing:
        result.lost_acknowledged += len(missing)
        _fail(
            result,
            f"the run with {result.fault} acknowledged {len(missing)} commit(s) its log does "
            f"not hold (first: seq {missing[0]}): memory ran ahead of the disk",
        )


def _counts(probe: Mapping[str, Any]) -> list[Any]:
    return [(e.get("callId"), e.get("count"), e.get("content")) for e in probe.get("effects", ())]


def _check_effects(
    scenario: Scenario,
    result: CaseResult,
    probe: Mapping[str, Any],
    facts: LogFacts,
    *,
    strict: bool,
) -> None:
    for orphan in probe.get("orphans", ()):
        result.duplicates += 1
        _fail(result, f"an effect nobody started: {orphan}")
    user_abort = facts.abort_requested
    specs = {spec.call_id: spec for spec in scenario.effects}
    for effect in probe.get("effects", ()):
        call = str(effect.get("callId"))
        tool = str(effect.get("tool"))
        kind = effect.get("kind")
        outcome = str(effect.get("outcome"))
        ops = [str(op) for op in effect.get("operationIds", ())]
        count = effect.get("count")
        key = ops[0] if len(ops) == 1 else call
        result.effects[key] = {
            "callId": call,
            "tool": tool,
            "count": count,
            "outcome": outcome,
            **({"perOperation": effect["perOperation"]} if "perOperation" in effect else {}),
        }
        if kind == "denied":
            if count != 0 or outcome not in ("error", "absent"):
                _fail(
                    result,
                    f"the denied {tool} call {call} ran {count} time(s) and ended {outcome}",
                )
            continue
        if kind == "replayed":
            if outcome not in ("success", "absent"):
                _fail(
                    result,
                    f"the replay-safe {tool} call {call} ended {outcome} instead of being replayed",
                )
            continue
        if outcome == "synthetic:interrupted":
            result.unknown += 1
            if tool in scenario.knowable and not user_abort:
                if strict:
                    _fail(
                        result,
                        f"the {tool} call {call} was recorded as interrupted although its "
                        "outcome can be established (journal or lookup)",
                    )
                else:
                    result.unknown_knowable += 1
        if count is None:
            _fail(
                result, f"cannot count the effects of the {tool} call {call}: {effect.get('error')}"
            )
            continue
        count = int(count)
        if count > 1:
            result.duplicates += count - 1
            _fail(result, f"DUPLICATE EFFECT: the {tool} call {call} took effect {count} times")
        if outcome == "success" and count == 0:
            _fail(
                result,
                f"LOST EFFECT: the {tool} call {call} has a success result but took no effect",
            )
        never_ran = outcome == "absent" or (
            outcome.startswith("synthetic:") and outcome != "synthetic:interrupted"
        )
        if never_ran and count > 0:
            _fail(result, f"the {tool} call {call} took effect although it never ran ({outcome})")
        spec = specs.get(call)
        if kind == "file" and spec is not None:
            tampered = scenario.tamper.get(spec.path or "")
            _check_file(result, spec, effect.get("content"), call, count, outcome, tampered)


def _check_file(
    result: CaseResult,
    spec: EffectSpec,
    content: str | None,
    call: str,
    count: int,
    outcome: str,
    tampered: str | None = None,
) -> None:
    """The file must hold exactly the before- or the after-content; ``after`` iff applied.

    ``tampered``: what someone else wrote after the crash (then only the apply count tells).
    """
    tool = spec.tool
    if tampered is not None and content == tampered:
        return
    if spec.twice is not None and content == spec.twice:
        result.duplicates += 1
        _fail(
            result,
            f"DUPLICATE EFFECT: the {tool} call {call} was applied twice "
            f"({spec.path} reads {content!r})",
        )
        return
    if content not in (spec.before, spec.after):
        _fail(
            result,
            f"the {tool} call {call} left {spec.path} in neither its before nor its after "
            f"state: {content!r}",
        )
        return
    if outcome == "success" and content != spec.after:
        _fail(
            result,
            f"LOST EFFECT: the {tool} call {call} has a success result but {spec.path} "
            "does not hold its content",
        )
    elif count == 0 and content != spec.before:
        _fail(result, f"{spec.path} changed without the lab seeing the {tool} call {call} apply it")
    elif count >= 1 and content != spec.after:
        _fail(
            result, f"the {tool} call {call} was applied but {spec.path} does not hold its content"
        )


def _finish(result: CaseResult, scenario: Scenario) -> CaseResult:
    if result.failures:
        result.verdict = "fail"
    elif scenario.user_tool and (result.unknown or result.reviews):
        result.verdict = "review"
    else:
        result.verdict = "pass"
    return result


# =========================================================================== the lab


@dataclass
class LabOptions:
    scenarios: Sequence[Scenario]
    boundaries: Sequence[str] = ()
    """``NAME`` (every hit) or ``NAME@N``; empty: the whole matrix."""
    jobs: int = 0
    durability: str = "durable"
    store: str | None = None
    """A ``postgresql://`` URL: every run's session in a schema of its own there."""
    timeout: float = DEFAULT_TIMEOUT
    workdir: Path | None = None
    keep: bool = False
    fork: bool = True
    reproduce: Callable[[Case], str] | None = None
    skipped: Sequence[tuple[str, str]] = ()
    sample: bool = False
    """Run a representative sample of the matrix (:func:`sample_cases`), not all of it."""


@dataclass
class Discovery:
    scenario: Scenario
    reached: list[Case]
    """Every (boundary, N) the uncrashed run passed."""
    baseline: CaseResult
    hits: int
    cases: list[Case] = field(default_factory=list)
    """The cases to run (``reached`` filtered by ``--boundary``, then sampled)."""
    left_out: list[Case] = field(default_factory=list)
    """The cases the whole matrix has and a sample leaves out."""


@dataclass
class LabResult:
    options: LabOptions
    discoveries: list[Discovery]
    results: list[CaseResult]
    wall_seconds: float
    strict: bool
    workdir: Path

    @property
    def failures(self) -> list[CaseResult]:
        baseline = [d.baseline for d in self.discoveries if d.baseline.verdict == "fail"]
        return baseline + [r for r in self.results if r.verdict == "fail"]

    @property
    def duplicate_effects(self) -> int:
        return sum(r.duplicates for r in self.results) + sum(
            d.baseline.duplicates for d in self.discoveries
        )

    @property
    def verdict(self) -> str:
        if self.failures:
            return "FAIL"
        everything = [*self.results, *(d.baseline for d in self.discoveries)]
        if any(r.verdict == "review" for r in everything):
            return "REVIEW"
        return "PASS"

    @property
    def boundaries(self) -> list[str]:
        return list(dict.fromkeys(r.case.boundary for r in self.results))


def effects_integrated() -> bool:
    """Whether the executor wires the effects layer in (journal / lookup on recovery).

    Heuristic: the executor's reconciliation module (:mod:`tether._runtime.recovery`) holds
    something from ``tether._effects``. When it does, an ``interrupted`` result for a call
    whose outcome the journal or a lookup can establish is a failure; until then it is only
    counted (and reported).
    """
    from tether._runtime import recovery

    for value in vars(recovery).values():
        module = getattr(value, "__module__", None) or getattr(value, "__name__", "")
        if isinstance(module, str) and module.startswith("tether._effects"):
            return True
    return False


def parse_boundary_filter(specs: Iterable[str]) -> list[tuple[str, int | None]]:
    out: list[tuple[str, int | None]] = []
    for spec in specs:
        name, sep, count = spec.strip().partition("@")
        if not name:
            raise ValueError(f"bad --boundary {spec!r}: expected NAME or NAME@N")
        if not sep:
            out.append((name, None))
            continue
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"bad --boundary {spec!r}: N must be a positive integer")
        out.append((name, int(count)))
    return out


def _matrix(scenario: Scenario, hits: list[str]) -> list[Case]:
    """Every (boundary, N) in the order the uncrashed run passed them."""
    seen: Counter[str] = Counter()
    cases = []
    for name in hits:
        seen[name] += 1
        cases.append(Case(scenario.name, name, seen[name]))
    return cases


SAMPLE_IN_EVERY_SCENARIO = ("before_effect", "after_effect")
"""The crash points on either side of a tool's effect, where a duplicate effect would be
born: a sample runs them in every scenario that reaches them."""


def sample_cases(discoveries: Sequence[Discovery]) -> None:
    """Narrow every discovery's ``cases`` to a representative sample (the rest go to
    ``left_out``), chosen in three passes, each case at the middle hit of its boundary in its
    scenario (the first and last store writes are the header and the closing fact; the
    middle of a run is where its work is):

    1. every boundary of :data:`SAMPLE_IN_EVERY_SCENARIO` in every scenario that reaches it;
    2. every other boundary once, in the scenario with the fewest sampled cases so far
       among those that reach it (the first one listed on a tie): the boundaries are spread
       over the scenarios;
    3. a scenario still without a case gets its boundary sampled least often so far.
    """
    hits: dict[tuple[str, str], list[Case]] = {}
    for discovery in discoveries:
        for case in discovery.cases:
            hits.setdefault((case.scenario, case.boundary), []).append(case)

    def middle(scenario: str, boundary: str) -> Case:
        cases = sorted(hits[(scenario, boundary)], key=lambda c: c.hit)
        return cases[(len(cases) - 1) // 2]

    chosen: dict[str, list[Case]] = {d.scenario.name: [] for d in discoveries}
    sampled: Counter[str] = Counter()

    def take(scenario: str, boundary: str) -> None:
        chosen[scenario].append(middle(scenario, boundary))
        sampled[boundary] += 1

    names = list(chosen)
    for scenario in names:
        for boundary in SAMPLE_IN_EVERY_SCENARIO:
            if (scenario, boundary) in hits:
                take(scenario, boundary)
    boundaries = dict.fromkeys(b for d in discoveries for b in (c.boundary for c in d.cases))
    for boundary in boundaries:
        if sampled[boundary]:
            continue
        reaching = [n for n in names if (n, boundary) in hits]
        take(min(reaching, key=lambda n: (len(chosen[n]), names.index(n))), boundary)
    for discovery in discoveries:
        name = discovery.scenario.name
        if not chosen[name] and discovery.cases:
            own = dict.fromkeys(c.boundary for c in discovery.cases)
            take(name, min(own, key=lambda b: (sampled[b], list(own).index(b))))
    for discovery in discoveries:
        keep = set(chosen[discovery.scenario.name])
        discovery.left_out = [c for c in discovery.cases if c not in keep]
        discovery.cases = [c for c in discovery.cases if c in keep]


def _select(cases: list[Case], wanted: list[tuple[str, int | None]]) -> list[Case]:
    if not wanted:
        return cases
    return [
        c for c in cases if any(c.boundary == b and (n is None or c.hit == n) for b, n in wanted)
    ]


class _Workers:
    """A thread pool whose threads each own a runner (a fork server)."""

    def __init__(self, jobs: int, fork: bool, env: Mapping[str, str] | None = None) -> None:
        self.jobs = jobs
        self.fork = fork and fork_available()
        self.env = dict(env or {})
        """Extra environment of the fork servers (and of spawned jobs' interpreters)."""
        self._local = threading.local()
        self._runners: list[Runner] = []
        self._lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="crashlab")

    def runner(self) -> Runner:
        runner: Runner | None = getattr(self._local, "runner", None)
        if runner is None:
            runner = ForkServerRunner(self.env) if self.fork else SpawnRunner()
            self._local.runner = runner
            with self._lock:
                self._runners.append(runner)
        return runner

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        for runner in self._runners:
            runner.close()


def _child_command(case: Case, run_dir: Path, scenario: Scenario) -> str:
    """The case by hand: rebuild the run folder, crash, (tamper,) resume twice."""

    def child(mode: str) -> str:
        argv = [
            sys.executable,
            "-m",
            "tether.testing.crashlab.child",
            case.scenario,
            str(run_dir),
            mode,
        ]
        return shlex.join(argv)

    tamper = f"{child('tamper')} && " if scenario.tamper else ""
    return (
        f"{child('reset')} && TETHER_CRASH_AT={case.spec} {child('run')}; "
        f"{tamper}{child('resume')} && {child('resume')}"
    )


def _execute(
    workers: _Workers,
    scenario: Scenario,
    case: Case,
    run_dir: Path,
    options: LabOptions,
    *,
    strict: bool,
    crash: bool,
) -> CaseResult:
    runner = workers.runner()
    name = scenario.name
    if crash:
        prepare_run_dir(run_dir, scenario, options.durability, options.store)
        env = {"TETHER_CRASH_AT": case.spec, "TETHER_CRASH_MODE": "kill"}
        run = runner.run(
            [name, str(run_dir), "run"],
            env=env,
            out=run_dir / "out" / "run",
            timeout=options.timeout,
        )
    else:
        run = runner.run(
            [name, str(run_dir), "discover"],
            env={},
            out=run_dir / "out" / "discover",
            timeout=options.timeout,
        )
    pre_log = session_log_bytes(run_dir)
    acks = _acks(run_dir)
    if scenario.tamper:
        apply_tamper(run_dir, scenario)
    result = CaseResult(case, crashed=crash, run_dir=str(run_dir))
    result.reproduce = options.reproduce(case) if options.reproduce is not None else ""
    result.child_command = _child_command(case, run_dir, scenario) if crash else ""
    return resume_and_evaluate(
        runner,
        scenario,
        result,
        run_dir,
        strict=strict,
        run=run,
        pre_log=pre_log,
        acks=acks,
        timeout=options.timeout,
    )


def resume_and_evaluate(
    runner: Runner,
    scenario: Scenario,
    result: CaseResult,
    run_dir: Path,
    *,
    strict: bool,
    run: JobResult,
    pre_log: bytes,
    acks: Sequence[tuple[int, str]],
    timeout: float,
) -> CaseResult:
    """Resume the run folder's session twice in fresh processes, then :func:`evaluate`.

    The same for every lab: a killed run, a faulted run, a power-cut state.
    """
    argv = [scenario.name, str(run_dir), "resume"]
    resume1 = runner.run(argv, env={}, out=run_dir / "out" / "resume1", timeout=timeout)
    log1 = session_log_bytes(run_dir)
    resume2 = runner.run(argv, env={}, out=run_dir / "out" / "resume2", timeout=timeout)
    log2 = session_log_bytes(run_dir)
    return evaluate(
        scenario,
        result,
        strict=strict,
        run=run,
        pre_log=pre_log,
        acks=acks,
        resume1=resume1,
        log1=log1,
        resume2=resume2,
        log2=log2,
    )


def _discover(
    workers: _Workers, scenario: Scenario, base: Path, options: LabOptions, strict: bool
) -> Discovery:
    run_dir = base / scenario.name / "discover"
    prepare_run_dir(run_dir, scenario, options.durability, options.store)
    baseline = _execute(
        workers,
        scenario,
        Case(scenario.name, "none", 0),
        run_dir,
        options,
        strict=strict,
        crash=False,
    )
    hits = [line for line in _read(run_dir / HITS_FILE).splitlines() if line]
    if not hits and not baseline.failures:
        _fail(baseline, "the uncrashed run passed no crash boundary")
        baseline.verdict = "fail"
    return Discovery(scenario, _matrix(scenario, hits), baseline, len(hits))


ProgressHook = Callable[[str, Any], None]


def run_lab(options: LabOptions, progress: ProgressHook | None = None) -> LabResult:
    """Discover, run the whole matrix in parallel and check every case.

    ``progress(event, payload)`` is called from the calling thread: ``("discovered",
    [Discovery…])`` once, then ``("case", CaseResult)`` per finished case.
    """
    started = time.perf_counter()
    jobs = options.jobs if options.jobs > 0 else (os.cpu_count() or 1)
    strict = effects_integrated()
    wanted = parse_boundary_filter(options.boundaries)
    if options.workdir is not None:
        options.workdir.mkdir(parents=True, exist_ok=True)
        base = Path(tempfile.mkdtemp(prefix="crashlab-", dir=options.workdir))
    else:
        base = Path(tempfile.mkdtemp(prefix="tether-crashlab-"))
    base = base.resolve()
    workers = _Workers(jobs, options.fork)
    discoveries: list[Discovery] = []
    results: list[CaseResult] = []
    try:
        futures = [
            workers.pool.submit(_discover, workers, s, base, options, strict)
            for s in options.scenarios
        ]
        discoveries = [f.result() for f in futures]
        for discovery in discoveries:
            discovery.cases = _select(discovery.reached, wanted)
            if discovery.baseline.verdict != "fail" and not options.keep:
                shutil.rmtree(Path(discovery.baseline.run_dir or base / "none"), ignore_errors=True)
        if options.sample:
            sample_cases(discoveries)
        if progress is not None:
            progress("discovered", discoveries)
        by_name = {s.name: s for s in options.scenarios}
        pending = []
        for discovery in discoveries:
            for case in discovery.cases:
                run_dir = base / case.scenario / case.spec
                scenario = by_name[case.scenario]
                pending.append(
                    workers.pool.submit(
                        _execute,
                        workers,
                        scenario,
                        case,
                        run_dir,
                        options,
                        strict=strict,
                        crash=True,
                    )
                )
        order = {future: index for index, future in enumerate(pending)}
        finished: dict[int, CaseResult] = {}
        for future in as_completed(pending):
            result = future.result()
            finished[order[future]] = result
            if result.verdict != "fail" and not options.keep and result.run_dir:
                shutil.rmtree(result.run_dir, ignore_errors=True)
            if progress is not None:
                progress("case", result)
        results = [finished[index] for index in range(len(pending))]
    finally:
        workers.close()
    if not options.keep:
        _prune(base)
    return LabResult(options, discoveries, results, time.perf_counter() - started, strict, base)


def _prune(base: Path) -> None:
    """Remove empty folders bottom-up (failing run folders stay for inspection)."""
    for root, _dirs, _files in sorted(os.walk(base), key=lambda item: -len(item[0])):
        try:
            os.rmdir(root)
        except OSError:
            pass


def summarize_boundaries(results: Sequence[CaseResult]) -> list[dict[str, Any]]:
    """Per boundary: runs, recovery time, facts appended, effects per operation, reviews."""
    rows: dict[str, dict[str, Any]] = {}
    for r in results:
        row = rows.setdefault(
            r.case.boundary,
            {
                "boundary": r.case.boundary,
                "runs": 0,
                "hits": 0,
                "recovery": [],
                "facts": [],
                "maxEffects": 0,
                "effectOps": 0,
                "unknown": 0,
                "reviews": Counter(),
                "failed": 0,
                "duplicates": 0,
            },
        )
        row["runs"] += 1
        row["hits"] = max(row["hits"], r.case.hit)
        if r.recovery_ms is not None:
            row["recovery"].append(r.recovery_ms)
        if r.facts_appended is not None:
            row["facts"].append(r.facts_appended)
        for effect in r.effects.values():
            if effect.get("count") is not None:
                row["effectOps"] += 1
                row["maxEffects"] = max(row["maxEffects"], int(effect["count"]))
        row["unknown"] += r.unknown
        for item in r.reviews:
            row["reviews"][str(item.get("reason"))] += 1
        row["failed"] += r.verdict == "fail"
        row["duplicates"] += r.duplicates
    out = []
    for row in rows.values():
        recovery = row.pop("recovery")
        facts = row.pop("facts")
        reviews: Counter[str] = row.pop("reviews")
        row["recoveryMedianMs"] = round(statistics.median(recovery), 1) if recovery else None
        row["recoveryMaxMs"] = round(max(recovery), 1) if recovery else None
        row["factsAppendedMin"] = min(facts) if facts else None
        row["factsAppendedMax"] = max(facts) if facts else None
        row["reviewCount"] = sum(reviews.values())
        row["reviewReasons"] = dict(reviews)
        out.append(row)
    return out
