"""Scale-out on one machine: two main workers and two ingress processes against one dev server.

Exactly one ingress owns the (subject, server) session through the PostgreSQL lease. Killing the
owner with SIGKILL hands the session to the other within a bounded time; the new session
generation is higher and the subscription resubscribes and re-reads.

``test_run_bound_to_a_killed_ingress_session_recovers_within_the_lease``: subscriptions started
between the SIGKILL of their sessions' ingress and the handoff send their subscribes to the dead
ingress's queue; the new lease holder polls that queue and answers them at once, so the run is
ACTIVE on the new session within the lease plus a few seconds, not the 60 s schedule-to-close.

``test_two_main_two_ingress_kill_one_of_each_under_load`` (issue 28 item 5, docs/deploy.md): two
``--role main`` and two ``--role ingress`` subprocesses, 20 subscriptions over two leases (two
subjects) and one task queue, a change after another on every URI while one main and the lease
owner of one subject are SIGKILLed: every change gets its ACCEPTED receipt, in commit order, and
the lease moves within ``lease_seconds`` of the kill.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Collection
from contextlib import suppress
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.ingress.process import ingress_task_queue
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.stack.common import REPO_ROOT
from mcpsync.worker.stack.temporal import TemporalDevServer
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState
from mcpsync.workflows.subscription import MCP_HEARTBEAT_TIMEOUT
from tests import cli_process
from tests.conftest import eventually, ledger_rows, running_services, unique
from tests.e2e.conftest import SpareFixtures
from tests.e2e.test_e2e_subscription import _wait_record

LEASE_SECONDS = 2.0
STICKY_SECONDS = 1.0  # [temporal] sticky_queue_timeout_seconds: a killed main's runs go back to the queue


def _spawn(config: Path, role: str, log: Path) -> subprocess.Popen[bytes]:
    env = cli_process.without_database_url()
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "mcpsync.worker.cli", "--config", str(config),
                                 "worker", "--role", role],
                                cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env)


def _stop(procs: Collection[subprocess.Popen[bytes]]) -> None:
    """Stop the spawned workers: SIGTERM to each still running, then up to 10 s each to exit before
    it is killed."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


