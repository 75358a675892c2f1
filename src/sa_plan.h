/*
 * sa_plan.h — plans: which kernel family, tiles, grid and workspace a call runs, listed, forced and reported.
 * Internal to the project and unsupported for users (tests, benches and the Python package call it through
 * the shared libraries). A plan's name is backend.kind.variant: "hopper.fwd.persistent", "cuda.bwd.portable",
 * "cpu.fwd.avx512", "ref.bwd". The developer switch SINKATTN_PLAN="fwd=NAME,bwd=NAME,decode=NAME" is read once
 * and forces plans process-wide; sa_plan_force (per thread) wins over it. docs/hopper.md, "plans".
 */
#ifndef SA_PLAN_H
#define SA_PLAN_H

#include <stddef.h>

#include "sinkattn.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { SA_PLAN_FWD = 0, SA_PLAN_BWD = 1, SA_PLAN_DECODE = 2, SA_PLAN_KINDS = 3 };

/* Every plan a backend could run for this call's problem, best first (the default is names[0]). be: the
   backend (AUTO resolves as a call would). Writes up to max names (static strings) and returns how many are
   legal (may exceed max). Shapes only: data pointers may be NULL. Never fails: an invalid problem has 0. */
SA_API int sa_plan_list(const sa_attn *a, int which, sa_backend be, const char **names, int max);

/* Forces the plan of the calling thread's next calls of kind `which` (NULL or "" clears it). SA_ERR_INVALID for
   an unknown name (the message names it and lists the known ones). A forced plan that is not legal for a call
   makes that call fail with SA_ERR_UNSUPPORTED naming the plan and why: never a silent fallback. */
SA_API sa_status sa_plan_force(int which, const char *name);

/* A one-line description of the last plan that ran ("NAME hd=.. tile=.. grid=.. ... reason=..."): of the
   calling thread's last call of kind `which`; sa_plan_last_any: of the process's (copied into buf,
   NUL-terminated; returns the full length). "" before any call. */
SA_API const char *sa_plan_last(int which);
SA_API size_t sa_plan_last_any(int which, char *buf, size_t n);

/* ---- what dispatch and the backends share (not exported) ---- */

/* The plan forced for this thread's calls of kind `which`: sa_plan_force's, else SINKATTN_PLAN's, else NULL. */
const char *sa_plan_forced(int which);
/* SA_ERR_INVALID (message set) when SINKATTN_PLAN is malformed: every call then fails rather than ignore it. */
sa_status sa_plan_env_check(void);
/* Records a call's plan description (thread-local and process-wide). */
void sa_plan_record(int which, const char *desc);
/* REF and CPU calls: the plan name they run; SA_ERR_UNSUPPORTED when another plan is forced. Records it. */
sa_status sa_plan_host(int which, sa_backend be, const sa_attn *a);

#ifdef __cplusplus
}
#endif
#endif /* SA_PLAN_H */
