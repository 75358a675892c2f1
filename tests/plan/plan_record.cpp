/*
 * plan_record.cpp — what the CUDA backend enqueues for each shape of a cases file, on the runtime mock
 * (cuda_mock.cpp: an H200 that runs nothing). For every case: the forward's launches, the backward's
 * workspace bytes and launches, and (q_len <= 64) decode's; the kernel arguments that fix a schedule are
 * decoded (mirrors below: the kernels' parameter blocks, whose layout the SASS comparison keeps fixed).
 *   plan_record CASES            print the record (tests/plan/golden.txt is made so)
 *   plan_record --check GOLDEN   replay GOLDEN's cases and compare line by line (the plan lines aside); exit 1
 *                                on a difference
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "cuda_mock.h"
#include "feat.h"
#include "sa_plan.h"
#include "sinkattn.h"

namespace {

/* ---- mirrors of the kernels' parameter blocks ---- */
struct m_cuda_params {
  const void *q, *k, *v;
  void *out;
  float *lse;
  const float *sinks;
  const int32_t *q_lens, *kv_lens, *q_seg, *kv_seg;
  int64_t B, T, S, N, K, G, H, Hv;
  float scale, scale_log2;
  int softmax, causal;
  int64_t wl, wr, diag_offset;
  const void *dout;
  const float *dlse;
  void *dq, *dk, *dv;
  float *dsinks, *D, *dsink_part, *lse2;
  int64_t nqb;
};
struct m_decode_params {
  m_cuda_params p;
  int64_t rows, rowgroups, chunk, splits;
  int lanes;
  float *part_out, *part_lse;
};
struct m_hop_mask {
  long long off, wl, wr;
  int S, causal, dlo, dhi;
};
struct m_hop_shape {
  const int32_t *q_lens, *kv_lens;
  int causal;
  long long wl, wr, diag;
};
struct m_hop_params {
  void *out;
  float *lse;
  const float *sinks;
  int T, S, N, G, softmax;
  float scale_l2;
  m_hop_mask mask;
  m_hop_shape shape;
  const int32_t *q_seg, *kv_seg;
  int BH, n_mb, total, hg, nph;
};
/* the feature kernels' blocks: the plain block, then feat.h's sa_cuda_feat and their own fields */
struct m_hop_fwd_feat_params {
  m_hop_params base;
  sa_cuda_feat f;
  int B, b_fast, lists;
};
struct m_twopass_params {
  void *dq, *dk, *dv;
  const float *lse2, *D;
  int T, S, N, KH;
  float scale, scale_l2;
  m_hop_mask mask;
  m_hop_shape shape;
  int kb_slowest;
  const int32_t *q_seg, *kv_seg;
};
struct m_twopass_feat_params {
  m_twopass_params base;
  sa_cuda_feat f;
  int b0, n0;
};
struct m_feat_class_args {
  int64_t B, T, S, N, Hv, cb, cn;
  uint8_t *out;
};
struct m_onepass128_sched {
  int *sync;
  int nkb, G, n_all, d, total;
};
struct m_onepass64_sched {
  int *sync;
  float *part;
  int nkb, Gc, hs, n_all, d;
  size_t slice;
};

bool has(const char *s, const char *sub) { return strstr(s, sub) != nullptr; }

