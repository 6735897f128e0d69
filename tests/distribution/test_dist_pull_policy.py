"""`slm pull` into a store that requires signatures (require_signed, trusted_keys), against a
real registry (Debian's docker-registry on loopback): the policy is applied to the signatures
that come with the composition (those its bundle carries, its referrers, those the store keeps
with it already) before anything is received, so an unsigned or untrusted composition is
refused with the store byte for byte as it was (every file, the advisory cache included), and
`slm serve --model REF` of one stops before listening with the store as it was too."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

import pytest
import tomlkit

from dist_fixtures import registry  # noqa: F401  (fixture)
from helpers import one_line, tiny_store
from test_dist_referrers import _attach_referrer, _ed25519_key, _manifest_size
from test_serve_model import _refused_start


def _tree(root: Path) -> dict[str, tuple]:
    """Every entry under `root`: a directory, a link and its target, or a file's mode and bytes' hash."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            st = path.lstat()
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = (stat.S_IMODE(st.st_mode), hashlib.sha256(path.read_bytes()).hexdigest())
    return out


@pytest.fixture(scope="module")
def publisher(tmp_path_factory, tiny_model):
    """Store A with two compositions, tq+a1@0.5 and tq+a1@0.25 (the first active); two keys."""
    root = tmp_path_factory.mktemp("publisher")
    a = tiny_store(root, tiny_model, 1, steps=(("activate", "tq", "a1@0.25"), ("activate", "tq", "a1@0.5")))
    return a, {"ci": _ed25519_key(root / "ci.pem", 11), "other": _ed25519_key(root / "other.pem", 12)}


def _copy(a: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(a, tmp_path / "a", symlinks=True))


def _push(cli, store: Path, ref: str, comp: str | None = None) -> dict:
    r = cli("--store", store, "push", ref, *([comp] if comp else []), "--json")
    assert r.code == 0, r.err
    return r.json()


def _sign(cli, store: Path, comp: str, key: Path) -> None:
    assert cli("--store", store, "sign", comp, "--key", key).code == 0


def _requiring(cli, path: Path, trusted: str) -> Path:
    """A fresh store that requires compositions signed by `trusted`."""
    assert cli("--store", path, "init").code == 0
    _require(path, trusted)
    return path


def _require(path: Path, trusted: str) -> None:
    doc = tomlkit.parse((path / "config.toml").read_text())
    doc["require_signed"], doc["trusted_keys"] = True, [trusted]
    (path / "config.toml").write_text(tomlkit.dumps(doc))


def _refused_pull(cli, store: Path, ref: str, code: int = 6) -> str:
    before = _tree(store)
    r = cli("--store", store, "pull", ref)
    assert r.code == code and one_line(r.err), (r.code, r.err)
    assert _tree(store) == before, "the refused pull changed the store"
    return r.err


def _active(cli, store: Path) -> str:
    return cli("--store", store, "status", "--json").json()["active"]["id"]


@pytest.mark.hostile
def test_an_unsigned_composition_is_not_received(cli, tmp_path, publisher, registry):  # noqa: F811
    a, keys = publisher
    comp = _active(cli, a)
    ref = f"{registry.host}/policy/unsigned:v1"
    _push(cli, a, ref)
    b = _requiring(cli, tmp_path / "b", keys["ci"][1])
    err = _refused_pull(cli, b, ref)
    assert f"composition {comp[7:19]} is not signed" in err and "require_signed" in err, err


@pytest.mark.hostile
def test_a_composition_signed_only_by_an_untrusted_key_is_not_received(cli, tmp_path, publisher, registry):  # noqa: F811
    a = _copy(publisher[0], tmp_path)
    keys = publisher[1]
    comp = _active(cli, a)
    _sign(cli, a, comp, keys["other"][0])
    ref = f"{registry.host}/policy/untrusted:v1"
    pushed = _push(cli, a, ref)  # the signature in the bundle and as a referrer
    b = _requiring(cli, tmp_path / "b", keys["ci"][1])
    assert "signed only by untrusted keys" in _refused_pull(cli, b, ref)
    # an untrusted signature arriving as a referrer alone of an unsigned bundle: the same
    unsigned_ref = f"{registry.host}/policy/untrusted-referrer:v1"
    plain = _push(cli, publisher[0], unsigned_ref)
    assert plain["composition_id"] == pushed["composition_id"] and plain["referrers"] == 0
    blob = _signature_of(a, comp, keys["other"][0], cli)
    _attach_referrer(registry.host, "policy/untrusted-referrer", plain["manifest_digest"],
                     _manifest_size(registry.host, "policy/untrusted-referrer", plain["manifest_digest"]), blob)
    assert "signed only by untrusted keys" in _refused_pull(cli, b, unsigned_ref)


def _signature_of(store: Path, comp: str, key: Path, cli) -> bytes:
    from slm.store import StoreDir

    r = cli("--store", store, "sign", comp, "--key", key, "--json")
    assert r.code == 0, r.err
    return StoreDir.open(store).objects.read_verified(r.json()["signature"])


