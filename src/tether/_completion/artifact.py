"""Artifact versions: one digest that identifies the content of a workspace.

An *artifact version* names the content of every file of the workspace that matters, so
that verification evidence ("the check command passed") can be tied to exactly the
content it was run against: if any file that matters changes, the version changes.

Which files matter
------------------
* **Git mode.** When the workspace is inside a git work tree (and ``use_git`` is true),
  the files are those ``git ls-files -z --cached --others --exclude-standard`` lists:
  tracked files plus untracked files that git does not ignore. A tracked file that was
  deleted is simply absent. Git runs through tether's process runner
  (:func:`tether._procs.run_in_group`), with a timeout and ``GIT_OPTIONAL_LOCKS=0`` (so it
  never takes the index lock), with ``GIT_DIR``/``GIT_WORK_TREE``/``GIT_INDEX_FILE``
  removed from its environment. Whether the workspace is in a work tree is decided by git
  itself (``ls-files`` fails outside one, as ``rev-parse --is-inside-work-tree`` would say
  false), and git is not started at all when no ancestor of the workspace has a ``.git``
  entry. If git is missing, times out or fails, the scanner falls back to the walk
  below. A listed path that is a directory (a submodule, or an untracked nested
  repository) is walked as below.
* **Walk mode.** Otherwise every entry under the workspace, found with ``os.scandir``.
  Symbolic links are never followed, into directories or otherwise.

In both modes these are always left out: the ``.tether/`` directory at the workspace root,
every entry named ``.git`` (the repository directory, or the ``.git`` file of a linked
worktree or submodule), the persisted cache file when it lies inside the workspace, the
ignore patterns below, and entries that are neither regular files nor symbolic links
(FIFOs, sockets, devices: they have no content to hash).

Ignore patterns
---------------
A gitignore-like subset, matched with :func:`fnmatch.fnmatchcase` (``*``, ``?``,
``[seq]``, ``[!seq]``; note that ``*`` also matches ``/``):

* a trailing ``/`` restricts the pattern to directories (``build/``); a symbolic link is
  never a directory;
* a pattern with no other ``/`` matches the entry's *name* at any depth (``*.pyc``,
  ``node_modules/``);
* a pattern with a ``/`` elsewhere matches the path relative to the workspace root, a
  leading ``/`` being stripped (``/dist``, ``docs/_build/``, ``src/*.generated.py``);
* an ignored directory is not descended into, so nothing below it is included;
* negation (``!pattern``) is not supported and rejected, as is an empty pattern.

:data:`DEFAULT_IGNORES` (``__pycache__/``, ``*.pyc``, ``.pytest_cache/``,
``.mypy_cache/``, ``.ruff_cache/``) are the caches a check command such as pytest writes;
without them running the verification would itself change the version. The ``ignore``
argument extends them. The patterns apply in git mode too, on top of git's own ignores.

Digests
-------
* A regular file's digest is ``"sha256:" + hex`` of its bytes (opened with
  ``O_NOFOLLOW``, streamed in chunks).
* A symbolic link's digest is that of ``b"symlink\\0" + target`` (the text
  ``os.readlink`` returns), which cannot collide with a file's.
* The version digest is ``"sha256:" + hex`` of the canonical listing: for every file,
  sorted by path bytes, ``path + b"\\0" + file digest + b"\\n"``, the path being the
  POSIX path relative to the workspace as raw file-system bytes (``os.fsencode``; UTF-8
  for ordinary names). In :attr:`ArtifactVersion.files` a name that is not valid UTF-8
  is a ``surrogateescape``-decoded ``str``. An empty workspace has the version
  ``"sha256:" + sha256(b"").hexdigest()``.

A file that vanishes while being scanned is left out of that version. A file or
directory that cannot be read (permission denied, I/O error) raises
:class:`~tether.errors.ArtifactError` naming it, as does a workspace that is not a
directory: no version is better than a wrong one.

The cache, and the racy-mtime rule
----------------------------------
:class:`ArtifactScanner` remembers, for every file, the stat key ``(path, size,
mtime_ns, ctime_ns, inode, mode)`` and the digest it had. A file whose key is unchanged
is not read again; when the whole listing equals the previous one, the previous
:class:`ArtifactVersion` object is returned as is, so an unchanged workspace costs one
directory walk with one ``lstat`` per file. The change time is part of the key (as in
git): it cannot be set by a program, so content rewritten with its old size and
modification time restored (``touch -r``, ``tar``, ``cp -p``) is still noticed.

Time stamps are coarse (a clock tick, up to seconds on some file systems), so a file
written in the same tick as it was hashed may change again without its key changing.
Like git's "racily clean" entries, a digest is only remembered when the file's mtime and
ctime are both older than the start of the scan minus :data:`RACY_MARGIN_NS` (2 s; the
margin also absorbs small clock skew with a file server). A newer file is hashed again
on every scan until it has been left alone for that long.

With ``cache_path`` the cache also survives the process: it is written after a scan
that changed it (to a temporary file in the same directory, mode 0600, then
``os.replace``; a failed write is not an error) and read by the first scan of a later
scanner, so a ``tether verify`` process starts warm. The file holds a format version,
the workspace's real path and a SHA-256 checksum of its payload; a file that is missing,
corrupt, truncated, of another format or for another workspace is ignored (the scan
starts cold), and a symbolic link at ``cache_path`` is refused (:class:`ArtifactError`
when the scanner is created) and never read. A scanner is not thread-safe.
"""

