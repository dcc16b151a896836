"""The benchmark's PNG (``benchmarks.png``): per run, the fraction of changes not yet converged over time
(mcpsync, the naive client, both floors); per transport with several N, convergence and memory per
subscription against N."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.png import COLORS, Canvas, Panel, Series
from benchmarks.report import Run

__all__ = ["plot"]


def survival(values: Sequence[float], total: int, floor: float) -> list[tuple[float, float]]:
    """A step curve of the fraction of ``total`` still above x, over the sorted ``values`` (the rest of
    ``total`` never ends: the curve stays above 0 by them), no lower than ``floor``."""
    return [(values[0], 1.0)] + [(v, max(floor, (total - i - 1) / total)) for i, v in enumerate(values)]


def plot(runs: Sequence[Run], path: Path, grown: dict[str, Any]) -> None:
    panels: list[Panel] = []
    decades = [(1e-3, "1MS"), (1e-2, "10MS"), (0.1, "100MS"), (1.0, "1S"), (10.0, "10S"), (100.0, "100S")]
    for x in runs:
        series = []
        for name, color in (("floor", COLORS["gray"]), ("temporal_floor", COLORS["green"]),
                            ("baseline", COLORS["orange"]), ("system", COLORS["blue"])):
            lat = sorted(max(v, 1e-3) for v in x.curves.get(name, []))
            if not lat:
                continue
            floors = ("floor", "temporal_floor")
            total = len(lat) + (x.result[name]["convergence"]["unconverged"] if name not in floors else 0)
            pts = survival(lat, total, 1e-3)
            label = {"system": "MCPSYNC", "baseline": "NAIVE SDK CLIENT",
                     "floor": "FLOOR (1 NOTIFY + 1 READ)",
                     "temporal_floor": "TEMPORAL FLOOR (SIGNAL + 1 ACTIVITY)"}[name]
            series.append(Series(label, pts, color, step=True))
        # The scale figure's target is p99 <= 250 ms (benchmarks.scale), the full run's p99.9 <= 1 s.
        target = ((0.25, "TARGET P99", COLORS["red"]) if "scale" in x.result
                  else (1.0, "TARGET P99.9", COLORS["red"]))
        panels.append(Panel(f"{x.transport} N={x.n}: changes not yet converged",
                            "time since the change committed",
                            "fraction", (1e-3, 100.0), (1e-3, 1.0), x_log=True, y_log=True, x_ticks=decades,
                            y_ticks=[(1.0, "1"), (0.1, "0.1"), (0.01, "0.01"), (0.001, "0.001")],
                            series=series, markers=[target]))
        if x.curves.get("verification"):
            panels.append(_verification_panel(x))
    for transport, g in grown.items():
        ns = [row["subscriptions"] for row in g["series"]]
        lo, hi = min(ns) / 1.5, max(ns) * 1.5
        lines = []
        for key, color in (("convergence_p50_ms", COLORS["blue"]), ("convergence_p99_ms", COLORS["purple"]),
                           ("convergence_p999_ms", COLORS["red"])):
            pts = [(row["subscriptions"], max(row[key] or 1, 1) / 1000) for row in g["series"]]
            lines.append(Series(key.split("_")[1].upper(), pts, color))
        panels.append(Panel(f"{transport}: convergence vs subscriptions", "subscriptions", "seconds",
                            (lo, hi), (1e-3, 100.0), x_log=True, y_log=True,
                            x_ticks=[(v, str(v)) for v in ns], y_ticks=decades, series=lines))
        mem = [(row["subscriptions"], max(row["worker_bytes_per_subscription"],
                                          1) / 1024) for row in g["series"]]
        tmem = [(row["subscriptions"], max(row["temporal_server_bytes_per_subscription"], 1) / 1024)
                for row in g["series"]]
        panels.append(Panel(f"{transport}: memory per subscription", "subscriptions", "KIB", (lo, hi),
                            (1.0, 10000.0), x_log=True, y_log=True, x_ticks=[(v, str(v)) for v in ns],
                            y_ticks=[(1, "1"), (10, "10"), (100, "100"), (1000, "1000"), (10000, "10000")],
                            series=[Series("WORKER RSS", mem, COLORS["blue"]),
                                    Series("TEMPORAL DEV SERVER RSS", tmem, COLORS["green"])]))
    cols = 2 if len(panels) > 1 else 1
    rows = math.ceil(len(panels) / cols)
    pw, ph = 640, 380
    canvas = Canvas(pw * cols, ph * rows)
    for i, p in enumerate(panels):
        p.draw(canvas, (i % cols) * pw, (i // cols) * ph, pw, ph)
    path.write_bytes(canvas.png())



def _verification_panel(x: Run) -> Panel:
    """--scale-only: the fraction of rows whose longest gap between verifications exceeded x periods."""
    gaps = sorted(x.curves["verification"])
    floor = 0.5 / max(1, len(gaps))
    top = max(2.0, gaps[-1] * 1.1)
    step = 0.5 if top <= 4 else float(math.ceil(top / 8))
    return Panel(f"{x.transport} N={x.n}: longest verification gap", "longest gap / period",
                 "rows", (0.0, top), (floor, 1.0), y_log=True,
                 x_ticks=[(i * step, f"{i * step:g}") for i in range(int(top / step) + 1)],
                 y_ticks=[(10.0 ** -k, f"{10.0 ** -k:g}") for k in range(6) if 10.0 ** -k >= floor],
                 series=[Series("ROWS", survival(gaps, len(gaps), floor), COLORS["blue"], step=True)],
                 markers=[(1.0, "THE PERIOD", COLORS["red"])])
