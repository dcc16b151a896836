"""The simulator's interpreter of the subscription program: a deterministic coroutine scheduler.

Contract:
- ``ProgramRun`` runs ``mcpsync.workflows.subscription_program.SubscriptionProgram`` (the code
  production runs) as one Temporal run would: the main coroutine, read tasks and async
  handlers are coroutines it steps by hand. An activation runs every ready coroutine, then
  checks the wait conditions in the order they were registered (all that hold wake up),
  and repeats until nothing is ready: the order of temporalio's own workflow event loop.
- An activation with no input since the last one is skipped (``activate``): the program's wait
  conditions read its own state, and none depends on the clock (the deadline keeper's ask
  ``until_read_due(rt.now())`` only whether a deadline applies), so none can have changed; as in
  Temporal, where a run is activated only by a new event. The skipped activation is not logged.
- The program's runtime calls become commands (``ScheduleActivity``, ``ContinueAsNew``) the
  simulation carries out, and inputs (``start``, ``signal``, ``complete``, ``fail``,
  ``fire_timer``, ``suggest_continue_as_new``, ``activate``) the simulation feeds back. Each
  input is logged with the time it arrived; ``replayed`` rebuilds a run from a prefix of that
  log (Temporal's reset: a new run replays history to the reset point, with the draws of
  ``random``/``uuid4`` made so far, and fresh draws after it). Coroutines cannot be copied;
  replaying is how a reset is modelled, and it is exact because the program is deterministic.
- Failures the program would cause in Temporal are reported, never raised: an exception in a
  coroutine (``errors``; the run wedges if it was the main loop) and a main loop that runs
  ``LOOP_BUDGET`` iterations without waiting (a livelock: Temporal's deadlock detector).
- What the run shows operators (``Publisher``: search attributes, the details panel) is shown nowhere:
  the run's publisher is ``_Unshown``, which compares and makes nothing (the checker judges the
  ledger's rows and the run's record, not what it publishes).
- No I/O, no wall clock, no hashing of ``id()``s: the same inputs give the same commands.
"""

from __future__ import annotations

import random
import types
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cache
from typing import Any, NoReturn, TypeVar

from mcpsync.workflows.interpreter import ActivityFailed, Publication, WaitKind
from mcpsync.workflows.records.subscription import (
    CloseRequest,
    ResumeRequest,
    SessionChanged,
    SubscriptionStart,
)
from mcpsync.workflows.subscription_details import Publisher
from mcpsync.workflows.subscription_program import SubscriptionProgram
from mcpsync.workflows.subscription_state import SubscriptionFence, UpdateDisposition

__all__ = ["ProgramRun", "RunStage", "Signal", "ScheduleActivity", "ContinueAsNew", "LOOP_BUDGET"]

T = TypeVar("T")

LOOP_BUDGET = 200
"""Main-loop iterations in one activation without waiting before the run counts as livelocked."""


class RunStage(StrEnum):
    RUNNING = "running"
    DONE = "done"  # run() returned: the workflow completed
    CONTINUED = "continued"  # continue_as_new was called
    WEDGED = "wedged"  # an exception in the main loop, or a livelock: Temporal would fail every task


class Signal(StrEnum):
    """Signals and updates the simulation delivers (the wire names of ``mcpsync.workflows.names``)."""

    UPDATED = "updated"
    SESSION_CHANGED = "session_changed"
    CATALOG = "catalog"
    CONFLICT = "conflict"
    REVOKE = "revoke"
    RESUME = "resume"  # update (validated)
    CLOSE_SIGNAL = "close_signal"
    CLOSE = "close"  # update
    FIRST_READ = "first_read"  # update: the record once the first read was judged
    READ_REPORTED = "read_reported"  # resource_read: the ingress read a notified change itself (ReadReport)


# Read once: on Python 3.11 an ``Enum`` class attribute goes through the metaclass's ``__getattr__``
# hook (about ten times a plain attribute), and these are compared on every scheduler pass (``_S``:
# every signal delivered).
RUNNING = RunStage.RUNNING


