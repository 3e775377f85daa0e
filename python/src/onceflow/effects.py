"""Fenced external side effects: the ledger protocol of Go's ``effects.Do``
for Python, over the same SQL functions and the same ``onceflow.effects``
table, so Go and Python share one ledger.

A fence claims a key with a lease, in a short statement on a connection
of its own (never the caller's business transaction) that commits at once:
it waits while another caller, in any language, holds the same key and its
lease runs, then either finds the recorded result (``replayed``: do not
call) or records the intent, claimed by this fence until the lease ends,
and lets the caller call the downstream with the key. While the call runs
the fence holds no connection, no transaction and no lock; the result is
recorded after the call, in a statement of its own. A call that fails
gives the lease up and leaves the intent, and the next attempt calls again
with the same key, for the downstream to dedup (``Idempotency-Key``). A
caller that dies between claim and record (a killed process) leaves its
claim: its own ``owner`` claims it again at once, anyone else once the
lease has expired, and the call is made again with the same key.

Context manager::

    with fenced(event_key(event_id), db=pool) as fx:
        if fx.replayed:
            receipt = fx.result.summary
        else:
            resp = send(..., idempotency_key=fx.key)
            receipt = fx.record(resp.status, {"id": resp.id}).summary

Decorator (the return value is the recorded result, JSON)::

    @fenced(lambda order: event_key(order["id"]), db=pool)
    def charge(order):
        return api.charge(order, idempotency_key=current_fence().key)

Both work with ``async with`` / ``async def`` and psycopg's async API.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime
import functools
import inspect
import json
import os
import re
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from urllib.parse import unquote
from types import TracebackType
from typing import Any, Protocol, TypeVar, Union, cast, overload

import psycopg
from psycopg import errors as pgerrors
from psycopg.types.json import Jsonb

from . import failpoint
from .errors import EffectHeldError, FenceError, InvalidKeyError
from .keys import validate_key, validate_scope

__all__ = [
    "DATABASE_URL_ENV",
    "DEFAULT_LEASE",
    "AsyncConnectionSource",
    "ConnectionSource",
    "Fence",
    "Result",
    "current_fence",
    "fenced",
]

DATABASE_URL_ENV = "ONCEFLOW_DATABASE_URL"
"""The connection string used when ``fenced`` is given no ``db``."""

FAILPOINT_AFTER_CALL = "effects-after-call"
FAILPOINT_AFTER_RECORD = "effects-after-record"

# The lease protocol of Go's effects.DoLeased (migration 022). The claim's
# commit is not waited for on disk, as Go's: a claim lost in a database
# crash costs no correctness (the record inserts the done row without it,
# and a call made again carries the same key).
_CLAIM = (
    "SELECT c.status, c.attempts, c.result_code, c.result, c.claimed_by, c.lease_until"
    " FROM set_config('synchronous_commit', 'off', true) AS sc,"
    " onceflow.effect_lease_claim(%s, %s, %s, %s, make_interval(secs => %s)) AS c"
)
_RECORD = "SELECT onceflow.effect_lease_record(%s, %s, %s, %s, %s)"
_RELEASE = "SELECT onceflow.effect_lease_release(%s, %s, %s)"
# The row of a key lies in one partition of its owner's or in the legacy one
# (migration 032): effect_row_owner names which, so the read probes only
# those partitions.
_KEPT = (
    "SELECT result_code, result FROM onceflow.effects"
    " WHERE owner = onceflow.effect_row_owner(%(scope)s, %(key)s) AND scope = %(scope)s AND idempotency_key = %(key)s"
    " AND status = 'done'"
)
_AGE = "SELECT onceflow.effect_window_age(%s, %s)"
_HOLD = "SELECT onceflow.effect_hold(%s, %s, %s)"
_HELD_ROW = (
    "SELECT attempts, onceflow.effect_window_age(idempotency_key, scope) FROM onceflow.effects"
    " WHERE owner = onceflow.effect_row_owner(%(scope)s, %(key)s) AND scope = %(scope)s AND idempotency_key = %(key)s"
)
_SQLSTATE_HELD = "OFH01"  # a claim of a held key is refused (migration 025)

DEFAULT_LEASE = datetime.timedelta(minutes=5)
"""How long a fence's claim lasts when ``fenced`` is given no ``lease``."""

