"""The crash lab's child process: build a scenario's agent, run or resume it, probe effects.

Usage::

    python -m tether.testing.crashlab.child SCENARIO RUN_DIR run|discover|resume|reset|tamper
    python -m tether.testing.crashlab.child serve

``RUN_DIR`` was prepared by the parent (:func:`tether.testing.crashlab.matrix.prepare_run_dir`):
``lab.json`` (the scenario and the durability mode), ``script.json`` (the scripted model)
and ``ws/`` (the workspace). Crash injection is armed the usual way, through the
environment (``TETHER_CRASH_AT=NAME[@N]``, ``TETHER_CRASH_MODE``; see
:mod:`tether._faults`), so a failing case is reproduced by hand with e.g.::

    python -m tether.testing.crashlab.child bash-counter RUN_DIR reset
    TETHER_CRASH_AT=after_effect@1 python -m tether.testing.crashlab.child bash-counter RUN_DIR run
    python -m tether.testing.crashlab.child bash-counter RUN_DIR resume

``run``
    runs the scenario's ``setup`` steps with crash injection *disarmed*, then arms it and
    runs its ``steps`` (so ``NAME@N`` counts hits from the first armed step on);
``discover``
    the same without a crash, logging every boundary hit of the armed steps to
    ``RUN_DIR/hits.log`` — the crash matrix is every ``(boundary, N)`` seen there;
``reset``
    rebuilds the run folder from its ``lab.json`` (fresh workspace, no session);
``tamper``
    overwrites the workspace files the scenario's ``tamper`` names (someone else changed
    them while the agent was down; the lab does this between the crash and the resume);
``resume``
    probes the effects, resumes the session's unfinished operation
    (:meth:`~tether._runtime.Agent.resume`), probes again;
``serve``
    a fork server: imports everything once, then for every job read from stdin (one JSON
    line: ``argv``, ``env``, ``stdout``, ``stderr``, ``timeout``) forks a process that runs
    ``main(argv)`` and answers with one JSON line (``returncode``, ``elapsed``). A forked
    job is a real process — it is killed by a real ``SIGKILL`` — it only skips the
    interpreter start-up and imports (most of a job's cost).

Every mode prints one JSON line on stdout. Besides the session log the child keeps three
side channels in ``RUN_DIR``, each appended with one ``write(2)`` per line so they survive a
``SIGKILL`` (the page cache does):

* ``acks.jsonl`` — every commit the store *acknowledged* (``commit`` returned): its seqs
  and fact ids; the parent checks each is still in the log after recovery;
* ``effects.log`` — ``apply PATH`` for every ``os.replace`` of a new file content by
  ``apply_change`` (write/edit), ``call OPERATION_ID`` for every call of a user's effect tool;
* ``hits.log`` — boundary hits (``discover`` only).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tether import _faults as faults
from tether import errors
from tether.testing.crashlab.scenarios import (
    BASH_RUNS,
    MCP_EFFECTS,
    EffectSpec,
    Scenario,
    Step,
    ToolSpec,
    load_user_tool,
)

__all__ = ["LogFacts", "main", "prepare_run_dir", "probe", "session_log_path"]

LAB_FILE = "lab.json"
SCRIPT_FILE = "script.json"
WORKSPACE = "ws"
ACKS_FILE = "acks.jsonl"
EFFECTS_FILE = "effects.log"
HITS_FILE = "hits.log"

EXIT_USAGE = errors.EXIT_USAGE
EXIT_TETHER_ERROR = 3
"""``run`` stopped with a typed :class:`~tether.errors.TetherError` (the I/O-error lab
injects failing system calls; a clear, typed error is an acceptable outcome of one).

