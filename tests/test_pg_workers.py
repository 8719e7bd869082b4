"""The acceptance of the shared store, with real worker processes on a real server.

3 workers drive 30 sessions; each session makes two bash calls that append
``<session>:<call>`` to a counter file and two ``publish_report`` calls (the ledger). Then:

1. one worker is killed with SIGKILL mid-run: its sessions are taken over after their
   leases expire and finish;
2. one worker is stopped with SIGSTOP past its lease; another takes its session over;
   after SIGCONT its next commit (or lease check) is fenced, it starts no effect after
   the takeover and exits with the fenced error (11);
3. PostgreSQL is restarted during the runs (only where the test may restart the cluster:
   ``TETHER_TEST_PG_CLUSTER``, set by ``.ci/run``): workers reconnect or exit cleanly, and
   nothing acknowledged is lost;
4. one worker gets SIGTERM while its sessions' steps are slow (bash calls that sleep): it
   finishes the step in progress, leaves the sessions unfinished, releases their leases at
   once (long leases: free means released, not expired) and exits 0; another worker
   finishes them.

In every case: no call id twice in the counter file, at most one ledger row per operation
id, every session exports to a file that reduces and is idle, and a second drive appends
nothing. Leases are 2 s, so the whole file takes well under a minute.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from pgkit import WorkerProcesses, pg_store, pg_url, restart_cluster, restartable_cluster, wait_for  # noqa: F401 (fixtures)
from tether._models import load_model
from tether._runtime import Agent
from tether._runtime.worker import submit
from tether._stores.postgres import PostgresSessions
from tether._tools.builtin import builtin_tools
from tether._wsdb.sqlite import EffectsDB
from tether.core.reducer import Reducer
from tether.core.state import RunOperation, ToolStatus
from tether.testing.ledger import PublishReportTool, ReportLedger

CHILD = Path(__file__).with_name("pg_worker_child.py")
SESSIONS = 30
LEASE = 2.0
EXIT_FENCED = 11


def _bash(call: str, pause: float) -> str:
    return f'echo "$TETHER_SESSION_ID:{call}" >> counter.txt; sleep {pause}'


def _script(pause: float = 0.15) -> dict[str, object]:
    return {
        "model": "scripted/pg-workers",
        "responses": [
            {
                "content": "First.",
                "tool_calls": [
                    {"id": "b1", "name": "bash", "arguments": {"command": _bash("b1", pause)}},
                    {
                        "id": "p1",
                        "name": "publish_report",
                        "arguments": {"title": "one", "body": "first"},
                    },
                ],
            },
            {
                "content": "Second.",
                "tool_calls": [
                    {"id": "b2", "name": "bash", "arguments": {"command": _bash("b2", pause)}},
                    {
                        "id": "p2",
                        "name": "publish_report",
                        "arguments": {"title": "two", "body": "second"},
                    },
                ],
            },
            {"content": "All done.", "finish_reason": "stop"},
        ],
    }


class Farm(WorkerProcesses):
    """A workspace, a script, 30 submitted sessions and the worker processes."""

    def __init__(self, root: Path, url: str, pause: float = 0.15, sessions: int = SESSIONS) -> None:
        self.url = url
        self.workspace = root / "ws"
        (self.workspace / ".tether").mkdir(parents=True)
        self.counter = self.workspace / "counter.txt"
        self.script = root / "script.json"
        self.script.write_text(json.dumps(_script(pause)))
        super().__init__()
        agent = self.agent()
        try:
            self.ids = [submit(agent, f"task {n}") for n in range(sessions)]
        finally:
            agent.close()

    def agent(self) -> Agent:
        return Agent(
            load_model(f"scripted:{self.script}"),
            [*builtin_tools(), PublishReportTool.for_workspace(self.workspace)],
            workspace=self.workspace,
            environment="pgtest",
            read_agents_md=False,
            store_url=self.url,
        )

    def start(self, concurrency: int = 2, lease: float = LEASE) -> subprocess.Popen[bytes]:
        log = self.workspace.parent / f"worker{len(self.procs)}.log"
        env = {**os.environ, "TETHER_LEASE_SECONDS": str(lease)}
        return self.spawn(
            [
                sys.executable,
                str(CHILD),
                self.url,
                str(self.workspace),
                str(self.script),
                str(concurrency),
            ],
            log,
            env=env,
        )

    def leases(self) -> dict[str, tuple[str | None, int, bool]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT session_id, lease_owner, lease_epoch, "
                "lease_owner IS NOT NULL AND lease_expires > now() "
                "FROM tether_sessions"
            ).fetchall()
        return {str(r[0]): (r[1], int(r[2]), bool(r[3])) for r in rows}

    def check(self) -> None:
        """The invariants of every scenario."""
        lines = self.counter.read_text().split() if self.counter.exists() else []
        twice = [line for line, n in Counter(lines).items() if n > 1]
        assert twice == [], f"bash calls ran twice: {twice}"
        ledger = ReportLedger.for_workspace(self.workspace)
        try:
            assert ledger.duplicate_effects() == 0
            assert ledger.count_all() <= 2 * len(self.ids)
            receipts = {p.receipt for p in ledger.publications()}
        finally:
            ledger.close()
        with psycopg.connect(self.url, autocommit=True) as conn:
            # The workspace database's tables are in the store's database (created when an
            # agent first needs them): sessions with evidence are bound to its identity there.
            if conn.execute("SELECT to_regclass('meta')").fetchone() != (None,):
                identity = conn.execute("SELECT value FROM meta WHERE key = 'db_id'").fetchone()
                assert identity is not None
        if (self.workspace / ".tether" / "effects.db").exists():
            local = EffectsDB.open_workspace(self.workspace)
            try:  # the workspace's own effects.db keeps only the file-change journal
                row = local.query_one("SELECT count(*) FROM sessions")
                assert row is not None and row[0] == 0
            finally:
                local.close()
        with PostgresSessions(self.url) as sessions:
            before = {}
            for session in self.ids:
                data = sessions.log_bytes(session)
                state = Reducer.load(data).state  # exports to a file that reduces
                assert state.operation.kind == "idle", session
                assert state.transcript[-1]["content"] == "All done.", session
                published = [
                    m["content"]
                    for m in state.transcript
                    if m["role"] == "tool" and "rcpt-" in str(m.get("content"))
                ]
                for text in published:
                    assert any(r in text for r in receipts)
                before[session] = data
            # A lease whose release was lost with its connection (a restart) expires.
            wait_for(
                lambda: not any(live for _, _, live in self.leases().values()),
                3 * LEASE,
                "the leases to be released or to expire",
            )
            agent = self.agent()  # a second drive appends nothing
            try:
                for session in self.ids:
                    assert agent.resume(session).status.value == "idle"
            finally:
                agent.close()
            for session in self.ids:
                assert sessions.log_bytes(session) == before[session]


def test_a_killed_worker_s_sessions_are_taken_over(pg_store: str, tmp_path: Path) -> None:  # noqa: F811
    farm = Farm(tmp_path, pg_store)
    victim = farm.start()
    wait_for(lambda: farm.held_by(victim), 20, "the first worker to lease a session")
    others = [farm.start(), farm.start()]
    time.sleep(0.3)
    victim.send_signal(signal.SIGKILL)
    codes = farm.wait_all()
    assert codes[0] == -signal.SIGKILL
    assert codes[1:] == [0, 0], [farm.log(p) for p in others]
    farm.check()


def test_a_stopped_worker_is_fenced_after_the_takeover(pg_store: str, tmp_path: Path) -> None:  # noqa: F811
    farm = Farm(tmp_path, pg_store, pause=0.3)
    zombie = farm.start(concurrency=1)
    wait_for(lambda: farm.held_by(zombie), 20, "the zombie to lease a session")
    zombie.send_signal(signal.SIGSTOP)
    try:
        (taken,) = farm.held_by(zombie) or [None]
        assert taken is not None
        epoch = farm.leases()[taken][1]
        farm.start()
        farm.start()
        wait_for(
            lambda: farm.leases()[taken][1] > epoch, 30, "the takeover of the zombie's session"
        )
        lines_at_takeover = farm.counter.read_text().split()
    finally:
        zombie.send_signal(signal.SIGCONT)
    assert zombie.wait(timeout=30) == EXIT_FENCED, farm.log(zombie)
    log = farm.log(zombie)
    assert "fenced" in log and taken in log
    codes = farm.wait_all()
    assert codes[1:] == [0, 0]
    # The zombie started no effect after the takeover: any line of its session's calls
    # written after it is the new owner's (checked: no call id twice).
    assert len(lines_at_takeover) <= len(farm.counter.read_text().split())
    farm.check()


def test_sigterm_stops_after_the_current_step_and_releases_the_leases(
    pg_store: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    # Slow steps (each bash call sleeps 1.5 s) and long leases (60 s): a lease found free
    # right after the worker exits was released by it, not expired.
    farm = Farm(tmp_path, pg_store, pause=1.5, sessions=4)
    worker = farm.start(concurrency=2, lease=60)
    wait_for(
        lambda: (
            len(farm.held_by(worker)) == 2
            and farm.counter.exists()
            and len(farm.counter.read_text().split()) >= 2
        ),
        30,
        "both of the worker's threads to be inside a bash call",
    )
    held = farm.held_by(worker)
    before = farm.leases()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, farm.log(worker)
    log = farm.log(worker)
    after = farm.leases()
    with PostgresSessions(pg_store) as sessions:
        for session in held:
            assert f"session {session}: stopped at a durable point" in log, log
            owner, epoch, _live = after[session]
            assert owner is None, f"{session}'s lease was not released: {owner}"
            assert epoch == before[session][1]  # nobody took it over: it was released
            state = Reducer.load(sessions.log_bytes(session)).state
            # Stopped mid-session (the whole drive would have finished the run), after the
            # step in progress: its result committed, no call left started without one.
            operation = state.operation
            assert isinstance(operation, RunOperation), session
            assert all(t.status is not ToolStatus.PENDING for t in operation.tool_calls)
            results = [m for m in state.transcript if m["role"] == "tool"]
            assert results and all("interrupted" not in str(m["content"]) for m in results)
    finisher = farm.start()
    assert farm.wait_all() == [0, 0], farm.log(finisher)
    finished = farm.log(finisher)
    assert all(f"session {session}: completed" in finished for session in held), finished
    farm.check()


# Serial: it stops the server under every PostgreSQL test that would run beside it.
@pytest.mark.serial
def test_workers_survive_a_postgres_restart(pg_store: str, tmp_path: Path) -> None:  # noqa: F811
    cluster = restartable_cluster()
    farm = Farm(tmp_path, pg_store)
    for _ in range(3):
        farm.start()
    wait_for(
        lambda: farm.counter.exists() and len(farm.counter.read_text().split()) >= 6,
        30,
        "the workers to make progress",
    )
    restart_cluster(cluster)
    codes = farm.wait_all(timeout=120)
    # Every worker reconnected (0) or exited cleanly with the store error (10).
    assert set(codes) <= {0, 10}, [farm.log(p) for p in farm.procs]
    if any(code != 0 for code in codes):
        finisher = farm.start()
        assert finisher.wait(timeout=90) == 0
    farm.check()
