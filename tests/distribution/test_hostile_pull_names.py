"""A pulled artifact names what it brings (a ModelPack descriptor's name, a Docker config's
slm.base, a weight file's name for an adapter): a name that reads as a composition id (the short
id of a composition the store holds) is refused like any name made in the store, so it cannot
shadow that composition."""

from __future__ import annotations

import pytest

from dist_fixtures import registry, skopeo  # noqa: F401  (fixtures)
from helpers import copy_store, refused
from model_artifact_helpers import publish, publisher_world
from slm.distribution.model_artifacts import (DOCKER_CONFIG, DOCKER_GGUF, FILEPATH_ANNOTATION, MODELPACK_ARTIFACT,
                                              MODELPACK_CONFIG, MODELPACK_WEIGHT)


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model):
    return publisher_world(tmp_path_factory.mktemp("pull-names"), tiny_model)


def _artifact(form: str, id_like: str, world: dict):
    """(config media type, config, layers, artifact type) of an artifact naming something `id_like`."""
    gguf, lora = world["gguf"].read_bytes(), world["lora"].read_bytes()
    if form == "docker config's base":
        return DOCKER_CONFIG, {"config": {"format": "gguf"}, "descriptor": {}, "rootfs": {},
                               "slm": {"base": id_like}}, [(DOCKER_GGUF, gguf, {})], None
    path = FILEPATH_ANNOTATION
    if form == "modelpack descriptor's name":
        return MODELPACK_CONFIG, {"descriptor": {"name": id_like}, "config": {"format": "gguf"}, "modelfs": {}}, \
            [(MODELPACK_WEIGHT, gguf, {path: "model.gguf"})], MODELPACK_ARTIFACT
    return MODELPACK_CONFIG, {"descriptor": {"name": "tiny"}, "config": {"format": "gguf"}, "modelfs": {}}, \
        [(MODELPACK_WEIGHT, gguf, {path: "model.gguf"}), (MODELPACK_WEIGHT, lora, {path: f"{id_like}.gguf"})], \
        MODELPACK_ARTIFACT


@pytest.mark.hostile
@pytest.mark.parametrize("form", ["docker config's base", "modelpack descriptor's name", "modelpack adapter file"])
def test_a_pulled_name_that_reads_as_a_composition_id_is_refused(cli, tmp_path, registry, skopeo, world,  # noqa: F811
                                                                form):
    store = copy_store(world["store"], tmp_path)
    active = cli("--store", store, "status", "--json").json()["active"]["id"]
    short = active[7:19]  # what `slm status` and `slm log` show
    media, config, layers, artifact_type = _artifact(form, short, world)
    ref = f"{registry.host}/shadow/{form.split()[0]}:v1"
    publish(skopeo, tmp_path / "layout", ref, media, config, layers, artifact_type)
    r = refused(cli, store, 4, "pull", ref)
    assert short in r.err and "as a composition id" in r.err, r.err
    assert cli("--store", store, "activate", short, "--json").json()["active"]["id"] == active
