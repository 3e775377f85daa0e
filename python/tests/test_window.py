"""Downstream-window-aware effects: a retry whose first attempt is older
than the downstream's idempotency window is never sent blindly — it is
reconciled by key or held for an operator. The downstream here is a
counter of calls; its idempotency cache is taken to have forgotten every
key older than its window."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import psycopg
import pytest

from onceflow import EffectHeldError, FenceError, Result, fenced

DAY = datetime.timedelta(hours=24)


class Downstream:
    """Counts calls; remembers what it did by key (its durable records)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.records: dict[str, dict[str, str]] = {}

    def send(self, key: str) -> dict[str, str]:
        self.calls.append(key)
        out = {"id": f"m-{len(self.calls)}"}
        self.records[key] = out
        return out

    def lookup(self, key: str) -> Result | None:
        found = self.records.get(key)
        return Result(200, found) if found is not None else None


def lost_response(db_url: str, down: Downstream, key: str) -> None:
    """The first attempt: the call reaches the downstream, the response is
    lost (an exception before record): the intent stays."""
    with pytest.raises(TimeoutError):
        with fenced(key, "w", db=db_url, window=DAY) as fx:
            down.send(fx.key)
            raise TimeoutError("response lost")


def age(db_url: str, key: str, hours: int) -> None:
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "UPDATE onceflow.effects SET created_at = now() - make_interval(hours => %s) WHERE idempotency_key = %s",
            (hours, key),
        )


def row(db_url: str, key: str) -> tuple[Any, ...] | None:
    with psycopg.connect(db_url) as conn:
        return conn.execute(
            "SELECT status, attempts, result_code, result FROM onceflow.effects WHERE idempotency_key = %s", (key,)
        ).fetchone()


def send(db_url: str, down: Downstream, key: str, **kw: Any) -> Result:
    with fenced(key, "w", db=db_url, **kw) as fx:
        if fx.replayed:
            assert fx.result is not None
            return fx.result
        return fx.record(200, down.send(fx.key))


def test_retry_past_the_window_without_a_hook_is_held(db_url: str) -> None:
    down = Downstream()
    lost_response(db_url, down, "k-held")
    age(db_url, "k-held", 25)
    for kw in ({"window": DAY}, {"window": DAY}, {}):
        # The first retry holds the effect (effect_hold); every claim after
        # it, with a window or without, is refused (SQLSTATE OFH01).
        with pytest.raises(EffectHeldError) as err:
            send(db_url, down, "k-held", **kw)
        assert err.value.key == "k-held" and err.value.attempts == 2 and err.value.age > DAY
    assert down.calls == ["k-held"], "a retry past the window sent again"
    assert row(db_url, "k-held") == ("held", 2, None, None)
    # An operator lets it send (effect_unhold restarts the window): the key
    # is not left locked, and the next fence, with its window, sends.
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SELECT onceflow.effect_unhold('k-held', 'w')")
    assert send(db_url, down, "k-held", window=DAY).summary == {"id": "m-2"}


def test_held_effect_resolved_by_an_operator_replays(db_url: str) -> None:
    down = Downstream()
    lost_response(db_url, down, "k-res")
    age(db_url, "k-res", 25)
    with pytest.raises(EffectHeldError):
        send(db_url, down, "k-res", window=DAY)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("""SELECT onceflow.effect_resolve('k-res', 'w', 200, '{"id": "m-1"}')""")
    assert send(db_url, down, "k-res", window=DAY) == Result(200, {"id": "m-1"}, replayed=True)
    assert down.calls == ["k-res"]


async def _held_async(db_url: str) -> None:
    async with fenced("k-held-async", "w", db=db_url, window=DAY):
        pass  # pragma: no cover - the claim is refused


def test_held_effect_refused_async(db_url: str) -> None:
    down = Downstream()
    lost_response(db_url, down, "k-held-async")
    age(db_url, "k-held-async", 25)
    with pytest.raises(EffectHeldError):
        asyncio.run(_held_async(db_url))  # holds it
    with pytest.raises(EffectHeldError) as err:
        asyncio.run(_held_async(db_url))  # refused
    assert err.value.attempts == 2 and row(db_url, "k-held-async") == ("held", 2, None, None)


def test_retry_past_the_window_without_fencing_the_window_sends_blindly(db_url: str) -> None:
    """What the window prevents: the old fence retries with the same key,
    which a downstream past its window takes for a new request."""
    down = Downstream()
    lost_response(db_url, down, "k-blind")
    age(db_url, "k-blind", 25)
    send(db_url, down, "k-blind")
    assert down.calls == ["k-blind", "k-blind"]


def test_retry_past_the_window_reconciles_by_key(db_url: str) -> None:
    down = Downstream()
    lost_response(db_url, down, "k-rec")
    age(db_url, "k-rec", 25)
    with fenced("k-rec", "w", db=db_url, window=DAY, reconcile=down.lookup) as fx:
        assert fx.replayed and fx.reconciled
        assert fx.result == Result(200, {"id": "m-1"}, replayed=True)
    assert down.calls == ["k-rec"]
    assert row(db_url, "k-rec") == ("done", 2, 200, {"id": "m-1"})
    assert send(db_url, down, "k-rec").summary == {"id": "m-1"} and down.calls == ["k-rec"]


def test_retry_past_the_window_calls_when_the_downstream_has_nothing(db_url: str) -> None:
    down = Downstream()
    with pytest.raises(TimeoutError):  # the first attempt never reached the downstream
        with fenced("k-none", "w", db=db_url, window=DAY):
            raise TimeoutError("connect timeout")
    age(db_url, "k-none", 25)
    assert send(db_url, down, "k-none", window=DAY, reconcile=down.lookup).summary == {"id": "m-1"}
    assert down.calls == ["k-none"]


def test_retry_inside_the_window_calls_again_with_the_key(db_url: str) -> None:
    down = Downstream()
    lost_response(db_url, down, "k-in")
    age(db_url, "k-in", 23)
    held: list[str] = []
    send(db_url, down, "k-in", window=DAY, reconcile=lambda k: held.append(k))
    assert down.calls == ["k-in", "k-in"] and held == [], "inside the window the downstream dedups by key"


def test_async_and_decorator(db_url: str) -> None:
    down = Downstream()
    lost_response(db_url, down, "k-async")
    age(db_url, "k-async", 25)

    async def lookup(key: str) -> Result | None:
        return down.lookup(key)

    @fenced(lambda order: f"k-{order}", "w", db=db_url, window=DAY, reconcile=lookup)
    async def charge(order: str) -> dict[str, str]:
        return down.send(f"k-{order}")

    async def main() -> Any:
        return await charge("async")

    assert asyncio.run(main()) == Result(200, {"id": "m-1"}, replayed=True)
    assert down.calls == ["k-async"]

    @fenced(lambda order: f"k-{order}", "w", db=db_url, window=DAY)
    def charge_sync(order: str) -> dict[str, str]:
        return down.send(f"k-{order}")

    lost_response(db_url, down, "k-sync")
    age(db_url, "k-sync", 25)
    with pytest.raises(EffectHeldError):
        charge_sync("sync")
    assert down.calls == ["k-async", "k-sync"]


def test_bad_window_arguments() -> None:
    with pytest.raises(FenceError, match="positive timedelta"):
        fenced("k", window=datetime.timedelta(0))
    with pytest.raises(FenceError, match="reconcile needs window"):
        fenced("k", reconcile=lambda k: None)
