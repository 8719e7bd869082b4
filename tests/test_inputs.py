"""``tether._inputs``: bounded, typed reading of input files, and JSON depth without parsing.

The reader is checked against every kind of thing a path can name (regular file, FIFO,
device, directory, links to each, nothing), against its size limit from both sides, and
against a FIFO swapped in between the ``stat`` of the name and the ``open`` (the verdict
comes from the descriptor). Then each user of it: the model script, ``tether.toml`` and
``AGENTS.md``. The real-CLI acceptance tests are in ``test_cli_inputs.py``.
"""

from __future__ import annotations

import errno
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether._inputs import (
    MAX_CONFIG_BYTES,
    MAX_CURRENT_BYTES,
    MAX_JSON_DEPTH,
    MAX_SCRIPT_BYTES,
    MAX_SESSION_FILE_BYTES,
    MAX_SUBMIT_BYTES,
    deeper_than,
    nesting_depth,
    read_file,
    read_optional_file,
    value_deeper_than,
)
from tether._project import load_project_config
from tether._runtime import Agent
from tether._runtime.compose import MAX_AGENTS_BYTES
from tether.errors import (
    ConfigurationError,
    InputFileError,
    InputTooDeep,
    InputTooLarge,
    NotARegularFile,
    ProjectConfigError,
)
from tether.testing.scripted import ScriptedModel

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")


@pytest.fixture(autouse=True)
def _never_hang() -> Iterator[None]:
    """A read that blocks (a FIFO without a writer) fails the test instead of hanging it."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError("the read blocked")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(10)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_documented_limits() -> None:
    """The numbers docs/cli.md states (and test_cli_inputs.py checks through the CLI)."""
    assert MAX_SESSION_FILE_BYTES == 1 << 30
    assert MAX_SCRIPT_BYTES == 8 << 20
    assert MAX_SUBMIT_BYTES == 256 << 20
    assert MAX_CURRENT_BYTES == 1 << 20
    assert MAX_CONFIG_BYTES == 1 << 20
    assert MAX_AGENTS_BYTES == 64 << 10
    assert MAX_JSON_DEPTH == 512


def test_errors_are_configuration_errors_exit_2() -> None:
    for error in (
        InputFileError("x", "why"),
        NotARegularFile("x", "why"),
        InputTooLarge("x", 5, 4),
        InputTooDeep("x", 3),
    ):
        assert isinstance(error, ConfigurationError)
        assert error.exit_code == 2
    assert str(InputTooLarge("model script a.json", 9 << 20, 8 << 20)) == (
        "cannot read model script a.json: it is larger than the 8 MiB limit (9437184 bytes)"
    )
    assert (
        str(InputTooLarge("f", None, 1000))
        == "cannot read f: it is larger than the 1000 bytes limit"
    )
    assert str(InputTooDeep("--args", 128)) == (
        "--args is nested deeper than 128 levels of arrays and objects"
    )


# --------------------------------------------------------------------------- read_file


def test_regular_file_within_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_file(path, "f", limit=100) == b"x" * 100
    assert read_file(tmp_path / "f", "f", limit=1000) == b"x" * 100
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert read_file(empty, "empty", limit=0) == b""


def test_one_byte_over_the_limit_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 101)
    with pytest.raises(InputTooLarge) as info:
        read_file(path, "thing f", limit=100)
    assert (info.value.size, info.value.limit) == (101, 100)
    assert (
        str(info.value) == "cannot read thing f: it is larger than the 100 bytes limit (101 bytes)"
    )


def test_truncate_returns_the_first_limit_bytes(tmp_path: Path) -> None:
    path = tmp_path / "f"
    with path.open("wb") as file:
        file.write(b"head")
        file.truncate(1 << 40)  # 1 TiB, sparse
    data = read_file(path, "f", limit=4096, truncate=True)
    assert data == b"head" + b"\0" * 4092


def test_a_file_longer_than_its_size_is_still_bounded() -> None:
    status = Path("/proc/self/status")
    if not status.exists() or status.stat().st_size != 0:
        pytest.skip("needs a /proc file that reports size 0")
    assert b"Name:" in read_file(status, "status", limit=1 << 20)
    with pytest.raises(InputTooLarge) as info:
        read_file(status, "status", limit=10)
    assert info.value.size is None


@needs_fifo
def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(NotARegularFile, match=r"^cannot read the fifo: it is not a regular file$"):
        read_file(fifo, "the fifo", limit=10)


@needs_fifo
def test_fifo_swapped_in_after_the_stat_is_refused_by_the_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The name said "regular file"; what was opened is a FIFO: the descriptor decides."""
    regular = tmp_path / "regular"
    regular.write_bytes(b"x")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    real_stat = os.stat

    def stale_stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if Path(path) == fifo:
            return real_stat(regular)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stale_stat)
    with pytest.raises(NotARegularFile, match="not a regular file"):
        read_file(fifo, "f", limit=10)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_devices_and_links_to_them_are_refused(device: str, tmp_path: Path) -> None:
    if not Path(device).exists():
        pytest.skip(f"no {device}")
    link = tmp_path / "link"
    link.symlink_to(device)
    for path in (Path(device), link):
        with pytest.raises(NotARegularFile, match="not a regular file"):
            read_file(path, "f", limit=1 << 30)


