"""Enqueue events into the transactional outbox from Python.

``enqueue`` calls the SQL function ``onceflow.enqueue`` on the caller's
connection, inside the caller's transaction: the event commits or rolls
back with the business writes, and the relay publishes it after commit.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pgerrors
from psycopg.types.json import Jsonb

from .errors import DuplicateEventError, InvalidEventError, OnceflowError, RetryableError

__all__ = ["Enqueued", "TraceparentDroppedWarning", "enqueue", "aenqueue"]

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")

# Does this database's onceflow.enqueue take a traceparent?
_HAS_TRACEPARENT = """
SELECT EXISTS (
    SELECT 1 FROM pg_proc p
     WHERE p.pronamespace = 'onceflow'::regnamespace AND p.proname = 'enqueue'
       AND 'traceparent' = ANY (p.proargnames))"""

_ENQUEUE = (
    "SELECT (r).event_id, (r).seq FROM (SELECT onceflow.enqueue("
    "%(topic)s, %(source)s, %(event_type)s, %(payload)s, %(event_id)s, %(headers)s, %(key)s) AS r) q"
)
_ENQUEUE_TRACED = (
    "SELECT (r).event_id, (r).seq FROM (SELECT onceflow.enqueue("
    "topic => %(topic)s, source => %(source)s, event_type => %(event_type)s, payload => %(payload)s, "
    "event_id => %(event_id)s, headers => %(headers)s, key => %(key)s, traceparent => %(traceparent)s) AS r) q"
)


@dataclass(frozen=True)
class Enqueued:
    """What ``onceflow.enqueue`` returned: the event id (generated unless
    given) and the event's sequence number in its stream (source and topic)."""

    event_id: str
    seq: int


class TraceparentDroppedWarning(UserWarning):
    """A traceparent was given but this database's ``onceflow.enqueue`` has
    no traceparent parameter yet: the event was enqueued without it."""


def _params(
    topic: str,
    source: str,
    event_type: str,
    payload: Any,
    event_id: str | None,
    headers: Mapping[str, str] | None,
    key: str | None,
    traceparent: str | None,
) -> dict[str, Any]:
    if traceparent is not None and not _TRACEPARENT.match(traceparent):
        raise InvalidEventError(
            f"traceparent {traceparent!r}: want the W3C form 00-<32 hex>-<16 hex>-<2 hex>, lower case"
        )
    return {
        "topic": topic,
        "source": source,
        "event_type": event_type,
        "payload": Jsonb(payload),
        "event_id": event_id,
        "headers": Jsonb(dict(headers) if headers is not None else {}),
        "key": key,
        "traceparent": traceparent,
    }


def _translate(err: psycopg.Error, event_id: str | None) -> OnceflowError | None:
    msg = err.diag.message_primary or str(err)
    if isinstance(err, pgerrors.UniqueViolation):
        return DuplicateEventError(msg, event_id)
    if isinstance(err, pgerrors.InvalidParameterValue):
        return InvalidEventError(msg)
    if isinstance(err, (pgerrors.DeadlockDetected, pgerrors.SerializationFailure)):
        return RetryableError(msg)
    return None


def _warn_dropped() -> None:
    warnings.warn(
        "onceflow.enqueue in this database has no traceparent parameter: the event is enqueued without "
        "its trace context (upgrade the schema with `relay migrate` to carry it)",
        TraceparentDroppedWarning,
        stacklevel=3,
    )


def enqueue(
    conn: psycopg.Connection[Any],
    topic: str,
    source: str,
    event_type: str,
    payload: Any,
    event_id: str | None = None,
    headers: Mapping[str, str] | None = None,
    key: str | None = None,
    traceparent: str | None = None,
) -> Enqueued:
    """Enqueue one event in ``conn``'s current transaction.

    ``payload`` is any JSON-serialisable value. ``event_id`` defaults to a
    random UUID made by the database; ``headers`` are extra string headers
    (the envelope's own names are reserved); ``key`` is the Kafka record key
    (default: the source). ``traceparent`` (W3C) is passed to
    ``onceflow.enqueue`` (which takes one since migration 009); an older
    schema enqueues without it and a :class:`TraceparentDroppedWarning` is
    issued.

    Raises :class:`InvalidEventError`, :class:`DuplicateEventError` or
    :class:`RetryableError`; after any of them the transaction is aborted,
    as after any failed statement.
    """
    params = _params(topic, source, event_type, payload, event_id, headers, key, traceparent)
    sql = _ENQUEUE
    try:
        with conn.cursor() as cur:
            if traceparent is not None:
                row = cur.execute(_HAS_TRACEPARENT).fetchone()
                if row is not None and row[0]:
                    sql = _ENQUEUE_TRACED
                else:
                    _warn_dropped()
            got = cur.execute(sql, params).fetchone()
    except psycopg.Error as err:
        mapped = _translate(err, event_id)
        if mapped is not None:
            raise mapped from err
        raise
    if got is None:  # pragma: no cover - the function always returns a row
        raise OnceflowError("onceflow.enqueue returned no row")
    return Enqueued(event_id=str(got[0]), seq=int(got[1]))


async def aenqueue(
    conn: psycopg.AsyncConnection[Any],
    topic: str,
    source: str,
    event_type: str,
    payload: Any,
    event_id: str | None = None,
    headers: Mapping[str, str] | None = None,
    key: str | None = None,
    traceparent: str | None = None,
) -> Enqueued:
    """:func:`enqueue` for an ``AsyncConnection``."""
    params = _params(topic, source, event_type, payload, event_id, headers, key, traceparent)
    sql = _ENQUEUE
    try:
        async with conn.cursor() as cur:
            if traceparent is not None:
                await cur.execute(_HAS_TRACEPARENT)
                row = await cur.fetchone()
                if row is not None and row[0]:
                    sql = _ENQUEUE_TRACED
                else:
                    _warn_dropped()
            await cur.execute(sql, params)
            got = await cur.fetchone()
    except psycopg.Error as err:
        mapped = _translate(err, event_id)
        if mapped is not None:
            raise mapped from err
        raise
    if got is None:  # pragma: no cover
        raise OnceflowError("onceflow.enqueue returned no row")
    return Enqueued(event_id=str(got[0]), seq=int(got[1]))
