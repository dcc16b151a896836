"""The simulator cross-checked on the real stack (issue 6, item 3).

A seeded sample of the simulator's own generated schedules is replayed against the real
Temporal dev server, PostgreSQL and the fixture MCP server, so the simulator cannot drift
from the workflow unnoticed. Each schedule drives one subscription on a URI of its own; all
run concurrently on one worker and one session.

Translation (``real_actions``): what the real stack decides by itself (activity execution and
completion order, signal delivery order, timers) becomes a short pause, so real scheduling
supplies the interleavings; everything else is an action: a mutation / delete / recreate
through the control plane with the schedule's notification count (0 = dropped, 2-3 =
duplicated; a per-URI fixture switch), a failed or denied read (fixture switches, then a
notification to make the workflow read), a close update or signal, an old-session or
wrong-URI notification, a catalog word measured some steps ago (proven or not), an identity
conflict, a resume, a platform revocation, a ``temporal workflow reset`` (first or last
workflow task, with or without signal reapply) and continue-as-new (a small
``max_history_events``). Left out: session loss (one session is shared by all schedules;
``test_e2e_process_faults`` covers it), restart of a closed key, lost responses, guardrail
refusals, concurrent reads (F4) and the sweep's stops (the real ingress sweeps throughout; a killed
ingress is a session loss). The simulator's ``sweep`` jumps are pauses: the real ingress sweeps itself.

Then the drain (resume, a catalog word, a final notification, until quiet) and the
simulator's invariants, asserted from the PostgreSQL ledger: advancing receipts in ordinal
order, accepted digests committed by the oracle and never older than the one before, nothing
accepted, tombstoned or published after a close or revocation returned, no read allocated
past the close ordinal, a terminal state only for a reason the schedule gave, the run
completed, and convergence to the oracle's last state otherwise. Sized by
``MCPSYNC_CROSSCHECK_SCHEDULES`` (default 50).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.activities.workflow_updates import execute_update
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.stack.temporal import TemporalDevServer, temporal_cli_path
from mcpsync.workflows.names import (
    SIGNAL_CATALOG_RECONCILED,
    SIGNAL_CLOSE,
    SIGNAL_IDENTITY_CONFLICT,
    SIGNAL_RESOURCE_UPDATED,
    SIGNAL_REVOKE,
    UPDATE_CLOSE,
    UPDATE_RESUME,
    Act,
)
from mcpsync.workflows.records.subscription import (
    CatalogObservation,
    CloseReceipt,
    CloseRequest,
    IdentityConflict,
    ResourceUpdated,
    ResumeRequest,
    RevokeRequest,
    SubscriptionKey,
    SubscriptionOptions,
    SubscriptionState,
)
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1
from sim.model import ALL_FAULTS, Event, Fault, Op, SimConfig, schedule_seed
from sim.schedule import run_schedule
from tests.conftest import eventually, ledger_rows, running_services, unique
from tests.e2e.conftest import SpareFixtures, notifications_seen, reads_settled
from tests.e2e.test_e2e_fence import _record

S = SubscriptionState
SCHEDULES = int(os.environ.get("MCPSYNC_CROSSCHECK_SCHEDULES", "50"))
CONCURRENCY = 10
CROSSCHECK_CONFIG = SimConfig(faults=ALL_FAULTS - {
    Fault.SESSION_LOSS, Fault.RESTART, Fault.RETRY, Fault.GUARDRAIL, Fault.CONCURRENT_READS, Fault.POLLING,
    Fault.LOST_ACK, Fault.SWEEP_STOP})
PAUSE_S = 0.03
TERMINAL = {S.CLOSED, S.UNSUBSCRIBE_UNKNOWN, S.TOMBSTONED, S.REVOKED}
READING = {S.ACTIVE, S.UPDATE_SEEN, S.READ_PENDING, S.VERSION_ACCEPTED}  # a notification makes these read
ADVANCING = ("ACCEPTED", "UNCHANGED", "TOMBSTONE_PENDING", "GUARDRAIL_REJECTED")


# --- translation (pure) ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Action:
    kind: str  # mutate | delete | recreate | read_fault | close | old_note | wrong_uri | catalog | conflict
    # | resume | revoke | reset | pause
    n: int = 0  # notification copies; catalog lag in steps; reset: 0 first task, 1 last task
    # read_fault: error | denied; close: update | signal; catalog: proven | ""; reset: reapply | ""
    detail: str = ""


def real_actions(events: Iterable[Event]) -> list[Action]:
    """The simulator's events as real-stack actions (see the module docstring)."""
    out: list[Action] = []
    for e in events:
        op = e.op
        if op in (Op.MUTATE, Op.DELETE, Op.RECREATE):
            out.append(Action(op.value, n=e.n))
        elif op == Op.EXEC and e.act in (Act.MCP_READ, Act.MCP_READ_CYCLE, Act.MCP_SUBSCRIBE_CYCLE) \
                and e.fault in ("error", "malformed", "denied"):
            out.append(Action("read_fault", detail="denied" if e.fault == "denied" else "error"))
        elif op == Op.CLOSE:
            out.append(Action("close", detail="signal" if e.fault == "signal" else "update"))
        elif op == Op.OLD_NOTE:
            out.append(Action("old_note"))
        elif op == Op.WRONG_URI:
            out.append(Action("wrong_uri"))
        elif op == Op.CATALOG:
            out.append(Action("catalog", n=e.n, detail=e.fault))
        elif op in (Op.CONFLICT, Op.RESUME, Op.REVOKE):
            out.append(Action(op.value))
        elif op == Op.RESET:
            out.append(Action("reset", n=e.n % 2, detail=e.fault))
        elif out and out[-1].kind == "pause" and out[-1].n < 5:
            out[-1] = Action("pause", n=out[-1].n + 1)  # the real stack orders these itself
        elif not (out and out[-1].kind == "pause"):
            out.append(Action("pause", n=1))
    return out