def test_devices_are_never_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    real_open = os.open

    def spy(path: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    with pytest.raises(NotARegularFile):
        read_file("/dev/zero", "f", limit=10)
    assert opened == []


def test_directory_and_link_to_directory(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "d")
    for path in (tmp_path / "d", tmp_path / "link"):
        with pytest.raises(
            NotARegularFile, match=r"^cannot read f: it is a directory, not a file$"
        ):
            read_file(path, "f", limit=10)


def test_link_to_a_regular_file_is_followed(tmp_path: Path) -> None:
    (tmp_path / "target").write_bytes(b"data")
    (tmp_path / "link").symlink_to("target")
    assert read_file(tmp_path / "link", "f", limit=10) == b"data"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match=r"^cannot read f: No such file or directory$"):
        read_file(tmp_path / "absent", "f", limit=10)
    assert read_optional_file(tmp_path / "absent", "f", limit=10) is None


def test_dangling_link_is_an_error_even_when_optional(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(tmp_path / "absent")
    for read in (read_file, read_optional_file):
        with pytest.raises(InputFileError, match="symbolic link to a missing file"):
            read(tmp_path / "link", "f", limit=10)


def test_os_errors_become_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    with pytest.raises(InputFileError, match="Not a directory"):
        read_file(path / "below", "f", limit=10)
    with pytest.raises(InputFileError, match="NUL"):
        read_file(str(path) + "\0", "f", limit=10)

    def denied(*args: Any, **kwargs: Any) -> int:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(InputFileError, match=r"^cannot read f: Permission denied$"):
        read_file(path, "f", limit=10)


def test_read_error_after_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")

    def fail(fd: int, n: int) -> bytes:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "read", fail)
    with pytest.raises(InputFileError, match=r"^cannot read f: Input/output error$"):
        read_file(path, "f", limit=10)


def test_descriptor_is_closed_on_every_path(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * 20)
    (tmp_path / "ok").write_bytes(b"x")
    before = len(os.listdir("/proc/self/fd")) if Path("/proc/self/fd").is_dir() else None
    if before is None:
        pytest.skip("needs /proc/self/fd")
    for _ in range(20):
        read_file(tmp_path / "ok", "f", limit=10)
        with pytest.raises(InputTooLarge):
            read_file(tmp_path / "big", "f", limit=10)
    assert len(os.listdir("/proc/self/fd")) == before


def test_within_follows_links_that_stay_inside(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "real.md").write_bytes(b"inside")
    (root / "link").symlink_to("docs/real.md")
    assert read_file(root / "link", "f", limit=10, within=root) == b"inside"


def test_within_refuses_links_that_leave(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "secret").write_bytes(b"key")
    (root / "link").symlink_to(tmp_path / "secret")
    with pytest.raises(InputFileError, match="outside") as info:
        read_file(root / "link", "f", limit=10, within=root)
    assert "key" not in str(info.value)


def test_within_refuses_a_name_that_changed_after_the_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "a").write_bytes(b"a")
    (root / "b").write_bytes(b"b")
    real = os.path.realpath
    monkeypatch.setattr(
        os.path, "realpath", lambda p: str(root / "b") if Path(p) == root / "a" else real(p)
    )
    with pytest.raises(InputFileError, match="changed while it was being opened"):
        read_file(root / "a", "f", limit=10, within=root)


