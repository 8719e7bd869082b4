"""The MCP manager: one event loop in a background thread speaks to every MCP server.

The official ``mcp`` SDK is async; tether's executor is not. :class:`McpManager` runs one
asyncio loop in a daemon thread and gives the executor blocking calls with time bounds:

* :meth:`McpManager.tools` starts a server (lazily: the first agent that needs it) and
  lists its tools; the connection is kept for the life of the process and reused by every
  agent and run of it that names the same server with the same settings;
* :meth:`McpManager.call` sends one ``tools/call`` with the call's operation id in the
  request's ``_meta`` (and, over HTTP, in an ``Idempotency-Key`` header) and waits at most
  the timeout, polling the call's cancel event. A server that exits, hangs past the timeout
  or answers malformed JSON-RPC raises :class:`McpCallFailed` (the outcome is unknown: the
  caller decides what that means) and is stopped; the next call starts it again;
* :meth:`McpManager.stop_all` stops every server; it runs at interpreter exit (also after
  Ctrl+C). A stdio server's stdin is closed first, then SIGTERM, then SIGKILL (the SDK's
  shutdown). A stdio server runs in a process group of its own, registered with tether's
  reaper (:mod:`tether._procs`): if tether itself is killed, the reaper kills the group.

A stdio server's stderr goes to ``.tether/mcp/NAME.log`` in the workspace, the SDK's own
log records to ``.tether/mcp/client.log``; never to the terminal. ``${NAME}`` in ``env``
and ``headers`` values is replaced by the variable of tether's environment when the server
starts; the value is registered as a secret.

A server that does not start is one line (:class:`~tether.errors.ConfigurationError`) that
says why in the user's terms: a command that does not exist or cannot be run is named as
such; a server that exits at start gives its exit status, the last line of its stderr
(masked) and the path of its log, since the reason is usually there. The exit status
needs the SDK's process object, which ``stdio_client`` keeps to itself: its spawn function
is wrapped once (:func:`_watch_spawns`) to hand the process to the connection that started
it; an SDK without that function only loses the exit status.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import contextvars
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

from tether._credentials import Masker, register_secret
from tether._mcp.config import McpServerConfig
from tether._mcp.trace import TRACE_CONTEXT
from tether._procs import guard_group, release_group
from tether._tools.workspace import TETHER_DIR
from tether.errors import ConfigurationError

__all__ = [
    "IDEMPOTENCY_HEADER",
    "LOG_DIR",
    "OPERATION_META_KEY",
    "TRACE_CONTEXT",
    "Answer",
    "McpCallFailed",
    "McpManager",
    "ServerTool",
    "log_path",
    "manager",
]

OPERATION_META_KEY: Final = "dev.tether/operationId"
"""The ``_meta`` member of every ``tools/call`` request that carries the operation id."""
IDEMPOTENCY_HEADER: Final = "Idempotency-Key"
"""The HTTP header that carries the operation id of a ``tools/call`` over HTTP."""
LOG_DIR: Final = "mcp"
"""Under ``.tether/``: one ``NAME.log`` per stdio server (its stderr)."""
STOP_TIMEOUT: Final = 6.0
"""Seconds a server gets to stop (the SDK: 2 s after stdin closes, 2 s after SIGTERM)."""
_POLL: Final = 0.05


class McpCallFailed(Exception):
    """A call got no answer: the server exited, hung past the timeout, answered garbage or
    could not be started. Whether the tool's effect happened is unknown, unless ``sent`` is
    false (the request never left tether)."""

    def __init__(self, message: str, *, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


class _StartFailed(McpCallFailed):
    """A server that did not start: the short reason, and the ``report`` for the user (how
    it exited, the end of its log and where the log is)."""

    def __init__(self, message: str, report: str) -> None:
        super().__init__(message, sent=False)
        self.report = report


@dataclass(frozen=True)
class ServerTool:
    """One tool a server advertises (``tools/list``)."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    hints: Mapping[str, bool] = field(default_factory=dict)
    """``readOnlyHint``, ``idempotentHint``, … as the server says: shown, never trusted."""


