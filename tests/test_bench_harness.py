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


def test_feature_bench_times_every_plan_set_and_reports_each(monkeypatch, capsys):
  """bench/feature_bench.py's bookkeeping without a GPU: every feature call under each plan set of --plans beside
  the plain ones, a ratio, an A/A and a check per contender, the plan named on each line, a verdict per plan set,
  and a contender whose plan cannot run reported (not timed) while the rest still are."""
  import feature_bench

  class Chain:  # stands for torch and its tensors: every attribute and call gives itself
    def __getattr__(self, name):
      return self

    def __call__(self, *a, **k):
      return self

  class FakeCall:
    def __init__(self, lib, torch, sets, causal, bias=None, mask=None, plans=None):
      self.plans_, self.fails = plans, plans is not None and plans[0].endswith(".tma") and bias is None and causal == 0
      self.fails = self.fails and mask is MASKS[1]

    def fwd(self, i):
      pass

    fb = fwd

    def plans(self):
      if self.fails:
        raise RuntimeError("sa_attn_fwd: status 2: plan not legal")
      p = self.plans_ or ("hopper.fwd.persistent", "hopper.bwd.onepass")
      return p[0] + " hd=64", p[1] + " hd=64"

  class FakeTimer:
    def rounds(self, cons, rounds, target_ms):
      ms = lambda n: 1.0 if n.startswith("causal") else 2.0 if n.startswith("nobias") else 1.05 if ".tma" in n else 3.0  # noqa: E731
      return {c.name: [ms(c.name)] * rounds for c in cons}

  chain = Chain()
  MASKS = []
  real_view = Chain.__getattr__

  def view(self, name):  # the two masks are told apart by identity: the second is the [B, 1, T, S] one
    if name == "contiguous":
      m = Chain()
      MASKS.append(m)
      return lambda *a, **k: m
    return real_view(self, name)

  monkeypatch.setattr(Chain, "__getattr__", view)
  monkeypatch.setattr(feature_bench, "Call", FakeCall)
  monkeypatch.setattr(feature_bench, "make_sets", lambda *a: [None, None])
  monkeypatch.setattr(feature_bench, "same_output", lambda *a: 1e-5)
  monkeypatch.setattr(feature_bench.gpu_timing, "l2_bytes", lambda t: 60 << 20)
  args = feature_bench.argparse.Namespace(seed=1, rounds=5, target_ms=1.0, plans=["verified", "tma"])
  row = feature_bench.bench_shape(chain, None, FakeTimer(), (4, 256, 4, 4, 64), args)
  names = {k for k in row["fwd"] if "_over_" in k}
  assert "mask_11TS.tma_over_causal" in names and "bias_BNTS_over_nobias" in names, names
  assert "mask_B1TS.tma_over_causal" not in names and "mask_B1TS.tma" in row["errors"]
  assert row["fwd"]["aa_mask_11TS.tma"]["median"] == 1.0 and "bias_zero.tma" in row["check"]
  ok, met = feature_bench.report([row], args.plans)
  out = capsys.readouterr().out
  assert not ok and not met, out  # one contender could not run; the verified plans miss their targets
  assert "mask_B1TS.tma could not run" in out, out
  line = lambda key: next(x for x in out.splitlines() if key in x)  # noqa: E731
  assert "1.050" in line("fwd mask_11TS.tma_over_causal") and "met" in line("fwd mask_11TS.tma_over_causal"), out
  assert line("fwd mask_11TS.tma_over_causal").endswith("[hopper.fwd.features.tma]"), out
  assert "1.500" in line("fb  bias_1NTS_over_nobias") and "MISSED" in line("fb  bias_1NTS_over_nobias"), out
  assert line("fb  bias_1NTS_over_nobias").endswith("[hopper.bwd.twopass.features]"), out
  assert "verdict tma (hopper.fwd.features.tma + hopper.bwd.twopass.features.tma): targets met fwd mask 1/1" in out
  assert "verdict verified" in out and "fwd bias 0/2" in out, out
