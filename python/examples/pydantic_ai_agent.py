"""A Pydantic AI agent, made durable by DBOS (``DBOSDurability``), whose
tool sends an e-mail exactly once per call, however often DBOS runs the
agent: recovery after a crash, ``fork_workflow``, two processes running
one workflow.

    model request (DBOS step) ──► send_email (tool, fenced) ──► model request ──► answer

The model is a ``FunctionModel`` (no network): it asks for ``send_email``
to the recipient in the table ``dbos_agent_recipient`` (an LLM whose answer
an operator can change before forking), then answers with the tool's
result. The tool POSTs the e-mail with an ``Idempotency-Key`` fenced by the
onceflow ledger under ``onceflow.pydantic_ai.tool_key`` (the DBOS workflow's
origin, the tool's name, the digest of its arguments).

Run as a program (the tests do, and SIGKILL it)::

    python pydantic_ai_agent.py --db URL --mail-url URL --workflow W [--recover | --resume | --fork-at start|send] [--no-fencing]

as ``dbos_agent.py``; ``--fork-at start`` forks from the first model
request, ``--fork-at send`` from the model request after the tool (the
tool runs again, the first answer is DBOS's record). The last line printed
is JSON: the agent's output and the workflow id.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

import psycopg
from dbos import DBOS, DBOSConfig, SetWorkflowID, WorkflowHandleAsync
from pydantic_ai import Agent, RunContext
from pydantic_ai.durable_exec.dbos import DBOSDurability
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from mailer import FAILPOINT_AFTER_SEND, arendezvous, post_email
from onceflow import current_fence, failpoint
from onceflow.pydantic_ai import fenced_tool

SCOPE = "pydantic-ai-agent"
"""The ledger scope of this agent's effects."""

FAILPOINT_BEFORE_SEND = "agent-before-send"
"""The tool has started, nothing is sent."""

SETTINGS: dict[str, Any] = {}
"""Set by main before DBOS launches: db, mail_url, fencing, barrier, parties."""


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """First turn: call send_email; after the tool returned: report."""
    for m in messages:
        if isinstance(m, ModelRequest):
            for part in m.parts:
                if isinstance(part, ToolReturnPart):
                    return ModelResponse(parts=[TextPart(f"sent {part.content}")])
    with psycopg.connect(SETTINGS["db"]) as conn:
        row = conn.execute("SELECT to_addr FROM dbos_agent_recipient").fetchone()
    to = row[0] if row else "nobody@example.com"
    args = {"to": to, "subject": "Re: the report", "body": f"Hello {to}: done."}
    return ModelResponse(parts=[ToolCallPart("send_email", args)])


agent: Agent[None, str] = Agent(FunctionModel(model), name="mailer", capabilities=[DBOSDurability()])


async def _post(to: str, subject: str, body: str) -> str:
    key = current_fence().key if SETTINGS["fencing"] else None
    email = {"to": to, "subject": subject, "body": body}
    _, email_id = await asyncio.to_thread(post_email, SETTINGS["mail_url"], key, email)
    return f"{email_id} to {to}"


@fenced_tool(SCOPE)
async def _fenced_post(ctx: RunContext[None], to: str, subject: str, body: str) -> str:
    return await _post(to, subject, body)


@agent.tool
async def send_email(ctx: RunContext[None], to: str, subject: str, body: str) -> str:
    """Send an e-mail."""
    failpoint.hit(FAILPOINT_BEFORE_SEND)
    await arendezvous(SETTINGS["barrier"], SETTINGS["parties"])
    if SETTINGS["fencing"]:
        sent = await _fenced_post(ctx, to, subject, body)
    else:
        sent = await _post(to, subject, body)
    failpoint.hit(FAILPOINT_AFTER_SEND)  # the next model request (a DBOS step) has not run
    return sent


@DBOS.workflow()
async def mail_workflow(request: str) -> str:
    result = await agent.run(request)
    return result.output


async def fork_step(workflow_id: str, at: str) -> int:
    steps = sorted(await DBOS.list_workflow_steps_async(workflow_id), key=lambda s: s["function_id"])
    requests = [s["function_id"] for s in steps if "request" in s["function_name"]]
    if len(requests) < 2:
        raise SystemExit(f"workflow {workflow_id} has {len(requests)} model requests: {steps}")
    return requests[0] if at == "start" else requests[1]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    handle: WorkflowHandleAsync[str]
    if args.fork_at:
        handle = await DBOS.fork_workflow_async(args.workflow, await fork_step(args.workflow, args.fork_at))
    elif args.resume:
        handle = await DBOS.resume_workflow_async(args.workflow)
    elif args.recover:
        handle = await DBOS.retrieve_workflow_async(args.workflow)
    else:
        with SetWorkflowID(args.workflow):
            handle = await DBOS.start_workflow_async(mail_workflow, "e-mail the report")
    return {"result": await handle.get_result(), "workflow_id": handle.get_workflow_id()}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--db", required=True)
    ap.add_argument("--mail-url", required=True)
    ap.add_argument("--workflow", required=True)
    ap.add_argument("--recover", action="store_true")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--fork-at", choices=["start", "send"])
    ap.add_argument("--no-fencing", action="store_true")
    ap.add_argument("--barrier")
    ap.add_argument("--parties", type=int, default=2)
    args = ap.parse_args(argv)
    SETTINGS.update(
        db=args.db, mail_url=args.mail_url, fencing=not args.no_fencing, barrier=args.barrier, parties=args.parties
    )
    os.environ["ONCEFLOW_DATABASE_URL"] = args.db  # the fence's database: DBOS's too
    config: DBOSConfig = {"name": "onceflow-pydantic-ai-agent", "system_database_url": args.db, "log_level": "WARNING"}
    DBOS(config=config)
    DBOS.launch()
    try:
        out = asyncio.run(run(args))
        print(json.dumps(out), flush=True)
    finally:
        DBOS.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
