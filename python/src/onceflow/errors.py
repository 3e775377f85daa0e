"""Typed errors of the onceflow package.

Every error raised on purpose is an :class:`OnceflowError`; the ones about
bad input are also :class:`ValueError`, so existing ``except ValueError``
handlers keep working.
"""

from __future__ import annotations

import datetime

__all__ = [
    "OnceflowError",
    "InvalidKeyError",
    "InvalidEventError",
    "DuplicateEventError",
    "RetryableError",
    "FenceError",
    "EffectHeldError",
]


class OnceflowError(Exception):
    """Base class of every error this package raises on purpose."""


class InvalidKeyError(OnceflowError, ValueError):
    """An idempotency key (or a part of one) breaks the key rules.

    The rules are Go's ``effects.ValidateKey``/``EventKey``/``GraphKey``
    and the SQL functions' (``onceflow.effect_key_error`` …), tested
    against one shared table of cases.
    """


class InvalidEventError(OnceflowError, ValueError):
    """``onceflow.enqueue`` rejected an argument (SQLSTATE 22023); the
    message names it. The caller's transaction is aborted."""


class DuplicateEventError(OnceflowError):
    """The event id already exists in the outbox (SQLSTATE 23505). The
    caller's transaction is aborted."""

    def __init__(self, message: str, event_id: str | None) -> None:
        super().__init__(message)
        self.event_id = event_id


class RetryableError(OnceflowError):
    """A deadlock or serialization failure (SQLSTATE 40P01, 40001): roll the
    transaction back and run it again (and lock sources in one fixed order)."""


class FenceError(OnceflowError):
    """The fencing protocol was misused or the ledger could not be written:
    a claim inside a transaction that already wrote, a record without a
    claim, a result that is not JSON. The message says which."""


class EffectHeldError(FenceError):
    """A retry of an effect whose first attempt is older than its
    downstream's idempotency window, with no ``reconcile`` hook to ask the
    downstream what became of it: nothing was sent. The fence holds the
    effect in the ledger (``onceflow.effect_hold``: status ``held``), and
    every claim of the key is refused with this error until an operator
    resolves it (``onceflow.effect_resolve``: records what the downstream
    did) or lets it send (``onceflow.effect_unhold``); ``consumer effects
    held|resolve|unhold`` runs them.

    ``key``, ``scope``, ``attempts`` and ``age`` (a ``timedelta`` since
    the first attempt, or the last unhold) say which effect and why."""

    def __init__(self, message: str, *, key: str, scope: str, attempts: int, age: datetime.timedelta) -> None:
        super().__init__(message)
        self.key = key
        self.scope = scope
        self.attempts = attempts
        self.age = age