from __future__ import annotations

import base64
import binascii
import errno
import fnmatch
import hashlib
import os
import re
import shutil
import stat
import sys
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

import orjson

from tether._credentials import child_environment
from tether._procs import Ending, Finished, Supervision, run_in_group
from tether.core.canonical import hasher_digest, sha256_digest
from tether.core.values import ArtifactVersion
from tether.errors import ArtifactError, ConfigurationError

__all__ = [
    "DEFAULT_IGNORES",
    "EMPTY_DIGEST",
    "GIT_TIMEOUT",
    "RACY_MARGIN_NS",
    "ArtifactScanner",
    "ArtifactVersion",
    "from_manifest",
    "to_manifest",
]

DEFAULT_IGNORES: Final[tuple[str, ...]] = (
    "__pycache__/",
    "*.pyc",
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
)

#: A digest is trusted for the next scan only if the file's mtime and ctime are older than
#: the start of the scan that computed it minus this margin (nanoseconds).
RACY_MARGIN_NS: Final[int] = 2_000_000_000

#: Seconds ``git ls-files`` may take before the scanner falls back to walking the tree.
GIT_TIMEOUT: Final[float] = 60.0

#: The version of a workspace without any file.
EMPTY_DIGEST: Final[str] = sha256_digest(b"")

_CHUNK: Final = 1 << 20
_NOT_CONTENT: Final = "-"  # cached "digest" of a FIFO, socket or device: not part of a version
_CACHE_MAGIC: Final = b"tether-artifact-cache 1\n"
_MANIFEST_FORMAT: Final = 1
_MANIFEST_LIMIT: Final = 1 << 30
_MANIFEST_KEYS: Final = frozenset({"format", "files", "raw"})
_DIGEST_RE: Final = re.compile(r"sha256:[0-9a-f]{64}\Z")
_UTF8_FS: Final = (
    sys.getfilesystemencoding() == "utf-8" and sys.getfilesystemencodeerrors() == "surrogateescape"
)
_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_OPEN_FLAGS: Final = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
_GIT_ENV_DROP: Final = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR")

# The clock the racy-mtime rule compares time stamps with (a seam for tests).
_now_ns: Callable[[], int] = time.time_ns

# (relative path, size, mtime_ns, ctime_ns, inode, mode)
_Key = tuple[str, int, int, int, int, int]


# --------------------------------------------------------------------------- the version
#
# The value type, ArtifactVersion, is the core's (tether.core.values: pure). Its manifest
# encoding stays here, in the shell: the names of files that are not valid UTF-8 are
# encoded with the file system's encoding (os.fsencode), a property of the process.


