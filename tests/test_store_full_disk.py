"""A real full disk: ``tether run`` on a tmpfs with no space left.

The workspace lives on a small tmpfs, mounted in a private mount namespace
(``unshare --mount``) so nothing outside the test sees it and it vanishes with the test's
shell. The tmpfs is filled up first: making directories and empty files still works (tmpfs
needs no data blocks for them), so creating the session fails where a full disk really
fails, at the write of the header. ``tests/test_store_syscalls.py`` fails every other
system call of create the same way with strace.

Skipped with a reason where a mount namespace or a tmpfs mount is not permitted.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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


def test_a_full_disk_on_create_is_one_store_error_and_leaves_nothing(tmp_path: Path) -> None:
    problem = namespace_problem()
    if problem is not None:
        pytest.skip(problem)
    mnt = tmp_path / "mnt"
    out = tmp_path / "out"
    mnt.mkdir()
    out.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"model": "scripted/test", "responses": [{"content": "ok"}]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_") and k != "PYTHONPATH"}
    env.update(
        MNT=str(mnt),
        OUT=str(out),
        SCRIPT=str(script),
        PYTHON=sys.executable,
        PYTHONPATH=str(ROOT / "src"),
        PYTHONDONTWRITEBYTECODE="1",
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr

    stderr = (out / "stderr1").read_text()
    assert (out / "rc1").read_text().strip() == "9", stderr
    assert stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    assert "cannot create a session in" in stderr
    assert "write of the header failed: No space left on device" in stderr
    assert "no session was created" in stderr
    assert (out / "stdout1").read_text() == ""
    assert (out / "left").read_text() == "", "the failed create left part of a session"
    # With space again, the next run just works.
    assert (out / "rc2").read_text().strip() == "0", (out / "stderr2").read_text()
    [log] = (out / "after").read_text().split()
    assert log.endswith(".jsonl")
