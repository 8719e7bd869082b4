"""The one exception hierarchy of tether, and the one table of exit statuses.

Every error a user can cause derives from :class:`TetherError`; the CLI maps each
subclass to a one-line message and an exit code. The codes are not attributes written on
each class: :data:`EXIT_STATUSES` at the end of this module is the one table from error type
(and from run outcome) to exit status, each row with its meaning, and every command reads
it (``tether._cli.common.handle_errors``, ``tether._cli.run_cmd.exit_code_for``). The
README's and ``docs/cli.md``'s exit-status tables list exactly its codes
(``tests/test_exit_codes.py``). ``TetherError.exit_code`` stays, read from the table.
"""

from __future__ import annotations

from typing import Any


class _TableExitCode:
    """``exit_code`` of an error class or instance: its row of :data:`EXIT_STATUSES`."""

    def __get__(self, instance: object, owner: type[BaseException]) -> int:
        return exit_code_of(owner)


class TetherError(Exception):
    """Base class of every error tether raises on purpose."""

    exit_code = _TableExitCode()


class SessionCorruption(TetherError):
    """A session log violates the session format contract.

    ``code`` is one of the spec's error codes (section 12), ``line`` the 1-based line
    number and ``seq`` the fact's sequence number, or ``None`` where the spec has none.
    """

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


class CheckpointMismatch(TetherError, ValueError):
    """A reducer checkpoint that cannot be used: not a checkpoint, another format or
    reducer, bound to another log prefix, or damaged (:mod:`tether.core.checkpoint`).
    Never reaches a user: the reader reduces the whole log instead."""


class CanonicalizationError(TetherError, ValueError):
    """A value is outside the closed JSON subset that canonical JSON admits."""


class ConfigurationError(TetherError, ValueError):
    """A configuration input (e.g. the planner's ``current``) is malformed."""


# --- Session store errors (tether._stores.file) -------------------------------------------
#
# Exit codes 3-12 (EXIT_STATUSES below).
#
# This module is pure, like tether.core (its import rule admits tether.errors): whatever a
# message needs from the operating system (the text of an errno, whether a pid is this
# process) is passed in by the shell code that raises the error.


class SessionNotFound(TetherError, LookupError):
    """No session log matches the given id, prefix or path."""

    def __init__(self, query: str, where: str = "") -> None:
        self.query = query
        self.where = where
        if query == "--last":  # no session to pick, not a session named "--last"
            super().__init__("--last: no session" + (f" in {where}" if where else ""))
            return
        super().__init__(f"no session {query!r}" + (f" in {where}" if where else ""))


class SessionBusy(TetherError):
    """Another writer (another process, or this one) holds the session's lock.

    ``pid`` is the holder's pid when it is proven to hold the lock (this process, or a
    process the kernel reports holding the pid record's lock), else ``None``;
    ``this_process`` says that the holder is the process raising the error.
    """

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


class AmbiguousSessionId(TetherError, LookupError):
    """A session id prefix matches more than one session."""

    def __init__(self, prefix: str, candidates: list[str]) -> None:
        self.prefix = prefix
        self.candidates = candidates
        shown = ", ".join(candidates[:5]) + (", …" if len(candidates) > 5 else "")
        super().__init__(
            f"session id prefix {prefix!r} is ambiguous: {len(candidates)} sessions match ({shown})"
        )


class UnsafeSessionPath(TetherError):
    """A session path is a symlink, not a regular file, or outside the sessions directory."""

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

    def __init__(self, path: str, why: str) -> None:
        self.path = path
        self.why = why
        super().__init__(f"session {path}: {why}")


class SessionFenced(TetherError):
    """This writer lost its lease on a session: another writer took it over (a higher epoch)
    or wrote to it. The writer must stop at once; nothing of the refused commit is stored."""

    def __init__(self, session_id: str, epoch: int, detail: str) -> None:
        self.session_id = session_id
        self.epoch = epoch
        self.detail = detail
        super().__init__(
            f"session {session_id}: fenced: this writer's lease (epoch {epoch}) {detail}"
        )


class StoreSchemaError(TetherError):
    """The database behind a store URL has no tether schema, or one this version cannot use."""


# --- Tool errors (tether._tools) ------------------------------------------------------------
#
# Expected failures of a tool call. The built-in tools turn them into an error result for the
# model (``"Error: " + str(error)``); they never end the run on their own.


class ToolError(TetherError):
    """A tool call failed in an expected way (bad path, text not found, stale file, …)."""


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
# Exit codes 20-26 (EXIT_STATUSES below).


