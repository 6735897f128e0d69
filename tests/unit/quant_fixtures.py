"""What the slm.quant tests share (test_quant.py, test_quant_nf4.py,
test_quant_codec_interface.py): the type lists, float32 bit patterns, the bit-exact comparison
with gguf-py's reference codecs, and the random data (over a million values, drawn once)."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf import quants as gq  # noqa: E402

from slm.quant import get_codec  # noqa: E402

GGML_BLOCK_TYPES = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"]
ALL_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "nf4"]
F16_MAX = 65504.0
F32_MAX = float(np.finfo(np.float32).max)


def gguf_type(name: str) -> GT:
    return GT[name.upper()]


def bits(a: np.ndarray) -> np.ndarray:
    """float32 bit patterns, so comparisons see signed zeros and NaN payloads."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def assert_bit_exact(name: str, x: np.ndarray) -> None:
    """Our quantize == gguf's bytes, and our dequantize == gguf's floats, bit for bit."""
    codec, qtype = get_codec(name), gguf_type(name)
    ours = codec.quantize(x)
    with np.errstate(over="ignore"):  # gguf warns when a scale overflows float16
        theirs = gq.quantize(x, qtype)
    assert ours.dtype == np.uint8 and ours.shape == theirs.shape
    if not np.array_equal(ours, theirs):
        bad = np.flatnonzero((ours != theirs).reshape(-1, codec.type_size).any(axis=1))
        block = x.reshape(-1, codec.block_size)[bad[0]]
        pytest.fail(f"{name}: {bad.size} blocks differ from gguf, first: {block!r}")
    with np.errstate(all="ignore"):  # scales that overflowed to inf decode to inf/NaN
        ref = gq.dequantize(theirs, qtype)
    np.testing.assert_array_equal(bits(codec.dequantize(ours, x.shape)), bits(ref))


def random_values(seed: int, normal_row: int = 1024) -> dict[str, np.ndarray]:
    """Four distributions of 2**18 values each: 1,048,576 values in all (test_quant.py's and,
    with rows of 2048 normal values, test_quant_kquants.py's)."""
    rng = np.random.default_rng(seed)
    n = 1 << 18
    log_uniform = rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-44, 38, n)
    return {
        "normal": rng.normal(0, 0.02, n).astype(np.float32).reshape(-1, normal_row),
        "uniform_wide": rng.uniform(-1e5, 1e5, n).astype(np.float32).reshape(-1, 256),
        "heavy_tailed": rng.standard_t(1.5, n).astype(np.float32).reshape(64, -1),
        # magnitudes from subnormal to near float32 max, so some scales overflow float16
        "log_uniform": log_uniform.astype(np.float32).reshape(-1, 4096),
    }


RANDOM = random_values(seed=1234)