def to_manifest(version: ArtifactVersion) -> bytes:
    """``version.files`` as zlib-compressed JSON, for :func:`from_manifest` in another process.

    Paths that are not valid UTF-8 go, base64-encoded, into a separate ``raw`` list.
    """
    files = dict(version.files)
    try:
        payload = orjson.dumps({"format": _MANIFEST_FORMAT, "files": files})
    except orjson.JSONEncodeError:
        plain: dict[str, str] = {}
        raw: list[list[str]] = []
        for path, digest in files.items():
            if _is_utf8(path):
                plain[path] = digest
            else:
                raw.append([base64.b64encode(os.fsencode(path)).decode("ascii"), digest])
        payload = orjson.dumps({"format": _MANIFEST_FORMAT, "files": plain, "raw": raw})
    return zlib.compress(payload, 6)


def from_manifest(digest: str, data: bytes) -> ArtifactVersion:
    """The version whose digest is `digest` and whose files `data` lists.

    Raises :class:`ArtifactError` when `data` is not a manifest, or lists files whose
    version digest is not `digest`.
    """
    if not isinstance(digest, str) or not _DIGEST_RE.match(digest):
        raise ArtifactError(f"bad artifact version digest {digest!r}")
    try:
        inflater = zlib.decompressobj()
        payload = inflater.decompress(data, _MANIFEST_LIMIT)
        if inflater.unconsumed_tail or inflater.unused_data or not inflater.eof:
            raise ArtifactError("artifact manifest is truncated, too large or has trailing data")
        document = orjson.loads(payload)
    except (zlib.error, orjson.JSONDecodeError, TypeError) as error:
        raise ArtifactError(f"artifact manifest is not readable: {error}") from error
    files = _parse_manifest(document)
    if _listing_digest(files) != digest:
        raise ArtifactError(f"artifact manifest does not match version {digest}")
    return ArtifactVersion(digest, MappingProxyType(files))


def _parse_manifest(document: Any) -> dict[str, str]:
    if not isinstance(document, dict) or document.get("format") != _MANIFEST_FORMAT:
        raise ArtifactError("artifact manifest has an unknown format")
    plain = document.get("files")
    raw = document.get("raw", [])
    if (
        not isinstance(plain, dict)
        or not isinstance(raw, list)
        or not _MANIFEST_KEYS >= set(document)
    ):
        raise ArtifactError("artifact manifest has an unknown format")
    files: dict[str, str] = {}
    pairs: list[tuple[Any, Any]] = list(plain.items())
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            raise ArtifactError("artifact manifest has a bad raw path entry")
        try:
            path = os.fsdecode(base64.b64decode(item[0], validate=True))
        except (binascii.Error, ValueError) as error:
            raise ArtifactError("artifact manifest has a bad raw path entry") from error
        pairs.append((path, item[1]))
    for path, file_digest in pairs:
        if not _valid_relpath(path):
            raise ArtifactError(f"artifact manifest has a bad path {path!r}")
        if not isinstance(file_digest, str) or not _DIGEST_RE.match(file_digest):
            raise ArtifactError(f"artifact manifest has a bad digest for {path!r}")
        if path in files:
            raise ArtifactError(f"artifact manifest lists {path!r} twice")
        files[path] = file_digest
    return files


def _valid_relpath(path: object) -> bool:
    if not isinstance(path, str) or not path or path[0] == "/" or "\0" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _listing_digest(files: Mapping[str, str]) -> str:
    """``sha256`` of ``path NUL digest LF`` for every file, sorted by path bytes."""
    data: bytes | None = None
    if _UTF8_FS:
        # For valid Unicode, code point order is UTF-8 byte order; only lone surrogates
        # (undecodable bytes) break it, and they also make the strict encode fail.
        text = "".join([f"{path}\0{files[path]}\n" for path in sorted(files)])
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            data = None
    if data is None:
        encoded = sorted((os.fsencode(path), digest) for path, digest in files.items())
        data = b"".join(path + b"\0" + digest.encode("ascii") + b"\n" for path, digest in encoded)
    return sha256_digest(data)


# --------------------------------------------------------------------------- ignore rules


_MAGIC: Final = frozenset("*?[")
_SLASHES: Final = re.compile("/{2,}")


