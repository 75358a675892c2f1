"""The timing decisions' harness where there is no GPU: bench/plan_decide.py's rules on synthetic results (the one
pass's wait flips only when it costs < 1% beyond the A/A noise on every row and the gate steps passed; a decode
split count flips below the largest chunk where it never loses), bench/plan_bench.py's shape argument,
bench/kernel_bench.py's anchors (rows of their grid, and the ratio's direction), and bench/jax_bench.py's flops
(the pairs of the mask, counted per row)."""

import json
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import plan_decide  # noqa: E402


def _stats(ms, samples=None):
  s = samples or [ms] * 5
  return dict(median=ms, min=min(s), max=max(s), samples=s)


def _ratio(x, lo=None, hi=None):
  return dict(median=x, min=lo if lo is not None else x, max=hi if hi is not None else x)


def _wait_rows(costs, aa=1.002, ok=True):
  rows = []
  for i, c in enumerate(costs):
    d = dict(ms=_stats(1.0), aa=_ratio(aa), over_default=_ratio(1.0), check=dict(ok=True))
    w = dict(ms=_stats(1.0 + c), aa=_ratio(1.0), over_default=_ratio(1.0 + c), check=dict(ok=ok))
    rows.append(
      dict(
        name="row %d" % i, default="hopper.bwd.onepass", plans={"hopper.bwd.onepass": d, "hopper.bwd.onepass.wait": w}
      )
    )
  rows.append(dict(name="window", default="hopper.bwd.twopass.dq3", plans={}))  # not a one-pass row: left out
  return dict(meta={}, rows=rows)


def _decide(tmp_path, gate_rc="0", **files):
  args = ["--stage", str(tmp_path), "--gate", "san_synccheck_wait", "--decode-gate", "test_decode"]
  (tmp_path / "san_synccheck_wait.rc").write_text(gate_rc + "\n")
  (tmp_path / "test_decode.rc").write_text(gate_rc + "\n")
  for k, v in files.items():
    p = tmp_path / (k + ".json")
    p.write_text(json.dumps(v))
    args += ["--" + k, str(p)]
  out = tmp_path / "decision.txt"
  assert plan_decide.main(args + ["--out", str(out)]) == 0
  return out.read_text()


def test_wait_flips_only_under_the_rule(tmp_path):
  text = _decide(tmp_path, wait=_wait_rows([0.003, 0.008, -0.002]))
  assert "3 rows" in text and "FLIP: src/cuda/plan.c: #define SA_HOP_OP_WAIT_DEFAULT 1" in text
  # one row over 1% + noise (0.2%): keep
  assert "KEEP the skip" in _decide(tmp_path, wait=_wait_rows([0.003, 0.0125]))
  # within the noise allowance: 1.1% against 1% + 0.2%
  assert "FLIP" in _decide(tmp_path, wait=_wait_rows([0.011]))
  assert "KEEP the skip" in _decide(tmp_path, wait=_wait_rows([0.0]), gate_rc="99")
  assert "KEEP the skip" in _decide(tmp_path, wait=_wait_rows([0.0], ok=False))
  assert "1 one pass always waits: NO RESULT" in _decide(tmp_path)


def _dec(B, S, plan, default, ms, chunk, copy, aa=1.0, ok=True):
  return dict(
    B=B,
    S=S,
    plan=plan,
    default=default,
    ran="%s hd=64 splits=%d chunk=%d" % (plan, S // chunk, chunk),
    ms=_stats(ms),
    aa=_ratio(aa),
    of_copy=copy,
    check=dict(ok=ok),
  )


def _decode(x2_s16k):
  rows = []
  for (B, S, chunk), x2 in (((8, 4096, 1024), 0.95), ((1, 32768, 1024), 0.97), ((8, 16384, 4096), x2_s16k)):
    rows.append(_dec(B, S, "cuda.decode.mma", True, 1.0, chunk, 0.64))
    rows.append(_dec(B, S, "cuda.decode.mma.x2", False, x2, chunk // 2, 0.64 / x2))
    rows.append(_dec(B, S, "cuda.decode.mma.half", False, 1.1, chunk * 2, 0.58))
  return dict(meta={}, rows=[], decode=rows)


def test_decode_split_count_rule(tmp_path):
  # x2 wins at both chunk-1024 shapes and loses at chunk 4096: the default chunk limit stays 1024
  text = _decide(tmp_path, decode=_decode(1.05))
  assert "cuda.decode.mma.x2" in text and "#define SA_DEC_MMA_SHORT_SPLITS_PCT 200 (then" in text
  # x2 wins everywhere: the limit rises to the largest chunk timed
  text = _decide(tmp_path, decode=_decode(0.99))
  assert "SA_DEC_MMA_SHORT_SPLITS_PCT 200, #define SA_DEC_MMA_SHORT_CHUNK 4096" in text
  assert "KEEP: gate steps FAILED" in _decide(tmp_path, gate_rc="1", decode=_decode(1.05))
  slow = _decode(1.05)
  for d in slow["decode"]:
    if d["plan"] == "cuda.decode.mma.x2":
      d["ms"] = _stats(1.005)
  assert "KEEP the one-wave rule" in _decide(tmp_path, decode=slow)


def test_plan_bench_shapes():
  import plan_bench

  assert plan_bench.parse_shape("1:32768:64:8:64:c:w127_0") == (1, 32768, 64, 8, 64, True, (127, 0))
  assert plan_bench.parse_shape("4:4096:16:16:128") == (4, 4096, 16, 16, 128, False, None)
  for bad in ("1:2:3", "1:128:2:2:64:x"):
    with pytest.raises(ValueError):
      plan_bench.parse_shape(bad)


def test_anchors_are_grid_rows_and_flops_count_the_mask():
  import jax_bench
  import kernel_bench

  assert set(kernel_bench.ANCHORS) == set(jax_bench.GRIDS["h200_gptoss"])
  row = dict(B=1, T=32768, N=64, K=8, H=64, causal=True, window=[127, 0], fwd=dict(ours=dict(median=0.47, tflops=1)))
  a = kernel_bench.anchor_of(row)
  assert a["unit"] == "ms" and a["ours_over_anchor"] == pytest.approx(0.517 / 0.47)
  for B, T, N, H, causal, window in (
    (1, 300, 2, 64, True, None),
    (2, 257, 1, 128, False, (10, 20)),
    (1, 200, 1, 64, True, (5, 0)),
  ):
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    ok = np.ones((T, T), bool)
    if causal:
      ok &= j <= i
    if window:
      ok &= (j >= i - window[0]) & (j <= i + window[1])
    assert jax_bench.flops(B, T, N, H, causal, window) == 4.0 * B * N * H * ok.sum()