Private to the lab and its child, never the status of a ``tether`` command: so not a row of
``tether.errors.EXIT_STATUSES`` (where 3 is "no such session")."""
EXIT_INTERNAL = errors.EXIT_INTERNAL

IO_PLANT_ENV = "TETHER_LAB_IO_PLANT"
"""``ignore_write_errors``: a planted bug for the I/O-error lab to catch — the file store
swallows a failing ``write(2)`` of a commit and acknowledges the commit anyway."""


# =========================================================================== side channels


class _Appender:
    """Append whole lines with one ``write(2)`` each (atomic enough, survives SIGKILL)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        data = (text + "\n").encode("utf-8", "surrogatepass")
        with self._lock:
            if self._fd is None:
                self._fd = os.open(
                    self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644
                )
            os.write(self._fd, data)


def _plant_ignore_write_errors() -> None:
    """The planted bug: every file store's write seam reports a failed write as done."""
    from tether._stores.file import SessionStore

    original = SessionStore.__init__

    def __init__(store: SessionStore, **kwargs: Any) -> None:
        original(store, **kwargs)
        write = store._write

        def swallowing_write(fd: int, data: bytes | memoryview) -> int:
            try:
                return write(fd, data)
            except OSError:
                return len(data)  # the bug: the error is dropped, the commit acknowledged

        store._write = swallowing_write

    setattr(SessionStore, "__init__", __init__)  # noqa: B010


class _Instruments:
    """Monkeypatches installed in this (child) process only."""

    def __init__(self, run_dir: Path) -> None:
        self.acks = _Appender(run_dir / ACKS_FILE)
        self.effects = _Appender(run_dir / EFFECTS_FILE)
        self.hits = _Appender(run_dir / HITS_FILE)
        self.count_hits = False
        self._applying: list[str] = []

    def install(self) -> None:
        self._wrap_hit()
        self._wrap_commit()
        self._wrap_apply_change()
        if os.environ.get(IO_PLANT_ENV) == "ignore_write_errors":
            _plant_ignore_write_errors()

    def _wrap_hit(self) -> None:
        original = faults.hit
        instruments = self

        def hit(name: str, before_crash: Callable[[], object] | None = None) -> None:
            if name == "tools.apply.after_replace" and instruments._applying:
                # The new content has been renamed over the file: that is the effect.
                instruments.effects.line(f"apply {instruments._applying[-1]}")
            if instruments.count_hits and name in faults.BOUNDARIES:
                instruments.hits.line(name)
            original(name, before_crash)

        faults.hit = hit

    def _wrap_commit(self) -> None:
        from tether._stores.file import SessionStore

        original = SessionStore.commit
        instruments = self

        def commit(
            store: SessionStore, facts: Sequence[Mapping[str, Any]], *, sync: bool = True
        ) -> list[dict[str, Any]]:
            committed = original(store, facts, sync=sync)
            # Every returned commit is written, so it survives SIGKILL (a durable point or
            # not: "sync" says which, for a power-loss model).
            instruments.acks.line(
                json.dumps(
                    {
                        "seqs": [f["seq"] for f in committed],
                        "ids": [f["id"] for f in committed],
                        "sync": sync,
                    }
                )
            )
            return committed

        setattr(SessionStore, "commit", commit)  # noqa: B010
        try:
            from tether._stores.postgres import PostgresSessionStore
        except ImportError:  # pragma: no cover - without tether[postgres]
            return
        pg_original = PostgresSessionStore.commit

        def pg_commit(
            store: PostgresSessionStore, facts: Sequence[Mapping[str, Any]], *, sync: bool = True
        ) -> list[dict[str, Any]]:
            committed = pg_original(store, facts, sync=sync)
            instruments.acks.line(
                json.dumps(
                    {"seqs": [f["seq"] for f in committed], "ids": [f["id"] for f in committed]}
                )
            )
            return committed

        setattr(PostgresSessionStore, "commit", pg_commit)  # noqa: B010

    def _wrap_apply_change(self) -> None:
        from tether._tools import builtin

        original = builtin.apply_change
        instruments = self

        def apply_change(workspace: Path, change: Any, **options: Any) -> Any:
            instruments._applying.append(str(change.path))
            try:
                return original(workspace, change, **options)  # e.g. protected=…
            finally:
                instruments._applying.pop()

        builtin.apply_change = apply_change
        try:
            from tether._effects import journal
        except ImportError:
            return
        if hasattr(journal, "apply_change"):
            setattr(journal, "apply_change", apply_change)  # noqa: B010

    def count_calls(self, tool: Any) -> None:
        """Log ``call OPERATION_ID`` for every execution of a user's tool."""
        effects = self.effects
        execute = getattr(tool, "execute", None)
        if callable(execute):

            def counted_execute(arguments: Mapping[str, Any], operation_id: str) -> Any:
                effects.line(f"call {operation_id}")
                return execute(arguments, operation_id)

            tool.execute = counted_execute
            return
        run = tool.run

        def counted_run(arguments: Mapping[str, Any], context: Any) -> Any:
            effects.line(f"call {context.operation_id}")
            return run(arguments, context)

        tool.run = counted_run


