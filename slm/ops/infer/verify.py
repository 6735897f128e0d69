"""`slm verify`: integrity (every blob re-hashed, the id recomputed, the composition's prompt-cache
entries checked against their digests), then numerics against the
fresh-base oracle (slm.model.oracle) on fixed probe prompts, always in the exact mode
(slm.model.modes: float32 products), the one with a tolerance to check.

Exit codes: 5 when bytes are wrong (integrity), 10 when the numbers are (numerics).
"""

from __future__ import annotations

import numpy as np

from slm.compose.composition import Composition
from slm.model import modes
from slm.model.oracle import Oracle, OracleAdapter
from slm.ops.infer import compositions
from slm.ops.store import specs
from slm.ops.infer.loading import load_composition
from slm.ops.infer.prefix_cache import damaged_entries
from slm.ops.results import VerifyReport
from slm.ops.results import CompositionInfo
from slm.ops.progress import NoProgress, Progress
from slm.store import StoreDir
from slm.store import digest as dg

# One sequence (one oracle pass: each float64 weight is built once) mixing prose, a fact,
# code and digits.
PROBES = ("Once upon a time, in a small village, the capital of France was 2024 km away.\n"
          "def fibonacci(n):",)
# float32 executor vs float64 oracle on the same bytes: summation order and float32 rounding
# stay far below these (docs/numerics.md has the differences); an error of a hundredth in
# one adapter's scale does not.
MAX_ABS_TOL = 1e-3
MEAN_ABS_TOL = 1e-4


def _composition(store: StoreDir, ref: str | None) -> Composition:
    return specs.resolve(store, ref, hint="name a composition or a base to verify")


def _blobs(store: StoreDir, comp: Composition) -> list[str]:
    from slm.compose.adapter_manifest import parse_adapter_manifest
    from slm.compose.base_manifest import parse_base_manifest

    blobs = [comp.base]
    if store.objects.has(comp.base):
        blobs += parse_base_manifest(store.objects.read_verified(comp.base)).blob_digests()
    for a in comp.adapters:
        blobs.append(a.digest)
        if store.objects.has(a.digest):
            blobs += parse_adapter_manifest(store.objects.read_verified(a.digest)).blob_digests()
    return blobs


def check_integrity(store: StoreDir, comp: Composition, progress: Progress) -> dict:
    blobs = _blobs(store, comp)
    sizes = {d: store.objects.size(d) if store.objects.has(d) else 0 for d in blobs}
    progress.start("re-hashing blobs", sum(sizes.values()))
    bad = []
    for d in blobs:
        if not store.objects.has(d) or not store.objects.verify(d):
            bad.append(d)
        progress.advance(sizes[d])
    progress.finish()
    store.objects.save_verified()  # every blob was re-hashed: the cache now says what was found
    entries, damaged = damaged_entries(store.root / "cache", comp.id)  # its prompt-cache entries' digests
    return {"blobs": len(blobs), "bytes": sum(sizes.values()), "bad_blobs": bad, "cache_entries": entries,
            "bad_cache_entries": [str(path.relative_to(store.root)) for path, _ in damaged],
            "ok": not bad and not damaged}


def oracle(store: StoreDir, staged: compositions.Staged, tensors: dict) -> Oracle:
    """The fresh-base oracle for a staged composition (its adapters' tensors read afresh)."""
    shapes = {t.name: t.shape for t in staged.base.tensors}
    adapters = []
    for ref, manifest in staged.adapters:
        label = ref.name or dg.short(ref.digest)
        targets = [compositions.target_data(store, label, manifest.kind, t, shapes[t.module])
                   for t in manifest.targets]
        adapters.append(OracleAdapter(manifest.kind, ref.weight, targets, manifest.row_layout))
    return Oracle(staged.base.architecture, staged.base.qk_row_layout, tensors, adapters)


def check_numerics(store: StoreDir, comp: Composition) -> dict:
    loaded = load_composition(store, comp, verify=False)  # integrity was checked just before
    model = loaded.model
    with model.kernels.lock:
        modes.use(model.kernels, modes.EXACT)  # what the 1e-3 promise is about, whatever the default
    reference = oracle(store, loaded.staged, model.t)
    worst, total, count, agree, positions = 0.0, 0.0, 0, 0, 0
    for probe in PROBES:
        ids = np.asarray(loaded.tokenizer.encode(probe))
        ours = model.forward(ids, model.new_cache(len(ids)), "all").astype(np.float64)
        ref_logits = reference.logits(ids)
        err = np.abs(ours - ref_logits)
        worst = max(worst, float(err.max()))
        total += float(err.sum())
        count += err.size
        agree += int(np.sum(ours.argmax(-1) == ref_logits.argmax(-1)))
        positions += len(ids)
    mean = total / count
    return {
        "mode": modes.EXACT, "probes": len(PROBES), "positions": positions,
        "max_abs_error": worst, "mean_abs_error": mean, "top1_agreement": agree / positions,
        "tolerance": {"max_abs": MAX_ABS_TOL, "mean_abs": MEAN_ABS_TOL, "top1": 1.0},
        "ok": worst <= MAX_ABS_TOL and mean <= MEAN_ABS_TOL and agree == positions,
    }


def verify(store: StoreDir, ref: str | None = None, numerics: bool = True,
           progress: Progress | None = None) -> VerifyReport:
    comp = _composition(store, ref)  # loading re-derives the id from the manifest and checks it
    integrity = check_integrity(store, comp, progress or NoProgress())
    checked = check_numerics(store, comp) if numerics and integrity["ok"] else None
    return VerifyReport(comp.id, comp.base, CompositionInfo.of(comp).adapters, integrity, checked)