async def test_two_ingress_one_owner_and_handoff_on_kill(temporal_client: Client,
                                                         temporal_server: TemporalDevServer, ledger: Ledger,
                                                         database_url: str, tmp_path: Path,
                                                         spare_fixtures: SpareFixtures) -> None:
    fx = await spare_fixtures.take()
    server, queue = unique("fx"), unique("scaleq")
    config = tmp_path / "mcpsync.toml"
    config.write_text(
        f'[temporal]\naddress = "{temporal_server.address}"\ntask_queue = "{queue}"\n'
        f'sticky_queue_timeout_seconds = {STICKY_SECONDS}\n\n'
        f'[database]\nurl = "{database_url}"\n\n'
        f'[[servers]]\nname = "{server}"\ntransport = "http"\nurl = "{fx.mcp_url}"\nsubjects = ["alice"]\n'
        f'lease_seconds = {LEASE_SECONDS}\nping_interval_seconds = 0.5\nping_timeout_seconds = 2\n'
    )
    uri = f"demo://scale/{uuid.uuid4().hex}"
    key = SubscriptionKey(subject="alice", server=server, uri=uri)
    first = await fx.create(uri, text="v1")
    procs = {name: _spawn(config, role, tmp_path / f"{name}.log")
             for name, role in (("main1", "main"), ("main2", "main"), ("in1", "ingress"), ("in2", "ingress"))}
    try:
        handle = await start_subscription(temporal_client, key, task_queue=queue)
        await _wait_record(handle, lambda r: r.last_accepted_digest == first["committed"]["digest"],
                           "initial", timeout=60)
        # One owner: the live session is the lease holder's (its queue). Usually generation 1; a box
        # starved past the 2 s lease may already have handed it over once, which is the same rule at work.
        holder, live = await eventually(lambda: _holder_and_its_session(ledger, server),
                                        what="a lease holder with the live session")
        owner_pid = int(holder[0].split(":")[1])
        ingress = {p.pid: name for name, p in procs.items() if name.startswith("in")}
        assert owner_pid in ingress, f"the lease holder {holder} is one of our ingress processes"
        before = await handle.query("subscription")

        procs[ingress[owner_pid]].send_signal(signal.SIGKILL)
        procs[ingress[owner_pid]].wait(timeout=10)
        # And the main worker that has the run cached: its next task waits on that worker's sticky queue.
        cached = await _last_main(handle, {procs[n].pid: n for n in ("main1", "main2")})
        procs[cached].send_signal(signal.SIGKILL)
        procs[cached].wait(timeout=10)
        killed_at = time.monotonic()
        new_holder = await eventually(
            lambda: _other_holder(ledger, server, owner_pid), timeout=LEASE_SECONDS * 5, what="handoff")
        handoff = time.monotonic() - killed_at
        assert int(new_holder[0].split(":")[1]) != owner_pid and new_holder[1] > holder[1]
        session = await eventually(lambda: _session_after(ledger, server, live.generation),
                                   what="new session generation")
        change = await fx.edit(uri, text="after handoff")
        rec = await _wait_record(handle, lambda r: r.last_accepted_digest == change["committed"]["digest"],
                                 "converged after handoff", timeout=60)
        assert rec.session_generation == session.generation > before["session_generation"]
        assert rec.subscription_generation > before["subscription_generation"]
        assert handoff < LEASE_SECONDS * 5
        # The task on the dead worker's sticky queue went back to the shared queue after the configured
        # timeout (the SDK's default is 10 s), and the other main completed it.
        waited = await _sticky_timeouts(handle)
        assert waited and all(w < STICKY_SECONDS + 1 for w in waited), waited
        assert await _last_main(handle, {procs[n].pid: n for n in ("main1", "main2")}) != cached
    finally:
        _stop(procs.values())
        await fx.stop()


async def _last_main(handle: WorkflowHandle, mains: dict[int, str]) -> str:
    """The main worker (of ``mains``, by pid) that completed the run's newest workflow task."""
    last = ""
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            pid = event.workflow_task_completed_event_attributes.identity.split("@", 1)[0]
            last = mains.get(int(pid), last) if pid.isdigit() else last
    assert last, "no workflow task completed by a main worker"
    return last


async def _sticky_timeouts(handle: WorkflowHandle) -> list[float]:
    """Seconds each timed-out workflow task waited after it was scheduled."""
    scheduled: dict[int, float] = {}
    waited: list[float] = []
    async for event in handle.fetch_history_events():
        at = event.event_time.ToDatetime().timestamp()
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            scheduled[event.event_id] = at
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            waited.append(at - scheduled[event.workflow_task_timed_out_event_attributes.scheduled_event_id])
    return waited


async def _other_holder(ledger: Ledger, server: str, old_pid: int) -> tuple[str, int] | None:
    holder = await ledger.sessions.lease_holder("alice", server)
    return holder if holder is not None and int(holder[0].split(":")[1]) != old_pid else None


async def _holder_and_its_session(ledger: Ledger, server: str):  # type: ignore[no-untyped-def]
    holder = await ledger.sessions.lease_holder("alice", server)
    live = await ledger.current_session("alice", server)
    if holder is None or live is None or live.task_queue != ingress_task_queue(holder[0]):
        return None
    return holder, live


async def _session_after(ledger: Ledger, server: str, generation: int):  # type: ignore[no-untyped-def]
    await asyncio.sleep(0)
    s = await ledger.current_session("alice", server)
    return s if s is not None and s.generation > generation else None


# --- a run that binds to a dead ingress's session ---------------------------------------------

DEAD_LEASE_SECONDS = 4.0
DEAD_RECOVERY_SECONDS = DEAD_LEASE_SECONDS + 10  # well under the MCP activities' 60 s schedule-to-close


