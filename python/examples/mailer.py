"""What the agent examples share: the mail service's client and the crash
and race points the tests arm.

``post_email`` sends one e-mail with an ``Idempotency-Key``; the tests'
mail service dedups nothing, so every call is an e-mail a person receives.
``rendezvous`` makes runners meet inside the tool before its effect (a
directory of marker files, with a deadline), so that a race test has both
runners in the tool at once rather than hoping they overlap.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
import urllib.request
from pathlib import Path

FAILPOINT_AFTER_SEND = "agent-after-send"
"""The e-mail is sent (and, fenced, its result recorded); the engine has
not recorded the step or tool call yet."""


def post_email(mail_url: str, key: str | None, email: dict[str, str]) -> tuple[int, str]:
    """Send one e-mail; returns (HTTP status, the service's message id)."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    req = urllib.request.Request(mail_url, data=json.dumps(email).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = json.loads(resp.read())
        return resp.status, str(body["id"])


def rendezvous(directory: str | None, parties: int, timeout: float = 60.0) -> None:
    """Wait until ``parties`` processes have reached this point (no-op
    without a directory)."""
    if not directory:
        return
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{os.getpid()}-{uuid.uuid4().hex}").touch()  # one per arrival, several may share a process
    deadline = time.monotonic() + timeout
    while len(list(d.iterdir())) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"rendezvous in {directory}: {len(list(d.iterdir()))} of {parties} arrived")
        time.sleep(0.01)


async def arendezvous(directory: str | None, parties: int, timeout: float = 60.0) -> None:
    """:func:`rendezvous` for async code: it waits without blocking the event
    loop, so that two runs on one loop can meet."""
    if not directory:
        return
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{os.getpid()}-{uuid.uuid4().hex}").touch()
    deadline = time.monotonic() + timeout
    while len(list(d.iterdir())) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"rendezvous in {directory}: {len(list(d.iterdir()))} of {parties} arrived")
        await asyncio.sleep(0.01)