def test_translation_keeps_decisive_events_and_folds_the_rest() -> None:
    events = [Event(Op.EXEC, act="ledger_allocate_read"), Event(Op.COMPLETE, act="ledger_allocate_read"),
              Event(Op.MUTATE, n=0), Event(Op.EXEC, act="mcp_read", fault="denied"),
              Event(Op.CLOSE, fault="signal"), Event(Op.CATALOG, n=3, fault="proven"),
              Event(Op.RESET, n=3, fault="reapply")]
    assert real_actions(events) == [
        Action("pause", n=2), Action("mutate", n=0), Action("read_fault", detail="denied"),
        Action("close", detail="signal"), Action("catalog", n=3, detail="proven"),
        Action("reset", n=1, detail="reapply")]


# --- the real-stack driver --------------------------------------------------------------------------


class FaultBoard:
    """Per-URI fixture switches shared by concurrent schedules (``POST /faults`` replaces a map)."""

    def __init__(self, fx: FixtureProcess) -> None:
        self.fx = fx
        self.lock = asyncio.Lock()
        self.maps: dict[str, dict[str, Any]] = {"notify_copies": {}, "fail_reads": {}, "deny_reads": {}}

    async def set(self, switch: str, uri: str, value: Any) -> None:
        async with self.lock:
            if self.maps[switch].get(uri) == value:
                return  # the fixture has this map already
            if value is None:
                self.maps[switch].pop(uri, None)
            else:
                self.maps[switch][uri] = value
            await self.fx.faults(**{switch: dict(self.maps[switch])})

    async def clear(self, uri: str) -> None:
        for switch in self.maps:
            if uri in self.maps[switch]:
                await self.set(switch, uri, None)


@dataclass
class Run:
    """One schedule on the real stack: what the oracle committed and what the driver did."""

    index: int
    key: SubscriptionKey
    actions: list[Action]
    committed: list[str] = field(default_factory=list)  # content digests in commit order
    timeline: list[tuple[datetime, bool]] = field(default_factory=list)  # (when, exists)
    version: int = 0
    closed_at: datetime | None = None  # the close update (or signal) had taken effect
    revoked_at: datetime | None = None
    reasons: set[str] = field(default_factory=set)  # why a terminal state is legal
    ended: bool = False  # the run completed for a reason of its own (e.g. a denied read revoked it)
    resets: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def exists(self) -> bool:
        return self.timeline[-1][1]

    def existed_at(self, when: datetime) -> bool:
        state = self.timeline[0][1]
        for t, exists in self.timeline:
            if t <= when:
                state = exists
        return state


