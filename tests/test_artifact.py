"""Artifact versions: what is included, digests, the stat cache, the racy-mtime rule,
the persisted cache and manifests. Real files in temporary directories; real git
repositories when git is installed."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether._completion import artifact
from tether._completion.artifact import (
    DEFAULT_IGNORES,
    EMPTY_DIGEST,
    ArtifactScanner,
    ArtifactVersion,
    from_manifest,
    to_manifest,
)
from tether.errors import ArtifactError, ConfigurationError

HAVE_GIT = shutil.which("git") is not None
needs_git = pytest.mark.skipif(not HAVE_GIT, reason="git is not installed")
not_root = pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads files whatever their mode"
)
HOUR_NS = 3600 * 10**9


# --------------------------------------------------------------------------- helpers


def write(root: Path, rel: str, data: bytes | str = b"x") -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def listing_digest(files: dict[bytes, str]) -> str:
    return sha(b"".join(p + b"\0" + d.encode() + b"\n" for p, d in sorted(files.items())))


_DEFAULT_DIRS = {b"__pycache__", b".pytest_cache", b".mypy_cache", b".ruff_cache", b".git"}


def reference(root: Path) -> str:
    """An independent, plain implementation of the walk-mode digest (default ignores)."""
    files: dict[bytes, str] = {}

    def visit(directory: bytes, rel: bytes) -> None:
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            sub = rel + name
            is_dir = os.path.isdir(path) and not os.path.islink(path)
            if name == b".git" or name.endswith(b".pyc"):
                continue
            if is_dir and (name in _DEFAULT_DIRS or (not rel and name == b".tether")):
                continue
            if os.path.islink(path):
                files[sub] = sha(b"symlink\0" + os.readlink(path))
            elif is_dir:
                visit(path, sub + b"/")
            elif os.path.isfile(path):
                with open(path, "rb") as fh:
                    files[sub] = sha(fh.read())

    visit(os.fsencode(root), b"")
    return listing_digest(files)


def scan(root: Path, **kwargs: Any) -> ArtifactVersion:
    kwargs.setdefault("use_git", False)
    return ArtifactScanner(root, **kwargs).version()


@contextmanager
def clock_ahead(ns: int = HOUR_NS) -> Iterator[None]:
    """Pretend every file is old enough to be trusted from the cache (no racy entries)."""
    with mock.patch.object(artifact, "_now_ns", lambda: time.time_ns() + ns):
        yield


@contextmanager
def count_hashes() -> Iterator[list[str]]:
    """Record the relative path of every entry the scanner reads and hashes."""
    seen: list[str] = []
    real = artifact._hash_entry

    def counting(root: str, rel: str, mode: int) -> str | None:
        seen.append(rel)
        return real(root, rel, mode)

    with mock.patch.object(artifact, "_hash_entry", counting):
        yield seen


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    done = subprocess.run(
        ["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=True
    )
    return done.stdout


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


# --------------------------------------------------------------------------- digests


def test_same_content_same_digest_in_different_directories(tmp_path: Path) -> None:
    for name in ("one", "two"):
        root = tmp_path / name
        write(root, "README.md", "hello\n")
        write(root, "src/pkg/mod.py", "print('hi')\n")
        write(root, "src/pkg/empty.txt", b"")
        (root / "link").symlink_to("src/pkg/mod.py")
    one, two = scan(tmp_path / "one"), scan(tmp_path / "two")
    assert one == two and one.digest == two.digest
    assert sorted(one.files) == ["README.md", "link", "src/pkg/empty.txt", "src/pkg/mod.py"]
    assert one.files["src/pkg/empty.txt"] == sha(b"")
    assert one.files["README.md"] == sha(b"hello\n")
    assert one.digest == reference(tmp_path / "one")
    assert one.digest.startswith("sha256:") and len(one.digest) == 7 + 64


def test_empty_workspace_has_a_well_defined_version(ws: Path) -> None:
    version = scan(ws)
    assert version.digest == EMPTY_DIGEST == sha(b"")
    assert dict(version.files) == {}
    (ws / ".tether").mkdir()
    write(ws, "__pycache__/m.cpython-311.pyc")
    assert scan(ws).digest == EMPTY_DIGEST


def test_canonical_listing_is_documented_format(ws: Path) -> None:
    write(ws, "b", "2")
    write(ws, "a/z", "1")
    write(ws, "a-b", "3")  # '-' sorts before '/': "a-b" < "a/z"
    expected = listing_digest({b"a-b": sha(b"3"), b"a/z": sha(b"1"), b"b": sha(b"2")})
    assert scan(ws).digest == expected


def test_edit_changes_version_and_changed_since_names_it(ws: Path) -> None:
    write(ws, "a.txt", "one")
    write(ws, "dir/b.txt", "two")
    scanner = ArtifactScanner(ws, use_git=False)
    before = scanner.version()
    write(ws, "dir/b.txt", "TWO!")
    after = scanner.version()
    assert after.digest != before.digest
    assert after.changed_since(before) == ["dir/b.txt"]
    assert before.changed_since(after) == ["dir/b.txt"]
    assert after.changed_since(after) == []
    assert after == scan(ws)


def test_add_and_remove_are_reported(ws: Path) -> None:
    write(ws, "keep", "k")
    write(ws, "gone/old.txt", "o")
    scanner = ArtifactScanner(ws, use_git=False)
    before = scanner.version()
    (ws / "gone" / "old.txt").unlink()
    write(ws, "new/z.txt", "n")
    write(ws, "0first", "f")
    after = scanner.version()
    assert after.changed_since(before) == ["0first", "gone/old.txt", "new/z.txt"]
    assert set(after.files) == {"keep", "new/z.txt", "0first"}


def test_version_object_is_read_only_and_compact(ws: Path) -> None:
    write(ws, "a", "1")
    version = scan(ws)
    with pytest.raises(TypeError):
        version.files["a"] = "x"  # type: ignore[index]
    with pytest.raises(AttributeError):
        version.digest = "x"  # type: ignore[misc]
    assert "1 files" in repr(version) and version.digest in repr(version)
    assert hash(version) == hash(ArtifactVersion(version.digest, dict(version.files)))
    plain = {"a": sha(b"1")}
    made = ArtifactVersion(version.digest, plain)
    plain["b"] = "sha256:" + "0" * 64
    assert dict(made.files) == {"a": sha(b"1")}  # the caller's dict was copied
    assert made == version and made != object()


# --------------------------------------------------------------------------- what is included


def test_tether_dir_git_dir_and_default_ignores_are_excluded(ws: Path) -> None:
    write(ws, "src/m.py", "code")
    write(ws, ".tether/sessions/s.jsonl", "log")
    write(ws, ".git/HEAD", "ref")
    write(ws, "vendor/.git/config", "x")
    write(ws, "src/__pycache__/m.cpython-311.pyc", "pyc")
    write(ws, "stray.pyc", "pyc")
    write(ws, ".pytest_cache/v/cache/lastfailed", "{}")
    write(ws, "sub/.mypy_cache/x.json", "{}")
    write(ws, ".ruff_cache/0.1/x", "r")
    write(ws, "sub/.tether/not-root", "kept")  # .tether is excluded at the root only
    write(ws, "pycache_like/__pycache__.txt", "kept")  # a file, not the directory
    assert sorted(scan(ws).files) == [
        "pycache_like/__pycache__.txt",
        "src/m.py",
        "sub/.tether/not-root",
    ]
    assert DEFAULT_IGNORES == (
        "__pycache__/",
        "*.pyc",
        ".pytest_cache/",
        ".mypy_cache/",
        ".ruff_cache/",
    )


def test_running_a_check_that_writes_caches_does_not_change_the_version(ws: Path) -> None:
    write(ws, "m.py", "x = 1\n")
    before = scan(ws)
    write(ws, "__pycache__/m.cpython-311.pyc", b"\0compiled")
    write(ws, ".pytest_cache/README.md", "cache")
    assert scan(ws).digest == before.digest


def test_user_patterns_basename_dir_only_and_rooted(ws: Path) -> None:
    for rel in (
        "app.log",
        "deep/er/trace.log",
        "build/out.o",  # dir-only "build/": the directory at any depth
        "lib/build/x.o",
        "notes/build",  # a *file* named build is kept
        "dist/bundle.js",  # rooted "/dist": only at the root
        "pkg/dist/keep.js",
        "docs/a.tmp",  # rooted glob "docs/*.tmp"
        "docs/a.md",
        "other/a.tmp",
        "secret.txt",  # exact basename, any depth
        "x/secret.txt",
        "gen/a/b.py",  # "gen/a/" rooted, dir only
        "gen/c.py",
        "src/main.py",
    ):
        write(ws, rel, rel)
    ignore = ["*.log", "build/", "/dist", "docs/*.tmp", "secret.txt", "/gen//a/"]
    assert sorted(scan(ws, ignore=ignore).files) == [
        "docs/a.md",
        "gen/c.py",
        "notes/build",
        "other/a.tmp",
        "pkg/dist/keep.js",
        "src/main.py",
    ]


def test_pattern_question_mark_and_brackets(ws: Path) -> None:
    for rel in ("a1.txt", "a2.txt", "ab.txt", "k/v9", "k/vv"):
        write(ws, rel)
    version = scan(ws, ignore=["a[0-9].txt", "k/v?"])
    assert sorted(version.files) == ["ab.txt"]


@pytest.mark.parametrize("bad", ["", "/", "//", "!keep.txt", "a\0b", 3, None])
def test_bad_ignore_patterns_are_configuration_errors(ws: Path, bad: Any) -> None:
    with pytest.raises(ConfigurationError):
        ArtifactScanner(ws, ignore=[bad])


def test_ignore_must_be_a_sequence_of_patterns(ws: Path) -> None:
    with pytest.raises(ConfigurationError):
        ArtifactScanner(ws, ignore="*.log")


def test_symlinks_are_not_followed_and_their_target_text_matters(tmp_path: Path, ws: Path) -> None:
    outside = write(tmp_path, "outside/data.txt", "secret v1")
    write(tmp_path, "outside/dir/inner.txt", "inner")
    (ws / "to_file").symlink_to(outside)
    (ws / "to_dir").symlink_to(tmp_path / "outside" / "dir")
    (ws / "dangling").symlink_to("nowhere")
    scanner = ArtifactScanner(ws, use_git=False)
    first = scanner.version()
    assert sorted(first.files) == ["dangling", "to_dir", "to_file"]  # to_dir/ not walked
    assert first.files["to_file"] == sha(b"symlink\0" + os.fsencode(outside))
    assert first.files["dangling"] == sha(b"symlink\0nowhere")
    outside.write_text("secret v2")  # the target's content is not part of the version
    assert scanner.version().digest == first.digest
    (ws / "dangling").unlink()
    (ws / "dangling").symlink_to("elsewhere")
    assert scanner.version().changed_since(first) == ["dangling"]


def test_symlink_digest_cannot_collide_with_a_file(ws: Path) -> None:
    write(ws, "f", "target")
    (ws / "l").symlink_to("target")
    version = scan(ws)
    assert version.files["f"] != version.files["l"]


def test_symlink_to_directory_does_not_match_dir_only_pattern(tmp_path: Path, ws: Path) -> None:
    (tmp_path / "real").mkdir()
    (ws / "build").symlink_to(tmp_path / "real")
    assert list(scan(ws, ignore=["build/"]).files) == ["build"]
    assert list(scan(ws, ignore=["build"]).files) == []


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_fifo_is_skipped_not_opened(ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    write(ws, "a", "1")
    scanner = ArtifactScanner(ws, use_git=False)
    assert list(scanner.version().files) == ["a"]
    with clock_ahead():
        assert list(scanner.version().files) == ["a"]
        cache = ws.parent / "artifact.cache"
        first = scan(ws, cache_path=cache)
        with count_hashes() as read:
            assert scan(ws, cache_path=cache) == first
            assert list(scan(ws, cache_path=cache).files) == ["a"]
        assert read == []


def test_non_utf8_file_name_hashes_raw_bytes(ws: Path) -> None:
    raw = b"caf\xe9.txt"
    with open(os.path.join(os.fsencode(ws), raw), "wb") as fh:
        fh.write(b"latin-1 name")
    write(ws, "plain", "p")
    version = scan(ws)
    key = os.fsdecode(raw)
    assert version.files[key] == sha(b"latin-1 name")
    assert version.digest == reference(ws)
    assert version.digest == listing_digest({raw: sha(b"latin-1 name"), b"plain": sha(b"p")})
    copy = from_manifest(version.digest, to_manifest(version))
    assert copy == version
    cache = ws.parent / "artifact.cache"
    with clock_ahead():
        assert scan(ws, cache_path=cache) == version
        with count_hashes() as read:  # the undecodable name is left out of the cache file
            assert scan(ws, cache_path=cache) == version
    assert read == [key]


def test_unicode_names_sort_by_utf8_bytes(ws: Path) -> None:
    for name in ("z", "é", "\U0001f600", "\uffff", "a/b", "a-b"):
        write(ws, name, name)
    assert scan(ws).digest == reference(ws)


# --------------------------------------------------------------------------- errors


@not_root
def test_unreadable_file_is_an_error_naming_it(ws: Path) -> None:
    path = write(ws, "dir/locked.txt", "x")
    path.chmod(0)
    try:
        with pytest.raises(ArtifactError, match=r"'dir/locked\.txt'"):
            scan(ws)
    finally:
        path.chmod(0o600)


@not_root
def test_unreadable_directory_is_an_error_naming_it(ws: Path) -> None:
    write(ws, "closed/x", "x")
    (ws / "closed").chmod(0)
    try:
        with pytest.raises(ArtifactError, match="'closed'"):
            scan(ws)
    finally:
        (ws / "closed").chmod(0o700)


def test_permission_denied_is_an_error_naming_the_file_even_as_root(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(ws, "ok.txt", "fine")
    write(ws, "sub/denied.txt", "no")
    real_open = os.open

    def fake_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path).endswith("denied.txt"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(artifact.os, "open", fake_open)
    with pytest.raises(ArtifactError) as caught:
        scan(ws)
    message = str(caught.value)
    assert "'sub/denied.txt'" in message and "Permission denied" in message
    assert "\n" not in message
    assert caught.value.exit_code == 30


def test_unreadable_directory_is_an_error_even_as_root(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(ws, "open/x", "x")
    write(ws, "a/closed/y", "y")
    real_scandir = os.scandir

    def fake_scandir(path: Any) -> Any:
        if os.fspath(path).endswith("closed"):
            raise PermissionError(13, "Permission denied", path)
        return real_scandir(path)

    monkeypatch.setattr(artifact.os, "scandir", fake_scandir)
    with pytest.raises(ArtifactError, match=r"cannot read 'a/closed' .*Permission denied"):
        scan(ws)


def test_file_vanishing_mid_scan_is_skipped(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(ws, "stays", "s")
    write(ws, "goes", "g")
    real_walk = artifact._walk

    def walk_then_delete(*args: Any) -> None:
        real_walk(*args)
        (ws / "goes").unlink()

    monkeypatch.setattr(artifact, "_walk", walk_then_delete)
    scanner = ArtifactScanner(ws, use_git=False)
    assert list(scanner.version().files) == ["stays"]
    monkeypatch.setattr(artifact, "_walk", real_walk)
    assert list(scanner.version().files) == ["stays"]


def test_workspace_that_is_not_a_directory(tmp_path: Path) -> None:
    afile = write(tmp_path, "file.txt", "x")
    with pytest.raises(ArtifactError, match="not a directory"):
        ArtifactScanner(afile)
    with pytest.raises(ArtifactError, match="not a directory"):
        ArtifactScanner(tmp_path / "missing")
    root = tmp_path / "later"
    root.mkdir()
    scanner = ArtifactScanner(root, use_git=False)
    root.rmdir()
    with pytest.raises(ArtifactError, match="not a directory"):
        scanner.version()


# --------------------------------------------------------------------------- the cache


def test_unchanged_tree_returns_the_same_object_without_reading(ws: Path) -> None:
    write(ws, "a", "1")
    write(ws, "d/b", "2")
    (ws / "l").symlink_to("a")
    scanner = ArtifactScanner(ws, use_git=False)
    with clock_ahead():
        first = scanner.version()
        with count_hashes() as read:
            assert scanner.version() is first
            assert scanner.version() is first
        assert read == []
        write(ws, "d/b", "22")
        with count_hashes() as read:
            second = scanner.version()
        assert read == ["d/b"]
    assert second.changed_since(first) == ["d/b"]


def test_racy_files_are_read_again_until_old_enough(ws: Path) -> None:
    write(ws, "fresh", "new")
    scanner = ArtifactScanner(ws, use_git=False)
    with count_hashes() as read:
        scanner.version()
        scanner.version()  # just written: its mtime is within the racy margin
    assert read == ["fresh", "fresh"]
    with clock_ahead(), count_hashes() as read:
        scanner.version()  # now trusted (digest recorded), then reused
        scanner.version()
    assert read == ["fresh"]


def test_racy_same_size_rewrite_with_restored_mtime_changes_version(ws: Path) -> None:
    path = write(ws, "f.txt", "aaaa")
    old = path.stat()
    scanner = ArtifactScanner(ws, use_git=False)
    first = scanner.version()
    path.write_bytes(b"bbbb")  # same size, same second
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert path.stat().st_mtime_ns == old.st_mtime_ns and path.stat().st_size == old.st_size
    second = scanner.version()
    assert second.digest != first.digest
    assert second.files["f.txt"] == sha(b"bbbb")


def test_restored_mtime_is_noticed_through_ctime_even_when_trusted(ws: Path) -> None:
    path = write(ws, "f.txt", "aaaa")
    os.utime(path, ns=(10**18, 10**18))  # an old-looking mtime
    scanner = ArtifactScanner(ws, use_git=False)
    with clock_ahead():
        first = scanner.version()
        time.sleep(0.02)  # past one clock tick, so the ctime differs
        path.write_bytes(b"bbbb")
        os.utime(path, ns=(10**18, 10**18))
        assert scanner.version().changed_since(first) == ["f.txt"]


def test_persisted_cache_roundtrip_starts_warm(tmp_path: Path, ws: Path) -> None:
    write(ws, "a", "1")
    write(ws, "d/b", "2")
    (ws / "l").symlink_to("a")
    cache = tmp_path / "state" / "artifact.cache"
    cache.parent.mkdir()
    with clock_ahead():
        first = ArtifactScanner(ws, cache_path=cache, use_git=False).version()
        assert stat.S_IMODE(cache.stat().st_mode) == 0o600
        with count_hashes() as read:
            again = ArtifactScanner(ws, cache_path=cache, use_git=False).version()
        assert read == [] and again == first
        write(ws, "d/b", "changed")
        write(ws, "c", "3")
        with count_hashes() as read:
            third = ArtifactScanner(ws, cache_path=cache, use_git=False).version()
        assert sorted(read) == ["c", "d/b"]
    assert third == scan(ws) and third.changed_since(first) == ["c", "d/b"]
    assert [p.name for p in cache.parent.iterdir()] == ["artifact.cache"]  # no temp files


def test_persisted_cache_keeps_racy_entries_out(tmp_path: Path, ws: Path) -> None:
    write(ws, "fresh", "x")
    cache = tmp_path / "artifact.cache"
    ArtifactScanner(ws, cache_path=cache, use_git=False).version()
    with count_hashes() as read:
        ArtifactScanner(ws, cache_path=cache, use_git=False).version()
    assert read == ["fresh"]


def _corruptions(data: bytes) -> list[bytes]:
    flipped = bytearray(data)
    flipped[-5] ^= 0x01
    payload = data[data.index(b"\n", len(b"tether-artifact-cache 1\n")) + 1 :]
    return [
        b"",
        b"garbage",
        data[: len(data) // 2],
        bytes(flipped),
        data.replace(b"tether-artifact-cache 1", b"tether-artifact-cache 9"),
        b"tether-artifact-cache 1\n" + b"0" * 64 + b"\n" + payload,  # wrong checksum
    ]


def test_corrupt_cache_file_is_ignored(tmp_path: Path, ws: Path) -> None:
    write(ws, "a", "1")
    write(ws, "b", "2")
    cache = tmp_path / "artifact.cache"
    with clock_ahead():
        good = ArtifactScanner(ws, cache_path=cache, use_git=False).version()
    data = cache.read_bytes()
    for bad in _corruptions(data):
        cache.write_bytes(bad)
        with clock_ahead(), count_hashes() as read:
            assert ArtifactScanner(ws, cache_path=cache, use_git=False).version() == good
        assert sorted(read) == ["a", "b"]  # started cold


def test_forged_cache_with_valid_checksum_but_bad_types_is_ignored(
    tmp_path: Path, ws: Path
) -> None:
    write(ws, "a", "1")
    cache = tmp_path / "artifact.cache"
    with clock_ahead():
        good = ArtifactScanner(ws, cache_path=cache, use_git=False).version()
    magic = b"tether-artifact-cache 1\n"
    document = orjson.loads(cache.read_bytes()[len(magic) + 65 :])
    document["columns"][6] = [12345]  # a digest that is not a string
    payload = orjson.dumps(document)
    cache.write_bytes(magic + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
    with clock_ahead():
        assert ArtifactScanner(ws, cache_path=cache, use_git=False).version() == good


def test_cache_of_another_workspace_is_ignored(tmp_path: Path) -> None:
    cache = tmp_path / "artifact.cache"
    one, two = tmp_path / "one", tmp_path / "two"
    write(one, "f", "same name, other content")
    write(two, "f", "same name, OTHER CONTENT")
    with clock_ahead():
        ArtifactScanner(one, cache_path=cache, use_git=False).version()
        with count_hashes() as read:
            version = ArtifactScanner(two, cache_path=cache, use_git=False).version()
    assert read == ["f"] and version.files["f"] == sha(b"same name, OTHER CONTENT")


def test_symlink_at_cache_path_is_refused(tmp_path: Path, ws: Path) -> None:
    target = write(tmp_path, "elsewhere", "do not touch")
    link = tmp_path / "artifact.cache"
    link.symlink_to(target)
    with pytest.raises(ArtifactError, match="symbolic link"):
        ArtifactScanner(ws, cache_path=link)
    assert target.read_text() == "do not touch"


def test_cache_file_inside_the_workspace_is_not_part_of_the_version(ws: Path) -> None:
    write(ws, "a", "1")
    first = scan(ws, cache_path=ws / "artifact.cache")
    assert (ws / "artifact.cache").exists()
    again = scan(ws, cache_path=ws / "artifact.cache")
    assert list(first.files) == list(again.files) == ["a"] and first == again


def test_unwritable_cache_location_is_not_an_error(tmp_path: Path, ws: Path) -> None:
    write(ws, "a", "1")
    version = scan(ws, cache_path=tmp_path / "no-such-dir" / "artifact.cache")
    assert list(version.files) == ["a"]


# --------------------------------------------------------------------------- manifests


def test_manifest_roundtrip(ws: Path) -> None:
    write(ws, "a.txt", "1")
    write(ws, "dir/ü.txt", "2")
    version = scan(ws)
    data = to_manifest(version)
    assert isinstance(data, bytes) and len(data) < 400
    copy = from_manifest(version.digest, data)
    assert copy == version and dict(copy.files) == dict(version.files)
    empty = scan(ws, ignore=["*"])
    assert from_manifest(empty.digest, to_manifest(empty)) == empty


def _manifest(document: Any) -> bytes:
    return zlib.compress(orjson.dumps(document))


def test_bad_manifests_are_artifact_errors(ws: Path) -> None:
    write(ws, "a", "1")
    version = scan(ws)
    good = {"format": 1, "files": dict(version.files)}
    digest = sha(b"1")
    bad_inputs = [
        b"",
        b"not zlib",
        zlib.compress(b"not json"),
        to_manifest(version)[:-3],
        to_manifest(version) + b"trailing",
        _manifest([1, 2]),
        _manifest({**good, "format": 2}),
        _manifest({**good, "extra": 1}),
        _manifest({"format": 1, "files": {"a": "md5:1234"}}),
        _manifest({"format": 1, "files": {"../a": digest}}),
        _manifest({"format": 1, "files": {"/a": digest}}),
        _manifest({"format": 1, "files": {"a//b": digest}}),
        _manifest({"format": 1, "files": {}, "raw": [["!!notbase64", digest]]}),
        _manifest({"format": 1, "files": {"b": digest}}),  # does not match the digest
        _manifest({"format": 1, "files": {"a": digest}, "raw": [["YQ==", digest]]}),  # twice
    ]
    for data in bad_inputs:
        with pytest.raises(ArtifactError):
            from_manifest(version.digest, data)
    with pytest.raises(ArtifactError):
        from_manifest("sha256:nothex", to_manifest(version))
    with pytest.raises(ArtifactError):
        from_manifest(EMPTY_DIGEST, to_manifest(version))


# --------------------------------------------------------------------------- git mode


def _repo(root: Path) -> Path:
    root.mkdir()
    git(root, "init", "-q")
    write(root, ".gitignore", "*.log\nbuild/\n")
    write(root, "tracked.py", "t")
    write(root, "sub/tracked.txt", "s")
    write(root, "gone.txt", "g")
    write(root, "forced.log", "tracked although ignored")
    git(root, "add", ".gitignore", "tracked.py", "sub/tracked.txt", "gone.txt")
    git(root, "add", "-f", "forced.log")
    git(root, "commit", "-q", "-m", "init")
    (root / "gone.txt").unlink()  # tracked but deleted
    write(root, "untracked.py", "u")  # untracked, not ignored
    write(root, "debug.log", "ignored")  # untracked, ignored
    write(root, "build/out.bin", "ignored")
    write(root, ".tether/state", "always excluded")
    write(root, "sub/__pycache__/x.pyc", "default ignore")
    return root


GIT_FILES = [".gitignore", "forced.log", "sub/tracked.txt", "tracked.py", "untracked.py"]


@needs_git
def test_git_mode_lists_tracked_and_untracked_not_ignored(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    version = ArtifactScanner(repo).version()
    assert sorted(version.files) == GIT_FILES
    walked = scan(repo)  # use_git=False: every file (but the always-excluded ones)
    assert "debug.log" in walked.files and "build/out.bin" in walked.files
    assert walked.digest != version.digest


@needs_git
def test_git_mode_in_a_subdirectory_and_with_changes(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    scanner = ArtifactScanner(repo / "sub")
    first = scanner.version()
    assert sorted(first.files) == ["tracked.txt"]
    whole = ArtifactScanner(repo)
    before = whole.version()
    write(repo, "sub/tracked.txt", "edited")
    write(repo, "another.log", "ignored")
    write(repo, "new_dir/new.py", "n")
    after = whole.version()
    assert after.changed_since(before) == ["new_dir/new.py", "sub/tracked.txt"]
    assert scanner.version().changed_since(first) == ["tracked.txt"]
    assert ArtifactScanner(repo).version() == after  # cold agrees with warm


@needs_git
def test_git_mode_user_patterns_apply_on_top(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    version = ArtifactScanner(repo, ignore=["sub/", "*.py"]).version()
    assert sorted(version.files) == [".gitignore", "forced.log"]


@needs_git
def test_git_mode_walks_an_untracked_nested_repository(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    nested = repo / "nested"
    nested.mkdir()
    git(nested, "init", "-q")
    write(nested, "inner.txt", "i")
    write(nested, "x.log", "walked: the outer .gitignore does not apply inside")
    files = ArtifactScanner(repo).version().files
    assert "nested/inner.txt" in files and "nested/.git/HEAD" not in files


@needs_git
def test_git_missing_falls_back_to_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _repo(tmp_path / "repo")
    with_git = ArtifactScanner(repo).version()
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    without = ArtifactScanner(repo).version()
    assert without == scan(repo) and without != with_git


@needs_git
def test_git_environment_pointing_elsewhere_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _repo(tmp_path / "repo")
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    assert sorted(ArtifactScanner(repo).version().files) == GIT_FILES


@needs_git
def test_git_mode_warm_scanner_reuses_listing_and_cache(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    cache = tmp_path / "artifact.cache"
    with clock_ahead():
        scanner = ArtifactScanner(repo, cache_path=cache)
        first = scanner.version()
        with count_hashes() as read:
            assert scanner.version() is first
            from_file = ArtifactScanner(repo, cache_path=cache).version()
        assert read == [] and from_file == first
        (repo / "untracked.py").unlink()
        second = scanner.version()
    assert second.changed_since(first) == ["untracked.py"]


def test_not_in_a_git_work_tree_uses_the_walk(ws: Path) -> None:
    write(ws, "x.log", "kept: no git, no .gitignore semantics")
    write(ws, ".gitignore", "*.log\n")
    assert sorted(ArtifactScanner(ws).version().files) == [".gitignore", "x.log"]


# --------------------------------------------------------------------------- property


NAMES = ["a", "b", "c.txt", "x.pyc", "__pycache__", ".tether", ".git", "é", "sp ace"]
path_st = st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map(tuple)
tree_st = st.dictionaries(path_st, st.binary(max_size=12), max_size=10)
ops_st = st.lists(
    st.tuples(
        st.sampled_from(["write", "delete", "add", "symlink"]), path_st, st.binary(max_size=12)
    ),
    max_size=6,
)


def _build(root: Path, tree: dict[tuple[str, ...], bytes]) -> None:
    for parts, data in tree.items():
        _put(root, parts, data)


def _put(root: Path, parts: tuple[str, ...], data: bytes, *, link: bool = False) -> None:
    """Create a file (or symlink), unless a prefix is a file or the path is a directory."""
    path = root.joinpath(*parts)
    for i in range(1, len(parts)):
        prefix = root.joinpath(*parts[:i])
        if prefix.is_symlink() or prefix.is_file():
            return
    if path.is_dir() and not path.is_symlink():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    if link:
        path.symlink_to(data.hex() or "empty")
    else:
        path.write_bytes(data)


_mtime = [1_500_000_000 * 10**9]


def _bump(path: Path) -> None:
    """A fresh, unique mtime, so that a rewrite never keeps its stat key."""
    _mtime[0] += 10**9
    os.utime(path, ns=(_mtime[0], _mtime[0]), follow_symlinks=False)


def _files(root: Path) -> list[Path]:
    out = []
    for directory, dirs, names in os.walk(root):
        out.extend(Path(directory, n) for n in names)
        out.extend(Path(directory, d) for d in dirs if Path(directory, d).is_symlink())
    return sorted(out)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tree=tree_st, ops=ops_st)
def test_property_matches_reference_and_warm_equals_cold(
    tree: dict[tuple[str, ...], bytes], ops: list[tuple[str, tuple[str, ...], bytes]]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _build(root, tree)
        with clock_ahead():  # the warm scanner trusts everything it may trust
            warm = ArtifactScanner(root, use_git=False)
            first = warm.version()
            assert first.digest == reference(root)
            for op, parts, data in ops:
                existing = _files(root)
                if op == "write" and existing:
                    target = existing[len(data) % len(existing)]
                    if not target.is_symlink():
                        target.write_bytes(data)
                        _bump(target)
                elif op == "delete" and existing:
                    existing[len(data) % len(existing)].unlink()
                elif op in ("add", "symlink"):
                    _put(root, parts, data, link=op == "symlink")
                    path = root.joinpath(*parts)
                    if path.is_symlink() or path.is_file():
                        _bump(path)
            cold = ArtifactScanner(root, use_git=False).version()
            assert warm.version() == cold
            assert cold.digest == reference(root)
            assert sorted(cold.changed_since(first)) == cold.changed_since(first)


def test_reference_helpers_agree_on_a_known_tree(ws: Path) -> None:
    # Guards the property test: the reference applies the documented defaults.
    write(ws, "__pycache__/a", "x")
    write(ws, "a.pyc", "x")
    write(ws, ".tether/x", "x")
    write(ws, "k", "v")
    assert reference(ws) == listing_digest({b"k": sha(b"v")}) == scan(ws).digest
