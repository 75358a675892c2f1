# sinkattn — the README's commands. Everything is set up from a fresh clone: two virtualenvs at the repository
# root, .venv (Python $(PY): the oldest supported jax stack, requirements-dev.txt) and, for `make test`,
# .venv-newest (Python 3.13: the newest, requirements-newest.txt); a CMake build in build/; then the tests,
# the docs or the demo. One library serves both: the handlers declare XLA FFI API 0.1 (src/ffi/ffi_version.c).
PY        ?= python3
PY_NEWEST ?= $(firstword $(wildcard $(shell pyenv root 2>/dev/null)/versions/3.13*/bin/python3.13) \
                         $(shell command -v python3.13 2>/dev/null | grep -v /shims/))
VENV      := .venv
VPY       := $(VENV)/bin/python
VENV_NEW  := .venv-newest
VPY_NEW   := $(VENV_NEW)/bin/python
BUILD     := build
JOBS      ?= $(shell nproc)
CMAKE_FLAGS ?=
WHEEL_ARGS ?=

.PHONY: all build check test test-c test-c-clang test-py test-py-newest docs lint wheel wheel-compat demo demo-c bench \
        bench-cpu sanitize fuzz clean

all: build

$(VENV)/.stamp: requirements-dev.txt requirements-oldest.txt requirements-test.txt
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r requirements-dev.txt
	touch $@

$(VENV_NEW)/.stamp: requirements-newest.txt requirements-test.txt
	@test -n "$(PY_NEWEST)" || { echo "make: no Python 3.13 for the newest end of the tested range:" \
	  "set PY_NEWEST=/path/to/python3.13"; exit 1; }
	$(PY_NEWEST) -m venv $(VENV_NEW)
	$(VPY_NEW) -m pip install -q --upgrade pip
	$(VPY_NEW) -m pip install -q -r requirements-newest.txt -r requirements-test.txt
	touch $@

$(VENV)/.stamp-wheel: $(VENV)/.stamp requirements-wheel.txt
	$(VPY) -m pip install -q -r requirements-wheel.txt
	touch $@

build: $(VENV)/.stamp
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DSINKATTN_WERROR=ON \
	      -DPython_EXECUTABLE=$(abspath $(VPY)) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

test-c: build
	ctest --test-dir $(BUILD) --output-on-failure

# The CPU library and its C tests built by a second compiler (clang 14, packaging/clang.sh) and run: a
# miscompile under either compiler fails `make test` (GCC 12 once deleted the AMX tile configuration's stores).
test-c-clang:
	cmake -S . -B build-clang -DCMAKE_C_COMPILER=$$(packaging/clang.sh) -DCMAKE_BUILD_TYPE=Release \
	      -DSINKATTN_CUDA=OFF -DSINKATTN_FFI=OFF -DSINKATTN_WERROR=ON
	cmake --build build-clang -j $(JOBS)
	ctest --test-dir build-clang --output-on-failure

test-py: build
	PYTHONPATH=python $(VPY) -m pytest tests -q

# The same library (built against the oldest jaxlib's header) under the newest jax, flax and Python.
test-py-newest: build $(VENV_NEW)/.stamp
	PYTHONPATH=python $(VPY_NEW) -m pytest tests -q

# The API reference (pdoc) from the docstrings, into build/docs/api; a warning fails it.
docs: $(VENV)/.stamp
	PYTHONPATH=python $(VPY) docs/api/build.py $(BUILD)/docs/api

# The style: Python by ruff (pyproject.toml's [tool.ruff]: lint rules and the formatter), C and CUDA by
# clang-format 14 (.clang-format), each over every file of its language; then the rot gate (tests/rot_gate.py):
# an sa_* name, a path, a commit hash or a date in a comment or a doc that the tree no longer backs.
LINT_DIRS := python tests bench docs packaging examples
lint: $(VENV)/.stamp
	$(VENV)/bin/ruff check $(LINT_DIRS)
	$(VENV)/bin/ruff format --check $(LINT_DIRS)
	$(VENV)/bin/clang-format --dry-run --Werror --style=file $$(find src include tests fuzz bench examples \
	  \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' \) -not -path '*/corpus/*')
	$(VPY) tests/rot_gate.py

# Both ends of the version range, the API reference, the sanitizer run and the fuzz budget (2 x 60 s): 17 min
# from a fresh clone on the 2 shared cores, CUDA compiled (12 min of CPU; each pytest run 4-5 min).
test: lint test-c test-c-clang test-py test-py-newest docs sanitize fuzz

# The inner loop: the C tests and the pytest suite but its `slow` tests (tests/conftest.py lists them by role),
# on .venv only: no sanitizers, fuzz, clang build or second venv. On a built tree on 2 cores of the Xeon with AMX
# (the tile plans the bf16 default): 3 min 31 s, ctest 16 s and pytest 3 min 15 s (511 tests; the whole suite 6 min).
check: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	PYTHONPATH=python $(VPY) -m pytest tests -q -m "not slow"

# The wheel users get from `pip wheel .`, built by the newest Python (so against the newest jaxlib's header),
# then `auditwheel repair`: dist/sinkattn-<version>-py3-none-manylinux_*.whl (CUDA backend when nvcc is found;
# WHEEL_ARGS=-Ccmake.define.SINKATTN_CUDA=OFF for the CPU backend only).
wheel: $(VENV_NEW)/.stamp $(VENV)/.stamp-wheel
	rm -rf dist
	$(VPY_NEW) -m pip wheel . --no-deps -w dist/linux $(WHEEL_ARGS)
	PATH=$(abspath $(VENV))/bin:$$PATH auditwheel repair -w dist dist/linux/sinkattn-*.whl
	PATH=$(abspath $(VENV))/bin:$$PATH auditwheel show dist/sinkattn-*manylinux*.whl

# A wheel built against the newest jaxlib on the oldest jax, and the reverse, both built from a read-only copy
# (packaging/wheel_compat.sh says what runs).
wheel-compat: $(VENV)/.stamp $(VENV_NEW)/.stamp
	PY=$(PY) PY_NEWEST=$(PY_NEWEST) WHEEL_ARGS="$(WHEEL_ARGS)" packaging/wheel_compat.sh

demo: build
	PYTHONPATH=python $(VPY) examples/demo.py

demo-c: build
	$(BUILD)/sinkattn_demo

# One table: the default plans, the AMX tile and vector plans forced and PyTorch's SDPA (when torch is importable)
# side by side, the CPU's FMA / AMX / read-bandwidth peaks of the same run above it (bench/cpu_bench.py); the JSON
# (OUT=file.json, else bench/results/cpu-<date>.json) names the commit, the CPU, the compiler and the versions.
bench-cpu: build
	$(VPY) bench/cpu_bench.py --lib $(BUILD)/libsinkattn_cpubench.so $(if $(OUT),--out $(OUT))

bench: build
	PYTHONPATH=python $(VPY) bench/jax_bench.py --out bench/results/

sanitize:
	cmake -S . -B build-san -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSINKATTN_SANITIZE=ON -DSINKATTN_CUDA=OFF \
	      -DSINKATTN_FFI=OFF -DSINKATTN_WERROR=ON
	cmake --build build-san -j $(JOBS)
	SINKATTN_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --test-dir build-san --output-on-failure

# libFuzzer targets (clang, ASan + UBSan), FUZZ_SECONDS each (default 60); see fuzz/run.sh.
fuzz: $(VENV)/.stamp
	JOBS=$(JOBS) PYTHON=$(VPY) fuzz/run.sh

clean:
	rm -rf $(BUILD) build-san build-fuzz build-clang dist
