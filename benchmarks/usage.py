"""Process and machine usage from /proc: resident memory of a process, CPU of the benchmark's process
tree, of PostgreSQL and of everything else on the machine.

Contract:
- :func:`rss_bytes` is a process's resident set size (0 where /proc cannot tell); :func:`memory_bytes` its
  resident and proportional set sizes (PSS: each shared page divided among the processes that map it, so
  PostgreSQL's shared buffers count once over its processes; None where /proc cannot tell).
- :func:`cpu_snapshot` is the CPU seconds used so far, by group (this process tree, PostgreSQL, other
  processes) plus the machine's busy and total CPU seconds; :func:`cpu_report` diffs two snapshots into a
  phase's ``cpu`` section.
"""

from __future__ import annotations

import os
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Memory", "cpu_report", "cpu_snapshot", "memory_bytes", "rss_bytes"]


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of ``pid`` (default: this process) from /proc, in bytes; 0 if unknown."""
    try:
        for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


@dataclass(frozen=True)
class Memory:
    rss: int
    pss: int


def memory_bytes(pid: int) -> Memory | None:
    """RSS and PSS of ``pid`` from /proc/PID/smaps_rollup, in bytes; None if it exited or cannot be read."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    kib = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("Rss", "Pss"):
            kib[name] = int(rest.split()[0])
    if set(kib) != {"Rss", "Pss"}:
        return None
    return Memory(rss=kib["Rss"] * 1024, pss=kib["Pss"] * 1024)


def cpu_snapshot() -> dict[str, float]:
    """CPU seconds used so far by this process tree, PostgreSQL backends and everything else, plus
    the machine's busy and total CPU seconds (from /proc; empty where /proc is missing)."""
    tick = os.sysconf("SC_CLK_TCK")
    procs: dict[int, tuple[int, str, float]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    for name in entries:
        if not name.isdigit():
            continue
        try:
            data = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        close = data.rfind(")")
        fields = data[close + 2:].split()
        procs[int(name)] = (int(fields[1]), data[data.find("(") + 1:close],
                            (int(fields[11]) + int(fields[12])) / tick)
    ours = {os.getpid()}
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _, _) in procs.items():
            if ppid in ours and pid not in ours:
                ours.add(pid)
                grew = True
    out = {"benchmark_tree": 0.0, "postgres": 0.0, "other_processes": 0.0}
    for pid, (_, comm, cpu) in procs.items():
        key = ("benchmark_tree" if pid in ours else "postgres" if comm.startswith("postgres")
               else "other_processes")
        out[key] += cpu
    with suppress(OSError, ValueError):
        jiffies = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        out["machine_total"] = sum(jiffies[:8]) / tick
        out["machine_busy"] = (sum(jiffies[:8]) - jiffies[3] - jiffies[4]) / tick
    return out


def cpu_report(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    d = {k: round(after.get(k, 0.0) - before.get(k, 0.0), 1) for k in after if k != "other_processes"}
    # Processes that exited meanwhile take their CPU time with them: derive "other" from the machine total.
    d["other_processes"] = round(
        max(0.0, d.get("machine_busy", 0.0) - d["benchmark_tree"] - d["postgres"]), 1)
    total = d.get("machine_total") or 0.0
    return {
        "cpu_seconds": d,
        "machine_busy_pct": round(100 * d.get("machine_busy", 0.0) / total, 1) if total else None,
        "other_processes_pct_of_machine": round(100 * d["other_processes"] / total, 1) if total else None,
        "note": "benchmark_tree = this process (worker, driver, baseline) + dev server + fixtures; "
                "other_processes = anything else on the machine during the phase (it competes for the same "
                "cores)",
    }

