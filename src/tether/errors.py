"""The one exception hierarchy of tether.

Every error a user can cause derives from :class:`TetherError`; the CLI maps each
subclass to a one-line message and a distinct exit code.
"""

from __future__ import annotations

from typing import Any


class TetherError(Exception):
    """Base class of every error tether raises on purpose."""

    exit_code: int = 1


class SessionCorruption(TetherError):
    """A session log violates the session format contract.

    ``code`` is one of the spec's error codes (section 12), ``line`` the 1-based line
    number and ``seq`` the fact's sequence number, or ``None`` where the spec has none.
    """

    exit_code = 1

    def __init__(self, code: str, line: int, seq: int | None = None, detail: str = "") -> None:
        self.code = code
        self.line = line
        self.seq = seq
        self.detail = detail
        where = f"line {line}" + (f", seq {seq}" if seq is not None else "")
        super().__init__(f"{code} at {where}" + (f": {detail}" if detail else ""))

    def to_json(self) -> dict[str, Any]:
        """The error as the spec encodes it: ``seq`` omitted when absent."""
        out: dict[str, Any] = {"code": self.code, "line": self.line}
        if self.seq is not None:
            out["seq"] = self.seq
        return out


class CanonicalizationError(TetherError, ValueError):
    """A value is outside the closed JSON subset that canonical JSON admits."""


class ConfigurationError(TetherError, ValueError):
    """A configuration input (e.g. the planner's ``current``) is malformed."""

    exit_code = 2


# --- Session store errors (tether._stores.file) -------------------------------------------
#
# Exit codes: 1 generic / corrupt candidate, 2 configuration, 3 session not found,
# 4 session busy, 5 corrupt session log, 6 unsupported session version, 7 ambiguous session
# id, 8 unsafe session path, 9 write/sync failure, 10 store not usable (closed, read-only or
# failed).
#
# This module is pure, like tether.core (its import rule admits tether.errors): whatever a
# message needs from the operating system (the text of an errno, whether a pid is this
# process) is passed in by the shell code that raises the error.


class SessionNotFound(TetherError, LookupError):
    """No session log matches the given id, prefix or path."""

    exit_code = 3

    def __init__(self, query: str, where: str = "") -> None:
        self.query = query
        self.where = where
        super().__init__(f"no session {query!r}" + (f" in {where}" if where else ""))


class SessionBusy(TetherError):
    """Another writer (another process, or this one) holds the session's lock.

    ``pid`` is the holder's pid when it is proven to hold the lock (this process, or a
    process the kernel reports holding the pid record's lock), else ``None``;
    ``this_process`` says that the holder is the process raising the error.
    """

    exit_code = 4

    def __init__(self, path: str, pid: int | None, *, this_process: bool = False) -> None:
        self.path = path
        self.pid = pid
        self.this_process = this_process
        if pid is None:
            # Not provably the current holder: naming a pid someone might kill would be a
            # guess (see tether._stores.locking).
            holder = "another process"
        elif this_process:
            holder = f"this process (pid {pid})"
        else:
            holder = f"pid {pid}"
        super().__init__(f"session {path} is already open for writing by {holder}")


class CorruptSession(SessionCorruption):
    """A session log on disk violates the format; carries the file's path.

    Still a :class:`SessionCorruption` (same ``code``/``line``/``seq``), so callers that
    catch the spec-level error keep working.
    """

    exit_code = 5

    def __init__(
        self, path: str, code: str, line: int, seq: int | None = None, detail: str = ""
    ) -> None:
        super().__init__(code, line, seq, detail)
        self.path = path
        where = f"line {line}" + (f", seq {seq}" if seq is not None else "")
        self.args = (
            f"session {path} is corrupt: {code} at {where}" + (f" ({detail})" if detail else ""),
        )

    @classmethod
    def wrap(cls, path: str, error: SessionCorruption) -> CorruptSession:
        """The right subclass for ``error`` found in the file at ``path``."""
        kind = UnsupportedSessionVersion if error.code == "UNSUPPORTED_VERSION" else cls
        return kind(path, error.code, error.line, error.seq, error.detail)


