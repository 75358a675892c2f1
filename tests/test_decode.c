/*
 * test_decode.c — sa_attn_decode_fwd (CPU, and CUDA when a GPU is present) against the fp64 reference
 * (sa_attn_fwd with SA_BACKEND_REF) on decode shapes: Tq in {1, 2, 5, 16}, GQA ratios 1/2/8, every
 * softmax type with sinks from U(-10, 10) and +-50, windows, cache lengths 0, 1, S and random, f32/f16/bf16,
 * several chunks per head; bias, mask and positions (the CPU backend then runs sa_attn_fwd's kernels);
 * plus thread-count determinism (bitwise) and the error contract. The CPU cases run once per CPU decode
 * plan this machine has (forced in turn: the AVX-512 kernel with vdpbf16ps or fp32 scores, the portable
 * one, the attention forward's kernels, the tile item on AMX or, with AVX512-BF16, over emulated tile
 * instructions); a case a plan cannot take must be refused naming it, and runs on the default. On a GPU,
 * every legal CUDA decode plan of each case in turn.
 * Last line: "N passed, N failed".
 */
#include "sa_plan.h"
#include "sa_test_decode.h"

#ifdef SINKATTN_WITH_CUDA
/* The few CUDA runtime calls the test needs, declared here so a C compiler without the CUDA include path
   builds it (cudaError_t is an int-sized enum; kinds 1 = host to device, 2 = device to host). */
extern int cudaMalloc(void **p, size_t n);
extern int cudaFree(void *p);
extern int cudaMemcpy(void *dst, const void *src, size_t n, int kind);
extern int cudaDeviceSynchronize(void);
#endif

static void check(int ok, const char *what) {
  if (!ok) t_report("%s", what);
  t_count(ok);
}

/* The CPU decode plan of the current pass; a case it cannot run (vdpbf16ps scores of an f32 cache, the
   split-KV kernels with a bias, the tile item with an f16 cache or a head_dim not a multiple of 32) must be
   refused naming the plan (SA_ERR_UNSUPPORTED, checked once per such case) and then takes the default plan.
   Returns the plan forced; counts the pass's cases run on it, refused, and its worst error / tolerance. */
static const char *cpu_plan;
static int cuda_pass; /* the CUDA plans run in the first CPU pass only: the CPU plan does not change them */
static int pass_ran, pass_refused;
static double pass_worst;
static const char *force_cpu_plan(const sa_attn *a) {
  const char *names[8], *use = NULL;
  int n = sa_plan_list(a, SA_PLAN_DECODE, SA_BACKEND_CPU, names, 8);
  for (int i = 0; i < n && i < 8; i++)
    if (cpu_plan && strcmp(names[i], cpu_plan) == 0) use = cpu_plan;
  if (cpu_plan && !use && a->batch > 0) {
    sa_plan_force(SA_PLAN_DECODE, cpu_plan);
    sa_status s = sa_attn_decode_fwd(a, NULL, 0, SA_BACKEND_CPU, NULL);
    char what[200];
    snprintf(what, sizeof what, "%s, not listed for this case: SA_ERR_UNSUPPORTED naming it, got %s (%s)", cpu_plan,
             sa_status_name(s), sa_last_error());
    check(s == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), cpu_plan), what);
    pass_refused++;
  }
  sa_plan_force(SA_PLAN_DECODE, use);
  return use;
}

