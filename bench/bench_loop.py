"""Benchmark: the whole agent loop against a scripted OpenAI-compatible server (issue 31).

Run: ``python bench/bench_loop.py`` (200 turns: under a minute for tether and the floor, a
few more with the peers; ``--turns``, ``--dir``, ``--profile``, ``--process``, ``--peers-inline``,
``--no-peers``). Everything happens in a temporary directory (default ``$TMPDIR``).

Workload: one durable session of N turns. Each turn is a 400-byte prompt; the model (a
scripted chat-completions server on loopback, answering in SSE) asks to read a 2,000-byte
file, then answers 400 bytes. Every request carries the whole history, as with a real
provider, so every system grows with the session.

Contenders, turn by turn in alternation so that a disturbance of the machine hits all
alike, each with its own session and its own client of the same server. The floor and
tether alternate in this interpreter; the peers, when installed, alternate the same way
afterwards in a second one (``--peers-inline``: all five in this interpreter). Sharing an
interpreter with the peers measures them as much as tether: their modules and objects (a
few hundred MB: SQLAlchemy, Pydantic, LangChain) stay on the heap that every collection of
the oldest generation walks, and each of their turns (100-400 ms of other code) leaves the
caches cold; both cost the contender that does more per turn, so tether, ~0.5-1 ms a turn
that a process of its own never pays (measured: tether/floor 2.30-2.39x inline against
1.81-1.84x apart, same code and machine).

* ``floor`` — only the physical work of a turn: two HTTP requests whose bodies are joined
  from messages encoded once (``orjson``) on a kept-alive ``http.client`` connection, the
  SSE answers read and parsed, the file read, and four ``os.write`` + ``os.fdatasync`` of
  the turn's new messages (tether's four durable points);
* ``tether`` — :class:`tether.Agent` (durable mode, built-in tools) with the
  OpenAI-compatible adapter: ``agent.run(prompt, session=…)``.
* the peers, when installed (``pip install -e '.[bench]'``; ``--no-peers`` leaves them out):
  ``agents_sdk`` — the OpenAI Agents SDK with its ``SQLiteSession``, streamed runs;
  ``langgraph`` — LangGraph's prebuilt ReAct agent with ``langchain-openai`` (streaming) and
  a SQLite checkpointer; ``pydantic_dbos`` — Pydantic AI made durable with DBOS (SQLite
  system database; a DBOS workflow asks for whole answers, which the server also gives).
  Each uses its default durability.

Printed, for each: the median turn, the median of the last 50 turns, the growth (last 50
over first 50); then tether against the floor. Targets (issue 31): tether's median and
last-50 median at most **2x** the floor's, its growth at most **1.3x** the floor's growth,
and at least **10x** faster than each peer over the last 50 turns.
``--profile`` prints a cProfile of tether's last 10 turns; ``--process`` drops the syncs from
both (tether's durability ``process``), which leaves the CPU cost alone. The script always
exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import http.client
import json
import os
import pstats
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import orjson

from tether import Agent, RunStatus
from tether._models.openai_compat import OpenAICompatibleModel

PROMPT_BYTES = 400
FILE_BYTES = 2000
ANSWER_BYTES = 400
MODEL = "bench/model"
TARGET_TURN = 2.0
TARGET_GROWTH = 1.3

_ROLE = re.compile(rb'"role"\s*:\s*"(\w+)"')


# -- the scripted server ------------------------------------------------------------------------


def _sse(payload: Any) -> bytes:
    return b"data: " + (payload if isinstance(payload, bytes) else orjson.dumps(payload)) + b"\n\n"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return _sse(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def _usage() -> bytes:
    usage = {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100}
    return _sse(
        {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "choices": [], "usage": usage}
    )


def _tool_call_answer() -> bytes:
    call = {
        "index": 0,
        "id": "call_read",
        "type": "function",
        "function": {"name": "read", "arguments": '{"path": "data.txt"}'},
    }
    return b"".join(
        (
            _chunk({"role": "assistant", "content": None, "tool_calls": [call]}),
            _chunk({}, "tool_calls"),
            _usage(),
            _sse(b"[DONE]"),
        )
    )


def _text_answer() -> bytes:
    text = ("The file says what it says. " * 20)[:ANSWER_BYTES]
    pieces = [_chunk({"role": "assistant", "content": ""})]
    pieces += [_chunk({"content": text[i : i + 40]}) for i in range(0, len(text), 40)]
    pieces += [_chunk({}, "stop"), _usage(), _sse(b"[DONE]")]
    return b"".join(pieces)


def _whole(stream: bytes) -> bytes:
    """The same answer as one ``chat.completion`` (for a client that does not stream)."""
    content: list[str] = []
    calls: list[Any] = []
    finish = None
    for line in stream.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        for choice in orjson.loads(line[6:])["choices"]:
            content.append(choice["delta"].get("content") or "")
            calls += choice["delta"].get("tool_calls") or ()
            finish = choice["finish_reason"] or finish
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in calls]
    usage = {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100}
    return orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage,
        }
    )


TOOL_CALL = _tool_call_answer()
TEXT = _text_answer()
WHOLE = {TOOL_CALL: _whole(TOOL_CALL), TEXT: _whole(TEXT)}
_STREAM = re.compile(rb'"stream"\s*:\s*true')


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else a small second write waits for a delayed ACK

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        # The last message decides: after a tool result, answer; otherwise ask to read.
        roles = [m.group(1) for m in _ROLE.finditer(body, max(0, body.rfind(b'"role"') - 1))]
        answer = TEXT if roles and roles[-1] == b"tool" else TOOL_CALL
        # "stream" is near the start (the SDKs) or the end (tether) of the body.
        if _STREAM.search(body[:512]) or _STREAM.search(body[-1024:]):
            head = (
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            self.wfile.write(b"%s%x\r\n%s\r\n0\r\n\r\n" % (head, len(answer), answer))
        else:
            whole = WHOLE[answer]
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            self.wfile.write(b"%sContent-Length: %d\r\n\r\n%s" % (head, len(whole), whole))
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    connections = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        self.connections += 1
        super().process_request(request, client_address)


# -- the floor ----------------------------------------------------------------------------------


class Floor:
    """The physical work of a turn, nothing else."""

    def __init__(self, port: int, workdir: Path, sync: bool) -> None:
        self.sync = sync
        self.connection = http.client.HTTPConnection("127.0.0.1", port)
        self.file = workdir / "data.txt"
        self.fd = os.open(workdir / "floor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        system = orjson.dumps({"role": "system", "content": "You are a helpful agent."})
        self.pieces = [system]
        tools = [
            {
                "type": "function",
                "function": {
                    "name": "read",
                    "description": "Read a file of the workspace.",
                    "parameters": {
                        "type": "object",
                        "properties": {"path": {"type": "string"}},
                        "required": ["path"],
                    },
                },
            }
        ]
        self.head = b'{"model":' + orjson.dumps(MODEL) + b',"messages":['
        self.tail = (
            b'],"tools":'
            + orjson.dumps(tools)
            + b',"stream":true,"stream_options":{"include_usage":true}}'
        )

    def _durable(self, *messages: bytes) -> None:
        os.write(self.fd, b"\n".join(messages) + b"\n")
        if self.sync:
            os.fdatasync(self.fd)

    def _request(self) -> dict[str, Any]:
        body = b"".join((self.head, b",".join(self.pieces), self.tail))
        self.connection.request(
            "POST", "/v1/chat/completions", body, {"Content-Type": "application/json"}
        )
        response = self.connection.getresponse()
        data = response.read()
        content: list[str] = []
        calls: list[dict[str, Any]] = []
        for line in data.split(b"\n"):
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    content.append(delta["content"])
                calls.extend(delta.get("tool_calls") or ())
        message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
        if calls:
            message["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": c["function"]} for c in calls
            ]
        return message

    def turn(self, prompt: str) -> None:
        user = orjson.dumps({"role": "user", "content": prompt})
        self.pieces.append(user)
        self._durable(user)  # the user entry (and the step attempt)
        asked = orjson.dumps(self._request())
        self.pieces.append(asked)
        self._durable(asked)  # the assistant entry (and the tool start)
        content = self.file.read_text()
        result = orjson.dumps({"role": "tool", "content": content, "tool_call_id": "call_read"})
        self.pieces.append(result)
        self._durable(result)  # the tool result (and the next step attempt)
        answer = orjson.dumps(self._request())
        self.pieces.append(answer)
        self._durable(answer)  # the answer (and the end of the run)

    def close(self) -> None:
        self.connection.close()
        os.close(self.fd)


# -- tether ---------------------------------------------------------------------------------------


class Tether:
    def __init__(self, port: int, workdir: Path, sync: bool) -> None:
        self.model = OpenAICompatibleModel(MODEL, base_url=f"http://127.0.0.1:{port}/v1")
        self.agent = Agent(
            self.model,
            workspace=workdir,
            sessions_dir=workdir / "sessions",
            durability="durable" if sync else "process",
            read_agents_md=False,
            system_prompt="You are a helpful agent.",
        )
        self.session: str | None = None

    def turn(self, prompt: str) -> None:
        result = self.agent.run(prompt, session=self.session)
        if result.status is not RunStatus.COMPLETED:
            raise SystemExit(f"tether: the run ended {result.status}: {result.message}")
        self.session = result.session_id

    def close(self) -> None:
        self.agent.close()


# -- peers (optional: the ``bench`` extra) -----------------------------------------------------


class AgentsSDK:
    """The OpenAI Agents SDK with a ``SQLiteSession`` (its durable session) and one tool."""

    def __init__(self, port: int, workdir: Path, sync: bool) -> None:
        import agents
        from openai import AsyncOpenAI

        agents.set_tracing_disabled(True)
        data = workdir / "data.txt"

        @agents.function_tool
        def read(path: str) -> str:
            """Read a file of the workspace."""
            return (workdir / path).read_text() if path == "data.txt" else data.read_text()

        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench-key")
        self.agent = agents.Agent(
            name="bench",
            instructions="You are a helpful agent.",
            model=agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
            tools=[read],
        )
        self.session = agents.SQLiteSession("bench", workdir / "agents.sqlite")
        self.runner = agents.Runner
        self.loop = asyncio.new_event_loop()

    async def _turn(self, prompt: str) -> None:
        result = self.runner.run_streamed(self.agent, prompt, session=self.session)
        async for _ in result.stream_events():
            pass

    def turn(self, prompt: str) -> None:
        self.loop.run_until_complete(self._turn(prompt))  # streamed, as tether is

    def close(self) -> None:
        self.session.close()
        self.loop.close()


class LangGraph:
    """LangGraph's prebuilt ReAct agent, ``langchain-openai`` streaming, a SQLite checkpointer."""

    def __init__(self, port: int, workdir: Path, sync: bool) -> None:
        import sqlite3

        from langchain_core.tools import tool
        from langchain_openai import ChatOpenAI
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.prebuilt import create_react_agent

        # Moved to langchain.agents.create_agent (another package), the same graph.
        warnings.filterwarnings("ignore", message="create_react_agent has been moved")

        @tool
        def read(path: str) -> str:
            """Read a file of the workspace."""
            return (workdir / "data.txt").read_text()

        model = ChatOpenAI(
            model=MODEL,
            base_url=f"http://127.0.0.1:{port}/v1",
            api_key=cast(Any, "bench-key"),
            streaming=True,
        )
        self.db = sqlite3.connect(workdir / "langgraph.sqlite", check_same_thread=False)
        self.graph = create_react_agent(
            model, [read], prompt="You are a helpful agent.", checkpointer=SqliteSaver(self.db)
        )
        self.config: Any = {"configurable": {"thread_id": "bench"}}

    def turn(self, prompt: str) -> None:
        for _ in self.graph.stream(
            {"messages": [("user", prompt)]}, self.config, stream_mode="messages"
        ):
            pass

    def close(self) -> None:
        self.db.close()


