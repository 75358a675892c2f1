"""GPU decode benchmark (H200), self-contained: build, test, then time decode_attention against copy bandwidth.

Run from the repository root on the GPU machine (no package registry needed):
    python3 bench/decode_bench.py            # cmake build (CUDA + FFI) in build-gpu, tests, bench
    python3 bench/decode_bench.py --no-build # reuse build-gpu
Steps: 1. cmake -S . -B build-gpu (CUDA, FFI against the installed jax) and build; 2. build-gpu/test_decode
(CUDA decode vs the fp64 reference), with the default kernels and again with SINKATTN_CUDA_DECODE=register
(the register split kernel on the pipeline kernel's shapes too), and pytest tests/test_decode.py (its gpu
test included); 3. for B in {1, 8, 64}, S in {4k, 32k, 128k}, gpt-oss shape (N/K = 64/8, H = 64, bf16, one
token, learnable sinks), plus H = 128 with N/K = 64/8 and 32/8, the time per call (20 calls queued per sync,
median of 5) of the pipeline kernel ("pipe", the default) and of the register kernel ("reg"), bytes moved =
K and V cache + q + out, against the device-to-device copy bandwidth of a 2 GiB bf16 array measured in the
same run (read + write bytes).
Results: bench/results/decode_<gpu>.json, stamped with the commit, GPU and versions.
"""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build-gpu")


def sh(cmd, **kw):
  print("+", " ".join(cmd), flush=True)
  subprocess.run(cmd, check=True, cwd=ROOT, **kw)


def build_and_test():
  sh(["cmake", "-S", ".", "-B", BUILD, "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_CUDA_ARCHITECTURES=90a",
      f"-DPython_EXECUTABLE={sys.executable}"])
  sh(["cmake", "--build", BUILD, "-j", str(os.cpu_count() or 4)])
  sh([os.path.join(BUILD, "test_decode")])
  sh([os.path.join(BUILD, "test_decode")], env=dict(os.environ, SINKATTN_CUDA_DECODE="register"))
  env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"),
             SINKATTN_LIBRARY=os.path.join(BUILD, "libsinkattn_jax.so"))
  sh([sys.executable, "-m", "pytest", "-q", "tests/test_decode.py"], env=env)


def per_call(f, *args, calls=20, reps=5):
  jax = sys.modules["jax"]
  jax.block_until_ready(f(*args))
  ts = []
  for _ in range(reps):
    t0 = time.perf_counter()
    outs = [f(*args) for _ in range(calls)]
    jax.block_until_ready(outs)
    ts.append((time.perf_counter() - t0) / calls)
  return sorted(ts)[len(ts) // 2]


def bench():
  os.environ.setdefault("SINKATTN_LIBRARY", os.path.join(BUILD, "libsinkattn_jax.so"))
  sys.path.insert(0, os.path.join(ROOT, "python"))
  import jax
  import jax.numpy as jnp
  import sinkattn

  dev = jax.devices("gpu")[0]
  x = jnp.ones((1 << 30,), jnp.bfloat16)  # 2 GiB
  copy = jax.jit(lambda a: a + jnp.bfloat16(1))
  copy_gbps = 2 * x.nbytes / per_call(copy, x) / 1e9
  del x
  print(f"{dev.device_kind}: copy bandwidth {copy_gbps:.0f} GB/s (read + write)")
  shapes = [(B, S, 64, 8, 64) for B in (1, 8, 64) for S in (4096, 32768, 131072)]
  shapes += [(8, 32768, 64, 8, 128), (8, 32768, 32, 8, 128), (64, 32768, 32, 8, 128)]
  rows = []
  for B, S, N, K, H in shapes:
    ks = jax.random.split(jax.random.PRNGKey(B * S), 4)
    q = jax.random.normal(ks[0], (B, 1, N, H), jnp.bfloat16)
    kc = jax.random.normal(ks[1], (B, S, K, H), jnp.bfloat16)
    vc = jax.random.normal(ks[2], (B, S, K, H), jnp.bfloat16)
    sinks = jax.random.uniform(ks[3], (N,), minval=-10, maxval=10)
    lens = jnp.full((B,), S, jnp.int32)
    f = jax.jit(lambda q, k, v, l, s: sinkattn.decode_attention(q, k, v, l, s, implementation="fused"))
    nbytes = kc.nbytes + vc.nbytes + 2 * q.nbytes
    for kernel in ("pipe", "reg"):
      # read by the C library at each call: the same compiled function runs either split kernel
      os.environ["SINKATTN_CUDA_DECODE"] = "register" if kernel == "reg" else "default"
      t = per_call(f, q, kc, vc, lens, sinks)
      gbps = nbytes / t / 1e9
      rows.append(dict(kernel=kernel, B=B, S=S, N=N, K=K, H=H, ms=t * 1e3, bytes=nbytes, GBps=gbps,
                       of_copy=gbps / copy_gbps))
      print(f"{kernel:4s} B={B:3d} S={S:7d} N/K={N}/{K} H={H:3d}: {t * 1e3:8.3f} ms  {gbps:7.0f} GB/s  "
            f"{100 * gbps / copy_gbps:5.1f}% of copy", flush=True)
    os.environ.pop("SINKATTN_CUDA_DECODE")
    del q, kc, vc
  commit = os.environ.get("SINKATTN_COMMIT") or subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT,
                                                                capture_output=True, text=True).stdout.strip()
  out = dict(commit=commit, gpu=dev.device_kind, jax=jax.__version__, copy_GBps=copy_gbps, dtype="bfloat16",
             Tq=1, softmax="learnable", rows=rows)
  path = os.path.join(ROOT, "bench", "results", "decode_%s.json" % dev.device_kind.replace(" ", "_"))
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as fh:
    json.dump(out, fh, indent=1)
  print("wrote", path)


if __name__ == "__main__":
  if "--no-build" not in sys.argv:
    build_and_test()
  bench()