/* One case on the CPU (and CUDA when present): decode vs reference; returns the CPU output. */
static void run_case(const dcase *c) {
  float sinks[64];
  int32_t kvl[16], ql[16];
  sa_attn a;
  make_attn(c, &a, sinks, kvl, ql);
  int64_t no = c->B * c->Tq * c->N * c->Hv, nl = c->B * c->N * c->Tq;
  size_t ob = (size_t)(no > 0 ? no : 1) * sa_dtype_size(c->dtype);
  void *out_ref = malloc(ob), *out = malloc(ob);
  float *lse_ref = malloc((size_t)(nl + 1) * 4), *lse = malloc((size_t)(nl + 1) * 4);
  char what[320];
  snprintf(what, sizeof what,
           "%s%s%s B%lld Tq%lld S%lld N%lld K%lld H%lld Hv%lld softmax%d win(%lld,%lld) lens%d ql%d "
           "causal%d bias%d mask%d pos%d cap%g",
           c->name ? c->name : "", c->name ? ": " : "", t_dtype_name(c->dtype), (long long)c->B, (long long)c->Tq,
           (long long)c->S, (long long)c->N, (long long)c->K, (long long)c->H, (long long)c->Hv, (int)c->softmax,
           (long long)c->wl, (long long)c->wr, c->lens, c->q_lens, (int)c->causal, c->bias, c->mask, c->pos,
           (double)c->cap);

  a.out = out_ref;
  a.lse = lse_ref;
  sa_status s = sa_attn_fwd(&a, SA_BACKEND_REF, NULL);
  check(s == SA_OK, "reference forward");

  memset(out, 0xff, ob); /* poison: NaN in every dtype */
  memset(lse, 0xff, (size_t)(nl + 1) * 4);
  a.out = out;
  a.lse = lse;
  const char *plan = force_cpu_plan(&a);
  size_t ws = sa_attn_decode_workspace_size(&a, SA_BACKEND_CPU);
  void *w = ws ? malloc(ws) : NULL;
  s = sa_attn_decode_fwd(&a, w, ws, SA_BACKEND_CPU, NULL);
  double worst = 0;
  int ok = s == SA_OK && close_enough(&a, out, lse, out_ref, lse_ref, &worst);
  /* the plan that ran is the one asked for (its name is the description's first word) */
  if (s == SA_OK && plan)
    ok &= strncmp(sa_plan_last(SA_PLAN_DECODE), plan, strlen(plan)) == 0 &&
          sa_plan_last(SA_PLAN_DECODE)[strlen(plan)] == ' ';
  /* a soft-cap is served by the attention forward's kernels (the split-KV ones refuse it) */
  if (s == SA_OK && c->cap > 0.0f && !plan && c->B > 0)
    ok &= strncmp(sa_plan_last(SA_PLAN_DECODE), "cpu.decode.fwd ", 15) == 0;
  if (!ok)
    printf("  cpu %s: status %s (%s), worst error / tol %.3g\n", sa_plan_last(SA_PLAN_DECODE), sa_status_name(s),
           sa_last_error(), worst);
  check(ok, what);
  if (plan) {
    pass_ran++;
    if (worst > pass_worst || isnan(worst)) pass_worst = worst;
  }
  free(w);
  sa_plan_force(SA_PLAN_DECODE, NULL); /* a CPU plan forced for this thread would fail the CUDA calls below */

#ifdef SINKATTN_WITH_CUDA
  if (sa_cuda_available() && cuda_pass && (c->bias || c->mask || c->pos || c->cap > 0.0f)) {
    s = sa_attn_decode_fwd(&a, NULL, 0, SA_BACKEND_CUDA, NULL);
    char w2[1024];
    snprintf(w2, sizeof w2, "cuda %s: SA_ERR_UNSUPPORTED naming it, got %s (%s)", what, sa_status_name(s),
             sa_last_error());
    check(s == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), "unsupported by the CUDA backend"), w2);
  } else if (sa_cuda_available() && cuda_pass) {
    size_t es = sa_dtype_size(c->dtype);
    int64_t nq = c->B * c->Tq * c->N * c->H, nk = c->B * c->S * c->K * c->H, nv = c->B * c->S * c->K * c->Hv;
    void *dq, *dk, *dv, *dout, *dsinks, *dkvl, *dql, *dlse, *dw = NULL;
    cudaMalloc(&dq, (size_t)(nq + 1) * es);
    cudaMalloc(&dk, (size_t)(nk + 1) * es);
    cudaMalloc(&dv, (size_t)(nv + 1) * es);
    cudaMalloc(&dout, ob);
    cudaMalloc(&dlse, (size_t)(nl + 1) * 4);
    cudaMalloc(&dsinks, sizeof sinks);
    cudaMalloc(&dkvl, sizeof kvl);
    cudaMalloc(&dql, sizeof ql);
    cudaMemcpy(dq, a.q, (size_t)nq * es, 1);
    cudaMemcpy(dk, a.k, (size_t)nk * es, 1);
    cudaMemcpy(dv, a.v, (size_t)nv * es, 1);
    cudaMemcpy(dsinks, sinks, sizeof sinks, 1);
    cudaMemcpy(dkvl, kvl, sizeof kvl, 1);
    cudaMemcpy(dql, ql, sizeof ql, 1);
    sa_attn g = a;
    g.q = dq;
    g.k = dk;
    g.v = dv;
    g.out = dout;
    g.lse = dlse;
    if (a.sinks) g.sinks = dsinks;
    if (a.kv_lens) g.kv_lens = dkvl;
    if (a.q_lens) g.q_lens = dql;
    /* every legal CUDA decode plan in turn (the default first), each checked to be the one that ran */
    const char *cplans[8];
    int ncp = sa_plan_list(&g, SA_PLAN_DECODE, SA_BACKEND_CUDA, cplans, 8);
    check(ncp >= 1, "CUDA has a decode plan for this case");
    for (int pi = 0; pi < ncp && pi < 8; pi++) {
      sa_plan_force(SA_PLAN_DECODE, cplans[pi]);
      size_t gws = sa_attn_decode_workspace_size(&g, SA_BACKEND_CUDA);
      if (gws) cudaMalloc(&dw, gws);
      memset(out, 0xff, ob);
      cudaMemcpy(dout, out, ob, 1); /* poison: a row the kernels skip shows as NaN */
      s = sa_attn_decode_fwd(&g, dw, gws, SA_BACKEND_CUDA, NULL);
      cudaDeviceSynchronize();
      cudaMemcpy(out, dout, ob, 2);
      cudaMemcpy(lse, dlse, (size_t)nl * 4, 2);
      const size_t pl = strlen(cplans[pi]);
      ok = s == SA_OK && close_enough(&a, out, lse, out_ref, lse_ref, &worst) &&
           strncmp(sa_plan_last(SA_PLAN_DECODE), cplans[pi], pl) == 0 && sa_plan_last(SA_PLAN_DECODE)[pl] == ' ';
      if (!ok)
        printf("  cuda %s: status %s (%s), worst error / tol %.3g\n", cplans[pi], sa_status_name(s), sa_last_error(),
               worst);
      char w2[1024];
      snprintf(w2, sizeof w2, "cuda %s %s", cplans[pi], what);
      check(ok, w2);
      cudaFree(dw);
      dw = NULL;
    }
    sa_plan_force(SA_PLAN_DECODE, NULL);
    cudaFree(dq);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dout);
    cudaFree(dlse);
    cudaFree(dsinks);
    cudaFree(dkvl);
    cudaFree(dql);
  }
