/* placeholder until the reference lands */
#include "sa_internal.h"
sa_status sa_ref_attn_fwd(const sa_attn *a) { (void)a; return sa_error(SA_ERR_UNSUPPORTED, "reference not written yet"); }
sa_status sa_ref_attn_bwd(const sa_attn *a, const sa_attn_grad *g) { (void)a; (void)g; return sa_error(SA_ERR_UNSUPPORTED, "reference not written yet"); }
