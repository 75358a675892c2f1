/*
 * fuzz_ffi.c — libFuzzer target for the XLA FFI handlers' decoding (src/ffi/): the four handlers
 * (fwd/bwd x cpu/CUDA) get call frames that start as a well-formed call (the buffer layout of
 * src/ffi/ffi_attn.c, version 4 with bias / mask / positions / dbias present or as placeholders, a soft-cap or
 * none; 0-2 vmap dims) and then take up to 8 mutations picked by the input: wrong argument
 * or result counts, non-buffer argument types, dtypes, ranks and dims; attribute names (unknown, empty,
 * prefixes, not NUL-terminated), types (array, string, dictionary), scalar dtypes and values (enums out
 * of range, huge offsets, NaN scale or soft-cap, a cap that float32 cannot hold); the metadata handshake and
 * other execution stages.
 *
 * XLA is replaced by a fake XLA_FFI_Api holding the few functions the handlers call (Error_Create,
 * Error_Destroy, Stream_Get: names every jaxlib header shares). Buffers are always consistent with their
 * dims (XLA guarantees that) and allocated at their exact size, as are scalar attribute payloads (4-byte
 * S32 read as 8 bytes would show). What must hold: no crash and no sanitizer report; a handler returns NULL or an
 * error made by this fake API with a non-empty message; the metadata query returns NULL and fills in
 * the declared API version. Compiled against the installed jaxlib's header (jax.ffi.include_dir()).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "xla/ffi/api/c_api.h"

XLA_FFI_Error *sa_jax_attn_fwd_cpu(XLA_FFI_CallFrame *f);
XLA_FFI_Error *sa_jax_attn_bwd_cpu(XLA_FFI_CallFrame *f);
XLA_FFI_Error *sa_jax_attn_fwd_cuda(XLA_FFI_CallFrame *f);
XLA_FFI_Error *sa_jax_attn_bwd_cuda(XLA_FFI_CallFrame *f);
int sa_jax_ffi_api_version(void);

#define FF_REQUIRE(cond)           \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

/* ---- the fake XLA ----------------------------------------------------------------------------- */

#define FF_MAGIC 0x5a17e11u
struct XLA_FFI_Error {
  uint32_t magic;
  XLA_FFI_Error_Code code;
  char msg[];
};

static XLA_FFI_Error *ff_error_create(XLA_FFI_Error_Create_Args *args) {
  FF_REQUIRE(args->struct_size >= XLA_FFI_Error_Create_Args_STRUCT_SIZE && args->message);
  size_t n = strlen(args->message);
  XLA_FFI_Error *e = malloc(sizeof *e + n + 1);
  FF_REQUIRE(e);
  e->magic = FF_MAGIC;
  e->code = args->errc;
  memcpy(e->msg, args->message, n + 1);
  return e;
}
static void ff_error_destroy(XLA_FFI_Error_Destroy_Args *args) { free(args->error); }
static XLA_FFI_Error *ff_stream_get(XLA_FFI_Stream_Get_Args *args) {
  args->stream = NULL; /* no GPU here: the CUDA handlers then fail cleanly in sa_attn_* */
  return NULL;
}

static XLA_FFI_Api ff_api;

static void ff_api_init(void) {
  ff_api.struct_size = sizeof ff_api;
  ff_api.api_version.struct_size = sizeof ff_api.api_version;
  ff_api.api_version.major_version = XLA_FFI_API_MAJOR;
  ff_api.api_version.minor_version = XLA_FFI_API_MINOR;
  ff_api.XLA_FFI_Error_Create = ff_error_create;
  ff_api.XLA_FFI_Error_Destroy = ff_error_destroy;
  ff_api.XLA_FFI_Stream_Get = ff_stream_get;
}

/* ---- reading the input ------------------------------------------------------------------------- */

typedef struct {
  const uint8_t *p;
  size_t n;
} ff_in;
static unsigned ff_u8(ff_in *in) {
  if (!in->n) return 0;
  in->n--;
  return *in->p++;
}
static int ff_pick(ff_in *in, int n) { return (int)(ff_u8(in) % (unsigned)n); }

/* ---- the frame ------------------------------------------------------------------------------------ */

enum { FF_MAX_BUF = 24, FF_MAX_RANK = 12, FF_MAX_ATTR = 20 };

typedef struct {
  XLA_FFI_Buffer b;
  int64_t dims[FF_MAX_RANK];
} ff_buf;

