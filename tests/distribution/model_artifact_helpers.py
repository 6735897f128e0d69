"""Model artifacts made without slm: an OCI image layout written by hand (the spec's JSON, the
files as blobs) and copied to the registry by skopeo."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _blob(layout: Path, data: bytes) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest[7:]).write_bytes(data)
    return {"digest": digest, "size": len(data)}


def publish(skopeo: str, layout: Path, ref: str, config_media: str, config: dict,
            layers: list[tuple[str, bytes, dict]], artifact_type: str | None = None) -> dict:
    """Write an OCI layout holding one manifest (config + layers: (mediaType, bytes,
    annotations)) and `skopeo copy` it to `ref`; the manifest."""
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    descs = [{"mediaType": media, **_blob(layout, data), **({"annotations": notes} if notes else {})}
             for media, data, notes in layers]
    if config.get("modelfs") == {}:  # {}: filled with the layers' digests, as the specs say
        config = {**config, "modelfs": {"type": "layers", "diffIds": [d["digest"] for d in descs]}}
    if config.get("rootfs") == {}:
        config = {**config, "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in descs]}}
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": config_media, **_blob(layout, json.dumps(config).encode())},
                "layers": descs}
    if artifact_type:
        manifest["artifactType"] = artifact_type
    raw = json.dumps(manifest, indent=2).encode()
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [{"mediaType": OCI_MANIFEST, **_blob(layout, raw),
                            "annotations": {"org.opencontainers.image.ref.name": "v1"}}]}
    (layout / "index.json").write_text(json.dumps(index))
    out = subprocess.run([skopeo, "copy", "--dest-tls-verify=false", f"oci:{layout}:v1", f"docker://{ref}"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return manifest


def inspect_raw(skopeo: str, ref: str) -> dict:
    out = subprocess.run([skopeo, "inspect", "--raw", "--tls-verify=false", f"docker://{ref}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def publisher_world(root: Path, tiny_model) -> dict:
    """A store that imported the tiny GGUF base and a LoRA, the LoRA exported as a GGUF LoRA
    file: the files a publisher would have, and the digests `slm import` gives them."""
    from helpers import tiny_store
    from slm.cli import run
    from slm.store import StoreDir

    store = tiny_store(root, tiny_model, {"demo": 1}, steps=(("activate", "tq", "demo"),))
    lora = root / "demo.gguf"
    assert run(["--store", str(store), "export", "demo", "--base", "tq", "--format", "gguf-lora", "-o", str(lora)]) == 0
    assert run(["--store", str(store), "import", "adapter", str(lora), "--name", "demo-gguf"]) == 0
    names = StoreDir(store).names
    return {"store": store, "gguf": tiny_model["gguf_q"], "lora": lora, "base": names.get("bases", "tq"),
            "adapter": names.get("adapters", "demo-gguf"), "root": root}


def pull_json(cli, store: Path, ref: str) -> dict:
    """`slm pull REF --json` into `store`, which must succeed: its result."""
    r = cli("--store", store, "pull", ref, "--json")
    assert r.code == 0, r.err
    return r.json()
