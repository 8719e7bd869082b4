"""The I/O-error lab: fail each of tether's own system calls in turn, then recover.

For every scenario the lab first runs it once under ``strace -f -y`` (the child's ``run``
mode, deterministic start: ``PYTHONHASHSEED=0``, no byte-code writes) and records every
call of :data:`SYSCALLS` the main thread makes on a file of tether's own — the session log
(and its directory, lock and sidecars), the effects database (SQLite's calls are these
system calls: ``effects.db``, ``-wal``, ``-journal``, ``-shm``), the workspace files the
file tools write (temporary file + rename) and tether's directories. The lab's own
instrument files (``acks.jsonl``, ``effects.log``, ``hits.log``), Python's and the
libraries' files and the report ledger (the simulated remote service of
``publish-report``) are not tether's and are left alone.

A *site* is ``(syscall, N)`` — the N-th call of that syscall in the main thread (strace
without ``-f`` traces the first thread only, so ``when=N`` counts exactly those) — with the
file it touched. A *case* is a site and an errno (:data:`ERRNOS`). Each case

1. runs the scenario in a fresh run folder under
   ``strace -e inject=SYSCALL:error=ERRNO:when=N``: the kernel's place is taken by a real
   error at exactly that call; strace's log must show exactly that call (same file, same
   ordinal on that file) injected — if lazy work moved the count, the lab re-aims from the
   log (up to :data:`AIM_TRIES` runs) or reports the case as not aimed;
2. resumes twice with no fault (the fork server, as the crash matrix does);
3. is judged by :func:`tether.testing.crashlab.matrix.evaluate` with ``fault`` set: the
   faulted run finished normally or stopped with a typed one-line error (exit 3), every
   commit it acknowledged is in the log it left (memory never ran ahead of the disk), and
   after the fault cleared the usual checks hold (nothing acknowledged lost, the log
   reduces, every tool call one result, no duplicate effect, the second resume appends
   nothing).

:func:`bounded_cases` picks a representative subset (the first and the last hit of every
``(syscall, file class)``, the errnos in turn); :func:`full_cases` every hit with every
errno.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether import errors
from tether.testing.crashlab.child import (
    IO_PLANT_ENV,
    WORKSPACE,
    apply_tamper,
    prepare_run_dir,
    session_log_bytes,
)
from tether.testing.crashlab.matrix import (
    Case,
    CaseResult,
    ForkServerRunner,
    JobResult,
    _acks,
    _Workers,
    child_environment,
    effects_integrated,
    resume_and_evaluate,
)
from tether.testing.crashlab.scenarios import BUILTIN_SCENARIOS, Scenario
from tether.testing.crashlab.strace import Call, parse

__all__ = [
    "BOUNDED_SCENARIOS",
    "ERRNOS",
    "FULL_SCENARIOS",
    "SYSCALLS",
    "IoCase",
    "IoLabOptions",
    "IoLabResult",
    "Site",
    "bounded_cases",
    "call_path",
    "classify",
    "cli_command",
    "full_cases",
    "parse_site_filter",
    "run_io_lab",
    "sites_from_calls",
]

ERRNOS = ("EIO", "ENOSPC", "EDQUOT", "EROFS")
SYSCALLS = (
    "openat",
    "write",
    "pwrite64",
    "fsync",
    "fdatasync",
    "ftruncate",
    "rename",
    "renameat",
    "renameat2",
    "linkat",
    "unlink",
    "unlinkat",
    "mkdir",
    "mkdirat",
)
BOUNDED_SCENARIOS = ("write", "bash-counter", "edit")
FULL_SCENARIOS = ("write", "bash-counter", "edit", "publish-report")
AIM_TRIES = 4
DEFAULT_TIMEOUT = 120.0

CLASSES = ("session", "effects-db", "workspace", "tether-dir")
"""File classes: the session log (its directory, lock, sidecars), the effects database
(and SQLite's side files), workspace files (the file tools' edits), ``.tether`` itself."""

_PATH_CALLS = frozenset(
    {"openat", "rename", "renameat", "renameat2", "linkat", "unlink", "unlinkat"}
    | {"mkdir", "mkdirat"}
)
_SESSION_NAME = re.compile(r"\d{10,}_[0-9a-f]{8}-[0-9a-f-]{27}")
_SESSION_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TEMP_NAME = re.compile(r"\.[0-9a-f]{8,}\.tether-tmp")


# =========================================================================== sites


def call_path(call: Call) -> str | None:
    """The file a call touched: the name it passes (``openat``, ``mkdir``, ``renameat``'s
    old name, …) or the file behind its descriptor (``write``, ``fsync``, …)."""
    if call.name in _PATH_CALLS:
        return call.path_arg()
    return call.fd_path(0)


def classify(path: str | None, run_dir: Path) -> str | None:
    """The file class of ``path`` (one of :data:`CLASSES`), ``None`` if it is not tether's."""
    if path is None:
        return None
    workspace = str(run_dir / WORKSPACE)
    if path != workspace and not path.startswith(workspace + "/"):
        return None  # the lab's instrument files, python, libraries, /dev/urandom …
    relative = path[len(workspace) + 1 :]
    if relative == ".tether/sessions" or relative.startswith(".tether/sessions/"):
        return "session"
    if relative.startswith(".tether/effects.db"):
        return "effects-db"
    if relative.startswith(".tether/ledger.db"):
        return None  # publish-report's simulated remote service, not tether's own state
    if relative == ".tether" or relative.startswith(".tether/"):
        return "tether-dir"
    return "workspace"