async def _until(handle: WorkflowHandle, pred: Any, timeout: float) -> ResourceSubscriptionV1 | None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            rec = await _record(handle)
        except Exception:  # a reset in progress, or the run completed between calls
            rec = None
        if rec is not None and pred(rec):
            return rec
        if loop.time() > deadline:
            return rec
        await asyncio.sleep(0.1)


class Driver:
    def __init__(self, client: Client, ledger: Ledger, fx: FixtureProcess, board: FaultBoard,
                 temporal: TemporalDevServer, server: ServerConfig, task_queue: str) -> None:
        self.client, self.ledger, self.fx, self.board = client, ledger, fx, board
        self.temporal, self.server, self.task_queue = temporal, server, task_queue

    def handle(self, run: Run) -> WorkflowHandle:
        return self.client.get_workflow_handle(run.key.workflow_id)

    async def commit(self, run: Run, kind: str, copies: int) -> None:
        await self.board.set("notify_copies", run.key.uri, copies)
        if kind == "delete":
            await self.fx.delete(run.key.uri)
            run.timeline.append((datetime.now(UTC), False))
            return
        run.version += 1
        result = await self.fx.edit(run.key.uri, text=f"{run.key.uri} version {run.version}")
        run.committed.append(result["committed"]["digest"])
        run.timeline.append((datetime.now(UTC), True))

    async def act(self, run: Run, a: Action) -> None:
        h = self.handle(run)
        uri = run.key.uri
        finished = run.closed_at is not None or run.revoked_at is not None or run.ended
        if a.kind == "pause":
            # Models the simulator's scheduling steps (activity completions, signal deliveries, timers)
            # that the real stack performs by itself: a short gap (at most 5 x 0.03 s) lets real
            # scheduling supply the interleaving. Not a wait for an outcome: nothing is asserted here.
            await asyncio.sleep(PAUSE_S * a.n)
        elif a.kind == "mutate" and run.exists or a.kind == "recreate" and not run.exists:
            await self.commit(run, "edit", a.n)
        elif a.kind == "delete" and run.exists:
            await self.commit(run, "delete", a.n)
        elif a.kind == "read_fault":
            switch, value = ("deny_reads", [run.key.subject]) if a.detail == "denied" else ("fail_reads",
                                                                                            -32603)
            await self.board.set(switch, uri, value)
            if a.detail == "denied":
                run.reasons.add("denied")
            await self.board.set("notify_copies", uri, 1)
            served = (await self.fx.stats())["reads"].get(uri, 0)
            await self.fx.notify(uri)  # make the workflow read while the switch is on
            # Witness instead of a pause: the server served a read of the URI after the notification
            # (under the switch), unless the subscription is in no state to read on a notification.
            await eventually(lambda: self.read_or_not_reading(h, uri, served), timeout=30, interval=0.05,
                             what=f"schedule {run.index}: the read the faulted notification causes")
            await self.board.set(switch, uri, None)
        elif finished or a.kind in ("mutate", "recreate", "delete"):
            return  # nothing to change; or the subscription already ended: only the oracle moves on
        elif a.kind == "close":
            run.reasons.add("close")
            if a.detail == "signal":
                await h.signal(SIGNAL_CLOSE, CloseRequest(reason="crosscheck close signal"))
                await _until(h, lambda r: r.state in TERMINAL, 30)
            else:
                await execute_update(h, UPDATE_CLOSE, [CloseRequest(reason="crosscheck close")],
                                     result_type=CloseReceipt)
            run.closed_at = datetime.now(UTC)
        elif a.kind == "old_note":
            rec = await _record(h)
            await h.signal(SIGNAL_RESOURCE_UPDATED, ResourceUpdated(
                uri=uri, session_generation=max(0, rec.session_generation - 1)))
        elif a.kind == "wrong_uri":
            rec = await _record(h)
            await h.signal(SIGNAL_RESOURCE_UPDATED, ResourceUpdated(
                uri=uri + "/other", session_generation=rec.session_generation))
        elif a.kind == "catalog":
            rec = await _record(h)
            measured = datetime.now(UTC) - timedelta(seconds=PAUSE_S * 2 * a.n)
            listed = run.existed_at(measured)
            proven = a.detail == "proven"
            if proven and not listed:
                run.reasons.add("catalog_unlisted")
            run.reasons.add("catalog")
            await h.signal(SIGNAL_CATALOG_RECONCILED, CatalogObservation(
                uri=uri, listed=listed, scan_id=unique("xscan"),
                snapshot_status="SNAPSHOT_PROVEN" if proven else "SNAPSHOT_UNPROVEN",
                session_generation=rec.session_generation, measured_at=measured))
        elif a.kind == "conflict":
            await h.signal(SIGNAL_IDENTITY_CONFLICT, IdentityConflict(
                observed_uri=uri.upper(), reason="crosscheck conflict"))
        elif a.kind == "resume":
            await self.resume(h)
        elif a.kind == "revoke":
            run.reasons.add("revoke")
            await h.signal(SIGNAL_REVOKE, RevokeRequest(reason="crosscheck revoke"))
            await _until(h, lambda r: r.state in TERMINAL, 30)
            run.revoked_at = datetime.now(UTC)
        elif a.kind == "reset":
            await self.reset(run, first=a.n == 0, reapply=a.detail == "reapply")

    async def read_or_not_reading(self, h: WorkflowHandle, uri: str, served: int) -> bool:
        """A read of ``uri`` was served since the server's count was ``served``, or the run cannot
        read on a notification now (it ended, is being reset, or is not watching)."""
        if (await self.fx.stats())["reads"].get(uri, 0) > served:
            return True
        try:
            rec = await _record(h)
        except Exception:  # the run completed, or a reset in progress: no read to wait for
            return True
        return rec.state not in READING

    async def final_read_done(self, run: Run, h: WorkflowHandle, seen: int) -> bool:
        """The final invalidation was recorded on the ledger row and no read is owed for it any more,
        or the run cannot read on it (see ``read_or_not_reading``)."""
        if await notifications_seen(self.ledger, run.key) > seen and await reads_settled(self.ledger,
                                                                                         run.key):
            return True
        try:
            rec = await _record(h)
        except Exception:
            return True
        return rec.state not in READING

    async def resume(self, h: WorkflowHandle) -> None:
        try:
            await asyncio.wait_for(execute_update(h, UPDATE_RESUME, [ResumeRequest(reason="crosscheck")],
                                                  result_type=ResourceSubscriptionV1), 30)
        except Exception:  # the validator refuses when not RECONCILIATION_REQUIRED: as in the simulator
            pass

    async def reset(self, run: Run, *, first: bool, reapply: bool) -> None:
        cmd = [str(temporal_cli_path()), "workflow", "reset", "--address", self.temporal.address,
               "--workflow-id", run.key.workflow_id, "--type",
               "FirstWorkflowTask" if first else "LastWorkflowTask", "--reason", "crosscheck rollback",
               "--yes"]
        if not reapply:
            cmd += ["--reapply-exclude", "Signal"]
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        _, err = await proc.communicate()
        if proc.returncode == 0:
            run.resets += 1
        else:
            run.notes.append(f"reset refused: {err.decode(errors='replace')[-200:]}")

    async def drive(self, run: Run) -> None:
        h = await start_subscription(self.client, run.key, task_queue=self.task_queue,
                                     options=SubscriptionOptions(max_history_events=150))
        first = run.committed[0]
        rec = await _until(h, lambda r: r.last_accepted_digest == first, 60)
        assert rec is not None and rec.last_accepted_digest == first, f"schedule {run.index}: no initial read"
        await self.fx.wait_subscribed(run.key.uri, timeout=30)
        for a in run.actions:
            try:
                await self.act(run, a)
            except Exception:
                # Signals and updates fail once the run completed (a denied read revoked it, say).
                if (await h.describe()).status != WorkflowExecutionStatus.COMPLETED:
                    raise
                run.ended = True
                run.notes.append(f"{a.kind}: the run had completed")
        await self.drain(run)

    async def drain(self, run: Run) -> None:
        """Quiet end: faults off, then resume / catalog word / the final notification (always once,
        as in the simulator: it also heals a row an orphaned activity of a reset run moved), until the
        workflow's view and the ledger row both match the oracle, or the run ended."""
        await self.board.clear(run.key.uri)
        h = self.handle(run)
        final_sent = False
        for _ in range(5):
            rec = await _until(h, lambda r: True, 10)
            if rec is None or rec.state in TERMINAL:
                break
            if final_sent and self.converged(run, rec) and self.converged(run, await self.row(run)):
                break
            if rec.state in (S.RECONCILIATION_REQUIRED, S.TOMBSTONE_PENDING):
                try:
                    await self.unblock(run, h, rec)
                except Exception:
                    # The run may complete between the query and the word (a catalog word the drive
                    # sent tombstoned it meanwhile): then there is nothing left to drain.
                    if (await h.describe()).status != WorkflowExecutionStatus.COMPLETED:
                        raise
                    break
            else:
                final_sent = True
                seen = await notifications_seen(self.ledger, run.key)
                await self.fx.notify(run.key.uri)  # the final invalidation
                # Witness instead of a pause: the ingress recorded it and the read it owes was judged.
                with suppress(AssertionError):  # not there in time: the checks below say what is wrong
                    await eventually(lambda s=seen: self.final_read_done(run, h, s), timeout=15,
                                     interval=0.05)
            await _until(h, lambda r: r.state in TERMINAL or self.converged(run, r), 15)
        rec = await _until(h, lambda r: True, 10)
        if rec is not None and rec.state in TERMINAL:
            await asyncio.wait_for(h.result(), 60)

    async def unblock(self, run: Run, h: WorkflowHandle, rec: ResourceSubscriptionV1) -> None:
        """The word a waiting state needs: resume a reconciliation, a catalog for a pending tombstone."""
        if rec.state == S.RECONCILIATION_REQUIRED:
            await self.resume(h)
            return
        run.reasons.add("catalog")
        await h.signal(SIGNAL_CATALOG_RECONCILED, CatalogObservation(
            uri=run.key.uri, listed=run.exists, scan_id=unique("xdrain"),
            snapshot_status="SNAPSHOT_UNPROVEN", session_generation=rec.session_generation,
            measured_at=datetime.now(UTC)))

    async def row(self, run: Run) -> ResourceSubscriptionV1:
        fence = await self.ledger.load_fence(run.key)
        assert fence.state is not None
        return ResourceSubscriptionV1(subject=run.key.subject, server=run.key.server, uri=run.key.uri,
                                      state=fence.state, last_accepted_digest=fence.last_accepted_digest)

    @staticmethod
    def converged(run: Run, rec: ResourceSubscriptionV1) -> bool:
        if run.exists:
            return rec.state == S.ACTIVE and rec.last_accepted_digest == run.committed[-1]
        return rec.state in (S.TOMBSTONE_PENDING, S.TOMBSTONED)


