"""The DBOS workflow (examples/dbos_agent.py) under DBOS's duplicate
sources: a SIGKILL after the step's e-mail and before DBOS records the step
(then DBOS's start-up recovery), ``fork_workflow``, two processes running one
workflow at once (``resume_workflow`` of a workflow still running). The mail service dedups nothing: its count is the
number of e-mails a person would receive."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from conftest import EXAMPLES, MailService

sys.path.insert(0, str(EXAMPLES))
import mailer  # noqa: E402


def set_recipient(db_url: str, to: str) -> None:
    with psycopg.connect(db_url) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS dbos_agent_recipient (to_addr text NOT NULL)")
        conn.execute("DELETE FROM dbos_agent_recipient")
        conn.execute("INSERT INTO dbos_agent_recipient VALUES (%s)", (to,))


def start(
    db_url: str, mail: MailService, *args: str, failpoints: str = "", script: str = "dbos_agent.py"
) -> subprocess.Popen[str]:
    env = dict(os.environ, ONCEFLOW_FAILPOINTS=failpoints)
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / script), "--db", db_url, "--mail-url", mail.url, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(p: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=120)
    return p.returncode, out, err


def run(db_url: str, mail: MailService, *args: str, script: str = "dbos_agent.py") -> dict[str, Any]:
    rc, out, err = finish(start(db_url, mail, *args, script=script))
    assert rc == 0, out + err
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def crash(db_url: str, mail: MailService, *args: str, script: str = "dbos_agent.py") -> None:
    rc, out, err = finish(start(db_url, mail, *args, failpoints=mailer.FAILPOINT_AFTER_SEND, script=script))
    assert rc == -signal.SIGKILL, out + err
    assert f"failpoint {mailer.FAILPOINT_AFTER_SEND}: SIGKILL" in err
    assert mail.count() == 1, "the e-mail went out before the crash"


def step_outputs(db_url: str, workflow_id: str) -> list[str]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT function_name FROM dbos.operation_outputs WHERE workflow_uuid = %s ORDER BY function_id",
            (workflow_id,),
        ).fetchall()
    return [r[0].rsplit(".", 1)[-1] for r in rows]


def ledger(db_url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(
            "SELECT idempotency_key, status, attempts, result FROM onceflow.effects ORDER BY created_at"
        ).fetchall()


def crash_then_recover(db_url: str, mail: MailService, *extra: str) -> dict[str, Any]:
    set_recipient(db_url, "ann@example.com")
    crash(db_url, mail, "--workflow", "wf-crash", *extra)
    # DBOS recorded plan, not send_email: recovery runs the step again.
    assert step_outputs(db_url, "wf-crash") == ["plan"]
    return run(db_url, mail, "--workflow", "wf-crash", "--recover", *extra)


def test_crash_before_the_step_is_recorded_fenced_sends_once(db_url: str, mail: MailService) -> None:
    out = crash_then_recover(db_url, mail)
    assert mail.count() == 1, f"{mail.count()} e-mails sent, want 1"
    assert out == {"result": "sent msg-1 to ann@example.com", "workflow_id": "wf-crash"}
    rows = ledger(db_url)
    assert len(rows) == 1 and rows[0][1:] == ("done", 1, "msg-1")
    assert rows[0][0].startswith("wf-crash:send_email:") and mail.keys() == [rows[0][0]]


def test_crash_before_the_step_is_recorded_unfenced_sends_twice(db_url: str, mail: MailService) -> None:
    out = crash_then_recover(db_url, mail, "--no-fencing")
    assert mail.count() == 2, "without fencing DBOS's recovery sends again"
    assert out["result"] == "sent msg-2 to ann@example.com"


def finished_workflow(db_url: str, mail: MailService, *extra: str) -> None:
    set_recipient(db_url, "ann@example.com")
    out = run(db_url, mail, "--workflow", "wf-1", *extra)
    assert out["result"] == "sent msg-1 to ann@example.com" and mail.count() == 1


def test_fork_reuses_the_recorded_result_and_a_changed_input_really_calls(db_url: str, mail: MailService) -> None:
    finished_workflow(db_url, mail)
    # Forks from send_email and from plan re-run send_email with the same
    # arguments under new workflow ids: the recorded result, no e-mail.
    for step in ("send_email", "plan"):
        out = run(db_url, mail, "--workflow", "wf-1", "--fork-from", step)
        assert out["result"] == "sent msg-1 to ann@example.com" and out["workflow_id"] != "wf-1", step
    assert mail.count() == 1, "a fork sent the e-mail again"
    # A fork of a fork has the same origin.
    fork = run(db_url, mail, "--workflow", "wf-1", "--fork-from", "plan")["workflow_id"]
    assert run(db_url, mail, "--workflow", fork, "--fork-from", "send_email")["result"] == "sent msg-1 to ann@example.com"
    assert mail.count() == 1
    # The operator changes the recipient and forks from plan: a new input,
    # a new key, a real e-mail; forking that fork again reuses it.
    set_recipient(db_url, "bob@example.com")
    bob = run(db_url, mail, "--workflow", "wf-1", "--fork-from", "plan")
    assert bob["result"] == "sent msg-2 to bob@example.com"
    assert run(db_url, mail, "--workflow", bob["workflow_id"], "--fork-from", "send_email")["result"] == bob["result"]
    assert mail.to() == ["ann@example.com", "bob@example.com"]
    keys = mail.keys()
    assert keys[0] != keys[1] and all(k is not None and k.startswith("wf-1:send_email:") for k in keys)
    assert [r[2] for r in ledger(db_url)] == [1, 1]


def test_fork_unfenced_sends_again(db_url: str, mail: MailService) -> None:
    finished_workflow(db_url, mail, "--no-fencing")
    run(db_url, mail, "--workflow", "wf-1", "--fork-from", "send_email", "--no-fencing")
    assert mail.count() == 2, "without fencing a fork sends again"


def race(
    db_url: str, mail: MailService, tmp_path: Path, *extra: str, script: str = "dbos_agent.py"
) -> list[tuple[int, str]]:
    """Process A runs the workflow and stalls inside send_email before the
    send; an operator, taking A for dead, resumes the workflow from process
    B (``DBOS.resume_workflow`` re-enqueues a pending workflow, and B runs
    it); both are in the step at once and meet there before the send."""
    set_recipient(db_url, "ann@example.com")
    meet = tmp_path / "meet"
    a = start(db_url, mail, "--workflow", "wf-race", "--barrier", str(meet), *extra, script=script)
    deadline = time.monotonic() + 60
    while not (meet.exists() and any(meet.iterdir())):
        assert a.poll() is None and time.monotonic() < deadline, "runner A never reached the step"
        time.sleep(0.02)
    b = start(db_url, mail, "--workflow", "wf-race", "--resume", "--barrier", str(meet), *extra, script=script)
    outs = []
    for p in (a, b):
        rc, out, err = finish(p)
        outs.append((rc, out + err))
    return outs


def test_two_runners_racing_fenced_send_once(db_url: str, mail: MailService, tmp_path: Path) -> None:
    outs = race(db_url, mail, tmp_path)
    assert mail.count() == 1, f"{mail.count()} e-mails sent, want 1: {outs}"
    # The runner that finishes the workflow has the one e-mail's result.
    assert any(rc == 0 and '"sent msg-1 to ann@example.com"' in out for rc, out in outs), outs
    assert [r[1:3] for r in ledger(db_url)] == [("done", 1)]


def test_two_runners_racing_unfenced_send_twice(db_url: str, mail: MailService, tmp_path: Path) -> None:
    race(db_url, mail, tmp_path, "--no-fencing")
    # The control: without fencing each runner sends (a runner whose step
    # record loses the race may run the tool once more: 3 were seen).
    assert mail.count() >= 2, f"without fencing both runners send: {mail.count()} e-mails"

