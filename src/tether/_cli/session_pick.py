"""Which session a command means, and the settings a session was run with.

* ``--last`` picks the session with the latest activity in the sessions folder; a session
  argument is a full id, a unique id prefix, a file name or a path (the store resolves it).
* ``run``/``resume``/``repl``/``retry`` remember the model, endpoint and options they used
  (the settings the table marks ``remembered``, never the API key, and only those given by
  a flag or a variable) when they make a model request with them, in
  ``.tether/settings/<session id>.json`` of the workspace. Continuing the session later
  without those flags uses them again (a flag given now wins). A session without that
  record falls back to the model its header names (not for scripted models: their file is
  unknown).

**The record is not trusted.** It lies in the workspace, where a command the agent runs can
rewrite it (with the sandbox off), and it decides where the user's API key is sent. So it is
bound to the session log: its model and endpoint are used only when they give the model and
routing identity the log's last ``stepAttempt`` recorded, and its system prompt only when it
gives the recorded ``systemPromptDigest`` (the log records both in every attempt's
configuration snapshot). A value that does not match is ignored, with one warning line
naming the record; and when the endpoint used comes from the record rather than from this
process's flags, variables or tether.toml, one line says so before any request is sent.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from tether._inputs import MAX_SESSION_FILE_BYTES, read_file
from tether._project import find_workspace_root
from tether._settings import SETTINGS, Settings, resolve_settings
from tether._stores.file import find_session, list_sessions, sessions_dir_for
from tether._stores.sidecar import FileSidecar
from tether.core.framing import parse_line
from tether.errors import (
    ConfigurationError,
    CorruptSession,
    InputFileError,
    NotARegularFile,
    SessionCorruption,
    SessionNotFound,
    TetherError,
    UnsafeSessionPath,
)

if TYPE_CHECKING:
    from tether._project import ProjectConfig
    from tether._runtime import events

__all__ = [
    "REMEMBERED",
    "SETTINGS_DIR",
    "LastOption",
    "agent_sessions_dir",
    "newest_session",
    "pick_session",
    "recorded_snapshot",
    "recording_sink",
    "session_id_for",
    "settings_record",
    "with_recorded",
]

SETTINGS_DIR: Final = "settings"
"""The folder of the records in the workspace's ``.tether/``: ``<session id>.json``."""

REMEMBERED: Final = tuple(row.name for row in SETTINGS if row.remembered)
"""The settings a session remembers (the table's ``remembered`` rows; never a credential)."""

LastOption = Annotated[
    bool,
    typer.Option(
        "--last", "-l", help="The session with the latest activity in the sessions folder."
    ),
]
SessionArgument = Annotated[
    Path | None,
    typer.Argument(
        help="Session log (.jsonl), or a session id or unique id prefix.",
        metavar="SESSION",
        show_default=False,
    ),
]
"""The SESSION argument of the commands that read one session (``--last`` beside it)."""


def agent_sessions_dir(sessions_dir: Path | None, workspace: Path | None) -> Path:
    """The sessions folder an agent command uses (``--sessions-dir``, else the workspace's)."""
    if sessions_dir is not None:
        return sessions_dir
    return sessions_dir_for(find_workspace_root(workspace).path)


def newest_session(sessions_dir: Path) -> str:
    """The id of the readable session with the latest activity."""
    readable = [s for s in list_sessions(sessions_dir) if s.id is not None and s.error is None]
    if not readable:
        why = "it holds no sessions" if sessions_dir.is_dir() else "no such folder yet"
        raise SessionNotFound("--last", f"{sessions_dir} ({why})")
    newest = max(readable, key=lambda s: (s.last_activity, s.created or 0))
    assert newest.id is not None
    return newest.id


def session_id_for(session: str | None, last: bool, sessions_dir: Path) -> str | None:
    """The full id of the session meant by an id, unique prefix, path or ``--last``."""
    chosen = pick_session(session, last, sessions_dir)
    if chosen is None:
        return None
    value = _header(find_session(sessions_dir, chosen)).get("id")
    if not isinstance(value, str):
        raise SessionNotFound(chosen, str(sessions_dir))
    return value


