"""Temporal Cloud's billable actions, counted from workflow histories.

Contract:
- ``RULES`` is the one table of which history events Temporal Cloud bills, as what (Cloud's usage
  metric name, :class:`Action`) and how many; every event type not in it is not billed. Its source is
  Temporal's page "Temporal Cloud Actions" (https://docs.temporal.io/cloud/actions; in the
  temporalio/documentation repository docs/evaluate/cloud/actions.mdx), read 2026-12-07. That page
  calls a count from histories an estimate: ``NOT_IN_HISTORY`` lists what Cloud bills that leaves no
  history event, so a count from histories leaves it out.
- :func:`count_run` counts one run's events (optionally only those stamped within a wall-clock window)
  into a :class:`Tally`: history events by type, and actions by :class:`Action` (in a reset run, the
  events before the reset are the base run's: in the history, billed to the base run). Tallies add up (``+``)
  over runs and workflows; ``Tally.actions_total`` is the billable count.
- Replays are not billed (the page says so) and are not in a history: nothing to subtract.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent

__all__ = ["CHANGE_VERSION_SEARCH_ATTRIBUTE", "NOT_IN_HISTORY", "PRICES_USD_PER_MILLION", "RULES", "Action",
           "Rule", "Tally", "count_run", "event_type_name"]

CHANGE_VERSION_SEARCH_ATTRIBUTE = "TemporalChangeVersion"
"""The search attribute an SDK upserts for a patch: exempt from the upsert action."""


class Action(StrEnum):
    """Temporal Cloud's usage metric name of each billable action a history shows."""

    START_WORKFLOW = "start_workflow"
    CONTINUE_AS_NEW = "continue_as_new_workflow"
    START_CHILD_WORKFLOW = "start_child_workflow"
    UPSERT_SEARCH_ATTRIBUTES = "upsert_workflow_search_attributes"
    UPDATE_WORKFLOW_OPTIONS = "update_workflow_options"
    RESET_WORKFLOW = "reset_workflow"
    SCHEDULE_ACTIVITY = "schedule_activity"
    RETRY_ACTIVITY = "retry_activity"
    RECORD_MARKERS = "record_activity_markers"
    RETRY_LOCAL_ACTIVITY = "retry_activity_local"
    START_TIMER = "start_timer"
    SIGNAL_WORKFLOW = "signal_workflow"
    ACCEPT_UPDATE = "accept_workflow_update"
    SCHEDULE_NEXUS_OPERATION = "schedule_nexus_operation"
    CANCEL_NEXUS_OPERATION = "request_nexus_operation_cancellation"


def _one(_: HistoryEvent) -> int:
    return 1


def _started(ev: HistoryEvent) -> int:
    # A run continued as new is billed once, as its predecessor's continue-as-new event.
    return 0 if ev.workflow_execution_started_event_attributes.continued_execution_run_id else 1


def _upsert(ev: HistoryEvent) -> int:
    fields = set(ev.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields)
    return 0 if fields <= {CHANGE_VERSION_SEARCH_ATTRIBUTE} else 1


def _retries(ev: HistoryEvent) -> int:
    return max(0, ev.activity_task_started_event_attributes.attempt - 1)


def _local_retries(ev: HistoryEvent) -> int:
    metering = ev.workflow_task_completed_event_attributes.metering_metadata
    return metering.nonfirst_local_activity_execution_attempts


def _reset(ev: HistoryEvent) -> int:
    cause = ev.workflow_task_failed_event_attributes.cause
    return 1 if cause == WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW else 0


def _marker_task(ev: HistoryEvent) -> int:
    return ev.marker_recorded_event_attributes.workflow_task_completed_event_id


@dataclass(frozen=True)
class Rule:
    """How one billed event type counts: ``actions`` per event, or once per ``once_per`` key."""

    action: Action
    actions: Callable[[HistoryEvent], int]
    note: str
    once_per: Callable[[HistoryEvent], int] | None = None


