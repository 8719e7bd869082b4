"""Crash tests of the agent loop with real processes killed by ``SIGKILL``.

Scenario: a scripted model answers the prompt with ONE assistant message holding two tool
calls — ``read README.md`` (replay ``safe``) and ``bash "echo x >> counter.txt"`` (replay
``never``) — and then with a final ``stop`` answer. ``tests/runtime_child.py`` runs it in
a child process with one crash boundary armed (``TETHER_CRASH_AT=NAME@N``); the parent
then resumes in a new child, and resumes once more (in process, to save start-up time).

A clean run passes the runtime boundaries and the store's commit boundaries this often
(checked by :func:`test_boundary_hit_counts`, in process, and by the "no crash" cases of
the matrix, which arm the hit *after* the last one and must run to completion)::

    commit  1  [user entry, runStarted]          run_accepted@1
    commit  2  stepAttempt (step 1, attempt 1)   attempt_recorded@1, response_received@1
    commit  3  [assistant toolUse, usage]
    commit  4  toolStarted read                  before_effect@1, after_effect@1
    commit  5  read result                       after_result@1
    commit  6  toolStarted bash                  before_effect@2, after_effect@2
    commit  7  bash result                       after_result@2
    commit  8  stepAttempt (step 2, attempt 1)   attempt_recorded@2, response_received@2
    commit  9  [assistant stop, usage]
    commit 10  operationFinished completed       operation_finished@1

Every crash leaves a *durable prefix* of ``d`` commits (``store.before_write@k`` and
``store.torn_write@k`` leave ``k-1``, ``store.after_write@k`` leaves ``k``; the page cache
survives ``SIGKILL``). ``store.after_sync`` is hit at the durable points only (docs/runtime.md,
"Durable points"): after commits 2, 4, 6 and 8 (the attempts and the tool intents) and after
the final flush, so ``store.after_sync@j`` leaves the commit of the ``j``-th durable point.
What recovery must do follows from ``d`` alone (spec 14.5), except for the one case the
log cannot tell apart: with ``d=6`` the bash command either never ran (``before_effect@2``,
``store.*@6``) or ran (``after_effect@2``, ``store.before_write@7``/``store.torn_write@7``);
both become ``interrupted`` and are never re-run, so the counter file holds 0 or 1 line.

Every runtime boundary is crashed at every hit; the store boundaries at the commits
listed in :func:`_cases`. Further tests: two crashes at ``attempt_recorded`` (blocked
``attempts_exhausted``, then ``resume --abort``), ``--abort`` after a tool intent, a crash
while aborting, a changed environment or script (blocked), a changed replay declaration,
``TETHER_CRASH_MODE=exit``, a kill from outside while a command runs, and a compaction
matrix.

For every case the test checks: the child died by ``SIGKILL``; the log reduces and holds
exactly ``d`` transactions; the resume finishes the run (or finds it idle); the counter
file has at most one line (exactly as predicted); ``read`` has a successful result (it is
replayed when the crash came between its intent and its result); every call has exactly
one result; every committed byte from before the crash is a prefix of the final log; a
torn tail is repaired; and a second resume appends zero bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tether import _faults as faults
from tether._faults import CRASH_EXIT_CODE
from tether._models import load_model
from tether._runtime import Agent, RunStatus
from tether.core import reduce_session
from tether.core.state import IdleOperation, SessionState

REPO_ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "runtime_child.py"
README_TEXT = "hello from the README\n"
COUNTER_CMD = "echo x >> counter.txt"
INTERRUPTED = (
    "Operation interrupted after execution status became unknown; the tool was not replayed."
)

SCRIPT: dict[str, Any] = {
    "model": "scripted/crash",
    "responses": [
        {
            "content": "Let me look and count.",
            "tool_calls": [
                {"id": "call_read", "name": "read", "arguments": {"path": "README.md"}},
                {"id": "call_bash", "name": "bash", "arguments": {"command": COUNTER_CMD}},
            ],
            "usage": {"input": 100, "output": 20},
        },
        {"content": "Done.", "finish_reason": "stop", "usage": {"input": 150, "output": 3}},
    ],
}

RUNTIME_HITS = {
    "run_accepted": 1,
    "attempt_recorded": 2,
    "response_received": 2,
    "before_effect": 2,
    "after_effect": 2,
    "after_result": 2,
    "operation_finished": 1,
}
COMMITS = 10
STORE_HITS = {
    "store.before_write": COMMITS,
    "store.torn_write": COMMITS,
    "store.after_write": COMMITS,
    "store.after_sync": 5,
}
# The commit each durable point (an fdatasync, store.after_sync@j) makes durable: the two
# attempts, the two tool intents, and the final flush after operationFinished.
SYNCED_COMMITS = (2, 4, 6, 8, COMMITS)
# Boundaries of creating the session (one create, so one hit each); the store's own crash
# tests (tests/test_store_crash.py) and the crash lab kill there.
CREATE_HITS = {
    "store.create_opened": 1,
    "store.locked": 1,
    "store.create_written": 1,
    "store.create_linked": 1,
}

# Durable prefix (number of transactions after the header) a runtime crash leaves.
RUNTIME_PREFIX = {
    ("run_accepted", 1): 1,
    ("attempt_recorded", 1): 2,
    ("attempt_recorded", 2): 8,
    ("response_received", 1): 2,
    ("response_received", 2): 8,
    ("before_effect", 1): 4,
    ("before_effect", 2): 6,
    ("after_effect", 1): 4,
    ("after_effect", 2): 6,
    ("after_result", 1): 5,
    ("after_result", 2): 7,
    ("operation_finished", 1): 10,
}


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module", autouse=True)
def _default_environment() -> Iterator[None]:
    """In-process agents must have the children's identity: the workspace path."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("TETHER_ENVIRONMENT_IDENTITY", raising=False)
        yield


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TETHER_CRASH") and k != "TETHER_ENVIRONMENT_IDENTITY"
    }
    env["PYTHONPATH"] = str(REPO_ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


@dataclass
class Child:
    returncode: int
    stdout: str
    stderr: str

    @property
    def result(self) -> dict[str, Any]:
        lines = self.stdout.strip().splitlines()
        assert lines, f"no result (rc={self.returncode}); stderr:\n{self.stderr[-3000:]}"
        value: dict[str, Any] = json.loads(lines[-1])
        return value

    @property
    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.stderr.splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out


def spawn(args: Sequence[str], env: Mapping[str, str] | None = None) -> Child:
    proc = subprocess.run(
        [sys.executable, str(CHILD), *args],
        capture_output=True,
        text=True,
        env=child_env(env),
        timeout=60,
    )
    return Child(proc.returncode, proc.stdout, proc.stderr)


def crash_env(spec: str | None) -> dict[str, str]:
    return {"TETHER_CRASH_AT": spec, "TETHER_CRASH_MODE": "kill"} if spec else {}


def make_workspace(root: Path, script: Mapping[str, Any] = SCRIPT) -> tuple[Path, Path]:
    workspace = root / "ws"
    workspace.mkdir(parents=True)
    (workspace / "README.md").write_text(README_TEXT)
    script_path = root / "script.json"
    script_path.write_text(json.dumps(script))
    return workspace, script_path


def session_file(workspace: Path) -> Path:
    files = sorted((workspace / ".tether" / "sessions").glob("*.jsonl"))
    assert len(files) == 1, files
    return files[0]


def session_id(path: Path) -> str:
    return path.name.split("_", 1)[1].removesuffix(".jsonl")


def committed(data: bytes) -> bytes:
    return data[: data.rfind(b"\n") + 1]


def transactions(data: bytes) -> list[list[dict[str, Any]]]:
    """The committed transactions (after the header), each as a list of facts."""
    lines = committed(data).split(b"\n")[1:-1]
    out = []
    for line in lines:
        value = json.loads(line)
        out.append(value if isinstance(value, list) else [value])
    return out


def facts(data: bytes) -> list[dict[str, Any]]:
    return [fact for tx in transactions(data) for fact in tx]


def records(data: bytes, kind: str) -> list[dict[str, Any]]:
    return [
        f["record"] for f in facts(data) if f["kind"] == "record" and f["record"]["type"] == kind
    ]


def tool_results(data: bytes) -> dict[str, list[dict[str, Any]]]:
    """call id → the tool entries answering it (in log order)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for fact in facts(data):
        if fact["kind"] != "entry":
            continue
        entry = fact["entry"]
        message = entry.get("message")
        if entry["type"] == "message" and message and message["role"] == "tool":
            out.setdefault(message["tool_call_id"], []).append(entry)
    return out


def assert_legal_transcript(state: SessionState, *, closed: bool) -> None:
    """Spec 6.3 over ``state.transcript``; with ``closed``, every call is answered once."""
    open_calls: set[str] = set()
    answered: Counter[str] = Counter()
    calls: list[str] = []
    for message in state.transcript:
        role = message["role"]
        if role == "assistant":
            assert not open_calls, f"assistant message while calls are open: {open_calls}"
            ids = [c["id"] for c in message.get("tool_calls", ())]
            assert len(ids) == len(set(ids))
            open_calls = set(ids)
            calls.extend(ids)
        elif role == "tool":
            call_id = message["tool_call_id"]
            assert call_id in open_calls, f"tool result for {call_id} is not open"
            open_calls.discard(call_id)
            answered[call_id] += 1
        else:
            assert role == "user"
            assert not open_calls, f"user message while calls are open: {open_calls}"
    if closed:
        assert not open_calls, f"unanswered calls: {open_calls}"
        assert all(answered[c] == 1 for c in calls), answered


def counter_lines(workspace: Path) -> int:
    path = workspace / "counter.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def finished_outcomes(data: bytes) -> list[str]:
    return [r["outcome"] for r in records(data, "operationFinished")]


# --------------------------------------------------------------------------- the matrix


@dataclass(frozen=True)
class Case:
    boundary: str
    hit: int

    @property
    def spec(self) -> str:
        return f"{self.boundary}@{self.hit}"

    @property
    def crashes(self) -> bool:
        limit = RUNTIME_HITS.get(self.boundary, STORE_HITS.get(self.boundary, 0))
        return self.hit <= limit

    @property
    def durable_prefix(self) -> int:
        """Transactions on disk after the crash (after the whole run when nothing fires)."""
        if not self.crashes:
            return COMMITS
        if self.boundary in RUNTIME_HITS:
            return RUNTIME_PREFIX[(self.boundary, self.hit)]
        if self.boundary in ("store.before_write", "store.torn_write"):
            return self.hit - 1
        if self.boundary == "store.after_sync":
            return SYNCED_COMMITS[self.hit - 1]
        return self.hit

    @property
    def bash_ran_before_crash(self) -> bool:
        if self.boundary == "store.after_sync":
            return self.durable_prefix >= 7
        if self.boundary in STORE_HITS:
            return self.hit >= 7  # commit 7 (the bash result) was being written
        return self.durable_prefix >= 7 or (self.boundary, self.hit) == ("after_effect", 2)


def _cases() -> list[Case]:
    cases = [Case(name, n) for name, count in RUNTIME_HITS.items() for n in range(1, count + 1)]
    # One past the last hit: the child must run to completion (ends the enumeration).
    cases += [Case(name, count + 1) for name, count in RUNTIME_HITS.items()]
    # torn_write@5 and @8 leave the prefixes of before_effect@1 and after_result@2.
    cases += [Case("store.torn_write", k) for k in (1, 2, 3, 4, 6, 7, 9, 10, COMMITS + 1)]
    # The other store boundaries leave the same prefixes as torn_write@k (without the
    # tail) or torn_write@k+1; a few commits each, around the bash call.
    cases += [Case("store.before_write", k) for k in (1, 7)]
    cases += [Case("store.after_write", k) for k in (6, 7)]
    cases += [Case("store.after_sync", k) for k in (1, 3, 5)]
    return cases


CASES = _cases()


@dataclass
class Outcome:
    case: Case
    workspace: Path
    crash: Child
    after_crash: bytes
    resume: Child | None = None
    after_resume: bytes = b""
    again_status: str = ""
    after_again: bytes = b""
    error: BaseException | None = field(default=None)


def run_case(case: Case, root: Path) -> Outcome:
    workspace, script = make_workspace(root)
    crash = spawn(["run", str(workspace), str(script)], crash_env(case.spec))
    path = session_file(workspace)
    outcome = Outcome(case, workspace, crash, path.read_bytes())
    sid = session_id(path)
    if case.crashes:
        outcome.resume = spawn(["resume", str(workspace), str(script), sid])
    else:  # nothing to recover: the in-process resume below proves that
        outcome.resume = Child(0, "", "")
    outcome.after_resume = path.read_bytes()
    # The second resume runs in this process (cheaper; the first one proved the child).
    again = Agent(load_model(f"scripted:{script}"), workspace=workspace).resume(sid)
    outcome.again_status = again.status.value
    outcome.after_again = path.read_bytes()
    return outcome


@pytest.fixture(scope="module")
def outcomes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Outcome]:
    """Run every selected case of the matrix, several child processes at a time."""
    selected = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if getattr(item, "originalname", None) == "test_crash_then_resume" and callspec:
            selected.append(callspec.params["case"])
    root = tmp_path_factory.mktemp("crash")

    def one(index_case: tuple[int, Case]) -> tuple[str, Outcome]:
        index, case = index_case
        try:
            return case.spec, run_case(case, root / f"{index:02d}")
        except BaseException as exc:  # reported by the test of that case
            empty = Child(0, "", "")
            return case.spec, Outcome(case, root, empty, b"", error=exc)

    workers = max(2, min(4, (os.cpu_count() or 2) + 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(pool.map(one, enumerate(selected)))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.spec)
def test_crash_then_resume(case: Case, outcomes: dict[str, Outcome]) -> None:
    out = outcomes[case.spec]
    if out.error is not None:
        raise out.error
    d = case.durable_prefix

    # 1. The crash: SIGKILL, nothing printed; or (one hit too many) a normal run.
    if case.crashes:
        assert out.crash.returncode == -9, (out.crash.returncode, out.crash.stderr[-2000:])
        assert out.crash.stdout == ""
    else:
        assert out.crash.returncode == 0, out.crash.stderr[-2000:]
        assert out.crash.result["status"] == "completed"
    data0 = out.after_crash
    base0 = committed(data0)
    torn = len(data0) - len(base0)
    if case.boundary == "store.torn_write" and case.crashes:
        assert torn > 0, "the torn-write boundary must leave a torn tail"
    else:
        assert torn == 0
    state0 = reduce_session(data0)  # never corrupt; the torn tail is ignored
    assert_legal_transcript(state0, closed=False)
    assert len(transactions(data0)) == d, "durable prefix differs from the prediction"

    # 2. The resume finishes the run (or finds nothing to do).
    assert out.resume is not None
    assert out.resume.returncode == 0, out.resume.stderr[-3000:]
    if case.crashes:
        result = out.resume.result
        expected_status = "completed" if 1 <= d < COMMITS else "idle"
        assert result["status"] == expected_status, result
        if expected_status == "completed":
            assert result["text"] == "Done."
        opened = next(e for e in out.resume.events if e["event"] == "session")
        assert opened["repaired"] == torn
    data1 = out.after_resume
    assert data1.startswith(base0), "a fact committed before the crash was lost or changed"
    assert data1.endswith(b"\n")
    state1 = reduce_session(data1)
    assert isinstance(state1.operation, IdleOperation)
    assert_legal_transcript(state1, closed=True)

    if d == 0:  # the prompt was never accepted: nothing to recover, nothing ran
        assert data1 == base0
        assert state1.transcript == ()
        assert counter_lines(out.workspace) == 0
    else:
        assert finished_outcomes(data1) == ["completed"]
        finish = records(data1, "operationFinished")[0]
        assert finish["completion"] == "normal"
        assert state1.transcript[-1] == {"role": "assistant", "content": "Done."}
        results = tool_results(data1)
        assert set(results) == {"call_read", "call_bash"}
        # read: always a real, successful result (replayed after a crash mid-call).
        (read,) = results["call_read"]
        assert read["result"] == {"type": "success"}
        assert README_TEXT.strip() in read["message"]["content"]
        # bash: at most once; interrupted (not re-run) if it was started and not answered.
        (bash,) = results["call_bash"]
        started = records(data1, "toolStarted")
        assert [s["toolName"] for s in started] == ["read", "bash"]
        assert started[1]["replay"] == "never" and started[0]["replay"] == "safe"
        if d == 6:
            assert bash["result"] == {"type": "synthetic", "reason": "interrupted"}
            assert bash["message"]["content"] == INTERRUPTED
            assert counter_lines(out.workspace) == (1 if case.bash_ran_before_crash else 0)
        else:
            assert bash["result"] == {"type": "success"}
            assert "exit code: 0" in bash["message"]["content"]
            assert counter_lines(out.workspace) == 1
        # An open attempt is retried once, as attempt 2 of the same step.
        attempts = records(data1, "stepAttempt")
        retry = {2: 1, 8: 2}.get(d)  # index of the retry when an attempt was left open
        numbers = {None: [1, 1], 1: [1, 2, 1], 2: [1, 1, 2]}[retry]
        assert [a["attempt"] for a in attempts] == numbers
        if retry is not None:
            first, second = attempts[retry - 1], attempts[retry]
            assert second["stepId"] == first["stepId"]
            assert second["contextThroughEntryId"] == first["contextThroughEntryId"]
        assert records(data1, "stepFailed") == []
        assert (state1.usage.input, state1.usage.output) == (250, 23)
    assert counter_lines(out.workspace) <= 1

    # 3. A second resume appends nothing.
    assert out.again_status == "idle"
    assert out.after_again == data1


# --------------------------------------------------------------------------- enumeration


def test_boundary_hit_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A clean run (in process) passes each boundary exactly as often as the matrix assumes."""
    workspace, script = make_workspace(tmp_path)
    hits: Counter[str] = Counter()
    real_hit = faults.hit

    def counting(name: str, before_crash: Any = None) -> None:
        hits[name] += 1
        real_hit(name, before_crash)

    monkeypatch.setattr(faults, "hit", counting)
    monkeypatch.setattr(faults, "ARMED", True)  # the store only calls hit() when armed
    result = Agent(load_model(f"scripted:{script}"), workspace=workspace).run("do it")
    assert result.status is RunStatus.COMPLETED
    assert {k: hits[k] for k in RUNTIME_HITS} == RUNTIME_HITS
    assert {k: hits[k] for k in STORE_HITS} == STORE_HITS
    assert {k: hits[k] for k in CREATE_HITS} == CREATE_HITS
    assert set(hits) <= set(RUNTIME_HITS) | set(STORE_HITS) | set(CREATE_HITS)
    data = session_file(workspace).read_bytes()
    assert len(transactions(data)) == COMMITS
    assert counter_lines(workspace) == 1


def test_every_runtime_boundary_is_in_the_matrix() -> None:
    from tether._runtime import boundaries

    assert set(boundaries.ALL) == set(RUNTIME_HITS)
    covered = {(c.boundary, c.hit) for c in CASES}
    for name, count in RUNTIME_HITS.items():
        for n in range(1, count + 2):
            assert (name, n) in covered


# --------------------------------------------------------------------------- retries, abort


def test_attempt_crash_twice_blocks_then_abort_closes(tmp_path: Path) -> None:
    workspace, script = make_workspace(tmp_path)
    crashed = spawn(["run", str(workspace), str(script)], crash_env("attempt_recorded@1"))
    assert crashed.returncode == -9
    path = session_file(workspace)
    sid = session_id(path)

    # The resume records attempt 2 of the same step, and dies again before the request.
    again = spawn(["resume", str(workspace), str(script), sid], crash_env("attempt_recorded@1"))
    assert again.returncode == -9
    attempts = records(path.read_bytes(), "stepAttempt")
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert attempts[0]["stepId"] == attempts[1]["stepId"]
    assert attempts[0]["attemptId"] != attempts[1]["attemptId"]
    assert attempts[0]["contextThroughEntryId"] == attempts[1]["contextThroughEntryId"]
    assert attempts[0]["configurationDigest"] == attempts[1]["configurationDigest"]

    # Never a third attempt: blocked, nothing appended, and it stays blocked.
    before = path.read_bytes()
    blocked = spawn(["resume", str(workspace), str(script), sid])
    assert blocked.returncode == 0, blocked.stderr
    assert blocked.result["status"] == "blocked"
    assert blocked.result["blockedReason"] == "attempts_exhausted"
    assert "--abort" in blocked.result["message"]
    assert path.read_bytes() == before
    agent = Agent(load_model(f"scripted:{script}"), workspace=workspace)
    assert agent.resume(sid).blocked_reason == "attempts_exhausted"
    assert path.read_bytes() == before

    # Neither a new prompt nor a compaction is accepted while recovery is blocked.
    refused = agent.run("a new prompt", session=sid)
    assert refused.status is RunStatus.BLOCKED
    assert refused.blocked_reason == "attempts_exhausted"
    assert agent.compact(sid).status is RunStatus.BLOCKED
    assert path.read_bytes() == before
    agent.close()  # it holds the session (blocked or not): the child is the next writer

    # resume --abort closes it durably: abortRequested, stepFailed(aborted), finished aborted.
    aborted = spawn(["resume", str(workspace), str(script), sid, "--abort"])
    assert aborted.returncode == 0, aborted.stderr
    assert aborted.result["status"] == "aborted"
    data = path.read_bytes()
    assert data.startswith(before)
    new = [f for tx in transactions(data)[len(transactions(before)) :] for f in tx]
    assert [f["record"]["type"] for f in new] == [
        "abortRequested",
        "stepFailed",
        "operationFinished",
    ]
    assert new[0]["record"]["phase"] == "model"
    assert new[1]["record"]["error"] == {"code": "aborted", "message": "Operation aborted"}
    assert new[1]["record"]["attemptId"] == attempts[1]["attemptId"]
    assert new[2]["record"]["outcome"] == "aborted"
    state = reduce_session(data)
    assert isinstance(state.operation, IdleOperation)
    assert_legal_transcript(state, closed=True)
    assert counter_lines(workspace) == 0
    assert agent.resume(sid).status is RunStatus.IDLE
    assert path.read_bytes() == data


def test_abort_after_tool_intent_interrupts_started_and_aborts_queued(tmp_path: Path) -> None:
    """Crash with read started and bash queued, then ``resume --abort``."""
    workspace, script = make_workspace(tmp_path)
    crashed = spawn(["run", str(workspace), str(script)], crash_env("before_effect@1"))
    assert crashed.returncode == -9
    path = session_file(workspace)
    before = path.read_bytes()
    aborted = spawn(["resume", str(workspace), str(script), session_id(path), "--abort"])
    assert aborted.result["status"] == "aborted", aborted.stderr
    data = path.read_bytes()
    assert data.startswith(before)
    results = tool_results(data)
    # read was started (safe, but abort wins over replay): interrupted; bash never started.
    assert results["call_read"][0]["result"] == {"type": "synthetic", "reason": "interrupted"}
    assert results["call_bash"][0]["result"] == {"type": "synthetic", "reason": "aborted"}
    abort = records(data, "abortRequested")[0]
    assert abort["phase"] == "tool" and abort["toolCallId"] == "call_read"
    assert finished_outcomes(data) == ["aborted"]
    assert_legal_transcript(reduce_session(data), closed=True)
    assert counter_lines(workspace) == 0


def test_environment_change_blocks_replay(tmp_path: Path) -> None:
    workspace, script = make_workspace(tmp_path)
    env_a = {"TETHER_ENVIRONMENT_IDENTITY": "machine-a"}
    crashed = spawn(["run", str(workspace), str(script)], {**env_a, **crash_env("after_effect@1")})
    assert crashed.returncode == -9
    path = session_file(workspace)
    sid = session_id(path)
    data0 = path.read_bytes()
    assert b'"environmentIdentity":"machine-a"' in data0.split(b"\n", 1)[0]
    (started,) = records(data0, "toolStarted")
    assert started["environmentIdentity"] == "machine-a"

    model = load_model(f"scripted:{script}")
    other = Agent(model, workspace=workspace, environment="b").resume(sid)
    assert other.status is RunStatus.BLOCKED
    assert other.blocked_reason == "environment_changed"
    assert "machine-a" in (other.message or "")
    assert path.read_bytes() == data0
    default = Agent(model, workspace=workspace)  # identity = the workspace's real path
    assert default.environment == os.path.realpath(workspace)
    assert default.resume(sid).blocked_reason == "environment_changed"
    default.close()  # it holds the session; an agent in use is never robbed of it

    same = Agent(model, workspace=workspace, environment="machine-a").resume(sid)
    assert same.status is RunStatus.COMPLETED
    assert counter_lines(workspace) == 1
    assert tool_results(path.read_bytes())["call_read"][0]["result"] == {"type": "success"}


def test_changed_script_blocks_retry_of_open_attempt(tmp_path: Path) -> None:
    workspace, script = make_workspace(tmp_path)
    crashed = spawn(["run", str(workspace), str(script)], crash_env("response_received@1"))
    assert crashed.returncode == -9
    path = session_file(workspace)
    before = path.read_bytes()
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps({**SCRIPT, "comment": "edited"}))
    sid = session_id(path)
    blocked = Agent(load_model(f"scripted:{edited}"), workspace=workspace).resume(sid)
    assert blocked.status is RunStatus.BLOCKED
    assert blocked.blocked_reason == "configuration_changed"
    assert "routing" in (blocked.message or "")
    assert path.read_bytes() == before
    done = Agent(load_model(f"scripted:{script}"), workspace=workspace).resume(sid)
    assert done.status is RunStatus.COMPLETED
    assert records(path.read_bytes(), "stepAttempt")[1]["attempt"] == 2


