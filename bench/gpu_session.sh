#!/usr/bin/env bash
# gpu_session.sh — one H200 session's worth of checks in two device calls (each must end well inside the
# device tool's 10-minute limit; the build in build-gpu/ survives between calls on a warm machine).
#
#   PART=probe bash bench/gpu_session.sh   builds while dev/run_hopper.sh runs (HOPPER_VARIANTS; RACECHECK=1),
#                                           test_cuda, pytest on the GPU (PYTEST=0: not), the pytest part of
#                                           gpu_sanitize.sh (on GPU 1 when there are two)
#   PART=lib bash bench/gpu_session.sh     build, test_cuda, ctest, pytest, the learnable grid, the other types
#   PART=x2 bash bench/gpu_session.sh      (2 GPUs) test_cuda, compute-sanitizer over test_cuda on GPU 1 while GPU 0
#                                           times the target rows (grid h200_targets), ring_reach.py (REACH=0:
#                                           not), pytest (PYTEST=1), gpu_sanitize_probe.sh (SANPROBE=1)
#   PART=quick bash bench/gpu_session.sh   build, test_cuda, the target rows (PYTEST=1: pytest): the shortest check
#   PART=close bash bench/gpu_session.sh   (2 GPUs) the sanitizer (test_cuda, pytest) on GPU 1 while GPU 0 runs
#                                           test_cuda, the target rows, pytest and ncu over one jax f+b
#                                           (GRID=h200: the whole performance.md grid; PROFILE=0: no ncu;
#                                           SAN_ONLY=test_cuda: the sanitizer over test_cuda only)
#   PART=ncu bash bench/gpu_session.sh     (2 GPUs) the sanitizer over test_cuda on GPU 1 (SAN_TOOLS, HOPPER_STRIDE);
#                                           GPU 0: test_cuda, ncu's detailed sections over NCU_SHAPES (ours, cuDNN)
#   PART=ab bash bench/gpu_session.sh      (2 GPUs) the sanitizer over test_cuda on GPU 1; GPU 0: test_cuda, the grid
#                                           (fused, cuDNN and fused under AB_ENV, interleaved ROUNDS times), AB_EXTRA
#                                           A/Bs on GRID2, DEV_VARIANTS, NCU_SHAPES, NCU_SRC (stall samples per SASS
#                                           instruction), pytest (PYTEST=1); bench/ratios.py reads the result
#   PART=bench bash bench/gpu_session.sh   python -m sinkattn.bench on the performance.md grid (learnable;
#                                           vanilla and off_by_one on the H=128 T=4096 rows), the decode
#                                           bandwidth table, the Hopper dev variants (dev/run_hopper.sh),
#                                           ring attention on 2 GPUs when there are two
#
# Everything lands in one tarball $OUT/session-$PART.tgz plus $OUT/summary-$PART.txt (the device tool
# returns at most 8 files). Each step has its own time limit so one hang cannot eat the call.
set -u
cd "$(dirname "$0")/.."
PART=${PART:-close}
OUT=${OUT:-gpu_out}
STAGE=$(mktemp -d)/$PART
mkdir -p "$OUT" "$STAGE"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=python
# The device machine gets a copy of the tree without .git: the caller passes the commit to stamp results.
export SINKATTN_COMMIT=${SINKATTN_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
PY=$(command -v python3)
summary=()
step() { # name, limit seconds, command...
  local name=$1 lim=$2; shift 2
  local t0=$SECONDS
  timeout "$lim" "$@" > "$STAGE/$name.log" 2>&1
  local rc=$?
  summary+=("$name rc=$rc $((SECONDS - t0))s")
  echo "== $name rc=$rc ($((SECONDS - t0))s)"; tail -n 6 "$STAGE/$name.log"
}
# The two builds every PART uses: build-gpu (Release, what the tests and benchmarks load) and build-gpusan
# (RelWithDebInfo with -lineinfo, test_cuda and the FFI library only, for compute-sanitizer's source lines).
build_gpu() {
  cmake -S . -B build-gpu -DPython_EXECUTABLE="$PY" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    && cmake --build build-gpu -j16
}
build_gpusan() {
  cmake -S . -B build-gpusan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSINKATTN_CUDA=ON -DSINKATTN_FFI=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DPython_EXECUTABLE="$PY" && cmake --build build-gpusan -j16 --target test_cuda sinkattn_jax
}
export -f build_gpu build_gpusan
export PY
# profile_args "B T N K H causal [window [fwd]]": bench/profile_fb.py's arguments for one shape, into the array pa
# (a left window w >= 0: local_window_size (w, 0); fwd 1: the forward alone).
profile_args() {
  local B T N K H C W F
  read -r B T N K H C W F <<< "$1"
  pa=(--B "$B" --T "$T" --N "$N" --K "$K" --H "$H")
  [ "$C" = 1 ] && pa+=(--causal)
  [ -n "$W" ] && [ "$W" -ge 0 ] && pa+=(--window "$W")
  [ "$F" = 1 ] && pa+=(--fwd)
}
# ncu_shapes "B T N K H causal [window [fwd]], ...": ncu's detailed sections over one jax f+b of each shape (a left
# window w >= 0: local_window_size (w, 0); fwd 1: the forward alone), ours and cuDNN's kernels.
ncu_shapes() {
  local shapes sh who kre i=0
  IFS=, read -ra shapes <<< "$1"
  for sh in "${shapes[@]}"; do
    profile_args "$sh"
    for who in fused cudnn; do
      kre='regex:sa_hop|sa_bwd|bwd_onepass|dq_convert|dkdv_sum'; [ $who = cudnn ] && kre='regex:sdpa|flash|fmha|cudnn'
      step ncu$i-$who ${NCU_LIMIT:-100} ncu --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats \
        --section Occupancy --section InstructionStats -k "$kre" --launch-count ${NCU_COUNT:-6} \
        --log-file "$STAGE/ncu$i-$who.txt" "$PY" bench/profile_fb.py "${pa[@]}" --contender $who
    done
    i=$((i + 1))
  done
}
# ncu_src "B T N K H causal [window [fwd]], ...": ncu's warp-stall sampling per SASS instruction over our kernels in
# one jax call of each shape (SourceCounters + WarpStateStats into a report, then its source page as CSV: every
# instruction with its stall samples by reason), to find where the warps wait.
ncu_src() {
  local shapes sh i=0
  IFS=, read -ra shapes <<< "$1"
  for sh in "${shapes[@]}"; do
    profile_args "$sh"
    step ncusrc$i ${NCU_LIMIT:-100} ncu --section SourceCounters --section WarpStateStats \
      -k 'regex:sa_hop|bwd_onepass' --launch-count ${NCU_COUNT:-2} -f -o "$STAGE/ncusrc$i" \
      "$PY" bench/profile_fb.py "${pa[@]}" --contender fused
    step ncusrc$i-csv 60 bash -c "ncu --import '$STAGE/ncusrc$i.ncu-rep' --page source --csv --print-source sass \
      > '$STAGE/ncusrc$i-sass.csv' && ncu --import '$STAGE/ncusrc$i.ncu-rep' --page details \
      > '$STAGE/ncusrc$i-details.txt'"
    rm -f "$STAGE/ncusrc$i.ncu-rep"
    i=$((i + 1))
  done
}

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; echo "commit $SINKATTN_COMMIT";
  "$PY" -c 'import jax, jaxlib; print("jax", jax.__version__, "jaxlib", jaxlib.__version__)'; } \
  > "$STAGE/machine.txt" 2>&1

