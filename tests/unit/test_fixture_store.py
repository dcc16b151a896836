"""The fixture's catalog history (``fixture/store.py``): what each subject could list at every catalog
generation on record, kept bounded, at a cost per mutation that does not grow with the catalog."""

from __future__ import annotations

import time

import pytest

from mcpsync.fixture import store as store_module
from mcpsync.fixture.store import ResourceStore


def _put(store: ResourceStore, uri: str, **kw: object) -> int:
    store.put(uri, kind="text", data=b"x", **kw)  # type: ignore[arg-type]
    return store.generation


def test_each_generation_lists_what_the_subject_could_see_then() -> None:
    s = ResourceStore()
    g1 = _put(s, "demo://a")
    g2 = _put(s, "demo://b", visible_to=["bob"])
    assert _put(s, "demo://a") == g2, "a content-only edit keeps the generation"
    s.set_visibility("demo://a", ["bob"])
    g3 = s.generation
    s.delete("demo://b")
    g4 = s.generation
    s.restore("demo://b")
    g5 = s.generation
    assert s.listed_by_generation("alice") == [(0, []), (g1, ["demo://a"]), (g2, ["demo://a"]), (g3, []),
                                               (g4, []), (g5, [])]
    assert s.listed_by_generation("bob") == [(0, []), (g1, ["demo://a"]), (g2, ["demo://a", "demo://b"]),
                                             (g3, ["demo://a", "demo://b"]), (g4, ["demo://a"]),
                                             (g5, ["demo://a", "demo://b"])]


def test_the_history_keeps_its_last_generations_and_the_oldest_kept_lists_in_full(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "_HISTORY_LIMIT", 4)
    s = ResourceStore()
    for i in range(6):
        _put(s, f"demo://{i}")
    s.delete("demo://0")
    history = s.listed_by_generation("anyone")
    assert [g for g, _ in history] == [4, 5, 6, 7]
    assert history[0][1] == [f"demo://{i}" for i in range(4)]
    assert history[-1][1] == [f"demo://{i}" for i in range(1, 6)]


def test_a_create_costs_the_same_in_a_large_catalog() -> None:
    """A copy of the whole catalog per generation would make N creates O(N²) in time and memory: a
    benchmark's fixture holds 50,000 URIs."""
    def creates(store: ResourceStore, prefix: str, n: int = 500) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            _put(store, f"{prefix}/{i}")
        return time.perf_counter() - t0

    large = ResourceStore()
    creates(large, "demo://fill", 10_000)
    empty = min(creates(ResourceStore(), "demo://e") for _ in range(3))
    large_t = min(creates(large, f"demo://l{k}") for k in range(3))
    assert large_t < 4 * empty, (empty, large_t)
