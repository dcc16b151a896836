"""CatalogWorkflow (one per subject+server): the Temporal driver of the catalog rules.

Contract:
- A thin driver: every decision is ``mcpsync.workflows.catalog_rules`` (``CatalogReconciler``,
  ``judge_pair``); this module turns them into activities (scans on the session host's queue,
  ledger on the main queue), timers with deterministic jitter (``workflow.random``), signals,
  the ``reconcile`` update, the ``catalog`` / ``scans`` queries and the McpCatalogState search
  attribute. Activities never import this module (tests/unit/test_layers.py).
- Under worker versioning ``CatalogWorkflow`` runs PINNED to its build (``mcpsync.workflows.versioning``)
  and continues-as-new onto the deployment's current build when that changes, between
  reconciliations only.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from mcpsync.workflows.catalog_rules import (
        AutoSubscribeRequest,
        CatalogPhase,
        CatalogReconciler,
        CatalogState,
        CatalogView,
        NotifyRequest,
        NotifyResult,
        PublishOutcome,
        PublishRequest,
        ScanRequest,
        judge_pair,
    )
    from mcpsync.workflows.names import (
        CATALOG_WORKFLOW_TYPE,
        QUERY_CATALOG,
        QUERY_SCANS,
        SA_CATALOG_STATE,
        SIGNAL_LIST_CHANGED,
        SIGNAL_RECONCILE,
        UPDATE_RECONCILE,
        Act,
        CatalogAct,
    )
    from mcpsync.workflows.records.catalog import (
        CatalogSnapshot,
        CatalogStart,
        ListChanged,
        ResourceDiscoveryScanV1,
        RolloutMode,
        RolloutPolicy,
    )
    from mcpsync.workflows.records.ledger import SessionQuery
    from mcpsync.workflows.records.subscription import SessionInfo
    from mcpsync.workflows.retries import LEDGER_RETRY
    from mcpsync.workflows.versioning import target_version_changed, upgrade_behavior

__all__ = ["CatalogWorkflow"]


_LEDGER_TIMEOUT = timedelta(seconds=60)
_SCAN_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=500), maximum_interval=timedelta(seconds=5),
                          maximum_attempts=3)
_SCAN_SCHEDULE_TO_START = timedelta(seconds=30)  # no session host polling its queue: look again
_SCAN_START_TO_CLOSE = timedelta(minutes=10)
_SCAN_HEARTBEAT = timedelta(seconds=60)
KEY_STATE = SearchAttributeKey.for_keyword(SA_CATALOG_STATE)


@workflow.defn(name=CATALOG_WORKFLOW_TYPE)
class CatalogWorkflow:
    @workflow.init
    def __init__(self, start: CatalogStart) -> None:
        if start.carried_state is not None:  # the new run's policy replaces the carried one
            state = CatalogState.model_validate({**start.carried_state, "policy": start.policy})
        else:
            state = CatalogState(key=start.key, policy=start.policy)
        self.rec = CatalogReconciler(state)
        self.key = start.key
        self.last_published: tuple[object, ...] = ()

    # --- handlers --------------------------------------------------------------------

    @workflow.signal(name=SIGNAL_LIST_CHANGED)
    def list_changed(self, sig: ListChanged) -> None:
        self.rec.note_list_changed(sig)
        self._publish()

    @workflow.signal(name=SIGNAL_RECONCILE)
    def reconcile_signal(self, reason: str) -> None:
        self.rec.request(reason or "requested")

    @workflow.update(name=UPDATE_RECONCILE)
    async def reconcile(self, reason: str) -> CatalogSnapshot | None:
        """Ask for a reconciliation; returns the first catalog published (and acted on) from one started
        after it."""
        self.rec.request(reason or "requested")
        started = self.rec.s.reconciliations_started
        await workflow.wait_condition(lambda: self.rec.s.settled_from > started)
        return self.rec.s.last_catalog

    @workflow.query(name=QUERY_CATALOG)
    def catalog(self) -> CatalogView:
        return self.rec.view()

    @workflow.query(name=QUERY_SCANS)
    def scans(self) -> list[ResourceDiscoveryScanV1]:
        return list(self.rec.s.recent_scans)

    # --- main loop -------------------------------------------------------------------

    @workflow.run
    async def run(self, start: CatalogStart) -> None:
        s = self.rec.s
        self._publish()
        while True:
            if self._continue_as_new_due():
                workflow.continue_as_new(CatalogStart(key=self.key, policy=s.policy,
                                                      carried_state=s.model_dump(mode="json")),
                                         initial_versioning_behavior=upgrade_behavior())
            if not s.wanted:
                s.phase = CatalogPhase.IDLE
                self._publish()
                wait = self.rec.seconds_until_review(workflow.now())
                try:
                    if wait <= 0:
                        raise TimeoutError
                    await workflow.wait_condition(lambda: s.wanted or self._continue_as_new_due(),
                                                  timeout=timedelta(seconds=wait))
                except TimeoutError:
                    self.rec.request("periodic")
                continue
            query = SessionQuery(subject=self.key.subject, server=self.key.server)
            session = await self._ledger(Act.CURRENT_SESSION, query, SessionInfo, allow_none=True)
            if session is None:
                s.phase = CatalogPhase.NO_SESSION
                s.detail = "no live MCP session for this subject and server"
                self._publish()
                await workflow.sleep(timedelta(seconds=s.policy.session_recheck_seconds))
                continue
            self.rec.bind_session(session)
            if not await self._reconcile(session):
                delay = self.rec.backoff_seconds()
                self._publish()
                if delay > 0:
                    await workflow.sleep(timedelta(seconds=delay))

    def _continue_as_new_due(self) -> bool:
        # Between reconciliations only, and never while a handler (a ``reconcile`` update
        # waiting for this loop) is still running: it would never finish. A new current build
        # (worker versioning) moves the run there the same way.
        return ((workflow.info().is_continue_as_new_suggested() or target_version_changed())
                and workflow.all_handlers_finished())

    async def _reconcile(self, session: SessionInfo) -> bool:
        """One A/B reconciliation; False if it had to restart."""
        s = self.rec.s
        s.rollout = await self._ledger(CatalogAct.ROLLOUT, self.key, RolloutPolicy)
        self.rec.begin(str(workflow.uuid4()))
        self._publish()
        scans: list[ResourceDiscoveryScanV1] = []
        for label in ("A", "B"):
            scan = await self._scan(session, label)  # type: ignore[arg-type]
            if scan is None:
                self.rec.restart(f"scan {label} could not run on the session host")
                return False
            reason = self.rec.scan_finished(scan)
            self._publish()
            if reason is not None:
                self.rec.restart(reason)
                return False
            scans.append(scan)
        a, b = scans
        verdict = judge_pair(a, b)
        if not verdict.match:
            self.rec.restart(verdict.reason)
            return False
        next_review, bound = self.rec.schedule(workflow.now(), a, b, workflow.random().random())
        assert s.rollout is not None and s.reconciliation_id is not None
        out = await self._ledger(CatalogAct.PUBLISH, PublishRequest(
            key=self.key, reconciliation_id=s.reconciliation_id, scan_a=a.scan_id, scan_b=b.scan_id,
            next_review_at=next_review, staleness_bound_seconds=bound, rollout_mode=s.rollout.mode,
        ), PublishOutcome)
        if not out.published or out.catalog is None:
            self.rec.restart(f"ledger refused the catalog: {out.reason}")
            return False
        self.rec.published(out.catalog, b)
        self._publish()
        if s.policy.signal_subscriptions:
            notify = NotifyRequest(catalog=out.catalog, rollout=s.rollout)
            s.last_notify = await self._ledger(CatalogAct.NOTIFY, notify, NotifyResult)
        if s.policy.auto_subscribe_prefixes and out.catalog.added:
            s.auto_subscribed += await self._ledger(CatalogAct.AUTO_SUBSCRIBE, AutoSubscribeRequest(
                catalog=out.catalog, rollout=s.rollout, prefixes=s.policy.auto_subscribe_prefixes), int)
        s.settled_from = s.published_from
        self._publish()
        return True

    async def _scan(self, session: SessionInfo, label: Literal["A", "B"]) -> ResourceDiscoveryScanV1 | None:
        s = self.rec.s
        assert s.reconciliation_id is not None
        req = ScanRequest(key=self.key, reconciliation_id=s.reconciliation_id, scan_id=str(workflow.uuid4()),
                          label=label, session_generation=session.generation, page_cap=s.policy.page_cap)
        try:
            return await workflow.execute_activity(
                CatalogAct.SCAN, req, result_type=ResourceDiscoveryScanV1, task_queue=session.task_queue,
                schedule_to_start_timeout=_SCAN_SCHEDULE_TO_START, heartbeat_timeout=_SCAN_HEARTBEAT,
                start_to_close_timeout=_SCAN_START_TO_CLOSE, retry_policy=_SCAN_RETRY)
        except ActivityError as err:
            s.detail = f"scan {label} failed: {type(err.cause).__name__}"
            return None

    # --- plumbing --------------------------------------------------------------------

    async def _ledger(self, name: str, arg: object, result_type: type, *, allow_none: bool = False):  # type: ignore[no-untyped-def]
        result = await workflow.execute_activity(name, arg, result_type=result_type,
                                                 start_to_close_timeout=_LEDGER_TIMEOUT,
                                                 retry_policy=LEDGER_RETRY)
        if result is None and not allow_none:
            raise RuntimeError(f"{name} returned nothing")
        return result

    def _publish(self) -> None:
        """McpCatalogState and the Web UI's current-details panel, only when they change."""
        s = self.rec.s
        status = self.rec.status
        c = s.last_catalog
        snapshot = (status, s.phase, c.catalog_id if c else None, s.restarts_total, s.list_changed_signals,
                    s.detail, s.reconciliations_started)
        if snapshot == self.last_published:
            return
        self.last_published = snapshot
        workflow.upsert_search_attributes([KEY_STATE.value_set(status)])
        lines = [f"**{status}** catalog of `{self.key.subject}` on `{self.key.server}`", "",
                 "| catalog | value |", "|---|---|", f"| phase | {s.phase.value} |"]
        if c is not None:
            lines += [
                f"| last catalog | #{c.catalog_id} {c.status.value} ({c.status_reason or '-'}) |",
                f"| resources / templates | {c.resource_count} / {c.template_count} |",
                f"| added / removed / changed | {c.added} / {c.removed} / {c.changed} |",
                f"| measured at | {c.measured_at.isoformat(timespec='seconds')} |",
                f"| staleness bound | {c.staleness_bound_seconds:.0f} s |",
                f"| next review | {c.next_review_at.isoformat(timespec='seconds')} |",
                f"| uri set digest | `{c.uri_set_digest[:23]}` |",
            ]
        lines += [
            f"| session generation | {s.session_generation} (listChanged: {s.list_changed_capable}) |",
            f"| reconciliations / published / restarts | {s.reconciliations_started} / {s.catalogs_published}"
            f" / {s.restarts_total} |",
            f"| list_changed signals | {s.list_changed_signals} |",
            f"| rollout | {s.rollout.mode.value if s.rollout else '-'}"
            f"{f' {s.rollout.percent:g}%' if s.rollout and s.rollout.mode == RolloutMode.PERCENT else ''} |",
        ]
        for scan in s.recent_scans[-2:]:
            lines.append(f"| scan {scan.label} `{scan.scan_id[:8]}` | {scan.status.value}, "
                         f"{scan.page_count} pages, {scan.resource_count} URIs, "
                         f"list_changed {scan.notifications_observed} |")
        if s.restart_reasons:
            lines.append(f"| last restart | {s.restart_reasons[-1][:120]} |")
        if s.detail:
            lines += ["", s.detail]
        workflow.set_current_details("\n".join(lines))
