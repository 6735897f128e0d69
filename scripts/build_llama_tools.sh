#!/usr/bin/env bash
# Builds llama.cpp's own tools (llama-bench, llama-batched-bench, llama-server, llama-quantize),
# the benchmark peer of docs/benchmarks.md, from the llama.cpp sources vendored in the
# llama-cpp-python sdist, so that the peer is the same llama.cpp the tokenizer reference uses.
# Native (-DGGML_NATIVE=ON) unless the CPU reports AMX: inside these VMs AMX is reported but not
# usable and a -march=native build dies with SIGILL, so the portable flags of
# scripts/llama_cpp_cmake_args.sh apply there. Idempotent: a stamp records the flags used.
#   usage: scripts/build_llama_tools.sh [PEERS_DIR]   (default: .peers)
set -euo pipefail
VERSION=0.3.36
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
peers=${1:-$root/.peers}
pip=${PIP:-$root/.venv/bin/pip}
[ -x "$pip" ] || pip="python3 -m pip"
jobs=${JOBS:-2}
stamp=$peers/tools.stamp
bin=$peers/bin
if [ -f "$stamp" ] && [ -x "$bin/llama-bench" ] && [ -x "$bin/llama-batched-bench" ] \
    && [ -x "$bin/llama-server" ] && [ -x "$bin/llama-quantize" ]; then
    exit 0
fi
mkdir -p "$peers/src" "$bin"
sdist=$(ls "$peers"/src/llama_cpp_python-$VERSION.tar.gz 2>/dev/null || true)
if [ -z "$sdist" ]; then
    $pip download --disable-pip-version-check -q --no-binary :all: --no-deps \
        "llama-cpp-python==$VERSION" -d "$peers/src"
    sdist=$peers/src/llama_cpp_python-$VERSION.tar.gz
fi
srcdir=$peers/src/llama_cpp_python-$VERSION
[ -d "$srcdir" ] || tar -xzf "$sdist" -C "$peers/src"
llama=$srcdir/vendor/llama.cpp

if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
    arch_flags=$(bash "$here/llama_cpp_cmake_args.sh")
else
    arch_flags="-DGGML_NATIVE=ON"
fi
# Option names of the vendored version: LLAMA_CURL is deprecated there (a no-op; HTTP goes through
# the bundled cpp-httplib), so it is not passed.
flags="-DCMAKE_BUILD_TYPE=Release $arch_flags -DBUILD_SHARED_LIBS=OFF \
-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
-DGGML_OPENMP=ON"
build=$peers/build
# shellcheck disable=SC2086
nice -n 10 cmake -S "$llama" -B "$build" $flags >"$peers/cmake.log"
nice -n 10 cmake --build "$build" --config Release -j"$jobs" \
    --target llama-bench llama-batched-bench llama-server llama-quantize >"$peers/build.log"
for t in llama-bench llama-batched-bench llama-server llama-quantize; do
    cp "$build/bin/$t" "$bin/$t"
done
{
    echo "llama-cpp-python $VERSION (vendored llama.cpp)"
    echo "$(grep -m1 -o 'ggml commit: .*' "$peers/cmake.log" || echo 'ggml commit: unknown')"
    echo "cmake flags: $flags"
    echo "compiler: $(${CXX:-c++} --version | head -1)"
} >"$stamp"
cat "$stamp"
