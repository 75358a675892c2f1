"""cuda_bench.py — the CUDA backend against cuDNN (vanilla, through jax.nn.dot_product_attention(
implementation='cudnn'), the targets' reference, and through PyTorch SDPA) and the unfused jnp sink attention
(through JAX), on the GPU test machine, over the grid of shared/notes/performance.md. Calls libsinkattn.so
directly through ctypes on PyTorch tensors (so it needs neither the FFI handlers nor an installed package),
times our kernels and torch with CUDA events (JAX: host clock around block_until_ready, 20 calls queued per
sync), checks our output against PyTorch fp32 math first, and writes one JSON with the git commit, GPU and
versions. (Commit b39f7a3 of this script also timed the kernel variants of bench/results/h200-cuda-v2-variants.json.)

usage: python3 bench/cuda_bench.py LIBSINKATTN.so OUT.json [quick]
"""
import ctypes
import json
import math
import subprocess
import sys
import time

import torch

LIB = ctypes.CDLL(sys.argv[1])
P, I64, F32, I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int


class Attn(ctypes.Structure):  # mirrors sa_attn in include/sinkattn.h
    _fields_ = [("dtype", I32), ("batch", I64), ("q_len", I64), ("kv_len", I64), ("q_heads", I64),
                ("kv_heads", I64), ("head_dim", I64), ("v_head_dim", I64), ("q", P), ("k", P), ("v", P),
                ("sinks", P), ("q_lens", P), ("kv_lens", P), ("q_segment_ids", P), ("kv_segment_ids", P),
                ("scale", F32), ("softmax", I32), ("causal", I32), ("window_left", I64), ("window_right", I64),
                ("out", P), ("lse", P), ("diag_offset", I64)]


class Grad(ctypes.Structure):  # mirrors sa_attn_grad
    _fields_ = [("dout", P), ("dlse", P), ("dq", P), ("dk", P), ("dv", P), ("dsinks", P), ("deterministic", I32)]


LIB.sa_attn_fwd.argtypes = [ctypes.POINTER(Attn), I32, P]
LIB.sa_attn_bwd.argtypes = [ctypes.POINTER(Attn), ctypes.POINTER(Grad), P, ctypes.c_size_t, I32, P]
LIB.sa_attn_bwd_workspace_size.argtypes = [ctypes.POINTER(Attn), I32]
LIB.sa_attn_bwd_workspace_size.restype = ctypes.c_size_t
LIB.sa_last_error.restype = ctypes.c_char_p
CUDA = 3


def flops(B, T, S, N, H, causal, window):
    pairs = T * S
    if window is not None:
        pairs = sum(min(i + 1, window[0] + 1) for i in range(T))
    elif causal:
        pairs = T * (T + 1) // 2
    return 4.0 * B * N * pairs * H


class Ours:
    def __init__(self, q, k, v, sinks, causal, window, deterministic=1):
        B, T, N, H = q.shape
        S, K = k.shape[1], k.shape[2]
        self.out = torch.empty_like(q)
        self.lse = torch.empty(B, N, T, device=q.device, dtype=torch.float32)
        self.a = Attn(dtype=2, batch=B, q_len=T, kv_len=S, q_heads=N, kv_heads=K, head_dim=H, v_head_dim=H,
                      q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), sinks=sinks.data_ptr(), scale=0.0,
                      softmax=2, causal=1 if causal else 0, window_left=window[0] if window else -1,
                      window_right=window[1] if window else -1, out=self.out.data_ptr(),
                      lse=self.lse.data_ptr())
        self.dout = torch.randn_like(q)
        self.dq, self.dk, self.dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self.dsinks = torch.empty_like(sinks)
        self.g = Grad(dout=self.dout.data_ptr(), dq=self.dq.data_ptr(), dk=self.dk.data_ptr(),
                      dv=self.dv.data_ptr(), dsinks=self.dsinks.data_ptr(), deterministic=deterministic)
        ws = LIB.sa_attn_bwd_workspace_size(ctypes.byref(self.a), CUDA)
        self.ws = torch.empty(max(ws, 16), dtype=torch.uint8, device=q.device)
        self.wsn = ws

    def fwd(self):
        s = LIB.sa_attn_fwd(ctypes.byref(self.a), CUDA, P(torch.cuda.current_stream().cuda_stream))
        if s:
            raise RuntimeError(LIB.sa_last_error().decode())

    def bwd(self):
        s = LIB.sa_attn_bwd(ctypes.byref(self.a), ctypes.byref(self.g), self.ws.data_ptr(), self.wsn, CUDA,
                            P(torch.cuda.current_stream().cuda_stream))
        if s:
            raise RuntimeError(LIB.sa_last_error().decode())


