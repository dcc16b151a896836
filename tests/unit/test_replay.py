"""Replay every released corpus (tests/histories/<version>/*.json) against the current workflow code.

A failure here means a workflow change is not replay-compatible: running subscriptions
(which live for months) would fail their next workflow task after the deploy. Fix the change
with ``workflow.patched(...)``; never regenerate a corpus to make this pass (docs/upgrades.md).
Each release's corpus is frozen: its files must match its ``SHA256SUMS``.
Offline: ``Replayer`` needs no Temporal server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mcpsync import __version__
from mcpsync.worker.main.config import WorkflowRunnerKind
from mcpsync.worker.main.worker import workflow_runner
from mcpsync.workflows.names import (
    ANSWER_WORKFLOW_TYPE,
    CATALOG_WORKFLOW_TYPE,
    SIGNAL_RESOURCE_READ,
    WORKFLOW_TYPE,
    Act,
)
from tests.histories.corpus import (
    MAX_HISTORY_BYTES,
    SUMS,
    history_files,
    leaks,
    load,
    release_dirs,
    replayer,
    sha256sums,
    traits,
    version_key,
)

RELEASES = release_dirs()
FILES = history_files()


def _id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


@pytest.mark.parametrize("runner", [None, *WorkflowRunnerKind], ids=["strict-sandbox", *WorkflowRunnerKind])
@pytest.mark.parametrize("path", FILES, ids=[_id(p) for p in FILES])
async def test_recorded_history_replays(path: Path, runner: WorkflowRunnerKind | None) -> None:
    # The SDK's strict sandbox checks every workflow call (no I/O, wall clock, threads) whichever runner
    # production is configured with; each configurable runner must replay too.
    history = load(path)
    result = await replayer(None if runner is None else workflow_runner(runner)).replay_workflow(
        history, raise_on_replay_failure=False)
    failure = result.replay_failure
    assert failure is None, f"{_id(path)} no longer replays: {type(failure).__name__}: {str(failure)[:300]}"


def test_a_released_corpus_exists_and_none_is_newer_than_this_version() -> None:
    names = [d.name for d in RELEASES]
    assert names, "no released corpus under tests/histories/<version>/"
    assert all(version_key(n) <= version_key(__version__) for n in names), (names, __version__)


@pytest.mark.parametrize("release", RELEASES, ids=[d.name for d in RELEASES])
def test_a_released_corpus_is_frozen(release: Path) -> None:
    # Re-recording or editing a released corpus would silently drop the runs it stands for.
    assert (release / SUMS).read_text() == sha256sums(history_files(release)), \
        f"{release.name}: the corpus differs from its {SUMS}; a released corpus is never re-recorded"


@pytest.mark.parametrize("release", RELEASES, ids=[d.name for d in RELEASES])
def test_a_corpus_has_one_generation_per_scenario_and_every_long_life_path(release: Path) -> None:
    files = history_files(release)
    assert len(files) >= 12, f"{release.name}: the corpus shrank to {len(files)} files"
    assert not [p.name for p in files if "@" in p.name], "one history generation per scenario"
    seen = {p.stem: traits(load(p)) for p in files}
    types = {t.workflow_type for t in seen.values()}
    assert {WORKFLOW_TYPE, CATALOG_WORKFLOW_TYPE, ANSWER_WORKFLOW_TYPE} <= types, types
    subscription = [t for t in seen.values() if t.workflow_type == WORKFLOW_TYPE]
    assert any(t.continued_as_new for t in subscription), "no subscription run that ends in continue-as-new"
    assert any(t.continued_from_run for t in subscription), "no subscription run started by continue-as-new"
    assert any(t.reset for t in subscription), "no subscription run produced by a workflow reset"
    assert any(t.target_changed and t.continued_as_new for t in subscription), \
        "no subscription run that continues-as-new because its target build changed (worker versioning)"
    assert any(t.upgraded for t in subscription), "no subscription run started on a new build (AUTO_UPGRADE)"
    assert any(t.continued_as_new for t in seen.values() if t.workflow_type == CATALOG_WORKFLOW_TYPE)


@pytest.mark.parametrize("path", FILES, ids=[_id(p) for p in FILES])
def test_recorded_history_is_small_and_holds_no_body_or_token(path: Path) -> None:
    text = path.read_text()
    assert len(text.encode()) <= MAX_HISTORY_BYTES
    assert leaks(text) == []


def patch_markers(path: Path) -> set[str]:
    """The workflow.patched ids a recorded run took (its ``core_patch`` markers)."""
    found = set()
    for event in load(path).events:
        if event.HasField("marker_recorded_event_attributes"):
            attrs = event.marker_recorded_event_attributes
            if attrs.marker_name == "core_patch":
                found |= {json.loads(p.data)["id"] for p in attrs.details["patch-data"].payloads}
    return found


def test_the_baseline_corpus_carries_no_patch_marker() -> None:
    # 0.2.0 is the first release: its workflows ask no workflow.patched id (docs/upgrades.md).
    baseline = [p for d in RELEASES if d.name == "0.2.0" for p in history_files(d)]
    if not baseline:
        pytest.skip("the 0.2.0 corpus has retired (docs/upgrades.md, 'Patch lifecycle')")
    assert not {p.name: patch_markers(p) for p in baseline if patch_markers(p)}


def _newest_subscriptions() -> list[Path]:
    """The subscription histories of the newest release's corpus."""
    return [p for p in history_files(RELEASES[-1]) if traits(load(p)).workflow_type == WORKFLOW_TYPE]


def test_the_newest_corpus_replays_runs_that_mirrored_reads_made_at_the_ingress() -> None:
    # The resource_read handler (reads at the ingress) runs in recorded histories.
    def reports(path: Path) -> int:
        return sum(1 for e in load(path).events
                   if e.HasField("workflow_execution_signaled_event_attributes")
                   and e.workflow_execution_signaled_event_attributes.signal_name == SIGNAL_RESOURCE_READ)

    with_reports = {p.stem for p in _newest_subscriptions() if reports(p)}
    assert {"subscription-updates-churn-and-close", "subscription-reset",
            "subscription-continue-as-new"} <= with_reports, with_reports


def test_the_newest_corpus_replays_starts_made_in_one_round_trip() -> None:
    # Subscribe, mark ACTIVE and the initial read as one activity.
    def starts(path: Path) -> int:
        return sum(1 for e in load(path).events
                   if e.HasField("activity_task_scheduled_event_attributes")
                   and (e.activity_task_scheduled_event_attributes.activity_type.name
                        == Act.MCP_SUBSCRIBE_CYCLE))

    with_starts = {p.stem for p in _newest_subscriptions() if starts(p)}
    assert {"subscription-updates-churn-and-close", "subscription-reset", "subscription-session-change",
            "subscription-continue-as-new"} <= with_starts, with_starts