class UnsupportedSessionVersion(CorruptSession):
    """The log's header names a format version this tether does not read."""

    exit_code = 6

    def __init__(
        self, path: str, code: str, line: int, seq: int | None = None, detail: str = ""
    ) -> None:
        super().__init__(path, code, line, seq, detail)
        self.args = (
            f"session {path} has an unsupported format version (this tether reads version 2)"
            + (f": {detail}" if detail else ""),
        )


class FactRejected(SessionCorruption):
    """A candidate transaction failed validation; nothing was written or changed.

    ``code``/``line``/``seq`` are what the reducer would report if the line were on disk.
    """

    exit_code = 1


class AmbiguousSessionId(TetherError, LookupError):
    """A session id prefix matches more than one session."""

    exit_code = 7

    def __init__(self, prefix: str, candidates: list[str]) -> None:
        self.prefix = prefix
        self.candidates = candidates
        shown = ", ".join(candidates[:5]) + (", …" if len(candidates) > 5 else "")
        super().__init__(
            f"session id prefix {prefix!r} is ambiguous: {len(candidates)} sessions match ({shown})"
        )


class UnsafeSessionPath(TetherError):
    """A session path is a symlink, not a regular file, or outside the sessions directory."""

    exit_code = 8

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"refusing session path {path}: {reason}")


class SessionWriteError(TetherError, OSError):
    """Writing or syncing a transaction failed; the transaction is not committed.

    ``errno`` is the operating system's error and ``strerror`` its text (``os.strerror``,
    passed in by the raiser; ``None``: "I/O error"). When ``failed`` is true the store could
    not prove that file and memory agree (a sync failed, or undoing the write failed): it
    accepts no further commits until the session is reopened.
    """

    exit_code = 9

    def __init__(
        self,
        path: str,
        op: str,
        errno_: int | None,
        failed: bool,
        *,
        strerror: str | None = None,
    ) -> None:
        reason = strerror or "I/O error"
        OSError.__init__(self, errno_, reason)
        self.path = path
        self.op = op
        self.failed = failed
        tail = "; store is unusable until reopened" if failed else "; nothing was committed"
        self.args = (f"session {path}: {op} failed: {reason}{tail}",)

    def __str__(self) -> str:
        return str(self.args[0])


class SessionCreateError(SessionWriteError):
    """Creating a session failed at one of its system calls; no session was created.

    ``path`` is the sessions directory, ``op`` the step that failed (``mkdir DIR``,
    ``write of the header``, ``link to the final name``, …) and ``errno`` the cause, e.g.
    ``ENOSPC`` on a full disk. What the create had made is removed again (directories it
    made stay: they are empty).
    """

    exit_code = 9

    def __init__(
        self, path: str, op: str, errno_: int | None, *, strerror: str | None = None
    ) -> None:
        super().__init__(path, op, errno_, False, strerror=strerror)
        reason = strerror or "I/O error"
        self.args = (
            f"cannot create a session in {path}: {op} failed: {reason}; no session was created",
        )


class StoreUnavailable(TetherError):
    """The store cannot accept commits: it is closed, read-only, or failed earlier."""

    exit_code = 10

    def __init__(self, path: str, why: str) -> None:
        self.path = path
        self.why = why
        super().__init__(f"session {path}: {why}")


class SessionFenced(TetherError):
    """This writer lost its lease on a session: another writer took it over (a higher epoch)
    or wrote to it. The writer must stop at once; nothing of the refused commit is stored."""

    exit_code = 11

    def __init__(self, session_id: str, epoch: int, detail: str) -> None:
        self.session_id = session_id
        self.epoch = epoch
        self.detail = detail
        super().__init__(
            f"session {session_id}: fenced: this writer's lease (epoch {epoch}) {detail}"
        )


class StoreSchemaError(TetherError):
    """The database behind a store URL has no tether schema, or one this version cannot use."""

    exit_code = 12