# =========================================================================== run folder


def prepare_run_dir(
    run_dir: Path, scenario: Scenario, durability: str, store: str | None = None
) -> None:
    """A fresh run folder: ``lab.json``, ``script.json``, ``ws/`` with the scenario's files.

    With ``store`` (a ``postgresql://`` URL) the run's sessions go to a schema of their own
    in that database, created empty here (``lab.json`` keeps the schema's URL)."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    workspace = run_dir / WORKSPACE
    workspace.mkdir(parents=True)
    for relative, text in scenario.files.items():
        target = workspace / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    scenario.write_script(run_dir / SCRIPT_FILE)
    lab: dict[str, Any] = {"scenario": scenario.to_json(), "durability": durability}
    if store is not None:
        lab["store"] = _fresh_schema(store, run_dir)
    (run_dir / LAB_FILE).write_text(json.dumps(lab, indent=1) + "\n")
    (run_dir / "out").mkdir()


CREATED_SCHEMAS: list[tuple[str, str]] = []
"""(store URL, schema) of every lab schema this process created (:func:`drop_lab_schemas`)."""


def drop_lab_schemas(keep: bool = False) -> None:
    """Drop the lab schemas this process created (unless ``keep``)."""
    from tether._stores.postgres import connect

    while CREATED_SCHEMAS:
        store, schema = CREATED_SCHEMAS.pop()
        if keep:
            continue
        with connect(store) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _fresh_schema(store: str, run_dir: Path) -> str:
    """An empty schema with tether's tables for ``run_dir``; its URL."""
    import hashlib
    from urllib.parse import quote

    from tether._stores.postgres import connect, init_schema

    schema = "lab_" + hashlib.sha256(str(run_dir).encode()).hexdigest()[:16]
    with connect(store) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"CREATE SCHEMA {schema}")
    if (store, schema) not in CREATED_SCHEMAS:
        CREATED_SCHEMAS.append((store, schema))
    sep = "&" if "?" in store else "?"
    url = f"{store}{sep}options={quote(f'-csearch_path={schema}')}"
    init_schema(url)
    return url


def lab_store(run_dir: Path) -> str | None:
    """The shared store's URL of a run folder (``None``: the file store)."""
    value = json.loads((run_dir / LAB_FILE).read_text()).get("store")
    return None if value is None else str(value)


def session_log(run_dir: Path) -> tuple[str, bytes] | None:
    """The (single) session of a run folder: its id and committed lines, or ``None``."""
    store = lab_store(run_dir)
    if store is None:
        log = session_log_path(run_dir / WORKSPACE)
        if log is None:
            return None
        return log.name[: -len(".jsonl")].split("_", 1)[1], log.read_bytes()
    from tether._stores.postgres import PostgresSessions

    with PostgresSessions(store) as sessions:
        rows = sessions.sessions()
        if not rows:
            return None
        return rows[0].session_id, sessions.log_bytes(rows[0].session_id)


def session_log_bytes(run_dir: Path) -> bytes:
    """The committed lines of the run folder's session (empty when there is none)."""
    log = session_log(run_dir)
    return log[1] if log is not None else b""


