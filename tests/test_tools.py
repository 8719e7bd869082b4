"""The tool contract, the registry, workspace confinement and the file tools.

Real files under ``tmp_path``; ``bash`` has its own module (``test_tools_bash.py``).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether._tools import (
    EditTool,
    FileChange,
    FunctionTool,
    ReadTool,
    Rejection,
    Tool,
    ToolContext,
    ToolRegistry,
    ToolResult,
    ValidatedCall,
    WriteTool,
    apply_change,
    builtin,
    builtin_tools,
    plan_edit,
    plan_write,
    resolve_in_workspace,
    tool,
)
from tether._tools.base import BUILTIN_MODULES
from tether._tools.builtin import READ_MAX_BYTES, READ_MAX_LINES, ApplyOutcome, current_hash
from tether._tools.workspace import open_parent, relative_parts
from tether.core.canonical import sha256_digest, tool_definition_digest
from tether.core.contents import SYNTHETIC_CONTENT
from tether.core.current import CurrentConfiguration, ToolDeclaration
from tether.core.state import Replay
from tether.errors import (
    CanonicalizationError,
    ConfigurationError,
    StaleFileChange,
    ToolError,
    WorkspaceEscape,
)

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    other = tmp_path / "outside"
    other.mkdir()
    (other / "secret.txt").write_text("top secret\n")
    return other.resolve()


def ctx(ws: Path) -> ToolContext:
    return ToolContext(workspace=ws, operation_id="op-1")


def run(t: Tool, ws: Path, **arguments: Any) -> ToolResult:
    """Validate through a registry like the executor will, then run."""
    outcome = ToolRegistry([t]).validate(t.name, json.dumps(arguments))
    assert isinstance(outcome, ValidatedCall), outcome
    return t.run(outcome.arguments, ctx(ws))


def listing(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


# =========================================================================== confinement


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/etc/passwd", "absolute"),
        ("../outside/secret.txt", "'..'"),
        ("a/../../outside/secret.txt", "'..'"),
        ("a/..", "'..'"),
        ("", "empty"),
        ("a\x00b", "NUL"),
    ],
)
def test_malformed_paths_are_refused(ws: Path, path: str, reason: str) -> None:
    (ws / "a").mkdir()
    with pytest.raises(WorkspaceEscape, match=reason):
        resolve_in_workspace(ws, path, must_exist=False, for_write=True)
    for t, args in (
        (ReadTool(), {"path": path}),
        (WriteTool(), {"path": path, "content": "x"}),
        (EditTool(), {"path": path, "old_string": "a", "new_string": "b"}),
    ):
        result = t.run(args, ctx(ws))
        assert result.is_error
        assert result.content.startswith("Error: path escapes the workspace: ")
    assert listing(ws) == ["a"]


def test_dot_components_and_double_slashes_are_normalized(ws: Path) -> None:
    (ws / "src").mkdir()
    (ws / "src" / "a.py").write_text("x = 1\n")
    assert relative_parts("./src//a.py") == ("src", "a.py")
    assert resolve_in_workspace(ws, "./src//a.py", must_exist=True, for_write=False) == (
        ws / "src" / "a.py"
    )
    assert run(ReadTool(), ws, path="./src//a.py").content == "x = 1\n"


def test_symlinked_file_is_refused_even_when_it_points_inside(ws: Path) -> None:
    (ws / "real.txt").write_text("inside\n")
    (ws / "link.txt").symlink_to(ws / "real.txt")
    with pytest.raises(WorkspaceEscape, match="symbolic link"):
        resolve_in_workspace(ws, "link.txt", must_exist=True, for_write=False)
    for t, args in (
        (ReadTool(), {"path": "link.txt"}),
        (WriteTool(), {"path": "link.txt", "content": "changed"}),
        (EditTool(), {"path": "link.txt", "old_string": "inside", "new_string": "x"}),
    ):
        result = t.run(args, ctx(ws))
        assert result.is_error and "symbolic link" in result.content, result.content
    assert (ws / "real.txt").read_text() == "inside\n"
    assert (ws / "link.txt").is_symlink()


def test_symlink_pointing_outside_is_refused(ws: Path, outside: Path) -> None:
    (ws / "leak").symlink_to(outside / "secret.txt")
    result = ReadTool().run({"path": "leak"}, ctx(ws))
    assert result.is_error and "secret" not in result.content.replace("'leak'", "")
    result = WriteTool().run({"path": "leak", "content": "pwned"}, ctx(ws))
    assert result.is_error
    assert (outside / "secret.txt").read_text() == "top secret\n"


def test_symlinked_directory_in_the_middle_is_refused(ws: Path, outside: Path) -> None:
    (ws / "real").mkdir()
    (ws / "real" / "f.txt").write_text("f\n")
    (ws / "inner").symlink_to(ws / "real")  # points inside: still refused
    (ws / "out").symlink_to(outside)
    for path in ("inner/f.txt", "out/secret.txt", "out/new.txt", "out/deep/new.txt"):
        with pytest.raises(WorkspaceEscape, match="symbolic link"):
            resolve_in_workspace(ws, path, must_exist=False, for_write=True)
        assert ReadTool().run({"path": path}, ctx(ws)).is_error
        assert WriteTool().run({"path": path, "content": "x"}, ctx(ws)).is_error
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "top secret\n"


def test_descriptor_walk_refuses_symlinks_without_the_path_check(ws: Path, outside: Path) -> None:
    """The race-free layer alone (as if a directory were swapped after the check)."""
    (ws / "d").symlink_to(outside)
    with pytest.raises(WorkspaceEscape, match="symbolic link"):
        with open_parent(ws, "d/secret.txt", create=False):
            pass
    change = FileChange("d/new.txt", None, sha256_digest(b"x"), b"x")
    with pytest.raises(WorkspaceEscape):
        apply_change(ws, change)
    (ws / "f").symlink_to(outside / "secret.txt")
    change = FileChange("f", None, sha256_digest(b"x"), b"x")
    with pytest.raises(WorkspaceEscape):
        apply_change(ws, change)
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "top secret\n"


def test_symlinked_workspace_root_is_resolved(tmp_path: Path, ws: Path) -> None:
    (ws / "a.txt").write_text("a")
    alias = tmp_path / "alias"
    alias.symlink_to(ws)
    assert resolve_in_workspace(alias, "a.txt", must_exist=True, for_write=False) == ws / "a.txt"


def test_non_regular_files_are_refused_without_blocking(ws: Path) -> None:
    os.mkfifo(ws / "fifo")
    (ws / "dir").mkdir()
    result = ReadTool().run({"path": "fifo"}, ctx(ws))
    assert result.is_error and "not a regular file" in result.content
    result = ReadTool().run({"path": "dir"}, ctx(ws))
    assert result.is_error and "is a directory" in result.content
    result = WriteTool().run({"path": "dir", "content": "x"}, ctx(ws))
    assert result.is_error and "is a directory" in result.content
    result = WriteTool().run({"path": "fifo", "content": "x"}, ctx(ws))
    assert result.is_error
    assert stat.S_ISFIFO(os.lstat(ws / "fifo").st_mode)


def test_missing_files_and_file_parents(ws: Path) -> None:
    (ws / "file").write_text("x")
    with pytest.raises(FileNotFoundError):
        resolve_in_workspace(ws, "nope/x.txt", must_exist=True, for_write=False)
    assert resolve_in_workspace(ws, "nope/x.txt", must_exist=False, for_write=True) == (
        ws / "nope" / "x.txt"
    )
    with pytest.raises(NotADirectoryError):
        resolve_in_workspace(ws, "file/x.txt", must_exist=False, for_write=True)
    assert ReadTool().run({"path": "nope.txt"}, ctx(ws)).content == (
        "Error: nope.txt: no such file or directory"
    )
    result = WriteTool().run({"path": "file/x.txt", "content": "x"}, ctx(ws))
    assert result.is_error and "not a directory" in result.content


# =========================================================================== read


def test_read_returns_the_file_verbatim(ws: Path) -> None:
    (ws / "f.txt").write_bytes(b"one\r\ntwo\n\nthree")
    result = run(ReadTool(), ws, path="f.txt")
    assert not result.is_error
    assert result.content == "one\r\ntwo\n\nthree"
    assert result.metadata["lines"] == 4


def test_read_offset_and_limit_with_cut_note(ws: Path) -> None:
    (ws / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    result = run(ReadTool(), ws, path="f.txt", offset=3, limit=2)
    assert result.content == (
        "line 3\nline 4\n[... cut: 6 more lines / 43 bytes not shown; use offset=5 to read further]"
    )
    assert run(ReadTool(), ws, path="f.txt", offset=10).content == "line 10\n"
    result = run(ReadTool(), ws, path="f.txt", offset=11)
    assert result.is_error and "past the end" in result.content and "(10 lines)" in result.content


def test_read_caps_lines(ws: Path) -> None:
    (ws / "many.txt").write_text("".join(f"{i}\n" for i in range(1, 2501)))
    result = run(ReadTool(), ws, path="many.txt")
    lines = result.content.split("\n")
    assert lines[0] == "1" and lines[READ_MAX_LINES - 1] == str(READ_MAX_LINES)
    assert lines[-1].startswith("[... cut: 500 more lines / ")
    assert lines[-1].endswith(f"use offset={READ_MAX_LINES + 1} to read further]")
    assert len(lines) == READ_MAX_LINES + 1
    rest = run(ReadTool(), ws, path="many.txt", offset=READ_MAX_LINES + 1)
    assert rest.content.startswith("2001\n") and rest.content.endswith("2500\n")


def test_read_caps_bytes_at_line_boundaries(ws: Path) -> None:
    line = "x" * 99 + "\n"
    (ws / "wide.txt").write_text(line * 1000)  # 100 000 bytes
    result = run(ReadTool(), ws, path="wide.txt")
    body, note = result.content.rsplit("\n", 1)
    shown = READ_MAX_BYTES // 100
    assert body + "\n" == line * shown
    assert note == (
        f"[... cut: {1000 - shown} more lines / {100 * (1000 - shown)} bytes not shown; "
        f"use offset={shown + 1} to read further]"
    )


def test_read_cuts_a_single_overlong_line(ws: Path) -> None:
    (ws / "long.txt").write_text("é" * READ_MAX_BYTES + "\nnext\n")
    result = run(ReadTool(), ws, path="long.txt")
    first, long_note, note = result.content.split("\n")
    assert set(first) == {"é"} and len(first.encode()) <= READ_MAX_BYTES
    assert "line 1 is longer than" in long_note
    assert "use offset=2 to read further]" in note
    assert run(ReadTool(), ws, path="long.txt", offset=2).content == "next\n"


def test_read_invalid_utf8_binary_and_empty(ws: Path) -> None:
    (ws / "latin1.txt").write_bytes(b"caf\xe9\n")
    assert run(ReadTool(), ws, path="latin1.txt").content == "caf\ufffd\n"
    (ws / "bin").write_bytes(b"\x7fELF\x00\x01")
    result = run(ReadTool(), ws, path="bin")
    assert result.is_error and "binary" in result.content
    (ws / "empty").write_bytes(b"")
    assert run(ReadTool(), ws, path="empty").content == "[empty file]"
    assert run(ReadTool(), ws, path="empty", offset=2).is_error


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    content=st.lists(
        st.sampled_from([b"a", b"\xc3\xa9", b"\n", b"\r\n", b"\xff", b"  ", b"line"]),
        max_size=60,
    ).map(b"".join),
    limit=st.integers(min_value=1, max_value=12),
)
def test_small_file_shortcut_reads_what_the_line_walk_reads(
    ws: Path, content: bytes, limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A small file read from line 1 is served from the binary probe; a probe of one byte
    # never holds a whole file, so it forces the line-by-line walk: both must agree.
    (ws / "f.txt").write_bytes(content)
    fast = run(ReadTool(), ws, path="f.txt", limit=limit)
    with monkeypatch.context() as patch:
        patch.setattr(builtin, "_BINARY_PROBE", 1)
        walked = run(ReadTool(), ws, path="f.txt", limit=limit)
    assert (fast.content, fast.metadata, fast.is_error) == (
        walked.content,
        walked.metadata,
        walked.is_error,
    )


# =========================================================================== write


def test_write_creates_parents_atomically(ws: Path) -> None:
    result = run(WriteTool(), ws, path="a/b/c.txt", content="héllo\n")
    assert not result.is_error, result.content
    assert result.content == "Wrote 7 bytes to a/b/c.txt (created)"
    assert (ws / "a" / "b" / "c.txt").read_bytes() == "héllo\n".encode()
    assert listing(ws) == ["a", "a/b", "a/b/c.txt"]  # no temp files left
    assert result.metadata["before_hash"] is None
    assert result.metadata["after_hash"] == sha256_digest("héllo\n".encode())
    assert result.metadata["bytes_written"] == 7


def test_write_replaces_and_preserves_mode(ws: Path) -> None:
    target = ws / "run.sh"
    target.write_text("old\n")
    target.chmod(0o750)
    result = run(WriteTool(), ws, path="run.sh", content="new\n")
    assert result.content == "Wrote 4 bytes to run.sh (replaced)"
    assert target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    assert result.metadata["before_hash"] == sha256_digest(b"old\n")
    assert listing(ws) == ["run.sh"]


def test_new_file_mode_follows_umask(ws: Path) -> None:
    old = os.umask(0o022)
    try:
        run(WriteTool(), ws, path="n.txt", content="")
    finally:
        os.umask(old)
    assert stat.S_IMODE((ws / "n.txt").stat().st_mode) == 0o644


def test_write_refuses_directory_like_paths(ws: Path) -> None:
    result = run(WriteTool(), ws, path="d/", content="x")
    assert result.is_error and "names a directory" in result.content
    assert listing(ws) == []


def test_plan_and_apply_compare_and_swap(ws: Path) -> None:
    (ws / "f.txt").write_text("v1")
    change = plan_write(ws, "./f.txt", "v2")
    assert change == FileChange("f.txt", sha256_digest(b"v1"), sha256_digest(b"v2"), b"v2")
    assert (ws / "f.txt").read_text() == "v1"  # planning writes nothing
    assert apply_change(ws, change) is ApplyOutcome.APPLIED
    assert apply_change(ws, change) is ApplyOutcome.ALREADY_APPLIED  # idempotent
    assert current_hash(ws, "f.txt") == change.after_hash
    stale = plan_write(ws, "f.txt", "v3")
    (ws / "f.txt").write_text("someone else")
    with pytest.raises(StaleFileChange, match="changed since"):
        apply_change(ws, stale)
    assert (ws / "f.txt").read_text() == "someone else"
    created = plan_write(ws, "g.txt", "g")
    assert created.before_hash is None
    (ws / "g.txt").write_text("raced")
    with pytest.raises(StaleFileChange):
        apply_change(ws, created)
    assert listing(ws) == ["f.txt", "g.txt"]


def test_write_same_content_is_reported_unchanged(ws: Path) -> None:
    (ws / "f.txt").write_text("same")
    before = os.stat(ws / "f.txt").st_ino
    result = run(WriteTool(), ws, path="f.txt", content="same")
    assert "unchanged" in result.content and result.metadata["bytes_written"] == 0
    assert os.stat(ws / "f.txt").st_ino == before


def _crash_child(ws: Path, boundary: str, content: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys; from pathlib import Path; from tether._tools import apply_change, plan_write;"
        "ws = Path(sys.argv[1]); apply_change(ws, plan_write(ws, 'f.txt', sys.argv[2]))"
    )
    env = {**os.environ, "TETHER_CRASH_AT": boundary, "TETHER_CRASH_MODE": "exit"}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-c", code, str(ws), content],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_crash_before_or_after_the_rename_leaves_old_or_new_content(ws: Path) -> None:
    (ws / "f.txt").write_text("old")
    done = _crash_child(ws, "tools.apply.before_replace", "new")
    assert "INJECTED_CRASH boundary=tools.apply.before_replace" in done.stderr
    assert (ws / "f.txt").read_text() == "old"  # the leftover temp file is hidden and unused
    assert next(n for n in os.listdir(ws) if n != "f.txt").endswith(".tether-tmp")
    done = _crash_child(ws, "tools.apply.after_replace", "new")
    assert "INJECTED_CRASH boundary=tools.apply.after_replace" in done.stderr
    assert (ws / "f.txt").read_text() == "new"


# =========================================================================== edit


def test_edit_unique_replacement(ws: Path) -> None:
    (ws / "m.py").write_text("def f():\n    return 1\n")
    result = run(EditTool(), ws, path="m.py", old_string="return 1", new_string="return 2")
    assert result.content == "Edited m.py: replaced 1 occurrence"
    assert (ws / "m.py").read_text() == "def f():\n    return 2\n"
    assert result.metadata["replacements"] == 1
    assert listing(ws) == ["m.py"]


def test_edit_not_found_and_ambiguous(ws: Path) -> None:
    (ws / "m.txt").write_text("a a a")
    result = run(EditTool(), ws, path="m.txt", old_string="b", new_string="c")
    assert result.is_error and "not found" in result.content
    result = run(EditTool(), ws, path="m.txt", old_string="a", new_string="c")
    assert (
        result.is_error and "occurs 3 times" in result.content and "replace_all" in result.content
    )
    result = run(EditTool(), ws, path="m.txt", old_string="a", new_string="a")
    assert result.is_error and "identical" in result.content
    assert (ws / "m.txt").read_text() == "a a a"
    result = run(EditTool(), ws, path="m.txt", old_string="a", new_string="bb", replace_all=True)
    assert result.content == "Edited m.txt: replaced 3 occurrences"
    assert (ws / "m.txt").read_text() == "bb bb bb"


def test_edit_missing_file_and_invalid_arguments(ws: Path) -> None:
    result = run(EditTool(), ws, path="nope.txt", old_string="a", new_string="b")
    assert result.is_error and "no such file" in result.content
    registry = ToolRegistry([EditTool()])
    empty = registry.validate("edit", '{"path":"x","old_string":"","new_string":"b"}')
    assert isinstance(empty, Rejection) and empty.reason == "invalidArguments"


def test_edit_keeps_bytes_that_are_not_utf8(ws: Path) -> None:
    (ws / "mixed").write_bytes(b"\xff\xfeA=1\n\xe9")
    change, count = plan_edit(ws, "mixed", "A=1", "A=2")
    assert count == 1 and change.new_bytes == b"\xff\xfeA=2\n\xe9"
    apply_change(ws, change)
    assert (ws / "mixed").read_bytes() == b"\xff\xfeA=2\n\xe9"


def test_plan_edit_errors_are_tool_errors(ws: Path) -> None:
    (ws / "f").write_text("x")
    with pytest.raises(ToolError):
        plan_edit(ws, "f", "y", "z")


# =========================================================================== contract


def _echo(arguments: Mapping[str, Any], context: ToolContext) -> str:
    return str(arguments.get("text", ""))


ECHO_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 5}},
    "required": ["text"],
    "additionalProperties": False,
}


def test_builtin_declarations() -> None:
    tools = builtin_tools()
    assert [t.name for t in tools] == ["read", "bash", "write", "edit"]
    assert [(d.name, d.replay, d.replay_key) for d in ToolRegistry(tools).declarations()] == [
        ("read", Replay.SAFE, "builtin:read:v1"),
        ("bash", Replay.NEVER, "builtin:bash:v1"),
        ("write", Replay.NEVER, "builtin:write:v1"),
        ("edit", Replay.NEVER, "builtin:edit:v1"),
    ]
    for t in tools:
        assert t.definition_digest() == tool_definition_digest(t.definition())
        assert set(t.definition()) == {"name", "description", "parameters"}


def test_declarations_feed_the_planner() -> None:
    registry = ToolRegistry(builtin_tools())
    current = CurrentConfiguration.from_json(
        {
            "configurationDigest": "sha256:" + "0" * 64,
            "environmentIdentity": "/w",
            "tools": [d.to_json() for d in registry.declarations()],
        }
    )
    assert list(current.tools) == registry.declarations()
    assert registry.snapshot_tools()[0] == {
        "name": "read",
        "definitionDigest": registry.declarations()[0].definition_digest,
    }


def test_user_tool_named_read_is_never_replay_safe() -> None:
    fake = FunctionTool(
        _echo, name="read", description="d", parameters=ECHO_SCHEMA, replay=Replay.SAFE
    )
    assert fake.replay is Replay.NEVER and fake.replay_key == "user:read:v1"
    assert fake.declaration() == ToolDeclaration(
        "read", fake.definition_digest(), Replay.NEVER, "user:read:v1"
    )

    class MyRead(ReadTool):  # a subclass outside tether is not the built-in
        replay_key = "user:read:v2"

    assert MyRead().replay is Replay.NEVER
    with pytest.raises(ConfigurationError, match="reserved"):

        class Impostor(ReadTool):
            pass

        Impostor()
    with pytest.raises(ConfigurationError, match="reserved"):
        FunctionTool(
            _echo, name="x", description="", parameters=ECHO_SCHEMA, replay_key="builtin:read:v1"
        )


def test_user_tools_may_declare_replay_safe_for_their_own_name() -> None:
    lookup = FunctionTool(
        _echo, name="lookup", description="d", parameters=ECHO_SCHEMA, replay=Replay.SAFE
    )
    assert (lookup.replay, lookup.replay_key) == (Replay.SAFE, "user:lookup:v1")
    pinned = FunctionTool(
        _echo,
        name="lookup",
        description="d",
        parameters=ECHO_SCHEMA,
        replay=Replay.SAFE,
        replay_key="acme:lookup:v7",
    )
    assert pinned.replay_key == "acme:lookup:v7"


def test_registry_rejects_duplicates_and_keeps_order() -> None:
    echo = FunctionTool(_echo, name="echo", description="", parameters=ECHO_SCHEMA)
    registry = ToolRegistry([*builtin_tools(), echo])
    assert registry.names == ("read", "bash", "write", "edit", "echo")
    assert registry.get("echo") is echo and registry.get("nope") is None
    assert "echo" in registry and len(registry) == 5
    with pytest.raises(ConfigurationError, match="duplicate tool name 'read'"):
        ToolRegistry(
            [
                *builtin_tools(),
                FunctionTool(_echo, name="read", description="", parameters=ECHO_SCHEMA),
            ]
        )
    with pytest.raises(ConfigurationError, match="duplicate"):
        ToolRegistry([echo, echo])


def test_registry_validation_outcomes() -> None:
    registry = ToolRegistry(
        [FunctionTool(_echo, name="echo", description="", parameters=ECHO_SCHEMA)]
    )
    unknown = registry.validate("nope", '{"text":"hi"}')
    assert isinstance(unknown, Rejection)
    assert unknown == Rejection("unknownTool", SYNTHETIC_CONTENT["unknownTool"], unknown.detail)
    assert "nope" in unknown.detail
    bad: list[object] = [
        "{not json",
        '["text"]',
        '"text"',
        "",
        '{"text": NaN}',
        '{"text":"hi"} x',
        '{"text": 1}',
        '{"text":"toolong"}',
        "{}",
        '{"text":"hi","extra":1}',
        None,
    ]
    for text in bad:
        outcome = registry.validate("echo", text)
        assert isinstance(outcome, Rejection), text
        assert outcome.reason == "invalidArguments"
        assert outcome.content == SYNTHETIC_CONTENT["invalidArguments"]
    detail = registry.validate("echo", '{"text": 1}')
    assert isinstance(detail, Rejection) and "arguments.text" in detail.detail
    ok = registry.validate("echo", ' {"text":"hi"} ')
    assert isinstance(ok, ValidatedCall) and ok.arguments == {"text": "hi"}
    assert ok.declaration.replay_key == "user:echo:v1"
    assert ok.tool.run(ok.arguments, ToolContext(Path("/"), "op")) == ToolResult("hi")


def test_builtin_schemas_reject_bad_arguments() -> None:
    registry = ToolRegistry(builtin_tools())
    for name, arguments in [
        ("read", {"path": "a", "limit": READ_MAX_LINES + 1}),
        ("read", {"path": "a", "offset": 0}),
        ("read", {"path": ""}),
        ("bash", {"command": "ls", "timeout": 0}),
        ("bash", {"command": "ls", "timeout": 601}),
        ("write", {"path": "a"}),
        ("edit", {"path": "a", "old_string": "x", "new_string": "y", "replace_all": "yes"}),
    ]:
        outcome = registry.validate(name, json.dumps(arguments))
        assert isinstance(outcome, Rejection) and outcome.reason == "invalidArguments", arguments


@pytest.mark.parametrize(
    "parameters",
    [
        {"type": "object", "properties": {"p": {"type": "string", "format": "uri"}}},
        {"type": "object", "anyOf": [{"required": ["a"]}]},
        {"type": "object", "$defs": {}},
        {"type": "object", "properties": {"p": {"$ref": "#/x"}}},
        {"type": "object", "properties": {"p": {"type": "date"}}},
    ],
)
def test_unsupported_schema_keywords_are_rejected(parameters: dict[str, Any]) -> None:
    with pytest.raises((CanonicalizationError, ConfigurationError)):
        FunctionTool(_echo, name="t", description="", parameters=parameters)


def test_unsupported_keyword_error_names_it() -> None:
    schema = {"type": "object", "properties": {"p": {"type": "string", "format": "uri"}}}
    with pytest.raises(CanonicalizationError, match="'format'"):
        FunctionTool(_echo, name="t", description="", parameters=schema)


@pytest.mark.parametrize(
    ("name", "parameters", "match"),
    [
        ("t", {"type": "string"}, '"type": "object"'),
        ("t", {"type": "object", "properties": {"n": {"minimum": "x"}}}, "not a valid JSON"),
        ("t", [], "JSON Schema object"),
        ("bad name", ECHO_SCHEMA, "invalid tool name"),
        ("", ECHO_SCHEMA, "invalid tool name"),
        ("x" * 65, ECHO_SCHEMA, "invalid tool name"),
    ],
)
def test_bad_definitions_are_configuration_errors(name: str, parameters: Any, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        FunctionTool(_echo, name=name, description="", parameters=parameters)


def test_definition_is_a_private_copy() -> None:
    schema = json.loads(json.dumps(ECHO_SCHEMA))
    echo = FunctionTool(_echo, name="echo", description="d", parameters=schema)
    digest = echo.definition_digest()
    schema["properties"]["text"]["maxLength"] = 99
    definition = echo.definition()
    definition["parameters"]["required"].append("zzz")
    assert echo.definition()["parameters"] == ECHO_SCHEMA
    assert echo.definition_digest() == digest == tool_definition_digest(echo.definition())


def test_decorator_and_results() -> None:
    @tool(parameters=ECHO_SCHEMA)
    def shout(arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        """Shout the text."""
        return ToolResult(str(arguments["text"]).upper(), metadata={"n": 1})

    @tool
    def noop(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return "ok"

    assert isinstance(shout, FunctionTool)
    assert (shout.name, shout.description, shout.replay) == (
        "shout",
        "Shout the text.",
        Replay.NEVER,
    )
    result = shout.run({"text": "hi"}, ToolContext(Path("/"), "op"))
    assert result == ToolResult("HI", metadata={"n": 1})
    with pytest.raises(TypeError):
        result.metadata["n"] = 2  # type: ignore[index]
    assert noop.definition()["parameters"]["properties"] == {}
    assert ToolResult.error("Error: x", code=3) == ToolResult("Error: x", True, {"code": 3})


def test_context_checks() -> None:
    with pytest.raises(ValueError):
        ToolContext(Path("relative"), "op")
    with pytest.raises(ValueError):
        ToolContext(Path("/"), "op", timeout=0)
    assert not ToolContext(Path("/"), "op").cancel.is_set()
    assert isinstance(ToolContext(Path("/"), "op").cancel, type(threading.Event()))


def test_uninitialised_tools_are_refused() -> None:
    class Lazy(Tool):
        name = "lazy"
        description = ""
        parameters = ECHO_SCHEMA

        def __init__(self) -> None:  # forgets super().__init__()
            pass

        def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
            return ToolResult("")

    with pytest.raises(ConfigurationError, match="not initialised"):
        ToolRegistry([Lazy()])


# Pinned: changing a built-in definition changes every configurationDigest, which blocks
# recovery of sessions started with the old definitions (spec 14.4 rule 5). Update these
# deliberately, together with the replay key version when the semantics change.
BUILTIN_DIGESTS = {
    "read": "sha256:245e3e15946f626e00c96b11d145d13689fb7b054b14d618550475c169df91a4",
    "bash": "sha256:900800a878e416b936838bdde8b5f847ab98f60bf2a81091696bd845731b1895",
    "write": "sha256:3ab60860c230c90bdf3a7e4d00f2ae8d1078341e1b67eab8191249558c03d9ee",
    "edit": "sha256:382001bbfe0b62064f0170c4a9d649bf949f342e0f2056773f39c75bdc7b784f",
}


def test_definition_digests_are_stable_across_runs() -> None:
    here = {t.name: t.definition_digest() for t in builtin_tools()}
    assert here == BUILTIN_DIGESTS
    code = (
        "import json; from tether._tools import builtin_tools;"
        "print(json.dumps({t.name: t.definition_digest() for t in builtin_tools()}))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == here


def test_builtin_schemas_are_valid_json_schema() -> None:
    # Tool construction checks a schema against the metaschema for user tools only (the
    # check and the jsonschema import cost every start and resume): the built-ins' schemas
    # are tether's own, so they are checked here, with every variant tether builds.
    from jsonschema import Draft202012Validator

    from tether._completion.verify import VerifyTool

    tools = [
        *builtin_tools(),
        *builtin_tools(pass_env=("PATH", "HOME")),
        VerifyTool(lambda: pytest.fail("not called")),
    ]
    for each in tools:
        assert type(each).__module__ in BUILTIN_MODULES, each
        Draft202012Validator.check_schema(each.definition()["parameters"])
    assert {t.name for t in tools} == {*BUILTIN_DIGESTS, "verify"}


def test_a_user_tools_schema_is_still_checked_at_construction() -> None:
    class Broken(Tool):
        name = "broken"
        description = "a schema with a wrong keyword type"
        parameters: ClassVar = {"type": "object", "properties": {"n": {"type": "nonsense"}}}

        def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
            raise NotImplementedError

    with pytest.raises(ConfigurationError, match="not a valid JSON Schema"):
        Broken()


def test_tether_state_is_out_of_reach(tmp_path: Path) -> None:
    from tether._tools.workspace import relative_parts
    from tether.errors import WorkspaceEscape

    for path in (".tether/effects.db", "./.tether/sessions/x.jsonl", ".tether"):
        with pytest.raises(WorkspaceEscape, match="tether's own state"):
            relative_parts(path)
    assert relative_parts("sub/.tether/x") == ("sub", ".tether", "x")


def test_built_in_tools_built_again_share_one_definition_and_its_digest_is_still_right() -> None:
    """A worker builds the tools once per session in flight: the built-ins' definitions
    (tether's own constants) are digested once, and each digest is the one spec 10.5 gives."""
    from tether._tools.builtin import builtin_tools

    first, again = builtin_tools(), builtin_tools()
    for one, other in zip(first, again, strict=True):
        assert one._definition is other._definition
        assert one.definition_digest() == tool_definition_digest(one.definition())
    bash = again[1]
    bash.confine(" Commands run in a sandbox.")
    assert bash.definition()["description"].endswith(" Commands run in a sandbox.")
    assert bash.definition_digest() == tool_definition_digest(bash.definition())
    assert first[1].definition_digest() != bash.definition_digest()  # the other kept its own
    copy = first[0].definition()
    copy["parameters"]["properties"].clear()  # a caller's copy: the shared one is untouched
    assert builtin_tools()[0].definition()["parameters"]["properties"]
