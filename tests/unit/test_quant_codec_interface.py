"""What every slm.quant codec shares: read-only and unaligned buffers, dequantize_into, shapes
and sizes, its refusals (slm's QuantError), the codec registry and the numpy-free layout table."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402

from quant_fixtures import ALL_TYPES, assert_bit_exact, bits  # noqa: E402
from slm.errors import InvalidInput  # noqa: E402
from slm.quant import (  # noqa: E402
    SUPPORTED_GGML_TYPES,
    Codec,
    QuantError,
    by_ggml_type,
    codec_names,
    get_codec,
)


# ---------------------------------------------------------------- buffers and dequantize_into


@pytest.mark.parametrize("name", ALL_TYPES)
def test_dequantize_accepts_read_only_buffers(name, tmp_path):
    codec = get_codec(name)
    x = np.random.default_rng(4).normal(size=(3, 128)).astype(np.float32)
    raw = codec.quantize(x)
    expected = codec.dequantize(raw, x.shape)
    path = tmp_path / "blob"
    path.write_bytes(b"pad" + raw.tobytes())
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)[3:]  # read-only and unaligned
        got = codec.dequantize(view, x.shape)
        np.testing.assert_array_equal(bits(got), bits(expected))
        del got, view
    ro = np.frombuffer(raw.tobytes(), dtype=np.uint8)
    assert not ro.flags.writeable
    np.testing.assert_array_equal(bits(codec.dequantize(ro, x.shape)), bits(expected))
    from_bytes = codec.dequantize(raw.tobytes(), list(x.shape))
    np.testing.assert_array_equal(bits(from_bytes), bits(expected))


@pytest.mark.parametrize("name", ALL_TYPES)
def test_dequantize_into_reuses_the_output_buffer(name):
    codec = get_codec(name)
    x = np.random.default_rng(6).normal(size=(4, 256)).astype(np.float32)
    raw = codec.quantize(x)
    out = np.full(x.shape, np.nan, dtype=np.float32)
    assert codec.dequantize_into(raw, x.shape, out) is out
    np.testing.assert_array_equal(bits(out), bits(codec.dequantize(raw, x.shape)))
    with pytest.raises(QuantError, match="out must be"):
        codec.dequantize_into(raw, x.shape, np.empty((4, 128), dtype=np.float32))
    with pytest.raises(QuantError, match="out must be"):
        codec.dequantize_into(raw, x.shape, np.empty(x.shape, dtype=np.float64))


def test_large_tensor_spans_several_chunks():
    # more than CHUNK_ELEMENTS values, so quantize/dequantize loop over chunks
    x = np.random.default_rng(8).normal(size=(40, 32768)).astype(np.float32)
    assert_bit_exact("q4_0", x)


@pytest.mark.parametrize("name", ALL_TYPES)
def test_shapes_and_sizes(name):
    codec = get_codec(name)
    for shape in [(codec.block_size * 3,), (2, 5, codec.block_size * 2), (0, codec.block_size)]:
        x = np.ones(shape, dtype=np.float32)
        raw = codec.quantize(x)
        assert raw.dtype == np.uint8
        assert raw.shape == (*shape[:-1], shape[-1] // codec.block_size * codec.type_size)
        assert raw.nbytes == codec.nbytes(shape)
        assert codec.dequantize(raw, shape).shape == shape
        assert codec.dequantize(raw, shape).dtype == np.float32


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("name", ALL_TYPES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_is_rejected(name, bad):
    codec = get_codec(name)
    x = np.zeros((2, 2 * codec.block_size), dtype=np.float32)
    x[1, -1] = bad
    with pytest.raises(QuantError, match=f"{name}: cannot quantize non-finite values"):
        codec.quantize(x)


def test_non_finite_message_counts_nan_and_inf():
    x = np.zeros(64, dtype=np.float32)
    x[:3] = np.nan
    with pytest.raises(QuantError) as info:
        get_codec("q4_1").quantize(x)
    assert str(info.value) == "q4_1: cannot quantize non-finite values (3 NaN, 0 inf)"
    x[5] = -np.inf
    with pytest.raises(QuantError, match=r"\(3 NaN, 1 inf\)"):
        get_codec("q4_1").quantize(x)


def test_float64_overflowing_float32_is_reported():
    x = np.zeros(32)
    x[0] = 1e39  # finite in float64, inf in float32
    with pytest.raises(QuantError, match="overflow converting to float32"):
        get_codec("q8_0").quantize(x)


@pytest.mark.parametrize("name", ALL_TYPES)
def test_wrong_byte_length_is_rejected(name):
    codec = get_codec(name)
    shape = (2, codec.block_size * 2)
    raw = codec.quantize(np.ones(shape, dtype=np.float32)).tobytes()
    for data in (raw[:-1], raw + b"\0", b""):
        with pytest.raises(QuantError, match=f"takes {len(raw)} bytes"):
            codec.dequantize(data, shape)
    with pytest.raises(QuantError):
        codec.dequantize(raw, (3, codec.block_size * 2))


@pytest.mark.parametrize("name", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "nf4"])
def test_last_dim_not_multiple_of_block_size_is_rejected(name):
    codec = get_codec(name)
    n = codec.block_size + 1
    with pytest.raises(QuantError, match="not a multiple of the block size"):
        codec.quantize(np.ones((2, n), dtype=np.float32))
    with pytest.raises(QuantError, match="not a multiple"):
        codec.nbytes((2, n))
    with pytest.raises(QuantError, match="not a multiple"):
        codec.dequantize(b"", (n,))


def test_other_bad_inputs_are_rejected():
    with pytest.raises(QuantError, match="0-d"):
        get_codec("f32").quantize(np.float32(1.0))
    with pytest.raises(QuantError, match="dtype"):
        get_codec("q8_0").quantize(np.ones(32, dtype=np.complex64))
    with pytest.raises(QuantError, match="negative"):
        get_codec("q8_0").nbytes((-32,))
    with pytest.raises(QuantError, match="expected bytes"):
        get_codec("q8_0").dequantize(12345, (32,))


# ---------------------------------------------------------------- registry


# Covered in tests/unit/test_quant_kquants.py; listed here so the registry test sees every codec.
MORE_GGML_TYPES = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]


def test_registry_lookup():
    assert codec_names() == sorted(ALL_TYPES + MORE_GGML_TYPES)
    assert SUPPORTED_GGML_TYPES == {
        0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 10: "q2_k",
        11: "q3_k", 12: "q4_k", 13: "q5_k", 14: "q6_k", 30: "bf16",
    }
    for name in ALL_TYPES + MORE_GGML_TYPES:
        codec = get_codec(name)
        assert isinstance(codec, Codec) and codec.name == name
        assert get_codec(name.upper()) is codec
        if codec.ggml_type is not None:
            assert get_codec(codec.ggml_type) is codec is by_ggml_type(codec.ggml_type)
            assert get_codec(np.int64(codec.ggml_type)) is codec
            block_size, type_size = gguf.GGML_QUANT_SIZES[GT(codec.ggml_type)]
            assert (codec.block_size, codec.type_size) == (block_size, type_size)
            assert GT(codec.ggml_type).name.lower() == name
    assert get_codec(GT.Q4_1).name == "q4_1"
    assert by_ggml_type(16) is None


def test_unknown_codec_lists_supported_names():
    with pytest.raises(QuantError) as info:
        get_codec("q7_k")
    for name in ALL_TYPES:
        assert name in str(info.value)
    with pytest.raises(QuantError, match=r"unsupported GGML tensor type IQ2_XXS \(id 16\).*q4_0"):
        get_codec(16)
    with pytest.raises(QuantError):
        get_codec(True)
    with pytest.raises(QuantError):
        get_codec(None)


def test_quant_error_is_a_value_error_and_an_slm_input_error():
    assert issubclass(QuantError, ValueError)
    assert issubclass(QuantError, InvalidInput)


def test_subclass_registration_rules():
    class Helper(Codec):  # no name of its own: a helper base, not registered
        pass

    assert "helper" not in codec_names()
    with pytest.raises(TypeError, match="must implement"):

        class Incomplete(Codec):
            name = "incomplete"
            ggml_type = None
            block_size = 1
            type_size = 1

    assert "incomplete" not in codec_names()


# ------------------------------------------------------------ the numpy-free layout table

def test_the_layout_table_agrees_with_every_codec():
    """slm.quant.layouts (what an activation uses, without the codecs) is the codecs' layouts:
    the same types, the same bytes for every shape a type can hold."""
    from slm.quant.layouts import LAYOUTS, stored_bytes

    assert set(LAYOUTS) == set(codec_names())
    for name in codec_names():
        codec = get_codec(name)
        assert LAYOUTS[name] == (codec.block_size, codec.type_size)
        for shape in [(codec.block_size,), (3, 2 * codec.block_size), (2, 5, 4 * codec.block_size)]:
            assert stored_bytes(name, shape) == codec.nbytes(shape)


@pytest.mark.parametrize("dtype, shape", [("q4_1", (3, 33)), ("q6_k", (2, 128)), ("iq2_xxs", (1, 256)),
                                          ("nope", (4,)), ("f32", ())])
def test_stored_bytes_refuses_with_the_codecs_own_error(dtype, shape):
    from slm.quant.layouts import stored_bytes

    with pytest.raises(QuantError) as ours:
        stored_bytes(dtype, shape)
    with pytest.raises(QuantError) as theirs:
        get_codec(dtype).nbytes(shape)
    assert str(ours.value) == str(theirs.value)


def test_a_codec_whose_layout_disagrees_with_the_table_does_not_register():
    from slm.quant import registry

    class Wrong:
        name, ggml_type, block_size, type_size = "q4_1", None, 32, 21

    with pytest.raises(TypeError, match="layouts"):
        registry.register(Wrong())


def test_importing_the_package_imports_no_codec_until_one_is_asked_for():
    import subprocess
    import sys

    probe = ("import sys; import slm.quant, slm.quant.layouts, slm.quant.errors; "
             "print('numpy' in sys.modules); from slm.quant import get_codec; "
             "print(get_codec('q4_1').type_size, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "20", "True"], out.stderr
