#!/usr/bin/env bash
# CMAKE_ARGS for building llama-cpp-python portably: GGML_NATIVE=OFF plus the x86 features this
# CPU reports in /proc/cpuinfo. Never AMX: a -march=native build on a CPU that reports AMX dies
# with SIGILL (tilezero) inside these VMs, where AMX is reported but not usable.
set -euo pipefail
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2 || true)
has() { [[ " $flags " == *" $1 "* ]]; }
args="-DGGML_NATIVE=OFF"
add() { if has "$2"; then args+=" -D$1=ON"; else args+=" -D$1=OFF"; fi; }
add GGML_AVX avx
add GGML_AVX2 avx2
add GGML_FMA fma
add GGML_F16C f16c
add GGML_BMI2 bmi2
add GGML_AVX512 avx512f
add GGML_AVX512_VBMI avx512vbmi
add GGML_AVX512_VNNI avx512_vnni
add GGML_AVX512_BF16 avx512_bf16
add GGML_AVX_VNNI avx_vnni
args+=" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
echo "$args"
