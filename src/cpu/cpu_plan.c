/*
 * cpu_plan.c — the CPU backend's plans (cpu_plan.h): the table of kernels, when each is legal, the
 * default, the work-item shapes, and the call's plan from the plan API's forced name.
 */
#include <stdio.h>
#include <string.h>

#include "cpu_internal.h"
#include "cpu_plan.h"

/* Preference order within a kind: the default is the first legal entry that is not override-only and, for
   the AMX tile entries, whose shape they win (sa_cpu_tile_wins). */
typedef struct {
  const char *name;
  int which;
  sa_cpu_simd simd;
  sa_cpu_tile tile;
  int bf16_dot;
  int override_only; /* reached only through a forced plan */
  int fwd_kernels;   /* decode: the attention forward's kernels, those of the forward's default plan */
} sa_cpu_plan_kind;

static const sa_cpu_plan_kind sa_cpu_plan_kinds[] = {
    /* bf16 on AMX tiles first: on 2 cores of a Xeon with AMX they take 0.25-0.35x the AVX-512 plan's time at
       T = S = 128..2048 (forward and forward+backward, H 16 to 256, docs/performance.md); the vector plans
       take the shapes below sa_cpu_tile_wins's threshold. */
    {"cpu.fwd.amx", SA_PLAN_FWD, SA_CPU_AVX512, SA_CPU_TILE_AMX, 0, 0, 0},
    {"cpu.fwd.avx512", SA_PLAN_FWD, SA_CPU_AVX512, 0, 0, 0, 0},
    {"cpu.fwd.avx2", SA_PLAN_FWD, SA_CPU_AVX2, 0, 0, 0, 0},
    {"cpu.fwd.scalar", SA_PLAN_FWD, SA_CPU_SCALAR, 0, 0, 0, 0},
    {"cpu.fwd.amx.emulated", SA_PLAN_FWD, SA_CPU_AVX512, SA_CPU_TILE_EMULATED, 0, 1, 0},
    {"cpu.bwd.amx", SA_PLAN_BWD, SA_CPU_AVX512, SA_CPU_TILE_AMX, 0, 0, 0},
    {"cpu.bwd.avx512", SA_PLAN_BWD, SA_CPU_AVX512, 0, 0, 0, 0},
    {"cpu.bwd.avx2", SA_PLAN_BWD, SA_CPU_AVX2, 0, 0, 0, 0},
    {"cpu.bwd.scalar", SA_PLAN_BWD, SA_CPU_SCALAR, 0, 0, 0, 0},
    {"cpu.bwd.amx.emulated", SA_PLAN_BWD, SA_CPU_AVX512, SA_CPU_TILE_EMULATED, 0, 1, 0},
    /* The split-KV item with Q.K^T and P.V on AMX tiles (bf16, head_dim a multiple of 32): 0.55-0.82x the
       time of the vdpbf16ps item on 2 cores of a Xeon with AMX (gpt-oss N/K 64/8 H 64, B 1 and 8, S 256 to
       32k; docs/performance.md). Then the AVX-512 decode kernels (scores by vdpbf16ps straight from a bf16
       cache, or fp32 FMAs), and the portable C one, which the avx2 and scalar levels get; then the attention
       forward's kernels, which take what those do not (a bias, a mask, positions, a soft-cap). */
    {"cpu.decode.amx", SA_PLAN_DECODE, SA_CPU_AVX512, SA_CPU_TILE_AMX, 0, 0, 0},
    {"cpu.decode.avx512bf16", SA_PLAN_DECODE, SA_CPU_AVX512, 0, 1, 0, 0},
    {"cpu.decode.avx512", SA_PLAN_DECODE, SA_CPU_AVX512, 0, 0, 0, 0},
    {"cpu.decode.portable", SA_PLAN_DECODE, SA_CPU_SCALAR, 0, 0, 0, 0},
    {"cpu.decode.fwd", SA_PLAN_DECODE, SA_CPU_SCALAR, 0, 0, 0, 1},
    /* the tile code over emulated instructions: a test vehicle, never a default */
    {"cpu.decode.amx.emulated", SA_PLAN_DECODE, SA_CPU_AVX512, SA_CPU_TILE_EMULATED, 0, 1, 0},
};
#define SA_CPU_NPLANS ((int)(sizeof sa_cpu_plan_kinds / sizeof sa_cpu_plan_kinds[0]))

