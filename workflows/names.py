"""Wire names of mcpsync's Temporal surface: the contract with platform teams and ingress services.

Contract: these strings are stable. Any Temporal client may start
``WORKFLOW_TYPE`` on ``DEFAULT_TASK_QUEUE`` with a ``SubscriptionStart`` payload
(pydantic JSON), signal it with the payloads named below, and query it.
"""

from __future__ import annotations

from workflows.records import DEFAULT_TASK_QUEUE

__all__ = [
    "DEFAULT_TASK_QUEUE",
    "WORKFLOW_TYPE",
    "SIGNAL_RESOURCE_UPDATED",
    "SIGNAL_SESSION_CHANGED",
    "SIGNAL_CLOSE",
    "SIGNAL_CATALOG_RECONCILED",
    "UPDATE_CLOSE",
    "QUERY_SUBSCRIPTION",
    "SA_SERVER",
    "SA_URI",
    "SA_SUBJECT",
    "SA_STATE",
    "SA_SESSION_GENERATION",
    "SA_SUBSCRIPTION_GENERATION",
    "SA_WATERMARK",
    "Act",
]

WORKFLOW_TYPE = "ResourceSubscriptionWorkflow"

SIGNAL_RESOURCE_UPDATED = "resource_updated"  # payload: ResourceUpdated
SIGNAL_SESSION_CHANGED = "session_changed"  # payload: SessionChanged
SIGNAL_CLOSE = "close"  # payload: CloseRequest (fire-and-forget form of the update)
SIGNAL_CATALOG_RECONCILED = "catalog_reconciled"  # payload: CatalogObservation (from CatalogWorkflow)
UPDATE_CLOSE = "close"  # payload: CloseRequest -> CloseReceipt
QUERY_SUBSCRIPTION = "subscription"  # -> ResourceSubscriptionV1

# Search attributes registered by setup (temporal/search_attributes.toml).
SA_SERVER = "McpServer"
SA_URI = "McpUri"
SA_SUBJECT = "McpSubject"
SA_STATE = "McpState"
SA_SESSION_GENERATION = "McpSessionGeneration"
SA_SUBSCRIPTION_GENERATION = "McpSubscriptionGeneration"
SA_WATERMARK = "McpWatermark"


class Act:
    """Activity names. Ledger activities run on DEFAULT_TASK_QUEUE; MCP ones on the session's queue."""

    ENSURE = "ledger_ensure_subscription"
    LOAD_FENCE = "ledger_load_fence"
    CURRENT_SESSION = "ledger_current_session"
    BEGIN_SUBSCRIPTION = "ledger_begin_subscription"
    MARK_ACTIVE = "ledger_mark_active"
    ALLOCATE_READ = "ledger_allocate_read"
    ACCEPT = "ledger_accept"
    BEGIN_UNSUBSCRIBE = "ledger_begin_unsubscribe"
    FINISH_UNSUBSCRIBE = "ledger_finish_unsubscribe"
    AUDIT = "ledger_audit"
    MCP_SUBSCRIBE = "mcp_subscribe"
    MCP_UNSUBSCRIBE = "mcp_unsubscribe"
    MCP_READ = "mcp_read"
