"""Fixture-driven tests fail loudly: no silent run of zero cases.

A test parametrized over files (the conformance fixtures, the planner fixtures, the
documents) collects nothing when the files are not where it looks, and pytest reports that
as zero tests, not as a failure. These helpers make a missing file, or fewer cases than the
suite is known to hold, an error at collection.

The fixtures are the repository's copy of the spec bundle under ``tests/conformance/``
(``tests/test_conformance.py`` keeps it byte-identical to ``../shared/spec`` where that
exists, which is only on developer machines): tests read them from there and nowhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

CONFORMANCE = Path(__file__).resolve().parent / "conformance"

T = TypeVar("T")


class MissingFixtures(Exception):
    """A fixture file or folder is absent, or holds fewer cases than it is known to."""


def conformance_path(*parts: str) -> Path:
    """``tests/conformance/PARTS``, which must exist."""
    path = CONFORMANCE.joinpath(*parts)
    if not path.exists():
        raise MissingFixtures(f"fixture {path} is missing (the repository's spec-bundle copy)")
    return path


def at_least(minimum: int, cases: Sequence[T], what: str) -> list[T]:
    """``cases``, when there are at least ``minimum`` of them (else :class:`MissingFixtures`).

    ``minimum`` is what the suite holds today, written down: a folder that moved or emptied
    fails the collection instead of running nothing.
    """
    if len(cases) < minimum:
        raise MissingFixtures(f"found {len(cases)} {what}, expected at least {minimum}")
    return list(cases)