def normalize(path: str, run_dir: Path) -> str:
    """``path`` with what differs between runs taken out (run folder, session, temp names)."""
    text = path.replace(str(run_dir), "RUN", 1)
    text = _SESSION_NAME.sub("SESSION", text)
    text = _SESSION_ID.sub("ID", text)
    return _TEMP_NAME.sub(".TMP.tether-tmp", text)


@dataclass(frozen=True, slots=True)
class Site:
    """The ``hit``-th call of ``syscall`` in the main thread, on a file of ``file_class``."""

    syscall: str
    hit: int
    file_class: str
    path: str
    """Normalized (:func:`normalize`)."""
    path_hit: int
    """Which call of ``syscall`` on ``path`` it is (1-based): how the lab re-aims."""

    @property
    def spec(self) -> str:
        return f"{self.syscall}@{self.hit}"


@dataclass(frozen=True, slots=True)
class IoCase:
    scenario: str
    site: Site
    errno: str

    @property
    def fault(self) -> str:
        return f"{self.site.syscall}@{self.site.hit}:{self.errno} on {self.site.path}"

    @property
    def key(self) -> str:
        return f"{self.scenario}:{self.site.spec}:{self.errno}"


def sites_from_calls(
    calls: Sequence[Call], run_dir: Path, main_pid: int | None = None
) -> tuple[list[Site], int]:
    """Every main-thread call on a tether file as a :class:`Site`, and how many calls on
    tether files other threads made (they cannot be aimed at without ``-f``)."""
    if main_pid is None:
        main_pid = calls[0].pid if calls else 0
    counts: dict[str, int] = {}
    per_path: dict[tuple[str, str], int] = {}
    sites: list[Site] = []
    elsewhere = 0
    for call in calls:
        if call.name not in SYSCALLS:
            continue
        path = call_path(call)
        file_class = classify(path, run_dir)
        if call.pid != main_pid:
            elsewhere += file_class is not None
            continue
        counts[call.name] = counts.get(call.name, 0) + 1
        if file_class is None or path is None:
            continue
        where = normalize(path, run_dir)
        key = (call.name, where)
        per_path[key] = per_path.get(key, 0) + 1
        sites.append(Site(call.name, counts[call.name], file_class, where, per_path[key]))
    return sites, elsewhere


def bounded_cases(scenario: str, sites: Sequence[Site]) -> list[IoCase]:
    """The first and the last hit of every ``(syscall, file class)``; the errnos taken in
    turn over them (tether handles every errno of a call alike, so each site gets one, and
    each errno about a quarter of the sites)."""
    chosen: dict[tuple[str, str], list[Site]] = {}
    for site in sites:
        chosen.setdefault((site.syscall, site.file_class), []).append(site)
    picked: list[Site] = []
    for group in chosen.values():
        picked.extend(dict.fromkeys((group[0], group[-1])))
    picked.sort(key=lambda s: (SYSCALLS.index(s.syscall), s.hit))
    return [IoCase(scenario, site, ERRNOS[i % len(ERRNOS)]) for i, site in enumerate(picked)]


def full_cases(scenario: str, sites: Sequence[Site]) -> list[IoCase]:
    """Every hit with every errno."""
    return [IoCase(scenario, site, errno) for site in sites for errno in ERRNOS]