class PydanticDBOS:
    """Pydantic AI made durable with DBOS (its ``DBOSDurability`` capability, each run a DBOS
    workflow, SQLite system database); ``run`` asks for whole answers."""

    def __init__(self, port: int, workdir: Path, sync: bool) -> None:
        from dbos import DBOS, DBOSConfig
        from pydantic_ai import Agent as PydanticAgent
        from pydantic_ai.durable_exec.dbos import DBOSDurability
        from pydantic_ai.messages import ModelMessage
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        provider = OpenAIProvider(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench-key")
        agent = PydanticAgent(
            OpenAIChatModel(MODEL, provider=provider),
            instructions="You are a helpful agent.",
            name="bench",
            capabilities=[DBOSDurability()],
        )

        @agent.tool_plain
        def read(path: str) -> str:
            """Read a file of the workspace."""
            return (workdir / "data.txt").read_text()

        config: DBOSConfig = {
            "name": "bench",
            "system_database_url": f"sqlite:///{workdir / 'dbos.sqlite'}",
            "log_level": "WARNING",
        }
        DBOS(config=config)
        history: list[ModelMessage] = []

        @DBOS.workflow()
        async def turn(prompt: str) -> None:
            result = await agent.run(prompt, message_history=history)
            history[:] = result.all_messages()

        DBOS.launch()
        self.dbos = DBOS
        self.workflow = turn
        self.loop = asyncio.new_event_loop()

    def turn(self, prompt: str) -> None:
        self.loop.run_until_complete(self.workflow(prompt))

    def close(self) -> None:
        self.dbos.destroy()
        self.loop.close()


PEERS: dict[str, Any] = {
    "agents_sdk": AgentsSDK,
    "langgraph": LangGraph,
    "pydantic_dbos": PydanticDBOS,
}
_MODULES = {"agents_sdk": "agents", "langgraph": "langgraph", "pydantic_dbos": "dbos"}


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(_MODULES[name]) is not None


# -- the run ------------------------------------------------------------------------------------


def _summary(times: list[float]) -> tuple[float, float, float]:
    window = min(50, max(1, len(times) // 4))
    median = statistics.median(times)
    first = statistics.median(times[:window])
    last = statistics.median(times[-window:])
    return median * 1000, last * 1000, last / first


def _order(contenders: dict[str, Any], index: int) -> list[tuple[str, Any]]:
    """Turn ``index``'s order: the floor and tether first, in either order, then the peers
    (forwards, then backwards). So with ``--peers-inline`` each of the two follows a peer's
    turn equally often, at a turn's start every other turn (the order before, all five
    reversed every other turn, never put the floor after a peer and tether after one every
    other turn)."""
    pair = [(name, contenders[name]) for name in ("floor", "tether") if name in contenders]
    peers = [(name, c) for name, c in contenders.items() if name not in ("floor", "tether")]
    if index % 2:
        pair.reverse()
        peers.reverse()
    return pair + peers


def _run(
    names: list[str], args: argparse.Namespace
) -> tuple[dict[str, list[float]], int, cProfile.Profile | None]:
    """The alternation of ``names`` over ``args.turns`` turns, in this interpreter, against a
    server of its own: each contender's turn times, the connections the server accepted."""
    server = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    port = int(server.server_address[1])
    kinds: dict[str, Any] = {"floor": Floor, "tether": Tether, **PEERS}
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        contenders: dict[str, Any] = {}
        for name in names:
            workdir = Path(root) / name
            workdir.mkdir()
            (workdir / "data.txt").write_text(("0123456789abcdef" * 200)[: FILE_BYTES - 1] + "\n")
            contenders[name] = kinds[name](port, workdir, not args.process)
        times: dict[str, list[float]] = {name: [] for name in contenders}
        profile = cProfile.Profile() if args.profile and "tether" in names else None
        prompt_text = ("Please read data.txt and tell me what it says. " * 10)[:PROMPT_BYTES]
        try:
            for index in range(args.turns):
                prompt = f"{index}: {prompt_text}"
                order = _order(contenders, index)
                for name, contender in order:
                    turn: Callable[[str], None] = contender.turn
                    profiled = profile is not None and name == "tether" and index >= args.turns - 10
                    if profiled:
                        assert profile is not None
                        profile.enable()
                    start = time.perf_counter()
                    turn(prompt)
                    times[name].append(time.perf_counter() - start)
                    if profiled:
                        assert profile is not None
                        profile.disable()
        finally:
            for contender in contenders.values():
                contender.close()
            server.shutdown()
            server.server_close()
    return times, server.connections, profile


def _peers_apart(peers: list[str], args: argparse.Namespace) -> tuple[dict[str, list[float]], int]:
    """The peers' alternation in a child interpreter (see the module docstring)."""
    command = [sys.executable, __file__, "--only", ",".join(peers), "--turns", str(args.turns)]
    if args.dir:
        command += ["--dir", args.dir]
    if args.process:
        command.append("--process")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the peers' run failed:\n{done.stderr[-2000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report["times"], int(report["connections"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--dir", default=None, help="where the sessions go (default: $TMPDIR)")
    parser.add_argument("--profile", action="store_true", help="cProfile tether's last 10 turns")
    parser.add_argument(
        "--no-peers",
        dest="peers",
        action="store_false",
        help="only tether and the floor (peers run when installed: the bench extra)",
    )
    parser.add_argument(
        "--peers-inline",
        action="store_true",
        help="the peers in the same interpreter as tether and the floor, in the alternation",
    )
    parser.add_argument("--only", default=None, help=argparse.SUPPRESS)  # the peers' child
    parser.add_argument(
        "--process",
        action="store_true",
        help="no fdatasync (tether's durability 'process'): the CPU cost alone",
    )
    args = parser.parse_args()
    if args.only is not None:
        times, connections, _ = _run(args.only.split(","), args)
        print(json.dumps({"times": times, "connections": connections}))
        return
    peers = [name for name in PEERS if args.peers and _importable(name)]
    inline = peers if args.peers_inline else []
    times, connections, profile = _run(["floor", "tether", *inline], args)
    if peers and not inline:
        apart, more = _peers_apart(peers, args)
        times.update(apart)
        connections += more
    mode = "process mode, no fdatasync" if args.process else "durable"
    where = "in one interpreter" if inline or not peers else "the peers in a second interpreter"
    print(f"loop: {args.turns} turns, one session each ({mode}), loopback SSE server, {where}")
    print(f"{'system':<14}{'median ms':>12}{'last-50 ms':>12}{'growth':>9}")
    figures = {name: _summary(values) for name, values in times.items()}
    for name, (median, last, growth) in figures.items():
        print(f"{name:<14}{median:>12.2f}{last:>12.2f}{growth:>8.2f}x")
    floor, tether = figures["floor"], figures["tether"]
    checks = (
        ("loop.turn", tether[0] / floor[0], TARGET_TURN),
        ("loop.last50", tether[1] / floor[1], TARGET_TURN),
        ("loop.growth", tether[2] / floor[2], TARGET_GROWTH),
    )
    for name, ratio, target in checks:
        verdict = "PASS" if ratio <= target else "MISS"
        print(f"{name:<12} tether/floor {ratio:5.2f}x  (target <= {target}x) {verdict}")
    for name, (_median, last, _growth) in figures.items():
        if name not in ("floor", "tether"):
            speed = last / tether[1]
            print(f"{name:<14} last-50: tether is {speed:5.1f}x faster (target >= 10x)")
    print(f"connections accepted: {connections} (tether and the floor keep one each)")
    if profile is not None:
        pstats.Stats(profile, stream=sys.stdout).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
