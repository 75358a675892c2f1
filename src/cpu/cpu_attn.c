/* placeholder until the CPU backend lands */
#include "sa_internal.h"
sa_status sa_cpu_attn_supported(const sa_attn *a) { (void)a; return sa_error(SA_ERR_UNSUPPORTED, "CPU backend not written yet"); }
sa_status sa_cpu_attn_fwd(const sa_attn *a) { (void)a; return SA_ERR_UNSUPPORTED; }
size_t sa_cpu_attn_bwd_workspace_size(const sa_attn *a) { (void)a; return 0; }
sa_status sa_cpu_attn_bwd(const sa_attn *a, const sa_attn_grad *g, void *w, size_t ws) { (void)a; (void)g; (void)w; (void)ws; return SA_ERR_UNSUPPORTED; }
void sa_cpu_set_num_threads(int n) { (void)n; }
int sa_cpu_get_num_threads(void) { return 1; }
const char *sa_cpu_simd_name(void) { return "scalar"; }
