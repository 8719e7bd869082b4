"""The runtime's guards: authorization before effects, stop conditions, the completion gate.

:class:`Guards` is the imperative shell around the pure rules of
:mod:`tether.core.policy`, :mod:`tether.core.stops` and
:mod:`tether.core.gate`. It owns the durable records those rules need, all in the
workspace database (``effects.db``, through :class:`~tether._wsdb.protocol.WorkspaceDB`):
authorization decisions (recorded before the call starts, so a call decided before a crash
is not asked again), failed calls with the artifact version they failed on (so
``repeated_failure`` holds across a resume), and verification evidence.

Rules of this module:

* the decisions are the pure rules' (:func:`~tether.core.policy.decide`,
  :func:`~tether.core.stops.repeated_failure`, the gate); this module only reads and writes
  the records they need, and a decision is durable (boundary ``authorized``) before the
  executor starts the call;
* the first recorded decision for a call wins: a person is never asked twice for one call,
  not even across a crash;
* a person's denial sticks to the tool for the rest of the session
  (:func:`~tether.core.policy.standing_denial`, from the log and the recorded decisions):
  later calls of it need a person again, whatever rule would allow them;
* one probe remains, commented where it is: the files a call touches (only file-change
  tools say, by their class).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import tether._faults as faults
from tether._project import ProjectConfig
from tether._tools.base import Tool, ToolResult
from tether._tools.builtin import FileChangeTool, current_hash
from tether.core.canonical import arguments_digest
from tether.core.gate import (
    CompletionCheck,
    CompletionStatus,
    name_files,
    unconfigured_check,
)
from tether.core.kinds import Replay
from tether.core.policy import (
    NOBODY_REASONS,
    PERSON_DENIAL_PREFIX,
    Decision,
    Policy,
    PolicyVerdict,
    ToolKind,
    decide,
    decided_by_person,
    standing_denial,
)
from tether.core.stops import FailedCall, StopError, describe_call, repeated_failure
from tether.errors import ArtifactError, TetherError

if TYPE_CHECKING:
    from tether._completion.artifact import ArtifactScanner
    from tether._completion.failures import ToolFailure
    from tether._completion.verify import Verifier
    from tether._effects.authorization import Authorization
    from tether._runtime.approval import AuthorizationRequest as AuthorizationRequest
    from tether._runtime.approval import ParkedCall as ParkedCall
    from tether._wsdb.protocol import ApprovalTable, WorkspaceDB
    from tether.core.state import SessionState
    from tether.core.values import ApprovalRequest

# The completion machinery (the scanner, check runs, the verifier) and the authorization
# store are imported by the methods that use them: every agent builds its Guards, and only
# a call that is authorized or verified needs them (they bring SQLite's tables along).

__all__ = [
    "ALWAYS",
    "AUTHORIZED",
    "LOST_RECORD_RULE",
    "PARKED",
    "AuthorizationRequest",
    "Authorizer",
    "EarlierDecision",
    "Guards",
    "ParkedCall",
    "arguments_digest",
    "follow_up_prompt",
    "is_failure",
    "run_range",
    "stale_reason",
    "touched_snapshot",
]

AUTHORIZED = faults.register(
    "authorized", "an authorization decision is durable; the call has not started"
)
PARKED = faults.register(
    "approval.parked", "a call is parked for approval (durable); the run has not stopped yet"
)
MAX_SUMMARY: Final = 500
LOST_RECORD_RULE: Final = (
    "no authorization record: one may have been lost with the effects database"
)
"""The rule of a call that needs a decision because its record may have been lost."""


# What a person is asked and a parked call are a call's values: their classes live in
# tether._runtime.approval and are this module's names too, loaded on first use (PEP 562),
# so building an agent (which builds its Guards) creates neither.
_APPROVAL: Final = frozenset({"AuthorizationRequest", "ParkedCall"})


def __getattr__(name: str) -> Any:
    if name in _APPROVAL:
        from tether._runtime import approval

        return getattr(approval, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class EarlierDecision(StrEnum):
    """Whether an earlier process may have recorded a decision for a call."""

    NONE = "none"
    """The call is new to this process's view of the log: nobody can have decided it."""
    RECORDED = "recorded"
    """A crashed process may have decided it; its record is in ``effects.db`` if it did."""
    UNKNOWN = "unknown"
    """A crashed process may have decided it, and ``effects.db`` is missing or replaced:
    the absence of a record proves nothing."""


