"""`slm --version` (issue 32): slm's version, the runtime version compositions record, and the
kernels' build (the CPU variant loaded, the variants built and runnable, and the SIMD level the
variant was compiled for, as setup.py records it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import HANG_S
from slm.errors import ExitCode

SLM = [sys.executable, "-m", "slm"]


def _cpu_flags() -> set[str] | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    line = next((ln for ln in text.splitlines() if ln.split(":")[0].strip() in ("flags", "Features")), None)
    return None if line is None else set(line.partition(":")[2].split())


def test_version_prints_the_version_the_runtime_and_the_kernel_build(tmp_path):
    import slm
    from slm.compose.composition import RUNTIME
    from slm.model import cpu_variants
    from slm.model.kernel_choice import library_path

    # no store anywhere: --version needs none
    env_store = {"SLM_STORE": str(tmp_path / "no-store")}
    r = subprocess.run([*SLM, "--version", "--json"], capture_output=True, text=True, timeout=HANG_S,
                       env={**os.environ, **env_store})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    info = json.loads(r.stdout)
    assert info["version"] == slm.__version__
    assert info["runtime"] == RUNTIME
    assert info["kernels"]["extension"] == library_path()
    assert info["kernels"]["variant"] == cpu_variants.chosen()
    assert (info["kernels"]["variants_built"], info["kernels"]["variants_runnable"]) == \
        (cpu_variants.built(), cpu_variants.runnable())
    assert info["mode"] in ("int8", "exact")
    flags = _cpu_flags()
    if flags is not None:  # the CPU's SIMD features are what /proc/cpuinfo lists, in its spelling
        for feature, flag in (("avx2", "avx2"), ("avx512f", "avx512f"), ("fma", "fma"), ("avx512vnni", "avx512_vnni")):
            assert (feature in info["kernels"]["cpu"]) == (flag in flags), feature
    human = subprocess.run([*SLM, "--version"], capture_output=True, text=True, timeout=HANG_S)
    assert human.returncode == 0
    lines = human.stdout.splitlines()
    assert lines[0] == f"slm {slm.__version__}" and lines[1] == f"runtime slm {RUNTIME['version']}"
    assert lines[2].startswith("kernels: ") and f"numerics mode: {info['mode']}" in lines[2]
    if info["kernels"]["variant"] is not None:
        assert f"variant {info['kernels']['variant']} of {' '.join(cpu_variants.built())}," in lines[2]


@pytest.mark.parametrize("macros,level,features", [
    (["__AVX2__", "__FMA__", "__AVX__", "__F16C__", "__SSE4_2__", "__x86_64__"], "avx2",
     ["avx2", "fma", "avx", "f16c", "sse4_2"]),
    (["__AVX512F__", "__AVX512BW__", "__AVX512VNNI__", "__AVX2__", "__AVX__"], "avx512f",
     ["avx512vnni", "avx512bw", "avx512f", "avx2", "avx"]),
    (["__ARM_NEON", "__ARM_FEATURE_DOTPROD", "__aarch64__"], "neon", ["asimddp", "neon"]),
    (["__x86_64__", "__SSE2__"], "generic", []),
])
def test_the_build_record_names_the_simd_level_the_kernels_were_compiled_for(tmp_path, monkeypatch, macros,
                                                                              level, features):
    from slm.model import kernel_choice

    extension = tmp_path / "_qkernels_avx2.cpython-311-x86_64-linux-gnu.so"
    extension.write_bytes(b"")
    monkeypatch.setattr(kernel_choice, "library_path", lambda: str(extension))
    assert kernel_choice.build_info()["built_for"] is None  # built before the record: unknown, not guessed
    (tmp_path / f"_qkernels_avx2{kernel_choice.BUILD_RECORD}").write_text(json.dumps({"flags": [], "macros": macros}))
    info = kernel_choice.build_info()
    assert (info["simd"], info["built_for"]) == (level, features)


def test_version_says_when_the_c_kernels_are_not_built(monkeypatch, capsys):
    from slm.cli import run
    from slm.model import kernel_choice

    monkeypatch.setattr(kernel_choice, "library_path", lambda: None)
    assert run(["--version"]) == 0
    out = capsys.readouterr().out
    assert "NumPy reference kernels (the C extension is not built)" in out and "numerics mode: exact" in out


def test_options_without_a_command_are_still_a_usage_error(tmp_path):
    r = subprocess.run([*SLM, "--store", str(tmp_path)], capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == ExitCode.USAGE and r.stderr == "slm: error: Missing command.\n"
