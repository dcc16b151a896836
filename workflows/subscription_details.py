"""The Web UI's current-details panel of a subscription run: what operators read first.

Contract:
- ``details_panel`` renders the run's state (``FenceState``) as Markdown: phase, freshness (last
  accepted, last verified, next read due, the staleness bound and what sets it), generations,
  ordinals, the last digest (a prefix) and the detail line. Metadata only, never content. A watched
  run (the ledger schedules its safety reads, ``SubscriptionProgram._watched``) claims no deadline:
  it names the ledger's schedule and its watchdog's horizon instead.
- The text is the current details (not history): it changes freely without history events.
- ``Publisher`` writes the panel and the search attributes (``Publication``) only when they change;
  the panel is rendered by the interpreter that shows it, when it publishes (the simulator shows
  nothing and renders nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import partial

from mcpsync.workflows.interpreter import Publication
from mcpsync.workflows.records.subscription import SubscriptionOptions, SubscriptionState
from mcpsync.workflows.subscription_state import SubscriptionFence

__all__ = ["Publisher"]

S = SubscriptionState


def _stamp(at: datetime | None) -> str:
    """A details-panel time: UTC to the second; ``-`` for none."""
    return "-" if at is None else at.strftime("%Y-%m-%d %H:%M:%S UTC")


def _span(seconds: float) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds:g} s"


def details_panel(fence: SubscriptionFence, options: SubscriptionOptions, *, watched: bool = False) -> str:
    """The panel's Markdown: a list, not a table (the Web UI draws a table cell against its label)."""
    s = fence.s
    phase = fence.phase
    key = s.key
    digest = s.last_accepted_digest or "-"
    # Freshness is what the page is for; it changes with the read ordinal, which ``Publisher.details``
    # compares.
    if s.staleness_bound_seconds:
        bound = (f"{s.staleness_bound_seconds:.0f} s (polling; set by "
                 f"{s.staleness_bound_source.value if s.staleness_bound_source else 'config'})")
    elif watched:
        bound = (f"{options.safety_read_seconds:.0f} s (safety read period, kept by the ingress's ledger "
                 f"sweep; a notification is read sooner)")
    elif options.safety_read_seconds:
        bound = f"{options.safety_read_seconds:.0f} s (safety read period; a notification is read sooner)"
    else:
        bound = "-"
    due = _stamp(s.read_due_at if s.state == S.ACTIVE else None)
    if watched:
        due = (f"by the ledger's schedule (the watchdog looks every {_span(options.watchdog_seconds)}, "
               f"next at {_stamp(s.watch_due_at)})")
    rows = [
        ("subject / server", f"{key.subject} / {key.server}"),
        ("last accepted at", _stamp(s.last_accepted_at)),
        ("last verified at", _stamp(s.content_seen_at)),
        ("next read due", due),
        ("staleness bound", bound),
        ("session gen / subscription gen", f"{s.session_generation} / {s.subscription_generation}"),
        ("edition", s.edition or "-"),
        ("last issued / accepted ordinal", f"{s.last_issued_ordinal} / {s.last_accepted_ordinal}"),
        ("watermark", str(s.watermark)),
        ("last receipt", str(s.last_receipt_id or "-")),
        ("last digest", f"`{digest[:23]}`"),
        ("close epoch / ordinal", f"{s.close_epoch} / {'-' if s.close_ordinal is None else s.close_ordinal}"),
        ("updates seen", str(s.updates_seen)),
        ("reads issued", str(s.reads_issued)),
        ("stale receipts / stale after close", f"{s.stale_receipts} / {s.stale_after_close}"),
    ]
    return (f"**{phase.value}** `{key.uri}`\n\n" + "".join(f"- {k}: **{v}**\n" for k, v in rows)
            + (f"\n{s.detail}\n" if s.detail else ""))


class Publisher:
    """What a run shows operators, written only when it changes: the details panel at once (no
    history event), the search attributes when a coroutine blocks (one upsert a workflow task)."""

    def __init__(self, publish: Callable[[Publication], None], options: SubscriptionOptions) -> None:
        self._publish = publish
        self.options = options
        self.last_published: tuple[object, ...] = ()
        self.last_search_attributes: tuple[object, ...] = ()

    def details(self, fence: SubscriptionFence, *, watched: bool = False) -> None:
        """The Web UI's current-details panel, only when it changes (the search attributes follow
        when the coroutine blocks: ``search_attributes``). ``watched``: as ``details_panel``."""
        s = fence.s
        phase = fence.phase
        snapshot = (phase, s.session_generation, s.subscription_generation, s.watermark, s.last_receipt_id,
                    s.detail, s.last_issued_ordinal, watched, s.watch_due_at)
        if snapshot == self.last_published:
            return
        self.last_published = snapshot
        self._publish(Publication(phase, s.session_generation, s.subscription_generation, s.watermark,
                                  partial(details_panel, fence, self.options, watched=watched), upsert=False))

    def search_attributes(self, fence: SubscriptionFence) -> None:
        """Upsert the search attributes if one changed since the last upsert. Called where a coroutine
        blocks or ends, so one workflow task writes at most one upsert per coroutine."""
        s = fence.s
        # McpState is the subscription's state, not the read phase, so it stays ACTIVE through a read
        # (a list filtered on ACTIVE keeps a subscription mid-read) and a change costs one upsert, not
        # two; the phase stays in the details panel and the query.
        values = (s.state, s.session_generation, s.subscription_generation, s.watermark)
        if values == self.last_search_attributes:
            return
        self.last_search_attributes = values
        self._publish(Publication(*values, None))
