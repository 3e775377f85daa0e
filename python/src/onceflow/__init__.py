"""onceflow for Python: enqueue events into the transactional outbox and
fence external side effects with the effects ledger, interoperating with
the Go relay, consumer and ``effects.Do`` through the same tables.

- :func:`enqueue` / :func:`aenqueue`: ``onceflow.enqueue`` in the caller's
  transaction.
- :class:`fenced`: a side effect once per key (context manager or
  decorator, sync or async), the ledger shared with Go.
- :func:`event_key`, :func:`graph_key`: keys byte for byte as Go builds
  them; :func:`consumer_scope`: the ledger scope of a Go consumer's
  ``http`` handler, to fence a key that handler shares.
- :mod:`onceflow.langgraph`: the key of the running LangGraph node;
  :mod:`onceflow.dbos`, :mod:`onceflow.pydantic_ai`,
  :mod:`onceflow.openai_agents`: a DBOS step's or an agent tool call's key
  and a decorator fencing it (:mod:`onceflow.digest`: the input digest
  they share).
"""

from .effects import AsyncConnectionSource, ConnectionSource, Fence, Result, current_fence, fenced
from .errors import (
    DuplicateEventError,
    EffectHeldError,
    FenceError,
    InvalidEventError,
    InvalidKeyError,
    OnceflowError,
    RetryableError,
)
from .keys import (
    MAX_KEY_LEN,
    MAX_SCOPE_LEN,
    consumer_scope,
    escape_scope_part,
    event_key,
    graph_key,
    validate_key,
    validate_scope,
)
from .outbox import Enqueued, TraceparentDroppedWarning, aenqueue, enqueue

__all__ = [
    "MAX_KEY_LEN",
    "MAX_SCOPE_LEN",
    "AsyncConnectionSource",
    "ConnectionSource",
    "DuplicateEventError",
    "EffectHeldError",
    "Enqueued",
    "Fence",
    "FenceError",
    "InvalidEventError",
    "InvalidKeyError",
    "OnceflowError",
    "Result",
    "RetryableError",
    "TraceparentDroppedWarning",
    "aenqueue",
    "consumer_scope",
    "current_fence",
    "enqueue",
    "escape_scope_part",
    "event_key",
    "fenced",
    "graph_key",
    "validate_key",
    "validate_scope",
]
