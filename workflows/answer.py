"""AnswerWorkflow (one per answer id): the Temporal driver of the answer freshness gate.

Contract:
- A thin driver over ``mcpsync.workflows.answer_rules`` (``AnswerTracker``, ``judge_answer``):
  updates ``bind``, ``select_input``, ``check`` (snapshot activity, then ``judge_answer``; every
  disposition is persisted), query ``answer`` -> ``answerBinding.v1``; wire names in
  ``mcpsync.workflows.names``, workflow id ``answer_workflow_id``. Its state lives in
  PostgreSQL too: a new run (after idling out, or a reset) reloads it.
- Activities never import this module (tests/unit/test_layers.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

from temporalio import workflow
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from mcpsync.workflows.answer_rules import (
        AnswerBindingV1,
        AnswerKeyRequest,
        AnswerStart,
        AnswerState,
        AnswerTracker,
        BindLedgerRequest,
        BindRequest,
        BoundAnswer,
        CheckRequest,
        Disposition,
        InputSelection,
        LoadedAnswer,
        ObservationSnapshot,
        RecordDispositionRequest,
        SelectInputRequest,
        SelectLedgerRequest,
        Verdict,
        iso_ms,
    )
    from mcpsync.workflows.names import (
        ANSWER_WORKFLOW_TYPE,
        QUERY_ANSWER,
        SA_ANSWER_STATE,
        UPDATE_BIND,
        UPDATE_CHECK,
        UPDATE_SELECT_INPUT,
        AnswerAct,
    )
    from mcpsync.workflows.retries import LEDGER_RETRY

__all__ = ["AnswerWorkflow"]


_LEDGER_RETRY = replace(LEDGER_RETRY, non_retryable_error_types=["InvalidBinding", "InvalidSelection"])
_LEDGER_TIMEOUT = timedelta(seconds=30)
KEY_STATE = SearchAttributeKey.for_keyword(SA_ANSWER_STATE)


@workflow.defn(name=ANSWER_WORKFLOW_TYPE)
class AnswerWorkflow:
    @workflow.init
    def __init__(self, start: AnswerStart) -> None:
        state = AnswerState(answer_id=start.answer_id)
        if start.carried_state is not None:
            state = AnswerState.model_validate(start.carried_state)
        self.tracker = AnswerTracker(state)
        self.answer_id = start.answer_id
        self.lock = asyncio.Lock()
        self.loaded = start.carried_state is not None
        self.touched = False

    # --- handlers ------------------------------------------------------------------------------

    @workflow.update(name=UPDATE_BIND)
    async def bind(self, req: BindRequest) -> AnswerBindingV1:
        async with self.lock:
            await self._ready()
            request = BindLedgerRequest(request_id=str(workflow.uuid4()),
                                        workflow_id=workflow.info().workflow_id, bind=req)
            result = await self._ledger(AnswerAct.BIND, request, BoundAnswer)
            self.tracker.rebound(req, result)
            self._publish()
            return self.tracker.record()

    @bind.validator
    def _validate_bind(self, req: BindRequest) -> None:
        self._same_answer(req.answer_id)

    @workflow.update(name=UPDATE_SELECT_INPUT)
    async def select_input(self, req: SelectInputRequest) -> AnswerBindingV1:
        async with self.lock:
            await self._ready()
            self._require_bound()
            dep = self.tracker.dependency(req.uri)
            if dep is None:
                raise ApplicationError(f"{req.uri!r} is not a dependency of answer {self.answer_id!r}",
                                       type="InvalidSelection", non_retryable=True)
            selection = await self._ledger(AnswerAct.SELECT, SelectLedgerRequest(
                request_id=str(workflow.uuid4()), answer_id=self.answer_id, revision=self.tracker.s.revision,
                dependency=dep.model_copy(update={"receipt_id": req.receipt_id})), InputSelection)
            self.tracker.selected(selection)
            self._publish()
            return self.tracker.record()

    @select_input.validator
    def _validate_select(self, req: SelectInputRequest) -> None:
        self._same_answer(req.answer_id)

    @workflow.update(name=UPDATE_CHECK)
    async def check(self, req: CheckRequest) -> Disposition:
        async with self.lock:
            await self._ready()
            self._require_bound()
            snapshot = await self._ledger(AnswerAct.OBSERVE, self.tracker.observe_request(),
                                          ObservationSnapshot)
            disposition = self.tracker.judge(snapshot, req.policy)
            stored = await self._ledger(AnswerAct.RECORD, RecordDispositionRequest(
                request_id=str(workflow.uuid4()), disposition=disposition), int)
            disposition = self.tracker.judged(disposition, stored)
            self._publish()
            return disposition

    @check.validator
    def _validate_check(self, req: CheckRequest) -> None:
        self._same_answer(req.answer_id)

    @workflow.query(name=QUERY_ANSWER)
    def answer(self) -> AnswerBindingV1:
        return self.tracker.record()

    # --- main loop -------------------------------------------------------------------------------

    @workflow.run
    async def run(self, start: AnswerStart) -> AnswerBindingV1:
        if start.carried_state is None:
            loaded = await self._ledger(AnswerAct.LOAD, AnswerKeyRequest(answer_id=self.answer_id),
                                        LoadedAnswer, allow_none=True)
            if loaded is not None:
                self.tracker.adopt(loaded)
            self.loaded = True
        self._publish()
        idle = timedelta(seconds=start.idle_seconds)
        while True:
            await workflow.wait_condition(workflow.all_handlers_finished)
            if not self.tracker.bound:
                break  # started by a select/check for an answer nobody bound: nothing to keep
            self.touched = False
            try:
                await workflow.wait_condition(lambda: self.touched or self._continue_as_new_due(),
                                              timeout=idle)
            except TimeoutError:
                await workflow.wait_condition(workflow.all_handlers_finished)
                if not self.touched:
                    # idle: everything is in PostgreSQL; the next update starts a new run that reloads it
                    break
                continue
            if self._continue_as_new_due():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(AnswerStart(
                    answer_id=self.answer_id, idle_seconds=start.idle_seconds,
                    carried_state=self.tracker.s.model_dump(mode="json")))
        return self.tracker.record()

    # --- plumbing ----------------------------------------------------------------------------------

    def _same_answer(self, answer_id: str) -> None:
        if answer_id != self.answer_id:
            raise ValueError(f"this workflow is answer {self.answer_id!r}, not {answer_id!r}")

    async def _ready(self) -> None:
        self.touched = True
        await workflow.wait_condition(lambda: self.loaded)

    def _require_bound(self) -> None:
        if not self.tracker.bound:
            raise ApplicationError(f"answer {self.answer_id!r} is not bound: bind it first", type="NotBound",
                                   non_retryable=True)

    def _continue_as_new_due(self) -> bool:
        info = workflow.info()
        return info.is_continue_as_new_suggested() or info.get_current_history_length() >= 10_000

    async def _ledger(self, name: str, arg: object, result_type: type, *, allow_none: bool = False):  # type: ignore[no-untyped-def]
        try:
            result = await workflow.execute_activity(name, arg, result_type=result_type,
                                                     start_to_close_timeout=_LEDGER_TIMEOUT,
                                                     retry_policy=_LEDGER_RETRY)
        except ActivityError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.type in ("InvalidBinding", "InvalidSelection"):
                # The host's request was wrong, not the workflow: fail this update only.
                raise ApplicationError(cause.message, type=cause.type, non_retryable=True) from None
            raise
        if result is None and not allow_none:
            raise RuntimeError(f"{name} returned nothing")
        return result

    def _publish(self) -> None:
        s = self.tracker.s
        d = s.disposition
        state = "UNBOUND" if not self.tracker.bound else (d.verdict.value if d is not None else "BOUND")
        workflow.upsert_search_attributes([KEY_STATE.value_set(state)])
        lines = [f"**{state}** answer `{s.answer_id}` revision {s.revision}", "",
                 "| dependency | bound | selected | latest | conditions |", "|---|---|---|---|---|"]
        latest = {x.uri: x for x in d.dependencies} if d is not None and d.revision == s.revision else {}
        for dep in s.dependencies:
            sel = s.selections.get(dep.uri)
            j = latest.get(dep.uri)
            lines.append(f"| `{dep.uri}` | {dep.receipt_id} | {sel.receipt_id if sel else dep.receipt_id} | "
                         f"{j.latest_receipt_id if j else '-'} | "
                         f"{', '.join(c.value for c in j.conditions) if j and j.conditions else '-'} |")
        if d is not None:
            lines += ["", f"check #{d.sequence} at {iso_ms(d.checked_at)}: {d.reason}"]
            if d.verdict == Verdict.ACCEPT:
                lines.append(f"evidence window {iso_ms(d.evidence_from)} → {iso_ms(d.evidence_to)}, "
                             f"receipts {d.receipt_ids}")
        workflow.set_current_details("\n".join(lines))