# --- Tool errors (tether._tools) ------------------------------------------------------------
#
# Expected failures of a tool call. The built-in tools turn them into an error result for the
# model (``"Error: " + str(error)``); they never end the run on their own.


class ToolError(TetherError):
    """A tool call failed in an expected way (bad path, text not found, stale file, …)."""

    exit_code = 1


class WorkspaceEscape(ToolError):
    """A path would leave the workspace: absolute, ``..``, a symbolic link, or outside it."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"path escapes the workspace: {path!r} ({reason})")


class ProtectedPath(WorkspaceEscape):
    """A path names tether's own state: a session log, its lock, the effects database, …

    The file tools never read or change what tether keeps for itself (its ``.tether``
    folder and the sessions directory, wherever that is), whatever the path to it — a
    second path, a bind mount or a hard link included.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        # A WorkspaceEscape for every handler that refuses a path, but in its own words:
        # the path may well lie inside the workspace; it is just not the tools' to use.
        ToolError.__init__(
            self,
            f"{path!r} is tether's own state ({reason}); the file tools never read or change it",
        )


class StaleFileChange(ToolError):
    """A planned file change no longer applies: the file changed since it was planned."""

    def __init__(self, path: str, expected: str | None, found: str | None) -> None:
        self.path = path
        self.expected = expected
        self.found = found
        was = expected or "absent"
        now = found or "absent"
        super().__init__(
            f"{path!r} changed since the edit was planned (expected {was}, found {now}); "
            "nothing was written"
        )


# --- Model adapter errors (tether._models) ----------------------------------------------------


class ModelError(TetherError):
    """One model request failed; becomes ``stepFailed.error`` ``{code, message}`` (spec 8.4).

    ``code`` is one of :data:`MODEL_ERROR_CODES`; ``message`` is one line and carries the
    provider's own message (credentials redacted). ``status`` is the HTTP status when there
    was one; ``retry_after`` the provider's hint in seconds (informational: tether never
    retries on its own).
    """

    exit_code = 1

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        if code not in MODEL_ERROR_CODES:
            raise ValueError(f"unknown model error code {code!r}")
        line = " ".join(message.split()) or code
        self.code = code
        self.message = line if len(line) <= 1000 else line[:999] + "…"
        self.status = status
        self.retry_after = retry_after
        super().__init__(self.message)

    def to_json(self) -> dict[str, str]:
        """The ``{"code", "message"}`` object of ``stepFailed.error``."""
        return {"code": self.code, "message": self.message}


MODEL_ERROR_CODES = frozenset(
    {
        "rate_limited",
        "timeout",
        "connection",
        "provider_error",
        "authentication",
        "bad_response",
        "aborted",
    }
)


# --- Effects errors (tether._effects) ----------------------------------------------------------
#
# Exit codes: 20 effects database unusable (corrupt, locked, newer schema, I/O), 21 operation id
# reused with different arguments, 22 review item not found, 23 review item already resolved,
# 24 a call needs review (the run is blocked).


class EffectsDatabaseError(TetherError):
    """``.tether/effects.db`` (or an effect ledger) cannot be used: corrupt, locked, unreadable.

    ``path`` names the database file, ``cause`` says what is wrong in one line.
    """

    exit_code = 20

    def __init__(self, path: str, cause: str, what: str = "effects database") -> None:
        self.path = path
        self.cause = cause
        self.what = what
        super().__init__(f"{what} {path}: {cause}")


class OperationIdConflict(TetherError):
    """An operation id was used again with different arguments; nothing was applied."""

    exit_code = 21

    def __init__(self, operation_id: str, recorded: str, given: str, where: str = "") -> None:
        self.operation_id = operation_id
        self.recorded = recorded
        self.given = given
        place = f" in {where}" if where else ""
        super().__init__(
            f"operation id {operation_id} is already recorded{place} with different arguments "
            f"(recorded {recorded}, now {given}); refusing to apply it again"
        )


