"""The public agent: one settings value and the seams, composed, driven by the executor's loop.

``Agent(model, tools, **options)``: each option is either a setting of the one settings
table (:data:`tether._settings.SETTINGS`: ``workspace``, ``system_prompt``, ``durability``,
``max_steps``, ``store``, …, the same names as the CLI's flags) or a seam
(:class:`~tether._runtime.compose.Seams`: ``on_event``, ``authorize``, ``session_store``,
``clock``, …). Options given here rank as flags do: above the environment variables and
``tether.toml``. An unknown option is a :class:`~tether.errors.ConfigurationError`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, Unpack

from tether._credentials import Masker
from tether._models.base import ModelAdapter
from tether._project import (
    find_workspace_root,
    load_project_config,
)
from tether._runtime.compose import Composition, Seams, compose
from tether._runtime.options import AgentOptions
from tether._runtime.results import RunResult
from tether._settings import SETTINGS, Settings, override_settings, resolve_settings
from tether._tools.base import Tool, ToolRegistry
from tether._tools.workspace import ProtectedState
from tether.core.configuration import AgentConfiguration
from tether.core.records import fields
from tether.errors import ConfigurationError

if TYPE_CHECKING:
    from tether._runtime.executor import Executor

__all__ = ["Agent", "AgentOptions"]


_SETTING_NAMES = frozenset(row.name for row in SETTINGS)
_SEAM_NAMES = frozenset(f.name for f in fields(Seams))
_ALIASES = {"store_url": "store"}


def split_options(
    options: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``options`` as (settings given, seams given); an unknown name is refused."""
    given: dict[str, Any] = {}
    seams: dict[str, Any] = {}
    for name, value in options.items():
        name = _ALIASES.get(name, name)
        if name in _SETTING_NAMES:
            given[name] = value
        elif name in _SEAM_NAMES:
            seams[name] = value
        else:
            raise ConfigurationError(f"Agent() got an unknown option {name!r}")
    return given, seams


def _checked_retries(seams: dict[str, Any]) -> None:
    retries = seams.get("model_retries")
    if retries is None:
        return
    if isinstance(retries, bool) or not isinstance(retries, int):
        raise ConfigurationError("model_retries must be an integer")
    if not 0 <= retries <= 10:
        raise ConfigurationError("model_retries must be between 0 and 10")