_MAX_BUSY_WAIT = 1.0  # seconds between two claims of a busy key, at most
_sleep = time.sleep  # the wait between two claims of a busy key (tests count it)

Reconcile = Callable[[str], "Result | None | Awaitable[Result | None]"]
"""Asks the downstream what became of the effect sent under a key: the
:class:`Result` it recorded, or ``None`` when it has none."""


class ConnectionSource(Protocol):
    """A pool of sync connections, such as ``psycopg_pool.ConnectionPool``."""

    def connection(self) -> AbstractContextManager[psycopg.Connection[Any]]: ...


class AsyncConnectionSource(Protocol):
    """A pool of async connections, such as ``psycopg_pool.AsyncConnectionPool``."""

    def connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]: ...


DB = Union[str, ConnectionSource, AsyncConnectionSource, None]


@dataclass(frozen=True)
class Result:
    """A recorded result: ``code`` (e.g. an HTTP status; Go's
    ``Result.Code``, ``None`` for none), ``summary`` (a small JSON value:
    a downstream id, a hash), and whether it came from the ledger without
    calling (``replayed``)."""

    code: int | None = None
    summary: Any = None
    replayed: bool = False


_current: contextvars.ContextVar[Fence | None] = contextvars.ContextVar("onceflow_fence", default=None)


def current_fence() -> Fence:
    """The fence of the ``with fenced(...)`` block or ``@fenced`` function
    running now (its ``key`` is what the downstream must receive)."""
    f = _current.get()
    if f is None:
        raise FenceError("current_fence(): not inside a fenced block or function")
    return f


class Fence:
    """One claim of one key: what a ``with fenced(...)`` block sees."""

    def __init__(self, key: str, scope: str, owner: str = "", event_id: str | None = None) -> None:
        self.key = key
        self.scope = scope
        self.owner = owner
        self.replayed = False
        self.attempts = 0
        self.result: Result | None = None
        self.reconciled = False
        self.lease_until: datetime.datetime | None = None
        self._event_id = event_id
        self._busy_owner: str | None = None
        # How to get a connection for one statement (claim, record,
        # release): none is kept between them.
        self._open: Callable[[], AbstractContextManager[psycopg.Connection[Any]]] | None = None
        self._aopen: Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]] | None = None
        self._held = False

    def _record_args(self, code: int | None, summary: Any) -> tuple[str, str, int | None, Jsonb | None, str | None]:
        if self.replayed:
            raise FenceError(f"key {self.key!r} was replayed: its result is recorded already, nothing was called")
        if not self._held:
            raise FenceError(f"key {self.key!r} is not held (recorded already, or the fence has ended)")
        if code is not None and not isinstance(code, int):
            raise FenceError(f"result code of {self.key!r} is {type(code).__name__}, want int or None")
        try:
            json.dumps(summary)
        except (TypeError, ValueError) as err:
            raise FenceError(f"result summary of {self.key!r} is not JSON: {err}") from err
        return (self.key, self.scope, code, Jsonb(summary) if summary is not None else None, self._event_id)

    def _recorded(self, code: int | None, summary: Any, kept: tuple[Any, ...] | None) -> Result:
        self._held = False
        if kept is not None:
            # Another claimant took the key over after this fence's lease
            # expired and recorded first: its result is kept (both calls
            # carried the same key).
            self.result = Result(code=kept[0], summary=kept[1], replayed=True)
        else:
            self.result = Result(code=code, summary=json.loads(json.dumps(summary)), replayed=False)
        failpoint.hit(FAILPOINT_AFTER_RECORD)
        return self.result

    def record(self, code: int | None = None, summary: Any = None) -> Result:
        """Record the call's result (status done) and release the key. Call
        it right after the downstream answered; a block that ends without
        it records ``Result()``."""
        if self._aopen is not None:
            raise FenceError("record(): this fence is async; use await arecord()")
        failpoint.hit(FAILPOINT_AFTER_CALL)
        args = self._record_args(code, summary)
        if self._open is None:
            raise FenceError(f"key {self.key!r} is not held (the fence has ended)")
        kept = None
        try:
            with self._open() as conn:
                row = conn.execute(_RECORD, args).fetchone()
                if row is None or not row[0]:
                    kept = conn.execute(_KEPT, {"scope": self.scope, "key": self.key}).fetchone()
                if not conn.autocommit:
                    conn.commit()
        except psycopg.Error as err:
            raise FenceError(f"record result of {self.key!r}: {err}") from err
        return self._recorded(code, summary, kept)

    async def arecord(self, code: int | None = None, summary: Any = None) -> Result:
        """:meth:`record` for an async fence."""
        if self._open is not None:
            raise FenceError("arecord(): this fence is sync; use record()")
        failpoint.hit(FAILPOINT_AFTER_CALL)
        args = self._record_args(code, summary)
        if self._aopen is None:
            raise FenceError(f"key {self.key!r} is not held (the fence has ended)")
        kept = None
        try:
            async with self._aopen() as conn:
                cur = await conn.execute(_RECORD, args)
                row = await cur.fetchone()
                if row is None or not row[0]:
                    cur = await conn.execute(_KEPT, {"scope": self.scope, "key": self.key})
                    kept = await cur.fetchone()
                if not conn.autocommit:
                    await conn.commit()
        except psycopg.Error as err:
            raise FenceError(f"record result of {self.key!r}: {err}") from err
        return self._recorded(code, summary, kept)

    def _reconciled(self, found: Result) -> tuple[str, str, int | None, Jsonb | None, str | None]:
        if not isinstance(found, Result):
            raise FenceError(f"reconcile({self.key!r}) returned {type(found).__name__}, want Result or None")
        args = self._record_args(found.code, found.summary)
        return args

    def _mark_reconciled(self, found: Result) -> None:
        self._held = False
        self.replayed = True
        self.reconciled = True
        self.result = Result(code=found.code, summary=json.loads(json.dumps(found.summary)), replayed=True)

    def _claimed(self, row: tuple[Any, ...] | None) -> bool:
        """Take a claim's answer; False when the key is busy (claim again later)."""
        if row is None:  # pragma: no cover - the function always returns a row
            raise FenceError(f"claim {self.key!r}: no row")
        status, attempts, code, summary, owner, until = row
        if status == "busy":
            self._busy_owner = owner
            return False
        self.attempts = int(attempts)
        if status == "done":
            self.replayed = True
            self.result = Result(code=code, summary=summary, replayed=True)
        else:
            self._held = True
            self.lease_until = until
        return True


