"""What the subscription program needs from its interpreter, and what it hands back.

Contract:
- ``Interpreter`` is the narrow protocol ``SubscriptionProgram`` runs over: time, randomness and ids,
  activities (ledger and session host), waits, spawned coroutines, continue-as-new, publication.
  Temporal's implementation is ``mcpsync.workflows.subscription.TemporalInterpreter``; the simulator's
  is ``sim/interpreter.ProgramRun``. No temporalio import here.
- ``WaitKind`` names every wait, ``ActivityFailed`` is how a session-queue activity fails for good,
  ``Publication`` is what the run shows operators (search attributes, the details panel).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, NoReturn, Protocol, TypeVar

from mcpsync.workflows.records.subscription import SubscriptionStart, SubscriptionState
from mcpsync.workflows.subscription_state import UpdateDisposition

__all__ = ["PATCH_AFTER_0_2_0", "ActivityFailed", "Publication", "Interpreter", "WaitKind"]

T = TypeVar("T")

PATCH_AFTER_0_2_0 = "after-0.2.0"
"""The one ``workflow.patched`` id of every change to 0.2.0's workflow commands made before the next
release (docs/upgrades.md): the dispatch margin (``read_deadline``), the deadline keeper's far-moved
re-arm (``deadline_keeper``), a new run's one first ledger call (``Act.START_SUBSCRIPTION``,
``SubscriptionProgram``) and the watchdog of a run whose safety reads the ledger schedules
(``deadline_keeper``, ``Act.WATCH_VERIFICATIONS``). A run asks it once, before its first command:
one marker (and one ``TemporalChangeVersion`` upsert) a run."""


class WaitKind(StrEnum):
    """What a ``Interpreter.wait`` waits for: names the wait for the simulator's scheduler and checker."""

    IDLE = "idle"  # the main loop has nothing to do until work or the read deadline
    SESSION = "session"  # no usable session: back off until a new generation or the recheck timer
    TOMBSTONE = "tombstone"  # TOMBSTONE_PENDING: only a catalog (or close/revocation) moves it
    RECONCILIATION = "reconciliation"  # RECONCILIATION_REQUIRED: resume, evidence, or its time bound
    CONTINUE_AS_NEW = "continue_as_new"  # reads and handlers drain before continue-as-new
    DRAIN = "drain"  # after the loop: reads and handlers drain before the run returns
    RELOAD = "reload"  # a notification handler waits for the run to reload the durable fence
    CLOSE_UPDATE = "close_update"  # the close update waits for the run to finish
    RESUME_UPDATE = "resume_update"  # the resume update waits for the main loop to serve it
    FIRST_READ_UPDATE = "first_read_update"  # the first_read update waits for a judged read (or none to come)
    DEADLINE = "deadline"  # the deadline keeper waits for a deadline to apply, or for it to pass
    WATCHDOG = "watchdog"  # the keeper's watchdog waits its horizon, then for the main loop's look


class ActivityFailed(Exception):
    """An activity on the session queue failed for good (retries exhausted or non-retryable)."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


@dataclass(frozen=True, slots=True)
class Publication:
    """What the run shows operators: search attributes and the Web UI's current-details text."""

    state: SubscriptionState  # McpState: the subscription's state (the read phase is in the details)
    session_generation: int
    subscription_generation: int
    watermark: int
    # The Web UI's current-details text, rendered when called (None: unchanged). An interpreter that
    # shows it calls it in ``publish``, before the run moves on; one that shows nothing skips the render.
    details: Callable[[], str] | None
    upsert: bool = True  # the search attributes changed (a history event); else only the details


class Interpreter(Protocol):
    """What the program needs from its interpreter. Temporal's is ``mcpsync.workflows.subscription``."""

    def now(self) -> datetime: ...
    def uuid4(self) -> str: ...
    def random(self) -> float: ...
    def start_time(self) -> datetime | None: ...
    def first_execution_run_id(self) -> str: ...

    def patched(self, patch_id: str) -> bool:
        """Whether this run takes the code behind ``patch_id`` (``workflow.patched``: a new run
        does, a replayed run that did not record the marker does not); asked before any command."""
        ...

    async def ledger(self, name: str, arg: Any, result_type: type[T]) -> T | None:
        """A ledger activity on the main queue (retried until it succeeds)."""
        ...

    async def mcp(self, task_queue: str, name: str, arg: Any, result_type: type[T]) -> T:
        """An activity on a session host's queue; raises ``ActivityFailed`` when it fails for good."""
        ...

    async def wait(self, condition: Callable[[], bool], timeout: timedelta | None, kind: WaitKind) -> bool:
        """Until ``condition()`` holds (True) or ``timeout`` elapses (False)."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...
    def all_handlers_finished(self) -> bool: ...
    def continue_as_new_suggested(self) -> bool: ...
    def history_length(self) -> int: ...
    def target_version_changed(self) -> bool: ...
    def continue_as_new(self, start: SubscriptionStart) -> NoReturn: ...
    def publish(self, publication: Publication) -> None: ...
    def update_noted(self, notification_id: str | None, disposition: UpdateDisposition) -> None: ...

    def loop_iteration(self) -> None:
        """Called once per main-loop pass: an interpreter may bound passes without a wait (a livelock)."""
        ...
