"""Model artifacts other tools publish and read: CNCF ModelPack and Docker model artifacts.

Both are plain OCI image manifests whose weights are whole files, one per layer:

  ModelPack (github.com/modelpack/model-spec, docs/spec.md, docs/config.md)
      artifactType  application/vnd.cncf.model.manifest.v1+json
      config        application/vnd.cncf.model.config.v1+json
                    {"descriptor": {...}, "config": {"format": "gguf", ...},
                     "modelfs": {"type": "layers", "diffIds": [<sha256 of each layer>]}}
      weights       application/vnd.cncf.model.weight.v1.raw (the file itself)
                    application/vnd.cncf.model.weight.v1.tar (a tar of that one file, as modctl
                    packs it; compressed tars are refused)
  Docker model (github.com/docker/model-distribution types/config.go; the model-spec
  compat/docker/v0 types)
      config        application/vnd.docker.ai.model.config.v0.1+json
                    {"config": {"format": "gguf", ...}, "descriptor": {...},
                     "rootfs": {"type": "layers", "diff_ids": [...]}}
      weights       application/vnd.docker.ai.gguf.v3, LoRA application/vnd.docker.ai.gguf.v3.lora
  Ollama's layer types, in either: application/vnd.ollama.image.model (a GGUF model),
  application/vnd.ollama.image.adapter (a GGUF LoRA).

slm reads one whose weights are one GGUF model (the base) and any number of GGUF LoRA files
(adapters): a Docker or Ollama layer says which by its type; a ModelPack weight layer by its
annotation `org.slm.adapter.name`, else by the GGUF file itself (`general.type = adapter`, as
llama.cpp writes LoRAs). Layers that hold no weights (a license, a chat template, docs, the
weights' own config files) are skipped and reported; any other layer (safetensors, a multimodal
projector, a compressed tar, a second model file) is refused with the reason, never dropped.

slm's own fields ride where each format allows them: ModelPack's config admits no unknown
field, so the manifest's annotations name the composition (`org.slm.composition.id`) and each
adapter layer its name and weight (`org.slm.adapter.name`, `org.slm.adapter.weight`); Docker's
config gains an "slm" object with the same. Both layers carry `org.opencontainers.image.title`
(and ModelPack's `org.cncf.model.filepath`): the file name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from slm.distribution import mediatypes as mt
from slm.distribution import titles
from slm.distribution.bundle import (MAX_CONFIG_BYTES, MAX_MANIFEST_BYTES, Descriptor, byte_count, canonical,
                                     is_sha256, sha256_of)
from slm.errors import InvalidInput
from slm.formats.jsonfile import parse_json_object

MODELPACK = "modelpack"
DOCKER = "docker"
FORMATS = (MODELPACK, DOCKER)

MODELPACK_ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"
MODELPACK_CONFIG = "application/vnd.cncf.model.config.v1+json"
MODELPACK_WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
MODELPACK_WEIGHT_TAR = "application/vnd.cncf.model.weight.v1.tar"
_MODELPACK_PREFIX = "application/vnd.cncf.model."
# ModelPack layers that hold no weights: the weights' config files, docs, code, data sets
_MODELPACK_OTHER = ("weight.config.", "doc.", "code.", "dataset.")

DOCKER_CONFIG = "application/vnd.docker.ai.model.config.v0.1+json"
DOCKER_CONFIG_V02 = "application/vnd.docker.ai.model.config.v0.2+json"  # the fields slm reads are v0.1's
_DOCKER_CONFIG_PREFIX = "application/vnd.docker.ai.model.config."
DOCKER_GGUF = "application/vnd.docker.ai.gguf.v3"
DOCKER_LORA = "application/vnd.docker.ai.gguf.v3.lora"
_DOCKER_OTHER = ("application/vnd.docker.ai.license", "application/vnd.docker.ai.chat.template.jinja")

OLLAMA_MODEL = "application/vnd.ollama.image.model"
OLLAMA_ADAPTER = "application/vnd.ollama.image.adapter"
_OLLAMA_OTHER = ("application/vnd.ollama.image.license", "application/vnd.ollama.image.template",
                 "application/vnd.ollama.image.params", "application/vnd.ollama.image.system")

FILEPATH_ANNOTATION = "org.cncf.model.filepath"
COMPOSITION_ANNOTATION = "org.slm.composition.id"
ADAPTER_NAME_ANNOTATION = "org.slm.adapter.name"
ADAPTER_WEIGHT_ANNOTATION = "org.slm.adapter.weight"

MAX_WEIGHT_LAYERS = 65  # one base and at most slm's 64 adapters
MAX_LAYERS = 1000

BASE, ADAPTER, EITHER = "base", "adapter", "either"  # EITHER: a ModelPack weight, told by its GGUF header


def kind_of(doc: dict) -> str | None:
    """MODELPACK or DOCKER for a manifest of that form, None for anything else (slm's own)."""
    config = doc.get("config")
    media = config.get("mediaType") if isinstance(config, dict) else None
    if doc.get("artifactType") == MODELPACK_ARTIFACT or media == MODELPACK_CONFIG:
        return MODELPACK
    if isinstance(media, str) and media.startswith(_DOCKER_CONFIG_PREFIX):
        return DOCKER
    return None


@dataclass(frozen=True)
class WeightLayer:
    index: int  # its place among the manifest's layers
    descriptor: Descriptor
    role: str  # BASE, ADAPTER or EITHER
    name: str  # a file name for it ("" if the artifact gives none)
    adapter_name: str  # org.slm.adapter.name ("" if none)


@dataclass(frozen=True)
class ModelArtifact:
    kind: str
    config: Descriptor
    weights: tuple[WeightLayer, ...]
    skipped: tuple[str, ...]  # media types of the layers holding no weights
    composition_id: str  # org.slm.composition.id, or ""
    layers: int


def _descriptor(raw: object, what: str) -> tuple[Descriptor, dict]:
    if not isinstance(raw, dict):
        raise InvalidInput(f"{what}: not a descriptor object")
    media, digest = raw.get("mediaType"), raw.get("digest")
    if not isinstance(media, str):
        raise InvalidInput(f"{what}: mediaType missing")
    if not is_sha256(digest):
        raise InvalidInput(f"{what}: digest {digest!r} is not sha256:<64 hex>")
    notes = raw.get("annotations", {})
    if not isinstance(notes, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in notes.items()):
        raise InvalidInput(f"{what}: annotations must map strings to strings")
    return Descriptor(media, digest, byte_count(raw.get("size"), what)), notes


def _role(kind: str, media: str, notes: dict, where: str) -> str | None:
    """The layer's role (BASE, ADAPTER, EITHER), None for a layer holding no weights;
    InvalidInput for one slm cannot read."""
    if media in (DOCKER_LORA, OLLAMA_ADAPTER):
        return ADAPTER
    if media in (DOCKER_GGUF, OLLAMA_MODEL):
        return BASE
    if media in _DOCKER_OTHER or media in _OLLAMA_OTHER:
        return None
    if kind == MODELPACK and media in (MODELPACK_WEIGHT, MODELPACK_WEIGHT_TAR):
        return ADAPTER if ADAPTER_NAME_ANNOTATION in notes else EITHER
    if media.startswith(_MODELPACK_PREFIX) and media[len(_MODELPACK_PREFIX):].startswith(_MODELPACK_OTHER):
        return None
    if media.startswith(MODELPACK_WEIGHT_TAR + "+"):
        raise InvalidInput(f"{where}: mediaType {media}: a compressed weight layer (slm reads a GGUF published "
                           f"as the file itself, {MODELPACK_WEIGHT}, or in a plain tar, {MODELPACK_WEIGHT_TAR})")
    raise InvalidInput(f"{where}: mediaType {media!r} is not a layer slm can read (a GGUF model or GGUF LoRA; "
                       "safetensors and multimodal projectors are not supported)")


def parse_model_manifest(data: bytes, what: str) -> ModelArtifact:
    """A ModelPack or Docker model manifest, every size bounded before anything is fetched."""
    doc = parse_json_object(data, what, MAX_MANIFEST_BYTES)
    kind = kind_of(doc)
    if kind is None or doc.get("schemaVersion") != 2 or doc.get("mediaType") != mt.OCI_MANIFEST:
        raise InvalidInput(f"{what}: not a ModelPack or Docker model OCI image manifest")
    config, _ = _descriptor(doc.get("config"), f"{what} config")
    if config.media_type not in (MODELPACK_CONFIG, DOCKER_CONFIG, DOCKER_CONFIG_V02):
        raise InvalidInput(f"{what}: config mediaType {config.media_type!r} is not {MODELPACK_CONFIG} or "
                           f"{DOCKER_CONFIG} (or v0.2)")
    if config.size > MAX_CONFIG_BYTES:
        raise InvalidInput(f"{what} config: {config.size} bytes claimed, more than a config can be "
                           f"({MAX_CONFIG_BYTES})")
    raw_layers = doc.get("layers")
    if not isinstance(raw_layers, list) or not raw_layers or len(raw_layers) > MAX_LAYERS:
        raise InvalidInput(f"{what}: layers must be a list of 1 to {MAX_LAYERS} descriptors")
    weights, skipped = [], []
    for i, raw in enumerate(raw_layers):
        where = f"{what} layer {i}"
        desc, notes = _descriptor(raw, where)
        role = _role(kind, desc.media_type, notes, where)
        if role is None:
            skipped.append(desc.media_type)
            continue
        file_name = notes.get(mt.TITLE_ANNOTATION) or notes.get(FILEPATH_ANNOTATION, "")
        weights.append(WeightLayer(i, desc, role, file_name.rsplit("/", 1)[-1],
                                   notes.get(ADAPTER_NAME_ANNOTATION, "")))
    if not weights:
        raise InvalidInput(f"{what}: no weight layer (a GGUF model) in the artifact")
    if len(weights) > MAX_WEIGHT_LAYERS:
        raise InvalidInput(f"{what}: {len(weights)} weight layers; slm reads one model and at most "
                           f"{MAX_WEIGHT_LAYERS - 1} adapters")
    if sum(w.role == BASE for w in weights) > 1:
        raise InvalidInput(f"{what}: more than one GGUF model layer (a sharded GGUF is not supported)")
    if len({w.descriptor.digest for w in weights}) != len(weights):
        raise InvalidInput(f"{what}: a weight layer is listed twice")
    notes = doc.get("annotations", {})
    comp_id = notes.get(COMPOSITION_ANNOTATION, "") if isinstance(notes, dict) else ""
    return ModelArtifact(kind, config, tuple(weights), tuple(skipped), comp_id if isinstance(comp_id, str) else "",
                         len(raw_layers))


def check_config(data: bytes, artifact: ModelArtifact, what: str) -> dict:
    """The config blob (already verified against its digest): a JSON object whose format, if
    given, is gguf, and whose list of layer digests (ModelPack modelfs.diffIds, Docker
    rootfs.diff_ids), if given, names every weight layer (uncompressed layers, raw or tar: the
    layer's digest is its diff id)."""
    doc = parse_json_object(data, what, MAX_CONFIG_BYTES)
    inner = doc.get("config", {})
    fmt = inner.get("format") if isinstance(inner, dict) else None
    if fmt not in (None, "", "gguf"):
        raise InvalidInput(f"{what}: format {str(fmt)[:40]!r}; slm reads GGUF model artifacts")
    fs_doc = doc.get("modelfs" if artifact.kind == MODELPACK else "rootfs")
    ids = fs_doc.get("diffIds" if artifact.kind == MODELPACK else "diff_ids") if isinstance(fs_doc, dict) else None
    if ids is not None:
        if not isinstance(ids, list):
            raise InvalidInput(f"{what}: its layer digests are not a list")
        missing = [w for w in artifact.weights if w.descriptor.digest not in ids]
        if missing:
            raise InvalidInput(f"{what}: layer {missing[0].index} ({missing[0].descriptor.digest[:19]}) is not "
                               "among the config's layer digests")
    return doc


# -- building ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class OutLayer:
    """A weight layer to publish: its bytes' sha256 and size, file name, adapter name and weight."""
    digest: str
    size: int
    file_name: str
    adapter: str | None = None  # None: the base
    weight: float = 1.0


def build(kind: str, layers: list[OutLayer], composition_id: str, base_name: str, family: str,
          quantization: str) -> tuple[bytes, bytes]:
    """(manifest bytes, config bytes) of a ModelPack or Docker model artifact; canonical JSON,
    so one composition always gives one manifest digest."""
    ids = [l.digest for l in layers]
    adapters = [{"name": l.adapter, "weight": l.weight, "file": l.file_name} for l in layers if l.adapter is not None]
    if kind == MODELPACK:
        config = canonical({"descriptor": {"name": base_name or "model", "family": family},
                            "config": {"format": "gguf", "quantization": quantization},
                            "modelfs": {"type": "layers", "diffIds": ids}})
        config_media, artifact = MODELPACK_CONFIG, MODELPACK_ARTIFACT
    else:
        config = canonical({"config": {"format": "gguf", "architecture": family, "quantization": quantization},
                            "descriptor": {},
                            "rootfs": {"type": "layers", "diff_ids": ids},
                            "slm": {"composition_id": composition_id, "base": base_name, "adapters": adapters}})
        config_media, artifact = DOCKER_CONFIG, None
    out_layers = []
    for l in layers:
        notes = {mt.TITLE_ANNOTATION: titles.safe(l.file_name)}
        if kind == MODELPACK:
            notes[FILEPATH_ANNOTATION] = titles.safe(l.file_name)
        if l.adapter is not None:
            notes[ADAPTER_NAME_ANNOTATION] = l.adapter
            notes[ADAPTER_WEIGHT_ANNOTATION] = json.dumps(l.weight)
        media = (MODELPACK_WEIGHT if kind == MODELPACK else DOCKER_GGUF if l.adapter is None else DOCKER_LORA)
        out_layers.append({"mediaType": media, "digest": l.digest, "size": l.size, "annotations": notes})
    doc = {"schemaVersion": 2, "mediaType": mt.OCI_MANIFEST,
           "config": Descriptor(config_media, sha256_of(config), len(config)).to_json(), "layers": out_layers,
           "annotations": {COMPOSITION_ANNOTATION: composition_id}}
    if artifact is not None:
        doc["artifactType"] = artifact
    return canonical(doc), config

