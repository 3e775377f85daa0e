"""An agent graph whose tool sends an e-mail exactly once per task, however
often LangGraph runs the node: after a crash, on time travel, on a fork.

    plan ──► send_email ──► confirm

``plan`` turns the request into an e-mail (deterministic: no LLM here),
``send_email`` POSTs it to a mail service with an ``Idempotency-Key``,
fenced by the onceflow ledger under the task's key (``task_key``), and
``confirm`` writes the reply. Checkpoints go to PostgreSQL
(``PostgresSaver``); the ledger lives in the same database.

Run as a program (the tests do, and SIGKILL it)::

    python email_agent.py --db URL --mail-url URL --thread T --to ann@example.com [--no-fencing]

It resumes the thread when its last checkpoint has work left, otherwise it
starts it with the request. It runs with ``durability="sync"``: each step's
checkpoint is written before the next step starts, so a crash loses exactly
the running step (with LangGraph's default, "async", it may lose the step
before too; the fence covers that the same way: the same input, the same
key). The last line printed is the final state, JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from onceflow import failpoint, fenced
from onceflow.langgraph import task_key

SCOPE = "email-agent"
"""The ledger scope of this agent's effects."""

FAILPOINT_AFTER_SEND = "agent-after-send"
"""Armed by the crash tests: the e-mail is sent (and, fenced, its result
recorded), the node has not returned, so LangGraph has not checkpointed it."""


class State(TypedDict, total=False):
    request: str
    to: str
    subject: str
    body: str
    email_id: str
    reply: str


def post_email(mail_url: str, key: str | None, email: dict[str, str]) -> tuple[int, str]:
    """Send one e-mail; returns (HTTP status, the service's message id)."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    req = urllib.request.Request(mail_url, data=json.dumps(email).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = json.loads(resp.read())
        return resp.status, str(body["id"])


def build_graph(db: str, mail_url: str, *, fencing: bool = True) -> StateGraph[State, Any, State, State]:
    def plan(state: State) -> State:
        to = state.get("to") or "nobody@example.com"
        return {"subject": f"Re: {state['request']}", "body": f"Hello {to}, about {state['request']!r}: done."}

    def send_email(state: State, config: RunnableConfig) -> State:
        email = {"to": state["to"], "subject": state["subject"], "body": state["body"]}
        if not fencing:
            _, email_id = post_email(mail_url, None, email)
        else:
            with fenced(task_key(email, config), SCOPE, db=db) as fx:
                if fx.replayed:
                    assert fx.result is not None
                    email_id = str(fx.result.summary["id"])
                    print(f"send_email: {fx.key} replayed, recorded id {email_id}", flush=True)
                else:
                    status, email_id = post_email(mail_url, fx.key, email)
                    fx.record(status, {"id": email_id})
                    print(f"send_email: {fx.key} sent, id {email_id}", flush=True)
        failpoint.hit(FAILPOINT_AFTER_SEND)
        return {"email_id": email_id}

    def confirm(state: State) -> State:
        return {"reply": f"sent {state['email_id']} to {state['to']}"}

    g = StateGraph(State)
    g.add_node("plan", plan)
    g.add_node("send_email", send_email)
    g.add_node("confirm", confirm)
    g.add_edge(START, "plan")
    g.add_edge("plan", "send_email")
    g.add_edge("send_email", "confirm")
    g.add_edge("confirm", END)
    return g


def compile_graph(
    saver: PostgresSaver, db: str, mail_url: str, *, fencing: bool = True
) -> CompiledStateGraph[State, Any, State, State]:
    return build_graph(db, mail_url, fencing=fencing).compile(checkpointer=saver)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--db", required=True)
    ap.add_argument("--mail-url", required=True)
    ap.add_argument("--thread", required=True)
    ap.add_argument("--to", default="ann@example.com")
    ap.add_argument("--request", default="the quarterly report")
    ap.add_argument("--no-fencing", action="store_true")
    args = ap.parse_args(argv)
    with PostgresSaver.from_conn_string(args.db) as saver:
        saver.setup()
        app = compile_graph(saver, args.db, args.mail_url, fencing=not args.no_fencing)
        cfg: RunnableConfig = {"configurable": {"thread_id": args.thread}}
        snapshot = app.get_state(cfg)
        if snapshot.next:
            print(f"resuming thread {args.thread} at {list(snapshot.next)}", flush=True)
            out = app.invoke(None, cfg, durability="sync")
        else:
            out = app.invoke({"request": args.request, "to": args.to}, cfg, durability="sync")
    print(json.dumps(out, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
