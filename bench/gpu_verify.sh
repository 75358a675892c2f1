#!/usr/bin/env bash
# bench/gpu_verify.sh — the GPU verification run and the benchmark, on the one-GPU H200 machine, in two calls of
# at most 10 minutes each (run from the repository root; the device's copy of the tree has no .git, so the caller
# sets SINKATTN_COMMIT to the commit it is):
#
#   PART=1  correctness. Two builds side by side (build-gpu: Release, what the tests and benchmarks load;
#           build-gpusan: RelWithDebInfo with -lineinfo for compute-sanitizer), then CONCURRENTLY (each its own
#           process, the GPU time-sliced between them; none of these is timed): test_cuda over every plan (full, a
#           process per table), ctest's other C tests, pytest -m gpu, bench/prod_check.py (every grid row, default and
#           persistent / one-pass plans against the fp64 reference), and compute-sanitizer over test_cuda: memcheck,
#           synccheck and initcheck on strided subsets of its general and hopper tables, racecheck split into one
#           process per Hopper plan family (the slow tool), memcheck over tests/test_gpu_kernels.py (kns=sa_).
#   PART=2  behaviour and speed, each step ALONE and in turn: tests/amx_check.c (the AMX tile kernels on the host
#           CPU, where it has AMX) and bench/cpu_bench.py on 2 host cores, bench/gpu_progress.cu (the persistent and one-pass
#           plans under a hog kernel holding k SMs, in green contexts, and the cooperative-launch experiment), ring
#           attention on two GPUs (only where two are present), bench/kernel_bench.py (ours against cuDNN's SDPA
#           with a sink, kernel level, plus JAX end to end and decode; needs the cudnn-frontend wheel in .whl/) and
#           bench/segments_bench.py (every segment-id plan against the dense layer).
#   PART=3  the segment-id and decode work, in one short call: test_cuda's segment-id cases (every legal plan),
#           bench/segments_bench.py, the decode rows of bench/kernel_bench.py, and ncu (where the warps wait) over
#           the default decode kernel at B1 S32k and B8 S4k and our forward on the two rows below cuDNN-with-sink.
#   PART=decode  the decode kernels, in one short call: tests/test_decode.c (every legal CUDA decode plan of each
#           case against the fp64 reference), compute-sanitizer memcheck and racecheck over it (the decode kernels
#           instrumented), the decode rows of bench/kernel_bench.py (every plan, against the copy bandwidth of the same
#           run), and ncu over the mma kernel at B1 S32k and B8 S4k.
#   PART=cpu  the host CPU alone: tests/amx_check.c --bench (the AMX tile kernels, attention and decode, where the
#           host has AMX) and bench/cpu_bench.py on 2 host cores (the default, tile and vector plans and PyTorch); with
#           AB_BASE=DIR (a source tree of another commit, e.g. `git archive C | tar -x -C DIR`, carried untracked)
#           also bench/cpu_ab.py: DIR's library against this one's, A/B/A, under the plans AB_PLANS (amx).
#   PART=features  the feature kernels (bias, mask array, positions, soft-cap), in one call: the verified plans
#           (hopper.fwd.features, hopper.bwd.twopass.features: the default), the TMA plans (hopper.fwd.features.tma,
#           hopper.bwd.twopass.features.tma) and the portable ones (cuda.fwd.portable.features,
#           cuda.bwd.portable.features; sm_80+), both override-only until this part passes. A Release build and a sanitizer
#           build side by side; then concurrently, each plan set in its own processes (a fault in one cannot stop the
#           other's runs): test_cuda's features and features-prod tables (every case on each plan of the set, forced,
#           against the fp64 reference: out, lse, dq, dk, dv, dsinks, dbias, three bitwise-equal backward runs) and
#           compute-sanitizer memcheck over the features table; racecheck over it per plan; test_cuda_feat and the plan
#           record; the JAX op's feature calls on the default routing (tests/test_gpu_kernels.py -k feature_calls:
#           the feature plans ran, no fallback, out / lse / every gradient against fp64). Then ALONE
#           bench/feature_bench.py, both plan sets in the same rounds (a mask causal in content
#           against is_causal, a bias [1,N,T,S] / [B,N,T,S] against none, at B4 T4096 N32 H64 / H128 and gpt-oss's
#           shape: CUDA events, A/A, rotated inputs; the verified set again alone if the joint run faulted). Last, a
#           verdict line per plan (verified when its runs passed, its process did not fault and its sanitizers are
#           clean) and the ratios against the targets (10% for the mask, 25% for the bias), a verdict per plan set.
#   PART=perf33  the timing decisions, in one call (about 7 of its 10 minutes): a Release and a sanitizer build side
#           by side; then concurrently the override-only variants against the fp64 reference (test_cuda's hopper and
#           prod tables' one-pass cases under the one pass that always waits, hopper.bwd.onepass.wait / .narrow.wait;
#           test_decode, every decode plan, cuda.decode.mma.half / .x2 / .x4 included) and compute-sanitizer
#           synccheck and racecheck over the waiting one passes; then ALONE, in order of value: the waiting one pass against the
#           default on the grid rows whose default is the one pass (bench/plan_bench.py), the decode split counts at
#           B8 S4k and its neighbours (bench/kernel_bench.py --decode-plans), the gpt-oss forward at 2k-32k against
#           cuDNN 9.27's published figures (kernel_bench.py --grid h200_gptoss, cuDNN beside it where the wheel is
#           in .whl/), every Hopper plan on the rows below cuDNN (information). Last, bench/plan_decide.py's decision
#           table: what flips which default, and the line of src/cuda/plan.c that does it.
#   PART=f32  the float32 instantiations of the portable kernels (plans cuda.fwd.portable.f32 / cuda.bwd.portable.f32,
#           override-only until this part passes), in one short call: test_cuda's float32 cases (every legal plan
#           against the fp64 reference: out, lse, dq, dk, dv, dsinks, three bitwise-equal backward runs; the error
#           of each printed), compute-sanitizer memcheck, racecheck and initcheck over them.
#   PART="1 decode cpu"  several parts in one call, in that order, one summary (a list of the names above).
#   PART=all  1 and 2, in one call (longer than one call's 10 minutes on the H200).
#
# Every step has its own time limit (and the whole part a budget, BUDGET seconds, that later steps are cut to):
# a hang is reported under the step's name (rc 124, or 137 when it ignored the TERM) and the rest still runs.
# Everything lands under $OUT: summary.txt (printed last: step, rc, seconds, the key figures), the result JSON
# files, and gpu_verify-PART.tgz with every log. Exit status: 0 when every step passed.
# Knobs (env): SAN_STRIDE / SAN_HOPPER_STRIDE (every k-th case of test_cuda's general / hopper table under the
# sanitizers; default 8 / 3), RACE_FAMILIES (racecheck over the hopper table, one process per plan-name
# substring: "hopper.fwd hopper.bwd.onepass hopper.bwd.twopass"), RACE_HOPPER_STRIDE (3), PYTEST_WORKERS (4),
# GREEN_SMS ("64 32 16 8"), PROGRESS_SHAPES, BENCH_ARGS, SEGMENTS_ARGS, CPU_BENCH (1: the cpu part runs cpu_bench.py),
# SAN_FEAT_STRIDE / RACE_FEAT_STRIDE (the features table under memcheck / racecheck: 2 / 3), BUDGET (560).
# The feature kernels' call: PART=features SINKATTN_COMMIT=<commit> bench/gpu_verify.sh (about 4 of its 10 minutes:
# builds ~80 s, tests and sanitizers ~90 s concurrently, feature_bench ~60 s).
# The timing decisions' call: PART=perf33 SINKATTN_COMMIT=<commit> bench/gpu_verify.sh (about 7 of its 10 minutes).
set -u
cd "$(dirname "$0")/.." || exit 2
PART=${PART:-1}
OUT=${OUT:-gpu_out}
BUDGET=${BUDGET:-560}
TAG=${PART// /_}
STAGE=$(mktemp -d)/gpu_verify-$TAG
mkdir -p "$OUT" "$STAGE"
PY=$(command -v python3)
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
export SINKATTN_COMMIT=${SINKATTN_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
STEPS=()

# has NAME: the part NAME is asked for (PART lists names; all = 1 and 2).
has() {
  case " $PART " in *" $1 "*) return 0 ;; esac
  [ "$PART" = all ] && { [ "$1" = 1 ] || [ "$1" = 2 ]; }
}

# step_limit LIMIT: LIMIT, cut to what is left of the part's budget (at least 10 s).
step_limit() {
  local left=$((BUDGET - SECONDS - 10))
  [ "$left" -lt "$1" ] && { [ "$left" -gt 10 ] && echo "$left" || echo 10; } || echo "$1"
}
# run_step NAME LIMIT CMD...: runs CMD with its log in $STAGE/NAME.log, its status in NAME.rc and its seconds in
# NAME.secs. bg_step does the same in the background (wait_steps waits for them all).
run_step() { STEPS+=("$1"); _run "$@"; }
BG=()
bg_step() { STEPS+=("$1"); _run "$@" & BG+=($!); }
wait_steps() { wait "${BG[@]}"; BG=(); }
_run() {
  local name=$1 lim t0
  lim=$(step_limit "$2")
  shift 2
  t0=$SECONDS
  timeout -k 10 "$lim" "$@" > "$STAGE/$name.log" 2>&1
  echo $? > "$STAGE/$name.rc"
  echo $((SECONDS - t0)) > "$STAGE/$name.secs"
  echo "== $name rc=$(cat "$STAGE/$name.rc") $((SECONDS - t0))s (limit ${lim}s)"
}

# key NAME: the figure a step's log ends with, for the summary.
key() {
  local log=$STAGE/$1.log
  case $1 in
    test_cuda*|prod_check) grep -h -E "(test_cuda|prod_check): [0-9]+ passed" "$log" | tail -n 1 ;;
    feature_bench*) grep -h -E "^feature_bench: (every|checks|SOME)" "$log" | tail -n 1 ;;
    wait_bench|plans_*) grep -h -E "^plan_bench: " "$log" | tail -n 1 ;;
    san_*) grep -h -E "(ERROR|RACECHECK) SUMMARY" "$STAGE/$1.san.log" 2>/dev/null | tail -n 1
           grep -h -E "test_cuda: [0-9]+ passed|[0-9]+ passed" "$log" | tail -n 1 | cut -c1-100 ;;
    test_decode) grep -h -E "[0-9]+ passed, [0-9]+ failed" "$log" | tail -n 1 ;;
    pytest*|ctest) grep -h -E "[0-9]+ (passed|failed)|tests passed|tests failed" "$log" | tail -n 1 | cut -c1-160 ;;
    progress) cat "$STAGE/progress.digest" 2>/dev/null ;;
    amx_check*) grep -h -E "^(SKIP|bench: fwd|bench: decode B|[0-9]+ passed)" "$log" | cut -c1-110 | tr '\n' ' ' ;;
    cpu_bench) grep -h -E "^peaks on|^bf16 " "$log" | cut -c1-120 | tr '\n' ' ' ;;
    cpu_ab) grep -h -E " / base: " "$log" | sed 's/ *base .* head / head /' | cut -c1-100 | tr '\n' ' ' ;;
    *) grep -h -E "^(kernel_bench|segments_bench|ring|build|wheels):" "$log" | tail -n 1 ;;
  esac
}