typedef struct {
  char name[16];
  XLA_FFI_ByteSpan span;
  XLA_FFI_AttrType type;
  XLA_FFI_DataType dtype;
  int64_t value; /* scalar payload (integers); the float attribute uses fvalue */
  double fvalue;
  void *payload; /* exact-size scalar value, or the array / string / dictionary struct */
  XLA_FFI_Scalar scalar;
  XLA_FFI_Array array;
  XLA_FFI_Attrs dict;
} ff_attr;

typedef struct {
  ff_buf bufs[FF_MAX_BUF]; /* args first, then rets */
  XLA_FFI_ArgType arg_types[FF_MAX_BUF];
  XLA_FFI_RetType ret_types[FF_MAX_BUF];
  void *arg_ptrs[FF_MAX_BUF], *ret_ptrs[FF_MAX_BUF];
  int nargs, nrets;
  ff_attr attrs[FF_MAX_ATTR];
  int nattrs;
  XLA_FFI_AttrType attr_types[FF_MAX_ATTR];
  XLA_FFI_ByteSpan *attr_names[FF_MAX_ATTR];
  void *attr_ptrs[FF_MAX_ATTR];
} ff_frame;

/* The harness's own element sizes, not the handlers' sa_ffi_elem_size: buffers sized by the code under test
   could not expose its mistakes. */
static size_t ff_elem(XLA_FFI_DataType t) {
  switch (t) {
    case XLA_FFI_DataType_F64:
    case XLA_FFI_DataType_S64:
    case XLA_FFI_DataType_U64: return 8;
    case XLA_FFI_DataType_F32:
    case XLA_FFI_DataType_S32:
    case XLA_FFI_DataType_U32: return 4;
    case XLA_FFI_DataType_F16:
    case XLA_FFI_DataType_BF16:
    case XLA_FFI_DataType_S16: return 2;
    default: return 1;
  }
}

static const XLA_FFI_DataType ff_dtypes[] = {
    XLA_FFI_DataType_F32, XLA_FFI_DataType_F16,  XLA_FFI_DataType_BF16, XLA_FFI_DataType_S32,     XLA_FFI_DataType_S64,
    XLA_FFI_DataType_U8,  XLA_FFI_DataType_PRED, XLA_FFI_DataType_F64,  XLA_FFI_DataType_INVALID, XLA_FFI_DataType_C64};

/* Buffer layouts of src/ffi/ffi_attn.c as dim letters: B T S N K H V(=Hv) W(=workspace bytes) 0 (a
   zero-size placeholder); the kind says the dtype: 'd' the data dtype, 'b' the bias dtype, 'f' f32,
   'i' s32, 'u' u8, 'p' pred. */
typedef struct {
  char kind;
  const char *dims;
} ff_spec;
static const ff_spec ff_fwd_args[] = {{'d', "BTNH"}, {'d', "BSKH"}, {'d', "BSKV"}, {'f', "N"},
                                      {'i', "B"},    {'i', "B"},    {'i', "BT"},   {'i', "BS"}};
static const ff_spec ff_extra_args[] = {{'b', "BNTS"}, {'p', "BNTS"}, {'i', "BT"}, {'i', "BS"}};
static const ff_spec ff_fwd_rets[] = {{'d', "BTNV"}, {'f', "BNT"}};
static const ff_spec ff_bwd_extra_args[] = {{'d', "BTNV"}, {'f', "BNT"}, {'d', "BTNV"}, {'f', "BNT"}};
static const ff_spec ff_bwd_rets[] = {{'d', "BTNH"}, {'d', "BSKH"}, {'d', "BSKV"},
                                      {'f', "N"},    {'f', "BNTS"}, {'u', "W"}};
static const ff_spec ff_placeholder = {'f', "0"};

static void ff_set_buf(ff_buf *fb, const ff_spec *sp, const int64_t *sizes, XLA_FFI_DataType dt, XLA_FFI_DataType bt,
                       int nlead, const int64_t *lead) {
  fb->b.struct_size = XLA_FFI_Buffer_STRUCT_SIZE;
  fb->b.dtype = sp->kind == 'd'   ? dt
                : sp->kind == 'b' ? bt
                : sp->kind == 'f' ? XLA_FFI_DataType_F32
                : sp->kind == 'i' ? XLA_FFI_DataType_S32
                : sp->kind == 'p' ? XLA_FFI_DataType_PRED
                                  : XLA_FFI_DataType_U8;
  int r = 0;
  for (int d = 0; d < nlead; d++) fb->dims[r++] = lead[d];
  for (const char *c = sp->dims; *c; c++) fb->dims[r++] = sizes[strchr("BTSNKHVW0", *c) - "BTSNKHVW0"];
  fb->b.rank = r;
  fb->b.dims = fb->dims;
}