class ReviewItemNotFound(TetherError, LookupError):
    """No review item has the given id."""

    exit_code = 22

    def __init__(self, item: object) -> None:
        self.item = item
        super().__init__(f"no review item {item!r}; run 'tether review' to list the open items")


class ReviewItemResolved(TetherError):
    """The review item was already resolved; a decision is recorded only once."""

    exit_code = 23

    def __init__(self, item: object, decision: str, resolved_at: str) -> None:
        self.item = item
        self.decision = decision
        self.resolved_at = resolved_at
        super().__init__(
            f"review item {item!r} was already resolved ({decision}, at {resolved_at}); "
            "a decision cannot be changed"
        )


class ReviewRequired(TetherError):
    """Recovery stopped: a started call's outcome needs a human decision (``tether review``)."""

    exit_code = 24

    def __init__(self, item: object, tool_name: str, operation_id: str, reason: str) -> None:
        self.item = item
        self.tool_name = tool_name
        self.operation_id = operation_id
        self.reason = reason
        super().__init__(
            f"blocked: call {tool_name} (operation {operation_id}) needs review: {reason}; "
            f"see 'tether review' and resolve item {item}"
        )


class ApprovalNotFound(TetherError, LookupError):
    """No parked call has the given id (``tether approve``/``deny``)."""

    exit_code = 25


class ApprovalDecided(TetherError):
    """The parked call was decided already, or is void (it changed since it was proposed);
    a decision is recorded only once."""

    exit_code = 26


# --------------------------------------------------------------------------- completion


class ProjectConfigError(ConfigurationError):
    """``tether.toml`` is unreadable, not valid TOML, or has a bad or unknown setting.

    The message names the file and the setting (``tether.toml: [verify] timeout: …``).
    """

    exit_code = 2


class ArtifactError(TetherError):
    """The workspace's artifact version cannot be computed (e.g. an unreadable file).

    Nothing is ever recorded as verified when this is raised.
    """

    exit_code = 30


class CheckCommandError(TetherError):
    """The check command of ``[verify]`` is missing or cannot be started."""

    exit_code = 31


# --------------------------------------------------------------------------- input files
#
# Exit code 2 (a usage / configuration error), like every other input a user gives: the
# session file of `tether inspect`/`tether plan`, CURRENT.json, a model script, AGENTS.md,
# tether.toml. Raised by tether._inputs, which every reader of such a file goes through.


class InputFileError(ConfigurationError):
    """A file tether reads as input cannot be used: missing, unreadable or not a regular file.

    ``label`` names the input as the message shows it (``model script demo.json``,
    ``tether.toml``); ``reason`` says what is wrong. The message is
    ``cannot read <label>: <reason>``.
    """

    exit_code = 2

    def __init__(self, label: str, reason: str) -> None:
        self.label = label
        self.reason = reason
        super().__init__(f"cannot read {label}: {reason}")


class NotARegularFile(InputFileError):
    """The input is a directory, a FIFO, a device or a socket (after following links).

    Checked on the open descriptor, so a FIFO never blocks and a device is never read.
    """


class InputTooLarge(InputFileError):
    """The input is larger than the limit for its kind.

    ``size`` is the file's size when it was known before reading (then nothing was read),
    ``None`` when the file turned out larger than it said (it grew, or it is in ``/proc``).
    """

    def __init__(self, label: str, size: int | None, limit: int) -> None:
        self.size = size
        self.limit = limit
        actual = f" ({size} bytes)" if size is not None else ""
        super().__init__(label, f"it is larger than the {_size(limit)} limit{actual}")


class InputTooDeep(ConfigurationError):
    """A JSON input is nested deeper than the limit for its kind."""

    exit_code = 2

    def __init__(self, label: str, limit: int) -> None:
        self.label = label
        self.limit = limit
        super().__init__(f"{label} is nested deeper than {limit} levels of arrays and objects")


def _size(size: int) -> str:
    """``64 KiB``, ``8 MiB``, ``1 GiB``: a size limit as the documentation states it."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} bytes"
