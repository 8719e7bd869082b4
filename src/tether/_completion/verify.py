"""Verification: run the workspace's check command, record evidence, judge completion.

:class:`Verifier` is the imperative shell around the pure pieces: it computes artifact
versions (:mod:`~tether._completion.artifact`), runs ``[verify] command`` through
:func:`~tether._completion.check.run_check`, records every run in the workspace database
(:attr:`~tether._wsdb.protocol.WorkspaceDB.verifications`; in ``effects.db`` the
:class:`~tether._completion.evidence.VerificationStore`, with the manifest of a passing
version so that later verdicts can name the files changed since), and asks the pure
:func:`~tether.core.gate.assess_completion` for the verdict.

:class:`VerifyTool` is the ``verify`` tool the model calls. It is replay-safe: after a
crash a started ``verify`` call whose evidence was already recorded is answered from that
evidence instead of running the check again; one without evidence simply runs it again.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from tether._completion.artifact import (
    ArtifactScanner,
    ArtifactVersion,
    from_manifest,
    to_manifest,
)
from tether._completion.check import run_check
from tether._completion.evidence import Verification, VerificationStatus
from tether._project import ProjectConfig
from tether._tools.base import Tool, ToolContext, ToolResult
from tether._wsdb.protocol import WorkspaceDB
from tether.core.gate import (
    CompletionCheck,
    assess_completion,
    name_files,
    unconfigured_check,
)
from tether.core.kinds import Replay
from tether.errors import ArtifactError, CheckCommandError

__all__ = [
    "ARTIFACT_CACHE_NAME",
    "NO_COMMAND",
    "Verifier",
    "VerifyTool",
    "describe_verification",
    "workspace_scanner",
]

ARTIFACT_CACHE_NAME: Final = "artifact-cache.json"
"""The persisted (path, size, mtime) cache, in the workspace's ``.tether`` folder."""

NO_COMMAND: Final = (
    'no check command is configured: add [verify] command = "pytest -q" (or your own) '
    "to tether.toml"
)


def workspace_scanner(workspace: str | os.PathLike[str], config: ProjectConfig) -> ArtifactScanner:
    """The artifact scanner of ``workspace``: ``[artifact] ignore`` and the persisted cache."""
    root = Path(os.path.realpath(workspace))
    return ArtifactScanner(
        root, ignore=config.artifact.ignore, cache_path=root / ".tether" / ARTIFACT_CACHE_NAME
    )


class Verifier:
    """Verification of one workspace with its ``tether.toml`` settings."""

    def __init__(
        self,
        workspace: str | os.PathLike[str],
        config: ProjectConfig,
        db: WorkspaceDB,
        *,
        scanner: ArtifactScanner | None = None,
    ) -> None:
        self.workspace = Path(os.path.realpath(workspace))
        self.config = config
        self.store = db.verifications
        self.scanner = scanner if scanner is not None else workspace_scanner(workspace, config)

    @property
    def command(self) -> str | None:
        return self.config.verify.command

    def version(self) -> ArtifactVersion:
        """The current artifact version (raises :class:`ArtifactError`)."""
        return self.scanner.version()

    def verify(
        self,
        *,
        session_id: str | None = None,
        tool_started_id: str | None = None,
        cancel: threading.Event | None = None,
        timeout: float | None = None,
    ) -> tuple[Verification, tuple[str, ...]]:
        """Run the check once and record it; the evidence and, for void evidence, the
        files that changed while it ran.

        With ``tool_started_id`` a verification already recorded for that call (before a
        crash) is returned instead of running the check again.
        """
        command = self.command
        if command is None:
            raise CheckCommandError(NO_COMMAND)
        if tool_started_id is not None:
            earlier = self.store.by_tool_started_id(tool_started_id)
            if earlier is not None:
                return earlier, ()
        seen: list[ArtifactVersion] = []

        def version() -> str:
            current = self.scanner.version()
            seen.append(current)
            return current.digest

        outcome = run_check(
            self.workspace,
            command,
            timeout=timeout if timeout is not None else self.config.verify.timeout,
            version=version,
            cancel=cancel,
            pass_env=self.config.tools.pass_env,
        )
        manifest = None
        if outcome.status is VerificationStatus.PASSED and seen:
            manifest = (seen[0].digest, to_manifest(seen[0]))
        recorded = self.store.record(
            session_id=session_id,
            tool_started_id=tool_started_id,
            outcome=outcome,
            manifest=manifest,
        )
        changed: tuple[str, ...] = ()
        if len(seen) == 2:
            changed = tuple(seen[1].changed_since(seen[0]))
        return recorded, changed

    def assess(self, current: ArtifactVersion | None = None) -> CompletionCheck:
        """The completion verdict for the files as they are now (or for ``current``)."""
        if self.command is None:
            return unconfigured_check(current.digest if current is not None else None)
        if current is None:
            current = self.version()
        at_current = self.store.latest_conclusive(current.digest)
        last_passing = self.store.latest_passing()
        passing_version: ArtifactVersion | None = None
        if last_passing is not None and last_passing.version_start is not None:
            data = self.store.manifest(last_passing.version_start)
            if data is not None:
                try:
                    passing_version = from_manifest(last_passing.version_start, data)
                except ArtifactError:
                    passing_version = None
        return assess_completion(
            current,
            command=self.command,
            at_current=at_current,
            last_passing=last_passing,
            passing_version=passing_version,
        )


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.1f} s"


