"""Wire names of mcpsync's Temporal surface: the contract with platform teams and ingress services.

Contract: these strings are stable. Any Temporal client may start ``WORKFLOW_TYPE`` on
``DEFAULT_TASK_QUEUE`` with a ``SubscriptionStart`` payload (pydantic JSON), signal it with the
payloads named below, and query it.
"""

from __future__ import annotations

import hashlib

from mcpsync.workflows.uris import uri_slug

__all__ = ["WORKFLOW_TYPE", "SIGNAL_RESOURCE_UPDATED", "SIGNAL_RESOURCE_READ", "SIGNAL_SESSION_CHANGED",
           "SIGNAL_CLOSE", "SIGNAL_CATALOG_RECONCILED", "UPDATE_CLOSE", "UPDATE_RESUME", "UPDATE_FIRST_READ",
           "SIGNAL_IDENTITY_CONFLICT", "SIGNAL_REVOKE", "QUERY_SUBSCRIPTION", "SA_SERVER", "SA_URI",
           "SA_SUBJECT", "SA_STATE", "SA_CATALOG_STATE", "SA_ANSWER_STATE", "SA_SESSION_GENERATION",
           "SA_SUBSCRIPTION_GENERATION", "SA_WATERMARK", "Act"]

WORKFLOW_TYPE = "ResourceSubscriptionWorkflow"

SIGNAL_RESOURCE_UPDATED = "resource_updated"  # payload: ResourceUpdated
SIGNAL_RESOURCE_READ = "resource_read"  # payload: ReadReport (the ingress read the update itself)
SIGNAL_SESSION_CHANGED = "session_changed"  # payload: SessionChanged
SIGNAL_CLOSE = "close"  # payload: CloseRequest (fire-and-forget form of the update)
SIGNAL_CATALOG_RECONCILED = "catalog_reconciled"  # payload: CatalogObservation (from CatalogWorkflow)
SIGNAL_IDENTITY_CONFLICT = "identity_conflict"  # payload: IdentityConflict
SIGNAL_REVOKE = "revoke"  # payload: RevokeRequest
UPDATE_CLOSE = "close"  # payload: CloseRequest -> CloseReceipt
UPDATE_RESUME = "resume"  # payload: ResumeRequest -> ResourceSubscriptionV1
UPDATE_FIRST_READ = "first_read"  # no payload -> ResourceSubscriptionV1 once the first read was judged
QUERY_SUBSCRIPTION = "subscription"  # -> ResourceSubscriptionV1

# Search attributes registered by setup (temporal/search_attributes.toml).
SA_SERVER = "McpServer"
SA_URI = "McpUri"
SA_SUBJECT = "McpSubject"
SA_STATE = "McpState"  # ResourceSubscriptionWorkflow's state (SubscriptionState phases)
SA_CATALOG_STATE = "McpCatalogState"  # CatalogWorkflow's status (SNAPSHOT_* / scan phase)
SA_ANSWER_STATE = "McpAnswerState"  # AnswerWorkflow's verdict (UNBOUND / BOUND / HOLD / ACCEPT)
SA_SESSION_GENERATION = "McpSessionGeneration"
SA_SUBSCRIPTION_GENERATION = "McpSubscriptionGeneration"
SA_WATERMARK = "McpWatermark"


