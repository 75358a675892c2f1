/*
 * hopper_fwd_05_host.cuh — the host half of dev/hopper_fwd_05.cu (the configurations, the scheduler setup, the
 * launches, the same-run A/B and main), split off to keep each file under 600 lines. Included once, at the end
 * of hopper_fwd_05.cu, after the kernels it launches; not a header of its own.
 */
/* ---- host ----------------------------------------------------------------------------------------- */

using Cfg128 = v05::Cfg<128, 2, 176, false>;  /* H128 non-causal: dev 04's tile */
using Cfg128c = v05::Cfg<128, 2, 128, true>;  /* H128 causal: dev 02's tile */
using Cfg64 = v05::Cfg<64, 3, 128, false>;    /* H64: dev 03's 192-row CTAs */
using Cfg64c = v05::Cfg<64, 3, 128, true>;

static int g_sms = 0;          /* cudaDevAttrMultiProcessorCount */
static unsigned *g_ctr = nullptr; /* the scheduler's two counters */
static bool g_persist = true;  /* false: grid = all work tiles, one per CTA (the library's launch) */
static bool g_merge = false;   /* the MERGE kernel: a work tile's last P V under the next one's S_0 */
static int g_grid_cap = 0;     /* > 0: at most this many persistent CTAs (checks: many work tiles per CTA) */
/* Causal L2 sections: heads whose K/V (per query head: 2 S H 2 B / G) add up to <= 16 MiB, a third of the H200's
   50 MiB L2 (the rest: Q, O and the far partition's copies). T1024 H128: 32 heads (256 work tiles). */
static const double L2_SECTION_BYTES = 16.0 * 1024 * 1024;

/* The configuration's maps (Q: BM-row boxes; K / V: BN-row boxes), encoded once per problem and configuration
   so that timed launches do no host work beyond the launch. */
struct Maps {
  CUtensorMap q, k, v;
};
template <class C>
static const Maps &maps_for(const Problem &pr) {
  static Maps m;
  static const void *q = nullptr, *k = nullptr, *v = nullptr;
  static int key[6] = {0, 0, 0, 0, 0, 0};
  const Case &c = pr.c;
  const int nk[6] = {c.B, c.T, c.S, c.N, c.KH, c.H};
  if (q != pr.q || k != pr.k || v != pr.v || memcmp(key, nk, sizeof key) != 0) {
    m.q = make_map(pr.q, c.B, c.T, c.N, c.H, C::BM);
    m.k = make_map(pr.k, c.B, c.S, c.KH, c.H, C::BN);
    m.v = make_map(pr.v, c.B, c.S, c.KH, c.H, C::BN);
    q = pr.q, k = pr.k, v = pr.v;
    memcpy(key, nk, sizeof key);
  }
  return m;
}

/* The launch's grid and scheduler; printed once per bench shape. */
template <class C>
static v05::Sched sched_for(const Case &c, int *grid) {
  v05::Sched sc;
  sc.n_mb = (c.T + C::BM - 1) / C::BM;
  sc.total = c.B * c.N * sc.n_mb;
  sc.ctr = g_ctr;
  if (g_persist) {
    const int cap = g_grid_cap > 0 ? std::min(g_grid_cap, g_sms) : g_sms;
    *grid = std::min(cap, sc.total);
    sc.dynamic = C::CAUSAL ? 1 : 0;
    const double head_kv = 4.0 * c.S * c.H / (c.N / c.KH);
    sc.hg = C::CAUSAL ? std::max(1, std::min(c.B * c.N, (int)(L2_SECTION_BYTES / head_kv))) : 0;
    /* Experiments without a rebuild: SA05_HG = heads per L2 section (0: the library's order, heaviest first
       within a head only), SA05_DYNAMIC = 0 / 1 (static stride / counter, any mask). */
    if (const char *e = getenv("SA05_HG")) sc.hg = C::CAUSAL ? std::max(0, std::min(c.B * c.N, atoi(e))) : 0;
    if (const char *e = getenv("SA05_DYNAMIC")) sc.dynamic = atoi(e) != 0;
  } else {
    *grid = sc.total;
    sc.dynamic = 0;
    sc.hg = 0;
  }
  return sc;
}