#endif
  free(out_ref);
  free(out);
  free(lse_ref);
  free(lse);
  free_attn(&a);
}

/* The same problem on 1, 2, 3 and 7 threads (and without a workspace) gives bitwise equal results. */
static void test_threads(sa_dtype t) {
  dcase c = {.dtype = t,
             .B = 3,
             .Tq = 2,
             .S = 3000,
             .N = 16,
             .K = 2,
             .H = 64,
             .Hv = 64,
             .softmax = SA_SOFTMAX_LEARNABLE,
             D_ALL,
             .lens = 2,
             .causal = D_BR};
  float sinks[64];
  int32_t kvl[16], ql[16];
  sa_attn a;
  make_attn(&c, &a, sinks, kvl, ql);
  int64_t no = c.B * c.Tq * c.N * c.Hv, nl = c.B * c.N * c.Tq;
  size_t ob = (size_t)no * sa_dtype_size(t);
  void *o1 = malloc(ob), *o2 = malloc(ob);
  float *l1 = malloc((size_t)nl * 4), *l2 = malloc((size_t)nl * 4);
  a.out = o1;
  a.lse = l1;
  force_cpu_plan(&a);
  size_t ws = sa_attn_decode_workspace_size(&a, SA_BACKEND_CPU);
  void *w = malloc(ws);
  int saved = sa_cpu_get_num_threads();
  sa_cpu_set_num_threads(1);
  a.out = o1;
  a.lse = l1;
  int ok = sa_attn_decode_fwd(&a, w, ws, SA_BACKEND_CPU, NULL) == SA_OK;
  const int counts[4] = {2, 3, 7, 1};
  for (int i = 0; i < 4; i++) {
    sa_cpu_set_num_threads(counts[i]);
    memset(o2, 0, ob);
    a.out = o2;
    a.lse = l2;
    ok &= sa_attn_decode_fwd(&a, i == 3 ? NULL : w, i == 3 ? 0 : ws, SA_BACKEND_CPU, NULL) == SA_OK;
    ok &= memcmp(o1, o2, ob) == 0 && memcmp(l1, l2, (size_t)nl * 4) == 0;
  }
  sa_cpu_set_num_threads(saved > 0 ? saved : 0);
  char what[400];
  snprintf(what, sizeof what, "%s %s: bitwise equal for 1, 2, 3, 7 threads and without workspace", t_dtype_name(t),
           sa_plan_last(SA_PLAN_DECODE));
  check(ok, what);
  free(o1);
  free(o2);
  free(l1);
  free(l2);
  free(w);
  free_attn(&a);
}