def test_a_trusted_signature_in_the_bundle_as_a_referrer_or_kept_by_the_store_admits_it(
        cli, tmp_path, publisher, registry):  # noqa: F811
    a = _copy(publisher[0], tmp_path)
    keys = publisher[1]
    comp = _active(cli, a)
    # in the bundle (and as its referrer)
    signed = _copy(publisher[0], tmp_path / "signed")
    _sign(cli, signed, comp, keys["ci"][0])
    ref = f"{registry.host}/policy/trusted:v1"
    _push(cli, signed, ref)
    b = _requiring(cli, tmp_path / "b", keys["ci"][1])
    r = cli("--store", b, "pull", ref, "--json")
    assert r.code == 0, r.err
    assert r.json()["composition_id"] == comp and r.json()["signatures"] == 1
    assert cli("--store", b, "activate", ref).code == 0 and _active(cli, b) == comp
    # as a referrer alone, pushed later by the signer, of an unsigned bundle
    unsigned_ref = f"{registry.host}/policy/trusted-referrer:v1"
    plain = _push(cli, a, unsigned_ref)
    blob = _signature_of(signed, comp, keys["ci"][0], cli)
    _attach_referrer(registry.host, "policy/trusted-referrer", plain["manifest_digest"],
                     _manifest_size(registry.host, "policy/trusted-referrer", plain["manifest_digest"]), blob)
    c = _requiring(cli, tmp_path / "c", keys["ci"][1])
    r = cli("--store", c, "pull", unsigned_ref, "--json")
    assert r.code == 0, r.err
    assert r.json()["referrer_signatures"] == 1 and r.json()["signatures"] == 1
    assert cli("--store", c, "activate", unsigned_ref).code == 0 and _active(cli, c) == comp
    # kept by the store: pulled before the policy, signed there with the trusted key; an
    # unsigned bundle of it is pulled again (its reference recorded), and is activatable
    other = f"{registry.host}/policy/unsigned-again:v1"
    _push(cli, publisher[0], other)
    d = tmp_path / "d"
    assert cli("--store", d, "init").code == 0
    assert cli("--store", d, "pull", other).code == 0
    _sign(cli, d, comp, keys["ci"][0])
    _require(d, keys["ci"][1])
    r = cli("--store", d, "pull", other, "--json")
    assert r.code == 0 and r.json()["composition_id"] == comp, r.err
    assert cli("--store", d, "activate", other).code == 0 and _active(cli, d) == comp


@pytest.mark.hostile
def test_a_trusted_signature_of_another_composition_does_not_admit_this_one(cli, tmp_path, publisher, registry):  # noqa: F811
    a = _copy(publisher[0], tmp_path)
    keys = publisher[1]
    signed_comp = _active(cli, a)
    _sign(cli, a, signed_comp, keys["ci"][0])
    _push(cli, a, f"{registry.host}/policy/pair:signed")  # its signature: a referrer of its own manifest
    plain = _push(cli, a, f"{registry.host}/policy/pair:unsigned", "tq+a1@0.25")
    assert plain["composition_id"] != signed_comp and plain["referrers"] == 0
    b = _requiring(cli, tmp_path / "b", keys["ci"][1])
    ref = f"{registry.host}/policy/pair:unsigned"
    assert "is not signed" in _refused_pull(cli, b, ref)
    # the trusted signature of the other composition attached as a referrer of this manifest
    blob = _signature_of(a, signed_comp, keys["ci"][0], cli)
    _attach_referrer(registry.host, "policy/pair", plain["manifest_digest"],
                     _manifest_size(registry.host, "policy/pair", plain["manifest_digest"]), blob)
    assert "signature referrer" in _refused_pull(cli, b, ref, code=5)


@pytest.mark.hostile
def test_a_model_artifact_is_not_received_by_a_store_that_requires_signatures(cli, tmp_path, publisher, registry):  # noqa: F811
    a, keys = publisher
    ref = f"{registry.host}/policy/modelpack:v1"
    assert cli("--store", a, "push", "--as", "modelpack", ref, "tq").code == 0
    b = _requiring(cli, tmp_path / "b", keys["ci"][1])
    err = _refused_pull(cli, b, ref)
    assert "modelpack model artifact carries no slm signature" in err and "require_signed" in err, err


@pytest.mark.hostile
def test_serve_model_of_an_unsigned_or_untrusted_composition_stops_with_the_store_unchanged(
        cli, tmp_path, publisher, registry):  # noqa: F811
    a = _copy(publisher[0], tmp_path)
    keys = publisher[1]
    comp = _active(cli, a)
    b = _requiring(cli, tmp_path / "b", keys["ci"][1])
    unsigned = _push(cli, a, f"{registry.host}/policy/serve:unsigned")
    _sign(cli, a, comp, keys["other"][0])
    untrusted = _push(cli, a, f"{registry.host}/policy/serve:untrusted")
    for pushed, says in ((unsigned, "is not signed"), (untrusted, "signed only by untrusted keys")):
        for ref in (f"{registry.host}/policy/serve@{pushed['manifest_digest']}",
                    f"{registry.host}/policy/serve:{'unsigned' if pushed is unsigned else 'untrusted'}"):
            before = _tree(b)
            _refused_start(b, ref, 6, says)
            assert _tree(b) == before, ref
