"""bench/perf_tables.py on synthetic results in the formats the GPU benchmarks write: kernel_bench.json
(bench/kernel_bench.py), segments.json (bench/segments_bench.py) and progress.jsonl (bench/gpu_progress.sh over
bench/gpu_progress.cu). The files are built with the benchmarks' own statistics (gpu_timing.stats / paired) and
read back by the benchmarks' own summaries (kernel_bench.table / digest, segments_bench.summary), so a change to
a writer's format that the tables do not follow fails here."""

import json
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import gpu_timing  # noqa: E402
import perf_tables  # noqa: E402
import sa_capi  # noqa: E402

META = dict(
  sa_capi.stamp(),
  commit="0123456789abcdef",
  gpus=["NVIDIA H200, 580.159.04, 1980 MHz, 3201 MHz"],
  torch="2.9.0",
  torch_cuda="13.0",
  cudnn_backend=91400,
  device="NVIDIA H200",
  jax="0.11.2",
  jaxlib="0.11.2",
  rounds=5,
  target_ms=10.0,
  gated=True,
)


def timed(ms, mult=1.0, flops=1e12):
  """One contender's entry as kernel_bench writes it: gpu_timing.stats plus tflops."""
  x = [ms] * 5
  return x, dict(gpu_timing.stats(x), tflops=mult * flops / gpu_timing.stats(x)["median"] * 1e-9)


def kernel_row(causal, window=None, cudnn=True, jax=True):
  """bench_row's dict (and bench_jax's keys): every contender twice, paired ratios per round."""
  fl = 2.0e12
  row = dict(
    B=16,
    T=1024,
    N=32,
    K=32,
    H=64,
    causal=causal,
    window=window,
    sets=4,
    flops_fwd=fl,
    plan_fwd="hopper.fwd.persistent",
    plan_bwd="hopper.bwd.onepass64",
  )
  ok = dict(errors={}, ok=True)
  row["check"] = dict(ours_vs_ref=ok, **(dict(cudnn_sink_vs_ref=ok, ours_vs_cudnn_sink=ok) if cudnn else {}))
  for mode, mult in (("fwd", 1.0), ("fb", 3.5)):
    s = {}
    res = {}
    for name, ms in (("ours", 4.0), ("ours#2", 4.04)) + ((("cudnn_sink", 4.4), ("cudnn_sink#2", 4.4)) if cudnn else ()):
      s[name], res[name] = timed(ms * mult, mult, fl)
    res["aa_ours"] = gpu_timing.paired(s["ours#2"], s["ours"])
    if cudnn:
      res["cudnn_over_ours"] = gpu_timing.paired(s["cudnn_sink"], s["ours"])
      res["aa_cudnn"] = gpu_timing.paired(s["cudnn_sink#2"], s["cudnn_sink"])
    row[mode] = res
    if jax:
      js = {"jax_ours": timed(5.0 * mult)[0], "jax_cudnn_vanilla": timed(5.5 * mult)[0]}
      row["jax_" + mode] = {
        n: dict(gpu_timing.stats(x), tflops=mult * fl / gpu_timing.stats(x)["median"] * 1e-9) for n, x in js.items()
      }
      row["jax_" + mode]["cudnn_vanilla_over_ours"] = gpu_timing.paired(js["jax_cudnn_vanilla"], js["jax_ours"])
  if not cudnn:
    row["cudnn_sink_error"] = "RuntimeError: graph not supported"
  if not jax:
    row["jax_error"] = "not run: --budget 225 s spent"
  return row


def decode_row(plan, default, copy_bps):
  """bench_decode's dict for one (B, S, plan)."""
  nbytes = 2 * 8 * 16384 * 8 * 64 * 2 + 2 * 2 * 8 * 64 * 64
  x, _ = timed(0.1)
  st = gpu_timing.stats(x)
  bps = nbytes / (st["median"] * 1e-3)
  return dict(
    B=8,
    S=16384,
    N=64,
    K=8,
    H=64,
    sets=8,
    bytes=nbytes,
    plan=plan,
    default=default,
    ran=plan,
    ms=st,
    GBps=bps * 1e-9,
    of_copy=bps / copy_bps,
    aa=gpu_timing.paired(x, x),
    check=dict(errors={}, ok=True),
  )