static void test_errors(void) {
  dcase c = {.dtype = SA_F32, .B = 1, .Tq = 65, .S = 10, .N = 4, .K = 2, .H = 32, .Hv = 32, D_ALL, .causal = D_BR};
  float sinks[64];
  int32_t kvl[16], ql[16];
  sa_attn a;
  make_attn(&c, &a, sinks, kvl, ql);
  float out[65 * 4 * 32], lse[65 * 4];
  a.out = out;
  a.lse = lse;
  sa_status s = sa_attn_decode_fwd(&a, NULL, 0, SA_BACKEND_CPU, NULL);
  check(s == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), "q_len 65"), "q_len 65 -> SA_ERR_UNSUPPORTED naming q_len");
  check(sa_attn_decode_workspace_size(&a, SA_BACKEND_CPU) == 0, "workspace size 0 for q_len 65");
  a.q_len = 64;
  s = sa_attn_decode_fwd(&a, NULL, 0, SA_BACKEND_CPU, NULL);
  check(s == SA_OK, "q_len 64 accepted (CPU allocates partials without a workspace)");
  check(sa_attn_decode_workspace_size(&a, SA_BACKEND_REF) == 0, "REF needs no workspace");
  a.head_dim = 0;
  s = sa_attn_decode_fwd(&a, NULL, 0, SA_BACKEND_CPU, NULL);
  check(s == SA_ERR_INVALID && strstr(sa_last_error(), "head_dim"), "head_dim 0 -> SA_ERR_INVALID naming head_dim");
  a.head_dim = 32;
  s = sa_attn_decode_fwd(&a, NULL, 0, (sa_backend)9, NULL);
  check(s == SA_ERR_INVALID && strstr(sa_last_error(), "backend"), "backend 9 -> SA_ERR_INVALID");
  if (!sa_has_cuda()) {
    s = sa_attn_decode_fwd(&a, NULL, 0, SA_BACKEND_CUDA, NULL);
    check(s == SA_ERR_DEVICE, "SA_BACKEND_CUDA without CUDA -> SA_ERR_DEVICE");
  }
  /* segments: CPU decode declines, AUTO falls back to the reference */
  int32_t seg[64 * 10] = {0};
  a.q_segment_ids = seg;
  a.kv_segment_ids = seg;
  check(sa_attn_decode_fwd(&a, NULL, 0, SA_BACKEND_CPU, NULL) == SA_ERR_UNSUPPORTED,
        "segments: CPU decode says unsupported");
  check(sa_attn_decode_fwd(&a, NULL, 0, SA_BACKEND_AUTO, NULL) == SA_OK, "segments: AUTO runs the reference");
  a.q_segment_ids = a.kv_segment_ids = NULL;
  /* bias, mask and positions are validated as by sa_attn_fwd */
  float bias[64 * 4 * 10];
  a.bias = bias;
  a.bias_dims[0] = 1;
  a.bias_dims[1] = 3;
  a.bias_dims[2] = 1;
  a.bias_dims[3] = 10;
  s = sa_attn_decode_fwd(&a, NULL, 0, SA_BACKEND_CPU, NULL);
  check(s == SA_ERR_INVALID && strstr(sa_last_error(), "bias_dims[1] 3 invalid"), "bias_dims[1] 3 -> SA_ERR_INVALID");
  a.bias_dims[1] = 4;
  check(sa_attn_decode_fwd(&a, NULL, 0, SA_BACKEND_CPU, NULL) == SA_OK, "bias [1, N, 1, S] accepted");
  a.q_positions = ql;
  s = sa_attn_decode_fwd(&a, NULL, 0, SA_BACKEND_CPU, NULL);
  check(s == SA_ERR_INVALID && strstr(sa_last_error(), "kv_positions is NULL"), "q_positions alone -> SA_ERR_INVALID");
  a.kv_positions = kvl;
  s = sa_attn_decode_fwd(&a, NULL, 0, SA_BACKEND_CPU, NULL);
  check(s == SA_ERR_INVALID && strstr(sa_last_error(), "SA_CAUSAL_BOTTOM_RIGHT"), "positions with bottom-right causal");
  a.bias = NULL;
  a.q_positions = a.kv_positions = NULL;
  free_attn(&a);
}

