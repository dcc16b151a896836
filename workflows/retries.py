"""Contract: the retry policy the workflows give their ledger activities (a deterministic
constant, shared so that every workflow retries the ledger alike; a workflow narrows it with
``dataclasses.replace``, e.g. the errors its activities raise that no retry can fix)."""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

LEDGER_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200),
                           maximum_interval=timedelta(seconds=10))
"""PostgreSQL briefly away: retry without a limit (the activity's timeout bounds each attempt)."""
