"""What a power cut can leave on disk: a model of the file system, fed by a system-call trace.

Pure: recorded calls and the files as they were before the run go in; the on-disk states a
power cut after any call could leave come out. Nothing here touches the disk (the power-loss
lab, :mod:`tether.testing.crashlab.powerlab`, records the trace and materialises the states).

The model (POSIX, with ext4 ``data=ordered`` semantics, stated as rules the code follows):

P1. What was on disk before the run is durable.
P2. A file's data is durable up to its last ``fsync``/``fdatasync``. The writes and truncates
    made since then survive as a *prefix* of their sequence, and the last surviving write may
    be cut at any byte (``data=ordered``: bytes that survive are bytes that were written, never
    zeros or stale blocks). So an unsynced append may be lost, kept, or torn at any byte.
P3. A directory's entries (create, link, rename in or out, unlink, mkdir, rmdir) are durable
    up to the directory's last ``fsync``. The entry operations made since then survive as a
    prefix of that directory's sequence. A rename within one directory is one operation (it
    is atomic); across directories it is an unlink in one and a link in the other.
    ``fsync`` of a file does not make its name durable (POSIX; ext4 often does, we do not
    count on it).
P4. A file no durable (or surviving) name points to is gone, with its data; so is everything
    under a directory whose own entry did not survive.
P5. ``fsync``/``fdatasync`` of a file makes all of its data durable, whichever descriptor
    wrote it; ``fsync`` of a directory makes all of its entries durable.

*World* files are the lab's record of what happened outside the disk under test (effects
counted, commits acknowledged, the reference ledger): they are never lost, and a state holds
them exactly as they were at the cut. *Ignored* files (the interpreter, libraries, SQLite's
``-shm`` index, which SQLite rebuilds) are not modelled.

States are chosen per cut (:func:`choices`): the *minimal* state (everything unsynced lost,
the hardest one for write-ahead), and in the full exploration also the *maximal* state (all
survived: what ``SIGKILL`` leaves), every prefix of every one dimension (one file's unsynced
writes, torn at their middle and one byte short, or one directory's unsynced entries) with
the others at minimal and at maximal, up to a cap per cut. Identical states are explored once.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from tether.testing.crashlab.strace import Call

__all__ = [
    "Cut",
    "FileClass",
    "Model",
    "PowerState",
    "TraceError",
    "choices",
    "explore",
]


class TraceError(Exception):
    """The trace shows something the model cannot follow (the lab must not guess)."""


class FileClass(Enum):
    SUBJECT = "subject"
    """On the disk under test: lost as the model says."""
    WORLD = "world"
    """The lab's record of the outside world: never lost."""
    IGNORED = "ignored"


Classify = Callable[[str], FileClass]

_CLONES = ("clone", "clone3", "fork", "vfork")
"""Calls that make a process or thread: it shares (``CLONE_FILES``) or copies descriptors."""


@dataclass
class _Node:
    """A file (inode): its bytes as the page cache has them and what is durable."""

    ident: int
    data: bytearray
    synced: bytes
    pending: list[tuple[str, int, bytes]] = field(default_factory=list)
    """Data operations since the last sync: ``("write", offset, bytes)``, ``("trunc", n, b"")``."""
    klass: FileClass = FileClass.SUBJECT
    touched: int = 0
    """When its data last changed (the model's counter): the bounded form tears the latest."""


@dataclass
class _Desc:
    """An open file description: shared by ``dup``ed descriptors and by forked children."""

    node: _Node
    append: bool
    offset: int = 0


@dataclass(frozen=True)
class _EntryOp:
    """One atomic change of directory entries: ``(path, node id | DIR | None)`` pairs."""

    seq: int
    directory: str
    changes: tuple[tuple[str, int | None], ...]
    what: str


DIR = -1
"""An entry that is a directory."""


