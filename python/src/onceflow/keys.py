"""Idempotency keys from stable identity, byte for byte as Go builds them.

``event_key(event_id)`` is ``"event:<event id>"``; ``graph_key(thread_id,
node, task_path)`` is ``"<thread_id>:<node>:<task_path>"``. The rules are
those of Go's ``pkg/effects`` (``ValidateKey``, ``EventKey``, ``GraphKey``)
and of the SQL functions ``onceflow.effect_key_error`` /
``effect_event_key`` / ``effect_graph_key``; all three are tested against
``pkg/effects/testdata/keys.json``, which Go generates.

Ledger scopes: ``validate_scope`` as Go's ``ValidateScope``;
``consumer_scope(consumer, entry)`` is the scope of the Go consumer's
``http`` handler, ``"inbox/<consumer>/http/<entry>"``, as Go's
``ConsumerScope`` builds it (each part escaped by ``escape_scope_part``,
as Go's ``EscapeScopePart``); the same vectors file covers them.

Lengths are counted in UTF-8 bytes, as in Go. A key built from anything
per-execution (an attempt number, a timestamp, a random or run id) would
make a replay look new: use stable identity only.
"""

from __future__ import annotations

__all__ = [
    "SEP",
    "MAX_KEY_LEN",
    "MAX_SCOPE_LEN",
    "consumer_scope",
    "escape_scope_part",
    "event_key",
    "graph_key",
    "validate_key",
    "validate_scope",
]

from .errors import InvalidKeyError

SEP = ":"
"""Separates the parts of a key."""

MAX_KEY_LEN = 600
"""Upper bound of a key, in UTF-8 bytes (room for ``event:`` and the
envelope's longest event id, 512 bytes)."""

MAX_SCOPE_LEN = 512
"""Upper bound of a ledger scope, in UTF-8 bytes."""

_MAX_PART_LEN = 190
_EVENT_PREFIX = "event"

# The characters Go's strings.TrimSpace removes: Unicode White_Space (not
# Python's str.isspace, which also counts U+001C..U+001F).
_WHITE_SPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


def _blank(v: str) -> bool:
    return all(c in _WHITE_SPACE for c in v)


def _utf8_len(name: str, v: str) -> int:
    try:
        return len(v.encode("utf-8"))
    except UnicodeEncodeError:  # lone surrogates: not valid UTF-8
        raise InvalidKeyError(f"invalid idempotency key: {name} is not valid UTF-8") from None


def _check_chars(name: str, v: str) -> None:
    _utf8_len(name, v)
    for c in v:
        if c < "\x20" or c == "\x7f":
            raise InvalidKeyError(f"invalid idempotency key: {name} contains a control character")


def _check_part(name: str, v: str) -> None:
    if not isinstance(v, str):
        raise InvalidKeyError(f"invalid idempotency key: {name} is {type(v).__name__}, not str")
    if _blank(v):
        raise InvalidKeyError(f"invalid idempotency key: {name} is empty")
    if SEP in v:
        raise InvalidKeyError(f"invalid idempotency key: {name} {v!r} contains the separator {SEP!r}")
    n = _utf8_len(name, v)
    if n > _MAX_PART_LEN:
        raise InvalidKeyError(f"invalid idempotency key: {name} is {n} bytes, at most {_MAX_PART_LEN}")
    _check_chars(name, v)


def validate_key(key: str) -> None:
    """Raise :class:`InvalidKeyError` unless ``key`` is a valid idempotency
    key: non-empty, valid UTF-8, no control characters, at most
    :data:`MAX_KEY_LEN` bytes."""
    if not isinstance(key, str):
        raise InvalidKeyError(f"invalid idempotency key: {type(key).__name__}, not str")
    if key == "":
        raise InvalidKeyError("invalid idempotency key: empty")
    n = _utf8_len("key", key)
    if n > MAX_KEY_LEN:
        raise InvalidKeyError(f"invalid idempotency key: {n} bytes, at most {MAX_KEY_LEN}")
    _check_chars("key", key)


def event_key(event_id: str) -> str:
    """The key of the side effect of one event: ``"event:<event id>"``.

    The event id is the envelope's, the same on every delivery; it may
    itself contain ``:`` (the prefix keeps it unambiguous)."""
    if not isinstance(event_id, str) or _blank(event_id):
        raise InvalidKeyError("invalid idempotency key: event id is empty")
    key = _EVENT_PREFIX + SEP + event_id
    validate_key(key)
    return key


def graph_key(thread_id: str, node: str, task_path: str) -> str:
    """The key of one task of an agent graph:
    ``"<thread_id>:<node>:<task_path>"``.

    The same task reached again (a resumed checkpoint, a replay, another
    delivery) must give the same parts: ``task_path`` is the task's stable
    identity within the thread, never an attempt or run id. No part may be
    blank, contain ``:`` or a control character, or exceed 190 bytes; the
    thread id ``event`` is reserved for event keys."""
    _check_part("thread id", thread_id)
    _check_part("node", node)
    _check_part("task path", task_path)
    if thread_id == _EVENT_PREFIX:
        raise InvalidKeyError(f"invalid idempotency key: thread id {_EVENT_PREFIX!r} is reserved for event keys")
    key = SEP.join((thread_id, node, task_path))
    validate_key(key)
    return key


def validate_scope(scope: str) -> None:
    """Raise :class:`InvalidKeyError` unless ``scope`` is a valid ledger
    scope: at most :data:`MAX_SCOPE_LEN` bytes, valid UTF-8, no control
    characters. The empty scope is valid (Go's ``effects.Do`` uses it)."""
    if not isinstance(scope, str):
        raise InvalidKeyError(f"invalid idempotency key: scope is {type(scope).__name__}, not str")
    n = _utf8_len("scope", scope)
    if n > MAX_SCOPE_LEN:
        raise InvalidKeyError(f"invalid idempotency key: scope is {n} bytes, at most {MAX_SCOPE_LEN}")
    _check_chars("scope", scope)


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def escape_scope_part(part: str) -> str:
    """One part of a ledger scope, as Go's ``effects.EscapeScopePart``:
    every UTF-8 byte percent-encoded (upper-case hex) except the RFC 3986
    unreserved characters ``A-Z a-z 0-9 - . _ ~``. An escaped part never
    contains ``/``, so the parts of a scope cannot run into each other."""
    if not isinstance(part, str):
        raise InvalidKeyError(f"invalid idempotency key: scope part is {type(part).__name__}, not str")
    _utf8_len("scope part", part)
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in part.encode("utf-8"))


def consumer_scope(consumer: str, entry: str, *, kind: str = "http") -> str:
    """The ledger scope of one handler of a Go consumer:
    ``"inbox/<consumer>/<kind>/<entry>"``, each part escaped with
    :func:`escape_scope_part`, byte for byte as Go's
    ``effects.ConsumerScope(consumer, kind, entry)``.

    ``consumer`` is the consumer's ``-consumer-name`` (``"default"`` unless
    configured) and ``entry`` the ``event_type`` of its handlers-file entry
    (``"*"`` for the catch-all). Fence with
    ``fenced(key, consumer_scope(consumer, entry))`` to share a key with
    that consumer's ``http`` handler: what one records, the other replays."""
    return "inbox/" + escape_scope_part(consumer) + "/" + escape_scope_part(kind) + "/" + escape_scope_part(entry)