class _S:
    """The signals ``signal`` tells apart, as plain class attributes."""

    UPDATED, READ_REPORTED, SESSION_CHANGED = Signal.UPDATED, Signal.READ_REPORTED, Signal.SESSION_CHANGED
    CATALOG, CONFLICT, REVOKE, RESUME = Signal.CATALOG, Signal.CONFLICT, Signal.REVOKE, Signal.RESUME
    CLOSE_SIGNAL, CLOSE, FIRST_READ = Signal.CLOSE_SIGNAL, Signal.CLOSE, Signal.FIRST_READ

ENDED = frozenset({RunStage.DONE, RunStage.WEDGED})  # the chain does not go on (``Simulation.chain_running``)
# Coverage labels of the timers of these waits; any other wait's timer is the read deadline's.
_TIMER_KINDS = {WaitKind.SESSION: "session", WaitKind.RECONCILIATION: "reconcile",
                WaitKind.WATCHDOG: "watchdog"}


# Not frozen (nor ``_Wait``): a frozen dataclass's ``__init__`` sets each field through
# ``object.__setattr__``, four times a plain one's, and the program makes one of each for every
# activity and wait. Neither is changed once made.
@dataclass(slots=True)
class ScheduleActivity:
    seq: int
    name: str
    arg: Any


@dataclass(frozen=True, slots=True)
class ContinueAsNew:
    start: SubscriptionStart


@types.coroutine
def _request(request: ScheduleActivity | _Wait) -> Generator[Any, Any, Any]:
    """The one awaitable the interpreter hands out: it passes a request up to the scheduler."""
    return (yield request)


class _ContinuedAsNew(BaseException):
    def __init__(self, start: SubscriptionStart) -> None:
        super().__init__("continue-as-new")
        self.start = start


class _Livelock(BaseException):
    pass


@dataclass(eq=False, slots=True)
class _Task:
    coro: Coroutine[Any, Any, Any]
    handler: Signal | None = None  # the signal or update an async handler runs for


@dataclass(eq=False, slots=True)
class _Wait:
    """A wait the program asked for (of the task being stepped); once ``_step`` took it, one of the run's
    conditions."""

    condition: Callable[[], bool]
    timeout: timedelta | None
    kind: WaitKind
    task: _Task
    fire_at: datetime | None = None  # its timer, if it has a timeout
    timer_kind: str = ""  # coverage label of that timer: session | reconcile | poll | safety | watchdog


class _Unshown(Publisher):
    """The run's publisher in the simulator, which shows nothing: nothing to compare, no ``Publication``
    to make (the program publishes about 28 times a schedule)."""

    def details(self, fence: SubscriptionFence, *, watched: bool = False) -> None:
        pass

    def search_attributes(self, fence: SubscriptionFence) -> None:
        pass


# The payloads ``signal`` delivers: frozen records, so one a process (one a generation).
_RESUME = ResumeRequest(reason="simulated resume")
_CLOSE_SIGNAL = CloseRequest(reason="simulated close signal")
_CLOSE = CloseRequest(reason="simulated close")


@cache
def _session_changed(generation: int) -> SessionChanged:
    return SessionChanged(session_generation=generation)


@cache
def _seeded_draw(name: str) -> float:
    """The first draw of ``random.Random(name)``. Runs are named alike in every schedule (``c1r1``, …),
    so the same few names recur: each is seeded once a process (seeding a string hashes it)."""
    return random.Random(name).random()