def _claim_error(key: str, err: psycopg.Error) -> Exception:
    msg = err.diag.message_primary or str(err)
    if isinstance(err, pgerrors.InvalidParameterValue):
        return InvalidKeyError(msg)
    return FenceError(f"claim {key!r}: {msg}")


def _refused_error(f: Fence, row: tuple[Any, ...] | None) -> EffectHeldError:
    attempts, age = (int(row[0]), row[1]) if row is not None else (0, datetime.timedelta(0))
    f.attempts = attempts
    return EffectHeldError(
        f"effect {f.key!r} (scope {f.scope!r}) is held for an operator (a retry came after the downstream's "
        "idempotency window); nothing was sent: resolve it or let it send (consumer effects resolve / unhold)",
        key=f.key,
        scope=f.scope,
        attempts=attempts,
        age=age,
    )


def _refused_sync(conn: psycopg.Connection[Any], f: Fence) -> EffectHeldError:
    """The claim was refused (SQLSTATE OFH01; effect_claim released the key
    first): the held effect's attempts and age, for the error."""
    try:
        if not conn.autocommit:
            conn.rollback()
        row = conn.execute(_HELD_ROW, {"scope": f.scope, "key": f.key}).fetchone()
        if not conn.autocommit:
            conn.commit()
    except psycopg.Error as err:
        conn.close()
        raise FenceError(f"read held effect {f.key!r}: {err}") from err
    return _refused_error(f, row)


async def _refused_async(conn: psycopg.AsyncConnection[Any], f: Fence) -> EffectHeldError:
    try:
        if not conn.autocommit:
            await conn.rollback()
        cur = await conn.execute(_HELD_ROW, {"scope": f.scope, "key": f.key})
        row = await cur.fetchone()
        if not conn.autocommit:
            await conn.commit()
    except psycopg.Error as err:
        await conn.close()
        raise FenceError(f"read held effect {f.key!r}: {err}") from err
    return _refused_error(f, row)