static const char *sa_cpu_simd_str(sa_cpu_simd s) {
  return s == SA_CPU_AVX512 ? "avx512" : s == SA_CPU_AVX2 ? "avx2" : "scalar";
}

/* NULL when kind k can run a, else why not (static text). */
static const char *sa_cpu_plan_why_not(const sa_cpu_plan_kind *k, const sa_attn *a, const sa_cpu_record *r) {
  if (k->which == SA_PLAN_DECODE && !k->fwd_kernels &&
      (sa_dims_set(a->bias_dims) || sa_dims_set(a->mask_dims) || a->q_positions || a->logits_soft_cap != 0.0f))
    return "the split-KV kernels take no bias, mask, positions or logits_soft_cap (cpu.decode.fwd does)";
  if (k->simd > r->simd_cpu) return "this CPU lacks the instructions (CPUID)";
  if (k->simd > r->simd) return "SINKATTN_SIMD lowers the level below it";
  if (k->bf16_dot) {
    if (a->dtype != SA_BF16) return "its vdpbf16ps scores read a bf16 cache only";
    if (!r->f.avx512_bf16) return "this CPU lacks AVX512-BF16 (CPUID)";
  }
  if (k->tile) {
    if (a->dtype == SA_F32) return "the tile products take bf16 inputs only";
    if (a->dtype == SA_F16)
      return "the tile products take bf16 inputs only: f16 needs AMX-FP16's TDPFP16PS, which has no kernels yet";
    if (k->which == SA_PLAN_DECODE && a->head_dim % 32 != 0)
      return "the tile decode loads K rows straight into A tiles, 32 elements a k step: head_dim must be a multiple "
             "of 32";
    if (!r->f.avx512_bf16) return "the tile kernels pack their operands with AVX512-BF16, which this CPU lacks (CPUID)";
    if (k->tile == SA_CPU_TILE_EMULATED) return NULL;
    if (!r->f.amx_bf16) return "this CPU lacks AMX-TILE + AMX-BF16 (CPUID)";
    if (!r->f.amx_os) return "the OS did not grant the tile state (XCR0, arch_prctl ARCH_REQ_XCOMP_PERM)";
#ifndef SA_CPU_HAVE_AMX
    return "this library was built without the AMX kernels (the compiler took no -mamx-tile -mamx-bf16)";
#endif
  }
  return NULL;
}

static const sa_cpu_plan_kind *sa_cpu_plan_find(const char *name) {
  for (int i = 0; i < SA_CPU_NPLANS; i++)
    if (strcmp(sa_cpu_plan_kinds[i].name, name) == 0) return &sa_cpu_plan_kinds[i];
  return NULL;
}

const char *sa_cpu_plan_known(const char *name) {
  const sa_cpu_plan_kind *k = name ? sa_cpu_plan_find(name) : NULL;
  return k ? k->name : NULL;
}

const char *sa_cpu_plan_name(int i) { return i >= 0 && i < SA_CPU_NPLANS ? sa_cpu_plan_kinds[i].name : NULL; }

