#!/usr/bin/env bash
# dev/run_hopper.sh — build the Hopper forward variants (dev/hopper_fwd_NN.cu) for sm_90a, prove that they use
# wgmma (HGMMA in the SASS), then validate and time them on the GPU. Everything lands in $OUT (./out if unset):
#   build_NN.log   nvcc -Xptxas -v report (registers, spills, stack frame) and any warning
#   sass_NN.txt    HGMMA / TMA / setmaxnreg counts and the SASS lines of HGMMA (the full SASS is ~14k lines)
#   run_NN.jsonl   the program's JSON lines: device, one "check" per validation case, one "bench" per shape
#   summary.txt    one line per variant
# Budget: ~5 s of compile per variant and ~10 s of run; each run is killed after 100 s (a pipeline deadlock
# would otherwise hang the GPU job; the program itself gives up after 20 s per launch).
# Usage: bash dev/run_hopper.sh [NN ...]   (default: every dev/hopper_fwd_*.cu)
set -u
cd "$(dirname "$0")"
OUT=${OUT:-./out}
mkdir -p "$OUT"
BIN=$(mktemp -d)  # binaries stay out of $OUT: only logs come back
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CUOBJDUMP=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
variants=("$@")
if [ ${#variants[@]} -eq 0 ]; then
  for f in hopper_fwd_*.cu; do v=${f#hopper_fwd_}; variants+=("${v%.cu}"); done
fi
: > "$OUT/summary.txt"
for v in "${variants[@]}"; do
  src=hopper_fwd_$v.cu bin=$BIN/hopper_fwd_$v
  # -gencode with compute_90a/sm_90a: the -arch=sm_90a shorthand has been seen to add a plain sm_90 pass that
  # rejects wgmma and setmaxnreg.
  if ! "$NVCC" -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo -std=c++17 -Xptxas -v \
      -o "$bin" "$src" > "$OUT/build_$v.log" 2>&1; then
    echo "hopper_fwd_$v: BUILD FAILED (see build_$v.log)" | tee -a "$OUT/summary.txt"
    continue
  fi
  spills=$(grep -c "[1-9][0-9]* bytes spill" "$OUT/build_$v.log")
  "$CUOBJDUMP" --dump-sass "$bin" > "$BIN/sass_$v.full" 2>&1
  {
    echo "HGMMA $(grep -c HGMMA "$BIN/sass_$v.full")"
    echo "HMMA $(grep -c ' HMMA' "$BIN/sass_$v.full")"
    echo "UTMALDG $(grep -c UTMALDG "$BIN/sass_$v.full")"
    echo "USETMAXREG $(grep -c USETMAXREG "$BIN/sass_$v.full")"
    echo "LDL/STL (local memory) $(grep -c -E ' (LDL|STL)' "$BIN/sass_$v.full")"
    grep -E "Function :|HGMMA|WARPGROUP" "$BIN/sass_$v.full" | sed -e 's@/\* 0x[0-9a-f]* \*/@@' -e 's/  */ /g'
  } > "$OUT/sass_$v.txt"
  timeout -s KILL 100 "$bin" > "$OUT/run_$v.jsonl" 2>&1
  rc=$?
  pass=$(grep -c '"pass": true' "$OUT/run_$v.jsonl")
  fail=$(grep -c '"pass": false' "$OUT/run_$v.jsonl")
  tf=$(grep '"bench"' "$OUT/run_$v.jsonl" | sed -E 's/.*"B": ([0-9]+), "T": ([0-9]+).*"H": ([0-9]+), "causal": ([01]).*"tflops": ([0-9.]+).*/B\1 T\2 H\3 c\4: \5/' | paste -sd ';' -)
  echo "hopper_fwd_$v: rc=$rc checks pass=$pass fail=$fail spills=$spills $(head -1 "$OUT/sass_$v.txt") | TFLOP/s $tf" \
    | tee -a "$OUT/summary.txt"
done
rm -rf "$BIN"
