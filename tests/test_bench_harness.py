"""The GPU benchmarks' and checks' harness where there is no GPU: bench/sa_capi.py's structs against the C
compiler's layout of include/sinkattn.h, bench/prod_check.py's --cpu mode on the REF and CPU backends (and that it
fails on a wrong reference), bench/kernel_bench.py's argument handling and dry run; of the CPU benchmarks,
bench/cpu_ab.py's arguments; and bench/jax_bench.py (`make bench`) on its tiny grid."""

import ctypes
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import prod_check  # noqa: E402
import sa_capi  # noqa: E402


def _lib():
  try:
    return sa_capi.Lib()
  except FileNotFoundError as e:
    pytest.skip(str(e))


def test_struct_layout_matches_the_c_compiler(tmp_path):
  cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
  if cc is None:
    pytest.skip("no C compiler")
  lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "sinkattn.h"', "int main(void) {"]
  want = []
  for cname, cls in (("sa_attn", sa_capi.Attn), ("sa_attn_grad", sa_capi.Grad)):
    lines.append('  printf("%%zu\\n", sizeof(%s));' % cname)
    want.append(ctypes.sizeof(cls))
    for field, _ in cls._fields_:
      lines.append('  printf("%%zu\\n", offsetof(%s, %s));' % (cname, field))
      want.append(getattr(cls, field).offset)
  lines.append("  return 0;\n}")
  src = tmp_path / "layout.c"
  src.write_text("\n".join(lines))
  exe = tmp_path / "layout"
  subprocess.run([cc, "-I", os.path.join(ROOT, "include"), str(src), "-o", str(exe)], check=True)
  got = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
  assert got == want, f"sizeof / offsetof from the compiler {got} != ctypes {want}"


def test_header_parser_names_an_unknown_field_type(tmp_path):
  h = tmp_path / "h.h"
  h.write_text("typedef enum { A = 0, B } ab;\ntypedef struct s { int64_t n; ab e; sa_thing x; } s;\n")
  with pytest.raises(ValueError, match="field x has type sa_thing"):
    sa_capi.parse_header(str(h))
  h.write_text("typedef enum { A = 3, B } ab;\ntypedef struct s { int64_t n; ab e; const float *p, *q; } s;\n")
  consts, enums, structs = sa_capi.parse_header(str(h))
  assert consts == {"A": 3, "B": 4} and enums == {"ab"}
  assert [f for f, _ in structs["s"]] == ["n", "e", "p", "q"]


def test_status_messages_name_the_fields_through_ctypes():
  """A field written through the mirror reaches the library at the right place: the message names it."""
  lib = _lib()
  q = np.zeros((1, 4, 2, 64), np.float32)
  k = np.zeros((1, 4, 1, 64), np.float32)
  a = sa_capi.make_attn(lib, q, k, k, q.copy(), None, softmax="vanilla", dtype="f32")
  assert lib.lib.sa_attn_check(ctypes.byref(a), sa_capi.C["SA_BACKEND_CPU"]) == 0, lib.error()
  a.kv_heads = 3
  assert lib.lib.sa_attn_check(ctypes.byref(a), sa_capi.C["SA_BACKEND_CPU"]) == sa_capi.C["SA_ERR_INVALID"]
  assert "kv_heads" in lib.error() or "q_heads" in lib.error(), lib.error()
  with pytest.raises(ValueError, match="sinks"):
    sa_capi.make_attn(lib, q, k, k, q, None, sinks=np.zeros(2, np.float32), softmax="vanilla", dtype="f32")


def test_prod_check_cpu_mode_passes():
  lib = _lib()
  assert prod_check.main(["--cpu", "--lib", lib.path]) == 0


@pytest.mark.parametrize("where", ["fwd", "bwd"])
def test_prod_check_fails_on_a_wrong_reference(monkeypatch, where):
  """The harness can fail: a reference whose sinks are off by 0.25 (forward), or whose dsinks are off by 5%."""
  lib = _lib()
  ref = prod_check.attn_ref
  if where == "fwd":
    real = ref.forward
    monkeypatch.setattr(ref, "forward", lambda q, k, v, s, **kw: real(q, k, v, s + np.float32(0.25), **kw))
  else:
    real = ref.backward
    monkeypatch.setattr(
      ref, "backward", lambda *a, **kw: tuple(x * (1.05 if i == 3 else 1.0) for i, x in enumerate(real(*a, **kw)))
    )
  rows = prod_check.check_shape(
    lib, prod_check._Host(), prod_check.CPU_GRID[0], sa_capi.C["SA_BACKEND_CPU"], "default", 5
  )
  assert rows and not any(r["ok"] for r in rows if r["kind"] == where)


def test_kernel_bench_dry_run_and_arguments(capsys):
  import kernel_bench

  assert kernel_bench.main(["--dry-run", "--rows", "12,13"]) == 0
  out = capsys.readouterr().out
  assert "row 12" in out and "row 13" in out and "decode B64 S131072" in out
  with pytest.raises(SystemExit):
    kernel_bench.main(["--dry-run", "--rounds", "3"])


def test_cpu_ab_arguments(monkeypatch):
  import cpu_ab

  assert cpu_ab.parse_libs(["a=/x.so", "b=/y.so", "a"]) == [("a", "/x.so"), ("b", "/y.so"), ("a", "/x.so")]
  with pytest.raises(SystemExit, match="no path given"):
    cpu_ab.parse_libs(["a=/x.so", "c"])
  for argv in (["--lib", "a=/x.so"], ["--lib", "a=/x.so", "--lib", "a", "--plans", "cpu.fwd.avx512,cpu.bwd.avx512"]):
    monkeypatch.setattr(sys, "argv", ["cpu_ab.py", *argv])
    with pytest.raises(SystemExit, match="at least twice|three plan names"):
      cpu_ab.main()


def test_jax_bench_tiny_grid(tmp_path):
  """`make bench`'s program runs from the source tree and writes its rows; the A/B of environment switches within
  one process is gone (the library reads its switches once per process: both contenders would time one plan)."""
  import json

  import jax_bench

  out = tmp_path / "r.json"
  flags = ["--grid", "tiny", "--contenders", "fused", "--repeats", "1", "--no-progress", "--out", str(out)]
  jax_bench.main(flags)
  rows = json.loads(out.read_text())["rows"]
  assert [r["contender"] for r in rows] == ["fused", "fused"] and all(r["fwd_ms"] > 0 for r in rows)
  with pytest.raises(SystemExit):
    jax_bench.main(flags + ["--ab-env", "SINKATTN_SIMD=avx2"])
