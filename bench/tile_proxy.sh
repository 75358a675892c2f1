#!/usr/bin/env bash
# bench/tile_proxy.sh SRC DEST — a build of the CPU library from source tree SRC (a checkout or a `git archive` of
# any commit) whose emulated tile instructions keep their data movement and drop their products: TDPBF16PS does
# nothing, TILELOADD / TILESTORED move each 64-byte row with one vector load and store, and the emulated tile state
# is reached through an initial-exec thread-local pointer (a dlopen'd library's dynamic TLS lookups were 13% of the
# samples). Under bench/cpu_ab.py --plans emulated its tile plans then time what the tile path does besides its
# products, on a CPU without AMX (docs/cpu.md, "Tiles"). Builds
# DEST/build/libsinkattn_cpubench.so (CPU only). Loading two such builds into one process needs static TLS room:
# GLIBC_TUNABLES=glibc.rtld.optional_static_tls=1048576.
set -euo pipefail
src=$1 dst=$2
rm -rf "$dst"
mkdir -p "$dst"
tar -C "$src" --exclude=./.git --exclude="./build*" --exclude="./.venv*" --exclude=./dist --exclude=./.whl -cf - . |
  tar -C "$dst" -xf -
python3 - "$dst/src/cpu/cpu_tile_isa.h" <<'PY'
import sys

p = sys.argv[1]
s = open(p).read()


def rep(old, new):
  global s
  if s.count(old) != 1:
    sys.exit(f"tile_proxy.sh: {p} no longer has the text to replace: {old[:60]!r}")
  s = s.replace(old, new)


rep("#define TILE_DPBF16PS(c, a, b)    sa_tile_emu_dpbf16ps(c, a, b)", "#define TILE_DPBF16PS(c, a, b)    ((void)sa_tile_emu_dpbf16ps)")
rep(
  "  memset(sa_tile_emu.t[t], 0, sizeof sa_tile_emu.t[t]);\n"
  "  for (int r = 0; r < rows; r++) memcpy(sa_tile_emu.t[t][r], (const char *)p + r * stride, (size_t)colsb);",
  "  (void)colsb;\n"
  "  for (int r = 0; r < rows; r++) _mm512_store_si512(sa_tile_emu.t[t][r], _mm512_loadu_si512((const char *)p + r * stride));",
)
rep(
  "  for (int r = 0; r < rows; r++) memcpy((char *)p + r * stride, sa_tile_emu.t[t][r], (size_t)colsb);",
  "  (void)colsb;\n"
  "  for (int r = 0; r < rows; r++) _mm512_storeu_si512((char *)p + r * stride, _mm512_load_si512(sa_tile_emu.t[t][r]));",
)
rep("#include <string.h>\n", "#include <string.h>\n#include <stdlib.h>\n#include <immintrin.h>\n")
rep(
  "static _Thread_local struct {\n  sa_tile_cfg cfg;\n  uint8_t t[8][16][64];\n} sa_tile_emu;",
  "typedef struct {\n  sa_tile_cfg cfg;\n  uint8_t t[8][16][64] __attribute__((aligned(64)));\n} sa_tile_emu_state;\n"
  'static __thread __attribute__((tls_model("initial-exec"))) sa_tile_emu_state *sa_tile_emu_p;\n'
  "#define sa_tile_emu (*sa_tile_emu_p)",
)
rep(
  "static void sa_tile_emu_loadconfig(const void *cfg) {",
  "static void sa_tile_emu_loadconfig(const void *cfg) {\n"
  "  if (!sa_tile_emu_p) sa_tile_emu_p = aligned_alloc(64, sizeof(sa_tile_emu_state));",
)
open(p, "w").write(s)
PY
[ "${TILE_PROXY_NO_BUILD:-0}" = 1 ] && exit 0 # the patched tree only (tests/test_bench_harness.py)
cmake -S "$dst" -B "$dst/build" -DCMAKE_BUILD_TYPE=Release -DSINKATTN_CUDA=OFF -DSINKATTN_FFI=OFF >/dev/null
cmake --build "$dst/build" -j "$(nproc)" --target sinkattn_cpubench >/dev/null
echo "$dst/build/libsinkattn_cpubench.so"
