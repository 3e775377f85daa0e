"""Pydantic AI integration: the idempotency key of a tool call's effect.

``tool_key(ctx, on)`` is ``graph_key(identity, tool, input_digest(on))``
where

- ``identity`` names the agent run across its re-runs: inside a DBOS
  workflow (Pydantic AI's ``DBOSDurability``), the workflow's origin
  (``onceflow.dbos.root_workflow_id``: the workflow's id, or for a fork the
  id of the workflow it was forked from); elsewhere, what ``identity=``
  gives (a conversation or task id from ``ctx.deps``),
- ``tool`` is the tool's name (``ctx.tool_name``),
- ``on`` is the value that identifies the effect: the tool call's
  arguments.

Why not ``ctx.tool_call_id`` or ``ctx.run_id``: the tool call id is the
model's, and a re-run that asks the model again (a fork from the model
request, a run repeated after a crash without durable execution) gets a new
one for the same call; the run id is new on every run. The arguments are
what make two calls the same effect: the same arguments reuse the recorded
result, changed ones (the model answered differently) get a new key and a
real call. Two calls of one tool with equal arguments in one run are one
effect: put what tells them apart into the arguments.

Use::

    @agent.tool
    @fenced_tool(scope="mail", db=pool)
    async def send_email(ctx: RunContext[Deps], to: str, body: str) -> str:
        return await mail.send(to, body, idempotency_key=current_fence().key)

``fenced_tool`` goes under ``@agent.tool`` (the tool's signature and
docstring are kept, so its schema is unchanged). The tool's return value is
recorded (JSON) and a replayed call returns it without running the tool.
Requires ``pydantic-ai-slim`` (``pip install onceflow[pydantic-ai]``);
``dbos`` only for the DBOS identity.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic_ai import RunContext

from ._contexttool import context_tool_fence
from .digest import input_digest
from .effects import DB
from .errors import InvalidKeyError
from .keys import graph_key

__all__ = ["fenced_tool", "run_identity", "tool_key"]

T = TypeVar("T")

Identity = Callable[[RunContext[Any]], str]


def run_identity(ctx: RunContext[Any], identity: Identity | None = None) -> str:
    """The stable identity of the run ``ctx`` belongs to: ``identity(ctx)``
    when given, else the DBOS workflow's origin when the run is inside a
    DBOS workflow."""
    if identity is not None:
        value = identity(ctx)
        if not isinstance(value, str) or value == "":
            raise InvalidKeyError(f"onceflow.pydantic_ai: identity gave {value!r}, want a non-empty str")
        return value
    try:
        from dbos import DBOS
    except ImportError:  # pragma: no cover - dbos is installed with the test extras
        DBOS = None  # type: ignore[assignment,misc]  # noqa: N806
    if DBOS is not None and DBOS.workflow_id:
        from .dbos import root_workflow_id

        return root_workflow_id()
    raise InvalidKeyError(
        "onceflow.pydantic_ai: the run is not inside a DBOS workflow; pass identity= "
        "(a function of the RunContext returning a stable run id, e.g. a conversation id from ctx.deps)"
    )


def tool_key(ctx: RunContext[Any], on: Any, *, identity: Identity | None = None) -> str:
    """The key of the running tool call's effect identified by ``on``."""
    tool = ctx.tool_name
    if not tool:
        raise InvalidKeyError("onceflow.pydantic_ai: no running tool (ctx.tool_name is empty)")
    return graph_key(run_identity(ctx, identity), tool, input_digest(on))


def fenced_tool(
    scope: str = "",
    *,
    db: DB = None,
    identity: Identity | None = None,
    on: Callable[..., Any] | None = None,
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Fence a tool function (sync or async) whose first parameter is the
    ``RunContext`` by :func:`tool_key`. ``on`` maps the tool's arguments
    (after the context, by parameter name) to the identifying value
    (default: all of them); ``scope`` and ``db`` are
    :class:`~onceflow.fenced`'s. Inside, ``current_fence().key`` is the key
    to send downstream."""

    return context_tool_fence(
        "onceflow.pydantic_ai", RunContext, lambda ctx, value: tool_key(ctx, value, identity=identity), scope, db, on
    )