# =========================================================================== running


SERVER_ENV = {"PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
"""The same calls in the same order in every job: the N-th call of the dry run is the
N-th call of the run that fails it (fork servers and fresh interpreters alike)."""
EXIT_INTERNAL = errors.EXIT_INTERNAL


def _strace_env(plant: str | None) -> dict[str, str]:
    env = child_environment()
    env.pop(IO_PLANT_ENV, None)
    # The same calls in the same order on every run: the N-th call of a dry run is the
    # N-th call of the run that fails it.
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if plant:
        env[IO_PLANT_ENV] = plant
    return env


def _child_argv(scenario: str, run_dir: Path, mode: str) -> list[str]:
    return [sys.executable, "-m", "tether.testing.crashlab.child", scenario, str(run_dir), mode]


_EXIT = re.compile(
    r"^(?:(?P<pid>\d+)\s+)?\+\+\+ (?:exited with (?P<code>\d+)|killed by SIG(?P<sig>\w+))"
)
_SIGNALS = {"KILL": 9, "TERM": 15, "ABRT": 6, "SEGV": 11, "INT": 2, "BUS": 7}


def _exit_status(log_text: str) -> int | None:
    """The traced job's exit status from strace's ``+++ exited with N +++`` (first pid)."""
    first: str | None = None
    for line in log_text.splitlines():
        pid = line.split(" ", 1)[0] if line[:1].isdigit() else ""
        if first is None:
            first = pid
        m = _EXIT.match(line)
        if m is not None and (m.group("pid") or "") == first:
            if m.group("code") is not None:
                return int(m.group("code"))
            return -_SIGNALS.get(m.group("sig"), 9)
    return None


def _strace(
    workers: _Workers,
    scenario: str,
    run_dir: Path,
    log: Path,
    *,
    trace: str,
    inject: str | None,
    follow: bool,
    plant: str | None,
    timeout: float,
) -> JobResult:
    """The child's ``run`` mode under strace: forked from a fork server (strace attaches
    before ``main`` starts) or, without one, a fresh interpreter."""
    exe = shutil.which("strace") or "strace"
    command = [exe, "-q", "-y", "-s", "512", "-e", "signal=none", "-e", f"trace={trace}"]
    if follow:
        command.append("-f")
    if inject is not None:
        command += ["-e", f"inject={inject}"]
    command += ["-o", str(log)]
    runner = workers.runner()
    env = {IO_PLANT_ENV: plant} if plant else {}
    if isinstance(runner, ForkServerRunner):
        job = runner.run(
            [scenario, str(run_dir), "run"],
            env=env,
            out=log.with_suffix(""),
            timeout=timeout,
            strace=command,
        )
        text = log.read_text(errors="replace") if log.exists() else ""
        code = _exit_status(text)
        if code is None:
            code = job.returncode if job.returncode != 0 else EXIT_INTERNAL
        return JobResult(code, job.elapsed, job.timed_out, job.stdout, job.stderr)
    command += ["--", *_child_argv(scenario, run_dir, "run")]
    started = time.perf_counter()
    stdout, stderr = log.with_suffix(".stdout"), log.with_suffix(".stderr")
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        proc = subprocess.Popen(
            command,
            cwd=run_dir,
            env={**_strace_env(plant), **workers.env},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        timed_out = False
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, 9)
            code = proc.wait()
    return JobResult(
        code,
        time.perf_counter() - started,
        timed_out,
        stdout.read_text(errors="replace"),
        stderr.read_text(errors="replace"),
    )


@dataclass
class IoDiscovery:
    scenario: Scenario
    sites: list[Site]
    background: int
    """Calls on tether files made by threads other than the main one (not aimed at)."""
    error: str | None = None
    cases: list[IoCase] = field(default_factory=list)


def discover(
    workers: _Workers, scenario: Scenario, run_dir: Path, *, timeout: float
) -> IoDiscovery:
    """Run ``scenario`` once under ``strace -f``: its sites."""
    prepare_run_dir(run_dir, scenario, "durable")
    log = run_dir / "out" / "discover.strace"
    run = _strace(
        workers,
        scenario.name,
        run_dir,
        log,
        trace=",".join(SYSCALLS),
        inject=None,
        follow=True,
        plant=None,
        timeout=timeout,
    )
    if run.returncode != 0:
        why = "timed out" if run.timed_out else f"exit status {run.returncode}"
        return IoDiscovery(scenario, [], 0, f"the unfaulted run failed ({why}) {run.stderr_tail()}")
    calls = parse(log.read_text(errors="replace"))
    sites, background = sites_from_calls(calls, run_dir.resolve())
    if not sites:
        return IoDiscovery(
            scenario, [], background, "the unfaulted run made no call on a tether file"
        )
    return IoDiscovery(scenario, sites, background)


@dataclass
class IoCaseResult:
    case: IoCase
    result: CaseResult | None
    """``None``: the injection could not be aimed at the site (see ``aim``)."""
    aimed_at: int | None
    """The ``when=N`` that hit the site (differs from the site's N when re-aimed)."""
    tries: int
    aim: str = ""
    seconds: float = 0.0
    outcome: str = ""
    """How the faulted run ended: ``absorbed`` (exit 0), the typed error's name, or
    ``exit N`` / ``timed out`` (a failure)."""

    @property
    def verdict(self) -> str:
        return "unaimed" if self.result is None else self.result.verdict

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "scenario": self.case.scenario,
            "syscall": self.case.site.syscall,
            "hit": self.case.site.hit,
            "errno": self.case.errno,
            "fileClass": self.case.site.file_class,
            "path": self.case.site.path,
            "aimedAt": self.aimed_at,
            "tries": self.tries,
            "verdict": self.verdict,
            "seconds": round(self.seconds, 2),
            "outcome": self.outcome,
        }
        if self.result is None:
            out["aim"] = self.aim
        else:
            out["failures"] = list(self.result.failures)
            out["lostAcknowledged"] = self.result.lost_acknowledged
            out["duplicateEffects"] = self.result.duplicates
            out["runDir"] = self.result.run_dir
            out["reproduce"] = self.result.reproduce
            out["childCommand"] = self.result.child_command
        return out