@dataclass(frozen=True)
class Answer:
    """A server's answer to ``tools/call``."""

    blocks: tuple[Mapping[str, Any], ...]
    structured: Any
    is_error: bool


def log_path(workspace: Path, server: str) -> Path:
    """Where the stderr of stdio server ``server`` goes."""
    return workspace / TETHER_DIR / LOG_DIR / f"{server}.log"


_REFERENCE: Final = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand(server: str, setting: str, value: str) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        found = os.environ.get(name)
        if found is None:
            raise ConfigurationError(
                f"MCP server {server!r}: {setting} refers to ${{{name}}}, which is not set"
            )
        register_secret(found)
        return found

    return _REFERENCE.sub(one, value)


_CLOSED: Final = "the server closed the connection"
"""A server that exited (or closed its stdout) before answering."""


def _innermost(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    """One line for an exception, looking inside exception groups."""
    exc = _innermost(exc)
    text = " ".join(str(exc).split())
    if len(text) > 200:
        text = text[:199] + "…"
    name = type(exc).__name__
    if isinstance(exc, TimeoutError) and not text:
        return "timed out"
    if name == "MCPError" and text == "Connection closed":
        return _CLOSED
    return f"{name}: {text}" if text else name


_SPAWN_ERRORS: Final[tuple[tuple[type[OSError], str, str], ...]] = (
    # (error, what it concerns, the words): the first row whose error and file match.
    (FileNotFoundError, "command", "command {file!r} not found ({where})"),
    (PermissionError, "command", "command {file!r} cannot be run (permission denied)"),
    (FileNotFoundError, "cwd", "its working directory {file} does not exist"),
    (NotADirectoryError, "cwd", "its working directory {file} is not a directory"),
)
"""How a stdio server whose process could not be created is reported (instead of a raw
``FileNotFoundError: [Errno 2] …``). Which file the error names tells the command from
the working directory."""
_OUR_SIGNALS: Final = frozenset({-signal.SIGTERM, -signal.SIGKILL})
"""Exit statuses of the SDK's own stop (SIGTERM, then SIGKILL): not the server's doing."""
_LOG_TAIL: Final = 65_536
_LOG_LINE: Final = 160


def _killed(number: int) -> str:
    try:
        return f"it was killed by {signal.Signals(number).name}"
    except ValueError:
        return f"it was killed by signal {number}"


def _spawn_failure(config: McpServerConfig, cwd: Path, exc: BaseException) -> str | None:
    """The words for a process that could not be created, or ``None`` for other errors."""
    exc = _innermost(exc)
    if config.command is None or not isinstance(exc, OSError):
        return None
    files = {"command": config.command, "cwd": str(cwd)}
    for error, concerns, words in _SPAWN_ERRORS:
        if isinstance(exc, error) and exc.filename == files[concerns]:
            where = "no such file" if os.sep in config.command else "not on PATH"
            return words.format(file=files[concerns], where=where)
    return None


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is below it (shorter lines)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except (ValueError, OSError):
        return str(path)


def _last_line(path: Path, offset: int) -> str | None:
    """The last non-blank line written to ``path`` after ``offset``, masked and shortened."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - _LOG_TAIL))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    masker = Masker.for_process()
    for line in reversed(tail.splitlines()):
        text = " ".join(masker.text(line).split())
        if text:
            return text if len(text) <= _LOG_LINE else text[: _LOG_LINE - 1] + "…"
    return None


_SPAWNED: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "tether_mcp_spawned", default=None
)
"""Where the SDK's spawn wrapper puts the process it created (set by the serving task)."""


def _watch_spawns() -> None:
    """Wrap the SDK's stdio spawn function (once) to hand each process to :data:`_SPAWNED`.

    Called on the manager's loop thread only, so the check-and-set needs no lock.
    """
    from mcp.client import stdio

    spawn = getattr(stdio, "_create_platform_compatible_process", None)
    if spawn is None or getattr(spawn, "_tether", False):
        return

    async def spawned(*args: Any, **kwargs: Any) -> Any:
        process = await spawn(*args, **kwargs)
        sink = _SPAWNED.get()
        if sink is not None:
            sink.append(process)
        return process

    spawned._tether = True  # type: ignore[attr-defined]
    stdio._create_platform_compatible_process = spawned


class _Connection:
    """One running server: a task on the manager's loop holds the SDK's context open."""

    def __init__(self, config: McpServerConfig, workspace: Path) -> None:
        self.config = config
        self.workspace = workspace
        # Expanded here, in the caller's thread: a missing variable is a start-up error.
        self.env = {k: _expand(config.name, f"env {k}", v) for k, v in config.env}
        self.headers = {k: _expand(config.name, f"headers {k}", v) for k, v in config.headers}
        self.session: Any = None
        self.failure: str | None = None
        self.processes: list[Any] = []  # the stdio server's process, once spawned
        self.log_offset = 0  # where this start's lines begin in the server's log
        self.exit_status: int | None = None
        self.stop: asyncio.Event | None = None
        self.closed: asyncio.Event | None = None
        self.done: concurrent.futures.Future[None] | None = None

    async def serve(self, ready: concurrent.futures.Future[list[ServerTool]]) -> None:
        from mcp import ClientSession

        self.stop = asyncio.Event()
        self.closed = asyncio.Event()
        try:
            async with AsyncExitStack() as stack:
                streams = await self._open(stack)
                session = await stack.enter_async_context(
                    ClientSession(streams[0], streams[1], message_handler=self._on_message)
                )
                await session.initialize()
                tools = await _list_tools(session)
                self.session = session
                if not ready.done():
                    ready.set_result(tools)
                await self.stop.wait()
        except BaseException as exc:  # reported to the waiting caller, never lost
            if self.failure is None:
                self.failure = _spawn_failure(self.config, self.cwd, exc) or _describe(exc)
            if self.processes:  # the SDK has stopped it: its status is known
                self.exit_status = getattr(self.processes[0], "returncode", None)
            if not ready.done():
                ready.set_exception(McpCallFailed(self.failure))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self.session = None
            self.closed.set()

    @property
    def cwd(self) -> Path:
        """A stdio server's working directory."""
        return self.workspace / self.config.cwd if self.config.cwd else self.workspace

    def start_report(self) -> str:
        """Why the server did not start, for the user: the failure and, for a stdio server
        that ran, its exit status, the last line of its stderr and its log's path."""
        why = self.failure or "the server did not start"
        if self.config.command is None or not self.processes:
            return why
        status = self.exit_status
        if why == _CLOSED and status is not None and status not in _OUR_SIGNALS:
            why = f"it exited with status {status}" if status >= 0 else _killed(-status)
        log = log_path(self.workspace, self.config.name)
        last = _last_line(log, self.log_offset)
        said = f'its stderr ends "{last}"' if last else "nothing on its stderr"
        return f"{why}; {said} (see {_shown(log)})"

    async def _open(self, stack: AsyncExitStack) -> tuple[Any, Any]:
        config = self.config
        if config.command is not None:
            from mcp import StdioServerParameters, stdio_client

            env = self.env
            cwd = self.cwd
            log = log_path(self.workspace, config.name)
            log.parent.mkdir(parents=True, exist_ok=True)
            errlog: TextIO = stack.enter_context(open(log, "a", encoding="utf-8"))
            errlog.write(f"--- tether starts {config.where()} at {time.ctime()}\n")
            errlog.flush()
            self.log_offset = errlog.tell()
            _watch_spawns()
            _SPAWNED.set(self.processes)
            launch = config.launch or (config.command, *config.args)
            parameters = StdioServerParameters(
                command=launch[0], args=list(launch[1:]), env=env, cwd=cwd
            )
            # The SDK starts the server in a session of its own: that group goes to tether's
            # reaper, which kills it if tether dies; released once the SDK has stopped it.
            guarded: list[int] = []
            stack.callback(_release_all, guarded)
            before = _child_groups()
            streams = await stack.enter_async_context(stdio_client(parameters, errlog=errlog))
            guarded.extend(g for g in _child_groups() - before if guard_group(g))
            return streams[0], streams[1]
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        headers = self.headers
        client = await stack.enter_async_context(
            httpx2.AsyncClient(
                headers=headers,
                timeout=httpx2.Timeout(30.0, read=max(config.timeout, 30.0) + 5.0),
                event_hooks={"request": [_idempotency_header]},
            )
        )
        streams = await stack.enter_async_context(
            streamable_http_client(str(config.url), http_client=client)
        )
        return streams[0], streams[1]

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            # Malformed JSON-RPC: nothing the server says can be trusted any more.
            self.failure = (
                f"the server sent a malformed JSON-RPC message ({type(message).__name__})"
            )
            if self.stop is not None:
                self.stop.set()

    async def call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        operation_id: str,
        timeout: float,
        trace: Mapping[str, str] | None = None,
    ) -> Answer:
        session = self.session
        if session is None or self.closed is None or self.closed.is_set():
            raise McpCallFailed(self.failure or "the server is not running")
        request = asyncio.ensure_future(
            session.call_tool(
                tool,
                dict(arguments),
                read_timeout_seconds=timeout,
                meta={**(trace or {}), OPERATION_META_KEY: operation_id},
            )
        )
        closed = asyncio.ensure_future(self.closed.wait())
        try:
            done, _ = await asyncio.wait(
                {request, closed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            closed.cancel()
        if request not in done:
            request.cancel()
            if closed in done:
                raise McpCallFailed(self.failure or "the server closed the connection")
            raise McpCallFailed(f"no answer within {timeout:g} s")
        try:
            result = request.result()
        except Exception as exc:
            from mcp import MCPError
            from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

            if isinstance(exc, MCPError) and exc.code not in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
                # A JSON-RPC error response: the server answered, and refused the call.
                return Answer(
                    ({"type": "text", "text": f"MCP error {exc.code}: {exc.message}"},),
                    None,
                    True,
                )
            await asyncio.sleep(0)  # let a malformed message's report land first
            if self.failure:
                raise McpCallFailed(self.failure) from None
            raise McpCallFailed(_describe(exc)) from None
        blocks = tuple(block.model_dump(mode="json", by_alias=True) for block in result.content)
        return Answer(blocks, result.structured_content, bool(result.is_error))


def _release_all(groups: list[int]) -> None:
    for pgid in groups:
        release_group(pgid)


def _child_groups() -> set[int]:
    """The process groups led by children of this process (``/proc``; empty elsewhere)."""
    me = os.getpid()
    groups: set[int] = set()
    try:
        names = os.listdir("/proc")
    except OSError:
        return groups
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[1] == str(me) and fields[2] == name:
            groups.add(int(name))
    return groups


async def _idempotency_header(request: Any) -> None:
    """Copy a ``tools/call``'s operation id from its ``_meta`` into a request header."""
    if request.method != "POST":
        return
    try:
        import orjson

        body = orjson.loads(request.content)
    except Exception:
        return
    if isinstance(body, dict) and body.get("method") == "tools/call":
        meta = (body.get("params") or {}).get("_meta") or {}
        operation = meta.get(OPERATION_META_KEY) if isinstance(meta, dict) else None
        if isinstance(operation, str):
            request.headers[IDEMPOTENCY_HEADER] = operation


async def _list_tools(session: Any) -> list[ServerTool]:
    from mcp_types import PaginatedRequestParams

    tools: list[ServerTool] = []
    cursor: str | None = None
    for _ in range(100):  # a server that pages forever is cut off
        params = PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        for tool in page.tools:
            hints: dict[str, bool] = {}
            if tool.annotations is not None:
                dumped = tool.annotations.model_dump(by_alias=True, exclude_none=True)
                hints = {k: v for k, v in dumped.items() if isinstance(v, bool)}
            tools.append(
                ServerTool(
                    name=tool.name,
                    description=tool.description or "",
                    input_schema=dict(tool.input_schema),
                    hints=hints,
                )
            )
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


CLIENT_LOG: Final = "client.log"
"""Under ``.tether/mcp/``: what the SDK's client logs (malformed messages, …), never the
terminal."""


def _route_sdk_logging(workspace: Path) -> None:
    """Send the SDK's log records to ``.tether/mcp/client.log`` (once per process)."""
    sdk = logging.getLogger("mcp")
    if any(getattr(h, "_tether", False) for h in sdk.handlers):
        return
    path = workspace / TETHER_DIR / LOG_DIR / CLIENT_LOG
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.FileHandler(path, encoding="utf-8", delay=True)
    except OSError:
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    handler._tether = True  # type: ignore[attr-defined]
    sdk.addHandler(handler)
    sdk.propagate = False


class McpManager:
    """The process's MCP connections (see the module docstring). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._connections: dict[tuple[McpServerConfig, Path], _Connection] = {}
        self._listings: dict[tuple[McpServerConfig, Path], list[ServerTool]] = {}
        self._stopping: set[_Connection] = set()

    # ------------------------------------------------------------------ the loop

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="tether-mcp", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
                atexit.register(self.stop_all)
            return self._loop

    # ------------------------------------------------------------------ servers

    def tools(self, config: McpServerConfig, workspace: Path) -> list[ServerTool]:
        """The tools of ``config``'s server, starting it if it is not running.

        A server that cannot be started, initialized and listed within its
        ``start_timeout`` raises :class:`~tether.errors.ConfigurationError` naming it.
        Several threads may start different servers at once.
        """
        key = (config, workspace)
        with self._lock:
            listing = self._listings.get(key)
            if listing is not None and key in self._connections:
                return list(listing)
        try:
            connection, tools = self._start(config, workspace)
        except McpCallFailed as exc:
            why = exc.report if isinstance(exc, _StartFailed) else str(exc)
            raise ConfigurationError(
                f"MCP server {config.name!r} ({config.where()}) did not start: {why}"
            ) from None
        with self._lock:
            if key in self._connections:  # another thread won the race: keep its server
                self._stop(connection, wait=False)
                return list(self._listings[key])
            self._connections[key] = connection
            self._listings.setdefault(key, tools)
            return list(tools)

    def _start(
        self, config: McpServerConfig, workspace: Path
    ) -> tuple[_Connection, list[ServerTool]]:
        _route_sdk_logging(workspace)
        loop = self._ensure_loop()
        connection = _Connection(config, workspace)
        ready: concurrent.futures.Future[list[ServerTool]] = concurrent.futures.Future()
        connection.done = asyncio.run_coroutine_threadsafe(connection.serve(ready), loop)
        try:
            tools = ready.result(config.start_timeout)
        except concurrent.futures.TimeoutError:
            connection.failure = f"no answer within {config.start_timeout:g} s"
            self._stop(connection)
            raise _StartFailed(connection.failure, connection.start_report()) from None
        except McpCallFailed:
            self._stop(connection)
            why = connection.failure or "the server did not start"
            raise _StartFailed(why, connection.start_report()) from None
        return connection, tools

    def _connection(self, config: McpServerConfig, workspace: Path) -> _Connection:
        """The running connection, restarted if a failure stopped it."""
        key = (config, workspace)
        with self._lock:
            connection = self._connections.get(key)
            if connection is not None and connection.session is not None:
                return connection
            if connection is not None:
                self._connections.pop(key, None)
                self._stop(connection)
            try:
                connection, tools = self._start(config, workspace)
            except (McpCallFailed, ConfigurationError) as exc:
                raise McpCallFailed(f"the server did not start again: {exc}") from None
            before = self._listings.get(key)
            if before is not None and before != tools:
                self._stop(connection, wait=False)
                raise McpCallFailed(
                    "the server was restarted and now advertises different tools; "
                    "restart tether to use them"
                )
            self._connections[key] = connection
            return connection

    def call(
        self,
        config: McpServerConfig,
        workspace: Path,
        tool: str,
        arguments: Mapping[str, Any],
        operation_id: str,
        *,
        timeout: float,
        cancel: threading.Event | None = None,
    ) -> Answer:
        """Call ``tool`` and wait for its answer at most ``timeout`` seconds.

        Raises :class:`McpCallFailed` when no answer came (the outcome is unknown); the
        server is then stopped, to be started again by the next call.
        """
        if cancel is not None and cancel.is_set():
            raise McpCallFailed("the call was cancelled before it was sent", sent=False)
        try:
            connection = self._connection(config, workspace)
        except McpCallFailed as exc:
            raise McpCallFailed(str(exc), sent=False) from None
        loop = self._ensure_loop()
        context = TRACE_CONTEXT.get()  # read here: the loop runs in its own thread
        trace = dict(context()) if context is not None else {}
        future = asyncio.run_coroutine_threadsafe(
            connection.call(tool, arguments, operation_id, timeout, trace), loop
        )
        deadline = time.monotonic() + timeout + 2.0
        while True:
            try:
                return future.result(_POLL)
            except concurrent.futures.TimeoutError:
                pass
            except McpCallFailed:
                self._discard(connection)
                raise
            except concurrent.futures.CancelledError:
                self._discard(connection)
                raise McpCallFailed("the call was cancelled") from None
            if cancel is not None and cancel.is_set():
                future.cancel()
                self._discard(connection)
                raise McpCallFailed("the call was cancelled")
            if time.monotonic() > deadline:
                future.cancel()
                self._discard(connection)
                raise McpCallFailed(f"no answer within {timeout:g} s")

    def _discard(self, connection: _Connection) -> None:
        """Stop a connection that failed a call (a hung or dead server is not reused)."""
        with self._lock:
            key = (connection.config, connection.workspace)
            if self._connections.get(key) is connection:
                del self._connections[key]
        self._stop(connection, wait=False)

    def _stop(self, connection: _Connection, wait: bool = True) -> None:
        loop = self._loop
        if loop is None or connection.done is None:
            return
        stop = connection.stop
        if stop is not None:
            loop.call_soon_threadsafe(stop.set)
        else:
            connection.done.cancel()
        if wait:
            with contextlib.suppress(Exception):
                connection.done.result(STOP_TIMEOUT)
        elif not connection.done.done():
            with self._lock:
                self._stopping.add(connection)
            connection.done.add_done_callback(lambda _: self._stopping.discard(connection))

    def running(self) -> list[str]:
        """The names of the servers with a live connection."""
        with self._lock:
            return [c.config.name for c in self._connections.values() if c.session is not None]

    def stop_all(self) -> None:
        """Stop every server (at exit, after Ctrl+C, or when a test is done)."""
        with self._lock:
            connections = list(self._connections.values())
            stopping = list(self._stopping)
            self._connections.clear()
            self._listings.clear()
        for connection in connections:
            self._stop(connection, wait=False)
        deadline = time.monotonic() + STOP_TIMEOUT
        for connection in [*connections, *stopping]:
            if connection.done is not None:
                with contextlib.suppress(Exception):
                    connection.done.result(max(0.0, deadline - time.monotonic()))


_MANAGER: McpManager | None = None
_MANAGER_LOCK = threading.Lock()


def _forget_after_fork() -> None:
    # A forked child has the parent's manager but not its loop thread: start afresh.
    global _MANAGER
    _MANAGER = None


os.register_at_fork(after_in_child=_forget_after_fork)


def manager() -> McpManager:
    """This process's manager (created on first use)."""
    global _MANAGER
    with _MANAGER_LOCK:
        if _MANAGER is None:
            _MANAGER = McpManager()
        return _MANAGER