# --- the invariants, from the PostgreSQL ledger ---------------------------------------------------------


def _non_decreasing_commit_order(digests: Sequence[str], committed: Sequence[str]) -> bool:
    """Can each accepted digest be matched to a commit no older than the previous one's?"""
    at = 0
    for d in digests:
        later = [i for i, c in enumerate(committed) if c == d and i >= at]
        if not later:
            return False
        at = later[0]
    return True


async def violations(run: Run, ledger: Ledger, client: Client) -> list[str]:
    wf = run.key.workflow_id
    found: list[str] = []
    if run.exists:  # eventual convergence: allow a continue-as-new or a late notification to settle
        for _ in range(100):
            fence = await ledger.load_fence(run.key)
            if fence.state in TERMINAL or (fence.state == S.ACTIVE
                                           and fence.last_accepted_digest == run.committed[-1]):
                break
            await asyncio.sleep(0.2)
    (row,) = await ledger_rows(ledger, "SELECT state, close_ordinal, last_accepted_digest, "
                                       "last_issued_ordinal FROM subscriptions WHERE workflow_id=%s", wf)
    state, close_ordinal, digest, _ = S(row[0]), row[1], row[2], row[3]
    receipts = await ledger_rows(ledger, "SELECT receipt_id, read_ordinal, status, content_digest, "
                                         "accepted_at FROM resource_versions WHERE workflow_id=%s "
                                         "ORDER BY receipt_id", wf)
    advancing = [r for r in receipts if r[2] in ADVANCING]
    ordinals = [r[1] for r in advancing]
    if ordinals != sorted(set(ordinals)):
        found.append(f"ordinal_order: advancing receipts {ordinals}")
    accepted = [r[3] for r in advancing if r[2] in ("ACCEPTED", "UNCHANGED")]
    if any(d not in run.committed for d in accepted) or (digest is not None and digest not in run.committed):
        found.append("uncommitted_digest")
    if not _non_decreasing_commit_order(accepted, run.committed):
        found.append("version_regression: accepted digests go back in commit order")
    ended = [t for t in (run.closed_at, run.revoked_at) if t is not None]
    if ended:
        end = min(ended)
        late = [r for r in advancing if r[4] > end]
        if late:
            found.append(f"not_active_write: {[(r[1], r[2]) for r in late]} after the close/revocation "
                         "returned")
        outbox = await ledger_rows(ledger, "SELECT event_type, read_ordinal FROM outbox WHERE workflow_id=%s"
                                     " AND event_type <> 'revoked' AND created_at > %s", wf, end)
        if outbox:
            found.append(f"outbox_after_close: {outbox}")
    if close_ordinal is not None:
        past = await ledger_rows(ledger, "SELECT ordinal FROM read_requests WHERE workflow_id=%s "
                                         "AND ordinal > %s",
                           wf, close_ordinal)
        if past:
            found.append(f"ordinal past the close fence: {past}")
    legal = {S.CLOSED: {"close"}, S.UNSUBSCRIBE_UNKNOWN: {"close"}, S.TOMBSTONED: {"catalog"},
             S.REVOKED: {"revoke", "denied", "catalog_unlisted"}}
    if state in TERMINAL:
        if not legal[state] & run.reasons:
            found.append(f"terminal {state.value} without a reason in the schedule ({sorted(run.reasons)})")
        desc = await client.get_workflow_handle(wf).describe()
        if desc.status != WorkflowExecutionStatus.COMPLETED:
            found.append(f"no_convergence: ledger {state.value} but the run is {desc.status}")
    elif run.exists and (state != S.ACTIVE or digest != run.committed[-1]):
        fence = await ledger.load_fence(run.key)
        try:
            rec = await _record(client.get_workflow_handle(wf))
            view = (f"view {rec.state.value} gen {rec.session_generation}/{rec.subscription_generation} "
                    f"{rec.detail!r}")
        except Exception as exc:
            view = f"no view: {exc}"
        if os.environ.get("MCPSYNC_CROSSCHECK_DEBUG"):
            hist = await client.get_workflow_handle(wf).fetch_history()
            lines = []
            for ev in hist.events[-40:]:
                name = ev.activity_task_scheduled_event_attributes.activity_type.name
                lines.append(f"{ev.event_id} {ev.event_time.ToDatetime():%H:%M:%S.%f} {ev.event_type} {name}")
            desc = await client.get_workflow_handle(wf).describe()
            lines.append(str(desc.raw_description.pending_activities))
            lines.append(f"checked at {datetime.now(UTC):%H:%M:%S.%f}")
            Path(f"/tmp/xcheck-{run.index}.txt").write_text("\n".join(lines + run.notes))
        found.append(f"no_convergence: {state.value} {str(digest)[:19]} vs oracle "
                     f"{run.committed[-1][:19]}; ledger gen "
                     f"{fence.session_generation}/{fence.subscription_generation}; {view}")
    elif not run.exists and state not in (S.TOMBSTONE_PENDING, S.TOMBSTONED):
        found.append(f"no_convergence: deleted at the oracle but {state.value}")
    return found


