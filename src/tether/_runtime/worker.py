"""The log is the queue: ``submit`` accepts a prompt durably, workers drive what is unfinished.

:func:`submit` commits a user entry and ``runStarted`` (the transaction ``tether run``
commits first) and returns: the session now has an unfinished run, which is all a worker
looks for. :func:`submit_all` (``tether submit --from FILE``, lines parsed by
:func:`parse_submissions`) accepts many: on the shared store 1,000 new sessions per
database transaction (:meth:`~tether._stores.postgres.PostgresSessions.create_queued`).

:class:`Worker` drives up to ``concurrency`` sessions at once (1 to
:data:`MAX_CONCURRENCY`), each with its own :class:`~tether._runtime.agent.Agent` over a
shared store (:mod:`tether._stores.postgres`), as a greenlet on one of :data:`HUBS` hub
threads (:mod:`tether._hub`).
Its loop claims the oldest unfinished sessions of its environment identity whose leases
are free or expired (``FOR UPDATE SKIP LOCKED``) while fewer than the limit are in flight
(as many as there are free slots, up to :data:`CLAIM_BATCH` in one statement, when every
slot shares the process's one opener), and starts a session on the least busy hub for
each, which drives it with the normal executor (``resume``: the same planner as after a
crash) and releases the lease. A session of another environment identity is
never claimed: it waits for a worker that serves it.

What a session in flight costs (docs/scale-out.md, "Many sessions per worker"): ``tether
worker`` gives every agent the process's one session opener (:class:`FleetSessions`: one
set of connections, one lease renewal for every lease) and one workspace database
(:class:`SharedWorkspaceDB`) through the composition's seams (:func:`fleet_openers`);
agents are made lazily, when a claim needs one and none is free, and kept for the next
session; the first is prepared (:meth:`~tether._runtime.agent.Agent.prepare`: the executor,
the model's SDK client, the tools' validators) before the first claim; every thread the
process starts meanwhile has a :data:`STACK_BYTES` stack. A session waiting on its model
holds no thread: its read of the answer parks its greenlet until the answer's bytes arrive
(the process's one watchdog thread still ends the calls that overrun or are cancelled:
:func:`tether._models.streaming.run_stream`), and so do a connection being made, a command
it runs and a commit behind the group commit's leader; the calls of other tools than
``bash`` run on helper threads while it is parked (:func:`tether._hub.offload`). So a
thousand sessions waiting on their models cost their state and a few hub threads. The collector
runs less often while the worker runs (:data:`GC_FIRST_THRESHOLD`).

* a session whose recovery is blocked (a gate, a review) is parked: out of the queue until
  its next commit (a person resolving it);
* :class:`~tether.errors.SessionFenced`: this worker lost a lease (it was paused past its
  expiry and another worker took over). It takes no new work, every drive stops at its
  next durable point, and the worker exits with the fenced error's code;
* any other error driving a session (a corrupt log, …): the session is parked, the worker
  goes on;
* back-pressure: a drive that ends on :class:`~tether.errors.StoreUnavailable` (no
  connection to be had for its session, or the database away longer than a commit waits)
  gives its session back and lowers the in-flight limit to what the store holds now; it
  grows again by half every :data:`GROW_SECONDS` without a refusal. A claim that fails
  waits a second and tries again. Each is said once per outage. The worker exits with the
  store error's code only when the store has been unreachable for
  :data:`UNREACHABLE_SECONDS` with no session in flight;
* :meth:`Worker.stop` (``SIGTERM``): no new claims; each session finishes the step it is in
  (the model request being answered, or the tool call running, until its result is
  committed: the executor's stop signal,
  :meth:`~tether._runtime.executor.Executor.set_stop_signal`), leaves the session's
  operation unfinished, releases its lease at once (claimable again right away, not after
  expiry), and the worker exits 0. Another worker continues each such session from that
  durable point with the same planner as after a crash there: nothing done is done again;
* ``status_every``: a status line (sessions in flight, finished, commits/s, lease
  renewals, the store's ``metrics()`` when it has them); :func:`fleet_status` is
  ``tether worker --status``: the queue and each worker's leases, from the database.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar, cast

import tether._faults as faults
import tether._runtime.boundaries as boundaries
from tether._clock import SYSTEM_CLOCK, Clock
from tether._hub import Hub
from tether._ids import new_uuid7
from tether._loading import gc_less_often
from tether._project import find_workspace_root
from tether._runtime.agent import Agent
from tether._runtime.results import RunStatus
from tether._settings import Settings
from tether._stores.protocol import ClosesOnExit, SessionStoreProtocol
from tether._text import printable
from tether._wsdb.protocol import WorkspaceDB, WorkspaceDBOpener
from tether.core import facts
from tether.core.state import IdleOperation
from tether.errors import (
    ConfigurationError,
    EffectsDatabaseError,
    SessionBusy,
    SessionFenced,
    StoreUnavailable,
    TetherError,
)

__all__ = [
    "MAX_CONCURRENCY",
    "SUBMIT_BATCH",
    "UNREACHABLE_SECONDS",
    "FleetSessions",
    "FleetStatus",
    "SharedWorkspaceDB",
    "Submission",
    "Worker",
    "WorkerLeases",
    "WorkerReport",
    "check_concurrency",
    "fleet_openers",
    "fleet_status",
    "parse_submissions",
    "submit",
    "submit_all",
    "when_reachable",
]

UNREACHABLE_SECONDS: Final = 30.0
POLL_SECONDS: Final = 0.2

GC_FIRST_THRESHOLD: Final = 20_000
"""Allocations between young collections while the worker runs
(:func:`tether._loading.gc_less_often`: the interpreter's 700 made the collector traverse
every session in flight again and again)."""


def _shared_store(agent: Agent) -> Any:
    sessions = agent.parts.sessions
    if not hasattr(sessions, "claim"):
        raise ConfigurationError(
            "submit and worker need a shared store: give --store postgresql://… "
            "(or TETHER_STORE_URL, or [store] url in tether.toml)"
        )
    return sessions


CLAIM_BATCH: Final = 64
"""The most sessions a worker claims in one statement when its slots share one opener."""


def _claim(sessions: Any, environment: str, free: int) -> list[str]:
    """Up to ``free`` (at most :data:`CLAIM_BATCH`) claimed sessions in one round trip when
    ``sessions`` is the worker's one opener for every slot (:class:`FleetSessions`, whose
    claims any slot can open), else one: another slot's own opener could not open it."""
    if isinstance(sessions, FleetSessions) and hasattr(sessions.inner, "claim_many"):
        claimed: list[str] = sessions.inner.claim_many(environment, min(free, CLAIM_BATCH))
        return claimed
    session = sessions.claim(environment)
    return [] if session is None else [session]


