"""A real full disk: ``tether run`` on a tmpfs with no space left.

The workspace lives on a small tmpfs, mounted in a private mount namespace
(``unshare --mount``) so nothing outside the test sees it and it vanishes with the test's
shell. The tmpfs is filled up first: making directories and empty files still works (tmpfs
needs no data blocks for them), so creating the session fails where a full disk really
fails, at the write of the header. ``tests/test_store_syscalls.py`` fails every other
system call of create the same way with strace.

The disk also fills *during* a run: the agent's own ``bash`` command fills the tmpfs, so the
next write of the session log (that command's result) fails with ``ENOSPC``; and a ``write``
of a file too large for the space left fails in the tool itself. The first stops the run
with one ``error:`` line and the command that resumes it; the second is an error result the
model sees. Either way the session resumes to its end once there is space again, and no
command runs twice.

Skipped with a reason where a mount namespace or a tmpfs mount is not permitted, except under
``CI=true``, where that is a failure (CI runs as root and must run these tests).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tether._loading import reduce_session

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent(
    """
    set -u
    mount -t tmpfs -o size=256k,mode=0755 tmpfs "$MNT"
    mkdir "$MNT/ws"
    cp "$SCRIPT" "$MNT/ws/script.json"
    cd "$MNT/ws"
    dd if=/dev/zero of="$MNT/filler" bs=4096 2>/dev/null
    "$PYTHON" -m tether run hi --model scripted:script.json >"$OUT/stdout1" 2>"$OUT/stderr1"
    echo $? >"$OUT/rc1"
    ls -A "$MNT/ws/.tether/sessions" >"$OUT/left" 2>&1
    rm "$MNT/filler"
    "$PYTHON" -m tether run hi --model scripted:script.json >"$OUT/stdout2" 2>"$OUT/stderr2"
    echo $? >"$OUT/rc2"
    ls -A "$MNT/ws/.tether/sessions" >"$OUT/after" 2>&1
    """
)


PROBE = (
    'd=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs "$d"; rc=$?; '
    'umount "$d"; rmdir "$d"; exit $rc'
)


@functools.cache
def namespace_problem() -> str | None:
    if not sys.platform.startswith("linux"):
        return "needs Linux mount namespaces"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        return f"a private tmpfs mount is not permitted here: {probe.stderr.strip()[:120]}"
    return None


def require_namespace() -> None:
    """Skip (with ``CI=true``: fail) unless a private tmpfs mount can be made here."""
    problem = namespace_problem()
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must be able to mount a private tmpfs: {problem}")
        pytest.skip(problem)


def run_on_tmpfs(tmp_path: Path, shell: str, script: dict[str, Any], **extra: str) -> Path:
    """Run ``shell`` in a private mount namespace; the folder it wrote its results to.

    ``shell`` sees ``$MNT`` (where it mounts its tmpfs), ``$OUT`` (a folder outside it, for
    what the test reads afterwards), ``$SCRIPT`` (``script`` as a model script file) and
    ``$PYTHON``, plus ``extra``.
    """
    mnt = tmp_path / "mnt"
    out = tmp_path / "out"
    mnt.mkdir()
    out.mkdir()
    script_file = tmp_path / "script.json"
    script_file.write_text(json.dumps(script))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_") and k != "PYTHONPATH"}
    env.update(
        MNT=str(mnt),
        OUT=str(out),
        SCRIPT=str(script_file),
        PYTHON=sys.executable,
        PYTHONPATH=str(ROOT / "src"),
        PYTHONDONTWRITEBYTECODE="1",
        # The command fills the disk the log is on, outside the workspace: only a command
        # without the sandbox can (docs/sandbox.md).
        TETHER_SANDBOX="off",
        **extra,
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", shell],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return out


def test_a_full_disk_on_create_is_one_store_error_and_leaves_nothing(tmp_path: Path) -> None:
    require_namespace()
    out = run_on_tmpfs(
        tmp_path, SCRIPT, {"model": "scripted/test", "responses": [{"content": "ok"}]}
    )

    stderr = (out / "stderr1").read_text()
    assert (out / "rc1").read_text().strip() == "9", stderr
    assert stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    assert "cannot create a session in" in stderr
    assert "write of the header failed: No space left on device" in stderr
    assert "no session was created (the disk is full; free some space on it first)" in stderr
    assert (out / "stdout1").read_text() == ""
    assert (out / "left").read_text() == "", "the failed create left part of a session"
    # With space again, the next run just works.
    assert (out / "rc2").read_text().strip() == "0", (out / "stderr2").read_text()
    [log] = (out / "after").read_text().split()
    assert log.endswith(".jsonl")


# --------------------------------------------------------------------------- during a run

MID_RUN = textwrap.dedent(
    """
    set -u
    mount -t tmpfs -o size=$SIZE,mode=0755 tmpfs "$MNT"
    mkdir "$MNT/ws"
    cp "$SCRIPT" "$MNT/ws/script.json"
    cd "$MNT/ws"
    "$PYTHON" -m tether run hi --model scripted:script.json >"$OUT/stdout1" 2>"$OUT/stderr1"
    echo $? >"$OUT/rc1"
    cp .tether/sessions/*.jsonl "$OUT/log1"
    ls -A "$MNT/ws" >"$OUT/ws1"
    rm -f "$MNT/filler"
    "$PYTHON" -m tether resume --last --yes >"$OUT/stdout2" 2>"$OUT/stderr2"
    echo $? >"$OUT/rc2"
    cp .tether/sessions/*.jsonl "$OUT/log2"
    ls -A "$MNT/ws" >"$OUT/ws2"
    """
)
"""Run the script until the disk is full, free the space, ``tether resume --last --yes``.

``$OUT`` gets each command's exit status, stdout and stderr (``rc1``/``rc2``, …), the
session log after each (``log1``, ``log2``) and the workspace's listing (``ws1``, ``ws2``).
"""


def facts(log: bytes) -> list[dict[str, Any]]:
    """The facts of a session log in order (a transaction's line holds an array)."""
    out: list[dict[str, Any]] = []
    for line in log.splitlines()[1:]:
        value = json.loads(line)
        out.extend(value if isinstance(value, list) else [value])
    return out


def kinds(log: bytes) -> list[str]:
    """Each fact's record or entry type: ``runStarted``, ``message:assistant``, …"""
    names = []
    for fact in facts(log):
        if fact["kind"] == "record":
            names.append(fact["record"]["type"])
        elif fact["kind"] == "entry":
            names.append(f"message:{fact['entry']['message']['role']}")
        else:
            names.append(fact["kind"])
    return names


def tool_results(log: bytes) -> dict[str, dict[str, Any]]:
    """The tool result entries of a log by tool call id."""
    return {
        f["entry"]["message"]["tool_call_id"]: f["entry"]
        for f in facts(log)
        if f["kind"] == "entry" and f["entry"]["message"]["role"] == "tool"
    }


def test_a_bash_command_that_fills_the_disk_stops_the_run_resumably(tmp_path: Path) -> None:
    require_namespace()
    counter = tmp_path / "counter"  # outside the tmpfs: counts the command's executions
    filler = tmp_path / "mnt" / "filler"
    # The command's 8 KiB of output make its result line longer than any slack left in the
    # last page of the log, so appending it needs a page the full tmpfs does not have.
    command = (
        f"echo ran >> {counter}; dd if=/dev/zero of={filler} bs=4096 2>/dev/null; "
        "head -c 8192 /dev/zero | tr '\\0' x"
    )
    script = {
        "model": "scripted/test",
        "responses": [
            {
                "tool_calls": [
                    {"id": "call_fill", "name": "bash", "arguments": {"command": command}}
                ]
            },
            {"content": "done", "finish_reason": "stop"},
        ],
    }
    out = run_on_tmpfs(tmp_path, MID_RUN, script, SIZE="1m")

    # The run stops at the failed write: exit 9, one error line naming the full disk, and
    # the command that resumes the session. No traceback, nothing on stdout.
    stderr = (out / "stderr1").read_text()
    assert (out / "rc1").read_text().strip() == "9", stderr
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    lines = stderr.splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, stderr
    log1 = (out / "log1").read_bytes()
    state = reduce_session(log1)
    session_id = state.header.id
    sessions = re.escape(f"{tmp_path}/mnt/ws/.tether/sessions/")
    assert re.fullmatch(
        f"error: session {sessions}[0-9]+_{session_id}\\.jsonl: write failed: "
        "No space left on device; nothing was committed "
        "\\(the disk is full; free some space on it first\\)",
        errors[0],
    ), errors[0]
    assert lines[-1] == f"resume with: tether resume {session_id}", stderr
    assert (out / "stdout1").read_text() == ""
    assert counter.read_text() == "ran\n"

    # The log the failed run left reduces as it is (no torn tail) and holds every
    # acknowledged fact: up to the toolStarted that had to be durable before the command
    # ran (it did run: the counter says so). The failed result is not there.
    assert log1.endswith(b"\n") and state.repaired_length == len(log1)
    assert kinds(log1) == [
        "message:user",
        "runStarted",
        "stepAttempt",
        "message:assistant",
        "usage",
        "toolStarted",
    ]
    assert facts(log1)[-1]["record"]["toolCallId"] == "call_fill"
    assert tool_results(log1) == {}
    assert state.operation.kind == "run"

    # With space again, resume finishes the session: the command is recorded as
    # interrupted (docs/runtime.md: a started bash call is never run again), the model
    # gets its second answer, exit 0.
    stderr2 = (out / "stderr2").read_text()
    assert (out / "rc2").read_text().strip() == "0", stderr2
    assert (out / "stdout2").read_text() == "done\n"
    assert "(interrupted)" in stderr2 and "error" not in stderr2, stderr2
    assert counter.read_text() == "ran\n", "resume ran the bash command a second time"
    log2 = (out / "log2").read_bytes()
    assert log2.startswith(log1), "an acknowledged fact of the failed run was lost"
    final = reduce_session(log2)
    assert final.operation.kind == "idle"
    assert final.last_finished is not None and final.last_finished.outcome == "completed"
    result = tool_results(log2)["call_fill"]
    assert result["result"] == {"type": "synthetic", "reason": "interrupted"}
    assert kinds(log2)[len(kinds(log1)) :] == [
        "message:tool",
        "stepAttempt",
        "message:assistant",
        "usage",
        "operationFinished",
    ]


def test_a_write_too_large_for_the_disk_is_an_error_result_and_leaves_no_file(
    tmp_path: Path,
) -> None:
    require_namespace()
    filler = tmp_path / "mnt" / "filler"
    content = "y" * (512 * 1024)
    # The log records the content twice (the assistant's call and its toolStarted): 1 MiB of
    # the 1480 KiB the bash step leaves free. The journal's SQLite pages take some of the
    # rest, and what is left is less than the 512 KiB the temp file of the write needs.
    fill = f"dd if=/dev/zero of={filler} bs=4096 2>/dev/null; truncate -s -1480K {filler}"
    script = {
        "model": "scripted/test",
        "responses": [
            {"tool_calls": [{"id": "call_fill", "name": "bash", "arguments": {"command": fill}}]},
            {
                "tool_calls": [
                    {
                        "id": "call_write",
                        "name": "write",
                        "arguments": {"path": "big.txt", "content": content},
                    }
                ]
            },
            {"content": "done", "finish_reason": "stop"},
        ],
    }
    out = run_on_tmpfs(tmp_path, MID_RUN, script, SIZE="4m")

    # The tool's own write failed: an error result the model saw, and the run finished.
    stderr = (out / "stderr1").read_text()
    assert (out / "rc1").read_text().strip() == "0", stderr
    assert "error:" not in stderr and "Traceback" not in stderr, stderr
    assert (out / "stdout1").read_text() == "done\n"
    log1 = (out / "log1").read_bytes()
    state = reduce_session(log1)
    assert state.operation.kind == "idle"
    assert state.last_finished is not None and state.last_finished.outcome == "completed"
    result = tool_results(log1)["call_write"]
    assert result["message"]["content"] == "Error: big.txt: no space left on device", result
    # Nothing half-written: no big.txt, and its temp file was removed.
    assert (out / "ws1").read_text().split() == [".tether", "script.json"]

    # With space again, resume has nothing to do: it appends nothing and does not try the
    # write again.
    assert (out / "rc2").read_text().strip() == "0", (out / "stderr2").read_text()
    assert "nothing to do" in (out / "stderr2").read_text()
    assert (out / "log2").read_bytes() == log1
    assert (out / "ws2").read_text().split() == [".tether", "script.json"]
