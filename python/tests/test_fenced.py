"""The fencing protocol from Python: double delivery, concurrent callers
(threads and asyncio), a failed call, a crashed caller, the decorator, and
the SQL functions' guards against misuse."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import psycopg
import pytest
from conftest import MailService
from psycopg_pool import AsyncConnectionPool, ConnectionPool

import onceflow.effects as effects_module
from onceflow import FenceError, InvalidKeyError, Result, consumer_scope, current_fence, event_key, fenced


def ledger(db_url: str, key: str, scope: str = "") -> tuple[str, int, int | None, Any] | None:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT status, attempts, result_code, result FROM onceflow.effects WHERE scope = %s AND idempotency_key = %s",
            (scope, key),
        ).fetchone()
    return None if row is None else (row[0], row[1], row[2], row[3])


def test_double_delivery_one_effect(db_url: str) -> None:
    key = event_key("ord-1")
    calls: list[str] = []
    results = []
    for _ in range(3):  # the same event delivered three times
        with fenced(key, db=db_url, event_id="ord-1") as fx:
            if fx.replayed:
                results.append(fx.result)
            else:
                calls.append(fx.key)
                results.append(fx.record(201, {"charge": "ch_1"}))
    assert calls == ["event:ord-1"]
    assert results[0] == Result(201, {"charge": "ch_1"}, replayed=False)
    assert results[1] == results[2] == Result(201, {"charge": "ch_1"}, replayed=True)
    assert ledger(db_url, key) == ("done", 1, 201, {"charge": "ch_1"})


def test_scopes_are_separate_ledgers(db_url: str) -> None:
    """The same key in two scopes is two effects: the empty scope (Go's
    effects.Do) and a consumer's http handler scope each call once."""
    key = event_key("ord-2")
    scope = consumer_scope("billing/eu", "payment.requested")
    assert scope == "inbox/billing%2Feu/http/payment.requested"
    calls: list[str] = []
    for s in ("", scope, scope, ""):
        with fenced(key, s, db=db_url) as fx:
            if not fx.replayed:
                calls.append(s)
                fx.record(201, {"scope": s})
    assert calls == ["", scope]
    assert ledger(db_url, key) == ("done", 1, 201, {"scope": ""})
    assert ledger(db_url, key, scope) == ("done", 1, 201, {"scope": scope})