T = TypeVar("T")


class fenced:  # noqa: N801 - used like a function: with fenced(...), @fenced(...)
    """Fence a side effect by ``key`` (see the module documentation).

    ``key`` is a key string (``event_key``, ``graph_key``, or any valid
    key) or, for the decorator form, a function of the decorated
    function's arguments returning it. ``scope`` names the owner of the
    effect, as in Go's ``effects.DoScoped``: the same key in two scopes is
    two effects. ``""`` (the default) is the scope of Go's ``effects.Do``;
    ``consumer_scope(consumer, entry)`` is that of a Go consumer's ``http``
    handler, so a key fenced there is replayed by the handler and back.
    ``db`` is a connection string, a psycopg pool
    (sync or async), or ``None`` for ``$ONCEFLOW_DATABASE_URL``: the fence
    takes a connection of its own for each of its short statements (the
    claim, the record) and holds none while the call runs. ``event_id`` is
    stored in the ledger row for operators.

    ``lease`` is how long the claim lasts (default :data:`DEFAULT_LEASE`):
    make it longer than the call can take, since a claimant that finds the
    lease expired takes the key over and calls again (with the same key).
    ``owner`` names the claimant (default: one unique to the fence): a
    process restarted with the same ``owner`` claims its own keys again at
    once instead of waiting for their leases; two live claimants must never
    share one.

    ``window`` is the downstream's idempotency window (how long it dedups
    a key: Stripe 24 hours). A retry of an intent (an earlier attempt may
    have called) whose first attempt is older than ``window`` is never sent
    blindly — the downstream would take the key for a new one: with
    ``reconcile`` the fence asks the downstream by key and records what it
    answers (``fx.replayed`` and ``fx.reconciled``; nothing is called) or,
    when it answers ``None`` (it has no such effect), lets the call go;
    without ``reconcile`` it raises :class:`~onceflow.EffectHeldError` and
    the effect stays held for an operator. ``reconcile`` must answer from
    the downstream's durable records (a search by the key stored with the
    effect), not from its idempotency cache, which has forgotten the key.
    """

    def __init__(
        self,
        key: str | Callable[..., str],
        scope: str = "",
        *,
        db: DB = None,
        event_id: str | None = None,
        window: datetime.timedelta | None = None,
        reconcile: Reconcile | None = None,
        lease: datetime.timedelta = DEFAULT_LEASE,
        owner: str | None = None,
    ) -> None:
        if not isinstance(scope, str):
            raise FenceError(f"scope is {type(scope).__name__}, want str")
        if not isinstance(lease, datetime.timedelta) or lease <= datetime.timedelta(0):
            raise FenceError(f"lease is {lease!r}, want a positive timedelta")
        if owner is not None and (not isinstance(owner, str) or not owner or len(owner.encode()) > 512):
            raise FenceError(f"owner is {owner!r}, want a string of 1 to 512 bytes")
        self._lease = lease
        self._owner = owner
        if window is not None and (not isinstance(window, datetime.timedelta) or window <= datetime.timedelta(0)):
            raise FenceError(f"window is {window!r}, want a positive timedelta")
        if reconcile is not None and window is None:
            raise FenceError("reconcile needs window: it is asked only for a retry after the downstream's window")
        self._window = window
        self._reconcile = reconcile
        self._key = key
        self.scope = scope
        self._db = db
        self._event_id = event_id
        self._fence: Fence | None = None
        self._token: contextvars.Token[Fence | None] | None = None

    # ------------------------------------------------------------- helpers

    def _key_str(self) -> str:
        if not isinstance(self._key, str):
            raise FenceError("a key function needs the decorator form; give `with fenced(...)` a key string")
        validate_key(self._key)
        return self._key

    def _db_or_env(self) -> str | ConnectionSource | AsyncConnectionSource:
        if self._db is not None:
            return self._db
        url = os.environ.get(DATABASE_URL_ENV, "")
        if not url:
            raise FenceError(f"no database: pass db= (a connection string or a pool) or set {DATABASE_URL_ENV}")
        return url

    def _start(self) -> Fence:
        if self._fence is not None:
            raise FenceError("this fenced(...) is already in use; make one per block")
        validate_scope(self.scope)
        owner = self._owner or f"{_local_owner_prefix()}/{secrets.token_hex(8)}"
        f = Fence(self._key_str(), self.scope, owner, self._event_id)
        self._fence = f
        return f

    def _claim_args(self, f: Fence) -> tuple[str, str, str | None, str, float]:
        return (f.key, f.scope, self._event_id, f.owner, self._lease.total_seconds())

    def _finish(self) -> None:
        if self._token is not None:
            _current.reset(self._token)
        self._token = None
        self._fence = None

    # -------------------------------------------------- downstream window

    def _too_old(self, f: Fence, row: tuple[Any, ...] | None) -> bool:
        if row is None or row[0] is None:  # pragma: no cover - the claim wrote the row
            raise FenceError(f"claim {f.key!r}: no ledger row for its age")
        assert self._window is not None
        self._age: datetime.timedelta = row[0]
        return bool(row[0] > self._window)

    def _held_error(self, f: Fence) -> EffectHeldError:
        return EffectHeldError(
            f"effect {f.key!r} (scope {f.scope!r}) held: attempt {f.attempts} is {self._age} after the first, "
            f"past the downstream's idempotency window of {self._window}, and there is no reconcile hook; "
            "nothing was sent: an operator must find out whether the first attempts reached the downstream "
            "(consumer effects resolve / unhold)",
            key=f.key,
            scope=f.scope,
            attempts=f.attempts,
            age=self._age,
        )

    def _hold_reason(self, f: Fence) -> str:
        return (
            f"attempt {f.attempts} is {self._age} after the first, past the downstream's idempotency window "
            f"of {self._window}; no reconcile hook (Python fence)"
        )

    def _hold_sync(self, conn: psycopg.Connection[Any], f: Fence) -> EffectHeldError:
        """Hold the effect in the ledger (status held; effect_hold releases
        the key) and return the error to raise."""
        try:
            conn.execute(_HOLD, (f.key, f.scope, self._hold_reason(f)))
            if not conn.autocommit:
                conn.commit()
        except psycopg.Error as err:
            raise FenceError(f"hold {f.key!r}: {err}") from err
        f._held = False
        return self._held_error(f)

    async def _hold_async(self, conn: psycopg.AsyncConnection[Any], f: Fence) -> EffectHeldError:
        try:
            await conn.execute(_HOLD, (f.key, f.scope, self._hold_reason(f)))
            if not conn.autocommit:
                await conn.commit()
        except psycopg.Error as err:
            raise FenceError(f"hold {f.key!r}: {err}") from err
        f._held = False
        return self._held_error(f)

    def _past_window_sync(self, conn: psycopg.Connection[Any], f: Fence) -> bool:
        if self._window is None or not f._held or f.attempts <= 1:
            return False
        try:
            row = conn.execute(_AGE, (f.key, f.scope)).fetchone()
            if not conn.autocommit:
                conn.commit()
        except psycopg.Error as err:
            raise FenceError(f"age of {f.key!r}: {err}") from err
        return self._too_old(f, row)

    async def _past_window_async(self, conn: psycopg.AsyncConnection[Any], f: Fence) -> bool:
        if self._window is None or not f._held or f.attempts <= 1:
            return False
        try:
            cur = await conn.execute(_AGE, (f.key, f.scope))
            row = await cur.fetchone()
            if not conn.autocommit:
                await conn.commit()
        except psycopg.Error as err:
            raise FenceError(f"age of {f.key!r}: {err}") from err
        return self._too_old(f, row)

    def _settle_sync(self, conn: psycopg.Connection[Any], f: Fence) -> None:
        """Past the window: reconcile, or hold (the caller's ``except``
        releases the key and leaves the intent)."""
        if self._reconcile is None:
            raise self._hold_sync(conn, f)
        found = self._reconcile(f.key)
        if inspect.isawaitable(found):
            raise FenceError("reconcile returned an awaitable: use `async with fenced(...)` or a sync hook")
        if found is None:
            return  # the downstream has no such effect: call
        args = f._reconciled(found)
        try:
            conn.execute(_RECORD, args)
            if not conn.autocommit:
                conn.commit()
        except psycopg.Error as err:
            raise FenceError(f"record reconciled result of {f.key!r}: {err}") from err
        f._mark_reconciled(found)

    async def _settle_async(self, conn: psycopg.AsyncConnection[Any], f: Fence) -> None:
        if self._reconcile is None:
            raise await self._hold_async(conn, f)
        answer = self._reconcile(f.key)
        found = await answer if inspect.isawaitable(answer) else answer
        if found is None:
            return
        args = f._reconciled(found)
        try:
            await conn.execute(_RECORD, args)
            if not conn.autocommit:
                await conn.commit()
        except psycopg.Error as err:
            raise FenceError(f"record reconciled result of {f.key!r}: {err}") from err
        f._mark_reconciled(found)

    # ---------------------------------------------------------------- sync

    def _opener_sync(self) -> Callable[[], AbstractContextManager[psycopg.Connection[Any]]]:
        db = self._db_or_env()
        if isinstance(db, str):
            url = db

            @contextlib.contextmanager
            def direct() -> Iterator[psycopg.Connection[Any]]:
                conn = _connect(url)
                try:
                    yield conn
                finally:
                    conn.close()

            return direct
        pool = cast(ConnectionSource, db)

        @contextlib.contextmanager
        def pooled() -> Iterator[psycopg.Connection[Any]]:
            with pool.connection() as conn:
                if not isinstance(conn, psycopg.Connection):
                    raise FenceError("db is an async pool: use `async with fenced(...)`")
                yield conn

        return pooled

    def __enter__(self) -> Fence:
        f = self._start()
        try:
            f._open = self._opener_sync()
            wait = 0.02
            while True:
                with f._open() as conn:
                    try:
                        row = conn.execute(_CLAIM, self._claim_args(f)).fetchone()
                        if not conn.autocommit:
                            conn.commit()
                    except psycopg.Error as err:
                        if err.sqlstate == _SQLSTATE_HELD:
                            raise _refused_sync(conn, f) from err
                        raise _claim_error(f.key, err) from err
                    if f._claimed(row):
                        if self._past_window_sync(conn, f):
                            self._settle_sync(conn, f)
                        break
                # Busy: another claimant's lease runs. A claimant of this
                # host whose process is gone is released at once; otherwise
                # wait, holding nothing.
                if _dead_local_owner(f._busy_owner):
                    with f._open() as conn:
                        row = conn.execute(_RELEASE, (f.key, f.scope, f._busy_owner)).fetchone()
                        if not conn.autocommit:
                            conn.commit()
                    if row is not None and row[0]:
                        continue
                _sleep(wait)
                wait = min(2 * wait, _MAX_BUSY_WAIT)
        except BaseException:
            self._release_sync(f)
            self._finish()
            raise
        self._token = _current.set(f)
        return f

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        f = self._fence
        if f is None:
            return
        try:
            if exc_type is None and f._held:
                f.record()
        finally:
            self._release_sync(f)
            self._finish()

    def _release_sync(self, f: Fence) -> None:
        """Give up a claim that was not recorded (the call failed): the
        intent stays, the lease goes, and the next claim calls again."""
        if f._held and f._open is not None:
            f._held = False
            try:
                with f._open() as conn:
                    conn.execute(_RELEASE, (f.key, f.scope, f.owner))
                    if not conn.autocommit:
                        conn.commit()
            except psycopg.Error:
                pass  # the lease expires on its own
        f._held = False
        f._open = None

    # --------------------------------------------------------------- async

    def _opener_async(self) -> Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]]:
        db = self._db_or_env()
        if isinstance(db, str):
            url = db

            @contextlib.asynccontextmanager
            async def direct() -> AsyncIterator[psycopg.AsyncConnection[Any]]:
                conn = await _aconnect(url)
                try:
                    yield conn
                finally:
                    await conn.close()

            return direct
        pool = cast(AsyncConnectionSource, db)

        @contextlib.asynccontextmanager
        async def pooled() -> AsyncIterator[psycopg.AsyncConnection[Any]]:
            cm = pool.connection()
            if not hasattr(cm, "__aenter__"):
                raise FenceError("db is a sync pool: use `with fenced(...)`")
            async with cm as conn:
                yield conn

        return pooled

    async def __aenter__(self) -> Fence:
        f = self._start()
        try:
            f._aopen = self._opener_async()
            wait = 0.02
            while True:
                async with f._aopen() as conn:
                    try:
                        cur = await conn.execute(_CLAIM, self._claim_args(f))
                        row = await cur.fetchone()
                        if not conn.autocommit:
                            await conn.commit()
                    except psycopg.Error as err:
                        if err.sqlstate == _SQLSTATE_HELD:
                            raise await _refused_async(conn, f) from err
                        raise _claim_error(f.key, err) from err
                    if f._claimed(row):
                        if await self._past_window_async(conn, f):
                            await self._settle_async(conn, f)
                        break
                if _dead_local_owner(f._busy_owner):
                    async with f._aopen() as conn:
                        cur = await conn.execute(_RELEASE, (f.key, f.scope, f._busy_owner))
                        row = await cur.fetchone()
                        if not conn.autocommit:
                            await conn.commit()
                    if row is not None and row[0]:
                        continue
                await asyncio.sleep(wait)
                wait = min(2 * wait, _MAX_BUSY_WAIT)
        except BaseException:
            await self._release_async(f)
            self._finish()
            raise
        self._token = _current.set(f)
        return f

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        f = self._fence
        if f is None:
            return
        try:
            if exc_type is None and f._held:
                await f.arecord()
        finally:
            await self._release_async(f)
            self._finish()

    async def _release_async(self, f: Fence) -> None:
        if f._held and f._aopen is not None:
            f._held = False
            try:
                async with f._aopen() as conn:
                    await conn.execute(_RELEASE, (f.key, f.scope, f.owner))
                    if not conn.autocommit:
                        await conn.commit()
            except psycopg.Error:
                pass
        f._held = False
        f._aopen = None

    # ----------------------------------------------------------- decorator

    @overload
    def __call__(self, fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]: ...
    @overload
    def __call__(self, fn: Callable[..., T]) -> Callable[..., T]: ...

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Fence every call of ``fn``: the first call with a key runs it and
        records its return value (JSON; a :class:`Result` records its code
        and summary); a call whose key is recorded returns the recorded
        value without running ``fn``. Both paths return the value as it
        reads back from JSON."""
        spec = self

        def child(args: tuple[Any, ...], kwargs: dict[str, Any]) -> fenced:
            key = spec._key(*args, **kwargs) if callable(spec._key) else spec._key
            return fenced(
                key,
                spec.scope,
                db=spec._db,
                event_id=spec._event_id,
                window=spec._window,
                reconcile=spec._reconcile,
                lease=spec._lease,
                owner=spec._owner,
            )

        def unpack(value: Any) -> tuple[int | None, Any, bool]:
            # A Result with a code is recorded as code + summary and comes
            # back as a Result; anything else is the summary alone.
            if isinstance(value, Result):
                return value.code, value.summary, value.code is not None
            return None, value, False

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                async with child(args, kwargs) as fx:
                    if fx.replayed:
                        assert fx.result is not None
                        return fx.result if isinstance(fx.result.code, int) else fx.result.summary
                    code, summary, wrapped = unpack(await fn(*args, **kwargs))
                    r = await fx.arecord(code, summary)
                    return r if wrapped else r.summary

            return awrapper

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with child(args, kwargs) as fx:
                if fx.replayed:
                    assert fx.result is not None
                    return fx.result if isinstance(fx.result.code, int) else fx.result.summary
                code, summary, wrapped = unpack(fn(*args, **kwargs))
                r = fx.record(code, summary)
                return r if wrapped else r.summary

        return wrapper


# ------------------------------------------------------------ owners

_OWNER_PREFIX = "python/"


def _proc_start(pid: int) -> str:
    """The start time of process ``pid`` (Linux: /proc/<pid>/stat field 22,
    in clock ticks since boot), "" where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _host_id() -> str:
    """``<host>~<boot id>~<pid namespace>``: two processes with the same
    host id see each other's pids. The host name alone does not say that:
    the containers of one Kubernetes pod share it, each with its own pid
    namespace, and a pid seen from one means nothing in another. The boot
    id or the namespace is empty where Linux does not tell them."""
    boot = ns = ""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()[:8]
    except OSError:
        pass
    try:
        ns = os.readlink("/proc/self/ns/pid").removeprefix("pid:[").rstrip("]")
    except OSError:
        pass
    return f"{socket.gethostname()[:200].replace('/', '_')}~{boot}~{ns}"


