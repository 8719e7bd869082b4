"""A real PostgreSQL server for the tests: ``TETHER_TEST_PG_URL`` names it (``.ci/run`` starts
one and exports it). Each test gets a fresh schema of its own (a ``search_path`` in the URL),
dropped afterwards, so tests never see each other's sessions.

Without a reachable server the tests skip with a one-line reason, except under ``CI=true``,
where that is a failure (CI must run them).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

URL_ENV = "TETHER_TEST_PG_URL"


def server_url() -> str:
    """The server's URL; skip (or, under ``CI=true``, fail) when there is none."""
    url = os.environ.get(URL_ENV)
    problem = None
    if not url:
        problem = f"no PostgreSQL server: set {URL_ENV} (.ci/run does)"
    else:
        try:
            import psycopg

            with psycopg.connect(url, connect_timeout=3):
                pass
        except Exception as exc:
            problem = f"PostgreSQL at {URL_ENV} is unreachable: {str(exc).splitlines()[0]}"
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the PostgreSQL tests: {problem}")
        pytest.skip(problem)
    assert url is not None
    return url


def with_schema(url: str, schema: str) -> str:
    """``url`` whose connections use ``schema`` (``options=-csearch_path=…``)."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}')}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A URL of a fresh, empty schema (no tether tables yet) on the test server."""
    import psycopg

    base = server_url()
    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield with_schema(base, schema)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def pg_store(pg_url: str) -> str:
    """:func:`pg_url` with tether's schema created."""
    from tether._stores.postgres import init_schema

    init_schema(pg_url)
    return pg_url


class WorkerProcesses:
    """Real ``tether worker`` processes of a test, each with its stderr in a log file, over
    the store at ``url``."""

    url: str

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def spawn(self, argv: list[str], log: Path, **popen: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log.open("wb"), **popen)
        self.procs.append(proc)
        self.logs.append(log)
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return self.logs[self.procs.index(proc)].read_text()

    def wait_all(self, timeout: float = 90) -> list[int]:
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=timeout))
            except subprocess.TimeoutExpired:
                proc.kill()
                pytest.fail(f"a worker did not finish: {self.log(proc)[-3000:]}")
        return codes

    def held_by(self, proc: subprocess.Popen[bytes]) -> list[str]:
        """The unfinished sessions whose live lease the worker process ``proc`` holds (a
        lease owner is ``host:pid:suffix``)."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT session_id FROM tether_sessions WHERE pending AND lease_owner LIKE %s "
                "AND lease_expires > now()",
                (f"%:{proc.pid}:%",),
            ).fetchall()
        return [str(r[0]) for r in rows]


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds, else fail the test naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


CLUSTER_ENV = "TETHER_TEST_PG_CLUSTER"
"""The cluster a test may restart (``VERSION NAME`` for ``pg_ctlcluster``; .ci/run sets it)."""


def restartable_cluster() -> str:
    """The cluster a restart test may restart; skipped without one, a failure in CI."""
    cluster = os.environ.get(CLUSTER_ENV)
    if not cluster:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the restart test: set {CLUSTER_ENV} (.ci/run does)")
        pytest.skip(f"may not restart the PostgreSQL cluster here: {CLUSTER_ENV} is not set")
    return cluster


def restart_cluster(cluster: str) -> None:
    """Restart the server under every connection to it (``pg_ctlcluster … restart``)."""
    subprocess.run(["pg_ctlcluster", *cluster.split(), "restart", "-m", "fast"], check=True)


@contextmanager
def cluster_stopped(cluster: str) -> Iterator[Callable[[], None]]:
    """The server stopped (``pg_ctlcluster … stop``); the block gets a function that starts
    it again, and it is started after the block whatever happened (other tests share it)."""
    command = ["pg_ctlcluster", *cluster.split()]

    def start() -> None:
        subprocess.run([*command, "start"], check=True)

    subprocess.run([*command, "stop", "-m", "fast"], check=True)
    try:
        yield start
    finally:
        subprocess.run([*command, "start"], check=False, capture_output=True)  # may be up
