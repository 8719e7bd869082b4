"""``tether show``: the terminal view, ``--json``, ``--html``, usage errors, and the page in a
real headless Chromium (Debian's ``chromium`` driven by Playwright; never a downloaded
browser).

The browser tests need ``/usr/bin/chromium`` and the ``playwright`` package (dev extra);
``.ci/run`` installs the browser. With ``CI=true`` they fail instead of skipping.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fixturekit import at_least
from tether._cli import app
from tether.testing.crashlab.child import WORKSPACE, session_log_path
from tether.testing.crashlab.matrix import LabOptions, run_lab
from tether.testing.crashlab.scenarios import BUILTIN_SCENARIOS

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import sessiongen  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PAGE_LOAD_BOUND_S = 5.0
"""The crash-lab page must be drawn (``window.__tetherReady``) within this many seconds."""
BIG_PAGE_LOAD_BOUND_S = 20.0
"""The 10,000-turn page, on a shared two-core machine."""

runner = CliRunner()


def invoke(*args: str) -> Any:
    return runner.invoke(app, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The workspace of a crash-lab run of publish-report killed (SIGKILL) right after its
    effect reached the ledger, then recovered in a new process."""
    base = tmp_path_factory.mktemp("lab")
    result = run_lab(
        LabOptions(
            scenarios=[BUILTIN_SCENARIOS["publish-report"]],
            boundaries=["after_effect@1"],
            workdir=base,
            keep=True,
            jobs=1,
        )
    )
    (case,) = result.results
    assert case.verdict == "pass" and case.crashed and case.run_dir is not None
    return Path(case.run_dir) / WORKSPACE


def lab_log(workspace: Path) -> Path:
    log = session_log_path(workspace)
    assert log is not None
    return log


# --------------------------------------------------------------------------- terminal, json


def test_terminal_view_tells_the_crash_and_the_recovery(lab: Path) -> None:
    result = invoke("show", str(lab_log(lab)))
    assert result.exit_code == 0, result.output
    out = result.output
    assert "run #1 completed (normal)" in out
    assert "tool #0 publish_report [call_publish]" in out
    assert "✖ CRASH" in out and "after seq" in out
    assert "recovered_from_ledger=true" in out
    assert "ledger lookup: committed" in out
    assert "(recorded by recovery after a crash)" in out
    assert out.index("started seq") < out.index("✖ CRASH") < out.index("result success")
    assert "Usage in " in out


