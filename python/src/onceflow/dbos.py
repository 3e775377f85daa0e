"""DBOS Transact integration: the idempotency key of a step's effect.

``step_key(step, on)`` is ``graph_key(root, step, input_digest(on))`` where

- ``root`` is the running workflow's id, or, for a workflow made by
  ``DBOS.fork_workflow``, the id of the workflow it was forked from (followed
  back to the first one),
- ``step`` names the step (``fenced_step`` uses the function's qualified
  name),
- ``on`` is the value that identifies the effect: the step's arguments.

Why not DBOS's own ids: recovery re-runs a step that started but was not
recorded under the same workflow id and step id, so those would do; but
``fork_workflow`` copies the steps before its start step into a new workflow
with a new id and re-runs the rest, and a step id shifts when a new version
of the code adds a step before it. The fork's origin and the input are what
make two runs of a step the same effect: a fork that re-runs the step with
the same arguments reuses the recorded result, one whose arguments changed
(an earlier step re-run and read something new) gets a new key and a real
call.

``on`` must be what the workflow passes to the step (DBOS records those
inputs), never something computed inside the step. Two calls of one step
with equal arguments in one workflow are one effect: pass what tells them
apart (a loop index) as an argument.

Use::

    @DBOS.step()
    @fenced_step(scope="billing", db=pool)
    def charge(order_id: str, cents: int) -> dict[str, str]:
        return api.charge(order_id, cents, idempotency_key=current_fence().key)

``fenced_step`` sits under ``@DBOS.step()``: the fence runs inside the step,
so its result is in the ledger before DBOS records the step. Requires
``dbos`` (``pip install onceflow[dbos]``).
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from dbos import DBOS, WorkflowStatus

from .digest import input_digest
from .effects import DB, fenced
from .errors import InvalidKeyError
from .keys import graph_key

__all__ = ["fenced_step", "root_workflow_id", "step_key"]

T = TypeVar("T")

_roots: dict[str, str] = {}  # workflow id -> its root; a workflow's origin never changes
_roots_lock = threading.Lock()
_MAX_FORK_DEPTH = 1000


def _status(workflow_id: str) -> WorkflowStatus | None:
    """``DBOS.get_workflow_status`` read outside the running workflow: in
    workflow code DBOS would record the read as a step of its own (and a
    fork would replay its original's answer), and in async code it refuses
    to run on the event loop. A new thread starts with no DBOS context."""
    out: list[WorkflowStatus | None] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            out.append(DBOS.get_workflow_status(workflow_id))
        except BaseException as e:  # handed to the caller
            err.append(e)

    t = threading.Thread(target=run, name="onceflow-dbos-status", daemon=True)
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]


def root_workflow_id(workflow_id: str | None = None) -> str:
    """The id of the workflow ``workflow_id`` (default: the running one)
    was forked from, followed back to the first workflow; its own id when
    it is no fork."""
    wid = workflow_id if workflow_id is not None else DBOS.workflow_id
    if not wid:
        raise InvalidKeyError("onceflow.dbos: not inside a DBOS workflow and no workflow id given")
    with _roots_lock:
        known = _roots.get(wid)
    if known is not None:
        return known
    seen = [wid]
    cur = wid
    for _ in range(_MAX_FORK_DEPTH):
        status = _status(cur)
        if status is None:
            raise InvalidKeyError(f"onceflow.dbos: workflow {cur!r} not found in the DBOS system database")
        origin = status.forked_from
        if not origin:
            break
        cur = origin
        seen.append(cur)
    else:
        raise InvalidKeyError(f"onceflow.dbos: workflow {wid!r} is forked more than {_MAX_FORK_DEPTH} deep")
    with _roots_lock:
        for w in seen:
            _roots[w] = cur
    return cur


def step_key(step: str, on: Any, *, workflow_id: str | None = None) -> str:
    """The key of the effect of step ``step`` identified by ``on`` in the
    running workflow (or ``workflow_id``), shared by its forks."""
    if not isinstance(step, str) or step == "":
        raise InvalidKeyError("onceflow.dbos: step name is empty")
    return graph_key(root_workflow_id(workflow_id), step, input_digest(on))


def _arguments(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by parameter name, defaults applied: the same
    call gives the same value whether an argument was passed by position or
    by name."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as err:
        raise InvalidKeyError(f"onceflow.dbos: arguments of {fn.__qualname__}: {err}") from err
    bound.apply_defaults()
    return dict(bound.arguments)


def fenced_step(
    scope: str = "",
    *,
    db: DB = None,
    name: str | None = None,
    on: Callable[..., Any] | None = None,
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Fence a DBOS step function (sync or async) by :func:`step_key`.

    ``name`` is the step part of the key (default: the function's
    qualified name); ``on`` maps the step's arguments to the identifying
    value (default: all arguments by parameter name); ``scope`` and ``db``
    are :class:`~onceflow.fenced`'s. The function's return value is
    recorded (JSON) and returned as it reads back from JSON; a replayed
    call returns the recorded value without running the function. Inside,
    ``current_fence().key`` is the key to send downstream."""

    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        step = name or fn.__qualname__

        def key(*args: Any, **kwargs: Any) -> str:
            value = on(*args, **kwargs) if on is not None else _arguments(fn, args, kwargs)
            return step_key(step, value)

        inner = fenced(key, scope, db=db)(fn)
        return functools.wraps(fn)(inner)

    return decorate
