"""The executor: the imperative shell that carries out recovery plans.

One loop serves a fresh run and a resume alike: reduce (the store keeps the state),
ask :func:`plan_recovery` for the next action, carry out exactly that action,
commit exactly the facts the spec requires (section 15), repeat until the session
is idle or recovery is blocked. Every intent is durable before it acts: the
``stepAttempt`` before the provider request, the ``toolStarted`` before the tool, and for
``write``/``edit`` the journal's intent in ``effects.db`` before the ``toolStarted``. The
session is bound to that database before its first evidence, so recovery can tell a lost
or replaced database from "nothing happened" (:mod:`tether._effects.binding`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from tether import _faults as faults
from tether._completion.verify import NO_COMMAND, VerifyTool
from tether._credentials import Masker
from tether._effects.binding import EvidenceCheck, bind_session, binding_path, ensure_binding
from tether._effects.contract import EffectTool, LookupStatus, has_lookup, safe_lookup
from tether._effects.journal import (
    ActionJournal,
    PreparedChange,
    is_journaled,
    journaled_resume,
    prepare_journaled,
    run_prepared,
)
from tether._effects.recovery import RecoveryAction, RecoveryDecision, reconcile_pending
from tether._effects.review import ReviewStore
from tether._ids import new_uuid7
from tether._inputs import read_optional_file
from tether._models.base import ModelAdapter, ModelRequest, ModelResponse
from tether._project import BudgetConfig, ProjectConfig, load_project_config
from tether._runtime import boundaries, events
from tether._runtime.guards import (
    Authorizer,
    EarlierDecision,
    Guards,
    follow_up_prompt,
    is_failure,
    run_range,
)
from tether._runtime.masking import mask_commits, masked_sink
from tether._stores.file import Durability, SessionStore
from tether._tools.base import Rejection, Tool, ToolContext, ToolRegistry, ToolResult
from tether._tools.builtin import builtin_tools
from tether._tools.workspace import ProtectedState
from tether._wsdb.sqlite import EffectsDB
from tether.core import facts
from tether.core.canonical import source_digest
from tether.core.compaction import COMPACTION_INSTRUCTION, COMPACTION_SYSTEM_PROMPT, plan_split
from tether.core.configuration import AgentConfiguration, environment_identity, explain_blocked
from tether.core.gate import CompletionCheck
from tether.core.planner import (
    ABORTED_ERROR,
    AppendSynthetic,
    AwaitReview,
    Blocked,
    CloseAttempt,
    CompleteTool,
    Finish,
    Observations,
    ObservedAction,
    Plan,
    StartStep,
    StartTool,
    SyntheticReason,
    SyntheticResult,
    ToolMode,
    ToolObservation,
    plan_recovery,
    unanswered_calls,
)
from tether.core.state import (
    CompactionOperation,
    IdleOperation,
    RunOperation,
    SessionState,
    StepKind,
    ToolCallState,
    Usage,
)
from tether.core.stops import StopError, budget_exhausted
from tether.errors import ConfigurationError, ModelError

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful software agent working in a workspace. Use the tools to read "
    "files, run commands and make edits. Be concise. When you are done, answer with a "
    "short summary of what you did and what you verified."
)
AGENTS_FILE = "AGENTS.md"
MAX_AGENTS_BYTES = 64 * 1024
MAX_FOLLOW_UPS = 2
"""Follow-up runs ``require_verified`` starts at most, asking the model to verify."""


class RunStatus(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"
    BLOCKED = "blocked"
    IDLE = "idle"  # nothing was unfinished and nothing was asked


@dataclass(frozen=True)
class RunResult:
    """How an operation ended, with its final text and usage."""

    status: RunStatus
    session_id: str
    session_path: Path
    text: str | None = None
    completion: str | None = None
    error: Mapping[str, str] | None = None
    blocked_reason: str | None = None
    message: str | None = None
    usage: Usage = field(default_factory=Usage)
    session_usage: Usage = field(default_factory=Usage)
    verification: CompletionCheck | None = None
    """The completion gate's verdict, for a completed run that changed files."""
    follow_ups: int = 0
    """Follow-up runs started to get the work verified (``require_verified``)."""
    require_verified: bool = False

    @property
    def resume_command(self) -> str:
        return f"tether resume {self.session_id}"

    @property
    def unverified(self) -> bool:
        """Verification was required, the run completed, and it is still not verified."""
        return (
            self.require_verified
            and self.status is RunStatus.COMPLETED
            and self.verification is not None
            and not self.verification.verified
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "sessionId": self.session_id,
            "sessionPath": str(self.session_path),
            "text": self.text,
            "completion": self.completion,
            "error": dict(self.error) if self.error is not None else None,
            "blockedReason": self.blocked_reason,
            "message": self.message,
            "usage": self.usage.to_json(),
            "sessionUsage": self.session_usage.to_json(),
            "verification": (
                self.verification.to_json() if self.verification is not None else None
            ),
            "followUps": self.follow_ups,
            "unverified": self.unverified,
        }


EventSink = Callable[[events.Event], None]


def _usage_sum(first: Usage, second: Usage) -> Usage:
    return Usage(
        first.input + second.input,
        first.output + second.output,
        first.cache_read + second.cache_read,
        first.cache_write + second.cache_write,
    )


def _usage_delta(after: Usage, before: Usage) -> Usage:
    return Usage(
        after.input - before.input,
        after.output - before.output,
        after.cache_read - before.cache_read,
        after.cache_write - before.cache_write,
    )


def _load_agents_md(workspace: Path) -> str | None:
    """The first :data:`MAX_AGENTS_BYTES` of the workspace's ``AGENTS.md`` as text.

    ``None`` when there is none or it is blank; the rest of a longer file is ignored. It
    must be a regular file. A symbolic link is followed only to a file inside the
    workspace: the text goes to the model provider, and a link must not carry a file
    from elsewhere (a key, a credentials file) into the prompt. A FIFO, a device, a
    directory, a link leading outside or an unreadable file raises
    :class:`~tether.errors.InputFileError` (exit 2) — it never blocks and is never
    silently skipped.
    """
    path = workspace / AGENTS_FILE
    data = read_optional_file(
        path, str(path), limit=MAX_AGENTS_BYTES, truncate=True, within=workspace
    )
    if data is None:
        return None
    text = data.decode("utf-8", errors="replace")
    return text if text.strip() else None


