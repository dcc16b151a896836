"""The benchmark's metrics probe: its own ``mcpsync.worker.observe.metrics`` endpoint (the Temporal SDK
runtime
the run's client uses) plus the split layout's worker and ingress endpoints, scraped and diffed per
phase; :meth:`Probe.breakdown` turns a phase's diff into mean latencies of the read path's steps."""

from __future__ import annotations

from typing import Any

from benchmarks.common import TASK_QUEUE
from benchmarks.services import Scrape, scrape
from mcpsync.worker.main.config import MetricsConfig
from mcpsync.worker.observe.metrics import serve_metrics
from mcpsync.workflows.names import Act

__all__ = ["Probe"]


class Probe:
    """The benchmark's own ``mcpsync.worker.observe.metrics`` endpoint: Temporal SDK and mcpsync meters,
    diffed per
    phase."""

    def __init__(self) -> None:
        self.server = serve_metrics(MetricsConfig(port=0), set_default_runtime=False)
        self.runtime = self.server.runtime
        self.also: list[str] = []  # the split layout's worker and ingress endpoints (benchmarks.services)

    async def scrape(self) -> Scrape:
        """Every endpoint's samples, summed by (name, labels): counters and histogram sums/counts of
        the worker and the ingress add up as if one process had served them."""
        out: Scrape = {}
        for url in [self.server.url or "", *self.also]:
            for key, value in (await scrape(url)).items():
                out[key] = out.get(key, 0.0) + value
        return out

    @staticmethod
    def diff(after: Scrape, before: Scrape) -> Scrape:
        return {k: v - before.get(k, 0.0) for k, v in after.items()}

    @staticmethod
    def mean_ms(d: Scrape, name: str, **labels: str) -> float | None:
        want = set(labels.items())
        # The SDK's runtime exports durations in seconds with a unit suffix (mcpsync.worker.observe.metrics:
        # unit_suffix=True, durations_as_seconds=True): temporal_request_latency is
        # temporal_request_latency_seconds there.
        names = {name, f"{name}_seconds"}
        total = sum(v for (n, lab), v in d.items() if n.removesuffix("_sum") in names and n.endswith("_sum")
                    and want <= lab)
        count = sum(v for (n, lab), v in d.items() if n.removesuffix("_count") in names
                    and n.endswith("_count")
                    and want <= lab)
        return round(1000 * total / count, 2) if count > 0 else None

    def breakdown(self, d: Scrape, server: str, session_queue: str) -> dict[str, Any]:
        """Mean latencies during the churn phase, from the SDK runtime's and mcpsync's histograms;
        ``session_queue``: the ingress queue the session's MCP activities ran on."""
        m = self.mean_ms
        return {
            "signal_workflow_execution": m(d, "temporal_request_latency",
                                           operation="SignalWorkflowExecution"),
            "workflow_task_schedule_to_start": m(d, "temporal_workflow_task_schedule_to_start_latency",
                                                 task_queue=TASK_QUEUE),
            "workflow_task_execution": m(d, "temporal_workflow_task_execution_latency",
                                         task_queue=TASK_QUEUE),
            "respond_workflow_task_completed": m(d, "temporal_request_latency",
                                                 operation="RespondWorkflowTaskCompleted"),
            "activity_schedule_to_start_main_queue": m(d, "temporal_activity_schedule_to_start_latency",
                                                       task_queue=TASK_QUEUE),
            "activity_schedule_to_start_session_queue": m(d, "temporal_activity_schedule_to_start_latency",
                                                          task_queue=session_queue),
            "activity_end_to_end": {
                a: m(d, "temporal_activity_succeed_endtoend_latency", activity_type=a)
                for a in (Act.MCP_READ_CYCLE, Act.MCP_SUBSCRIBE_CYCLE)},
            "mcp_read_round_trip": m(d, "mcpsync_read_latency_seconds", server=server),
            "ingress_notification_to_receipt": m(d, "mcpsync_convergence_seconds", server=server),
            "note": "means over the churn phase (histogram sum/count), Temporal SDK runtime + mcpsync meters",
        }

    async def aclose(self) -> None:
        await self.server.aclose()