if [ "$PART" = probe ]; then
  # One call: both builds in the background (build-gpu Release, build-gpusan RelWithDebInfo for the sanitizer)
  # while dev/run_hopper.sh validates and times the Hopper backward variants (RACECHECK=1: and racechecks them,
  # on GPU 1 when there are two); then test_cuda, the pytest part of the sanitizer run (on GPU 1 when there are
  # two, beside the rest) and the whole pytest suite on the GPU (PYTEST=0: not).
  ngpu=$(nvidia-smi -L | wc -l)
  ( build_gpu ) > "$STAGE/build.log" 2>&1 &
  bpid=$!
  ( build_gpusan ) > "$STAGE/build-san.log" 2>&1 &
  spid=$!
  step hopper ${HOPPER_LIMIT:-240} env OUT="$STAGE/hopper" RACECHECK_GPU=$((ngpu - 1)) CUDA_VISIBLE_DEVICES=0 \
    bash dev/run_hopper.sh ${HOPPER_VARIANTS:-bwd_01 bwd_02 bwd_03 bwd_04}
  t0=$SECONDS; wait $bpid; summary+=("build rc=$? waited $((SECONDS - t0))s"); wait $spid
  summary+=("build-san rc=$?"); tail -n 3 "$STAGE/build.log"
  ( CUDA_VISIBLE_DEVICES=$((ngpu - 1)) OUT="$STAGE/sanitize" SAN_ONLY=pytest timeout ${SAN_LIMIT:-150} \
      bash bench/gpu_sanitize.sh > "$STAGE/sanitize.log" 2>&1; echo "rc=$?" >> "$STAGE/sanitize.log" ) &
  san=$!
  [ "$ngpu" -ge 2 ] || wait $san
  step test_cuda 170 env CUDA_VISIBLE_DEVICES=0 build-gpu/test_cuda
  [ "${PYTEST:-1}" = 1 ] && step pytest 200 env CUDA_VISIBLE_DEVICES=0 "$PY" -m pytest tests -q -p no:cacheprovider \
    -rs --timeout=150 -n 8
  t0=$SECONDS; wait $san; summary+=("sanitize pytest part waited $((SECONDS - t0))s: $(tail -n 1 "$STAGE/sanitize.log")")
  cat "$STAGE/sanitize/summary.txt" 2>/dev/null
  [ "${SANPROBE:-0}" = 1 ] && step sanprobe 150 env CUDA_VISIBLE_DEVICES=$((ngpu - 1)) OUT="$STAGE/sanprobe" \
    PROBE_LIMIT=${PROBE_LIMIT:-40} bash bench/gpu_sanitize_probe.sh
