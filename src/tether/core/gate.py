"""The completion gate: is "done" backed by a passing check on the files as they are now?

Pure: the caller passes the current :class:`~tether.core.values.ArtifactVersion`
and the evidence it looked up; nothing here reads the disk, the clock or the database.

The verdict, in order:

* ``verified`` — the newest conclusive verification (passed or failed, not void) of the
  *current* artifact version passed;
* ``failed`` — that newest conclusive verification of the current version failed (or could
  not run): a failing check is never reported as verified, even if an older run on the
  same files passed;
* ``stale`` — nothing conclusive ran on the current version, but an earlier version
  passed: the files changed since (named, from that version's manifest);
* ``missing`` — no passing verification on record at all, or no check command configured.

Void evidence (the files changed while the check ran) proves nothing and is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final

from tether.core.records import record

if TYPE_CHECKING:  # annotations; the one value used at run time is imported where used
    from tether.core.values import ArtifactVersion, Verification

__all__ = [
    "MAX_NAMED_FILES",
    "CompletionCheck",
    "CompletionStatus",
    "assess_completion",
    "name_files",
    "unconfigured_check",
]

MAX_NAMED_FILES: Final = 10
"""How many changed files a message names before it says "and N more"."""


class CompletionStatus(StrEnum):
    VERIFIED = "verified"
    STALE = "stale"
    FAILED = "failed"
    MISSING = "missing"


@record
class CompletionCheck:
    """The gate's verdict on one artifact version."""

    status: CompletionStatus
    version: str | None
    """The artifact version judged; ``None`` when it was not computed."""
    message: str
    command: str | None = None
    evidence_id: str | None = None
    """The verification the verdict rests on (the passing one for ``stale``)."""
    changed_files: tuple[str, ...] = ()
    """Files changed since the last passing verification (``stale``, ``failed``)."""
    changes_known: bool = True
    """False when the passing version's manifest was not available to compare with."""

    @property
    def verified(self) -> bool:
        return self.status is CompletionStatus.VERIFIED

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "version": self.version,
            "message": self.message,
            "command": self.command,
            "evidenceId": self.evidence_id,
            "changedFiles": list(self.changed_files),
            "changesKnown": self.changes_known,
        }


def unconfigured_check(version: str | None = None) -> CompletionCheck:
    """The verdict when no check command is configured: nothing can be verified."""
    return CompletionCheck(
        CompletionStatus.MISSING,
        version,
        "unverified: no check command is configured (add [verify] command to tether.toml)",
    )


def name_files(paths: Sequence[str]) -> str:
    """``a, b, c`` — at most :data:`MAX_NAMED_FILES`, then ``and N more``."""
    shown = ", ".join(paths[:MAX_NAMED_FILES])
    hidden = len(paths) - MAX_NAMED_FILES
    return f"{shown} and {hidden} more" if hidden > 0 else shown


def _changes(
    current: ArtifactVersion, passing_version: ArtifactVersion | None
) -> tuple[tuple[str, ...], bool, str]:
    if passing_version is None:
        return (), False, "the changed files are not known (no manifest of that version)"
    changed = tuple(current.changed_since(passing_version))
    return changed, True, f"changed since: {name_files(changed)}" if changed else ""


def assess_completion(
    current: ArtifactVersion,
    *,
    command: str | None,
    at_current: Verification | None,
    last_passing: Verification | None,
    passing_version: ArtifactVersion | None,
) -> CompletionCheck:
    """The verdict for ``current``.

    ``at_current`` is the newest conclusive (passed, failed or error — not void)
    verification whose start version is ``current.digest``; ``last_passing`` the newest
    passing verification of any version and ``passing_version`` its artifact version (from
    its manifest), ``None`` when unknown. ``command`` is the configured check command.
    """
    from tether.core.values import VerificationStatus  # see the imports at the top

    digest = current.digest
    if command is None:
        return unconfigured_check(digest)
    if at_current is not None and at_current.version_start != digest:
        raise ValueError("at_current must be a verification of the current version")
    if at_current is not None and at_current.status is VerificationStatus.PASSED:
        return CompletionCheck(
            CompletionStatus.VERIFIED,
            digest,
            f"verified: `{at_current.command}` passed on the files as they are now",
            command=at_current.command,
            evidence_id=at_current.id,
        )
    changed: tuple[str, ...] = ()
    known = True
    since = ""
    if last_passing is not None:
        changed, known, since = _changes(current, passing_version)
    if at_current is not None:
        if at_current.error is not None:
            how = f"could not be checked ({at_current.error})"
        elif at_current.timed_out or at_current.exit_status is None:
            how = "timed out"
        else:
            how = f"exited {at_current.exit_status}"
        text = f"failed: the last check of these files, `{at_current.command}`, {how}"
        return CompletionCheck(
            CompletionStatus.FAILED,
            digest,
            f"{text}; {since}" if since else text,
            command=at_current.command,
            evidence_id=at_current.id,
            changed_files=changed,
            changes_known=known,
        )
    if last_passing is not None:
        text = f"stale: `{last_passing.command}` passed on an earlier version of the files"
        return CompletionCheck(
            CompletionStatus.STALE,
            digest,
            f"{text}; {since}" if since else text,
            command=command,
            evidence_id=last_passing.id,
            changed_files=changed,
            changes_known=known,
        )
    return CompletionCheck(
        CompletionStatus.MISSING,
        digest,
        f"unverified: `{command}` has never passed in this workspace",
        command=command,
    )
