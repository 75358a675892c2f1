/*
 * test_cuda_feat.h — test_cuda's cases of the feature plans (hopper.fwd.features, hopper.bwd.twopass.features: a
 * bias, a mask array, query / key positions, the logits soft-cap) and the inputs they draw: included by
 * tests/test_cuda.c after its tc_case. A case names its bias by its dims and dtype ("1NTS/f32": [1, N, T, S]
 * float32), its mask by dims and a pattern, its positions by a pattern, its soft-cap by value; nanm puts NaN where
 * every pair is masked (bias elements, and the K rows of keys no query may see), which a select keeps out of every
 * output the reference computes as finite (dq excepted: dS K multiplies the zero dS of such a key by its NaN row,
 * as jax.nn's gradient does).
 */
#ifndef TEST_CUDA_FEAT_H
#define TEST_CUDA_FEAT_H

/* "BNTS": each letter a full axis, '1' a broadcast one. */
static void tc_dims(const char *pat, const int64_t full[4], int64_t out[4]) {
  for (int d = 0; d < 4; d++) out[d] = pat[d] == '1' ? 1 : full[d];
}

static sa_dtype tc_dtype_of(const char *pat) {
  const char *x = strchr(pat, '/');
  return !x ? SA_F32 : !strcmp(x + 1, "bf16") ? SA_BF16 : !strcmp(x + 1, "f16") ? SA_F16 : SA_F32;
}

#ifdef SINKATTN_WITH_CUDA

/* Mask patterns: 1 causal in content (j <= i), 2 random 70% with every 7th row empty, 3 documents of 96 tokens
   (block diagonal), 4 causal with the last 37 keys off for every row. Position patterns: 1 documents of 100
   restarting at 0 (Transformer Engine's segment_pos), 2 shifted (q + 1000, k + 997). */
static int tc_mask_at(int pat, int64_t i, int64_t j, int64_t S, uint64_t *s) {
  switch (pat) {
    case 1: return j <= i;
    case 2: return i % 7 != 3 && tc_rand(s) < 0.7;
    case 3: return i / 96 == j / 96;
    default: return j <= i && j < S - 37;
  }
}

/* The case's feature inputs on the host (set into *a; buffers to free in *bufs) */
typedef struct {
  void *bias;
  uint8_t *mask;
  int32_t *qp, *kp;
  int64_t nbias, nmask;
} tc_feat_bufs;

static void tc_feat_make(const tc_case *c, sa_attn *a, tc_feat_bufs *fb, uint64_t *s) {
  memset(fb, 0, sizeof *fb);
  const int64_t full[4] = {c->B, c->N, c->T, c->S};
  if (c->bias) {
    tc_dims(c->bias, full, a->bias_dims);
    a->bias_dtype = tc_dtype_of(c->bias);
    fb->nbias = sa_dims_count(a->bias_dims);
    fb->bias = malloc((size_t)fb->nbias * sa_dtype_size(a->bias_dtype) + 16);
    for (int64_t x = 0; x < fb->nbias; x++) sa_store(fb->bias, a->bias_dtype, x, (float)(6 * tc_rand(s) - 3));
    a->bias = fb->bias;
  }
  if (c->mpat) {
    tc_dims(c->mdims ? c->mdims : "1111", full, a->mask_dims);
    fb->nmask = sa_dims_count(a->mask_dims);
    fb->mask = malloc((size_t)fb->nmask + 16);
    const sa_bcast ms = sa_bcast_of(a->mask_dims);
    for (int64_t b = 0; b < a->mask_dims[0]; b++)
      for (int64_t n = 0; n < a->mask_dims[1]; n++)
        for (int64_t i = 0; i < a->mask_dims[2]; i++)
          for (int64_t j = 0; j < a->mask_dims[3]; j++)
            fb->mask[sa_bcast_at(ms, b, n, i, j)] = (uint8_t)(tc_mask_at(c->mpat, i, j, c->S, s) ? 1 + (j % 200) : 0);
    a->mask = fb->mask;
  }
  if (c->pos) {
    fb->qp = malloc((size_t)(c->B * c->T) * 4 + 16);
    fb->kp = malloc((size_t)(c->B * c->S) * 4 + 16);
    for (int64_t b = 0; b < c->B; b++) {
      for (int64_t i = 0; i < c->T; i++) fb->qp[b * c->T + i] = (int32_t)(c->pos == 1 ? i % 100 : i + 1000);
      for (int64_t j = 0; j < c->S; j++) fb->kp[b * c->S + j] = (int32_t)(c->pos == 1 ? j % 100 : j + 997);
    }
    a->q_positions = fb->qp;
    a->kv_positions = fb->kp;
  }
  a->logits_soft_cap = c->cap;
}

