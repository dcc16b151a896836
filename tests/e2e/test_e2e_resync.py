"""Safety reads at the ingress (worker/ingress/resync.py, the sweep of the ledger's due verifications) on
the real stack: Temporal dev server, PostgreSQL, the fixture MCP server over HTTP with subscribe.

A subscription with a short safety-read period and no change gets its verifications from the
ingress's sweep: read at the ingress as if notified (ledger trigger ``updated``, receipt UNCHANGED)
and kept in the ledger: its workflow gets no signal for them (no ``resource_read``, no
``resource_updated``). A change is still read at the ingress, reported and mirrored. When the sweep
stops (its ingress and session stay up) the workflow's own deadline timer reads (trigger ``poll``);
on a server with ``read_on_notification: false`` the sweep signals the workflow, which reads. Either
way no gap between reads exceeds the published bound.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from benchmarks.staleness import gaps_between_reads
from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import ServerConfig
from mcpsync.workflows.names import SIGNAL_RESOURCE_READ, SIGNAL_RESOURCE_UPDATED, Act
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionOptions, SubscriptionState
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1
from mcpsync.workflows.verification_rules import SWEEP_IDLE_SECONDS
from tests.conftest import eventually, ledger_rows, running_services, unique
from tests.e2e.test_e2e_subscription import _wait_record

SAFETY_SECONDS = 5.0  # the sweep reads a row 3.8-4.3 s after its newest verification; the dispatch
# margin (0.5 s) is what a read the workflow dispatches (its timer's, or on a signal) has on a loaded box
READS = 3  # reads at the ingress after the initial one, nothing changing
# The first look that finds a new row comes up to SWEEP_IDLE_SECONDS after it started; then a read
# each period, a little less.
READS_TIMEOUT = SWEEP_IDLE_SECONDS + (READS + 3) * SAFETY_SECONDS


async def _history(handle: WorkflowHandle) -> dict[str, int]:
    counts = {"read_cycles": 0, "timers_fired": 0, "reports": 0, "updates": 0}
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            counts["read_cycles"] += event.activity_task_scheduled_event_attributes.activity_type.name \
                == Act.MCP_READ_CYCLE
        elif event.event_type == EventType.EVENT_TYPE_TIMER_FIRED:
            counts["timers_fired"] += 1
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            name = event.workflow_execution_signaled_event_attributes.signal_name
            counts["reports"] += name == SIGNAL_RESOURCE_READ
            counts["updates"] += name == SIGNAL_RESOURCE_UPDATED
    return counts


async def _reads(ledger: Ledger, key: SubscriptionKey) -> tuple[list[tuple[str, str | None]], float]:
    """(trigger, verdict) of the reads after the initial one, and the longest gap between reads (the
    open gap to now included: ``benchmarks.staleness.gaps_between_reads``)."""
    rows = await ledger_rows(ledger, "SELECT trigger_reason, outcome, issued_at FROM read_requests"
                                     " WHERE workflow_id=%s ORDER BY ordinal", key.workflow_id)
    now = (await ledger_rows(ledger, "SELECT now()"))[0][0]
    times = [r[2] for r in rows]
    return [(r[0], r[1]) for r in rows[1:]], max(gaps_between_reads(times, times[0], now))


Settled = tuple[list[tuple[str, str | None]], float, dict[str, int]]  # reads, widest gap, history counts


def _triggers(reads: list[tuple[str, str | None]]) -> list[str]:
    return [trigger for trigger, _ in reads]


def _polls(triggers: list[str]) -> int:
    """The workflow's own reads where the ingress reads: its timer's."""
    return triggers.count("poll")


async def _settled(ledger: Ledger, key: SubscriptionKey, handle: WorkflowHandle, *, updated: int,
                   own: Callable[[list[str]], int] = _polls,
                   polls: int = 0, since: int = 0) -> Settled:
    """Wait (at most ``READS_TIMEOUT``) for ``updated`` reads triggered ``updated`` after the initial
    one (and ``polls`` timer reads from read ``since`` on), every read judged, and each of the
    workflow's own reads (``own`` of the triggers) in its history: its read-cycle activity is
    scheduled before its row is written, so none is in flight then."""
    seen: list[object] = []

    async def check() -> Settled | None:
        reads, gap = await _reads(ledger, key)
        history = await _history(handle)
        seen[:] = [reads, history]
        triggers = _triggers(reads)
        done = triggers.count("updated") >= updated and triggers[since:].count("poll") >= polls \
            and all(verdict is not None for _, verdict in reads) and history["read_cycles"] == own(triggers)
        return (reads, gap, history) if done else None

    try:
        return await eventually(check, timeout=READS_TIMEOUT, interval=0.5, what=f"reads of {key.uri}")
    except AssertionError as err:
        raise AssertionError(f"{err}: reads and history {seen}") from None


async def _subscribed(client: Client, fx: FixtureProcess, server: ServerConfig,
                      queue: str) -> tuple[SubscriptionKey, WorkflowHandle, ResourceSubscriptionV1]:
    key = SubscriptionKey(subject="alice", server=server.name, uri=f"demo://resync/{uuid.uuid4().hex}")
    await fx.create(key.uri, text="v1")
    handle = await start_subscription(client, key, task_queue=queue,
                                      options=SubscriptionOptions(safety_read_seconds=SAFETY_SECONDS))
    record = await _wait_record(handle, lambda r: r.state == SubscriptionState.ACTIVE
                                and r.last_issued_ordinal > 0, "subscribed and read")
    return key, handle, record


async def test_unchanged_reads_stay_in_the_ledger_a_change_is_reported_and_the_bound_holds(
        temporal_client: Client, ledger: Ledger, tmp_path: Path) -> None:
    async with await FixtureProcess.start_http(tmp_path, seed="none") as fx:
        swept, stopped = (ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url,
                                       subjects=["alice"], catalog=False) for _ in range(2))
        signalling = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, subjects=["alice"],
                                  catalog=False, read_on_notification=False)
        async with running_services(temporal_client, ledger, [swept, stopped, signalling]) as cfg:
            queue = cfg.temporal.task_queue

            async def swept_then_changed() -> tuple[Settled, dict[str, int], str, bool]:
                key, handle, first = await _subscribed(temporal_client, fx, swept, queue)
                idle = await _settled(ledger, key, handle, updated=READS)
                await fx.edit(key.uri, text="v2")  # notified: read at the ingress, ACCEPTED, reported
                v1 = first.last_accepted_digest
                record = await _wait_record(handle, lambda r: r.last_accepted_digest != v1,
                                            "the change mirrored", timeout=15)
                digest, watermark = (await ledger_rows(
                    ledger, "SELECT last_accepted_digest, watermark FROM subscriptions WHERE workflow_id=%s",
                    key.workflow_id))[0]
                assert (record.last_accepted_digest, record.watermark) == (digest, watermark)
                trigger = (await ledger_rows(ledger, "SELECT trigger_reason FROM read_requests"
                                                     " WHERE workflow_id=%s AND ordinal=%s",
                                             key.workflow_id, watermark))[0][0]
                # (The change is the ingress's read, unless the workflow's timer read it first.)
                return idle, await _history(handle), digest, trigger == "updated"

            async def sweep_stopped() -> tuple[int, list[str], float]:
                key, handle, _ = await _subscribed(temporal_client, fx, stopped, queue)
                await _settled(ledger, key, handle, updated=1)
                # The sweep stops (its ingress and session stay): the workflow's timer reads.
                sweep = next(t for t in asyncio.all_tasks() if t.get_name() == f"resync:{stopped.name}")
                sweep.cancel()
                await asyncio.sleep(0.5)  # a read the sweep fed just before is judged meanwhile
                before_stop = len((await _reads(ledger, key))[0])
                reads, whole_gap, _ = await _settled(ledger, key, handle, updated=1, polls=2,
                                                     since=before_stop)
                return before_stop, _triggers(reads), whole_gap

            async def signalled() -> tuple[list[str], float, dict[str, int]]:
                key, handle, _ = await _subscribed(temporal_client, fx, signalling, queue)
                reads, gap, history = await _settled(ledger, key, handle, updated=2, own=len)
                return _triggers(reads), gap, history

            swept_run, stopped_run, signalled_run = await asyncio.gather(
                swept_then_changed(), sweep_stopped(), signalled())
    (idle_reads, gap, idle_history), changed_history, digest, read_at_ingress = swept_run
    before_stop, after, whole_gap = stopped_run
    s_triggers, s_gap, s_history = signalled_run

    # Unchanged reads at the ingress: UNCHANGED receipts in the ledger, no signal to the workflow
    # (its history holds only its own timer's reads, if any), and no gap over the bound.
    ingress = [verdict for trigger, verdict in idle_reads if trigger == "updated"]
    assert len(ingress) >= READS and set(ingress) == {"UNCHANGED"}, idle_reads
    assert idle_history["reports"] == 0 and idle_history["updates"] == 0, idle_history
    assert gap <= SAFETY_SECONDS, gap
    # The change: accepted, mirrored by the run (its record names the ledger's digest and watermark),
    # reported when the ingress read it; never as a wake-up.
    assert digest.startswith("sha256:") and changed_history["updates"] == 0, changed_history
    assert changed_history["reports"] >= 1 or not read_at_ingress, changed_history
    # The sweep stopped (after reading): the timer reads, and no gap over the whole run exceeded the bound.
    assert before_stop >= 1 and "updated" in after[:before_stop], (before_stop, after)
    stopped_reads = after[before_stop:]
    assert stopped_reads.count("poll") >= 2 and "updated" not in stopped_reads, (before_stop, after)
    assert whole_gap <= SAFETY_SECONDS, whole_gap
    # Nothing read at the ingress: the sweep wakes the workflow (resource_updated), which reads.
    assert s_triggers.count("updated") >= 2 and s_history["updates"] >= s_triggers.count("updated"), \
        (s_triggers, s_history)
    assert s_history["reports"] == 0 and s_history["read_cycles"] == len(s_triggers), s_history
    assert s_gap <= SAFETY_SECONDS, s_gap
