"""Benchmark: a fleet of ``tether worker`` processes on one PostgreSQL (issue 33).

Run: ``python bench/bench_fleet.py [URL]`` (URL default ``$TETHER_BENCH_PG_URL``, else
``$TETHER_TEST_PG_URL``; it works in a schema of its own, dropped at the end). Options:
``--sessions S`` (1000), ``--delay D`` seconds per model answer (2), ``--workers C`` (1),
``--concurrency N`` per worker (default: S/C, every session in flight at once),
``--sandbox MODE`` (``off``; ``workspace-write`` runs each bash call under bubblewrap),
``--sweep`` (also the zero-delay throughput at 1 to 4 workers), ``--lease S``, ``--memory``
(instead: the worker side alone, one worker with every session in flight over an in-memory
store: its wall, RSS and threads, without the database's connection limit; then the same
with a SIGTERM once half are in flight: how long the drain takes).

Workload: S sessions submitted with ``tether submit --from`` (one JSON line each). Each
session's model (a scripted OpenAI-compatible server on loopback, answering after
``--delay`` seconds) first asks for one ``bash`` call, ``echo "$TETHER_SESSION_ID" >>
effects.txt``, then answers. A bash call, not a file read: it is an effect that can be
counted (exactly one line per session in ``effects.txt``, whatever crashed or retried), and
it starts a process, as most agent steps do. C worker processes ``tether worker
--until-empty --concurrency N`` drive them.

Printed:

* wall (the workers' start to the last one's exit) against the ideal: every session's two
  model answers back to back, ``ceil(S / (C x N)) x 2 x D``;
* the workers' CPU: with their bash calls and the kernel's share (``wait4``), and their
  own alone (``/proc``, sampled): the part that runs under their GILs;
* the ramp: when the sessions' first requests reached the model server (the first: the
  workers' start-up; half, 90%, all), where the ideal sends them all at once; and when
  their second requests did (the last one plus the model delay is the earliest the last
  session can end; the workers' exit comes after it by their last steps and their exit);
* peak DB connections: ``pg_stat_activity`` of the database polled every 50 ms, the
  bench's own excluded; peak RSS (sum over the workers) and threads (of the largest
  worker), from ``/proc``;
* sessions finished and effects per session (exactly one each);
* facts/s and commits/s (lines: one database transaction each of a writer without group
  commit) over the wall, and a bare ``INSERT`` + ``COMMIT`` loop on one connection of
  lines of the same size, in the same run, with the ratio.
* the machine's CPU over the wall (``/proc/stat``, every core), split: the workers' own,
  their bash calls, PostgreSQL (its processes in ``/proc``, with the backends the
  postmaster reaped), this script (the model server, the sampler) and anything else
  running. Spread over the machine's cores, a share of it is the shortest wall a run that
  needed only that share could reach, and so the most facts/s this machine allows it,
  against the bare loop: printed for the rest but the workers' own (workers that took no
  CPU at all), for the bash calls and PostgreSQL alone, and for PostgreSQL and bare starts
  of ``bash -c COMMAND`` alone (a second physical baseline, measured after the fleet). A
  ratio above a bound cannot be reached here by any worker that needs what it counts.

Acceptance (issue 33), printed as PASS or MISS: with the defaults, every session finished
with exactly one effect within 2x the ideal, peak connections <= 25, RSS <= 500 MB; with
``--sweep``, zero-delay facts/s >= 3x the bare loop at every worker count 1-4. The script
always exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

from tether._stores.postgres import init_schema

MODEL = "bench-fleet"
COMMAND = 'echo "$TETHER_SESSION_ID" >> effects.txt'
TARGET_SPEEDUP = 2.0
TARGET_CONNECTIONS = 25
TARGET_RSS_MB = 500
TARGET_RATIO = 3.0


# -- the scripted model server ----------------------------------------------------------------


def _completion(message: dict[str, Any], finish: str) -> bytes:
    usage = {"prompt_tokens": 200, "completion_tokens": 20, "total_tokens": 220}
    body = {
        "id": "chatcmpl-fleet",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }
    return json.dumps(body).encode()


TOOL_CALL = _completion(
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_echo",
                "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": COMMAND})},
            }
        ],
    },
    "tool_calls",
)
ANSWER = _completion({"role": "assistant", "content": "Done: the line is written."}, "stop")


def _split(text: str, pieces: int) -> list[str]:
    size = max(1, -(-len(text) // pieces))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _sse(whole: bytes, pieces: int = 1) -> list[bytes]:
    """The same answer as a chat-completions stream, event by event: its text (or its tool
    call's arguments) in ``pieces`` deltas, as a provider streams about one a token, then the
    finish, the usage and ``[DONE]``."""
    choice = json.loads(whole)["choices"][0]
    message = choice["message"]
    deltas: list[dict[str, Any]]
    if message.get("tool_calls"):
        call = message["tool_calls"][0]
        parts = _split(call["function"]["arguments"], pieces)
        first = {**call, "index": 0, "function": {**call["function"], "arguments": parts[0]}}
        deltas = [{"role": "assistant", "content": None, "tool_calls": [first]}]
        deltas += [
            {"tool_calls": [{"index": 0, "function": {"arguments": part}}]} for part in parts[1:]
        ]
    else:
        parts = _split(message["content"], pieces)
        deltas = [{"role": "assistant", "content": parts[0]}]
        deltas += [{"content": part} for part in parts[1:]]
    chunks = [
        {"id": "c", "object": "chat.completion.chunk", "model": MODEL, "choices": [c]}
        for c in (
            *({"index": 0, "delta": d, "finish_reason": None} for d in deltas),
            {"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]},
        )
    ]
    chunks.append(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": json.loads(whole)["usage"],
        }
    )
    return [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    delay = 0.0
    pieces = 1

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        request = json.loads(body)
        # After the tool's result, answer; before it, ask for the call.
        last = request["messages"][-1]["role"]
        arrived = time.perf_counter()
        if last != "tool":
            self.server.first_requests.append(arrived)  # type: ignore[attr-defined]
        else:
            self.server.second_requests.append(arrived)  # type: ignore[attr-defined]
        whole = ANSWER if last == "tool" else TOOL_CALL
        streamed = bool(request.get("stream"))
        # Streamed in pieces, the answer takes the delay as a provider does: a delta every
        # delay / pieces seconds, the first after the first of them.
        pause = self.delay / self.pieces if streamed else self.delay
        if pause:
            time.sleep(pause)
        if streamed:
            events = _sse(whole, self.pieces)
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        else:
            events = [whole]
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        size = sum(len(event) for event in events)
        self.wfile.write(b"%sContent-Length: %d\r\n\r\n" % (head, size))
        if self.pieces == 1:  # the whole answer in one write
            events = [b"".join(events)]
        for n, event in enumerate(events):  # else event by event, as a provider streams
            if n and pause and n < self.pieces:
                time.sleep(pause)
            self.wfile.write(event)
            self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 4096  # a thousand sessions connect at once
    first_requests: list[float]
    """When each session's first request arrived (``perf_counter``; list appends are
    atomic)."""
    second_requests: list[float]
    """And its second (after the tool's result)."""


def serve(delay: float, pieces: int = 1) -> _Server:
    handler = type("Handler", (_Handler,), {"delay": delay, "pieces": pieces})
    server = _Server(("127.0.0.1", 0), handler)
    server.first_requests = []
    server.second_requests = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# -- measuring --------------------------------------------------------------------------------


def with_schema(url: str, schema: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}')}"


class Sampler:
    """Every 50 ms: the database's connections (``pg_stat_activity``, this connection
    excluded), and the workers' RSS and threads (``/proc``); the peaks."""

    def __init__(self, url: str, pids: list[int]) -> None:
        self.url = url
        self.pids = pids
        self.connections = 0
        self.rss_mb = 0.0
        self.threads = 0
        self.own_cpu: dict[int, float] = {}
        """Each worker's own CPU seconds (user + system, not its children's), last seen."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.wait(0.05):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                ).fetchone()
                self.connections = max(self.connections, int(row[0]) if row else 0)
                rss, threads = 0.0, 0
                for pid in self.pids:
                    status = _proc_status(pid)
                    rss += status.get("VmRSS", 0) / 1024
                    threads = max(threads, status.get("Threads", 0))
                    seen = _proc_cpu(pid)
                    if seen is not None:
                        self.own_cpu[pid] = seen
                self.rss_mb = max(self.rss_mb, rss)
                self.threads = max(self.threads, threads)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _proc_status(pid: int) -> dict[str, int]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "Threads"):
            out[key] = int(value.split()[0])
    return out


def _proc_cpu(pid: int) -> float | None:
    """``pid``'s own CPU seconds so far (``utime`` + ``stime`` of ``/proc/PID/stat``; its
    children's are other fields), or ``None`` once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # field 3 (state) onwards
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # fields 14, 15


def _postgres_cpu() -> float:
    """CPU seconds PostgreSQL's processes on this machine have used: each live one's own
    (``comm`` ``postgres``), and what they reaped of their exited children (the postmaster
    reaps every backend). The difference over a run is the server's share of it; 0 when the
    server runs elsewhere."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_bytes() != b"postgres\n":
                continue
            stat = (entry / "stat").read_bytes()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        total += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


def _machine_busy() -> float:
    """CPU seconds this machine's CPUs have been busy since boot, all of them together
    (``/proc/stat``: user, nice, system, irq and softirq; not idle, I/O wait or steal)."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, _steal = values
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _quantiles(times: list[float]) -> tuple[float, float, float]:
    """Half, 90% and all of ``times`` (sorted) are at or before these; zeros when empty."""
    if not times:
        return (0.0, 0.0, 0.0)
    ordered = sorted(times)

    def at(share: float) -> float:
        return ordered[max(0, math.ceil(share * len(ordered)) - 1)]

    return (at(0.5), at(0.9), ordered[-1])


def bare_loop(url: str, line: bytes, seconds: float = 2.0) -> float:
    """One connection, ``INSERT`` of one row like a committed line, then ``COMMIT``
    (autocommit: one WAL flush per row): rows per second."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bare (session_id text, line_no bigint, data bytea)")
        count = 0
        start = time.perf_counter()
        with conn.cursor() as cur:
            while time.perf_counter() - start < seconds:
                cur.execute(
                    "INSERT INTO bare VALUES (%s, %s, %b)", ("s", count, line), prepare=True
                )
                count += 1
        rate = count / (time.perf_counter() - start)
        conn.execute("DROP TABLE bare")
    return rate


def bare_spawns(workdir: Path, count: int = 300) -> float:
    """CPU seconds one bare start of the sessions' command takes (``subprocess.run`` of
    ``bash -c COMMAND``, the process's own CPU, the kernel's included): what any runtime
    pays for the workload's bash call, whatever it adds to it."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TETHER_SESSION_ID": "bare"}
    for _ in range(count):
        subprocess.run(["/bin/bash", "-c", COMMAND], cwd=workdir, env=env, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return used / count


@dataclass
class Result:
    sessions: int
    workers: int
    concurrency: int
    delay: float
    wall: float
    ideal: float
    connections: int
    rss_mb: float
    threads: int
    finished: int
    effects: Counter[str]
    facts: int
    commits: int
    codes: list[int]
    cpu: float
    """CPU seconds the workers used (user + system, with the bash calls they ran)."""
    system: float
    """Of :attr:`cpu`, the kernel's (threads, locks, process starts)."""
    own_cpu: float
    """Of :attr:`cpu`, the worker processes' own, without their children (``/proc``, last
    50 ms sample): what runs under their GILs."""
    first: float
    """When the first request of all reached the model, from the workers' start."""
    ramp: tuple[float, float, float]
    ramp2: tuple[float, float, float]
    """The same for the second requests."""
    """When the sessions' first requests reached the model, in seconds from the workers'
    start: half of them, 90% of them, the last (the ideal: all at once)."""
    bare: float
    """The bare INSERT + COMMIT loop's rows per second, measured right after the fleet."""
    machine_cpu: float
    """CPU seconds the whole machine used over the wall (``/proc/stat``): the workers, their
    bash calls, PostgreSQL, this script's model server, and anything else running."""
    postgres_cpu: float
    """Of :attr:`machine_cpu`, PostgreSQL's (0 when it runs elsewhere)."""
    script_cpu: float
    """Of :attr:`machine_cpu`, this script's: the model server and the sampler."""
    spawn_cpu: float
    """CPU seconds of one bare start of the sessions' command (:func:`bare_spawns`),
    measured right after the fleet."""
    cores: int

    @property
    def exactly_once(self) -> int:
        return sum(1 for n in self.effects.values() if n == 1)


def run_fleet(
    base: str,
    *,
    sessions: int,
    workers: int,
    concurrency: int,
    delay: float,
    sandbox: str,
    lease: float,
    keep: bool = False,
    pieces: int = 1,
) -> Result:
    schema = f"fleet_{secrets.token_hex(4)}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    url = with_schema(base, schema)
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    server = serve(delay, pieces)
    try:
        init_schema(url)
        ws = work / "ws"
        (ws / ".tether").mkdir(parents=True)
        (work / "prompts.jsonl").write_text(
            "".join(json.dumps({"prompt": f"task {n}"}) + "\n" for n in range(sessions))
        )
        env = {
            **os.environ,
            "OPENAI_API_KEY": "sk-bench-fleet",
            "TETHER_LEASE_SECONDS": str(lease),
        }
        env.pop("TETHER_STORE_URL", None)
        common = [
            "--store", url, "--workspace", str(ws), "--model", f"openai/{MODEL}",
            "--base-url", f"http://127.0.0.1:{server.server_address[1]}/v1",
            "--sandbox", sandbox,
        ]  # fmt: skip
        tether = [sys.executable, "-m", "tether"]
        submitted = subprocess.run(
            [*tether, "submit", "--from", str(work / "prompts.jsonl"), *common],
            cwd=ws, env=env, capture_output=True, text=True,
        )  # fmt: skip
        if submitted.returncode != 0:
            raise SystemExit(f"submit failed: {submitted.stderr.strip()}")
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT coalesce(sum(lines), 0) FROM tether_sessions").fetchone()
            lines_before = int(row[0]) if row else 0
        logs = [work / f"worker{n}.log" for n in range(workers)]
        start, busy = time.perf_counter(), _machine_busy()
        postgres, script = _postgres_cpu(), time.process_time()
        worker = [*tether, "worker", "--until-empty", "--concurrency", str(concurrency)]
        worker += ["--status-every", "5", *common]
        procs = [
            subprocess.Popen(
                worker, cwd=ws, env=env, stdout=subprocess.DEVNULL, stderr=log.open("wb")
            )
            for log in logs
        ]
        sampler = Sampler(base, [p.pid for p in procs])
        codes, cpu, system = [], 0.0, 0.0
        for proc in procs:  # wait4: the exit status and the CPU the worker used
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            codes.append(proc.returncode)
            cpu += usage.ru_utime + usage.ru_stime
            system += usage.ru_stime
        wall, busy = time.perf_counter() - start, _machine_busy() - busy
        postgres, script = _postgres_cpu() - postgres, time.process_time() - script
        sampler.stop()
        for code, log in zip(codes, logs, strict=True):
            if code != 0 or keep:
                print(f"--- worker exited {code}; its log, but for the completed sessions:")
                events = [x for x in log.read_text().splitlines() if "completed" not in x]
                print("\n".join(events[-25:]))
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE NOT pending), coalesce(sum(lines), 0) "
                "FROM tether_sessions"
            ).fetchone()
            assert row is not None
            finished, lines_after = int(row[0]), int(row[1])
            unfinished = conn.execute(
                "SELECT session_id, operation, lines, blocked, lease_owner FROM tether_sessions "
                "WHERE pending ORDER BY session_id LIMIT 5"
            ).fetchall()
        for session_id, operation, count, blocked, owner in unfinished:
            said = [
                line
                for log in logs
                for line in log.read_text().splitlines()
                if str(session_id) in line
            ]
            print(
                f"  unfinished: {session_id} ({operation}, {count} lines, "
                f"{'parked' if blocked else 'queued'}, lease {owner}): {said[-3:]}"
            )
        with psycopg.connect(url, autocommit=True) as conn:
            facts = 0
            sample = b""
            for (data,) in conn.execute(
                "SELECT data FROM tether_lines WHERE line_no > 2"
            ).fetchall():
                sample = bytes(data)
                facts += _facts_in(sample)
        effects_file = ws / "effects.txt"
        effects: Counter[str] = Counter(
            effects_file.read_text().split() if effects_file.exists() else []
        )
        rounds = math.ceil(sessions / (workers * concurrency))
        result = Result(
            sessions=sessions,
            workers=workers,
            concurrency=concurrency,
            delay=delay,
            wall=wall,
            ideal=rounds * 2 * delay,
            connections=sampler.connections,
            rss_mb=sampler.rss_mb,
            threads=sampler.threads,
            finished=finished,
            effects=effects,
            facts=facts,
            commits=lines_after - lines_before,
            codes=codes,
            cpu=cpu,
            system=system,
            own_cpu=sum(sampler.own_cpu.values()),
            first=min(server.first_requests, default=start) - start,
            ramp=_quantiles([t - start for t in server.first_requests]),
            ramp2=_quantiles([t - start for t in server.second_requests]),
            bare=bare_loop(url, sample or b"x" * 600),
            spawn_cpu=bare_spawns(work),
            machine_cpu=busy,
            postgres_cpu=postgres,
            script_cpu=script,
            cores=len(os.sched_getaffinity(0)),
        )
        return result
    finally:
        server.shutdown()
        shutil.rmtree(work, ignore_errors=True)
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