void sa_cpu_plan_rows(const sa_attn *a, int tile, int64_t *bq, int64_t *bq_min) {
  const int64_t G = a->kv_heads > 0 ? a->q_heads / a->kv_heads : 1;
  /* G heads x bq positions share each K/V tile (one position per item when G exceeds the rows). A mask
     array is treated as a diagonal mask: its all-false tiles are skipped, and shorter blocks skip more. The
     tile kernels take SA_CPU_TILE_ROWS_CAUSAL under a plain causal mask (no window, segment ids or mask
     array, whose blocks would span more keys outside them). */
  int diag = a->causal != SA_CAUSAL_NONE || a->window_left >= 0 || a->window_right >= 0 || a->q_segment_ids || a->mask;
  int plain_causal =
      a->causal != SA_CAUSAL_NONE && a->window_left < 0 && a->window_right < 0 && !a->q_segment_ids && !a->mask;
  int64_t rows = !diag ? SA_CPU_ROWS : tile && plain_causal ? SA_CPU_TILE_ROWS_CAUSAL : SA_CPU_ROWS_DIAG;
  *bq = G >= rows ? 1 : rows / G;
  *bq_min = G >= SA_CPU_ROWS_DIAG ? 1 : SA_CPU_ROWS_DIAG / G;
}

/* Work-item shapes of kind k for a (the tile table is cpu_internal.h). */
static void sa_cpu_plan_shape(const sa_attn *a, sa_cpu_plan *p) {
  const int64_t G = a->kv_heads > 0 ? a->q_heads / a->kv_heads : 1;
  if (p->which != SA_PLAN_DECODE || p->fwd_kernels) {
    sa_cpu_plan_rows(a, p->tile != SA_CPU_TILE_NONE, &p->bq, &p->bq_min);
    p->rows = G * p->bq;
    p->keys = p->tile != SA_CPU_TILE_NONE ? SA_CPU_TILE_BK : SA_CPU_BK;
    return;
  }
  /* Decode chunk = 16 * clamp(R, 32, 256) keys: at R = 8 rows (gpt-oss G = 8, one token) 512 keys, so the
     partials (R * (Hv + 1) floats per chunk) are ~1.6% of the cache bytes the chunk reads (bf16, H = Hv),
     and a 4k cache still gives 8 chunks per kv head to spread over threads. Larger R grows the chunk so
     the partials stay under ~6% of the traffic. The tile item takes 4 times that: it stages Q^T, configures the
     tiles and unpermutes o once per item, and at 2048 keys (gpt-oss, bf16 S 32k, 2 threads, Xeon with AMX) ran B8
     in 0.94-0.95x the time of 512 (1024 keys: 0.95-0.96x). */
  p->rows = G * a->q_len;
  int64_t r = p->rows < 32 ? 32 : p->rows > 256 ? 256 : p->rows;
  p->keys = (p->tile != SA_CPU_TILE_NONE ? 64 : 16) * r;
  /* At least 8 work items (batch x chunks) while chunks stay >= 256 keys (shape only, like the rule above):
     many rows (T = 64 tokens x G = 4: a 4096-key chunk) made a B = 1, 4k cache one item, one thread's work,
     and decode took 6.7 ms against 3.4 for sa_attn_fwd on 2 cores (N/K 8/2, H 64, f32). Splitting whatever
     the batch instead made B = 8 slower (44 -> 60 ms at T = 32, N/K 64/8, S 2k): 256 rows of partials per
     256-key chunk are as many bytes as the chunk's cache. */
  const int64_t want = a->batch >= 8 ? 1 : (8 + a->batch - 1) / (a->batch > 0 ? a->batch : 1);
  int64_t part = ((a->kv_len + want - 1) / want + 31) / 32 * 32;
  if (part < 256) part = 256;
  if (part < p->keys) p->keys = part;
  p->splits = a->kv_len > 0 ? (a->kv_len + p->keys - 1) / p->keys : 1;
}

/* Whether an AMX tile plan that can run a is also the default for it: the tile kernels pay a tile
   configuration per worker, operands padded to 16 rows and 32-element k steps and their staging per item,
   which tiny problems do not recover. Measured on 2 cores of a Xeon with AMX, bf16, CPU time, tile / vector
   (docs/performance.md): forward T = S = 16 1.5x (H 64) and 2.2x (H 16), T = S = 8 2.1-2.3x, T = 1 S = 16 0.92x;
   T = S = 32 0.54x (H 64, 128) and 0.84x (H 16); forward+backward T = S = 16 1.16x, T = S = 32 0.38-0.94x. So
   fewer than 32 keys take the vector kernels. Head dims off the 32-element k step cost the tiles padding but
   still win (forward+backward T = S = 256: H 8 0.65x, 16 0.56x, 48 0.29x, 80 0.27x). The tile decode wins from one
   row (N = K) and 64 keys on (0.56-0.74x at S 64 .. 1024, 0.64-0.82x at S 32k), and takes what its legality rule
   allows. */