class EffectsDatabaseError(TetherError):
    """``.tether/effects.db`` (or an effect ledger) cannot be used: corrupt, locked, unreadable.

    ``path`` names the database file, ``cause`` says what is wrong in one line.
    """

    def __init__(self, path: str, cause: str, what: str = "effects database") -> None:
        self.path = path
        self.cause = cause
        self.what = what
        super().__init__(f"{what} {path}: {cause}")


class OperationIdConflict(TetherError):
    """An operation id was used again with different arguments; nothing was applied."""

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

    def __init__(self, item: object) -> None:
        self.item = item
        super().__init__(f"no review item {item!r}; run 'tether review' to list the open items")


class ReviewItemResolved(TetherError):
    """The review item was already resolved; a decision is recorded only once."""

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

    def __init__(self, item: object, tool_name: str, operation_id: str, reason: str) -> None:
        self.item = item
        self.tool_name = tool_name
        self.operation_id = operation_id
        self.reason = reason
        super().__init__(
            f"blocked: call {tool_name} (operation {operation_id}) needs review: {reason}; "
            f"see 'tether review' and resolve item {item}"
        )


class RewindNeedsReview(ReviewRequired):
    """A rewind left files as they are because they changed since the session (``tether
    review`` lists them); exits like :class:`ReviewRequired`."""

    def __init__(self, paths: tuple[str, ...], items: tuple[object, ...]) -> None:
        self.paths = paths
        self.items = items
        TetherError.__init__(
            self,
            "rewind left for review (changed since the session, not overwritten): "
            + ", ".join(paths)
            + "; see 'tether review'",
        )


class ApprovalNotFound(TetherError, LookupError):
    """No parked call has the given id (``tether approve``/``deny``)."""


class ApprovalDecided(TetherError):
    """The parked call was decided already, or is void (it changed since it was proposed);
    a decision is recorded only once."""


# --------------------------------------------------------------------------- completion


class ProjectConfigError(ConfigurationError):
    """``tether.toml`` is unreadable, not valid TOML, or has a bad or unknown setting.

    The message names the file and the setting (``tether.toml: [verify] timeout: …``).
    """


class SandboxUnavailable(TetherError):
    """The sandbox mode is not ``off`` and its mechanism (bubblewrap) does not work here:
    tether refuses to run tools rather than run them unconfined (docs/sandbox.md)."""


class ArtifactError(TetherError):
    """The workspace's artifact version cannot be computed (e.g. an unreadable file).

    Nothing is ever recorded as verified when this is raised.
    """


class CheckCommandError(TetherError):
    """The check command of ``[verify]`` is missing or cannot be started."""


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