# --------------------------------------------------------------------------- JSON depth


def _depth(value: Any) -> int:
    """Nesting depth of a parsed value, computed the obvious way."""
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


TRICKY_TEXT = st.text(alphabet='[]{}"\\/ab\u00e9\u2028\n\t', max_size=8)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | TRICKY_TEXT,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(TRICKY_TEXT, children, max_size=3)
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(JSON_VALUES, st.booleans())
def test_nesting_depth_matches_the_parsed_value(value: Any, ascii_escapes: bool) -> None:
    """Exact for any valid JSON text: brackets inside strings and escapes never count."""
    compact = orjson.dumps(value)
    spaced = json.dumps(value, indent=1, ensure_ascii=ascii_escapes).encode()
    for text in (compact, spaced):
        assert nesting_depth(text) == _depth(value)
        for limit in range(4):
            assert deeper_than(text, limit) == (_depth(value) > limit)
    assert value_deeper_than(value, 3) == (_depth(value) > 3)


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        (b"1", 0),
        (b'"[[[{{{"', 0),
        (b'"\\"[["', 0),
        (b'["\\\\", [[]]]', 3),
        (b'{"a\\"]": [{"b": "}}}"}]}', 3),
        (b"[" * 100_000 + b"]" * 100_000, 100_000),
        (b"[" * 10, 10),  # not JSON: still what a parser would descend into
    ],
)
def test_nesting_depth_cases(text: bytes, depth: int) -> None:
    assert nesting_depth(text) == depth


def test_value_deeper_than_does_not_recurse() -> None:
    value: Any = []
    for _ in range(100_000):
        value = [value]
    assert value_deeper_than(value, MAX_JSON_DEPTH)
    mixed = {"a": [1, {"b": ()}]}  # a tuple is an array too: 4 levels
    assert not value_deeper_than(mixed, 4)
    assert value_deeper_than(mixed, 3)


# --------------------------------------------------------------------------- model script


def _nested_arguments(depth: int) -> bytes:
    """A script whose whole text nests exactly ``depth`` levels (depth >= 6)."""
    inner = b"[" * (depth - 6) + b"]" * (depth - 6)
    return (
        b'{"responses": [{"tool_calls": [{"name": "read", "arguments": {"a": ' + inner + b"}}]}]}"
    )


def test_script_at_the_depth_limit_loads(tmp_path: Path) -> None:
    text = _nested_arguments(MAX_JSON_DEPTH)
    assert nesting_depth(text) == MAX_JSON_DEPTH
    path = tmp_path / "s.json"
    path.write_bytes(text)
    response = ScriptedModel.from_file(path).response_at(0)
    assert not isinstance(response, Exception)
    assert (
        json.loads(response.tool_calls[0].arguments)
        == json.loads(text)["responses"][0]["tool_calls"][0]["arguments"]
    )


def test_script_one_level_deeper_names_the_file_and_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_bytes(_nested_arguments(MAX_JSON_DEPTH + 1))
    with pytest.raises(InputTooDeep) as info:
        ScriptedModel.from_file(path)
    assert (
        str(info.value)
        == f"model script {path} is nested deeper than 512 levels of arrays and objects"
    )
    with pytest.raises(InputTooDeep):
        ScriptedModel.from_json(path.read_text(), source="s.json")


def test_parsed_script_deeper_than_the_limit() -> None:
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    script = {"responses": [{"tool_calls": [{"name": "read", "arguments": {"a": deep}}]}]}
    with pytest.raises(InputTooDeep, match="model script <script>"):
        ScriptedModel.from_json(script)


def test_unpaired_surrogate_deep_in_arguments_is_found_without_recursion() -> None:
    depth = MAX_JSON_DEPTH - 8
    text = (
        '{"responses": [{"tool_calls": [{"name": "read", "arguments": {"a": '
        + "[" * depth
        + '"\\ud800"'
        + "]" * depth
        + "}}]}]}"
    )
    with pytest.raises(ConfigurationError) as info:
        ScriptedModel.from_json(text, source="s.json")
    assert "/responses/0/tool_calls/0/arguments/a" + "/0" * depth in str(info.value)
    assert "unpaired surrogate" in str(info.value)