def _local_owner_prefix() -> str:
    """``python/<host id>/<pid>.<start time>``: a fence's default owner is
    this and a random part, so that a fence of the same host, boot and pid
    namespace can tell whether the process of a claim it finds busy still
    runs."""
    pid = os.getpid()
    return f"{_OWNER_PREFIX}{_host_id()}/{pid}.{_proc_start(pid)}"


def _dead_local_owner(owner: str | None) -> bool:
    """Whether ``owner`` is a default owner of this host id (same host,
    boot and pid namespace) whose process is gone (killed between claim
    and record): no process has its pid, or the one that has it started at
    another time (the pid was reused). Such a claim is released at once
    instead of after its lease. Anything else — another host, boot or pid
    namespace (another container of the pod), an ``owner=`` given by the
    caller, a process that cannot be checked — is taken as alive: wait for
    the lease."""
    if not owner or not owner.startswith(_OWNER_PREFIX):
        return False
    parts = owner[len(_OWNER_PREFIX) :].split("/")
    here = _host_id()
    if len(parts) != 3 or parts[0] != here or here.endswith("~") or "~~" in here:
        return False  # another host id, or one that cannot tell
    pid_s, _, start = parts[1].partition(".")
    if not pid_s.isdigit():
        return False
    pid = int(pid_s)
    if pid == os.getpid() or pid <= 1:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # exists (another user's) or cannot tell
    return bool(start) and _proc_start(pid) not in ("", start)


