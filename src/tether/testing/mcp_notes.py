"""A small MCP server for the crash lab and the docs' worked example (``docs/mcp.md``).

Run it with ``python -m tether.testing.mcp_notes`` (stdio; needs ``tether[mcp]``). It keeps
``notes.txt`` in its working directory (tether starts a stdio server in the workspace):

* ``append`` adds a line — a naive server: it does the same thing again when asked again;
* ``append_once`` adds a line at most once per operation id (the id tether puts in the
  request's ``_meta``), remembered in ``notes-ops.json``; ``find_append`` answers whether an
  operation id committed, in the form tether's ``lookup`` expects;
* ``count_lines`` only reads.

Every line really added is also recorded as ``<operation id>`` in ``mcp-effects.txt``,
which is how the crash lab counts effects. The ``traceparent`` a traced call carries in its
``_meta`` is recorded in ``mcp-traceparents.txt``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Final

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

META_KEY: Final = "dev.tether/operationId"
NOTES: Final = Path("notes.txt")
OPS: Final = Path("notes-ops.json")
EFFECTS: Final = Path("mcp-effects.txt")
TRACES: Final = Path("mcp-traceparents.txt")

app = MCPServer("tether-notes")


def _operation(ctx: Context) -> str:
    meta = ctx.request_context.meta or {}
    extra: dict[str, object] = dict(meta) if isinstance(meta, dict) else {}
    if extra.get("traceparent"):
        # The W3C trace context tether sends with a traced call: recorded for the tests.
        with open(TRACES, "a", encoding="utf-8") as f:
            f.write(str(extra["traceparent"]) + "\n")
    return str(meta.get(META_KEY, "")) if isinstance(meta, dict) else ""


def _append(line: str, operation: str) -> None:
    for path, text in ((NOTES, line), (EFFECTS, operation)):
        with open(path, "a", encoding="utf-8") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())


def _ops() -> dict[str, str]:
    loaded = json.loads(OPS.read_text()) if OPS.exists() else {}
    return {str(k): str(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}


@app.tool(annotations=ToolAnnotations(read_only_hint=False))
def append(line: str, ctx: Context) -> str:
    """Append one line to notes.txt."""
    _append(line, _operation(ctx))
    return f"appended {line!r}"


@app.tool(annotations=ToolAnnotations(idempotent_hint=True))
def append_once(line: str, ctx: Context) -> str:
    """Append one line to notes.txt, at most once per operation id."""
    operation = _operation(ctx)
    ops = _ops()
    if operation and operation in ops:
        return ops[operation]
    _append(line, operation)
    result = f"appended {line!r} once"
    ops[operation] = result
    tmp = OPS.with_suffix(".tmp")
    tmp.write_text(json.dumps(ops))
    os.replace(tmp, OPS)
    return result


@app.tool(annotations=ToolAnnotations(read_only_hint=True))
def find_append(operation_id: str) -> str:
    """Whether append_once committed an operation id (tether's lookup answer)."""
    ops = _ops()
    if operation_id in ops:
        return json.dumps({"status": "committed", "result": ops[operation_id]})
    return json.dumps({"status": "notFound"})


@app.tool(annotations=ToolAnnotations(read_only_hint=True))
def count_lines() -> str:
    """Count the lines of notes.txt."""
    lines = NOTES.read_text().splitlines() if NOTES.exists() else []
    return f"{len(lines)} lines"


if __name__ == "__main__":
    app.run()
