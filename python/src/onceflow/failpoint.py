"""Crash points for fault tests, as in the Go binaries.

``hit(name)`` kills the process with SIGKILL when the environment variable
``ONCEFLOW_FAILPOINTS`` names that point: no ``finally`` block runs, no
buffer is flushed, exactly as if the machine had died. The variable is a
comma-separated list of ``NAME`` or ``NAME=N`` (die on the N-th hit,
default 1). Unset, ``hit`` costs a dictionary lookup.

Points in this package: ``effects-after-call`` (the fenced call returned,
its result is not recorded yet) and ``effects-after-record`` (the result is
recorded, the caller has not seen it yet).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

__all__ = ["ENV_VAR", "hit"]

ENV_VAR = "ONCEFLOW_FAILPOINTS"

_lock = threading.Lock()
_points: dict[str, list[int]] | None = None  # name -> [die at, hits so far]


def _load() -> dict[str, list[int]]:
    points: dict[str, list[int]] = {}
    for item in os.environ.get(ENV_VAR, "").split(","):
        item = item.strip()
        if not item:
            continue
        name, _, n = item.partition("=")
        at = 1
        if n.isdigit() and int(n) > 0:
            at = int(n)
        points[name] = [at, 0]
    return points


def hit(name: str) -> None:
    """SIGKILL this process if ``name`` is armed and this is its N-th hit."""
    global _points
    with _lock:
        if _points is None:
            _points = _load()
        p = _points.get(name)
        if p is None:
            return
        p[1] += 1
        if p[1] != p[0]:
            return
    sys.stderr.write(f"failpoint {name}: SIGKILL\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