# ------------------------------------------------------------ connecting

_REDACTED = "[redacted]"
_URI_USERINFO = re.compile(r"^\s*[A-Za-z][A-Za-z0-9+.-]*://([^@/?#]*)@")
_PASSWORD_PARAM = re.compile(r"""password\s*=\s*('(?:[^'\\]|\\.)*'|[^\s&]*)""", re.IGNORECASE)


def _conninfo_secrets(conninfo: str) -> list[str]:
    """The parts of a connection string that may be a password: the
    userinfo's password (as written and percent-decoded) and every
    ``password=`` value (URI query or keyword/value form), parsed leniently
    so that a malformed string is covered too."""
    out: list[str] = []
    m = _URI_USERINFO.match(conninfo)
    if m and ":" in m.group(1):
        out.append(m.group(1).split(":", 1)[1])
    for m in _PASSWORD_PARAM.finditer(conninfo):
        v = m.group(1)
        out.append(v)
        if len(v) >= 2 and v[0] == "'" and v[-1] == "'":
            out.append(v[1:-1])
    out += [unquote(v) for v in out]
    return sorted({v for v in out if v}, key=len, reverse=True)


def _redact_conninfo(text: str, conninfo: str) -> str:
    """``text`` (a driver's error) with the password of ``conninfo`` blanked
    out; libpq repeats a malformed string, or the bad part of it, in its
    errors."""
    for secret in _conninfo_secrets(conninfo):
        text = text.replace(secret, _REDACTED)
    return text


def _connect_error(err: psycopg.Error, conninfo: str) -> psycopg.Error:
    """The same kind of error as ``err`` without the password, and without
    ``err`` as its cause or context (a traceback would print it)."""
    clean = type(err)(_redact_conninfo(str(err), conninfo).strip())
    clean.__suppress_context__ = True
    return clean


def _connect(conninfo: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(conninfo, autocommit=True)
    except psycopg.Error as err:
        clean = _connect_error(err, conninfo)
    raise clean


async def _aconnect(conninfo: str) -> psycopg.AsyncConnection[Any]:
    try:
        return await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    except psycopg.Error as err:
        clean = _connect_error(err, conninfo)
    raise clean