def cuda_ms(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def check(q, k, v, sinks, causal, window, o):
    """fp32 torch math on a slice (first batch, first 2 heads) against our output."""
    qf, kf, vf = q[:1, :, :2].float(), k[:1].float(), v[:1].float()
    G = q.shape[2] // k.shape[2]
    kf, vf = kf.repeat_interleave(G, 2)[:, :, :2], vf.repeat_interleave(G, 2)[:, :, :2]
    s = torch.einsum("btnh,bsnh->bnts", qf, kf) / math.sqrt(q.shape[-1])
    T, S = s.shape[-2], s.shape[-1]
    i = torch.arange(T, device=q.device)[:, None]
    j = torch.arange(S, device=q.device)[None, :]
    ok = torch.ones(T, S, dtype=torch.bool, device=q.device)
    if causal:
        ok &= j <= i
    if window:
        ok &= j >= i - window[0]
    s = s.masked_fill(~ok, -float("inf"))
    sk = sinks[:2].float()[None, :, None, None].expand(1, 2, T, 1)
    p = torch.softmax(torch.cat([s, sk], -1), -1)[..., :-1]
    ref = torch.einsum("bnts,bsnh->btnh", p, vf)
    got = o[:1, :, :2].float()
    return float((got - ref).norm() / ref.norm())


def jnp_sink_ms(B, T, S, N, K, H, causal, window):
    """The unfused attention a JAX user writes today: fp32 logits, a sink column, softmax, drop it."""
    import jax
    import jax.numpy as jnp

    def attn(q, k, v, sinks):
        G = N // K
        k, v = jnp.repeat(k, G, 2), jnp.repeat(v, G, 2)
        s = jnp.einsum("btnh,bsnh->bnts", q, k, preferred_element_type=jnp.float32) / math.sqrt(H)
        i, j = jnp.arange(T)[:, None], jnp.arange(S)[None, :]
        ok = jnp.ones((T, S), bool)
        if causal:
            ok &= j <= i
        if window:
            ok &= j >= i - window[0]
        s = jnp.where(ok, s, -jnp.inf)
        s = jnp.concatenate([s, jnp.broadcast_to(sinks[None, :, None, None], (B, N, T, 1))], -1)
        p = jax.nn.softmax(s, -1)[..., :-1].astype(q.dtype)
        return jnp.einsum("bnts,bsnh->btnh", p, v)

    kq = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(kq[0], (B, T, N, H), jnp.bfloat16)
    k = jax.random.normal(kq[1], (B, S, K, H), jnp.bfloat16)
    v = jax.random.normal(kq[2], (B, S, K, H), jnp.bfloat16)
    sk = jax.random.uniform(kq[3], (N,), jnp.float32, -10, 10)
    f = jax.jit(attn)
    fb = jax.jit(jax.grad(lambda q, k, v, s: attn(q, k, v, s).astype(jnp.float32).sum(), argnums=(0, 1, 2, 3)))
    res = []
    for fn in (f, fb):
        jax.block_until_ready(fn(q, k, v, sk))
        t0 = time.perf_counter()
        for _ in range(20):
            r = fn(q, k, v, sk)
        jax.block_until_ready(r)
        res.append((time.perf_counter() - t0) / 20 * 1e3)
    return res


def jax_cudnn_ms(B, T, S, N, K, H, causal):
    """Vanilla cuDNN through jax.nn.dot_product_attention: forward, and forward + backward (vjp)."""
    import jax
    import jax.numpy as jnp
    kq = jax.random.split(jax.random.PRNGKey(1), 4)
    q = jax.random.normal(kq[0], (B, T, N, H), jnp.bfloat16)
    k = jax.random.normal(kq[1], (B, S, K, H), jnp.bfloat16)
    v = jax.random.normal(kq[2], (B, S, K, H), jnp.bfloat16)
    do = jax.random.normal(kq[3], (B, T, N, H), jnp.bfloat16)
    attn = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")
    f = jax.jit(attn)
    fb = jax.jit(lambda q, k, v, do: jax.vjp(attn, q, k, v)[1](do))
    res = []
    for fn, args in ((f, (q, k, v)), (fb, (q, k, v, do))):
        jax.block_until_ready(fn(*args))
        t0 = time.perf_counter()
        for _ in range(20):
            r = fn(*args)
        jax.block_until_ready(r)
        res.append((time.perf_counter() - t0) / 20 * 1e3)
    return res


def cudnn_ms(q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(True) for x in (q, k, v))
    G = q.shape[2] // k.shape[2]
    if G > 1:
        kt = kt.detach().repeat_interleave(G, 1).requires_grad_(True)
        vt = vt.detach().repeat_interleave(G, 1).requires_grad_(True)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        f = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        fwd = cuda_ms(f)
        o = f()
        do = torch.randn_like(o)
        fb = cuda_ms(lambda: torch.autograd.grad(f(), (qt, kt, vt), do))
    return fwd, fb


def main():
    out_path = sys.argv[2]
    quick = len(sys.argv) > 3 and sys.argv[3] == "quick"
    grid = [(16, 1024, 32, 32, 64, False, None), (16, 1024, 32, 32, 64, True, None),
            (4, 4096, 32, 32, 64, False, None), (4, 4096, 32, 32, 64, True, None),
            (1, 16384, 32, 32, 64, False, None), (1, 16384, 32, 32, 64, True, None),
            (16, 1024, 16, 16, 128, False, None), (16, 1024, 16, 16, 128, True, None),
            (4, 4096, 16, 16, 128, False, None), (4, 4096, 16, 16, 128, True, None),
            (1, 16384, 16, 16, 128, False, None), (1, 16384, 16, 16, 128, True, None),
            (1, 4096, 64, 8, 64, True, None), (1, 4096, 64, 8, 64, True, (127, 0))]
    if quick:
        grid = [g for g in grid if g[1] == 4096]
    rows = []
    torch.manual_seed(0)
    for B, T, N, K, H, causal, window in grid:
        q = torch.randn(B, T, N, H, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, T, K, H, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, T, K, H, device="cuda", dtype=torch.bfloat16)
        sinks = (torch.rand(N, device="cuda") * 20 - 10).float()
        fl = flops(B, T, T, N, H, causal, window)
        ours = Ours(q, k, v, sinks, causal, window)
        ours.fwd()
        torch.cuda.synchronize()
        err = check(q, k, v, sinks, causal, window, ours.out)
        f_ms = cuda_ms(ours.fwd)
        fb_ms = cuda_ms(lambda: (ours.fwd(), ours.bwd()))
        del ours
        row = dict(B=B, T=T, N=N, K=K, H=H, causal=causal, window=window, rel_err=err, ours_fwd_ms=f_ms,
                   ours_fb_ms=fb_ms, ours_fwd_tflops=fl / f_ms / 1e9, ours_fb_tflops=3.5 * fl / fb_ms / 1e9)
        if window is None:
            try:
                c_f, c_fb = jax_cudnn_ms(B, T, T, N, K, H, causal)
                row.update(jax_cudnn_fwd_ms=c_f, jax_cudnn_fb_ms=c_fb, fwd_vs_cudnn=c_f / f_ms, fb_vs_cudnn=c_fb / fb_ms)
            except Exception as e:
                row.update(jax_cudnn_error=str(e)[:200])
            try:
                c_f, c_fb = cudnn_ms(q, k, v, causal)
                row.update(torch_cudnn_fwd_ms=c_f, torch_cudnn_fb_ms=c_fb, fwd_vs_torch_cudnn=c_f / f_ms,
                           fb_vs_torch_cudnn=c_fb / fb_ms)
            except Exception as e:  # cuDNN may refuse a shape; the row says so
                row.update(torch_cudnn_error=str(e)[:200])
        if not quick:
            try:
                j_f, j_fb = jnp_sink_ms(B, T, T, N, K, H, causal, window)
                row.update(jnp_fwd_ms=j_f, jnp_fb_ms=j_fb, fwd_vs_jnp=j_f / f_ms, fb_vs_jnp=j_fb / fb_ms)
            except Exception as e:
                row.update(jnp_error=str(e)[:200])
        rows.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    import jax
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, jax=jax.__version__,
                commit=subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
                timing="CUDA events, median of 20 after 3 warm-ups; JAX: host clock, 20 calls per sync",
                flops="fwd 4*B*N*pairs*H, fwd+bwd 3.5x fwd", ours="learnable sinks; f+b = fwd + bwd (deterministic = 1)",
                cudnn="vanilla (no sinks); fwd_vs_cudnn / fb_vs_cudnn against jax.nn.dot_product_attention")
    with open(out_path, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print(f"{'shape':32} {'err':>7} {'fwd TF':>6} {'f+b TF':>6} {'xcuDNN f':>8} {'xcuDNN fb':>9} {'xjnp f':>6} "
          f"{'xjnp fb':>7}")
    for r in rows:
        name = f"B{r['B']} T{r['T']} N{r['N']}/{r['K']} H{r['H']} {'c' if r['causal'] else 'nc'} {r['window'] or ''}"
        print(f"{name:32} {r['rel_err']:7.1e} {r['ours_fwd_tflops']:6.0f} {r['ours_fb_tflops']:6.0f} "
              f"{r.get('fwd_vs_cudnn', float('nan')):8.2f} {r.get('fb_vs_cudnn', float('nan')):9.2f} "
              f"{r.get('fwd_vs_jnp', float('nan')):6.1f} {r.get('fb_vs_jnp', float('nan')):7.1f}")


if __name__ == "__main__":
    main()
