"""bench/gpu_timing.py: how the GPU benchmarks time a kernel-level contender (bench/kernel_bench.py,
bench/segments_bench.py), on PyTorch's current stream.

- Rotation: every contender cycles over R input/output sets, R = max(2, ceil(3 x L2 / bytes of one set)), so a
  call never finds its operands in the 60 MB L2 where a model's layer would not (the previous benchmark reused one
  set: gpt-oss's 8 MB of K / V stayed in L2).
- A round times each contender once, in an order rotated by one each round (round r starts with contender r mod
  n), as one batch of n calls between two CUDA events; the batch waits behind a GPU sleep long enough for the host
  to queue all n calls, so the interval is the GPU's time for n back-to-back calls, not the host's launch rate
  (the blocking-kernel method of NVIDIA's nvbench). Figure of a round: interval / n.
- A/A: the callers register every contender twice (instances a and b at different places in the order); the
  b / a ratios per round show the bias of position and the noise.
- Medians over >= 5 rounds, with the per-round range; ratios paired per round (same round, same clocks).
"""

import math
import statistics

L2_FALLBACK = 60 << 20  # the H200's L2, when the device does not say
SETS_MAX = 32


def rotation(set_bytes, l2_bytes):
  """How many input/output sets a contender cycles over so that none is still in L2 when its turn comes."""
  return max(2, min(SETS_MAX, math.ceil(3 * l2_bytes / max(set_bytes, 1))))


def l2_bytes(torch):
  return getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or L2_FALLBACK


class Contender:
  """`call(i)` runs one call on set i (0 <= i < sets) on torch's current stream."""

  def __init__(self, name, call, sets):
    self.name, self.call, self.sets, self.next = name, call, sets, 0

  def run(self, n):
    for _ in range(n):
      self.call(self.next)
      self.next = (self.next + 1) % self.sets


class Timer:
  """CUDA-event timing of contenders in rotated rounds (module docstring)."""

  def __init__(self, torch):
    self.t = torch
    sleep = getattr(torch.cuda, "_sleep", None)  # PyTorch's spin kernel; without it the batch is not gated
    self.sleep = sleep
    self.cycles_per_ms = self._calibrate() if sleep else 0.0

  def _calibrate(self):
    t = self.t
    a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
    self.sleep(1000)
    a.record()
    self.sleep(2_000_000)
    b.record()
    t.cuda.synchronize()
    return 2_000_000 / max(a.elapsed_time(b), 1e-3)

  def gate(self, ms):
    if self.sleep:
      self.sleep(int(ms * self.cycles_per_ms))

  def batch_ms(self, c, n, gate_ms):
    t = self.t
    a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
    self.gate(gate_ms)
    a.record()
    c.run(n)
    b.record()
    t.cuda.synchronize()
    return a.elapsed_time(b) / n

  def rounds(self, contenders, rounds=5, target_ms=10.0, min_calls=2, max_calls=200):
    """{name: [ms per call, one per round]}. Each contender is warmed up over its whole rotation first, then its
    batch size is set so that a batch lasts about target_ms."""
    calls = {}
    for c in contenders:
      c.run(c.sets)
      self.t.cuda.synchronize()
      est = self.batch_ms(c, c.sets, 5.0)
      calls[c.name] = max(min_calls, min(max_calls, math.ceil(target_ms / max(est, 1e-4))))
    out = {c.name: [] for c in contenders}
    for r in range(rounds):
      j = r % len(contenders)
      for c in contenders[j:] + contenders[:j]:
        n = calls[c.name]
        # the host queues about 30-60 us a call (ctypes, cudnn-frontend's execute): the gate covers 100 us a call
        out[c.name].append(self.batch_ms(c, n, 2.0 + 0.1 * n))
    return out


def stats(samples):
  """Median and per-round range of one contender's figures."""
  return dict(
    median=statistics.median(samples),
    min=min(samples),
    max=max(samples),
    rounds=len(samples),
    samples=[round(x, 5) for x in samples],
  )


def paired(num, den):
  """Ratios num[r] / den[r] of the same rounds: median and range."""
  r = [a / b for a, b in zip(num, den)]
  return dict(median=statistics.median(r), min=min(r), max=max(r))


def copy_bandwidth(torch, nbytes=2 << 30, reps=10):
  """Device-to-device copy bandwidth (bytes read + bytes written per second) of an nbytes buffer, median."""
  src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
  dst = torch.empty_like(src)
  dst.copy_(src)
  torch.cuda.synchronize()
  ts = []
  for _ in range(reps):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    dst.copy_(src)
    b.record()
    torch.cuda.synchronize()
    ts.append(a.elapsed_time(b))
  del src, dst
  return 2 * nbytes / (statistics.median(ts) * 1e-3)
