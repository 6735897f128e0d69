"""What the tests of `slm follow` share (tests/fleet/test_follow_*.py): a publisher's store of the
synthetic tiny model (helpers.tiny_store: a tiny base and random LoRA adapters, so that a
device pulls, loads and checks a composition in a moment), its Ed25519 keys, the device stores
that trust one of them, and publishing: a composition activated in the publisher's store,
signed as version N of the tag (`slm sign --for`), pushed to the tag (`slm push`)."""

from __future__ import annotations

from pathlib import Path

import tomlkit

from slm.cli import run

REPOSITORY = "fleet/support"
TAG = "prod"



def private_key(path: Path):
    from slm.distribution.signing import load_private_key

    return load_private_key(path)


def device(root: Path, trusted: str) -> Path:
    """A new device store that believes statements of the key `trusted` and runs only signed
    compositions."""
    assert run(["--store", str(root), "init"]) == 0
    config = root / "config.toml"
    doc = tomlkit.parse(config.read_text())
    doc["require_signed"], doc["trusted_keys"] = True, [trusted]
    config.write_text(tomlkit.dumps(doc))
    return root


def activate(cli, publisher: Path, *adapters: str) -> str:
    """The composition of the tiny base and `adapters` (e.g. "a1@0.5"), made active in the
    publisher's store; its id."""
    assert cli("--store", publisher, "activate", "tq", *adapters).code == 0
    return active_id(cli, publisher)


def active_id(cli, store: Path) -> str | None:
    active = cli("--store", store, "status", "--json").json()["active"]
    return None if active is None else active["id"]


def sign(cli, publisher: Path, comp_id: str, key: Path, version: int, *, target: str | None = None,
         expires: str = "30d") -> None:
    r = cli("--store", publisher, "sign", comp_id, "--key", key, "--for", target or f"{REPOSITORY}:{TAG}",
            "--version", str(version), "--expires", expires)
    assert r.code == 0, r.err


def push(cli, publisher: Path, ref: str, comp_id: str) -> None:
    r = cli("--store", publisher, "push", ref, comp_id)
    assert r.code == 0, r.err


def publish(cli, publisher: Path, ref: str, key: Path, version: int, *adapters: str,
            target: str | None = None) -> str:
    """The composition of `adapters`, signed as version `version` of `target` (REPO:TAG,
    default fleet/support:prod) and pushed to `ref`."""
    comp_id = activate(cli, publisher, *adapters)
    sign(cli, publisher, comp_id, key, version, target=target)
    push(cli, publisher, ref, comp_id)
    return comp_id


def add_statement(publisher: Path, comp_id: str, blob: bytes, public: str) -> None:
    """A statement built outside `slm sign` (an expiry in the past, say) recorded with the
    composition as `slm sign` records one, so that `slm push` sends it."""
    from slm.ops.ship.signing import add_signature
    from slm.store import StoreDir

    store = StoreDir.open(publisher)
    with store.locked():
        add_signature(store, comp_id, blob, public)
