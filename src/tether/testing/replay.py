"""Recorded sessions as regression tests: ``replay_cases`` and ``assert_replays``.

A directory of recorded session logs (``*.jsonl``, e.g. copied from ``.tether/sessions``)
becomes one pytest case per log; each case replays its log against an agent's configuration
with no side effect (:mod:`tether.core.replay`: nothing is sent, no tool runs) and fails
with the first divergence::

    import pytest
    from tether import Agent
    from tether.testing.replay import assert_replays, replay_cases

    @pytest.mark.parametrize("log", replay_cases("tests/sessions"))
    def test_recorded_session_still_replays(log):
        with Agent("scripted:tests/model.json", workspace=".", sandbox="off") as agent:
            assert_replays(log, agent)

``assert_replays(..., crash_points_too=True)`` also plans recovery after every line of the log
and fails if a plan would re-run a started effect blindly (the crash lab on a real log).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tether._inputs import MAX_SESSION_FILE_BYTES, read_file
from tether.core.replay import ReplayReport, crash_points, replay_log

if TYPE_CHECKING:
    from tether._runtime import Agent

__all__ = ["assert_replays", "replay_cases", "replay_session"]


def replay_cases(directory: str | os.PathLike[str], pattern: str = "*.jsonl") -> list[Any]:
    """One ``pytest.param`` per log of ``directory`` (sorted by name, id = the file's name);
    an empty list when there is none (pytest then reports the test as skipped)."""
    import pytest

    return [pytest.param(path, id=path.name) for path in sorted(Path(directory).glob(pattern))]


def replay_session(log: str | os.PathLike[str], agent: Agent) -> ReplayReport:
    """Replay ``log`` against ``agent``'s configuration (its snapshot, tools and policy);
    nothing is sent and nothing runs."""
    data = read_file(log, f"session log {log}", limit=MAX_SESSION_FILE_BYTES)
    configuration = agent.configuration
    return replay_log(
        data, configuration.current, configuration.snapshot, agent.parts.project.policy
    )


def assert_replays(
    log: str | os.PathLike[str], agent: Agent, *, crash_points_too: bool = False
) -> ReplayReport:
    """:func:`replay_session`, failing with every divergence (the first one first); with
    ``crash_points_too`` also the check of every crash boundary."""
    report = replay_session(log, agent)
    if report.divergences:
        lines = "\n".join(d.text() for d in report.divergences)
        raise AssertionError(f"{log}: replay diverges:\n{lines}")
    if crash_points_too:
        data = read_file(log, f"session log {log}", limit=MAX_SESSION_FILE_BYTES)
        _checked, _plans, bad = crash_points(data, agent.configuration.current)
        if bad:
            lines = "\n".join(point.text() for point in bad)
            raise AssertionError(f"{log}: blind re-run at a crash point:\n{lines}")
    return report