@dataclass(slots=True)
class ProgramRun:
    """One run of the program. ``commands`` collects what it asks for since the last read."""

    start_args: SubscriptionStart
    incarnation: str
    id_prefix: str
    started_at: datetime
    clock: datetime  # workflow.now(): the simulation sets it before each input
    program: SubscriptionProgram = field(init=False)
    stage: RunStage = RunStage.RUNNING
    commands: list[ScheduleActivity | ContinueAsNew] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[tuple[str | None, UpdateDisposition]] = field(default_factory=list)
    can_suggested: bool = False
    handlers: Counter[Signal] = field(default_factory=Counter)  # running async handlers by signal
    log: list[tuple[datetime, str, tuple[Any, ...]]] = field(default_factory=list)  # (at, input, arguments)
    draws: list[Any] = field(default_factory=list)
    _replay_draws: deque[Any] = field(default_factory=deque)
    _ready: deque[tuple[_Task, Any, BaseException | None]] = field(default_factory=deque)
    _conditions: list[_Wait] = field(default_factory=list)
    _activities: dict[int, _Task] = field(default_factory=dict)
    _requests: dict[int, ScheduleActivity] = field(default_factory=dict)
    _seq: int = 0
    _uuids: int = 0
    _randoms: int = 0
    _main: _Task | None = None
    _iterations: int = 0
    _handlers_running: int = 0  # the sum of ``handlers``
    _input: bool = False  # an input arrived since the last activation (``activate`` runs)
    # Activations run: the run's state changes only in one (an input, even a handler run at once, is
    # followed by one), so while this count is the same, what the run holds is (the checker asks).
    activations: int = 0
    _stepping: _Task = field(init=False)  # the task ``_step`` runs (whose ``wait`` it is)
    # What the simulation asks after every step, found once per change of ``_conditions``: the main
    # loop's wait and the armed timer that fires first.
    _indexed: bool = False
    _main_condition: _Wait | None = None
    _first_timer: _Wait | None = None

    def __post_init__(self) -> None:
        self.program = SubscriptionProgram(self.start_args, self)
        self.program.publisher = _Unshown(self.publish, self.start_args.options)

    # --- what the simulation inspects -----------------------------------------------------------

    @property
    def fence(self) -> SubscriptionFence:
        return self.program.fence

    @property
    def main_wait(self) -> WaitKind | None:
        """What the main loop waits for (None: an activity, or it is not running)."""
        if not self._indexed:
            self._index()
        c = self._main_condition
        return c.kind if c is not None else None

    def _next_timer(self) -> _Wait | None:
        """The armed timer that fires first (the main loop's, or the deadline keeper's; the first
        registered of those that fire at the same time)."""
        if not self._indexed:
            self._index()
        return self._first_timer

    def _index(self) -> None:
        main: _Wait | None = None
        first: _Wait | None = None
        for c in self._conditions:
            if main is None and c.task is self._main:
                main = c
            at = c.fire_at
            if at is not None and (first is None or first.fire_at is None or at < first.fire_at):
                first = c
        self._main_condition, self._first_timer, self._indexed = main, first, True

    @property
    def timer_at(self) -> datetime | None:
        """When the next armed timer fires."""
        c = self._next_timer()
        return c.fire_at if c is not None else None

    @property
    def pending_timer(self) -> str:
        """Which timer would fire next: "session", "reconcile", "poll", "safety", "watchdog", or ""."""
        c = self._next_timer()
        return c.timer_kind if c is not None else ""

    # --- inputs -----------------------------------------------------------------------------------

    def _record(self, op: str, *args: Any) -> None:
        """Log an input (``replayed`` feeds it again); the next activation runs."""
        self.log.append((self.clock, op, args))
        self._input = True

    def start(self) -> None:
        self._record("start")
        self._main = _Task(self.program.run())
        self._ready.append((self._main, None, None))

    def signal(self, kind: Signal, payload: Any) -> None:
        """Deliver a signal or update (an update its validator rejects is not run)."""
        self._record("signal", kind, payload)
        p = self.program
        if kind == _S.UPDATED:
            self._handler(kind, p.on_resource_updated(payload))
        elif kind == _S.READ_REPORTED:
            self._handler(kind, p.on_read_reported(payload))
        elif kind == _S.SESSION_CHANGED:
            p.on_session_changed(_session_changed(payload))
        elif kind == _S.CATALOG:
            p.on_catalog_reconciled(payload)
        elif kind == _S.CONFLICT:
            p.on_identity_conflict(payload)
        elif kind == _S.REVOKE:
            p.on_revoke(payload)
        elif kind == _S.RESUME:
            try:
                p.validate_resume(_RESUME)
            except ValueError:
                return
            self._handler(kind, p.on_resume(_RESUME))
        elif kind == _S.CLOSE_SIGNAL:
            p.on_close_signal(_CLOSE_SIGNAL)
        elif kind == _S.CLOSE:
            p.validate_close(_CLOSE)
            self._handler(kind, p.on_close(_CLOSE))
        elif kind == _S.FIRST_READ:
            self._handler(kind, p.on_first_read())

    def _handler(self, kind: Signal, coro: Coroutine[Any, Any, Any]) -> None:
        self.handlers[kind] += 1
        self._handlers_running += 1
        self._ready.append((_Task(coro, kind), None, None))

    def complete(self, seq: int, result: Any) -> None:
        """An activity returned ``result``."""
        self._record("complete", seq, result)
        task = self._activities.pop(seq, None)
        if task is not None:
            self._ready.append((task, result, None))

    def fail(self, seq: int, cause: str) -> None:
        self._record("fail", seq, cause)
        task = self._activities.pop(seq, None)
        if task is not None:
            self._ready.append((task, None, ActivityFailed(cause)))

    def fire_timer(self) -> bool:
        c = self._next_timer()
        if c is None:
            return False
        self._record("fire_timer")
        self._conditions.remove(c)
        self._indexed = False
        self._ready.append((c.task, False, None))
        return True

    def suggest_continue_as_new(self) -> None:
        self._record("suggest_continue_as_new")
        self.can_suggested = True

    def activate(self) -> None:
        """Run every coroutine until all of them wait on something external. Without an input since
        the last activation nothing runs: every condition was false when that one ended, and what they
        read has not changed since (the module's contract)."""
        if not self._input:
            return
        self.log.append((self.clock, "activate", ()))
        self._input = False
        self.activations += 1
        self._iterations = 0
        while self.stage == RUNNING:
            while self._ready and self.stage == RUNNING:
                task, value, exc = self._ready.popleft()
                self._step(task, value, exc)
            if self.stage != RUNNING:
                return
            woken: list[_Wait] = []
            waiting: list[_Wait] = []
            for c in self._conditions:
                (woken if c.condition() else waiting).append(c)
            if not woken:
                return
            self._conditions, self._indexed = waiting, False
            for c in woken:
                self._ready.append((c.task, True, None))

    @classmethod
    def replayed(cls, source: ProgramRun, inputs: int, draws: int, id_prefix: str) -> ProgramRun:
        """A reset run: a fresh run replays ``source``'s first ``inputs`` inputs (with its first
        ``draws`` random draws), then draws afresh under ``id_prefix``. Its ``commands`` are the
        activities pending at that point (scheduled and not completed: the new run schedules them again)."""
        run = cls(source.start_args, source.incarnation, id_prefix, source.started_at, source.clock)
        run._replay_draws = deque(source.draws[:draws])
        for at, op, args in source.log[:inputs]:
            run.clock = at
            getattr(run, op)(*args)
        run.commands = [run._requests[seq] for seq in sorted(run._activities)]
        run.errors.clear()
        run.notes.clear()
        return run

    # --- the scheduler ------------------------------------------------------------------------------

    def _step(self, task: _Task, value: Any, exc: BaseException | None) -> None:
        self._stepping = task
        try:
            request = task.coro.throw(exc) if exc is not None else task.coro.send(value)
        except StopIteration:
            self._finished(task)
            if task is self._main:
                self.stage = RunStage.DONE
            return
        except _ContinuedAsNew as can:
            self.commands.append(ContinueAsNew(can.start))
            self.stage = RunStage.CONTINUED
            return
        except _Livelock:
            self.errors.append(f"livelock: the main loop ran {LOOP_BUDGET} iterations without blocking "
                               f"(state={self.fence.s.state.value}, "
                               f"catalog={self.program.identity.catalog is not None})")
            self.stage = RunStage.WEDGED
            return
        except Exception as err:  # noqa: BLE001 - reported as a violation, as Temporal would fail the task
            self.errors.append(f"{type(err).__name__}: {err}")
            self._finished(task)
            if task is self._main:
                self.stage = RunStage.WEDGED
            return
        if isinstance(request, ScheduleActivity):
            self._activities[request.seq] = task
            self._requests[request.seq] = request
            self.commands.append(request)
            return
        assert isinstance(request, _Wait)
        timeout = request.timeout
        if timeout is not None and timeout <= timedelta(0):
            self._ready.append((task, False, None))  # asyncio.wait_for(…, 0): times out at once
            return
        kind = ""
        if timeout is not None:
            kind = _TIMER_KINDS.get(request.kind,
                                    "poll" if self.fence.s.staleness_bound_seconds is not None else "safety")
        request.timer_kind = kind
        if timeout is not None:
            request.fire_at = self.clock + timeout
        self._conditions.append(request)
        self._indexed = False

    def _finished(self, task: _Task) -> None:
        if task.handler is not None:
            self.handlers[task.handler] -= 1
            self._handlers_running -= 1

    # --- subscription_program.Interpreter ------------------------------------------------------------------

    def _draw(self, make: Callable[[], Any]) -> Any:
        value = self._replay_draws.popleft() if self._replay_draws else make()
        self.draws.append(value)
        return value

    def _fresh_uuid(self) -> str:
        self._uuids += 1
        return f"{self.id_prefix}-r{self._uuids}"

    def _fresh_random(self) -> float:
        self._randoms += 1  # its own counter: uuid draws do not shift the random sequence
        return _seeded_draw(f"{self.id_prefix}/{self._randoms}")

    def now(self) -> datetime:
        return self.clock

    def uuid4(self) -> str:
        return str(self._draw(self._fresh_uuid))

    def random(self) -> float:
        return float(self._draw(self._fresh_random))

    def patched(self, patch_id: str) -> bool:
        return True  # the simulator runs the newest program: every run takes every patch

    def start_time(self) -> datetime | None:
        return self.started_at

    def first_execution_run_id(self) -> str:
        return self.incarnation

    def _schedule(self, name: str, arg: Any) -> Awaitable[Any]:
        self._seq += 1
        return _request(ScheduleActivity(self._seq, name, arg))

    async def ledger(self, name: str, arg: Any, result_type: type[T]) -> T | None:
        result: T | None = await self._schedule(name, arg)
        return result

    async def mcp(self, task_queue: str, name: str, arg: Any, result_type: type[T]) -> T:
        result: T = await self._schedule(name, arg)
        return result

    async def wait(self, condition: Callable[[], bool], timeout: timedelta | None, kind: WaitKind) -> bool:
        woke: bool = await _request(_Wait(condition, timeout, kind, self._stepping))
        return woke

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._ready.append((_Task(coro), None, None))

    def all_handlers_finished(self) -> bool:
        return not self._handlers_running

    def continue_as_new_suggested(self) -> bool:
        return self.can_suggested

    def history_length(self) -> int:
        return 0  # not modelled: continue-as-new is suggested by the schedule instead

    def target_version_changed(self) -> bool:
        return False

    def continue_as_new(self, start: SubscriptionStart) -> NoReturn:
        raise _ContinuedAsNew(start)

    def publish(self, publication: Publication) -> None:
        pass  # the checker judges the ledger's rows, not what the run publishes

    def update_noted(self, notification_id: str | None, disposition: UpdateDisposition) -> None:
        self.notes.append((notification_id, disposition))

    def loop_iteration(self) -> None:
        self._iterations += 1
        if self._iterations > LOOP_BUDGET:
            raise _Livelock()