template <class C, bool MERGE>
static void launch_kernel(const Maps &m, const FwdParams &p, const v05::Sched &sc, int grid) {
  static bool attr_set = false;
  if (!attr_set) {
    CK(cudaFuncSetAttribute(v05::hopper_fwd05<C, MERGE>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
    attr_set = true;
  }
  v05::hopper_fwd05<C, MERGE><<<grid, C::THREADS, C::SMEM>>>(m.q, m.k, m.v, p, sc);
}

template <class C>
static void launch_cfg(const Problem &pr) {
  const Maps &m = maps_for<C>(pr);
  int grid = 0;
  const v05::Sched sc = sched_for<C>(pr.c, &grid);
  /* MERGE at H128 only: at H64 (3 consumers, 160 registers) ptxas spills 4-12 bytes with the pending tile's
     state, and there the other two warpgroups' products already cover one warpgroup's fill / drain. The "05m"
     rows at H64 run the 05 kernel. */
  if constexpr (C::NC == 2) {
    if (g_merge) {
      launch_kernel<C, true>(m, pr.p, sc, grid);
      CK(cudaGetLastError());
      return;
    }
  }
  launch_kernel<C, false>(m, pr.p, sc, grid);
  CK(cudaGetLastError());
}

static void launch(const Problem &pr) {
  const Case &c = pr.c;
  if (c.H == 128) c.causal ? launch_cfg<Cfg128c>(pr) : launch_cfg<Cfg128>(pr);
  else c.causal ? launch_cfg<Cfg64c>(pr) : launch_cfg<Cfg64>(pr);
}

static void print_launch(const Case &c) {
  int grid = 0, total = 0, dyn = 0, hg = 0, bm = 0, bn = 0, smem = 0;
  auto get = [&](auto cfg) {
    using C = decltype(cfg);
    const v05::Sched sc = sched_for<C>(c, &grid);
    total = sc.total, dyn = sc.dynamic, hg = sc.hg, bm = C::BM, bn = C::BN, smem = C::SMEM;
  };
  if (c.H == 128) c.causal ? get(Cfg128c{}) : get(Cfg128{});
  else c.causal ? get(Cfg64c{}) : get(Cfg64{});
  printf("{\"launch\": \"%s\", \"B\": %d, \"T\": %d, \"H\": %d, \"causal\": %d, \"BM\": %d, \"BN\": %d, "
         "\"smem\": %d, \"work_tiles\": %d, \"grid\": %d, \"dynamic\": %d, \"heads_per_l2_section\": %d}\n",
         g_persist ? (g_merge ? "persistent, merged tails" : "persistent") : "one tile per CTA", c.B, c.T, c.H,
         c.causal, bm, bn, smem, total, grid, dyn, hg);
}

/* 05, 05m and 05np on one problem, launch by launch in turn (same clocks, same L2 state pattern), CUDA events,
   median of 20 each; the same "bench" lines as hopper_common's bench(), then the ratios to 05np. */
static void set_variant(int v) { g_persist = v != 2, g_merge = v == 1, g_grid_cap = 0; }
static void bench_ab(const Case &c, bool validated) {
  constexpr int NV = 3;
  Problem pr;
  problem_init(pr, c, 1234);
  const char *names[NV] = {"hopper_fwd_05", "hopper_fwd_05m", "hopper_fwd_05np"};
  for (int v = 0; v < NV; ++v) {
    set_variant(v);
    print_launch(c);
    launch(pr);
    sync_or_die("hopper_fwd_05 (bench warm-up)");
    for (int i = 0; i < 2; ++i) launch(pr);
  }
  std::vector<float> ms[NV];
  for (auto &m : ms) m.resize(20);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 20; ++i)
    for (int v = 0; v < NV; ++v) {
      set_variant(v);
      CK(cudaEventRecord(e0));
      launch(pr);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      CK(cudaEventElapsedTime(&ms[v][i], e0, e1));
    }
  set_variant(0);
  const double flop = 4.0 * c.B * c.N * (double)c.T * c.S * c.H * (c.causal ? 0.5 : 1.0);
  double med[NV];
  for (int v = 0; v < NV; ++v) {
    std::sort(ms[v].begin(), ms[v].end());
    med[v] = 0.5 * (ms[v][9] + ms[v][10]);
    printf("{\"bench\": \"%s\", \"B\": %d, \"T\": %d, \"S\": %d, \"N\": %d, \"K\": %d, \"H\": %d, "
           "\"causal\": %d, \"softmax\": \"%s\", \"ms_median\": %.4f, \"ms_min\": %.4f, \"tflops\": %.1f, "
           "\"validated\": %s}\n",
           names[v], c.B, c.T, c.S, c.N, c.KH, c.H, c.causal, softmax_name(c.softmax), med[v], ms[v][0],
           flop / (med[v] * 1e-3) / 1e12, validated ? "true" : "false");
  }
  printf("{\"ab\": \"05np time / variant time\", \"B\": %d, \"T\": %d, \"N\": %d, \"H\": %d, \"causal\": %d, "
         "\"05\": %.3f, \"05m\": %.3f}\n", c.B, c.T, c.N, c.H, c.causal, med[2] / med[0], med[2] / med[1]);
  fflush(stdout);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  problem_free(pr);
}

/* One case in five launch modes: persistent on every SM and on grid_cap CTAs (many work tiles per CTA: the ring
   and Q phases across tiles, odd and even key-tile counts, the counter's reuse), each without and with MERGE,
   and one tile per CTA. */
static int check_modes(const Case &c, uint32_t seed, int grid_cap) {
  int failed = 0;
  /* Capped grid only where it stays short: B4 T4096 N16 H128 on 5 CTAs would take ~10-19 s per launch (~1.4-1.9
     us per key tile and CTA, 410 work tiles each), next to sync_or_die's 20 s. B N T S <= 2^28: < 1 s. */
  const bool small = (double)c.B * c.N * c.T * c.S <= 268435456.0;
  for (int merge = 0; merge < 2; ++merge) {
    set_variant(merge);
    failed += !check(merge ? "hopper_fwd_05m" : "hopper_fwd_05", launch, c, seed);
    if (small) {
      g_grid_cap = grid_cap;
      char name[32];
      snprintf(name, sizeof name, "hopper_fwd_05%sg%d", merge ? "m" : "", grid_cap);
      failed += !check(name, launch, c, seed);
    }
  }
  set_variant(2);
  failed += !check("hopper_fwd_05np", launch, c, seed);
  set_variant(0);
  return failed;
}

/* The counters must read 0 after every launch (the self-reset); a stale count would skip tiles next time. */
static int check_counters() {
  unsigned h[2];
  CK(cudaMemcpy(h, g_ctr, sizeof h, cudaMemcpyDeviceToHost));
  const bool ok = h[0] == 0 && h[1] == 0;
  printf("{\"check\": \"scheduler counters after the launches\", \"ctr\": [%u, %u], \"pass\": %s}\n", h[0], h[1],
         ok ? "true" : "false");
  fflush(stdout);
  return ok ? 0 : 1;
}

int main(int argc, char **argv) {
  harness_init();
  CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaMalloc(&g_ctr, 2 * sizeof(unsigned)));
  CK(cudaMemset(g_ctr, 0, 2 * sizeof(unsigned)));

  if (argc > 1 && strcmp(argv[1], "racecheck") == 0) {
    /* Two small persistent checks on 3 CTAs (several work tiles each, across the Q / ring phases), no timing. */
    const Case rc[] = {{1, 512, 1024, 4, 2, 128, 1, SM_LEARNABLE, 1}, {1, 384, 640, 4, 2, 128, 0, SM_OFF_BY_ONE, 1}};
    int failed = 0;
    for (int i = 0; i < 2; ++i) {
      set_variant(i); /* 05 on the causal case, 05m on the other */
      g_grid_cap = 3;
      failed += !check(i ? "hopper_fwd_05mg3" : "hopper_fwd_05g3", launch, rc[i], 21 + 25 * i);
    }
    failed += check_counters();
    return failed ? 1 : 0;
  }

  /* {B, T, S, N, K, H, causal, softmax, rows_every}. H128 non-causal (176-key tiles; keys in the last tile S mod
     176: 512: 160, 128: 128 (one tile), 640: 112, 1408 / 2816: 176, 16384: 16, 4096: 48); H128 causal (T < S,
     T > S, T1024 with 8 key tiles at the heaviest m-block); H64 with 192-row m-blocks (T mod 192: 512: 128 (2
     warpgroups with rows), 640 / 1024: 64 (1), 1152 / 384: 0); GQA 1:1 to 8:1; every softmax type; heads 0 / 1
     at sink +50 / -50. The small-grid run: 5 CTAs for 4..2048 work tiles. */
  const Case checks[] = {
      {2, 512, 512, 4, 4, 128, 0, SM_LEARNABLE, 1},    {1, 128, 128, 2, 2, 128, 0, SM_LEARNABLE, 1},
      {2, 256, 640, 4, 4, 128, 0, SM_VANILLA, 1},      {1, 768, 128, 4, 1, 128, 0, SM_VANILLA, 1},
      {2, 512, 1408, 4, 2, 128, 0, SM_LEARNABLE, 1},   {1, 384, 2816, 8, 1, 128, 0, SM_OFF_BY_ONE, 1},
      {1, 256, 16384, 4, 2, 128, 0, SM_LEARNABLE, 1},  {4, 4096, 4096, 16, 16, 128, 0, SM_LEARNABLE, 61},
      {2, 512, 512, 4, 4, 128, 1, SM_LEARNABLE, 1},    {2, 256, 768, 4, 2, 128, 1, SM_OFF_BY_ONE, 1},
      {1, 768, 256, 4, 4, 128, 1, SM_VANILLA, 1},      {1, 128, 128, 2, 2, 128, 1, SM_LEARNABLE, 1},
      {4, 1024, 1024, 16, 16, 128, 1, SM_LEARNABLE, 7}, {4, 4096, 4096, 16, 16, 128, 1, SM_LEARNABLE, 61},
      {2, 512, 512, 4, 2, 64, 1, SM_OFF_BY_ONE, 1},    {1, 640, 640, 4, 4, 64, 1, SM_LEARNABLE, 1},
      {2, 256, 768, 4, 1, 64, 1, SM_VANILLA, 1},       {1, 1152, 1152, 4, 2, 64, 1, SM_LEARNABLE, 1},
      {4, 1024, 1024, 32, 32, 64, 1, SM_LEARNABLE, 7}, {2, 512, 512, 4, 4, 64, 0, SM_LEARNABLE, 1},
      {1, 128, 384, 2, 1, 64, 0, SM_VANILLA, 1},       {1, 640, 384, 4, 2, 64, 0, SM_OFF_BY_ONE, 1},
  };
  int failed = 0;
  for (size_t i = 0; i < sizeof(checks) / sizeof(checks[0]); ++i)
    failed += check_modes(checks[i], 7 + 3 * (uint32_t)i, 5);
  failed += check_counters();

  /* 04's bench rows, then the target rows. */
  const Case benches[] = {
      {4, 4096, 4096, 16, 16, 128, 0, SM_LEARNABLE, 1},  {1, 16384, 16384, 16, 16, 128, 0, SM_LEARNABLE, 1},
      {2, 8192, 8192, 16, 16, 128, 0, SM_LEARNABLE, 1},  {16, 1024, 1024, 16, 16, 128, 0, SM_LEARNABLE, 1},
      {16, 1024, 1024, 16, 16, 128, 1, SM_LEARNABLE, 1}, {4, 4096, 4096, 16, 16, 128, 1, SM_LEARNABLE, 1},
      {1, 16384, 16384, 16, 16, 128, 1, SM_LEARNABLE, 1}, {16, 1024, 1024, 32, 32, 64, 1, SM_LEARNABLE, 1},
      {4, 4096, 4096, 32, 32, 64, 1, SM_LEARNABLE, 1},
  };
  for (const Case &c : benches) bench_ab(c, failed == 0);
  failed += check_counters();
  printf("{\"summary\": \"hopper_fwd_05\", \"checks_failed\": %d}\n", failed);
  fflush(stdout);
  return failed ? 1 : 0;
}