void decode(const char *k, void **args, char *buf, size_t n) {
  if (has(k, "sa_hop_fwd_kernel")) {
    const m_hop_params &h = *(const m_hop_params *)args[4];
    snprintf(buf, n, "BH=%d n_mb=%d total=%d hg=%d nph=%d", h.BH, h.n_mb, h.total, h.hg, h.nph);
    if (has(k, ", 1>")) { /* the feature kernel */
      const m_hop_fwd_feat_params &f = *(const m_hop_fwd_feat_params *)args[4];
      snprintf(buf + strlen(buf), n - strlen(buf), " b_fast=%d lists=%d cap=%g", f.b_fast, f.lists, (double)f.f.cap);
    }
  } else if (has(k, "sa_hop_twopass_dq_kernel") && has(k, ", 2, 1>")) {
    const m_twopass_feat_params &f = *(const m_twopass_feat_params *)args[5];
    snprintf(buf, n, "b0=%d n0=%d dbias=%d classes=%d", f.b0, f.n0, f.f.dbias_out != nullptr, f.f.cls != nullptr);
  } else if (has(k, "sa_feat_class_kernel")) {
    const m_feat_class_args &c = *(const m_feat_class_args *)args[1];
    snprintf(buf, n, "cb=%lld cn=%lld lists=%d", (long long)c.cb, (long long)c.cn, c.out != nullptr);
  } else if (has(k, "sa_hop_onepass64_kernel")) {
    const m_onepass64_sched &s = *(const m_onepass64_sched *)args[8];
    snprintf(buf, n, "nkb=%d Gc=%d hs=%d n_all=%d d=%d items=%d", s.nkb, s.Gc, s.hs, s.n_all, s.d,
             *(const int *)args[9]);
  } else if (has(k, "sa_hop_onepass128_kernel")) {
    const m_onepass128_sched &s = *(const m_onepass128_sched *)args[8];
    snprintf(buf, n, "nkb=%d G=%d n_all=%d d=%d items=%d", s.nkb, s.G, s.n_all, s.d, s.total);
  } else if (has(k, "sa_decode")) {
    const m_decode_params &d = *(const m_decode_params *)args[0];
    snprintf(buf, n, "rows=%lld rowgroups=%lld chunk=%lld splits=%lld lanes=%d", (long long)d.rows,
             (long long)d.rowgroups, (long long)d.chunk, (long long)d.splits, d.lanes);
  } else if (has(k, "sa_hop_dkdv_sum_kernel")) {
    snprintf(buf, n, "n=%zu hs=%d", *(const size_t *)args[3], *(const int *)args[4]);
  } else if (has(k, "sa_hop_dq_convert_kernel")) {
    snprintf(buf, n, "rows=%d", *(const int *)args[6]);
  }
}

struct tcase {
  std::string name, line;
  std::string force; /* a plan the case forces (force=NAME: the override-only variants), or empty */
  sa_attn a;
};

int parse_enum(const char *s, const char *const *names, int n) {
  for (int i = 0; i < n; ++i)
    if (!strcmp(s, names[i])) return i;
  fprintf(stderr, "plan_record: unknown value '%s'\n", s);
  exit(2);
}

/* "name | dtype B T S N K H Hv softmax causal wl wr diag lens segs [bias=DIMS/DTYPE] [mask=DIMS] [pos=1] [cap=X]
   [force=PLAN]" (DIMS as test_cuda's: "1NTS" is [1, N, T, S]); a case with one of bias .. cap runs the feature plans,
   one with force= runs that plan in its direction (the others their defaults). */