#define SA_CPU_TILE_MIN_KEYS 32
static int sa_cpu_tile_wins(const sa_cpu_plan_kind *k, const sa_attn *a) {
  return k->which == SA_PLAN_DECODE || a->kv_len >= SA_CPU_TILE_MIN_KEYS;
}

/* The default kind of a call (NULL: none, which the always-legal scalar entries rule out); *tile_lost: an AMX
   tile kind could run the call but loses at its shape. */
static const sa_cpu_plan_kind *sa_cpu_plan_default(const sa_attn *a, int which, const sa_cpu_record *r,
                                                   int *tile_lost) {
  *tile_lost = 0;
  for (int i = 0; i < SA_CPU_NPLANS; i++) {
    const sa_cpu_plan_kind *k = &sa_cpu_plan_kinds[i];
    if (k->which != which || k->override_only || sa_cpu_plan_why_not(k, a, r)) continue;
    if (k->tile == SA_CPU_TILE_AMX && !sa_cpu_tile_wins(k, a)) {
      *tile_lost = 1;
      continue;
    }
    return k;
  }
  return NULL;
}

static void sa_cpu_plan_fill(const sa_cpu_plan_kind *k, const sa_attn *a, const sa_cpu_record *r, const char *reason,
                             sa_cpu_plan *p) {
  memset(p, 0, sizeof *p);
  p->name = k->name;
  p->which = k->which;
  p->simd = k->simd;
  p->tile = k->tile;
  if (k->fwd_kernels) { /* the kernels of the forward's default plan: the AMX tiles too where that wins */
    int lost;
    const sa_cpu_plan_kind *f = sa_cpu_plan_default(a, SA_PLAN_FWD, r, &lost);
    p->simd = f ? f->simd : r->simd;
    p->tile = f ? f->tile : SA_CPU_TILE_NONE;
  }
  p->bf16_dot = k->bf16_dot;
  p->fwd_kernels = k->fwd_kernels;
  p->reason = reason;
  sa_cpu_plan_shape(a, p);
}

static sa_status sa_cpu_plan_env_error(const sa_cpu_record *r) {
  return sa_error(SA_ERR_INVALID,
                  "SINKATTN_SIMD=\"%s\" unknown: use avx512, avx2 or scalar (it can only "
                  "lower the level the CPU has, %s)",
                  r->env, sa_cpu_simd_str(r->simd_cpu));
}

/* SA_ERR_INVALID naming the unknown plan and the known ones of the kind. */
static sa_status sa_cpu_plan_unknown(int which, const char *name) {
  char known[512];
  size_t n = 0;
  known[0] = 0;
  for (int i = 0; i < SA_CPU_NPLANS; i++)
    if (sa_cpu_plan_kinds[i].which == which && n < sizeof known)
      n += (size_t)snprintf(known + n, sizeof known - n, "%s%s", n ? ", " : "", sa_cpu_plan_kinds[i].name);
  return sa_error(SA_ERR_INVALID, "plan \"%s\" unknown for this kind of call: the CPU backend has %s", name, known);
}

