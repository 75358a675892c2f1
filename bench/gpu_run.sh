#!/usr/bin/env bash
# gpu_run.sh — everything the CUDA backend needs checked on the GPU test machine, in one call:
# build (cmake), C tests (ctest, test_cuda in full), pytest -m gpu, compute-sanitizer memcheck and
# racecheck on a subset of test_cuda, then the benchmark. Logs and results go to $OUT (default ./gpu_out).
# Each step has its own time limit so one hang cannot eat the call; the summary is printed last.
# CUDA_ARCHS (default 90a: the H200 only, half the compile time of CI's 80;90a) and QUICK=1 (sanitizers,
# pytest and ctest skipped) keep a device call short.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
PY=$(command -v python3)
summary=()
step() { # name, limit seconds, command...
  local name=$1 lim=$2; shift 2
  local t0=$SECONDS
  timeout "$lim" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$name rc=$rc $((SECONDS - t0))s")
  echo "== $name rc=$rc ($((SECONDS - t0))s)"; tail -n 8 "$OUT/$name.log"
  return $rc
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
step build 240 bash -c "cmake -S . -B build-gpu -DPython_EXECUTABLE=$PY -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS:-90a} && cmake --build build-gpu -j16" || true
# Ordered by what a 10-minute device call must not lose: correctness, speed, sanitizers, then the
# Python suite and the CPU-side C tests (those also run in CI without a GPU).
step test_cuda 90 build-gpu/test_cuda || true
step bench ${BENCH_LIMIT:-200} "$PY" bench/cuda_bench.py build-gpu/libsinkattn.so "$OUT/h200-cuda.json" || true
[ "${QUICK:-0}" = 1 ] && { echo "== summary"; printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"; exit 0; }
step memcheck 60 env SA_TEST_CUDA_STRIDE=6 compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/test_cuda || true
step racecheck 60 env SA_TEST_CUDA_STRIDE=9 compute-sanitizer --tool racecheck --error-exitcode 9 build-gpu/test_cuda || true
step pytest_gpu ${PYTEST_LIMIT:-120} env PYTHONPATH=python "$PY" -m pytest tests -m gpu -q --timeout=100 || true
step ctest ${CTEST_LIMIT:-60} ctest --test-dir build-gpu --output-on-failure -j8 -E test_cuda || true
echo "== summary"; printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
