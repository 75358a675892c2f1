/*
 * sa_plan.c — the plan API of sa_plan.h: the list (per backend), the forced plan (thread-local, and
 * SINKATTN_PLAN read once), and the description of the last plan (thread-local and process-wide). The CUDA
 * backend's plans are src/cuda/plan.c's, the CPU backend's src/cpu/cpu_plan.c's; REF runs one plan per
 * kind, named here.
 */
#include "sa_plan.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_plan.h"
#include "cuda/plan.h"
#include "sa_internal.h"

#define SA_PLAN_DESC 384

static const char *const sa_kind_names[SA_PLAN_KINDS] = {"fwd", "bwd", "decode"};

/* REF's plans: one per kind. */
static const char *const sa_ref_plans[] = {"ref.fwd", "ref.bwd", "ref.decode", NULL};

static const char *sa_known(const char *name) {
  for (int i = 0; sa_ref_plans[i]; ++i)
    if (!strcmp(sa_ref_plans[i], name)) return sa_ref_plans[i];
  const char *cpu = sa_cpu_plan_known(name);
  if (cpu) return cpu;
  for (int i = 0; sa_cuda_plan_names[i]; ++i)
    if (!strcmp(sa_cuda_plan_names[i], name)) return sa_cuda_plan_names[i];
  return NULL;
}

/* A plan's kind is its second word. */
static int sa_kind_of(const char *name) {
  const char *d = strchr(name, '.');
  for (int k = 0; d && k < SA_PLAN_KINDS; ++k) {
    const size_t n = strlen(sa_kind_names[k]);
    if (!strncmp(d + 1, sa_kind_names[k], n) && (d[1 + n] == '.' || d[1 + n] == 0)) return k;
  }
  return -1;
}

static sa_status sa_unknown(const char *name, const char *where) {
  char list[1024];
  size_t k = 0;
  for (int i = 0; sa_ref_plans[i] && k < sizeof list; ++i)
    k += snprintf(list + k, sizeof list - k, "%s ", sa_ref_plans[i]);
  for (int i = 0; sa_cpu_plan_name(i) && k < sizeof list; ++i)
    k += snprintf(list + k, sizeof list - k, "%s ", sa_cpu_plan_name(i));
  for (int i = 0; sa_cuda_plan_names[i] && k < sizeof list; ++i)
    k += snprintf(list + k, sizeof list - k, "%s ", sa_cuda_plan_names[i]);
  return sa_error(SA_ERR_INVALID, "%s plan '%s' unknown: use one of %s", where, name, list);
}

/* ---- SINKATTN_PLAN, read once ---- */

static pthread_once_t sa_env_once = PTHREAD_ONCE_INIT;
static const char *sa_env_plan[SA_PLAN_KINDS];
static char sa_env_error[512];

static void sa_env_read(void) {
  const char *e = getenv("SINKATTN_PLAN");
  if (!e || !*e) return;
  char buf[512];
  snprintf(buf, sizeof buf, "%s", e);
  for (char *tok = buf, *next; tok; tok = next) {
    next = strchr(tok, ',');
    if (next) *next++ = 0;
    char *eq = strchr(tok, '=');
    int k = -1;
    for (int i = 0; eq && i < SA_PLAN_KINDS; ++i)
      if ((size_t)(eq - tok) == strlen(sa_kind_names[i]) && !strncmp(tok, sa_kind_names[i], (size_t)(eq - tok))) k = i;
    const char *name = eq ? sa_known(eq + 1) : NULL;
    if (k < 0 || !name || sa_kind_of(name) != k) {
      snprintf(sa_env_error, sizeof sa_env_error,
               "SINKATTN_PLAN entry '%.160s' invalid: use fwd=NAME, bwd=NAME or "
               "decode=NAME with a plan of that kind (sa_plan_list names them)",
               tok);
      return;
    }
    sa_env_plan[k] = name;
  }
}

sa_status sa_plan_env_check(void) {
  pthread_once(&sa_env_once, sa_env_read);
  return sa_env_error[0] ? sa_error(SA_ERR_INVALID, "%s", sa_env_error) : SA_OK;
}

/* ---- forcing ---- */

static _Thread_local const char *sa_forced[SA_PLAN_KINDS];