bool parse_case(const std::string &line, tcase *c) {
  const size_t bar = line.find(" | ");
  if (bar == std::string::npos) return false;
  c->name = line.substr(0, bar);
  c->line = line;
  char dt[8], sm[16], ca[16];
  long long B, T, S, N, K, H, Hv, wl, wr, diag;
  int lens, segs;
  if (sscanf(line.c_str() + bar + 3, "%7s %lld %lld %lld %lld %lld %lld %lld %15s %15s %lld %lld %lld %d %d", dt, &B,
             &T, &S, &N, &K, &H, &Hv, sm, ca, &wl, &wr, &diag, &lens, &segs) != 15) {
    fprintf(stderr, "plan_record: cannot parse '%s'\n", line.c_str());
    exit(2);
  }
  static const char *const dts[] = {"f32", "f16", "bf16"}, *const sms[] = {"vanilla", "off_by_one", "learnable"},
                           *const cas[] = {"none", "top_left", "bottom_right"};
  sa_attn &a = c->a;
  sa_attn_init(&a);
  a.dtype = (sa_dtype)parse_enum(dt, dts, 3);
  a.batch = B, a.q_len = T, a.kv_len = S, a.q_heads = N, a.kv_heads = K, a.head_dim = H, a.v_head_dim = Hv;
  a.softmax = (sa_softmax)parse_enum(sm, sms, 3);
  a.causal = (sa_causal)parse_enum(ca, cas, 3);
  a.window_left = wl, a.window_right = wr, a.diag_offset = diag;
  /* device addresses the mock never dereferences: 256-byte aligned, one region each */
  auto dev = [](int k) { return (void *)(uintptr_t)(0x100000000000ull + (uint64_t)k * 0x1000000000ull); };
  a.q = dev(1), a.k = dev(2), a.v = dev(3), a.out = dev(4), a.lse = (float *)dev(5);
  a.sinks = a.softmax == SA_SOFTMAX_LEARNABLE ? (const float *)dev(6) : nullptr;
  if (lens) a.q_lens = (const int32_t *)dev(7), a.kv_lens = (const int32_t *)dev(8);
  if (segs) a.q_segment_ids = (const int32_t *)dev(9), a.kv_segment_ids = (const int32_t *)dev(10);
  const long long full[4] = {B, N, T, S};
  for (size_t at = line.find(' ', bar + 3); at != std::string::npos; at = line.find(' ', at + 1)) {
    char dims[8] = "", dtype[8] = "f32";
    if (sscanf(line.c_str() + at + 1, "bias=%4s/%7s", dims, dtype) >= 1 && strlen(dims) == 4) {
      for (int d = 0; d < 4; ++d) a.bias_dims[d] = dims[d] == '1' ? 1 : full[d];
      a.bias_dtype = (sa_dtype)parse_enum(dtype, dts, 3);
      a.bias = dev(11);
    } else if (sscanf(line.c_str() + at + 1, "mask=%4s", dims) == 1 && strlen(dims) == 4) {
      for (int d = 0; d < 4; ++d) a.mask_dims[d] = dims[d] == '1' ? 1 : full[d];
      a.mask = (const uint8_t *)dev(12);
    } else if (!strncmp(line.c_str() + at + 1, "force=", 6)) {
      const size_t end = line.find(' ', at + 1);
      c->force = line.substr(at + 7, end == std::string::npos ? std::string::npos : end - at - 7);
    } else if (!strncmp(line.c_str() + at + 1, "pos=1", 5)) {
      a.q_positions = (const int32_t *)dev(13), a.kv_positions = (const int32_t *)dev(14);
    } else {
      sscanf(line.c_str() + at + 1, "cap=%f", &a.logits_soft_cap);
    }
  }
  return true;
}

/* The case takes the feature plans (override-only: run_case forces them). */
bool feature_case(const sa_attn &a) { return a.bias || a.mask || a.q_positions || a.logits_soft_cap != 0.0f; }

void run_case(const tcase &c, FILE *out) {
  static const char *const st[] = {"SA_OK", "SA_ERR_INVALID", "SA_ERR_UNSUPPORTED", "SA_ERR_NO_MEMORY",
                                   "SA_ERR_DEVICE"};
  fprintf(out, "case %s\n", c.line.c_str());
  void *stream = (void *)(uintptr_t)0x5000;
  const bool feat = feature_case(c.a);
  if (feat)
    sa_plan_force(SA_PLAN_FWD, "hopper.fwd.features"), sa_plan_force(SA_PLAN_BWD, "hopper.bwd.twopass.features");
  const int fk = c.force.empty()                                 ? -1
                 : c.force.find(".decode.") != std::string::npos ? SA_PLAN_DECODE
                 : c.force.find(".bwd.") != std::string::npos    ? SA_PLAN_BWD
                                                                 : SA_PLAN_FWD;
  if (fk >= 0) sa_plan_force(fk, c.force.c_str());
  fprintf(out, " fwd\n");
  sa_status s = sa_attn_fwd(&c.a, SA_BACKEND_CUDA, stream);
  if (s != SA_OK) fprintf(out, "  status %s\n", st[s]);
  else fprintf(out, "  plan %s\n", sa_plan_last(SA_PLAN_FWD));
  sa_attn_grad g;
  memset(&g, 0, sizeof g);
  g.dout = (void *)(uintptr_t)0x200000000000ull, g.dq = (void *)(uintptr_t)0x210000000000ull;
  g.dk = (void *)(uintptr_t)0x220000000000ull, g.dv = (void *)(uintptr_t)0x230000000000ull;
  g.dsinks = c.a.softmax == SA_SOFTMAX_LEARNABLE ? (float *)(uintptr_t)0x240000000000ull : nullptr;
  g.dbias = c.a.bias ? (float *)(uintptr_t)0x250000000000ull : nullptr;
  const size_t ws = sa_attn_bwd_workspace_size(&c.a, SA_BACKEND_CUDA);
  fprintf(out, " bwd ws=%zu\n", ws);
  s = sa_attn_bwd(&c.a, &g, (void *)(uintptr_t)0x300000000000ull, ws, SA_BACKEND_CUDA, stream);
  if (s != SA_OK) fprintf(out, "  status %s\n", st[s]);
  else fprintf(out, "  plan %s\n", sa_plan_last(SA_PLAN_BWD));
  if (feat) sa_plan_force(SA_PLAN_FWD, nullptr), sa_plan_force(SA_PLAN_BWD, nullptr);
  if (fk >= 0 && fk != SA_PLAN_DECODE) sa_plan_force(fk, nullptr);
  if (c.a.q_len <= 64) {
    const size_t dws = sa_attn_decode_workspace_size(&c.a, SA_BACKEND_CUDA);
    fprintf(out, " decode ws=%zu\n", dws);
    s = sa_attn_decode_fwd(&c.a, (void *)(uintptr_t)0x400000000000ull, dws, SA_BACKEND_CUDA, stream);
    if (s != SA_OK) fprintf(out, "  status %s\n", st[s]);
    else fprintf(out, "  plan %s\n", sa_plan_last(SA_PLAN_DECODE));
  }
  if (fk == SA_PLAN_DECODE) sa_plan_force(fk, nullptr);
}

