"""One build right on every x86-64 CPU (slm.model.cpu_variants): the kernels are built once per
CPU variant, slm loads the best one the CPU runs or the one SLM_CPU names, and refuses one the
CPU cannot run. Under qemu-user (Debian's qemu-user, installed by `make test`'s set-up) the
build runs on emulated CPUs without AVX-512 and without AVX: no SIGILL, and the right choice.

`make test` runs this file, with the kernel, step and batch tests, once more under each other
variant this machine runs (SLM_CPU=...; the Makefile's test-variants)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import HANG_S, one_line

from slm.errors import ExitCode, InvalidInput
from slm.model import cpu_variants

ROOT = Path(__file__).resolve().parents[2]
X86_64 = platform.machine().lower() in ("x86_64", "amd64")


def test_the_kernels_loaded_are_the_variant_slm_cpu_names_else_the_best_this_cpu_runs():
    from slm.model import kernel_choice, kernels_native

    if not cpu_variants.built():
        pytest.skip("the C kernels are not built")
    wanted = os.environ.get(cpu_variants.ENV) or cpu_variants.runnable()[0]
    assert cpu_variants.chosen() == wanted
    assert kernels_native.LIB._name == cpu_variants.library_path()
    assert Path(kernels_native.LIB._name).name.startswith(f"_qkernels_{wanted}.")
    assert cpu_variants.module().__name__ == cpu_variants.MODULE_PREFIX + wanted
    info = kernel_choice.build_info()
    assert info["variant"] == wanted and info["extension"] == kernels_native.LIB._name
    assert info["variants_runnable"] == cpu_variants.runnable()
    assert set(info["variants_runnable"]) <= set(info["variants_built"])


@pytest.mark.skipif(not X86_64, reason="the x86-64 levels")
def test_the_cpu_is_asked_what_it_supports():
    """cpuid through the baseline module agrees with what Linux reports of this (unemulated) CPU."""
    if "baseline" not in cpu_variants.built():
        pytest.skip("the C kernels are not built")
    flags = next((set(line.partition(":")[2].split()) for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), None)
    if flags is None:
        pytest.skip("no /proc/cpuinfo flags")
    supports = cpu_variants.cpu_supports()
    assert ("x86-64-v3" in supports) == ({"avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm"} <= flags)
    assert ("x86-64-v4" in supports) == ({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"} <= flags
                                         and "x86-64-v3" in supports)
    assert ("avx512vnni" in supports) == ("avx512_vnni" in flags)
    with pytest.raises(ValueError, match="no CPU feature"):
        cpu_variants.module().cpu_supports("avx9000")


@pytest.mark.skipif(not X86_64, reason="the x86-64 levels")
def test_slm_cpu_naming_a_variant_this_cpu_cannot_run_is_refused(monkeypatch):
    if "avx2" not in cpu_variants.built():
        pytest.skip("the avx2 variant is not built")
    monkeypatch.setattr(cpu_variants, "cpu_supports", lambda: frozenset())  # a CPU with SSE2 alone
    assert cpu_variants.runnable() == ["baseline"]
    monkeypatch.setenv(cpu_variants.ENV, "avx2")
    with pytest.raises(InvalidInput, match=r"^SLM_CPU='avx2': this CPU cannot run that variant; it runs baseline$"):
        cpu_variants.chosen()
    monkeypatch.setenv(cpu_variants.ENV, "baseline")
    assert cpu_variants.chosen() == "baseline"
    monkeypatch.delenv(cpu_variants.ENV)
    assert cpu_variants.chosen() == "baseline"


@pytest.mark.skipif(not X86_64, reason="the x86-64 levels")
def test_slm_cpu_naming_a_variant_the_compiler_did_not_build_is_refused(monkeypatch):
    origin = cpu_variants._origin
    monkeypatch.setattr(cpu_variants, "_origin", lambda name: None if name == "avx512" else origin(name))
    monkeypatch.setenv(cpu_variants.ENV, "avx512")
    with pytest.raises(InvalidInput, match=r"^SLM_CPU='avx512': that variant was not built \(.*\); built: "):
        cpu_variants.chosen()
    monkeypatch.delenv(cpu_variants.ENV)
    assert cpu_variants.chosen() != "avx512"


@pytest.mark.parametrize("value", ["avx3", "AVX2", " avx2", "native-ish"])
def test_an_unknown_slm_cpu_is_one_line_and_exit_4(value):
    r = subprocess.run([sys.executable, "-m", "slm", "--version"], capture_output=True, text=True, timeout=HANG_S,
                       env={**os.environ, cpu_variants.ENV: value})
    assert r.returncode == ExitCode.INVALID_INPUT and one_line(r.stderr), r.stderr
    assert r.stderr.startswith(f"slm: error: SLM_CPU={value!r}: not one of ") and r.stdout == ""


# Run under an emulated CPU: the variant chosen, then the kernels' products (float path and the
# int8 mode's, packed Q4_0 rows included) against the NumPy reference kernels.
PROBE = """
import numpy as np
from slm import quant
from slm.model import cpu_variants, kernels_native
from slm.model.kernels import ReferenceKernels
from slm.model.weights import quant_tensor
rng = np.random.default_rng(7)
worst = 0.0
for codec in ("q4_0", "q8_0", "q4_k"):
    w = rng.standard_normal((64, 256)).astype(np.float32) * 0.05
    tensor = quant_tensor("w", w.shape, codec, quant.get_codec(codec).quantize(w).tobytes())
    for tokens in (1, 5, 40):
        x = rng.standard_normal((tokens, 256)).astype(np.float32)
        ref = ReferenceKernels().matmul(x, tensor)
        native = kernels_native.NativeKernels()
        exact = native.matmul(x, tensor)
        assert np.abs(exact - ref).max() <= 1e-5 * np.abs(ref).max(), (codec, tokens)
        native.set_activations("int8")
        worst = max(worst, float(np.abs(native.matmul(x, tensor) - ref).max() / np.abs(ref).max()))