def expire_leases(run_dir: Path) -> None:
    """The crashed writer is dead: let its lease expire now rather than after its length."""
    store = lab_store(run_dir)
    if store is None:
        return
    from tether._stores.postgres import connect

    with connect(store) as conn:
        conn.execute(
            "UPDATE tether_sessions SET lease_expires = now() WHERE lease_owner IS NOT NULL"
        )


def apply_tamper(run_dir: Path, scenario: Scenario) -> None:
    """Someone else changes workspace files while the agent is down (``scenario.tamper``)."""
    for relative, text in scenario.tamper.items():
        target = run_dir / WORKSPACE / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def load_lab(run_dir: Path) -> tuple[Scenario, str]:
    data = json.loads((run_dir / LAB_FILE).read_text())
    return Scenario.from_json(data["scenario"]), str(data.get("durability", "durable"))


def session_log_path(workspace: Path) -> Path | None:
    """The (single) session log of a lab workspace, or ``None``."""
    directory = workspace / ".tether" / "sessions"
    try:
        logs = sorted(p for p in directory.iterdir() if p.name.endswith(".jsonl"))
    except OSError:
        return None
    return logs[0] if logs else None


def _build_tools(
    scenario: Scenario, workspace: Path, instruments: _Instruments | None
) -> list[Any]:
    from tether._tools.builtin import builtin_tools

    tools: list[Any] = builtin_tools()
    for spec in scenario.extra_tools:
        tools.append(_extra_tool(spec, workspace, scenario, instruments))
    return tools


def _extra_tool(
    spec: ToolSpec, workspace: Path, scenario: Scenario, instruments: _Instruments | None
) -> Any:
    if spec.ref == "publish_report":
        from tether.testing.ledger import PublishReportTool

        return PublishReportTool.for_workspace(workspace)
    tool = load_user_tool(spec.ref, workspace, spec.sys_path)
    if instruments is not None and scenario.user_tool:
        instruments.count_calls(tool)
    return tool


def _agent(
    scenario: Scenario,
    run_dir: Path,
    durability: str,
    instruments: _Instruments,
    reconciled: list[dict[str, Any]] | None = None,
) -> Any:
    from tether._runtime import Agent
    from tether.testing.scripted import ScriptedModel

    workspace = run_dir / WORKSPACE
    tools = _build_tools(scenario, workspace, instruments)
    model = ScriptedModel.from_file(run_dir / SCRIPT_FILE)

    def on_event(event: Any) -> None:
        if reconciled is not None and getattr(event, "kind", None) == "tool_reconciled":
            reconciled.append(
                {
                    "tool": getattr(event, "name", ""),
                    "callId": getattr(event, "call_id", ""),
                    "verdict": getattr(event, "verdict", ""),
                    "action": getattr(event, "action", ""),
                    "recoveredFromLedger": bool(getattr(event, "recovered_from_ledger", False)),
                    "reviewItem": getattr(event, "review_item", None),
                }
            )

    return Agent(
        model,
        tools,
        workspace=workspace,
        durability=durability,
        read_agents_md=False,
        on_event=on_event,
        store_url=lab_store(run_dir),
    )


class _AbortDriver:
    """Abort the agent once the ``bash`` call ``tag`` has started in this process."""

    def __init__(self, agent: Any, workspace: Path, tag: str) -> None:
        self.agent = agent
        self.path = workspace / BASH_RUNS
        self.tag = tag
        self.baseline = self._count()
        self.fired = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="crashlab-abort", daemon=True)

    def _count(self) -> int:
        try:
            text = self.path.read_text()
        except OSError:
            return 0
        return sum(1 for line in text.splitlines() if line == self.tag)

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            if self._count() > self.baseline:
                self.fired = True
                self.agent.abort()
                return

    def __enter__(self) -> _AbortDriver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(1.0)


def _close(agent: Any) -> None:
    close = getattr(agent, "close", None)
    if callable(close):
        close()


def _do(agent: Any, step: Step, session: str | None) -> Any:
    if step.action == "compact":
        if session is None:
            raise RuntimeError("compact needs a session from an earlier step")
        return agent.compact(session)
    return agent.run(step.prompt or "Do the task.", session=session)


