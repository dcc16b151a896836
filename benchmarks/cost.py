"""The cost of a change: CPU of the run's processes and Temporal history per change.

Contract:
- :func:`run_processes` names the processes of one benchmark run from /proc: this process (the
  driver and the naive baseline; in the in-process layout also mcpsync's worker and ingress), the
  processes named by the caller (the split layout's worker and ingress), the Temporal dev server
  (and its children), the fixture servers (every other descendant of this process, e.g. a stdio
  fixture the ingress spawned) and the PostgreSQL
  server holding ``database``: its postmaster (the parent of a backend connected to that
  database, embedded or system), the postmaster's auxiliary processes (shared with every other
  database on that server) and the backends connected to ``database`` (other databases'
  backends are left out).
- :func:`cpu_sample` reads utime+stime of those processes; :func:`cpu_delta` diffs two samples by
  (pid, start time): a process that started in between counts from zero, one that exited in
  between is lost (counted in ``exited``), a process whose stat could not be read is named in
  ``unreadable``.
- :func:`history_per_change` counts, over a wall-clock window, the history events of the given
  workflows by type and their Temporal Cloud billable actions (``benchmarks.actions``), following
  continue-as-new from the run that was current when the window opened. Fetching a history is one
  round trip per run, so at large N the caller passes a sample (``benchmarks.common.spread``) and the
  number it stands for: the counts are scaled to it (``WindowHistory.sampled`` says how many were read).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from benchmarks import actions
from benchmarks.common import gather_limited

__all__ = ["CpuSample", "Role", "WindowHistory", "cpu_delta", "cpu_sample", "history_per_change",
           "run_processes", "start_runs"]

_BACKEND = re.compile(r"^postgres: (?:\S+: )?(\S+) (\S+) (\S+\(\d+\)|\[local\])")  # user db host(port)


class Role(StrEnum):
    BENCHMARK_PROCESS = "benchmark_process"
    MCPSYNC_WORKER = "mcpsync_worker"  # split layout only (benchmarks.services): workflows, ledger activities
    MCPSYNC_INGRESS = "mcpsync_ingress"  # split layout only: session hosts, the read cycle
    TEMPORAL_DEV_SERVER = "temporal_dev_server"
    FIXTURES = "fixtures"
    POSTGRESQL = "postgresql"


@dataclass(frozen=True)
class _Proc:
    ppid: int
    comm: str
    start: int  # clock ticks after boot: with the pid, identifies the process
    cpu: float  # utime + stime, seconds


def _read_procs() -> tuple[dict[int, _Proc], list[int]]:
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, _Proc] = {}
    unreadable: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            data = Path(f"/proc/{name}/stat").read_text()
        except FileNotFoundError:
            continue  # exited meanwhile
        except OSError:
            unreadable.append(int(name))
            continue
        close = data.rfind(")")
        f = data[close + 2:].split()
        out[int(name)] = _Proc(int(f[1]), data[data.find("(") + 1:close], int(f[19]),
                               (int(f[11]) + int(f[12])) / tick)
    return out, unreadable


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def run_processes(temporal_pid: int | None, database: str,
                  named: dict[int, Role] | None = None) -> tuple[dict[int, Role], list[str]]:
    """pid -> role for the run's processes, and notes on what could not be found. ``named``: child
    processes whose role the caller knows (their own descendants stay fixtures)."""
    procs, _ = _read_procs()
    children: dict[int, list[int]] = {}
    for pid, p in procs.items():
        children.setdefault(p.ppid, []).append(pid)

    def tree(root: int) -> set[int]:
        seen, todo = set(), [root]
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            todo.extend(children.get(pid, []))
        return seen

    me = os.getpid()
    roles: dict[int, Role] = {me: Role.BENCHMARK_PROCESS}
    temporal = tree(temporal_pid) if temporal_pid and temporal_pid in procs else set()
    for pid in temporal:
        roles[pid] = Role.TEMPORAL_DEV_SERVER
    known = {pid: role for pid, role in (named or {}).items() if pid in procs}
    for pid in tree(me) - {me} - temporal - set(known):
        roles[pid] = Role.FIXTURES
    roles.update(known)
    notes: list[str] = []
    if not temporal:
        notes.append("the Temporal dev server's pid was not found")
    postmasters = set()
    for pid, p in procs.items():
        if p.comm.startswith("postgres") and pid not in roles:
            m = _BACKEND.match(_cmdline(pid))
            if m and m.group(2) == database:
                postmasters.add(p.ppid)
    if not postmasters:
        notes.append(f"no PostgreSQL backend connected to {database} was found: PostgreSQL not counted")
    for pm in postmasters:
        roles[pm] = Role.POSTGRESQL
        for pid in children.get(pm, []):
            m = _BACKEND.match(_cmdline(pid))
            if m is None or m.group(2) == database:  # auxiliary process, or a backend of this run's database
                roles[pid] = Role.POSTGRESQL
    return roles, notes


@dataclass
class CpuSample:
    cpu: dict[tuple[int, int], tuple[Role, float]]  # (pid, start) -> (role, cpu seconds)
    unreadable: list[int] = field(default_factory=list)


def cpu_sample(roles: dict[int, Role]) -> CpuSample:
    procs, unreadable = _read_procs()
    return CpuSample({(pid, procs[pid].start): (role, procs[pid].cpu) for pid,
                      role in roles.items() if pid in procs},
                     [pid for pid in unreadable if pid in roles])


def cpu_delta(before: CpuSample, after: CpuSample, changes: int) -> dict[str, Any]:
    by_role: dict[str, float] = {r.value: 0.0 for r in Role}
    procs: dict[str, int] = {r.value: 0 for r in Role}
    for key, (role, cpu) in after.cpu.items():
        prev = before.cpu.get(key)
        by_role[role.value] += cpu - (prev[1] if prev else 0.0)
        procs[role.value] += 1
    exited = [key[0] for key in before.cpu if key not in after.cpu]
    total = sum(by_role.values())
    per = (lambda s: round(1000 * s / changes, 1)) if changes else (lambda s: None)
    return {
        "cpu_ms_per_change": per(total),
        "by_process_ms_per_change": {k: per(v) for k, v in by_role.items()},
        "cpu_seconds": round(total, 2),
        "processes": procs,
        "exited_during_window": exited,
        "unreadable": sorted(set(before.unreadable) | set(after.unreadable)),
    }


@dataclass
class WindowHistory:
    workflows: int = 0  # the workflows the figures stand for
    runs: int = 0
    tally: actions.Tally = field(default_factory=actions.Tally)  # events by type, billable actions
    sampled: int = 0  # the workflows whose histories were read (fewer than ``workflows``: scaled to it)

    @property
    def events(self) -> int:
        return self.tally.events

    @property
    def workflow_tasks_completed(self) -> int:
        return self.tally.of(EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)

    @property
    def activities_scheduled(self) -> int:
        return self.tally.of(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)

    @property
    def signals(self) -> int:
        """resource_updated / resource_read and every other signal the runs received."""
        return self.tally.of(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)


async def start_runs(client: Client, workflow_ids: Sequence[str]) -> dict[str, str]:
    """workflow id -> the run current now (where :func:`history_per_change` starts following)."""
    async def one(wid: str) -> tuple[str, str]:
        d = await client.get_workflow_handle(wid).describe()
        return wid, d.run_id

    return dict(await gather_limited([one(w) for w in workflow_ids], 16))


async def history_per_change(client: Client, runs: dict[str, str], t0: float, t1: float, *,
                             of: int | None = None) -> WindowHistory:
    """Events stamped within [t0, t1] (wall clock, seconds) over each workflow's runs from ``runs``;
    ``of``: how many workflows ``runs`` samples (default: just these), the counts scaled to it."""
    out = WindowHistory(workflows=len(runs), sampled=len(runs))

    async def one(wid: str, run_id: str) -> tuple[int, actions.Tally]:
        runs_seen, tally = 0, actions.Tally()
        next_run: str | None = run_id
        while next_run:
            history = await client.get_workflow_handle(wid, run_id=next_run).fetch_history()
            runs_seen += 1
            next_run = None
            tally += actions.count_run(history.events, t0, t1)
            for ev in reversed(history.events):
                if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                    next_run = ev.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
                    break
        return runs_seen, tally

    for r, t in await gather_limited([one(w, rid) for w, rid in runs.items()], 16):
        out.runs += r
        out.tally += t
    if of is not None and of > len(runs) > 0:
        factor = of / len(runs)
        out.workflows = of
        out.runs = of + round((out.runs - len(runs)) * factor)
        out.tally = out.tally.scaled(factor)
    return out
