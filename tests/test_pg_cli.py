"""The shared-store commands as real processes (``python -m tether``) on a real server:
``store init``, ``submit``, ``worker``, ``sessions``/``inspect``/``resume``/``export``/``import``
with ``--store``, ``[store] url`` in tether.toml, SIGTERM, and every bad input as one line
with its own exit code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from pgkit import pg_store, pg_url  # noqa: F401 (fixtures)
from tether.core.reducer import Reducer

SCRIPT = {
    "model": "scripted/cli",
    "responses": [
        {
            "content": "Counting.",
            "tool_calls": [
                {
                    "id": "c1",
                    "name": "bash",
                    "arguments": {
                        "command": 'echo "$TETHER_SESSION_ID:$TETHER_FENCING_TOKEN" >> n.txt'
                    },
                }
            ],
        },
        {"content": "Done.", "finish_reason": "stop"},
    ],
}


def tether(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "TETHER_STORE_URL"}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "tether", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    (workspace / ".tether").mkdir(parents=True)
    (workspace / "script.json").write_text(json.dumps(SCRIPT))
    return workspace


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_submit_worker_sessions_inspect_export_import(pg_url: str, ws: Path) -> None:  # noqa: F811
    store = ["--store", pg_url]
    missing = tether("sessions", *store, cwd=ws)
    assert missing.returncode == 12
    assert "no tether schema" in one_error_line(missing)
    assert tether("store", "init", *store, cwd=ws).returncode == 0
    model = ["-m", "scripted:script.json"]
    ids = []
    for n in range(3):
        result = tether("submit", f"task {n}", *store, *model, cwd=ws)
        assert result.returncode == 0, result.stderr
        ids.append(result.stdout.strip())
    listed = json.loads(tether("sessions", *store, "--json", cwd=ws).stdout)
    assert [row["status"] for row in listed] == ["queued"] * 3
    worker = tether("worker", *store, *model, "--until-empty", "-c", "2", cwd=ws)
    assert worker.returncode == 0, worker.stderr
    counted = sorted((ws / "n.txt").read_text().split())
    assert counted == sorted(f"{s}:2" for s in ids)  # epoch 2: submit held 1
    listed = json.loads(tether("sessions", *store, "--json", cwd=ws).stdout)
    assert {row["status"] for row in listed} == {"idle"}
    assert {row["leaseOwner"] for row in listed} == {None}
    shown = tether("inspect", ids[0], *store, "--json", cwd=ws)
    assert json.loads(shown.stdout)["state"]["transcript"][-1]["content"] == "Done."
    out = ws / "s.jsonl"
    assert tether("export", ids[0], *store, "-o", str(out), cwd=ws).returncode == 0
    state = Reducer.load(out.read_bytes()).state
    assert state.transcript[-1]["content"] == "Done."
    # An exported file is an ordinary session file: inspect reads it too.
    assert tether("inspect", str(out), cwd=ws).returncode == 0
    # Import into another schema of the same server: the same bytes come back.
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DELETE FROM tether_sessions WHERE session_id = %s", (ids[0],))
        conn.execute("DELETE FROM tether_lines WHERE session_id = %s", (ids[0],))
    imported = tether("import", str(out), *store, cwd=ws)
    assert imported.returncode == 0 and imported.stdout.strip() == ids[0]
    again = tether("export", ids[0], *store, cwd=ws)
    assert again.stdout.encode() == out.read_bytes()
    dup = tether("import", str(out), *store, cwd=ws)
    assert dup.returncode == 2 and "already exists" in one_error_line(dup)
    # resume through the store: nothing to do, nothing appended.
    resumed = tether("resume", ids[0], *store, *model, cwd=ws)
    assert resumed.returncode == 0, resumed.stderr
    assert tether("export", ids[0], *store, cwd=ws).stdout.encode() == out.read_bytes()


def test_the_store_url_comes_from_tether_toml_and_the_environment(
    pg_store: str,  # noqa: F811
    ws: Path,
) -> None:
    (ws / "tether.toml").write_text(f'[store]\nurl = "{pg_store}"\nlease_seconds = 5\n')
    run = tether("run", "go", "-m", "scripted:script.json", cwd=ws)
    assert run.returncode == 0, run.stderr
    assert not (ws / ".tether" / "sessions").exists()  # not in the file store
    # [store] url alone: sessions lists the store, as run used it.
    rows = json.loads(tether("sessions", "--json", cwd=ws).stdout)
    assert len(rows) == 1 and rows[0]["status"] == "idle"
    (ws / "tether.toml").write_text("")
    listed = tether("sessions", "--json", cwd=ws, env={"TETHER_STORE_URL": pg_store})
    assert json.loads(listed.stdout) == rows  # the variable alone: the store too
    files = tether("sessions", "--json", "--sessions-dir", str(ws), cwd=ws, env={})
    assert json.loads(files.stdout) == []  # pointed at files: the files
    rows = json.loads(tether("sessions", "--store", pg_store, "--json", cwd=ws).stdout)
    assert len(rows) == 1 and rows[0]["status"] == "idle"
    run = tether(
        "run", "go", "-m", "scripted:script.json", cwd=ws, env={"TETHER_STORE_URL": pg_store}
    )
    assert run.returncode == 0, run.stderr
    assert len(json.loads(tether("sessions", "--store", pg_store, "--json", cwd=ws).stdout)) == 2
    (ws / "tether.toml").write_text('[store]\nurl = "mysql://x"\n')
    bad = tether("run", "go", "-m", "scripted:script.json", cwd=ws)
    assert bad.returncode == 2 and "[store] url" in one_error_line(bad)


def test_bad_input_is_one_line_with_its_own_exit_code(pg_store: str, ws: Path) -> None:  # noqa: F811
    model = ["-m", "scripted:script.json"]
    cases = [
        (["sessions", "--store", "postgresql://u:secret@127.0.0.1:1/db"], 10, "cannot connect"),
        (["submit", "x", "--store", "postgresql://u@/db?bogus=1", *model], 2, "store URL"),
        (["export", "018f-nope", "--store", pg_store], 3, "no session"),
        (["resume", "018f-nope", "--store", pg_store, *model], 3, "no session"),
        (["submit", "x", *model], 2, "no store given"),
        (["worker", "--store", "mysql://x", *model], 2, "postgresql://"),
    ]
    for args, code, text in cases:
        result = tether(*args, cwd=ws)
        assert result.returncode == code, (args, result.stderr)
        line = one_error_line(result)
        assert text in line and "secret" not in line, line
    with psycopg.connect(pg_store, autocommit=True) as conn:
        conn.execute("UPDATE tether_meta SET value = '99' WHERE key = 'schema_version'")
    newer = tether("sessions", "--store", pg_store, cwd=ws)
    assert newer.returncode == 12 and "newer than this tether supports" in one_error_line(newer)


def test_sigterm_stops_the_worker_and_releases_its_leases(pg_store: str, ws: Path) -> None:  # noqa: F811
    script = dict(SCRIPT)
    slow = json.loads(json.dumps(SCRIPT))
    # The call marks that it has started, then sleeps: the signal is sent once the mark is
    # there, so it lands inside the step whatever the machine's load (polling the sessions
    # list for "running" took long enough that the signal could arrive after the session
    # had finished).
    inside = ws / "inside.mark"
    slow["responses"][0]["tool_calls"][0]["arguments"]["command"] = f"touch {inside}; sleep 3"
    (ws / "slow.json").write_text(json.dumps(slow))
    del script
    model = ["-m", "scripted:slow.json"]
    for n in range(4):
        assert tether("submit", f"t{n}", "--store", pg_store, *model, cwd=ws).returncode == 0
    env = {k: v for k, v in os.environ.items() if k != "TETHER_STORE_URL"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tether", "worker", "--store", pg_store, *model],
        cwd=ws,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not inside.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert inside.exists(), "the worker never started the slow call"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "SIGTERM" in err
    rows = json.loads(tether("sessions", "--store", pg_store, "--json", cwd=ws).stdout)
    statuses = sorted(r["status"] for r in rows)
    assert statuses.count("running") == 0 and {r["leaseOwner"] for r in rows} == {None}
    # It stopped the session it was driving after the step in progress (the slow bash
    # call's result committed): unfinished and released, like the ones it never claimed.
    assert statuses == ["queued"] * 4
    lines = sorted(r["lines"] for r in rows)
    assert lines[-1] > lines[0], rows  # the driven one has its step's lines


def test_the_crash_lab_passes_against_the_store(pg_url: str, tmp_path: Path) -> None:  # noqa: F811
    """``tether crashlab --store URL``: the publish_report scenario killed at every boundary
    it passes, each run's session in a schema of its own, all dropped afterwards (those of
    another process's lab, left by a run that failed, are not this one's)."""

    def lab_schemas() -> set[str]:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'lab\\_%'"
            ).fetchall()
        return {str(r[0]) for r in rows}

    before = lab_schemas()
    result = tether(
        "crashlab", "--store", pg_url, "--scenario", "publish-report", "-j", "2", cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("PASS duplicate_effects=0"), last
    assert lab_schemas() <= before


def test_review_and_authorizations_through_the_store(pg_store: str, ws: Path) -> None:  # noqa: F811
    """Review items live in the store's database: any person resolves them from anywhere."""
    from tether._stores.postgres import PostgresSessions
    from tether._wsdb.postgres import PostgresEffectsDB
    from tether.core import facts

    with PostgresSessions(pg_store, str(ws)) as sessions:
        with sessions.create(provider="p", model="m", environment_identity="e") as store:
            entry = "018f0000-0000-7000-8000-100000000001"
            store.commit(
                [
                    facts.user_entry(entry_id=entry, content="go"),
                    facts.run_started(operation_id=entry[:-1] + "9", input_entry_id=entry),
                ]
            )
            session = store.session_id
    db = PostgresEffectsDB.open_url(pg_store)
    try:
        item = db.reviews.open_item(session, "op-1", "post", "outcome unknown", {"why": "test"})
    finally:
        db.close()
    listed = tether("review", "--store", pg_store, "--json", cwd=ws)
    assert listed.returncode == 0, listed.stderr
    assert [i["operationId"] for i in json.loads(listed.stdout)] == ["op-1"]
    assert json.loads(tether("review", "--json", cwd=ws).stdout) == []  # not in effects.db
    resolved = tether(
        "review", "resolve", str(item.id), "--not-applied", "--store", pg_store, cwd=ws
    )
    assert resolved.returncode == 0, resolved.stderr
    assert "resolved as notApplied" in resolved.stdout
    listed = tether("review", "--store", pg_store, "--json", cwd=ws)
    assert json.loads(listed.stdout) == []
    decisions = tether("authorizations", "--store", pg_store, "--json", cwd=ws)
    assert decisions.returncode == 0 and json.loads(decisions.stdout) == []