sa_status sa_cpu_plan_make(const sa_attn *a, int which, const sa_cpu_record *r, const char *forced, sa_cpu_plan *p) {
  if (r->env_bad) return sa_cpu_plan_env_error(r);
  if (r->threads_bad)
    return sa_error(SA_ERR_INVALID,
                    "SINKATTN_NUM_THREADS=\"%s\" invalid: use a thread count >= 1 (0 or unset: "
                    "every online core)",
                    r->threads_env);
  if (forced && *forced) {
    const sa_cpu_plan_kind *k = sa_cpu_plan_find(forced);
    /* another backend's plan (the plan API knows every backend's names) forced on a call the CPU runs */
    if (strncmp(forced, "cpu.", 4) != 0)
      return sa_error(SA_ERR_UNSUPPORTED,
                      "plan %s cannot run this call: the CPU backend runs it (its plans are "
                      "cpu.*)",
                      forced);
    if (!k || k->which != which) return sa_cpu_plan_unknown(which, forced);
    const char *why = sa_cpu_plan_why_not(k, a, r);
    if (why) return sa_error(SA_ERR_UNSUPPORTED, "plan %s cannot run this call: %s", forced, why);
    const char *reason = k->tile == SA_CPU_TILE_AMX ? "forced; AMX tiles (amx_check compares them with the emulation)"
                         : k->tile == SA_CPU_TILE_EMULATED ? "forced; a test vehicle: the tile code, emulated tiles"
                                                           : "forced";
    sa_cpu_plan_fill(k, a, r, reason, p);
    return SA_OK;
  }
  int lost;
  const sa_cpu_plan_kind *k = sa_cpu_plan_default(a, which, r, &lost);
  /* unreachable: the scalar / portable entries are always legal */
  if (!k) return sa_error(SA_ERR_UNSUPPORTED, "CPU backend: no plan for call kind %d", which);
  sa_cpu_plan_fill(k, a, r,
                   k->fwd_kernels ? "a bias, a mask, positions or a soft-cap: the attention forward's kernels"
                   : k->tile == SA_CPU_TILE_AMX ? "bf16 on AMX tiles, which this CPU has and the OS granted"
                   : lost                  ? "fewer keys than the AMX tile kernels win at: the widest vector kernels"
                   : r->simd < r->simd_cpu ? "the widest kernels SINKATTN_SIMD allows"
                                           : "the widest kernels this CPU has",
                   p);
  return SA_OK;
}

int sa_cpu_plan_list(const sa_attn *a, int which, const sa_cpu_record *r, const char **names, int max) {
  int n = 0, lost;
  if (r->env_bad || r->threads_bad) return 0;
  const sa_cpu_plan_kind *d = sa_cpu_plan_default(a, which, r, &lost);
  if (d && n < max) names[n] = d->name;
  n += d != NULL;
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < SA_CPU_NPLANS; i++) {
      const sa_cpu_plan_kind *k = &sa_cpu_plan_kinds[i];
      if (k == d || k->which != which || k->override_only != pass || sa_cpu_plan_why_not(k, a, r)) continue;
      if (n < max) names[n] = k->name;
      n++;
    }
  return n;
}

size_t sa_cpu_plan_describe(const sa_cpu_plan *p, const sa_attn *a, int threads, char *buf, size_t n) {
  int w;
  if (p->which == SA_PLAN_DECODE && !p->fwd_kernels)
    w = snprintf(buf, n, "%s rows=%lld chunk=%lld splits=%lld items=%lld threads=%d reason=%s", p->name,
                 (long long)p->rows, (long long)p->keys, (long long)p->splits, (long long)(a->batch * p->splits),
                 threads, p->reason);
  else
    w = snprintf(buf, n, "%s simd=%s tile=%d rows=%lld keys=%lld threads=%d reason=%s", p->name,
                 sa_cpu_simd_str(p->simd), (int)p->tile, (long long)p->rows, (long long)p->keys, threads, p->reason);
  return w < 0 ? 0 : (size_t)w;
}

/* ---- the call's plan ------------------------------------------------------------------------- */

sa_status sa_cpu_plan_of(const sa_attn *a, int which, sa_cpu_plan *p) {
  return sa_cpu_plan_make(a, which, sa_cpu_record_get(), sa_plan_forced(which), p);
}

void sa_cpu_plan_ran(const sa_cpu_plan *p, const sa_attn *a, int threads) {
  char desc[256];
  sa_cpu_plan_describe(p, a, threads, desc, sizeof desc);
  sa_plan_record(p->which, desc);
}
