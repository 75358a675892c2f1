/*
 * cpu_kernel_keys.h — the dq pass's keys that hold a NaN or an inf (c->k_bad, cpu_attn.c), for the kernel body
 * (cpu_kernel_body.h), which includes it after its row buffers (sa_bufs, kv_rows, LOAD_ROW): a key the masks
 * hide from a query must not reach that query's dq, though dq += dS k multiplies every key of a tile by the
 * query's ds, 0 for the hidden pair. Calls with finite keys never come here.
 */
#ifndef SA_CPU_KERNEL_KEYS_H
#define SA_CPU_KERNEL_KEYS_H

/* Whether key row `row` of k (H elements) holds a NaN or an inf. */
static int key_row_bad(const sa_attn *a, int64_t row) {
  for (int64_t e = 0; e < a->head_dim; e++)
    if (!isfinite(sa_load(a->k, a->dtype, row * a->head_dim + e))) return 1;
  return 0;
}

/* dq += dS k multiplies every ds by every key row of the tile: a masked pair's ds is 0, and 0 times a NaN or
   an inf in its key is NaN in that query's dq. So where some key holds one (c->k_bad), the tile's rows that do
   are zeroed in the product's K operand (the tile layer's rows read in place are copied into the row buffer
   first) and bad_keys_in adds them back for the pairs whose ds is not 0. Returns how many. */
static int64_t bad_keys_out(const sa_cpu_ctx *c, sa_bufs *B, kv_rows *kv, int64_t b, int64_t kh, int64_t j0,
                            int64_t nk) {
  const sa_attn *a = c->a;
  const int64_t row0 = (b * a->kv_len + j0) * a->kv_heads + kh;
  int64_t bad = 0;
  for (int64_t jj = 0; jj < nk; jj++) bad += key_row_bad(a, row0 + jj * a->kv_heads);
  if (!bad) return 0;
  if (kv->k != B->kr) {
    for (int64_t jj = 0; jj < nk; jj++)
      LOAD_ROW(B->kr + jj * c->hp, a->k, a->dtype, (row0 + jj * a->kv_heads) * a->head_dim, a->head_dim, c->hp, 1.0f);
    kv->k = B->kr;
    kv->kld = c->hp;
  }
  for (int64_t jj = 0; jj < nk; jj++)
    if (key_row_bad(a, row0 + jj * a->kv_heads)) memset(B->kr + jj * c->hp, 0, (size_t)c->hp * sizeof(float));
  return bad;
}

/* The zeroed key rows' part of dq += dS k (dS^T in B->dp [nk x Mp]), for the pairs whose ds is not 0. */
static void bad_keys_in(const sa_cpu_ctx *c, const sa_bufs *B, int64_t b, int64_t kh, int64_t j0, int64_t nk, int64_t M,
                        int64_t Mp) {
  const sa_attn *a = c->a;
  const int64_t H = a->head_dim, row0 = (b * a->kv_len + j0) * a->kv_heads + kh;
  for (int64_t jj = 0; jj < nk; jj++) {
    const int64_t row = row0 + jj * a->kv_heads;
    if (!key_row_bad(a, row)) continue;
    for (int64_t r = 0; r < M; r++) {
      const float ds = B->dp[jj * Mp + r];
      if (ds != 0.0f)
        for (int64_t e = 0; e < H; e++) B->acc[r * c->hp + e] += ds * sa_load(a->k, a->dtype, row * H + e);
    }
  }
}

#endif /* SA_CPU_KERNEL_KEYS_H */