def _result_json(result: Any) -> dict[str, Any]:
    return {
        "status": result.status.value,
        "session": result.session_id,
        "blockedReason": result.blocked_reason,
        "message": result.message,
    }


PLANT_ENV = "TETHER_LAB_PLANT"


def _plant(name: str) -> None:
    """A planted durability bug for the power-loss lab (it must be caught; see powerlab)."""
    from tether._stores import file

    if name == "skip_dir_sync":
        setattr(file, "_fsync_dir", lambda fd: None)  # noqa: B010
    elif name == "skip_sync_before_effect":
        original = file.SessionStore.__init__

        def init(store: Any, *args: Any, **kwargs: Any) -> None:
            original(store, *args, **kwargs)
            store._sync = lambda fd: None

        setattr(file.SessionStore, "__init__", init)  # noqa: B010
    else:
        raise RuntimeError(f"unknown {PLANT_ENV}={name!r}")


def _run(scenario: Scenario, run_dir: Path, durability: str, *, discover: bool) -> dict[str, Any]:
    plant = os.environ.get(PLANT_ENV)
    if plant:
        _plant(plant)
    crash_at = os.environ.get("TETHER_CRASH_AT")
    crash_mode = os.environ.get("TETHER_CRASH_MODE")
    if discover and crash_at:
        raise RuntimeError("discover runs without TETHER_CRASH_AT")
    faults.configure(None)
    instruments = _Instruments(run_dir)
    instruments.install()
    agent = _agent(scenario, run_dir, durability, instruments)
    workspace = run_dir / WORKSPACE
    session: str | None = None
    results: list[dict[str, Any]] = []
    for step in scenario.setup:
        result = _do(agent, step, session)
        session = result.session_id
        results.append(_result_json(result))
    faults.configure(crash_at, crash_mode)
    if discover:
        faults.ARMED = True  # the store passes its boundaries only when something is armed
        instruments.count_hits = True
    for step in scenario.steps:
        if scenario.abort_on is not None:
            with _AbortDriver(agent, workspace, scenario.abort_on):
                result = _do(agent, step, session)
        else:
            result = _do(agent, step, session)
        session = result.session_id
        results.append(_result_json(result))
    instruments.count_hits = False
    _close(agent)
    return {"mode": "discover" if discover else "run", "steps": results}


def _resume(scenario: Scenario, run_dir: Path, durability: str) -> dict[str, Any]:
    instruments = _Instruments(run_dir)
    instruments.install()
    workspace = run_dir / WORKSPACE
    reconciled: list[dict[str, Any]] = []
    agent = _agent(scenario, run_dir, durability, instruments, reconciled)
    before = probe(scenario, run_dir, agent.registry)
    log = session_log(run_dir)
    out: dict[str, Any] = {"mode": "resume", "probeBefore": before, "reconciled": reconciled}
    if log is None:
        out.update(result=None, elapsedMs=0.0)
    else:
        session = log[0]
        expire_leases(run_dir)
        started = time.perf_counter()
        if scenario.abort_on is not None:
            with _AbortDriver(agent, workspace, scenario.abort_on):
                result = agent.resume(session)
        else:
            result = agent.resume(session)
        out["elapsedMs"] = (time.perf_counter() - started) * 1000.0
        out["result"] = _result_json(result)
    _close(agent)
    out["probeAfter"] = probe(scenario, run_dir, agent.registry)
    return out


# =========================================================================== the probe


