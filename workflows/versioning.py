"""Worker Deployment Versioning inside workflow code: upgrade on continue-as-new.

Contract:
- A versioned main worker runs every workflow ``PINNED`` (``MAIN_WORKER_BEHAVIOR``, its
  ``default_versioning_behavior``): a run only ever meets the build that started it, so a
  deploy never replays a run's history on different code. Not declared on ``@workflow.defn``:
  the SDK sends a declared behaviour with every task completion, and the server refuses it
  from an unversioned worker ("versioning behavior cannot be specified without deployment
  options"), which would break every deployment that does not use versioning.
- ``target_version_changed()`` is True once the deployment's current (target) build is no
  longer the one this run is pinned to; the workflow then continues-as-new at its next
  wake-up (not mid-read, not mid-handler) with ``upgrade_behavior()``, so the new run's first
  task goes to the current build and is pinned there. A rollback is the same move backwards.
- Both are deterministic (the flag and the build travel in the workflow task's history events) and
  inert on an unversioned worker: no deployment version, never a target change. Only
  workflow-sandbox-safe calls; no I/O.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import VersioningBehavior

__all__ = ["MAIN_WORKER_BEHAVIOR", "target_version_changed", "upgrade_behavior"]

MAIN_WORKER_BEHAVIOR = VersioningBehavior.PINNED
"""The versioning behaviour of every workflow on a versioned main worker (its default)."""


def target_version_changed() -> bool:
    """True when this run is pinned to a build that is no longer its deployment's target."""
    info = workflow.info()
    return (info.get_current_deployment_version() is not None
            and info.is_target_worker_deployment_version_changed())


def upgrade_behavior() -> workflow.ContinueAsNewVersioningBehavior | None:
    """For ``workflow.continue_as_new``: AUTO_UPGRADE on a versioned worker (the new run starts on
    the current build instead of inheriting this run's pin), None (today's inheritance) otherwise."""
    if workflow.info().get_current_deployment_version() is None:
        return None
    return workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE
