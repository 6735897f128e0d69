"""The fleet the router tests run against (tests/fleet/): a local docker-registry holding three
compositions of the real SmolLM2 (the base alone, + pirate@0.8, + french@0.6: the demo
adapters), each signed by one Ed25519 key; three `slm serve` replicas, each with a store of
its own that trusts only that key and requires signatures, started as a fleet starts them:
`slm serve --model REF` with REF pinned by digest (pulled and activated before it listens),
the two other compositions pulled beforehand for requests that name them; vLLM's router in
front (scripts/router_peer.py). Real processes on loopback, free ports, bounded waits."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomlkit
from prometheus_client.parser import text_string_to_metric_families

from bench_http import free_port
from dist_fixtures import local_registry
from serve_helpers import Server
from router_peer import Router, executable

from slm.api import Store

ROOT = Path(__file__).resolve().parents[2]
DEMO_ADAPTERS = ROOT / "fixtures" / "demo_adapters"
# tag in the registry -> the adapters of that composition on SmolLM2
TAGS = {"pirate": ["pirate@0.8"], "french": ["french@0.6"], "base": []}
ACTIVE = "pirate"  # what every replica serves as `active` (its --model)
REPLICAS = 3
REQUEST_S = 120  # one request's deadline through the router or direct
GENERATION_ENDPOINTS = ("/v1/completions", "/v1/chat/completions")


def signing_key(path: Path) -> str:
    """A deterministic Ed25519 key written as PEM at `path`; its public text."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from slm.distribution.signing import public_key_text

    key = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([7]) * 32)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return public_key_text(key)


def _slm(*args) -> None:
    from slm.cli import run

    assert run([str(a) for a in args]) == 0, args


@dataclass
class Published:
    refs: dict[str, str]  # tag -> HOST/fleet/smol:TAG
    pinned: dict[str, str]  # tag -> HOST/fleet/smol@sha256:... (its manifest's digest)
    ids: dict[str, str]  # tag -> composition id
    public_key: str


def publish(root: Path, registry_host: str, smollm2_gguf: Path) -> Published:
    """A publisher's store: SmolLM2 and the demo adapters; each of TAGS activated, signed and
    pushed (its signature goes along as an OCI referrer)."""
    public = signing_key(root / "key.pem")
    store = root / "publisher"
    _slm("--store", store, "init")
    _slm("--store", store, "import", "base", smollm2_gguf, "--name", "smollm2")
    for name in ("pirate", "french"):
        _slm("--store", store, "import", "adapter", DEMO_ADAPTERS / name, "--name", name)
    refs, pinned, ids = {}, {}, {}
    for tag, adapters in TAGS.items():
        _slm("--store", store, "activate", "smollm2", *adapters)
        _slm("--store", store, "sign", "--key", root / "key.pem")
        refs[tag] = f"{registry_host}/fleet/smol:{tag}"
        pushed = Store.open(store).push(refs[tag])
        pinned[tag] = f"{registry_host}/fleet/smol@{pushed.manifest_digest}"
        ids[tag] = pushed.composition_id
    return Published(refs, pinned, ids, public)


def replica_store(path: Path, published: Published) -> Path:
    """A replica's store: require_signed with the publisher's key alone (every activation, and
    every composition a request stages, is checked against it), the tags but ACTIVE pulled."""
    _slm("--store", path, "init")
    config = path / "config.toml"
    doc = tomlkit.parse(config.read_text())
    doc["require_signed"] = True
    doc["trusted_keys"] = [published.public_key]
    config.write_text(tomlkit.dumps(doc))
    for tag, ref in published.refs.items():
        if tag != ACTIVE:
            _slm("--store", path, "pull", ref)
    return path


class Replica:
    """One `slm serve --model REF` on a port of its own, kept across a restart (the router knows
    it by URL; a restart finds REF's digest received and asks no registry)."""

    def __init__(self, store: Path, port: int, model: str):
        self.store, self.port, self.model = store, port, model
        self.url = f"http://127.0.0.1:{port}"
        self.start()

    def start(self) -> None:
        # a grace period longer than any test's stream: a SIGTERM lets every running one finish
        self.server = Server(self.store, "--threads", "1", "--grace", str(REQUEST_S), "--model", self.model,
                             port=self.port)

    def kill(self) -> None:
        """kill -9: no draining, no goodbye; the open connections are cut."""
        os.kill(self.server.proc.pid, signal.SIGKILL)
        self.server.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.server.proc.poll() is None:
            self.server.stop()

    def requests(self) -> dict[tuple[str, str], float]:
        """(endpoint, status) -> requests this process answered since it started
        (slm_requests_total)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            text = r.read().decode()
        return {(s.labels["endpoint"], s.labels["status"]): s.value for family in text_string_to_metric_families(text)
                if family.name == "slm_requests" for s in family.samples if s.name == "slm_requests_total"}

    def requests_served(self) -> float:
        """Generation requests this process answered since it started, every status."""
        return sum(n for (endpoint, _), n in self.requests().items() if endpoint in GENERATION_ENDPOINTS)

    def load(self) -> int:
        """GET /get_load, what vllm-router's power_of_two policy polls."""
        with urllib.request.urlopen(self.url + "/get_load", timeout=30) as r:
            return json.loads(r.read())["load"]


@dataclass
class Fleet:
    root: Path
    published: Published
    replicas: list[Replica]

    @property
    def worker_urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def router(self, policy: str) -> Router:
        return Router(self.worker_urls, policy, self.root / f"router-{policy}.log", request_timeout_s=REQUEST_S)


def openai_client(url: str, timeout: float = REQUEST_S):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=timeout)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, smollm2_gguf):
    if executable() is None:
        pytest.fail("vllm-router is not installed (the dev extra pins it; make test installs it)")
    root = tmp_path_factory.mktemp("fleet")
    (root / "registry").mkdir()
    with local_registry(root / "registry") as registry:
        published = publish(root, registry.host, smollm2_gguf)
        stores = [replica_store(root / f"replica{i}", published) for i in range(REPLICAS)]
        replicas: list[Replica] = []
        try:
            for store in stores:
                replicas.append(Replica(store, free_port(), published.pinned[ACTIVE]))
            yield Fleet(root, published, replicas)
        finally:
            for replica in replicas:
                replica.stop()