def test_exit_mode_crash(tmp_path: Path) -> None:
    workspace, script = make_workspace(tmp_path)
    child = spawn(
        ["run", str(workspace), str(script)],
        {"TETHER_CRASH_AT": "after_result@2", "TETHER_CRASH_MODE": "exit"},
    )
    assert child.returncode == CRASH_EXIT_CODE
    assert "INJECTED_CRASH boundary=after_result" in child.stderr
    path = session_file(workspace)
    assert len(transactions(path.read_bytes())) == 7
    done = Agent(load_model(f"scripted:{script}"), workspace=workspace).resume(session_id(path))
    assert done.status is RunStatus.COMPLETED
    assert counter_lines(workspace) == 1


def test_new_run_first_finishes_the_crashed_one(tmp_path: Path) -> None:
    """``Agent.run(prompt, session=…)`` on a crashed session recovers before accepting."""
    script_data = {
        **SCRIPT,
        "responses": [*SCRIPT["responses"], {"content": "Second answer."}],
    }
    workspace, script = make_workspace(tmp_path, script_data)
    crashed = spawn(["run", str(workspace), str(script)], crash_env("before_effect@2"))
    assert crashed.returncode == -9
    path = session_file(workspace)
    agent = Agent(load_model(f"scripted:{script}"), workspace=workspace)
    result = agent.run("and now?", session=session_id(path))
    assert result.status is RunStatus.COMPLETED
    assert result.text == "Second answer."
    data = path.read_bytes()
    assert finished_outcomes(data) == ["completed", "completed"]
    assert tool_results(data)["call_bash"][0]["result"]["reason"] == "interrupted"
    assert counter_lines(workspace) == 0
    state = reduce_session(data)
    assert [m["role"] for m in state.transcript][-2:] == ["user", "assistant"]
    assert_legal_transcript(state, closed=True)


