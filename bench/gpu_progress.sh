#!/usr/bin/env bash
# bench/gpu_progress.sh JSONL DIGEST — every case of build-gpu/gpu_progress (bench/gpu_progress.cu), each in a
# process of its own under a time limit, so that a hang ends that case only: the hog mode per shape, the
# cooperative-launch experiment (device, then green contexts), and one process per (shape, SMs, plan) in green
# contexts (backward plans at every size of GREEN_SMS, forward plans at the smallest: a persistent forward has no
# wait between CTAs). JSONL gets every PROGRESS record, plus one per process killed by its limit; DIGEST one line
# of counts. Exit 0 only when every case finished and matched.
set -u
BIN=${BIN:-build-gpu/gpu_progress}
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
  echo "gpu_progress $* rc=$rc: $(grep -c '"status":"ok"' "$tmp") ok, $(grep -c -E '"status":"(WRONG|ERROR|HANG)"' "$tmp") not"
}
read -r -a sms <<< "${GREEN_SMS:-64 32 16 8}"
for s in ${PROGRESS_SHAPES:-h128_t16k_causal gptoss h128_t4k}; do run 90 hog "$s"; done
run 60 coop
for n in "${sms[@]}"; do run 20 coop-green "$n"; done
for s in ${GREEN_SHAPES:-h128_t16k_causal gptoss}; do
  mapfile -t targets < <("$BIN" list "$s" 2>&1 | grep -E '^(fwd|bwd) ')
  [ ${#targets[@]} -gt 0 ] || echo "{\"args\":\"list $s\",\"status\":\"ERROR\"}" >> "$out"
  for t in "${targets[@]}"; do
    read -r kind plan <<< "$t"
    if [ "$kind" = bwd ]; then todo=("${sms[@]}"); else todo=("${sms[-1]}"); fi
    for n in "${todo[@]}"; do run 20 green "$s" "$n" "$kind" "$plan"; done
  done
done
rm -f "$tmp"
count() { grep -c "\"status\":\"$1\"" "$out"; }
echo "progress: $(count ok) ok, $(count WRONG) wrong, $(count ERROR) error, $(count HANG) hang, $(count KILLED) killed;" \
  "coop: $(grep -c '"mode":"coop"' "$out") records" | tee "$digest"
[ "$(grep -c -E '"status":"(WRONG|ERROR|HANG|KILLED)"|"fatal"' "$out")" = 0 ]
