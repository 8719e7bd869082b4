"""Benchmark: what tether's MCP manager adds to one MCP tool call.

Run: ``python bench/bench_mcp.py`` (about 10 s; ``--calls``, ``--rounds``; needs
``tether[mcp]``).

Both contenders call ``count_lines`` of the same kind of server,
``python -m tether.testing.mcp_notes`` over stdio, each with its own server process:

* ``sdk`` — the baseline: ``ClientSession.call_tool`` awaited directly in an asyncio
  loop (the least any client of the SDK does), with the same ``_meta`` operation id;
* ``tool`` — :class:`tether._mcp.tools.McpTool` ``run`` from a plain thread: the hop to
  the manager's loop thread, the race against the connection's end, the timeout and
  cancel polling, and rendering the result.

Printed (target in brackets)::

    mcp.call added=-0.09ms (tool 0.96ms, sdk 1.03ms per call, ratio 0.93)  [<= 2 ms] PASS

``added`` is the median over rounds of (median tool call - median sdk call); the contenders
alternate within each round so that load drifts hit both.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tether._mcp.config import McpConfig, McpServerConfig
from tether._mcp.manager import OPERATION_META_KEY, manager
from tether._mcp.tools import mcp_tools
from tether._tools.base import ToolContext

TARGET_MS = 2.0
ARGS = ("-m", "tether.testing.mcp_notes")


class SdkClient:
    """The baseline: one SDK session on a loop of its own thread, awaited directly."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.requests: list[int] = []
        self.ready = threading.Event()
        self.go = threading.Event()
        self.result: list[float] = []
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        from mcp import ClientSession, StdioServerParameters, stdio_client

        parameters = StdioServerParameters(
            command=sys.executable, args=list(ARGS), cwd=self.workspace
        )
        with open(self.workspace / "sdk.log", "w") as errlog:
            async with stdio_client(parameters, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    self.session = session
                    self.loop = asyncio.get_running_loop()
                    self.ready.set()
                    await asyncio.Event().wait()

    def timed_calls(self, count: int) -> list[float]:
        async def calls() -> list[float]:
            times = []
            for _ in range(count):
                began = time.perf_counter()
                result = await self.session.call_tool(
                    "count_lines", {}, meta={OPERATION_META_KEY: "bench"}
                )
                assert not result.is_error
                times.append((time.perf_counter() - began) * 1000)
            return times

        return asyncio.run_coroutine_threadsafe(calls(), self.loop).result(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100, help="calls per contender and round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp).resolve()
        server = McpServerConfig(name="notes", command=sys.executable, args=ARGS)
        (tool,) = [
            t for t in mcp_tools(McpConfig((server,)), root) if t.name == "notes__count_lines"
        ]
        context = ToolContext(root, "bench")
        sdk = SdkClient(root)
        sdk.thread.start()
        assert sdk.ready.wait(60), "the baseline's server did not start"

        def tool_calls(count: int) -> list[float]:
            times = []
            for _ in range(count):
                began = time.perf_counter()
                result = tool.run({}, context)
                assert not result.is_error, result.content
                times.append((time.perf_counter() - began) * 1000)
            return times

        contenders: dict[str, Callable[[int], list[float]]] = {
            "sdk": sdk.timed_calls,
            "tool": tool_calls,
        }
        for run in contenders.values():  # warm up
            run(10)
        medians: dict[str, list[float]] = {name: [] for name in contenders}
        for round_ in range(args.rounds):
            order = list(contenders.items())
            if round_ % 2:
                order.reverse()
            for name, run in order:
                medians[name].append(statistics.median(run(args.calls)))
        manager().stop_all()
    added = statistics.median(t - s for t, s in zip(medians["tool"], medians["sdk"], strict=True))
    tool_ms = statistics.median(medians["tool"])
    sdk_ms = statistics.median(medians["sdk"])
    verdict = "PASS" if added <= TARGET_MS else "MISS"
    print(
        f"mcp.call added={added:.2f}ms (tool {tool_ms:.2f}ms, sdk {sdk_ms:.2f}ms per call, "
        f"ratio {tool_ms / sdk_ms:.2f})  [<= {TARGET_MS:g} ms] {verdict}"
    )


if __name__ == "__main__":
    main()