def test_a_worker_parks_a_session_it_cannot_drive(pg_store: str, ws: Path) -> None:  # noqa: F811
    model = ["-m", "scripted:script.json"]
    good = tether("submit", "fine", "--store", pg_store, *model, cwd=ws).stdout.strip()
    bad = tether("submit", "broken", "--store", pg_store, *model, cwd=ws).stdout.strip()
    with psycopg.connect(pg_store, autocommit=True) as conn:
        conn.execute(
            "UPDATE tether_lines SET data = %s WHERE session_id = %s AND line_no = 2",
            (b'{"not": "a fact"}', bad),
        )
    worker = tether("worker", "--store", pg_store, *model, "--until-empty", cwd=ws)
    assert worker.returncode == 0, worker.stderr
    assert f"session {bad}: parked" in worker.stderr
    rows = {
        r["id"]: r
        for r in json.loads(tether("sessions", "--store", pg_store, "--json", cwd=ws).stdout)
    }
    assert rows[good]["status"] == "idle" and rows[bad]["status"] == "blocked"


def test_show_works_by_session_id_on_the_store(pg_store: str, ws: Path) -> None:  # noqa: F811
    """``tether show --store URL SESSION``: the same timeline as for a file, read from the
    store by id, with the store database's authorization evidence."""
    run = tether("run", "go", "-m", "scripted:script.json", "--store", pg_store, "--yes", cwd=ws)
    assert run.returncode == 0, run.stderr
    [row] = json.loads(tether("sessions", "--store", pg_store, "--json", cwd=ws).stdout)
    session = row["id"]
    shown = tether("show", session, "--store", pg_store, "--json", cwd=ws)
    assert shown.returncode == 0, shown.stderr
    timeline = json.loads(shown.stdout)
    text = json.dumps(timeline)
    assert session in text and "bash" in text and "Done." in text
    terminal = tether("show", session, "--store", pg_store, cwd=ws)
    assert terminal.returncode == 0, terminal.stderr
    assert "bash" in terminal.stdout
    page = ws / "page.html"
    assert tether("show", session, "--store", pg_store, "--html", str(page), cwd=ws).returncode == 0
    assert page.read_text().startswith("<!")
    missing = tether("show", "018f-nope", "--store", pg_store, cwd=ws)
    assert missing.returncode == 3 and "no session" in one_error_line(missing)
    last = tether("show", "--last", "--store", pg_store, cwd=ws)  # the newest session
    assert last.returncode == 0 and session in last.stdout, last.stderr
    both = tether("show", session, "--last", "--store", pg_store, cwd=ws)
    assert both.returncode == 2 and "one of the two" in one_error_line(both)


