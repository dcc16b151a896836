"""Connecting: the Temporal client and the PostgreSQL ledger every process of mcpsync opens.

Contract:
- ``connect_temporal`` returns a client using the pydantic data converter (``worker/main/converter.py``), or
  raises ``TemporalUnavailable`` with the address in the message (``connect_error_reason``: why, on one line).
- ``open_ledger`` opens PostgreSQL at ``url``, applies migrations and returns a ``Ledger``.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

from temporalio.client import Client, TLSConfig

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.db import migrate, open_pool
from mcpsync.worker.main.config import TemporalConfig
from mcpsync.worker.main.converter import DATA_CONVERTER

__all__ = ["TemporalUnavailable", "connect_error_reason", "connect_temporal", "open_ledger"]


class TemporalUnavailable(RuntimeError):
    """The Temporal frontend could not be reached."""

async def connect_temporal(cfg: TemporalConfig) -> Client:
    tls: TLSConfig | bool = False
    if cfg.tls_cert and cfg.tls_key:
        cert, key = await asyncio.to_thread(lambda: (Path(cfg.tls_cert or "").read_bytes(),
                                                     Path(cfg.tls_key or "").read_bytes()))
        tls = TLSConfig(client_cert=cert, client_private_key=key)
    api_key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
    if api_key and tls is False:
        tls = True
    try:
        return await asyncio.wait_for(
            Client.connect(cfg.address, namespace=cfg.namespace, tls=tls, api_key=api_key,
                           data_converter=DATA_CONVERTER),
            cfg.connect_timeout_seconds,
        )
    except Exception as exc:
        raise TemporalUnavailable(
            f"Temporal unreachable at {cfg.address} (namespace {cfg.namespace}): "
            f"{connect_error_reason(exc, cfg.connect_timeout_seconds)}"
        ) from None


def connect_error_reason(exc: BaseException, timeout: float) -> str:
    """Why a connection failed, whole: the OS's words when the driver nests them (``tcp connect
    error: Connection refused``), else the message on one line, shortened at a word boundary."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s"
    text = " ".join(str(exc).split())
    os_message = re.search(r'message: "([^"]+)"', text)
    if os_message:
        what = re.search(r'ConnectError\("([^"]+)"', text)
        return f"{what.group(1) + ': ' if what else ''}{os_message.group(1)}"
    if len(text) > 300:
        text = text[:300].rsplit(" ", 1)[0] + " …"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def open_ledger(url: str, *, max_size: int = 16) -> Ledger:
    pool = await open_pool(url, max_size=max_size)
    await migrate(pool)
    return Ledger(pool)
