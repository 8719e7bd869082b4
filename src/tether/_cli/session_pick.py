"""Which session a command means, and the settings a session was run with.

* ``--last`` picks the session with the latest activity in the sessions folder; a session
  argument is a full id, a unique id prefix, a file name or a path (the store resolves it).
* ``run``/``resume``/``repl``/``retry`` record the model, endpoint and options they used when
  they make a model request with them, in ``.tether/settings/<session id>.json`` of the
  workspace (never the API key; tether's own state: the file tools cannot touch it);
  continuing the session later without those flags uses them again (an explicit flag wins; a changed
  configuration still meets the configuration gate). A session without that record falls
  back to the model its header names (not for scripted models: their file is unknown).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from tether._project import find_workspace_root
from tether._stores.file import find_session, list_sessions, sessions_dir_for
from tether._stores.sidecar import FileSidecar
from tether.errors import ConfigurationError, SessionNotFound, TetherError

if TYPE_CHECKING:
    from tether._cli.run_cmd import AgentSettings
    from tether._runtime import events

__all__ = [
    "RECORDED_SETTINGS",
    "SETTINGS_DIR",
    "LastOption",
    "agent_sessions_dir",
    "newest_session",
    "pick_session",
    "recording_sink",
    "session_id_for",
    "settings_record",
    "with_recorded",
]

SETTINGS_DIR: Final = "settings"
"""The folder of the records in the workspace's ``.tether/``: ``<session id>.json``."""

RECORDED_SETTINGS: Final = ("model", "base_url", "timeout", "system_prompt", "tool_timeout")
"""The :class:`~tether._cli.run_cmd.AgentSettings` fields a session remembers (never the
API key)."""

LastOption = Annotated[
    bool,
    typer.Option(
        "--last", "-l", help="The session with the latest activity in the sessions folder."
    ),
]


def agent_sessions_dir(sessions_dir: Path | None, workspace: Path | None) -> Path:
    """The sessions folder an agent command uses (``--sessions-dir``, else the workspace's)."""
    if sessions_dir is not None:
        return sessions_dir
    return sessions_dir_for(find_workspace_root(workspace).path)


def newest_session(sessions_dir: Path) -> str:
    """The id of the readable session with the latest activity."""
    readable = [s for s in list_sessions(sessions_dir) if s.id is not None and s.error is None]
    if not readable:
        raise SessionNotFound("--last", f"{sessions_dir} (it holds no sessions)")
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


def _effective(settings: AgentSettings) -> dict[str, Any]:
    """What this call uses: the flags, else the variables the model loader reads."""
    values: dict[str, Any] = {}
    model = settings.model or os.environ.get("TETHER_MODEL", "").strip() or None
    if model:
        values["model"] = _scripted_absolute(model)
    base_url = settings.base_url or os.environ.get("TETHER_BASE_URL", "").strip() or None
    if base_url and not (model or "").startswith("scripted:"):
        values["base_url"] = base_url
    for name in ("timeout", "system_prompt", "tool_timeout"):
        value = getattr(settings, name)
        if value is not None:
            values[name] = value
    return values


def settings_record(workspace: Path | None, session_id: str) -> FileSidecar:
    """The record of the settings a session was run with."""
    root = find_workspace_root(workspace).path
    return FileSidecar(root / ".tether" / SETTINGS_DIR / f"{session_id}.json")


def recording_sink(
    settings: AgentSettings, sink: Callable[[events.Event], None]
) -> Callable[[events.Event], None]:
    """``sink``, plus: record the settings used for a session once a model request is made
    with them (a resume refused by the configuration gate never replaces what the session
    was run with, and a session that could not be created leaves no record)."""
    from tether._runtime import events as runtime_events

    values = _effective(settings)
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


def _header(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            line = handle.readline(64 * 1024)
        value = json.loads(line)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def with_recorded(settings: AgentSettings, session: str) -> AgentSettings:
    """``settings`` with what the session recorded filled in where no flag was given."""
    sessions_dir = agent_sessions_dir(settings.sessions_dir, settings.workspace)
    try:
        path = find_session(sessions_dir, session)
    except TetherError:
        return settings  # the agent reports the same error when it opens the session
    header = _header(path)
    session_id = header.get("id")
    recorded: dict[str, Any] = {}
    if isinstance(session_id, str):
        data, _ = settings_record(settings.workspace, session_id).read()
        if data is not None:
            try:
                loaded = json.loads(data)
            except ValueError:
                loaded = {}
            if isinstance(loaded, dict):
                recorded = {k: v for k, v in loaded.items() if k in RECORDED_SETTINGS}
    if "model" not in recorded and header.get("provider") != "scripted":
        model = header.get("model")
        if isinstance(model, str) and model:
            recorded["model"] = model
    known = {f.name for f in fields(settings)}
    changes = {
        name: value
        for name, value in recorded.items()
        if name in known and getattr(settings, name) is None
    }
    return replace(settings, **changes) if changes else settings