# --- the test ---------------------------------------------------------------------------------------------


async def test_simulated_schedules_keep_their_invariants_on_the_real_stack(
        temporal_client: Client, ledger: Ledger, temporal_server: TemporalDevServer,
        spare_fixtures: SpareFixtures) -> None:
    seed = "crosscheck"
    server_name = unique("xfx")
    runs: list[Run] = []
    only = os.environ.get("MCPSYNC_CROSSCHECK_ONLY")  # one schedule index, to debug a failure
    for i in [int(only)] if only else range(SCHEDULES):
        sim = run_schedule(schedule_seed(seed, i), CROSSCHECK_CONFIG)
        assert not sim.violations, (i, sim.violations)  # the simulator's own verdict on the same schedule
        key = SubscriptionKey(subject="alice", server=server_name, uri=f"demo://xcheck/{unique('s')}/{i}")
        runs.append(Run(i, key, real_actions(sim.events)))
    kinds = {a.kind for r in runs for a in r.actions}
    if SCHEDULES >= 30 and not only:
        assert {"mutate", "delete", "close", "reset", "catalog", "conflict", "revoke",
                "read_fault"} <= kinds, kinds

    fx = await spare_fixtures.take()
    try:
        server = ServerConfig(name=server_name, transport="http", url=fx.mcp_url, subjects=["alice"],
                              ping_interval_seconds=1, ping_timeout_seconds=5)
        board = FaultBoard(fx)
        async with running_services(temporal_client, ledger, [server]) as cfg:
            driver = Driver(temporal_client, ledger, fx, board, temporal_server, server,
                            cfg.temporal.task_queue)
            gate = asyncio.Semaphore(CONCURRENCY)

            async def one(run: Run) -> list[str]:
                async with gate:
                    created = await fx.create(run.key.uri, text=f"{run.key.uri} version 0")
                    run.committed.append(created["committed"]["digest"])
                    run.timeline.append((datetime.now(UTC), True))
                    try:
                        await driver.drive(run)
                    except Exception as exc:  # report which schedule, with its trace, not just the error
                        return [f"driver error: {type(exc).__name__}: {exc}"]
                    return await violations(run, ledger, temporal_client)

            results = await asyncio.gather(*(one(r) for r in runs))
    finally:
        await fx.stop()
    finals = [(await ledger_rows(ledger, "SELECT state FROM subscriptions WHERE workflow_id=%s",
                                 r.key.workflow_id))[0][0]
              for r in runs]
    counts: dict[str, int] = {}
    for r in runs:
        for act in r.actions:
            counts[act.kind] = counts.get(act.kind, 0) + 1
    print(f"\ncrosscheck: {SCHEDULES} schedules, actions {dict(sorted(counts.items()))}, "
          f"resets applied {sum(r.resets for r in runs)}, final states "
          f"{ {s: finals.count(s) for s in sorted(set(finals))} }, notes {sum(len(r.notes) for r in runs)}")
    failures = {r.index: (v, [f"{a.kind}{a.n or ''}{a.detail}" for a in r.actions if a.kind != "pause"],
                          r.notes) for r, v in zip(runs, results, strict=True) if v}
    resets = sum(r.resets for r in runs)
    terminal = sum(1 for r in runs if r.reasons & {"close", "revoke", "denied"})
    assert not failures, failures
    assert only or resets >= SCHEDULES // 10, f"only {resets} resets took effect"
    assert only or SCHEDULES < 10 or 0 < terminal < SCHEDULES, terminal


@pytest.mark.parametrize(("digests", "ok"), [(["a", "b", "b", "c"], True), (["c", "b"], False),
                                             (["a", "c", "a"], True), (["x"], False)])
def test_commit_order_check(digests: list[str], ok: bool) -> None:
    # "a" was committed again after "c" (deleted and restored with the same body).
    assert _non_decreasing_commit_order(digests, ["a", "b", "c", "a"]) is ok
