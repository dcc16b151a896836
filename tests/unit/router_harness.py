"""Drives one ``IngressRouter.process()`` turn (workflows/ingress.py) as an interpreter would, with
the answers a test gives: the unit tests of the router's rules share it (test_resync.py,
test_ingress_settle.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from mcpsync.workflows.ingress import Effect, IngressRouter, Stamp, Stamped, Turn
from mcpsync.workflows.records.subscription import ResourceUpdated

STAMPED_AT = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)


def run_turn(router: IngressRouter, answers: Mapping[type, Any],
             during: Callable[[Effect], None] = lambda _: None) -> tuple[Turn, list[Effect]]:
    """Run one turn: each ``Stamp`` is answered with the live session on generation 1, every other
    effect with ``answers[type(effect)]`` (an effect the test gives no answer for fails the test with
    ``KeyError``). ``during`` sees each effect before it is answered (a read cycle's ``absorb`` is
    called there, where ``run_cycle`` calls it). Answers the turn and the effects in order."""
    program = router.process()
    effects: list[Effect] = []
    answer: Any = None
    while True:
        try:
            effect = program.send(answer)
        except StopIteration as stop:
            return stop.value, effects
        effects.append(effect)
        during(effect)
        if isinstance(effect, Stamp):
            answer = Stamped(ResourceUpdated(uri=effect.uri, session_generation=1), STAMPED_AT, "r", 1)
        else:
            answer = answers[type(effect)]
