"""Starting workflows: the idempotent starters of subscriptions (for the CLI, the platform API
and the catalog's auto-subscribe activity alike) and of catalogs.

Contract: ``start_subscription`` starts (or joins) the ``ResourceSubscriptionWorkflow`` of a key
with conflict policy USE_EXISTING (starting twice joins the running workflow) and reuse policy
ALLOW_DUPLICATE (a closed key starts a new incarnation). It carries the subject and server in the
memo, the key in the search attributes (the URI up to 255 bytes: ``sa_uri``) and the Web UI's static
summary/details (the exact URI in the details); never a body or a credential. The URI, up to
``MAX_URI_LENGTH`` characters, stays out of the memo: Temporal's client warns (on stdout) about a memo
over 2 KiB. It
lives in ``activities`` so the catalog activities can start subscriptions without importing the
worker. The id is the caller's ``workflow_id``: production callers pass ``FenceLedger.workflow_id_of(key)``
(the id a subscription of the key already runs or ran under, so an older one is joined or
reopened under its own id); without it, ``key.workflow_id``, right only for a key the ledger has
never seen (docs/upgrades.md, "Workflow ids").

``start_subscription_first_read`` is the same start (same id, policies, memo and attributes) as
one Update-with-Start of the ``first_read`` update: one call starts or joins the workflow and
answers its record once the first read was judged (the first receipt), or once no read will come
(TOMBSTONE_PENDING, RECONCILIATION_REQUIRED, closing, ended). A running subscription just answers
the update (at once if its first read was already judged). It waits as long as that takes: the
caller bounds it (``asyncio.wait_for``). The update goes through ``workflow_updates``: resent under
its id while the server answers that it was not applied.
"""

from __future__ import annotations

from typing import Any

from temporalio.client import Client, WithStartWorkflowOperation, WorkflowHandle
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)

from mcpsync.activities.workflow_updates import execute_update_with_start
from mcpsync.workflows.names import (
    CATALOG_WORKFLOW_TYPE,
    SA_CATALOG_STATE,
    SA_SERVER,
    SA_STATE,
    SA_SUBJECT,
    SA_URI,
    UPDATE_FIRST_READ,
    WORKFLOW_TYPE,
)
from mcpsync.workflows.records.catalog import CatalogKey, CatalogPolicy, CatalogStart
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionOptions, SubscriptionStart
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1

__all__ = ["start_subscription", "start_subscription_first_read", "start_catalog", "subscription_contract",
           "sa_uri"]


def sa_uri(uri: str) -> str:
    # Keyword values are VARCHAR(255) in SQL visibility; the exact URI is in the static details.
    return uri if len(uri.encode()) <= 255 else uri.encode()[:240].decode(errors="ignore") + "…"


def _start_options(*, id: str, task_queue: str, memo: dict[str, str],
                   attributes: list[SearchAttributePair[str]],
                   summary: str, details: str | None = None) -> dict[str, Any]:
    """How every mcpsync workflow starts: USE_EXISTING on conflict (join the run going),
    ALLOW_DUPLICATE after it ended (a new incarnation)."""
    return {"id": id, "task_queue": task_queue, "id_conflict_policy": WorkflowIDConflictPolicy.USE_EXISTING,
            "id_reuse_policy": WorkflowIDReusePolicy.ALLOW_DUPLICATE, "memo": memo,
            "search_attributes": TypedSearchAttributes(attributes), "static_summary": summary,
            "static_details": details}


def _keyword(name: str, value: str) -> SearchAttributePair[str]:
    return SearchAttributePair(SearchAttributeKey.for_keyword(name), value)


def _subscription_options(key: SubscriptionKey, options: SubscriptionOptions | None, *, task_queue: str,
                          workflow_id: str | None) -> tuple[SubscriptionStart, dict[str, Any]]:
    options = options or SubscriptionOptions()
    workflow_id = workflow_id or key.workflow_id
    return SubscriptionStart(key=key, options=options), _start_options(
        id=workflow_id, task_queue=task_queue,
        memo={"subject": key.subject, "server": key.server},
        attributes=[_keyword(SA_SERVER, key.server), _keyword(SA_URI, sa_uri(key.uri)),
                    _keyword(SA_SUBJECT, key.subject), _keyword(SA_STATE, "DISCOVERED")],
        summary=f"{key.server} {key.subject} {sa_uri(key.uri)}",
        details=subscription_contract(key, options, workflow_id=workflow_id))


