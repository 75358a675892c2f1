#!/usr/bin/env bash
# packaging/wheel_compat.sh (`make wheel-compat`) — one wheel for every supported jaxlib, both ways, built from
# a read-only copy of the repository:
#   1. the files git tracks (or would: untracked, not ignored) are copied from the working tree to $WORK/src,
#      which is then made read-only (a read-only bind mount when run as root, else chmod a-w);
#   2. wheel N: `pip wheel` there by the newest Python (pip's isolated build environment gets the newest
#      jax/jaxlib, FFI header 0.5 with jaxlib 0.12); wheel O: `pip wheel --no-build-isolation` in a virtualenv
#      holding the oldest supported jax stack (requirements-oldest.txt: FFI header 0.3);
#   3. wheel N goes into a fresh virtualenv with the oldest jax stack (Python $PY), wheel O into one with the
#      newest (Python $PY_NEWEST); each runs the README's JAX snippet and `pytest -q tests/test_ops.py` from a
#      copy of tests/ outside the source tree, after checking that the package and the library it loads are
#      the installed ones.
# Environment: PY, PY_NEWEST (the two interpreters; the Makefile passes its own), WHEEL_ARGS (extra pip
# arguments for both builds, e.g. -Ccmake.define.SINKATTN_CUDA=OFF to skip the CUDA backend), WORK (scratch
# directory, default a new one under /tmp; removed at the end unless KEEP=1).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PY=${PY:-python3}
PY_NEWEST=${PY_NEWEST:?set PY_NEWEST to a Python 3.13 interpreter}
WHEEL_ARGS=${WHEEL_ARGS:-}
WORK=${WORK:-$(mktemp -d /tmp/sinkattn-wheel-compat.XXXXXX)}
MOUNTED=0
cleanup() {
  if ((MOUNTED)); then umount "$WORK/src" || true; fi
  if [ "${KEEP:-0}" != 1 ]; then chmod -R u+w "$WORK" 2>/dev/null || true; rm -rf "$WORK"; fi
}
trap cleanup EXIT
step() { printf '\n== %s (%ds)\n' "$*" "$SECONDS"; }

step "read-only copy of the tracked files in $WORK/src"
mkdir -p "$WORK/src" "$WORK/wheels"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  if [ -e "$f" ]; then cp --parents -t "$WORK/src" "$f"; fi  # a file deleted but not yet committed: skipped
done
if [ "$(id -u)" -eq 0 ] && mount --bind "$WORK/src" "$WORK/src" 2>/dev/null; then
  MOUNTED=1
  mount -o remount,bind,ro "$WORK/src"
else
  chmod -R a-w "$WORK/src"
fi
if touch "$WORK/src/.probe" 2>/dev/null; then echo "the copy is writable: cannot test a read-only build"; exit 1; fi

build() {  # build <label> <python> [pip arguments]: the wheel into $WORK/wheels/<label>, CMake's summary shown
  local label=$1 python=$2 log="$WORK/build-$1.log"
  shift 2
  (cd "$WORK" && "$python" -m pip wheel "$WORK/src" -v --no-deps -w "$WORK/wheels/$label" "$@" $WHEEL_ARGS) \
    >"$log" 2>&1 || { tail -40 "$log"; exit 1; }
  grep -E -- "-- sinkattn|Created wheel" "$log"
}
step "wheel N: isolated build by $PY_NEWEST (the newest jaxlib's header)"
build newest "$PY_NEWEST"

step "wheel O: build against the oldest jaxlib's header (requirements-oldest.txt, --no-build-isolation)"
"$PY" -m venv "$WORK/venv-build-oldest"
"$WORK/venv-build-oldest/bin/pip" install -q -r "$REPO/requirements-oldest.txt" -r "$REPO/requirements-wheel.txt"
build oldest "$WORK/venv-build-oldest/bin/python" --no-build-isolation

# The README's first python block under "## JAX", run as a user would after installing.
python3 - "$REPO/README.md" "$WORK/snippet.py" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
block = re.search(r"^## JAX\n.*?```python\n(.*?)```", text, re.S | re.M).group(1)
open(sys.argv[2], "w").write(block + "print('README snippet ran: out', out.shape, out.dtype)\n")
EOF
mkdir -p "$WORK/tests"
cp "$REPO"/tests/*.py "$WORK/tests/"

check() {  # check <wheel dir> <python> <requirements> <label>
  local venv="$WORK/venv-$4"
  step "wheel $(basename "$1") on $4: $("$2" --version), $(grep -E '^jax==' "$3")"
  "$2" -m venv "$venv"
  "$venv/bin/pip" install -q -r "$3" -r "$REPO/requirements-test.txt" "$1"/sinkattn-*.whl
  (cd "$WORK" && "$venv/bin/python" - <<'EOF'
import sinkattn, sinkattn._lib as lib, jaxlib
path = lib.load()._name
print("sinkattn", sinkattn.__version__, "from", sinkattn.__file__, "| library", path, "| jaxlib", jaxlib.__version__,
      "FFI API %d.%d" % lib.jaxlib_ffi_api_version())
assert "site-packages" in sinkattn.__file__ and "site-packages" in path, "not the installed package"
EOF
  )
  (cd "$WORK" && "$venv/bin/python" snippet.py)
  (cd "$WORK/tests" && "$venv/bin/python" -m pytest -q -p no:cacheprovider test_ops.py)
}
check "$WORK/wheels/newest" "$PY" "$REPO/requirements-oldest.txt" oldest
check "$WORK/wheels/oldest" "$PY_NEWEST" "$REPO/requirements-newest.txt" newest
step "both directions passed"