class LogFacts:
    """What the lab needs from a session log's committed lines (parsed, not reduced)."""

    def __init__(self, data: bytes) -> None:
        import orjson

        self.complete = data[: data.rfind(b"\n") + 1]
        self.torn = len(data) - len(self.complete)
        self.facts: list[dict[str, Any]] = []
        self.lines = 0
        self.error: str | None = None
        for number, raw in enumerate(self.complete.splitlines(), 1):
            if not raw.strip():
                continue
            try:
                value = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                self.error = f"line {number} is not JSON: {exc}"
                break
            self.lines += 1
            if isinstance(value, list):
                self.facts.extend(v for v in value if isinstance(v, dict))
            elif isinstance(value, dict) and value.get("kind") != "header":
                self.facts.append(value)
        self.started: dict[str, list[str]] = {}
        self.started_tool: dict[str, str] = {}
        self.results: dict[str, list[str]] = {}
        self.calls: list[str] = []
        self.abort_requested = False
        for fact in self.facts:
            kind = fact.get("kind")
            if kind == "record":
                record = fact.get("record") or {}
                if record.get("type") == "toolStarted":
                    call = str(record.get("toolCallId"))
                    self.started.setdefault(call, []).append(str(fact.get("id")))
                    self.started_tool[str(fact.get("id"))] = str(record.get("toolName"))
                elif record.get("type") == "abortRequested":
                    self.abort_requested = True
            elif kind == "entry":
                entry = fact.get("entry") or {}
                if entry.get("type") != "message":
                    continue
                message = entry.get("message") or {}
                role = message.get("role")
                if role == "assistant":
                    for call in message.get("tool_calls") or ():
                        self.calls.append(str(call.get("id")))
                elif role == "tool":
                    result = entry.get("result") or {}
                    outcome = str(result.get("type"))
                    if outcome == "synthetic":
                        outcome = f"synthetic:{result.get('reason')}"
                    self.results.setdefault(str(message.get("tool_call_id")), []).append(outcome)

    @property
    def last_seq(self) -> int:
        seqs = [f["seq"] for f in self.facts if isinstance(f.get("seq"), int)]
        return max(seqs, default=0)

    def ids_by_seq(self) -> dict[int, str]:
        return {f["seq"]: str(f.get("id")) for f in self.facts if isinstance(f.get("seq"), int)}

    def outcome(self, call_id: str) -> str:
        """``success``/``error``/``synthetic:REASON`` of the call's (first) result;
        ``pending`` when the call is in the log without a result; ``absent`` otherwise."""
        results = self.results.get(call_id)
        if results:
            return results[0]
        return "pending" if call_id in self.calls else "absent"


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _ledger_rows(workspace: Path) -> list[str] | None:
    """Operation ids of the report ledger's rows (``None`` when it cannot be read)."""
    path = workspace / ".tether" / "ledger.db"
    if not path.exists():
        return []
    from tether.testing.ledger import ReportLedger

    ledger = ReportLedger(path)
    try:
        return [p.operation_id for p in ledger.publications()]
    except Exception:
        return None
    finally:
        ledger.close()


def _reviews(workspace: Path, store: str | None = None) -> list[dict[str, Any]]:
    """Every review item of the workspace (none when there is no effects database); for a
    run against a shared store, of that store's database, where reviews are kept."""
    from tether._effects.review import ReviewStore

    if store is not None:
        from tether._wsdb.postgres import PostgresEffectsDB

        shared = PostgresEffectsDB.open_url(store)
        try:
            items = ReviewStore(shared).list_all()
        finally:
            shared.close()
    else:
        path = workspace / ".tether" / "effects.db"
        if not path.exists():
            return []
        from tether._wsdb.sqlite import EffectsDB

        with EffectsDB.open_workspace(workspace) as db:
            items = ReviewStore(db).list_all()
    return [
        {
            "id": item.id,
            "operationId": item.operation_id,
            "tool": item.tool_name,
            "reason": item.reason,
            "status": item.status.value,
            "decision": None if item.decision is None else item.decision.value,
        }
        for item in items
    ]


