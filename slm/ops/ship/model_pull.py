"""`slm pull` of a model artifact others publish (ModelPack, Docker model; slm.distribution.model_artifacts).

    read the manifest (every size bounded) -> fetch the config, check it (sha256, format,
    the layer digests it lists) -> stream each weight layer into the store's staging area,
    refused at its first byte past its descriptor's size, sha256 checked at its end -> the
    GGUF model (a tar layer's one file, slm.distribution.weight_tar) staged exactly as
    `slm import base` of that file stages it (the same base
    digest), each GGUF LoRA as `slm import adapter` does, checked to fit the base -> one
    composition (the base, the adapters at weight 1) -> the receive transaction's commit
    (slm.ops.ship.receive.commit: names and composition record, recovered by fsck as a pulled bundle).

The downloaded files live under the staging area and are removed with it: only the blobs the
imports stage are committed. A failure anywhere leaves the store as it was.
"""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path

from slm.compose.composition import AdapterRef, for_base, stamped
from slm.compose.validate import check_adapter_fits
from slm.distribution import model_artifacts as ma
from slm.distribution.bundle import sha256_of
from slm.distribution.reference import Reference
from slm.distribution.weight_tar import copy_single_file
from slm.errors import IntegrityError, InvalidInput
from slm.formats.gguf_lora import is_gguf_lora
from slm.ops.ship import receive, received_bytes
from slm.ops.store.importing import open_adapter_source, open_base_source, stage_adapter, stage_base
from slm.ops.progress import NoProgress, Progress
from slm.ops.results import ReceiveResult
from slm.store import StoreDir
from slm.store import digest as dg

_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def _name(text: str) -> str:
    """`text` as a store name (letters, digits, '.', '_', '-'), or "" if nothing is left."""
    name = _NAME_CHARS.sub("-", text).strip("-._")[:128].replace("..", ".")
    return name


def _small(source, desc, where: str) -> bytes:
    data = source.blob(desc.digest, desc.size)
    if len(data) != desc.size or sha256_of(data) != desc.digest:
        raise IntegrityError(f"{where}: blob {desc.digest[:19]} does not hash to its sha256 digest or is not "
                             f"its descriptor's {desc.size} bytes")
    return data


def _download(source, incoming, desc, where: str, progress: Progress) -> None:
    """A layer's bytes into `incoming` (a staging file), checked as they arrive."""
    with contextlib.closing(source.chunks(desc.digest, desc.size)) as chunks:
        n, sha = received_bytes.copy_bounded(chunks, incoming, desc.size, desc.digest, where, progress)
    if n != desc.size:
        raise IntegrityError(f"{where}: blob {desc.digest[:19]} is {n} bytes, its descriptor says {desc.size}")
    if sha != desc.digest:
        raise IntegrityError(f"{where}: blob {desc.digest[:19]} does not hash to its sha256 digest "
                             "(tampered or damaged)")


def _base_name(config: dict, artifact: ma.ModelArtifact, ref: Reference) -> str:
    """The name the base gets: the one the artifact gives (ModelPack descriptor.name, Docker
    config slm.base), else the repository's last path component."""
    given = ""
    if artifact.kind == ma.MODELPACK and isinstance(config.get("descriptor"), dict):
        given = config["descriptor"].get("name", "")
    elif isinstance(config.get("slm"), dict):
        given = config["slm"].get("base", "")
    return _name(given if isinstance(given, str) else "") or _name(ref.repository.rsplit("/", 1)[-1]) or "model"


def _adapter_name(w: ma.WeightLayer, base_name: str, i: int) -> str:
    stem = w.adapter_name or (w.name[:-5] if w.name.endswith(".gguf") else w.name)
    return _name(stem) or f"{base_name}-adapter{i}"


def pull_model(store: StoreDir, artifact: ma.ModelArtifact, manifest_data: bytes, source, ref: Reference,
               progress: Progress | None = None) -> ReceiveResult:
    progress = progress or NoProgress()
    started = time.perf_counter()
    where = str(ref)
    config = ma.check_config(_small(source, artifact.config, f"{where} config"), artifact, f"{where} config")
    staging = store.objects.staging()
    try:
        with contextlib.ExitStack() as files:
            progress.start("receiving", sum(w.descriptor.size for w in artifact.weights))
            paths = []
            for w in artifact.weights:
                label = f"{where} layer {w.index}"
                incoming = files.enter_context(staging.incoming())  # removed at exit: never kept
                _download(source, incoming, w.descriptor, label, progress)
                if w.descriptor.media_type == ma.MODELPACK_WEIGHT_TAR:
                    inner = files.enter_context(staging.incoming())
                    copy_single_file(Path(incoming.path), inner, label)
                    incoming = inner
                paths.append(Path(incoming.path))
            progress.finish()
            base_at, adapters_at = _classify(artifact, paths, where)
            base_name = _base_name(config, artifact, ref)
            base_source = open_base_source(paths[base_at], None)
            try:
                base, side_names = stage_base(staging, base_source, progress)
            finally:
                base_source.close()
            base_digest = staging.put(base.to_bytes())
            shapes = {t.name: t.shape for t in base.tensors}
            refs, names = [], set()
            for i in adapters_at:
                w = artifact.weights[i]
                label = f"{where} layer {w.index}"
                adapter = open_adapter_source(paths[i], shapes)
                manifest = stage_adapter(staging, adapter, label, progress)
                check_adapter_fits(f"{label} (for its base)", manifest, base, shapes)
                name = _adapter_name(w, base_name, len(refs) + 1)
                if name in names:
                    raise InvalidInput(f"{where}: two adapters would be named {name!r}")
                names.add(name)
                refs.append(AdapterRef(staging.put(manifest.to_bytes()), 1.0, name))
        comp = stamped(for_base(base_digest, base, base_name).with_adapters(refs), "slm pull")
        # pulled before: the stored record is kept (its provenance), not a second one made
        record = store.names.get("compositions", dg.hex_of(comp.id)) or staging.put(comp.to_toml())
        reused = len(staging.reused)
        new = receive.commit(store, comp, record, staging,
                             tuple((kind, dg.hex_of(base_digest), d) for kind, d in side_names))
    finally:
        staging.discard()
    return ReceiveResult(comp.id, record, base_name, tuple(a.name for a in refs), 0, artifact.layers,
                         len(artifact.weights) + 1, artifact.config.size + sum(w.descriptor.size for w in artifact.weights),
                         reused, len(new), round(time.perf_counter() - started, 3), where, sha256_of(manifest_data))


def _classify(artifact: ma.ModelArtifact, paths: list[Path], where: str) -> tuple[int, list[int]]:
    """(index of the base's file, indices of the adapters'): by layer type where it says,
    checked against the file; by the file (general.type = adapter) for a ModelPack weight."""
    base, adapters = [], []
    for i, (w, path) in enumerate(zip(artifact.weights, paths)):
        lora = is_gguf_lora(path)
        if w.role == ma.BASE and lora:
            raise InvalidInput(f"{where} layer {w.index}: its type says GGUF model, the file is a GGUF LoRA adapter")
        if w.role == ma.ADAPTER and not lora:
            raise InvalidInput(f"{where} layer {w.index}: its type says GGUF LoRA adapter, the file is not one")
        (adapters if lora else base).append(i)
    if len(base) != 1:
        raise InvalidInput(f"{where}: {len(base)} GGUF model layers; slm reads an artifact of exactly one "
                           "(and any number of GGUF LoRA adapters)")
    return base[0], adapters