def test_concurrent_callers_one_effect(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight threads with one key: one calls, never two at once, seven get its result."""
    callers = 8
    lock = threading.Lock()
    inside = 0
    most = 0
    calls = 0
    replayed = 0
    errors: list[BaseException] = []
    start = threading.Barrier(callers)
    entered = threading.Event()
    release = threading.Event()

    def caller() -> None:
        nonlocal inside, most, calls, replayed
        try:
            start.wait()
            with fenced("same", db=db_url) as fx:
                if fx.replayed:
                    with lock:
                        replayed += 1
                    return
                with lock:
                    inside += 1
                    most = max(most, inside)
                    calls += 1
                entered.set()
                release.wait(30)  # hold the key while the others queue on it
                with lock:
                    inside -= 1
                fx.record(200, {"n": 1})
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for t in threads:
        t.start()
    assert entered.wait(30), "no caller got the key"
    # Another key is not held up meanwhile.
    with fenced("other", db=db_url) as fx:
        assert not fx.replayed
    # Wait until every other caller has found the key busy (the lease
    # runs) and waits to claim it again.
    waiting: set[int] = set()
    busy = threading.Condition()

    def counted_sleep(seconds: float) -> None:
        with busy:
            waiting.add(threading.get_ident())
            busy.notify_all()
        real_sleep(seconds)

    real_sleep = effects_module._sleep
    monkeypatch.setattr(effects_module, "_sleep", counted_sleep)
    with busy:
        assert busy.wait_for(lambda: len(waiting) >= callers - 1, timeout=30), "the other callers never waited on the key"
    release.set()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert (calls, most, replayed) == (1, 1, callers - 1)
    assert ledger(db_url, "same") == ("done", 1, 200, {"n": 1})


def test_concurrent_async_callers_one_effect(db_url: str) -> None:
    asyncio.run(_concurrent_async_callers(db_url))


async def _concurrent_async_callers(db_url: str) -> None:
    calls = 0

    async def caller() -> Result:
        nonlocal calls
        async with fenced("async-key", "agents", db=db_url) as fx:
            if fx.replayed:
                assert fx.result is not None
                return fx.result
            calls += 1
            await asyncio.sleep(0.2)  # let the others reach the lock
            return await fx.arecord(202, ["sent"])

    results = await asyncio.gather(*(caller() for _ in range(6)))
    assert calls == 1
    assert sum(r.replayed for r in results) == 5
    assert all(r.code == 202 and r.summary == ["sent"] for r in results)
    assert ledger(db_url, "async-key", "agents") == ("done", 1, 202, ["sent"])


def test_failed_call_keeps_intent_and_calls_again_with_the_same_key(db_url: str) -> None:
    sent: list[str] = []
    with pytest.raises(ConnectionError):
        with fenced("k1", db=db_url) as fx:
            sent.append(fx.key)
            raise ConnectionError("503 from the downstream")
    assert ledger(db_url, "k1") == ("intent", 1, None, None)
    with fenced("k1", db=db_url) as fx:
        assert not fx.replayed and fx.attempts == 2
        sent.append(fx.key)
        # the block ends without record(): done with an empty result
    assert sent == ["k1", "k1"]
    assert ledger(db_url, "k1") == ("done", 2, None, None)


def test_crashed_caller_releases_the_key(db_url: str) -> None:
    """A caller whose session dies mid-call (the process crashed) holds
    nothing: the next caller calls again with the same key."""
    conn = psycopg.connect(db_url, autocommit=True)
    row = conn.execute("SELECT status FROM onceflow.effect_claim('crash-key')").fetchone()
    assert row == ("intent",)
    conn.pgconn.finish()  # the session ends without release, as on SIGKILL
    with fenced("crash-key", db=db_url) as fx:
        assert not fx.replayed and fx.attempts == 2
        fx.record(200)


def test_pool_connection_comes_back_without_the_key(db_url: str) -> None:
    with ConnectionPool(db_url, min_size=1, max_size=1, open=True) as pool:
        with pytest.raises(RuntimeError):
            with fenced("pooled", db=pool) as fx:
                assert not fx.replayed
                raise RuntimeError("call failed")
        with pool.connection() as conn:  # the only connection: it must hold nothing
            row = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()").fetchone()
            assert row == (0,)
        with fenced("pooled", db=pool) as fx:
            assert fx.attempts == 2
            fx.record(200)
        with fenced("pooled", db=pool) as fx:
            assert fx.replayed


def test_decorator_runs_once_per_key(db_url: str) -> None:
    runs: list[str] = []

    @fenced(lambda order_id, amount: event_key(order_id), db=db_url)
    def charge(order_id: str, amount: int) -> dict[str, Any]:
        runs.append(current_fence().key)
        return {"charge": f"ch_{order_id}", "amount": amount}

    first = charge("o-1", 10)
    again = charge("o-1", 10)
    other = charge("o-2", 5)
    assert runs == ["event:o-1", "event:o-2"]
    assert first == again == {"charge": "ch_o-1", "amount": 10}
    assert other["charge"] == "ch_o-2"


def test_async_decorator_and_pool(db_url: str) -> None:
    asyncio.run(_async_decorator_and_pool(db_url))


async def _async_decorator_and_pool(db_url: str) -> None:
    runs = 0
    async with AsyncConnectionPool(db_url, min_size=1, max_size=2, open=False) as pool:

        @fenced("async-deco", db=pool)
        async def send() -> Result:
            nonlocal runs
            runs += 1
            return Result(201, {"id": "m-1"})

        assert await send() == Result(201, {"id": "m-1"}, replayed=False)
        assert await send() == Result(201, {"id": "m-1"}, replayed=True)
    assert runs == 1


def test_invalid_key_and_scope(db_url: str) -> None:
    with pytest.raises(InvalidKeyError):
        with fenced("a\nb", db=db_url):
            pass
    with pytest.raises(FenceError):
        fenced("k", scope=None, db=db_url)  # type: ignore[arg-type]
    for bad_scope in ("s" * 513, "tab\there"):
        with pytest.raises(InvalidKeyError, match="scope"):
            with fenced("k", bad_scope, db=db_url):
                pass
    with psycopg.connect(db_url, autocommit=True) as conn:  # the SQL function checks the same
        for bad_scope in ("s" * 513, "tab\there"):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match="scope"):
                conn.execute("SELECT onceflow.effect_claim('k', %s)", (bad_scope,))
    with pytest.raises(FenceError, match="decorator form"):
        with fenced(lambda: "k", db=db_url):
            pass


def test_result_must_be_json(db_url: str) -> None:
    with pytest.raises(FenceError, match="not JSON"):
        with fenced("json", db=db_url) as fx:
            fx.record(200, {"when": object()})
    assert ledger(db_url, "json") == ("intent", 1, None, None)


def test_sql_protocol_guards(db_url: str) -> None:
    """What the SQL functions refuse: a claim in a transaction that already
    wrote (its intent would not commit before the call), a second claim of
    a key the session holds, a record without the claim."""
    with psycopg.connect(db_url) as conn:
        conn.execute("INSERT INTO onceflow.effects (idempotency_key) VALUES ('business-write')")
        with pytest.raises(psycopg.errors.ActiveSqlTransaction, match="outside the business transaction"):
            conn.execute("SELECT onceflow.effect_claim('in-tx')")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SELECT onceflow.effect_claim('twice')")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="already holds"):
            conn.execute("SELECT onceflow.effect_claim('twice')")
        with psycopg.connect(db_url, autocommit=True) as other:
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="not claimed by this session"):
                other.execute("SELECT onceflow.effect_record('twice', '', 200, NULL)")
        conn.execute("SELECT onceflow.effect_record('twice', '', 200, NULL)")
        row = conn.execute("SELECT onceflow.effect_release('twice', '')").fetchone()
        assert row == (False,)  # record released it already


def test_malformed_database_url_password_not_echoed() -> None:
    """libpq repeats a malformed connection string (or its bad part) in its
    error: the fence's error keeps the driver's kind and reason and none of
    the password, in its text, its repr or its traceback."""
    import traceback

    secret = "s3cr%zzet-7f1d"
    for url in [
        f"postgres://alice:{secret}@localhost:1/db",
        f"postgres://alice:{secret}@[::1/db",
        f"postgres://alice@localhost:1/db?password={secret}&bogus",
        f"host=localhost password='{secret}' bogus",
    ]:
        for use_async in (False, True):
            with pytest.raises(psycopg.Error) as info:
                if use_async:

                    async def enter(u: str = url) -> None:
                        async with fenced(event_key("ev-1"), db=u):
                            pass

                    asyncio.run(enter())
                else:
                    with fenced(event_key("ev-1"), db=url):
                        pass
            shown = str(info.value) + repr(info.value) + "".join(traceback.format_exception(info.value))
            assert secret not in shown and "s3cr" not in shown, shown
            assert "[redacted]" in shown or "missing" in shown, shown


def test_no_connection_transaction_or_lock_during_the_call(db_url: str) -> None:
    """The lease protocol: while the fenced call runs, the fence holds no
    connection (the pool's only one is free), PostgreSQL has no transaction
    and no lock of it, and the ledger shows the claim with its lease."""
    with ConnectionPool(db_url, min_size=1, max_size=1, open=True) as pool:
        with fenced(event_key("slow-1"), db=pool, event_id="slow-1") as fx:
            assert not fx.replayed and fx.attempts == 1
            with pool.connection(timeout=2) as conn:  # the call: the fence holds nothing
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE xact_start IS NOT NULL AND pid <> pg_backend_pid()),"
                    " (SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
                    "   WHERE l.locktype = 'advisory' AND d.datname = current_database())"
                    " FROM pg_stat_activity WHERE datname = current_database()"
                ).fetchone()
                assert row == (0, 0), "a transaction or an advisory lock is open during the call"
                row = conn.execute(
                    "SELECT status, claimed_by, lease_until > now(), event_id FROM onceflow.effects WHERE idempotency_key = %s",
                    (fx.key,),
                ).fetchone()
                assert row == ("intent", fx.owner, True, "slow-1")
                conn.commit()
            fx.record(200, {"id": "s-1"})
    assert ledger(db_url, event_key("slow-1")) == ("done", 1, 200, {"id": "s-1"})
    # A connection string: the fence's own connections are closed during the call.
    app = "onceflow-fence-under-test"
    sep = "&" if "?" in db_url else "?"
    with fenced("slow-2", db=f"{db_url}{sep}application_name={app}") as fx:
        with psycopg.connect(db_url, autocommit=True) as conn:
            # A closed connection's backend leaves pg_stat_activity when it
            # has exited, a moment after the client closed it: wait up to
            # 5 s for that (a fence that kept its connection would still show
            # it then), polling a condition.
            deadline = time.monotonic() + 5
            while True:
                row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)).fetchone()
                if row == (0,) or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert row == (0,), "the fence keeps a connection open during the call"
        fx.record(200)


_CRASH_CHILD = """
import datetime, sys, urllib.request
from onceflow import fenced
db, down, key, owner, lease = sys.argv[1:6]
with fenced(key, db=db, owner=owner or None, lease=datetime.timedelta(seconds=float(lease))) as fx:
    req = urllib.request.Request(down, data=b'{"to": "a@example.com"}', method="POST",
                                 headers={"Idempotency-Key": fx.key, "Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).read()
    print("called", flush=True)
    sys.stdin.readline()  # killed here, between the call and the record
    fx.record(202)
"""


def test_killed_between_claim_and_record_resumes_with_the_same_key(db_url: str, mail: MailService) -> None:
    """A process SIGKILLed after its call and before the record leaves the
    claim: restarted with the same owner it claims the key again at once;
    another owner takes it over once the lease has expired, or at once when
    the claim is a default owner's of this host whose process is gone. Each
    calls again with the same key, so a downstream that dedups by key makes
    one business effect, and the ledger ends done after two attempts."""
    import json
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    def crash(key: str, owner: str, lease: float) -> None:
        p = subprocess.Popen(
            [sys.executable, "-c", _CRASH_CHILD, db_url, mail.url, key, owner, str(lease)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line == "called\n", (line, p.stderr.read() if p.stderr else "")
            p.send_signal(signal.SIGKILL)
        finally:
            p.wait(30)
        assert p.returncode == -signal.SIGKILL
        row = ledger(db_url, key)
        assert row is not None and row[:2] == ("intent", 1), row

    def resume(key: str, **kw: Any) -> None:
        with fenced(key, db=db_url, **kw) as fx:
            assert not fx.replayed and fx.attempts == 2 and fx.key == key
            req = urllib.request.Request(
                mail.url,
                data=json.dumps({"to": "a@example.com"}).encode(),
                method="POST",
                headers={"Idempotency-Key": fx.key, "Content-Type": "application/json"},
            )
            urllib.request.urlopen(req, timeout=10).read()
            fx.record(202)
        assert ledger(db_url, key) == ("done", 2, 202, None)

    # Restarted with the same owner: no wait for the lease (a minute).
    k1 = event_key("crash-own")
    crash(k1, "worker-1", 60)
    t0 = time.monotonic()
    resume(k1, owner="worker-1")
    assert time.monotonic() - t0 < 30
    # Another owner: waits for the lease (one second), then takes it over.
    k2 = event_key("crash-other")
    crash(k2, "worker-2", 1)
    resume(k2)
    # The default owner (this host, the killed process's pid): released at
    # once, although its lease runs for a minute.
    k3 = event_key("crash-default")
    crash(k3, "", 60)
    t0 = time.monotonic()
    resume(k3)
    assert time.monotonic() - t0 < 30
    assert mail.keys() == [k1, k1, k2, k2, k3, k3], "every call carries its event's key"
    assert len(set(mail.keys())) == 3, "one business effect per key for a downstream that dedups by key"


def test_a_dead_owner_is_released_only_from_its_own_pid_namespace() -> None:
    """A default owner names its host, boot and pid namespace: a fence
    releases a busy claim at once only when all three are its own and the
    pid is gone. The containers of one pod share the host name but not
    their pids, so an owner of another namespace waits for its lease."""
    fx = effects_module
    here = fx._host_id()
    host, boot, ns = here.split("~")
    assert host and boot and ns, here
    gone = 2**22 + 12345  # above the kernel's pid_max: no such process
    assert fx._dead_local_owner(f"python/{here}/{gone}.1/abc")
    assert not fx._dead_local_owner(f"python/{host}~{boot}~{int(ns) + 1}/{gone}.1/abc")
    assert not fx._dead_local_owner(f"python/{host}~{'0' * 8}~{ns}/{gone}.1/abc")
    assert not fx._dead_local_owner(f"python/{host}/{gone}.1/abc")  # the old form: cannot tell
    assert not fx._dead_local_owner(f"python/{here}/{os.getpid()}.1/abc")  # this process
    assert not fx._dead_local_owner(f"app/{here}/{gone}.1/abc")  # an owner= of the caller