def cli_command(case: IoCase, plant: str | None = None) -> str:
    """``tether crashlab --io-errors --scenario S --site SYSCALL@N:ERRNO --keep``."""
    site = f"{case.site.syscall}@{case.site.hit}:{case.errno}"
    argv = ["tether", "crashlab", "--io-errors", "--scenario", case.scenario]
    env = f"{IO_PLANT_ENV}={shlex.quote(plant)} " if plant else ""
    return env + shlex.join([*argv, "--site", site, "--keep"])


def reproduce_command(case: IoCase, run_dir: Path, when: int, plant: str | None = None) -> str:
    """The case by hand: rebuild the run folder, fail the call, resume twice."""
    child = [shlex.join(_child_argv(case.scenario, run_dir, m)) for m in ("reset", "run", "resume")]
    sc = case.site.syscall
    env = f"{IO_PLANT_ENV}={plant} " if plant else ""
    strace = (
        f"PYTHONHASHSEED=0 PYTHONDONTWRITEBYTECODE=1 {env}strace -qq -e trace={sc} "
        f"-e inject={sc}:error={case.errno}:when={when} {child[1]}"
    )
    return f"{child[0]} && {strace}; {child[2]} && {child[2]}"


def _aim(calls: Sequence[Call], site: Site, run_dir: Path) -> tuple[bool, int | None, str]:
    """Whether the one injected call is the site's; else the ``when`` to try next."""
    injected = [(i, c) for i, c in enumerate(calls, 1) if c.injected]
    on_path = [
        i for i, c in enumerate(calls, 1) if normalize(call_path(c) or "", run_dir) == site.path
    ]
    if len(injected) == 1:
        position, call = injected[0]
        where = normalize(call_path(call) or "", run_dir)
        if where == site.path and on_path.index(position) + 1 == site.path_hit:
            return True, position, ""
        seen = f"{call.name}@{position} on {where}"
    else:
        seen = f"{len(injected)} injected calls"
    # Re-aim: where the site's call (by its ordinal on its file) sat in this run.
    if len(on_path) >= site.path_hit:
        return False, on_path[site.path_hit - 1], seen
    return False, None, seen