def _doomed_and_standby(tmp_path: Path, temporal_server: TemporalDevServer, database_url: str,
                        fx: FixtureProcess, server: str, subjects: list[str]) -> tuple[Path, ServerConfig]:
    """The config of an ingress process to SIGKILL (holding ``subjects`` of ``server``) and a standby
    for alice in this process, both with ``DEAD_LEASE_SECONDS`` leases."""
    config = tmp_path / "mcpsync.toml"
    config.write_text(
        f'[temporal]\naddress = "{temporal_server.address}"\ntask_queue = "{unique("unused")}"\n\n'
        f'[database]\nurl = "{database_url}"\n\n'
        f'[[servers]]\nname = "{server}"\ntransport = "http"\nurl = "{fx.mcp_url}"\n'
        f'subjects = {json.dumps(subjects)}\ncatalog = false\nlease_seconds = {DEAD_LEASE_SECONDS}\n'
        f'ping_interval_seconds = 0.5\nping_timeout_seconds = 2\n')
    standby = ServerConfig(name=server, transport="http", url=fx.mcp_url, subjects=["alice"],
                           catalog=False, lease_seconds=DEAD_LEASE_SECONDS, ping_interval_seconds=0.5,
                           ping_timeout_seconds=2)
    return config, standby


async def test_run_bound_to_a_killed_ingress_session_recovers_within_the_lease(
        temporal_client: Client, temporal_server: TemporalDevServer, ledger: Ledger, database_url: str,
        tmp_path: Path, spare_fixtures: SpareFixtures) -> None:
    """Subscriptions started right after their sessions' ingress was SIGKILLed, before the leases move:
    the ledger still names the dead sessions, so their subscribes go to the dead ingress's queue. The
    ingress that takes a lease over polls that queue too once the dead one holds no lease
    (``mcpsync.worker.ingress.orphan_queues``) and answers every task there at once (that generation is gone):
    ``alice``'s run rebinds to the new session and is ACTIVE on it within the lease plus a few seconds,
    not after the subscribe's 60 s schedule-to-close; ``bob``'s, a pair it does not hold (nobody
    does), is answered as quickly and waits for a session."""
    fx = await spare_fixtures.take()
    server = unique("fx")
    config, standby = _doomed_and_standby(tmp_path, temporal_server, database_url, fx, server,
                                          ["alice", "bob"])
    warm, late, bob = (SubscriptionKey(subject=subject, server=server, uri=f"demo://dead/{n}/{uuid.uuid4().hex}")
                       for subject, n in (("alice", "warm"), ("alice", "late"), ("bob", "late")))
    warm_v1 = await fx.create(warm.uri, text="warm v1")
    await fx.create(late.uri, text="late v1")
    await fx.create(bob.uri, text="bob v1")
    doomed = _spawn(config, "ingress", tmp_path / "doomed.log")
    bob_handle: WorkflowHandle | None = None
    try:
        dead = {s: await eventually(lambda s=s: _session_held_by(ledger, s, server, doomed.pid), timeout=60,  # type: ignore[misc]
                                    what=f"the doomed ingress's lease and session of {s}")
                for s in ("alice", "bob")}
        # This process: the main worker and a standby ingress for alice (the lease is taken: it waits).
        async with running_services(temporal_client, ledger, [standby]) as cfg:
            handle = await start_subscription(temporal_client, warm, task_queue=cfg.temporal.task_queue)
            await _wait_record(handle, lambda r: r.last_accepted_digest == warm_v1["committed"]["digest"],
                               "the main worker warm, on the doomed session", timeout=60)

            doomed.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            queue = cfg.temporal.task_queue
            handle, bob_handle = [await start_subscription(temporal_client, k, task_queue=queue)
                                  for k in (late, bob)]
            old = dead["alice"].generation
            rec = await _wait_record(
                handle, lambda r: r.state == SubscriptionState.ACTIVE and r.session_generation > old,
                "ACTIVE on the new session generation", timeout=90)
            recovered = time.monotonic() - killed_at
            # The precondition of the stall: the run's subscribe was scheduled on the dead queue.
            dead_tasks = await _activities_on(handle, dead["alice"].task_queue)
            print(f"dead queue: ACTIVE on generation {rec.session_generation} {recovered:.2f} s after the "
                  f"kill (lease_seconds {DEAD_LEASE_SECONDS}); on the dead queue: {dead_tasks}")
            assert dead_tasks, "the run never scheduled on the dead ingress's queue: nothing was tested"
            assert recovered < DEAD_RECOVERY_SECONDS, recovered
            # Answered there (that generation is gone), not timed out.
            assert all(how == "EVENT_TYPE_ACTIVITY_TASK_COMPLETED" for _, how in dead_tasks), dead_tasks

            bob_tasks = await eventually(lambda: _answered_on(bob_handle, dead["bob"].task_queue),
                                         timeout=DEAD_RECOVERY_SECONDS, interval=0.05,
                                         what="bob's subscribe answered on the dead queue")
            bob_answered = time.monotonic() - killed_at
            print(f"dead queue: bob's answered there {bob_answered:.2f} s after the kill: {bob_tasks}")
            assert bob_answered < DEAD_RECOVERY_SECONDS, bob_answered
            doomed.wait(timeout=10)
    finally:
        if bob_handle is not None:  # nobody holds bob's session: it would rebind to the dead one again
            with suppress(Exception):
                await bob_handle.terminate("test over")
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(timeout=10)
        await fx.stop()


