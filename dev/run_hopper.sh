#!/usr/bin/env bash
# dev/run_hopper.sh — build the Hopper forward and backward variants (dev/hopper_fwd_NN.cu, dev/hopper_bwd_NN.cu)
# for sm_90a, prove that they use wgmma (HGMMA in the SASS), then validate and time them on the GPU. Everything
# lands in $OUT (./out if unset); a forward variant is tagged NN, a backward one bwd_NN:
#   build_TAG.txt  nvcc -Xptxas -v report (registers, spills, stack frame, warnings), then the SASS summary:
#                  HGMMA / TMA / setmaxnreg / local-memory counts, the exp2s that overlap a product, and the
#                  HGMMA and WARPGROUP lines (the full SASS is ~14k lines and stays behind)
#   run_TAG.jsonl  the program's JSON lines: device, one "check" per validation case, one "bench" per shape
#   summary.txt    one line per variant
# Two files per variant plus the summary: the GPU runner returns at most 8 files, so at most 3 variants per run.
# The default (every variant: fwd 01, 02, bwd_01, 02, 03, 04 = 13 files) is over that when $OUT comes back file
# by file: name the variants, e.g. `bash dev/run_hopper.sh bwd_01 bwd_02 bwd_04` (7 files: 01 against the two
# fixes of its lse2 / D staging, per-thread loads and tensor-map copies) or `bwd_02 bwd_03` (5).
# bench/gpu_session.sh tars $OUT, so the file count does not bind there, but its PART=bench step (the default,
# 100 s for all) fits ~3 variants of the budget below.
# Budget: ~5-7 s of compile per variant and ~10-30 s of run (the backward's naive reference takes most of it;
# bwd_01 also checks and times the one-pass 01a); each run is killed after 100 s (a pipeline deadlock would
# otherwise hang the GPU job; the programs give up after 20 s per launch).
# RACECHECK=1: after a backward variant's run (or a forward one with the mode: fwd 05),
# `compute-sanitizer --tool racecheck <bin> racecheck` (two small checks, ~10-40 s) into racecheck_TAG.txt and
# its hazard count into the summary; RACECHECK_GPU picks the GPU (compute-sanitizer crashes under the one-GPU
# machine's gVisor: run it on the two-GPU kind).
# Usage: bash dev/run_hopper.sh [NN | bwd_NN ...]   (default: every dev/hopper_fwd_*.cu, then every hopper_bwd_*.cu)
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
  for f in hopper_bwd_*.cu; do v=${f#hopper_}; variants+=("${v%.cu}"); done
fi
{
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet -- . 2>/dev/null || echo ' (dev/ modified)')"
  "$NVCC" --version | tail -1
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader | head -1
  fi
} > "$OUT/summary.txt"
for v in "${variants[@]}"; do
  case $v in bwd_*) name=hopper_$v ;; *) name=hopper_fwd_$v ;; esac
  src=$name.cu bin=$BIN/$name
  # -gencode with compute_90a/sm_90a: the -arch=sm_90a shorthand has been seen to add a plain sm_90 pass that
  # rejects wgmma and setmaxnreg.
  if ! "$NVCC" -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo -std=c++17 -Xptxas -v \
      -o "$bin" "$src" > "$OUT/build_$v.txt" 2>&1; then
    echo "$name: BUILD FAILED (see build_$v.txt)" | tee -a "$OUT/summary.txt"
    continue
  fi
  spills=$(grep -c "[1-9][0-9]* bytes spill" "$OUT/build_$v.txt")
  "$CUOBJDUMP" --dump-sass "$bin" > "$BIN/sass_$v.full" 2>&1
  sass_head="HGMMA $(grep -c HGMMA "$BIN/sass_$v.full")"
  {
    echo "---- SASS summary"
    echo "HGMMA $(grep -c HGMMA "$BIN/sass_$v.full")"
    echo "HMMA $(grep -c ' HMMA' "$BIN/sass_$v.full")"
    echo "UTMALDG $(grep -c UTMALDG "$BIN/sass_$v.full")"
    echo "USETMAXREG $(grep -c USETMAXREG "$BIN/sass_$v.full")"
    echo "LDL/STL (local memory) $(grep -c -E ' (LDL|STL)' "$BIN/sass_$v.full")"
    # Softmax under the tensor core: MUFU.EX2 between a wait_group 1 and the next wait_group 0, per kernel
    # (66 = 64 exp2 + 2 rescale factors in variant 02; 0 where a variant has no intra-warpgroup overlap).
    awk '/Function :/{f=$3} /DEPBAR.LE gsb0, 0x1/{w=1; n=0} w&&/MUFU.EX2/{n++}
         /DEPBAR.LE gsb0, 0x0/&&w{print "EX2 overlapped " n " in " f; w=0}' "$BIN/sass_$v.full"
    grep -E "Function :|HGMMA|WARPGROUP" "$BIN/sass_$v.full" | sed -e 's@/\* 0x[0-9a-f]* \*/@@' -e 's/  */ /g'
  } >> "$OUT/build_$v.txt"
  timeout -s KILL 100 "$bin" > "$OUT/run_$v.jsonl" 2>&1
  rc=$?
  pass=$(grep -c '"pass": true' "$OUT/run_$v.jsonl")
  fail=$(grep -c '"pass": false' "$OUT/run_$v.jsonl")
  tf=$(grep '"bench"' "$OUT/run_$v.jsonl" | sed -E 's/.*"bench": "([^"]+)", "B": ([0-9]+), "T": ([0-9]+).*"H": ([0-9]+), "causal": ([01]).*"tflops": ([0-9.]+).*/\1 B\2 T\3 H\4 c\5: \6/' | paste -sd ';' -)
  race=""
  # Backward variants all have the racecheck mode; a forward one only if its source handles the argument (05).
  if [ "${RACECHECK:-0}" = 1 ] && { [ "${v#bwd_}" != "$v" ] || grep -q '"racecheck"' "$src"; }; then
    CUDA_VISIBLE_DEVICES=${RACECHECK_GPU:-0} timeout -s KILL ${RACECHECK_LIMIT:-120} \
      compute-sanitizer --tool racecheck --racecheck-report hazard "$bin" racecheck > "$OUT/racecheck_$v.txt" 2>&1
    race=" racecheck rc=$? '$(grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$OUT/racecheck_$v.txt" | tail -n 1)'"
  fi
  echo "$name: rc=$rc checks pass=$pass fail=$fail spills=$spills $sass_head$race | TFLOP/s $tf" \
    | tee -a "$OUT/summary.txt"
done
rm -rf "$BIN"
