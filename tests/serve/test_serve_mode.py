"""`slm serve` in either numerics mode (slm.model.modes): the mode it runs is reported on every
response (the slm-mode header) and in /v1/slm/status, and its answers are what `slm run` gives
in the same mode (the default's int8 text is not assumed to be the exact mode's)."""

from __future__ import annotations

import pytest

from helpers import copy_store, tiny_store
from serve_helpers import Server
from slm.model import kernels_native

pytest.importorskip("uvicorn")
pytestmark = pytest.mark.skipif(not kernels_native.available(), reason="C kernels not built")

PROMPT = "the cat sat on"


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    return tiny_store(tmp_path_factory.mktemp("serve-mode"), tiny_model)


@pytest.mark.parametrize("flags,mode", [((), "int8"), (("--exact",), "exact")])
def test_the_server_reports_and_runs_its_mode(cli, template, tmp_path, flags, mode):
    root = copy_store(template, tmp_path)
    r = cli("--store", root, "run", PROMPT, "-n", "8", "--temperature", "0", "--json", *flags)
    assert r.code == 0 and r.json()["mode"] == mode, r.err
    server = Server(root, "--threads", "1", *flags)
    try:
        assert server.status()["mode"] == mode
        status, headers, _ = server.http("GET", "/v1/models")
        assert status == 200 and headers["slm-mode"] == mode
        status, headers, _ = server.http("GET", "/no-such-endpoint")
        assert status == 404 and headers["slm-mode"] == mode  # every answer, errors too
        code, body = server.json("POST", "/v1/completions",
                                 {"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
        assert code == 200 and body["choices"][0]["text"] == r.json()["text"]
        assert any(f"mode {mode}" in line for line in server.lines)  # the start-up line says it
    finally:
        assert server.stop() == 0
