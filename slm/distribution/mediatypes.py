"""Media types and annotations of an slm bundle (docs/distribution.md, docs/formats.md).

No registered media type fits a raw tensor or an slm manifest (ModelPack has no LoRA layer;
Docker's `application/vnd.docker.ai.gguf.v3.lora` is a whole GGUF file, and slm ships one blob
per tensor), so slm's own vendor types are used. The OCI manifest itself is a plain image
manifest with `artifactType` set and a real config blob (some registries reject the empty one).
"""

from __future__ import annotations

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_LAYOUT_VERSION = "1.0.0"

ARTIFACT_COMPOSITION = "application/vnd.slm.composition.v1"
ARTIFACT_SIGNATURE = "application/vnd.slm.signature.v1"
ARTIFACT_CERTIFICATE = "application/vnd.slm.certificate.v1"
CONFIG = "application/vnd.slm.bundle.config.v1+json"

COMPOSITION = "application/vnd.slm.composition.v1+toml"  # the composition record (TOML)
BASE_MANIFEST = "application/vnd.slm.base.v1+toml"
ADAPTER_MANIFEST = "application/vnd.slm.adapter.v1+toml"
TOKENIZER = "application/vnd.slm.tokenizer.v1+json"
TENSOR = "application/vnd.slm.tensor.v1"  # raw bytes of one tensor, typed by its manifest
SIGNATURE = "application/vnd.slm.signature.v1+json"
CERTIFICATE = "application/vnd.slm.certificate.v1+json"  # a signed verify certificate (slm.certificate/1)

LAYER_TYPES = (COMPOSITION, BASE_MANIFEST, ADAPTER_MANIFEST, TOKENIZER, TENSOR, SIGNATURE, CERTIFICATE)

# Per layer: the BLAKE3 digest of its bytes (the store's name for them). Registries only take
# sha256 on the wire; a receiver re-hashes both.
BLAKE3_ANNOTATION = "org.slm.blake3"
REF_NAME_ANNOTATION = "org.opencontainers.image.ref.name"
# Per layer: the file name an OCI client (oras pull) writes it to (slm.distribution.titles).
TITLE_ANNOTATION = "org.opencontainers.image.title"