/* REF through the decode entry point is the reference forward, bit for bit. */
static void test_ref_path(void) {
  dcase c = {.dtype = SA_BF16,
             .B = 2,
             .Tq = 3,
             .S = 200,
             .N = 8,
             .K = 2,
             .H = 64,
             .Hv = 32,
             .softmax = SA_SOFTMAX_OFF_BY_ONE,
             .wl = 31,
             .wr = 0,
             .lens = 1,
             .causal = D_BR};
  float sinks[64];
  int32_t kvl[16], ql[16];
  sa_attn a;
  make_attn(&c, &a, sinks, kvl, ql);
  uint16_t o1[2 * 3 * 8 * 32], o2[2 * 3 * 8 * 32];
  float l1[2 * 8 * 3], l2[2 * 8 * 3];
  a.out = o1;
  a.lse = l1;
  int ok = sa_attn_fwd(&a, SA_BACKEND_REF, NULL) == SA_OK;
  a.out = o2;
  a.lse = l2;
  ok &= sa_attn_decode_fwd(&a, NULL, 0, SA_BACKEND_REF, NULL) == SA_OK;
  check(ok && !memcmp(o1, o2, sizeof o1) && !memcmp(l1, l2, sizeof l1), "REF decode == reference forward");
  free_attn(&a);
}