def test_a_queued_run_is_shown_queued_not_crashed(tmp_path: Path) -> None:
    """Issue 32 item 2, through ``python -m tether show``: a run accepted by a submit and
    picked up 14.2 s later shows that wait as queued, with no crash."""
    from sessionkit import SessionKit

    kit = SessionKit()
    kit.start_run("queued work")  # what `tether submit` commits
    kit.timestamp += 14_200
    kit.step_attempt()
    kit.assistant("done")
    kit.finish()
    log = tmp_path / "queued.jsonl"
    log.write_bytes(kit.bytes())
    shown = subprocess.run(
        [sys.executable, "-m", "tether", "show", str(log), "--workspace", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "⧖ QUEUED" in shown.stdout and "queued 14.2 s: the run was accepted" in shown.stdout
    assert "CRASH" not in shown.stdout and "0 crash(es)" in shown.stdout


def test_a_corrupt_line_stops_the_timeline_there(tmp_path: Path) -> None:
    """Issue 32 item 9, through ``python -m tether show``: the valid lines before a corrupt
    one are drawn, a marker says where and why it stops, and the error (exit 1) says it
    once, with what is readable."""
    from sessionkit import SessionKit

    kit = SessionKit()
    kit.simple_run("first question", "first answer")
    kit.simple_run("second question", "second answer")
    log = tmp_path / "torn-middle.jsonl"
    lines = kit.bytes().split(b"\n")
    line = lines[6]  # line 7: the second run's attempt, with a seq out of order
    lines[6] = line.replace(b'"seq":' + str(json.loads(line)["seq"]).encode(), b'"seq":99', 1)
    log.write_bytes(b"\n".join(lines))

    def show(*extra: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "tether", "show", str(log), "-w", str(tmp_path), *extra]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)

    shown = show()
    assert shown.returncode == 1, shown.stderr
    assert "run #1 completed" in shown.stdout and "'second question'" in shown.stdout
    assert "second answer" not in shown.stdout
    assert shown.stdout.rstrip().endswith(
        "✖ UNREADABLE from line 7, seq 99: SEQ_MISMATCH; the timeline above is the 6 line(s) "
        "before it, nothing after it is shown"
    )
    assert shown.stderr == (
        f"error: session {log} is corrupt: SEQ_MISMATCH at line 7, seq 99; the 6 lines "
        "before it are intact: the timeline shows them and nothing after it\n"
    )
    as_json = show("--json")
    assert as_json.returncode == 1
    doc = json.loads(as_json.stdout)
    assert doc["unreadable"] == {"code": "SEQ_MISMATCH", "line": 7, "seq": 99, "detail": ""}
    assert [o["outcome"] for o in doc["operations"]] == ["completed", "unfinished"]


def test_by_id_prefix_and_last(lab: Path) -> None:
    log = lab_log(lab)
    sessions = str(log.parent)
    session_id = json.loads(log.read_bytes().split(b"\n", 1)[0])["id"]
    by_id = invoke("show", session_id[:13], "--sessions-dir", sessions, "--json")
    last = invoke("show", "--last", "--sessions-dir", sessions, "--json")
    assert by_id.exit_code == 0 and last.exit_code == 0, by_id.output + last.output
    assert json.loads(by_id.output)["session"]["id"] == session_id
    assert by_id.output == last.output


def test_json_is_one_document(lab: Path) -> None:
    result = invoke("show", str(lab_log(lab)), "--json")
    assert result.exit_code == 0
    doc = json.loads(result.output)
    (gap,) = doc["gaps"]
    assert gap["kind"] == "crash" and gap["certain"] is True
    (call,) = doc["operations"][0]["steps"][0]["toolCalls"]
    assert call["recoveredFromLedger"] is True and call["recovered"] is True
    assert call["reconciliations"][0]["verdict"] == "committed"
    assert doc["usage"]["input"] > 0


def test_usage_errors(tmp_path: Path, lab: Path) -> None:
    none = invoke("show")
    assert none.exit_code == 2 and "name one session" in none.output
    both = invoke("show", str(lab_log(lab)), "--last")
    assert both.exit_code == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert invoke("show", "--last", "--sessions-dir", str(empty)).exit_code == 3
    assert invoke("show", "nosuchid", "--sessions-dir", str(empty)).exit_code == 3
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_bytes(lab_log(lab).read_bytes().replace(b'"seq":3', b'"seq":9', 1))
    bad = invoke("show", str(corrupt))
    assert bad.exit_code == 1
    assert f"session {corrupt} is corrupt: SEQ_MISMATCH at line 3, seq 9" in bad.output
    assert "✖ UNREADABLE from line 3, seq 9: SEQ_MISMATCH" in bad.output  # lines before it drawn
    nowhere = invoke("show", str(lab_log(lab)), "--html", str(tmp_path / "no" / "p.html"))
    assert nowhere.exit_code == 2 and "cannot write" in nowhere.output
    for result in (none, both, bad, nowhere):
        assert "Traceback" not in result.output


def test_a_long_session_is_summarised(tmp_path: Path) -> None:
    log = tmp_path / "long.jsonl"
    log.write_bytes(sessiongen.generate(60))
    short = invoke("show", str(log), "--workspace", str(tmp_path))
    assert short.exit_code == 0, short.output
    assert "run #10 " in short.output and "run #51 " in short.output
    assert "run #11 " not in short.output
    assert "… 40 operations not shown" in short.output
    full = invoke("show", str(log), "--workspace", str(tmp_path), "--all")
    assert "run #11 " in full.output and "not shown" not in full.output


def test_html_is_self_contained_and_small(tmp_path: Path) -> None:
    log = tmp_path / "s.jsonl"
    log.write_bytes(sessiongen.generate(300))
    page = tmp_path / "s.html"
    result = invoke("show", str(log), "--workspace", str(tmp_path), "--html", str(page))
    assert result.exit_code == 0, result.output
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>")
    for remote in ("http://", "https://", "src=", "<link", "@import", "url("):
        assert remote not in html, remote
    assert page.stat().st_size < 3 * log.stat().st_size


def test_untrusted_text_cannot_close_the_script(tmp_path: Path) -> None:
    from sessionkit import SessionKit

    kit = SessionKit()
    kit.simple_run("</script><script>alert(1)</script>", "<b>done</b>")
    log = tmp_path / "x.jsonl"
    log.write_bytes(kit.bytes())
    page = tmp_path / "x.html"
    assert (
        invoke("show", str(log), "--workspace", str(tmp_path), "--html", str(page)).exit_code == 0
    )
    html = page.read_text()
    assert html.count("</script>") == 2  # the data element's and the script's own


# --------------------------------------------------------------------------- the browser


def _browser_missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing (apt-get install chromium; .ci/run does)"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = _browser_missing()
    if missing is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {missing}")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield instance
        finally:
            instance.close()


def open_page(browser: Any, path: Path, bound: float) -> tuple[Any, float, list[str]]:
    """Open ``path``, refusing every request that is not the file itself; wait until the
    script has drawn the page. Returns the page, the load time and the refused URLs."""
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    refused: list[str] = []
    errors: list[str] = []
    url = path.resolve().as_uri()

    def route(request_route: Any) -> None:
        if request_route.request.url == url:
            request_route.continue_()
        else:
            refused.append(request_route.request.url)
            request_route.abort()

    page.route("**/*", route)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    started = time.perf_counter()
    page.goto(url)
    # Functions, not expression strings: the page's CSP forbids eval, which the latter need.
    page.wait_for_function("() => window.__tetherReady === true", timeout=bound * 1000)
    elapsed = time.perf_counter() - started
    assert errors == [], errors
    return page, elapsed, refused


def test_the_page_of_a_crash_and_its_recovery(browser: Any, lab: Path, tmp_path: Path) -> None:
    page_file = tmp_path / "lab.html"
    result = invoke("show", str(lab_log(lab)), "--html", str(page_file))
    assert result.exit_code == 0, result.output
    page, elapsed, refused = open_page(browser, page_file, PAGE_LOAD_BOUND_S)
    assert elapsed < PAGE_LOAD_BOUND_S
    assert refused == []  # self-contained: nothing but the file was requested
    # the crash marker, on the operation's lane and in the list of gaps
    marker = page.locator(".lane .marker.crash")
    assert marker.count() == 1 and "crash" in marker.inner_text()
    listed = page.locator(".gap-item.crash")
    assert listed.count() == 1
    assert "recovered_from_ledger=true" in listed.inner_text()
    # the recovered call, drawn as such, with its ledger evidence in its details
    call = page.locator('.call.recovered[data-call="call_publish"]')
    assert call.count() == 1 and call.get_attribute("data-ledger") == "recovered"
    call.click()
    details = page.locator("#details").inner_text()
    assert "tool call publish_report [call_publish]" in details
    assert "reconciled: verdict committed, action complete, ledger lookup: committed" in details
    assert "recovered_from_ledger=true" in details
    assert "recorded by recovery after a crash" in details
    # the legend says in words what the colours mean; the transcript is beside the lanes
    legend = page.locator("#legend").inner_text()
    assert "crash" in legend and "recovery" in legend
    assert "Published report" in page.locator("#transcript").inner_text()
    shot = tmp_path / "show.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 1000
    page.close()


def test_a_10000_turn_page_is_virtualised(browser: Any, tmp_path: Path) -> None:
    log = tmp_path / "big.jsonl"
    log.write_bytes(sessiongen.generate(10_000))
    page_file = tmp_path / "big.html"
    result = invoke("show", str(log), "--workspace", str(tmp_path), "--html", str(page_file))
    assert result.exit_code == 0, result.output
    assert page_file.stat().st_size < log.stat().st_size  # within a few times: below it
    page, elapsed, _ = open_page(browser, page_file, BIG_PAGE_LOAD_BOUND_S)
    assert elapsed < BIG_PAGE_LOAD_BOUND_S
    lanes = page.locator(".lane").count()
    assert 0 < lanes < 100  # only the lanes in view exist
    assert page.locator(".msg").count() < 100
    page.locator("#scroller").evaluate("el => el.scrollTop = el.scrollHeight")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.lane-label')]"
        ".some(e => e.textContent.includes('#10000 '))"
    )
    assert page.locator(".lane").count() < 100
    page.close()


