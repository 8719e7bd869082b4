"""Unit and property tests of the pure parts of honest completion.

* :mod:`tether.core.gate` — the completion verdict (verified / failed / stale /
  missing) and ``name_files``;
* :mod:`tether.core.stops` — ``repeated_failure``, ``budget_exhausted``,
  ``describe_call``;
* :mod:`tether._completion.evidence` — the ``verification_status`` rule table;
* :mod:`tether._completion.artifact` — ``ArtifactVersion.changed_since``;
* :mod:`tether._runtime.guards` — the pure helpers (``is_failure``, ``arguments_digest``,
  ``call_summary``, ``denial_text``, ``follow_up_prompt``, ``_previous_tool_result``).

Nothing here touches the disk, a database or a subprocess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether._completion.artifact import ArtifactVersion
from tether._completion.evidence import Verification, VerificationStatus, verification_status
from tether._completion.verify import VerifyTool
from tether._runtime.guards import (
    MAX_SUMMARY,
    _previous_tool_result,
    arguments_digest,
    call_summary,
    denial_text,
    follow_up_prompt,
    is_failure,
)
from tether._tools.base import ToolResult
from tether._tools.builtin import BashTool, EditTool, ReadTool, WriteTool
from tether.core.gate import (
    MAX_NAMED_FILES,
    CompletionCheck,
    CompletionStatus,
    assess_completion,
    name_files,
)
from tether.core.state import IDLE, Header, SessionState, Usage
from tether.core.stops import (
    BUDGET_EXHAUSTED,
    REPEATED_FAILURE,
    FailedCall,
    StopError,
    budget_exhausted,
    describe_call,
    repeated_failure,
)

CMD = "pytest -q"
DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64
DIGEST_C = "sha256:" + "c" * 64
FILE_1 = "sha256:" + "1" * 64
FILE_2 = "sha256:" + "2" * 64
FILE_3 = "sha256:" + "3" * 64

PASSED = VerificationStatus.PASSED
FAILED = VerificationStatus.FAILED
ERROR = VerificationStatus.ERROR
VOID = VerificationStatus.VOID


# --------------------------------------------------------------------------- builders


def verification(
    status: VerificationStatus = PASSED,
    *,
    id: str = "V-1",
    version: str | None = DIGEST_A,
    version_end: str | None = None,
    command: str = CMD,
    exit_status: int | None = None,
    timed_out: bool = False,
    error: str | None = None,
) -> Verification:
    """A verification; ``exit_status`` defaults to what ``status`` suggests."""
    if exit_status is None and status is PASSED:
        exit_status = 0
    if exit_status is None and status is FAILED and not timed_out:
        exit_status = 1
    return Verification(
        id=id,
        session_id="S-1",
        tool_started_id=None,
        command=command,
        exit_status=exit_status,
        timed_out=timed_out,
        error=error,
        output_digest="sha256:" + "0" * 64,
        output_tail="",
        version_start=version,
        version_end=version if version_end is None else version_end,
        started_at_ms=1_700_000_000_000,
        duration_ms=12,
        status=status,
    )


def version(digest: str, files: Mapping[str, str] | None = None) -> ArtifactVersion:
    return ArtifactVersion(digest, dict(files or {}))


CURRENT = version(DIGEST_A, {"src/b.py": FILE_2, "src/a.py": FILE_1})


def assess(
    *,
    command: str | None = CMD,
    at_current: Verification | None = None,
    last_passing: Verification | None = None,
    passing_version: ArtifactVersion | None = None,
    current: ArtifactVersion = CURRENT,
) -> CompletionCheck:
    return assess_completion(
        current,
        command=command,
        at_current=at_current,
        last_passing=last_passing,
        passing_version=passing_version,
    )


# --------------------------------------------------------------------------- gate: unit


def test_no_command_is_missing_whatever_the_evidence() -> None:
    check = assess(
        command=None,
        at_current=verification(PASSED, version=DIGEST_A),
        last_passing=verification(PASSED, version=DIGEST_A),
        passing_version=CURRENT,
    )
    assert check.status is CompletionStatus.MISSING
    assert not check.verified
    assert check.version == DIGEST_A
    assert check.command is None
    assert check.evidence_id is None
    assert "no check command is configured" in check.message
    assert check.message.startswith("unverified")


def test_passing_check_of_the_current_version_is_verified() -> None:
    check = assess(at_current=verification(PASSED, id="V-now", command="make check"))
    assert check.status is CompletionStatus.VERIFIED
    assert check.verified
    assert check.version == DIGEST_A
    assert check.evidence_id == "V-now"
    assert check.command == "make check"
    assert check.changed_files == ()
    assert check.message.startswith("verified")
    assert "`make check` passed" in check.message


def test_verified_when_an_older_version_also_passed() -> None:
    older = version(DIGEST_B, {"src/a.py": FILE_3})
    check = assess(
        at_current=verification(PASSED, id="V-now"),
        last_passing=verification(PASSED, id="V-old", version=DIGEST_B),
        passing_version=older,
    )
    assert check.status is CompletionStatus.VERIFIED
    assert check.evidence_id == "V-now"
    assert check.changed_files == ()


def test_failed_with_exit_status_says_it_exited() -> None:
    check = assess(at_current=verification(FAILED, id="V-bad", exit_status=1))
    assert check.status is CompletionStatus.FAILED
    assert not check.verified
    assert check.evidence_id == "V-bad"
    assert check.command == CMD
    assert check.version == DIGEST_A
    assert check.message.startswith("failed")
    assert "exited 1" in check.message
    assert f"`{CMD}`" in check.message


def test_error_without_exit_status_quotes_the_error() -> None:
    at = verification(ERROR, id="V-err", exit_status=None, error="cannot start check command")
    check = assess(at_current=at)
    assert check.status is CompletionStatus.FAILED
    assert check.evidence_id == "V-err"
    assert "cannot start check command" in check.message
    assert "exited" not in check.message
    assert "timed out" not in check.message


def test_timed_out_says_timed_out() -> None:
    at = verification(FAILED, id="V-slow", exit_status=None, timed_out=True)
    check = assess(at_current=at)
    assert check.status is CompletionStatus.FAILED
    assert check.message.endswith("timed out")
    assert "exited" not in check.message


def test_failed_is_never_verified_even_if_the_same_version_passed_before() -> None:
    check = assess(
        at_current=verification(FAILED, id="V-bad"),
        last_passing=verification(PASSED, id="V-good", version=DIGEST_A),
        passing_version=CURRENT,
    )
    assert check.status is CompletionStatus.FAILED
    assert check.evidence_id == "V-bad"
    assert check.changed_files == ()
    assert check.changes_known is True
    assert "changed since" not in check.message


def test_failed_names_the_files_changed_since_the_last_pass() -> None:
    older = version(DIGEST_B, {"src/a.py": FILE_1, "src/b.py": FILE_1})
    check = assess(
        at_current=verification(FAILED, id="V-bad"),
        last_passing=verification(PASSED, id="V-good", version=DIGEST_B),
        passing_version=older,
    )
    assert check.status is CompletionStatus.FAILED
    assert check.evidence_id == "V-bad"
    assert check.changed_files == ("src/b.py",)
    assert check.changes_known is True
    assert check.message.endswith("; changed since: src/b.py")


def test_stale_names_exactly_the_added_removed_and_modified_files_sorted() -> None:
    current = version(
        DIGEST_A,
        {"z_added.py": FILE_1, "same.py": FILE_1, "m_modified.py": FILE_2, "a_added.py": FILE_3},
    )
    passing = version(
        DIGEST_B,
        {
            "same.py": FILE_1,
            "m_modified.py": FILE_1,
            "y_removed.py": FILE_1,
            "b_removed.py": FILE_2,
        },
    )
    check = assess(
        current=current,
        last_passing=verification(PASSED, id="V-old", version=DIGEST_B, command="make"),
        passing_version=passing,
    )
    assert check.status is CompletionStatus.STALE
    assert not check.verified
    assert check.version == DIGEST_A
    assert check.evidence_id == "V-old"
    assert check.command == CMD  # the configured command
    assert check.changes_known is True
    expected = ("a_added.py", "b_removed.py", "m_modified.py", "y_removed.py", "z_added.py")
    assert check.changed_files == expected
    assert check.message.startswith("stale: `make` passed on an earlier version")
    assert check.message.endswith("changed since: " + ", ".join(expected))
    assert "same.py" not in check.message


def test_stale_without_manifest_does_not_know_the_changes() -> None:
    check = assess(
        last_passing=verification(PASSED, id="V-old", version=DIGEST_B),
        passing_version=None,
    )
    assert check.status is CompletionStatus.STALE
    assert check.evidence_id == "V-old"
    assert check.changes_known is False
    assert check.changed_files == ()
    assert "not known" in check.message


def test_stale_names_at_most_ten_files() -> None:
    now = {f"f{i:02}.py": FILE_1 for i in range(13)}
    check = assess(
        current=version(DIGEST_A, now),
        last_passing=verification(PASSED, version=DIGEST_B),
        passing_version=version(DIGEST_B, {}),
    )
    assert len(check.changed_files) == 13
    assert check.message.endswith("f09.py and 3 more")
    assert "f10.py" not in check.message


def test_nothing_on_record_is_missing() -> None:
    check = assess()
    assert check.status is CompletionStatus.MISSING
    assert check.version == DIGEST_A
    assert check.command == CMD
    assert check.evidence_id is None
    assert check.changed_files == ()
    assert f"`{CMD}` has never passed" in check.message


def test_at_current_of_another_version_is_rejected() -> None:
    with pytest.raises(ValueError, match="current version"):
        assess(at_current=verification(PASSED, version=DIGEST_B))
    with pytest.raises(ValueError):
        assess(at_current=verification(FAILED, version=None))


def test_to_json_round_trips_every_field() -> None:
    check = assess(
        at_current=verification(FAILED, id="V-bad"),
        last_passing=verification(PASSED, id="V-good", version=DIGEST_B),
        passing_version=version(DIGEST_B, {"src/a.py": FILE_1}),
    )
    data = check.to_json()
    assert set(data) == {
        "status",
        "version",
        "message",
        "command",
        "evidenceId",
        "changedFiles",
        "changesKnown",
    }
    rebuilt = CompletionCheck(
        status=CompletionStatus(data["status"]),
        version=data["version"],
        message=data["message"],
        command=data["command"],
        evidence_id=data["evidenceId"],
        changed_files=tuple(data["changedFiles"]),
        changes_known=data["changesKnown"],
    )
    assert rebuilt == check
    assert data["status"] == "failed"
    assert data["changedFiles"] == ["src/b.py"]
    assert isinstance(data["changedFiles"], list)


def test_error_with_exit_status_zero_reports_the_error() -> None:
    at = verification(ERROR, exit_status=0, error="workspace unreadable", version_end=None)
    check = assess(at_current=at)
    assert check.status is CompletionStatus.FAILED
    assert "workspace unreadable" in check.message


# --------------------------------------------------------------------------- gate: property

PATHS = st.sampled_from(["a.py", "b.py", "c/d.py", "e.txt", "z"])
FILE_DIGESTS = st.sampled_from([FILE_1, FILE_2, FILE_3])
MANIFESTS = st.dictionaries(PATHS, FILE_DIGESTS, max_size=5)


@settings(max_examples=200, deadline=None)
@given(
    command=st.one_of(st.none(), st.just(CMD)),
    at_status=st.one_of(st.none(), st.sampled_from([PASSED, FAILED, ERROR])),
    at_exit=st.one_of(st.none(), st.integers(-15, 255)),
    at_timed_out=st.booleans(),
    at_error=st.one_of(st.none(), st.text(min_size=1, max_size=20)),
    has_last_passing=st.booleans(),
    last_same_version=st.booleans(),
    has_manifest=st.booleans(),
    now_files=MANIFESTS,
    then_files=MANIFESTS,
)
def test_gate_verdict_property(
    command: str | None,
    at_status: VerificationStatus | None,
    at_exit: int | None,
    at_timed_out: bool,
    at_error: str | None,
    has_last_passing: bool,
    last_same_version: bool,
    has_manifest: bool,
    now_files: dict[str, str],
    then_files: dict[str, str],
) -> None:
    current = version(DIGEST_A, now_files)
    at_current = (
        None
        if at_status is None
        else verification(
            at_status,
            id="V-at",
            exit_status=at_exit,
            timed_out=at_timed_out,
            error=at_error,
        )
    )
    passing_digest = DIGEST_A if last_same_version else DIGEST_B
    last_passing = (
        verification(PASSED, id="V-last", version=passing_digest) if has_last_passing else None
    )
    if not has_manifest:
        passing_version = None
    elif last_same_version:
        passing_version = current
    else:
        passing_version = version(DIGEST_B, then_files)

    check = assess(
        command=command,
        current=current,
        at_current=at_current,
        last_passing=last_passing,
        passing_version=passing_version,
    )  # never raises

    assert check.version == DIGEST_A
    assert check.verified == (check.status is CompletionStatus.VERIFIED)
    at_passed = at_current is not None and at_current.status is PASSED
    assert check.verified == (command is not None and at_passed)
    if at_current is not None and at_current.status is not PASSED:
        assert not check.verified
        if command is not None:
            assert check.status is CompletionStatus.FAILED
            assert check.evidence_id == "V-at"
    if command is None:
        assert check.status is CompletionStatus.MISSING
        return
    if at_current is None:
        if last_passing is None:
            assert check.status is CompletionStatus.MISSING
            assert check.evidence_id is None
        else:
            assert check.status is CompletionStatus.STALE
            assert check.evidence_id == "V-last"
    if check.status in (CompletionStatus.STALE, CompletionStatus.FAILED):
        if last_passing is not None and passing_version is not None:
            then = passing_version.files
            expected = sorted(
                {p for p in now_files if then.get(p) != now_files[p]}
                | {p for p in then if p not in now_files}
            )
            assert list(check.changed_files) == expected
            assert check.changes_known
        else:
            assert check.changed_files == ()
            assert check.changes_known == (last_passing is None)
    else:
        assert check.changed_files == ()
    assert check.to_json()["status"] == check.status.value


# --------------------------------------------------------------------------- name_files


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (0, ""),
        (1, "p0"),
        (3, "p0, p1, p2"),
        (10, ", ".join(f"p{i}" for i in range(10))),
        (11, ", ".join(f"p{i}" for i in range(10)) + " and 1 more"),
        (25, ", ".join(f"p{i}" for i in range(10)) + " and 15 more"),
    ],
)
def test_name_files(count: int, expected: str) -> None:
    assert name_files([f"p{i}" for i in range(count)]) == expected


@given(st.lists(st.from_regex(r"[a-z]{1,6}", fullmatch=True), max_size=30))
def test_name_files_property(paths: list[str]) -> None:
    text = name_files(paths)
    shown = paths[:MAX_NAMED_FILES]
    assert text.startswith(", ".join(shown))
    hidden = len(paths) - MAX_NAMED_FILES
    assert text.endswith(f" and {hidden} more") == (hidden > 0)
    if hidden <= 0:
        assert text == ", ".join(paths)


# --------------------------------------------------------------------------- artifact


def test_changed_since_is_sorted_added_removed_modified() -> None:
    then = version(DIGEST_B, {"keep": FILE_1, "mod": FILE_1, "gone": FILE_1})
    now = version(DIGEST_A, {"new": FILE_1, "keep": FILE_1, "mod": FILE_2})
    assert now.changed_since(then) == ["gone", "mod", "new"]
    assert then.changed_since(now) == ["gone", "mod", "new"]
    assert now.changed_since(now) == []
    assert now.changed_since(version(DIGEST_C, dict(now.files))) == []


@given(MANIFESTS, MANIFESTS)
def test_changed_since_property(now: dict[str, str], then: dict[str, str]) -> None:
    changed = version(DIGEST_A, now).changed_since(version(DIGEST_B, then))
    assert changed == sorted(changed)
    assert len(set(changed)) == len(changed)
    assert set(changed) == {p for p in now.keys() | then.keys() if now.get(p) != then.get(p)}


# --------------------------------------------------------------------------- stops: repeated


def failed_call(
    tool: str = "bash",
    digest: str = "sha256:args",
    artifact: str | None = DIGEST_A,
    summary: str = "",
) -> FailedCall:
    return FailedCall(tool, digest, artifact, summary)


def test_repeated_failure_on_the_same_call_and_files() -> None:
    stop = repeated_failure(failed_call(), failed_call(summary="bash make"))
    assert isinstance(stop, StopError)
    assert stop.code == REPEATED_FAILURE == "repeated_failure"
    assert stop.message.startswith("bash make failed twice in a row")
    assert "files unchanged" in stop.message
    assert stop.to_json() == {"code": "repeated_failure", "message": stop.message}


def test_repeated_failure_without_summary_names_the_tool() -> None:
    stop = repeated_failure(failed_call(tool="edit"), failed_call(tool="edit"))
    assert stop is not None
    assert stop.message.startswith("edit failed twice")


@pytest.mark.parametrize(
    "previous",
    [
        None,
        failed_call(tool="edit"),
        failed_call(digest="sha256:other"),
        failed_call(artifact=DIGEST_B),
        failed_call(artifact=None),
    ],
)
def test_no_repeated_failure_when_anything_differs(previous: FailedCall | None) -> None:
    assert repeated_failure(previous, failed_call()) is None


def test_unknown_version_is_never_unchanged() -> None:
    assert repeated_failure(failed_call(artifact=None), failed_call(artifact=None)) is None
    assert repeated_failure(failed_call(), failed_call(artifact=None)) is None


def test_repeated_failure_summary_is_shortened() -> None:
    stop = repeated_failure(failed_call(), failed_call(summary="x" * 1000))
    assert stop is not None
    what = stop.message.split(" failed twice")[0]
    assert len(what) == 200
    assert what == "x" * 199 + "…"


@given(
    st.sampled_from(["bash", "edit"]),
    st.sampled_from(["d1", "d2"]),
    st.one_of(st.none(), st.sampled_from([DIGEST_A, DIGEST_B])),
    st.sampled_from(["bash", "edit"]),
    st.sampled_from(["d1", "d2"]),
    st.one_of(st.none(), st.sampled_from([DIGEST_A, DIGEST_B])),
)
def test_repeated_failure_property(
    tool1: str, args1: str, v1: str | None, tool2: str, args2: str, v2: str | None
) -> None:
    stop = repeated_failure(FailedCall(tool1, args1, v1), FailedCall(tool2, args2, v2))
    same = tool1 == tool2 and args1 == args2 and v1 == v2 and v2 is not None
    assert (stop is not None) == same


# --------------------------------------------------------------------------- stops: budget


def budget(
    steps: int = 0,
    tokens: int = 0,
    elapsed: float = 0.0,
    max_steps: int | None = None,
    max_tokens: int | None = None,
    max_seconds: float | None = None,
) -> StopError | None:
    return budget_exhausted(
        steps=steps,
        tokens=tokens,
        elapsed=elapsed,
        max_steps=max_steps,
        max_tokens=max_tokens,
        max_seconds=max_seconds,
    )


def test_no_limits_never_stop() -> None:
    assert budget(steps=10**9, tokens=10**12, elapsed=1e9) is None


def test_step_budget_boundary() -> None:
    assert budget(steps=4, max_steps=5) is None
    stop = budget(steps=5, max_steps=5)
    assert stop is not None
    assert stop.code == BUDGET_EXHAUSTED == "budget_exhausted"
    assert stop.message == "the run used its step budget (5 of 5 steps)"
    over = budget(steps=7, max_steps=5)
    assert over is not None
    assert "(7 of 5 steps)" in over.message


def test_token_budget_boundary() -> None:
    assert budget(tokens=999, max_tokens=1000) is None
    stop = budget(tokens=1000, max_tokens=1000)
    assert stop is not None
    assert stop.code == BUDGET_EXHAUSTED
    assert stop.message == "the run used its token budget (1000 of 1000 tokens)"


def test_time_budget_boundary() -> None:
    assert budget(elapsed=29.99, max_seconds=30) is None
    stop = budget(elapsed=30.0, max_seconds=30)
    assert stop is not None
    assert stop.code == BUDGET_EXHAUSTED
    assert stop.message == "the run used its time budget (30.0 s of 30 s)"
    late = budget(elapsed=42.26, max_seconds=2.5)
    assert late is not None
    assert late.message == "the run used its time budget (42.3 s of 2.5 s)"


def test_zero_limits_stop_immediately() -> None:
    assert budget(max_steps=0) is not None
    assert budget(max_tokens=0) is not None
    assert budget(max_seconds=0) is not None


def test_step_budget_is_checked_first() -> None:
    stop = budget(steps=3, tokens=50, elapsed=9, max_steps=3, max_tokens=50, max_seconds=9)
    assert stop is not None
    assert "step budget" in stop.message


@given(
    steps=st.integers(0, 100),
    tokens=st.integers(0, 10_000),
    elapsed=st.floats(0, 1000, allow_nan=False),
    max_steps=st.one_of(st.none(), st.integers(0, 100)),
    max_tokens=st.one_of(st.none(), st.integers(0, 10_000)),
    max_seconds=st.one_of(st.none(), st.floats(0, 1000, allow_nan=False)),
)
def test_budget_property(
    steps: int,
    tokens: int,
    elapsed: float,
    max_steps: int | None,
    max_tokens: int | None,
    max_seconds: float | None,
) -> None:
    stop = budget(steps, tokens, elapsed, max_steps, max_tokens, max_seconds)
    hit_steps = max_steps is not None and steps >= max_steps
    hit_tokens = max_tokens is not None and tokens >= max_tokens
    hit_time = max_seconds is not None and elapsed >= max_seconds
    assert (stop is not None) == (hit_steps or hit_tokens or hit_time)
    if stop is not None:
        assert stop.code == BUDGET_EXHAUSTED
        if hit_steps:
            assert f"({steps} of {max_steps} steps)" in stop.message
        elif hit_tokens:
            assert f"({tokens} of {max_tokens} tokens)" in stop.message
        else:
            assert "time budget" in stop.message


# --------------------------------------------------------------------------- stops: describe


def test_describe_call_is_sorted_compact_json() -> None:
    assert describe_call("bash", {"timeout": 5, "command": "make"}) == (
        'bash {"command":"make","timeout":5}'
    )


def test_describe_call_shortens_to_200() -> None:
    text = describe_call("write", {"content": "x" * 1000})
    assert len(text) == 200
    assert text.endswith("…")
    assert text.startswith('write {"content":"xxx')


@pytest.mark.parametrize(
    "arguments",
    [
        {"x": object()},
        {"x": {1, 2}},
        {1: "non-str key"},
        {"big": 2**70},
        {"raw": b"bytes"},
    ],
)
def test_describe_call_handles_non_json_arguments(arguments: Any) -> None:
    assert describe_call("tool", arguments) == "tool " + repr(arguments)


def test_describe_call_handles_a_cycle() -> None:
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    text = describe_call("tool", cyclic)
    assert text.startswith("tool {")
    assert len(text) <= 200


JSONISH = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(max_size=50),
        st.builds(object),
        st.binary(max_size=10),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(st.one_of(st.text(max_size=10), st.integers()), children, max_size=5),
    ),
    max_leaves=20,
)


@given(st.text(max_size=300), JSONISH)
def test_describe_call_property(tool: str, arguments: Any) -> None:
    text = describe_call(tool, arguments)
    assert len(text) <= 200
    full_prefix = tool + " "
    if len(full_prefix) < 199:
        assert text.startswith(full_prefix)


# --------------------------------------------------------------------------- evidence


@pytest.mark.parametrize(
    ("exit_status", "timed_out", "error", "start", "end", "expected"),
    [
        # error beats everything
        (0, False, "cancelled", DIGEST_A, DIGEST_A, ERROR),
        (0, False, "boom", DIGEST_A, DIGEST_B, ERROR),
        (1, True, "boom", DIGEST_A, DIGEST_B, ERROR),
        (0, False, None, None, DIGEST_A, ERROR),
        (0, False, None, DIGEST_A, None, ERROR),
        (0, False, None, None, None, ERROR),
        # void beats failed and passed
        (0, False, None, DIGEST_A, DIGEST_B, VOID),
        (1, False, None, DIGEST_A, DIGEST_B, VOID),
        (None, True, None, DIGEST_A, DIGEST_B, VOID),
        # failed beats passed
        (1, False, None, DIGEST_A, DIGEST_A, FAILED),
        (-9, False, None, DIGEST_A, DIGEST_A, FAILED),
        (None, True, None, DIGEST_A, DIGEST_A, FAILED),
        (0, True, None, DIGEST_A, DIGEST_A, FAILED),
        (None, False, None, DIGEST_A, DIGEST_A, FAILED),
        # passed
        (0, False, None, DIGEST_A, DIGEST_A, PASSED),
    ],
)
def test_verification_status_table(
    exit_status: int | None,
    timed_out: bool,
    error: str | None,
    start: str | None,
    end: str | None,
    expected: VerificationStatus,
) -> None:
    assert verification_status(exit_status, timed_out, error, start, end) is expected


@given(
    st.one_of(st.none(), st.integers(-20, 300)),
    st.booleans(),
    st.one_of(st.none(), st.text(max_size=5)),
    st.one_of(st.none(), st.sampled_from([DIGEST_A, DIGEST_B])),
    st.one_of(st.none(), st.sampled_from([DIGEST_A, DIGEST_B])),
)
def test_verification_status_property(
    exit_status: int | None,
    timed_out: bool,
    error: str | None,
    start: str | None,
    end: str | None,
) -> None:
    status = verification_status(exit_status, timed_out, error, start, end)
    passed = (
        exit_status == 0 and not timed_out and error is None and start is not None and start == end
    )
    assert (status is PASSED) == passed
    if error is not None or start is None or end is None:
        assert status is ERROR
    elif start != end:
        assert status is VOID
    elif not passed:
        assert status is FAILED


def test_verification_passed_property_follows_status() -> None:
    assert verification(PASSED).passed
    assert not verification(FAILED).passed
    assert not verification(ERROR, error="x").passed
    assert not verification(VOID, version_end=DIGEST_B, exit_status=0).passed


# --------------------------------------------------------------------------- guards: is_failure


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (ToolResult("ok"), False),
        (ToolResult.error("Error: no such file"), True),
        (ToolResult.error("Error", exit_code=0), True),
        (ToolResult("out", metadata={"exit_code": 0}), False),
        (ToolResult("out", metadata={"exit_code": 3}), True),
        (ToolResult("out", metadata={"exit_code": -9}), True),
        (ToolResult("out", metadata={"bytes": 12}), False),
        (ToolResult("out", metadata={"exit_code": "3"}), False),
        (ToolResult("out", metadata={"exit_code": None}), False),
        (ToolResult("out", metadata={"exit_code": 3.0}), False),
    ],
)
def test_is_failure(result: ToolResult, expected: bool) -> None:
    assert is_failure(result) is expected


# --------------------------------------------------------------------------- guards: digest


def test_arguments_digest_ignores_key_order() -> None:
    one = arguments_digest({"command": "make", "cwd": "src"})
    two = arguments_digest({"cwd": "src", "command": "make"})
    assert one == two
    assert one.startswith("sha256:")
    assert len(one) == len("sha256:") + 64


def test_arguments_digest_ignores_key_order_with_numbers() -> None:
    # Numbers are not canonical JSON without scalars: the fallback digest must still be
    # independent of the (top-level) key order.
    one = arguments_digest({"command": "make", "timeout": 10})
    two = arguments_digest({"timeout": 10, "command": "make"})
    assert one == two


def test_arguments_digest_ignores_nested_key_order_of_strings() -> None:
    one = arguments_digest({"edits": [{"old": "a", "new": "b"}], "path": "f"})
    two = arguments_digest({"path": "f", "edits": [{"new": "b", "old": "a"}]})
    assert one == two


def test_arguments_digest_ignores_nested_key_order_with_numbers() -> None:
    one = arguments_digest({"edits": [{"old": "a", "new": "b"}], "limit": 1})
    two = arguments_digest({"limit": 1, "edits": [{"new": "b", "old": "a"}]})
    assert one == two


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"command": "make"}, {"command": "make test"}),
        ({"command": "make"}, {"cmd": "make"}),
        ({"command": "make"}, {"command": "make", "cwd": "x"}),
        ({"timeout": 1}, {"timeout": 2}),
        ({"x": None}, {"x": "None"}),
        ({"x": ["a", "b"]}, {"x": ["b", "a"]}),
    ],
)
def test_arguments_digest_differs_for_different_arguments(
    a: dict[str, Any], b: dict[str, Any]
) -> None:
    assert arguments_digest(a) != arguments_digest(b)


def test_arguments_digest_survives_non_finite_numbers() -> None:
    digest = arguments_digest({"x": float("nan")})
    assert digest.startswith("sha256:")
    assert arguments_digest({"x": float("inf")}) != arguments_digest({"x": float("-inf")})


FLAT_ARGS = st.dictionaries(
    st.text(max_size=8),
    st.one_of(st.text(max_size=8), st.none(), st.integers(-1000, 1000), st.booleans()),
    max_size=6,
)


@given(FLAT_ARGS, st.randoms(use_true_random=False))
def test_arguments_digest_order_property(arguments: dict[str, Any], rnd: Any) -> None:
    items = list(arguments.items())
    rnd.shuffle(items)
    assert arguments_digest(dict(items)) == arguments_digest(arguments)


@given(FLAT_ARGS, FLAT_ARGS)
def test_arguments_digest_distinguishes_property(a: dict[str, Any], b: dict[str, Any]) -> None:
    same_json = a.keys() == b.keys() and all(type(a[k]) is type(b[k]) and a[k] == b[k] for k in a)
    assert (arguments_digest(a) == arguments_digest(b)) == same_json


# --------------------------------------------------------------------------- guards: summary


# Each tool gives its own summary (Tool.approval_summary); call_summary bounds it.
_VERIFY = VerifyTool(lambda: pytest.fail("a summary needs no verifier"))


def test_call_summary_of_bash_is_the_command() -> None:
    assert call_summary(BashTool(), {"command": "make test", "timeout": 5}) == "make test"


def test_call_summary_of_file_tools_is_tool_and_path() -> None:
    assert call_summary(WriteTool(), {"path": "src/a.py", "content": "x" * 999}) == "write src/a.py"
    assert call_summary(EditTool(), {"path": "b.txt", "old": "a", "new": "b"}) == "edit b.txt"


def test_call_summary_of_other_tools_describes_the_call() -> None:
    assert call_summary(ReadTool(), {"path": "a.py"}) == 'read {"path":"a.py"}'
    assert call_summary(_VERIFY, {}) == "verify {}"
    # bash without a string command and write without a string path fall back too
    assert call_summary(BashTool(), {"command": ["make"]}) == 'bash {"command":["make"]}'
    assert call_summary(WriteTool(), {"content": "x"}) == 'write {"content":"x"}'
    assert call_summary(EditTool(), {"path": 3}) == 'edit {"path":3}'


def test_call_summary_truncates_at_500() -> None:
    command = "echo " + "y" * 1000
    text = call_summary(BashTool(), {"command": command})
    assert len(text) == MAX_SUMMARY == 500
    assert text == command[:499] + "…"
    exact = "z" * 500
    assert call_summary(BashTool(), {"command": exact}) == exact
    path = "d/" * 300
    written = call_summary(WriteTool(), {"path": path})
    assert len(written) == 500
    assert written.endswith("…")
    assert written.startswith("write d/d/")


# --------------------------------------------------------------------------- guards: texts


def test_denial_text_names_who_rule_and_reason() -> None:
    text = denial_text("user", "bash:rm *", "declined at the terminal")
    assert "permission denied" in text
    assert "(user, bash:rm *: declined at the terminal)" in text
    assert "did not run" in text
    assert text.startswith("Error: ")


def test_denial_text_without_reason() -> None:
    text = denial_text("policy", "default", None)
    assert "permission denied" in text
    assert "(policy, default)" in text
    assert "None" not in text


def test_follow_up_prompt_for_stale_names_the_changed_files() -> None:
    check = CompletionCheck(
        CompletionStatus.STALE,
        DIGEST_A,
        "stale",
        command=CMD,
        evidence_id="V-1",
        changed_files=("src/a.py", "src/b.py"),
    )
    prompt = follow_up_prompt(check)
    assert "changed since the last passing check (src/a.py, src/b.py)" in prompt
    assert "`verify`" in prompt
    assert prompt.startswith("Your work is not verified yet")


def test_follow_up_prompt_for_stale_names_at_most_ten_files() -> None:
    files = tuple(f"f{i}" for i in range(12))
    check = CompletionCheck(CompletionStatus.STALE, DIGEST_A, "stale", changed_files=files)
    prompt = follow_up_prompt(check)
    assert "f9 and 2 more" in prompt
    assert "f10" not in prompt


@pytest.mark.parametrize(
    ("check", "why"),
    [
        (
            CompletionCheck(CompletionStatus.FAILED, DIGEST_A, "failed", changed_files=("x",)),
            "the last check of the files as they are now did not pass",
        ),
        (
            CompletionCheck(CompletionStatus.MISSING, None, "missing"),
            "there is no passing check of the files as they are now",
        ),
        (
            CompletionCheck(CompletionStatus.STALE, DIGEST_A, "stale", changes_known=False),
            "there is no passing check of the files as they are now",
        ),
    ],
)
def test_follow_up_prompt_other_statuses(check: CompletionCheck, why: str) -> None:
    prompt = follow_up_prompt(check)
    assert f"not verified yet: {why}." in prompt
    assert "`verify`" in prompt
    assert "changed since" not in prompt


# --------------------------------------------------------------------------- guards: previous


HEADER = Header("H", 0, "/workspace", "openrouter", "test/model", "env-a")


def session(entries: Sequence[tuple[str, str]]) -> SessionState:
    """A state whose transcript is ``(entry id, role)`` pairs."""
    messages = [{"role": role, "content": ""} for _, role in entries]
    return SessionState(
        header=HEADER,
        transcript=messages,
        active_context=messages,
        usage=Usage(),
        operation=IDLE,
        repaired_length=0,
        transcript_ids=[entry for entry, _ in entries],
    )


RUN = [
    ("E-old-user", "user"),
    ("E-old-a", "assistant"),
    ("E-old-t", "tool"),
    ("E-in", "user"),
    ("E-a1", "assistant"),
    ("E-t1", "tool"),
    ("E-a2", "assistant"),
    ("E-t2", "tool"),
    ("E-t3", "tool"),
    ("E-u", "user"),
    ("E-a3", "assistant"),
    ("E-t4", "tool"),
]


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ("E-t1", None),  # the first result of the run: only the input before it
        ("E-t2", "E-t1"),  # separated by an assistant message only
        ("E-t3", "E-t2"),  # two results of one assistant message
        ("E-t4", None),  # a user message between
        ("E-old-t", None),  # not in this run
        ("E-missing", None),
    ],
)
def test_previous_tool_result(result: str, expected: str | None) -> None:
    assert _previous_tool_result(session(RUN), "E-in", result) == expected


def test_previous_tool_result_does_not_cross_the_run_input() -> None:
    entries = [("E-a0", "assistant"), ("E-t0", "tool"), ("E-in", "assistant"), ("E-t1", "tool")]
    # The input entry itself (here an assistant message) bounds the search.
    assert _previous_tool_result(session(entries), "E-in", "E-t1") is None
