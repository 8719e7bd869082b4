"""``tether.toml``: loading real files, validation, and one-line error messages."""

from __future__ import annotations

import errno
import os
import re
from dataclasses import fields
from pathlib import Path
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether._project import (
    CONFIG_FILE,
    ArtifactConfig,
    BudgetConfig,
    BudgetTime,
    ProjectConfig,
    VerifyConfig,
    load_project_config,
    parse_project_config,
    project_config_from_mapping,
)
from tether.core.policy import BashRule, Decision, Policy
from tether.core.stops import BUDGET_CHECKS
from tether.errors import ConfigurationError, ProjectConfigError

FULL_EXAMPLE = """\
[verify]
command = "pytest -q"     # shell command run in the workspace
timeout = 600             # seconds
required = false

[artifact]
ignore = ["build/", "*.log"]

[budget]
max_steps = 50
max_tokens = 200000
max_seconds = 1800

[policy]
default = "ask"
[policy.tools]
bash = "ask"
write = "allow"
publish_report = "deny"

[[policy.bash]]
pattern = "git push*"
decision = "deny"
reason = "pushing is for humans"

[[policy.bash]]
pattern = "pytest*"
decision = "allow"
"""


def write_config(workspace: Path, text: str) -> Path:
    path = workspace / CONFIG_FILE
    path.write_text(text, encoding="utf-8")
    return path


def load_error(workspace: Path) -> str:
    with pytest.raises(ProjectConfigError) as info:
        load_project_config(workspace)
    message = str(info.value)
    assert "\n" not in message and "\r" not in message
    return message


def parse_error(text: str) -> str:
    with pytest.raises(ProjectConfigError) as info:
        parse_project_config(text)
    message = str(info.value)
    assert message.splitlines() == [message]
    assert message.startswith("tether.toml")
    return message


# --------------------------------------------------------------------------- defaults


def test_defaults() -> None:
    config = ProjectConfig()
    assert config.verify == VerifyConfig(command=None, timeout=600.0, required=False)
    assert config.artifact == ArtifactConfig(ignore=())
    assert config.budget == BudgetConfig(max_steps=None, max_tokens=None, max_seconds=None)
    assert config.policy == Policy()
    assert config.policy.default is None and dict(config.policy.tools) == {}
    assert config.policy.bash == ()
    assert config.path is None


def test_missing_file_gives_defaults(tmp_path: Path) -> None:
    assert load_project_config(tmp_path) == ProjectConfig()
    assert load_project_config(str(tmp_path)) == ProjectConfig()


def test_empty_file_gives_defaults_with_path(tmp_path: Path) -> None:
    path = write_config(tmp_path, "")
    config = load_project_config(tmp_path)
    assert config == ProjectConfig(path=path)


def test_error_class_is_configuration_error_exit_2() -> None:
    assert issubclass(ProjectConfigError, ConfigurationError)
    assert ProjectConfigError.exit_code == 2


# --------------------------------------------------------------------------- full example


def test_full_example_round_trip(tmp_path: Path) -> None:
    path = write_config(tmp_path, FULL_EXAMPLE)
    config = load_project_config(tmp_path)
    assert config.path == path
    assert config.verify == VerifyConfig(command="pytest -q", timeout=600.0, required=False)
    assert isinstance(config.verify.timeout, float)
    assert config.artifact == ArtifactConfig(ignore=("build/", "*.log"))
    assert config.budget == BudgetConfig(max_steps=50, max_tokens=200000, max_seconds=1800.0)
    assert isinstance(config.budget.max_seconds, float)
    assert config.policy == Policy(
        default=Decision.ASK,
        tools={"bash": Decision.ASK, "write": Decision.ALLOW, "publish_report": Decision.DENY},
        bash=(
            BashRule("git push*", Decision.DENY, "pushing is for humans"),
            BashRule("pytest*", Decision.ALLOW, None),
        ),
    )
    assert isinstance(config.policy.tools, MappingProxyType)
    # pure parse gives the same, without a path
    assert parse_project_config(FULL_EXAMPLE) == ProjectConfig(
        verify=config.verify,
        artifact=config.artifact,
        budget=config.budget,
        policy=config.policy,
    )


