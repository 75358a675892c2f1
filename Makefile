# sinkattn — the README's commands. Everything is set up from a fresh clone: a .venv at the repository
# root with the packages of requirements-dev.txt, a CMake build in build/, then the tests or the demo.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
BUILD   := build
JOBS    ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all build test test-c test-py demo demo-c bench bench-cpu sanitize fuzz clean

all: build

$(VENV)/.stamp: requirements-dev.txt
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r requirements-dev.txt
	touch $@

build: $(VENV)/.stamp
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DSINKATTN_WERROR=ON \
	      -DPython_EXECUTABLE=$(abspath $(VPY)) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

test-c: build
	ctest --test-dir $(BUILD) --output-on-failure

test-py: build
	PYTHONPATH=python $(VPY) -m pytest tests -q

# The sanitizer run and the fuzz budget (2 x 60 s) are part of `make test`: about 6 minutes on 2 cores.
test: test-c test-py sanitize fuzz

demo: build
	PYTHONPATH=python $(VPY) -m sinkattn.demo

demo-c: build
	$(BUILD)/sinkattn_demo

# The CPU's FMA / AMX / read-bandwidth peaks beside the kernels' figures, PyTorch's SDPA as a contender when
# torch is importable (bench/cpu_bench.py); OUT=file.json says where the results go.
bench-cpu: build
	$(VPY) bench/cpu_bench.py --lib $(BUILD)/libsinkattn_cpubench.so $(if $(OUT),--out $(OUT))

bench: build
	PYTHONPATH=python $(VPY) -m sinkattn.bench

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
	rm -rf $(BUILD) build-san build-fuzz python/sinkattn/*.so
