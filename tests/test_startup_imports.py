"""Start-up stays light: what ``import tether``, building an ``Agent`` and resuming a session
load. Each check runs in a fresh interpreter and reads ``sys.modules``, so no timing is
involved and a module-level import that brings a heavy dependency back fails here (the
figures themselves are in ``bench/bench_resume.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Loaded only by the code that needs them: model SDKs and HTTP by a model adapter, MCP by a
# configured server, rich and typer by the CLI, psycopg by the PostgreSQL store, jsonschema
# by a user tool's schema or a call's validation, pydantic by a typed tool.
NOT_AT_IMPORT = (
    "openai",
    "anthropic",
    "httpx",
    "httpx2",
    "httpcore",
    "httpcore2",
    "mcp",
    "rich",
    "typer",
    "psycopg",
    "pydantic",
    "jsonschema",
    "asyncio",
    "sqlite3",
)
# Building an agent with a scripted model and resuming a session of its own: the runtime
# (and sqlite3 for the workspace database) is loaded, none of the optional machinery.
NOT_AT_RESUME = (
    "openai",
    "anthropic",
    "httpx",
    "httpx2",
    "mcp",
    "rich",
    "typer",
    "psycopg",
    "pydantic",
    "jsonschema",
    "asyncio",
)


# Building an agent (an OpenAI-compatible model, the built-in tools) loads what checking
# its settings and making its configuration snapshot need, and none of what a call needs:
# the executor and its handlers, the event types, the model's HTTP stack, SQLite and the
# workspace database, the evidence binding, the completion machinery, the planner, MCP,
# the renderers and the crash lab (each loads on first use; bench/bench_resume.py times it).
NOT_AT_CONSTRUCTION = (
    *NOT_AT_IMPORT,
    "tether._runtime.executor",
    "tether._runtime.drive",
    "tether._runtime.model_steps",
    "tether._runtime.tool_calls",
    "tether._runtime.recovery",
    "tether._runtime.events",
    "tether._runtime.approval",  # what a person is asked, a parked call
    "tether._runtime.retry_record",  # a failed run's durable retry schedule
    "tether._runtime.costs",  # what a run cost in money
    "tether._models.streaming",
    "tether._models.messages",  # a request and an answer: the first call's values
    "tether._models.chat_stream",
    "tether._wsdb.sqlite",
    "tether._effects.binding",
    "tether._effects.journal",
    "tether._effects.authorization",
    "tether._completion.verify",
    "tether._completion.artifact",
    "tether._mcp.tools",
    "tether._show",
    "tether.testing",
    "tether.core.planner",
    "tether.core.plans",
    "tether.core.reconcile",
    "tether.core.timeline",
    "tether.core.values",
    # The session state's dataclasses: its enums and token counters (which a model response,
    # a tool and a result name) are tether.core.kinds, the rest loads with a session.
    "tether.core.state",
    # The session store: a construction opens no session, so the file store (the loader,
    # the reducer, the checkpoints, the side records, the log's framing) waits for the
    # opener's first create or open (tether._stores.opener holds what a construction uses).
    "tether._stores.file",
    "tether._loading",
    "tether.core.reducer",
    "tether.core.facts",
    "tether.core.framing",
    "tether.core.checkpoint",
    "tether._stores.checkpoints",
    "tether._stores.sidecar",
    "tether._stores.reasoning",
    "tether._stores.transaction",
    "tether._stores.locking",
    "tether._dirs",
    # The seams' protocols: annotations of the composition, loaded with what implements them.
    "tether._stores.protocol",
    "tether._wsdb.protocol",
    # A command's: the process runner, the bubblewrap check (subprocess, shutil), a file
    # change's temporary name (secrets); the scripted adapter with another model; TOML
    # with no tether.toml and no --model-option.
    "tether._procs",
    "tether._models.scripted",
    "subprocess",
    "shutil",
    "secrets",
    "tomllib",
    # What only a command killed by a signal or a crash point that fires needs, and the
    # close-match search of a misspelt model prefix (openai:… is not close to any).
    "signal",
    "difflib",
    # Issue 31's last 30 ms: orjson (~18 ms: it imports dataclasses, inspect, uuid and
    # datetime itself) encodes the first fact, not the configuration's digests (the standard
    # library's json does, tether.core.canonical); the value types a construction builds
    # are records (tether.core.records), whose methods are not compiled per class, so
    # neither dataclasses nor the inspect it imports is loaded; uuid (and platform) wait
    # for the first span.
    "orjson",
    "dataclasses",
    "inspect",
    "uuid",
    "platform",
)


def _run(code: str, cwd: Path | None = None) -> str:
    """What ``code`` printed, run in a fresh interpreter (it must succeed)."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=cwd
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _loaded_modules(code: str, names: tuple[str, ...], cwd: Path | None = None) -> list[str]:
    """Which of ``names`` (modules, or packages with any of their modules) ``code`` left in
    ``sys.modules`` of a fresh interpreter."""
    probe = (
        f"{code}\n"
        "import sys, json\n"
        f"names = {names!r}\n"
        "print(json.dumps(sorted({n for n in names for m in sys.modules "
        "if m == n or m.startswith(n + '.')})))\n"
    )
    loaded: list[str] = json.loads(_run(probe, cwd).strip().splitlines()[-1])
    return loaded


