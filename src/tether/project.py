"""The project configuration file ``tether.toml``: loading and validation.

``<workspace>/tether.toml`` configures the check command (``[verify]``), the artifact version
(``[artifact]``), per-run budgets (``[budget]``) and the authorization policy (``[policy]``,
see :mod:`tether.effects.policy`). A missing file is not an error: every setting has a
default. Any other problem — unreadable file, a directory at that path, invalid TOML, an
unknown table or key, a value of the wrong type — raises :class:`ProjectConfigError` with
one line naming the file and the setting, e.g.::

    tether.toml: [verify] timeout: expected a positive number of seconds, got "ten"

:func:`parse_project_config` is pure (text in, config out); :func:`load_project_config` reads
the file. See ``docs/config.md``.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from tether.effects.policy import (
    Policy,
    check_known,
    policy_from_mapping,
    show_value,
    toml_key,
)
from tether.errors import InputFileError, ProjectConfigError
from tether.inputs import MAX_CONFIG_BYTES, read_optional_file

__all__ = [
    "CONFIG_FILE",
    "ArtifactConfig",
    "BudgetConfig",
    "ProjectConfig",
    "VerifyConfig",
    "load_project_config",
    "parse_project_config",
    "project_config_from_mapping",
]

CONFIG_FILE: Final = "tether.toml"
"""The name of the project configuration file, relative to the workspace."""

DEFAULT_VERIFY_TIMEOUT: Final = 600.0


@dataclass(frozen=True)
class VerifyConfig:
    """``[verify]``: the check command, its timeout, and the completion gate."""

    command: str | None = None
    timeout: float = DEFAULT_VERIFY_TIMEOUT
    required: bool = False


@dataclass(frozen=True)
class ArtifactConfig:
    """``[artifact]``: extra ignore patterns for the artifact version."""

    ignore: tuple[str, ...] = ()


@dataclass(frozen=True)
class BudgetConfig:
    """``[budget]``: per-run limits; ``None`` means unlimited."""

    max_steps: int | None = None
    max_tokens: int | None = None
    max_seconds: float | None = None


@dataclass(frozen=True)
class ProjectConfig:
    """Everything ``tether.toml`` configures; ``path`` is the file read (``None``: absent)."""

    verify: VerifyConfig = field(default_factory=VerifyConfig)
    artifact: ArtifactConfig = field(default_factory=ArtifactConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    policy: Policy = field(default_factory=Policy)
    path: Path | None = None


# --------------------------------------------------------------------------- loading


def load_project_config(workspace: str | os.PathLike[str]) -> ProjectConfig:
    """Read and validate ``<workspace>/tether.toml``; defaults when there is no such file.

    A symbolic link is followed (it is the user's own file); a dangling link, a directory or
    any other non-regular file at that path is an error, as is an unreadable file.
    """
    path = Path(workspace) / CONFIG_FILE
    data = _read(path)
    if data is None:
        return ProjectConfig()
    return replace(parse_project_config(data, source=CONFIG_FILE), path=path)


def _read(path: Path) -> str | None:
    """The file's text, or ``None`` when there is no file (and no link) at ``path``.

    Through :func:`tether.inputs.read_optional_file`: never blocks on a FIFO, never reads a
    device, and refuses a file over :data:`~tether.inputs.MAX_CONFIG_BYTES` unread.
    """
    try:
        raw = read_optional_file(path, CONFIG_FILE, limit=MAX_CONFIG_BYTES)
    except InputFileError as exc:
        # Still a ProjectConfigError: callers and tests catch the configuration's own error.
        raise ProjectConfigError(str(exc)) from exc
    if raw is None:
        return None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ProjectConfigError(
            f"{CONFIG_FILE} is not valid TOML: it is not UTF-8 text "
            f"(byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        ) from None


# --------------------------------------------------------------------------- parsing


def parse_project_config(text: str, *, source: str = CONFIG_FILE) -> ProjectConfig:
    """The :class:`ProjectConfig` of the TOML ``text`` (pure; ``path`` is ``None``).

    ``source`` names the file in error messages.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProjectConfigError(f"{source} is not valid TOML: {_one_line(str(exc))}") from None
    except RecursionError:
        raise ProjectConfigError(f"{source} is not valid TOML: nested too deeply") from None
    return project_config_from_mapping(data, source=source)


_SECTIONS: Final = ("verify", "artifact", "budget", "policy")


def project_config_from_mapping(
    data: Mapping[str, Any], *, source: str = CONFIG_FILE
) -> ProjectConfig:
    """The :class:`ProjectConfig` of an already parsed TOML document (pure)."""
    for name, value in data.items():
        if name not in _SECTIONS:
            shown = toml_key(str(name))
            shown = f"[{shown}]" if isinstance(value, Mapping) else shown
            known = ", ".join(f"[{s}]" for s in _SECTIONS)
            raise ProjectConfigError(f"{source}: unknown setting {shown} (known: {known})")
        if not isinstance(value, Mapping):
            raise ProjectConfigError(
                f"{source}: [{name}]: expected a table, got {show_value(value)}"
            )
    return ProjectConfig(
        verify=_verify(source, data.get("verify", {})),
        artifact=_artifact(source, data.get("artifact", {})),
        budget=_budget(source, data.get("budget", {})),
        policy=policy_from_mapping(data.get("policy", {}), source),
    )


def _verify(source: str, table: Mapping[str, Any]) -> VerifyConfig:
    check_known(source, "[verify]", table, ("command", "timeout", "required"))
    command = table.get("command")
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise _bad(source, "[verify] command", "a non-empty shell command string", command)
    timeout = DEFAULT_VERIFY_TIMEOUT
    if "timeout" in table:
        timeout = _positive_number(source, "[verify] timeout", table["timeout"])
    required = table.get("required", False)
    if not isinstance(required, bool):
        raise _bad(source, "[verify] required", "true or false", required)
    return VerifyConfig(command=command, timeout=timeout, required=required)


def _artifact(source: str, table: Mapping[str, Any]) -> ArtifactConfig:
    check_known(source, "[artifact]", table, ("ignore",))
    ignore = table.get("ignore", [])
    if not isinstance(ignore, list):
        raise _bad(source, "[artifact] ignore", "a list of non-empty pattern strings", ignore)
    for index, pattern in enumerate(ignore, 1):
        if not isinstance(pattern, str) or not pattern.strip():
            raise _bad(
                source, f"[artifact] ignore: item {index}", "a non-empty pattern string", pattern
            )
    return ArtifactConfig(ignore=tuple(ignore))


def _budget(source: str, table: Mapping[str, Any]) -> BudgetConfig:
    check_known(source, "[budget]", table, ("max_steps", "max_tokens", "max_seconds"))
    max_steps = max_tokens = None
    max_seconds = None
    if "max_steps" in table:
        max_steps = _positive_int(source, "[budget] max_steps", table["max_steps"], "steps")
    if "max_tokens" in table:
        max_tokens = _positive_int(source, "[budget] max_tokens", table["max_tokens"], "tokens")
    if "max_seconds" in table:
        max_seconds = _positive_number(source, "[budget] max_seconds", table["max_seconds"])
    return BudgetConfig(max_steps=max_steps, max_tokens=max_tokens, max_seconds=max_seconds)


def _positive_number(source: str, setting: str, value: object) -> float:
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    ):
        return float(value)
    raise _bad(source, setting, "a positive number of seconds", value)


def _positive_int(source: str, setting: str, value: object, unit: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise _bad(source, setting, f"a positive whole number of {unit}", value)


def _bad(source: str, setting: str, expected: str, value: object) -> ProjectConfigError:
    return ProjectConfigError(f"{source}: {setting}: expected {expected}, got {show_value(value)}")


def _one_line(text: str) -> str:
    return " ".join(text.split())
