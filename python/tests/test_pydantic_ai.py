"""The Pydantic AI agent made durable by DBOS (examples/pydantic_ai_agent.py)
under its duplicate sources: a SIGKILL after the tool's e-mail and before
the next model request is recorded (then DBOS's recovery, which replays the
recorded model answer and runs the tool again), forks of the workflow, two
processes running it at once. The mail service counts every e-mail."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.models.test import TestModel

from conftest import MailService
from onceflow import InvalidKeyError, current_fence
from onceflow.digest import input_digest
from onceflow.pydantic_ai import fenced_tool
from test_dbos import crash, ledger, race, run, set_recipient, step_outputs

SCRIPT = "pydantic_ai_agent.py"


def crash_then_recover(db_url: str, mail: MailService, *extra: str) -> dict[str, Any]:
    set_recipient(db_url, "ann@example.com")
    crash(db_url, mail, "--workflow", "wf-crash", *extra, script=SCRIPT)
    # DBOS recorded the first model request only: the tool's call is not in it.
    assert len(step_outputs(db_url, "wf-crash")) == 1
    return run(db_url, mail, "--workflow", "wf-crash", "--recover", *extra, script=SCRIPT)


def test_crash_after_the_tool_call_fenced_sends_once(db_url: str, mail: MailService) -> None:
    out = crash_then_recover(db_url, mail)
    assert mail.count() == 1, f"{mail.count()} e-mails sent, want 1"
    assert out == {"result": "sent msg-1 to ann@example.com", "workflow_id": "wf-crash"}
    rows = ledger(db_url)
    assert len(rows) == 1 and rows[0][1:] == ("done", 1, "msg-1 to ann@example.com")
    assert rows[0][0].startswith("wf-crash:send_email:") and mail.keys() == [rows[0][0]]


def test_crash_after_the_tool_call_unfenced_sends_twice(db_url: str, mail: MailService) -> None:
    out = crash_then_recover(db_url, mail, "--no-fencing")
    assert mail.count() == 2, "without fencing DBOS's recovery runs the tool again"
    assert out["result"] == "sent msg-2 to ann@example.com"


def test_fork_reuses_the_recorded_result_and_a_changed_answer_really_calls(db_url: str, mail: MailService) -> None:
    set_recipient(db_url, "ann@example.com")
    assert run(db_url, mail, "--workflow", "wf-1", script=SCRIPT)["result"] == "sent msg-1 to ann@example.com"
    for at in ("send", "start"):
        out = run(db_url, mail, "--workflow", "wf-1", "--fork-at", at, script=SCRIPT)
        assert out["result"] == "sent msg-1 to ann@example.com" and out["workflow_id"] != "wf-1", at
    assert mail.count() == 1, "a fork sent the e-mail again"
    # The model answers with another recipient on a fork from its request.
    set_recipient(db_url, "bob@example.com")
    bob = run(db_url, mail, "--workflow", "wf-1", "--fork-at", "start", script=SCRIPT)
    assert bob["result"] == "sent msg-2 to bob@example.com"
    assert run(db_url, mail, "--workflow", bob["workflow_id"], "--fork-at", "send", script=SCRIPT)["result"] == bob["result"]
    assert mail.to() == ["ann@example.com", "bob@example.com"]
    keys = mail.keys()
    assert keys[0] != keys[1] and all(k is not None and k.startswith("wf-1:send_email:") for k in keys)


def test_fork_unfenced_sends_again(db_url: str, mail: MailService) -> None:
    set_recipient(db_url, "ann@example.com")
    run(db_url, mail, "--workflow", "wf-1", "--no-fencing", script=SCRIPT)
    run(db_url, mail, "--workflow", "wf-1", "--fork-at", "send", "--no-fencing", script=SCRIPT)
    assert mail.count() == 2, "without fencing a fork runs the tool again"


def test_two_runners_racing_fenced_send_once(db_url: str, mail: MailService, tmp_path: Path) -> None:
    outs = race(db_url, mail, tmp_path, script=SCRIPT)
    assert mail.count() == 1, f"{mail.count()} e-mails sent, want 1: {outs}"
    assert any(rc == 0 and '"sent msg-1 to ann@example.com"' in out for rc, out in outs), outs
    assert [r[1:3] for r in ledger(db_url)] == [("done", 1)]


def test_two_runners_racing_unfenced_send_twice(db_url: str, mail: MailService, tmp_path: Path) -> None:
    race(db_url, mail, tmp_path, "--no-fencing", script=SCRIPT)
    # The control: without fencing each runner sends (a runner whose step
    # record loses the race may run the tool once more: 3 were seen).
    assert mail.count() >= 2, f"without fencing both runners send: {mail.count()} e-mails"


def test_identity_outside_dbos(db_url: str) -> None:
    """Without DBOS the run's identity comes from identity=; a run repeated
    with the same identity and the same arguments reuses the result."""
    calls: list[str] = []

    def make_agent(identity: Any) -> Agent[str, str]:
        agent: Agent[str, str] = Agent(TestModel(), deps_type=str)

        @agent.tool
        @fenced_tool("t", db=db_url, identity=identity)
        def notify(ctx: RunContext[str], to: str) -> str:
            calls.append(current_fence().key)
            return f"ok {len(calls)}"

        return agent

    agent = make_agent(lambda ctx: ctx.deps)
    for _ in range(2):
        asyncio.run(agent.run("go", deps="conv-7"))
    assert len(calls) == 1 and calls[0] == f"conv-7:notify:{input_digest({'to': 'a'})}"
    asyncio.run(agent.run("go", deps="conv-8"))
    assert len(calls) == 2
    with pytest.raises(InvalidKeyError, match="not inside a DBOS workflow"):
        asyncio.run(make_agent(None).run("go", deps="x"))