def pick_session(session: str | None, last: bool, sessions_dir: Path) -> str | None:
    """``session`` as given, the newest one for ``--last``, ``None`` when neither."""
    if last and session is not None:
        raise ConfigurationError("give a session or --last, not both")
    if last:
        return newest_session(sessions_dir)
    return session


def _scripted_absolute(model: str) -> str:
    prefix = "scripted:"
    if model.startswith(prefix) and len(model) > len(prefix):
        return prefix + str(Path(model[len(prefix) :]).resolve())
    return model


def _remembered_values(flags: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    """What a session remembers of this call: the remembered settings given by a flag or a
    variable (a value from tether.toml is read from there again next time)."""
    values: dict[str, Any] = {}
    for row in SETTINGS:
        if not row.remembered:
            continue
        given = flags.get(row.name) is not None
        from_env = bool(row.env and os.environ.get(row.env, "").strip())
        value = getattr(settings, row.name)
        if (given or from_env) and value is not None:
            values[row.name] = value
    if "model" in values:
        values["model"] = _scripted_absolute(values["model"])
        if values["model"].startswith("scripted:"):
            values.pop("base_url", None)
    return values


def settings_record(workspace: Path | None, session_id: str) -> FileSidecar:
    """The record of the settings a session was run with."""
    root = find_workspace_root(workspace).path
    return FileSidecar(root / ".tether" / SETTINGS_DIR / f"{session_id}.json")


def recording_sink(
    flags: Mapping[str, Any], settings: Settings, sink: Callable[[events.Event], None]
) -> Callable[[events.Event], None]:
    """``sink``, plus: record the settings used for a session once a model request is made
    with them (a resume refused by the configuration gate never replaces what the session
    was run with, and a session that could not be created leaves no record)."""
    from tether._runtime import events as runtime_events

    values = _remembered_values(flags, settings)
    opened: list[str] = []
    written: set[str] = set()

    def on_event(event: events.Event) -> None:
        if isinstance(event, runtime_events.SessionOpened):
            opened[:] = [event.session_id]
        elif isinstance(event, runtime_events.ModelStarted) and values and opened:
            session_id = opened[0]
            if session_id not in written:
                written.add(session_id)
                try:
                    record = settings_record(settings.workspace, session_id)
                    record.path.parent.mkdir(parents=True, exist_ok=True)
                    record.write(json.dumps(values, sort_keys=True).encode("utf-8"))
                except OSError:
                    pass  # a convenience: the run does not depend on it
        sink(event)

    return on_event


def _header(path: Path, *, strict: bool = False) -> dict[str, Any]:
    """The log's header, ``{}`` when it cannot be read. With ``strict`` (a command about to
    open the session) a log that is not a regular file, or whose complete header line is
    not valid, is refused now, as the store refuses it: nothing else (a missing model, a
    recorded setting) may be reported instead, and nothing reads further."""
    try:
        data = read_file(path, "session file", limit=_HEADER_LIMIT, truncate=True)
        if strict and b"\n" not in data and len(data) == _HEADER_LIMIT:
            # A header this long is not tether's; read the whole line to judge it.
            data = read_file(path, "session file", limit=MAX_SESSION_FILE_BYTES, truncate=True)
    except NotARegularFile:
        if strict:
            raise UnsafeSessionPath(str(path), "not a regular file") from None
        return {}
    except InputFileError:
        return {}  # gone, unreadable: the store says so when it opens the log
    line, newline, _ = data.partition(b"\n")
    try:
        value = parse_line(line, 1)
    except SessionCorruption as exc:
        if strict and newline:  # a torn header is the store's to judge (an unfinished create)
            raise CorruptSession.wrap(str(path), exc) from None
        return {}
    return value if isinstance(value, dict) else {}


_HEADER_LIMIT: Final = 64 * 1024


def recorded_snapshot(path: Path) -> Mapping[str, Any] | None:
    """The configuration snapshot of the last ``stepAttempt`` in the log at ``path``, or
    ``None`` (no attempt yet, or an unreadable log: then nothing is vouched for)."""
    try:  # only a regular file, so a FIFO there cannot block
        data = read_file(path, "session file", limit=MAX_SESSION_FILE_BYTES)
    except InputFileError:
        return None
    for line in reversed(data.splitlines()):
        if b'"stepAttempt"' not in line:
            continue
        try:  # depth-checked: json.loads would recurse into a hostile line
            value = parse_line(line, 0)
        except SessionCorruption:
            continue  # the store names the line when it opens the log
        # A line is a transaction: one fact, or an array of facts (spec 5).
        for fact in reversed(value if isinstance(value, list) else [value]):
            record = fact.get("record") if isinstance(fact, dict) else None
            if isinstance(record, dict) and record.get("type") == "stepAttempt":
                snapshot = record.get("configurationSnapshot")
                return snapshot if isinstance(snapshot, dict) else None
    return None


def _read_record(workspace: Path | None, session_id: str) -> dict[str, Any]:
    data, _ = settings_record(workspace, session_id).read()
    if data is None:
        return {}
    try:
        loaded = json.loads(data)
    except ValueError:
        return {}
    if not isinstance(loaded, dict):
        return {}
    return {k: v for k, v in loaded.items() if k in REMEMBERED and isinstance(v, (str, float, int))}


def _mismatched(
    candidate: Mapping[str, Any],
    flags: Mapping[str, Any],
    project: ProjectConfig,
    snapshot: Mapping[str, Any] | None,
) -> list[str]:
    """The names of ``candidate`` (values from the record) that the log does not vouch for."""
    from tether._runtime.compose import load_configured_model, system_prompt_for
    from tether.core.canonical import system_prompt_digest

    bad: list[str] = []
    settings = resolve_settings({**flags, **candidate}, environ=os.environ, project=project)
    connection = [name for name in ("model", "base_url") if name in candidate]
    if connection:
        try:
            model = load_configured_model(settings, project).adapter
        except TetherError:
            model = None  # the build reports it, with the values it was given
        if model is not None and (
            snapshot is None
            or model.model != snapshot.get("model")
            or model.routing_identity != snapshot.get("routingIdentity")
        ):
            bad.extend(connection)
    if "system_prompt" in candidate:
        root = find_workspace_root(settings.workspace).path
        digest = system_prompt_digest(system_prompt_for(settings, root))
        if snapshot is None or digest != snapshot.get("systemPromptDigest"):
            bad.append("system_prompt")
    return bad


def with_recorded(flags: Mapping[str, Any], session: str, project: ProjectConfig) -> dict[str, Any]:
    """``flags`` with what the session remembered filled in where no flag was given, as far
    as its log vouches for it (see the module docstring)."""
    workspace = flags.get("workspace")
    sessions_dir = agent_sessions_dir(flags.get("sessions_dir"), workspace)
    try:
        path = find_session(sessions_dir, session)
    except TetherError:
        return dict(flags)  # the agent reports the same error when it opens the session
    header = _header(path, strict=True)
    session_id = header.get("id")
    record = _read_record(workspace, session_id) if isinstance(session_id, str) else {}
    candidate = {k: v for k, v in record.items() if flags.get(k) is None}
    snapshot = recorded_snapshot(path) if candidate else None
    bad = _mismatched(candidate, flags, project, snapshot) if candidate else []
    if bad:
        typer.echo(
            f"warning: ignored {', '.join(bad)} of {SETTINGS_DIR}/{session_id}.json: the "
            "session's log did not record them (the file was changed after the session "
            "wrote it?)",
            err=True,
        )
        for name in bad:
            candidate.pop(name)
    if "model" not in candidate and header.get("provider") != "scripted":
        model = header.get("model")
        if isinstance(model, str) and model and flags.get("model") is None:
            candidate["model"] = model  # the log's own word: no record needed
    if "base_url" in candidate:
        own = resolve_settings(flags, environ=os.environ, project=project).base_url
        if own != candidate["base_url"]:
            typer.echo(
                f"endpoint: {candidate['base_url']} (the one session {session_id} was run "
                "with; --base-url chooses another)",
                err=True,
            )
    return {**flags, **candidate}