def test_the_store_variable_alone_serves_every_reading_command(
    pg_store: str,  # noqa: F811
    ws: Path,
) -> None:
    """Issue 32, item 3: with only $TETHER_STORE_URL set, sessions, inspect (an id and
    --last), show (an id and --last), resume, export and approvals (--last, --session: ids
    only the store knows) all use the store."""
    env = {"TETHER_STORE_URL": pg_store}
    ran = tether("run", "go", "-m", "scripted:script.json", cwd=ws, env=env)
    assert ran.returncode == 0, ran.stderr
    [row] = json.loads(tether("sessions", "--json", cwd=ws, env=env).stdout)
    session = row["id"]
    for args in (
        ("inspect", session, "--json"),
        ("inspect", "--last", "--json"),
        ("show", session, "--json"),
        ("show", "--last", "--json"),
        ("resume", session, "-m", "scripted:script.json"),
        ("export", session),
        ("approvals", "--last", "--json"),
        ("approvals", "--session", session, "--json"),
    ):
        done = tether(*args, cwd=ws, env=env)
        assert done.returncode == 0, (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert session in tether("show", "--last", "--json", cwd=ws, env=env).stdout
    inspected = json.loads(tether("inspect", "--last", "--json", cwd=ws, env=env).stdout)
    assert inspected["state"]["header"]["id"] == session
    assert not (ws / ".tether" / "sessions").exists()  # nothing went to the file store


def test_approvals_use_the_store_variable_alone(
    pg_store: str,  # noqa: F811
    ws: Path,
) -> None:
    """Issue 32: with only $TETHER_STORE_URL set, a call parked by a run on the store is in
    the store's database: `tether approvals` lists it, `approve` decides it there, and
    `resume` carries it out once; the workspace's own effects.db holds no parked call."""
    env = {"TETHER_STORE_URL": pg_store}
    (ws / "tether.toml").write_text('[policy.tools]\nbash = "ask"\n')
    # The count stays in the workspace: the sandbox lets bash write nowhere else.
    count = {"command": 'echo "$TETHER_SESSION_ID" >> n.txt'}
    script = json.loads(json.dumps(SCRIPT))
    script["responses"][0]["tool_calls"][0]["arguments"] = count
    (ws / "script.json").write_text(json.dumps(script))
    parked = tether("run", "go", "-m", "scripted:script.json", cwd=ws, env=env)
    assert parked.returncode == 67, parked.stderr
    assert "awaiting approval: call #1 (bash: " in parked.stderr
    assert not (ws / "n.txt").exists()
    [row] = json.loads(tether("sessions", "--json", cwd=ws, env=env).stdout)
    session = row["id"]
    for extra in ((), ("--last",), ("--session", session[:13])):
        listed = tether("approvals", "--json", *extra, cwd=ws, env=env)
        assert listed.returncode == 0, (extra, listed.stderr)
        [request] = json.loads(listed.stdout)
        assert (request["id"], request["sessionId"]) == (1, session), extra
    shown = tether("approvals", cwd=ws, env=env)
    assert "$ echo" in shown.stdout and "tether approve 1" in shown.stdout
    # Not the file store: without the variable this workspace has no parked call.
    assert tether("approvals", "--json", cwd=ws).stdout.strip() == "[]"
    approved = tether("approve", "1", "--as", "alice", cwd=ws, env=env)
    assert approved.returncode == 0, approved.stderr
    assert f"tether resume {session}" in approved.stdout
    resumed = tether("resume", session, "-m", "scripted:script.json", cwd=ws, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert (ws / "n.txt").read_text().split() == [session]  # carried out once
    again = tether("approve", "1", cwd=ws, env=env)
    assert again.returncode == 26 and "already approved by alice" in again.stderr
    assert tether("approvals", "--json", cwd=ws, env=env).stdout.strip() == "[]"
    denied = tether("deny", "7", "--why", "no", cwd=ws, env=env)
    assert denied.returncode == 25 and "no parked call #7" in denied.stderr
    assert not (ws / ".tether" / "sessions").exists()  # nothing went to the file store


# --------------------------------------------------------------------------- the printed --store


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        # A Unix-socket URL stays one (it came back as postgresql://postgres@/sock/db).
        ("postgresql:///db?host=/var/run/postgresql", "postgresql:///db?host=/var/run/postgresql"),
        ("postgresql://u:pw@/db?host=/sock&port=5433", "postgresql://u@/db?host=/sock&port=5433"),
        (
            "postgres://u:s3cr%40t@h:5432/db?sslmode=require",
            "postgres://u@h:5432/db?sslmode=require",
        ),
        (
            "postgresql://u@h/db?password=pw&options=-csearch_path%3Dt",
            "postgresql://u@h/db?options=-csearch_path%3Dt",
        ),
        ("postgresql://h/db?pass%77ord=pw", "postgresql://h/db"),
        ("postgresql://:pw@h/db", "postgresql://h/db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("postgresql://u:p@ss@h/db", "postgresql://u@h/db"),
    ],
)
def test_display_url_is_the_given_url_minus_its_password(given: str, shown: str) -> None:
    from tether._stores.postgres import display_url

    assert display_url(given) == shown


def test_resume_hint_prints_the_store_url_as_given_and_it_connects(
    pg_store: str,  # noqa: F811
    ws: Path,
) -> None:
    """The hint keeps everything but the password: the schema (options=…), host and port;
    run as printed (the password from the environment, as a user's .pgpass would give it),
    it reaches the same session."""
    import shlex
    from urllib.parse import urlsplit

    password = urlsplit(pg_store).password
    assert password, "the test server's URL carries a password"
    # A model with nothing to say fails the run: its closing line offers the retry.
    (ws / "mute.json").write_text(
        json.dumps(
            {
                "model": "scripted/cli",
                "responses": [{"error": {"code": "authentication", "message": "no"}}],
            }
        )
    )
    ran = tether("run", "count", "--store", pg_store, "-m", "scripted:mute.json", cwd=ws)
    assert ran.returncode == 1, ran.stderr
    hint = next(line for line in ran.stderr.splitlines() if line.startswith("retry with: "))
    argv = shlex.split(hint.removeprefix("retry with: "))
    printed = argv[argv.index("--store") + 1]
    assert printed == pg_store.replace(f":{password}@", "@", 1)
    assert f":{password}@" not in hint
    retried = tether(*argv[1:], "-m", "scripted:script.json", cwd=ws, env={"PGPASSWORD": password})
    assert retried.returncode == 0, retried.stderr
    session_id = argv[argv.index("retry") + 1]
    # The same session of the same schema (another schema has no such session: exit 3).
    assert f"session {session_id}\n" in retried.stdout + retried.stderr
    assert retried.stdout.rstrip().endswith("Done.")


# --------------------------------------------------------------------------- submit --from


def test_submit_from_a_file_accepts_thousands_in_batches(pg_store: str, ws: Path) -> None:  # noqa: F811
    """2,000 prompts in one command: every id printed once, in the file's order, each a
    queued session whose log is a user entry and runStarted; a line naming a session adds a
    run to it; a worker drives a submitted session like any other."""
    first = tether("submit", "seed", "--store", pg_store, "-m", "scripted:script.json", cwd=ws)
    seed = first.stdout.strip()
    # The seed's run must be finished before a line can add one to its session.
    done = tether("resume", seed, "--store", pg_store, "-m", "scripted:script.json", cwd=ws)
    assert done.returncode == 0, done.stderr
    lines = [json.dumps({"prompt": f"task {n}"}) for n in range(2000)]
    lines.insert(1500, json.dumps({"prompt": "one more for the seed", "session": seed}))
    lines.insert(10, "")  # blank lines are skipped
    lines.insert(20, json.dumps("a bare string is a prompt"))
    (ws / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    model = ["-m", "scripted:script.json"]
    result = tether("submit", "--from", "prompts.jsonl", "--store", pg_store, *model, cwd=ws)
    assert result.returncode == 0, result.stderr
    ids = result.stdout.split()
    # In the file's order, the blank line skipped: the seed's line is the 1,502nd id.
    assert len(ids) == len(set(ids)) == 2002 and ids.index(seed) == 1501
    with psycopg.connect(pg_store) as conn:
        rows = conn.execute(
            "SELECT session_id, lines, pending, lease_owner, lease_epoch FROM tether_sessions"
        ).fetchall()
        logs = dict(
            conn.execute(
                "SELECT session_id, string_agg(convert_from(data, 'UTF8'), E'\\n' "
                "ORDER BY line_no) || E'\\n' FROM tether_lines GROUP BY session_id"
            ).fetchall()
        )
    assert len(rows) == 2002
    new = [r for r in rows if r[0] != seed]
    assert {(r[1], r[2], r[3], r[4]) for r in new} == {(2, True, None, 1)}
    for n, session_id in ((0, ids[0]), (1999, ids[-1])):
        state = Reducer.load(logs[session_id].encode()).state
        assert state.transcript[-1]["content"] == f"task {n}"
        assert state.operation.kind == "run"
    bare = Reducer.load(logs[ids[19]].encode()).state
    assert bare.transcript[-1]["content"] == "a bare string is a prompt"
    seeded = Reducer.load(logs[seed].encode()).state
    assert [m["content"] for m in seeded.transcript if m["role"] == "user"] == [
        "seed",
        "one more for the seed",
    ]
    driven = tether("resume", ids[-1], "--store", pg_store, *model, cwd=ws)
    assert driven.returncode == 0 and driven.stdout.strip() == "Done.", driven.stderr


GOOD = json.dumps({"prompt": "fine"})


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([GOOD, "{not json"], "p.jsonl line 2: not valid JSON (Expecting property name"),
        (
            [GOOD, GOOD, "[1, 2]"],
            'p.jsonl line 3: expected an object {"prompt": …} or a string, got an array',
        ),
        (["null"], 'p.jsonl line 1: expected an object {"prompt": …} or a string, got null'),
        (
            [json.dumps({"prompt": ""})],
            'p.jsonl line 1: "prompt" must be a non-empty string, got an empty prompt',
        ),
        (
            [json.dumps({"prompt": 3})],
            'p.jsonl line 1: "prompt" must be a non-empty string, got a number',
        ),
        (
            [json.dumps({"session": "x"})],
            'p.jsonl line 1: "prompt" must be a non-empty string, got null',
        ),
        (
            [json.dumps({"promt": "x"})],
            "p.jsonl line 1: unknown key 'promt' (known: prompt, session)",
        ),
        (
            [GOOD, json.dumps({"prompt": "x", "session": 7})],
            'p.jsonl line 2: "session" must be a session id string, got a number',
        ),
        (["[" * 100_000], "p.jsonl line 1: not valid JSON"),
        (["", "  "], "p.jsonl: no prompts in it"),
    ],
)
def test_a_bad_prompts_file_is_one_line_naming_the_line(lines: list[str], expected: str) -> None:
    from tether._runtime.worker import parse_submissions
    from tether.errors import ConfigurationError

    with pytest.raises(ConfigurationError) as raised:
        parse_submissions(("\n".join(lines) + "\n").encode(), "p.jsonl")
    assert str(raised.value).startswith(expected) and "\n" not in str(raised.value)