/* The size-1 axes of a bias or mask: dims 1 where `ones` has the bit (B N T S = bits 3 2 1 0). */
static void ff_bcast(ff_buf *fb, int nlead, unsigned ones) {
  for (int d = 0; d < 4; d++)
    if (ones >> (3 - d) & 1) fb->dims[nlead + d] = 1;
}

enum {
  FA_CAUSAL,
  FA_DIAG_OFFSET,
  FA_HAS_DLSE,
  FA_HAS_KV_LENS,
  FA_HAS_Q_LENS,
  FA_HAS_SEGMENTS,
  FA_SCALE,
  FA_SOFTMAX,
  FA_WINDOW_LEFT,
  FA_WINDOW_RIGHT,
  FA_HAS_BIAS,
  FA_HAS_MASK,
  FA_HAS_POSITIONS,
  FA_HAS_DBIAS,
  FA_LOGITS_SOFT_CAP,
  FF_NATTR
};
static const char *const ff_attr_names[FF_NATTR] = {[FA_CAUSAL] = "causal",
                                                    [FA_DIAG_OFFSET] = "diag_offset",
                                                    [FA_HAS_DLSE] = "has_dlse",
                                                    [FA_HAS_KV_LENS] = "has_kv_lens",
                                                    [FA_HAS_Q_LENS] = "has_q_lens",
                                                    [FA_HAS_SEGMENTS] = "has_segments",
                                                    [FA_SCALE] = "scale",
                                                    [FA_SOFTMAX] = "softmax",
                                                    [FA_WINDOW_LEFT] = "window_left",
                                                    [FA_WINDOW_RIGHT] = "window_right",
                                                    [FA_HAS_BIAS] = "has_bias",
                                                    [FA_HAS_MASK] = "has_mask",
                                                    [FA_HAS_POSITIONS] = "has_positions",
                                                    [FA_HAS_DBIAS] = "has_dbias",
                                                    [FA_LOGITS_SOFT_CAP] = "logits_soft_cap"};

static void ff_set_attr(ff_attr *at, const char *name, XLA_FFI_DataType dt, int64_t value) {
  memset(at, 0, sizeof *at);
  strncpy(at->name, name, sizeof at->name - 1);
  at->span.len = strlen(at->name);
  at->type = XLA_FFI_AttrType_SCALAR;
  at->dtype = dt;
  at->value = value;
  at->fvalue = (double)value;
}