STARTED_RECOVERY_SECONDS = MCP_HEARTBEAT_TIMEOUT.total_seconds() + DEAD_LEASE_SECONDS + 10


async def test_an_activity_the_killed_ingress_had_started_ends_at_its_heartbeat_timeout(
        temporal_client: Client, temporal_server: TemporalDevServer, ledger: Ledger, database_url: str,
        tmp_path: Path, spare_fixtures: SpareFixtures) -> None:
    """A subscribe cycle the ingress had started (its initial read held by the server) when it was
    SIGKILLed: no heartbeat comes any more, so the attempt times out after the heartbeat timeout, not
    the 60 s schedule-to-close, and its retry on the dead queue is answered by the ingress that took the
    session over (``mcpsync.worker.ingress.heartbeats``, ``orphan_queues``). The run is ACTIVE on the new
    session with its initial read accepted within the heartbeat timeout plus the lease plus a few
    seconds."""
    fx = await spare_fixtures.take()
    server = unique("fx")
    config, standby = _doomed_and_standby(tmp_path, temporal_server, database_url, fx, server, ["alice"])
    key = SubscriptionKey(subject="alice", server=server, uri=f"demo://held/{uuid.uuid4().hex}")
    v1 = await fx.create(key.uri, text="held v1")
    await fx.faults(read_delay_ms={key.uri: 120_000})  # the doomed ingress's read never returns
    doomed = _spawn(config, "ingress", tmp_path / "doomed.log")
    try:
        dead = await eventually(lambda: _session_held_by(ledger, "alice", server, doomed.pid), timeout=60,
                                what="the doomed ingress's lease and session")
        async with running_services(temporal_client, ledger, [standby]) as cfg:
            handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)

            async def read_in_flight() -> bool:  # the allocation commits before the request is sent
                rows = await ledger_rows(ledger, "SELECT count(*) FROM read_requests r JOIN subscriptions s"
                                                 " USING (workflow_id) WHERE s.uri=%s", key.uri)
                return bool(rows[0][0])

            await eventually(read_in_flight, timeout=60, what="the initial read sent by the doomed ingress")
            doomed.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            await fx.faults(read_delay_ms={})
            rec = await _wait_record(
                handle,
                lambda r: (r.state == SubscriptionState.ACTIVE and r.session_generation > dead.generation
                           and r.last_accepted_digest == v1["committed"]["digest"]),
                "ACTIVE on the new session with the initial read accepted", timeout=90)
            recovered = time.monotonic() - killed_at
            dead_tasks = await _activities_on(handle, dead.task_queue)
            print(f"started on the dead ingress: ACTIVE on generation {rec.session_generation} "
                  f"{recovered:.2f} s after the kill (heartbeat timeout {MCP_HEARTBEAT_TIMEOUT}, lease "
                  f"{DEAD_LEASE_SECONDS} s); on the dead queue: {dead_tasks}")
            assert dead_tasks == [("mcp_subscribe_cycle", "EVENT_TYPE_ACTIVITY_TASK_COMPLETED")], dead_tasks
            assert recovered < STARTED_RECOVERY_SECONDS, recovered
            doomed.wait(timeout=10)
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(timeout=10)
        await fx.stop()


