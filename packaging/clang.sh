#!/usr/bin/env bash
# packaging/clang.sh — installs clang 14 and its runtime (libFuzzer, the sanitizers) from Debian's packages
# where they are missing, then prints the compiler's path. The fuzz build (fuzz/run.sh) and the second
# compiler of `make test` (test-c-clang) use it.
set -euo pipefail
need=()
for pkg in clang-14 libclang-rt-14-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q "${need[@]}" >&2
fi
command -v clang-14 || command -v clang
