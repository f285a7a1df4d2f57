"""Prometheus metrics of ``chunkyard serve`` (``GET /metrics``), in a registry of its own.

Counted per request: ``chunkyard_requests_total{route, code}`` and the latency histogram
``chunkyard_request_seconds{route}`` (routes are the API's own paths; anything else is
``other``, so a scan of random paths cannot grow the label set). Read at each scrape: the
index's chunk count, size on disk and generation, the writer's last sync (``--watch``).
Under ``serve --processes N`` the counters live in Prometheus' multiprocess files
(``PROMETHEUS_MULTIPROC_DIR``, set before the processes start) and a scrape sums them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from pipeline.serve.handle import IndexHandle

#: Latency buckets (seconds): a warm query takes milliseconds, a cold one (first load) seconds.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _IndexCollector:
    """Gauges read from the live index (and the writer) when Prometheus scrapes."""

    def __init__(self, handle: IndexHandle, writer_state: Callable[[], dict[str, Any] | None]) -> None:
        self.handle = handle
        self.writer_state = writer_state

    def collect(self) -> Iterator[Metric]:
        try:
            status = self.handle.status()
        except Exception:  # noqa: BLE001 - a scrape never fails because the index is being replaced
            status = {"exists": False}
        gauges = (
            ("chunkyard_index_chunks", "Chunks in the live index.", status.get("chunks", 0)),
            ("chunkyard_index_bytes", "Size of the index on disk (with its WAL).", status.get("bytes", 0)),
            ("chunkyard_index_generation", "Index runs committed so far.", status.get("generation", 0)),
        )
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value=float(value or 0))
        writer = self.writer_state()
        if writer is not None:
            yield GaugeMetricFamily(
                "chunkyard_writer_up",
                "1 while serve --watch's writer runs.",
                value=1.0 if writer["alive"] else 0.0,
            )
            yield GaugeMetricFamily(
                "chunkyard_last_sync_timestamp_seconds",
                "Unix time of the writer's last index run (0: none yet).",
                value=float(writer.get("last_sync") or 0.0),
            )
            yield GaugeMetricFamily(
                "chunkyard_syncs_total", "Index runs of the writer.", value=float(writer["syncs"])
            )


class Metrics:
    """The registry, the request counters, and the text Prometheus reads."""

    def __init__(
        self, handle: IndexHandle, writer_state: Callable[[], dict[str, Any] | None] = lambda: None
    ) -> None:
        self.registry = CollectorRegistry()
        # several processes: each counts into its files, the scrape reads every process's
        counted: CollectorRegistry | None = self.registry
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client.multiprocess import MultiProcessCollector

            MultiProcessCollector(self.registry)  # type: ignore[no-untyped-call]
            counted = None
        self.requests = Counter(
            "chunkyard_requests",
            "Requests answered, by route and code.",
            ["route", "code"],
            registry=counted,
        )
        self.latency = Histogram(
            "chunkyard_request_seconds",
            "Time to answer, by route.",
            ["route"],
            buckets=BUCKETS,
            registry=counted,
        )
        self.registry.register(_IndexCollector(handle, writer_state))

    def observe(self, route: str, code: str, seconds: float) -> None:
        self.requests.labels(route, code).inc()
        self.latency.labels(route).observe(seconds)

    def text(self) -> bytes:
        return generate_latest(self.registry)
