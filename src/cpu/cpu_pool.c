/*
 * cpu_pool.c — threads for the CPU backend: per-call pthreads (the caller works too) pulling item indices
 * from one atomic counter. No state survives a call, so several threads may call the library at once.
 * Items are independent and each is computed by one thread in a fixed order, so which thread takes which
 * item changes timing only, never a bit of the result; the counter balances causal problems whose
 * late query blocks cost more. Per-call threads cost about 30 us to start, small against the >= 1 ms
 * calls where more than one thread is used (see sa_cpu_parallel's cap).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu_internal.h"
#include "cpu_plan.h"

static atomic_int sa_cpu_threads_set; /* 0: default */

void sa_cpu_set_num_threads(int n) { atomic_store(&sa_cpu_threads_set, n > 0 ? n : 0); }

/* The default (SINKATTN_NUM_THREADS, else the online cores) is the CPU record's, read once per process. */
int sa_cpu_get_num_threads(void) {
  int n = atomic_load(&sa_cpu_threads_set);
  return n > 0 ? n : sa_cpu_record_get()->threads;
}

typedef struct {
  sa_cpu_item_fn fn;
  void *arg;
  int64_t n;
  size_t scratch_floats;
  void (*begin)(void), (*end)(void);
  atomic_llong next;
} sa_cpu_job;

static void *sa_cpu_worker(void *p) {
  sa_cpu_job *j = (sa_cpu_job *)p;
  size_t bytes = (j->scratch_floats * sizeof(float) + 63) & ~(size_t)63;
  float *ws = aligned_alloc(64, bytes ? bytes : 64);
  if (!ws) return NULL; /* the other workers take this one's share; the caller checks the counter */
  if (j->begin) j->begin();
  for (;;) {
    int64_t i = (int64_t)atomic_fetch_add(&j->next, 1);
    if (i >= j->n) break;
    j->fn(j->arg, i, ws);
  }
  if (j->end) j->end();
  free(ws);
  return NULL;
}

sa_status sa_cpu_run_items(sa_cpu_item_fn fn, void *arg, int64_t n, size_t scratch_floats, int64_t max_threads,
                           void (*begin)(void), void (*end)(void), int *threads) {
  if (n <= 0) return SA_OK;
  sa_cpu_job job = {fn, arg, n, scratch_floats, begin, end, 0};
  int64_t nt = sa_cpu_get_num_threads();
  if (nt > max_threads) nt = max_threads;
  if (nt > n) nt = n;
  pthread_t *tid = NULL;
  int64_t started = 0;
  if (nt > 1 && (tid = malloc((size_t)(nt - 1) * sizeof *tid)) != NULL) {
    for (; started < nt - 1; started++)
      if (pthread_create(&tid[started], NULL, sa_cpu_worker, &job) != 0) break; /* run with fewer */
  }
  sa_cpu_worker(&job);
  for (int64_t t = 0; t < started; t++) pthread_join(tid[t], NULL);
  free(tid);
  if (threads && 1 + started > *threads) *threads = (int)(1 + started);
  if ((int64_t)atomic_load(&job.next) < n)
    return sa_error(SA_ERR_NO_MEMORY, "CPU backend: cannot allocate %zu bytes of per-thread scratch",
                    scratch_floats * sizeof(float));
  return SA_OK;
}

/* A thread start costs ~20 us (T = S = 16, N = 8, H = 64: fwd 15 us on one thread, 34 us on two), about
   2 MFLOP of one core; a thread is only worth starting for twice that, and for at least 2 items. */
#define SA_CPU_MIN_FLOPS_PER_THREAD 4e6
#define SA_CPU_MIN_ITEMS_PER_THREAD 2

typedef struct {
  const sa_cpu_kernels *k;
  const sa_cpu_ctx *c;
  sa_cpu_pass pass;
} sa_cpu_pass_arg;

static void sa_cpu_pass_item(void *p, int64_t item, float *scratch) {
  const sa_cpu_pass_arg *x = (const sa_cpu_pass_arg *)p;
  x->k->run(x->c, x->pass, item, scratch);
}

sa_status sa_cpu_parallel(const sa_cpu_kernels *k, const sa_cpu_ctx *c, sa_cpu_pass pass, int64_t n,
                          size_t scratch_floats, double flops, int *threads) {
  sa_cpu_pass_arg x = {k, c, pass};
  int64_t cap = (n + SA_CPU_MIN_ITEMS_PER_THREAD - 1) / SA_CPU_MIN_ITEMS_PER_THREAD;
  if ((double)cap > 1.0 + flops / SA_CPU_MIN_FLOPS_PER_THREAD)
    cap = (int64_t)(1.0 + flops / SA_CPU_MIN_FLOPS_PER_THREAD);
  return sa_cpu_run_items(sa_cpu_pass_item, &x, n, scratch_floats, cap, k->begin, k->end, threads);
}
