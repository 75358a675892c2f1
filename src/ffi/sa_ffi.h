/*
 * sa_ffi.h — shared by the XLA FFI handler files: call-frame decoding (attributes by name with type
 * checks, buffers with rank/dtype/dims checks), error creation, and the "vmap grid" of leading dims.
 *
 * Portability across jaxlib versions: the handlers declare FFI API 0.1 whatever header they are
 * compiled against, and use only what 0.1 has (ffi_version.c says why and pins the layout). Headers name
 * the extension type differently (XLA_FFI_Extension_Base* up to 0.3, XLA_FFI_InternalExtension* from
 * 0.4); this code never names it: it reads `extension_start->type` (a field every version has), sets
 * extension_start to NULL in argument structs, and casts the metadata extension through void*.
 */
#ifndef SA_FFI_H
#define SA_FFI_H

#include <stdint.h>

#include "sa_internal.h"
#include "xla/ffi/api/c_api.h"

#define SA_FFI_EXPORT __attribute__((visibility("default")))

/* Largest number of vmap dims folded in front of a buffer's own dims (nested vmaps). */
#define SA_FFI_MAX_LEAD 8

/* The FFI API version every handler declares at registration (see ffi_version.c). */
#define SA_FFI_API_MAJOR 0
#define SA_FFI_API_MINOR 1

/* 1 when this call is XLA's metadata query at registration (answered here, with SA_FFI_API_MAJOR /
   MINOR and the given traits): the handler then returns NULL at once. */
int sa_ffi_metadata(XLA_FFI_CallFrame *f, uint32_t traits);

/* An XLA error with a printf-style message; code from an sa_status. */
XLA_FFI_Error *sa_ffi_error(const XLA_FFI_CallFrame *f, XLA_FFI_Error_Code code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
XLA_FFI_Error *sa_ffi_status_error(const XLA_FFI_CallFrame *f, const char *target, sa_status s);

/* ---- attributes ---------------------------------------------------------------------------- */

typedef struct {
  const char *name;
  int kind; /* SA_ATTR_INT, SA_ATTR_BOOL, SA_ATTR_FLOAT */
  int required;
  int found;
  int64_t i; /* INT and BOOL */
  double f;  /* FLOAT */
} sa_ffi_attr;

enum { SA_ATTR_INT = 0, SA_ATTR_BOOL = 1, SA_ATTR_FLOAT = 2 };

/* Fills every entry of want[] from f->attrs; unknown names, wrong types and missing required
   attributes are errors naming the attribute. */
XLA_FFI_Error *sa_ffi_attrs_decode(const XLA_FFI_CallFrame *f, const char *target, sa_ffi_attr *want, int n);

/* The logits_soft_cap attribute v (decoded as a double) into the sa_attn field *out (0 = no cap). A value that
   float32 cannot hold (beyond its range, or nonzero but rounding to 0, which would read as no cap) is an error
   naming it; the contract's rule (0, or > 0 and finite) is sa_attn_check's. */
XLA_FFI_Error *sa_ffi_soft_cap(const XLA_FFI_CallFrame *f, const char *target, double v, float *out);

/* ---- buffers ------------------------------------------------------------------------------- */

/* One buffer seen as [lead..., base...]: lead dims are either the grid's full size or 1 (broadcast). */
typedef struct {
  const char *name;
  XLA_FFI_Buffer *buf;
  int present;                          /* 0: a placeholder for an absent optional input; never read */
  int64_t base_count;                   /* elements of one grid cell: product of the base dims */
  int64_t lead_stride[SA_FFI_MAX_LEAD]; /* elements per step of each lead dim; 0 where broadcast */
  int lead_full;                        /* every lead dim has the grid's size (so the grid folds into batch) */
  int lead_ones;                        /* every lead dim is 1 */
} sa_ffi_view;

typedef struct {
  int nlead;
  int64_t lead[SA_FFI_MAX_LEAD];
  int64_t cells; /* product of lead */
} sa_ffi_grid;

/* The buffer at index i of args (is_ret 0) or rets (is_ret 1), checked to be a buffer. */
XLA_FFI_Buffer *sa_ffi_buffer(const XLA_FFI_CallFrame *f, int is_ret, int64_t i);

/* Derives the grid from a result buffer of base rank base_rank. */
XLA_FFI_Error *sa_ffi_grid_from(const XLA_FFI_CallFrame *f, const char *target, XLA_FFI_Buffer *b, const char *name,
                                int base_rank, sa_ffi_grid *g);

/* Checks rank, dtype and the base dims (-1 = any, recorded in got[]) of b against the grid and
   fills *v. dtype XLA_FFI_DataType_INVALID accepts any of F32/F16/BF16. */
XLA_FFI_Error *sa_ffi_view_make(const XLA_FFI_CallFrame *f, const char *target, const sa_ffi_grid *g, XLA_FFI_Buffer *b,
                                const char *name, XLA_FFI_DataType dtype, int base_rank, const int64_t *want_dims,
                                int64_t *got_dims, sa_ffi_view *v);

/* Element offset of grid cell c in view v. */
int64_t sa_ffi_view_offset(const sa_ffi_grid *g, const sa_ffi_view *v, int64_t c);

int sa_ffi_dtype_of(XLA_FFI_DataType t, sa_dtype *out);
size_t sa_ffi_elem_size(XLA_FFI_DataType t);

/* *a initialised (sa_attn_init) with a dtype code and the sizes: the problem the shape-only queries that
   Python makes at trace time (workspace bytes, CUDA support) ask about; no data pointers. */
void sa_ffi_attn_of_shape(sa_attn *a, int dtype, int64_t batch, int64_t q_len, int64_t kv_len, int64_t q_heads,
                          int64_t kv_heads, int64_t head_dim, int64_t v_head_dim);

#endif /* SA_FFI_H */
