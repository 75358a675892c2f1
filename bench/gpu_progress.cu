/*
 * gpu_progress.cu — do the persistent and semaphore-ordered plans finish, correctly, when they do not have the
 * whole GPU to themselves? The one-pass backwards order their dQ adds with per-tile semaphores whose progress
 * argument assumes that the CTAs of a head are co-resident; on a shared GPU (another stream's kernels, NCCL,
 * MPS, green contexts) that need not hold, and a wait on work no resident CTA will do is a hang.
 *
 *   gpu_progress list SHAPE                 the plans of SHAPE this program targets ("fwd NAME" / "bwd NAME")
 *   gpu_progress hog SHAPE                  every target plan while a HOG kernel on another stream holds k SMs
 *                                           (k = 1, 33, 66, 131: one CTA per SM by taking the most shared memory,
 *                                           spinning on %globaltimer until a deadline or a host flag)
 *   gpu_progress green SHAPE NSM KIND PLAN  one plan (KIND fwd | bwd; "default": the library's choice there)
 *                                           inside a green context of NSM SMs; a forced plan the context makes
 *                                           illegal is "refused" (SA_ERR_UNSUPPORTED naming it), not a failure
 *   gpu_progress coop                       cooperative-launch semantics: a grid-barrier kernel of one CTA per
 *                                           SM launched (cooperative, then plain) while the hog holds k SMs
 *   gpu_progress coop-green NSM             the same kernel, cooperative, inside a green context of NSM SMs
 * SHAPE: h128_t16k_causal (B1 T16384 N16/16 H128 causal: 128 key blocks a head), gptoss (B1 T4096 N64/8 H64
 * causal), h128_t4k (B4 T4096 N16/16 H128). bf16, learnable sinks U(-10, 10) with heads 0 / 1 at +50 / -50.
 *
 * Each case prints "PROGRESS {json}": status ok (finished, within the tolerances of the reference plan, a plan
 * named portable or two-pass run on the same inputs, and under the hog bitwise equal to the same plan run
 * alone) or WRONG; "finished": before the hog's deadline (it ran beside the hog) or after_hog (it waited for the
 * hog's SMs: a cooperative launch starts only when every CTA fits, the plain one pass stalls on CTAs not yet
 * resident); its time and errors. A call that has not finished 10 s after the hog's deadline (8 s after its
 * launch in a green context) is a hang: the program prints it and exits at once with status 3 (the caller runs
 * the next case in a new process). Exit 1: a wrong result or an error status; 0: every case finished and
 * matched.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "gpu_hog.cuh"
#include "sa_plan.h"
#include "sinkattn.h"

/* ---- plans ---------------------------------------------------------------------------------------------- */
enum { KIND_FWD = SA_PLAN_FWD, KIND_BWD = SA_PLAN_BWD };

static int plans(const sa_attn *a, int kind, const char **names, int max) {
  int n = sa_plan_list(a, kind, SA_BACKEND_CUDA, names, max);
  if (n <= 0) {
    printf("PROGRESS {\"fatal\":\"no legal %s plan: %s\"}\n", kind ? "bwd" : "fwd", sa_last_error());
    exit(2);
  }
  return n < max ? n : max;
}
/* "default" clears the forced plan: the library's own choice. */
static void plan_force(int kind, const char *name) {
  if (sa_plan_force(kind, strcmp(name, "default") ? name : NULL) != SA_OK) {
    printf("PROGRESS {\"fatal\":\"sa_plan_force %s: %s\"}\n", name, sa_last_error());
    exit(2);
  }
}
static const char *plan_ran(int kind) { return sa_plan_last(kind); }
/* A target: a persistent grid or an ordering between CTAs. The reference: portable or two-pass kernels. */
static int plan_is_target(const char *n) {
  static const char *w[] = {"persistent", "onepass"};
  for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
    if (strstr(n, w[i])) return 1;
  return 0;
}
static const char *plan_reference(const char **names, int n) {
  static const char *w[] = {"portable", "twopass"};
  for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
    for (int j = 0; j < n; j++)
      if (strstr(names[j], w[i])) return names[j];
  for (int j = n - 1; j >= 0; j--)
    if (!plan_is_target(names[j])) return names[j];
  return names[0];
}