def _effect(
    spec: EffectSpec,
    facts: LogFacts,
    workspace: Path,
    effects_log: list[str],
    ledger: list[str] | None,
    registry: Any,
) -> dict[str, Any]:
    ops = facts.started.get(spec.call_id, [])
    out: dict[str, Any] = {
        "callId": spec.call_id,
        "tool": spec.tool,
        "kind": spec.kind,
        "operationIds": ops,
        "outcome": facts.outcome(spec.call_id),
    }
    if spec.kind == "replayed":
        out["count"] = None
        return out
    if spec.kind in ("bash", "denied"):
        lines = _read_lines(workspace / BASH_RUNS)
        out["count"] = sum(1 for line in lines if line == spec.call_id)
    elif spec.kind == "file":
        assert spec.path is not None
        out["count"] = sum(1 for line in effects_log if line == f"apply {spec.path}")
        out["content"] = _read_text(workspace / spec.path)
    elif spec.kind == "ledger":
        if ledger is None:
            out["count"] = None
            out["error"] = "the report ledger cannot be read"
        else:
            out["count"] = sum(1 for op in ledger if op in ops)
            out["perOperation"] = {op: ledger.count(op) for op in ops}
    elif spec.kind == "mcp":
        recorded = _read_lines(workspace / MCP_EFFECTS)
        out["perOperation"] = {op: recorded.count(op) for op in ops}
        out["count"] = sum(out["perOperation"].values())
    else:  # calls
        tool = registry.get(spec.tool) if registry is not None else None
        counter = getattr(tool, "effect_count", None)
        counted = Counter(line.split(" ", 1)[1] for line in effects_log if line.startswith("call "))
        if callable(counter):
            per_op = {op: int(counter(op)) for op in ops}
            out["source"] = "effect_count"
        else:
            per_op = {op: counted.get(op, 0) for op in ops}
            out["source"] = "execute calls"
        out["perOperation"] = per_op
        out["count"] = sum(per_op.values())
    return out


def probe(scenario: Scenario, run_dir: Path, registry: Any = None) -> dict[str, Any]:
    """Effect counts, outcomes, ledger and review items of a run folder, as JSON."""
    workspace = run_dir / WORKSPACE
    log = session_log(run_dir)
    facts = LogFacts(log[1] if log is not None else b"")
    effects_log = _read_lines(run_dir / EFFECTS_FILE)
    needs_ledger = any(spec.kind == "ledger" for spec in scenario.effects)
    ledger = _ledger_rows(workspace) if needs_ledger else []
    effects = [
        _effect(spec, facts, workspace, effects_log, ledger, registry) for spec in scenario.effects
    ]
    known_ops = {op for ops in facts.started.values() for op in ops}
    orphans: list[str] = []
    if ledger:
        orphans.extend(
            f"ledger row for unknown operation {op}" for op in ledger if op not in known_ops
        )
    for line in effects_log:
        if line.startswith("call ") and line[5:] not in known_ops:
            orphans.append(f"execute call for unknown operation {line[5:]}")
    reviews = _reviews(workspace, lab_store(run_dir))
    return {"effects": effects, "orphans": orphans, "reviews": reviews}


# =========================================================================== fork server


def _serve() -> int:
    """Answer jobs from stdin, one forked process each (see the module docstring)."""
    import select
    import signal

    import tether._runtime
    import tether._stores.file
    import tether._tools.builtin
    from tether.testing.scripted import ScriptedModel  # noqa: F401

    try:
        import tether.testing.ledger  # noqa: F401
    except Exception:
        pass
    import orjson  # noqa: F401

    stdout = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        stdout.flush()
        sys.stderr.flush()
        started = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # the job
            code = EXIT_INTERNAL
            try:
                _enter_job(job)
                if job.get("strace"):
                    _traced_job(job)  # does not return
                code = main(list(job["argv"]))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                traceback.print_exc()
                code = EXIT_INTERNAL
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        timeout = float(job.get("timeout", 120.0))
        timed_out = False
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = -1
        if pidfd >= 0:
            try:
                ready, _, _ = select.select([pidfd], [], [], timeout)
            finally:
                os.close(pidfd)
            if not ready:
                timed_out = True
                if job.get("strace"):
                    os.killpg(pid, signal.SIGKILL)  # strace and the job it traces
                else:
                    os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        else:  # pragma: no cover - kernels without pidfd
            deadline = time.monotonic() + timeout
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    os.kill(pid, signal.SIGKILL)
                    _, status = os.waitpid(pid, 0)
                    break
                time.sleep(0.002)
        answer = {
            "returncode": os.waitstatus_to_exitcode(status),
            "elapsed": time.perf_counter() - started,
            "timedOut": timed_out,
        }
        stdout.write(json.dumps(answer) + "\n")
        stdout.flush()
    return 0


