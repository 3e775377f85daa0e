"""The digest of an effect's identifying input, shared by the agent runtime
adapters (:mod:`onceflow.langgraph`, :mod:`onceflow.dbos`,
:mod:`onceflow.pydantic_ai`, :mod:`onceflow.openai_agents`): the last part
of their keys. It needs no runtime installed.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from .errors import InvalidKeyError

__all__ = ["input_digest"]

_DIGEST_HEX = 32  # 128 bits of SHA-256


def _canonical(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, enum.Enum):
        return _canonical(v.value)
    if isinstance(v, Mapping):
        out: dict[str, Any] = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise InvalidKeyError(f"input digest: mapping key {k!r} is not a string")
            # A key starting with "$" gets one more: the markers below
            # ({"$bytes": …}, {"$type": …}) then never equal a mapping's
            # form, and keys without "$" (nearly all) keep their digests.
            out["$" + k if k.startswith("$") else k] = _canonical(x)
        return out
    if isinstance(v, (list, tuple)):
        return [_canonical(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted((_canonical(x) for x in v), key=lambda x: json.dumps(x, sort_keys=True))
    if isinstance(v, (bytes, bytearray)):
        return {"$bytes": bytes(v).hex()}
    dump = getattr(v, "model_dump", None)  # pydantic models, LangChain messages
    if callable(dump):
        return {"$type": type(v).__name__, "v": _canonical(dump(mode="json"))}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {"$type": type(v).__name__, "v": _canonical(dataclasses.asdict(v))}
    raise InvalidKeyError(
        f"input digest: cannot take a stable identity from a {type(v).__name__}; pass on= a JSON-like value"
    )


def input_digest(on: Any) -> str:
    """The hex digest (128 bits of SHA-256) of ``on`` in canonical JSON
    (sorted keys, no spaces, UTF-8), the last part of the task path.

    Bytes are written as ``{"$bytes": hex}``, a pydantic model or a
    dataclass as ``{"$type": class name, "v": fields}``; a mapping key that
    starts with ``$`` is written with one more ``$``, so that no mapping
    has the form of bytes or of a model."""
    body = json.dumps(_canonical(on), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True)
    return hashlib.sha256(body.encode("utf-8")).hexdigest()[:_DIGEST_HEX]
