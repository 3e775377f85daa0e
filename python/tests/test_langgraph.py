"""The e-mail agent (examples/email_agent.py) under LangGraph's duplicate
sources: a SIGKILL after the tool's call and before the next checkpoint,
time travel, forks. The mail service dedups nothing, so its count is the
number of e-mails a person would receive."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any, TypedDict

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph


from conftest import EXAMPLES, MailService
from onceflow.langgraph import input_digest, task_key

sys.path.insert(0, str(EXAMPLES))
import email_agent  # noqa: E402


def run_agent(db_url: str, mail: MailService, thread: str, *extra: str, failpoints: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ONCEFLOW_FAILPOINTS=failpoints)
    return subprocess.run(
        [sys.executable, str(EXAMPLES / "email_agent.py"), "--db", db_url, "--mail-url", mail.url, "--thread", thread, *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def final_state(p: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert p.returncode == 0, p.stdout + p.stderr
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def next_nodes(db_url: str, thread: str) -> tuple[str, ...]:
    with PostgresSaver.from_conn_string(db_url) as saver:
        app = email_agent.compile_graph(saver, db_url, "http://unused")
        return tuple(app.get_state({"configurable": {"thread_id": thread}}).next)


def crash_then_resume(db_url: str, mail: MailService, *extra: str, failpoint: str) -> dict[str, Any]:
    crashed = run_agent(db_url, mail, "t-crash", *extra, failpoints=failpoint)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    assert f"failpoint {failpoint}: SIGKILL" in crashed.stderr
    assert mail.count() == 1, "the e-mail went out before the crash"
    # The node's work was never checkpointed: resuming the thread runs it again.
    assert next_nodes(db_url, "t-crash") == ("send_email",)
    resumed = run_agent(db_url, mail, "t-crash", *extra)
    assert "resuming thread t-crash at ['send_email']" in resumed.stdout
    return final_state(resumed)


def test_crash_after_send_fenced_sends_once(db_url: str, mail: MailService) -> None:
    state = crash_then_resume(db_url, mail, failpoint=email_agent.FAILPOINT_AFTER_SEND)
    assert mail.count() == 1, f"{mail.count()} e-mails sent, want 1"
    assert state["email_id"] == "msg-1" and state["reply"] == "sent msg-1 to ann@example.com"
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT idempotency_key, status, attempts, result FROM onceflow.effects").fetchall()
    assert len(rows) == 1 and rows[0][1:] == ("done", 1, {"id": "msg-1"})
    assert rows[0][0].startswith("t-crash:send_email:") and mail.keys() == [rows[0][0]]


def test_crash_after_send_unfenced_sends_twice(db_url: str, mail: MailService) -> None:
    state = crash_then_resume(db_url, mail, "--no-fencing", failpoint=email_agent.FAILPOINT_AFTER_SEND)
    assert mail.count() == 2, "without fencing the resumed node sends again"
    assert state["email_id"] == "msg-2"


def test_crash_between_call_and_record_resends_with_the_same_key(db_url: str, mail: MailService) -> None:
    """The one window the ledger cannot close alone: the call happened, its
    result is not recorded. The resumed node calls again with the same
    Idempotency-Key, so a downstream that dedups by key (Stripe-style)
    sends once; this one dedups nothing and sends twice."""
    state = crash_then_resume(db_url, mail, failpoint="effects-after-call")
    keys = mail.keys()
    assert len(keys) == 2 and keys[0] == keys[1] and keys[0] is not None
    assert state["email_id"] == "msg-2"
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT status, attempts FROM onceflow.effects").fetchone()
    assert row == ("done", 2)


def finished_thread(db_url: str, mail: MailService, saver: PostgresSaver) -> tuple[Any, RunnableConfig]:
    app = email_agent.compile_graph(saver, db_url, mail.url)
    cfg: RunnableConfig = {"configurable": {"thread_id": "t-history"}}
    out = app.invoke({"request": "the report", "to": "ann@example.com"}, cfg)
    assert out["email_id"] == "msg-1" and mail.count() == 1
    return app, cfg


def checkpoint_before(app: Any, cfg: RunnableConfig, node: str) -> RunnableConfig:
    for snap in app.get_state_history(cfg):
        if snap.next == (node,):
            c: RunnableConfig = snap.config
            return c
    raise AssertionError(f"no checkpoint before {node}")


def test_time_travel_reuses_the_recorded_result(db_url: str, mail: MailService) -> None:
    with PostgresSaver.from_conn_string(db_url) as saver:
        saver.setup()
        app, cfg = finished_thread(db_url, mail, saver)
        # Replay from before send_email, and from before plan: both re-run
        # send_email with the same input.
        for node in ("send_email", "plan"):
            out = app.invoke(None, checkpoint_before(app, cfg, node))
            assert out["email_id"] == "msg-1", node
        assert mail.count() == 1, "time travel sent the e-mail again"
        # A fork that writes the same values is the same input too.
        same = app.update_state(checkpoint_before(app, cfg, "send_email"), {"to": "ann@example.com"})
        assert app.invoke(None, same)["email_id"] == "msg-1"
        assert mail.count() == 1
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT count(*), min(attempts), max(attempts) FROM onceflow.effects").fetchone()
    assert row == (1, 1, 1)


def test_fork_with_a_changed_input_really_calls(db_url: str, mail: MailService) -> None:
    with PostgresSaver.from_conn_string(db_url) as saver:
        saver.setup()
        app, cfg = finished_thread(db_url, mail, saver)
        fork = app.update_state(checkpoint_before(app, cfg, "send_email"), {"to": "bob@example.com"})
        out = app.invoke(None, fork)
        assert out["email_id"] == "msg-2" and out["reply"] == "sent msg-2 to bob@example.com"
        assert mail.to() == ["ann@example.com", "bob@example.com"]
        # Replaying the fork reuses the fork's own result.
        assert app.invoke(None, fork)["email_id"] == "msg-2"
        assert mail.count() == 2
    keys = mail.keys()
    assert keys[0] != keys[1]
    assert all(k is not None and k.startswith("t-history:send_email:") for k in keys)


class Inner(TypedDict, total=False):
    x: int
    keys: list[str]


def test_task_key_from_the_running_node() -> None:
    """thread and node from the config, the subgraph path from the
    checkpoint namespace, the input's digest; no database needed."""
    seen: dict[str, str] = {}

    def leaf(s: Inner) -> Inner:
        seen["inner"] = task_key({"x": s["x"]})
        return {}

    sub: StateGraph[Inner, Any, Inner, Inner] = StateGraph(Inner)
    sub.add_node("leaf", leaf)  # type: ignore[call-overload,arg-type,unused-ignore]
    sub.add_edge(START, "leaf")
    sub.add_edge("leaf", END)

    def top(s: Inner, config: RunnableConfig) -> Inner:
        seen["top"] = task_key({"x": s["x"]}, config)
        return {}

    g: StateGraph[Inner, Any, Inner, Inner] = StateGraph(Inner)
    g.add_node("top", top)  # type: ignore[call-overload,arg-type,unused-ignore]
    g.add_node("outer", sub.compile())
    g.add_edge(START, "top")
    g.add_edge("top", "outer")
    g.add_edge("outer", END)
    from langgraph.checkpoint.memory import InMemorySaver

    g.compile(checkpointer=InMemorySaver()).invoke({"x": 1}, {"configurable": {"thread_id": "th-1"}})
    d = input_digest({"x": 1})
    assert seen == {"top": f"th-1:top:{d}", "inner": f"th-1:leaf:outer/{d}"}
    assert input_digest({"x": 1}) != input_digest({"x": 2})
    assert input_digest({"a": 1, "b": [1, "é"]}) == input_digest({"b": [1, "é"], "a": 1})


