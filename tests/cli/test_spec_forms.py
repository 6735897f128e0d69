"""One spec grammar everywhere (issue 32): every verb that takes a composition accepts every
form of slm.ops.store.specs, and each form names the same composition in every verb.

Forms: a tag, a tag's version (NAME@{N}), an id prefix, BASE+ADAPTER@W, @active, @active~N, a
pulled HOST/repo:tag, and -f manifest.toml where the verb takes a file. The registry is a real docker-registry on
loopback (tests/distribution/dist_fixtures.py)."""

from __future__ import annotations

import json

import pytest

from dist_fixtures import registry  # noqa: F401  (fixture)
from helpers import copy_store, tiny_store

FORMS = ["tag", "tag@{1}", "prefix", "base+adapter", "@active", "@active~1", "pulled", "file"]
VERBS = ["activate", "verify", "export", "push", "show", "rollback", "sign", "tag", "run", "health"]
TAKES_A_FILE = {"activate"}


def _json(cli, *args):
    r = cli(*args, "--json")
    assert r.code == 0, (args, r.err)
    return json.loads(r.out)


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model, registry):  # noqa: F811
    """tq + french@0.8 active (after tq+pirate), tagged prod (which named tq+pirate before:
    prod@{1}), pushed and pulled back as HOST/names/smol:v1; its manifest written to a file."""
    from slm.cli import run

    root = tmp_path_factory.mktemp("specs")
    store = tiny_store(root, tiny_model, {"french": 1, "pirate": 2},
                       [("activate", "tq", "pirate"), ("activate", "tq", "french@0.8"), ("tag", "prod", "tq+pirate"),
                        ("tag", "prod", "@active")])
    pulled = f"{registry.host}/names/smol:v1"
    assert run(["--store", str(store), "push", pulled, "prod"]) == 0
    assert run(["--store", str(store), "pull", pulled]) == 0
    return {"store": store, "root": root, "pulled": pulled}


@pytest.fixture
def expected(template, cli):
    s = str(template["store"])
    return {"now": _json(cli, "--store", s, "show", "tq+french@0.8")["id"],
            "before": _json(cli, "--store", s, "show", "tq+pirate")["id"]}


def _spec(form: str, template, ids) -> tuple[list[str], str]:
    """(the arguments that name the composition, the key of its expected id)."""
    if form == "tag":
        return ["prod"], "now"
    if form == "tag@{1}":
        return ["prod@{1}"], "before"
    if form == "prefix":
        return [ids["now"][7:19]], "now"
    if form == "base+adapter":
        return ["tq+french@0.8"], "now"
    if form == "@active":
        return ["@active"], "now"
    if form == "@active~1":
        return ["@active~1"], "before"
    if form == "pulled":
        return [template["pulled"]], "now"
    raise AssertionError(form)


def _run(cli, verb, spec_args, store, tmp_path, registry_host):  # noqa: F811
    s = ["--store", str(store)]
    if verb == "activate":
        return _json(cli, *s, "activate", *spec_args)["active"]["id"]
    if verb == "verify":
        return _json(cli, *s, "verify", "--no-numerics", *spec_args)["composition"]
    if verb == "export":
        return _json(cli, *s, "export", *spec_args, "-o", tmp_path / "bundle")["composition_id"]
    if verb == "push":
        return _json(cli, *s, "push", f"{registry_host}/names/forms:{tmp_path.name[-20:]}", *spec_args)["composition_id"]
    if verb == "show":
        return _json(cli, *s, "show", *spec_args)["id"]
    if verb == "rollback":
        return _json(cli, *s, "rollback", "--to", *spec_args)["active"]["id"]
    if verb == "sign":
        return _json(cli, *s, "sign", *spec_args, "--key", _key(tmp_path / "key.pem"))["composition_id"]
    if verb == "tag":
        return _json(cli, *s, "tag", "candidate", *spec_args)["new"]
    if verb == "health":
        return _json(cli, *s, "health", *spec_args)["composition"]
    if verb == "run":  # run without activating (slm run --model)
        return _json(cli, *s, "run", "Once upon a time", "-n", "1", "--model", *spec_args)["composition"]
    raise AssertionError(verb)


def _key(path):
    """An Ed25519 private key (PEM, as openssl genpkey writes it)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([7]) * 32)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path


@pytest.mark.parametrize("verb,form", [(v, f) for v in VERBS for f in FORMS if f != "file" or v in TAKES_A_FILE])
def test_every_verb_accepts_every_spec_form(cli, template, expected, registry, tmp_path, verb, form):  # noqa: F811
    store = copy_store(template["store"], tmp_path)
    if form == "file":
        manifest = tmp_path / "comp.toml"
        manifest.write_text(_json(cli, "--store", store, "show", "prod")["manifest_toml"])
        args, key = ["-f", str(manifest)], "now"
    else:
        args, key = _spec(form, template, expected)
    assert _run(cli, verb, args, store, tmp_path, registry.host) == expected[key]


def test_a_push_to_a_new_repository_takes_a_composed_spec(cli, template, expected, registry, tmp_path):  # noqa: F811
    """`slm push HOST/fleet/smol:pirate tq+pirate` (issue 32: it said "invalid name"), then a
    pull into another store names the composition by that reference."""
    store = copy_store(template["store"], tmp_path)
    ref = f"{registry.host}/fleet/smol:pirate"
    pushed = _json(cli, "--store", store, "push", ref, "tq+pirate")
    assert pushed["composition_id"] == expected["before"]
    other = tmp_path / "other"
    assert cli("--store", other, "init").code == 0
    assert cli("--store", other, "pull", ref).code == 0
    assert _json(cli, "--store", other, "activate", ref)["active"]["id"] == expected["before"]
    assert [e["op"] for e in _json(cli, "--store", other, "log", ref)] == ["pull"]


def test_an_unpulled_reference_is_not_found_and_says_how_to_get_it(cli, template, tmp_path):
    store = copy_store(template["store"], tmp_path)
    r = cli("--store", store, "activate", "localhost:5999/nothing/here:v1")
    assert r.code == 3 and "slm pull" in r.err


def test_active_tilde_past_the_log_is_not_found(cli, template, tmp_path):
    store = copy_store(template["store"], tmp_path)
    r = cli("--store", store, "show", "@active~9")
    assert r.code == 3 and "the log has 2 transitions" in r.err