class Act:
    """Activity names. Ledger activities run on DEFAULT_TASK_QUEUE; MCP ones on the session's queue."""

    ENSURE = "ledger_ensure_subscription"
    LOAD_FENCE = "ledger_load_fence"
    CURRENT_SESSION = "ledger_current_session"
    BEGIN_SUBSCRIPTION = "ledger_begin_subscription"
    START_SUBSCRIPTION = "ledger_start_subscription"  # a new run's ensure + current session + begin
    MARK_ACTIVE = "ledger_mark_active"
    ALLOCATE_READ = "ledger_allocate_read"
    ACCEPT = "ledger_accept"
    BEGIN_UNSUBSCRIBE = "ledger_begin_unsubscribe"
    FINISH_UNSUBSCRIBE = "ledger_finish_unsubscribe"
    AUDIT = "ledger_audit"
    SET_STATE = "ledger_set_state"
    CONFIRM_TOMBSTONE = "ledger_confirm_tombstone"
    REVOKE = "ledger_revoke"
    WATCH_VERIFICATIONS = "ledger_watch_verifications"  # the watchdog's look at the ledger's schedule
    MCP_SUBSCRIBE = "mcp_subscribe"
    MCP_UNSUBSCRIBE = "mcp_unsubscribe"
    MCP_READ = "mcp_read"
    MCP_READ_CYCLE = "mcp_read_cycle"  # allocate + read + judge in one activity
    MCP_SUBSCRIBE_CYCLE = "mcp_subscribe_cycle"  # subscribe + mark ACTIVE + the initial read cycle


# --- CatalogWorkflow (one per subject+server) ------------------------------------------

__all__ += ["CATALOG_WORKFLOW_TYPE", "SIGNAL_LIST_CHANGED", "SIGNAL_RECONCILE", "UPDATE_RECONCILE",
            "QUERY_CATALOG", "QUERY_SCANS", "CatalogAct"]

CATALOG_WORKFLOW_TYPE = "CatalogWorkflow"
SIGNAL_LIST_CHANGED = "list_changed"  # payload: ListChanged (from the session host; never starts it)
SIGNAL_RECONCILE = "reconcile"  # payload: str reason; a new A/B reconciliation (coalesced)
UPDATE_RECONCILE = "reconcile"  # payload: str reason -> CatalogSnapshot | None (the next published one)
QUERY_CATALOG = "catalog"  # -> mcpsync.workflows.catalog_rules.CatalogView
QUERY_SCANS = "scans"  # -> list[ResourceDiscoveryScanV1], newest last


class CatalogAct:
    """Catalog activity names. SCAN runs on the session host's queue, the rest on the main queue."""

    SCAN = "catalog_scan"
    ROLLOUT = "catalog_rollout"
    PUBLISH = "catalog_publish"
    NOTIFY = "catalog_notify_subscriptions"
    AUTO_SUBSCRIBE = "catalog_auto_subscribe"


# --- AnswerWorkflow (one per answer id) -------------------------------------------------

__all__ += ["ANSWER_WORKFLOW_TYPE", "UPDATE_BIND", "UPDATE_SELECT_INPUT", "UPDATE_CHECK", "QUERY_ANSWER",
            "AnswerAct", "answer_workflow_id"]

ANSWER_WORKFLOW_TYPE = "AnswerWorkflow"
UPDATE_BIND = "bind"  # BindRequest -> AnswerBindingV1
UPDATE_SELECT_INPUT = "select_input"  # SelectInputRequest -> AnswerBindingV1
UPDATE_CHECK = "check"  # CheckRequest -> Disposition
QUERY_ANSWER = "answer"  # -> AnswerBindingV1


class AnswerAct:
    """Activity names (main task queue, ``mcpsync.activities.ledger.answers``)."""

    LOAD = "answer_load"
    BIND = "answer_bind"
    SELECT = "answer_select"
    OBSERVE = "answer_observe"
    RECORD = "answer_record_disposition"


def answer_workflow_id(answer_id: str) -> str:
    """``mcpsync-answer/<uri_slug of the answer id>-<hash>`` (the bare hash when the slug is empty), readable
    in the Web UI's list; the exact answer id is in the memo. A run under an older id scheme idles out and
    the next request starts this one, which reloads the answer from PostgreSQL."""
    digest = hashlib.sha256(answer_id.encode()).hexdigest()
    slug = uri_slug(answer_id)
    return f"mcpsync-answer/{slug}-{digest[:24]}" if slug else f"mcpsync-answer/{digest[:32]}"