elif [ "$PART" = lib ]; then
  # One call: build, the CUDA C tests (Hopper forward and backward checked against fp64 there; if they fail the
  # rest runs with SINKATTN_CUDA_HOPPER=0), pytest on the GPU, the learnable grid and the other softmax types.
  step build 150 bash -c build_gpu
  step test_cuda 170 build-gpu/test_cuda
  grep -q " 0 failed" "$STAGE/test_cuda.log" || export SINKATTN_CUDA_HOPPER=0
  step ctest 40 ctest --test-dir build-gpu --output-on-failure -j8 -E test_cuda
  step pytest 170 "$PY" -m pytest tests -q -p no:cacheprovider -rs --timeout=150 -n 8
  step bench_learnable 200 "$PY" -m sinkattn.bench --grid h200 --softmax learnable --max-ref-t 4096 \
    --repeats 2 --contenders fused,jnp_sinks,cudnn_no_sink --out "$STAGE/h200-jax-learnable.json"
  step bench_types 80 "$PY" -m sinkattn.bench --grid h200_types --softmax vanilla,off_by_one --max-ref-t 4096 \
    --repeats 2 --contenders fused,cudnn_no_sink --out "$STAGE/h200-jax-types.json"
elif [ "$PART" = x2 ]; then
  # Two GPUs, one call: both builds at once; test_cuda; compute-sanitizer over test_cuda on GPU 1 while GPU 0
  # times the rows the issue targets name; then ring_reach.py on both GPUs (issue #7: the longest sequence).
  ( build_gpu ) > "$STAGE/build.log" 2>&1 &
  ( build_gpusan ) > "$STAGE/build-san.log" 2>&1 &
  wait
  step test_cuda 170 build-gpu/test_cuda
  ( CUDA_VISIBLE_DEVICES=1 OUT="$STAGE/sanitize" SA_TEST_CUDA_STRIDE=${STRIDE:-16} SAN_ONLY=test_cuda \
      timeout ${SAN_LIMIT:-150} bash bench/gpu_sanitize.sh > "$STAGE/sanitize.log" 2>&1; echo "rc=$?" >> "$STAGE/sanitize.log" ) &
  san=$!
  step bench 140 env CUDA_VISIBLE_DEVICES=0 "$PY" -m sinkattn.bench --grid h200_targets --softmax learnable \
    --max-ref-t 16384 --repeats 2 --contenders fused,cudnn_no_sink --out "$STAGE/h200-jax-targets.json"
  t0=$SECONDS; wait $san; summary+=("sanitize (GPU 1, in parallel) waited $((SECONDS - t0))s: $(tail -n 1 "$STAGE/sanitize.log")")
  cat "$STAGE/sanitize/summary.txt" 2>/dev/null
  [ "${REACH:-1}" = 1 ] && step reach ${REACH_LIMIT:-150} "$PY" bench/ring_reach.py --time-budget ${REACH_BUDGET:-50} \
    --out "$STAGE/h200x2-reach.json"
  [ "${SANPROBE:-0}" = 1 ] && step sanprobe 150 env OUT="$STAGE/sanprobe" PROBE_LIMIT=${PROBE_LIMIT:-40} \
    bash bench/gpu_sanitize_probe.sh
  [ "${PYTEST:-0}" = 1 ] && step pytest 150 "$PY" -m pytest tests -q -p no:cacheprovider -rs --timeout=140 -n 8