def test_config_is_frozen_and_hashable() -> None:
    config = parse_project_config(FULL_EXAMPLE)
    with pytest.raises(AttributeError):
        config.verify = VerifyConfig()  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.policy.tools["bash"] = Decision.ALLOW  # type: ignore[index]
    assert hash(config) == hash(parse_project_config(FULL_EXAMPLE))


def test_inline_and_dotted_forms_are_equivalent() -> None:
    dotted = parse_project_config(
        'verify.command = "make check"\n'
        'policy.tools.bash = "deny"\n'
        'policy.bash = [{pattern = "ls*", decision = "allow"}]\n'
    )
    assert dotted.verify.command == "make check"
    assert dotted.policy.tools == {"bash": Decision.DENY}
    assert dotted.policy.bash == (BashRule("ls*", Decision.ALLOW),)


def test_utf8_bom_and_crlf_accepted(tmp_path: Path) -> None:
    (tmp_path / CONFIG_FILE).write_bytes(b'\xef\xbb\xbf[verify]\r\ncommand = "make"\r\n')
    assert load_project_config(tmp_path).verify.command == "make"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[verify]\ntimeout = 1", VerifyConfig(timeout=1.0)),
        ("[verify]\ntimeout = 0.5", VerifyConfig(timeout=0.5)),
        ("[verify]\nrequired = true", VerifyConfig(required=True)),
        ('[verify]\ncommand = "  make test  "', VerifyConfig(command="  make test  ")),
    ],
)
def test_verify_values(text: str, expected: VerifyConfig) -> None:
    assert parse_project_config(text).verify == expected


def test_budget_partial() -> None:
    config = parse_project_config("[budget]\nmax_seconds = 1.5\n")
    assert config.budget == BudgetConfig(max_seconds=1.5)
    assert config.budget.time is BudgetTime.ACTIVE


def test_budget_time_wall() -> None:
    config = parse_project_config('[budget]\nmax_seconds = 60\ntime = "wall"\n')
    assert config.budget == BudgetConfig(max_seconds=60.0, time=BudgetTime.WALL)


def test_every_budget_check_is_a_budget_key_and_documented() -> None:
    """Each row of the budget table is a ``[budget]`` key, every key has a row (``time``
    says how ``max_seconds`` counts), and docs/config.md's table lists exactly the keys."""
    keys = {row.key for row in BUDGET_CHECKS}
    assert keys == {f.name for f in fields(BudgetConfig)} - {"time"}
    text = (Path(__file__).parents[1] / "docs" / "config.md").read_text()
    table = text.split("### `[budget]`", 1)[1].split("\n### ", 1)[0]
    documented = set(re.findall(r"^\| `(\w+)` \|", table, flags=re.MULTILINE))
    assert documented == keys | {"time"}


def test_reason_empty_string_is_none() -> None:
    config = parse_project_config('[[policy.bash]]\npattern = "x"\ndecision = "ask"\nreason = ""')
    assert config.policy.bash == (BashRule("x", Decision.ASK, None),)


# --------------------------------------------------------------------------- bad values

