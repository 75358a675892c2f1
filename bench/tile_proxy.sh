#!/usr/bin/env bash
# bench/tile_proxy.sh SRC DEST — the CPU library of source tree SRC (a checkout or a `git archive` of a commit that
# has CMake's SINKATTN_TILE_PROXY) built into DEST with that switch on: its emulated tile instructions keep their
# data movement and drop their products (src/cpu/cpu_tile_isa.h, SA_TILE_PROXY), so that under bench/cpu_ab.py
# --plans emulated its tile plans time what the tile path does besides its products, on a CPU without AMX. Prints
# DEST/libsinkattn_cpubench.so (CPU only). Loading two such builds into one process needs static TLS room:
# GLIBC_TUNABLES=glibc.rtld.optional_static_tls=1048576.
set -euo pipefail
src=$1 dst=$2
if ! grep -q SINKATTN_TILE_PROXY "$src/CMakeLists.txt"; then
  echo "tile_proxy.sh: $src has no SINKATTN_TILE_PROXY switch (a tree older than it): nothing to build" >&2
  exit 2
fi
cmake -S "$src" -B "$dst" -DCMAKE_BUILD_TYPE=Release -DSINKATTN_CUDA=OFF -DSINKATTN_FFI=OFF \
  -DSINKATTN_TILE_PROXY=ON >/dev/null
cmake --build "$dst" -j "$(nproc)" --target sinkattn_cpubench >/dev/null
echo "$dst/libsinkattn_cpubench.so"
