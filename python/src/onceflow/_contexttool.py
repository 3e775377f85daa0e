"""The decorator shared by the agent adapters whose tools take a context
as their first parameter (Pydantic AI's ``RunContext``, the OpenAI Agents
SDK's ``ToolContext``): it binds the call's arguments, takes the context
out, and keys the fence by what the adapter makes of the context and the
identifying value."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from .effects import DB, fenced
from .errors import InvalidKeyError

T = TypeVar("T")


def context_tool_fence(
    adapter: str,
    context_type: type,
    key_of: Callable[[Any, Any], str],
    scope: str,
    db: DB,
    on: Callable[..., Any] | None,
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Fence a tool function whose first parameter is a ``context_type``:
    ``key_of(context, value)`` is the key, where value is ``on`` applied to
    the other arguments by parameter name (default: all of them). Errors
    name ``adapter``."""

    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        sig = inspect.signature(fn)

        def key(*args: Any, **kwargs: Any) -> str:
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as err:
                raise InvalidKeyError(f"{adapter}: arguments of {fn.__qualname__}: {err}") from err
            bound.apply_defaults()
            named = dict(bound.arguments)
            ctx = named.pop(next(iter(sig.parameters)), None)
            if not isinstance(ctx, context_type):
                raise InvalidKeyError(f"{adapter}: {fn.__qualname__}'s first argument is not a {context_type.__name__}")
            value = on(**named) if on is not None else named
            return key_of(ctx, value)

        return functools.wraps(fn)(fenced(key, scope, db=db)(fn))

    return decorate