/* nanm 1: NaN in every bias element whose pairs are all masked; 2: also in the K rows of keys no pair may use. */
static void tc_feat_nan(const tc_case *c, const sa_attn *a, void *k, tc_feat_bufs *fb) {
  if (!c->nanm) return;
  const int64_t B = c->B, N = c->N, T = c->T, S = c->S, K = c->K, H = c->H, G = N / K;
  for (int64_t b = 0; b < B && c->nanm == 2; b++)
    for (int64_t kh = 0; kh < K; kh++)
      for (int64_t j = 0; j < S; j++) {
        int used = 0;
        for (int64_t n = kh * G; n < kh * G + G && !used; n++)
          for (int64_t i = 0; i < T && !used; i++) used = sa_attn_valid(a, b, n, i, j);
        if (!used)
          for (int64_t e = 0; e < H; e++) sa_store(k, c->dt, (b * S + j) * K * H + kh * H + e, NAN);
      }
  if (!fb->bias) return;
  for (int64_t x = 0; x < fb->nbias; x++) { /* an element is NaN-able when no (b, n, i, j) reading it is valid */
    int64_t r = x, idx[4];
    for (int d = 3; d >= 0; d--) idx[d] = r % a->bias_dims[d], r /= a->bias_dims[d];
    int used = 0;
    for (int64_t b = 0; b < (a->bias_dims[0] == 1 ? B : 1) && !used; b++)
      for (int64_t n = 0; n < (a->bias_dims[1] == 1 ? N : 1) && !used; n++)
        for (int64_t i = 0; i < (a->bias_dims[2] == 1 ? T : 1) && !used; i++)
          for (int64_t j = 0; j < (a->bias_dims[3] == 1 ? S : 1) && !used; j++) {
            const int64_t bb = a->bias_dims[0] == 1 ? b : idx[0], nn = a->bias_dims[1] == 1 ? n : idx[1];
            const int64_t ii = a->bias_dims[2] == 1 ? i : idx[2], jj = a->bias_dims[3] == 1 ? j : idx[3];
            used = sa_attn_valid(a, bb, nn, ii, jj);
          }
    if (!used) sa_store(fb->bias, a->bias_dtype, x, NAN);
  }
}

static void tc_feat_free(tc_feat_bufs *fb) {
  free(fb->bias);
  free(fb->mask);
  free(fb->qp);
  free(fb->kp);
}

#endif /* SINKATTN_WITH_CUDA */

/* Inside the Hopper feature plans' scope (src/cuda/plan.c, sa_feat_hop_scope): bf16, H = Hv in {64, 128}, T and S
   multiples of 128 (S <= 65536), masks [B or 1, N or 1, T, S], no segment ids; then five cases outside it, which the
   portable feature plans alone take. Every plan of each case runs (the TMA plans too, where their scope takes the
   case: a bias [., ., T, S], f32 at H64 in the forward; the portable ones, whose backward takes no bias): the forward
   and the backward (dbias too) against the fp64 reference. Sinks U(-10, 10) and +-50 (sink_range -r). */