def test_first_bad_string_in_document_order_is_reported() -> None:
    text = (
        '{"responses": [{"tool_calls": [{"name": "read", "arguments": '
        '{"a": ["ok", "\\ud800"], "b": "\\udc00"}}]}]}'
    )
    with pytest.raises(ConfigurationError, match=r"arguments/a/1: contains an unpaired"):
        ScriptedModel.from_json(text, source="s.json")


@needs_fifo
def test_script_fifo_and_size(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(NotARegularFile, match=r"cannot read model script .*fifo\.json"):
        ScriptedModel.from_file(tmp_path / "fifo.json")
    big = tmp_path / "big.json"
    with big.open("wb") as file:
        file.truncate(MAX_SCRIPT_BYTES + 1)
    with pytest.raises(InputTooLarge, match="8 MiB limit"):
        ScriptedModel.from_file(big)


# --------------------------------------------------------------------------- tether.toml


def test_tether_toml_over_the_limit(tmp_path: Path) -> None:
    with (tmp_path / "tether.toml").open("wb") as file:
        file.truncate(MAX_CONFIG_BYTES + 1)
    with pytest.raises(ProjectConfigError) as info:
        load_project_config(tmp_path)
    assert str(info.value) == (
        "cannot read tether.toml: it is larger than the 1 MiB limit (1048577 bytes)"
    )
    assert isinstance(info.value.__cause__, InputTooLarge)


def test_tether_toml_link_to_a_device(tmp_path: Path) -> None:
    (tmp_path / "tether.toml").symlink_to("/dev/zero")
    with pytest.raises(
        ProjectConfigError, match=r"^cannot read tether\.toml: it is not a regular file$"
    ):
        load_project_config(tmp_path)


# --------------------------------------------------------------------------- AGENTS.md


def _agent(workspace: Path) -> Agent:
    return Agent(ScriptedModel.from_json({"responses": [{"content": "ok"}]}), workspace=workspace)


def test_agents_md_is_cut_at_64_kib(tmp_path: Path) -> None:
    text = ("rule " * 20_000).encode()
    assert len(text) > MAX_AGENTS_BYTES
    (tmp_path / "AGENTS.md").write_bytes(text)
    prompt = _agent(tmp_path).system_prompt
    kept = text[:MAX_AGENTS_BYTES].decode()
    assert prompt.endswith("# AGENTS.md\n\n" + kept)


def test_agents_md_link_inside_the_workspace_is_followed(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "agents.md").write_text("Use tabs.\n")
    (tmp_path / "AGENTS.md").symlink_to("docs/agents.md")
    assert "Use tabs." in _agent(tmp_path).system_prompt


def test_agents_md_link_leaving_the_workspace_is_refused(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (tmp_path / "credentials").write_text("sk-secret\n")
    (workspace / "AGENTS.md").symlink_to(tmp_path / "credentials")
    with pytest.raises(InputFileError, match="outside") as info:
        _agent(workspace)
    assert "sk-secret" not in str(info.value)


@needs_fifo
def test_agents_md_fifo_and_directory_are_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "AGENTS.md")
    with pytest.raises(NotARegularFile, match=r"AGENTS\.md: it is not a regular file"):
        _agent(tmp_path)
    os.unlink(tmp_path / "AGENTS.md")
    (tmp_path / "AGENTS.md").mkdir()
    with pytest.raises(NotARegularFile, match="directory"):
        _agent(tmp_path)


def test_agents_md_absent_or_blank_adds_nothing(tmp_path: Path) -> None:
    without = _agent(tmp_path).system_prompt
    assert "AGENTS.md" not in without
    (tmp_path / "AGENTS.md").write_text(" \n\t\n")
    assert _agent(tmp_path).system_prompt == without
    assert (
        Agent(
            ScriptedModel.from_json({"responses": [{"content": "ok"}]}),
            workspace=tmp_path,
            read_agents_md=False,
        ).system_prompt
        == without
    )


def test_agents_md_unreadable_is_an_error_not_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "AGENTS.md").write_text("rules\n")
    real_open = os.open

    def deny(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith("AGENTS.md"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    with pytest.raises(InputFileError, match="Permission denied"):
        _agent(tmp_path)