def _translate(globs: list[str]) -> Callable[[str], object] | None:
    if not globs:
        return None
    joined = "|".join(f"(?:{fnmatch.translate(glob)})" for glob in globs)
    return re.compile(joined).match


class _IgnoreRules:
    """The patterns, split by kind so that the common cases cost a set lookup."""

    def __init__(self, patterns: Sequence[str]) -> None:
        # index 0: applies to files (and symlinks etc.), index 1: applies to directories
        names: tuple[set[str], set[str]] = ({".git"}, {".git"})
        suffixes: tuple[list[str], list[str]] = ([], [])
        globs: tuple[list[str], list[str]] = ([], [])
        rooted: tuple[dict[str, set[str]], dict[str, set[str]]] = ({}, {"": {".tether"}})
        rooted_globs: tuple[list[str], list[str]] = ([], [])
        for pattern in patterns:
            if not isinstance(pattern, str) or not pattern.strip("/"):
                raise ConfigurationError(
                    f"ignore pattern {pattern!r} must be a non-empty string that is not just '/'"
                )
            if pattern.startswith("!"):
                raise ConfigurationError(
                    f"ignore pattern {pattern!r}: negation ('!') is not supported"
                )
            if "\0" in pattern:
                raise ConfigurationError(f"ignore pattern {pattern!r} contains a NUL character")
            dir_only = pattern.endswith("/")
            core = _SLASHES.sub("/", pattern).rstrip("/")
            kinds = (1,) if dir_only else (0, 1)
            magic = not _MAGIC.isdisjoint(core)
            if "/" in core:
                core = core.lstrip("/")
                for kind in kinds:
                    if magic:
                        rooted_globs[kind].append(core)
                    else:
                        head, _, name = core.rpartition("/")
                        rooted[kind].setdefault(head + "/" if head else "", set()).add(name)
            elif not magic:
                for kind in kinds:
                    names[kind].add(core)
            elif core.startswith("*") and len(core) > 1 and _MAGIC.isdisjoint(core[1:]):
                for kind in kinds:
                    suffixes[kind].append(core[1:])
            else:
                for kind in kinds:
                    globs[kind].append(core)
        self.file_names: frozenset[str] = frozenset(names[0])
        self.dir_names: frozenset[str] = frozenset(names[1])
        self.file_suffixes: tuple[str, ...] | None = tuple(suffixes[0]) or None
        self.dir_suffixes: tuple[str, ...] | None = tuple(suffixes[1]) or None
        self.file_match = _translate(globs[0])
        self.dir_match = _translate(globs[1])
        self.file_rooted: dict[str, frozenset[str]] = {
            k: frozenset(v) for k, v in rooted[0].items()
        }
        self.dir_rooted: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in rooted[1].items()}
        self.file_path_match = _translate(rooted_globs[0])
        self.dir_path_match = _translate(rooted_globs[1])

    def add_rooted_file(self, rel: str) -> None:
        head, _, name = rel.rpartition("/")
        prefix = head + "/" if head else ""
        self.file_rooted[prefix] = self.file_rooted.get(prefix, frozenset()) | {name}

    def ignored(self, name: str, rel: str, prefix: str, is_dir: bool) -> bool:
        """Whether the entry `name` at `rel` (in the directory `prefix`) is ignored."""
        if is_dir:
            names, suffixes, match = self.dir_names, self.dir_suffixes, self.dir_match
            rooted, path_match = self.dir_rooted.get(prefix), self.dir_path_match
        else:
            names, suffixes, match = self.file_names, self.file_suffixes, self.file_match
            rooted, path_match = self.file_rooted.get(prefix), self.file_path_match
        return bool(
            name in names
            or (suffixes is not None and name.endswith(suffixes))
            or (match is not None and match(name))
            or (rooted is not None and name in rooted)
            or (path_match is not None and path_match(rel))
        )

    def dir_ignored(self, rel: str, memo: dict[str, bool]) -> bool:
        """Whether the directory `rel` or one of its ancestors is ignored."""
        known = memo.get(rel)
        if known is None:
            parent, _, name = rel.rpartition("/")
            known = bool(parent and self.dir_ignored(parent, memo)) or self.ignored(
                name, rel, parent + "/" if parent else "", True
            )
            memo[rel] = known
        return known