def describe_verification(verification: Verification, changed: tuple[str, ...] = ()) -> str:
    """One line saying what a verification proved."""
    command = f"`{verification.command}`"
    status = verification.status
    if status is VerificationStatus.PASSED:
        return (
            f"PASSED: {command} exited 0 in {_seconds(verification.duration_ms)} on the files "
            "as they are now"
        )
    if status is VerificationStatus.VOID:
        which = f" ({name_files(changed)})" if changed else ""
        return (
            f"VOID: the files changed while {command} ran{which}, so the result proves "
            "nothing; if the check itself writes those files, add them to [artifact] ignore "
            "in tether.toml"
        )
    if status is VerificationStatus.ERROR:
        return f"ERROR: {command} could not be checked: {verification.error}"
    if verification.timed_out:
        return f"FAILED: {command} timed out after {_seconds(verification.duration_ms)}"
    return (
        f"FAILED: {command} exited {verification.exit_status} in "
        f"{_seconds(verification.duration_ms)}"
    )


class VerifyTool(Tool):
    """``verify`` {}: run the workspace's check command and record the evidence."""

    name = "verify"
    description = (
        "Run the workspace's check command (configured by the user, e.g. the test suite) "
        "on the files as they are now, and record the result as evidence. Call it after "
        "your last change and before you say the work is done: any later edit makes the "
        "evidence stale. Takes no arguments."
    )
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }
    replay = Replay.SAFE
    replay_key = "builtin:verify:v1"

    def __init__(self, verifier: Verifier | Callable[[], Verifier]) -> None:
        """``verifier`` may be a factory: the effects database is then opened on the first
        call, not when the tool is built."""
        super().__init__()
        self._verifier = verifier

    @property
    def verifier(self) -> Verifier:
        if not isinstance(self._verifier, Verifier):
            self._verifier = self._verifier()
        return self._verifier

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        try:
            verification, changed = self.verifier.verify(
                session_id=context.session_id,
                tool_started_id=context.operation_id,
                cancel=context.cancel,
            )
        except CheckCommandError as exc:
            return ToolResult.error(f"Error: {exc}")
        text = describe_verification(verification, changed)
        tail = verification.output_tail
        content = f"verify: {text}.\n\nOutput (last part):\n{tail}" if tail else f"verify: {text}."
        passed = verification.status is VerificationStatus.PASSED
        return ToolResult(
            content,
            is_error=not passed,
            metadata={"verification": verification.id, "status": verification.status.value},
        )