assert worst < 0.05, worst
print(cpu_variants.chosen())
"""
QEMU = shutil.which("qemu-x86_64")
# (Haswell-noTSX: Haswell without the TSX qemu's TCG does not emulate; Nehalem: SSE4.2, no AVX)
EMULATED = [("Haswell-noTSX", "avx2"), ("Nehalem", "baseline")]


def _emulated(cpu: str, argv: list[str], **env: str) -> subprocess.CompletedProcess:
    if not X86_64 or QEMU is None:
        pytest.skip("no qemu-x86_64 (Debian's qemu-user) on an x86-64 machine")
    if set(cpu_variants.built()) != {"baseline", "avx2", "avx512"}:
        pytest.skip("not every x86-64 variant is built")
    r = subprocess.run([QEMU, "-cpu", cpu, sys.executable, *argv], capture_output=True, text=True,
                       timeout=HANG_S * 2, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    # (qemu warns of the host features its CPU model names that it cannot emulate)
    r.stderr = "".join(line for line in r.stderr.splitlines(keepends=True) if not line.startswith("qemu-x86_64: warning"))
    return r


@pytest.mark.slow
@pytest.mark.parametrize("cpu,expected", EMULATED)
def test_an_older_cpu_runs_the_best_variant_it_has_without_sigill(cpu, expected):
    r = _emulated(cpu, ["-c", PROBE], **{cpu_variants.ENV: ""})
    assert r.returncode == 0, f"exit {r.returncode} (-4: SIGILL): {r.stderr[-2000:]}"
    assert r.stdout.split() == [expected]


@pytest.mark.slow
def test_forcing_avx512_on_a_cpu_without_it_is_one_line_and_exit_4():
    r = _emulated("Haswell-noTSX", ["-m", "slm", "--version"], **{cpu_variants.ENV: "avx512"})
    assert r.returncode == ExitCode.INVALID_INPUT and r.stdout == "", r.stderr
    assert r.stderr == "slm: error: SLM_CPU='avx512': this CPU cannot run that variant; it runs avx2, baseline\n"