/* one case a line */
// clang-format off
static const tc_case tc_feat_cases[] = {
    {.name = "feat bias BNTS f32 H128 causal dbias", .dt = SA_BF16, .B = 2, .T = 256, .S = 256, .N = 4, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10, .bias = "BNTS/f32"},
    {.name = "feat bias 1NTS bf16 H64 (dbias over B)", .dt = SA_BF16, .B = 3, .T = 256, .S = 384, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = -10, .bias = "1NTS/bf16"},
    {.name = "feat bias B1TS f16 H64 GQA4 (dbias over N)", .dt = SA_BF16, .B = 2, .T = 384, .S = 256, .N = 8, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10, .bias = "B1TS/f16"},
    {.name = "feat bias BNT1 f32 H128 window (per-row)", .dt = SA_BF16, .B = 1, .T = 256, .S = 256, .N = 2, .K = 1, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = 64, .wr = 32, .sink_range = 10, .bias = "BNT1/f32"},
    {.name = "feat mask B1TS causal content H128 +-50", .dt = SA_BF16, .B = 2, .T = 384, .S = 384, .N = 4, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 50, .mpat = 1, .mdims = "B1TS"},
    {.name = "feat mask 11TS causal content H64 GQA8", .dt = SA_BF16, .B = 1, .T = 512, .S = 512, .N = 16, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = -10, .mpat = 1, .mdims = "11TS"},
    {.name = "feat mask 1NTS random, empty rows H64", .dt = SA_BF16, .B = 2, .T = 256, .S = 384, .N = 4, .K = 4, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10, .mpat = 2, .mdims = "1NTS"},
    {.name = "feat mask BNTS documents vanilla H128", .dt = SA_BF16, .B = 1, .T = 384, .S = 384, .N = 2, .K = 1, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = 10, .mpat = 3, .mdims = "BNTS"},
    {.name = "feat mask + bias + causal + lens H64", .dt = SA_BF16, .B = 2, .T = 384, .S = 384, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .lens = 1, .dlse = 1, .sink_range = 10, .bias = "1NTS/f32", .mpat = 3, .mdims = "B1TS"},
    {.name = "feat positions docs causal H64", .dt = SA_BF16, .B = 2, .T = 256, .S = 256, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10, .pos = 1},
    {.name = "feat positions shifted window 50,0 H128", .dt = SA_BF16, .B = 1, .T = 384, .S = 256, .N = 2, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_TOP_LEFT, .wl = 50, .wr = 0, .diag = 3, .sink_range = 10, .pos = 2},
    {.name = "feat soft-cap 30 causal H128", .dt = SA_BF16, .B = 2, .T = 256, .S = 256, .N = 4, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10, .cap = 30.0f},
    {.name = "feat soft-cap 5 + bias + mask H64 +-50", .dt = SA_BF16, .B = 1, .T = 256, .S = 384, .N = 4, .K = 1, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = -10, .bias = "BNTS/bf16", .mpat = 2, .mdims = "B1TS", .cap = 5.0f},
    {.name = "feat NaN in masked bias H64", .dt = SA_BF16, .B = 2, .T = 256, .S = 256, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10, .bias = "BNTS/f32", .mpat = 2, .mdims = "BNTS", .nanm = 1},
    {.name = "feat bias BNTS bf16 H128 window lens", .dt = SA_BF16, .B = 2, .T = 256, .S = 384, .N = 4, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = 100, .wr = 0, .lens = 1, .dlse = 1, .sink_range = 10, .bias = "BNTS/bf16"},
    {.name = "feat bias 1NTS f16 + mask B1TS H128", .dt = SA_BF16, .B = 2, .T = 256, .S = 256, .N = 4, .K = 4, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = -10, .bias = "1NTS/f16", .mpat = 2, .mdims = "B1TS"},
    {.name = "feat bias B1TS f32 H64 causal", .dt = SA_BF16, .B = 2, .T = 384, .S = 384, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10, .bias = "B1TS/f32"},
    {.name = "feat NaN in masked keys (no dq) H128", .dt = SA_BF16, .B = 1, .T = 256, .S = 384, .N = 4, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = 50, .bias = "1NTS/f32", .mpat = 4, .mdims = "11TS", .nanm = 2},
    /* outside the Hopper scope: the portable feature plans alone (odd sizes, f16, head dims 32 / 96 / 256, a mask broadcast along the queries) */
    {.name = "feat portable key padding B11S f16 odd", .dt = SA_F16, .B = 2, .T = 77, .S = 130, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10, .mpat = 2, .mdims = "B11S"},
    {.name = "feat portable mask 1NTS causal content H96 lens", .dt = SA_BF16, .B = 2, .T = 100, .S = 100, .N = 4, .K = 4, .H = 96, .Hv = 96, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .lens = 1, .sink_range = -10, .mpat = 1, .mdims = "1NTS"},
    {.name = "feat portable positions window 20,0 H32 GQA3", .dt = SA_BF16, .B = 2, .T = 90, .S = 150, .N = 6, .K = 2, .H = 32, .Hv = 32, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_TOP_LEFT, .wl = 20, .wr = 0, .dlse = 1, .sink_range = 10, .pos = 1},
    {.name = "feat portable soft-cap 10 H256 BR +-50", .dt = SA_BF16, .B = 1, .T = 65, .S = 97, .N = 2, .K = 1, .H = 256, .Hv = 256, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = -50, .cap = 10.0f},
    {.name = "feat portable mask docs + positions + cap f16 H128", .dt = SA_F16, .B = 1, .T = 130, .S = 77, .N = 4, .K = 1, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10, .mpat = 3, .mdims = "BNTS", .pos = 2, .cap = 20.0f},
};
/* Production sizes: a causal-in-content mask at gpt-oss's heads, a per-head bias at H128. */
static const tc_case tc_feat_prod_cases[] = {
    {.name = "feat prod mask causal content gpt-oss 4096", .dt = SA_BF16, .B = 1, .T = 4096, .S = 4096, .N = 8, .K = 1, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .dlse = 1, .sink_range = -10, .mpat = 1, .mdims = "11TS"},
    {.name = "feat prod bias 1NTS bf16 H128 2048", .dt = SA_BF16, .B = 2, .T = 2048, .S = 2048, .N = 4, .K = 4, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .sink_range = 10, .bias = "1NTS/bf16"},
};
// clang-format on

#endif /* TEST_CUDA_FEAT_H */
