"""Building, finding and staging compositions (shared by activate, run and verify)."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from slm.compose.adapter_manifest import AdapterManifest, check_tensor_bytes, parse_adapter_manifest, tensor_from_bytes
from slm.compose.base_manifest import BaseManifest, parse_base_manifest
from slm.compose.composition import (MAX_ADAPTERS, AdapterRef, Composition, check_adapter_list, for_base,
                                     parse_composition, parse_weight)
from slm.compose.validate import validate
from slm.errors import Incompatible, IntegrityError, NotFound
from slm.formats import untrusted
from slm.arch.roles import qk_heads
from slm.model.finite import f32_all_finite
from slm.ops.store.resolve import by_prefix, load_base, resolve
from slm.store import StoreDir
from slm.store import digest as dg

if TYPE_CHECKING:
    from slm.model.overlays import Overlay, TargetData


def parse_adapter_spec(spec: str) -> tuple[str, float]:
    """'name' or 'name@0.7' -> (name, weight): the one parser of the CLI's and the server's
    adapter specs; the weight's grammar is slm.numbers' DECIMAL. A version of the name,
    'name@{2}@0.7', stays with the name (slm.ops.store.versions reads it)."""
    version_end = spec.find("}") + 1 if spec.find("@{") >= 0 else 0
    name, sep, weight_text = spec[version_end:].partition("@")
    name = spec[:version_end] + name
    if not sep:
        return name, 1.0
    return name, parse_weight(weight_text, f"adapter {name}")


def build(store: StoreDir, base_ref: str, adapter_specs: list[str]) -> Composition:
    if len(adapter_specs) > MAX_ADAPTERS:
        raise Incompatible(f"{len(adapter_specs)} adapters; a composition stacks at most {MAX_ADAPTERS}")
    base_digest, base = load_base(store, base_ref)
    adapters = []
    for spec in adapter_specs:
        name, weight = parse_adapter_spec(spec)
        digest, found_name = resolve(store, name, ("adapters",))
        adapters.append(AdapterRef(digest, weight, found_name or name))
    check_adapter_list(adapters, "composition")
    _, base_name = resolve(store, base_ref, ("bases",))
    return for_base(base_digest, base, base_name or "").with_adapters(adapters)


MAX_MANIFEST_BYTES = 1 << 20


def from_file(path: Path) -> Composition:
    """A composition manifest given with `activate -f`: a file, or a pipe such as <(...) that
    sends it within untrusted.PIPE_WAIT_S (the bounded reader: a FIFO nothing writes to is
    refused, never waited on)."""
    data = untrusted.read_untrusted(path, MAX_MANIFEST_BYTES, "composition manifest",
                                    pipe_wait=untrusted.PIPE_WAIT_S)
    return parse_composition(data, Path(path).name)


def load(store: StoreDir, comp_id: str) -> Composition:
    """The stored manifest of a composition id, checked to hash back to that id."""
    manifest_digest = store.names.get("compositions", dg.hex_of(comp_id))
    if manifest_digest is None:
        raise NotFound(f"no composition {comp_id} in the store")
    comp = parse_composition(store.objects.read_verified(manifest_digest), f"composition {dg.short(comp_id)}")
    if comp.id != comp_id:
        raise IntegrityError(f"composition {dg.short(comp_id)}: its manifest hashes to another id")
    return comp


def active_id(store: StoreDir, hint: str) -> str:
    """The composition refs/active names, for a command given none; when nothing is active,
    NotFound "nothing is active: <hint>" (hint: what the user can name instead)."""
    comp_id = store.active_ref.read()
    if comp_id is None:
        raise NotFound(f"nothing is active: {hint}")
    return comp_id


def load_active(store: StoreDir, hint: str) -> Composition:
    """The composition refs/active names, loaded (active_id's NotFound when nothing is)."""
    return load(store, active_id(store, hint))


def find_id(store: StoreDir, ref: str) -> str:
    """A composition id from a full id or a unique prefix of one (resolve.by_prefix)."""
    found = by_prefix([dg.PREFIX + hex_id for hex_id, _ in store.names.items("compositions")], ref,
                      "composition")
    if found is None:
        raise NotFound(f"no composition {ref!r} in the store")
    return found


@dataclass
class Staged:
    """A validated composition with everything it needs loaded: ready to run or to swap in
    (overlays None: checked only, for a switch of refs/active that runs nothing)."""

    composition: Composition
    base_digest: str
    base: BaseManifest
    adapters: list[tuple[AdapterRef, AdapterManifest]]
    overlays: list[Overlay] | None


def _verified(store: StoreDir, digest: str, what: str) -> bytes:
    try:
        return store.objects.read_verified(digest)
    except NotFound as err:
        raise NotFound(f"{what}: unknown digest {digest}") from err


def stage(store: StoreDir, comp: Composition, verify_base: bool = True, load_overlays: bool = True) -> Staged:
    """Validate everything (every blob re-hashed, or vouched for by the verified-digest cache:
    docs/recovery.md) and load the overlays (load_overlays=False: every check, and no NumPy
    array made, nor NumPy imported: what `slm activate` needs). Changes nothing but that
    advisory cache."""
    base = parse_base_manifest(_verified(store, comp.base, "base"), f"base {dg.short(comp.base)}")
    # the base blobs the verified-digest cache does not vouch for: usually none, and then no
    # thread is started (nor concurrent.futures imported: slm activate is a new process each time)
    unknown = [d for d in base.blob_digests() if not store.objects.trusted(d)] if verify_base else []
    if not unknown:
        try:
            return _stage_adapters(store, comp, base, load_overlays)
        finally:
            store.objects.save_verified()
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as background:
        # Re-hashing the base (BLAKE3 and file reads release the GIL) overlaps with parsing
        # and checking the adapters, which hold it: an activation waits for the longer of the
        # two, not their sum.
        base_check = background.submit(store.objects.first_bad, unknown)
        try:
            return _stage_adapters(store, comp, base, load_overlays)
        finally:  # a corrupt base outranks whatever the adapters' checks said
            bad = base_check.result()
            store.objects.save_verified()  # what the re-hashes found, for the next command
            if bad is not None:
                raise IntegrityError(f"base blob {dg.short(bad)} is missing or corrupt (run `slm fsck`)")


def _stage_adapters(store: StoreDir, comp: Composition, base: BaseManifest, load_overlays: bool) -> Staged:
    adapters = []
    for ref in comp.adapters:
        label = ref.name or dg.short(ref.digest)
        manifest = parse_adapter_manifest(_verified(store, ref.digest, f"adapter {label}"), f"adapter {label}")
        adapters.append((ref, manifest))
    validate(comp, comp.base, base, adapters)
    shapes = {t.name: t.shape for t in base.tensors}
    overlays = [] if load_overlays else None
    for ref, manifest in adapters:
        label = ref.name or dg.short(ref.digest)
        for t in manifest.targets:
            if not _finite_in_float32(ref.weight, t.scale):
                raise Incompatible(f"adapter {label}: weight {ref.weight:g} x scale {t.scale:g} of "
                                   f"{t.module} overflows float32")
        if overlays is None:
            for t in manifest.targets:
                target_blobs(store, label, manifest.kind, t, shapes[t.module])
            continue
        from slm.model.overlays import build_overlay

        targets = [target_data(store, label, manifest.kind, t, shapes[t.module]) for t in manifest.targets]
        overlays.append(build_overlay(manifest.kind, ref.weight, targets, src_layout=manifest.row_layout,
                                      dst_layout=base.qk_row_layout, heads=qk_heads(base.architecture)))
    return Staged(comp, comp.base, base, adapters, overlays)


def _float32(x: float) -> float:
    """x rounded to float32 (as NumPy's float32 rounds it); inf past float32's range."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.inf


def _finite_in_float32(weight: float, scale: float) -> bool:
    """Whether weight x scale, the factor an overlay applies, is finite in float32, the
    precision the overlays compute in (the product of two float32 values is exact in a
    float64, so rounding it once is float32's own product)."""
    return math.isfinite(_float32(_float32(weight) * _float32(scale)))


def target_blobs(store: StoreDir, label: str, kind: str, t, base_shape: tuple[int, ...]) -> dict[str, bytes]:
    """A target's tensors as their verified bytes, each checked: as long as its record says,
    finite (float32), sparse indices inside the base weight."""
    out_features, in_features = base_shape
    blobs = {}
    for key, ref in t.tensors.items():
        data = check_tensor_bytes(ref, _verified(store, ref.digest, f"adapter {label}"))
        # finite in the precision the overlays compute in (float32), not only as stored
        if ref.dtype == "f32" and not f32_all_finite(data):
            raise Incompatible(f"adapter {label}: tensor {key} of {t.module} has values that are "
                               "not finite as float32")
        blobs[key] = data
    if kind == "sparse":
        idx = tensor_from_bytes(t.tensors["indices"], blobs["indices"])
        if idx.size and (idx.min() < 0 or idx.max() >= out_features * in_features):
            raise Incompatible(f"adapter {label}: sparse indices of {t.module} fall outside the weight")
    return blobs


def target_data(store: StoreDir, label: str, kind: str, t, base_shape: tuple[int, ...]) -> TargetData:
    """Load a target's tensors; its dimensions come from the base weight (validated equal)."""
    from slm.model.overlays import TargetData

    out_features, in_features = base_shape
    tensors = {key: tensor_from_bytes(t.tensors[key], data)
               for key, data in target_blobs(store, label, kind, t, base_shape).items()}
    return TargetData(t.module, out_features, in_features, tensors, t.scale, t.ia3_on)
