"""What a subject may see of its own versions: the one rule, ``public.mcpsync_version_visible``.

Contract:
- The rule is the SQL function of migration 021: a version of subscription (workflow id, subject,
  server, URI) accepted or written at ``at`` is visible to its subject when the subscription is not
  REVOKED and no revocation of it, nor of the subject on that server (that URI or all), was recorded
  at or after ``at``. A whole-subject revoke keeps finished subscriptions (CLOSED, TOMBSTONED,
  UNSUBSCRIBE_UNKNOWN) in their state; the rule hides them all the same.
- ``visible_to_subject(alias, at)`` is the predicate every reader puts in its SQL (``released_content``,
  serve's list, read, subscribe, listen and events); the consumer role's ``revocation_scope`` policy
  calls the same function. No other code filters on revocation.
"""

from __future__ import annotations

__all__ = ["RULE_FUNCTION", "visible_to_subject"]

RULE_FUNCTION = "public.mcpsync_version_visible"


def visible_to_subject(alias: str, at: str) -> str:
    """The rule as an SQL predicate over a row ``alias`` with workflow_id, subject, server and uri
    columns (a subscription, a receipt, an outbox row), the version's time being the SQL ``at``."""
    return f"{RULE_FUNCTION}({alias}.workflow_id, {alias}.subject, {alias}.server, {alias}.uri, {at})"
