"""A worker process for the PostgreSQL acceptance tests (``tests/test_pg_workers.py``).

Usage::

    python tests/pg_worker_child.py URL WORKSPACE SCRIPT CONCURRENCY

Runs :class:`tether._runtime.worker.Worker` (``--until-empty``) with ``CONCURRENCY``
agents over the store at ``URL``: the scripted model ``SCRIPT``, the built-in tools plus
``publish_report`` over ``WORKSPACE/.tether/ledger.db``, environment ``pgtest``; leases of
``TETHER_LEASE_SECONDS``. Exit as ``tether worker`` does: 0 done (or ``SIGTERM``), 11
fenced, 10 the store stayed away. One line per event on stderr.
"""

from __future__ import annotations

import os
import signal
import sys


def main(argv: list[str]) -> int:
    url, workspace, script, concurrency = argv
    from tether._models import load_model
    from tether._runtime import Agent
    from tether._runtime.worker import Worker
    from tether._tools.builtin import builtin_tools
    from tether.testing.ledger import PublishReportTool

    def make_agent() -> Agent:
        return Agent(
            load_model(f"scripted:{script}"),
            [*builtin_tools(), PublishReportTool.for_workspace(workspace)],
            workspace=workspace,
            environment="pgtest",
            read_agents_md=False,
            store_url=url,
        )

    def log(line: str) -> None:
        sys.stderr.write(f"worker {os.getpid()}: {line}\n")
        sys.stderr.flush()

    worker = Worker(make_agent, concurrency=int(concurrency), until_empty=True, log=log)
    signal.signal(signal.SIGTERM, lambda signum, frame: worker.stop())
    report = worker.run()
    if report.fenced is not None:
        log(f"error: {report.fenced}")
        return report.fenced.exit_code
    if report.failed is not None:
        log(f"error: {report.failed}")
        return report.failed.exit_code
    log(f"done: {len(report.driven)} sessions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
