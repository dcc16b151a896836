"""``mcpsync upgrades``: the counting and the verdict (the live query: tests/e2e/test_e2e_versioning.py)."""

from __future__ import annotations

from mcpsync.worker.cli.root import build_parser
from mcpsync.worker.cli.upgrades import OpenRuns, report, runs_without
from mcpsync.workflows.names import CATALOG_WORKFLOW_TYPE, WORKFLOW_TYPE

RUNS = [
    OpenRuns(WORKFLOW_TYPE, "mcpsync:0.2.0", (), 4),
    OpenRuns(WORKFLOW_TYPE, "mcpsync:0.3.0", ("read-slot",), 7),
    OpenRuns(CATALOG_WORKFLOW_TYPE, "mcpsync:0.3.0", (), 2),
]


def test_runs_older_than_a_patch_are_those_without_its_marker() -> None:
    assert runs_without(RUNS, "read-slot") == 6
    assert runs_without(RUNS, "read-slot", WORKFLOW_TYPE) == 4
    assert runs_without(RUNS[1:2], "read-slot", WORKFLOW_TYPE) == 0


def test_the_report_says_whether_deprecate_patch_is_safe() -> None:
    doc, text = report(RUNS, "read-slot", WORKFLOW_TYPE)
    assert doc["total"] == 13 and doc["patch"] == {"id": "read-slot", "workflow_type": WORKFLOW_TYPE,
                                                   "open_runs_without_marker": 4, "deprecate_ok": False}
    assert "mcpsync:0.3.0" in text and "4 open run(s) of ResourceSubscriptionWorkflow" in text
    doc, text = report(RUNS[1:2], "read-slot", None)
    assert doc["patch"]["deprecate_ok"] and "deprecate_patch is safe" in text
    doc, _ = report([], None, None)
    assert doc == {"open_runs": [], "total": 0}


def test_the_command_is_registered() -> None:
    args = build_parser().parse_args(["upgrades", "--patch", "read-slot", "--workflow-type", WORKFLOW_TYPE,
                                      "--task-queue", "mcpsync", "--json"])
    assert (args.patch, args.workflow_type, args.task_queue,
            args.json) == ("read-slot", WORKFLOW_TYPE, "mcpsync",
                                                                          True)
