"""Resume and start-up benchmark: opening a 1,000-turn session, ``import tether``, ``Agent(...)``
(a report, not a test).

Run ``.venv/bin/python bench/bench_resume.py [--turns N] [--repeat R]``. One session of N
turns (:mod:`sessiongen`, 1,000 by default, ~6.4 MB) is written into a fresh workspace's
sessions directory; every figure below is measured in the same run, the in-process ones
interleaved round by round so that load from other processes hits all of them alike:

* ``orjson`` — the physical floor of any strict reader: read the file's bytes and
  ``orjson.loads`` every line. ``json`` — the same with the standard library.
* ``tether.open`` — ``SessionStore.open`` of the session (resolve, lock, read, the reducer's
  checkpoint beside the log — SHA-256 of the prefix it covers, decode, reduce what follows —
  or, without one, the strict parse and the reducer's checks of every fact; the durable
  open's sync), its reduced state, close. The first open of the run reduces the whole log
  and its close writes the checkpoint the later rounds open from (``tether.reduce`` is the
  full reduction). Target: at most **1.2x** ``orjson``, and below the OpenAI Agents SDK.
* ``tether.read_only`` — ``SessionStore.open_read_only`` (what ``inspect`` and ``show`` do:
  no lock, no sync), for information: the difference to ``tether.open`` is the durable
  open's ``fdatasync`` of the log and ``fsync`` of its directories.
* ``tether.reduce`` — ``load_reducer`` of bytes already in memory (for information).
* ``tether.checkpoint.write`` — what a closing writer pays once per 256 KiB of new log:
  encode the whole state and write the sidecar (temporary name, ``fsync``, rename).
  ``tether.checkpoint.full`` — decode the checkpoint in memory *and* build the indexes that
  only a later line's checks read (an open defers them to its first commit): what the first
  commit after an open adds (for information).
* ``tether.resume`` — what ``tether resume`` does in-process: ``Agent(...)`` (an
  OpenAI-compatible model on an unused loopback URL, the built-in tools) and
  ``agent.resume(id)`` of the session (nothing unfinished: open, reduce, plan, close).
  Target: at most **1.2x** ``orjson``, and below the OpenAI Agents SDK.
* ``agents.SQLiteSession`` — the OpenAI Agents SDK opening the same conversation (the same
  messages as Responses items, stored by its ``add_items``): ``SQLiteSession(id, db)`` and
  ``await get_items()``, timed inside a persistent event loop. Runs in a child interpreter:
  ``--agents-python PATH`` (a venv with ``openai-agents`` installed), or this one if it can
  import ``agents``; otherwise the line says it was not measured.
* ``Agent(...)`` warm — constructing an agent in a process that has built one before.
  Target: **30 ms**.
* Start-up in a fresh interpreter (best of ``--starts``): ``import tether``, then the first
  ``tether.Agent`` lookup (loads the runtime), then the first ``Agent(...)`` with a
  ``scripted:`` model and, separately, with an OpenAI-compatible one (the built-in tools;
  no request is sent, so neither the ``openai`` SDK nor httpx is loaded), and ``total_*``,
  the three together. Target for ``import tether`` and for each total: **30 ms**. The
  ``floor`` is a fresh interpreter importing only the standard-library and third-party
  modules those children loaded (what tether's own modules stand on). The children get a
  private bytecode cache (``PYTHONPYCACHEPREFIX``, warmed first), as an installed package
  has.

The exit status is always 0.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sessiongen
from tether._loading import load_reducer
from tether._stores import checkpoints
from tether._stores.file import SessionStore, session_file_name, sessions_dir_for
from tether._stores.sidecar import FileSidecar
from tether.core.checkpoint import decode_checkpoint, read_binding

OPEN_TARGET = 1.2
STARTUP_TARGET_MS = 30.0
MODEL = "openai/gpt-4o-mini"
MODEL_OPTIONS: dict[str, Any] = {"api_key": "sk-bench", "base_url": "http://127.0.0.1:9/v1"}


def _best_interleaved(runs: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best time (s) of each callable; each round runs every callable once."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeat):
        for name, run in runs.items():
            gc.collect()
            start = time.perf_counter()
            result = run()
            elapsed = time.perf_counter() - start
            del result
            best[name] = min(best[name], elapsed)
    return best


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _orjson_floor(path: Path) -> None:
    for line in _read(path).split(b"\n")[:-1]:
        orjson.loads(line)


def _json_baseline(path: Path) -> None:
    for line in _read(path).split(b"\n")[:-1]:
        json.loads(line)


def _tether_open(workspace: Path, session_id: str) -> None:
    store = SessionStore.open(session_id, workspace=workspace)
    try:
        store.state  # noqa: B018 - the reduced state is what an open is for
    finally:
        store.close()


def _tether_read_only(workspace: Path, session_id: str) -> None:
    store = SessionStore.open_read_only(session_id, workspace=workspace)
    try:
        store.state  # noqa: B018
    finally:
        store.close()


def _tether_resume(workspace: Path, session_id: str) -> None:
    import tether

    with tether.Agent(MODEL, workspace=workspace, **MODEL_OPTIONS) as agent:
        result = agent.resume(session_id)
    if result.status.value != "idle":
        raise RuntimeError(f"resume of a finished session: {result}")


class CheckpointFigures:
    """Writing the checkpoint of the whole session, and decoding it in full."""

    def __init__(self, folder: Path, data: bytes) -> None:
        self.reducer = load_reducer(data)
        self.hashed = hashlib.sha256(data)
        self.sidecar = FileSidecar(folder / ".bench.checkpoint.json")
        self.header = data[: data.index(b"\n")]
        self.write()
        self.raw = self.sidecar.path.read_bytes()
        self.binding = read_binding(self.raw)

    def write(self) -> None:
        if not checkpoints.save(self.reducer, self.hashed.copy(), self.sidecar):
            raise RuntimeError("the checkpoint could not be written")

    def decode_all(self) -> None:
        decode_checkpoint(self.raw, self.binding, self.header)._complete()


def _agent_construction(workspace: Path) -> None:
    import tether

    tether.Agent(MODEL, workspace=workspace, **MODEL_OPTIONS).close()


# ------------------------------------------------------------- the OpenAI Agents SDK, a child

_AGENTS_CHILD = r"""
import asyncio, json, sys, time
from agents import SQLiteSession
db, session_id, items_file = sys.argv[1:4]
loop = asyncio.new_event_loop()
with open(items_file, "rb") as f:
    items = json.load(f)