async def start_subscription(client: Client, key: SubscriptionKey, *, task_queue: str,
                             options: SubscriptionOptions | None = None,
                             workflow_id: str | None = None) -> WorkflowHandle:
    """Start (or join) the subscription workflow of ``key`` under ``workflow_id``; idempotent."""
    start, kwargs = _subscription_options(key, options, task_queue=task_queue, workflow_id=workflow_id)
    return await client.start_workflow(WORKFLOW_TYPE, start, **kwargs)


async def start_subscription_first_read(
        client: Client, key: SubscriptionKey, *, task_queue: str, options: SubscriptionOptions | None = None,
        workflow_id: str | None = None) -> tuple[WorkflowHandle, ResourceSubscriptionV1]:
    """``start_subscription`` and the ``first_read`` update in one Update-with-Start: the workflow's
    handle and its record with the first receipt (``last_receipt_id``, ``last_verdict``)."""
    start, kwargs = _subscription_options(key, options, task_queue=task_queue, workflow_id=workflow_id)
    record, operation = await execute_update_with_start(
        client, UPDATE_FIRST_READ, workflow_id=kwargs["id"], result_type=ResourceSubscriptionV1,
        start=lambda: WithStartWorkflowOperation(WORKFLOW_TYPE, start, **kwargs))
    return await operation.workflow_handle(), record


async def start_catalog(client: Client, key: CatalogKey, *, task_queue: str,
                        policy: CatalogPolicy | None = None) -> WorkflowHandle:
    """Start (or join) the CatalogWorkflow of (subject, server); idempotent. Nothing else starts it."""
    return await client.start_workflow(
        CATALOG_WORKFLOW_TYPE, CatalogStart(key=key, policy=policy or CatalogPolicy()), **_start_options(
            id=key.workflow_id, task_queue=task_queue, memo={"subject": key.subject, "server": key.server},
            attributes=[_keyword(SA_SERVER, key.server), _keyword(SA_SUBJECT, key.subject),
                        _keyword(SA_CATALOG_STATE, "STARTING")],
            summary=f"catalog {key.server} {key.subject}"))


def subscription_contract(key: SubscriptionKey, options: SubscriptionOptions, *, workflow_id: str) -> str:
    """The Web UI's static details of a subscription: what it is and the promises it runs under."""
    o = options
    return (
        f"**resourceSubscription.v1** `{key.uri}`\n\n"
        f"| contract | value |\n|---|---|\n"
        f"| subject / server | {key.subject} / {key.server} |\n"
        f"| URI (exact, never normalized) | `{key.uri[:500]}` |\n"
        f"| workflow id | `{workflow_id}` |\n"
        f"| poll interval (no subscribe) | {o.poll_interval_seconds:g} s: the published staleness bound |\n"
        "| safety re-read (with subscribe) |"
        f" {f'{o.safety_read_seconds:g} s' if o.safety_read_seconds else 'off'} |\n"
        f"| watchdog (the ledger schedules the safety reads) | looks every {o.watchdog_seconds:g} s |\n"
        f"| max concurrent reads | {o.max_concurrent_reads} |\n"
        f"| continue-as-new at | {o.max_history_events} events (or when suggested) |\n\n"
        "Signals: `resource_updated` (a notification), `resource_read` (the ingress read the"
        " change itself: most of the timeline), `session_changed`, `catalog_reconciled`, `revoke`,"
        " `identity_conflict`, `close`; updates: `close`, `resume`, `first_read`; query: `subscription`. The"
        " negotiated edition, the live ledger and the freshness (last verified, next read due, staleness"
        " bound) are in the current details."
    )