# san_step NAME TOOL TEST_CUDA_ARGS...: compute-sanitizer TOOL over test_cuda with those arguments (--table=,
# --plan=, --stride=: test_cuda runs every legal plan of each case it takes).
san_step() {
  local name=$1 tool=$2 extra=()
  shift 2
  [ "$tool" = memcheck ] && extra=(--leak-check full)
  bg_step "$name" 420 "$SAN" --tool "$tool" "${extra[@]}" --error-exitcode 99 --print-limit 50 \
    --log-file "$STAGE/$name.san.log" build-gpusan/test_cuda "$@"
}

# build DIR TYPE JOBS [--target T...]: configure and build for the H200 (sm_90a only: half of CI's compile time).
build() {
  local dir=$1 type=$2 jobs=$3
  shift 3
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE="$type" -DCMAKE_CUDA_ARCHITECTURES=90a -DPython_EXECUTABLE="$PY" \
    -DSINKATTN_CUDA=ON && cmake --build "$dir" -j "$jobs" "$@" && echo "build: $dir $type ok"
}
export -f build
export PY

{ nvidia-smi; nvcc --version | tail -n 2; "$PY" --version; "$SAN" --version | tail -n 1
  "$PY" -c 'import jax, jaxlib, torch; print("jax", jax.__version__, "jaxlib", jaxlib.__version__, "torch",
torch.__version__, "cuDNN", torch.backends.cudnn.version())'
  echo "commit $SINKATTN_COMMIT part $PART gpus $NGPU cores $(nproc)"
  lscpu; } > "$STAGE/machine.txt" 2>&1

