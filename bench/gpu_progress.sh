#!/usr/bin/env bash
# bench/gpu_progress.sh JSONL DIGEST — every case of build-gpu/gpu_progress (bench/gpu_progress.cu), each in a
# process of its own under a time limit, so that a hang ends that case only: the hog mode per shape, the
# cooperative-launch experiment (device, then green contexts), and one process per (shape, SMs, plan) in green
# contexts: the backward plans (the library's default and every target) at every size of GREEN_SMS, the forward
# ones at the smallest (a persistent forward has no wait between CTAs). JSONL gets every
# PROGRESS record, plus one per process killed by its limit; DIGEST one line of counts. The plans matching
# PROGRESS_DIAGNOSTIC (default onepass.plain: the one pass without its cooperative launch, never a default,
# there to show what co-residency buys) are counted apart and do not fail the step. Exit 0 when every other
# case finished and matched (or was refused by name in a context that makes its plan illegal).
set -u
BIN=${BIN:-build-gpu/gpu_progress}
DIAG=${PROGRESS_DIAGNOSTIC:-onepass.plain}
out=$1
digest=$2
tmp=$(mktemp)
: > "$out"
run() { # LIMIT ARGS...: one process; its PROGRESS lines into JSONL
  local lim=$1 rc
  shift
  timeout -k 5 "$lim" "$BIN" "$@" > "$tmp" 2>&1
  rc=$?
  sed -n 's/^PROGRESS //p' "$tmp" >> "$out"
  [ $rc -le 3 ] || echo "{\"args\":\"$*\",\"status\":\"KILLED\",\"rc\":$rc}" >> "$out"
  echo "gpu_progress $* rc=$rc: $(grep -c -E '"status":"(ok|refused)"' "$tmp") ok or refused," \
    "$(grep -c -E '"status":"(WRONG|ERROR|HANG)"' "$tmp") not"
}
read -r -a sms <<< "${GREEN_SMS:-64 32 16 8}"
for s in ${PROGRESS_SHAPES:-h128_t16k_causal gptoss h128_t4k}; do run 90 hog "$s"; done
run 60 coop
for n in "${sms[@]}"; do run 20 coop-green "$n"; done
for s in ${GREEN_SHAPES:-h128_t16k_causal gptoss}; do
  mapfile -t targets < <("$BIN" list "$s" 2>&1 | grep -E '^(fwd|bwd) ')
  [ ${#targets[@]} -gt 0 ] || echo "{\"args\":\"list $s\",\"status\":\"ERROR\"}" >> "$out"
  for t in "fwd default" "bwd default" "${targets[@]}"; do
    read -r kind plan <<< "$t"
    if [ "$kind" = bwd ]; then todo=("${sms[@]}"); else todo=("${sms[-1]}"); fi
    for n in "${todo[@]}"; do run 20 green "$s" "$n" "$kind" "$plan"; done
  done
done
rm -f "$tmp"
main=$(grep -v -F "$DIAG" "$out")
diag=$(grep -F "$DIAG" "$out")
count() { printf '%s\n' "$1" | grep -c "\"status\":\"$2\""; }
echo "progress: $(count "$main" ok) ok, $(count "$main" refused) refused, $(count "$main" WRONG) wrong," \
  "$(count "$main" ERROR) error, $(count "$main" HANG) hang, $(count "$main" KILLED) killed" \
  "($(printf '%s\n' "$main" | grep -c '"finished":"after_hog"') waited for the hog's SMs);" \
  "$DIAG (diagnostic): $(count "$diag" ok) ok, $(count "$diag" WRONG) wrong, $(count "$diag" HANG) hang;" \
  "coop: $(grep -c '"mode":"coop"' "$out") records" | tee "$digest"
[ "$(printf '%s\n' "$main" | grep -c -E '"status":"(WRONG|ERROR|HANG|KILLED)"|"fatal"')" = 0 ]