async def _session_held_by(ledger: Ledger, subject: str, server: str, pid: int):  # type: ignore[no-untyped-def]
    """The live session of (subject, server) when the ingress process ``pid`` holds its lease."""
    holder = await ledger.sessions.lease_holder(subject, server)
    live = await ledger.current_session(subject, server)
    if holder is None or live is None or int(holder[0].split(":")[1]) != pid \
            or live.task_queue != ingress_task_queue(holder[0]):
        return None
    return live


async def _answered_on(handle: WorkflowHandle, task_queue: str) -> list[tuple[str, str]] | None:
    """The run's activities on ``task_queue`` once one of them completed (None before)."""
    tasks = await _activities_on(handle, task_queue)
    return tasks if any(how == "EVENT_TYPE_ACTIVITY_TASK_COMPLETED" for _, how in tasks) else None


async def _activities_on(handle: WorkflowHandle, task_queue: str) -> list[tuple[str, str]]:
    """(activity type, how it ended) of each activity the run scheduled on ``task_queue``."""
    scheduled: dict[int, str] = {}
    ended: dict[int, str] = {}
    closing = {EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "activity_task_completed_event_attributes",
               EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity_task_failed_event_attributes",
               EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity_task_timed_out_event_attributes"}
    async for e in handle.fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = e.activity_task_scheduled_event_attributes
            if attrs.task_queue.name == task_queue:
                scheduled[e.event_id] = attrs.activity_type.name
        elif e.event_type in closing:
            ended[getattr(e, closing[e.event_type]).scheduled_event_id] = EventType.Name(e.event_type)
    return [(name, ended.get(event_id, "open")) for event_id, name in scheduled.items()]


# --- two of each, one of each killed under load ----------------------------------------------

LOAD_LEASE_SECONDS = 3.0
LOAD_URIS = 10  # x 2 subjects = 20 subscriptions
LOAD_ROUNDS = 6  # changes per URI after its creation
KILL_AFTER_CHANGES = 20  # changes accepted by every subscription of the URI before the kills
CHANGE_TIMEOUT = 90.0  # one change to its receipts, a handoff included (2 shared cores)


def _metrics_port(log: Path) -> int | None:
    """The port a worker started with ``[metrics] port = 0`` says it serves on (None: not yet). Picking a
    free port here and passing it would race every other process on the box for it."""
    found = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", log.read_text(errors="replace"))
    return int(found.group(1)) if found else None


def _probe(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


async def _all_ready(ports: dict[str, int]) -> bool | None:
    codes = await asyncio.gather(*(asyncio.to_thread(_probe, port, "/readyz") for port in ports.values()))
    return True if all(c == 200 for c in codes) else None


async def test_two_main_two_ingress_kill_one_of_each_under_load(
        temporal_client: Client, temporal_server: TemporalDevServer, ledger: Ledger, database_url: str,
        tmp_path: Path, spare_fixtures: SpareFixtures) -> None:
    fx = await spare_fixtures.take()
    server, queue = unique("fx"), unique("scaleq")
    subjects = ("alice", "bob")  # two (subject, server) leases for the two ingress processes
    names = {"main1": "main", "main2": "main", "in1": "ingress", "in2": "ingress"}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    for name, role in names.items():
        config = tmp_path / f"{name}.toml"
        config.write_text(
            f'[temporal]\naddress = "{temporal_server.address}"\ntask_queue = "{queue}"\n'
            f'sticky_queue_timeout_seconds = {STICKY_SECONDS}\n\n'
            f'[database]\nurl = "{database_url}"\n\n[metrics]\nport = 0\nrefresh_seconds = 60\n\n'
            f'[[servers]]\nname = "{server}"\ntransport = "http"\nurl = "{fx.mcp_url}"\n'
            f'subjects = {json.dumps(list(subjects))}\ncatalog = false\n'
            f'lease_seconds = {LOAD_LEASE_SECONDS}\nping_interval_seconds = 0.5\nping_timeout_seconds = 2\n')
        procs[name] = _spawn(config, role, tmp_path / f"{name}.log")
    tag = uuid.uuid4().hex[:8]
    uris = [f"demo://scale/{tag}/{i}" for i in range(LOAD_URIS)]
    committed: dict[str, list[str]] = {}
    try:
        async def bound() -> dict[str, int] | None:
            found = {name: _metrics_port(tmp_path / f"{name}.log") for name in names}
            return {name: port for name, port in found.items() if port} if all(found.values()) else None

        ports: dict[str, int] = await eventually(bound, timeout=90, what="all four metrics ports")
        # Positive witness, no sleep: every process says it polls (/readyz) before any work starts.
        await eventually(lambda: _all_ready(ports), timeout=90, what="all four workers polling (/readyz)")
        for uri in uris:
            committed[uri] = [(await fx.create(uri, text=f"{uri} v0"))["committed"]["digest"]]
        keys = [SubscriptionKey(subject=s, server=server, uri=u) for u in uris for s in subjects]
        await asyncio.gather(*(start_subscription(temporal_client, k, task_queue=queue) for k in keys))

        async def accepted_by_all(uri: str, digest: str) -> bool | None:
            for subject in subjects:
                fence = await ledger.fence.find_subscription(subject, server, uri)
                if fence is None or fence.last_accepted_digest != digest:
                    return None
            return True

        await asyncio.gather(*(eventually(lambda u=u: accepted_by_all(u, committed[u][0]), timeout=120,  # type: ignore[misc]
                                          what=f"initial read of {u}") for u in uris))
        holders = {s: await ledger.sessions.lease_holder(s, server) for s in subjects}
        ingress_of = {procs[n].pid: n for n in ("in1", "in2")}
        assert all(h is not None and int(h[0].split(":")[1]) in ingress_of for h in holders.values()), holders
        owner = ingress_of[int(holders["alice"][0].split(":")[1])]  # type: ignore[index]
        moving = [s for s, h in holders.items() if ingress_of[int(h[0].split(":")[1])] == owner]  # type: ignore[index]

        done = [0]
        kills_done = asyncio.Event()

        async def changes(uri: str) -> None:
            for r in range(1, LOAD_ROUNDS + 1):
                digest = (await fx.edit(uri, text=f"{uri} v{r}"))["committed"]["digest"]
                committed[uri].append(digest)
                await eventually(lambda d=digest: accepted_by_all(uri, d), timeout=CHANGE_TIMEOUT,  # type: ignore[misc]
                                 what=f"{uri} v{r} accepted by {subjects}")
                done[0] += 1
                if r == LOAD_ROUNDS - 1:  # the last change of every URI comes after the kills
                    await kills_done.wait()

        rss = {name: _rss_mib(proc.pid) for name, proc in procs.items()}  # for docs/deploy.md's base RSS
        writers = asyncio.gather(*(changes(u) for u in uris))
        await eventually(lambda: _at_least(done, KILL_AFTER_CHANGES), timeout=120, what="changes flowing")
        procs[owner].send_signal(signal.SIGKILL)
        procs["main1"].send_signal(signal.SIGKILL)
        killed_at, killed_wall = time.monotonic(), time.time()
        kills_done.set()
        handoffs: dict[str, float] = {}
        for subject in moving:
            await eventually(lambda s=subject: _holder_other_than(ledger, s, server, procs[owner].pid),  # type: ignore[misc]
                             timeout=LOAD_LEASE_SECONDS * 5, interval=0.02, what=f"lease of {subject} moved")
            handoffs[subject] = time.monotonic() - killed_at
        changes_at_kill = done[0]
        await writers
        for name in (owner, "main1"):
            assert procs[name].wait(timeout=10) == -signal.SIGKILL
        print(f"scale-out: killed {owner} (leases {moving}) and main1 after {changes_at_kill} changes; "
              f"lease handoff {', '.join(f'{s} {t:.2f} s' for s, t in handoffs.items())} "
              f"(lease_seconds {LOAD_LEASE_SECONDS}); {done[0]} changes x {len(subjects)} subscriptions; "
              f"RSS before the kills (MiB, {len(keys)} subscriptions): {rss}")

        # 0 lost: every committed version of every URI has an ACCEPTED receipt in every subscription,
        # in commit order, nothing else accepted, and the record ends at the last version.
        for uri in uris:
            for subject in subjects:
                rows = await ledger_rows(
                    ledger, "SELECT rv.content_digest FROM resource_versions rv JOIN subscriptions s"
                    " ON s.workflow_id = rv.workflow_id WHERE s.subject = %s AND s.server = %s AND s.uri = %s"
                    " AND rv.status = 'ACCEPTED' ORDER BY rv.receipt_id", subject, server, uri)
                assert [r[0] for r in rows] == committed[uri], (f"{subject} {uri}: receipts out of order or "
                                                                "lost")
        assert done[0] == LOAD_URIS * LOAD_ROUNDS
        assert set(handoffs) == set(moving) and all(t < LOAD_LEASE_SECONDS
                                                    for t in handoffs.values()), handoffs
        # The survivors carry on: the other main polls the shared queue, the other ingress holds every lease.
        survivor = "in2" if owner == "in1" else "in1"
        assert all(int(h[0].split(":")[1]) == procs[survivor].pid
                   for h in [await ledger.sessions.lease_holder(s, server) for s in moving] if h is not None)
        assert _probe(ports["main2"], "/readyz") == 200 and _probe(ports[survivor], "/readyz") == 200
        # The task queue spread the workflows over both mains; the survivor took over main1's.
        served = await _workflow_task_workers(temporal_client,
                                              [await ledger.fence.workflow_id_of(k) for k in keys],
                                              {procs["main1"].pid: "main1", procs["main2"].pid: "main2"},
                                              killed_wall)
        print(f"scale-out: workflow tasks completed per main: {served}")
        assert served["main1"]["before"] > 0 and served["main2"]["before"] > 0, served
        assert served["main2"]["after"] > 0 and served["main1"]["after"] == 0, served
    finally:
        _stop(procs.values())
        await fx.stop()


async def _workflow_task_workers(client: Client, workflow_ids: list[str],
                                 mains: dict[int, str], killed: float) -> dict[str, dict[str, int]]:
    """Workflow tasks completed per main worker (identity ``pid@host``), before and after the kill
    (``killed``: wall-clock seconds; the dev server runs on this box's clock)."""
    completed: list[tuple[float, str]] = []
    for wf in workflow_ids:
        async for event in client.get_workflow_handle(wf).fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                ident = event.workflow_task_completed_event_attributes.identity
                pid = int(ident.split("@", 1)[0]) if ident.split("@", 1)[0].isdigit() else -1
                if pid in mains:
                    completed.append((event.event_time.ToDatetime().timestamp(), mains[pid]))
    out = {name: {"before": 0, "after": 0} for name in mains.values()}
    for t, who in completed:
        out[who]["before" if t <= killed else "after"] += 1
    return out


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return -1.0


async def _at_least(counter: list[int], n: int) -> bool | None:
    await asyncio.sleep(0)
    return True if counter[0] >= n else None


async def _holder_other_than(ledger: Ledger, subject: str, server: str,
                             old_pid: int) -> tuple[str, int] | None:
    holder = await ledger.sessions.lease_holder(subject, server)
    return holder if holder is not None and int(holder[0].split(":")[1]) != old_pid else None
