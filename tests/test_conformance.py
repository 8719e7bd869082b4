"""Reducer conformance against the bundled golden fixtures (spec section 16).

Runs every case of ``tests/conformance/fixtures/manifest.json`` exactly as the spec
bundle's README prescribes: the raw bytes go to :func:`tether.core.reduce_session`,
the result is encoded as ``{"ok": true, "state": ...}`` / ``{"ok": false, "error": ...}``
and compared with the expected file by JSON-value equality.

Planner conformance lives in ``tests/test_planner.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from fixturekit import at_least, conformance_path
from tether.core import SessionCorruption, reduce_session

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFORMANCE = REPO_ROOT / "tests" / "conformance"
FIXTURES = CONFORMANCE / "fixtures"
SCHEMAS = CONFORMANCE / "schemas"
UPSTREAM_SPEC = REPO_ROOT.parent / "shared" / "spec"

# Everything copied verbatim from the spec bundle (README.md is copied with a note).
COPIED_DIRS = ("fixtures", "planner-fixtures", "schemas")
COPIED_FILES = ("LICENSE-fixtures",)
README_NOTE_END = b"END OF PROVENANCE NOTE\n-->\n"


def _load_json(path: Path) -> Any:
    return json.loads(path.read_bytes())


MIN_CASES = 36
"""The reducer fixtures the spec bundle holds today (32 of them schema-valid): a manifest
that is missing or lists fewer fails the collection instead of running zero cases."""
MIN_SCHEMA_VALID_CASES = 32

MANIFEST: dict[str, Any] = _load_json(conformance_path("fixtures", "manifest.json"))
CASES: list[dict[str, Any]] = at_least(MIN_CASES, MANIFEST["fixtures"], "reducer fixtures")


def _reduce_result(data: bytes) -> dict[str, Any]:
    """The spec's result encoding (README step 3)."""
    try:
        state = reduce_session(data)
    except SessionCorruption as exc:
        return {"ok": False, "error": exc.to_json()}
    return {"ok": True, "state": state.to_json()}


def _schema_validator(schema_file: str, pointer: str = "") -> Draft202012Validator:
    """A Draft 2020-12 validator for ``schema_file`` or one of its ``$defs``."""
    schema = _load_json(SCHEMAS / schema_file)
    if not pointer:
        Draft202012Validator.check_schema(schema)
        return Draft202012Validator(schema)
    resource = Resource.from_contents(schema, default_specification=DRAFT202012)
    registry: Registry[Any] = Registry().with_resource(schema["$id"], resource)
    return Draft202012Validator({"$ref": f"{schema['$id']}#{pointer}"}, registry=registry)


# session.schema.json's top level is oneOf(header, transaction); the spec says line 1
# must be the header and every later line a transaction, so validate against each
# definition separately rather than against the ambiguous top level.
HEADER_VALIDATOR = _schema_validator("session.schema.json", "/$defs/header")
TRANSACTION_VALIDATOR = _schema_validator("session.schema.json", "/$defs/transaction")


def _committed_lines(data: bytes) -> list[bytes]:
    """The lines of the committed region (spec 2.1/2.2); the torn tail is dropped."""
    end = data.rfind(b"\n")
    if end < 0:
        return []
    return data[: end + 1].split(b"\n")[:-1]


def test_manifest_is_complete() -> None:
    assert MANIFEST["version"] == 1
    assert CASES, "the fixture manifest lists no cases"
    names = [case["name"] for case in CASES]
    assert len(names) == len(set(names)), "duplicate fixture names"
    listed = {case["file"] for case in CASES} | {case["expected"] for case in CASES}
    on_disk = {p.name for p in FIXTURES.iterdir()} - {"manifest.json"}
    assert listed == on_disk


def test_manifest_validates_against_its_schema() -> None:
    _schema_validator("fixtures/manifest.schema.json").validate(MANIFEST)


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_reducer_fixture(case: dict[str, Any]) -> None:
    data = (FIXTURES / case["file"]).read_bytes()
    expected = _load_json(FIXTURES / case["expected"])
    assert _reduce_result(data) == expected


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_expected_file_matches_schema(case: dict[str, Any]) -> None:
    validator = _schema_validator("expected-state.schema.json")
    validator.validate(_load_json(FIXTURES / case["expected"]))


SCHEMA_VALID_CASES = at_least(
    MIN_SCHEMA_VALID_CASES,
    [case for case in CASES if case["schemaValid"]],
    "schema-valid reducer fixtures",
)


@pytest.mark.parametrize(
    "case", SCHEMA_VALID_CASES, ids=[case["name"] for case in SCHEMA_VALID_CASES]
)
def test_committed_lines_match_session_schema(case: dict[str, Any]) -> None:
    data = (FIXTURES / case["file"]).read_bytes()
    lines = _committed_lines(data)
    assert lines, "a schema-valid fixture has at least a header line"
    for number, line in enumerate(lines, start=1):
        if not line:
            # An empty line is a framing error (BLANK_LINE), not a JSON value; the
            # schema says nothing about it.
            continue
        value = json.loads(line)  # a trailing CR is JSON whitespace
        validator = HEADER_VALIDATOR if number == 1 else TRANSACTION_VALIDATOR
        errors = sorted(validator.iter_errors(value), key=lambda e: list(e.path))
        assert not errors, f"line {number}: {errors[0].message}"


def _relative_files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*") if p.is_file()}


# The one test that may skip: the shared bundle exists only on developer machines.
@pytest.mark.skipif(not UPSTREAM_SPEC.is_dir(), reason="upstream spec bundle not present")
def test_copies_are_byte_identical_to_upstream() -> None:
    for name in COPIED_DIRS:
        upstream, copy = UPSTREAM_SPEC / name, CONFORMANCE / name
        assert _relative_files(copy) == _relative_files(upstream), name
        for rel in sorted(_relative_files(upstream)):
            assert (copy / rel).read_bytes() == (upstream / rel).read_bytes(), f"{name}/{rel}"
    for name in COPIED_FILES:
        assert (CONFORMANCE / name).read_bytes() == (UPSTREAM_SPEC / name).read_bytes(), name
    readme = (CONFORMANCE / "README.md").read_bytes()
    assert README_NOTE_END in readme
    assert readme.split(README_NOTE_END, 1)[1] == (UPSTREAM_SPEC / "README.md").read_bytes()
    spec = REPO_ROOT / "docs" / "SESSION_FORMAT.md"
    assert spec.read_bytes() == (UPSTREAM_SPEC / "SESSION_FORMAT.md").read_bytes()
