"""Fused C kernels vs the NumPy reference path: agreement within 1e-5 relative on every type."""

from __future__ import annotations

import numpy as np
import pytest

from slm import quant
from slm.model import kernels_native
from slm.model.kernels import ReferenceKernels
from slm.model.weights import quant_tensor


@pytest.mark.parametrize("codec", ["q8_0", "q4_0", "q4_1", "nf4", "f16", "bf16", "f32"])
@pytest.mark.parametrize("tokens", [1, 3, 8, 12])
def test_fused_matches_reference(codec, tokens):
    rng = np.random.default_rng(hash((codec, tokens)) % 2**32)
    shape = (96, 256)
    w = rng.standard_normal(shape).astype(np.float32) * 0.05
    w[5, :32] = 0.0  # an all-zero block
    w[7, 40] = 3.0  # an outlier
    tensor = quant_tensor("w", shape, codec, quant.get_codec(codec).quantize(w).tobytes())
    x = rng.standard_normal((tokens, shape[1])).astype(np.float32)
    ref = ReferenceKernels().matmul(x, tensor)
    fused = kernels_native.NativeKernels().matmul(x, tensor)
    scale = np.abs(ref).max()
    assert np.abs(fused - ref).max() <= 1e-5 * scale


def test_fused_model_matches_reference(tiny_model, store):
    from slm.ops.importing import import_base
    from slm.ops.loading import load_base_model

    import_base(store, tiny_model["gguf_q"], "tq")
    import_base(store, tiny_model["hf"], "nf", quant="nf4")
    ids = np.asarray([5, 17, 42, 99, 123, 7])
    for name in ("tq", "nf"):
        loaded = load_base_model(store, name)
        model = loaded.model
        model.kernels = ReferenceKernels()
        ref = [model.forward(ids[:1], c := model.new_cache(8), "last")]
        ref += [model.forward(ids[i:i + 1], c, "last") for i in range(1, 6)]
        model.kernels = kernels_native.NativeKernels()
        out = [model.forward(ids[:1], c2 := model.new_cache(8), "last")]
        out += [model.forward(ids[i:i + 1], c2, "last") for i in range(1, 6)]
        np.testing.assert_allclose(np.concatenate(out), np.concatenate(ref), rtol=1e-4, atol=1e-4)