ALWAYS: Final = "always"
"""The answer that allows the call and every later call of the tool under the same rule
in the session."""

Authorizer = Callable[["AuthorizationRequest"], bool | str]
"""Asks a person; ``True`` allows the call, :data:`ALWAYS` allows it and later calls of the
tool under the same rule in the session, ``False`` declines. Called only for ``ask``."""


def touched_files(tool: Tool, arguments: Mapping[str, Any]) -> list[str]:
    """The workspace files a call changes, where the tool says (``write``, ``edit``)."""
    # By class: no declaration on Tool names the files a call touches (its ``path``
    # argument means that only for a FileChangeTool), and the recovery kind is not the
    # same thing (a subclass may declare another one): a declaration on Tool would be.
    path = arguments.get("path")
    if isinstance(tool, FileChangeTool) and isinstance(path, str):
        return [path]
    return []


def touched_snapshot(workspace: Path, paths: list[str]) -> dict[str, str | None]:
    """The content hash of each path now (``None``: missing; ``"unreadable"``)."""
    snapshot: dict[str, str | None] = {}
    for path in paths:
        try:
            snapshot[path] = current_hash(workspace, path)
        except (OSError, TetherError):
            snapshot[path] = "unreadable"
    return snapshot


def stale_reason(
    request: ApprovalRequest,
    workspace: Path,
    version: Callable[[], str | None],
    *,
    digest: str | None = None,
) -> str | None:
    """Why a parked call's decision no longer applies (``None``: it still does): its
    arguments (``digest``, when known) or the files it touches changed since it was
    proposed; a call whose files are unknown (``bash``) compares the artifact version."""
    if digest is not None and digest != request.arguments_digest:
        return "the call's arguments changed since it was proposed"
    if request.touched:
        now = touched_snapshot(workspace, list(request.touched))
        changed = sorted(path for path, hashed in request.touched.items() if now[path] != hashed)
        if changed:
            return f"{name_files(changed)} changed since the call was proposed"
        return None
    current = version()
    if request.artifact_version is not None and current != request.artifact_version:
        return "the workspace files changed since the call was proposed"
    return None


def is_failure(result: ToolResult) -> bool:
    """A call that failed: an error result, or a command that exited non-zero (``bash``
    reports that as a successful call with ``exit_code`` in its metadata)."""
    code = result.metadata.get("exit_code")
    return result.is_error or (isinstance(code, int) and code != 0)


def call_summary(tool: Tool, arguments: Mapping[str, Any]) -> str:
    """What the call does, as a person reads it: the tool's own
    :meth:`~tether._tools.base.Tool.approval_summary` (the command of bash, the path of a
    file tool, else the tool and its arguments), at most :data:`MAX_SUMMARY` characters."""
    text = tool.approval_summary(arguments)
    return text if len(text) <= MAX_SUMMARY else text[: MAX_SUMMARY - 1] + "…"


def denial_text(who: str, rule: str, reason: str | None) -> str:
    """The error result the model receives for a denied call. A person's denial starts with
    :data:`~tether.core.contents.PERSON_DENIAL_PREFIX`: that is how the log remembers it (the
    reducer's ``person_denials``), so later calls of the tool need a person again."""
    why = f": {reason}" if reason else ""
    said = f"this call was not authorized ({who}, {rule}{why}). It did not run."
    if decided_by_person(who):
        return (
            f"{PERSON_DENIAL_PREFIX}{said} Later calls of this tool in this session need a "
            "person's approval. This decision is final: do not try to reach the same effect "
            "another way; ask the user instead."
        )
    return (
        f"Error: permission denied: {said} This decision is final: do not try to reach the "
        "same effect another way; ask the user instead."
    )