def segment_rows():
  """bench_shape's dicts: the dense layer (default plans) and 4 documents (two backward plans)."""
  rows = []
  for docs, plans in (
    ("dense", (("fwd default", 2.0), ("bwd default", 5.0))),
    (4, (("fwd default", 1.0), ("fwd hopper.seg", 0.9), ("bwd default", 3.0), ("bwd portable", 6.0))),
  ):
    pairs = 4 * (4096 // 4) * (4096 // 4 + 1) // 2 if docs == 4 else 4096 * 4097 // 2
    fl = 4.0 * 64 * 64 * pairs
    fwd_default = dict(plans)["fwd default"]
    for key, ms in plans:
      s = gpu_timing.stats([ms] * 5)
      is_fwd = key.startswith("fwd ")
      fb = None if is_fwd else fwd_default + ms
      rows.append(
        dict(
          T=4096,
          H=64,
          N=64,
          K=8,
          docs=docs,
          plan=key,
          ran=key[4:],
          ms=s,
          tflops=fl / ms * 1e-9 if is_fwd else None,
          fb_ms=fb,
          fb_tflops=None if is_fwd else 3.5 * fl / fb * 1e-9,
          useful_pairs=pairs,
          check=dict(errors={}, ok=True, ran=key[4:]),
        )
      )
  return rows


PROGRESS = [
  {
    "mode": "hog",
    "shape": "gptoss",
    "kind": "bwd",
    "plan": "onepass64",
    "ran": "onepass64",
    "k": 0,
    "status": "ok",
    "ms": 1.2,
    "err_dq": 1e-3,
  },
  {
    "mode": "hog",
    "shape": "gptoss",
    "kind": "bwd",
    "plan": "onepass64",
    "ran": "onepass64",
    "k": 66,
    "status": "WRONG",
    "finished": "after_hog",
    "ms": 900.0,
    "hog_sms": 66,
    "bitwise_vs_alone": 1,
    "ran_under_hog": "onepass64",
  },
  {
    "mode": "green",
    "sms": 8,
    "shape": "gptoss",
    "kind": "bwd",
    "plan": "onepass64",
    "status": "refused",
    "error": "SA_ERR_UNSUPPORTED onepass64",
  },
  {
    "mode": "green",
    "sms": 16,
    "shape": "gptoss",
    "kind": "fwd",
    "plan": "default",
    "running": "default",
    "status": "HANG",
    "waited_s": 8.0,
  },
  {"args": "green gptoss 8 bwd twopass", "status": "KILLED", "rc": 124},
  {
    "mode": "coop",
    "ctx": "device",
    "launch": "cooperative",
    "grid": 132,
    "hog_k": 66,
    "launch_status": "no error",
    "sync_status": "no error",
    "ctas_started_before_hog_end": 66,
    "barrier_timeouts": 0,
    "start_spread_ms": 1.0,
    "first_start_vs_hog_end_ms": 0.0,
    "hog_deadline_vs_end_ms": 0.0,
  },
]


def write(d, kb=None, sg=None, pg=None):
  if kb is not None:
    (d / "kernel_bench.json").write_text(json.dumps(kb, indent=1))
  if sg is not None:
    (d / "segments.json").write_text(json.dumps(sg, indent=1))
  if pg is not None:
    (d / "progress.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pg))


def run(d, capsys):
  assert perf_tables.main([str(d)]) == 0
  return capsys.readouterr().out


def test_the_writers_read_the_synthetic_files(capsys):
  """The synthetic rows are in the writers' formats: their own summaries read them without a missing key."""
  import kernel_bench
  import segments_bench

  copy = 4.0e12
  rows = [kernel_row(False), kernel_row(True, cudnn=False, jax=False)]
  decode = [decode_row("split", True, copy), decode_row("pipe", False, copy)]
  kernel_bench.table(rows, decode, copy)
  assert "2 rows" in kernel_bench.digest(rows, decode)
  segments_bench.summary(segment_rows())
  assert "of dense" in capsys.readouterr().out


def test_progress_keys_are_the_ones_gpu_progress_prints():
  names = ("gpu_progress.cu", "gpu_hog.cuh", "gpu_progress.sh")
  src = "".join(open(os.path.join(ROOT, "bench", f)).read() for f in names)
  printed = set(re.findall(r'\\"(\w+)\\":', src))
  for p in PROGRESS:
    assert set(p) <= printed, set(p) - printed
  for status in ("ok", "WRONG", "refused", "HANG", "ERROR", "KILLED", "before_hog_deadline", "after_hog"):
    assert '\\"%s\\"' % status in src or '"%s"' % status in src, status


def test_every_table_from_a_whole_run(tmp_path, capsys):
  copy = 4.0e12
  kb = dict(
    meta=dict(META, copy_GBps=copy * 1e-9),
    rows=[kernel_row(False), kernel_row(True, window=[127, 0])],
    decode=[decode_row("split", True, copy), decode_row("pipe", False, copy)],
  )
  write(tmp_path, kb, dict(meta=META, rows=segment_rows()), PROGRESS)
  out = run(tmp_path, capsys)
  for title in (
    "Kernel level, forward",
    "Kernel level, forward+backward",
    "JAX end to end",
    "Decode",
    "Packed sequences",
    "Progress under contention",
    "Cooperative launch",
  ):
    assert "## " + title in out or title + ":" in out, title
  assert "commit 0123456789ab, NVIDIA H200, driver 580.159.04, torch 2.9.0" in out and "jaxlib 0.11.2" in out
  assert "B16 T1024 N32/32 H64 causal window (127, 0)" in out
  # cuDNN 4.4 ms over ours 4.0 in every round; A/A ours 1.01; TFLOP/s 2e12 / 4 ms = 500
  assert "| 500 | 455 | 1.100 [1.100, 1.100] | 1.010 [1.010, 1.010] | 1.000 [1.000, 1.000] |" in out
  assert "| 1.100 [1.100, 1.100] |" in out.split("## JAX")[1]  # jax.nn cuDNN 5.5 over ours 5.0
  d = decode_row("split", True, copy)
  assert "| split * |" in out and "| %.0f | %.1f |" % (d["GBps"], 100 * d["of_copy"]) in out
  # 4 documents: default fwd 1.0 + fastest bwd 3.0 ms against the dense 2.0 + 5.0 ms, in useful pairs
  fb4 = 3.5 * 4 * 64 * 64 * (4 * 1024 * 1025 // 2) / 4.0 * 1e-9
  fbd = 3.5 * 4 * 64 * 64 * (4096 * 4097 // 2) / 7.0 * 1e-9
  assert (
    "| T4096 H64 | 4 | 1.000 | 0.900 (hopper.seg) | 3.000 | 3.000 (default) | %.0f | %.0f | ok |"
    % (fb4, 100 * fb4 / fbd)
    in out
  )
  prog = out.split("## Progress")[1]
  assert "2 of 6 records ok or refused" in prog
  assert "| hog | gptoss bwd | onepass64 | alone | yes | yes |" in prog
  assert "| hog | gptoss bwd | onepass64 | hog on 66 SMs | only after the hog | no |" in prog
  assert "| green | gptoss bwd | onepass64 | green, 8 SMs | refused by name | - |" in prog
  assert "no (hang)" in prog and "no (killed, rc 124)" in prog


@pytest.mark.parametrize("missing", ["kernel", "segments", "progress"])
def test_a_missing_file_prints_not_measured(tmp_path, capsys, missing):
  kb = dict(meta=META, rows=[kernel_row(False)], decode=[])
  write(
    tmp_path,
    None if missing == "kernel" else kb,
    None if missing == "segments" else dict(meta=META, rows=[]),
    None if missing == "progress" else PROGRESS,
  )
  out = run(tmp_path, capsys)
  name = dict(kernel="kernel_bench.json", segments="segments.json", progress="progress.jsonl")[missing]
  assert "not measured (no %s)" % name in out
  assert out.count("## ") >= 5


def test_a_missing_contender_prints_not_measured(tmp_path, capsys):
  kb = dict(meta=META, rows=[kernel_row(True, cudnn=False, jax=False)], decode=[])
  write(tmp_path, kb)
  out = run(tmp_path, capsys)
  fwd = out.split("## Kernel level, forward\n")[1].split("##")[0]
  assert "| 500 | not measured (cuDNN refused the graph) | not measured | 1.010 [1.010, 1.010] | not measured |" in fwd
  assert "not measured | not measured | not measured | not run: --budget 225 s spent |" in out
  assert "## Decode" in out and "not measured (no decode rows)" in out


def test_a_partial_file_is_not_measured_and_names_follow_the_scripts_defaults(tmp_path, capsys):
  (tmp_path / "kernel_bench-0123456.json").write_text('{"meta": {"commit": "0123')  # cut mid-write
  write(tmp_path, None, dict(meta=META, rows=segment_rows()))
  (tmp_path / "segments.json").rename(tmp_path / "segments-0123456.json")
  out = run(tmp_path, capsys)
  assert "not measured (no kernel_bench.json)" in out and "| T4096 H64 | dense |" in out