def test_chromium_is_debians() -> None:
    missing = _browser_missing()
    if missing is not None and os.environ.get("CI", "").lower() != "true":
        pytest.skip(missing)
    assert CHROMIUM.exists() and shutil.which("chromium") is not None


# --------------------------------------------------------------------------- evidence


def test_journal_authorization_and_a_stale_verification(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real run: write (journaled), verify (passes), edit (journaled): the verification
    is linked to its call and shown stale, the journal rows and authorizations to theirs."""
    from tether._models import ScriptedModel
    from tether._runtime import Agent

    monkeypatch.delenv("TETHER_ENVIRONMENT_IDENTITY", raising=False)
    root = tmp_path / "ws"
    root.mkdir()
    (root / "tether.toml").write_text('[verify]\ncommand = "grep -q good status.txt"\n')

    def calls(*items: dict[str, Any]) -> dict[str, Any]:
        return {"content": "", "tool_calls": list(items), "usage": {"input": 10, "output": 5}}

    steps = {
        "model": "scripted/show",
        "responses": [
            calls(
                {
                    "id": "w",
                    "name": "write",
                    "arguments": {"path": "status.txt", "content": "good\n"},
                }
            ),
            calls({"id": "v", "name": "verify", "arguments": {}}),
            calls(
                {
                    "id": "e",
                    "name": "edit",
                    "arguments": {
                        "path": "status.txt",
                        "old_string": "good",
                        "new_string": "good, edited",
                    },
                }
            ),
            {"content": "Done.", "finish_reason": "stop", "usage": {"input": 10, "output": 5}},
        ],
    }
    agent = Agent(
        ScriptedModel.from_json(steps), workspace=root, read_agents_md=False, assume_yes=True
    )
    try:
        result = agent.run("do it")
    finally:
        agent.close()
    doc = json.loads(invoke("show", str(result.session_path), "--json").output)
    calls_by_id = {
        c["callId"]: c for o in doc["operations"] for s in o["steps"] for c in s["toolCalls"]
    }
    assert calls_by_id["w"]["journal"]["status"] == "succeeded"
    assert calls_by_id["e"]["journal"]["path"] == "status.txt"
    assert calls_by_id["w"]["authorization"]["decision"] == "allow"
    assert calls_by_id["w"]["authorization"]["who"] == "policy"
    check = calls_by_id["v"]["verification"]
    assert check["status"] == "passed" and check["current"] is False  # edited since
    (listed,) = doc["verifications"]
    assert listed["id"] == check["id"]
    text = invoke("show", str(result.session_path)).output
    assert "journal: succeeded status.txt" in text
    assert "authorization: allow by policy" in text
    assert "verification: passed 'grep -q good status.txt'" in text and "stale" in text
    assert doc["gaps"] == []


GOLDEN = at_least(  # fewer fail the collection instead of drawing nothing (fixturekit)
    18,
    sorted(
        p.with_name(p.name.replace(".expected.json", ".jsonl"))
        for p in (REPO / "tests" / "conformance" / "fixtures").glob("*.expected.json")
        if json.loads(p.read_text())["ok"]
    ),
    "reducing golden fixtures",
)


def test_every_golden_fixture_draws(browser: Any, tmp_path: Path) -> None:
    """Every log that reduces gets a page without script errors, one lane per operation
    and one marker per crash or open end of an operation."""
    for log in GOLDEN:
        doc = json.loads(invoke("show", str(log), "--workspace", str(tmp_path), "--json").output)
        page_file = tmp_path / f"{log.stem}.html"
        result = invoke("show", str(log), "--workspace", str(tmp_path), "--html", str(page_file))
        assert result.exit_code == 0, result.output
        page, _, refused = open_page(browser, page_file, PAGE_LOAD_BOUND_S)
        assert refused == []
        assert page.locator(".lane").count() == len(doc["operations"]), log.name
        marked = [g for g in doc["gaps"] if g["kind"] != "stop" and g["operationId"]]
        assert page.locator(".lane .marker").count() == len(marked), log.name
        page.close()