def test_submit_from_a_bad_file_accepts_nothing(pg_store: str, ws: Path) -> None:  # noqa: F811
    model = ["-m", "scripted:script.json"]
    (ws / "prompts.jsonl").write_text(f"{GOOD}\n{GOOD}\n{{oops\n")
    result = tether("submit", "--from", "prompts.jsonl", "--store", pg_store, *model, cwd=ws)
    assert result.returncode == 2, result.stderr
    assert "prompts.jsonl line 3: not valid JSON" in one_error_line(result)
    both = tether("submit", "x", "--from", "prompts.jsonl", "--store", pg_store, *model, cwd=ws)
    assert both.returncode == 2 and "give no PROMPT" in one_error_line(both)
    with psycopg.connect(pg_store) as conn:
        assert conn.execute("SELECT count(*) FROM tether_sessions").fetchone() == (0,)


def test_submit_from_a_file_works_on_the_file_store(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "script.json").write_text(json.dumps(SCRIPT))
    (ws / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": f"t{n}"}) + "\n" for n in range(3))
    )
    model = ["-m", "scripted:script.json"]
    result = tether("submit", "--from", "prompts.jsonl", *model, cwd=ws)
    assert result.returncode == 0, result.stderr
    ids = result.stdout.split()
    assert len(ids) == 3 and "accepted 3 runs in the file store" in result.stderr
    files = sorted((ws / ".tether" / "sessions").glob("*.jsonl"))
    assert sorted(f.stem.split("_", 1)[1] for f in files) == sorted(ids)
    resumed = tether("resume", ids[1], *model, cwd=ws)
    assert resumed.returncode == 0 and resumed.stdout.strip() == "Done.", resumed.stderr
    [counted] = (ws / "n.txt").read_text().split()
    assert counted.startswith(f"{ids[1]}:")