def submit(agent: Agent, prompt: str, session: str | None = None, *, shared: bool = True) -> str:
    """Accept ``prompt`` durably as a new run (in a new session unless ``session``); the
    session id. Nothing is driven: a worker picks it up (``shared``: the store must be one
    a worker reads; without it, any store: ``tether resume`` drives the run)."""
    if not prompt or not prompt.strip():
        raise ConfigurationError("the prompt is empty")
    if shared:
        _shared_store(agent)
    sessions = agent.parts.sessions
    if session is None:
        store = sessions.create(
            provider=agent.model.provider,
            model=agent.model.model,
            environment_identity=agent.environment,
        )
    else:
        store = sessions.open(session)
    with store:
        if not isinstance(store.state.operation, IdleOperation):
            raise ConfigurationError(
                f"session {store.session_id} has an unfinished operation; a worker finishes "
                "it first (submit again afterwards)"
            )
        store.commit(_run_facts(agent, prompt))
        faults.hit(boundaries.RUN_ACCEPTED)
        return str(store.session_id)


SUBMIT_BATCH: Final = 1000
"""Sessions per database transaction of ``tether submit --from`` on a shared store."""

SUBMISSION_KEYS: Final = ("prompt", "session")


@dataclass(frozen=True)
class Submission:
    """One line of a ``tether submit --from`` file (docs/scale-out.md, "Submitting many")."""

    prompt: str
    session: str | None = None
    """Add the run to this existing session (as ``--session``) instead of a new one."""


def parse_submissions(data: bytes, source: str) -> list[Submission]:
    """The submissions of a JSON-lines file: per line a JSON object ``{"prompt": TEXT,
    "session": ID}`` (``session`` optional) or a JSON string (the prompt); blank lines are
    skipped. Every problem is one :class:`ConfigurationError` line naming ``source`` and the
    line number; nothing is accepted from a file with a bad line."""
    items: list[Submission] = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        where = f"{source} line {number}"
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not JSON"
            raise ConfigurationError(f"{where}: not valid JSON ({reason})") from None
        if isinstance(value, str):
            value = {"prompt": value}
        if not isinstance(value, dict):
            raise ConfigurationError(
                f'{where}: expected an object {{"prompt": …}} or a string, got {_kind(value)}'
            )
        for key in value:
            if key not in SUBMISSION_KEYS:
                raise ConfigurationError(
                    f"{where}: unknown key {printable(str(key))[:40]!r} "
                    f"(known: {', '.join(SUBMISSION_KEYS)})"
                )
        prompt = value.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            got = "an empty prompt" if isinstance(prompt, str) else _kind(prompt)
            raise ConfigurationError(f'{where}: "prompt" must be a non-empty string, got {got}')
        session = value.get("session")
        if session is not None and (not isinstance(session, str) or not session.strip()):
            raise ConfigurationError(
                f'{where}: "session" must be a session id string, got {_kind(session)}'
            )
        items.append(Submission(prompt, session))
    if not items:
        raise ConfigurationError(f"{source}: no prompts in it")
    return items


