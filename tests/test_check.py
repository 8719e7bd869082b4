"""The check-command runner: real subprocesses, bounded output, timeouts, cancellation."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from tether._completion.check import CheckOutcome, run_check
from tether._completion.evidence import VerificationStatus
from tether.errors import ArtifactError, CheckCommandError


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


def fixed(value: str = "v1") -> str:
    return value


def check(ws: Path, command: str, **kwargs: object) -> CheckOutcome:
    kwargs.setdefault("timeout", 10.0)
    kwargs.setdefault("version", fixed)
    return run_check(ws, command, **kwargs)  # type: ignore[arg-type]


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def group_alive(pgid: int) -> bool:
    """Any non-zombie process left in the group?"""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2 :].split()
        if fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def test_passing_command(ws: Path) -> None:
    (ws / "marker").write_text("here")
    result = run_check(
        ws, "cat marker; echo; echo err >&2", timeout=10, version=fixed, clock=lambda: 1234.5
    )
    assert result.exit_status == 0 and not result.timed_out and result.error is None
    assert result.status is VerificationStatus.PASSED
    assert result.output_tail == "here\nerr\n"
    assert result.output_digest == sha(b"here\nerr\n")
    assert result.version_start == result.version_end == "v1"
    assert result.started_at_ms == 1_234_500
    assert result.duration_ms >= 0
    assert result.command == "cat marker; echo; echo err >&2"


def test_failing_command(ws: Path) -> None:
    result = check(ws, "echo failing; exit 3")
    assert result.exit_status == 3
    assert result.error is None and not result.timed_out
    assert result.status is VerificationStatus.FAILED
    assert result.output_tail == "failing\n"


def test_stdin_is_dev_null_and_env_is_used(ws: Path) -> None:
    result = check(ws, 'cat; echo "[$CHECK_X]"', env={"PATH": os.environ["PATH"], "CHECK_X": "y"})
    assert result.exit_status == 0
    assert result.output_tail == "[y]\n"


def test_digest_is_of_exact_output(ws: Path) -> None:
    data = bytes(range(256)) * 3 + b"\xff\xfe tail"
    (ws / "blob").write_bytes(data)
    result = check(ws, "cat blob", tail_bytes=100)
    assert result.output_digest == sha(data)
    assert len(result.output_tail.encode("utf-8")) <= 100 * 3  # replacement chars are 3 bytes
    assert result.output_tail.endswith(" tail")


def test_tail_is_bounded_for_huge_output(ws: Path) -> None:
    # 1 MiB of 'a' followed by a final marker line.
    command = "head -c 1048576 /dev/zero | tr '\\0' a; echo; echo END"
    result = check(ws, command)
    assert result.exit_status == 0
    assert len(result.output_tail) == 4096
    assert result.output_tail.endswith("a\nEND\n")
    assert result.output_digest == sha(b"a" * 1048576 + b"\nEND\n")


def test_tail_does_not_start_with_a_broken_character(ws: Path) -> None:
    (ws / "u").write_text("é" * 100, encoding="utf-8")
    result = check(ws, "cat u", tail_bytes=51)
    assert result.output_tail == "é" * 25


def test_timeout_kills_the_process_group(ws: Path) -> None:
    began = time.monotonic()
    result = check(ws, "echo started; sleep 30; echo never", timeout=0.5)
    elapsed = time.monotonic() - began
    assert elapsed < 5
    assert result.timed_out and result.exit_status is None and result.error is None
    assert result.status is VerificationStatus.FAILED
    assert result.output_tail == "started\n"


def test_timeout_group_is_gone(ws: Path) -> None:
    pid_file = ws / "pgid"
    began = time.monotonic()
    result = check(ws, f"echo $$ > {pid_file}; sh -c 'sleep 30'; sleep 30", timeout=0.5)
    assert time.monotonic() - began < 5
    assert result.timed_out
    pgid = int(pid_file.read_text())  # the shell leads its own process group
    assert not group_alive(pgid)


def test_timeout_with_a_term_ignoring_command(ws: Path) -> None:
    began = time.monotonic()
    result = check(ws, "trap '' TERM; sleep 30 & wait; sleep 30", timeout=0.3)
    assert time.monotonic() - began < 5  # SIGKILL after the 2 s grace
    assert result.timed_out


def test_background_grandchild_holding_stdout_does_not_hang(ws: Path) -> None:
    pid_file = ws / "bg"
    began = time.monotonic()
    result = check(ws, f"sleep 30 & echo $! > {pid_file}; echo done")
    elapsed = time.monotonic() - began
    assert elapsed < 5
    assert result.exit_status == 0 and result.error is None and not result.timed_out
    assert result.status is VerificationStatus.PASSED
    assert result.output_tail == "done\n"
    assert not _running(int(pid_file.read_text()))


def test_command_not_found(ws: Path) -> None:
    result = check(ws, "definitely-not-a-command-xyz --flag")
    assert result.exit_status == 127
    assert result.error == "check command not found: definitely-not-a-command-xyz"
    assert result.status is VerificationStatus.ERROR


def test_command_not_found_after_cd(ws: Path) -> None:
    (ws / "sub").mkdir()
    result = check(ws, "cd sub && nosuch-tool-abc")
    assert result.error == "check command not found: nosuch-tool-abc"


def test_command_not_executable(ws: Path) -> None:
    script = ws / "check.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    result = check(ws, "./check.sh")
    assert result.exit_status == 126
    assert result.error == "check command is not executable: ./check.sh"
    assert result.status is VerificationStatus.ERROR


def test_exit_127_without_not_found_is_a_failure(ws: Path) -> None:
    result = check(ws, "exit 127")
    assert result.exit_status == 127 and result.error is None
    assert result.status is VerificationStatus.FAILED


def test_bad_workspace_or_empty_command_raises(ws: Path) -> None:
    with pytest.raises(CheckCommandError):
        check(ws / "missing", "true")
    with pytest.raises(CheckCommandError):
        check(ws, "   ")
    (ws / "file").write_text("x")
    with pytest.raises(CheckCommandError):
        check(ws / "file", "true")


def test_version_error_at_start_does_not_run_the_command(ws: Path) -> None:
    def broken() -> str:
        raise ArtifactError("cannot read\nsecret.txt: permission denied")

    result = check(ws, "touch ran", version=broken)
    assert not (ws / "ran").exists()
    assert result.error == "cannot read secret.txt: permission denied"
    assert result.version_start is None and result.version_end is None
    assert result.exit_status is None and not result.timed_out
    assert result.output_digest == sha(b"") and result.output_tail == ""
    assert result.status is VerificationStatus.ERROR


def test_version_error_at_end_is_an_error(ws: Path) -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) > 1:
            raise ArtifactError("file vanished")
        return "v1"

    result = check(ws, "touch ran", version=flaky)
    assert (ws / "ran").exists()
    assert result.exit_status == 0
    assert result.version_start == "v1" and result.version_end is None
    assert result.error == "file vanished"
    assert result.status is VerificationStatus.ERROR


def test_files_changed_during_the_run_is_void(ws: Path) -> None:
    def version() -> str:
        return "v-" + ((ws / "counter").read_text() if (ws / "counter").exists() else "0")

    result = check(ws, "echo 1 > counter", version=version)
    assert result.exit_status == 0 and result.error is None
    assert result.version_start == "v-0" and result.version_end == "v-1\n"
    assert result.status is VerificationStatus.VOID


def test_cancel_event(ws: Path) -> None:
    cancel = threading.Event()
    timer = threading.Timer(0.3, cancel.set)
    timer.start()
    began = time.monotonic()
    try:
        result = check(ws, "echo go; sleep 30", cancel=cancel, timeout=20)
    finally:
        timer.cancel()
    assert time.monotonic() - began < 5
    assert result.error == "cancelled" and result.exit_status is None
    assert not result.timed_out
    assert result.status is VerificationStatus.ERROR
    assert result.output_tail == "go\n"


def test_cancel_before_start(ws: Path) -> None:
    cancel = threading.Event()
    cancel.set()
    result = check(ws, "true", cancel=cancel)
    assert result.error == "cancelled"
    assert result.status is VerificationStatus.ERROR


def _running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2 :].split()[0] not in ("Z", "X")