elif [ "$PART" = close ]; then
  # Two GPUs, one call, everything a closing note needs: both builds; GPU 1: compute-sanitizer over test_cuda (4
  # tools) then over the pytest subset; GPU 0 meanwhile: test_cuda, the target rows, the whole pytest suite, and
  # ncu's kernel-by-kernel timing of one jax forward+backward (bench/profile_fb.py).
  ( build_gpu ) > "$STAGE/build.log" 2>&1 &
  ( build_gpusan ) > "$STAGE/build-san.log" 2>&1 &
  wait
  ( CUDA_VISIBLE_DEVICES=1 OUT="$STAGE/sanitize" SA_TEST_CUDA_STRIDE=${STRIDE:-16} SAN_ONLY=${SAN_ONLY:-} \
      SA_TEST_CUDA_HOPPER_STRIDE=${HOPPER_STRIDE:-5} \
      timeout ${SAN_LIMIT:-400} bash bench/gpu_sanitize.sh > "$STAGE/sanitize.log" 2>&1; echo "rc=$?" >> "$STAGE/sanitize.log" ) &
  san=$!
  export CUDA_VISIBLE_DEVICES=0
  step test_cuda 170 build-gpu/test_cuda
  step bench ${BENCH_LIMIT:-150} "$PY" -m sinkattn.bench --grid ${GRID:-h200_targets} --softmax learnable \
    --max-ref-t 16384 --repeats 2 --contenders fused,cudnn_no_sink --out "$STAGE/h200-jax-${GRID:-h200_targets}.json"
  step pytest 150 "$PY" -m pytest tests -q -p no:cacheprovider -rs --timeout=140 -n 8
  [ "${PROFILE:-1}" = 1 ] && step profile 90 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    --log-file "$STAGE/profile_fb.csv" "$PY" bench/profile_fb.py
  t0=$SECONDS; wait $san; summary+=("sanitize (GPU 1, in parallel) waited $((SECONDS - t0))s: $(tail -n 1 "$STAGE/sanitize.log")")
  cat "$STAGE/sanitize/summary.txt" 2>/dev/null