/* ---- the problem ---------------------------------------------------------------------------------------- */
/* bf16 values from a hash of (seed, index): U(-2, 2) (k: U(-4, 4), so rows are peaked), the range test_cuda uses. */
__global__ void fill_kernel(uint16_t *x, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + i;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    float f = scale * ((float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f);
    uint32_t u = __float_as_uint(f);
    x[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}
static float bf2f(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

struct shape {
  const char *name;
  int64_t B, T, N, K, H;
  sa_causal causal;
};
static const shape shapes[] = {
    {"h128_t16k_causal", 1, 16384, 16, 16, 128, SA_CAUSAL_TOP_LEFT},
    {"gptoss", 1, 4096, 64, 8, 64, SA_CAUSAL_TOP_LEFT},
    {"h128_t4k", 4, 4096, 16, 16, 128, SA_CAUSAL_NONE},
};

/* The buffers of one problem: inputs, the outputs of the case being run, and the reference plan's. */
struct problem {
  const shape *s;
  sa_attn a;
  sa_attn_grad g;
  size_t nq, nk, nl;
  void *q, *k, *v, *dout, *ws;
  float *sinks;
  size_t wsn;
  void *out[2], *dq[2], *dk[2], *dv[2]; /* [0]: the case, [1]: the reference */
  float *lse[2], *ds[2];
};

static void *dalloc(size_t bytes) {
  void *p;
  CK(cudaMalloc(&p, bytes));
  return p;
}

static void problem_init(problem *p, const shape *s, cudaStream_t st) {
  p->s = s;
  p->nq = s->B * s->T * s->N * s->H;
  p->nk = s->B * s->T * s->K * s->H;
  p->nl = s->B * s->N * s->T;
  p->q = dalloc(p->nq * 2);
  p->k = dalloc(p->nk * 2);
  p->v = dalloc(p->nk * 2);
  p->dout = dalloc(p->nq * 2);
  fill_kernel<<<264, 256, 0, st>>>((uint16_t *)p->q, p->nq, 1, 2.0f);
  fill_kernel<<<264, 256, 0, st>>>((uint16_t *)p->k, p->nk, 2, 4.0f);
  fill_kernel<<<264, 256, 0, st>>>((uint16_t *)p->v, p->nk, 3, 1.0f);
  fill_kernel<<<264, 256, 0, st>>>((uint16_t *)p->dout, p->nq, 4, 1.0f);
  CK(cudaGetLastError());
  std::vector<float> sk(s->N);
  uint64_t z = 12345;
  for (int64_t n = 0; n < s->N; n++) {
    z = z * 6364136223846793005ull + 1442695040888963407ull;
    sk[n] = (float)((double)(z >> 11) / 9007199254740992.0 * 20.0 - 10.0);
  }
  sk[0] = 50.0f;
  sk[1] = -50.0f;
  p->sinks = (float *)dalloc(s->N * 4);
  CK(cudaMemcpy(p->sinks, sk.data(), s->N * 4, cudaMemcpyHostToDevice));
  for (int i = 0; i < 2; i++) {
    p->out[i] = dalloc(p->nq * 2);
    p->lse[i] = (float *)dalloc(p->nl * 4);
    p->dq[i] = dalloc(p->nq * 2);
    p->dk[i] = dalloc(p->nk * 2);
    p->dv[i] = dalloc(p->nk * 2);
    p->ds[i] = (float *)dalloc(s->N * 4);
  }
  sa_attn_init(&p->a);
  sa_attn *a = &p->a;
  a->dtype = SA_BF16;
  a->batch = s->B;
  a->q_len = s->T;
  a->kv_len = s->T;
  a->q_heads = s->N;
  a->kv_heads = s->K;
  a->head_dim = s->H;
  a->v_head_dim = s->H;
  a->q = p->q;
  a->k = p->k;
  a->v = p->v;
  a->sinks = p->sinks;
  a->softmax = SA_SOFTMAX_LEARNABLE;
  a->causal = s->causal;
  a->out = p->out[1];
  a->lse = p->lse[1];
  memset(&p->g, 0, sizeof p->g);
  p->g.dout = p->dout;
  /* the largest workspace any backward plan asks */
  const char *names[64];
  int n = plans(a, KIND_BWD, names, 64);
  p->wsn = 16;
  for (int i = 0; i < n; i++) {
    plan_force(KIND_BWD, names[i]);
    size_t w = sa_attn_bwd_workspace_size(a, SA_BACKEND_CUDA);
    if (w > p->wsn) p->wsn = w;
  }
  plan_force(KIND_BWD, "default");
  p->ws = dalloc(p->wsn);
  CK(cudaStreamSynchronize(st));
}

/* Launches one call of `plan` (its outputs: slot 0 the case, 1 the reference; the backward always reads the
   reference forward's out and lse) after poisoning its outputs with NaN. Returns the library's status. */
static sa_status launch(problem *p, int kind, const char *plan, int slot, cudaStream_t st) {
  sa_attn a = p->a;
  plan_force(kind, plan);
  sa_status r;
  if (kind == KIND_FWD) {
    a.out = p->out[slot];
    a.lse = p->lse[slot];
    CK(cudaMemsetAsync(a.out, 0xff, p->nq * 2, st));
    CK(cudaMemsetAsync(a.lse, 0xff, p->nl * 4, st));
    r = sa_attn_fwd(&a, SA_BACKEND_CUDA, st);
  } else {
    sa_attn_grad g = p->g;
    g.dq = p->dq[slot];
    g.dk = p->dk[slot];
    g.dv = p->dv[slot];
    g.dsinks = p->ds[slot];
    CK(cudaMemsetAsync(g.dq, 0xff, p->nq * 2, st));
    CK(cudaMemsetAsync(g.dk, 0xff, p->nk * 2, st));
    CK(cudaMemsetAsync(g.dv, 0xff, p->nk * 2, st));
    CK(cudaMemsetAsync(g.dsinks, 0xff, p->s->N * 4, st));
    r = sa_attn_bwd(&a, &g, p->ws, p->wsn, SA_BACKEND_CUDA, st);
  }
  plan_force(kind, "default");
  return r;
}

/* Relative Frobenius error of slot 0 against slot 1 (bf16 or fp32 buffers); NaN anywhere counts as infinite. */
static double rel_err(const void *x, const void *r, size_t n, int f32) {
  std::vector<uint16_t> a16, b16;
  std::vector<float> a32, b32;
  double num = 0, den = 0;
  if (f32) {
    a32.resize(n);
    b32.resize(n);
    CK(cudaMemcpy(a32.data(), x, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b32.data(), r, n * 4, cudaMemcpyDeviceToHost));
  } else {
    a16.resize(n);
    b16.resize(n);
    CK(cudaMemcpy(a16.data(), x, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b16.data(), r, n * 2, cudaMemcpyDeviceToHost));
  }
  for (size_t i = 0; i < n; i++) {
    double a = f32 ? a32[i] : bf2f(a16[i]), b = f32 ? b32[i] : bf2f(b16[i]);
    if (!isfinite(a) || !isfinite(b)) return INFINITY;
    num += (a - b) * (a - b);
    den += b * b;
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int same_bytes(const void *x, const void *y, size_t bytes) {
  std::vector<char> a(bytes), b(bytes);
  CK(cudaMemcpy(a.data(), x, bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(b.data(), y, bytes, cudaMemcpyDeviceToHost));
  return memcmp(a.data(), b.data(), bytes) == 0;
}

/* Errors of the case (slot 0) against the reference (slot 1), printed as JSON fields; 1 when within the
   tolerances of two bf16 kernels against each other (each ~2e-3 from fp64 at these shapes: out 1e-2, dq / dk /
   dv 2e-2, lse and dsinks (fp32) 1e-3 / 1e-2). */
static int compare(problem *p, int kind, char *buf, size_t n) {
  if (kind == KIND_FWD) {
    double eo = rel_err(p->out[0], p->out[1], p->nq, 0), el = rel_err(p->lse[0], p->lse[1], p->nl, 1);
    snprintf(buf, n, "\"err_out\":%.3g,\"err_lse\":%.3g", eo, el);
    return eo <= 1e-2 && el <= 1e-3;
  }
  double e[4] = {rel_err(p->dq[0], p->dq[1], p->nq, 0), rel_err(p->dk[0], p->dk[1], p->nk, 0),
                 rel_err(p->dv[0], p->dv[1], p->nk, 0), rel_err(p->ds[0], p->ds[1], p->s->N, 1)};
  int ds_same = same_bytes(p->ds[0], p->ds[1], p->s->N * 4);
  snprintf(buf, n, "\"err_dq\":%.3g,\"err_dk\":%.3g,\"err_dv\":%.3g,\"err_dsinks\":%.3g,\"dsinks_bitwise_vs_ref\":%d",
           e[0], e[1], e[2], e[3], ds_same);
  return e[0] <= 2e-2 && e[1] <= 2e-2 && e[2] <= 2e-2 && e[3] <= 1e-2;
}

/* A copy of slot 0's outputs (to compare a run under the hog with the same plan run alone, bitwise). */
struct snapshot {
  std::vector<char> bytes;
};
static snapshot snap(problem *p, int kind) {
  snapshot s;
  void *src[4] = {kind == KIND_FWD ? p->out[0] : p->dq[0], kind == KIND_FWD ? (void *)p->lse[0] : p->dk[0],
                  kind == KIND_FWD ? NULL : p->dv[0], kind == KIND_FWD ? NULL : (void *)p->ds[0]};
  size_t len[4] = {p->nq * 2, kind == KIND_FWD ? p->nl * 4 : p->nk * 2, p->nk * 2, (size_t)p->s->N * 4};
  for (int i = 0; i < 4; i++) {
    if (!src[i]) continue;
    size_t o = s.bytes.size();
    s.bytes.resize(o + len[i]);
    CK(cudaMemcpy(s.bytes.data() + o, src[i], len[i], cudaMemcpyDeviceToHost));
  }
  return s;
}

static const shape *shape_named(const char *name) {
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    if (!strcmp(shapes[i].name, name)) return &shapes[i];
  printf("PROGRESS {\"fatal\":\"unknown shape %s (h128_t16k_causal, gptoss, h128_t4k)\"}\n", name);
  exit(2);
}

/* Cooperative-launch probe: every CTA records its start and SM, meets the others at a grid barrier (an atomic
   count; it gives up after 2 s so that a grid that never becomes co-resident cannot hang) and records its exit. */
struct coop_rec {
  unsigned long long start, leave;
  unsigned sm, timed_out;
};
__global__ void coop_kernel(unsigned *count, coop_rec *rec) {
  extern __shared__ char smem[];
  if (threadIdx.x) return;
  smem[0] = 1;
  unsigned long long t0 = gtime();
  rec[blockIdx.x].start = t0;
  rec[blockIdx.x].sm = smid();
  atomicAdd(count, 1u);
  unsigned to = 0;
  while (atomicAdd(count, 0u) < gridDim.x) {
    if (gtime() - t0 > 2000000000ull) {
      to = 1;
      break;
    }
    __nanosleep(1000);
  }
  rec[blockIdx.x].leave = gtime();
  rec[blockIdx.x].timed_out = to;
}

static const int hog_ks[] = {1, 33, 66, 131};

/* Every target plan of the shape, alone, then under the hog for each k. */
static int mode_hog(const shape *s) {
  hog h;
  hog_init(&h);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  problem p;
  problem_init(&p, s, st);
  int bad = 0;
  for (int kind = KIND_FWD; kind <= KIND_BWD; kind++) {
    const char *names[64];
    int n = plans(&p.a, kind, names, 64);
    const char *ref = plan_reference(names, n);
    if (launch(&p, kind, ref, 1, st) != SA_OK) {
      printf("PROGRESS {\"fatal\":\"reference plan %s: %s\"}\n", ref, sa_last_error());
      return 2;
    }
    CK(cudaStreamSynchronize(st));
    for (int i = 0; i < n; i++) {
      if (!plan_is_target(names[i])) continue;
      /* alone, after a first call that loads its kernels: its time sets the hog's hold, its outputs the bitwise
         baseline */
      sa_status r = launch(&p, kind, names[i], 0, st);
      CK(cudaStreamSynchronize(st));
      double t0 = wall();
      if (r == SA_OK) r = launch(&p, kind, names[i], 0, st);
      CK(cudaStreamSynchronize(st));
      double alone = wall() - t0;
      char base[512], errs[256];
      snprintf(base, sizeof base, "\"mode\":\"hog\",\"shape\":\"%s\",\"kind\":\"%s\",\"plan\":\"%s\",\"ran\":\"%s\"",
               s->name, kind ? "bwd" : "fwd", names[i], plan_ran(kind));
      if (r != SA_OK) {
        printf("PROGRESS {%s,\"status\":\"ERROR\",\"error\":\"%s\"}\n", base, sa_last_error());
        bad = 1;
        continue;
      }
      int ok = compare(&p, kind, errs, sizeof errs);
      printf("PROGRESS {%s,\"k\":0,\"status\":\"%s\",\"ms\":%.3f,%s}\n", base, ok ? "ok" : "WRONG", alone * 1e3, errs);
      bad |= !ok;
      snapshot alone_out = snap(&p, kind);
      for (size_t ki = 0; ki < sizeof hog_ks / sizeof hog_ks[0]; ki++) {
        int k = hog_ks[ki] < h.sms ? hog_ks[ki] : h.sms - 1;
        /* the hold: 3x the call's time on the SMs the hog leaves (132 / (132 - k) times its time alone), at least
           0.5 s; a call that progresses ends long before it, and the hog is released as soon as it has */
        const unsigned long long hold = (unsigned long long)(fmax(0.5, 3.0 * alone * h.sms / (h.sms - k)) * 1e9);
        unsigned long long deadline = hog_start(&h, k, hold);
        time_kernel<<<1, 1, 0, st>>>(&h.sh->launched);
        r = launch(&p, kind, names[i], 0, st);
        time_kernel<<<1, 1, 0, st>>>(&h.sh->done);
        char what[600];
        snprintf(what, sizeof what, "%s,\"k\":%d", base, k);
        if (r == SA_OK) wait_done(h.sh, st, hold * 1e-9 + 10.0, what);
        unsigned long long done = h.sh->done, t_launch = h.sh->launched;
        int distinct = 0;
        unsigned long long hog_end = hog_release(&h, k, &distinct);
        CK(cudaStreamSynchronize(st));
        if (r != SA_OK) {
          printf("PROGRESS {%s,\"status\":\"ERROR\",\"error\":\"%s\"}\n", what, sa_last_error());
          bad = 1;
          continue;
        }
        ok = compare(&p, kind, errs, sizeof errs);
        snapshot under = snap(&p, kind);
        int bitwise = under.bytes == alone_out.bytes;
        int before = done < deadline && done < hog_end;
        printf(
            "PROGRESS {%s,\"status\":\"%s\",\"finished\":\"%s\",\"ms\":%.3f,\"hog_sms\":%d,\"bitwise_vs_alone\":%d,"
            "\"ran_under_hog\":\"%s\",%s}\n",
            what, ok && bitwise ? "ok" : "WRONG", before ? "before_hog_deadline" : "after_hog",
            (done - t_launch) * 1e-6, distinct, bitwise, plan_ran(kind), errs);
        bad |= !(ok && bitwise);
      }
    }
  }
  return bad;
}

/* One plan of one kind in a green context of nsm SMs: the reference plans first (for a backward, the reference
   forward too: the backward reads its out and lse), then the plan, each watched for a hang (8 s: the slowest
   reference, the portable backward at T16384, takes ~1.5 s on 8 SMs). */
static int mode_green(const shape *s, int nsm, int kind, const char *plan) {
  cudaStream_t st = (cudaStream_t)green_setup(nsm);
  shared_rec *sh;
  CK(cudaHostAlloc((void **)&sh, sizeof(shared_rec), cudaHostAllocMapped));
  problem p;
  problem_init(&p, s, st);
  char what[512], errs[256];
  snprintf(what, sizeof what, "\"mode\":\"green\",\"sms\":%d,\"shape\":\"%s\",\"kind\":\"%s\",\"plan\":\"%s\"", nsm,
           s->name, kind ? "bwd" : "fwd", plan);
  struct {
    int kind, slot;
    const char *plan;
  } steps[3];
  int ns = 0;
  for (int k = KIND_FWD; k <= kind; k++) { /* the reference of every kind up to this one, in slot 1 */
    const char *names[64];
    int n = plans(&p.a, k, names, 64);
    steps[ns].kind = k;
    steps[ns].slot = 1;
    steps[ns++].plan = plan_reference(names, n);
  }
  steps[ns].kind = kind;
  steps[ns].slot = 0;
  steps[ns++].plan = plan;
  for (int i = 0; i < ns; i++) {
    sh->done = 0;
    double t0 = wall();
    sa_status r = launch(&p, steps[i].kind, steps[i].plan, steps[i].slot, st);
    if (r == SA_ERR_UNSUPPORTED && i == ns - 1) { /* not legal in this context: refused by name, no hang */
      printf("PROGRESS {%s,\"status\":\"refused\",\"error\":\"%s\"}\n", what, sa_last_error());
      return 0;
    }
    if (r != SA_OK) {
      printf("PROGRESS {%s,\"status\":\"ERROR\",\"in\":\"%s\",\"error\":\"%s\"}\n", what, steps[i].plan,
             sa_last_error());
      return 1;
    }
    time_kernel<<<1, 1, 0, st>>>(&sh->done);
    char w2[600];
    snprintf(w2, sizeof w2, "%s,\"running\":\"%s\"", what, steps[i].plan);
    wait_done(sh, st, 8.0, w2);
    if (i == ns - 1) {
      int ok = compare(&p, kind, errs, sizeof errs);
      printf("PROGRESS {%s,\"ran\":\"%s\",\"status\":\"%s\",\"ms\":%.3f,%s}\n", what, plan_ran(kind),
             ok ? "ok" : "WRONG", (wall() - t0) * 1e3, errs);
      return !ok;
    }
  }
  return 0;
}

/* The grid-barrier kernel of one CTA an SM, cooperative or plain, on stream st (hog h holding k SMs, or none). */
static void coop_once(hog *h, cudaStream_t st, int grid, int cooperative, int k, const char *ctx) {
  unsigned *count;
  coop_rec *rec;
  CK(cudaMalloc(&count, 4));
  CK(cudaMemset(count, 0, 4));
  CK(cudaHostAlloc((void **)&rec, grid * sizeof(coop_rec), cudaHostAllocMapped));
  memset(rec, 0, grid * sizeof(coop_rec));
  unsigned long long deadline = k ? hog_start(h, k, 300000000ull) : 0;
  void *args[] = {&count, &rec};
  cudaError_t e = cooperative ? cudaLaunchCooperativeKernel((void *)coop_kernel, grid, 32, args, h->smem, st)
                              : cudaLaunchKernel((void *)coop_kernel, grid, 32, args, h->smem, st);
  cudaError_t e2 = e == cudaSuccess ? cudaStreamSynchronize(st) : e;
  int distinct = 0;
  unsigned long long hog_end = k ? hog_release(h, k, &distinct) : 0;
  cudaGetLastError();
  int before = 0, timed_out = 0;
  unsigned long long first = ~0ull, last = 0;
  for (int i = 0; i < grid && e == cudaSuccess; i++) {
    before += k && rec[i].start < hog_end;
    timed_out += rec[i].timed_out;
    if (rec[i].start < first) first = rec[i].start;
    if (rec[i].start > last) last = rec[i].start;
  }
  printf(
      "PROGRESS {\"mode\":\"coop\",\"ctx\":\"%s\",\"launch\":\"%s\",\"grid\":%d,\"hog_k\":%d,\"launch_status\":\"%s\","
      "\"sync_status\":\"%s\",\"ctas_started_before_hog_end\":%d,\"barrier_timeouts\":%d,\"start_spread_ms\":%.3f,"
      "\"first_start_vs_hog_end_ms\":%.3f,\"hog_deadline_vs_end_ms\":%.3f}\n",
      ctx, cooperative ? "cooperative" : "plain", grid, k, cudaGetErrorString(e), cudaGetErrorString(e2), before,
      timed_out, e == cudaSuccess ? (last - first) * 1e-6 : -1.0,
      e == cudaSuccess && k ? ((double)first - (double)hog_end) * 1e-6 : 0.0,
      k ? ((double)deadline - (double)hog_end) * 1e-6 : 0.0);
  CK(cudaFree(count));
  CK(cudaFreeHost(rec));
}

static int mode_coop(int nsm) {
  cudaStream_t st = nsm ? (cudaStream_t)green_setup(nsm) : NULL; /* green: the kernel alone, in nsm SMs */
  hog h;
  hog_init(&h);
  CK(cudaFuncSetAttribute(coop_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, h.smem));
  if (!nsm) CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  coop_once(&h, st, h.sms, 1, 0, nsm ? "green" : "device");
  for (size_t ki = 0; ki < sizeof hog_ks / sizeof hog_ks[0] && !nsm; ki++)
    for (int coop = 1; coop >= 0; coop--) coop_once(&h, st, h.sms, coop, hog_ks[ki], "device");
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) {
    fprintf(stderr, "usage: gpu_progress list|hog SHAPE | green SHAPE NSM fwd|bwd PLAN | coop | coop-green NSM\n");
    return 2;
  }
  const char *m = argv[1];
  if (!strcmp(m, "coop")) return mode_coop(0);
  if (!strcmp(m, "coop-green") && argc == 3) return mode_coop(atoi(argv[2]));
  if (argc < 3) return 2;
  const shape *s = shape_named(argv[2]);
  if (!strcmp(m, "list")) {
    CK(cudaSetDevice(0));
    problem p;
    problem_init(&p, s, 0);
    for (int kind = KIND_FWD; kind <= KIND_BWD; kind++) {
      const char *names[64];
      int n = plans(&p.a, kind, names, 64);
      for (int i = 0; i < n; i++)
        if (plan_is_target(names[i])) printf("%s %s\n", kind ? "bwd" : "fwd", names[i]);
    }
    return 0;
  }
  if (!strcmp(m, "hog")) return mode_hog(s);
  if (!strcmp(m, "green") && argc == 6) return mode_green(s, atoi(argv[3]), strcmp(argv[4], "bwd") ? 0 : 1, argv[5]);
  fprintf(stderr, "gpu_progress: bad arguments\n");
  return 2;
}