if has 1; then
  bg_step build_release 240 bash -c 'build "$@"' build build-gpu Release 8
  bg_step build_sanitizer 240 bash -c 'build "$@"' build build-gpusan RelWithDebInfo 8 --target test_cuda sinkattn_jax
  wait_steps
  export SINKATTN_LIBRARY=$PWD/build-gpu/libsinkattn_jax.so SINKATTN_C_LIBRARY=$PWD/build-gpu/libsinkattn.so
  for t in general hopper prod; do  # test_cuda in full, one process a table (their fp64 references on 3 cores)
    bg_step "test_cuda_$t" 360 build-gpu/test_cuda --table="$t"
  done
  bg_step ctest 150 ctest --test-dir build-gpu --output-on-failure -E '^test_cuda$'
  bg_step pytest_gpu 330 "$PY" -m pytest tests -m gpu -q -p no:cacheprovider -rs --timeout=240 \
    -n "${PYTEST_WORKERS:-4}"
  bg_step prod_check 330 "$PY" bench/prod_check.py --plans persistent --out "$STAGE/prod_check.json"
  # The sanitizers take the general and Hopper tables (not prod: T = S = 4096-8192 under instrumentation, and its
  # fp64 reference, would not fit), one process per table and tool; racecheck, the slow one over the Hopper
  # kernels, one process per plan family.
  gs=${SAN_STRIDE:-8} hs=${SAN_HOPPER_STRIDE:-3}
  for tool in memcheck synccheck initcheck; do
    san_step "san_${tool}_general" "$tool" --table=general --stride="$gs"
    san_step "san_${tool}_hopper" "$tool" --table=hopper --stride="$hs"
  done
  san_step san_racecheck_general racecheck --table=general --stride="$gs"
  for fam in ${RACE_FAMILIES:-hopper.fwd hopper.bwd.onepass hopper.bwd.twopass}; do
    san_step "san_racecheck_$fam" racecheck --table=hopper --plan="$fam" --stride="${RACE_HOPPER_STRIDE:-3}"
  done
  bg_step san_pytest_memcheck 330 env SINKATTN_LIBRARY="$PWD/build-gpusan/libsinkattn_jax.so" "$SAN" --tool memcheck \
    --kernel-name kns=sa_ --error-exitcode 99 --print-limit 50 --log-file "$STAGE/san_pytest_memcheck.san.log" \
    "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu_kernels.py
  wait_steps
