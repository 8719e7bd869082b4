"""The I/O-error lab (``tether crashlab --io-errors``) and the store seam it relies on.

* **sites** — a real scenario run recorded with ``strace -f -y``: the calls on tether's own
  files are classified (session log, effects database, workspace edits, ``.tether``), the
  lab's instrument files and Python's are not, and every site's ``N`` is the N-th call of
  its syscall in the main thread of that very trace (what ``when=N`` counts);
* **the bounded lab** on the ``write`` scenario passes: real strace injections into real
  processes, each faulted run judged, resumed twice, checked;
* **the planted bug** (``TETHER_LAB_IO_PLANT=ignore_write_errors``: the store acknowledges
  a commit whose write failed) is caught: FAIL with lost acknowledged commits;
* **the CLI** refuses bad input with one ``error:`` line and exit 2;
* **the seam**, in-process: a commit whose ``write`` (whole or after a short write) or
  ``fdatasync`` fails with each errno raises :class:`SessionWriteError`, leaves what the
  store holds in memory equal to what a fresh open of the file reduces to, and a retry
  after the fault clears succeeds.

The strace tests are skipped with a reason where strace cannot run, except under
``CI=true``.
"""

from __future__ import annotations

import errno
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from stracekit import require_strace
from tether._cli import app
from tether._stores import file as file_store
from tether._stores.file import SessionStore
from tether.errors import SessionWriteError, StoreUnavailable
from tether.testing.crashlab import iofaults
from tether.testing.crashlab.child import ACKS_FILE, EFFECTS_FILE, WORKSPACE
from tether.testing.crashlab.iofaults import (
    ERRNOS,
    IoLabOptions,
    Site,
    bounded_cases,
    call_path,
    classify,
    full_cases,
    normalize,
    parse_site_filter,
    run_io_lab,
)
from tether.testing.crashlab.matrix import (
    Case,
    CaseResult,
    JobResult,
    _Workers,
    judge_faulted_run,
)
from tether.testing.crashlab.scenarios import BUILTIN_SCENARIOS
from tether.testing.crashlab.strace import parse

runner = CliRunner()


# =========================================================================== sites


def test_classify_keeps_tethers_own_files_only(tmp_path: Path) -> None:
    run = tmp_path / "run"
    ws = run / WORKSPACE
    assert classify(f"{ws}/.tether/sessions/1_abc.jsonl", run) == "session"
    assert classify(f"{ws}/.tether/sessions", run) == "session"
    assert classify(f"{ws}/.tether/effects.db-wal", run) == "effects-db"
    assert classify(f"{ws}/.tether/effects.db", run) == "effects-db"
    assert classify(f"{ws}/.tether", run) == "tether-dir"
    assert classify(f"{ws}/.tether/.gitignore", run) == "tether-dir"
    assert classify(f"{ws}/out/.result.txt.0123456789ab.tether-tmp", run) == "workspace"
    assert classify(str(ws), run) == "workspace"
    for other in (
        f"{run}/{ACKS_FILE}",
        f"{run}/{EFFECTS_FILE}",
        f"{ws}/.tether/ledger.db",  # publish-report's simulated remote service
        f"{run}/wsx/file",
        "/usr/lib/python3.11/json/__init__.py",
        "/dev/urandom",
        None,
    ):
        assert classify(other, run) is None, other


def test_site_filter_parses_and_refuses() -> None:
    assert parse_site_filter(["write", "fsync@3", "openat:EIO", "pwrite64@2:EROFS"]) == [
        ("write", None, None),
        ("fsync", 3, None),
        ("openat", None, "EIO"),
        ("pwrite64", 2, "EROFS"),
    ]
    for bad in ("read", "write@0", "write@x", "write:EPERM"):
        with pytest.raises(ValueError, match="bad --site"):
            parse_site_filter([bad])


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    """One real run of the write scenario under ``strace -f -y`` (the lab's discovery)."""
    require_strace()
    run_dir = (tmp_path_factory.mktemp("io") / "discover").resolve()
    workers = _Workers(1, True, iofaults.SERVER_ENV)
    try:
        found = iofaults.discover(workers, BUILTIN_SCENARIOS["write"], run_dir, timeout=60)
    finally:
        workers.close()
    yield run_dir, found


