"""Building, finding and staging compositions (shared by activate, run and verify)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slm.compose.adapter_manifest import AdapterManifest, parse_adapter_manifest, tensor_from_bytes
from slm.compose.base_manifest import BaseManifest, parse_base_manifest
from slm.compose.composition import (MAX_ADAPTERS, AdapterRef, Composition, check_adapter_list, check_weight,
                                     for_base, parse_composition)
from slm.compose.validate import validate
from slm.errors import Incompatible, IntegrityError, InvalidInput, NotFound
from slm.arch.roles import qk_heads
from slm.model.overlays import Overlay, TargetData, build_overlay
from slm.ops.resolve import by_prefix, load_base, resolve
from slm.store import Store
from slm.store import digest as dg


def parse_adapter_spec(spec: str) -> tuple[str, float]:
    """'name' or 'name@0.7' -> (name, weight)."""
    name, sep, weight_text = spec.partition("@")
    if not sep:
        return name, 1.0
    try:
        weight = float(weight_text)
    except ValueError as err:
        raise InvalidInput(f"adapter {name}: weight {weight_text!r} is not a number") from err
    return name, check_weight(weight, f"adapter {name}")


def build(store: Store, base_ref: str, adapter_specs: list[str]) -> Composition:
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
    """A composition manifest given with `activate -f` (a pipe such as <(...) is fine)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError as err:
        raise NotFound(f"no such file: {path}") from err
    except OSError as err:
        raise InvalidInput(f"cannot read {path}: {err.strerror}") from err
    if len(data) > MAX_MANIFEST_BYTES:
        raise InvalidInput(f"{path}: a composition manifest is at most {MAX_MANIFEST_BYTES} bytes")
    return parse_composition(data, Path(path).name)


def load(store: Store, comp_id: str) -> Composition:
    """The stored manifest of a composition id, checked to hash back to that id."""
    manifest_digest = store.names.get("compositions", dg.hex_of(comp_id))
    if manifest_digest is None:
        raise NotFound(f"no composition {comp_id} in the store")
    comp = parse_composition(store.objects.read_verified(manifest_digest), f"composition {dg.short(comp_id)}")
    if comp.id != comp_id:
        raise IntegrityError(f"composition {dg.short(comp_id)}: its manifest hashes to another id")
    return comp


def find_id(store: Store, ref: str) -> str:
    """A composition id from a full id or a unique prefix of one (resolve.by_prefix)."""
    found = by_prefix([dg.PREFIX + hex_id for hex_id, _ in store.names.items("compositions")], ref,
                      "composition")
    if found is None:
        raise NotFound(f"no composition {ref!r} in the store")
    return found


@dataclass
class Staged:
    """A validated composition with everything it needs loaded: ready to run or to swap in."""

    composition: Composition
    base_digest: str
    base: BaseManifest
    adapters: list[tuple[AdapterRef, AdapterManifest]]
    overlays: list[Overlay]


def _verified(store: Store, digest: str, what: str) -> bytes:
    try:
        return store.objects.read_verified(digest)
    except NotFound as err:
        raise NotFound(f"{what}: unknown digest {digest}") from err


def stage(store: Store, comp: Composition, verify_base: bool = True) -> Staged:
    """Validate everything (every blob re-hashed, or vouched for by the verified-digest cache:
    docs/recovery.md) and load the overlays. Changes nothing but that advisory cache."""
    base = parse_base_manifest(_verified(store, comp.base, "base"), f"base {dg.short(comp.base)}")
    # the base blobs the verified-digest cache does not vouch for: usually none, and then no
    # thread is started (nor concurrent.futures imported: slm activate is a new process each time)
    unknown = [d for d in base.blob_digests() if not store.objects.trusted(d)] if verify_base else []
    if not unknown:
        try:
            return _stage_adapters(store, comp, base)
        finally:
            store.objects.save_verified()
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as background:
        # Re-hashing the base (BLAKE3 and file reads release the GIL) overlaps with parsing
        # and checking the adapters, which hold it: about 40 ms off an activation.
        base_check = background.submit(store.objects.first_bad, unknown)
        try:
            return _stage_adapters(store, comp, base)
        finally:  # a corrupt base outranks whatever the adapters' checks said
            bad = base_check.result()
            store.objects.save_verified()  # what the re-hashes found, for the next command
            if bad is not None:
                raise IntegrityError(f"base blob {dg.short(bad)} is missing or corrupt (run `slm fsck`)")


def _stage_adapters(store: Store, comp: Composition, base: BaseManifest) -> Staged:
    adapters = []
    for ref in comp.adapters:
        label = ref.name or dg.short(ref.digest)
        manifest = parse_adapter_manifest(_verified(store, ref.digest, f"adapter {label}"), f"adapter {label}")
        adapters.append((ref, manifest))
    validate(comp, comp.base, base, adapters)
    arch = base.architecture
    heads = qk_heads(arch)
    overlays = []
    shapes = {t.name: t.shape for t in base.tensors}
    for ref, manifest in adapters:
        label = ref.name or dg.short(ref.digest)
        for t in manifest.targets:
            with np.errstate(over="ignore"):
                factor = np.float32(ref.weight) * np.float32(t.scale)
            if not np.isfinite(factor):
                raise Incompatible(f"adapter {label}: weight {ref.weight:g} x scale {t.scale:g} of "
                                   f"{t.module} overflows float32")
        targets = [target_data(store, label, manifest.kind, t, shapes[t.module]) for t in manifest.targets]
        overlays.append(build_overlay(manifest.kind, ref.weight, targets, src_layout=manifest.row_layout,
                                      dst_layout=base.qk_row_layout, heads=heads))
    return Staged(comp, comp.base, base, adapters, overlays)


def target_data(store: Store, label: str, kind: str, t, base_shape: tuple[int, ...]) -> TargetData:
    """Load a target's tensors; its dimensions come from the base weight (validated equal)."""
    out_features, in_features = base_shape
    tensors = {}
    for key, ref in t.tensors.items():
        arr = tensor_from_bytes(ref, _verified(store, ref.digest, f"adapter {label}"))
        # finite in the precision the overlays compute in (float32), not only as stored
        if arr.dtype.kind == "f" and not np.all(np.isfinite(arr.astype(np.float32, copy=False))):
            raise Incompatible(f"adapter {label}: tensor {key} of {t.module} has values that are "
                               "not finite as float32")
        tensors[key] = arr
    if kind == "sparse":
        idx = tensors["indices"]
        if idx.size and (idx.min() < 0 or idx.max() >= out_features * in_features):
            raise Incompatible(f"adapter {label}: sparse indices of {t.module} fall outside the weight")
    return TargetData(t.module, out_features, in_features, tensors, t.scale, t.ia3_on)