def _loaded(code: str, cwd: Path | None = None) -> list[str]:
    """The top-level packages of ``NOT_AT_IMPORT`` that ``code`` left in ``sys.modules``."""
    probe = (
        f"{code}\n"
        "import sys, json\n"
        "loaded = {m.split('.')[0] for m in sys.modules}\n"
        f"print(json.dumps(sorted(loaded & {set(NOT_AT_IMPORT)!r})))\n"
    )
    loaded: list[str] = json.loads(_run(probe, cwd).strip().splitlines()[-1])
    return loaded


def test_import_tether_loads_no_sdk_cli_or_database() -> None:
    assert _loaded("import tether") == []


def test_the_cli_loads_no_sdk_mcp_or_database() -> None:
    # Every `tether` command imports the whole CLI (typer registers each command): the
    # command modules import their heavy machinery (MCP's asyncio, the SDKs) where used.
    loaded = _loaded("import tether._cli")
    assert sorted(set(loaded) & set(NOT_AT_RESUME) - {"rich", "typer"}) == []


def test_the_probe_sees_a_loaded_package() -> None:
    # The check above cannot pass vacuously: the same probe reports what is loaded.
    assert _loaded("import tether, rich, jsonschema") == ["jsonschema", "rich"]


def test_building_an_agent_and_resuming_load_no_optional_machinery(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps({"model": "scripted/startup", "responses": [{"content": "hello"}]}),
        encoding="utf-8",
    )
    model = f"scripted:{script}"
    run = (
        "import tether\n"
        f"with tether.Agent({model!r}, workspace={str(tmp_path)!r}) as agent:\n"
        "    result = agent.run('hi')\n"
        "assert result.status.value == 'completed', result\n"
        "print(result.session_id)\n"
    )
    session = _run(run, tmp_path).strip()
    # A new process builds the agent and resumes the session (nothing is unfinished).
    resume = (
        "import tether\n"
        f"with tether.Agent({model!r}, workspace={str(tmp_path)!r}) as agent:\n"
        f"    assert agent.resume({session!r}).status.value == 'idle'\n"
    )
    assert sorted(set(_loaded(resume, cwd=tmp_path)) & set(NOT_AT_RESUME)) == []


def test_an_openai_compatible_agent_loads_its_sdk_on_the_first_request(tmp_path: Path) -> None:
    # Building the agent (and resuming a finished session, inspecting one) never sends a
    # request: the openai SDK, most of a second to import, waits for the first one.
    build = (
        "import tether\n"
        f"agent = tether.Agent('some/model', workspace={str(tmp_path)!r}, "
        "base_url='http://127.0.0.1:9/v1', api_key='sk-test-startup-000000')\n"
        "agent.close()\n"
    )
    assert "openai" not in _loaded(build, cwd=tmp_path)


def test_building_an_agent_loads_nothing_a_call_needs(tmp_path: Path) -> None:
    build = (
        "import tether\n"
        f"agent = tether.Agent('some/model', workspace={str(tmp_path)!r}, "
        "base_url='http://127.0.0.1:9/v1', api_key='sk-test-startup-000000')\n"
        "assert agent.registry.get('bash') is not None  # the built-ins, bash included\n"
    )
    assert _loaded_modules(build, NOT_AT_CONSTRUCTION, cwd=tmp_path) == []
    # The probe sees what a call loads: the same agent's first call loads the executor.
    call = build + (
        "try:\n    agent.resume('no-such-session')\nexcept tether.TetherError:\n    pass\n"
    )
    loaded = _loaded_modules(call, NOT_AT_CONSTRUCTION, cwd=tmp_path)
    assert {
        "tether._runtime.executor",
        "tether._runtime.events",
        "tether._stores.file",
        "orjson",
    } <= set(loaded)