@dataclass(frozen=True)
class PowerState:
    """One on-disk state a power cut can leave: the subject files and the world files."""

    files: Mapping[str, bytes]
    """Every subject file that exists, by absolute path."""
    dirs: frozenset[str]
    """Every subject directory that exists (absolute paths)."""
    world: Mapping[str, bytes]
    lost: tuple[str, ...]
    """What this state lost against the page cache, one line per file or directory."""
    kind: str
    """``minimal``, ``maximal`` or the one dimension varied."""

    def digest(self) -> str:
        h = hashlib.sha256()
        for group in (self.files, self.world):
            for path in sorted(group):
                h.update(path.encode("utf-8", "surrogateescape") + b"\0")
                h.update(hashlib.sha256(group[path]).digest())
            h.update(b"\1")
        for path in sorted(self.dirs):
            h.update(path.encode("utf-8", "surrogateescape") + b"\0")
        return h.hexdigest()


@dataclass(frozen=True)
class Cut:
    """A power cut right after trace call ``index`` (``-1``: before the first)."""

    index: int
    call: str
    """The call, as a short text (``fdatasync(…/x.jsonl)``)."""
    states: tuple[PowerState, ...]


class Model:
    """The file system as the trace changes it (rules P1–P5 in the module docstring)."""

    def __init__(self, files: Mapping[str, bytes], dirs: Iterable[str], classify: Classify) -> None:
        self._classify = classify
        self._next = 0
        self._seq = 0
        self.nodes: dict[int, _Node] = {}
        self.cur: dict[str, int] = {}
        """The page cache's view: path → node id or :data:`DIR`."""
        self.durable: dict[str, int] = {}
        self.pending: dict[str, list[_EntryOp]] = {}
        """Entry operations per directory since its last ``fsync``."""
        self.known: set[str] = set()
        """Every path the model has had an entry for (its ancestors above are assumed)."""
        self._tables: dict[int, dict[int, _Desc]] = {}
        """Descriptor tables by thread id (threads share one, forks copy it)."""
        for path in sorted(dirs):
            klass = classify(path)
            if klass is not FileClass.IGNORED:
                self.cur[path] = self.durable[path] = DIR
                self.known.add(path)
        for path, data in sorted(files.items()):
            klass = classify(path)
            if klass is FileClass.IGNORED:
                continue
            node = self._new(klass, data)  # P1: what was there before the run is durable
            self.cur[path] = self.durable[path] = node.ident
            self.known.add(path)

    # ------------------------------------------------------------------ following the trace

    def _new(self, klass: FileClass, data: bytes = b"") -> _Node:
        node = _Node(self._next, bytearray(data), bytes(data), klass=klass)
        self._next += 1
        self.nodes[node.ident] = node
        return node

    def _table(self, pid: int) -> dict[int, _Desc]:
        return self._tables.setdefault(pid, {})

    def _node_at(self, path: str | None) -> _Node | None:
        if path is None:
            return None
        ident = self.cur.get(path)
        return None if ident is None or ident == DIR else self.nodes[ident]

    def _node_of(self, call: Call) -> _Node | None:
        fd = _fd_number(call)
        desc = self._table(call.pid).get(fd) if fd is not None else None
        if desc is not None:
            return desc.node
        return self._node_at(call.fd_path(0))

    def _entry(self, path: str, ident: int | None, what: str) -> None:
        self._entries(((path, ident),), what)

    def _entries(self, changes: tuple[tuple[str, int | None], ...], what: str) -> None:
        """Apply entry changes to the page cache and queue them per directory (P3)."""
        by_dir: dict[str, list[tuple[str, int | None]]] = {}
        for path, ident in changes:
            if ident is None:
                self.cur.pop(path, None)
                for sub in [p for p in self.cur if p.startswith(path + "/")]:
                    del self.cur[sub]
            else:
                self.cur[path] = ident
                self.known.add(path)
            by_dir.setdefault(_parent(path), []).append((path, ident))
        for directory, group in by_dir.items():
            if self._classify(directory) is FileClass.IGNORED and not any(
                self._classify(p) is not FileClass.IGNORED for p, _ in group
            ):
                continue
            self._seq += 1
            self.pending.setdefault(directory, []).append(
                _EntryOp(self._seq, directory, tuple(group), what)
            )

    def apply(self, call: Call) -> bool:
        """Follow one completed call; whether it changed anything the model tracks."""
        if call.name in _CLONES:
            self._clone(call)  # the child's descriptors, whatever the parent's call returned
            return False
        handler = _HANDLERS.get(call.name)
        if handler is None or not call.ok:
            return False  # a failed call changed nothing
        return handler(self, call)

    def _close(self, call: Call) -> bool:
        fd = _fd_number(call)
        if fd is not None:
            self._table(call.pid).pop(fd, None)
        return False

    def _dup(self, call: Call) -> bool:
        if call.name == "fcntl" and not _is_dupfd(call):
            return False
        fd = _fd_number(call)
        table = self._table(call.pid)
        if fd is not None and call.ret is not None and fd in table:
            table[call.ret] = table[fd]  # one open file description, two descriptors
        elif call.ret is not None:
            table.pop(call.ret, None)
        return False

    def _lseek(self, call: Call) -> bool:
        desc = self._desc(call)
        if desc is not None and call.ret is not None:
            desc.offset = call.ret
        return False

    def _ftruncate(self, call: Call) -> bool:
        node = self._node_of(call)
        if node is None or node.klass is FileClass.IGNORED:
            return False
        self._data(node, ("trunc", _int(call.args[1]), b""))
        return True

    def _unlink(self, call: Call) -> bool:
        path = call.path_arg()
        if path is None or self._untracked(path):
            return False
        self._entry(path, None, f"{call.name} {_short(path)}")
        return True

    def _mkdir(self, call: Call) -> bool:
        path = call.path_arg()
        if path is None or self._untracked(path):
            return False
        self._entry(path, DIR, f"mkdir {_short(path)}")
        return True

    def _unfollowed(self, call: Call) -> bool:
        path = call.fd_path(0) if call.name != "truncate" else call.string(0)
        if path is not None and not self._untracked(path):
            raise TraceError(f"{call.name} on {path}: the power model does not follow it")
        return False

    def _untracked(self, path: str) -> bool:
        return self._classify(path) is FileClass.IGNORED

    def _clone(self, call: Call) -> None:
        if call.ret is None or call.ret <= 0:
            return
        shares = "CLONE_FILES" in " ".join(call.args) or "CLONE_THREAD" in " ".join(call.args)
        parent = self._table(call.pid)
        self._tables[call.ret] = parent if shares else dict(parent)

    def _desc(self, call: Call) -> _Desc | None:
        fd = _fd_number(call)
        return None if fd is None else self._table(call.pid).get(fd)

    def _open(self, call: Call) -> bool:
        path = call.ret_path or call.path_arg()
        if path is None or call.ret is None:
            return False
        klass = self._classify(path)
        table = self._table(call.pid)
        if klass is FileClass.IGNORED:
            table.pop(call.ret, None)
            return False
        flags = call.args[2] if len(call.args) > 2 else ""
        changed = False
        ident = self.cur.get(path)
        if ident == DIR:
            table.pop(call.ret, None)
            return False
        if ident is None:
            if "O_CREAT" not in flags:
                raise TraceError(f"{path} was opened but the model has no such file")
            node = self._new(klass)
            self._entry(path, node.ident, f"create {_short(path)}")
            changed = True
        else:
            node = self.nodes[ident]
            if "O_TRUNC" in flags and node.data:
                self._data(node, ("trunc", 0, b""))
                changed = True
        table[call.ret] = _Desc(node, append="O_APPEND" in flags)
        return changed

    def _write(self, call: Call) -> bool:
        node = self._node_of(call)
        if node is None or node.klass is FileClass.IGNORED:
            return False
        data = call.data(1)
        if data is None:
            raise TraceError(f"call #{call.index}: the bytes of a {call.name} were not recorded")
        assert call.ret is not None
        data = data[: call.ret]
        desc = self._desc(call)
        if call.name == "pwrite64":
            offset = _int(call.args[3])
        elif desc is None or desc.append or desc.node is not node:
            offset = len(node.data)
        else:
            offset = desc.offset
        if desc is not None and call.name == "write":
            desc.offset = offset + len(data)
        self._data(node, ("write", offset, data))
        return True

    def _data(self, node: _Node, op: tuple[str, int, bytes]) -> None:
        self._seq += 1
        node.touched = self._seq
        _do(node.data, op)
        node.pending.append(op)

    def _sync(self, call: Call) -> bool:
        path = call.fd_path(0)
        desc = self._desc(call)
        if desc is not None:
            node: _Node | None = desc.node
        elif path is not None and self.cur.get(path) == DIR:
            return self._sync_dir(path)
        else:
            node = self._node_at(path)
        if node is None:
            return False
        if node.klass is FileClass.IGNORED:
            return False
        node.synced = bytes(node.data)  # P5
        node.pending.clear()
        return True

    def _sync_dir(self, path: str) -> bool:
        if self._untracked(path):
            return False
        ops = self.pending.pop(path, [])
        for op in ops:
            _apply_entries(self.durable, op)
        return True

    def _rename(self, call: Call) -> bool:
        old = call.path_arg()
        new = _second_path(call)
        if old is None or new is None:
            raise TraceError(f"call #{call.index}: cannot tell the paths of a {call.name}")
        if self._untracked(old) and self._untracked(new):
            return False
        ident = self.cur.get(old)
        if ident is None:
            raise TraceError(f"{call.name} of {old}, which the model does not have")
        moved: list[tuple[str, int | None]] = [(old, None), (new, ident)]
        if ident == DIR:
            for sub in sorted(p for p in self.cur if p.startswith(old + "/")):
                moved.append((new + sub[len(old) :], self.cur[sub]))
        what = f"rename {_short(old)} -> {_short(new)}"
        if _parent(old) == _parent(new):
            self._entries(tuple(moved), what)
        else:
            self._entries(tuple(moved[:1]), what)
            self._entries(tuple(moved[1:]), what)
        return True

    def _link(self, call: Call) -> bool:
        old = call.path_arg()
        new = _second_path(call)
        if old is None or new is None or self._untracked(new):
            return False
        ident = self.cur.get(old)
        if ident is None or ident == DIR:
            raise TraceError(f"link of {old}, which the model does not have as a file")
        self._entry(new, ident, f"link {_short(old)} -> {_short(new)}")
        return True

    # ------------------------------------------------------------------ building states

    def dimensions(self) -> list[tuple[str, int]]:
        """What may be lost now: ``("file:ID", n)`` / ``("dir:PATH", n)`` with n choices."""
        dims: list[tuple[str, int]] = []
        written = [n for n in self.nodes.values() if n.klass is FileClass.SUBJECT and n.pending]
        for node in sorted(written, key=lambda n: -n.touched):  # the latest written first
            dims.append((f"file:{node.ident}", len(node.pending)))
        for directory, ops in sorted(self.pending.items()):
            if ops and not self._untracked(directory):
                dims.append((f"dir:{directory}", len(ops)))
        return dims

    def state(self, keep: Mapping[str, float], kind: str) -> PowerState:
        """The state that keeps, per dimension, this many of its pending operations.

        A whole number keeps that many; ``k + 0.5`` keeps ``k`` and the next write cut at
        its middle; ``k + 0.9`` keeps ``k`` and the next write but its last byte (P2).
        Dimensions not named keep nothing (the minimal state).
        """
        names = self.cur_names()
        entries = dict(self.durable)
        lost: list[str] = []
        survivors: list[_EntryOp] = []
        for directory, ops in self.pending.items():
            if self._untracked(directory):
                survivors.extend(ops)  # an untracked directory is not under test
                continue
            n = int(keep.get(f"dir:{directory}", 0))
            survivors.extend(ops[:n])
            for op in ops[n:]:
                lost.append(f"entry lost: {op.what} (directory {_short(directory)} not synced)")
        for op in sorted(survivors, key=lambda o: o.seq):
            _apply_entries(entries, op)
        files: dict[str, bytes] = {}
        world: dict[str, bytes] = {}
        dirs = {p for p, ident in entries.items() if ident == DIR}
        for path, ident in self.cur.items():
            if ident != DIR and self.nodes[ident].klass is FileClass.WORLD:
                world[path] = bytes(self.nodes[ident].data)
        for path, ident in entries.items():
            if ident == DIR or not _reachable(path, dirs, self.known):
                continue
            node = self.nodes[ident]
            if node.klass is FileClass.WORLD:
                continue
            content, note = _content(node, keep.get(f"file:{node.ident}", 0))
            if note:
                lost.append(f"{_short(path)}: {note}")
            files[path] = content
        for path in names:
            if path not in files and path not in dirs and self.cur[path] != DIR:
                if self.nodes[self.cur[path]].klass is FileClass.SUBJECT:
                    lost.append(f"file gone: {_short(path)}")
        reachable_dirs = frozenset(d for d in dirs if _reachable(d, dirs, self.known))
        return PowerState(files, reachable_dirs, world, tuple(lost), kind)

    def label(self, kind: str) -> str:
        """``kind`` with ``file:ID`` and ``dir:PATH`` named by their (short) paths."""

        def name(match: re.Match[str]) -> str:
            if match.group(1) == "dir":
                return f"dir {_short(match.group(2))}"
            ident = int(match.group(2))
            paths = [p for p, i in self.cur.items() if i == ident]
            return f"file {_short(paths[0]) if paths else f'#{ident} (removed)'}"

        return re.sub(r"\b(file|dir):(\d+|/\S*)", name, kind)

    def is_log(self, name: str) -> bool:
        """Whether dimension ``file:ID`` is a session log (``….jsonl``)."""
        ident = int(name.split(":", 1)[1])
        return any(i == ident and p.endswith(".jsonl") for p, i in self.cur.items())

    def cur_names(self) -> list[str]:
        return sorted(self.cur)

    def pending_bytes(self, node_id: int) -> int:
        return sum(len(op[2]) for op in self.nodes[node_id].pending)