def test_sites_of_a_recorded_trace(recorded: tuple[Path, Any]) -> None:
    run_dir, found = recorded
    assert found.error is None
    calls = parse((run_dir / "out" / "discover.strace").read_text())
    main = calls[0].pid
    sites: list[Site] = found.sites
    # Every class of tether's files is hit, with the calls the issue names.
    pairs = {(s.syscall, s.file_class) for s in sites}
    for pair in (
        ("write", "session"),
        ("fdatasync", "session"),
        ("linkat", "session"),
        ("pwrite64", "effects-db"),
        ("fdatasync", "effects-db"),
        ("openat", "effects-db"),
        ("renameat", "workspace"),
        ("write", "workspace"),
        ("mkdir", "tether-dir"),
    ):
        assert pair in pairs, pair
    # N is the N-th call of the syscall in the main thread of this very trace.
    by_name: dict[str, list[Any]] = {}
    for call in calls:
        if call.pid == main:
            by_name.setdefault(call.name, []).append(call)
    for site in sites:
        call = by_name[site.syscall][site.hit - 1]
        path = call_path(call)
        assert path is not None and normalize(path, run_dir) == site.path, site
        assert classify(path, run_dir) == site.file_class
    # Everything else that was touched is not a site: the acks file, python, libraries.
    touched = {call_path(c) for c in calls if c.pid == main}
    assert f"{run_dir}/{ACKS_FILE}" in touched
    assert not any("acks" in s.path or ".py" in s.path for s in sites)
    tether_calls = sum(1 for c in calls if c.pid == main and classify(call_path(c), run_dir))
    assert len(sites) == tether_calls
    # Bounded: each pair's first and last hit, the errnos in turn; full: all × all.
    bounded = bounded_cases("write", sites)
    for pair in pairs:
        group = [s for s in sites if (s.syscall, s.file_class) == pair]
        chosen = {c.site for c in bounded if (c.site.syscall, c.site.file_class) == pair}
        assert chosen == {group[0], group[-1]}
    assert set(Counter(c.errno for c in bounded)) == set(ERRNOS)
    full = full_cases("write", sites)
    assert len(full) == 4 * len(sites) and len({(c.site, c.errno) for c in full}) == len(full)


# =========================================================================== the judgement


def _job(code: int, stdout: str = "", stderr: str = "", timed_out: bool = False) -> JobResult:
    return JobResult(code, 0.1, timed_out, stdout, stderr)


@pytest.mark.parametrize(
    "job, failure",
    [
        (_job(0), None),
        (_job(0, stderr="Traceback (most recent call last):\n  ...\nOSError: x"), "traceback"),
        (
            _job(
                3,
                json.dumps({"mode": "run", "error": {"type": "X", "message": "m"}}),
                "Traceback (most recent call last):\n  ...",
            ),
            "traceback",
        ),
        (
            _job(3, json.dumps({"mode": "run", "error": {"type": "X", "message": "m"}})),
            None,
        ),
        (_job(3, "no json"), "without a typed error line"),
        (_job(1, stderr="Traceback (most recent call last):\n  ...\nOSError: x"), "exit status 1"),
        (_job(70), "exit status 70"),
        (_job(-9), "was killed"),
        (_job(-9, timed_out=True), "hung"),
    ],
)
def test_a_faulted_run_must_finish_or_stop_with_a_typed_error(
    job: JobResult, failure: str | None
) -> None:
    result = CaseResult(Case("write", "write:EIO", 3), crashed=False, fault="write@3:EIO")
    judge_faulted_run(result, job, b"", [])
    if failure is None:
        assert result.failures == []
    else:
        assert len(result.failures) == 1 and failure in result.failures[0]


def test_an_acknowledged_commit_missing_from_the_faulted_log_is_lost() -> None:
    line = json.dumps({"kind": "entry", "seq": 1, "id": "a"}).encode() + b"\n"
    result = CaseResult(Case("write", "write:EIO", 3), crashed=False, fault="write@3:EIO")
    judge_faulted_run(result, _job(0), line, [(1, "a"), (2, "b")])
    assert result.lost_acknowledged == 1
    assert "memory ran ahead of the disk" in result.failures[0]


# =========================================================================== real labs


def test_bounded_lab_on_write_passes(tmp_path: Path) -> None:
    require_strace()
    result = runner.invoke(
        app,
        ["crashlab", "--io-errors", "--scenario", "write", "--json", "--workdir", str(tmp_path)],
        catch_exceptions=False,
    )
    report = json.loads(result.stdout)
    assert result.exit_code == 0, [c for c in report["cases"] if c["verdict"] != "pass"]
    assert report["verdict"] == "PASS"
    assert report["runs"] >= 30 and report["errnos"] == list(sorted(ERRNOS))
    assert report["lostAcknowledged"] == 0 and report["duplicateEffects"] == 0
    assert report["unaimed"] <= 2
    cases = report["cases"]
    # Real injections with real consequences: both endings happen, and the session
    # log's own write failure is among the typed errors.
    outcomes = Counter(c["outcome"] for c in cases)
    assert outcomes["absorbed"] > 0
    assert any(
        c["syscall"] == "write"
        and c["fileClass"] == "session"
        and c["outcome"] == "SessionWriteError"
        for c in cases
    )
    assert {c["fileClass"] for c in cases} == {"session", "effects-db", "workspace", "tether-dir"}


