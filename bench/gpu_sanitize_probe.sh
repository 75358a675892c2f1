#!/usr/bin/env bash
# bench/gpu_sanitize_probe.sh — why compute-sanitizer crashes (SIGSEGV, no report) over the Python tests on the
# H200 machine while it runs test_cuda fine: each line starts the sanitizer on a smaller Python program or with
# one option changed, and prints its exit status and last log line. The first line that passes tells
# gpu_sanitize.sh what to change. Env: OUT (logs), PYTHON (python3), SANITIZER.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/sanitize-probe}
PYTHON=${PYTHON:-python3}
SAN=${SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=python
n=0
try() { # label, sanitizer options ..., -- program ...
  local label=$1; shift
  n=$((n + 1))
  timeout -s KILL "${PROBE_LIMIT:-90}" "$SAN" "$@" > "$OUT/probe$n.log" 2>&1
  echo "$n $label: rc=$? | $(grep -v '^$' "$OUT/probe$n.log" | tail -n 1 | cut -c1-160)" | tee -a "$OUT/summary.txt"
}
: > "$OUT/summary.txt"
"$SAN" --version | tail -n 1 >> "$OUT/summary.txt"
try "python, no CUDA" --tool memcheck "$PYTHON" -c 'print("ok")'
try "import jax, devices" --tool memcheck "$PYTHON" -c 'import jax; print(jax.devices())'
try "jnp op" --tool memcheck "$PYTHON" -c 'import jax.numpy as jnp; print(float((jnp.ones(8) * 2).sum()))'
try "jnp op, allocator platform" --tool memcheck env XLA_PYTHON_CLIENT_ALLOCATOR=platform "$PYTHON" -c \
  'import jax.numpy as jnp; print(float((jnp.ones(8) * 2).sum()))'
try "jnp op, no command buffers" --tool memcheck env XLA_FLAGS=--xla_gpu_enable_command_buffer= "$PYTHON" -c \
  'import jax.numpy as jnp; print(float((jnp.ones(8) * 2).sum()))'
try "jnp op, kns=sa_" --tool memcheck --kernel-name kns=sa_ "$PYTHON" -c \
  'import jax.numpy as jnp; print(float((jnp.ones(8) * 2).sum()))'
try "jnp op, no api check" --tool memcheck --check-api-memory-access no --check-device-heap no "$PYTHON" -c \
  'import jax.numpy as jnp; print(float((jnp.ones(8) * 2).sum()))'
try "sinkattn fwd" --tool memcheck --kernel-name kns=sa_ "$PYTHON" -c '
import jax, jax.numpy as jnp, sinkattn
q = jnp.ones((1, 128, 2, 64), jnp.bfloat16)
print(float(sinkattn.dot_product_attention(q, q, q, softmax_type="off_by_one").astype(jnp.float32).sum()))'
try "sinkattn fwd, initcheck" --tool initcheck "$PYTHON" -c '
import jax, jax.numpy as jnp, sinkattn
q = jnp.ones((1, 128, 2, 64), jnp.bfloat16)
print(float(sinkattn.dot_product_attention(q, q, q, softmax_type="off_by_one").astype(jnp.float32).sum()))'
try "jnp op, --target-processes all" --tool memcheck --target-processes all "$PYTHON" -c \
  'import jax.numpy as jnp; print(float((jnp.ones(8) * 2).sum()))'
try "pytest collect only" --tool memcheck --kernel-name kns=sa_ "$PYTHON" -m pytest -q -p no:cacheprovider --co \
  tests/test_hardening.py
try "pytest one gpu test" --tool memcheck --kernel-name kns=sa_ "$PYTHON" -m pytest -q -p no:cacheprovider -x \
  tests/test_ops.py -k "grad" --maxfail=1
