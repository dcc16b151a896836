"""Worker Deployment Versioning inside workflow code: upgrade on continue-as-new.

Contract:
- Every long-lived workflow of the main worker is declared ``PINNED``: a run only ever meets
  the build that started it, so a deploy never replays a run's history on different code.
- ``target_version_changed()`` is True once the deployment's current (target) build is no
  longer the one this run is pinned to; the workflow then continues-as-new at its next
  wake-up (not mid-read, not mid-handler) with ``upgrade_behavior()``, so the new run's first
  task goes to the current build and is pinned there. A rollback is the same move backwards.
- Both are deterministic (the flag and the build travel in the workflow task's history
  events) and inert on an unversioned worker: no deployment version, never a target change,
  continue-as-new exactly as before. Replay of the corpus (tests/test_replay.py) is unaffected.
- Only workflow-sandbox-safe calls; no I/O.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import VersioningBehavior

__all__ = ["DECLARED_BEHAVIOR", "target_version_changed", "upgrade_behavior"]

DECLARED_BEHAVIOR = VersioningBehavior.PINNED
"""The versioning behaviour every main-worker workflow declares on ``@workflow.defn``."""


def target_version_changed() -> bool:
    """True when this run is pinned to a build that is no longer its deployment's target."""
    info = workflow.info()
    return info.get_current_deployment_version() is not None and info.is_target_worker_deployment_version_changed()


def upgrade_behavior() -> workflow.ContinueAsNewVersioningBehavior | None:
    """For ``workflow.continue_as_new``: AUTO_UPGRADE on a versioned worker (the new run starts on
    the current build instead of inheriting this run's pin), None (today's inheritance) otherwise."""
    if workflow.info().get_current_deployment_version() is None:
        return None
    return workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE
