"""A changed build of the main worker's workflows for tests/e2e/test_e2e_versioning.py.

Contract:
- ``ChangedSubscriptionWorkflow`` is the production ``ResourceSubscriptionWorkflow`` plus one
  observable, compatible change at the start of each run: a ``workflow.patched(V2_PATCH)``
  marker in history and a ``build = "v2"`` memo entry. Registered under the same workflow type.
- Its own module, importing only workflow code, because the workflow sandbox re-imports the
  module that defines a workflow (a test module's I/O imports are refused there).
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from mcpsync.workflows.answer import AnswerWorkflow
    from mcpsync.workflows.catalog import CatalogWorkflow
    from mcpsync.workflows.names import WORKFLOW_TYPE
    from mcpsync.workflows.records.subscription import SubscriptionStart
    from mcpsync.workflows.records.versioned import ResourceSubscriptionV1
    from mcpsync.workflows.subscription import ResourceSubscriptionWorkflow

__all__ = ["V2_PATCH", "V2_WORKFLOWS", "ChangedSubscriptionWorkflow"]

V2_PATCH = "mcpsync-test-v2-build"
"""The changed workflow's marker: a ``workflow.patched`` id only build v2 records."""


@workflow.defn(name=WORKFLOW_TYPE)
class ChangedSubscriptionWorkflow(ResourceSubscriptionWorkflow):
    @workflow.run
    async def run(self, start: SubscriptionStart) -> ResourceSubscriptionV1:
        if workflow.patched(V2_PATCH):
            workflow.upsert_memo({"build": "v2"})
        return await super().run(start)


V2_WORKFLOWS = (ChangedSubscriptionWorkflow, CatalogWorkflow, AnswerWorkflow)
"""Build v2's ``workflows=`` for ``mcpsync.worker.main.worker.main_worker``: MAIN_WORKFLOWS changed."""
