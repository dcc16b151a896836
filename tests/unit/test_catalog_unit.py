"""Pure catalog logic, no I/O: scan accumulation, A/B judgement, snapshot proofs, the reconciler.

These drive ``mcpsync.workflows.catalog_rules`` the way the scan activity and the workflow do, with
synthetic pages, so every rule has a fast test besides the real-stack ones.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mcpsync.workflows.catalog_rules import (
    SNAPSHOT_EXTENSION,
    CatalogPhase,
    CatalogReconciler,
    CatalogState,
    ScanAccumulator,
    canonical_descriptor,
    cursor_digest,
    judge_pair,
    refresh_enabled,
    rollout_bucket,
    set_digest,
    snapshot_negotiated,
)
from mcpsync.workflows.records.catalog import (
    CatalogKey,
    CatalogPolicy,
    CatalogSnapshot,
    ListChanged,
    ResourceDiscoveryScanV1,
    RolloutMode,
    RolloutPolicy,
    ScanStatus,
    SnapshotStatus,
)
from mcpsync.workflows.records.subscription import SessionInfo

KEY = b"k" * 32
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def res(uri: str, **extra: Any) -> dict[str, Any]:
    return {"uri": uri, "name": uri.rsplit("/", 1)[-1], **extra}


def stamp(sid: str, uris: list[str]) -> dict[str, Any]:
    return {SNAPSHOT_EXTENSION: {"id": sid, "setDigest": set_digest(uris), "count": len(set(uris))}}


def run_scan(pages: list[tuple[list[dict[str, Any]], str | None, dict[str, Any] | None]], *,
             edition: str = "2025-11-25", negotiated: bool = False, page_cap: int = 100,
             templates: list[dict[str, Any]] | None = None, template_meta: dict[str, Any] | None = None,
             ) -> ScanAccumulator:
    """Feed resources pages in order (each: items, next cursor, _meta), then one template page."""
    acc = ScanAccumulator(edition=edition, page_cap=page_cap, snapshot_negotiated=negotiated, cursor_key=KEY)
    cursor: str | None = None
    for items, next_cursor, meta in pages:
        cursor = acc.page("resources", cursor, items, next_cursor, meta)
        if cursor is None:
            break
    if not acc.stopped:
        acc.page("templates", None, templates or [], None, template_meta)
    return acc


def record(acc: ScanAccumulator, label: str, *, before: int = 0, after: int = 0, gen: int = 1,
           start: datetime = T0, rid: str = "r1") -> ResourceDiscoveryScanV1:
    digests = acc.digests()
    return ResourceDiscoveryScanV1(
        scan_id=f"{rid}-{label}", reconciliation_id=rid, label=label, subject="alice",
        server="fx",  # type: ignore[arg-type]
        session_generation=gen, status=acc.final_status(), first_request_at=start,
        completed_at=start + timedelta(seconds=1), page_count=acc.pages,
        resource_count=len(acc.descriptors["resources"]),
        uri_set_digest=digests[0] if digests else None, descriptor_set_digest=digests[1] if digests else None,
        template_set_digest=digests[2] if digests else None, list_changed_before=before,
        list_changed_after=after, notifications_observed=after - before, snapshot=acc.snapshot_evidence(),
        problems=acc.problems,
    )


# --- canonical forms ------------------------------------------------------------------


def test_canonical_descriptor_keeps_uri_exact_and_drops_content_hints() -> None:
    a = canonical_descriptor({"uri": "demo://A/b%2F", "name": "n", "size": 10, "_meta": {"x": 1},
                              "annotations": {"lastModified": "2026", "priority": 0.5}})
    b = canonical_descriptor({"annotations": {"priority": 0.5, "lastModified": "2027"}, "name": "n",
                              "uri": "demo://A/b%2F", "size": 99})
    assert a == b == {"uri": "demo://A/b%2F", "name": "n", "annotations": {"priority": 0.5}}
    assert canonical_descriptor({"uri": "demo://a/", "name": "n"}) != canonical_descriptor({"uri": "demo://a",
                                                                                           "name": "n"})


def test_set_digest_is_order_and_duplicate_independent_but_exact() -> None:
    assert set_digest(["b", "a", "a"]) == set_digest(["a", "b"])
    assert set_digest(["ab", "c"]) != set_digest(["a", "bc"])  # netstrings: no ambiguity
    assert set_digest(["demo://x"]) != set_digest(["demo://X"])


def test_cursor_digest_is_keyed_and_never_the_cursor() -> None:
    d = cursor_digest("eyJvIjoyfQ", KEY)
    assert "eyJvIjoyfQ" not in d and d != cursor_digest("eyJvIjoyfQ", b"other" * 8)
    assert cursor_digest(None, KEY) == "start"


# --- one scan -----------------------------------------------------------------------------


def test_full_scan_follows_every_cursor() -> None:
    acc = run_scan([([res("a://1"), res("a://2")], "CURSOR-2", None), ([res("a://3")], "CURSOR-3", None),
                    ([res("a://4")], None, None)])
    assert acc.final_status() == ScanStatus.COMPLETE
    assert list(acc.descriptors["resources"]) == ["a://1", "a://2", "a://3", "a://4"]
    assert acc.pages == 4 and acc.page_cursor_digests[0] == "r:start"
    assert all("CURSOR" not in d for d in acc.page_cursor_digests)


def test_empty_string_cursor_is_a_cursor_on_2026_07_28_and_the_end_on_2025_11_25() -> None:
    modern = run_scan([([res("a://1")], "", None), ([res("a://2")], None, None)], edition="2026-07-28")
    legacy = run_scan([([res("a://1")], "", None), ([res("a://2")], None, None)], edition="2025-11-25")
    assert list(modern.descriptors["resources"]) == ["a://1", "a://2"]
    assert list(legacy.descriptors["resources"]) == ["a://1"]


def test_cursor_loop_is_detected() -> None:
    acc = run_scan([([res("a://1")], "c2", None), ([res("a://2")], "c3", None), ([res("a://3")], "c2", None)])
    assert acc.final_status() == ScanStatus.CURSOR_LOOP and acc.digests() is None


def test_page_cap_stops_an_endless_listing() -> None:
    acc = run_scan([([], f"c{i}", None) for i in range(1, 50)], page_cap=10)
    assert acc.final_status() == ScanStatus.PAGE_CAP and acc.pages == 10


@pytest.mark.parametrize("second, problem", [
    (res("a://2"), "duplicate"),
    (res("a://2", description="edited"), "descriptor changed between pages"),
])
def test_uri_on_two_pages_makes_the_scan_inconsistent(second: dict[str, Any], problem: str) -> None:
    acc = run_scan([([res("a://1"), res("a://2")], "c2", None), ([second, res("a://3")], None, None)])
    assert acc.final_status() == ScanStatus.INCONSISTENT
    assert problem in acc.problems[0] and "a://2" in acc.problems[0]


def test_failure_reported_by_the_caller_wins() -> None:
    acc = run_scan([([res("a://1")], "c2", None)])
    acc.fail(ScanStatus.INVALID_CURSOR, "rejected")
    assert acc.final_status() == ScanStatus.INVALID_CURSOR and acc.snapshot_evidence().bound is False


# --- snapshot evidence ----------------------------------------------------------------------

URIS = ["a://1", "a://2", "a://3"]
TEMPLATES = [{"uriTemplate": "a://{x}", "name": "t"}]


def snapshot_scan(metas: list[dict[str, Any] | None], *, negotiated: bool = True,
                  template_meta: dict[str, Any] | None | str = "same") -> ScanAccumulator:
    pages = [([res(URIS[0]), res(URIS[1])], "c2", metas[0]), ([res(URIS[2])], None, metas[1])]
    tmeta = stamp("s1", ["a://{x}"]) if template_meta == "same" else template_meta
    return run_scan(pages, negotiated=negotiated, templates=TEMPLATES,
                    template_meta=tmeta)  # type: ignore[arg-type]


def test_every_page_bound_to_one_id_is_a_proof() -> None:
    ev = snapshot_scan([stamp("s1", URIS), stamp("s1", URIS)]).snapshot_evidence()
    assert ev.bound and ev.snapshot_id == "s1" and ev.pages == 3


@pytest.mark.parametrize("metas, negotiated, template_meta, reason", [
    ([stamp("s1", URIS), None], True, "same", "carry no snapshot id"),
    ([stamp("s1", URIS), stamp("s2", URIS)], True, "same", "different snapshot ids"),
    ([stamp("s1", ["a://1", "a://2"]), stamp("s1", ["a://1", "a://2"])], True, "same", "forged or torn"),
    ([stamp("s1", URIS), stamp("s1", URIS)], False, "same", "did not negotiate"),
    ([stamp("s1", URIS), stamp("s1", URIS)], True, None, "carry no snapshot id"),
])
def test_missing_mismatched_forged_or_unnegotiated_ids_prove_nothing(
        metas: list[Any], negotiated: bool, template_meta: Any, reason: str) -> None:
    ev = snapshot_scan(metas, negotiated=negotiated, template_meta=template_meta).snapshot_evidence()
    assert not ev.bound and reason in ev.reason


def test_snapshot_negotiation_needs_version_1() -> None:
    assert snapshot_negotiated({SNAPSHOT_EXTENSION: {"version": 1}})
    assert not snapshot_negotiated({SNAPSHOT_EXTENSION: {"version": 2}})
    assert not snapshot_negotiated(None)


# --- A/B judgement ------------------------------------------------------------------------


def clean() -> ScanAccumulator:
    return run_scan([([res("a://1"), res("a://2")], "c2", None), ([res("a://3")], None, None)])


def test_two_matching_scans_are_unproven_and_one_scan_is_nothing() -> None:
    a = record(clean(), "A")
    b = record(clean(), "B", start=T0 + timedelta(seconds=2))
    verdict = judge_pair(a, b)
    assert verdict.match and verdict.status == SnapshotStatus.SNAPSHOT_UNPROVEN
    assert not judge_pair(a, a).match  # the same scan twice is not two scans


def test_two_bound_scans_with_one_id_are_proven() -> None:
    metas = [stamp("s1", URIS), stamp("s1", URIS)]
    a = record(snapshot_scan(metas), "A")
    b = record(snapshot_scan(metas), "B", start=T0 + timedelta(seconds=2))
    v = judge_pair(a, b)
    assert v.match and v.status == SnapshotStatus.SNAPSHOT_PROVEN and v.snapshot_id == "s1"
    b2 = record(snapshot_scan([stamp("s9", URIS), stamp("s9", URIS)],
                              template_meta=stamp("s9", ["a://{x}"])), "B", start=T0 + timedelta(seconds=2))
    assert judge_pair(a, b2).status == SnapshotStatus.SNAPSHOT_UNPROVEN


@pytest.mark.parametrize("change, reason", [
    ({"b_pages": [([res("a://1")], "c2", None), ([res("a://3")], None, None)]}, "digests differ"),
    ({"a_counts": (0, 1)}, "list_changed during scan A"),
    ({"b_counts": (0, 1)}, "list_changed during scan B"),
    ({"b_counts": (1, 1)}, "between the scans"),
    ({"b_gen": 2}, "session changed"),
    ({"b_start": T0}, "did not start after"),
])
def test_anything_suspicious_restarts(change: dict[str, Any], reason: str) -> None:
    a_before, a_after = change.get("a_counts", (0, 0))
    b_before, b_after = change.get("b_counts", (a_after, a_after))
    a = record(clean(), "A", before=a_before, after=a_after)
    b_acc = run_scan(change["b_pages"]) if "b_pages" in change else clean()
    b = record(b_acc, "B", before=b_before, after=b_after, gen=change.get("b_gen", 1),
               start=change.get("b_start", T0 + timedelta(seconds=2)))
    verdict = judge_pair(a, b)
    assert not verdict.match and reason in verdict.reason


def test_incomplete_scan_never_matches() -> None:
    loop = run_scan([([res("a://1")], "c2", None), ([res("a://2")], "c2", None)])
    v = judge_pair(record(loop, "A"), record(clean(), "B", start=T0 + timedelta(seconds=2)))
    assert not v.match and "CURSOR_LOOP" in v.reason


# --- rollout --------------------------------------------------------------------------------


def test_rollout_is_deterministic_and_monotonic_in_the_percentage() -> None:
    uris = [f"demo://r/{i}" for i in range(2000)]
    five = {u for u in uris
            if refresh_enabled(RolloutPolicy(server="fx", mode=RolloutMode.PERCENT, percent=5),
                                               "alice", "fx", u)}
    twenty = {u for u in uris
              if refresh_enabled(RolloutPolicy(server="fx", mode=RolloutMode.PERCENT, percent=20),
                                                 "alice", "fx", u)}
    assert five <= twenty and 50 < len(five) < 150 and 300 < len(twenty) < 500
    assert rollout_bucket("alice", "fx", uris[0]) == rollout_bucket("alice", "fx", uris[0])
    assert not any(refresh_enabled(RolloutPolicy(server="fx", mode=RolloutMode.SHADOW), "alice", "fx", u)
                   for u in uris)
    assert all(refresh_enabled(RolloutPolicy(server="fx"), "alice", "fx", u) for u in uris)


# --- the reconciler -------------------------------------------------------------------------


def reconciler(**policy: Any) -> CatalogReconciler:
    return CatalogReconciler(CatalogState(key=CatalogKey(subject="alice", server="fx"),
                                          policy=CatalogPolicy(**policy)))


def session(list_changed: bool) -> SessionInfo:
    return SessionInfo(subject="alice", server="fx", generation=1, edition="2025-11-25", subscribe=True,
                       list_changed=list_changed, task_queue="q", opened_at=T0)


def catalog(next_review: datetime) -> CatalogSnapshot:
    return CatalogSnapshot(catalog_id=1, subject="alice", server="fx", reconciliation_id="r1", scan_a="a",
                           scan_b="b", status=SnapshotStatus.SNAPSHOT_UNPROVEN, session_generation=1,
                           window_started_at=T0, measured_at=T0, staleness_bound_seconds=10,
                           next_review_at=next_review, uri_set_digest="d", descriptor_set_digest="d",
                           template_set_digest="d", resource_count=3, template_count=0)


def test_list_changed_signals_coalesce_and_late_ones_are_ignored() -> None:
    r = reconciler()
    r.begin("r1")
    assert not r.s.wanted
    for n in (1, 2, 3):
        r.note_list_changed(ListChanged(session_generation=1, count=n))
    assert r.s.wanted and r.s.want_reason == "list_changed" and r.s.list_changed_signals == 3
    r.begin("r2")
    b = record(clean(), "B", before=3, after=3)
    r.published(catalog(T0 + timedelta(seconds=60)), b)
    assert not r.s.wanted
    r.note_list_changed(ListChanged(session_generation=1, count=2))  # delayed: already reflected
    assert not r.s.wanted
    r.note_list_changed(ListChanged(session_generation=1, count=4))
    assert r.s.wanted


def test_signal_newer_than_scan_b_asks_for_one_follow_up() -> None:
    r = reconciler()
    r.begin("r1")
    r.note_list_changed(ListChanged(session_generation=1, count=5))
    r.s.wanted = False  # the restart already absorbed it in this run...
    r.published(catalog(T0), record(clean(), "B", before=4, after=4))
    assert r.s.wanted  # ...but scan B ended at count 4: one more reconciliation


def test_restarts_back_off_after_the_immediate_ones() -> None:
    r = reconciler(immediate_restarts=2, restart_backoff_seconds=1, restart_backoff_max_seconds=5)
    delays = []
    for _ in range(6):
        r.restart("x")
        delays.append(r.backoff_seconds())
    assert delays == [0, 0, 1, 2, 4, 5]
    assert r.s.phase == CatalogPhase.BACKOFF and r.s.wanted


@pytest.mark.parametrize("list_changed, interval", [(False, 10.0), (True, 100.0)])
def test_review_schedule_is_jittered_early_and_the_bound_covers_it(list_changed: bool,
                                                                   interval: float) -> None:
    r = reconciler(rescan_seconds=10, rescan_seconds_with_list_changed=100, jitter_fraction=0.2)
    r.bind_session(session(list_changed))
    a = record(clean(), "A")
    b = record(clean(), "B", start=T0 + timedelta(seconds=2))
    now = T0 + timedelta(seconds=3)
    for fraction in (0.0, 0.5, 0.999):
        next_review, bound = r.schedule(now, a, b, fraction)
        delay = (next_review - now).total_seconds()
        assert interval * 0.8 <= delay <= interval
        assert bound >= (next_review - T0).total_seconds()


def test_state_survives_continue_as_new_serialization() -> None:
    r = reconciler()
    r.begin("r1")
    r.note_list_changed(ListChanged(session_generation=3, count=2))
    r.scan_finished(record(clean(), "A"))
    r.published(catalog(T0 + timedelta(seconds=60)), record(clean(), "B", gen=3, before=2, after=2))
    carried = CatalogState.model_validate(r.s.model_dump(mode="json"))
    assert carried == r.s and carried.list_changed_seen == {3: 2} and carried.covered == (3, 2)