std::vector<std::string> read_lines(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "plan_record: cannot open %s\n", path);
    exit(2);
  }
  std::vector<std::string> v;
  char buf[1024];
  while (fgets(buf, sizeof buf, f)) {
    std::string s(buf);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    v.push_back(s);
  }
  fclose(f);
  return v;
}

} /* namespace */

int main(int argc, char **argv) {
  sa_mock_decoder_set(decode);
  if (argc == 2) {
    sa_mock_log_set(stdout);
    printf("# plan_record %s: the CUDA backend's launches on a mocked H200 (CC 9.0, 132 SMs)\n", argv[1]);
    for (const std::string &l : read_lines(argv[1])) {
      tcase c;
      if (l.empty() || l[0] == '#' || !parse_case(l, &c)) continue;
      run_case(c, stdout);
    }
    return 0;
  }
  if (argc == 3 && !strcmp(argv[1], "--check")) {
    /* The golden record's lines of each case against this build's, the plan lines aside: they describe the
       plan (tests/test_plan.c checks the choices); the launches are what this record pins. */
    const std::vector<std::string> golden = read_lines(argv[2]);
    int cases = 0, bad = 0;
    for (size_t i = 0; i < golden.size(); ++i) {
      if (golden[i].rfind("case ", 0) != 0) continue;
      std::vector<std::string> want;
      for (size_t j = i + 1; j < golden.size() && golden[j].rfind("case ", 0) != 0; ++j)
        if (golden[j].rfind("  plan ", 0) != 0) want.push_back(golden[j]);
      tcase c;
      parse_case(golden[i].substr(5), &c);
      FILE *f = tmpfile();
      sa_mock_log_set(f);
      run_case(c, f);
      sa_mock_log_set(nullptr);
      rewind(f);
      std::vector<std::string> got;
      char buf[1024];
      while (fgets(buf, sizeof buf, f)) {
        std::string l(buf);
        while (!l.empty() && l.back() == '\n') l.pop_back();
        if (l.rfind("  plan ", 0) == 0 || l.rfind("case ", 0) == 0) continue;
        got.push_back(l);
      }
      fclose(f);
      ++cases;
      if (got != want) {
        ++bad;
        printf("FAIL %s\n", golden[i].c_str());
        for (size_t j = 0; j < want.size() || j < got.size(); ++j) {
          const std::string w = j < want.size() ? want[j] : "", g = j < got.size() ? got[j] : "";
          if (w != g) printf("  want: %s\n  got:  %s\n", w.c_str(), g.c_str());
        }
      }
    }
    printf("plan_record --check: %d cases, %d passed, %d failed\n", cases, cases - bad, bad);
    return bad ? 1 : 0;
  }
  fprintf(stderr, "usage: plan_record CASES | plan_record --check GOLDEN\n");
  return 2;
}