def test_the_planted_bug_is_caught(tmp_path: Path) -> None:
    """A store that acknowledges a commit whose write failed: FAIL, lost acknowledged."""
    require_strace()
    options = IoLabOptions(
        [BUILTIN_SCENARIOS["write"]],
        jobs=2,
        workdir=tmp_path,
        plant="ignore_write_errors",
        sites=[("write", None, "ENOSPC")],
        limit=6,  # every other write hit: most are the session log's commits
    )
    result = run_io_lab(options)
    assert result.verdict == "FAIL"
    assert result.lost_acknowledged > 0
    caught = [r for r in result.failures if r.result is not None and r.result.lost_acknowledged]
    assert caught and all(r.case.site.file_class == "session" for r in caught)
    assert all("memory ran ahead of the disk" in " ".join(r.result.failures) for r in caught)  # type: ignore[union-attr]
    first = caught[0].result
    assert first is not None
    site = f"write@{caught[0].case.site.hit}:ENOSPC"
    assert first.reproduce == (
        "TETHER_LAB_IO_PLANT=ignore_write_errors tether crashlab --io-errors "
        f"--scenario write --site {site} --keep"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--full"], "--full goes with --power-loss or --io-errors"),
        (["--site", "write"], "--site needs --io-errors"),
        (["--io-errors", "--scenario", "nope"], "unknown scenario 'nope'"),
        (["--io-errors", "--site", "read"], "is not a traced call"),
        (["--io-errors", "--site", "write@0"], "N must be a positive integer"),
        (["--io-errors", "--site", "write:EPERM"], "the errno must be one of"),
        (["--io-errors", "--boundary", "after_effect"], "cannot be combined with --boundary"),
        (["--io-errors", "--tool", "x:y"], "cannot be combined with --tool"),
        (["--io-errors", "--durability", "process"], "cannot be combined with --durability"),
    ],
)
def test_cli_bad_input(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["crashlab", *args], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


# =========================================================================== the store seam


def _fact(text: str) -> dict[str, Any]:
    return {
        "kind": "entry",
        "entry": {"type": "message", "message": {"role": "user", "content": text}},
    }


class _FailNth:
    """``os.write`` / ``fdatasync`` stand-in: the N-th call on ``fd`` raises ``OSError``.

    ``short``: that call first writes half its buffer (a short write), the next raises.
    """

    def __init__(self, real: Callable[..., Any], n: int, code: int, short: bool = False):
        self.real, self.n, self.code, self.short = real, n, code, short
        self.fd = -1
        self.calls = 0
        self.armed = True

    def __call__(self, fd: int, *args: Any) -> Any:
        if fd != self.fd or not self.armed:
            return self.real(fd, *args)
        self.calls += 1
        if self.calls == self.n and self.short:
            data = args[0]
            return self.real(fd, data[: len(data) // 2])
        if self.calls == self.n + (1 if self.short else 0):
            raise OSError(self.code, os.strerror(self.code))
        return self.real(fd, *args)


def _assert_memory_equals_disk(store: SessionStore) -> None:
    fresh = SessionStore.open_read_only(store.path, sessions_dir=store.path.parent)
    try:
        assert store.path.stat().st_size == store.length
        assert fresh.state.last_seq == store.state.last_seq
        assert fresh.state.transcript_ids == store.state.transcript_ids
        assert fresh.state == store.state
    finally:
        fresh.close()


@pytest.mark.parametrize("code", [errno.EIO, errno.ENOSPC, errno.EDQUOT, errno.EROFS])
@pytest.mark.parametrize("call", ["write", "short-write", "fdatasync"])
def test_store_seam_failed_commit_keeps_memory_equal_to_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str, code: int
) -> None:
    store = SessionStore.create(
        tmp_path, provider="openrouter", model="test/model", environment_identity="env"
    )
    store.commit([_fact("one")])
    path = store.path
    store.close()
    if call == "fdatasync":
        failer = _FailNth(file_store._fdatasync, 2, code)
        monkeypatch.setattr(file_store, "_fdatasync", failer)
    else:
        failer = _FailNth(os.write, 2, code, short=call == "short-write")
        monkeypatch.setattr(os, "write", failer)
    store = SessionStore.open(path, workspace=tmp_path)  # binds the patched call as its seam
    failer.fd = store._fd
    try:
        store.commit([_fact("two")])  # the 1st call on the log: fine
        seq_before = store.state.last_seq
        with pytest.raises(SessionWriteError) as caught:
            store.commit([_fact("three")])  # the 2nd: fails
        assert caught.value.errno == code
        assert store.state.last_seq == seq_before
        _assert_memory_equals_disk(store)
        failer.armed = False  # the fault clears
        if call == "fdatasync":
            # After a failed sync only a fresh open is trusted: refused until reopened.
            assert caught.value.failed
            with pytest.raises(StoreUnavailable):
                store.commit([_fact("three")])
            store.close()
            store = SessionStore.open(path, workspace=tmp_path)
        else:
            assert not caught.value.failed
        [retried] = store.commit([_fact("three")])
        assert retried["seq"] == seq_before + 1
        _assert_memory_equals_disk(store)
    finally:
        store.close()
    texts = [
        json.loads(line)
        for line in path.read_bytes().splitlines()[1:]  # after the header
    ]
    contents = [
        f["entry"]["message"]["content"] for t in texts for f in (t if isinstance(t, list) else [t])
    ]
    assert contents == ["one", "two", "three"]