class Agent:
    """Runs an agent whose every step is written ahead to a session log.

    ``model`` is a :class:`~tether._models.base.ModelAdapter`, or a model string as
    ``--model`` takes it (``openai/gpt-4o-mini``, ``anthropic:…``, ``scripted:PATH``), or
    ``None`` for the model the settings name (``$TETHER_MODEL``, ``[model] model``).
    ``tools`` defaults to the built-ins (``read``, ``bash``, ``write``, ``edit``), plus
    ``verify`` when ``tether.toml`` configures a check command. ``AGENTS.md`` in the
    workspace is appended to the system prompt.

    The options (:class:`AgentOptions`) are the settings of the one settings table — the
    same as the CLI's flags, ranked as flags are, above the environment and ``tether.toml``
    — and the seams of :class:`~tether._runtime.compose.Seams`. ``settings`` passes a
    resolved :class:`~tether._settings.Settings` value instead (what the CLI does); options
    given beside it override it.

    ``authorize`` asks a person about calls the policy marks ``ask`` (without it nobody can
    be asked: such calls are denied); ``assume_yes`` answers every ``ask`` with yes.
    ``ask_by_default`` (default: whether ``authorize`` is given) makes ``ask`` the default
    for side-effecting tools no rule names, as in the REPL. ``park_approvals`` parks an
    ``ask`` call nobody can be asked about instead of denying it: the run ends
    ``awaiting_approval`` until ``tether approve``/``deny`` decides (see
    :mod:`tether._effects.approvals`). ``require_verified`` (default: ``[verify] required``)
    starts up to :data:`~tether._runtime.executor.MAX_FOLLOW_UPS` follow-up runs asking the
    model to verify when a run that changed files completes unverified.

    Credentials never reach the log or ``on_event``: every exact occurrence of a secret
    registered with :func:`tether._credentials.register_secret` (the model adapter registers
    its API key) or given in ``secrets`` is masked (:mod:`tether._runtime.masking`).

    The seams (default: the file store, ``.tether/effects.db``, the system clock, UUIDv7):
    ``session_store`` opens the session logs (:class:`~tether._stores.protocol.SessionOpener`,
    e.g. :class:`~tether._stores.memory.MemorySessions`), ``workspace_db`` opens the
    workspace database (:class:`~tether._wsdb.protocol.WorkspaceDBOpener`, e.g.
    :class:`~tether._wsdb.memory.MemoryWorkspace`), ``clock`` and ``ids`` are the time and id
    sources of the loop. ``store`` (default: ``$TETHER_STORE_URL``, else ``[store] url``)
    selects a shared PostgreSQL store instead of the file store (``docs/scale-out.md``).
    Everything is read and built by :func:`~tether._runtime.compose.compose`.

    Building an agent checks everything a bad option or file would break and starts
    nothing: the model's client is made at its first request, the executor and the check
    of the commands' sandbox (:class:`~tether.errors.SandboxUnavailable`, before any
    session is created or opened) at the first call that drives a session.
    """

    def __init__(
        self,
        model: ModelAdapter | str | None = None,
        tools: Sequence[Tool] | None = None,
        *,
        settings: Settings | None = None,
        **options: Unpack[AgentOptions],
    ) -> None:
        given, seam_values = split_options(options)
        _checked_retries(seam_values)
        if isinstance(model, str):
            given["model"] = model
            model = None
        if settings is None:
            if seam_values.get("project") is None:
                workspace = given.get("workspace")
                root = find_workspace_root(None if workspace is None else Path(workspace))
                seam_values["project"] = load_project_config(root.path)
            settings = resolve_settings(given, environ=os.environ, project=seam_values["project"])
        else:
            settings = override_settings(settings, given)
        self._parts = compose(settings, model, tools, Seams(**seam_values))
        # The executor (the drive loop, its handlers, recovery) is built by the first call
        # that drives a session: building an agent loads none of its modules.
        self._built: Executor | None = None
        self._abort_asked = False
        self._stop_signal: threading.Event | None = None

    @property
    def _executor(self) -> Executor:
        """The executor, built on first use with what was asked of it before."""
        built = self._built
        if built is None:
            # Imported here: the loop's modules are a call's, not a construction's (start-up,
            # docs/runtime.md); the first call pays for them once per process.
            from tether._runtime.executor import Executor

            built = Executor(self._parts)
            built.set_stop_signal(self._stop_signal)
            self._built = built
            if self._abort_asked:  # an abort asked before the first call applies to it
                built.abort()
        return built

    # The public surface: the executor carries each call out; an Agent is what a caller
    # holds, the executor (:mod:`tether._runtime.executor`) is how the loop works.

    def run(self, prompt: str, *, session: str | None = None) -> RunResult:
        """Run the agent on ``prompt``: in ``session`` (an id, prefix or path; its
        unfinished work is finished first) or in a new session."""
        return self._executor.run(prompt, session=session)

    def resume(self, session: str, *, abort: bool = False) -> RunResult:
        """Finish the session's unfinished operation as its log says (``abort``: close it
        durably instead; nothing is re-executed)."""
        return self._executor.resume(session, abort=abort)

    def retry(self, session: str) -> RunResult:
        """Run a failed (or aborted) last run again on its own prompt."""
        return self._executor.retry(session)

    def compact(self, session: str, *, keep_turns: int = 1) -> RunResult:
        """Summarise the session's history, keeping the last ``keep_turns`` turns."""
        return self._executor.compact(session, keep_turns=keep_turns)

    def abort(self) -> None:
        """Ask the running call to abort durably (thread-safe; from a signal handler too)."""
        built = self._built
        if built is None:
            # No executor yet (nothing imported in a signal handler): the flag is set before
            # the executor is read again, and read by _executor after it is stored, so the
            # abort reaches the first call whichever way the two interleave.
            self._abort_asked = True
            built = self._built
            if built is None:
                return
        built.abort()

    def prepare(self) -> None:
        """Load now what the first call would load: the executor (the drive loop and its
        handlers), the model's client (its SDK and HTTP client) and the tools' argument
        validators. Nothing is sent, opened or checked. For a process about to start many
        sessions at once (``tether worker``): otherwise every one of them waits, its
        thread contending for the import lock, on imports only one thread can do."""
        from tether._models.base import prepare_model

        self._executor  # noqa: B018 - the property builds it
        prepare_model(self._parts.model)
        for tool in self._parts.registry:
            tool._prepare()

    def set_stop_signal(self, signal: threading.Event | None) -> None:
        """An event that, once set, ends a drive at its next durable point, unfinished."""
        self._stop_signal = signal
        if self._built is not None:
            self._built.set_stop_signal(signal)

    def release(self) -> None:
        """Let go of the session this agent holds open (its writer lock)."""
        if self._built is not None:  # without an executor no session was ever held
            self._built.release()

    def close(self) -> None:
        """Release the held session and close what the agent opened (idempotent)."""
        if self._built is not None:
            self._built.close()
        else:
            self._parts.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def last_session(self) -> str | None:
        """The id of the session the last call worked on."""
        return None if self._built is None else self._built.last_session

    @property
    def held_session(self) -> str | None:
        """The id of the session this agent holds open (its writer lock held), if any."""
        return None if self._built is None else self._built.held_session

    @property
    def parts(self) -> Composition:
        """What the agent was built from (the composition root's result)."""
        return self._parts

    @property
    def configuration(self) -> AgentConfiguration:
        """The configuration snapshot, its digest and the planner's ``current``."""
        return self._parts.configuration

    @property
    def masker(self) -> Masker:
        """Masks the credentials tether knows in any text."""
        return self._parts.masker

    @property
    def model(self) -> ModelAdapter:
        return self._parts.model

    @property
    def registry(self) -> ToolRegistry:
        return self._parts.registry

    @property
    def workspace(self) -> Path:
        return self._parts.workspace

    @property
    def system_prompt(self) -> str:
        """The system prompt as sent: the settings' (or tether's own) with ``AGENTS.md``."""
        return self._parts.system_prompt

    @property
    def protected(self) -> ProtectedState:
        """tether's own state, which the file tools never touch."""
        return self._parts.protected

    @property
    def environment(self) -> str:
        """The environment identity (replays are gated on it)."""
        return self._parts.environment