fi

if has 2; then
  if ls .whl/*.whl > /dev/null 2>&1; then  # cudnn-frontend (kernel_bench's cuDNN contender), carried as a wheel
    run_step wheels 60 bash -c "\"$PY\" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && echo \"wheels: \$(ls .whl)\""
    export PYTHONPATH=/tmp/site:$PYTHONPATH
  fi
  [ -x build-gpu/gpu_progress ] || run_step build_release 240 bash -c 'build "$@"' build build-gpu Release 16 \
    --target sinkattn sinkattn_jax gpu_progress amx_check sinkattn_cpubench
  export SINKATTN_LIBRARY=$PWD/build-gpu/libsinkattn_jax.so SINKATTN_C_LIBRARY=$PWD/build-gpu/libsinkattn.so
  # The host CPU's AMX tile kernels (tests/amx_check.c: exit 77 = no AMX here, which counts as passed), with
  # their forward / forward+backward figures beside the AVX-512 plans'.
  run_step amx_check 90 bash -c 'build-gpu/amx_check --bench; rc=$?; [ $rc = 77 ] && exit 0; exit $rc'
  # bench-cpu on 2 of the host's cores (the size of the CI machines the CPU targets are set for), AMX forced
  # beside the default plans and PyTorch's SDPA: the peaks and the kernels' figures in one run.
  run_step cpu_bench 150 "$PY" bench/cpu_bench.py --lib build-gpu/libsinkattn_cpubench.so --quick --threads 2 \
    --rounds 3 --out "$STAGE/cpu_bench.json"
  run_step progress 180 bash bench/gpu_progress.sh "$STAGE/progress.jsonl" "$STAGE/progress.digest"
  if [ "$NGPU" -ge 2 ]; then
    run_step ring 150 "$PY" bench/ring_bench.py --devices 2 --start 16384 --max-len 65536 --iters 10 \
      --out "$STAGE/ring.json"
  else
    STEPS+=(ring); echo 0 > "$STAGE/ring.rc"; echo 0 > "$STAGE/ring.secs"
    echo "ring: SKIPPED: $NGPU GPU(s), ring attention beside NCCL needs 2" > "$STAGE/ring.log"
  fi
  # shellcheck disable=SC2086  # BENCH_ARGS / SEGMENTS_ARGS are word lists
  run_step kernel_bench 240 "$PY" bench/kernel_bench.py --out "$STAGE/kernel_bench.json" ${BENCH_ARGS:-}
  # shellcheck disable=SC2086
  run_step segments 80 "$PY" bench/segments_bench.py --out "$STAGE/segments.json" ${SEGMENTS_ARGS:-}
fi

if has 3; then
  run_step build_release 300 bash -c 'build "$@"' build build-gpu Release 16 --target sinkattn sinkattn_jax test_cuda
  export SINKATTN_LIBRARY=$PWD/build-gpu/libsinkattn_jax.so SINKATTN_C_LIBRARY=$PWD/build-gpu/libsinkattn.so
  bg_step test_cuda_segs_hopper 240 build-gpu/test_cuda --table=hopper --case=segs
  bg_step test_cuda_segs_general 240 build-gpu/test_cuda --table=general --case=seg
  wait_steps
  # shellcheck disable=SC2086
  run_step segments 150 "$PY" bench/segments_bench.py --out "$STAGE/segments.json" ${SEGMENTS_ARGS:-}
  run_step decode_bench 90 "$PY" bench/kernel_bench.py --no-grid --no-jax --no-cudnn --out "$STAGE/decode.json"
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  ncu_sections=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy
    --section MemoryWorkloadAnalysis --section LaunchStats)
  for sh in 1:32768 8:4096; do
    run_step "ncu_decode_${sh/:/_}" 90 "$NCU" --kernel-name regex:sa_decode_pipe --launch-skip 3 --launch-count 1 \
      "${ncu_sections[@]}" "$PY" bench/kernel_bench.py --no-grid --no-jax --no-cudnn --decode-shapes "$sh" --target-ms 1
  done
  for row in 1 13; do
    run_step "ncu_fwd_row_$row" 90 "$NCU" --kernel-name regex:sa_hop_fwd --launch-skip 2 --launch-count 1 \
      "${ncu_sections[@]}" "$PY" bench/kernel_bench.py --rows "$row" --no-jax --no-cudnn --no-decode --target-ms 1
  done
fi

if has decode; then
  run_step build_release 240 bash -c 'build "$@"' build build-gpu Release 16 --target sinkattn sinkattn_jax test_decode
  export SINKATTN_LIBRARY=$PWD/build-gpu/libsinkattn_jax.so SINKATTN_C_LIBRARY=$PWD/build-gpu/libsinkattn.so
  run_step test_decode 120 build-gpu/test_decode
  for tool in memcheck racecheck; do
    run_step "san_${tool}_decode" 150 "$SAN" --tool "$tool" --kernel-name kns=sa_decode --error-exitcode 99 \
      --print-limit 50 --log-file "$STAGE/san_${tool}_decode.san.log" build-gpu/test_decode
  done
  run_step decode_bench 150 "$PY" bench/kernel_bench.py --no-grid --no-jax --no-cudnn --out "$STAGE/decode.json"
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  ncu_sections=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy
    --section MemoryWorkloadAnalysis --section LaunchStats)
  for sh in 1:32768 8:4096; do
    run_step "ncu_decode_mma_${sh/:/_}" 90 "$NCU" --clock-control none --kernel-name regex:sa_decode_mma --launch-skip 3 \
      --launch-count 1 \
      "${ncu_sections[@]}" "$PY" bench/kernel_bench.py --no-grid --no-jax --no-cudnn --decode-shapes "$sh" --target-ms 1
  done
fi

if has features; then
  bg_step build_release 270 bash -c 'build "$@"' build build-gpu Release 8 --target sinkattn sinkattn_jax test_cuda \
    test_cuda_feat plan_record
  bg_step build_sanitizer 270 bash -c 'build "$@"' build build-gpusan RelWithDebInfo 8 --target test_cuda
  wait_steps
  export SINKATTN_LIBRARY=$PWD/build-gpu/libsinkattn_jax.so SINKATTN_C_LIBRARY=$PWD/build-gpu/libsinkattn.so
  # test_cuda's --plan: exact names (a trailing $), so that a set's processes run its own plans only
  declare -A FEAT_SET=([verified]='hopper.fwd.features$,hopper.bwd.twopass.features$'
    [tma]='hopper.fwd.features.tma$,hopper.bwd.twopass.features.tma$'
    [portable]='cuda.fwd.portable.features$,cuda.bwd.portable.features$')
  for set in verified tma portable; do
    for t in features features-prod; do bg_step "test_cuda_${t}_$set" 300 build-gpu/test_cuda --table="$t" \
      --plan="${FEAT_SET[$set]}"; done
    san_step "san_memcheck_features_$set" memcheck --table=features --stride="${SAN_FEAT_STRIDE:-2}" \
      --plan="${FEAT_SET[$set]}"
  done
  bg_step feat_host 60 bash -c 'build-gpu/test_cuda_feat && build-gpu/plan_record --check tests/plan/golden.txt'
  # the JAX op's default routing of such calls to the verified feature plans, against the fp64 reference
  bg_step pytest_features 240 "$PY" -m pytest tests/test_gpu_kernels.py -k feature_calls -q -p no:cacheprovider -rs \
    --timeout=200
  FEAT_PLANS="hopper.fwd.features hopper.bwd.twopass.features hopper.fwd.features.tma hopper.bwd.twopass.features.tma
    cuda.fwd.portable.features cuda.bwd.portable.features"
  for plan in $FEAT_PLANS; do
    san_step "san_racecheck_$plan" racecheck --table=features --plan="$plan\$" --stride="${RACE_FEAT_STRIDE:-3}"
  done
  wait_steps
  run_step feature_bench 300 "$PY" bench/feature_bench.py --plans verified,tma --out "$STAGE/feature_bench.json"
  case $(cat "$STAGE/feature_bench.rc") in # 0 every target met, 2 checks ok and targets missed; else a fault
    0|2) ;;
    *) run_step feature_bench_verified 200 "$PY" bench/feature_bench.py --plans verified \
         --out "$STAGE/feature_bench_verified.json" ;;
  esac
  # The verdict of each feature plan: its runs passed (and there were some), its set's test_cuda processes ended
  # without a fault or time-out (status 0, or 1 for failed checks, which the plan's own FAIL lines count), and its
  # set's memcheck and its own racecheck are clean.
  for plan in $FEAT_PLANS; do
    set=verified
    case $plan in *.tma) set=tma ;; cuda.*) set=portable ;; esac
    runs=$(cat "$STAGE"/test_cuda_features*_"$set".log 2>/dev/null | grep -c -E "^feat .* $plan ")
    fails=$(cat "$STAGE"/test_cuda_features*_"$set".log 2>/dev/null | grep -c -F "[$plan]")
    san=$(cat "$STAGE/san_memcheck_features_$set.rc" "$STAGE/san_racecheck_$plan.rc" 2>/dev/null | grep -c -v '^0$')
    tests=$(cat "$STAGE"/test_cuda_features*_"$set".rc 2>/dev/null | grep -c -v -E '^[01]$')
    if [ "$runs" -gt 0 ] && [ "$fails" = 0 ] && [ "$san" = 0 ] && [ "$tests" = 0 ]; then v=verified; else v="NOT verified"; fi
    echo "verdict $plan: $v ($runs runs, $fails failed checks; sanitizer steps failed: $san; test_cuda processes faulted: $tests)"
  done > "$STAGE/verdicts.txt"
fi

# ---- PART=perf33: the timing decisions (the one pass's wait, the decode split count, gpt-oss against cuDNN 9.27) ----
if has perf33; then
  bg_step build_release 240 bash -c 'build "$@"' build build-gpu Release 8 --target sinkattn sinkattn_jax test_cuda \
    test_decode
  bg_step build_sanitizer 240 bash -c 'build "$@"' build build-gpusan RelWithDebInfo 8 --target test_cuda
  wait_steps
  export SINKATTN_LIBRARY=$PWD/build-gpu/libsinkattn_jax.so SINKATTN_C_LIBRARY=$PWD/build-gpu/libsinkattn.so
  # the variants against the fp64 reference, concurrently (untimed): ".wait" selects both waiting one passes
  bg_step test_cuda_wait_hopper 200 build-gpu/test_cuda --table=hopper --plan=.wait
  # the prod table's one-pass cases in two processes (their fp64 references take ~30-60 s each on one core)
  bg_step test_cuda_wait_prod_h64 200 build-gpu/test_cuda --table=prod --plan=.wait --case=causal
  bg_step test_cuda_wait_prod_h128 200 build-gpu/test_cuda --table=prod --plan=.wait --case=H128
  bg_step test_decode 150 build-gpu/test_decode
  san_step san_synccheck_wait synccheck --table=hopper --plan=.wait
  san_step san_racecheck_wait racecheck --table=hopper --plan=.wait --stride="${RACE_HOPPER_STRIDE:-3}"
  wait_steps
  if ls .whl/*.whl > /dev/null 2>&1; then  # cudnn-frontend (kernel_bench's cuDNN contender), carried as a wheel
    run_step wheels 60 bash -c "\"$PY\" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && echo \"wheels: \$(ls .whl)\""
    export PYTHONPATH=/tmp/site:$PYTHONPATH
  fi
  # each timing step alone, in order of value (the budget cuts the last first)
  run_step wait_bench 150 "$PY" bench/plan_bench.py --dir bwd --rows 0,1,2,3,4,5,6,7,8,9,10,11,12 \
    --plans 'onepass\.wait$' --label "the one pass that always waits" --out "$STAGE/wait_bench.json"
  run_step decode_variants 80 "$PY" bench/kernel_bench.py --no-grid --no-jax --no-cudnn --rounds 7 \
    --decode-shapes 8:4096,8:16384,1:32768,1:16384,64:4096 --decode-plans '^cuda\.decode\.mma' \
    --out "$STAGE/decode_variants.json"
  run_step gptoss_anchors 150 "$PY" bench/kernel_bench.py --grid h200_gptoss --no-jax --no-decode --no-fb \
    --out "$STAGE/gptoss_anchors.json"
  run_step plans_fwd 70 "$PY" bench/plan_bench.py --dir fwd --rows 1,13 --shapes 1:32768:64:8:64:c:w127_0 \
    --plans '^hopper\.fwd\.(persistent|onetile)$' --label "forward plans on the rows below cuDNN" \
    --out "$STAGE/plans_fwd.json"
  run_step plans_bwd 90 "$PY" bench/plan_bench.py --dir bwd --rows 4,5,10,11 \
    --plans '^hopper\.bwd\.(onepass|twopass\.[a-z0-9]+)$' --label "backward plans on the T16384 rows" \
    --out "$STAGE/plans_bwd.json"
  wait_gates=test_cuda_wait_hopper,test_cuda_wait_prod_h64,test_cuda_wait_prod_h128,san_synccheck_wait,san_racecheck_wait
  "$PY" bench/plan_decide.py --wait "$STAGE/wait_bench.json" --decode "$STAGE/decode_variants.json" \
    --anchors "$STAGE/gptoss_anchors.json" --plans "$STAGE/plans_fwd.json" "$STAGE/plans_bwd.json" --stage "$STAGE" \
    --gate "$wait_gates,wait_bench" \
    --decode-gate test_decode,decode_variants \
    --out "$STAGE/decision.txt" > "$STAGE/plan_decide.log" 2>&1
fi
# ---- end of PART=perf33 ----

# ---- PART=f32: the float32 instantiations of the portable kernels (cuda.fwd.portable.f32, cuda.bwd.portable.f32) ----
if has f32; then
  bg_step build_release 240 bash -c 'build "$@"' build build-gpu Release 8 --target sinkattn sinkattn_jax test_cuda
  bg_step build_sanitizer 240 bash -c 'build "$@"' build build-gpusan RelWithDebInfo 8 --target test_cuda
  wait_steps
  # test_cuda's float32 cases (names "f32 ..."): every legal plan, which for float32 are the f32 plans alone
  bg_step test_cuda_f32 240 build-gpu/test_cuda --table=general --case="f32 "
  for tool in memcheck racecheck initcheck; do
    san_step "san_${tool}_f32" "$tool" --table=general --case="f32 "
  done
  wait_steps
fi

if has cpu; then
  [ -x build-gpu/amx_check ] || run_step build_cpu 240 bash -c 'build "$@"' build build-gpu Release 16 \
    --target sinkattn amx_check sinkattn_cpubench
  run_step amx_check 150 bash -c 'build-gpu/amx_check --bench; rc=$?; [ $rc = 77 ] && exit 0; exit $rc'
  run_step amx_check_2t 150 bash -c 'SINKATTN_NUM_THREADS=2 build-gpu/amx_check --bench; rc=$?; [ $rc = 77 ] && exit 0
    exit $rc'
  [ "${CPU_BENCH:-1}" = 1 ] && run_step cpu_bench 200 "$PY" bench/cpu_bench.py --lib build-gpu/libsinkattn_cpubench.so \
    --quick --threads 2 --rounds 3 --out "$STAGE/cpu_bench.json"
  if [ -n "${AB_BASE:-}" ]; then # the same rows under the tile plans, a base tree's library beside this one's
    run_step build_ab_base 200 bash -c 'cmake -S "$1" -B "$1/build" -DCMAKE_BUILD_TYPE=Release -DSINKATTN_CUDA=OFF \
      -DSINKATTN_FFI=OFF >/dev/null && cmake --build "$1/build" -j 16 --target sinkattn_cpubench' _ "$AB_BASE"
    run_step cpu_ab 240 "$PY" bench/cpu_ab.py --lib "base=$AB_BASE/build/libsinkattn_cpubench.so" \
      --lib head=build-gpu/libsinkattn_cpubench.so --lib base --plans "${AB_PLANS:-amx}" --rounds 5 --out "$STAGE/cpu_ab.json"
  fi
fi

{
  echo "gpu_verify PART=$PART commit $SINKATTN_COMMIT, $(grep -m1 -o 'NVIDIA H[0-9A-Za-z ]*' "$STAGE/machine.txt" \
    || echo 'GPU ?'), driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
  printf '%-34s %5s %6s  %s\n' step rc seconds "key figure"
  fail=0
  for s in "${STEPS[@]}"; do
    rc=$(cat "$STAGE/$s.rc" 2>/dev/null || echo '?')
    [ "$rc" = 0 ] || fail=1
    k=$(key "$s" | tr '\n' ' ' | cut -c1-200)
    [ -n "$k" ] || k=$(tail -n 1 "$STAGE/$s.log" | cut -c1-160)
    printf '%-34s %5s %6s  %s\n' "$s" "$rc" "$(cat "$STAGE/$s.secs" 2>/dev/null)" "$k"
  done
  [ -f "$STAGE/kernel_bench.log" ] && sed -n '/^kernel level, ms per call/,/^wrote /p' "$STAGE/kernel_bench.log" |
    cut -c1-210
  for f in "$STAGE"/amx_check*.log; do [ -f "$f" ] && grep -h "^bench:" "$f" | cut -c1-150; done
  [ -f "$STAGE/decode_bench.log" ] && grep -h "^decode B" "$STAGE/decode_bench.log" | cut -c1-120
  [ -f "$STAGE/segments.log" ] && sed -n '/^segments summary/,/^segments_bench:/p' "$STAGE/segments.log" | cut -c1-170
  [ -f "$STAGE/verdicts.txt" ] && cat "$STAGE/verdicts.txt"
  for f in "$STAGE"/feature_bench*.log; do [ -f "$f" ] && grep -h -E "^feature_bench: " "$f" | cut -c1-200; done
  [ "$SINKATTN_COMMIT" = unknown ] && echo "WARNING: SINKATTN_COMMIT unset: results are stamped 'unknown'"
  echo "status: $([ $fail = 0 ] && echo 'every step passed' || echo 'SOME STEPS FAILED (rc != 0)')"
  [ -f "$STAGE/decision.txt" ] && cut -c1-300 "$STAGE/decision.txt"  # the timing decisions (PART=perf33), last
  [ -f "$STAGE/plan_decide.log" ] && [ ! -f "$STAGE/decision.txt" ] && tail -n 20 "$STAGE/plan_decide.log"
} > "$STAGE/summary.txt"
cp "$STAGE/summary.txt" "$OUT/summary.txt"
for f in machine.txt prod_check.json kernel_bench.json decode.json segments.json progress.jsonl ring.json cpu_bench.json \
  cpu_ab.json feature_bench.json feature_bench_verified.json verdicts.txt wait_bench.json decode_variants.json \
  gptoss_anchors.json plans_fwd.json plans_bwd.json; do
  [ -f "$STAGE/$f" ] && cp "$STAGE/$f" "$OUT/"
done
tar -C "$(dirname "$STAGE")" -czf "$OUT/gpu_verify-$TAG.tgz" "gpu_verify-$TAG"
cat "$OUT/summary.txt"
grep -q "every step passed" "$OUT/summary.txt"
