#!/usr/bin/env bash
# fuzz/run.sh — build the libFuzzer targets with clang (ASan + UBSan) in build-fuzz/ and run each one for
# a fixed budget, starting from the committed seed corpus. Fails on any crash, sanitizer report, timeout
# or out-of-memory. `make fuzz` calls it; `make test` calls `make fuzz`.
#   FUZZ_SECONDS   budget per target (default 60)
#   FUZZ_TARGETS   which targets (default: fuzz_attn fuzz_ffi; fuzz_ffi only when the FFI sources exist)
#   PYTHON         python with jax, for the FFI header (default .venv/bin/python)
# New inputs found during a run go to build-fuzz/corpus/<target>/ (not to the committed corpus); a crash
# leaves build-fuzz/crash-* and the script prints the command that replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
PYTHON=${PYTHON:-.venv/bin/python}
JOBS=${JOBS:-$(nproc)}

CC_FUZZ=$(packaging/clang.sh) # clang 14 and its runtime, installed where missing

mkdir -p build-fuzz
# No -Werror here: clang warns where gcc (the -Werror build) does not, e.g. an unused static inline in
# a .c file; this build is for finding memory and UB bugs, the gcc builds enforce warnings.
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER="$CC_FUZZ" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DSINKATTN_FUZZ=ON -DSINKATTN_CUDA=OFF -DSINKATTN_TESTS=OFF -DSINKATTN_WERROR=OFF \
      -DPython_EXECUTABLE="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")" >build-fuzz/configure.log 2>&1 || { cat build-fuzz/configure.log; exit 1; }
targets=${FUZZ_TARGETS:-fuzz_attn $(ls src/ffi/*.c >/dev/null 2>&1 && echo fuzz_ffi)}
cmake --build build-fuzz -j "$JOBS" --target $targets

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
for t in $targets; do
  work=build-fuzz/corpus/$t
  mkdir -p "$work" fuzz/corpus/$t
  echo "== $t: ${FUZZ_SECONDS}s, seeds fuzz/corpus/$t ($(ls fuzz/corpus/$t | wc -l) files)"
  # -timeout: one input running 10 s is a hang; -rss_limit_mb: a 2 GiB process is a leak or a size bug.
  # -seed fixed (FUZZ_SEED to vary it by hand): CI replays the sequence a developer ran, so a red CI is a
  # regression on known ground, not a new finding that depends on the day's luck.
  if ! (cd build-fuzz && ./fuzz/$t -seed="${FUZZ_SEED:-1}" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 \
          -print_final_stats=1 "corpus/$t" "../fuzz/corpus/$t" >"$t.log" 2>&1); then
    tail -n 60 "build-fuzz/$t.log"
    echo "FAIL $t: see build-fuzz/$t.log; replay with: build-fuzz/fuzz/$t build-fuzz/crash-<hash>"
    status=1
  else
    grep -E "stat::number_of_executed_units|cov:" "build-fuzz/$t.log" | tail -n 2
    echo "ok $t"
  fi
done
exit $status
