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