/* A well-formed call: what Python's ffi_call would send (version 3 of the layout). */
static void ff_build(ff_in *in, ff_frame *fr, int bwd, int cuda) {
  static const XLA_FFI_DataType dts[] = {XLA_FFI_DataType_F32, XLA_FFI_DataType_F16, XLA_FFI_DataType_BF16};
  XLA_FFI_DataType dt = dts[ff_pick(in, 3)], bt = dts[ff_pick(in, 3)];
  int64_t K = 1 + ff_pick(in, 2), N = K * (1 + ff_pick(in, 2));
  int64_t sizes[9] = {ff_pick(in, 3),     ff_pick(in, 5),     ff_pick(in, 5),        N, K,
                      1 + ff_pick(in, 8), 1 + ff_pick(in, 8), ff_pick(in, 4) * 4096, 0};
  int nlead = ff_pick(in, 3);
  int64_t lead[2] = {ff_pick(in, 4), 1 + ff_pick(in, 2)};
  int has_bias = ff_pick(in, 2), has_mask = ff_pick(in, 2);
  int has_pos = ff_pick(in, 2), has_dbias = bwd && has_bias && ff_pick(in, 2);
  unsigned bias_ones = ff_u8(in) & 15, mask_ones = ff_u8(in) & 15;
  fr->nargs = fr->nrets = 0;
  for (int x = 0; x < 8; x++) ff_set_buf(&fr->bufs[fr->nargs++], &ff_fwd_args[x], sizes, dt, bt, nlead, lead);
  const int present[4] = {has_bias, has_mask, has_pos, has_pos};
  for (int x = 0; x < 4; x++) {
    ff_buf *fb = &fr->bufs[fr->nargs++];
    ff_set_buf(fb, present[x] ? &ff_extra_args[x] : &ff_placeholder, sizes, dt, bt, nlead, lead);
    if (present[x] && x < 2) ff_bcast(fb, nlead, x == 0 ? bias_ones : mask_ones);
    if (present[x] && x < 2 && nlead && ff_pick(in, 3) == 0) /* unbatched under vmap */
      for (int d = 0; d < nlead; d++) fb->dims[d] = 1;
  }
  if (bwd)
    for (int x = 0; x < 4; x++) ff_set_buf(&fr->bufs[fr->nargs++], &ff_bwd_extra_args[x], sizes, dt, bt, nlead, lead);
  for (int x = 0; x < (bwd ? 6 : 2); x++) {
    if (bwd && x == 5 && !cuda) continue; /* the workspace: CUDA only */
    ff_buf *fb = &fr->bufs[fr->nargs + fr->nrets++];
    const ff_spec *sp = bwd ? (x == 4 && !has_dbias ? &ff_placeholder : &ff_bwd_rets[x]) : &ff_fwd_rets[x];
    ff_set_buf(fb, sp, sizes, dt, bt, nlead, lead);
    if (bwd && x == 4 && has_dbias) ff_bcast(fb, nlead, bias_ones);
  }
  if (nlead && ff_pick(in, 2)) { /* unbatched sinks under vmap: lead dims of 1 */
    for (int d = 0; d < nlead; d++) fr->bufs[3].dims[d] = 1;
  }
  int64_t vals[FF_NATTR];
  vals[FA_CAUSAL] = ff_pick(in, 3);
  vals[FA_DIAG_OFFSET] = (int64_t)ff_pick(in, 9) - 4;
  vals[FA_HAS_DLSE] = ff_pick(in, 2);
  vals[FA_HAS_KV_LENS] = ff_pick(in, 2);
  vals[FA_HAS_Q_LENS] = ff_pick(in, 2);
  vals[FA_HAS_SEGMENTS] = ff_pick(in, 2);
  vals[FA_SCALE] = 0;
  vals[FA_SOFTMAX] = ff_pick(in, 3);
  vals[FA_WINDOW_LEFT] = (int64_t)ff_pick(in, 6) - 1;
  vals[FA_WINDOW_RIGHT] = (int64_t)ff_pick(in, 6) - 1;
  vals[FA_HAS_BIAS] = has_bias;
  vals[FA_HAS_MASK] = has_mask;
  vals[FA_HAS_POSITIONS] = has_pos;
  vals[FA_HAS_DBIAS] = has_dbias;
  vals[FA_LOGITS_SOFT_CAP] = 0;
  fr->nattrs = 0;
  for (int x = 0; x < FF_NATTR; x++) {
    if (!bwd && (x == FA_HAS_DLSE || x == FA_HAS_DBIAS)) continue; /* backward only */
    ff_attr *at = &fr->attrs[fr->nattrs++];
    const int is_bool =
        x == FA_HAS_DLSE || x == FA_HAS_KV_LENS || x == FA_HAS_Q_LENS || x == FA_HAS_SEGMENTS || x >= FA_HAS_BIAS;
    const int is_float = x == FA_SCALE || x == FA_LOGITS_SOFT_CAP;
    XLA_FFI_DataType t = is_float ? XLA_FFI_DataType_F64 : is_bool ? XLA_FFI_DataType_PRED : XLA_FFI_DataType_S64;
    ff_set_attr(at, ff_attr_names[x], t, vals[x]);
    if (x == FA_SCALE) at->fvalue = ff_pick(in, 2) ? 0.0 : 0.25;
    if (x == FA_LOGITS_SOFT_CAP) { /* none, a cap that bites, one that does not, as f64 or f32 (np.float32) */
      static const double caps[] = {0.0, 0.0, 0.5, 5.0, 1e30};
      at->fvalue = caps[ff_pick(in, 5)];
      if (ff_pick(in, 2)) at->dtype = XLA_FFI_DataType_F32;
    }
  }
}