# --------------------------------------------------------------------------- compaction

COMPACTION_SCRIPT: dict[str, Any] = {
    "model": "scripted/compaction",
    "responses": [
        {"content": "First."},
        {"content": "Second."},
        {"content": "Summary: the user said one and two.", "usage": {"input": 40, "output": 9}},
        {"content": "Third."},
    ],
}
SUMMARY = "[Compacted history]\nSummary: the user said one and two."

# (boundary spec in the compacting child, durable compaction transactions it leaves)
COMPACTION_CASES = [
    ("run_accepted@1", 1),  # compactionStarted durable
    ("attempt_recorded@1", 2),
    ("response_received@1", 2),
    ("operation_finished@1", 4),
    ("store.torn_write@1", 0),
    ("store.torn_write@3", 2),
    ("store.after_sync@1", 2),  # the durable points: the attempt, then the final flush
    ("store.after_sync@2", 4),
]


def _compaction_case(root: Path, spec: str, durable: int) -> None:
    workspace, script = make_workspace(root, COMPACTION_SCRIPT)
    agent = Agent(load_model(f"scripted:{script}"), workspace=workspace)
    sid = agent.run("one").session_id
    assert agent.run("two", session=sid).text == "Second."
    agent.close()  # release the session it holds: the child is its next writer
    path = session_file(workspace)
    before = path.read_bytes()
    base = len(transactions(before))

    crashed = spawn(["compact", str(workspace), str(script), sid], crash_env(spec))
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    data0 = path.read_bytes()
    assert data0.startswith(before)
    assert len(transactions(data0)) == base + durable
    reduce_session(data0)

    resumed = spawn(["resume", str(workspace), str(script), sid])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert resumed.result["status"] == ("completed" if 1 <= durable <= 3 else "idle")
    data1 = path.read_bytes()
    assert data1.startswith(committed(data0))
    state = reduce_session(data1)
    assert isinstance(state.operation, IdleOperation)
    assert_legal_transcript(state, closed=True)
    compacted = durable >= 1
    context = state.to_json()["activeContext"]
    if compacted:
        assert context[0] == {"role": "user", "content": SUMMARY}
        assert context[1:] == [
            {"role": "user", "content": "two"},
            {"role": "assistant", "content": "Second."},
        ]
        assert finished_outcomes(data1)[-1] == "completed"
        attempts = [a for a in records(data1, "stepAttempt") if a["stepKind"] == "compaction"]
        assert [a["attempt"] for a in attempts] == ([1, 2] if durable == 2 else [1])
    else:
        assert len(context) == 4  # nothing was compacted
    assert len(state.transcript) == 4  # the transcript is never shortened

    # Idempotent, and the session goes on (the next run asks position 3).
    assert Agent(load_model(f"scripted:{script}"), workspace=workspace).resume(sid).status is (
        RunStatus.IDLE
    )
    assert path.read_bytes() == data1
    if compacted:
        third = Agent(load_model(f"scripted:{script}"), workspace=workspace).run(
            "three", session=sid
        )
        assert third.status is RunStatus.COMPLETED and third.text == "Third."


