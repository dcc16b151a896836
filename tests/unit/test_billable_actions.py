"""Temporal Cloud's billable actions counted from histories (``benchmarks.actions``).

The recorded 0.2.0 histories are real runs; each expected count below is read off the history's
events by hand (event ids in the comments), not computed by the code under test. The synthetic events
cover the rules no recorded history exercises (retries, a patch's search attribute, nexus).
"""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType as ET
from temporalio.api.history.v1 import HistoryEvent

from benchmarks.actions import CHANGE_VERSION_SEARCH_ATTRIBUTE, RULES, Tally, count_run
from benchmarks.actions import Action as A
from tests.histories.corpus import HISTORY_DIR, load

CORPUS = HISTORY_DIR / "0.2.0"


def _events(name: str) -> list[HistoryEvent]:
    return list(load(CORPUS / f"{name}.json").events)


def _at(ev: HistoryEvent) -> float:
    return ev.event_time.seconds + ev.event_time.nanos / 1e9


def test_a_continued_run_bills_each_signal_and_upsert_and_one_action_for_its_local_activities() -> None:
    t = count_run(_events("subscription-continue-as-new"))
    assert t.events == 107
    # 1 started; 5-7: three local-activity markers of the task completed at 4 (one action); upserts at 8,
    # 15 and 21..106 every 5th (20); activity 9; timer 16; resource_read signals 17..102 every 5th (18);
    # continue-as-new 107. Workflow tasks (20 x 3 events) and the activity's start and completion: free.
    assert t.actions == {A.START_WORKFLOW: 1, A.RECORD_MARKERS: 1, A.UPSERT_SEARCH_ATTRIBUTES: 20,
                         A.SCHEDULE_ACTIVITY: 1, A.START_TIMER: 1, A.SIGNAL_WORKFLOW: 18,
                         A.CONTINUE_AS_NEW: 1}
    assert t.actions_total == 43
    assert t.of(ET.EVENT_TYPE_WORKFLOW_TASK_COMPLETED) == 20 and t.of(ET.EVENT_TYPE_MARKER_RECORDED) == 3


def test_a_window_counts_only_the_events_stamped_in_it() -> None:
    events = _events("subscription-continue-as-new")
    first_signal = events[16]
    assert (first_signal.event_id, first_signal.event_type) == (17, ET.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
    t = count_run(events, _at(first_signal), _at(events[-1]))
    # Events 17..107: the 18 signals, the upserts 21..106 (18), the continue-as-new; not the start, the
    # markers, the activity, the timer or the upserts at 8 and 15.
    assert t.events == 91
    assert t.actions == {A.SIGNAL_WORKFLOW: 18, A.UPSERT_SEARCH_ATTRIBUTES: 18, A.CONTINUE_AS_NEW: 1}
    assert count_run(events, 0.0, _at(events[0]) - 1).events == 0


def test_a_reset_run_bills_the_reset_and_what_follows_it_not_the_base_runs_events() -> None:
    t = count_run(_events("subscription-reset"))
    assert t.events == 38  # the history holds the base run's events 1-3 too
    # 4: the reset (WORKFLOW_TASK_FAILED, cause RESET_WORKFLOW); markers of the tasks completed at 7
    # (8-10), 25 (27) and 34 (35); upserts 11, 28, 36; activities 12, 29; signal 13; update 20; timer 26.
    # The start (1) was the base run's.
    assert t.actions == {A.RESET_WORKFLOW: 1, A.RECORD_MARKERS: 3, A.UPSERT_SEARCH_ATTRIBUTES: 3,
                         A.SCHEDULE_ACTIVITY: 2, A.SIGNAL_WORKFLOW: 1, A.ACCEPT_UPDATE: 1,
                         A.START_TIMER: 1}


def test_a_run_started_by_continue_as_new_is_not_billed_a_start_again() -> None:
    t = count_run(_events("subscription-continued-run-close"))
    assert A.START_WORKFLOW not in t.actions  # its predecessor's continue-as-new was the action
    # Four markers in three tasks; upserts; the timer, one signal, one update, one activity.
    assert t.actions == {A.RECORD_MARKERS: 3, A.UPSERT_SEARCH_ATTRIBUTES: 4, A.START_TIMER: 1,
                         A.SIGNAL_WORKFLOW: 1, A.ACCEPT_UPDATE: 1, A.SCHEDULE_ACTIVITY: 1}


def _event(event_id: int, t: ET.ValueType, **attrs: object) -> HistoryEvent:
    ev = HistoryEvent(event_id=event_id, event_type=t)
    ev.event_time.seconds = 1_000 + event_id
    for path, value in attrs.items():
        target: object = ev
        *parents, leaf = path.split("__")
        for p in parents:
            target = getattr(target, p)
        setattr(target, leaf, value)
    return ev


def _upsert(event_id: int, *names: str) -> HistoryEvent:
    ev = _event(event_id, ET.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES)
    fields = ev.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
    for name in names:
        fields[name].data = b"1"
    return ev


def test_retries_patch_search_attribute_markers_by_task_and_children_count_as_the_page_says() -> None:
    started = _event(1, ET.EVENT_TYPE_ACTIVITY_TASK_STARTED,
                     activity_task_started_event_attributes__attempt=3)  # two retries
    completed = _event(2, ET.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)
    metering = completed.workflow_task_completed_event_attributes.metering_metadata
    metering.nonfirst_local_activity_execution_attempts = 2
    change_version = _upsert(3, CHANGE_VERSION_SEARCH_ATTRIBUTE)
    both = _upsert(4, CHANGE_VERSION_SEARCH_ATTRIBUTE, "McpState")
    markers = [_event(5 + i, ET.EVENT_TYPE_MARKER_RECORDED,
                      marker_recorded_event_attributes__workflow_task_completed_event_id=task)
               for i, task in enumerate((2, 2, 2, 9))]
    child = _event(10, ET.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED)
    other_failure = _event(11, ET.EVENT_TYPE_WORKFLOW_TASK_FAILED)
    nexus = _event(12, ET.EVENT_TYPE_NEXUS_OPERATION_SCHEDULED)
    t = count_run([started, completed, change_version, both, *markers, child, other_failure, nexus])
    assert t.actions == {A.RETRY_ACTIVITY: 2, A.RETRY_LOCAL_ACTIVITY: 2, A.UPSERT_SEARCH_ATTRIBUTES: 1,
                         A.RECORD_MARKERS: 2, A.START_CHILD_WORKFLOW: 2, A.SCHEDULE_NEXUS_OPERATION: 1}
    assert t.events == 11


def test_tallies_add_up_and_every_rule_says_how_it_counts() -> None:
    a = count_run(_events("subscription-revoked"))
    b = count_run(_events("subscription-session-change"))
    total = a + b
    assert total.events == a.events + b.events and total.actions_total == a.actions_total + b.actions_total
    assert Tally().actions_total == 0
    assert all(rule.note for rule in RULES.values())
    assert len({rule.action for rule in RULES.values()}) == len(RULES), "one action per billed event type"
