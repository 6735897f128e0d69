"""Rejection rules for a composition, checked before anything changes (the seed's list).

Manifest-level checks live here; byte-level checks (hashes, finite values, index bounds) are
made by the caller as it loads the tensors.
"""

from __future__ import annotations

from slm.compose.adapter_manifest import AdapterManifest, TargetRecord
from slm.compose.base_manifest import BaseManifest
from slm.compose.composition import RUNTIME, AdapterRef, Composition, architecture_digest, check_usable_weight
from slm.errors import Incompatible
from slm.store import digest as dg


def validate(comp: Composition, base_digest: str, base: BaseManifest,
             adapters: list[tuple[AdapterRef, AdapterManifest]]) -> None:
    if comp.base != base_digest:
        named, given = dg.short_pair(comp.base, base_digest)
        raise Incompatible(f"composition names base {named}, not {given}")
    if comp.tokenizer != base.tokenizer_digest:
        expected, found = dg.short_pair(comp.tokenizer, base.tokenizer_digest)
        raise Incompatible(f"tokenizer mismatch: the composition expects {expected}, the base has {found}")
    if comp.architecture != architecture_digest(base):
        raise Incompatible("architecture mismatch: the composition was made for another architecture")
    if comp.quant_profile != base.quant_profile:
        raise Incompatible(
            f"quantization profile mismatch: the composition expects {comp.quant_profile}, "
            f"the base is {base.quant_profile}"
        )
    if comp.runtime != RUNTIME:
        raise Incompatible(
            f"composition {dg.short(comp.id)} was verified with {comp.runtime.get('name')} "
            f"{comp.runtime.get('version')}, this is {RUNTIME['name']} {RUNTIME['version']}: "
            f"`slm activate --upgrade {dg.short(comp.id)}` rebuilds it for this runtime (verified again)"
        )
    seen: set[str] = set()
    shapes = {t.name: t.shape for t in base.tensors}
    for ref, manifest in adapters:
        label = ref.name or dg.short(ref.digest)
        if ref.digest in seen:
            raise Incompatible(f"adapter {label} appears twice in the composition")
        seen.add(ref.digest)
        check_usable_weight(ref.weight, f"adapter {label}")
        check_adapter_fits(label, manifest, base, shapes)


def check_adapter_fits(label: str, manifest: AdapterManifest, base: BaseManifest,
                       shapes: dict[str, tuple[int, ...]] | None = None) -> None:
    """An adapter's requirements and every target's shapes against a base: the check an
    activation makes, and `slm import adapter --base` makes at import."""
    shapes = {t.name: t.shape for t in base.tensors} if shapes is None else shapes
    _check_requires(label, manifest, base)
    for target in manifest.targets:
        _check_target(label, manifest.kind, target, shapes, base)


def _check_requires(label: str, manifest: AdapterManifest, base: BaseManifest) -> None:
    for key, wanted in sorted(manifest.requires.items()):
        have = base.architecture.get(key)
        if have is not None and have != wanted:
            raise Incompatible(f"adapter {label} needs {key}={wanted}, the base has {key}={have}")


def _check_target(label: str, kind: str, t: TargetRecord, shapes: dict, base: BaseManifest) -> None:
    if t.module == "token_embd.weight":
        raise Incompatible(f"adapter {label}: adapting the token embedding is not supported")
    if t.module == "output.weight" and base.architecture["tie_word_embeddings"]:
        raise Incompatible(f"adapter {label} targets the output head, which this base ties to the embedding")
    if t.module not in shapes:
        raise Incompatible(f"adapter {label} targets {t.module}, which the base lacks")
    out_features, in_features = shapes[t.module]
    # 0 means the adapter file does not say (an IA3 vector knows only one side)
    if t.out_features not in (0, out_features) or t.in_features not in (0, in_features):
        raise Incompatible(
            f"adapter {label}: {t.module} is {t.out_features}x{t.in_features} in the adapter, "
            f"{out_features}x{in_features} in the base"
        )
    ts = {k: v.shape for k, v in t.tensors.items()}
    if kind == "lora":
        r = ts["A"][0] if len(ts["A"]) == 2 else -1
        ok = ts["A"] == (r, in_features) and ts["B"] == (out_features, r) and r > 0
    elif kind == "ia3":
        n = in_features if t.ia3_on == "input" else out_features
        ok = ts["vector"] == (n,) and t.ia3_on in ("input", "output")
    else:
        ok = len(ts["indices"]) == 1 and ts["indices"] == ts["values"]
    if not ok:
        raise Incompatible(f"adapter {label}: tensor shapes for {t.module} do not align ({ts})")