BAD_VALUES = [
    (
        '[verify]\ntimeout = "ten"',
        'tether.toml: [verify] timeout: expected a positive number of seconds, got "ten"',
    ),
    (
        "[verify]\ntimeout = true",
        "tether.toml: [verify] timeout: expected a positive number of seconds, got true",
    ),
    (
        "[verify]\ntimeout = 0",
        "tether.toml: [verify] timeout: expected a positive number of seconds, got 0",
    ),
    (
        "[verify]\ntimeout = -3.5",
        "tether.toml: [verify] timeout: expected a positive number of seconds, got -3.5",
    ),
    (
        "[verify]\ntimeout = inf",
        "tether.toml: [verify] timeout: expected a positive number of seconds, got inf",
    ),
    (
        "[verify]\ntimeout = nan",
        "tether.toml: [verify] timeout: expected a positive number of seconds, got nan",
    ),
    (
        "[verify]\ncommand = 42",
        "tether.toml: [verify] command: expected a non-empty shell command string, got 42",
    ),
    (
        '[verify]\ncommand = "   "',
        'tether.toml: [verify] command: expected a non-empty shell command string, got "   "',
    ),
    (
        '[verify]\ncommand = ["pytest", "-q"]',
        "tether.toml: [verify] command: expected a non-empty shell command string, "
        'got ["pytest", "-q"]',
    ),
    (
        '[verify]\nrequired = "yes"',
        'tether.toml: [verify] required: expected true or false, got "yes"',
    ),
    (
        "[verify]\nrequired = 1",
        "tether.toml: [verify] required: expected true or false, got 1",
    ),
    (
        '[artifact]\nignore = "build/"',
        "tether.toml: [artifact] ignore: expected a list of non-empty pattern strings, "
        'got "build/"',
    ),
    (
        '[artifact]\nignore = ["build/", 3]',
        "tether.toml: [artifact] ignore: item 2: expected a non-empty pattern string, got 3",
    ),
    (
        '[artifact]\nignore = [""]',
        'tether.toml: [artifact] ignore: item 1: expected a non-empty pattern string, got ""',
    ),
    (
        "[budget]\nmax_steps = 0",
        "tether.toml: [budget] max_steps: expected a positive whole number of steps, got 0",
    ),
    (
        "[budget]\nmax_steps = 5.0",
        "tether.toml: [budget] max_steps: expected a positive whole number of steps, got 5.0",
    ),
    (
        "[budget]\nmax_steps = true",
        "tether.toml: [budget] max_steps: expected a positive whole number of steps, got true",
    ),
    (
        '[budget]\nmax_tokens = "1k"',
        'tether.toml: [budget] max_tokens: expected a positive whole number of tokens, got "1k"',
    ),
    (
        "[budget]\nmax_seconds = false",
        "tether.toml: [budget] max_seconds: expected a positive number of seconds, got false",
    ),
    (
        "[budget]\nmax_seconds = -1",
        "tether.toml: [budget] max_seconds: expected a positive number of seconds, got -1",
    ),
    (
        '[budget]\ntime = "cpu"',
        'tether.toml: [budget] time: expected "active" | "wall", got "cpu"',
    ),
    (
        '[policy]\ndefault = "yes"',
        'tether.toml: [policy] default: expected one of "allow", "ask", "deny", got "yes"',
    ),
    (
        '[policy]\ndefault = "ALLOW"',
        'tether.toml: [policy] default: expected one of "allow", "ask", "deny", got "ALLOW"',
    ),
    (
        "[policy.tools]\nbash = true",
        'tether.toml: [policy.tools] bash: expected one of "allow", "ask", "deny", got true',
    ),
    (
        '[policy.tools]\n"my tool" = "maybe"',
        'tether.toml: [policy.tools] "my tool": expected one of "allow", "ask", "deny", '
        'got "maybe"',
    ),
    (
        '[policy]\ntools = "allow"',
        'tether.toml: [policy] tools: expected a table, got "allow"',
    ),
    (
        '[policy]\nbash = "ask"',
        'tether.toml: [policy] bash: expected an array of tables [[policy.bash]], got "ask" '
        '(to decide for every bash call, write [policy.tools] bash = "ask")',
    ),
    (
        "[policy]\nbash = [1]",
        "tether.toml: [[policy.bash]] #1: expected a table, got 1",
    ),
    (
        '[[policy.bash]]\npattern = "git push*"',
        "tether.toml: [[policy.bash]] #1 decision: missing "
        "(every rule needs a pattern and a decision)",
    ),
    (
        '[[policy.bash]]\npattern = "a"\ndecision = "allow"\n[[policy.bash]]\ndecision = "deny"',
        "tether.toml: [[policy.bash]] #2 pattern: missing "
        "(every rule needs a pattern and a decision)",
    ),
    (
        '[[policy.bash]]\npattern = ""\ndecision = "deny"',
        'tether.toml: [[policy.bash]] #1 pattern: expected a non-empty pattern string, got ""',
    ),
    (
        '[[policy.bash]]\npattern = "x"\ndecision = "no"',
        'tether.toml: [[policy.bash]] #1 decision: expected one of "allow", "ask", "deny", '
        'got "no"',
    ),
    (
        '[[policy.bash]]\npattern = "x"\ndecision = "deny"\nreason = 7',
        "tether.toml: [[policy.bash]] #1 reason: expected a string, got 7",
    ),
    ("verify = 3", "tether.toml: [verify]: expected a table, got 3"),
    ('policy = "deny"', 'tether.toml: [policy]: expected a table, got "deny"'),
    (
        "[verify]\ncommand = 1979-05-27T07:32:00Z",
        "tether.toml: [verify] command: expected a non-empty shell command string, "
        "got 1979-05-27T07:32:00+00:00",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD_VALUES)
def test_bad_values(text: str, message: str) -> None:
    assert parse_error(text) == message


def test_bad_values_from_a_real_file(tmp_path: Path) -> None:
    write_config(tmp_path, '[verify]\ncommand = "pytest"\ntimeout = "ten"\n')
    assert load_error(tmp_path) == (
        'tether.toml: [verify] timeout: expected a positive number of seconds, got "ten"'
    )


def test_long_values_are_shortened() -> None:
    message = parse_error(f'[verify]\ntimeout = "{"x" * 500}"')
    assert len(message) < 150 and message.endswith("…")


def test_control_characters_in_values_stay_on_one_line() -> None:
    message = parse_error('[verify]\ntimeout = "a\\u2028b\\nc"')
    assert "\\u2028" in message and "\\n" in message


# --------------------------------------------------------------------------- unknown keys

UNKNOWN = [
    (
        '[verify]\ncomand = "pytest"',
        "tether.toml: unknown setting [verify] comand (known: command, timeout, required)",
    ),
    (
        '[artifact]\nignores = ["x"]',
        "tether.toml: unknown setting [artifact] ignores (known: ignore)",
    ),
    (
        "[budget]\nmax_step = 3",
        "tether.toml: unknown setting [budget] max_step "
        "(known: max_steps, max_tokens, max_seconds, max_tool_calls, max_cost_usd, "
        "max_session_tokens, "
        "max_session_cost_usd, time)",
    ),
    (
        '[policy]\ndefualt = "ask"',
        "tether.toml: unknown setting [policy] defualt (known: default, tools, bash)",
    ),
    (
        '[[policy.bash]]\npatern = "x"\ndecision = "deny"',
        "tether.toml: unknown setting [[policy.bash]] #1 patern (known: pattern, decision, reason)",
    ),
    (
        "[verfy]\n",
        "tether.toml: unknown setting [verfy] "
        "(known: [verify], [artifact], [budget], [prices], [policy], [tools], [mcp], [store], "
        "[model], [sandbox], [telemetry])",
    ),
    (
        "timeout = 3\n",
        "tether.toml: unknown setting timeout "
        "(known: [verify], [artifact], [budget], [prices], [policy], [tools], [mcp], [store], "
        "[model], [sandbox], [telemetry])",
    ),
    (
        "[verify.extra]\nx = 1\n",
        "tether.toml: unknown setting [verify] extra (known: command, timeout, required)",
    ),
    (
        '"odd key\\n" = 1\n',
        'tether.toml: unknown setting "odd key\\n" (known: [verify], [artifact], [budget], '
        "[prices], [policy], [tools], [mcp], [store], [model], [sandbox], [telemetry])",
    ),
]


@pytest.mark.parametrize(("text", "message"), UNKNOWN)
def test_unknown_settings(text: str, message: str) -> None:
    assert parse_error(text) == message


# --------------------------------------------------------------------------- invalid TOML


def test_invalid_toml_names_line_and_column() -> None:
    message = parse_error("[verify]\n\nfoo bar\n")
    assert message.startswith("tether.toml is not valid TOML: Expected '=' after a key")
    assert message.endswith("(at line 3, column 5)")


@pytest.mark.parametrize(
    "text",
    [
        "[verify",
        'x = "unterminated',
        "[verify]\ncommand = 1\ncommand = 2",
        "a = " + "[" * 5000 + "]" * 5000,
        "a = " + "{b=" * 3000 + "1" + "}" * 3000,
    ],
)
def test_invalid_toml_is_one_line(text: str) -> None:
    assert parse_error(text).startswith("tether.toml is not valid TOML: ")


def test_source_names_the_file() -> None:
    with pytest.raises(ProjectConfigError, match=r"^other\.toml: \[verify\] timeout: "):
        parse_project_config("[verify]\ntimeout = 0", source="other.toml")
    with pytest.raises(ProjectConfigError, match=r"^other\.toml is not valid TOML: "):
        parse_project_config("[", source="other.toml")


def test_not_utf8(tmp_path: Path) -> None:
    (tmp_path / CONFIG_FILE).write_bytes(b'[verify]\ncommand = "\xff"\n')
    assert load_error(tmp_path) == (
        "tether.toml is not valid TOML: it is not UTF-8 text (byte 0xff at offset 20)"
    )


# --------------------------------------------------------------------------- the file itself


def test_directory_at_the_path(tmp_path: Path) -> None:
    (tmp_path / CONFIG_FILE).mkdir()
    assert load_error(tmp_path) == "cannot read tether.toml: it is a directory, not a file"


def test_symlink_to_directory(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / CONFIG_FILE).symlink_to(tmp_path / "d")
    assert load_error(tmp_path) == "cannot read tether.toml: it is a directory, not a file"


def test_symlink_is_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.toml"
    target.write_text('[verify]\ncommand = "make"\n', encoding="utf-8")
    (tmp_path / CONFIG_FILE).symlink_to(target)
    config = load_project_config(tmp_path)
    assert config.verify.command == "make"
    assert config.path == tmp_path / CONFIG_FILE


def test_dangling_symlink_is_an_error(tmp_path: Path) -> None:
    (tmp_path / CONFIG_FILE).symlink_to(tmp_path / "missing.toml")
    assert load_error(tmp_path) == (
        "cannot read tether.toml: it is a symbolic link to a missing file"
    )


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / CONFIG_FILE)
    assert load_error(tmp_path) == "cannot read tether.toml: it is not a regular file"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file(tmp_path: Path) -> None:
    path = write_config(tmp_path, FULL_EXAMPLE)
    path.chmod(0)
    try:
        assert load_error(tmp_path) == "cannot read tether.toml: Permission denied"
    finally:
        path.chmod(0o600)