def test_crash_during_compaction(tmp_path: Path) -> None:
    def one(item: tuple[int, tuple[str, int]]) -> tuple[str, BaseException | None]:
        index, (spec, durable) = item
        try:
            _compaction_case(tmp_path / f"c{index}", spec, durable)
        except BaseException as exc:
            return spec, exc
        return spec, None

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(one, enumerate(COMPACTION_CASES)))
    failures = {spec: exc for spec, exc in results if exc is not None}
    for spec, exc in failures.items():
        print(f"--- {spec}: {type(exc).__name__}: {exc}")
    if failures:
        raise next(iter(failures.values()))


# --------------------------------------------------------------------------- in process


class _Crash(BaseException):
    """Stands in for a crash in process: nothing after the boundary runs."""


def crash_in_process(monkeypatch: pytest.MonkeyPatch, name: str, at: int = 1) -> None:
    seen: Counter[str] = Counter()
    real_hit = faults.hit

    def hit(boundary: str, before_crash: Any = None) -> None:
        real_hit(boundary, before_crash)
        seen[boundary] += 1
        if boundary == name and seen[boundary] == at:
            raise _Crash(boundary)

    monkeypatch.setattr(faults, "hit", hit)


def test_replay_declaration_change_blocks_then_restoring_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A safe user tool whose replay key changed is not replayed (spec 14.4 rule 9)."""
    from tether._tools.base import ToolContext
    from tether._tools.decorator import tool
    from tether.core.state import Replay

    runs: list[str] = []

    def make(key: str, replay: Replay = Replay.SAFE) -> Any:
        @tool(name="probe", parameters={"type": "object"}, replay=replay, replay_key=key)
        def probe(arguments: Mapping[str, Any], context: ToolContext) -> str:
            runs.append(context.operation_id)
            return "probed"

        return probe

    script = {
        "responses": [
            {"tool_calls": [{"id": "c", "name": "probe", "arguments": {}}]},
            {"content": "Probed."},
        ]
    }
    workspace, script_path = make_workspace(tmp_path, script)
    model = load_model(f"scripted:{script_path}")
    with monkeypatch.context() as patch:
        crash_in_process(patch, "after_effect")
        with pytest.raises(_Crash):
            Agent(model, [make("user:probe:v1")], workspace=workspace).run("go")
    assert len(runs) == 1
    path = session_file(workspace)
    sid = session_id(path)
    before = path.read_bytes()

    for changed in (make("user:probe:v2"), make("user:probe:v1", Replay.NEVER)):
        blocked = Agent(model, [changed], workspace=workspace).resume(sid)
        assert blocked.status is RunStatus.BLOCKED
        assert blocked.blocked_reason == "replay_declaration_changed"
        assert "probe" in (blocked.message or "")
        assert path.read_bytes() == before
    gone = Agent(model, [], workspace=workspace).resume(sid)
    assert gone.blocked_reason == "configuration_changed"

    done = Agent(model, [make("user:probe:v1")], workspace=workspace).resume(sid)
    assert done.status is RunStatus.COMPLETED and done.text == "Probed."
    assert len(runs) == 2 and runs[0] == runs[1]  # replayed with the same operation id
    data = path.read_bytes()
    assert tool_results(data)["c"][0]["result"] == {"type": "success"}
    assert_legal_transcript(reduce_session(data), closed=True)


def test_sigkill_while_a_command_runs(tmp_path: Path) -> None:
    """Killed from outside mid-command (not at a boundary): the command is not re-run.

    The command runs in its own process group, which tether's reaper kills when the agent
    dies, so its effect never happens; the resumed session records it as ``interrupted``
    and the counter stays at zero lines.
    """
    slow = json.loads(json.dumps(SCRIPT))
    slow["responses"][0]["tool_calls"][1]["arguments"]["command"] = "sleep 1; " + COUNTER_CMD
    workspace, script = make_workspace(tmp_path, slow)
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), "run", str(workspace), str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        event = json.loads(line) if line.startswith("{") else {}
        if event.get("event") == "tool_started" and event.get("name") == "bash":
            break
    time.sleep(0.2)
    proc.kill()
    proc.wait(timeout=10)
    assert proc.returncode == -9
    path = session_file(workspace)
    resumed = spawn(["resume", str(workspace), str(script), session_id(path)])
    assert resumed.result["status"] == "completed", resumed.stderr[-2000:]
    data = path.read_bytes()
    assert tool_results(data)["call_bash"][0]["result"]["reason"] == "interrupted"
    assert_legal_transcript(reduce_session(data), closed=True)
    time.sleep(1.5)  # past the moment the command would have counted
    assert counter_lines(workspace) == 0


@pytest.mark.parametrize(
    ("spec", "abort_durable"),
    # abortRequested is not a durable point (docs/runtime.md): written, it survives SIGKILL.
    [("store.torn_write@1", False), ("store.after_write@1", True)],
)
def test_crash_while_aborting(tmp_path: Path, spec: str, abort_durable: bool) -> None:
    """``resume --abort`` killed mid-way: once ``abortRequested`` is durable, a plain
    resume finishes the abort (nothing is executed); before that, it finishes the run."""
    workspace, script = make_workspace(tmp_path)
    assert (
        spawn(["run", str(workspace), str(script)], crash_env("before_effect@2")).returncode == -9
    )
    path = session_file(workspace)
    sid = session_id(path)
    killed = spawn(["resume", str(workspace), str(script), sid, "--abort"], crash_env(spec))
    assert killed.returncode == -9
    assert len(records(committed(path.read_bytes()), "abortRequested")) == int(abort_durable)
    agent = Agent(load_model(f"scripted:{script}"), workspace=workspace)
    result = agent.resume(sid)
    data = path.read_bytes()
    results = tool_results(data)
    assert results["call_bash"][0]["result"] == {"type": "synthetic", "reason": "interrupted"}
    assert results["call_read"][0]["result"] == {"type": "success"}
    if abort_durable:
        assert result.status is RunStatus.ABORTED
        assert finished_outcomes(data) == ["aborted"]
        assert len(records(data, "stepAttempt")) == 1
    else:
        assert result.status is RunStatus.COMPLETED
        assert finished_outcomes(data) == ["completed"]
    assert counter_lines(workspace) == 0
    assert_legal_transcript(reduce_session(data), closed=True)
    assert agent.resume(sid).status is RunStatus.IDLE
    assert path.read_bytes() == data
