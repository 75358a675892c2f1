#!/usr/bin/env bash
# bench/gpu_sanitize.sh — compute-sanitizer over the GPU tests, on the H200 test machine (no package
# registry: needs only what is there: cmake, nvcc, compute-sanitizer, python with jax + pytest).
#
#   bench/gpu_sanitize.sh            (from the repository root; logs and summary.txt go to $OUT)
#
# 1. builds build-gpusan/ (CUDA + FFI handlers, RelWithDebInfo, -lineinfo from CMakeLists) with cmake;
# 2. runs tests/test_cuda under memcheck (with leak check), racecheck, initcheck and synccheck, on every
#    SA_TEST_CUDA_STRIDE-th case (default 8: the sanitizers slow kernels ~100x);
# 3. runs a small pytest subset (the gpu-marked tests of test_hardening.py and the GPU-platform cases
#    of test_ops.py picked by PYTEST_K) under memcheck (only sinkattn's kernels, names sa_*, instrumented)
#    and initcheck (every kernel instrumented, reports counted in sa_* kernels only; see below why);
# 4. writes $OUT/summary.txt (one line per run: tool, target, ERROR SUMMARY) and exits 1 if any run
#    reported an error or failed.
# Env: OUT (default bench/results/sanitize), SA_TEST_CUDA_STRIDE (8), PYTEST_K ("gpu and not f32"),
#      PYTEST_TOOLS ("memcheck initcheck"), SAN_NOBUILD (1: build-gpusan is already built),
#      SAN_TOOLS (the tools over test_cuda: "memcheck racecheck initcheck synccheck"),
#      SAN_ONLY (pytest: skip the test_cuda runs; test_cuda: skip the pytest runs), PYTHON (python3), SANITIZER (compute-sanitizer on PATH, else /usr/local/cuda/bin/compute-sanitizer).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/sanitize}
PYTHON=${PYTHON:-python3}
STRIDE=${SA_TEST_CUDA_STRIDE:-8}
# The tests' gpu-platform parameters (the CPU ones run no kernel of ours), less the f32 ones: on a GPU f32 inputs
# run the jnp reference (our kernels take bf16 / f16), and memcheck itself died (SIGSEGV) inside XLA's kernels of
# test_forward_f32[gpu-segments_causal_lengths] (H200 session 3; every test before it passed clean).
PYTEST_K=${PYTEST_K:-gpu and not f32}
SAN=${SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
mkdir -p "$OUT"
summary="$OUT/summary.txt"
: >"$summary"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; "$SAN" --version | tail -n 1; } \
  >"$OUT/machine.txt" 2>&1

[ "${SAN_NOBUILD:-0}" = 1 ] || cmake -S . -B build-gpusan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSINKATTN_CUDA=ON -DSINKATTN_FFI=ON \
      -DPython_EXECUTABLE="$(command -v "$PYTHON")" >"$OUT/build.log" 2>&1 &&
  cmake --build build-gpusan -j "$(nproc)" --target test_cuda sinkattn_jax >>"$OUT/build.log" 2>&1 ||
  { echo "build failed: see $OUT/build.log"; tail -n 40 "$OUT/build.log"; exit 1; }

status=0
# run TOOL NAME CMD...: one sanitizer run, its log in $OUT/NAME.TOOL.log, a line in the summary.
run() {
  local tool=$1 name=$2
  shift 2
  local extra=()
  # leak check over test_cuda only: under python the sanitizer crashed with it (H200 session 3, SIGSEGV before
  # any report; every probe without it ran, bench/gpu_sanitize_probe.sh), and XLA's allocations are not ours
  [ "$tool" = memcheck ] && [ "$name" = test_cuda ] && extra+=(--leak-check full)
  "$SAN" --tool "$tool" "${extra[@]}" --error-exitcode 99 --print-limit 50 \
         --log-file "$OUT/$name.$tool.san.log" "$@" >"$OUT/$name.$tool.log" 2>&1
  local rc=$?
  local errs
  errs=$(grep -h -E "(ERROR|RACECHECK) SUMMARY" "$OUT/$name.$tool.san.log" | tail -n 1)  # racecheck: hazards
  # rc 77: test_cuda found no device (a skip is not a pass on the GPU machine)
  echo "$tool $name rc=$rc ${errs:-no summary}" | tee -a "$summary"
  [ $rc -eq 0 ] || status=1
}