elif [ "$PART" = ncu ]; then
  # Two GPUs: where a kernel's time goes. GPU 1: compute-sanitizer over test_cuda (SAN_TOOLS, HOPPER_STRIDE);
  # GPU 0: test_cuda, then ncu's detailed sections (pipes, shared memory, stalls) over one jax f+b of each shape
  # in NCU_SHAPES ("B T N K H causal" separated by commas), ours and cuDNN's kernels.
  ( build_gpu ) > "$STAGE/build.log" 2>&1 &
  ( build_gpusan ) > "$STAGE/build-san.log" 2>&1 &
  wait
  ( CUDA_VISIBLE_DEVICES=1 OUT="$STAGE/sanitize" SA_TEST_CUDA_STRIDE=${STRIDE:-16} SAN_ONLY=test_cuda \
      SA_TEST_CUDA_HOPPER_STRIDE=${HOPPER_STRIDE:-5} SAN_NOBUILD=1 \
      timeout ${SAN_LIMIT:-400} bash bench/gpu_sanitize.sh > "$STAGE/sanitize.log" 2>&1; echo "rc=$?" >> "$STAGE/sanitize.log" ) &
  san=$!
  export CUDA_VISIBLE_DEVICES=0
  step test_cuda 170 build-gpu/test_cuda
  ncu_shapes "${NCU_SHAPES:-4 4096 32 32 64 1}"
  t0=$SECONDS; wait $san; summary+=("sanitize (GPU 1, in parallel) waited $((SECONDS - t0))s: $(tail -n 1 "$STAGE/sanitize.log")")
  cat "$STAGE/sanitize/summary.txt" 2>/dev/null
