"""One workspace root for every command, as real ``python -m tether`` processes.

Every command looks upward from the current directory for ``tether.toml`` or ``.tether/``
and stops at the filesystem root or at a git top level; ``--workspace DIR`` skips the
search. These tests start the CLI in subfolders of a temporary tree and check which
policy applied, where the session landed, and the one ``workspace: …`` line on stderr.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from test_cli_run import cli_env, json_lines, run_cli, script
from tether._project import choose_root, find_workspace_root, load_project_config
from tether.errors import ConfigurationError, ProjectConfigError

DENY_RM = """\
[[policy.bash]]
pattern = "*rm -rf*"
decision = "deny"
reason = "no recursive deletes"
"""


def scripted(root: Path, responses: list[dict[str, Any]]) -> str:
    """``--model`` for a script written into ``root``, by absolute path (any cwd works)."""
    script(root, responses)
    return f"scripted:{root / 'script.json'}"


def rm_then_done(root: Path) -> str:
    """A script (in ``root``) that asks for ``rm -rf build`` and then answers."""
    return scripted(
        root,
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "rm -rf build"}}]},
            {"content": "done"},
        ],
    )


def sessions_under(folder: Path) -> list[Path]:
    return sorted((folder / ".tether" / "sessions").glob("*.jsonl"))


def notice_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("workspace: ")]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """``root/`` with a ``tether.toml`` denying ``rm -rf``, ``root/a/b/``, and a ``build/``
    folder at both levels."""
    root = tmp_path / "root"
    deep = root / "a" / "b"
    deep.mkdir(parents=True)
    (root / "tether.toml").write_text(DENY_RM)
    for where in (root, deep):
        (where / "build").mkdir()
        (where / "build" / "keep.txt").write_text("keep me\n")
    return root.resolve()


def test_a_deny_rule_holds_two_levels_down(tree: Path) -> None:
    deep = tree / "a" / "b"
    model = rm_then_done(tree)
    result = run_cli("run", "clean up", "--model", model, cwd=deep)
    assert result.returncode == 0, result.stderr
    # The denied command did not run, neither in the root nor in the subfolder.
    assert (deep / "build" / "keep.txt").read_text() == "keep me\n"
    assert (tree / "build" / "keep.txt").read_text() == "keep me\n"
    assert "rm -rf build (denied by the policy, not run)" in result.stderr
    # tether's state is the root's: no second .tether/ in the subfolder.
    assert not (deep / ".tether").exists()
    assert not (tree / "a" / ".tether").exists()
    [log] = sessions_under(tree)
    assert log.stem.split("_", 1)[1] in result.stderr
    # Exactly one line says which root is used, and why.
    assert notice_lines(result.stderr) == [
        f"workspace: {tree} (found tether.toml above the current directory)"
    ]


def test_the_commands_of_a_subfolder_see_the_roots_state(tree: Path) -> None:
    deep = tree / "a" / "b"
    model = rm_then_done(tree)
    first = run_cli("run", "clean up", "--model", model, "--json", cwd=deep)
    assert first.returncode == 0, first.stderr
    session_id = json_lines(first.stdout)[-1]["sessionId"]
    # --json keeps stdout pure JSON; the notice is on stderr.
    assert notice_lines(first.stderr) == [
        f"workspace: {tree} (found tether.toml above the current directory)"
    ]
    listed = run_cli("sessions", "--json", cwd=deep)
    assert listed.returncode == 0, listed.stderr
    assert [s["id"] for s in json.loads(listed.stdout)] == [session_id]
    assert len(notice_lines(listed.stderr)) == 1
    shown = run_cli("inspect", "--json", session_id[:13], cwd=deep)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"]["header"]["id"] == session_id
    resumed = run_cli("resume", session_id, "--model", model, cwd=deep)
    assert resumed.returncode == 0, resumed.stderr
    decisions = run_cli("authorizations", "--json", cwd=deep)
    assert decisions.returncode == 0, decisions.stderr
    [decision] = json.loads(decisions.stdout)
    assert (decision["decision"], decision["sessionId"]) == ("deny", session_id)
    review = run_cli("review", "--json", cwd=deep)
    assert review.returncode == 0, review.stderr
    assert json.loads(review.stdout) == []
    assert not (deep / ".tether").exists()


def test_verify_from_a_subfolder_runs_the_roots_check_in_the_root(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    (root / "src").mkdir(parents=True)
    (root / "tether.toml").write_text('[verify]\ncommand = "test -f tether.toml"\n')
    result = run_cli("verify", cwd=root / "src")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("PASSED: `test -f tether.toml` exited 0")
    assert (root / ".tether" / "effects.db").exists()
    assert not (root / "src" / ".tether").exists()
    status = run_cli("verify", "--status", "--json", cwd=root / "src")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["status"] == "verified"


def test_an_existing_tether_folder_marks_the_root_too(tmp_path: Path) -> None:
    root = tmp_path / "r"
    (root / ".tether").mkdir(parents=True)
    (root / "x").mkdir()
    model = scripted(root, [{"content": "hi"}])
    result = run_cli("run", "hello", "--model", model, cwd=root / "x")
    assert result.returncode == 0, result.stderr
    assert notice_lines(result.stderr) == [
        f"workspace: {root.resolve()} (found .tether/ above the current directory)"
    ]
    assert len(sessions_under(root)) == 1
    assert not (root / "x" / ".tether").exists()


def test_workspace_flag_overrides_the_search(tree: Path, tmp_path: Path) -> None:
    deep = tree / "a" / "b"
    model = rm_then_done(tree)
    result = run_cli("run", "clean up", "--model", model, "--workspace", ".", cwd=deep)
    assert result.returncode == 0, result.stderr
    # The subfolder is the workspace: the root's policy does not apply there.
    assert not (deep / "build").exists()
    assert (tree / "build" / "keep.txt").exists()
    assert len(sessions_under(deep)) == 1
    assert notice_lines(result.stderr) == []


def test_a_git_top_level_stops_the_search(tree: Path) -> None:
    repo = tree / "a"
    (repo / ".git").mkdir()
    deep = repo / "b"
    model = rm_then_done(tree)
    result = run_cli("run", "clean up", "--model", model, cwd=deep)
    assert result.returncode == 0, result.stderr
    # tether.toml above the repository is not used: nothing denies, nothing was found,
    # so the current directory is the workspace (today's behaviour) and no line says so.
    assert not (deep / "build").exists()
    assert len(sessions_under(deep)) == 1
    assert not (repo / ".tether").exists() and not sessions_under(tree)
    assert notice_lines(result.stderr) == []


def test_the_git_top_level_itself_can_be_the_root(tree: Path) -> None:
    repo = tree / "a"
    (repo / ".git").write_text("gitdir: /somewhere/else\n")  # a worktree's .git is a file
    (repo / "tether.toml").write_text(DENY_RM)
    deep = repo / "b"
    model = rm_then_done(tree)
    result = run_cli("run", "clean up", "--model", model, cwd=deep)
    assert result.returncode == 0, result.stderr
    assert (deep / "build" / "keep.txt").exists()
    assert len(sessions_under(repo)) == 1
    assert notice_lines(result.stderr) == [
        f"workspace: {repo} (found tether.toml above the current directory)"
    ]


def test_no_line_when_the_root_is_the_current_directory(tree: Path) -> None:
    model = rm_then_done(tree)
    result = run_cli("run", "clean up", "--model", model, cwd=tree)
    assert result.returncode == 0, result.stderr
    assert (tree / "build" / "keep.txt").exists()
    assert notice_lines(result.stderr) == []


# --------------------------------------------------------------------------- the rule itself


def levels(*spec: tuple[str, set[str]]) -> list[tuple[Path, frozenset[str]]]:
    return [(Path(name), frozenset(names)) for name, names in spec]


def test_choose_root_takes_the_nearest_marker() -> None:
    assert choose_root(levels(("/a/b", set()), ("/a", {".tether"}), ("/", {"tether.toml"}))) == (
        Path("/a"),
        ".tether",
    )
    assert choose_root(levels(("/a", {".tether", "tether.toml"}))) == (Path("/a"), "tether.toml")
    assert choose_root(levels(("/a/b", set()), ("/a", set()), ("/", set()))) is None
    assert choose_root([]) is None


def test_choose_root_stops_at_a_git_top_level() -> None:
    # The top level itself may be the root; nothing above it is looked at.
    assert choose_root(levels(("/r/x", set()), ("/r", {".git", "tether.toml"}))) == (
        Path("/r"),
        "tether.toml",
    )
    assert choose_root(levels(("/r/x", set()), ("/r", {".git"}), ("/", {"tether.toml"}))) is None
    # A nested repository (a submodule) stops the search at its own top level.
    assert choose_root(levels(("/r/sub", {".git"}), ("/r", {".git", "tether.toml"}))) is None


def test_choose_root_reads_no_level_past_the_deciding_one() -> None:
    def lazy() -> Iterator[tuple[Path, frozenset[str]]]:
        yield Path("/r/x"), frozenset()
        yield Path("/r"), frozenset({".git"})
        raise AssertionError("looked above the git top level")

    assert choose_root(lazy()) is None


def test_find_workspace_root_on_disk(tmp_path: Path) -> None:
    root = (tmp_path / "w").resolve()
    (root / "a" / "b").mkdir(parents=True)
    found = find_workspace_root(start=root / "a" / "b")
    assert (found.marker, found.explicit) == (None, False)
    assert found.path == found.start == root / "a" / "b"
    assert found.notice is None
    # A broken tether.toml (here a dangling link) still marks the root: loading it then
    # fails loudly instead of a policy higher up being used silently.
    (root / "tether.toml").symlink_to(root / "missing.toml")
    found = find_workspace_root(start=root / "a" / "b")
    assert (found.path, found.marker) == (root, "tether.toml")
    assert found.notice == f"workspace: {root} (found tether.toml above the current directory)"
    with pytest.raises(ProjectConfigError, match="symbolic link to a missing file"):
        load_project_config(found.path)
    assert find_workspace_root(start=root).notice is None  # the root is the start


def test_an_explicit_workspace_is_not_searched(tmp_path: Path) -> None:
    (tmp_path / "tether.toml").write_text("")
    (tmp_path / "sub").mkdir()
    chosen = find_workspace_root(tmp_path / "sub", start=tmp_path)
    assert (chosen.path, chosen.explicit, chosen.marker) == (
        (tmp_path / "sub").resolve(),
        True,
        None,
    )
    assert chosen.notice is None
    with pytest.raises(ConfigurationError, match="workspace 'nope' is not a directory"):
        find_workspace_root("nope", start=tmp_path)


def test_a_bad_workspace_flag_is_one_line_exit_2(tree: Path) -> None:
    result = run_cli("verify", "--workspace", "missing", cwd=tree)
    assert result.returncode == 2
    assert result.stderr == "error: workspace 'missing' is not a directory\n"


def test_a_vanished_current_directory_is_one_line_exit_2(tmp_path: Path) -> None:
    command = f"mkdir gone && cd gone && rmdir ../gone && exec {sys.executable} -m tether sessions"
    result = subprocess.run(
        ["sh", "-c", command],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr == "error: the current directory no longer exists\n"


def test_the_tether_folder_is_ignored_by_git(tmp_path: Path) -> None:
    # `git add .` in a workspace must not pick up transcripts or the effects database.
    import shutil

    from tether._stores.file import SessionStore
    from tether._wsdb.sqlite import EffectsDB

    for make in ("store", "database"):
        ws = tmp_path / make
        ws.mkdir()
        if make == "store":
            SessionStore.create(ws, provider="p", model="m", environment_identity="e").close()
        else:
            EffectsDB.open_workspace(ws).close()
        ignore = ws / ".tether" / ".gitignore"
        assert ignore.read_text().splitlines()[-1] == "*"
        if shutil.which("git"):
            subprocess.run(["git", "init", "-q", str(ws)], check=True)
            listed = subprocess.run(
                ["git", "-C", str(ws), "ls-files", "--others", "--exclude-standard"],
                capture_output=True,
                text=True,
                check=True,
            )
            assert listed.stdout == "", listed.stdout
    # A .gitignore the user put there is never replaced.
    ws = tmp_path / "own"
    (ws / ".tether").mkdir(parents=True)
    (ws / ".tether" / ".gitignore").write_text("mine\n")
    EffectsDB.open_workspace(ws).close()
    assert (ws / ".tether" / ".gitignore").read_text() == "mine\n"
