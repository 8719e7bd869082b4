"""Benchmark of ArtifactScanner.version() against plain directory walks.

Run: ``python bench/bench_artifact.py`` (about 20 s; ``--dirs``/``--files`` change the tree).
Everything happens in a temporary directory on the file system of ``$TMPDIR``.

Workload: a tree of 100 directories x 100 files (10,000 files) of 200-400 bytes each. The
files are left alone for more than the racy margin (2 s) before anything is timed, as a
workspace is between two verifications; otherwise every file would be hashed again.

Physical baselines, measured in the same run:

* ``walk+stat``: a recursive ``os.scandir`` walk that calls
  ``entry.stat(follow_symlinks=False)`` on every file; the least any change detection
  based on file metadata must do;
* ``walk``: the same walk listing names only (no stat);
* ``git ls-files`` (git variant only): the subprocess the scanner runs in git mode.

Printed figures (acceptance target in brackets):

* ``artifact.warm``: ``version()`` on a scanner that has scanned the unchanged tree before
  (in-process cache), against ``walk+stat`` [< 1.5x], and against ``walk``;
* ``artifact.warm_file``: ``version()`` of a fresh scanner whose cache file (``cache_path``)
  was written by an earlier scanner (the ``tether verify`` case);
* ``artifact.one_edit``: ``version()`` on a warm scanner after one file was rewritten;
* ``artifact.cold``: ``version()`` of a fresh scanner without a cache (every file read and
  hashed; the page cache is warm, so this is CPU and system-call cost, not disk);
* the same in a git work tree (all files committed), where the listing comes from
  ``git ls-files`` and each file is ``lstat``-ed by path.

Estimator: rounds that run every contender once, in rotating order; each figure is the best
(minimum) over the rounds, so that a disturbance from other processes hits all alike.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from tether._completion.artifact import ArtifactScanner


def build_tree(root: str, dirs: int, files: int) -> None:
    rng = random.Random(0)
    alphabet = b"abcdefghijklmnopqrstuvwxyz     \n"
    for d in range(dirs):
        sub = os.path.join(root, f"pkg{d:03d}")
        os.mkdir(sub)
        for f in range(files):
            body = bytes(rng.choice(alphabet) for _ in range(rng.randint(200, 400)))
            with open(os.path.join(sub, f"mod{f:03d}.py"), "wb") as fh:
                fh.write(body)


def walk_stat(path: str) -> int:
    n = 0
    with os.scandir(path) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                n += walk_stat(entry.path)
            else:
                entry.stat(follow_symlinks=False)
                n += 1
    return n


def walk_names(path: str) -> int:
    n = 0
    with os.scandir(path) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                n += walk_names(entry.path)
            else:
                n += 1
    return n


def best_of(contenders: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Best time (s) of each contender over `rounds` rounds, rotating the order."""
    best = dict.fromkeys(contenders, float("inf"))
    names = list(contenders)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            contenders[name]()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def settle(seconds: float = 2.2) -> None:
    """Let the racy margin pass: files written just now are not trusted from a cache."""
    time.sleep(seconds)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}ms"


def report(label: str, mine: float, base: dict[str, float], note: str = "") -> None:
    ratios = ", ".join(f"{mine / t:.2f}x vs {name} ({ms(t)})" for name, t in base.items())
    print(f"{label:<22} {ms(mine):>8}  {ratios}{note}")


def bench(root: str, rounds: int, *, git: bool) -> None:
    cache_file = os.path.join(root, ".tether", "artifact-cache")
    os.makedirs(os.path.dirname(cache_file), exist_ok=True)
    warm = ArtifactScanner(root)
    first = warm.version()
    ArtifactScanner(root, cache_path=cache_file).version()  # writes the cache file
    assert warm.version() is first

    def from_file() -> None:
        ArtifactScanner(root, cache_path=cache_file).version()

    def git_list() -> None:
        subprocess.run(
            ["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            stdout=subprocess.DEVNULL,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
            check=True,
        )

    contenders: dict[str, Callable[[], object]] = {
        "walk+stat": lambda: walk_stat(root),
        "walk": lambda: walk_names(root),
        "warm": warm.version,
        "warm_file": from_file,
    }
    if git:
        contenders["git ls-files"] = git_list
    best = best_of(contenders, rounds)
    base = {"walk+stat": best["walk+stat"], "walk": best["walk"]}
    if git:
        base["git ls-files"] = best["git ls-files"]
    tag = "git." if git else ""
    target = " [target < 1.5x walk+stat]"
    report(f"artifact.{tag}warm", best["warm"], base, target)
    report(f"artifact.{tag}warm_file", best["warm_file"], base)

    # One edited file on a warm scanner (the edited file is then racy and read each time).
    victim = os.path.join(root, "pkg000", "mod000.py")
    counter = [0]

    def one_edit() -> None:
        counter[0] += 1
        with open(victim, "ab") as fh:
            fh.write(b"#")
        warm.version()

    edit = best_of({"one_edit": one_edit}, rounds)["one_edit"]
    report(f"artifact.{tag}one_edit", edit, base)

    cold = best_of({"cold": lambda: ArtifactScanner(root).version()}, max(3, rounds // 3))
    report(f"artifact.{tag}cold", cold["cold"], base, "  (full hash, page cache warm)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dirs", type=int, default=100)
    parser.add_argument("--files", type=int, default=100, help="files per directory")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    total = args.dirs * args.files
    print(f"tree: {args.dirs} dirs x {args.files} files = {total} files of 200-400 bytes")
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp:
        plain = os.path.join(tmp, "plain")
        os.mkdir(plain)
        build_tree(plain, args.dirs, args.files)
        settle()
        print("-- plain directory (walk mode)")
        bench(plain, args.rounds, git=False)

        if shutil.which("git") is None:
            print("-- git variant skipped: git is not installed")
            return 0
        repo = os.path.join(tmp, "repo")
        os.mkdir(repo)
        build_tree(repo, args.dirs, args.files)
        with open(os.path.join(repo, ".gitignore"), "w") as fh:
            fh.write(".tether/\n")
        env = {
            **os.environ,
            "GIT_AUTHOR_NAME": "bench",
            "GIT_AUTHOR_EMAIL": "bench@example.invalid",
            "GIT_COMMITTER_NAME": "bench",
            "GIT_COMMITTER_EMAIL": "bench@example.invalid",
        }
        for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "tree"]):
            subprocess.run(["git", "-C", repo, *command], env=env, check=True)
        settle()
        print("-- git work tree (git mode, everything committed)")
        bench(repo, args.rounds, git=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