def test_task_key_outside_a_node() -> None:
    from onceflow import InvalidKeyError

    with pytest.raises(InvalidKeyError, match="not inside a LangGraph node"):
        task_key({"x": 1})
    with pytest.raises(InvalidKeyError, match="thread_id"):
        task_key({"x": 1}, {"metadata": {"langgraph_node": "n"}})


def test_input_digest_markers_do_not_collide() -> None:
    """bytes and a dataclass are written with the markers "$bytes" and
    "$type"; a mapping that spells such a marker itself gets another digest
    (its "$" keys are escaped), and the digests of ordinary values are the
    ones keys were made with before (fixed vectors)."""
    import dataclasses

    @dataclasses.dataclass
    class Order:
        id: int
        items: list[str]

    assert input_digest(b"ab") != input_digest({"$bytes": "6162"})
    assert input_digest(Order(7, ["a"])) != input_digest({"$type": "Order", "v": {"id": 7, "items": ["a"]}})
    assert input_digest({"$bytes": "6162"}) != input_digest({"$$bytes": "6162"})
    assert input_digest({"$x": 1}) != input_digest({"$$x": 1})
    vectors = [
        ({"x": 1}, "5041bf1f713df204784353e82f6a4a53"),
        ({"a": 1, "b": [1, "é"], "c": None, "d": 1.5, "e": True}, "7b8fcfa9b673e5cbd7e813613dbd9372"),
        (b"ab", "2f838fad9144d29d1275f013316d4e07"),
        (Order(7, ["a"]), "0df11cd77dc319edcf74f07f06fcff57"),
        ({"k": b"\x00\xff"}, "03626b736d7c63f04e8173db83ae376d"),
    ]
    for value, want in vectors:
        assert input_digest(value) == want, value