# --------------------------------------------------------------------------- listing


def _unreadable(root: str, rel: str, error: OSError) -> ArtifactError:
    what = repr(rel) if rel else "the workspace root"
    reason = error.strerror or str(error)
    return ArtifactError(f"cannot read {what} in workspace {root}: {reason}")


def _walk(root: str, top_rel: str, rules: _IgnoreRules, out: list[_Key]) -> None:
    """Append the stat key of every entry under ``root/top_rel`` that is not ignored.

    The hot loop of a warm scan: everything is a local, the ignore checks that are
    empty are skipped, and the only system call per file is ``lstat``.
    """
    file_names, dir_names = rules.file_names, rules.dir_names
    file_suffixes, dir_suffixes = rules.file_suffixes, rules.dir_suffixes
    file_match, dir_match = rules.file_match, rules.dir_match
    file_path_match, dir_path_match = rules.file_path_match, rules.dir_path_match
    file_rooted, dir_rooted = rules.file_rooted, rules.dir_rooted
    append = out.append
    stack = [(os.path.join(root, top_rel) if top_rel else root, top_rel + "/" if top_rel else "")]
    pop, push = stack.pop, stack.append
    while stack:
        path, prefix = pop()
        rooted_files = file_rooted.get(prefix)
        rooted_dirs = dir_rooted.get(prefix)
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    name = entry.name
                    if entry.is_dir(follow_symlinks=False):
                        if (
                            name in dir_names
                            or (dir_suffixes is not None and name.endswith(dir_suffixes))
                            or (dir_match is not None and dir_match(name))
                            or (rooted_dirs is not None and name in rooted_dirs)
                        ):
                            continue
                        rel = prefix + name
                        if dir_path_match is None or not dir_path_match(rel):
                            push((entry.path, rel + "/"))
                        continue
                    if (
                        name in file_names
                        or (file_suffixes is not None and name.endswith(file_suffixes))
                        or (file_match is not None and file_match(name))
                        or (rooted_files is not None and name in rooted_files)
                    ):
                        continue
                    rel = prefix + name
                    if file_path_match is not None and file_path_match(rel):
                        continue
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    except OSError as error:
                        raise _unreadable(root, rel, error) from error
                    append((rel, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode))
        except (FileNotFoundError, NotADirectoryError):
            if not prefix:
                raise ArtifactError(f"workspace {root} is not a directory") from None
            continue  # vanished while scanning
        except OSError as error:
            raise _unreadable(root, prefix.rstrip("/"), error) from error


def _git_env() -> dict[str, str]:
    # No credentials: the workspace's own git configuration can make git run commands
    # (core.fsmonitor), and the model may have written that configuration.
    env = {k: v for k, v in child_environment().items() if k not in _GIT_ENV_DROP}
    env["GIT_OPTIONAL_LOCKS"] = "0"
    env["LC_ALL"] = "C"
    return env


def _maybe_in_git(root: str) -> bool:
    """False when no ancestor of `root` has a ``.git``: git cannot find a work tree then."""
    path = root
    while True:
        if os.path.lexists(os.path.join(path, ".git")):
            return True
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent


_GIT_SUPERVISION: Final = Supervision(kill_grace=0.5, final_drain=0.2, poll=0.05)
"""``git ls-files`` changes nothing: a short grace when it must be ended (timeout, abort)."""