int main(void) {
  const sa_dtype dts[3] = {SA_F32, SA_F16, SA_BF16};
  const int64_t groups[3] = {1, 2, 8}, tqs[4] = {1, 2, 5, 16};
  const int64_t wins[4][2] = {{-1, -1}, {127, 0}, {40, 0}, {9, 3}};
  const sa_softmax sms[3] = {SA_SOFTMAX_VANILLA, SA_SOFTMAX_OFF_BY_ONE, SA_SOFTMAX_LEARNABLE};
  /* the plans of a bf16 problem: every CPU decode kernel this machine can run */
  sa_attn probe;
  sa_attn_init(&probe);
  probe.dtype = SA_BF16;
  probe.batch = probe.q_len = probe.kv_len = probe.q_heads = probe.kv_heads = 1;
  probe.head_dim = probe.v_head_dim = 64;
  const char *plans[8];
  int nplans = sa_plan_list(&probe, SA_PLAN_DECODE, SA_BACKEND_CPU, plans, 8);
  check(nplans >= 1, "the CPU has decode plans");
  for (int level = 0; level < nplans && level < 8; level++) {
    cpu_plan = plans[level];
    cuda_pass = level == 0;
    printf("CPU decode plan %s\n", cpu_plan);
    pass_ran = pass_refused = 0;
    pass_worst = 0.0;
    int idx = 0;
    for (int di = 0; di < 3; di++)
      for (int gi = 0; gi < 3; gi++)
        for (int ti = 0; ti < 4; ti++)
          for (int si = 0; si < 3; si++, idx++) {
            int64_t G = groups[gi], K = G == 8 ? 1 : 2;
            dcase c = {.dtype = dts[di],
                       .B = 4,
                       .Tq = tqs[ti],
                       .S = 700 + 131 * (idx % 5),
                       .N = G * K,
                       .K = K,
                       .H = idx % 4 == 3 ? 40 : 64,
                       .Hv = 64,
                       .softmax = sms[si],
                       .wl = wins[idx % 4][0],
                       .wr = wins[idx % 4][1],
                       .lens = 1 + (idx % 3 == 2),
                       .q_lens = idx % 7 == 3,
                       .causal = D_BR};
            if (idx % 4 == 1) c.Hv = 32;
            if (idx % 11 == 5) c.lens = 0;
            run_case(&c);
          }
    /* several chunks per head (R = 8: 512-key chunks), H 128, no causal mask, top-left causal, odd dims */
    /* one case a line */
    // clang-format off
    static const dcase rows[] = {
        {.name = "several chunks, H 128", .dtype = SA_BF16, .B = 2, .Tq = 1, .S = 5000, .N = 8, .K = 1, .H = 128,
         .Hv = 128, .softmax = SA_SOFTMAX_LEARNABLE, D_ALL, .lens = 1, .causal = D_BR},
        {.name = "window 1000", .dtype = SA_F16, .B = 1, .Tq = 4, .S = 4100, .N = 16, .K = 2, .H = 64, .Hv = 64,
         .wl = 1000, .wr = 0, .causal = D_BR},
        {.name = "no causal mask", .dtype = SA_F32, .B = 2, .Tq = 3, .S = 2100, .N = 4, .K = 4, .H = 96, .Hv = 80,
         .softmax = SA_SOFTMAX_OFF_BY_ONE, D_ALL, .lens = 2},
        {.name = "top-left causal", .dtype = SA_BF16, .B = 2, .Tq = 16, .S = 1500, .N = 8, .K = 2, .H = 64, .Hv = 64,
         .softmax = SA_SOFTMAX_LEARNABLE, .wl = 200, .wr = 0, .lens = 2, .q_lens = 1, .causal = SA_CAUSAL_TOP_LEFT},
        /* odd head dims: a half-filled bf16 pair and masked 16-lane tails in the AVX-512 kernel; R = 3, 6 */
        {.name = "odd head dims, R 3", .dtype = SA_BF16, .B = 2, .Tq = 1, .S = 900, .N = 9, .K = 3, .H = 33,
         .Hv = 20, .softmax = SA_SOFTMAX_LEARNABLE, D_ALL, .lens = 1, .causal = D_BR},
        {.name = "odd head dims, R 6", .dtype = SA_F16, .B = 1, .Tq = 3, .S = 700, .N = 4, .K = 2, .H = 17, .Hv = 47,
         .softmax = SA_SOFTMAX_OFF_BY_ONE, .wl = 50, .wr = 0, .lens = 2, .causal = D_BR},
        /* gpt-oss decode, N/K 64/8 (R = 8: two kv heads share a score vector), bf16 and f32; a 128-key window */
        {.name = "gpt-oss", .dtype = SA_BF16, .B = 2, .Tq = 1, .S = 3000, .N = 64, .K = 8, .H = 64, .Hv = 64,
         .softmax = SA_SOFTMAX_LEARNABLE, D_ALL, .lens = 1, .causal = D_BR},
        {.name = "gpt-oss window", .dtype = SA_F32, .B = 1, .Tq = 1, .S = 2000, .N = 64, .K = 8, .H = 64, .Hv = 64,
         .softmax = SA_SOFTMAX_LEARNABLE, .wl = 127, .wr = 0, .causal = D_BR},
        /* 32 splits of 1024 keys: the mma decode's split-count plans (.half 16, .x2 64, .x4 128) all legal */
        {.name = "gpt-oss S 32k", .dtype = SA_BF16, .B = 1, .Tq = 1, .S = 32768, .N = 64, .K = 8, .H = 64, .Hv = 64,
         .softmax = SA_SOFTMAX_LEARNABLE, D_ALL, .lens = 1, .causal = D_BR},
        /* R = 1 with 6 kv heads (4 lanes each: groups of 4 and 2), and R = 2 with 8 heads (one group of 8) */
        {.name = "R 1, 6 kv heads", .dtype = SA_BF16, .B = 2, .Tq = 1, .S = 900, .N = 6, .K = 6, .H = 64, .Hv = 64,
         .softmax = SA_SOFTMAX_OFF_BY_ONE, D_ALL, .lens = 2, .causal = D_BR},
        /* the tile item's other shapes: three k steps of Q.K^T, Hv off 32 (a masked V tail); R 40 in three
           16-lane tiles of a head */
        {.name = "H 96, Hv 40, R 3", .dtype = SA_BF16, .B = 2, .Tq = 1, .S = 1300, .N = 6, .K = 2, .H = 96, .Hv = 40,
         .softmax = SA_SOFTMAX_LEARNABLE, .wl = 200, .wr = 0, .lens = 1, .causal = D_BR},
        {.name = "H 32, Hv 16, R 40", .dtype = SA_BF16, .B = 1, .Tq = 5, .S = 800, .N = 16, .K = 2, .H = 32, .Hv = 16,
         .softmax = SA_SOFTMAX_OFF_BY_ONE, D_ALL, .lens = 2, .q_lens = 1, .causal = D_BR},
        {.name = "R 2, 8 kv heads", .dtype = SA_F16, .B = 1, .Tq = 2, .S = 800, .N = 8, .K = 8, .H = 48, .Hv = 40,
         .wl = 30, .wr = 0, .lens = 2, .q_lens = 1, .causal = D_BR},
        /* empty shapes: no cache, no batch */
        {.name = "no cache", .dtype = SA_F32, .B = 2, .Tq = 2, .S = 0, .N = 4, .K = 2, .H = 64, .Hv = 64,
         .softmax = SA_SOFTMAX_LEARNABLE, D_ALL, .causal = D_BR},
        {.name = "no batch", .dtype = SA_BF16, .B = 0, .Tq = 1, .S = 100, .N = 4, .K = 2, .H = 64, .Hv = 64, D_ALL,
         .causal = D_BR},
        /* bias (ALiBi-like, per head and key), masks, positions in place of the bottom-right alignment */
        {.name = "bias [1,N,1,S]", .dtype = SA_BF16, .B = 3, .Tq = 1, .S = 2000, .N = 8, .K = 1, .H = 64, .Hv = 64,
         .softmax = SA_SOFTMAX_LEARNABLE, .wl = 127, .wr = 0, .lens = 1, .causal = D_BR, .bias = T_BCAST(1, 0, 1, 0)},
        {.name = "bias [B,N,Tq,S], mask [B,1,1,S]", .dtype = SA_F32, .B = 2, .Tq = 4, .S = 700, .N = 8, .K = 2,
         .H = 64, .Hv = 64, .softmax = SA_SOFTMAX_OFF_BY_ONE, D_ALL, .lens = 2, .q_lens = 1, .causal = D_BR,
         .bias = T_BCAST(0, 0, 0, 0), .mask = T_BCAST(0, 1, 1, 0)},
        {.name = "positions, window, mask", .dtype = SA_F16, .B = 2, .Tq = 5, .S = 900, .N = 4, .K = 2, .H = 64,
         .Hv = 32, .softmax = SA_SOFTMAX_LEARNABLE, .wl = 300, .wr = 0, .causal = SA_CAUSAL_TOP_LEFT,
         .mask = T_BCAST(1, 0, 0, 0), .pos = 1},
        /* the soft-cap (cpu.decode.fwd), sinks U(-10, 10) and +-50 */
        {.name = "soft-cap 3, gpt-oss window", .dtype = SA_BF16, .B = 2, .Tq = 1, .S = 3000, .N = 64, .K = 8, .H = 64,
         .Hv = 64, .softmax = SA_SOFTMAX_LEARNABLE, .wl = 127, .wr = 0, .lens = 1, .causal = D_BR, .cap = 3.0f},
        {.name = "soft-cap 0.5, R 16", .dtype = SA_F32, .B = 2, .Tq = 4, .S = 700, .N = 8, .K = 2, .H = 64, .Hv = 32,
         .softmax = SA_SOFTMAX_OFF_BY_ONE, D_ALL, .lens = 2, .q_lens = 1, .causal = D_BR, .cap = 0.5f},
        {.name = "soft-cap 20, bias, f16", .dtype = SA_F16, .B = 3, .Tq = 2, .S = 900, .N = 4, .K = 1, .H = 32,
         .Hv = 32, .softmax = SA_SOFTMAX_LEARNABLE, .wl = 300, .wr = 0, .lens = 1, .causal = D_BR,
         .bias = T_BCAST(1, 0, 1, 0), .cap = 20.0f},
    };
    // clang-format on
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) run_case(&rows[i]);
    for (int i = 0; i < TD_NCASES; i++) run_case(&td_cases[i]); /* amx_check's tile decode cases */
    for (int di = 0; di < 3; di++) test_threads(dts[di]);
    printf("  %d cases on it (largest error / tolerance %.3f), %d refused naming it and run on the default\n", pass_ran,
           pass_worst, pass_refused);
  }
  cpu_plan = NULL;
  sa_plan_force(SA_PLAN_DECODE, NULL);
  test_errors();
  test_ref_path();
#ifdef SINKATTN_WITH_CUDA
  if (!sa_cuda_available()) printf("CUDA decode: skipped (no GPU present)\n");
#else
  printf("CUDA decode: skipped (built without CUDA)\n");
#endif
  printf("%d passed, %d failed\n", t_passed, t_failed);
  return t_failed != 0;
}
