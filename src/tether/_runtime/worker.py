"""The log is the queue: ``submit`` accepts a prompt durably, workers drive what is unfinished.

:func:`submit` commits a user entry and ``runStarted`` (the transaction ``tether run``
commits first) and returns: the session now has an unfinished run, which is all a worker
looks for. :func:`submit_all` (``tether submit --from FILE``, lines parsed by
:func:`parse_submissions`) accepts many: on the shared store 1,000 new sessions per
database transaction (:meth:`~tether._stores.postgres.PostgresSessions.create_queued`).

:class:`Worker` runs ``concurrency`` threads, each with its own
:class:`~tether._runtime.agent.Agent` over a shared store (:mod:`tether._stores.postgres`):
a thread claims the oldest unfinished session of its environment identity whose lease is
free or expired (``FOR UPDATE SKIP LOCKED``), drives it with the normal executor
(``resume``: the same planner as after a crash), and releases the lease. A session of
another environment identity is never claimed: it waits for a worker that serves it.

* a session whose recovery is blocked (a gate, a review) is parked: out of the queue until
  its next commit (a person resolving it);
* :class:`~tether.errors.SessionFenced`: this worker lost a lease (it was paused past its
  expiry and another worker took over). The thread stops at once; the worker takes no new
  work and exits with the fenced error's code;
* any other error driving a session (a corrupt log, …): the session is parked, the worker
  goes on;
* the database going away: the thread waits and claims again; a worker that cannot reach
  it for :data:`UNREACHABLE_SECONDS` exits with the store error's code;
* :meth:`Worker.stop` (``SIGTERM``): no new claims; each thread finishes the step it is in
  (the model request being answered, or the tool call running, until its result is
  committed: the executor's stop signal,
  :meth:`~tether._runtime.executor.Executor.set_stop_signal`), leaves the session's
  operation unfinished, releases its lease at once (claimable again right away, not after
  expiry), and the worker exits 0. Another worker continues each such session from that
  durable point with the same planner as after a crash there: nothing done is done again.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import tether._faults as faults
import tether._runtime.boundaries as boundaries
from tether._runtime.agent import Agent
from tether._runtime.results import RunStatus
from tether._text import printable
from tether.core import facts
from tether.core.state import IdleOperation
from tether.errors import ConfigurationError, SessionFenced, StoreUnavailable, TetherError

__all__ = [
    "SUBMIT_BATCH",
    "UNREACHABLE_SECONDS",
    "Submission",
    "Worker",
    "WorkerReport",
    "parse_submissions",
    "submit",
    "submit_all",
]

UNREACHABLE_SECONDS: Final = 30.0
POLL_SECONDS: Final = 0.2


def _shared_store(agent: Agent) -> Any:
    sessions = agent.parts.sessions
    if not hasattr(sessions, "claim"):
        raise ConfigurationError(
            "submit and worker need a shared store: give --store postgresql://… "
            "(or TETHER_STORE_URL, or [store] url in tether.toml)"
        )
    return sessions


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


class Worker:
    """``concurrency`` threads claiming and driving sessions (see the module docstring).

    ``make_agent`` builds one agent per thread (its opener must be a shared store);
    ``until_empty`` ends the worker once no unfinished session of its environment is left
    (leased by anyone or not); ``log`` receives one line per event.
    """

    def __init__(
        self,
        make_agent: Callable[[], Agent],
        *,
        concurrency: int = 1,
        until_empty: bool = False,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        if concurrency < 1:
            raise ConfigurationError(f"--concurrency must be at least 1, got {concurrency}")
        self.make_agent = make_agent
        self.concurrency = concurrency
        self.until_empty = until_empty
        self.log = log
        self.report = WorkerReport()
        self._stop = threading.Event()

    def stop(self) -> None:
        """Take no new work; each thread stops at the next durable point of the session it
        is driving and releases it (thread-safe; callable from a signal handler)."""
        self._stop.set()

    def run(self) -> WorkerReport:
        agents = [self.make_agent() for _ in range(self.concurrency)]
        for agent in agents:
            _shared_store(agent)
            # One event for claims and drives alike: a stop, a fenced or failed thread
            # make every drive end at its next durable point.
            agent.set_stop_signal(self._stop)
        threads = [
            threading.Thread(target=self._loop, args=(agent,), name=f"tether-worker-{n}")
            for n, agent in enumerate(agents, 1)
        ]
        for thread in threads:
            thread.start()
        try:
            while any(t.is_alive() for t in threads):
                for thread in threads:
                    thread.join(timeout=0.2)
        finally:
            self._stop.set()
            for thread in threads:
                thread.join()
            for agent in agents:
                agent.close()
        return self.report

    def _loop(self, agent: Agent) -> None:
        sessions = _shared_store(agent)
        environment = agent.environment
        clock = agent.parts.clock  # polls and the outage's length: the agent's injected clock
        unreachable_since: float | None = None
        while not self._stop.is_set():
            try:
                session = sessions.claim(environment)
                if session is None:
                    if self.until_empty and sessions.waiting(environment) == 0:
                        return
                    unreachable_since = None
                    clock.wait(self._stop, POLL_SECONDS)
                    continue
                unreachable_since = None
                self._drive(agent, sessions, session)
            except SessionFenced as exc:
                self.log(f"fenced: {exc}")
                with self.report.lock:
                    self.report.fenced = exc
                self._stop.set()
                return
            except StoreUnavailable as exc:
                now = clock.monotonic()
                if unreachable_since is None:
                    unreachable_since = now
                    self.log(f"store unavailable, retrying: {exc}")
                if now - unreachable_since > UNREACHABLE_SECONDS:
                    with self.report.lock:
                        self.report.failed = exc
                    self._stop.set()
                    return
                clock.wait(self._stop, 1.0)

    def _drive(self, agent: Agent, sessions: Any, session: str) -> None:
        try:
            result = agent.resume(session)
        except (SessionFenced, StoreUnavailable):
            sessions.release_claim(session)
            raise
        except Exception as exc:
            # This session cannot be driven here (a corrupt log, a configuration the
            # planner refuses, a bug): park it for a person and go on with the others.
            sessions.release_claim(session)
            what = str(exc) if isinstance(exc, TetherError) else f"{type(exc).__name__}: {exc}"
            self.log(f"session {session}: parked: {what}")
            try:
                sessions.park(session)
            except TetherError:
                pass
            with self.report.lock:
                self.report.driven[session] = "error"
            return
        except BaseException:
            sessions.release_claim(session)
            raise
        finally:
            # An agent holds the session it worked on (docs/runtime.md); a worker lets go of
            # it at once, so a submit or another worker can have it.
            agent.release()
        status = result.status
        if status is RunStatus.BLOCKED:
            sessions.park(session)
        if status is RunStatus.STOPPED:
            # Released above (agent.release()): queued again for any worker at once.
            self.log(f"session {session}: stopped at a durable point, unfinished, released")
        else:
            self.log(f"session {session}: {status.value}")
        with self.report.lock:
            self.report.driven[session] = status.value
