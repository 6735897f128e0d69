"""The server's Prometheus metrics (GET /metrics), in a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401  (the /metrics content type)

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        # process_cpu_seconds_total, process_resident_memory_bytes...: the server's CPU time
        # tells its cost apart from the wall time a loaded machine stretches
        ProcessCollector(registry=r)
        self.requests = Counter("slm_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.latency = Histogram("slm_request_seconds", "Request latency (to the last byte)", ["endpoint"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.first_token = Histogram("slm_time_to_first_token_seconds", "Admission to the first token",
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("slm_tokens", "Tokens processed", ["kind"], registry=r)  # prompt, completion
        self.queue_depth = Gauge("slm_queue_depth", "Requests admitted but not yet decoding", registry=r)
        self.running = Gauge("slm_running_requests", "Requests in the decode batch", registry=r)
        self.batch_rows = Histogram("slm_batch_rows", "Rows per decode step (rows of one base share it)", buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32),
                                    registry=r)
        self.step_compositions = Histogram("slm_step_compositions", "Compositions whose rows share a decode step",
                                           buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32), registry=r)
        # where the engine's time goes: decode steps and prompt chunks (the rest of a request's
        # time is waiting its turn, and HTTP)
        self.step_seconds = Histogram("slm_decode_step_seconds", "Time of one decode step (all its rows)",
                                      buckets=STEP_BUCKETS, registry=r)
        self.prefill_seconds = Histogram("slm_prefill_chunk_seconds", "Time of one prompt chunk's prefill",
                                         buckets=STEP_BUCKETS, registry=r)
        self.cancelled = Counter("slm_cancelled_requests", "Requests cancelled (client gone, shutdown)", registry=r)
        self.switches = Counter("slm_switches", "Hot swaps of the active composition", ["result"], registry=r)
        self.switch_notice = Histogram("slm_switch_notice_seconds", "refs/active changed -> the server saw it",
                                       buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1), registry=r)

    def record_switch(self, sw) -> None:
        self.switches.labels("ok" if sw.ok else "refused").inc()
        self.switch_notice.observe(sw.noticed_ms / 1e3)

    def render(self) -> bytes:
        return generate_latest(self.registry)