def memory_child(sessions: int, delay: float, port: int, workdir: str) -> None:
    """(A child process.) One :class:`~tether._runtime.worker.Worker` with every session
    in flight, over an in-memory store: the worker side's own cost, with no database
    connection to run out of. Prints the wall and how many sessions completed."""
    from tether._models.openai_compat import OpenAICompatibleModel
    from tether._runtime import Agent
    from tether._runtime.worker import Worker, submit
    from tether._stores.memory import MemorySessions

    class Queue(MemorySessions):
        def __init__(self) -> None:
            super().__init__()
            self.queue: list[str] = []
            self.guard = threading.Lock()

        def claim(self, environment: str) -> str | None:
            with self.guard:
                return self.queue.pop(0) if self.queue else None

        def waiting(self, environment: str) -> int:
            with self.guard:
                return len(self.queue)

        def release_claim(self, session_id: str) -> None:
            pass

        def park(self, session_id: str) -> None:
            pass

    store = Queue()

    def make_agent() -> Agent:
        model = OpenAICompatibleModel(
            MODEL, base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-bench-fleet"
        )
        return Agent(
            model, workspace=workdir, read_agents_md=False, session_store=store, sandbox="off"
        )

    first = make_agent()
    store.queue = [submit(first, f"task {n}") for n in range(sessions)]
    first.close()

    def log(line: str) -> None:
        if line.startswith("status: "):
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    worker = Worker(make_agent, concurrency=sessions, until_empty=True, log=log, status_every=0.1)
    signal.signal(signal.SIGTERM, lambda signum, frame: worker.stop("SIGTERM"))
    start = time.perf_counter()
    report = worker.run()
    wall = time.perf_counter() - start
    statuses = Counter(report.driven.values())
    print(json.dumps({"wall": wall, "completed": statuses["completed"], **statuses}))