def test_a_tether_toml_and_a_scripted_model_load_what_they_need(tmp_path: Path) -> None:
    # The deferred imports are still there when asked for: a tether.toml is parsed with
    # tomllib, a scripted: model is the scripted adapter, a session opened is the file store.
    (tmp_path / "tether.toml").write_text("[model]\ntimeout = 30\n", encoding="utf-8")
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps({"model": "scripted/startup", "responses": [{"content": "hi"}]}), "utf-8"
    )
    build = (
        f"import tether\nagent = tether.Agent('scripted:{script}', workspace={str(tmp_path)!r})\n"
    )
    names = ("tomllib", "tether._models.scripted", "tether._stores.file", "subprocess")
    assert _loaded_modules(build, names, cwd=tmp_path) == ["tether._models.scripted", "tomllib"]


def test_an_anthropic_agent_loads_its_sdk_on_the_first_request(tmp_path: Path) -> None:
    build = (
        "import tether\n"
        f"agent = tether.Agent('anthropic:claude-test', workspace={str(tmp_path)!r}, "
        "api_key='sk-ant-test-startup-000000')\n"
        "assert agent.model.provider == 'anthropic'\n"
        "agent.close()\n"
    )
    assert _loaded(build, cwd=tmp_path) == []


def test_a_model_string_with_a_colon_loads_difflib_only_when_it_may_be_misspelt(
    tmp_path: Path,
) -> None:
    # openai:… (or llama3:8b) is close to no prefix of tether's: the close-match search is
    # not imported; a misspelt prefix is still refused with its suggestion, by difflib.
    build = (
        "import tether\n"
        f"agent = tether.Agent('openai:gpt-4o-mini', workspace={str(tmp_path)!r}, "
        "base_url='http://127.0.0.1:9/v1', api_key='sk-test-startup-000000')\n"
    )
    assert _loaded_modules(build, ("difflib",), cwd=tmp_path) == []
    misspelt = (
        "import tether\n"
        "try:\n"
        f"    tether.Agent('scriptd:x.json', workspace={str(tmp_path)!r})\n"
        "except tether.TetherError as exc:\n"
        "    assert \"did you mean 'scripted:'\" in str(exc), exc\n"
    )
    assert _loaded_modules(misspelt, ("difflib",), cwd=tmp_path) == ["difflib"]


# Agent.prepare: what the first call would load, loaded at once (the worker does it before
# its first claim, so that its sessions' first steps do not all wait on one import).
PREPARED = ("tether._runtime.executor", "jsonschema")


@pytest.mark.parametrize(
    ("model", "sdk", "path"),
    [("some/model", "openai", "/v1"), ("anthropic:claude-test", "anthropic", "")],
)
def test_prepare_loads_what_the_first_call_needs_and_sends_nothing(
    tmp_path: Path, model: str, sdk: str, path: str
) -> None:
    names = (*PREPARED, sdk, "tether._models.chat_stream")
    build = (
        "import socket, tether\n"
        "listener = socket.create_server(('127.0.0.1', 0))\n"
        "port = listener.getsockname()[1]\n"
        f"agent = tether.Agent({model!r}, workspace={str(tmp_path)!r}, "
        f"base_url=f'http://127.0.0.1:{{port}}{path}', api_key='sk-test-startup-000000')\n"
    )
    assert _loaded_modules(build, names, cwd=tmp_path) == []
    prepared = build + (
        "agent.prepare()\n"
        "listener.settimeout(0.2)\n"
        "try:\n    listener.accept()\nexcept TimeoutError:\n    pass\n"
        "else:\n    raise SystemExit('prepare() connected to the model server')\n"
        "agent.close()\n"
    )
    loaded = _loaded_modules(prepared, names, cwd=tmp_path)
    expected = {*PREPARED, sdk} | ({"tether._models.chat_stream"} if sdk == "openai" else set())
    assert set(loaded) == expected


def test_a_worker_prepares_its_first_agent_before_it_claims(tmp_path: Path) -> None:
    probe = (
        "import json, sys\n"
        "import tether\n"
        "from tether._runtime.worker import Worker\n"
        "from tether._stores.memory import MemorySessions\n"
        "seen = []\n"
        "class Queue(MemorySessions):\n"
        "    def claim(self, environment):\n"
        f"        seen.append(sorted(n for n in {(*PREPARED, 'openai')!r} if n in sys.modules))\n"
        "        return None\n"
        "    def waiting(self, environment):\n"
        "        return 0\n"
        "store = Queue()\n"
        "def make_agent():\n"
        f"    return tether.Agent('some/model', workspace={str(tmp_path)!r}, "
        "base_url='http://127.0.0.1:9/v1', api_key='sk-test-startup-000000', "
        "session_store=store, read_agents_md=False)\n"
        "Worker(make_agent, concurrency=4, until_empty=True, log=lambda line: None).run()\n"
        "print(json.dumps(seen))\n"
    )
    assert json.loads(_run(probe, tmp_path)) == [sorted((*PREPARED, "openai"))]