elif [ "$PART" = ab ]; then
  # Two GPUs: a kernel change checked and measured against its previous form in one call. GPU 1: compute-sanitizer
  # over test_cuda (SAN_TOOLS, HOPPER_STRIDE); GPU 0: test_cuda, then the grid GRID (default h200): fused, cuDNN and
  # fused under AB_ENV (e.g. SINKATTN_HOP_BWD_NC=2: the previous form) interleaved, ROUNDS rounds a row.
  # SAN_PASSES=bwd,fwd: the sanitizer's test_cuda runs only those passes (tests/test_cuda.c, SA_TEST_CUDA_PASSES).
  # SAN_AFTER=1: the sanitizer starts after the benches (its fp64 references load the host's cores: a bench beside
  # it reads its short rows low, H200 session 5 section 6), beside pytest.
  ( build_gpu ) > "$STAGE/build.log" 2>&1 &
  ( build_gpusan ) > "$STAGE/build-san.log" 2>&1 &
  wait
  start_san() {
    ( CUDA_VISIBLE_DEVICES=1 OUT="$STAGE/sanitize" SA_TEST_CUDA_STRIDE=${STRIDE:-16} SAN_ONLY=test_cuda \
        SA_TEST_CUDA_HOPPER_STRIDE=${HOPPER_STRIDE:-2} SAN_NOBUILD=1 SA_TEST_CUDA_PASSES=${SAN_PASSES:-} \
        timeout ${SAN_LIMIT:-400} bash bench/gpu_sanitize.sh > "$STAGE/sanitize.log" 2>&1; echo "rc=$?" >> "$STAGE/sanitize.log" ) &
    san=$!
  }
  [ "${SAN_AFTER:-0}" = 1 ] || start_san
  export CUDA_VISIBLE_DEVICES=0
  step test_cuda 170 build-gpu/test_cuda
  # One run: fused, cuDNN and (AB_ENV set) fused_ab, the fused kernel under AB_ENV, timed in turn ROUNDS times a row.
  ab=(); [ -n "${AB_ENV:-}" ] && ab=(--ab-env "$AB_ENV")
  step bench ${BENCH_LIMIT:-200} "$PY" -m sinkattn.bench --grid ${GRID:-h200} --softmax learnable \
    --max-ref-t 16384 --repeats 2 --rounds ${ROUNDS:-3} --contenders fused,cudnn_no_sink "${ab[@]}" \
    --out "$STAGE/h200-jax-${GRID:-h200}-ab.json"
  # AB_EXTRA="A=1 B=2;A=3": more A/Bs on grid GRID2 (default gptoss: the gpt-oss layers), one run per ';'-separated
  # environment: fused against fused under it, interleaved as above.
  if [ -n "${AB_EXTRA:-}" ]; then
    IFS=';' read -ra extras <<< "$AB_EXTRA"
    i=0
    for ex in "${extras[@]}"; do
      step bench_x$i ${BENCH_LIMIT:-150} "$PY" -m sinkattn.bench --grid ${GRID2:-gptoss} --softmax learnable \
        --max-ref-t 16384 --repeats 2 --rounds ${ROUNDS:-3} --contenders fused --ab-env "$ex" \
        --out "$STAGE/h200-jax-${GRID2:-gptoss}-x$i.json"
      i=$((i + 1))
    done
  fi
  [ -n "${DEV_VARIANTS:-}" ] && step dev ${DEV_LIMIT:-150} env OUT="$STAGE/dev" bash dev/run_hopper.sh $DEV_VARIANTS
  [ -n "${NCU_SHAPES:-}" ] && ncu_shapes "$NCU_SHAPES"
  [ -n "${NCU_SRC:-}" ] && ncu_src "$NCU_SRC"
  [ "${SAN_AFTER:-0}" = 1 ] && start_san
  [ "${PYTEST:-0}" = 1 ] && step pytest 150 "$PY" -m pytest tests -q -p no:cacheprovider -rs --timeout=140 -n 8
  t0=$SECONDS; wait $san; summary+=("sanitize (GPU 1, in parallel) waited $((SECONDS - t0))s: $(tail -n 1 "$STAGE/sanitize.log")")
  cat "$STAGE/sanitize/summary.txt" 2>/dev/null
elif [ "$PART" = quick ]; then
  # The shortest check of a kernel change: build, test_cuda, the target rows (fused and cuDNN); PYTEST=1: pytest too.
  # test_cuda takes ~85-130 s since session 8 (four forward launch passes, three backward ones, segment ids).
  step build 150 bash -c build_gpu
  step test_cuda 170 build-gpu/test_cuda
  step bench 100 "$PY" -m sinkattn.bench --grid h200_targets --softmax learnable --max-ref-t 16384 --repeats 2 \
    --contenders fused,cudnn_no_sink --out "$STAGE/h200-jax-targets.json"
  [ "${PYTEST:-0}" = 1 ] && step pytest 150 "$PY" -m pytest tests -q -p no:cacheprovider -rs --timeout=140 -n 8
else
  step bench_learnable 230 "$PY" -m sinkattn.bench --grid h200 --softmax learnable --max-ref-t 4096 \
    --out "$STAGE/h200-jax-learnable.json"
  step bench_types 90 "$PY" -m sinkattn.bench --grid h200_types --softmax vanilla,off_by_one \
    --out "$STAGE/h200-jax-types.json"
  step decode 150 "$PY" bench/decode_bench.py --no-build
  cp bench/results/decode_*.json "$STAGE/" 2>/dev/null
  step hopper 100 env OUT="$STAGE/hopper" bash dev/run_hopper.sh
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    step ring 100 "$PY" bench/ring_bench.py --devices 2 --max-len 32768 --iters 3 --out "$STAGE/h200x2-ring.json"
  fi
fi
printf '%s\n' "${summary[@]}" | tee "$OUT/summary-$PART.txt"
tar -C "$(dirname "$STAGE")" -czf "$OUT/session-$PART.tgz" "$PART"