def _kind(value: object) -> str:
    """What a JSON value is, for a message (never the value: it may be long or secret)."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    for kind, name in names.items():
        if isinstance(value, kind):
            return name
    return "a number"


def submit_all(
    agent: Agent,
    items: Sequence[Submission],
    *,
    accepted: Callable[[list[str]], None],
    batch: int = SUBMIT_BATCH,
) -> int:
    """Accept every submission durably, in order; ``accepted`` gets the session ids of each
    group as soon as it is durable. How many were accepted.

    On a shared store (PostgreSQL) the new sessions go ``batch`` at a time, each batch one
    database transaction (all of it or nothing); elsewhere (the file store) one session at a
    time, each durable before the next. A line naming an existing ``session`` is its own
    transaction, as ``tether submit --session`` (its session must have no unfinished
    operation). A failure stops there: the groups already passed to ``accepted`` stay.
    """
    sessions = agent.parts.sessions
    queued = getattr(sessions, "create_queued", None)  # the shared store's batch insert
    done = 0
    pending: list[Submission] = []

    def flush() -> None:
        nonlocal done
        if not pending:
            return
        assert queued is not None
        ids = queued(
            [_run_facts(agent, item.prompt) for item in pending],
            provider=agent.model.provider,
            model=agent.model.model,
            environment_identity=agent.environment,
        )
        accepted(list(ids))
        done += len(ids)
        pending.clear()

    for item in items:
        if queued is not None and item.session is None:
            pending.append(item)
            if len(pending) >= batch:
                flush()
            continue
        flush()
        accepted([submit(agent, item.prompt, item.session, shared=False)])
        done += 1
    flush()
    return done


def _run_facts(agent: Agent, prompt: str) -> list[dict[str, Any]]:
    """The first transaction of a run (what ``tether run`` commits first): the user entry
    (secrets masked) and ``runStarted``."""
    entry_id = agent.parts.ids()
    return [
        agent.masker.value(facts.user_entry(entry_id=entry_id, content=prompt)),
        facts.run_started(operation_id=agent.parts.ids(), input_entry_id=entry_id),
    ]


@dataclass
class WorkerReport:
    """What a worker did, and how it ended."""

    driven: dict[str, str] = field(default_factory=dict)
    """Session id → the status of its last drive."""
    fenced: SessionFenced | None = None
    failed: TetherError | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


# ---------------------------------------------------------------- one opener per process


class _CountedStore(ClosesOnExit):
    """One open session of :class:`FleetSessions`: the store itself, its commits counted
    (the worker's status line); everything else is the store's."""

    def __init__(self, store: SessionStoreProtocol, fleet: FleetSessions) -> None:
        self._store = store
        self._fleet = fleet

    def commit(
        self, facts: Sequence[Mapping[str, Any]], *, sync: bool = True
    ) -> list[dict[str, Any]]:
        committed = self._store.commit(facts, sync=sync)
        self._fleet.counted(len(committed))
        return committed

    def close(self) -> None:
        self._store.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class FleetSessions:
    """The one session opener of a worker process, shared by the agent of every slot
    (:attr:`~tether._runtime.compose.Seams.session_store`): one set of connections, one
    lease-renewal loop for every session the process drives. It is the shared store's
    opener itself (every attribute is its own: ``claim``, ``renewals``, ``metrics``…),
    counting the transactions and facts its sessions commit."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._lock = threading.Lock()
        self.commits = 0
        self.facts = 0

    def counted(self, facts: int) -> None:
        with self._lock:
            self.commits += 1
            self.facts += facts

    def create(self, *, provider: str, model: str, environment_identity: str) -> Any:
        store = self.inner.create(
            provider=provider, model=model, environment_identity=environment_identity
        )
        return _CountedStore(store, self)

    def open(self, session: str) -> Any:
        return _CountedStore(self.inner.open(session), self)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _SharedView:
    """What an agent's opener returns: the worker's one workspace database, whose closing
    is the worker's (an agent closing it closes nothing)."""

    def __init__(self, shared: SharedWorkspaceDB) -> None:
        self._shared = shared

    def close(self) -> None:
        """The worker closes the database (:meth:`SharedWorkspaceDB.close`)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._shared.current(), name)


class SharedWorkspaceDB:
    """One workspace database for every agent of a worker process: opened when first
    needed, opened again when its connection was lost (a database restart), closed once by
    the worker. Its implementations serialize their own use (a lock per database)."""

    def __init__(self, opener: WorkspaceDBOpener) -> None:
        self._opener = opener
        self._db: WorkspaceDB | None = None
        self._lock = threading.Lock()

    def current(self) -> WorkspaceDB:
        with self._lock:
            db = self._db
            if db is None or db.closed:
                if db is not None:
                    with contextlib.suppress(Exception):
                        db.close()
                self._db = db = self._opener()
            return db

    def opener(self) -> WorkspaceDBOpener:
        def open_view() -> WorkspaceDB:
            return cast(WorkspaceDB, _SharedView(self))

        return open_view

    def close(self) -> None:
        with self._lock:
            db, self._db = self._db, None
        if db is not None:
            db.close()


def fleet_openers(settings: Settings) -> tuple[FleetSessions, SharedWorkspaceDB]:
    """The session opener and the workspace database a worker's agents share, built as
    :func:`~tether._runtime.compose.compose` builds an agent's own for these settings (the
    same lease, ``cwd``, tables), once per process. The caller closes both."""
    from tether._runtime.compose import _shared_db_opener, _shared_sessions

    url = settings.store
    if not url:
        raise ConfigurationError("a worker needs a shared store: give --store postgresql://…")
    real = Path(os.path.realpath(find_workspace_root(settings.workspace).path))
    inner = _shared_sessions(settings, url, real, SYSTEM_CLOCK, new_uuid7)
    return FleetSessions(inner), SharedWorkspaceDB(_shared_db_opener(real, url))


_T = TypeVar("_T")


def when_reachable(
    open_store: Callable[[], _T],
    *,
    stop: threading.Event,
    log: Callable[[str], None],
    clock: Clock = SYSTEM_CLOCK,
) -> _T | None:
    """``open_store()``, tried again every second while the store is unavailable.

    A worker started before its database answers (a fleet booting with it, a database
    restarting, its connections all taken) waits for it as a running worker waits for
    its claims: said once, retried every second, the store's error raised only once it
    has been unavailable for :data:`UNREACHABLE_SECONDS`. ``None`` when ``stop`` is set
    meanwhile (``SIGTERM`` before the store answered: nothing was claimed)."""
    since: float | None = None
    while True:
        try:
            return open_store()
        except StoreUnavailable as exc:
            now = clock.monotonic()
            if since is None:
                since = now
                log(f"store unavailable, retrying: {exc}")
            if now - since > UNREACHABLE_SECONDS:
                raise
        if clock.wait(stop, 1.0):
            return None


# ---------------------------------------------------------------- the worker

MAX_CONCURRENCY: Final = 10_000
"""The most sessions one worker process drives at once (``--concurrency``)."""
HUBS: Final = 4
"""Threads that run a worker's sessions (:mod:`tether._hub`: each session a greenlet that
parks while it waits). Measured with 1,000 sessions in flight (``bench/bench_fleet.py``),
as the hubs were built: 2, 3 and 4 hubs alike (7.8-9.0 s); 1 hub 12.5 s (its sessions
wait for each other's statements) and 8 hubs 12.2 s (more threads, more GIL hand-offs)."""
STACK_BYTES: Final = 1 << 20
"""The stack of every thread the process starts while a worker runs (a hub's, a helper's):
1 MiB instead of the platform's usual 8 MiB of address space. Python frames live on the
heap; a thread's C stack only holds the interpreter's and the C libraries' frames (JSON,
TLS, SQLite), far below this."""
GROW_SECONDS: Final = 2.0
"""After the store refused a session (no connection to be had), the in-flight limit grows
again by half once this long has passed without another refusal."""


class Worker:
    """Claims sessions and drives each as a greenlet on a hub (see the module docstring).

    ``make_agent`` builds one agent per slot, lazily: a slot is made when a claim needs
    one and none is free, and kept for the next session; at most ``concurrency`` sessions
    are driven at once. Its opener must be a shared store (one per agent, or better the
    same :class:`FleetSessions` for every agent, whose claims fill up to
    :data:`CLAIM_BATCH` free slots in one statement). ``until_empty`` ends the worker once no
    unfinished session of its environment is left (leased by anyone or not); ``log``
    receives one line per event, and a status line every ``status_every`` seconds (0: none).
    """

    def __init__(
        self,
        make_agent: Callable[[], Agent],
        *,
        concurrency: int = 1,
        until_empty: bool = False,
        log: Callable[[str], None] = lambda line: None,
        status_every: float = 0.0,
        stack_size: int = STACK_BYTES,
        hubs: int = HUBS,
    ) -> None:
        check_concurrency(concurrency)
        if not 1 <= hubs <= 64:
            raise ConfigurationError(f"a worker runs 1 to 64 hubs, got {hubs}")
        if not status_every >= 0:
            raise ConfigurationError(
                f"--status-every must be 0 (off) or a number of seconds, got {status_every}"
            )
        self.make_agent = make_agent
        self.concurrency = concurrency
        self.until_empty = until_empty
        self.log = log
        self.status_every = float(status_every)
        self.stack_size = stack_size
        self.hubs = min(hubs, concurrency)
        self.report = WorkerReport()
        self._stop = threading.Event()
        self._why = ""
        self._cond = threading.Condition()
        self._agents: list[Agent] = []
        self._idle: list[Agent] = []
        self._running: set[threading.Event] = set()
        self._error: BaseException | None = None  # a slot its hub could not make
        self._hubs: list[Hub] = []
        self._driving: dict[str, threading.Event] = {}
        self._db_failures: dict[str, int] = {}
        self._in_flight = 0
        self._limit = concurrency
        self._refused_at: float | None = None
        self._started = 0
        self.finished = 0
        """Drives ended (completed, stopped, parked, or given back after a store error)."""
        self.peak = 0
        """The most sessions in flight at once."""

    def stop(self, why: str = "") -> None:
        """Take no new work; each session stops at its next durable point and is released
        (thread-safe; callable from a signal handler: it only sets an event). ``why`` (e.g.
        ``SIGTERM``) is logged by the worker's own thread."""
        self._why = why
        self._stop.set()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def run(self) -> WorkerReport:
        first = self._new_agent()
        environment = first.environment
        clock = first.parts.clock  # polls and the outage's length: the agent's injected clock
        with self._cond:
            self._idle.append(first)
        previous = _stack_size(self.stack_size)
        # Offloaded calls (tether._hub.offload: the calls of tools that do not park, host
        # name lookups) run on helpers; as many sessions as may be in flight may each be
        # running a tool.
        helpers = ThreadPoolExecutor(self.concurrency, thread_name_prefix="tether-helper")
        # Fewer collections while sessions are in flight, until the last thread ended.
        with gc_less_often(GC_FIRST_THRESHOLD):
            try:
                self._hubs = [Hub(f"tether-hub-{n}", helpers) for n in range(self.hubs)]
                # What every session's first step would load (the executor, the model's SDK
                # client, the tools' validators), loaded once here: 1,000 threads importing
                # the SDK at once wait on its import lock (~8% more CPU a session, measured).
                first.prepare()
                self._dispatch(environment, clock)
                if self._why:
                    self.log(
                        f"{self._why}: no new claims; stopping {self._in_flight} sessions after "
                        "their current steps, releasing their leases"
                    )
            finally:
                self._stop.set()
                while True:
                    with self._cond:
                        running = list(self._running)
                    if not running:
                        break
                    for done in running:
                        done.wait()
                for hub in self._hubs:
                    hub.close()
                helpers.shutdown()
                _stack_size(previous)
                for agent in self._agents:
                    agent.close()
        if self._error is not None:
            raise self._error
        return self.report

    def _new_agent(self) -> Agent:
        agent = self.make_agent()
        try:
            _shared_store(agent)
        except BaseException:
            agent.close()
            raise
        # One event for claims and drives alike: a stop, a fenced or failed thread make
        # every drive end at its next durable point.
        agent.set_stop_signal(self._stop)
        self._agents.append(agent)
        return agent

    def _dispatch(self, environment: str, clock: Any) -> None:
        """Claim while fewer than the limit are in flight; a hub drives each claim."""
        unreachable_since: float | None = None
        status = _Status(self, clock)
        while not self._stop.is_set():
            status.tick()
            with self._cond:
                self._grow(clock.monotonic())
                free = self._limit - self._in_flight
                if free <= 0:
                    self._cond.wait(POLL_SECONDS)
                    continue
                agent = self._idle.pop() if self._idle else None
            try:
                if agent is None:
                    agent = self._new_agent()
                sessions = _shared_store(agent)
                claimed = _claim(sessions, environment, free)
                empty = (
                    not claimed
                    and self.until_empty
                    and self._in_flight == 0
                    and sessions.waiting(environment) == 0
                )
            except StoreUnavailable as exc:
                if agent is not None:
                    with self._cond:
                        self._idle.append(agent)
                now = clock.monotonic()
                if unreachable_since is None:
                    unreachable_since = now
                    self.log(f"store unavailable, retrying: {exc}")
                # Never while a session is in flight: its drive waits for the database
                # itself, and ends (given back) only if the database stays away.
                if now - unreachable_since > UNREACHABLE_SECONDS and self._in_flight == 0:
                    with self.report.lock:
                        self.report.failed = exc
                    self._stop.set()
                    return
                clock.wait(self._stop, 1.0)
                continue
            if not claimed:
                with self._cond:
                    self._idle.append(agent)
                if empty:
                    return
                unreachable_since = None
                if self.until_empty and self._in_flight and not self._stop.is_set():
                    # The last drive's end wakes it (a drive's end notifies): the queue may
                    # be empty then, and the worker done at once rather than a poll later.
                    with self._cond:
                        self._cond.wait_for(lambda: self._in_flight == 0, POLL_SECONDS)
                else:
                    clock.wait(self._stop, POLL_SECONDS)
                continue
            if unreachable_since is not None:
                self.log("store reachable again")
            unreachable_since = None
            self._start_all(agent, sessions, claimed, clock)

    def _start_all(self, agent: Agent, sessions: Any, claimed: list[str], clock: Any) -> None:
        """A hub's session for each claimed one: the first on ``agent``, the others on free
        slots or on new ones made for them as they start (:meth:`_made_here`: they share
        ``sessions``, the opener that holds the claims). What a stop leaves unstarted is
        given back at once."""
        for index, session in enumerate(claimed):
            slot: Agent | None = agent if index == 0 else None
            if slot is None:
                with self._cond:
                    slot = self._idle.pop() if self._idle else None
                if slot is not None and _shared_store(slot) is not sessions:
                    with self._cond:
                        self._idle.append(slot)
                    slot = None  # not this opener's: a hub makes one that is
            if self._stop.is_set():
                if slot is not None:
                    with self._cond:
                        self._idle.append(slot)
                for rest in claimed[index:]:
                    sessions.release_claim(rest)
                return
            self._start(slot, sessions, session, clock)

    def _made_here(self, sessions: Any, session: str) -> Agent | None:
        """A new slot for ``session``, composed by its session on its hub, as the first
        thing it does. Why not by the dispatcher: a thousand agents (~1 ms each) made one
        after another on its thread waited on that thread's share of the GIL while the
        hubs ran sessions, and the last sessions started seconds late. Why not on other
        threads while the session is parked: measured, two such threads (CPU-bound, beside
        hubs that mostly wait) held the hubs' sessions at each GIL hand-off, and they all
        sent their first requests at once; a helper each cost more CPU and more threads
        (alternating runs, 1,000 sessions). A composition that waits (an MCP server
        starting: each slot starts its own) holds the hub's other sessions meanwhile.
        ``None`` when it cannot be made: the session is given back and the worker stops
        with the error (raised by :meth:`run`), as when the dispatcher made them."""
        try:
            agent = self._new_agent()
            if _shared_store(agent) is not sessions:
                raise ConfigurationError(
                    "a worker claiming many sessions at once needs one opener for every slot "
                    "(FleetSessions)"
                )
        except BaseException as exc:
            sessions.release_claim(session)
            with self.report.lock:
                if self._error is None:
                    self._error = exc
            self._stop.set()
            return None
        return agent

    def _start(self, agent: Agent | None, sessions: Any, session: str, clock: Any) -> None:
        done = threading.Event()
        hub: Hub | None = None
        with self._cond:
            self._in_flight += 1
            self.peak = max(self.peak, self._in_flight)
            self._started += 1
            # The session may be claimed again (its lease given back) while the thread
            # that drove it is still ending; on a shared opener that thread's clean-up
            # (``release_claim``) names the session, not the claim, and would give back the
            # new claim too: the new drive starts once the old thread is done.
            before = self._driving.get(session)
            self._driving[session] = done
            self._running.add(done)
            if before is None or before.is_set():
                hub = min(self._hubs, key=lambda each: each.sessions)  # the least loaded
        if hub is not None:
            hub.spawn(lambda: self._slot(agent, sessions, session, clock, None, done))
            return
        # Rare (the same session's last drive is still ending): it waits for that drive
        # on a thread of its own; parked on a hub, the wait could hold that drive's hub.
        threading.Thread(
            target=self._slot,
            args=(agent, sessions, session, clock, before, done),
            name=f"tether-session-{self._started}",
            daemon=True,
        ).start()

    def _slot(
        self,
        agent: Agent | None,
        sessions: Any,
        session: str,
        clock: Any,
        before: threading.Event | None,
        done: threading.Event,
    ) -> None:
        try:
            if before is not None:
                before.wait()
            if agent is None and not self._stop.is_set():
                agent = self._made_here(sessions, session)
                if agent is None:
                    return  # given back, and the worker stopped with the error
            if agent is None or self._stop.is_set():
                # Stopped before its drive began (while its slot was made, or while it
                # waited for its hub): given back at once, as a claim never started is.
                sessions.release_claim(session)
            else:
                self._drive(agent, sessions, session)
        except SessionFenced as exc:
            self.log(f"fenced: {exc}")
            with self.report.lock:
                self.report.fenced = exc
            self._stop.set()
        except StoreUnavailable as exc:
            self._refused(exc, clock.monotonic())
        finally:
            with self._cond:
                done.set()
                if self._driving.get(session) is done:
                    del self._driving[session]
                self._in_flight -= 1
                self.finished += 1
                if agent is not None:
                    self._idle.append(agent)
                self._running.discard(done)
                self._cond.notify()

    def _refused(self, exc: StoreUnavailable, now: float) -> None:
        """A drive ended on a store error (no connection for its session, or the database
        went away during it): its session is back in the queue (released, or its lease
        expires); hold fewer sessions in flight until the store takes more."""
        with self._cond:
            first = self._refused_at is None
            self._refused_at = now
            self._limit = max(1, min(self._limit, self._in_flight - 1))
            limit = self._limit
        if first:
            self.log(
                f"store unavailable, holding at most {limit} sessions in flight (of "
                f"{self.concurrency}) and retrying: {exc}"
            )

    def _grow(self, now: float) -> None:
        """(Under the lock.) After :data:`GROW_SECONDS` without a refusal, half as many
        sessions again may be in flight, up to the concurrency."""
        if self._refused_at is None or now - self._refused_at < GROW_SECONDS:
            return
        self._limit = min(self.concurrency, self._limit + max(1, self._limit // 2))
        self._refused_at = None if self._limit == self.concurrency else now
        if self._refused_at is None:
            self.log(f"store accepting again: up to {self.concurrency} sessions in flight")

    def _drive(self, agent: Agent, sessions: Any, session: str) -> None:
        try:
            result = agent.resume(session)
        except (SessionFenced, StoreUnavailable):
            sessions.release_claim(session)
            raise
        except EffectsDatabaseError as exc:
            # The workspace database failed: a lost connection (a restart, a terminated
            # backend; the shared one is opened again on its next use) is worth one more
            # drive, from the session's durable point; a second failure parks it.
            sessions.release_claim(session)
            with self._cond:
                failures = self._db_failures.get(session, 0) + 1
                self._db_failures[session] = failures
            if failures < 2:
                self.log(f"session {session}: given back after a workspace database error: {exc}")
                return
            self._park(sessions, session, str(exc))
            return
        except SessionBusy as exc:
            # Another writer holds it (or a claim this process gave back in a race): a
            # busy session is not a broken one, so it stays in the queue, never parked.
            sessions.release_claim(session)
            self.log(f"session {session}: busy, left in the queue: {exc}")
            return
        except Exception as exc:
            # This session cannot be driven here (a corrupt log, a configuration the
            # planner refuses, a bug): park it for a person and go on with the others.
            sessions.release_claim(session)
            what = str(exc) if isinstance(exc, TetherError) else f"{type(exc).__name__}: {exc}"
            self._park(sessions, session, what)
            return
        except BaseException:
            sessions.release_claim(session)
            raise
        finally:
            # An agent holds the session it worked on (docs/runtime.md); a worker lets go of
            # it at once, so a submit or another worker can have it.
            agent.release()
        status = result.status
        # A call parked for approval (a run or resume without a terminal on the store; a
        # worker's own agent denies instead) waits for a person, as a blocked one does.
        if status in (RunStatus.BLOCKED, RunStatus.AWAITING_APPROVAL):
            sessions.park(session)
        if status is RunStatus.STOPPED:
            # Released above (agent.release()): queued again for any worker at once.
            self.log(f"session {session}: stopped at a durable point, unfinished, released")
        else:
            self.log(f"session {session}: {status.value}")
        with self.report.lock:
            self.report.driven[session] = status.value

    def _park(self, sessions: Any, session: str, what: str) -> None:
        self.log(f"session {session}: parked: {what}")
        try:
            sessions.park(session)
        except TetherError:
            pass
        with self.report.lock:
            self.report.driven[session] = "error"

    def openers(self) -> list[Any]:
        """The distinct session openers of the worker's agents (one when they share it)."""
        seen: dict[int, Any] = {}
        for agent in list(self._agents):
            sessions = agent.parts.sessions
            seen.setdefault(id(sessions), sessions)
        return list(seen.values())


def check_concurrency(concurrency: int) -> None:
    """``--concurrency``: 1 to :data:`MAX_CONCURRENCY`, else one line."""
    if isinstance(concurrency, bool) or not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ConfigurationError(
            f"--concurrency must be between 1 and {MAX_CONCURRENCY}, got {concurrency}"
        )


def _stack_size(size: int) -> int:
    """Set the stack size of the threads started from now on; the previous one (0: the
    platform's default). A platform that cannot set it keeps its own."""
    try:
        return threading.stack_size(size)
    except (ValueError, RuntimeError):
        return threading.stack_size()


class _Status:
    """The worker's status line, every ``status_every`` seconds of its clock: sessions in
    flight (and the limit, when the store made it lower), finished, commits per second,
    lease renewals, and the store's own figures when it has them (``metrics()``)."""

    def __init__(self, worker: Worker, clock: Any) -> None:
        self.worker = worker
        self.clock = clock
        self.every = worker.status_every
        self.last = clock.monotonic()
        self.commits = 0

    def tick(self) -> None:
        if not self.every:
            return
        now = self.clock.monotonic()
        if now - self.last < self.every:
            return
        self.worker.log(self.line(now))

    def line(self, now: float) -> str:
        worker = self.worker
        openers = worker.openers()
        commits = sum(int(getattr(s, "commits", 0)) for s in openers)
        renewals = sum(int(getattr(s, "renewals", 0)) for s in openers)
        rate = (commits - self.commits) / max(now - self.last, 1e-9)
        self.last, self.commits = now, commits
        limit = "" if worker._limit == worker.concurrency else f" (limit {worker._limit})"
        parts = [
            f"status: in flight {worker.in_flight}{limit}",
            f"finished {worker.finished}",
            f"commits/s {rate:.0f}",
            f"lease renewals {renewals}",
        ]
        for sessions in openers[:1]:
            metrics = getattr(sessions, "metrics", None)
            if callable(metrics):
                try:
                    figures = metrics()
                except TetherError as exc:
                    figures = {"unavailable": str(exc)}
                if dataclasses.is_dataclass(figures) and not isinstance(figures, type):
                    figures = dataclasses.asdict(figures)
                if isinstance(figures, Mapping):
                    parts.append("store " + " ".join(f"{k} {v}" for k, v in figures.items()))
        return ", ".join(parts)


# ---------------------------------------------------------------- tether worker --status


@dataclass(frozen=True)
class WorkerLeases:
    """One lease owner (a worker process) in ``tether worker --status``."""

    owner: str
    leases: int
    """Live leases (unexpired)."""
    expired: int
    """Leases it still names that have expired (a worker gone, or paused)."""

    def to_json(self) -> dict[str, Any]:
        return {"owner": self.owner, "leases": self.leases, "expired": self.expired}


@dataclass(frozen=True)
class FleetStatus:
    """What ``tether worker --status`` prints, read from the database alone."""

    queued: int
    """Unfinished sessions no live lease holds: the queue's depth."""
    running: int
    """Unfinished sessions under a live lease."""
    parked: int
    """Unfinished sessions out of the queue until a person acts (``blocked``)."""
    idle: int
    """Sessions with nothing unfinished."""
    workers: tuple[WorkerLeases, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "queued": self.queued,
            "running": self.running,
            "parked": self.parked,
            "idle": self.idle,
            "workers": [w.to_json() for w in self.workers],
        }

    def lines(self) -> list[str]:
        head = (
            f"queued {self.queued}, running {self.running}, parked {self.parked}, "
            f"idle {self.idle}, workers {len(self.workers)}"
        )
        return [head] + [
            f"worker {printable(w.owner)}: {w.leases} leases"
            + (f", {w.expired} expired" if w.expired else "")
            for w in self.workers
        ]


STATUS_COUNTS_SQL: Final = """
SELECT count(*) FILTER (WHERE pending AND NOT blocked
                          AND (lease_owner IS NULL OR lease_expires <= now())),
       count(*) FILTER (WHERE pending AND NOT blocked
                          AND lease_owner IS NOT NULL AND lease_expires > now()),
       count(*) FILTER (WHERE pending AND blocked),
       count(*) FILTER (WHERE NOT pending)
  FROM tether_sessions
"""
STATUS_OWNERS_SQL: Final = """
SELECT lease_owner, count(*) FILTER (WHERE lease_expires > now()),
       count(*) FILTER (WHERE lease_expires <= now())
  FROM tether_sessions
 WHERE lease_owner IS NOT NULL
 GROUP BY lease_owner
 ORDER BY lease_owner
"""


def fleet_status(url: str) -> FleetStatus:
    """The queue and the leases per worker of the store at ``url`` (one snapshot: both
    queries in one repeatable-read transaction)."""
    from tether._stores.postgres import check_schema, connect

    conn = connect(url)
    try:
        check_schema(conn, url)
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            counts = conn.execute(STATUS_COUNTS_SQL).fetchone()
            owners = conn.execute(STATUS_OWNERS_SQL).fetchall()
    except Exception as exc:
        if isinstance(exc, TetherError):
            raise
        from tether._stores.postgres import display_url

        raise StoreUnavailable(display_url(url), str(exc).strip().splitlines()[0]) from None
    finally:
        conn.close()
    assert counts is not None
    return FleetStatus(
        queued=int(counts[0]),
        running=int(counts[1]),
        parked=int(counts[2]),
        idle=int(counts[3]),
        workers=tuple(WorkerLeases(str(r[0]), int(r[1]), int(r[2])) for r in owners),
    )