_HANDLERS: dict[str, Callable[[Model, Call], bool]] = {
    "openat": Model._open,
    "close": Model._close,
    "dup": Model._dup,
    "dup2": Model._dup,
    "dup3": Model._dup,
    "fcntl": Model._dup,  # F_DUPFD only
    "lseek": Model._lseek,
    "write": Model._write,
    "pwrite64": Model._write,
    "ftruncate": Model._ftruncate,
    "fsync": Model._sync,
    "fdatasync": Model._sync,
    "rename": Model._rename,
    "renameat": Model._rename,
    "renameat2": Model._rename,
    "link": Model._link,
    "linkat": Model._link,
    "unlink": Model._unlink,
    "unlinkat": Model._unlink,
    "rmdir": Model._unlink,
    "mkdir": Model._mkdir,
    "mkdirat": Model._mkdir,
    # Calls that write in ways the model does not replay: refused on a followed file.
    "writev": Model._unfollowed,
    "pwritev": Model._unfollowed,
    "pwritev2": Model._unfollowed,
    "sendfile": Model._unfollowed,
    "copy_file_range": Model._unfollowed,
    "truncate": Model._unfollowed,
}
"""What each traced call does to the model (a call not named here changes nothing)."""


def _content(node: _Node, keep: float) -> tuple[bytes, str]:
    data = bytearray(node.synced)
    whole = int(keep)
    for op in node.pending[:whole]:
        _do(data, op)
    note = ""
    if keep != whole and whole < len(node.pending):
        op = node.pending[whole]
        if op[0] == "write" and op[2]:
            cut = len(op[2]) // 2 if keep - whole < 0.75 else len(op[2]) - 1
            _do(data, ("write", op[1], op[2][:cut]))
            note = f"write {whole + 1} of {len(node.pending)} unsynced torn at byte {cut}"
    dropped = len(node.pending) - whole - (1 if note else 0)
    if dropped > 0:
        lost_bytes = sum(len(op[2]) for op in node.pending[len(node.pending) - dropped :])
        prefix = f"{note}; " if note else ""
        note = f"{prefix}{dropped} unsynced operation(s) lost ({lost_bytes} bytes)"
    return bytes(data), note