/* One mutation of a well-formed frame. */
static void ff_mutate(ff_in *in, ff_frame *fr) {
  int nb = fr->nargs + fr->nrets;
  ff_buf *b = nb ? &fr->bufs[ff_pick(in, nb)] : NULL;
  ff_attr *at = fr->nattrs ? &fr->attrs[ff_pick(in, fr->nattrs)] : NULL;
  switch (ff_pick(in, 12)) {
    case 0: /* one argument fewer, or one more (a copy of the first) */
      if (ff_pick(in, 2) && fr->nargs) {
        memmove(&fr->bufs[fr->nargs - 1], &fr->bufs[fr->nargs], (size_t)fr->nrets * sizeof fr->bufs[0]);
        fr->nargs--;
      } else if (nb < FF_MAX_BUF && fr->nargs) {
        memmove(&fr->bufs[fr->nargs + 1], &fr->bufs[fr->nargs], (size_t)fr->nrets * sizeof fr->bufs[0]);
        fr->bufs[fr->nargs++] = fr->bufs[0];
      }
      break;
    case 1: /* one result fewer or more */
      if (ff_pick(in, 2) && fr->nrets) fr->nrets--;
      else if (nb < FF_MAX_BUF && nb) fr->bufs[fr->nargs + fr->nrets++] = fr->bufs[nb - 1];
      break;
    case 2:
      if (b) b->b.dtype = ff_dtypes[ff_pick(in, 10)];
      break;
    case 3: /* rank: drop the last dim or append a 1 */
      if (b && ff_pick(in, 2) && b->b.rank > 0) b->b.rank--;
      else if (b && b->b.rank < FF_MAX_RANK) b->dims[b->b.rank++] = 1;
      break;
    case 4:
      if (b && b->b.rank) b->dims[ff_pick(in, (int)b->b.rank)] = ff_pick(in, 7);
      break;
    case 5:
      if (fr->nargs) fr->arg_types[ff_pick(in, fr->nargs)] = (XLA_FFI_ArgType)ff_pick(in, 3);
      break;
    case 6: /* a name: a prefix of itself (not NUL-terminated at len), empty, or other bytes */
      if (at) {
        size_t len = (size_t)ff_pick(in, (int)sizeof at->name);
        for (size_t c = 0; ff_pick(in, 2) && c < len; c++) at->name[c] = (char)ff_u8(in);
        at->span.len = len < at->span.len || ff_pick(in, 2) ? len : at->span.len;
      }
      break;
    case 7:
      if (at) at->type = (XLA_FFI_AttrType)(1 + ff_pick(in, 4));
      break;
    case 8:
      if (at) at->dtype = ff_dtypes[ff_pick(in, 10)];
      break;
    case 9:
      if (at) *at = fr->attrs[--fr->nattrs];
      break; /* drop one */
    case 10:
      if (at && fr->nattrs < FF_MAX_ATTR) fr->attrs[fr->nattrs++] = *at;
      break;   /* duplicate */
    default: { /* a value outside the accepted range */
      static const int64_t odd[] = {-1, 3, 7, -7, INT64_MAX, INT64_MIN, (int64_t)1 << 40, 0x100000002ll, 2};
      static const double fodd[] = {NAN, INFINITY, -INFINITY, 1e39, -1e39, 1e-50, -1e-50, -2.0, 0.0, 1e-40};
      if (at) {
        at->value = odd[ff_pick(in, 9)];
        at->fvalue = fodd[ff_pick(in, 10)];
      }
    }
  }
}

/* Payloads and the pointer arrays the call frame points to, after all mutations. */
static void ff_materialize(ff_in *in, ff_frame *fr) {
  for (int x = 0; x < fr->nargs + fr->nrets; x++) {
    XLA_FFI_Buffer *b = &fr->bufs[x].b;
    b->dims = fr->bufs[x].dims;
    int64_t n = 1;
    for (int64_t d = 0; d < b->rank; d++) n *= b->dims[d];
    size_t bytes = (size_t)n * ff_elem(b->dtype);
    b->data = bytes ? malloc(bytes) : NULL;
    /* Small integers read as valid lengths and segment ids; as floats they are tiny finite numbers. */
    for (size_t c = 0; c < bytes; c++) ((uint8_t *)b->data)[c] = (uint8_t)(c % 4 == 0 ? ff_pick(in, 6) : 0);
    if (x < fr->nargs) fr->arg_ptrs[x] = b;
    else fr->ret_ptrs[x - fr->nargs] = b;
  }
  for (int x = 0; x < fr->nattrs; x++) {
    ff_attr *at = &fr->attrs[x];
    at->span.ptr = at->name;
    fr->attr_names[x] = &at->span;
    fr->attr_types[x] = at->type;
    size_t es = ff_elem(at->dtype);
    at->payload = malloc(es);
    if (at->dtype == XLA_FFI_DataType_F64) memcpy(at->payload, &at->fvalue, 8);
    else if (at->dtype == XLA_FFI_DataType_F32) {
      float v = (float)at->fvalue;
      memcpy(at->payload, &v, 4);
    } else if (es == 8) memcpy(at->payload, &at->value, 8);
    else if (es == 4) {
      int32_t v = (int32_t)at->value;
      memcpy(at->payload, &v, 4);
    } else if (es == 2) {
      int16_t v = (int16_t)at->value;
      memcpy(at->payload, &v, 2);
    } else {
      uint8_t v = (uint8_t)at->value;
      memcpy(at->payload, &v, 1);
    }
    at->scalar.dtype = at->dtype;
    at->scalar.value = at->payload;
    at->array.dtype = at->dtype;
    at->array.size = 1;
    at->array.data = at->payload;
    at->dict.struct_size = XLA_FFI_Attrs_STRUCT_SIZE;
    switch (at->type) {
      case XLA_FFI_AttrType_SCALAR: fr->attr_ptrs[x] = &at->scalar; break;
      case XLA_FFI_AttrType_ARRAY: fr->attr_ptrs[x] = &at->array; break;
      case XLA_FFI_AttrType_STRING: fr->attr_ptrs[x] = &at->span; break;
      default: fr->attr_ptrs[x] = &at->dict; break;
    }
  }
}

