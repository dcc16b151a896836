"""``mcpsync upgrades``: open workflow runs by build and by ``workflow.patched`` marker.

Contract:
- Answers the patch lifecycle's one question (docs/upgrades.md): may patch ``P`` be deprecated
  yet? That is when no open run is older than it: no running workflow of ours lacks ``P``'s
  marker. Every run of code that has ``P`` records the marker on its first workflow task (the
  patches are asked at the start of ``run``), and the SDK makes it searchable
  (``TemporalChangeVersion``; continue-as-new does not carry it: each run shows the patches its
  own code asked for); the build a run is pinned to
  (Worker Deployment Versioning) from ``TemporalWorkerDeploymentVersion``, ``unversioned`` otherwise.
- Reads Temporal visibility only (``ListWorkflowExecutions`` over running executions of the
  workflow types the main worker hosts); changes nothing. With ``--patch P`` the exit code is
  0 when no open run lacks ``P`` and ``ExitCode.REFUSED`` (3) otherwise, so a release script can
  gate the ``deprecate_patch`` change on it.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client, WorkflowExecution

from mcpsync.workflows.names import ANSWER_WORKFLOW_TYPE, CATALOG_WORKFLOW_TYPE, WORKFLOW_TYPE

__all__ = ["OpenRuns", "CHANGE_VERSION", "open_runs", "runs_without", "register"]

CHANGE_VERSION = "TemporalChangeVersion"
"""The search attribute the SDK upserts with every ``workflow.patched`` id a run took."""

DEPLOYMENT_VERSION = "TemporalWorkerDeploymentVersion"
"""The search attribute the server keeps with the Worker Deployment Version a run is on
(``<deployment>:<build>``)."""

WORKFLOW_TYPES = (WORKFLOW_TYPE, CATALOG_WORKFLOW_TYPE, ANSWER_WORKFLOW_TYPE)
UNVERSIONED = "unversioned"


@dataclass(frozen=True, slots=True)
class OpenRuns:
    """How many running workflows of one type are on one build with one set of patch markers."""

    workflow_type: str
    build: str  # "<deployment>:<build id>", or "unversioned"
    patches: tuple[str, ...]  # the workflow.patched ids the run took, sorted
    count: int

    def to_json(self) -> dict[str, Any]:
        return {"workflow_type": self.workflow_type, "build": self.build, "patches": list(self.patches),
                "count": self.count}


def _build(execution: WorkflowExecution) -> str:
    # Visibility's record of the version the run is on (list results leave versioning_info empty).
    values = execution.search_attributes.get(DEPLOYMENT_VERSION) or []
    return str(values[0]) if values else UNVERSIONED


def _patches(execution: WorkflowExecution) -> tuple[str, ...]:
    values = execution.search_attributes.get(CHANGE_VERSION) or []
    return tuple(sorted(str(v) for v in values))


async def open_runs(client: Client, workflow_types: Iterable[str] = WORKFLOW_TYPES, *,
                    task_queue: str | None = None) -> list[OpenRuns]:
    """Running workflows of ``workflow_types`` (on ``task_queue``, or any), counted by (type, build,
    patch markers)."""
    types = ", ".join(f"'{t}'" for t in workflow_types)
    query = f"ExecutionStatus = 'Running' AND WorkflowType IN ({types})"
    if task_queue is not None:
        query += f" AND TaskQueue = '{task_queue}'"
    counts: Counter[tuple[str, str, tuple[str, ...]]] = Counter()
    async for execution in client.list_workflows(query):
        counts[(execution.workflow_type, _build(execution), _patches(execution))] += 1
    return [OpenRuns(t, b, p, n) for (t, b, p), n in sorted(counts.items())]


def runs_without(runs: Iterable[OpenRuns], patch: str, workflow_type: str | None = None) -> int:
    """Open runs older than ``patch``: those without its marker (of ``workflow_type``, or any type)."""
    return sum(r.count for r in runs if patch not in r.patches
               and (workflow_type is None or r.workflow_type == workflow_type))


def report(runs: list[OpenRuns], patch: str | None, workflow_type: str | None) -> tuple[dict[str, Any], str]:
    """The JSON document and the text ``mcpsync upgrades`` prints."""
    doc: dict[str, Any] = {"open_runs": [r.to_json() for r in runs], "total": sum(r.count for r in runs)}
    lines = [f"{'WORKFLOW TYPE':<32} {'BUILD':<28} {'PATCH MARKERS':<32} OPEN RUNS"]
    lines += [f"{r.workflow_type:<32} {r.build:<28} {','.join(r.patches) or '-':<32} {r.count}" for r in runs]
    lines.append(f"{doc['total']} open run(s)")
    if patch is not None:
        older = runs_without(runs, patch, workflow_type)
        doc["patch"] = {"id": patch, "workflow_type": workflow_type, "open_runs_without_marker": older,
                        "deprecate_ok": older == 0}
        scope = f" of {workflow_type}" if workflow_type else ""
        lines.append(f"{older} open run(s){scope} without the {patch!r} marker: "
                     + ("deprecate_patch is safe" if older == 0 else "keep the patch"))
    return doc, "\n".join(lines)


async def cmd_upgrades(args: argparse.Namespace) -> None:
    from mcpsync.worker.cli.common import CliError, ExitCode, ExitStatus, print_out, resolve_config
    from mcpsync.worker.main.connect import connect_temporal

    if args.workflow_type is not None and args.patch is None:
        raise CliError("--workflow-type applies to --patch only")
    config, _ = resolve_config(args)
    client = await connect_temporal(config.temporal)
    runs = await open_runs(client, task_queue=args.task_queue)
    doc, text = report(runs, args.patch, args.workflow_type)
    print_out(doc, args.json, text)
    if args.patch is not None and not doc["patch"]["deprecate_ok"]:
        raise ExitStatus(ExitCode.REFUSED)


def register(sub: Any) -> None:
    """Add ``upgrades`` to the top-level subparsers ``sub``."""
    help_ = "open workflow runs by build and workflow.patched marker (when a patch may be deprecated)"
    c = sub.add_parser("upgrades", help=help_, description=help_,
                       epilog="With --patch ID: exit 0 when no open run lacks the marker (deprecate_patch is "
                              "safe), 3 otherwise. docs/upgrades.md, 'Patch lifecycle'.\n\nexamples:\n"
                              "  mcpsync upgrades\n"
                              "  mcpsync upgrades --patch my-patch-id --workflow-type "
                              "ResourceSubscriptionWorkflow   # exit 3 while an open run lacks it\n"
                              "  mcpsync upgrades --task-queue mcpsync --json\n")
    c.add_argument("--patch", metavar="ID",
                   help="count the open runs without this workflow.patched marker")
    c.add_argument("--workflow-type", choices=WORKFLOW_TYPES, default=None,
                   help="with --patch: only runs of this workflow type (default: every type)")
    c.add_argument("--task-queue", default=None, metavar="QUEUE",
                   help="only runs on this task queue (default: every queue in the namespace)")
    c.add_argument("--json", action="store_true", help="print one JSON document")
    c.set_defaults(func=cmd_upgrades)