def run_memory(sessions: int, delay: float, drain: bool = False) -> None:
    """The worker side alone at ``sessions`` in flight (:func:`memory_child`); ``drain``:
    SIGTERM once half of them are in flight, and time the exit."""
    server = serve(delay)
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-mem-"))
    try:
        (work / ".tether").mkdir()
        child = subprocess.Popen(
            [
                sys.executable, __file__, "--memory-child", str(sessions), str(delay),
                str(server.server_address[1]), str(work),
            ],
            cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        termed: list[tuple[float, int]] = []

        def watch() -> None:
            assert child.stderr is not None
            for line in child.stderr:
                flying = line.partition("in flight ")[2].split(",")[0].split(" ")[0]
                if drain and not termed and flying.isdigit() and int(flying) >= 0.5 * sessions:
                    termed.append((time.perf_counter(), int(flying)))
                    child.send_signal(signal.SIGTERM)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        peak_rss, peak_threads = 0.0, 0
        while child.poll() is None:
            status = _proc_status(child.pid)
            peak_rss = max(peak_rss, status.get("VmRSS", 0) / 1024)
            peak_threads = max(peak_threads, status.get("Threads", 0))
            time.sleep(0.05)
        exited = time.perf_counter()
        watcher.join(timeout=5)
        out = json.loads((child.stdout.read() if child.stdout else "").strip().splitlines()[-1])
        # No file: no session got as far as its bash call (a SIGTERM before any did).
        effects_file = work / "effects.txt"
        effects = Counter(effects_file.read_text().split() if effects_file.exists() else ())
        once = sum(1 for n in effects.values() if n == 1)
        ideal = 2 * delay
        if drain:
            if not termed:
                print(f"drain: {sessions // 2} were never in flight at once; no SIGTERM")
                return
            at, flying = termed[0]
            print(
                f"drain (in-memory store): SIGTERM with {flying} sessions in flight; exit "
                f"{child.returncode} after {exited - at:.1f} s (model delay {delay:g} s); "
                f"{out.get('stopped', 0)} stopped at a durable point, {out['completed']} "
                f"completed, {sum(effects.values())} effects, none twice: "
                f"{all(n == 1 for n in effects.values())}"
            )
            return
        print(
            f"worker side alone (in-memory store, {sessions} in flight, model delay {delay:g} "
            f"s): wall {out['wall']:.1f} s, ideal {ideal:.1f} s"
            + (f" ({out['wall'] / ideal:.2f}x)" if ideal else "")
            + f"; completed {out['completed']}/{sessions}, exactly one effect in {once}; "
            f"peak RSS {peak_rss:.0f} MB, peak threads {peak_threads}"
        )
    finally:
        server.shutdown()
        shutil.rmtree(work, ignore_errors=True)


def _facts_in(line: bytes) -> int:
    """How many facts a committed line holds (a transaction: one JSON array or object)."""
    value = json.loads(line)
    if isinstance(value, list):
        return len(value)
    if isinstance(value, dict) and isinstance(value.get("facts"), list):
        return len(value["facts"])
    return 1


def _bound(who: str, cpu: float, result: Result) -> str:
    """The shortest wall ``cpu`` seconds allow on the machine's cores, and so the most
    facts/s, against the bare loop: a ratio above it cannot be reached here."""
    floor = cpu / result.cores
    if floor <= 0:
        return f"{who}: (not measured)"
    rate = result.facts / floor
    return (
        f"{who} could not end before {floor:.2f} s: {rate:.0f} facts/s, "
        f"{rate / result.bare:.2f}x the bare loop"
    )


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(result: Result) -> bool:
    bare = result.bare
    facts_rate = result.facts / result.wall
    commits_rate = result.commits / result.wall
    once = result.exactly_once
    ideal = f"{result.ideal:.1f} s" if result.ideal else "-"
    ratio = f" ({result.wall / result.ideal:.2f}x)" if result.ideal else ""
    print(
        f"fleet: {result.sessions} sessions, {result.workers} worker(s) x concurrency "
        f"{result.concurrency}, model delay {result.delay:g} s"
    )
    print(
        f"  wall {result.wall:.1f} s, ideal {ideal}{ratio}; worker exit codes {result.codes}; "
        f"worker CPU {result.cpu:.1f} s ({result.cpu / result.sessions * 1000:.1f} ms a session, "
        f"{result.system / result.cpu:.0%} in the kernel)"
    )
    half, most, last = result.ramp
    print(
        f"  the workers' own CPU (without their bash calls) {result.own_cpu:.1f} s "
        f"({result.own_cpu / result.sessions * 1000:.1f} ms a session); first requests "
        f"sent from {result.first:.1f} s, by {half:.1f} s (half), {most:.1f} s (90%), "
        f"{last:.1f} s (all)"
    )
    half, most, last = result.ramp2
    print(
        f"  second requests sent by {half:.1f} s (half), {most:.1f} s (90%), {last:.1f} s "
        f"(all); the last session could end at {last + result.delay:.1f} s, the workers "
        f"exited {result.wall - last - result.delay:.1f} s after"
    )
    print(
        f"  finished {result.finished}/{result.sessions}; effects: exactly one in {once}, "
        f"none in {result.sessions - len(result.effects)}, "
        f"more than one in {sum(1 for n in result.effects.values() if n > 1)}"
    )
    print(
        f"  peak DB connections {result.connections}; peak RSS {result.rss_mb:.0f} MB (all "
        f"workers); peak threads {result.threads} (largest worker)"
    )
    print(
        f"  facts/s {facts_rate:.0f}, commits/s {commits_rate:.0f}; bare INSERT+COMMIT loop "
        f"{bare:.0f}/s; facts/s over bare {facts_rate / bare:.2f}x, commits/s over bare "
        f"{commits_rate / bare:.2f}x"
    )
    # What the workers cannot make faster: the CPU the rest of the run needs (each session's
    # bash process, PostgreSQL, this script's model server and sampler) shares the machine's
    # cores with them.
    bash = max(0.0, result.cpu - result.own_cpu)
    rest = max(0.0, result.machine_cpu - result.own_cpu)
    other = max(0.0, rest - bash - result.postgres_cpu - result.script_cpu)
    print(
        f"  the machine's CPU over the wall {result.machine_cpu:.1f} s ({result.cores} cores): "
        f"the workers' own {result.own_cpu:.1f} s, their bash calls {bash:.1f} s, PostgreSQL "
        f"{result.postgres_cpu:.1f} s, this script (model server, sampler) "
        f"{result.script_cpu:.1f} s, the rest {other:.1f} s"
    )
    print(f"  {_bound('workers that took no CPU at all', rest, result)}")
    needed = bash + result.postgres_cpu
    print(f"  {_bound('nothing but the bash calls and PostgreSQL', needed, result)}")
    needed = result.postgres_cpu + result.spawn_cpu * result.sessions
    print(
        f"  {_bound('nothing but PostgreSQL and bare starts of bash', needed, result)} (a "
        f"bare start: {result.spawn_cpu * 1000:.2f} ms CPU, measured after the fleet)"
    )
    return once == result.sessions and result.finished == result.sessions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("url", nargs="?")
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--delay", type=float, default=2.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--sandbox", default="off")
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument(
        "--chunks", type=int, default=1, help="stream each answer in this many deltas, paced"
    )
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--keep-logs", action="store_true", help="print the workers' log tails")
    parser.add_argument(
        "--memory", action="store_true", help="also the worker side alone, in-memory store"
    )
    parser.add_argument("--memory-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        count, delay, port, workdir = args.memory_child
        memory_child(int(count), float(delay), int(port), workdir)
        return
    if args.memory:
        run_memory(args.sessions, args.delay)
        run_memory(args.sessions, args.delay, drain=True)
        return
    base = args.url or os.environ.get("TETHER_BENCH_PG_URL") or os.environ["TETHER_TEST_PG_URL"]
    with contextlib.suppress(psycopg.Error), psycopg.connect(base) as conn:
        row = conn.execute("SHOW max_connections").fetchone()
        print(f"PostgreSQL max_connections {row[0] if row else '?'}")

    def concurrency(workers: int) -> int:
        return args.concurrency or max(1, math.ceil(args.sessions / workers))

    if args.chunks > 1:
        print(f"each answer streamed in {args.chunks} deltas spread over the model delay")
    result = run_fleet(
        base, sessions=args.sessions, workers=args.workers,
        concurrency=concurrency(args.workers), delay=args.delay, sandbox=args.sandbox,
        lease=args.lease, keep=args.keep_logs, pieces=args.chunks,
    )  # fmt: skip
    complete = report(result)
    if args.delay > 0:
        print(
            f"acceptance (all finished once within {TARGET_SPEEDUP:g}x ideal, <= "
            f"{TARGET_CONNECTIONS} connections, <= {TARGET_RSS_MB} MB): "
            f"finished once {verdict(complete)}, "
            f"wall {verdict(result.wall <= TARGET_SPEEDUP * result.ideal)}, "
            f"connections {verdict(result.connections <= TARGET_CONNECTIONS)}, "
            f"RSS {verdict(result.rss_mb <= TARGET_RSS_MB)}"
        )
    if not args.sweep:
        return
    print(f"\nzero-delay throughput (target: facts/s >= {TARGET_RATIO:g}x the bare loop)")
    for workers in (1, 2, 3, 4):
        result = run_fleet(
            base, sessions=args.sessions, workers=workers, concurrency=concurrency(workers),
            delay=0.0, sandbox=args.sandbox, lease=args.lease, keep=args.keep_logs,
            pieces=args.chunks,
        )  # fmt: skip
        complete = report(result)
        ratio = result.facts / result.wall / result.bare
        print(
            f"  {workers} worker(s): facts/s over bare {ratio:.2f}x "
            f"{verdict(ratio >= TARGET_RATIO)}; all finished once {verdict(complete)}"
        )


if __name__ == "__main__":
    main()