def run_case(
    workers: _Workers,
    case: IoCase,
    scenario: Scenario,
    run_dir: Path,
    *,
    strict: bool,
    timeout: float,
    plant: str | None,
    reproduce: Callable[[IoCase], str] | None = None,
) -> IoCaseResult:
    started = time.perf_counter()
    site = case.site
    when = site.hit
    trail: list[str] = []
    run: JobResult | None = None
    aimed = False
    tries = 0
    while tries < AIM_TRIES:
        tries += 1
        prepare_run_dir(run_dir, scenario, "durable")
        log = run_dir / "out" / "run.strace"
        run = _strace(
            workers,
            case.scenario,
            run_dir,
            log,
            trace=site.syscall,
            inject=f"{site.syscall}:error={case.errno}:when={when}",
            follow=False,
            plant=plant,
            timeout=timeout,
        )
        calls = parse(log.read_text(errors="replace") if log.exists() else "")
        aimed, next_when, seen = _aim(calls, site, run_dir)
        if aimed:
            break
        trail.append(f"when={when} hit {seen}")
        if next_when is None or next_when == when:
            next_when = when + 1
        when = next_when
    if not aimed or run is None:
        aim = "; ".join(trail)
        return IoCaseResult(case, None, None, tries, aim, time.perf_counter() - started)
    pre_log = session_log_bytes(run_dir)
    acks = _acks(run_dir)
    if scenario.tamper:
        apply_tamper(run_dir, scenario)
    runner = workers.runner()
    result = CaseResult(
        Case(case.scenario, f"{site.syscall}:{case.errno}", site.hit),
        crashed=False,
        fault=case.fault,
        run_dir=str(run_dir),
    )
    # By hand only where N counts from the interpreter's start (a forked job's N does not).
    forked = isinstance(runner, ForkServerRunner)
    result.child_command = "" if forked else reproduce_command(case, run_dir, when, plant)
    result.reproduce = reproduce(case) if reproduce is not None else cli_command(case, plant)
    resume_and_evaluate(
        runner,
        scenario,
        result,
        run_dir,
        strict=strict,
        run=run,
        pre_log=pre_log,
        acks=acks,
        timeout=timeout,
    )
    elapsed = time.perf_counter() - started
    item = IoCaseResult(case, result, when, tries, "; ".join(trail), elapsed)
    item.outcome = _outcome(run)
    return item


def _outcome(run: JobResult) -> str:
    if run.timed_out:
        return "timed out"
    if run.returncode == 0:
        return "absorbed"
    error = (run.json() or {}).get("error")
    if run.returncode == 3 and isinstance(error, dict):
        return str(error.get("type"))
    return f"exit {run.returncode}"


# =========================================================================== the lab


@dataclass
class IoLabOptions:
    scenarios: Sequence[Scenario]
    full: bool = False
    jobs: int = 0
    timeout: float = DEFAULT_TIMEOUT
    workdir: Path | None = None
    keep: bool = False
    fork: bool = True
    plant: str | None = None
    """A planted bug for the child (``TETHER_LAB_IO_PLANT``), to show the lab catches it."""
    limit: int | None = None
    """Run at most this many cases per scenario (spread evenly over the selection)."""
    sites: Sequence[tuple[str, int | None, str | None]] = ()
    """Only these ``(syscall, N or every hit, errno or every errno)``; empty: the selection
    (bounded or full). A named site is run with the errnos it names (all four if none)."""
    reproduce: Callable[[IoCase], str] | None = None


@dataclass
class IoLabResult:
    options: IoLabOptions
    discoveries: list[IoDiscovery]
    results: list[IoCaseResult]
    wall_seconds: float
    workdir: Path

    @property
    def ran(self) -> list[IoCaseResult]:
        return [r for r in self.results if r.result is not None]

    @property
    def failures(self) -> list[IoCaseResult]:
        return [r for r in self.results if r.verdict == "fail"]

    @property
    def unaimed(self) -> list[IoCaseResult]:
        return [r for r in self.results if r.result is None]

    @property
    def lost_acknowledged(self) -> int:
        return sum(r.result.lost_acknowledged for r in self.ran if r.result is not None)

    @property
    def duplicate_effects(self) -> int:
        return sum(r.result.duplicates for r in self.ran if r.result is not None)

    @property
    def calls(self) -> int:
        return len({(r.case.scenario, r.case.site) for r in self.ran})

    @property
    def errnos(self) -> int:
        return len({r.case.errno for r in self.ran})

    @property
    def verdict(self) -> str:
        broken = any(d.error is not None for d in self.discoveries)
        return "FAIL" if self.failures or broken or not self.ran else "PASS"


