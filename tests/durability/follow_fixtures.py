"""What the follower's crash and power-cut tests start from (tests/durability/test_follow_crash.py,
tests/durability/test_follow_powercut.py): a publisher store that signed two versions of one tag
and pushed them to a local docker-registry (loopback), and device stores that trust its key.

    fleet.publish(1 | 2)   moves the tag to that version (the manifest PUT again under the tag:
                           its statements stay with it, as referrers of its digest)
    fleet.fresh            a device store that never followed the tag
    fleet.following        the same device after one round on version 1: v1 good and active

and `outcome(store)`: what the device runs by its follower's state, read through the public API.
"""

from __future__ import annotations

import dataclasses
import shutil
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import tomlkit

from helpers import tiny_store
from slm.cli import run

REPOSITORY, TAG = "fleet/device", "prod"
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json, "
                  "application/vnd.docker.distribution.manifest.v2+json")


@dataclass(frozen=True)
class Fleet:
    host: str
    ref: str  # HOST/fleet/device:prod
    v1: str  # the composition ids of versions 1 and 2
    v2: str
    manifests: dict  # version -> (manifest bytes, media type)
    fresh: Path
    following: Path

    def publish(self, version: int) -> None:
        data, media_type = self.manifests[version]
        request = urllib.request.Request(f"http://{self.host}/v2/{REPOSITORY}/manifests/{TAG}", data=data,
                                         method="PUT", headers={"Content-Type": media_type})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 201, response.status

    def device(self, where: Path, *, following: bool = True) -> Path:
        """A copy of a device store at where/store."""
        return Path(shutil.copytree(self.following if following else self.fresh, where / "store", symlinks=True))


def _key(path: Path) -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from slm.distribution.signing import public_key_text

    key = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([7]) * 32)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return public_key_text(key)


def _slm(store: Path, *args) -> None:
    assert run(["--store", str(store), *map(str, args)]) == 0, args


def _manifest(host: str) -> tuple[bytes, str]:
    request = urllib.request.Request(f"http://{host}/v2/{REPOSITORY}/manifests/{TAG}",
                                     headers={"Accept": MANIFEST_TYPES})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read(), response.headers["Content-Type"]


def build(root: Path, tiny: dict, host: str) -> Fleet:
    """Version 1 (tq+a1@0.5) and version 2 (tq+a2@0.5) signed for the tag and pushed; the tag
    left on version 2; the device templates."""
    publisher = tiny_store(root / "publisher", tiny, 2, steps=())
    public = _key(root / "publisher.pem")
    ref = f"{host}/{REPOSITORY}:{TAG}"
    ids, manifests = {}, {}
    for version, adapter in ((1, "a1@0.5"), (2, "a2@0.5")):
        _slm(publisher, "activate", "tq", adapter)
        _slm(publisher, "sign", "--key", root / "publisher.pem", "--for", f"{REPOSITORY}:{TAG}",
             "--version", version, "--expires", "30d")
        _slm(publisher, "push", ref)
        from slm.store import StoreDir

        ids[version] = StoreDir.open(publisher).active_ref.read()
        manifests[version] = _manifest(host)
    fresh = root / "fresh" / "store"
    _slm(fresh, "init")
    doc = tomlkit.parse((fresh / "config.toml").read_text())
    doc["require_signed"], doc["trusted_keys"] = True, [public]
    (fresh / "config.toml").write_text(tomlkit.dumps(doc))
    fleet = Fleet(host, ref, ids[1], ids[2], manifests, fresh, root / "following" / "store")
    fleet.publish(1)
    shutil.copytree(fresh, fleet.following, symlinks=True)
    _slm(fleet.following, "follow", ref, "--once", "--insecure")
    assert outcome(fleet.following) == Outcome(ids[1], ids[1], None, ())
    fleet.publish(2)
    return fleet


@dataclass(frozen=True)
class Outcome:
    active: str | None
    good: str | None  # the composition marked good
    trial: str | None  # the composition on trial
    bad: tuple[str, ...]  # the compositions marked bad
    deaths: int = 0  # the trial's
    reasons: tuple[str, ...] = ()  # why each bad one is

    def settled(self) -> bool:
        """The device runs the composition marked good, and no trial is pending."""
        return self.trial is None and self.good is not None and self.active == self.good


def outcome(store: Path) -> Outcome:
    import slm

    s = slm.Store.open(store).follow_status()
    return Outcome(s.active, s.good and s.good["composition"], s.trial and s.trial["composition"],
                   tuple(b["composition"] for b in s.bad), s.trial["deaths"] if s.trial else 0,
                   tuple(b["reason"] for b in s.bad))


def accounted(fleet: Fleet, state: Outcome) -> list[str]:
    """What any crash may leave before a repair: the active composition is the good one, or a
    trial the state records (or what ran before it): never a trial nobody recorded."""
    known = {state.good, state.trial} - {None}
    if state.active not in known:
        return [f"active {_name(fleet, state.active)} is neither the good {_name(fleet, state.good)} "
                f"nor a recorded trial ({_name(fleet, state.trial)})"]
    return []


def _name(fleet: Fleet, comp: str | None) -> str:
    return {fleet.v1: "v1", fleet.v2: "v2", None: "none"}.get(comp) or comp[:19]


def short(fleet: Fleet, state: Outcome) -> str:
    return str(dataclasses.replace(state, active=_name(fleet, state.active), good=_name(fleet, state.good),
                                   trial=_name(fleet, state.trial),
                                   bad=tuple(_name(fleet, b) for b in state.bad)))
