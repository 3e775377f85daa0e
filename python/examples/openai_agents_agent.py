"""An OpenAI Agents SDK agent whose tool sends an e-mail exactly once per
conversation and recipient, however often the run is repeated: after a
crash, a retry, a second worker given the same conversation.

    model ──► send_email (function tool, fenced) ──► model ──► answer

The model is local (``ScriptedModel``, the SDK's ``Model`` interface; no
network, no API key): it asks for ``send_email`` to the recipient in the
table ``dbos_agent_recipient`` (an LLM whose answer can change between
runs), then answers with the tool's result. The tool POSTs the e-mail with
an ``Idempotency-Key`` fenced by the onceflow ledger under
``onceflow.openai_agents.tool_key`` (the run's ``RunConfig.group_id``, the
tool's name, the digest of its arguments).

Run as a program (the tests do, and SIGKILL it)::

    python openai_agents_agent.py --db URL --mail-url URL --conversation C [--no-fencing]

The SDK keeps no durable record of a run: recovering from a crash is
running the conversation again. The last line printed is JSON: the
agent's final output.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from agents import (
    Agent,
    Handoff,
    Model,
    ModelResponse,
    ModelSettings,
    ModelTracing,
    RunConfig,
    Runner,
    Tool,
    TResponseInputItem,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from agents.agent_output import AgentOutputSchemaBase
from agents.tool_context import ToolContext
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponsePromptParam,
    ResponseStreamEvent,
)

from mailer import FAILPOINT_AFTER_SEND, arendezvous, post_email
from onceflow import current_fence, failpoint
from onceflow.openai_agents import fenced_tool

SCOPE = "openai-agents-agent"
"""The ledger scope of this agent's effects."""

SETTINGS: dict[str, Any] = {}
"""Set by main: db, mail_url, fencing, barrier, parties."""


class ScriptedModel(Model):
    """First turn: call send_email; once its output is in the input: report it."""

    def __init__(self) -> None:
        self.calls = 0

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        self.calls += 1
        for item in input if isinstance(input, list) else []:
            raw: dict[str, Any] = dict(item)
            if raw.get("type") == "function_call_output":
                text = ResponseOutputText(text=f"sent {raw['output']}", type="output_text", annotations=[])
                msg = ResponseOutputMessage(
                    id=f"msg-{self.calls}", content=[text], role="assistant", status="completed", type="message"
                )
                return ModelResponse(output=[msg], usage=Usage(), response_id=None)
        with psycopg.connect(SETTINGS["db"]) as conn:
            row = conn.execute("SELECT to_addr FROM dbos_agent_recipient").fetchone()
        to = row[0] if row else "nobody@example.com"
        args = {"to": to, "subject": "Re: the report", "body": f"Hello {to}: done."}
        # A new call id on every run, as a real model gives.
        call = ResponseFunctionToolCall(
            arguments=json.dumps(args), call_id=f"call-{os.getpid()}-{self.calls}", name="send_email", type="function_call"
        )
        return ModelResponse(output=[call], usage=Usage(), response_id=None)

    def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[ResponseStreamEvent]:
        raise NotImplementedError("ScriptedModel does not stream")


async def _post(to: str, subject: str, body: str) -> str:
    key = current_fence().key if SETTINGS["fencing"] else None
    email = {"to": to, "subject": subject, "body": body}
    _, email_id = await asyncio.to_thread(post_email, SETTINGS["mail_url"], key, email)
    return f"{email_id} to {to}"


@fenced_tool(SCOPE)
async def _fenced_post(ctx: ToolContext[None], to: str, subject: str, body: str) -> str:
    return await _post(to, subject, body)


@function_tool
async def send_email(ctx: ToolContext[None], to: str, subject: str, body: str) -> str:
    """Send an e-mail."""
    await arendezvous(SETTINGS["barrier"], SETTINGS["parties"])
    if SETTINGS["fencing"]:
        sent = await _fenced_post(ctx, to, subject, body)
    else:
        sent = await _post(to, subject, body)
    failpoint.hit(FAILPOINT_AFTER_SEND)  # the run has not seen the tool's output
    return sent


async def run(conversation: str) -> str:
    agent: Agent[None] = Agent(name="mailer", instructions="Send the e-mail.", model=ScriptedModel(), tools=[send_email])
    result = await Runner.run(
        agent, "e-mail the report", run_config=RunConfig(group_id=conversation, tracing_disabled=True)
    )
    return str(result.final_output)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--db", required=True)
    ap.add_argument("--mail-url", required=True)
    ap.add_argument("--conversation", required=True)
    ap.add_argument("--no-fencing", action="store_true")
    ap.add_argument("--barrier")
    ap.add_argument("--parties", type=int, default=2)
    args = ap.parse_args(argv)
    SETTINGS.update(
        db=args.db, mail_url=args.mail_url, fencing=not args.no_fencing, barrier=args.barrier, parties=args.parties
    )
    os.environ["ONCEFLOW_DATABASE_URL"] = args.db
    set_tracing_disabled(True)
    print(json.dumps({"result": asyncio.run(run(args.conversation))}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
