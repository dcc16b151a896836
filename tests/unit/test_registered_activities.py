"""Every activity a worker registers is one a workflow schedules, or one a released history holds.

An activity no workflow schedules is dead surface (a name the cluster can dispatch to, code to keep
compatible), unless a released run may still have it scheduled: then its history (the replay corpus,
``tests/histories/<version>/``) holds it. The lists are production's (``Ledger.activities()``, the
session queue's and the catalog's ``all()``); the names a workflow schedules are the ``Act`` constants
``workflows/`` names outside ``names.py``.
"""

from __future__ import annotations

import base64
import functools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from psycopg_pool import AsyncConnectionPool
from temporalio import activity
from temporalio.client import Client

from mcpsync.activities.catalog_scan import CatalogScanActivities
from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.answers import AnswerLedger, AnswerLedgerActivities
from mcpsync.activities.ledger.catalog import CatalogLedger, CatalogLedgerActivities
from mcpsync.activities.mcp_session import McpSessionActivities
from mcpsync.workflows import names

ROOT = Path(__file__).resolve().parents[2]
UNSCHEDULED = {"ledger_allocate_read", "ledger_accept", "mcp_read", "mcp_subscribe"}


def _registered() -> set[str]:
    pool = AsyncConnectionPool("", open=False)  # never opened: the lists only name bound methods
    ledger = Ledger(pool)
    lists: list[list[Callable[..., Any]]] = [
        ledger.activities(),
        CatalogLedgerActivities(CatalogLedger(pool), ledger, cast(Client, None), "q").all(),
        AnswerLedgerActivities(AnswerLedger(pool)).all(),
        McpSessionActivities(lambda subject, server: None, ledger).all(),
        CatalogScanActivities(lambda subject, server: None, lambda s, v, g: 0, CatalogLedger(pool)).all(),
    ]
    return {activity._Definition.must_from_callable(fn).name for fns in lists for fn in fns}


def _scheduled_by_workflows() -> set[str]:
    classes = {name: getattr(names, name) for name in ("Act", "CatalogAct", "AnswerAct")}
    source = "\n".join(p.read_text() for p in (ROOT / "workflows").rglob("*.py") if p.name != "names.py")
    used = re.findall(r"\b(Act|CatalogAct|AnswerAct)\.([A-Z_]+)\b", source)
    return {getattr(classes[cls], const) for cls, const in used}


@functools.cache
def _in_released_histories() -> frozenset[str]:
    """Activity names in every recorded history: scheduled ones and local activities' markers (payloads
    decoded)."""
    known = {v for cls in (names.Act, names.CatalogAct, names.AnswerAct) for k, v in vars(cls).items()
             if k.isupper()}
    found: set[str] = set()

    def strings(node: Any) -> list[str]:
        if isinstance(node, dict):
            out = [base64.b64decode(v).decode("utf-8", "replace") for k, v in node.items()
                   if k == "data" and isinstance(v, str)]
            return out + [s for v in node.values() for s in strings(v)]
        if isinstance(node, list):
            return [s for v in node for s in strings(v)]
        return [node] if isinstance(node, str) else []

    for history in sorted((ROOT / "tests" / "histories").glob("*/*.json")):
        text = "\n".join(strings(json.loads(history.read_text())))
        found |= {name for name in known if re.search(rf"\b{name}\b", text)}
    return frozenset(found)


def test_every_registered_activity_is_scheduled_or_in_a_released_history() -> None:
    registered = _registered()
    needed = _scheduled_by_workflows() | _in_released_histories()
    assert registered - needed == set(), "registered, but no workflow schedules it and no history holds it"
    assert needed - registered == set(), "scheduled or recorded, but no worker registers it"
    assert not UNSCHEDULED & registered


def test_the_history_reader_finds_local_activities_in_markers() -> None:
    # ledger_mark_active runs as a local activity: only its marker's payload names it.
    assert "ledger_mark_active" in _in_released_histories()
    assert "mcp_read_cycle" in _in_released_histories()
    assert not UNSCHEDULED & _in_released_histories()