def test_unreadable_file_simulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same as :func:`test_unreadable_file`, also when the tests run as root."""
    write_config(tmp_path, FULL_EXAMPLE)
    real_open = os.open

    def deny(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if str(path).endswith(CONFIG_FILE):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", deny)
    assert load_error(tmp_path) == "cannot read tether.toml: Permission denied"


def test_read_error_after_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(tmp_path, FULL_EXAMPLE)

    def fail(fd: int, n: int) -> bytes:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "read", fail)
    assert load_error(tmp_path) == "cannot read tether.toml: Input/output error"


def test_workspace_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "ws").write_text("not a directory")
    assert load_error(tmp_path / "ws") == "cannot read tether.toml: Not a directory"


# --------------------------------------------------------------------------- properties


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_never_crashes(text: str) -> None:
    try:
        config = parse_project_config(text)
    except ProjectConfigError as exc:
        assert str(exc).splitlines() == [str(exc)]
    else:
        assert isinstance(config, ProjectConfig)


_toml_scalars = (
    st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(["allow", "ask", "deny", "pytest -q", "git push*"])
)
_toml_values = st.recursive(
    _toml_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["pattern", "decision", "reason", "bash", "x", "y z"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)
_section_keys = st.sampled_from(
    [
        "command",
        "timeout",
        "required",
        "ignore",
        "max_steps",
        "max_tokens",
        "max_seconds",
        "default",
        "tools",
        "bash",
        "other",
    ]
)
_documents = st.dictionaries(
    st.sampled_from(["verify", "artifact", "budget", "policy", "other"]),
    st.dictionaries(_section_keys, _toml_values, max_size=4) | _toml_values,
    max_size=4,
)


@settings(max_examples=500, deadline=None)
@given(_documents)
def test_arbitrary_documents_give_config_or_one_line_error(document: dict[str, object]) -> None:
    try:
        config = project_config_from_mapping(document)
    except ProjectConfigError as exc:
        message = str(exc)
        assert message.startswith("tether.toml: ")
        assert message.splitlines() == [message]
    else:
        assert isinstance(config, ProjectConfig)