RULES: dict[EventType.ValueType, Rule] = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED: Rule(
        Action.START_WORKFLOW, _started,
        "a client start (Update-with-Start: one, plus the update), a child's start; 0 for a run started "
        "by continue-as-new (billed as the predecessor's continue-as-new)"),
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW: Rule(Action.CONTINUE_AS_NEW, _one, "1"),
    EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED: Rule(
        Action.START_CHILD_WORKFLOW, lambda _: 2, "2: the recorded intent and the start"),
    EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES: Rule(
        Action.UPSERT_SEARCH_ATTRIBUTES, _upsert,
        "1 per upsert command, however many attributes; 0 for an upsert of TemporalChangeVersion alone"),
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_OPTIONS_UPDATED: Rule(Action.UPDATE_WORKFLOW_OPTIONS, _one, "1"),
    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED: Rule(
        Action.RESET_WORKFLOW, _reset,
        "1 for a reset (cause RESET_WORKFLOW), else 0; the run's events before it are the base run's"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: Rule(Action.SCHEDULE_ACTIVITY, _one, "1"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED: Rule(Action.RETRY_ACTIVITY, _retries, "attempt - 1"),
    EventType.EVENT_TYPE_MARKER_RECORDED: Rule(
        Action.RECORD_MARKERS, _one,
        "1 per workflow task that recorded any marker, not 1 per marker (the page: all RecordMarker commands "
        "of one workflow task, i.e. its local activities and patch markers, are one action)",
        once_per=_marker_task),
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED: Rule(
        Action.RETRY_LOCAL_ACTIVITY, _local_retries,
        "metering_metadata.nonfirst_local_activity_execution_attempts (a task itself is not billed)"),
    EventType.EVENT_TYPE_TIMER_STARTED: Rule(Action.START_TIMER, _one, "1"),
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED: Rule(
        Action.SIGNAL_WORKFLOW, _one, "1 (a signal from another workflow is billed here, not at the sender)"),
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED: Rule(Action.ACCEPT_UPDATE, _one, "1"),
    EventType.EVENT_TYPE_NEXUS_OPERATION_SCHEDULED: Rule(Action.SCHEDULE_NEXUS_OPERATION, _one, "1"),
    EventType.EVENT_TYPE_NEXUS_OPERATION_CANCEL_REQUESTED: Rule(Action.CANCEL_NEXUS_OPERATION, _one, "1"),
}

NOT_IN_HISTORY: tuple[str, ...] = (
    "query_workflow: every query (mcpsync's answer gate and `up` query; the subscription cycle does not)",
    "record_activity_heartbeat: an activity heartbeat that reaches the server (mcpsync's MCP activities "
    "heartbeat while they run)",
    "reject_workflow_update: a rejected update (never written to history)",
    "a workflow task heartbeat of a long local activity (one more action each)",
    "signal-with-start: one action in all (mcpsync does not use it; a history would show a start and a "
    "signal, counted as two)",
    "schedules, history export, fairness, provisioned capacity",
)


PRICES_USD_PER_MILLION: tuple[float, ...] = (50.0, 25.0)
"""Temporal Cloud's action price, list and at volume (https://temporal.io/pricing, late 2026; the price
falls with a namespace's monthly volume: check it before budgeting)."""


def event_type_name(t: EventType.ValueType) -> str:
    return EventType.Name(t).removeprefix("EVENT_TYPE_")


@dataclass
class Tally:
    """History events by type and billable actions by :class:`Action`, over one or more runs."""

    events_by_type: Counter[str] = field(default_factory=Counter)
    actions: Counter[Action] = field(default_factory=Counter)

    @property
    def events(self) -> int:
        return sum(self.events_by_type.values())

    def of(self, t: EventType.ValueType) -> int:
        """The events of type ``t``."""
        return self.events_by_type[event_type_name(t)]

    @property
    def actions_total(self) -> int:
        return sum(self.actions.values())

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.events_by_type + other.events_by_type, self.actions + other.actions)

    def scaled(self, factor: float) -> Tally:
        """Every count times ``factor``, rounded: a sample's tally standing for a larger population."""
        return Tally(Counter({k: round(v * factor) for k, v in self.events_by_type.items()}),
                     Counter({k: round(v * factor) for k, v in self.actions.items()}))


def count_run(events: Iterable[HistoryEvent], t0: float | None = None, t1: float | None = None) -> Tally:
    """One run's events (those stamped within [t0, t1], wall-clock seconds, when given) by type, and
    their billable actions under ``RULES``."""
    evs = list(events)
    reset_at = next((i for i, ev in enumerate(evs)
                     if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED and _reset(ev)), 0)
    out = Tally()
    seen: set[tuple[EventType.ValueType, int]] = set()
    for i, ev in enumerate(evs):
        at = ev.event_time.seconds + ev.event_time.nanos / 1e9
        if (t0 is not None and at < t0) or (t1 is not None and at > t1):
            continue
        out.events_by_type[event_type_name(ev.event_type)] += 1
        rule = RULES.get(ev.event_type)
        if rule is None or i < reset_at:  # before a reset: the base run's events, billed there
            continue
        if rule.once_per is not None:
            key = (ev.event_type, rule.once_per(ev))
            if key in seen:
                continue
            seen.add(key)
        n = rule.actions(ev)
        if n:
            out.actions[rule.action] += n
    return out
