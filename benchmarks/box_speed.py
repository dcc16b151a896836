"""How fast this box runs a fixed piece of work: the yardstick that lets two runs' CPU figures compare.

Contract:
- ``box_speed()`` times two fixed loads on one core, each the best of three tries, before anything
  else of the run starts: ``python_loop_ms`` (ten million additions in a Python loop: the
  interpreter's speed, what the worker, the ingress and the fixture spend most of their CPU as) and
  ``sha256_ms`` (hashing 64 MiB: native code, as PostgreSQL and the dev server run).
- CPU figures are per box: the same commit's idle CPU per subscription-hour measured 122 ms on one
  2-core box and ~220 ms on another of the same kind a few hours later (docs/benchmarks.md). A
  figure from a box whose yardstick differs compares only through the yardstick's ratio, and the
  issue's targets are for the box they were set on.
"""

from __future__ import annotations

import hashlib
import time

__all__ = ["box_speed", "yardstick"]

LOOP = 10_000_000
HASHED = 64 * 1024 * 1024


def _loop() -> float:
    started = time.perf_counter()
    total = 0
    for i in range(LOOP):
        total += i
    assert total == LOOP * (LOOP - 1) // 2
    return (time.perf_counter() - started) * 1000


def _sha256(data: bytes) -> float:
    started = time.perf_counter()
    hashlib.sha256(data).digest()
    return (time.perf_counter() - started) * 1000


def box_speed(tries: int = 3) -> dict[str, float]:
    """The yardstick (module contract), in milliseconds: lower is a faster box."""
    data = bytes(HASHED)
    return {"python_loop_ms": round(min(_loop() for _ in range(tries)), 1),
            "sha256_ms": round(min(_sha256(data) for _ in range(tries)), 1)}


def yardstick(speed: dict[str, float] | None) -> str:
    """The summary's line for ``speed`` (``machine.speed`` of results.json; None: a run before it)."""
    if not speed:
        return "box yardstick: not measured"
    return (f"box yardstick: python loop {speed['python_loop_ms']} ms, sha256 {speed['sha256_ms']} ms"
            " (benchmarks/box_speed.py: CPU figures of two boxes compare through it)")
