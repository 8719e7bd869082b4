"""Suite-wide collection rules.

``make test`` runs the suite on every core (pytest-xdist, ``--dist loadgroup``). Tests that
share one outside resource that a test may take down are kept on one worker, in order:

* ``postgres``: every test that talks to the PostgreSQL server of ``.ci/run``. The restart
  test of ``tests/test_pg_workers.py`` stops and starts that cluster, which would break a
  PostgreSQL test running beside it on another worker.
"""

from __future__ import annotations

import pytest

_POSTGRES_FIXTURES = frozenset({"pg_url", "pg_store"})


def _uses_postgres(item: pytest.Item) -> bool:
    if item.path.name.startswith("test_pg_"):
        return True
    if _POSTGRES_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    # Parametrized over stores or databases, the server fixture fetched by name
    # (request.getfixturevalue) for the "postgres" parameter (tests/test_seams.py).
    callspec = getattr(item, "callspec", None)
    return callspec is not None and "postgres" in map(str, callspec.params.values())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _uses_postgres(item):
            item.add_marker(pytest.mark.xdist_group("postgres"))