# --------------------------------------------------------------------------- exit statuses
#
# The one table from error type and run outcome to exit status. A command never writes a
# number: it raises one of the errors above (``handle_errors`` looks its code up here), ends
# a run (``exit_code_for`` looks the outcome up here), or names one of the constants below.
# A new code is a new row here, in the README and in docs/cli.md (tests/test_exit_codes.py).

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_BLOCKED = 65
"""Recovery is blocked (configuration, environment or replay gate, or attempts exhausted);
65 is free in the table (75 is the crash-injection exit of ``tether._faults``)."""
EXIT_UNVERIFIED = 66
"""Verification was required (``--require-verified``) and the completed run is still not
backed by a passing check of the files as they are now."""
EXIT_AWAITING_APPROVAL = 67
"""A call is parked until a person decides with ``tether approve``/``deny`` (the policy
said ask and nobody could be asked here); ``tether resume`` carries the decision out."""
EXIT_INTERNAL = 70
"""sysexits.h ``EX_SOFTWARE``: an internal error (a bug in tether), never caused by input."""
EXIT_CRASH_INJECTED = 75
"""The crash-injection exit (``TETHER_CRASH_AT`` with ``TETHER_CRASH_MODE=exit``)."""
EXIT_ABORTED = 130
"""Aborted (Ctrl+C), as a shell reports a command ended by SIGINT (128 + 2)."""
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE, what a shell reports for a command whose reader went away (``| head``)."""


class ExitStatus:
    """One row of :data:`EXIT_STATUSES`: a code, its meaning, and what exits with it.

    ``errors``: the error types whose code this is (a subclass not listed has the code of
    its nearest listed base); ``outcomes``: the run outcomes (``RunStatus`` values) that end
    a ``run``/``resume``/REPL turn with it.

    A plain class: this module sits below the core, so it cannot be a record
    (:mod:`tether.core.records`), and a ``NamedTuple`` took ~1.1 ms of every start-up to
    create (issue 31's 30 ms). A row is never changed once the table is built.
    """

    __slots__ = ("code", "errors", "meaning", "outcomes")

    def __init__(
        self,
        code: int,
        meaning: str,
        errors: tuple[type[TetherError], ...] = (),
        outcomes: tuple[str, ...] = (),
    ) -> None:
        self.code = code
        self.meaning = meaning
        self.errors = errors
        self.outcomes = outcomes

    def __repr__(self) -> str:
        return f"ExitStatus({self.code}, {self.meaning!r})"


EXIT_STATUSES: tuple[ExitStatus, ...] = (
    ExitStatus(
        EXIT_OK,
        "success: the run completed or there was nothing to do; a check or lab passed",
        outcomes=("completed", "idle"),
    ),
    ExitStatus(
        EXIT_FAILED,
        "the run failed, a check or lab failed, a rejected write, or a corrupt session "
        "given to inspect/plan",
        errors=(TetherError, SessionCorruption, FactRejected, ToolError, ModelError),
        outcomes=("failed",),
    ),
    ExitStatus(
        EXIT_USAGE,
        "usage or configuration error: bad flags, no model, an unusable input file",
        errors=(ConfigurationError,),
    ),
    ExitStatus(3, "no such session", errors=(SessionNotFound,)),
    ExitStatus(4, "the session is busy: another writer holds it", errors=(SessionBusy,)),
    ExitStatus(5, "the session log is corrupt", errors=(CorruptSession,)),
    ExitStatus(6, "unsupported session format version", errors=(UnsupportedSessionVersion,)),
    ExitStatus(7, "ambiguous session id prefix", errors=(AmbiguousSessionId,)),
    ExitStatus(8, "unsafe session path", errors=(UnsafeSessionPath,)),
    ExitStatus(
        9, "writing, syncing or creating the session log failed", errors=(SessionWriteError,)
    ),
    ExitStatus(10, "the session store is not usable", errors=(StoreUnavailable,)),
    ExitStatus(11, "fenced: this writer lost its lease on the session", errors=(SessionFenced,)),
    ExitStatus(12, "the store's database has no usable tether schema", errors=(StoreSchemaError,)),
    ExitStatus(20, "the effects database is unusable", errors=(EffectsDatabaseError,)),
    ExitStatus(21, "an operation id reused with other arguments", errors=(OperationIdConflict,)),
    ExitStatus(22, "no such review item", errors=(ReviewItemNotFound,)),
    ExitStatus(23, "the review item is already resolved", errors=(ReviewItemResolved,)),
    ExitStatus(24, "a started call needs review", errors=(ReviewRequired,)),
    ExitStatus(25, "no such parked call", errors=(ApprovalNotFound,)),
    ExitStatus(26, "the parked call is already decided or void", errors=(ApprovalDecided,)),
    ExitStatus(
        27,
        "the sandbox cannot confine commands here (and its mode is not off)",
        errors=(SandboxUnavailable,),
    ),
    ExitStatus(30, "a file of the workspace cannot be read for verify", errors=(ArtifactError,)),
    ExitStatus(31, "the check command could not run", errors=(CheckCommandError,)),
    ExitStatus(EXIT_BLOCKED, "recovery is blocked", outcomes=("blocked",)),
    ExitStatus(EXIT_UNVERIFIED, "--require-verified and the completed run is not verified"),
    ExitStatus(
        EXIT_AWAITING_APPROVAL,
        "a call is parked until a person decides",
        outcomes=("awaiting_approval",),
    ),
    ExitStatus(EXIT_INTERNAL, "internal error: a bug in tether"),
    ExitStatus(EXIT_CRASH_INJECTED, "an injected crash (crash injection only)"),
    ExitStatus(
        EXIT_ABORTED,
        "aborted by Ctrl+C, or stopped by the caller",
        outcomes=("aborted", "stopped"),
    ),
    ExitStatus(EXIT_BROKEN_PIPE, "the reader of the output went away (broken pipe)"),
)

_ERROR_CODES: dict[type[BaseException], int] = {
    error: row.code for row in EXIT_STATUSES for error in row.errors
}
_OUTCOME_CODES: dict[str, int] = {
    outcome: row.code for row in EXIT_STATUSES for outcome in row.outcomes
}


def exit_code_of(error: type[BaseException]) -> int:
    """The exit status of ``error`` (a type): the row of its nearest listed base class.

    Anything that is not a :class:`TetherError` is a bug in tether: :data:`EXIT_INTERNAL`.
    """
    for base in error.__mro__:
        code = _ERROR_CODES.get(base)
        if code is not None:
            return code
    return EXIT_INTERNAL


def outcome_exit_code(outcome: str) -> int:
    """The exit status of a run that ended with ``outcome`` (a ``RunStatus`` value)."""
    try:
        return _OUTCOME_CODES[outcome]
    except KeyError:
        raise ValueError(f"no exit status for the run outcome {outcome!r}") from None