export SA_TEST_CUDA_STRIDE=$STRIDE
if [ "${SAN_ONLY:-}" != pytest ]; then  # SAN_ONLY=pytest: the pytest part alone
  for tool in ${SAN_TOOLS:-memcheck racecheck initcheck synccheck}; do
    run "$tool" test_cuda build-gpusan/test_cuda
  done
fi

[ "${SAN_ONLY:-}" = test_cuda ] && { echo "logs in $OUT; status $status"; exit $status; }  # SAN_ONLY=test_cuda
# XLA: no preallocated pool, so memcheck sees XLA's allocations as they grow. Not the "platform" allocator (a
# cudaMalloc per buffer, which would give each buffer exact bounds): with it memcheck died (SIGSEGV) within a
# minute of the pytest run, while without it the same run went through test_hardening and a third of test_ops
# (H200 session 3 of 2026-11-29).
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=python
export SINKATTN_LIBRARY=${SINKATTN_LIBRARY:-$(ls "$PWD"/build-gpusan/libsinkattn_jax.* 2>/dev/null | head -n 1)}
PYTEST_ARGS=(-q -p no:cacheprovider tests/test_hardening.py tests/test_ops.py -k "$PYTEST_K")
# memcheck: only our kernels (names sa_*) are instrumented; XLA's and cuDNN's are not ours to check.
# pytest runs the tests in its own process (no xdist here): the sanitizer follows only that process. With
# --target-processes all it crashed (SIGSEGV before any report, H200 session 3 of 2026-11-29) while the same
# sanitizer over a jax program without that option ran clean (bench/gpu_sanitize_probe.sh).
PYTEST_TOOLS=${PYTEST_TOOLS:-memcheck initcheck}  # e.g. one tool per GPU, two instances side by side
case " $PYTEST_TOOLS " in *" memcheck "*)
run memcheck pytest --kernel-name kns=sa_ "$PYTHON" -m pytest "${PYTEST_ARGS[@]}" ;; esac
case " $PYTEST_TOOLS " in *" initcheck "*) ;; *) echo "logs in $OUT; status $status"; exit $status ;; esac
# initcheck counts a buffer as initialised only when an instrumented kernel, memset or memcpy wrote it. With the
# kns=sa_ filter XLA's kernels are not instrumented, so every buffer XLA wrote (the cotangent dout, ...) looks
# uninitialised to our kernels: that is what the first GPU run's 50 reports in sa_bwd_pre_kernel were. So initcheck
# instruments every kernel, and the pass criterion is the number of reports located in one of ours (sa_*);
# XLA's own reports stay in the log.
"$SAN" --tool initcheck --print-limit 100000 --log-file "$OUT/pytest.initcheck.san.log" \
  "$PYTHON" -m pytest "${PYTEST_ARGS[@]}" >"$OUT/pytest.initcheck.log" 2>&1
rc=$?
ours=$(grep -c -E '^=+ +at .*[^A-Za-z0-9_]sa_[a-z0-9_]+' "$OUT/pytest.initcheck.san.log")
echo "initcheck pytest rc=$rc (pytest's own status) reports in sa_ kernels: $ours; all: $(grep -h 'ERROR SUMMARY' \
  "$OUT/pytest.initcheck.san.log" | tail -n 1)" | tee -a "$summary"
{ [ "$ours" -eq 0 ] && [ $rc -eq 0 ]; } || status=1

echo "logs in $OUT; status $status"
exit $status
