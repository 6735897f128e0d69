"""GET /get_load, what vllm-router's power_of_two policy polls (docs/serve.md, "Behind a
router"): `{"load": N}`, the rows in flight. Under load it is checked in the fleet, behind the
router (tests/fleet/: the replicas' loads sum to the streams running, and the router's polls are
answered); here, on the tiny model: idle, after requests, and under --api-key."""

from __future__ import annotations

import pytest

from helpers import tiny_store
from serve_helpers import Server

pytest.importorskip("uvicorn")


def test_get_load_is_the_rows_in_flight(tmp_path, tiny_model):
    store = tiny_store(tmp_path, tiny_model)
    server = Server(store, "--threads", "1")
    try:
        assert server.json("GET", "/get_load") == (200, {"load": 0})
        status, answer = server.json("POST", "/v1/completions", {"prompt": "the cat", "max_tokens": 4, "n": 2})
        assert status == 200 and len(answer["choices"]) == 2
        assert server.json("GET", "/get_load") == (200, {"load": 0})  # both rows ended with the answer
        assert b'slm_requests_total{endpoint="/get_load",status="200"} 2.0' in server.http("GET", "/metrics")[2]
    finally:
        assert server.stop() == 0


def test_get_load_is_answered_without_the_api_key_like_health(tmp_path, tiny_model):
    """The router's poll carries no key: /get_load answers it (a count, nothing of a request's
    content), as /health does; every other path still wants the key."""
    server = Server(tiny_store(tmp_path, tiny_model), "--threads", "1", "--api-key", "sekrit")
    try:
        assert server.json("GET", "/get_load") == (200, {"load": 0})
        assert server.http("GET", "/health")[0] == 200
        assert server.http("GET", "/metrics")[0] == 401
    finally:
        assert server.stop() == 0