class Agent:
    """Runs an agent whose every step is written ahead to a session log.

    ``model`` is a :class:`~tether._models.base.ModelAdapter`; ``tools`` defaults to the
    built-ins (``read``, ``bash``, ``write``, ``edit``), plus ``verify`` when ``tether.toml``
    configures a check command. ``AGENTS.md`` in the workspace is appended to the system
    prompt. ``on_event`` receives progress events.

    ``project`` is the workspace's ``tether.toml`` (read from the workspace when omitted):
    the check command, the authorization policy and the budgets (``budget`` overrides
    them). ``authorize`` asks a person about calls the policy marks ``ask`` (without it
    nobody can be asked: such calls are denied); ``assume_yes`` answers every ``ask`` with
    yes. ``ask_by_default`` (default: whether ``authorize`` is given) makes ``ask`` the
    default for side-effecting tools no rule names, as in the REPL. ``require_verified``
    (default: ``[verify] required``) starts up to :data:`MAX_FOLLOW_UPS` follow-up runs
    asking the model to verify when a run that changed files completes unverified.

    Credentials never reach the log or ``on_event``: every exact occurrence of a secret
    registered with :func:`tether._credentials.register_secret` (the model adapter registers
    its API key) or given in ``secrets`` is masked (:mod:`tether._runtime.masking`).
    """

    def __init__(
        self,
        model: ModelAdapter,
        tools: Sequence[Tool] | None = None,
        *,
        workspace: str | os.PathLike[str] = ".",
        system_prompt: str | None = None,
        durability: Durability | str = Durability.DURABLE,
        output_options: Mapping[str, Any] | None = None,
        environment: str | None = None,
        sessions_dir: str | os.PathLike[str] | None = None,
        on_event: EventSink | None = None,
        tool_timeout: float | None = None,
        read_agents_md: bool = True,
        project: ProjectConfig | None = None,
        authorize: Authorizer | None = None,
        assume_yes: bool = False,
        ask_by_default: bool | None = None,
        require_verified: bool | None = None,
        budget: BudgetConfig | None = None,
        secrets: Iterable[str] = (),
    ) -> None:
        root = Path(workspace)
        if not root.is_dir():
            raise ConfigurationError(f"workspace {str(root)!r} is not a directory")
        self.workspace = Path(os.path.realpath(root))
        self.model = model
        self.project = project if project is not None else load_project_config(self.workspace)
        self.budget = budget if budget is not None else self.project.budget
        self.require_verified = (
            require_verified if require_verified is not None else self.project.verify.required
        )
        if self.require_verified and self.project.verify.command is None:
            raise ConfigurationError(f"verification is required but {NO_COMMAND}")
        self._guards = Guards(
            self.workspace,
            self.project,
            self._session_effects_db,
            authorize=authorize,
            assume_yes=assume_yes,
            ask_by_default=ask_by_default,
        )
        chosen = (
            list(tools)
            if tools is not None
            else builtin_tools(pass_env=self.project.tools.pass_env)
        )
        if self.project.verify.command is not None and all(t.name != "verify" for t in chosen):
            chosen.append(VerifyTool(lambda: self._guards.verifier))
        self.registry = ToolRegistry(chosen)
        prompt = system_prompt if system_prompt is not None else DEFAULT_SYSTEM_PROMPT
        agents = _load_agents_md(self.workspace) if read_agents_md else None
        if agents is not None:
            prompt = f"{prompt}\n\n# {AGENTS_FILE}\n\n{agents}"
        self.system_prompt = prompt
        self.durability = Durability(durability)
        self.output_options: Mapping[str, Any] = dict(output_options or {})
        self.sessions_dir = Path(sessions_dir) if sessions_dir is not None else None
        # What the file tools must never touch, from this agent's actual layout (its
        # sessions directory wherever it is), handed to every call's ToolContext.
        self.protected = ProtectedState.for_workspace(self.workspace, self.sessions_dir)
        self.tool_timeout = tool_timeout
        if environment is None:
            environment = os.environ.get("TETHER_ENVIRONMENT_IDENTITY")
        self.environment = environment_identity(environment, str(self.workspace))
        self.configuration = AgentConfiguration.build(
            model=model.model,
            adapter_identity=model.adapter_identity,
            routing_identity=model.routing_identity,
            system_prompt=self.system_prompt,
            registry=self.registry,
            output_options=self.output_options,
            environment=self.environment,
        )
        # Credentials (the registered ones and ``secrets``) are masked in every fact and
        # event; one in the configuration snapshot could not be, since the log records
        # the snapshot's digest with it (the prompt itself is only recorded as a digest).
        self.masker = Masker.for_process(secrets)
        if self.masker.contains(self.configuration.snapshot):
            raise ConfigurationError(
                "a credential occurs in the agent's configuration (model id, endpoint or tool "
                "declarations), which every model attempt records; remove it"
            )
        self._on_event = masked_sink(on_event, self.masker)
        self._cancel = threading.Event()
        self._run_input: str | None = None
        self._pending_stop: StopError | None = None
        self._deadline: float | None = None
        self._last_session: str | None = None
        self._effects: tuple[EffectsDB, ActionJournal, ReviewStore] | None = None
        # The session this call works on, the check of its effects database (made once per
        # call, before its first evidence is read or written) and the assistant entry whose
        # next call a crashed process may have decided already (see _attach).
        self._store: SessionStore | None = None
        self._evidence: EvidenceCheck | None = None
        self._resumed_entry: str | None = None

    # ------------------------------------------------------------------ public API

    def run(self, prompt: str, *, session: str | None = None) -> RunResult:
        """Accept ``prompt`` as a new run (in a new session unless ``session`` is given).

        With ``require_verified``, a run that changed files and completed without fresh
        passing evidence is followed by up to :data:`MAX_FOLLOW_UPS` runs in the same
        session asking the model to verify; :attr:`RunResult.unverified` says whether it
        is still unverified after them.
        """
        if not prompt or not prompt.strip():
            raise ConfigurationError("the prompt is empty")
        result = self._run_once(prompt, session)
        return self._follow_up(result)

    def _follow_up(self, result: RunResult) -> RunResult:
        usage = result.usage
        count = 0
        while (
            self.require_verified
            and result.status is RunStatus.COMPLETED
            and result.verification is not None
            and not result.verification.verified
            and count < MAX_FOLLOW_UPS
        ):
            count += 1
            prompt = follow_up_prompt(result.verification)
            self._emit(events.FollowUpStarted(number=count, prompt=prompt))
            result = self._run_once(prompt, result.session_id, always_gate=True)
            usage = _usage_sum(usage, result.usage)
        return replace(result, usage=usage, follow_ups=count)

    def _run_once(
        self, prompt: str, session: str | None, *, always_gate: bool = False
    ) -> RunResult:
        with self._open(session) as store, self._abortable():
            blocked = self._settle_unfinished(store)
            if blocked is not None:
                return blocked
            self._rebind_if_lost(store)
            before = store.state.usage
            entry_id = new_uuid7()
            store.commit(
                [
                    facts.user_entry(entry_id=entry_id, content=prompt),
                    facts.run_started(operation_id=new_uuid7(), input_entry_id=entry_id),
                ]
            )
            faults.hit(boundaries.RUN_ACCEPTED)
            return self._drive(store, usage_before=before, always_gate=always_gate)

    def resume(self, session: str, *, abort: bool = False) -> RunResult:
        """Continue the session's unfinished operation exactly as the planner says.

        With ``abort=True`` an unfinished operation is aborted durably instead: the
        open attempt is closed as aborted, started tools whose outcome is unknown
        become ``interrupted``, queued calls ``aborted``; nothing is re-executed.
        """
        with self._open(session) as store, self._abortable():
            if abort:
                self._request_abort(store, store.state)
            result = self._drive(store)
        return result if abort else self._follow_up(result)

    def compact(self, session: str, *, keep_turns: int = 1) -> RunResult:
        """Summarise the history as its own durable operation, keeping the latest turns."""
        if keep_turns < 1:
            raise ConfigurationError("keep_turns must be at least 1")
        with self._open(session) as store, self._abortable():
            blocked = self._settle_unfinished(store)
            if blocked is not None:
                return blocked
            state = store.state
            split = plan_split(state.transcript, state.transcript_ids, keep_turns)
            if split is None or state.context_boundary != state.transcript_ids[-1]:
                return self._result(
                    store, RunStatus.IDLE, message="nothing to compact: too few complete turns"
                )
            compacted, retained = split
            ids = state.transcript_ids
            assert state.context_boundary is not None  # a split needs complete turns
            store.commit(
                [
                    facts.compaction_started(
                        operation_id=new_uuid7(),
                        input_through_entry_id=state.context_boundary,
                        result_entry_id=new_uuid7(),
                        compacted_entry_ids=compacted,
                        retained_entry_ids=retained,
                        source_digest=source_digest(zip(ids, state.transcript, strict=True)),
                    )
                ]
            )
            faults.hit(boundaries.RUN_ACCEPTED)
            return self._drive(store, usage_before=state.usage)

    def abort(self) -> None:
        """Ask the running operation to stop (thread-safe; e.g. from a SIGINT handler)."""
        self._cancel.set()

    @property
    def last_session(self) -> str | None:
        """The id of the session the last call worked on."""
        return self._last_session

    # ------------------------------------------------------------------ plumbing

    def _settle_unfinished(self, store: SessionStore) -> RunResult | None:
        """Finish what a crash left unfinished before starting something new (one loop
        for runs and resumes); the blocked result if that cannot be done."""
        if isinstance(store.state.operation, IdleOperation):
            return None
        earlier = self._drive(store)
        return earlier if earlier.status is RunStatus.BLOCKED else None

    @contextmanager
    def _abortable(self) -> Iterator[None]:
        """An abort requested before or during the call applies to it; none outlives it."""
        try:
            yield
        finally:
            self._cancel.clear()

    def _open(self, session: str | None) -> SessionStore:
        if session is None:
            store = SessionStore.create(
                self.workspace,
                provider=self.model.provider,
                model=self.model.model,
                environment_identity=self.environment,
                durability=self.durability,
                sessions_dir=self.sessions_dir,
            )
            created = True
        else:
            store = SessionStore.open(
                session,
                workspace=self.workspace,
                sessions_dir=self.sessions_dir,
                durability=self.durability,
            )
            created = False
        store = mask_commits(store, self.masker)
        self._last_session = store.session_id
        self._emit(
            events.SessionOpened(
                session_id=store.session_id,
                path=str(store.path),
                created=created,
                repaired=store.repaired,
            )
        )
        return store

    def _emit(self, event: events.Event) -> None:
        if self._on_event is not None:
            self._on_event(event)

    def _result(
        self,
        store: SessionStore,
        status: RunStatus,
        *,
        usage_before: Usage | None = None,
        **details: Any,
    ) -> RunResult:
        usage = store.state.usage
        return RunResult(
            status=status,
            session_id=store.session_id,
            session_path=store.path,
            usage=_usage_delta(usage, usage_before) if usage_before is not None else Usage(),
            session_usage=usage,
            require_verified=self.require_verified,
            **details,
        )

    # ------------------------------------------------------------------ the loop

    def _drive(
        self,
        store: SessionStore,
        *,
        usage_before: Usage | None = None,
        always_gate: bool = False,
    ) -> RunResult:
        """Carry out plans until the session is idle or recovery is blocked.

        Between plans the stop conditions apply to a run: a ``repeated_failure`` noted by
        the last tool call, or an exhausted budget before a new step or tool call, ends
        it ``failed``. A completed run that changed files (or any, with ``always_gate``)
        gets the completion gate's verdict.
        """
        if usage_before is None:
            usage_before = store.state.usage
        self._attach(store)
        outcome: dict[str, Any] = {}
        current = self.configuration.current
        operation = store.state.operation
        run_input = operation.input_entry_id if isinstance(operation, RunOperation) else None
        self._run_input = run_input
        self._pending_stop = None
        began = time.monotonic()
        self._deadline = (
            began + self.budget.max_seconds
            if run_input is not None and self.budget.max_seconds is not None
            else None
        )
        while True:
            state = store.state
            if self._cancel.is_set() and not isinstance(state.operation, IdleOperation):
                self._request_abort(store, state)
                state = store.state
            stop = self._take_stop()
            if stop is not None and self._stoppable(state):
                self._fail_operation(store, state, stop, outcome)
                continue
            plan: Plan = plan_recovery(state, current)
            reconciled = self._reconcile(store, state, plan)
            if isinstance(reconciled, _Aborted):
                continue
            if reconciled is not None:
                plan = reconciled
            if run_input is not None and self._stoppable(state):
                stop = self._budget_stop(state, plan, run_input, usage_before, began)
                if stop is not None:
                    self._fail_operation(store, state, stop, outcome)
                    continue
            if isinstance(plan, Finish):
                if plan.is_idle:
                    if run_input is not None and outcome.get("status") is RunStatus.COMPLETED:
                        gate = always_gate or self._guards.changed_files_in_run(
                            state, run_input, self.registry.get
                        )
                        if gate:
                            outcome["verification"] = self._assess()
                    return self._finished(store, outcome, usage_before)
                self._finish(store, state, plan, outcome)
            elif isinstance(plan, StartStep):
                self._start_step(store, state, plan, outcome)
            elif isinstance(plan, StartTool):
                self._start_tool(store, state, plan)
            elif isinstance(plan, AppendSynthetic):
                self._append_synthetic(store, state, plan)
            elif isinstance(plan, CloseAttempt):
                self._close_attempt(store, state)
            elif isinstance(plan, CompleteTool):
                self._complete_tool(store, plan)
            elif isinstance(plan, AwaitReview):
                return self._await_review(store, plan, usage_before)
            else:
                return self._blocked(store, state, plan, usage_before)

    def _finished(
        self, store: SessionStore, outcome: Mapping[str, Any], usage_before: Usage
    ) -> RunResult:
        status = outcome.get("status", RunStatus.IDLE)
        return self._result(
            store,
            status,
            usage_before=usage_before,
            text=outcome.get("text"),
            completion=outcome.get("completion"),
            error=outcome.get("error"),
            message=outcome.get("message"),
            verification=outcome.get("verification"),
        )

    # ------------------------------------------------------------------ stops and gate

    def _tool_timeout(self) -> float | None:
        """The tool's time bound: ``tool_timeout``, cut to what the time budget has left
        (a tool that runs past the budget is stopped; its result says it timed out)."""
        if self._deadline is None:
            return self.tool_timeout
        left = max(self._deadline - time.monotonic(), 0.001)
        return left if self.tool_timeout is None else min(self.tool_timeout, left)

    def _take_stop(self) -> StopError | None:
        """The stop a tool call noted (``repeated_failure``), once."""
        stop, self._pending_stop = self._pending_stop, None
        return stop

    @staticmethod
    def _stoppable(state: SessionState) -> bool:
        """A run that may still be ended ``failed`` by a stop condition."""
        operation = state.operation
        return isinstance(operation, RunOperation) and not operation.abort_requested

    def _budget_stop(
        self,
        state: SessionState,
        plan: Plan,
        run_input: str,
        usage_before: Usage,
        began: float,
    ) -> StopError | None:
        """``budget_exhausted`` before a new step (steps, tokens, time) or a new tool call
        (tokens, time). Retries and replays after a crash are not new work."""
        budget = self.budget
        if budget.max_steps is None and budget.max_tokens is None and budget.max_seconds is None:
            return None
        if isinstance(plan, StartStep) and plan.attempt == 1:
            steps = _assistant_steps(state, run_input) if budget.max_steps is not None else 0
        elif isinstance(plan, StartTool) and plan.mode is not ToolMode.REPLAY:
            steps = 0
        else:
            return None
        used = _usage_delta(state.usage, usage_before)
        return budget_exhausted(
            steps=steps,
            tokens=used.input + used.output,
            elapsed=time.monotonic() - began,
            max_steps=budget.max_steps,
            max_tokens=budget.max_tokens,
            max_seconds=budget.max_seconds,
        )

    def _fail_operation(
        self, store: SessionStore, state: SessionState, stop: StopError, outcome: dict[str, Any]
    ) -> None:
        """End the active run ``failed`` with a stop condition's error.

        Calls of the current step that were not carried out are answered first (``aborted``,
        never run), in the same transaction: the transcript stays legal for the next run
        and no crash can separate the answers from the end of the run.
        """
        operation = state.operation
        assert isinstance(operation, RunOperation)
        error = stop.to_json()
        answers = self._synthetic_facts(state, unanswered_calls(state))
        answers.append(
            facts.operation_finished(
                operation_id=operation.operation_id,
                operation_kind=operation.kind,
                outcome="failed",
                error=error,
            )
        )
        store.commit(answers)
        faults.hit(boundaries.OPERATION_FINISHED)
        self._emit(events.OperationFinished(operation=operation.kind, outcome="failed"))
        outcome["status"] = RunStatus.FAILED
        outcome["error"] = error
        outcome["message"] = f"{stop.code}: {stop.message}"

    def _assess(self) -> CompletionCheck:
        check = self._guards.assess()
        self._emit(
            events.CompletionChecked(
                status=check.status.value,
                message=check.message,
                changed_files=check.changed_files,
            )
        )
        return check

    def _blocked(
        self, store: SessionStore, state: SessionState, plan: Blocked, usage_before: Usage
    ) -> RunResult:
        message = explain_blocked(plan.reason, state, self.configuration)
        self._emit(events.Blocked(reason=plan.reason.value, detail=message))
        return self._result(
            store,
            RunStatus.BLOCKED,
            usage_before=usage_before,
            blocked_reason=plan.reason.value,
            message=message,
        )

    def _request_abort(self, store: SessionStore, state: SessionState) -> None:
        """Record ``abortRequested`` for the active operation (once)."""
        operation = state.operation
        if isinstance(operation, IdleOperation) or operation.abort_requested:
            return
        pending = _pending_tool(operation) if isinstance(operation, RunOperation) else None
        store.commit(
            [
                facts.abort_requested(
                    operation_id=operation.operation_id,
                    operation_kind=operation.kind,
                    tool_call_id=pending.tool_call_id if pending is not None else None,
                )
            ]
        )

    def _finish(
        self,
        store: SessionStore,
        state: SessionState,
        plan: Finish,
        outcome: dict[str, Any],
    ) -> None:
        operation = state.operation
        assert not isinstance(operation, IdleOperation)
        store.commit(
            [
                facts.operation_finished(
                    operation_id=operation.operation_id,
                    operation_kind=operation.kind,
                    outcome=plan.outcome.value,
                    completion=plan.completion.value if plan.completion is not None else None,
                    final_entry_id=plan.final_entry_id,
                    error=plan.error.to_json() if plan.error is not None else None,
                )
            ]
        )
        faults.hit(boundaries.OPERATION_FINISHED)
        self._emit(events.OperationFinished(operation=operation.kind, outcome=plan.outcome.value))
        outcome["status"] = RunStatus(plan.outcome.value)
        if plan.completion is not None:
            outcome["completion"] = plan.completion.value
        if plan.error is not None and "error" not in outcome:
            outcome["error"] = plan.error.to_json()
        if plan.final_entry_id is not None and isinstance(operation, RunOperation):
            final = next(m for m in reversed(state.transcript) if m["role"] == "assistant")
            outcome["text"] = final["content"]
        elif isinstance(operation, CompactionOperation):
            outcome["message"] = "history compacted"

    # ------------------------------------------------------------------ effects

    def _effects_stores(self) -> tuple[EffectsDB, ActionJournal, ReviewStore]:
        """``.tether/effects.db`` (opened on first use: only journaled or effect tools
        and their recovery need it)."""
        if self._effects is None:
            db = EffectsDB.open_workspace(self.workspace)
            self._effects = (db, ActionJournal(db), ReviewStore(db))
        return self._effects

    def close(self) -> None:
        """Close the effects database if it was opened (idempotent)."""
        if self._effects is not None:
            self._effects[0].close()
            self._effects = None
        self._evidence = None

    def _attach(self, store: SessionStore) -> None:
        """Start working on ``store`` (once per call, also when it drives twice): the last
        call's evidence check is forgotten, and the assistant entry whose next call a
        crashed process may have decided already is noted (see :func:`_undecided_entry`)."""
        if store is self._store:
            return
        self._store = store
        self._evidence = None
        self._resumed_entry = _undecided_entry(store.state)

    def _evidence_for(self, store: SessionStore) -> EvidenceCheck:
        """Whether ``effects.db`` holds the session's evidence (checked once per call).

        A session without evidence yet is bound to the database now, before its first
        record (:func:`~tether._effects.binding.ensure_binding`); a missing or replaced
        database is reported as it is, and recovery decides with it.
        """
        if self._evidence is None or self._evidence.session_id != store.session_id:
            db = self._effects_stores()[0]
            self._evidence = ensure_binding(db, store.path.parent, store.session_id)
        return self._evidence

    def _session_effects_db(self) -> EffectsDB:
        """``effects.db`` for the guards' records (authorizations, failures, verifications):
        the session is bound to it before they write anything for it."""
        db = self._effects_stores()[0]
        store = self._store
        if store is not None and not store.closed:
            self._evidence_for(store)
        return db

    def _has_binding(self, store: SessionStore) -> bool:
        """Whether the session ever recorded evidence (its sidecar exists; no database is
        opened to find out)."""
        if self._evidence is not None and self._evidence.session_id == store.session_id:
            return True
        return os.path.lexists(binding_path(store.path.parent, store.session_id))

    def _rebind_if_lost(self, store: SessionStore) -> None:
        """A session that is idle again after its effects database was lost or replaced is
        bound to the current one before a new run starts: nothing unfinished depends on the
        old evidence any more (every call of it is answered), and the new run's evidence
        must be checkable again."""
        self._attach(store)  # an idle session was not driven yet: this call starts here
        if not self._has_binding(store):
            return
        check = self._evidence_for(store)
        if not check.known:
            db = self._effects_stores()[0]
            self._evidence = bind_session(db, store.path.parent, store.session_id, previous=check)

    def _earlier_decision(self, store: SessionStore, assistant_entry_id: str) -> EarlierDecision:
        """Whether a crashed process may have decided the call about to start (only the
        first call started for the entry noted by :meth:`_attach`)."""
        if assistant_entry_id != self._resumed_entry:
            return EarlierDecision.NONE
        self._resumed_entry = None
        if not self._has_binding(store):
            return EarlierDecision.NONE  # no record was ever written for this session
        known = self._evidence_for(store).known
        return EarlierDecision.RECORDED if known else EarlierDecision.UNKNOWN

    def _reconcile(
        self, store: SessionStore, state: SessionState, plan: Plan
    ) -> Plan | _Aborted | None:
        """Turn the spec's answer for a pending started tool into one from the truth.

        Only where the spec would replay the call or record it ``interrupted`` (rule 9)
        and only for tools whose effect can be observed (journaled file tools, effect
        tools): the journal and file hashes, or the service's lookup, decide between
        completing the call, executing it once, or a review. Returns a new plan, the
        :data:`_ABORT` marker (a reviewer chose abort; it was recorded), or ``None``.
        """
        operation = state.operation
        if not isinstance(operation, RunOperation) or operation.abort_requested:
            return None
        started_id: str | None = None
        if isinstance(plan, StartTool) and plan.mode is ToolMode.REPLAY:
            started_id = plan.tool_started_id
        elif (
            isinstance(plan, AppendSynthetic)
            and len(plan.results) == 1
            and plan.results[0].reason is SyntheticReason.INTERRUPTED
        ):
            started_id = plan.results[0].tool_started_id
        if started_id is None:
            return None
        pending = next(t for t in operation.tool_calls if t.tool_started_id == started_id)
        tool = self.registry.get(pending.tool_name)
        if tool is None or not (is_journaled(tool) or isinstance(tool, EffectTool)):
            return None
        _, journal, reviews = self._effects_stores()
        decision, item = reconcile_pending(
            tool,
            started_id,
            store.session_id,
            workspace=self.workspace,
            journal=journal,
            reviews=reviews,
            arguments=pending.arguments,
            evidence=self._evidence_for(store),
        )
        if decision.action is RecoveryAction.SPEC:
            return None
        self._emit(
            events.ToolReconciled(
                name=pending.tool_name,
                call_id=pending.tool_call_id,
                verdict=decision.verdict,
                action=decision.action.value,
                recovered_from_ledger=decision.recovered_from_ledger,
                review_item=item.id if item is not None else decision.review_item,
            )
        )
        if decision.action is RecoveryAction.ABORT:
            self._request_abort(store, state)
            return _ABORT
        observed = _observation(decision, item.id if item is not None else None)
        return plan_recovery(
            state, self.configuration.current, Observations({started_id: observed})
        )

    def _complete_tool(self, store: SessionStore, plan: CompleteTool) -> None:
        self._commit_result(
            store,
            result_entry_id=plan.result_entry_id,
            step_id=plan.step_id,
            tool_started_id=plan.tool_started_id,
            tool_name=plan.tool_name,
            call_id=plan.tool_call_id,
            content=plan.content,
            is_error=plan.is_error,
        )

    def _commit_result(self, store: SessionStore, **entry: Any) -> None:
        """Append a started call's result entry (spec 7.3) and report it."""
        store.commit([facts.started_result_entry(**entry)])
        faults.hit(boundaries.AFTER_RESULT)
        self._emit(
            events.ToolFinished(
                name=entry["tool_name"],
                call_id=entry["call_id"],
                is_error=entry["is_error"],
                size=len(entry["content"]),
            )
        )

    def _await_review(
        self, store: SessionStore, plan: AwaitReview, usage_before: Usage
    ) -> RunResult:
        message = (
            f"review required: the outcome of {plan.tool_name} (operation "
            f"{plan.tool_started_id}) cannot be established: {plan.reason}. Decide with "
            "`tether review` and `tether review resolve ITEM --applied|--not-applied|--abort`, "
            f"then run `tether resume {store.session_id}`."
        )
        self._emit(events.Blocked(reason="review_required", detail=message))
        return self._result(
            store,
            RunStatus.BLOCKED,
            usage_before=usage_before,
            blocked_reason="review_required",
            message=message,
        )

    # ------------------------------------------------------------------ model steps

    def _start_step(
        self,
        store: SessionStore,
        state: SessionState,
        plan: StartStep,
        outcome: dict[str, Any],
    ) -> None:
        operation = state.operation
        assert isinstance(operation, RunOperation | CompactionOperation)
        step_id = plan.step_id if plan.step_id is not None else new_uuid7()
        attempt_id = new_uuid7()
        configuration = self.configuration
        store.commit(
            [
                facts.step_attempt(
                    operation_id=operation.operation_id,
                    step_id=step_id,
                    attempt_id=attempt_id,
                    step_kind=plan.step_kind.value,
                    attempt=plan.attempt,
                    context_through_entry_id=plan.context_through_entry_id,
                    configuration_snapshot=configuration.snapshot,
                    configuration_digest=configuration.digest,
                )
            ]
        )
        faults.hit(boundaries.ATTEMPT_RECORDED)
        state = store.state
        compaction = plan.step_kind is StepKind.COMPACTION
        messages: list[Mapping[str, Any]] = list(state.active_context)
        if compaction:
            messages.append({"role": "user", "content": COMPACTION_INSTRUCTION})
        request = ModelRequest(
            system_prompt=COMPACTION_SYSTEM_PROMPT if compaction else self.system_prompt,
            messages=messages,
            tools=() if compaction else self.registry.definitions(),
            output_options=self.output_options,
            position=max(state.step_count - 1, 0),
            purpose="compaction" if compaction else "assistant",
        )
        self._emit(
            events.ModelStarted(
                operation=operation.kind, attempt=plan.attempt, position=request.position
            )
        )
        try:
            response = self.model.complete(request, cancel=self._cancel)
        except ModelError as exc:
            self._model_failed(store, state, step_id, attempt_id, exc, outcome)
            return
        faults.hit(boundaries.RESPONSE_RECEIVED)
        if compaction:
            assert isinstance(operation, CompactionOperation)
            self._settle_compaction(store, state, operation, attempt_id, response)
        else:
            self._settle_assistant(store, operation, step_id, attempt_id, response)

    def _model_failed(
        self,
        store: SessionStore,
        state: SessionState,
        step_id: str,
        attempt_id: str,
        exc: ModelError,
        outcome: dict[str, Any],
    ) -> None:
        operation = state.operation
        assert isinstance(operation, RunOperation | CompactionOperation)
        self._emit(events.ModelFailed(code=exc.code, message=exc.message))
        if exc.code == "aborted" and self._cancel.is_set():
            # The planner closes the attempt as aborted and finishes the operation.
            self._request_abort(store, state)
            return
        error = {"code": exc.code, "message": exc.message}
        store.commit(
            [
                facts.step_failed(
                    operation_id=operation.operation_id,
                    step_id=step_id,
                    attempt_id=attempt_id,
                    error=error,
                ),
                facts.operation_finished(
                    operation_id=operation.operation_id,
                    operation_kind=operation.kind,
                    outcome="failed",
                    error=error,
                ),
            ]
        )
        faults.hit(boundaries.OPERATION_FINISHED)
        self._emit(events.OperationFinished(operation=operation.kind, outcome="failed"))
        outcome["status"] = RunStatus.FAILED
        outcome["error"] = error
        outcome["message"] = f"model request failed ({exc.code}): {exc.message}"

    def _usage_fact(
        self, operation_id: str, response: ModelResponse, attempt_id: str
    ) -> dict[str, Any]:
        return facts.usage(
            operation_id=operation_id, counters=response.usage.to_json(), attempt_id=attempt_id
        )

    def _emit_usage(self, response: ModelResponse) -> None:
        usage = response.usage
        self._emit(
            events.UsageReported(
                input=usage.input,
                output=usage.output,
                cache_read=usage.cache_read,
                cache_write=usage.cache_write,
            )
        )

    def _settle_assistant(
        self,
        store: SessionStore,
        operation: RunOperation | CompactionOperation,
        step_id: str,
        attempt_id: str,
        response: ModelResponse,
    ) -> None:
        store.commit(
            [
                facts.assistant_entry(
                    step_id=step_id,
                    attempt_id=attempt_id,
                    stop_reason=response.stop_reason.value,
                    message=response.to_message(),
                ),
                self._usage_fact(operation.operation_id, response, attempt_id),
            ]
        )
        self._emit(
            events.ModelFinished(
                stop_reason=response.stop_reason.value,
                text=response.content,
                tool_calls=len(response.tool_calls),
            )
        )
        self._emit_usage(response)

    def _settle_compaction(
        self,
        store: SessionStore,
        state: SessionState,
        operation: CompactionOperation,
        attempt_id: str,
        response: ModelResponse,
    ) -> None:
        through = operation.compacted_through_entry_id
        ids = state.transcript_ids
        end = ids.index(operation.input_through_entry_id) + 1
        if through is None or through not in ids[:end]:
            split = plan_split(state.transcript[:end], ids[:end], 1)
            through = split[0][-1] if split is not None else ids[0]
        start = ids.index(through) + 1
        tail = [
            facts.retained_item(source_entry_id=ids[i], message=state.transcript[i])
            for i in range(start, end)
        ]
        store.commit(
            [
                facts.compaction_entry(
                    entry_id=operation.result_entry_id,
                    operation_id=operation.operation_id,
                    summary=response.content or "",
                    compacted_through_entry_id=through,
                    retained_tail=tail,
                ),
                self._usage_fact(operation.operation_id, response, attempt_id),
            ]
        )
        self._emit(events.ModelFinished(stop_reason=response.stop_reason.value, text=None))
        self._emit_usage(response)

    def _close_attempt(self, store: SessionStore, state: SessionState) -> None:
        operation = state.operation
        assert isinstance(operation, RunOperation | CompactionOperation)
        step = operation.step
        assert step is not None
        store.commit(
            [
                facts.step_failed(
                    operation_id=operation.operation_id,
                    step_id=step.step_id,
                    attempt_id=step.attempt_id,
                    error=ABORTED_ERROR.to_json(),
                )
            ]
        )

    # ------------------------------------------------------------------ tools

    def _start_tool(self, store: SessionStore, state: SessionState, plan: StartTool) -> None:
        operation = state.operation
        assert isinstance(operation, RunOperation) and operation.step is not None
        call = _assistant_call(state, plan.assistant_entry_id, plan.tool_index)
        if plan.mode is ToolMode.REPLAY:
            tool_state = next(
                t for t in operation.tool_calls if t.tool_started_id == plan.tool_started_id
            )
            tool = self.registry.get(plan.tool_name)
            assert tool is not None
            self._emit(events.ToolStarted(name=plan.tool_name, call_id=call["id"], replay=True))
            self._execute(store, tool, dict(plan.arguments), tool_state)
            return
        earlier = self._earlier_decision(store, plan.assistant_entry_id)
        validated = self.registry.validate(plan.tool_name, call["function"]["arguments"])
        if isinstance(validated, Rejection):
            store.commit(
                [
                    facts.pre_execution_entry(
                        step_id=operation.step.step_id,
                        assistant_entry_id=plan.assistant_entry_id,
                        tool_index=plan.tool_index,
                        call_id=call["id"],
                        tool_name=plan.tool_name,
                        reason=validated.reason,
                        content=SyntheticReason(validated.reason).content,
                    )
                ],
            )
            return
        authorization, denial = self._guards.authorize(
            store.session_id,
            plan.assistant_entry_id,
            plan.tool_index,
            validated.tool,
            validated.arguments,
            earlier_decision=earlier,
        )
        if authorization is not None:
            self._emit(
                events.ToolAuthorized(
                    name=plan.tool_name,
                    call_id=call["id"],
                    decision="deny" if denial is not None else "allow",
                )
            )
        started_id = new_uuid7()
        result_id = new_uuid7()
        intent = [
            facts.tool_started(
                fact_id=started_id,
                operation_id=operation.operation_id,
                step_id=operation.step.step_id,
                assistant_entry_id=plan.assistant_entry_id,
                tool_index=plan.tool_index,
                tool_call_id=call["id"],
                tool_name=plan.tool_name,
                arguments=validated.arguments,
                replay=validated.declaration.replay.value,
                replay_key=validated.declaration.replay_key,
                environment_identity=self.environment,
                result_entry_id=result_id,
            )
        ]
        if denial is not None:
            # A denied call never runs: its intent and its error result are one
            # transaction, so no crash can leave it pending (and replayable).
            intent.append(
                facts.started_result_entry(
                    result_entry_id=result_id,
                    step_id=operation.step.step_id,
                    tool_started_id=started_id,
                    tool_name=plan.tool_name,
                    call_id=call["id"],
                    content=denial,
                    is_error=True,
                )
            )
            store.commit(intent)
            self._emit(events.ToolSkipped(name=plan.tool_name, call_id=call["id"], reason="denied"))
            self._note_failure(store, started_id, result_id, plan.tool_name, validated.arguments)
            return
        prepared: PreparedChange | None = None
        if is_journaled(validated.tool):
            # The journal's intent is durable before toolStarted: a started call without
            # a journal row can then only mean lost evidence, never "not applied".
            _, journal, _ = self._effects_stores()
            self._evidence_for(store)  # bound before its first evidence
            prepared = prepare_journaled(
                plan.tool_name,
                self.workspace,
                journal,
                store.session_id,
                started_id,
                validated.arguments,
                protected=self.protected,
            )
        store.commit(intent)
        faults.hit(boundaries.BEFORE_EFFECT)
        started = store.state.operation
        assert isinstance(started, RunOperation)
        tool_state = next(t for t in started.tool_calls if t.tool_started_id == started_id)
        self._emit(events.ToolStarted(name=plan.tool_name, call_id=call["id"]))
        self._execute(store, validated.tool, validated.arguments, tool_state, prepared)

    def _execute(
        self,
        store: SessionStore,
        tool: Tool,
        arguments: Mapping[str, Any],
        started: ToolCallState,
        prepared: PreparedChange | None = None,
    ) -> None:
        context = ToolContext(
            workspace=self.workspace,
            operation_id=started.tool_started_id,
            cancel=self._cancel,
            timeout=self._tool_timeout(),
            session_id=store.session_id,
            protected=self.protected,
        )
        result: ToolResult | None
        if is_journaled(tool):
            _, journal, _ = self._effects_stores()
            if prepared is not None:
                result = run_prepared(
                    self.workspace, journal, prepared, protected=context.protected
                )
            else:
                # A re-execution that reconciliation decided: only from the recorded intent
                # (None without one: left pending, the next reconciliation reviews it).
                result = journaled_resume(
                    tool.name,
                    self.workspace,
                    journal,
                    store.session_id,
                    started.tool_started_id,
                    arguments,
                    protected=context.protected,
                )
        else:
            result = self._run_tool(tool, arguments, context)
        faults.hit(boundaries.AFTER_EFFECT)
        if result is None or (self._cancel.is_set() and result.metadata.get("aborted")):
            # The tool was killed by an abort, or an effect tool failed and its service
            # cannot say whether the effect committed: the outcome is not known. Leave
            # the call pending; the planner (abort: interrupted) or reconciliation
            # (review) decides. A tool that finished despite an abort keeps its result.
            return
        self._commit_result(
            store,
            result_entry_id=started.result_entry_id,
            step_id=started.step_id,
            tool_started_id=started.tool_started_id,
            tool_name=started.tool_name,
            call_id=started.tool_call_id,
            content=result.content,
            is_error=result.is_error,
        )
        if is_failure(result):
            self._note_failure(
                store, started.tool_started_id, started.result_entry_id, tool.name, arguments
            )

    def _note_failure(
        self,
        store: SessionStore,
        tool_started_id: str,
        result_entry_id: str,
        tool_name: str,
        arguments: Mapping[str, Any],
    ) -> None:
        """Record a failed call; a repeated failure ends the run before the next plan."""
        if self._run_input is None:
            return
        self._pending_stop = self._guards.failed_call(
            store.state,
            session_id=store.session_id,
            input_entry_id=self._run_input,
            tool_started_id=tool_started_id,
            result_entry_id=result_entry_id,
            tool_name=tool_name,
            arguments=arguments,
        )

    def _run_tool(
        self, tool: Tool, arguments: Mapping[str, Any], context: ToolContext
    ) -> ToolResult | None:
        """Run one tool; ``None`` when an effect tool's outcome is unknown."""
        try:
            return tool.run(arguments, context)
        except Exception as exc:  # a tool's own failure must not lose the session
            failure = f"{type(exc).__name__}: {exc}"
            if not isinstance(tool, EffectTool):
                return ToolResult.error(f"Error: tool {tool.name!r} failed: {failure}")
        # An effect tool raised (timeout, connection reset, …): that says nothing
        # arrived, not that nothing happened. Ask the service.
        if not has_lookup(tool):
            return None
        lookup = safe_lookup(tool, context.operation_id)
        if lookup.status is LookupStatus.COMMITTED and lookup.result is not None:
            return lookup.result
        if lookup.status is LookupStatus.NOT_FOUND:
            return ToolResult.error(
                f"Error: {tool.name} failed ({failure}); the service has no record of "
                "the operation, so it did not take effect."
            )
        return None

    def _append_synthetic(
        self, store: SessionStore, state: SessionState, plan: AppendSynthetic
    ) -> None:
        store.commit(self._synthetic_facts(state, plan.results))

    def _synthetic_facts(
        self, state: SessionState, results: Sequence[SyntheticResult]
    ) -> list[dict[str, Any]]:
        """The entries of synthetic results (spec 15: interrupted → started form, the
        other reasons → pre-execution form); each is reported as a skipped call."""
        operation = state.operation
        out: list[dict[str, Any]] = []
        if not results:
            return out
        assert isinstance(operation, RunOperation) and operation.step is not None
        for item in results:
            if item.reason is SyntheticReason.INTERRUPTED:
                tool_state = next(
                    t for t in operation.tool_calls if t.tool_started_id == item.tool_started_id
                )
                assert item.tool_started_id is not None and item.result_entry_id is not None
                out.append(
                    facts.interrupted_result_entry(
                        result_entry_id=item.result_entry_id,
                        step_id=tool_state.step_id,
                        tool_started_id=item.tool_started_id,
                        tool_name=item.tool_name,
                        call_id=item.tool_call_id,
                        content=item.content,
                    )
                )
            else:
                out.append(
                    facts.pre_execution_entry(
                        step_id=operation.step.step_id,
                        assistant_entry_id=item.assistant_entry_id,
                        tool_index=item.tool_index,
                        call_id=item.tool_call_id,
                        tool_name=item.tool_name,
                        reason=item.reason.value,
                        content=item.content,
                    )
                )
            self._emit(
                events.ToolSkipped(
                    name=item.tool_name, call_id=item.tool_call_id, reason=item.reason.value
                )
            )
        return out