class _GitRun:
    """``git ls-files`` on the workspace, run through tether's one process runner
    (:func:`tether._procs.run_in_group`: its own process group, reaped even if tether dies)
    on a thread, so that git lists while this thread stats the previous listing
    (:meth:`ArtifactScanner._list`). The thread reads git's output as it comes, so git
    never waits on a full pipe."""

    def __init__(self, git: str, root: str) -> None:
        self._chunks: list[bytes] = []
        self._cancel = threading.Event()
        self._finished: Finished | None = None
        command = [git, "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
        self._thread = threading.Thread(
            target=self._run, args=(command, root), name="tether-git-ls-files", daemon=True
        )
        self._thread.start()

    def _run(self, command: list[str], root: str) -> None:
        try:
            self._finished = run_in_group(
                command,
                cwd=root,
                env=_git_env(),
                timeout=GIT_TIMEOUT,
                on_output=self._chunks.append,
                cancel=self._cancel,
                supervision=_GIT_SUPERVISION,
                merge_stderr=False,
            )
        except OSError:
            self._finished = None  # git could not be started: the walk answers instead

    def abort(self) -> None:
        """End git (if still running) and wait for it."""
        self._cancel.set()
        self._thread.join()

    def output(self) -> bytes | None:
        """Git's listing once it is done, or None if it failed (not a work tree, timeout,
        could not start)."""
        self._thread.join()
        done = self._finished
        if done is None or done.ending is not Ending.EXITED or done.returncode != 0:
            return None
        return b"".join(self._chunks)


def _start_git(root: str) -> _GitRun | None:
    """Start ``git ls-files`` on the workspace; None when git surely cannot answer (no
    ``.git`` above the workspace, no ``git`` on the ``PATH``)."""
    if not _maybe_in_git(root):
        return None
    git = shutil.which("git", path=_git_env().get("PATH"))
    if git is None:
        return None
    return _GitRun(os.path.abspath(git), root)


def _abort_git(run: _GitRun) -> None:
    run.abort()


def _finish_git(run: _GitRun) -> list[str] | None:
    """The paths git listed, or None if it failed (not a work tree, timeout, error)."""
    data = run.output()
    if data is None:
        return None
    if _UTF8_FS:
        paths = data.decode("utf-8", "surrogateescape").split("\0")
    else:
        paths = [os.fsdecode(raw) for raw in data.split(b"\0")]
    if paths and not paths[-1]:
        paths.pop()
    return paths


def _git_keys(root: str, paths: list[str], rules: _IgnoreRules) -> list[_Key]:
    """The stat keys of the paths git listed, less the ignored ones.

    Git lists paths sorted, so the per-directory decisions (is the directory ignored,
    which rooted names apply in it) are made once per run of paths in one directory.
    """
    file_names, file_suffixes = rules.file_names, rules.file_suffixes
    file_match, file_path_match = rules.file_match, rules.file_path_match
    file_rooted = rules.file_rooted
    out: list[_Key] = []
    append = out.append
    memo: dict[str, bool] = {}
    base = root + "/"
    lstat = os.lstat
    previous = current = ""
    skip_dir = False
    rooted: frozenset[str] | None = file_rooted.get("")
    for rel in paths:
        if rel == previous or not rel:
            continue  # an unmerged path is listed once per stage
        previous = rel
        if rel[-1] == "/":
            rel = rel.rstrip("/")  # an untracked nested repository is listed as "dir/"
        head, _, name = rel.rpartition("/")
        if head != current:
            current = head
            skip_dir = bool(head) and rules.dir_ignored(head, memo)
            rooted = file_rooted.get(head + "/" if head else "")
        if (
            skip_dir
            or name in file_names
            or (file_suffixes is not None and name.endswith(file_suffixes))
            or (file_match is not None and file_match(name))
            or (rooted is not None and name in rooted)
            or (file_path_match is not None and file_path_match(rel))
        ):
            continue
        try:
            st = lstat(base + rel)
        except (FileNotFoundError, NotADirectoryError):
            continue  # tracked but deleted
        except OSError as error:
            raise _unreadable(root, rel, error) from error
        mode = st.st_mode
        if mode & 0o170000 == stat.S_IFDIR:  # a submodule or nested repository
            if not rules.ignored(name, rel, head + "/" if head else "", True):
                _walk(root, rel, rules, out)
            continue
        append((rel, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, mode))
    return out


# --------------------------------------------------------------------------- hashing


def _hash_entry(root: str, rel: str, mode: int) -> str | None:
    """The digest of one entry; ``_NOT_CONTENT`` for a FIFO etc.; None if it vanished."""
    path = root + "/" + rel
    if stat.S_ISLNK(mode):
        try:
            target = os.readlink(os.fsencode(path))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as error:
            if error.errno == errno.EINVAL:
                return None  # no longer a symbolic link: changed under us
            raise _unreadable(root, rel, error) from error
        return sha256_digest(b"symlink\0" + target)
    if not stat.S_ISREG(mode):
        return _NOT_CONTENT
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        if error.errno == errno.ELOOP:
            return None  # replaced by a symbolic link: changed under us
        raise _unreadable(root, rel, error) from error
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        size = st.st_size
        digest = hashlib.sha256()
        update, read = digest.update, os.read
        want = size + 1 if size < _CHUNK else _CHUNK
        while True:
            block = read(fd, want)
            if not block:
                break
            update(block)
            want = _CHUNK
    except OSError as error:
        raise _unreadable(root, rel, error) from error
    finally:
        os.close(fd)
    return hasher_digest(digest)


# --------------------------------------------------------------------------- the scanner


def _cache_payload(
    root: str, digest: str, complete: bool, keys: list[_Key], digests: list[str]
) -> bytes:
    columns: list[Any] = [list(column) for column in zip(*keys, strict=True)] or [[]] * 6
    columns.append(digests)
    document = {"workspace": root, "digest": digest, "complete": complete, "columns": columns}
    return orjson.dumps(document)


class ArtifactScanner:
    """Computes :class:`ArtifactVersion` of one workspace, incrementally.

    See the module documentation for what is included, the ignore syntax, the cache and
    the racy-mtime rule.
    """

    def __init__(
        self,
        workspace: str | os.PathLike[str],
        *,
        ignore: Sequence[str] = (),
        cache_path: str | os.PathLike[str] | None = None,
        use_git: bool = True,
    ) -> None:
        if isinstance(ignore, str):
            raise ConfigurationError("ignore must be a sequence of patterns, not a string")
        self._rules = _IgnoreRules((*DEFAULT_IGNORES, *ignore))
        given = os.fspath(workspace)
        self._root = os.path.realpath(given)
        if not os.path.isdir(self._root):
            raise ArtifactError(f"workspace {given} is not a directory")
        self._use_git = use_git
        self._cache: dict[_Key, str] = {}
        self._last_keys: list[_Key] | None = None
        self._last: ArtifactVersion | None = None
        self._git_listing: list[str] | None = None
        self._cache_path: str | None = None
        self._cache_loaded = False
        if cache_path is not None:
            cache_file = os.path.abspath(os.fspath(cache_path))
            if os.path.islink(cache_file):
                raise ArtifactError(f"refusing artifact cache {cache_file}: it is a symbolic link")
            real = os.path.join(
                os.path.realpath(os.path.dirname(cache_file)), os.path.basename(cache_file)
            )
            inside = os.path.relpath(real, self._root)
            if inside not in (".", "..") and not inside.startswith("../"):
                self._rules.add_rooted_file(inside.replace(os.sep, "/"))
            self._cache_path = cache_file

    @property
    def workspace(self) -> str:
        """The workspace's real path."""
        return self._root

    def version(self) -> ArtifactVersion:
        """The artifact version of the workspace now."""
        started = _now_ns()
        root = self._root
        if self._cache_path is not None and not self._cache_loaded:
            self._cache_loaded = True
            self._load_cache()
        keys = self._list()
        last = self._last
        if last is not None and keys == self._last_keys:
            return last

        horizon = started - RACY_MARGIN_NS
        cache_get = self._cache.get
        cache: dict[_Key, str] = {}
        files: dict[str, str] = {}
        complete = True
        for key in keys:
            digest = cache_get(key)
            if digest is None:
                digest = _hash_entry(root, key[0], key[5])
                if digest is None:
                    complete = False  # vanished
                    continue
                if digest == _NOT_CONTENT or (key[2] < horizon and key[3] < horizon):
                    cache[key] = digest
                else:
                    complete = False  # racily clean: hash again next time
            else:
                cache[key] = digest
            if digest != _NOT_CONTENT:
                files[key[0]] = digest

        if last is not None and last.files == files:
            version = last
        else:
            version = ArtifactVersion(_listing_digest(files), MappingProxyType(files))
        self._cache = cache
        self._last = version
        self._last_keys = keys if complete and len(cache) == len(keys) else None
        if self._cache_path is not None:
            self._save_cache(version)
        return version

    # -- listing

    def _list(self) -> list[_Key]:
        """The stat keys of the files that matter, in listing order."""
        root, rules = self._root, self._rules
        run = _start_git(root) if self._use_git else None
        if run is not None:
            # While git lists the files (in its own process, on another core if there is
            # one), stat the files it listed last time; if it lists exactly the same paths,
            # those stats are this scan's. Otherwise stat its new listing.
            guess_paths = self._git_listing
            if guess_paths is None and self._last_keys is not None:
                guess_paths = [key[0] for key in self._last_keys]
            guess: list[_Key] | None = None
            try:
                if guess_paths is not None:
                    try:
                        guess = _git_keys(root, guess_paths, rules)
                    except ArtifactError:
                        guess = None  # e.g. a path that is gone from the new listing
            except BaseException:
                _abort_git(run)
                raise
            paths = _finish_git(run)
            self._git_listing = paths
            if paths is not None:
                if guess is not None and paths == guess_paths:
                    return guess
                return _git_keys(root, paths, rules)
        keys: list[_Key] = []
        _walk(root, "", rules, keys)
        return keys

    # -- the persisted cache

    def _load_cache(self) -> None:
        """Start from the persisted cache, if there is a sound one for this workspace."""
        assert self._cache_path is not None
        try:
            fd = os.open(self._cache_path, _OPEN_FLAGS)
        except OSError:
            return
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return
            chunks = []
            while block := os.read(fd, _CHUNK):
                chunks.append(block)
        except OSError:
            return
        finally:
            os.close(fd)
        data = b"".join(chunks)
        head = len(_CACHE_MAGIC)
        if not data.startswith(_CACHE_MAGIC) or data[head + 64 : head + 65] != b"\n":
            return
        payload = data[head + 65 :]
        if hashlib.sha256(payload).hexdigest().encode("ascii") != data[head : head + 64]:
            return
        try:
            document = orjson.loads(payload)
            if document["workspace"] != self._root:
                return
            columns = document["columns"]
            paths, digests = columns[0], columns[6]
            ints = columns[1:6]
            # Column-wise type checks run at C speed; a wrong type could only ever make a
            # key miss, but a digest must be a string to be used at all.
            if (
                len(columns) != 7
                or any(len(column) != len(paths) for column in columns)
                or not {str} >= set(map(type, paths))
                or not {str} >= set(map(type, digests))
                or not all({int} >= set(map(type, column)) for column in ints)
            ):
                return
            keys: list[_Key] = list(zip(paths, *ints, strict=True))
            cache = dict(zip(keys, digests, strict=True))
            digest = document["digest"]
            complete = document["complete"] is True and len(cache) == len(keys)
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError):
            return
        self._cache = cache
        if complete and isinstance(digest, str) and _DIGEST_RE.match(digest):
            files = dict(zip(paths, digests, strict=True))
            if _NOT_CONTENT in files.values():
                files = {path: d for path, d in files.items() if d != _NOT_CONTENT}
            self._last_keys = keys
            self._last = ArtifactVersion(digest, MappingProxyType(files))

    def _save_cache(self, version: ArtifactVersion) -> None:
        """Persist the cache atomically; failing to is not an error (it is only a cache)."""
        assert self._cache_path is not None
        keys = list(self._cache)
        digests = list(self._cache.values())
        complete = self._last_keys is not None
        try:
            payload = _cache_payload(self._root, version.digest, complete, keys, digests)
        except orjson.JSONEncodeError:
            # A path that is not valid UTF-8: leave it out (it is hashed again next time).
            kept = [i for i, key in enumerate(keys) if _is_utf8(key[0])]
            keys = [keys[i] for i in kept]
            digests = [digests[i] for i in kept]
            try:
                payload = _cache_payload(self._root, version.digest, False, keys, digests)
            except orjson.JSONEncodeError:
                return
        data = _CACHE_MAGIC + hashlib.sha256(payload).hexdigest().encode("ascii") + b"\n" + payload
        directory, name = os.path.split(self._cache_path)
        temp = os.path.join(directory, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        except OSError:
            return
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(temp, self._cache_path)
        except OSError:
            try:
                os.unlink(temp)
            except OSError:
                pass
