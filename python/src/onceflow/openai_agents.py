"""OpenAI Agents SDK integration: the idempotency key of a tool call's
effect.

``tool_key(ctx, on)`` is ``graph_key(identity, tool, input_digest(on))``
where

- ``identity`` names the agent run across its re-runs: by default the run's
  ``RunConfig.group_id`` (the SDK's id for a conversation or thread, which
  the caller passes again when it runs the conversation again), or what
  ``identity=`` takes from the ``ToolContext`` (e.g. a task id in
  ``ctx.context``),
- ``tool`` is the tool's name (``ctx.tool_name``),
- ``on`` is the value that identifies the effect: the tool call's
  arguments.

The SDK has no durable execution of its own: after a crash, or when a run
is repeated (a retry, a resumed conversation, a second worker given the
same task), the run starts again and the model asks for the tools again,
each with a new ``tool_call_id``, and ``RunConfig.trace_id`` is new on every
run. The identity and the arguments are what make two calls the same
effect: the same arguments reuse the recorded result, changed ones (the
model answered differently) get a new key and a real call. Two calls of one
tool with equal arguments in one run are one effect: put what tells them
apart into the arguments.

Use::

    @function_tool
    @fenced_tool(scope="mail", db=pool)
    async def send_email(ctx: ToolContext[Deps], to: str, body: str) -> str:
        return await mail.send(to, body, idempotency_key=current_fence().key)

    await Runner.run(agent, "...", run_config=RunConfig(group_id="ticket-7"))

``fenced_tool`` goes under ``@function_tool`` (the signature and docstring
are kept, so the tool's schema is unchanged); its first parameter must be
the ``ToolContext``. The tool's return value is recorded (JSON) and a
replayed call returns it without running the tool. Requires
``openai-agents`` (``pip install onceflow[openai-agents]``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from agents.tool_context import ToolContext

from ._contexttool import context_tool_fence
from .digest import input_digest
from .effects import DB
from .errors import InvalidKeyError
from .keys import graph_key

__all__ = ["fenced_tool", "run_identity", "tool_key"]

T = TypeVar("T")

Identity = Callable[[ToolContext[Any]], str]


def run_identity(ctx: ToolContext[Any], identity: Identity | None = None) -> str:
    """The stable identity of the run ``ctx`` belongs to: ``identity(ctx)``
    when given, else the run's ``RunConfig.group_id``."""
    value: str | None
    if identity is not None:
        value = identity(ctx)
    else:
        value = ctx.run_config.group_id if ctx.run_config is not None else None
        if not value:
            raise InvalidKeyError(
                "onceflow.openai_agents: the run has no RunConfig.group_id; run it with "
                "RunConfig(group_id=<conversation or task id>) or pass identity="
            )
    if not isinstance(value, str) or value == "":
        raise InvalidKeyError(f"onceflow.openai_agents: identity gave {value!r}, want a non-empty str")
    return value


def tool_key(ctx: ToolContext[Any], on: Any, *, identity: Identity | None = None) -> str:
    """The key of the running tool call's effect identified by ``on``."""
    if not ctx.tool_name:
        raise InvalidKeyError("onceflow.openai_agents: no running tool (ctx.tool_name is empty)")
    return graph_key(run_identity(ctx, identity), ctx.tool_name, input_digest(on))


def fenced_tool(
    scope: str = "",
    *,
    db: DB = None,
    identity: Identity | None = None,
    on: Callable[..., Any] | None = None,
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Fence a tool function (sync or async) whose first parameter is the
    ``ToolContext`` by :func:`tool_key`. ``on`` maps the tool's arguments
    (after the context, by parameter name) to the identifying value
    (default: all of them); ``scope`` and ``db`` are
    :class:`~onceflow.fenced`'s. Inside, ``current_fence().key`` is the key
    to send downstream."""

    return context_tool_fence(
        "onceflow.openai_agents", ToolContext, lambda ctx, value: tool_key(ctx, value, identity=identity), scope, db, on
    )
