"""The replay corpus: recorded workflow histories and how to replay them offline.

Contract:
- ``HISTORY_DIR/<version>/`` is the corpus of one release: one ``<path-it-covers>.json`` per
  recorded run (``WorkflowHistory.to_json()``) and ``SHA256SUMS`` over them, written once by
  ``tests/histories/record.py`` (``scripts/record-histories``) with that version's workflow code
  and never edited by hand. A released corpus is frozen: CI replays every release's corpus
  against the current code and checks each against its ``SHA256SUMS`` (tests/unit/test_replay.py).
- ``replayer(runner)`` replays with exactly the main worker's workflows and data converter
  (``mcpsync.worker.main.worker.MAIN_WORKFLOWS``, pydantic converter) on ``runner``: the SDK's default
  sandbox unless given (its strict restrictions check every workflow call, whichever runner
  ``[temporal] workflow_runner`` picks in production); no server needed.
- ``traits()`` says what a history exercises (workflow type, continue-as-new, reset, a build
  upgrade under Worker Deployment Versioning) so the
  coverage test can refuse a corpus that silently lost a path.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from temporalio.api.enums.v1 import ContinueAsNewVersioningBehavior, EventType, WorkflowTaskFailedCause
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from mcpsync import __version__
from mcpsync.worker.main.converter import DATA_CONVERTER
from mcpsync.worker.main.worker import MAIN_WORKFLOWS
from tests.e2e.test_e2e_faults import _decoded_payloads

HISTORY_DIR = Path(__file__).resolve().parent
MAX_HISTORY_BYTES = 512 * 1024  # "well under 1 MB": a bigger file means a scenario grew by accident

BODY_MARKER = "REPLAY-BODY-"
"""Every resource body the recorder creates contains this; no history may (digests only)."""

SECRET_MARKER = "tok-"
"""Prefix of every bearer token the recorder's fixtures accept; no history may contain one."""


SUMS = "SHA256SUMS"


def version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split("."))


def release_dirs() -> list[Path]:
    """Every release's corpus directory (``<major>.<minor>.<patch>``), oldest first."""
    found = [d for d in HISTORY_DIR.iterdir() if d.is_dir() and all(p.isdigit() for p in d.name.split("."))]
    return sorted(found, key=lambda d: version_key(d.name))


def current_dir() -> Path:
    """Where ``record.py`` writes: the corpus of the version this tree is (``mcpsync.__version__``)."""
    return HISTORY_DIR / __version__


def history_files(release: Path | None = None) -> list[Path]:
    """The histories of one release's corpus, or of every release's."""
    dirs = [release] if release is not None else release_dirs()
    return [p for d in dirs for p in sorted(d.glob("*.json"))]


def sha256sums(files: list[Path]) -> str:
    """``sha256sum`` format, one line per file, sorted by name."""
    return "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in sorted(files))


def load(path: Path) -> WorkflowHistory:
    # The file holds the history only; the workflow id is just a label for replay messages.
    return WorkflowHistory.from_json(path.stem, path.read_text())


def replayer(runner: WorkflowRunner | None = None) -> Replayer:
    return Replayer(workflows=list(MAIN_WORKFLOWS), data_converter=DATA_CONVERTER,
                    workflow_runner=runner or SandboxedWorkflowRunner())


@dataclass(frozen=True)
class Traits:
    workflow_type: str
    continued_as_new: bool  # the run ended in continue-as-new
    continued_from_run: bool  # the run was started by a continue-as-new
    reset: bool  # the run is the product of a workflow reset
    target_changed: bool  # a workflow task saw its deployment's target build change (worker versioning)
    upgraded: bool  # the run was started by a continue-as-new with AUTO_UPGRADE
    events: int


def traits(history: WorkflowHistory) -> Traits:
    events = list(history.events)
    started = events[0].workflow_execution_started_event_attributes
    return Traits(
        workflow_type=started.workflow_type.name,
        continued_as_new=any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
                             for e in events),
        continued_from_run=bool(started.continued_execution_run_id),
        reset=any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
                  and e.workflow_task_failed_event_attributes.cause
                  == WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW for e in events),
        target_changed=any(e.workflow_task_started_event_attributes.target_worker_deployment_version_changed
                           for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED),
        upgraded=started.inherited_auto_upgrade_info.continue_as_new_initial_versioning_behavior
        == ContinueAsNewVersioningBehavior.CONTINUE_AS_NEW_VERSIONING_BEHAVIOR_AUTO_UPGRADE,
        events=len(events),
    )


def leaks(history_json: str, needles: tuple[str, ...] = (BODY_MARKER, SECRET_MARKER)) -> list[str]:
    """The needles found in a history JSON or in any of its base64-decoded payloads."""
    corpus = history_json + "\n".join(_decoded_payloads(json.loads(history_json)))
    return [n for n in needles if n in corpus]

