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


def plot(runs: Sequence[Run], path: Path, grown: dict[str, Any]) -> None:
    panels: list[Panel] = []
    decades = [(1e-3, "1MS"), (1e-2, "10MS"), (0.1, "100MS"), (1.0, "1S"), (10.0, "10S"), (100.0, "100S")]
    for x in runs:
        series = []
        for name, color in (("floor", COLORS["gray"]), ("temporal_floor", COLORS["green"]),
                            ("baseline", COLORS["orange"]), ("system", COLORS["blue"])):
            lat = sorted(max(v, 1e-3) for v in x.curves.get(name, []))
            floors = ("floor", "temporal_floor")
            total = len(lat) + (x.result[name]["convergence"]["unconverged"] if name not in floors else 0)
            if not lat:
                continue
            pts = [(lat[0], 1.0)] + [(v, max(1e-3, (total - i - 1) / total)) for i, v in enumerate(lat)]
            label = {"system": "MCPSYNC", "baseline": "NAIVE SDK CLIENT",
                     "floor": "FLOOR (1 NOTIFY + 1 READ)",
                     "temporal_floor": "TEMPORAL FLOOR (SIGNAL + 1 ACTIVITY)"}[name]
            series.append(Series(label, pts, color, step=True))
        panels.append(Panel(f"{x.transport} N={x.n}: changes not yet converged",
                            "time since the change committed",
                            "fraction", (1e-3, 100.0), (1e-3, 1.0), x_log=True, y_log=True, x_ticks=decades,
                            y_ticks=[(1.0, "1"), (0.1, "0.1"), (0.01, "0.01"), (0.001, "0.001")],
                            series=series, markers=[(1.0, "TARGET P99.9", COLORS["red"])]))
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

