"""/metrics speaks the Kubernetes Gateway API Inference Extension's model-server protocol
(its endpoint picker routes by vLLM's gauges): 8 streams on 3 compositions held running on a
real `slm serve` of SmolLM2-135M, 4 admitted and 4 waiting, scraped and parsed by
prometheus_client's own text parser. A composition, as the requests name it, plays the LoRA
adapter."""

from __future__ import annotations

import http.client
import json
import time
from urllib.parse import urlparse

import pytest

import slm
from helpers import wait_until
from serve_helpers import Server

pytest.importorskip("uvicorn")
parser = pytest.importorskip("prometheus_client.parser")
pytestmark = pytest.mark.real_model

ADAPTERS = __import__("pathlib").Path(__file__).resolve().parents[2] / "fixtures" / "demo_adapters"
MAX_BATCH = 4
# the order the 8 requests are queued in: the first MAX_BATCH are admitted, the rest wait
# (None: `model` left out, the active composition)
MODELS = ["smol", "smol", "smol+french@0.8", "smol", "smol+french@0.8", None, None, "smol+french@0.8"]


@pytest.fixture
def served(cli, store, store_dir, smollm2_gguf):
    assert cli("import", "base", smollm2_gguf, "--name", "smol").code == 0
    for name in ("pirate", "french"):
        assert cli("import", "adapter", ADAPTERS / name, "--name", name).code == 0
    active = cli("activate", "smol", "pirate@0.8", "--json").json()["active"]["id"]
    eos = sorted(slm.Store.open(store_dir).tokenizer("smol").eos_ids)
    server = Server(store_dir, "--threads", "1", "--max-batch", str(MAX_BATCH), "--grace", "1")
    yield server, active, eos
    assert server.stop() == 0


def _scrape(server) -> dict:
    """{name: [(labels, value)]} of the vllm: families, as prometheus_client parses them."""
    status, headers, body = server.http("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in parser.text_string_to_metric_families(body.decode())
            if f.name.startswith("vllm:")}


def _gauge(families: dict, name: str) -> float:
    (labels, value), = families[name]
    assert labels == {}
    return value


def _open_stream(url: str, body: dict) -> http.client.HTTPConnection:
    """A streamed completion whose response headers came: the request is queued."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    assert conn.getresponse().status == 200
    return conn


def test_protocol_gauges_under_load(served):
    server, active, eos = served
    idle = _scrape(server)
    assert set(idle) == {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                         "vllm:gpu_cache_usage_perc", "vllm:lora_requests_info"}
    assert _gauge(idle, "vllm:num_requests_waiting") == 0 == _gauge(idle, "vllm:num_requests_running")
    assert _gauge(idle, "vllm:kv_cache_usage_perc") == 0
    # the end-of-sequence tokens forbidden: every answer runs to its max_tokens, long past the test
    body = {"prompt": "Once upon a time", "max_tokens": 1000, "stream": True,
            "logit_bias": {str(e): -100 for e in eos}}
    conns = []
    try:
        for model in MODELS:  # one at a time: queued in this order
            conns.append(_open_stream(server.url, body if model is None else {**body, "model": model}))
        names = [active if m is None else m for m in MODELS]

        def loaded():
            families = _scrape(server)
            counts = (_gauge(families, "vllm:num_requests_running"), _gauge(families, "vllm:num_requests_waiting"))
            return families if counts == (MAX_BATCH, len(MODELS) - MAX_BATCH) else None

        before = time.time()
        families = wait_until(loaded, "4 requests admitted and 4 waiting")
        after = time.time()
        (labels, value), = families["vllm:lora_requests_info"]
        assert before <= value <= after  # the time the status was read: the endpoint picker takes the newest
        assert labels["max_lora"] == "8"  # the compositions slm.Runtime keeps staged
        assert set(labels["running_lora_adapters"].split(",")) == set(names[:MAX_BATCH]) == {"smol", "smol+french@0.8"}
        assert set(labels["waiting_lora_adapters"].split(",")) == set(names[MAX_BATCH:]) == {"smol+french@0.8", active}
        assert " " not in labels["running_lora_adapters"] + labels["waiting_lora_adapters"]

        # the admitted rows' KV caches fill as they decode: the usage grows, within 0..1
        def usage_over(level: float):
            usage = _gauge(_scrape(server), "vllm:kv_cache_usage_perc")
            return usage if usage > level else None

        first = _gauge(families, "vllm:kv_cache_usage_perc")
        grown = wait_until(lambda: usage_over(first), "the KV cache usage growing")
        assert 0 <= first < grown < wait_until(lambda: usage_over(grown), "the KV cache usage growing again") < 1
        both = _scrape(server)  # the earlier name: the same reading
        assert _gauge(both, "vllm:gpu_cache_usage_perc") == _gauge(both, "vllm:kv_cache_usage_perc") > 0

        conns[0].close()  # the client goes away: its row is cancelled and the next waiting one admitted
        wait_until(lambda: _gauge(_scrape(server), "vllm:num_requests_waiting") == len(MODELS) - MAX_BATCH - 1,
                   "a waiting request admitted in the freed row")
        families = _scrape(server)
        (labels, _), = families["vllm:lora_requests_info"]
        assert _gauge(families, "vllm:num_requests_running") == MAX_BATCH
        assert set(labels["running_lora_adapters"].split(",")) == set(names[1:MAX_BATCH + 1])
        assert set(labels["waiting_lora_adapters"].split(",")) == set(names[MAX_BATCH + 1:])
    finally:
        for conn in conns:
            conn.close()
    drained = wait_until(lambda: (lambda f: f if _gauge(f, "vllm:num_requests_running") == 0 and
                                  _gauge(f, "vllm:num_requests_waiting") == 0 else None)(_scrape(server)),
                         "every cancelled request gone")
    assert _gauge(drained, "vllm:kv_cache_usage_perc") == 0
    (labels, _), = drained["vllm:lora_requests_info"]
    assert labels["running_lora_adapters"] == "" == labels["waiting_lora_adapters"]