sa_status sa_plan_force(int which, const char *name) {
  if (which < 0 || which >= SA_PLAN_KINDS)
    return sa_error(SA_ERR_INVALID, "which %d invalid: use SA_PLAN_FWD (0), SA_PLAN_BWD (1) or SA_PLAN_DECODE (2)",
                    which);
  if (!name || !*name) {
    sa_forced[which] = NULL;
    return SA_OK;
  }
  const char *known = sa_known(name);
  if (!known) return sa_unknown(name, "sa_plan_force:");
  if (sa_kind_of(known) != which)
    return sa_error(SA_ERR_INVALID, "sa_plan_force: plan '%s' is not of kind %s", name, sa_kind_names[which]);
  sa_forced[which] = known;
  return SA_OK;
}

const char *sa_plan_forced(int which) {
  pthread_once(&sa_env_once, sa_env_read);
  return sa_forced[which] ? sa_forced[which] : sa_env_plan[which];
}

/* ---- the last plan ---- */

static _Thread_local char sa_last[SA_PLAN_KINDS][SA_PLAN_DESC];
static char sa_last_proc[SA_PLAN_KINDS][SA_PLAN_DESC];
static pthread_mutex_t sa_last_mu = PTHREAD_MUTEX_INITIALIZER;

void sa_plan_record(int which, const char *desc) {
  snprintf(sa_last[which], SA_PLAN_DESC, "%s", desc);
  pthread_mutex_lock(&sa_last_mu);
  snprintf(sa_last_proc[which], SA_PLAN_DESC, "%s", desc);
  pthread_mutex_unlock(&sa_last_mu);
}

const char *sa_plan_last(int which) { return which >= 0 && which < SA_PLAN_KINDS ? sa_last[which] : ""; }

size_t sa_plan_last_any(int which, char *buf, size_t n) {
  if (which < 0 || which >= SA_PLAN_KINDS) {
    if (buf && n) buf[0] = 0;
    return 0;
  }
  pthread_mutex_lock(&sa_last_mu);
  const size_t len = strlen(sa_last_proc[which]);
  if (buf && n) snprintf(buf, n, "%s", sa_last_proc[which]);
  pthread_mutex_unlock(&sa_last_mu);
  return len;
}

/* ---- host backends ---- */

/* The CPU's plan comes from cpu_plan.c (checked and recorded here, so a call with no rows has one too; the
   backend records it again with the threads it ran on). */
sa_status sa_plan_host(int which, sa_backend be, const sa_attn *a) {
  sa_status s = sa_plan_env_check();
  if (s != SA_OK) return s;
  if (be == SA_BACKEND_CPU) {
    sa_cpu_plan p;
    if ((s = sa_cpu_plan_of(a, which, &p)) == SA_OK) sa_cpu_plan_ran(&p, a, sa_cpu_get_num_threads());
    return s;
  }
  const char *name = sa_ref_plans[which], *forced = sa_plan_forced(which);
  if (forced && strcmp(forced, name) != 0)
    return sa_error(SA_ERR_UNSUPPORTED,
                    "plan %s is not legal for this call: it runs on SA_BACKEND_REF, whose "
                    "plan is %s",
                    forced, name);
  char desc[SA_PLAN_DESC];
  snprintf(desc, sizeof desc, "%s reason=the fp64 reference", name);
  sa_plan_record(which, desc);
  return SA_OK;
}

/* ---- the list ---- */

int sa_plan_list(const sa_attn *a, int which, sa_backend be, const char **names, int max) {
  if (which < 0 || which >= SA_PLAN_KINDS || sa_check_backend_enum(be) != SA_OK || sa_check_dims(a) != SA_OK) {
    sa_clear_error();
    return 0;
  }
  if (which == SA_PLAN_DECODE && a->q_len > 64) return 0;
  sa_backend r = sa_backend_resolve(a, be);
  int n = 0;
  if (r == SA_BACKEND_CUDA) {
    const sa_cuda_device *dev = sa_cuda_device_current();
    sa_cuda_plan plans[16];
    const int ok = dev && sa_cuda_feature_check(a, 1) == SA_OK && /* the override-only plans too */
                   (which == SA_PLAN_DECODE ? sa_cuda_decode_supported(a) : sa_cuda_attn_supported(a)) == SA_OK;
    n = ok ? sa_cuda_plans(a, which, dev, (size_t)-1, plans, 16) : 0;
    for (int i = 0; i < n && i < max && names; ++i) names[i] = plans[i].name;
  } else if (r == SA_BACKEND_CPU) {
    const int ok = (which == SA_PLAN_DECODE ? sa_cpu_decode_supported(a) : sa_cpu_attn_supported(a)) == SA_OK;
    n = ok ? sa_cpu_plan_list(a, which, sa_cpu_record_get(), names ? names : NULL, names ? max : 0) : 0;
  } else {
    n = 1;
    if (names && max > 0) names[0] = sa_ref_plans[which];
  }
  sa_clear_error();
  return n;
}
