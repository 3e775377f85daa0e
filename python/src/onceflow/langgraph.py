"""LangGraph integration: the idempotency key of the running node's task.

``task_key(on)`` is ``graph_key(thread_id, node, task_path)`` where

- ``thread_id`` is the run's ``configurable.thread_id``,
- ``node`` is the running node's name (``langgraph_node``),
- ``task_path`` is the path of enclosing subgraph nodes (from the
  checkpoint namespace, task ids left out) and a SHA-256 digest of ``on``,
  the value that identifies the effect: the node's input, or the tool
  call's arguments.

Why a digest and not LangGraph's task id or step: both change whenever
LangGraph replays history. Resuming after a crash re-runs the task from its
checkpoint (same input: same key, so the recorded result is reused), but
time travel and forks write a new checkpoint first, so the task id and the
step number of a re-run node differ from the original's even when its input
is the same. The input is what makes two runs of a node the same effect;
an input changed by a fork gives a new key and a real call.

``on`` must come from the checkpointed state (the node's arguments), never
from something the node computes (an LLM answer, a timestamp): a re-run
would compute another value and the key would change. Two runs of one node
with an identical input in one thread are one effect: put what tells them
apart (a loop counter from the state) into ``on``.

Requires ``langgraph`` (``pip install onceflow[langgraph]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config

from .digest import input_digest
from .errors import InvalidKeyError
from .keys import graph_key

__all__ = ["input_digest", "task_key"]


def task_key(on: Any, config: RunnableConfig | None = None) -> str:
    """The key of the running node's effect identified by ``on``.

    Call it inside a LangGraph node (``config`` defaults to the running
    node's, ``langgraph.config.get_config()``); the graph must run with a
    ``thread_id``. Raises :class:`~onceflow.InvalidKeyError` when a part
    breaks the key rules (e.g. a thread id containing ``:``)."""
    if config is None:
        try:
            config = get_config()
        except RuntimeError as err:
            raise InvalidKeyError(f"task_key: not inside a LangGraph node and no config given ({err})") from err
    configurable: Mapping[str, Any] = config.get("configurable") or {}
    metadata: Mapping[str, Any] = config.get("metadata") or {}
    thread_id = configurable.get("thread_id")
    if thread_id is None or thread_id == "":
        raise InvalidKeyError("task_key: the run has no configurable.thread_id")
    node = metadata.get("langgraph_node")
    if not isinstance(node, str) or node == "":
        raise InvalidKeyError("task_key: no running node (metadata.langgraph_node) in the config")
    ns = metadata.get("langgraph_checkpoint_ns") or configurable.get("checkpoint_ns") or ""
    # "outer:<task id>|inner:<task id>|node:<task id>" → ["outer", "inner"]
    parents = [seg.split(":", 1)[0] for seg in str(ns).split("|") if seg][:-1]
    return graph_key(str(thread_id), node, "/".join([*parents, input_digest(on)]))