def _do(data: bytearray, op: tuple[str, int, bytes]) -> None:
    kind, at, payload = op
    if kind == "trunc":
        if at < len(data):
            del data[at:]
        else:
            data.extend(b"\0" * (at - len(data)))
        return
    if at > len(data):
        data.extend(b"\0" * (at - len(data)))
    data[at : at + len(payload)] = payload


def _apply_entries(entries: dict[str, int], op: _EntryOp) -> None:
    for path, ident in op.changes:
        if ident is None:
            entries.pop(path, None)
            for sub in [p for p in entries if p.startswith(path + "/")]:
                del entries[sub]
        else:
            entries[path] = ident


def _reachable(path: str, dirs: set[str] | frozenset[str], known: set[str]) -> bool:
    """Every ancestor directory the model follows survived (P4); those above it are there."""
    parent = _parent(path)
    while parent not in ("", "/"):
        if parent in known and parent not in dirs:
            return False
        parent = _parent(parent)
    return True


def _parent(path: str) -> str:
    head, _, _ = path.rstrip("/").rpartition("/")
    return head or "/"


def _short(path: str) -> str:
    parts = path.split("/")
    return "/".join(parts[-3:]) if len(parts) > 3 else path


def _int(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError as exc:
        raise TraceError(f"not a number in the trace: {text!r}") from exc


def _fd_number(call: Call) -> int | None:
    if not call.args:
        return None
    head = call.args[0].split("<", 1)[0]
    return int(head) if head.lstrip("-").isdigit() else None


def _is_dupfd(call: Call) -> bool:
    return len(call.args) > 1 and call.args[1].startswith("F_DUPFD")


def _second_path(call: Call) -> str | None:
    """The new name of a ``rename*``/``link*``, made absolute against its directory."""
    if call.name in ("rename", "link"):
        return call.string(1)
    name = call.string(3)
    if name is None or name.startswith("/"):
        return name
    base = call.fd_path(2)
    return f"{base}/{name}" if base is not None else None


# =========================================================================== exploring


def choices(
    dims: Sequence[tuple[str, int]],
    *,
    full: bool,
    cap: int,
    tear: Callable[[str], bool] = lambda name: True,
) -> Iterator[tuple[dict[str, float], str]]:
    """The states to build at one cut: (keep per dimension, kind), minimal first.

    Bounded (``full=False``): the minimal state, and when the file written last is one
    ``tear`` accepts (the session log), that file's unsynced tail torn in its first write
    with everything else minimal: a commit's line half on disk.
    """
    yield {}, "minimal"
    if not dims:
        return
    produced = 1
    maximal = {name: float(n) for name, n in dims}
    if not full:
        latest = dims[0][0]
        if latest.startswith("file:") and tear(latest) and produced < cap:
            yield {latest: 0.5}, f"{latest} torn"
        return
    yield maximal, "maximal"
    produced += 1
    for name, n in dims:
        steps: list[float] = []
        for k in range(n + 1):
            steps.append(float(k))
            if name.startswith("file:") and k < n:
                steps += [k + 0.5, k + 0.9]
        empty: dict[str, float] = {}
        for base_kind, base in (("minimal", empty), ("maximal", maximal)):
            for step in steps:
                if produced >= cap:
                    return
                keep = dict(base)
                keep[name] = step
                produced += 1
                yield keep, f"{name} keeps {step:g} of {n} ({base_kind} elsewhere)"


def explore(
    model: Model,
    calls: Sequence[Call],
    *,
    full: bool,
    cap: int,
    describe: Callable[[Call], str] = lambda c: f"{c.name}",
) -> Iterator[Cut]:
    """Follow ``calls`` through ``model``; after every call that changed it, the cut's states."""
    seen: set[str] = set()

    def cut(index: int, text: str) -> Cut:
        states = []
        for keep, kind in choices(model.dimensions(), full=full, cap=cap, tear=model.is_log):
            state = model.state(keep, model.label(kind))
            key = state.digest()
            if key in seen:
                continue
            seen.add(key)
            states.append(state)
        return Cut(index, text, tuple(states))

    yield cut(-1, "before the run")
    for call in calls:
        if model.apply(call):
            yield cut(call.index, describe(call))
