"""Benchmark: what the sandbox adds to one ``bash`` call (target: <= 10 ms).

Run: ``python bench/bench_sandbox.py`` (about 15 s; ``--calls``, ``--rounds``).

Contenders, each running ``true`` in a temporary workspace and collecting its output:

* ``bare`` — the physical baseline: ``subprocess.run(["/bin/bash", "-c", "true"])`` in a
  new session with stdin from ``/dev/null`` and the output captured;
* ``bash_tool`` — :class:`tether._tools.builtin.BashTool` ``run`` with the sandbox off (the
  process-group runner, the result text, the credential-free environment);
* ``sandboxed`` — the same call inside the sandbox of an agent on that workspace
  (``workspace-write``, network off: bubblewrap with its namespaces and mounts).

Printed (target in brackets)::

    sandbox.bash_call added=4.1ms (sandboxed 6.6ms, bash_tool 2.5ms, bare 1.5ms)  [<= 10 ms] PASS

``added`` is the median over rounds of (median sandboxed call - median bash_tool call); the
contenders alternate within each round so that load drifts hit all of them
(``bench_procs.alternating_medians``). The mechanism
check (once per agent) is done before timing and printed apart.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_procs import alternating_medians, bare_bash
from tether._sandbox.bwrap import Sandbox
from tether._sandbox.policy import DEFAULT_DENY_READ, SandboxMode, resolve_policy
from tether._tools.base import ToolContext
from tether._tools.builtin import BashTool

TARGET_MS = 10.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=30, help="calls per contender and round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp).resolve()
        (root / ".tether").mkdir()
        policy = resolve_policy(
            SandboxMode.WORKSPACE_WRITE,
            workspace=root,
            network=False,
            writable_roots=(),
            deny_read=DEFAULT_DENY_READ,
            hidden=(root / ".tether",),
            home=os.path.expanduser("~"),
        )
        sandbox = Sandbox(policy)
        started = time.perf_counter()
        mechanism = sandbox.ensure()
        check_ms = (time.perf_counter() - started) * 1000
        tool = BashTool()
        plain = ToolContext(root, "bench")
        confined = ToolContext(root, "bench", sandbox=sandbox)

        def bare() -> None:
            bare_bash(root)

        def bash_tool() -> None:
            assert not tool.run({"command": "true"}, plain).is_error

        def sandboxed() -> None:
            result = tool.run({"command": "true"}, confined)
            assert not result.is_error and "sandbox: workspace-write" in result.content

        contenders: dict[str, Callable[[], None]] = {
            "bare": bare,
            "bash_tool": bash_tool,
            "sandboxed": sandboxed,
        }
        medians = alternating_medians(contenders, rounds=args.rounds, calls=args.calls)
    added = statistics.median(
        s - b for s, b in zip(medians["sandboxed"], medians["bash_tool"], strict=True)
    )
    figure = {name: statistics.median(values) for name, values in medians.items()}
    verdict = "PASS" if added <= TARGET_MS else "FAIL"
    assert mechanism is not None
    print(f"sandbox.mechanism {mechanism.describe()} check={check_ms:.1f}ms (once per agent)")
    print(
        f"sandbox.bash_call added={added:.1f}ms (sandboxed {figure['sandboxed']:.1f}ms, "
        f"bash_tool {figure['bash_tool']:.1f}ms, bare {figure['bare']:.1f}ms)  "
        f"[<= {TARGET_MS:g} ms] {verdict}"
    )


if __name__ == "__main__":
    main()