static void ff_free(ff_frame *fr) {
  for (int x = 0; x < fr->nargs + fr->nrets; x++) free(fr->bufs[x].b.data);
  for (int x = 0; x < fr->nattrs; x++) free(fr->attrs[x].payload);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static XLA_FFI_Handler *const handlers[] = {sa_jax_attn_fwd_cpu, sa_jax_attn_bwd_cpu, sa_jax_attn_fwd_cuda,
                                              sa_jax_attn_bwd_cuda};
  if (!ff_api.struct_size) ff_api_init();
  ff_in in = {data, size};
  int h = ff_pick(&in, 4), bwd = h & 1, cuda = h >> 1;
  ff_frame *fr = calloc(1, sizeof *fr);
  FF_REQUIRE(fr);
  for (int x = 0; x < FF_MAX_BUF; x++) {
    fr->arg_types[x] = XLA_FFI_ArgType_BUFFER;
    fr->ret_types[x] = XLA_FFI_RetType_BUFFER;
  }
  ff_build(&in, fr, bwd, cuda);
  for (int m = ff_pick(&in, 9); m > 0; m--) ff_mutate(&in, fr);
  ff_materialize(&in, fr);

  XLA_FFI_CallFrame f;
  memset(&f, 0, sizeof f);
  f.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
  f.api = &ff_api;
  f.stage = ff_pick(&in, 16) ? XLA_FFI_ExecutionStage_EXECUTE : (XLA_FFI_ExecutionStage)ff_pick(&in, 3);
  f.args = (XLA_FFI_Args){XLA_FFI_Args_STRUCT_SIZE, NULL, fr->nargs, fr->arg_types, fr->arg_ptrs};
  f.rets = (XLA_FFI_Rets){XLA_FFI_Rets_STRUCT_SIZE, NULL, fr->nrets, fr->ret_types, fr->ret_ptrs};
  f.attrs = (XLA_FFI_Attrs){XLA_FFI_Attrs_STRUCT_SIZE, NULL, fr->nattrs, fr->attr_types, fr->attr_names, fr->attr_ptrs};
  XLA_FFI_Metadata meta;
  XLA_FFI_Metadata_Extension ext;
  int metadata = ff_pick(&in, 32) == 0;
  if (metadata) { /* XLA's registration-time query */
    memset(&meta, 0, sizeof meta);
    memset(&ext, 0, sizeof ext);
    ext.extension_base.struct_size = XLA_FFI_Metadata_Extension_STRUCT_SIZE;
    ext.extension_base.type = XLA_FFI_Extension_Metadata;
    ext.metadata = &meta;
    f.extension_start = (void *)&ext;
  }
  XLA_FFI_Error *e = handlers[h](&f);
  if (metadata) {
    FF_REQUIRE(e == NULL &&
               meta.api_version.major_version * 1000 + meta.api_version.minor_version == sa_jax_ffi_api_version());
  } else if (e) {
    FF_REQUIRE(e->magic == FF_MAGIC && e->msg[0] != '\0');
    XLA_FFI_Error_Destroy_Args d = {XLA_FFI_Error_Destroy_Args_STRUCT_SIZE, NULL, e};
    ff_api.XLA_FFI_Error_Destroy(&d);
  } else {
    FF_REQUIRE(f.stage == XLA_FFI_ExecutionStage_EXECUTE); /* only the execute stage may succeed */
  }
  ff_free(fr);
  free(fr);
  return 0;
}
