"""An MCP server written with the SDK's server API (``MCPServer``, formerly FastMCP), for
the MCP tests. Started as a real process::

    python tests/mcp_server.py [stdio | http PORT] [--bad-schema] [--extra-tool]
                               [--slow-start SECONDS]

Its files live in the directory ``NOTES_DIR`` (default: the working directory):

* ``append`` adds ``line`` to ``notes.txt`` with no deduplication at all (a naive server)
  and records ``<operation id> <line>`` in ``calls.txt``;
* ``append_once`` adds a line at most once per operation id (the ``_meta`` operation id),
  recorded in ``ops.json``; ``find_append`` is its lookup;
* ``count_lines`` is read-only; ``whoami`` returns the operation id (and, over HTTP, the
  ``Idempotency-Key`` header) of its own request; ``sleep``, ``die`` and ``huge`` misbehave.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations
from pydantic import BaseModel

META_KEY = "dev.tether/operationId"
NOTES = Path(os.environ.get("NOTES_DIR", "."))

app = MCPServer("tether-test-notes")


def _operation(ctx: Context) -> str:
    meta = ctx.request_context.meta or {}
    return str(meta.get(META_KEY, "")) if isinstance(meta, dict) else ""


def _ops() -> dict[str, str]:
    path = NOTES / "ops.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _append_line(line: str) -> None:
    with open(NOTES / "notes.txt", "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


@app.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
def append(line: str, ctx: Context) -> str:
    """Append one line to notes.txt."""
    _append_line(line)
    with open(NOTES / "calls.txt", "a", encoding="utf-8") as f:
        f.write(f"{_operation(ctx)} {line}\n")
    return f"appended {line!r}"


@app.tool(annotations=ToolAnnotations(idempotent_hint=True))
def append_once(line: str, ctx: Context) -> str:
    """Append one line to notes.txt, at most once per operation id."""
    operation = _operation(ctx)
    ops = _ops()
    if operation and operation in ops:
        return ops[operation]
    _append_line(line)
    result = f"appended {line!r} once"
    ops[operation] = result
    tmp = NOTES / "ops.json.tmp"
    tmp.write_text(json.dumps(ops))
    os.replace(tmp, NOTES / "ops.json")
    return result


@app.tool(annotations=ToolAnnotations(read_only_hint=True))
def find_append(operation_id: str) -> str:
    """Whether append_once committed an operation id."""
    ops = _ops()
    if operation_id in ops:
        return json.dumps({"status": "committed", "result": ops[operation_id]})
    return json.dumps({"status": "notFound"})


@app.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
def count_lines() -> str:
    """Count the lines of notes.txt."""
    with open(NOTES / "reads.txt", "a", encoding="utf-8") as f:
        f.write("read\n")
    path = NOTES / "notes.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return f"{len(lines)} lines"


@app.tool()
def whoami(ctx: Context) -> str:
    """Return the operation id of this call (and the Idempotency-Key header over HTTP)."""
    request: Any = ctx.request_context.request
    header = request.headers.get("idempotency-key") if request is not None else None
    token = os.environ.get("NOTES_TOKEN")
    return json.dumps(
        {"operation": _operation(ctx), "header": header, "pid": os.getpid(), "token": token}
    )


@app.tool()
def sleep(seconds: float) -> str:
    """Sleep (hangs past any short timeout)."""
    time.sleep(seconds)
    return "slept"


@app.tool()
def die() -> str:
    """Exit the server in the middle of the call."""
    os._exit(3)


@app.tool()
def huge(size: int) -> str:
    """Return a result of size characters."""
    return "".join(chr(ord("a") + i % 26) for i in range(size))


@app.tool()
def fail() -> str:
    """Report a tool error."""
    raise ValueError("the notes are locked")


class Point(BaseModel):
    x: int
    y: int


def main(argv: list[str]) -> None:
    if "--slow-start" in argv:
        time.sleep(float(argv[argv.index("--slow-start") + 1]))
    if "--extra-tool" in argv:

        @app.tool()
        def extra() -> str:
            """A tool that only some versions of the server have."""
            return "extra"

    if "--bad-schema" in argv:

        @app.tool()
        def plot(point: Point) -> str:
            """A tool whose schema uses $ref and $defs."""
            return f"{point.x},{point.y}"

    print(f"mcp test server starting: {argv}", file=sys.stderr, flush=True)
    if argv and argv[0] == "http":
        app.run("streamable-http", host="127.0.0.1", port=int(argv[1]))
    else:
        app.run()


if __name__ == "__main__":
    main(sys.argv[1:])