def _traced_job(job: Mapping[str, Any]) -> None:
    """Run the job under strace (the I/O-error lab): fork the job itself, become strace.

    The forked job waits until strace has attached (``TracerPid`` in ``/proc/self/status``,
    polled with ``pread`` on a descriptor opened before: no traced call), so strace counts
    its calls from the first line of ``main``; this process execs ``strace … -p JOB``
    (an ancestor may trace its descendant under Yama's default policy). strace's log ends
    in ``+++ exited with N +++``: the job's exit status.
    """
    os.setsid()  # the fork server's timeout kills the group: strace and the job
    job_pid = os.fork()
    if job_pid == 0:
        code = EXIT_INTERNAL
        try:
            status = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
            deadline = time.monotonic() + 30.0
            while not _traced(os.pread(status, 4096, 0)):
                if time.monotonic() > deadline:
                    sys.stderr.write("strace did not attach to the job within 30 s\n")
                    os._exit(EXIT_INTERNAL)
                time.sleep(0.001)
            os.close(status)
            code = main(list(job["argv"]))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    argv = [str(a) for a in job["strace"]] + ["-p", str(job_pid)]
    os.execvp(argv[0], argv)


def _traced(status: bytes) -> bool:
    for line in status.splitlines():
        if line.startswith(b"TracerPid:"):
            return line.split()[1:2] != [b"0"]
    return False


def _enter_job(job: Mapping[str, Any]) -> None:
    """In the forked job: redirect output, set the environment and re-arm the faults."""
    for fd, key in ((1, "stdout"), (2, "stderr")):
        target = os.open(job[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    os.close(stdin)
    for key in [k for k in os.environ if k.startswith("TETHER_CRASH")]:
        del os.environ[key]
    os.environ.update({str(k): str(v) for k, v in dict(job.get("env", {})).items()})
    if job.get("cwd"):
        os.chdir(job["cwd"])
    faults.configure(os.environ.get("TETHER_CRASH_AT"), os.environ.get("TETHER_CRASH_MODE"))


# =========================================================================== entry point


def main(argv: list[str]) -> int:
    if argv == ["serve"]:
        return _serve()
    if len(argv) != 3 or argv[2] not in ("run", "discover", "resume", "reset", "tamper"):
        sys.stderr.write((__doc__ or "").split("\n\n")[1] + "\n")
        return EXIT_USAGE
    name, folder, mode = argv
    run_dir = Path(folder).resolve()
    scenario, durability = load_lab(run_dir)
    if scenario.name != name:
        sys.stderr.write(f"{run_dir} holds scenario {scenario.name!r}, not {name!r}\n")
        return EXIT_USAGE
    out: dict[str, Any]
    if mode == "reset":
        prepare_run_dir(run_dir, scenario, durability, lab_store(run_dir))
        out = {"mode": "reset", "runDir": str(run_dir)}
    elif mode == "tamper":
        apply_tamper(run_dir, scenario)
        out = {"mode": "tamper", "files": sorted(scenario.tamper)}
    elif mode == "resume":
        out = _resume(scenario, run_dir, durability)
    elif mode == "run":
        from tether.errors import TetherError

        try:
            out = _run(scenario, run_dir, durability, discover=False)
        except TetherError as exc:
            # A typed error (e.g. a failed write of the session log): one line on stdout,
            # its own exit status, so the I/O-error lab can tell it from a traceback.
            message = " ".join(str(exc).split())
            error = {"type": type(exc).__name__, "message": message}
            sys.stdout.write(json.dumps({"mode": "run", "error": error}) + "\n")
            sys.stdout.flush()
            return EXIT_TETHER_ERROR
    else:
        out = _run(scenario, run_dir, durability, discover=True)
    sys.stdout.write(json.dumps(out, default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
