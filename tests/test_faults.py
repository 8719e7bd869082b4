"""Named crash boundaries: registry, arming from the environment, both crash modes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tether import _faults as faults


@pytest.fixture(autouse=True)
def _disarmed() -> Iterator[None]:
    faults.configure(None)
    yield
    faults.configure(os.environ.get("TETHER_CRASH_AT"), os.environ.get("TETHER_CRASH_MODE"))


def test_store_boundaries_are_registered_with_descriptions() -> None:
    import tether._stores.file  # noqa: F401  (registers its boundaries)

    for name in ("store.before_write", "store.torn_write", "store.after_write", "store.after_sync"):
        assert faults.BOUNDARIES[name]


def test_register_is_one_line_and_idempotent() -> None:
    assert faults.register("test.sample", "a sample boundary") == "test.sample"
    assert faults.register("test.sample", "a sample boundary") == "test.sample"
    with pytest.raises(ValueError):
        faults.register("test.sample", "a different description")
    for bad in ("", "has space", "with@count"):
        with pytest.raises(ValueError):
            faults.register(bad, "x")


def test_hit_of_an_unregistered_name_is_a_programming_error() -> None:
    with pytest.raises(faults.UnknownBoundary):
        faults.hit("no.such.boundary")


def test_unarmed_hit_does_nothing() -> None:
    faults.register("test.noop", "never fires")
    called = []
    faults.hit("test.noop", lambda: called.append(1))
    assert not faults.ARMED and called == []


def test_nth_hit_fires_once(monkeypatch: pytest.MonkeyPatch) -> None:
    faults.register("test.counted", "fires on the third hit")
    crashes: list[str] = []
    monkeypatch.setattr(faults, "_crash", crashes.append)
    faults.configure("test.counted@3", "exit")
    assert faults.ARMED and faults.armed_for("test.counted")
    before: list[int] = []
    for i in range(5):
        faults.hit("test.counted", lambda i=i: before.append(i))  # type: ignore[misc]
    assert crashes == ["test.counted"]
    assert before == [2]


@pytest.mark.parametrize("spec", ["x@0", "x@-1", "x@two"])
def test_bad_crash_spec_is_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        faults.configure(spec)


def test_bad_crash_mode_is_refused() -> None:
    with pytest.raises(ValueError):
        faults.configure("x", "explode")


CHILD = """
import sys
from tether import _faults as faults
faults.register("test.child", "boundary used by test_faults")
for i in range(5):
    print(f"before {i}", flush=True)
    faults.hit("test.child")
print("survived", flush=True)
"""


def run_child(env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **env_extra}
    return subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60
    )


def test_kill_mode_sends_sigkill_on_the_nth_hit() -> None:
    result = run_child({"TETHER_CRASH_AT": "test.child@2"})
    assert result.returncode == -signal.SIGKILL
    assert result.stdout.split("\n")[:2] == ["before 0", "before 1"]
    assert "survived" not in result.stdout


def test_exit_mode_reports_the_boundary_and_exits_75() -> None:
    result = run_child({"TETHER_CRASH_AT": "test.child", "TETHER_CRASH_MODE": "exit"})
    assert result.returncode == faults.CRASH_EXIT_CODE == 75
    assert result.stderr == "INJECTED_CRASH boundary=test.child\n"
    assert result.stdout == "before 0\n"


def test_other_boundary_armed_means_no_crash() -> None:
    result = run_child({"TETHER_CRASH_AT": "some.other.boundary"})
    assert result.returncode == 0
    assert "survived" in result.stdout


def test_stop_mode_freezes_the_process_at_the_boundary_until_continued() -> None:
    env = {**os.environ, "TETHER_CRASH_AT": "test.child@2", "TETHER_CRASH_MODE": "stop"}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, status = os.waitpid(child.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status) and os.WSTOPSIG(status) == signal.SIGSTOP
        os.kill(child.pid, signal.SIGCONT)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0
    assert err == "INJECTED_STOP boundary=test.child\n"
    assert out.split("\n")[:2] == ["before 0", "before 1"] and "survived" in out