def follow_up_prompt(check: CompletionCheck) -> str:
    """The prompt of a follow-up run asking the model to verify its work."""
    if check.status is CompletionStatus.STALE and check.changed_files:
        why = (
            "the files changed since the last passing check "
            f"({name_files(list(check.changed_files))})"
        )
    elif check.status is CompletionStatus.FAILED:
        why = "the last check of the files as they are now did not pass"
    else:
        why = "there is no passing check of the files as they are now"
    return (
        f"Your work is not verified yet: {why}. Call the `verify` tool on the files as they "
        "are now. If it fails, fix the cause and call `verify` again; finish only after it "
        "passes, and do not edit files after the passing check."
    )


def _policy_is_empty(policy: Policy) -> bool:
    return policy.default is None and not policy.tools and not policy.bash


def run_range(state: SessionState, input_entry_id: str) -> range:
    """Transcript positions of the run whose user entry is ``input_entry_id`` (after it)."""
    ids = state.transcript_ids
    # From the end: the run is the latest part of the transcript, so this costs the run's
    # length, not the session's (a forward index() would grow with every earlier turn).
    for start in range(len(ids) - 1, -1, -1):
        if ids[start] == input_entry_id:
            return range(start + 1, len(ids))
    return range(0)


class Guards:
    """Authorization, stop conditions and verification for one agent and workspace."""

    def __init__(
        self,
        workspace: Path,
        project: ProjectConfig,
        effects: Callable[[], WorkspaceDB],
        *,
        authorize: Authorizer | None = None,
        assume_yes: bool = False,
        ask_by_default: bool | None = None,
        park: bool = False,
    ) -> None:
        self.workspace = workspace
        self.park = park
        """Park ``ask`` calls nobody can be asked about (instead of denying them)."""
        self.project = project
        self._effects = effects
        self._authorize = authorize
        self.assume_yes = assume_yes
        self.ask_by_default = authorize is not None if ask_by_default is None else ask_by_default
        self._scanner: ArtifactScanner | None = None
        self._verifier: Verifier | None = None

    # ------------------------------------------------------------------ lazily opened

    @property
    def verifier(self) -> Verifier:
        if self._verifier is None:
            from tether._completion.verify import Verifier  # see the top of the module

            self._verifier = Verifier(
                self.workspace, self.project, self._effects(), scanner=self._scanner
            )
            self._scanner = self._verifier.scanner
        return self._verifier

    def _version(self) -> str | None:
        """The current artifact version, or ``None`` when it cannot be computed."""
        if self._scanner is None:
            from tether._completion.verify import workspace_scanner  # see the top

            self._scanner = workspace_scanner(self.workspace, self.project)
        try:
            return self._scanner.version().digest
        except ArtifactError:
            return None

    # ------------------------------------------------------------------ authorization

    def authorize(
        self,
        session_id: str,
        assistant_entry_id: str,
        tool_index: int,
        tool: Tool,
        arguments: Mapping[str, Any],
        *,
        earlier_decision: EarlierDecision = EarlierDecision.NONE,
        state: SessionState | None = None,
    ) -> tuple[Authorization | None, str | None] | ParkedCall:
        """Decide whether a validated call may start: the recorded decision (``None`` when
        none was needed) and the denial text when the call may not start.

        Every decision that comes from a rule, a person or ``--yes`` is recorded in
        ``effects.db`` before this returns (first decision wins). A decision recorded
        earlier for the same call (before a crash) is reused: the person is not asked
        again. Only read-only tools and the implicit batch default (no policy, no
        terminal) are allowed without a record.

        ``earlier_decision`` says whether a crashed process may have decided the call
        already: then its record is looked up even where no record is needed now (a person's
        deny in the REPL stands on a resume in a pipe), and when that record may have been
        lost (``UNKNOWN``) a missing one never counts as "allowed by default": the call is
        asked about like in the REPL (no terminal → denied, ``--yes`` → allowed).

        With ``park``, a call the policy says to ask about while nobody can be asked is
        parked instead of denied (:class:`ParkedCall`): the run stops until a person
        decides with ``tether approve``/``deny``; the next call carries the decision out
        (recorded here like any other) unless it became void. An "always" grant of the
        session for the tool and rule allows such a call without asking.

        ``state`` is the session's reduced log: where it shows that a person denied the tool
        and no person allowed it since (:func:`~tether.core.policy.standing_denial`), the
        call needs a person whatever the policy would decide (no grant, no ``--yes``).
        """
        kind = ToolKind.READ_ONLY if tool.replay is Replay.SAFE else ToolKind.SIDE_EFFECT
        policy = self.project.policy
        denied = state is not None and self._denied(session_id, tool.name, state)
        verdict = self._verdict(tool, arguments, kind, earlier_decision, denied)
        unrecorded = verdict.decision is Decision.ALLOW and (
            (kind is ToolKind.READ_ONLY and tool.name not in policy.tools)
            or (_policy_is_empty(policy) and not self.ask_by_default and not self.assume_yes)
        )
        if unrecorded and (kind is ToolKind.READ_ONLY or earlier_decision is EarlierDecision.NONE):
            return None, None
        store = self._effects().authorizations
        from tether._effects.authorization import call_key  # see the top of the module

        key = call_key(assistant_entry_id, tool_index)
        earlier = store.get(session_id, key)
        # A deny of the policy itself overrides an earlier decision; "nobody can be asked
        # now" does not: the person already answered before the crash.
        policy_denies = verdict.decision is Decision.DENY and verdict.reason not in NOBODY_REASONS
        if earlier is not None and not policy_denies:
            allowed = earlier.decision == Decision.ALLOW.value
            text = denial_text(earlier.who, earlier.rule, earlier.reason)
            return earlier, None if allowed else text
        if unrecorded:  # looked up: nobody decided it before the crash
            return None, None
        summary = call_summary(tool, arguments)
        decided = self._decide(session_id, key, tool, arguments, summary, verdict)
        from tether._runtime.approval import ParkedCall  # a call's values: see _APPROVAL

        if isinstance(decided, ParkedCall):  # narrowing: parked, or the decision to record
            return decided
        decision, who, reason = decided
        recorded = store.record(
            session_id=session_id,
            call_key=key,
            tool_name=tool.name,
            arguments_digest=arguments_digest(arguments),
            summary=summary,
            decision=decision.value,
            who=who,
            rule=verdict.rule,
            reason=reason,
        )
        faults.hit(AUTHORIZED)
        if policy_denies:
            return recorded, denial_text("policy", verdict.rule, verdict.reason)
        if recorded.decision == Decision.DENY.value:
            return recorded, denial_text(recorded.who, recorded.rule, recorded.reason)
        return recorded, None

    def _denied(self, session_id: str, tool_name: str, state: SessionState) -> bool:
        """Whether a person's denial of the tool stands in the session (the recorded
        decisions are read only when the log shows such a denial)."""
        if standing_denial(state, tool_name, ()) is None:
            return False
        decisions = self._effects().authorizations.list(session_id)
        return standing_denial(state, tool_name, decisions) is not None

    def _verdict(
        self,
        tool: Tool,
        arguments: Mapping[str, Any],
        kind: ToolKind,
        earlier_decision: EarlierDecision,
        denied: bool = False,
    ) -> PolicyVerdict:
        """The policy's verdict on the call, asked as the REPL would where a decision a
        crashed process made may have been lost with its record."""
        interactive = self._authorize is not None
        verdict = self._verdict_of(
            tool, arguments, kind, self.ask_by_default and interactive, denied
        )
        # A person may have denied this call before the crash, in a record that is gone:
        # "no record" must not mean "allowed by default"; ask as the REPL would instead.
        lost = earlier_decision is EarlierDecision.UNKNOWN and kind is ToolKind.SIDE_EFFECT
        if lost and verdict.decision is Decision.ALLOW:
            asking = self._verdict_of(tool, arguments, kind, True, denied)
            if asking.rule != verdict.rule:  # only the built-in default allowed it
                keep = asking.decision is Decision.ALLOW  # --yes answers the question
                verdict = (
                    asking
                    if keep
                    else PolicyVerdict(asking.decision, LOST_RECORD_RULE, asking.reason)
                )
        return verdict

    def _verdict_of(
        self,
        tool: Tool,
        arguments: Mapping[str, Any],
        kind: ToolKind,
        ask_by_default: bool,
        denied: bool,
    ) -> PolicyVerdict:
        return decide(
            self.project.policy,
            tool.name,
            arguments,
            kind=kind,
            interactive=self._authorize is not None,
            assume_yes=self.assume_yes,
            ask_by_default=ask_by_default,
            person_denied=denied,
        )

    def _decide(
        self,
        session_id: str,
        key: str,
        tool: Tool,
        arguments: Mapping[str, Any],
        summary: str,
        verdict: PolicyVerdict,
    ) -> ParkedCall | tuple[Decision, str, str | None]:
        """The decision to record for a call nobody decided yet: an "always" grant of the
        session, a parked call (or the decision a person made on it), the terminal's
        answer, else the policy's verdict (``--yes`` only where the policy said ask). After a
        person's denial of the tool no grant applies: only a person's new answer does."""
        decision = verdict.decision
        who = "--yes" if verdict.rule.startswith("--yes") else "policy"
        nobody = decision is Decision.DENY and verdict.reason in NOBODY_REASONS
        approvals = self._approvals()
        granted = (
            approvals.granted(session_id, tool.name, verdict.rule)
            if approvals is not None
            and (decision is Decision.ASK or nobody)
            and not verdict.after_denial
            else None
        )
        if granted is not None:
            return Decision.ALLOW, granted, "always allowed for this rule"
        if nobody and self.park and approvals is not None:
            return self._parked(approvals, session_id, key, tool, arguments, summary, verdict)
        if decision is Decision.ASK:
            return self._ask(session_id, tool, arguments, summary, verdict, approvals)
        return decision, who, verdict.reason

    def _ask(
        self,
        session_id: str,
        tool: Tool,
        arguments: Mapping[str, Any],
        summary: str,
        verdict: PolicyVerdict,
        approvals: ApprovalTable | None,
    ) -> tuple[Decision, str, str | None]:
        """Ask the person at the terminal; "always" is granted for the session too."""
        assert self._authorize is not None
        from tether._runtime.approval import AuthorizationRequest  # a call's values: see _APPROVAL

        request = AuthorizationRequest(tool.name, arguments, summary, verdict.rule, verdict.reason)
        answer = self._authorize(request)
        allowed = answer is True or answer == ALWAYS
        decision = Decision.ALLOW if allowed else Decision.DENY
        reason = "approved at the terminal" if allowed else "declined at the terminal"
        if answer == ALWAYS:
            reason = "always allowed for this rule (answered at the terminal)"
            if approvals is not None:
                approvals.grant(session_id, tool.name, verdict.rule, "user")
        return decision, "user", reason

    def _approvals(self) -> ApprovalTable | None:
        """The parked approvals, where the workspace database keeps them (SQLite)."""
        return self._effects().approvals

    def _parked(
        self,
        approvals: ApprovalTable,
        session_id: str,
        key: str,
        tool: Tool,
        arguments: Mapping[str, Any],
        summary: str,
        verdict: PolicyVerdict,
    ) -> ParkedCall | tuple[Decision, str, str | None]:
        """Park the call, or the decision a person made on it (void → parked again)."""
        digest = arguments_digest(arguments)
        request = approvals.active(session_id, key)
        note: str | None = None
        if request is not None and request.status != "proposed":
            why = stale_reason(request, self.workspace, self._version, digest=digest)
            if why is not None:
                approvals.void(request.id, why)
                note = f"the decision on call #{request.id} is void: {why}"
                request = None
        if request is None:
            paths = touched_files(tool, arguments)
            request = approvals.propose(
                session_id=session_id,
                call_key=key,
                tool_name=tool.name,
                arguments=dict(arguments),
                arguments_digest=digest,
                artifact_version=None if paths else self._version(),
                touched=touched_snapshot(self.workspace, paths),
                summary=summary,
                rule=verdict.rule,
            )
            faults.hit(PARKED)
        if request.status == "proposed":
            from tether._runtime.approval import ParkedCall  # a call's values: see _APPROVAL

            return ParkedCall(request.id, session_id, tool.name, summary, note)
        who = request.decided_by or "unknown"
        if request.status == "approved":
            return Decision.ALLOW, who, f"approved with tether approve (call #{request.id})"
        why = request.reason or "no reason given"
        return Decision.DENY, who, f"denied with tether deny (call #{request.id}): {why}"

    # ------------------------------------------------------------------ stop conditions

    def failed_call(
        self,
        state: SessionState,
        *,
        session_id: str,
        input_entry_id: str,
        tool_started_id: str,
        result_entry_id: str,
        tool_name: str,
        arguments: Mapping[str, Any],
    ) -> StopError | None:
        """Record a call that ended in an error result (``state`` already holds the
        result); the ``repeated_failure`` stop if the call right before it in this run was
        the same call failing on the same files."""
        failures = self._effects().failures
        current = FailedCall(
            tool_name,
            arguments_digest(arguments),
            self._version(),
            describe_call(tool_name, arguments),
        )
        failures.record(
            tool_started_id=tool_started_id,
            session_id=session_id,
            tool_name=tool_name,
            arguments_digest=current.arguments_digest,
            artifact_version=current.artifact_version,
            result_entry_id=result_entry_id,
        )
        previous_id = _previous_tool_result(state, input_entry_id, result_entry_id)
        if previous_id is None:
            return None
        earlier: ToolFailure | None = failures.by_result_entry(previous_id)
        if earlier is None:
            return None
        previous = FailedCall(earlier.tool_name, earlier.arguments_digest, earlier.artifact_version)
        return repeated_failure(previous, current)

    # ------------------------------------------------------------------ completion gate

    def changed_files_in_run(
        self, state: SessionState, input_entry_id: str, tools: Callable[[str], Tool | None]
    ) -> bool:
        """Whether the run called a tool that can change files (anything not replay-safe:
        write, edit, bash, effect tools)."""
        transcript = state.transcript
        for position in run_range(state, input_entry_id):
            message = transcript[position]
            if message.get("role") != "assistant":
                continue
            for call in message.get("tool_calls") or ():
                name = call.get("function", {}).get("name")
                tool = tools(name) if isinstance(name, str) else None
                if tool is None or tool.replay is not Replay.SAFE:
                    return True
        return False

    def assess(self) -> CompletionCheck:
        """The completion verdict for the files as they are now."""
        if self.project.verify.command is None:
            return unconfigured_check()  # without opening effects.db or scanning
        try:
            return self.verifier.assess()
        except ArtifactError as exc:
            return CompletionCheck(
                CompletionStatus.MISSING,
                None,
                f"unverified: the artifact version cannot be computed: {exc}",
                command=self.project.verify.command,
            )


def _previous_tool_result(
    state: SessionState, input_entry_id: str, result_entry_id: str
) -> str | None:
    """The id of the tool result right before ``result_entry_id`` in this run, if the
    entries between them are only assistant messages (the calls are consecutive)."""
    ids = state.transcript_ids
    transcript = state.transcript
    span = run_range(state, input_entry_id)
    try:
        position = ids.index(result_entry_id, span.start)
    except ValueError:
        return None
    for earlier in range(position - 1, span.start - 1, -1):
        role = transcript[earlier].get("role")
        if role == "tool":
            return ids[earlier]
        if role != "assistant":
            return None
    return None
