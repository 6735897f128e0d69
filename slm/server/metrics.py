"""The server's Prometheus metrics (GET /metrics), in a registry of its own: slm's own, the
Kubernetes Gateway API Inference Extension's model-server protocol (its endpoint picker routes
by load and adapter affinity from vLLM's gauges), read from the scheduler's status at each scrape,
and with `--follow` the follower's (FollowGauges, read from Store.follow_status at each scrape)."""

from __future__ import annotations

import calendar
import time
from typing import TYPE_CHECKING, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401  (the /metrics content type)
from prometheus_client.core import GaugeMetricFamily

from slm import ExitCode

if TYPE_CHECKING:
    from slm import FollowRound, FollowStatus, SlmError
    from slm.api import SchedulerStatus

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

        self.follow_rounds = Counter("slm_follow_rounds", "The follower's rounds by outcome (updated, current, "
                                     "rolled-back, known-bad, or the refusal) and exit code", ["outcome", "exit_code"],
                                     registry=r)

        self.protocol = ModelServerGauges()
        r.register(self.protocol)
        self.following = FollowGauges()
        r.register(self.following)

    def follow(self, status: Callable[[], SchedulerStatus], max_lora: int) -> None:
        """Read the model-server protocol's gauges from `status` (a Scheduler's) at each scrape;
        max_lora: how many compositions the server keeps staged."""
        self.protocol.status, self.protocol.max_lora = status, max_lora

    def record_switch(self, sw) -> None:
        self.switches.labels("ok" if sw.ok else "refused").inc()
        self.switch_notice.observe(sw.noticed_ms / 1e3)

    def follow_status(self, status: Callable[[], FollowStatus], running: Callable[[], bool]) -> None:
        """Read the follower's gauges from `status` (Store.follow_status) at each scrape; running:
        whether the server's follow loop is alive."""
        self.following.status, self.following.running = status, running

    def record_follow_round(self, result: FollowRound | None, error: SlmError | None) -> None:
        if result is not None:
            self.follow_rounds.labels(result.outcome, "0" if result.ok else str(int(ExitCode.UNHEALTHY))).inc()
        else:
            self.follow_rounds.labels(refusal_name(error.code), str(int(error.code))).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ModelServerGauges:
    """vLLM's gauges that the model-server protocol reads (docs/serve.md, "Metrics for
    routers"), counted in rows (a request's choices are a row each). A composition, as requests name it, plays
    the LoRA adapter: vllm:lora_requests_info is one series whose labels list the names with
    admitted rows and those with waiting rows, comma-separated without spaces (the endpoint
    picker splits on the comma), and whose value is the unix time they were read: the picker
    takes the newest series."""

    def __init__(self):
        self.status: Callable[[], SchedulerStatus] | None = None
        self.max_lora = 0

    def collect(self):
        if self.status is None:
            return
        s = self.status()
        yield GaugeMetricFamily("vllm:num_requests_waiting", "Rows queued: submitted, not admitted yet",
                                s.queued)
        yield GaugeMetricFamily("vllm:num_requests_running", "Rows admitted: decoding or prefilling",
                                s.admitted_rows)
        usage = "Positions the admitted rows' KV caches hold over what max_batch rows of their longest context hold (0..1)"
        yield GaugeMetricFamily("vllm:kv_cache_usage_perc", usage, s.kv_usage)
        # (vLLM's earlier name of the same gauge, which earlier endpoint pickers read)
        yield GaugeMetricFamily("vllm:gpu_cache_usage_perc", usage, s.kv_usage)
        info = GaugeMetricFamily("vllm:lora_requests_info", "Compositions (as requests name them) with admitted "
                                 "and with waiting rows; the value: when this was read (unix seconds)",
                                 labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"])
        info.add_metric([str(self.max_lora), ",".join(sorted(s.admitted_by_name)), ",".join(sorted(s.waiting_by_name))],
                        time.time())
        yield info


# A refusal's outcome label: what the follower refused, named as docs/fleet.md names it; any
# other error by its exit code's name (not-found, needs-recovery, ...)
REFUSALS = {ExitCode.ROLLBACK: "rollback", ExitCode.EQUIVOCATION: "equivocation", ExitCode.EXPIRED: "expired",
            ExitCode.WRONG_TARGET: "wrong-target", ExitCode.INCOMPATIBLE: "untrusted", ExitCode.INTEGRITY: "integrity",
            ExitCode.IO: "registry"}


def refusal_name(code: ExitCode) -> str:
    return REFUSALS.get(code) or ExitCode(code).name.lower().replace("_", "-")


def epoch_of(stamp: str | None) -> float | None:
    """A status time (UTC, 2026-01-02T03:04:05Z) as unix seconds."""
    try:
        return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))) if stamp else None
    except ValueError:
        return None


class FollowGauges:
    """The follower's state (follow/state.json) and its last report (the advisory status file),
    read at each scrape: the followed tag and what runs, when it last asked and will ask again,
    failures in a row, a trial in progress, and each composition marked bad."""

    def __init__(self):
        self.status: Callable[[], FollowStatus] | None = None
        self.running: Callable[[], bool] = lambda: False

    def collect(self):
        if self.status is None:
            return
        s = self.status()
        good = s.good or {}
        info = GaugeMetricFamily("slm_follow_info", "The followed tag, the active composition and the good version "
                                 "(always 1)", labels=["reference", "composition", "good_composition", "good_version"])
        info.add_metric([s.reference or "", s.active or "", good.get("composition", ""), str(good.get("version", ""))], 1)
        yield info
        yield GaugeMetricFamily("slm_follow_running", "1 while the server's follow loop runs", int(self.running()))
        for name, help_, stamp in (("slm_follow_last_check_timestamp_seconds", "When the follower last asked the "
                                    "registry (unix seconds)", s.last_check),
                                   ("slm_follow_next_try_timestamp_seconds", "When the follower asks next (unix "
                                    "seconds)", s.next_try)):
            epoch = epoch_of(stamp)
            if epoch is not None:
                yield GaugeMetricFamily(name, help_, epoch)
        yield GaugeMetricFamily("slm_follow_consecutive_failures", "Rounds in a row that ended in a refusal or an "
                                "error", s.failures)
        yield GaugeMetricFamily("slm_follow_trial", "1 while a composition is on trial", int(s.trial is not None))
        bad = GaugeMetricFamily("slm_follow_bad_info", "A composition marked bad: never followed again until cleared "
                                "(always 1)", labels=["composition", "manifest", "version"])
        for b in s.bad:
            bad.add_metric([b.get("composition", ""), b.get("manifest", ""), str(b.get("version", ""))], 1)
        yield bad
