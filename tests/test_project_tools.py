"""``tether.toml`` ``[tools]``: what the commands tether starts get from it."""

from __future__ import annotations

import pytest

from tether._project import ProjectConfig, ToolsConfig, parse_project_config
from tether.errors import ProjectConfigError


def test_default_passes_nothing_through() -> None:
    assert ProjectConfig().tools == ToolsConfig(pass_env=())
    assert parse_project_config("").tools.pass_env == ()


def test_pass_env_names_in_order_without_repeats() -> None:
    config = parse_project_config('[tools]\npass_env = ["OPENAI_API_KEY", "GH_TOKEN", "GH_TOKEN"]')
    assert config.tools.pass_env == ("OPENAI_API_KEY", "GH_TOKEN")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[tools]\npass_env = "OPENAI_API_KEY"',
            "tether.toml: [tools] pass_env: expected a list of environment variable names, "
            'got "OPENAI_API_KEY"',
        ),
        (
            '[tools]\npass_env = ["A", "B=1"]',
            "tether.toml: [tools] pass_env: item 2: expected an environment variable name "
            '(letters, digits, _), got "B=1"',
        ),
        (
            "[tools]\npass_env = [3]",
            "tether.toml: [tools] pass_env: item 1: expected an environment variable name "
            "(letters, digits, _), got 3",
        ),
        ("[tools]\npassenv = []", "tether.toml: unknown setting [tools] passenv (known: pass_env)"),
        ('tools = "bash"', 'tether.toml: [tools]: expected a table, got "bash"'),
    ],
)
def test_bad_tools_tables(text: str, message: str) -> None:
    with pytest.raises(ProjectConfigError) as info:
        parse_project_config(text)
    assert str(info.value) == message