writer = SQLiteSession(session_id, db)
loop.run_until_complete(writer.add_items(items))
writer.close()

async def load():
    start = time.perf_counter()
    session = SQLiteSession(session_id, db)
    got = await session.get_items()
    session.close()
    return time.perf_counter() - start, len(got)

print("ready", flush=True)
for _ in sys.stdin:
    elapsed, count = loop.run_until_complete(load())
    print(json.dumps([elapsed, count]), flush=True)
"""


def _responses_items(data: bytes) -> list[dict[str, Any]]:
    """The session's conversation as the Agents SDK stores it (Responses input items)."""
    items: list[dict[str, Any]] = []
    for message in load_reducer(data).state.transcript:
        role = message["role"]
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": message["content"],
                }
            )
            continue
        if message.get("content"):
            items.append({"role": role, "content": message["content"]})
        for call in message.get("tool_calls") or ():
            items.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"],
                }
            )
    return items


def _agents_python(given: str | None) -> str | None:
    if given:
        return given
    return sys.executable if importlib.util.find_spec("agents") is not None else None


class AgentsChild:
    """A child interpreter with the Agents SDK that times one session load per request."""

    def __init__(self, python: str, folder: Path, data: bytes) -> None:
        items_file = folder / "items.json"
        items_file.write_bytes(orjson.dumps(_responses_items(data)))
        self.items = len(_responses_items(data))
        self.proc = subprocess.Popen(
            [python, "-c", _AGENTS_CHILD, str(folder / "agents.db"), "bench", str(items_file)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the Agents SDK child did not start")
        self.times: list[float] = []  # as the child timed them (no pipe round trip)

    def load(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("load\n")
        self.proc.stdin.flush()
        elapsed, count = json.loads(self.proc.stdout.readline())
        if count != self.items:
            raise RuntimeError(f"the Agents SDK loaded {count} items of {self.items}")
        self.times.append(elapsed)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


# ------------------------------------------------------------------------ fresh interpreters

_STARTUP_CHILD = r"""
import json, sys, time
before = set(sys.modules)
start = time.perf_counter()
import tether
imported = time.perf_counter()
Agent = tether.Agent
resolved = time.perf_counter()
agent = Agent(sys.argv[1], workspace=sys.argv[2], **json.loads(sys.argv[3]))
built = time.perf_counter()
others = sorted(m for m in set(sys.modules) - before if m.split(".")[0] != "tether")
agent.close()
print(json.dumps([imported - start, resolved - imported, built - resolved, others]))
"""

# The floor of a start-up: a fresh interpreter importing the standard-library and
# third-party modules the first Agent(...) loaded, without tether (whose own modules and
# what they do are the rest). Same preamble as the child above.
_FLOOR_CHILD = r"""
import json, sys, time
import importlib
names = json.loads(sys.argv[1])
start = time.perf_counter()
for name in names:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
print(json.dumps(time.perf_counter() - start))
"""


def _startup(model: str, options: dict[str, Any], workspace: Path, env: dict[str, str]) -> Any:
    done = subprocess.run(
        [sys.executable, "-c", _STARTUP_CHILD, model, str(workspace), json.dumps(options)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=120,
    )
    return json.loads(done.stdout)


def _floor(names: list[str], env: dict[str, str]) -> float:
    done = subprocess.run(
        [sys.executable, "-c", _FLOOR_CHILD, json.dumps(names)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=120,
    )
    elapsed: float = json.loads(done.stdout)
    return elapsed


def bench_startup(workspace: Path, script: Path, starts: int, cache: Path) -> dict[str, float]:
    """Best of ``starts`` fresh interpreters, kinds and the floor alternating. The
    ``total_*`` figures add the three stages of the same interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    kinds = {"scripted": (f"scripted:{script}", {}), "openai": (MODEL, MODEL_OPTIONS)}
    modules: set[str] = set()
    for model, options in kinds.values():  # fills the bytecode cache
        modules.update(_startup(model, options, workspace, env)[3])
    names = sorted(modules)
    _floor(names, env)
    best: dict[str, float] = {}

    def keep(name: str, value: float) -> None:
        best[name] = min(best.get(name, float("inf")), value)

    for _ in range(starts):
        for kind, (model, options) in kinds.items():
            imported, resolved, built, _ = _startup(model, options, workspace, env)
            keep("import", imported)
            keep("runtime", resolved)
            keep(f"first_agent_{kind}", built)
            keep(f"total_{kind}", imported + resolved + built)
        keep("floor", _floor(names, env))
    return best


# ------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--starts", type=int, default=7, help="fresh interpreters per figure")
    parser.add_argument("--agents-python", help="a python that can import the Agents SDK")
    args = parser.parse_args(argv)
    turns: int = args.turns

    folder = Path(tempfile.mkdtemp(prefix="bench-resume-"))
    try:
        workspace = folder / "ws"
        sessions = sessions_dir_for(workspace)
        sessions.mkdir(parents=True)
        data = sessiongen.generate(turns)
        header = orjson.loads(data[: data.index(b"\n")])
        session_id: str = header["id"]
        path = sessions / session_file_name(header["createdAt"], session_id)
        path.write_bytes(data)
        script = folder / "script.json"
        script.write_text(json.dumps({"model": "scripted/bench", "responses": [{"content": "-"}]}))
        transactions = data.count(b"\n") - 1
        print(
            f"# python {sys.version.split()[0]}, {turns} turns ({len(data) / 1e6:.1f} MB, "
            f"{transactions} transactions, "
            f"{turns * sessiongen.FACTS_PER_TURN} facts); best of {args.repeat}, interleaved"
        )

        figures = CheckpointFigures(folder, data)
        runs: dict[str, Callable[[], object]] = {
            "orjson": lambda: _orjson_floor(path),
            "json": lambda: _json_baseline(path),
            "tether.open": lambda: _tether_open(workspace, session_id),
            "tether.read_only": lambda: _tether_read_only(workspace, session_id),
            "tether.reduce": lambda: load_reducer(data),
            "tether.checkpoint.write": figures.write,
            "tether.checkpoint.full": figures.decode_all,
            "tether.resume": lambda: _tether_resume(workspace, session_id),
            "Agent(...)": lambda: _agent_construction(workspace),
        }
        python = _agents_python(args.agents_python)
        child: AgentsChild | None = None
        if python is not None:
            child = AgentsChild(python, folder, data)
            runs["agents.SQLiteSession"] = child.load
        _agent_construction(workspace)  # the first construction loads the runtime and SDK
        best = _best_interleaved(runs, args.repeat)
        if child is not None:
            best["agents.SQLiteSession"] = min(child.times)
            child.close()

        floor = best["orjson"]
        for name, value in best.items():
            print(f"resume.{name:<25} {value * 1e3:8.1f} ms  {value / floor:5.2f}x orjson")
        if child is None:
            print(
                "resume.agents.SQLiteSession   not measured: the Agents SDK is not importable "
                "(pip install openai-agents into a venv, then --agents-python PATH)"
            )

        startup = bench_startup(workspace, script, args.starts, folder / "pycache")
        for name, value in startup.items():
            ratio = value / startup["floor"]
            print(
                f"startup.{name:<21} {value * 1e3:8.1f} ms  {ratio:5.2f}x floor "
                "(fresh interpreter, best)"
            )

        verdicts = [
            ("open vs orjson.loads", best["tether.open"] / floor, OPEN_TARGET, "x"),
            ("import tether", startup["import"] * 1e3, STARTUP_TARGET_MS, " ms"),
            ("Agent(...) warm", best["Agent(...)"] * 1e3, STARTUP_TARGET_MS, " ms"),
            (
                "import tether + first Agent(...), scripted",
                startup["total_scripted"] * 1e3,
                STARTUP_TARGET_MS,
                " ms",
            ),
            (
                "import tether + first Agent(...), OpenAI-compatible",
                startup["total_openai"] * 1e3,
                STARTUP_TARGET_MS,
                " ms",
            ),
        ]
        verdicts.append(("resume vs orjson.loads", best["tether.resume"] / floor, OPEN_TARGET, "x"))
        if child is not None:
            for name in ("open", "resume"):
                ratio = best[f"tether.{name}"] / best["agents.SQLiteSession"]
                verdicts.append((f"{name} vs agents.SQLiteSession", ratio, 1.0, "x"))
        for name, value, target, unit in verdicts:
            verdict = "PASS" if value <= target else "MISS"
            print(f"{verdict}  {name}: {value:.2f}{unit} (target <= {target}{unit})")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