def parse_site_filter(specs: Iterable[str]) -> list[tuple[str, int | None, str | None]]:
    """``SYSCALL``, ``SYSCALL@N``, ``SYSCALL:ERRNO`` or ``SYSCALL@N:ERRNO`` (ValueError if bad)."""
    out: list[tuple[str, int | None, str | None]] = []
    for spec in specs:
        head, colon, errno = spec.strip().partition(":")
        name, at, count = head.partition("@")
        if name not in SYSCALLS:
            raise ValueError(
                f"bad --site {spec!r}: {name!r} is not a traced call ({', '.join(SYSCALLS)})"
            )
        if at and (not count.isdigit() or int(count) < 1):
            raise ValueError(f"bad --site {spec!r}: N must be a positive integer")
        if colon and errno not in ERRNOS:
            raise ValueError(f"bad --site {spec!r}: the errno must be one of {', '.join(ERRNOS)}")
        out.append((name, int(count) if at else None, errno if colon else None))
    return out


def _select(
    cases: list[IoCase], wanted: Sequence[tuple[str, int | None, str | None]]
) -> list[IoCase]:
    if not wanted:
        return cases
    return [
        c
        for c in cases
        if any(
            c.site.syscall == name and n in (None, c.site.hit) and e in (None, c.errno)
            for name, n, e in wanted
        )
    ]


def _spread(cases: list[IoCase], limit: int | None) -> list[IoCase]:
    if limit is None or len(cases) <= limit:
        return cases
    step = len(cases) / limit
    return [cases[int(i * step)] for i in range(limit)]


ProgressHook = Callable[[str, Any], None]


def run_io_lab(options: IoLabOptions, progress: ProgressHook | None = None) -> IoLabResult:
    """Discover every scenario's sites, run the chosen cases in parallel, judge each."""
    started = time.perf_counter()
    jobs = options.jobs if options.jobs > 0 else (os.cpu_count() or 1)
    strict = effects_integrated()
    if options.workdir is not None:
        options.workdir.mkdir(parents=True, exist_ok=True)
        base = Path(tempfile.mkdtemp(prefix="crashlab-io-", dir=options.workdir))
    else:
        base = Path(tempfile.mkdtemp(prefix="tether-crashlab-io-"))
    base = base.resolve()
    workers = _Workers(jobs, options.fork, SERVER_ENV)
    discoveries: list[IoDiscovery] = []
    results: list[IoCaseResult] = []
    try:
        futures = [
            workers.pool.submit(
                discover, workers, s, base / s.name / "discover", timeout=options.timeout
            )
            for s in options.scenarios
        ]
        discoveries = [f.result() for f in futures]
        choose = full_cases if options.full or options.sites else bounded_cases
        for d in discoveries:
            d.cases = _spread(
                _select(choose(d.scenario.name, d.sites), options.sites), options.limit
            )
            if d.error is None and not options.keep:
                shutil.rmtree(base / d.scenario.name / "discover", ignore_errors=True)
        if progress is not None:
            progress("discovered", discoveries)
        by_name = {s.name: s for s in options.scenarios}
        pending = [
            workers.pool.submit(
                run_case,
                workers,
                case,
                by_name[case.scenario],
                base / case.scenario / f"{case.site.syscall}@{case.site.hit}-{case.errno}",
                strict=strict,
                timeout=options.timeout,
                plant=options.plant,
                reproduce=options.reproduce,
            )
            for d in discoveries
            for case in d.cases
        ]
        order = {future: index for index, future in enumerate(pending)}
        finished: dict[int, IoCaseResult] = {}
        from concurrent.futures import as_completed

        for future in as_completed(pending):
            item = future.result()
            finished[order[future]] = item
            if item.verdict not in ("fail", "unaimed") and not options.keep:
                if item.result is not None and item.result.run_dir:
                    shutil.rmtree(item.result.run_dir, ignore_errors=True)
            if progress is not None:
                progress("case", item)
        results = [finished[i] for i in range(len(pending))]
    finally:
        workers.close()
    if not options.keep:
        for root, _dirs, _files in sorted(os.walk(base), key=lambda x: -len(x[0])):
            try:
                os.rmdir(root)
            except OSError:
                pass
    return IoLabResult(options, discoveries, results, time.perf_counter() - started, base)


def scenarios_for(names: Iterable[str], full: bool) -> list[Scenario]:
    """The named built-in scenarios, or the lab's defaults (bounded or full)."""
    chosen = list(dict.fromkeys(names)) or list(FULL_SCENARIOS if full else BOUNDED_SCENARIOS)
    return [BUILTIN_SCENARIOS[n] for n in chosen]
