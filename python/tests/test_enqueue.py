"""enqueue / aenqueue: the event commits or rolls back with the caller's
transaction; bad input raises typed errors; a traceparent is carried as far
as the database's onceflow.enqueue allows."""

from __future__ import annotations

import asyncio
import warnings

import psycopg
import pytest

from onceflow import DuplicateEventError, Enqueued, InvalidEventError, TraceparentDroppedWarning, aenqueue, enqueue

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def outbox(db_url: str) -> list[tuple[str, str, str, int, str, bytes | None, dict[str, str], bytes]]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT event_id, topic, source, seq, event_type, record_key, headers, payload FROM onceflow.outbox ORDER BY id"
        ).fetchall()
    return [(r[0], r[1], r[2], r[3], r[4], r[5], r[6], bytes(r[7])) for r in rows]


def test_enqueue_in_the_callers_transaction(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        enqueue(conn, "orders", "order-7", "order.created", {"n": 1}, event_id="rolled-back")
        conn.rollback()
        got = enqueue(conn, "orders", "order-7", "order.created", {"n": 1, "é": True}, event_id="e-1",
                      headers={"x-tenant": "t1"}, key="k-7")
        generated = enqueue(conn, "orders", "order-7", "order.paid", [1, 2])
        conn.commit()
    assert got == Enqueued("e-1", 1)
    assert generated.seq == 2 and len(generated.event_id) == 36
    rows = outbox(db_url)
    assert [r[0] for r in rows] == ["e-1", generated.event_id]
    assert rows[0][1:7] == ("orders", "order-7", 1, "order.created", b"k-7", {"x-tenant": "t1"})
    assert rows[0][7] == '{"n": 1, "é": true}'.encode()


def test_enqueue_errors(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        with pytest.raises(InvalidEventError, match="topic is missing or empty"):
            enqueue(conn, "", "s", "t", {})
        conn.rollback()
        with pytest.raises(InvalidEventError, match="reserved"):
            enqueue(conn, "orders", "s", "t", {}, headers={"traceparent": TP})
        conn.rollback()
        enqueue(conn, "orders", "s", "t", {}, event_id="dup")
        with pytest.raises(DuplicateEventError) as exc:
            enqueue(conn, "orders", "s", "t", {}, event_id="dup")
        assert exc.value.event_id == "dup"
        conn.rollback()
        with pytest.raises(InvalidEventError, match="W3C"):
            enqueue(conn, "orders", "s", "t", {}, traceparent="not-a-traceparent")


def test_traceparent_today(db_url: str) -> None:
    """Today's onceflow.enqueue has no traceparent parameter: the event is
    enqueued without it and a warning says so. When the function gains the
    parameter, enqueue passes it (see docs/agents.md)."""
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT bool_or('traceparent' = ANY (proargnames)) FROM pg_proc WHERE proname = 'enqueue' "
            "AND pronamespace = 'onceflow'::regnamespace"
        ).fetchone()
        has_param = bool(row and row[0])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = enqueue(conn, "orders", "s", "t", {}, event_id="traced", traceparent=TP)
        conn.commit()
    assert got.event_id == "traced"
    dropped = [w for w in caught if issubclass(w.category, TraceparentDroppedWarning)]
    assert bool(dropped) != has_param


def test_aenqueue(db_url: str) -> None:
    async def run() -> list[Enqueued]:
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            out = [await aenqueue(conn, "orders", "a-1", "x.y", {"i": i}) for i in range(3)]
            with pytest.raises(InvalidEventError):
                await aenqueue(conn, "orders", "a-1", "", {})
            await conn.rollback()
            out.append(await aenqueue(conn, "orders", "a-1", "x.y", {"i": 3}, event_id="a-last"))
            await conn.commit()
            return out

    got = asyncio.run(run())
    assert [e.seq for e in got] == [1, 2, 3, 1]  # the rolled-back seqs are reused
    assert [r[0] for r in outbox(db_url)] == ["a-last"]
