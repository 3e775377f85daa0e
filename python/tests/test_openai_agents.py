"""The OpenAI Agents SDK agent (examples/openai_agents_agent.py) under its
duplicate sources: a SIGKILL after the tool's e-mail and before the run
saw its output (then the conversation run again), the same conversation run
again (same and changed model answer), two workers running it at once. The
SDK keeps no durable record, so every re-run asks the model again and gets
a new tool call id. The mail service counts every e-mail."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import EXAMPLES, MailService
from onceflow import InvalidKeyError
from test_dbos import ledger, set_recipient

sys.path.insert(0, str(EXAMPLES))
import mailer  # noqa: E402


def start(db_url: str, mail: MailService, *args: str, failpoints: str = "") -> subprocess.Popen[str]:
    env = dict(os.environ, ONCEFLOW_FAILPOINTS=failpoints, OPENAI_API_KEY="", OPENAI_AGENTS_DISABLE_TRACING="1")
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / "openai_agents_agent.py"), "--db", db_url, "--mail-url", mail.url, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run(db_url: str, mail: MailService, *args: str) -> str:
    p = start(db_url, mail, *args)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, out + err
    result: str = json.loads(out.strip().splitlines()[-1])["result"]
    return result


def crash_then_rerun(db_url: str, mail: MailService, *extra: str) -> str:
    set_recipient(db_url, "ann@example.com")
    p = start(db_url, mail, "--conversation", "c-crash", *extra, failpoints=mailer.FAILPOINT_AFTER_SEND)
    out, err = p.communicate(timeout=120)
    assert p.returncode == -signal.SIGKILL, out + err
    assert mail.count() == 1, "the e-mail went out before the crash"
    return run(db_url, mail, "--conversation", "c-crash", *extra)


def test_crash_after_the_tool_call_fenced_sends_once(db_url: str, mail: MailService) -> None:
    assert crash_then_rerun(db_url, mail) == "sent msg-1 to ann@example.com"
    assert mail.count() == 1, f"{mail.count()} e-mails sent, want 1"
    rows = ledger(db_url)
    assert len(rows) == 1 and rows[0][1:] == ("done", 1, "msg-1 to ann@example.com")
    assert rows[0][0].startswith("c-crash:send_email:") and mail.keys() == [rows[0][0]]


def test_crash_after_the_tool_call_unfenced_sends_twice(db_url: str, mail: MailService) -> None:
    assert crash_then_rerun(db_url, mail, "--no-fencing") == "sent msg-2 to ann@example.com"
    assert mail.count() == 2, "without fencing the re-run sends again"


def test_rerun_reuses_the_recorded_result_and_a_changed_answer_really_calls(db_url: str, mail: MailService) -> None:
    set_recipient(db_url, "ann@example.com")
    for _ in range(2):
        assert run(db_url, mail, "--conversation", "c-1") == "sent msg-1 to ann@example.com"
    assert mail.count() == 1, "the same conversation run again sent again"
    set_recipient(db_url, "bob@example.com")
    assert run(db_url, mail, "--conversation", "c-1") == "sent msg-2 to bob@example.com"
    assert run(db_url, mail, "--conversation", "c-1") == "sent msg-2 to bob@example.com"
    # Another conversation is another effect.
    assert run(db_url, mail, "--conversation", "c-2") == "sent msg-3 to bob@example.com"
    assert mail.to() == ["ann@example.com", "bob@example.com", "bob@example.com"]
    assert [r[2] for r in ledger(db_url)] == [1, 1, 1]


def test_rerun_unfenced_sends_again(db_url: str, mail: MailService) -> None:
    set_recipient(db_url, "ann@example.com")
    for _ in range(2):
        run(db_url, mail, "--conversation", "c-1", "--no-fencing")
    assert mail.count() == 2, "without fencing a re-run sends again"


def race(db_url: str, mail: MailService, tmp_path: Path, *extra: str) -> list[tuple[int, str]]:
    """Two workers given the same conversation meet inside the tool before
    the send."""
    set_recipient(db_url, "ann@example.com")
    meet = tmp_path / "meet"
    procs = [start(db_url, mail, "--conversation", "c-race", "--barrier", str(meet), *extra) for _ in range(2)]
    outs = []
    deadline = time.monotonic() + 120
    for p in procs:
        out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        outs.append((p.returncode, out + err))
    return outs


def test_two_workers_racing_fenced_send_once(db_url: str, mail: MailService, tmp_path: Path) -> None:
    outs = race(db_url, mail, tmp_path)
    assert mail.count() == 1, f"{mail.count()} e-mails sent, want 1: {outs}"
    assert all(rc == 0 and '"sent msg-1 to ann@example.com"' in out for rc, out in outs), outs
    assert [r[1:3] for r in ledger(db_url)] == [("done", 1)]


def test_two_workers_racing_unfenced_send_twice(db_url: str, mail: MailService, tmp_path: Path) -> None:
    race(db_url, mail, tmp_path, "--no-fencing")
    assert mail.count() == 2, "without fencing both workers send"


def test_identity_is_required() -> None:
    from agents import RunConfig
    from agents.tool_context import ToolContext

    from onceflow.openai_agents import run_identity

    ctx: ToolContext[None] = ToolContext(None, tool_name="t", tool_call_id="c", tool_arguments="{}", run_config=RunConfig())
    with pytest.raises(InvalidKeyError, match="group_id"):
        run_identity(ctx)
    assert run_identity(ctx, lambda c: "task-9") == "task-9"
    ctx2: ToolContext[None] = ToolContext(
        None, tool_name="t", tool_call_id="c", tool_arguments="{}", run_config=RunConfig(group_id="g-1")
    )
    assert run_identity(ctx2) == "g-1"