class _Aborted:
    """Marker: a review decided to abort; ``abortRequested`` was recorded, plan again."""


_ABORT = _Aborted()


def _observation(decision: RecoveryDecision, item: int | None) -> ToolObservation:
    if decision.action is RecoveryAction.COMPLETE:
        assert decision.content is not None
        return ToolObservation(
            ObservedAction.COMPLETE, content=decision.content, is_error=decision.is_error
        )
    if decision.action is RecoveryAction.EXECUTE:
        return ToolObservation(ObservedAction.EXECUTE, reason=decision.reason)
    where = f" (review item {item})" if item is not None else ""
    return ToolObservation(ObservedAction.REVIEW, reason=f"{decision.reason}{where}")


def _assistant_steps(state: SessionState, input_entry_id: str) -> int:
    """How many model steps of the run settled (its assistant entries)."""
    transcript = state.transcript
    span = run_range(state, input_entry_id)
    return sum(1 for i in span if transcript[i]["role"] == "assistant")


def _undecided_entry(state: SessionState) -> str | None:
    """The assistant entry whose next call a crashed process may have decided already.

    Calls are authorized one at a time, right before each starts; a decision that is
    durable while its ``toolStarted`` is not can only belong to the first unanswered call
    of the current step, and only when no call of it is pending (a pending call means the
    crash came while it ran, before any later call was decided). ``None`` when the
    operation is not a run that will start such a call.
    """
    operation = state.operation
    if not isinstance(operation, RunOperation) or operation.abort_requested:
        return None
    if _pending_tool(operation) is not None:
        return None
    for position in range(len(state.transcript) - 1, -1, -1):
        message = state.transcript[position]
        if message.get("role") == "assistant":
            return state.transcript_ids[position] if message.get("tool_calls") else None
    return None


def _pending_tool(operation: RunOperation) -> ToolCallState | None:
    for tool in operation.tool_calls:
        if tool.status.value == "pending":
            return tool
    return None


def _assistant_call(state: SessionState, entry_id: str, index: int) -> Mapping[str, Any]:
    """Tool call ``index`` of the assistant entry ``entry_id``."""
    ids = state.transcript_ids
    for position in range(len(ids) - 1, -1, -1):
        if ids[position] == entry_id:
            call: Mapping[str, Any] = state.transcript[position]["tool_calls"][index]
            return call
    raise LookupError(f"assistant entry {entry_id} is not in the transcript")


__all__ = ["Agent", "RunResult", "RunStatus"]
