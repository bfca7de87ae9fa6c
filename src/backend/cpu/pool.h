/*
 * pool.h — a small persistent pthread pool for the CPU backend.
 *
 * The pool is created once (per model) and every op hands it a range of work
 * items; the range is cut into one contiguous slice per thread, the calling
 * thread taking slice 0.  Slices are static, so which thread computes an output
 * element never depends on timing, and each op computes every output element on
 * one thread in a fixed order: results do not depend on the thread count.
 * Dispatch allocates nothing; between jobs of a burst it costs well under a
 * microsecond (the threads poll, see DDT_CPU_SPIN_US), and an idle pool sleeps.
 */
#ifndef DDT_BACKEND_CPU_POOL_H
#define DDT_BACKEND_CPU_POOL_H

#include <stdint.h>

#include "ddtree.h"

#define DDT_CPU_MAX_THREADS 256
/* How long an idle thread of the pool polls for the next job (or, for the caller,
 * for the workers to finish) before it sleeps: decoding hands the pool hundreds
 * of short jobs in a row, and a futex wake-up costs more than most of them. */
#define DDT_CPU_SPIN_US 200

typedef struct ddt_cpu_pool ddt_cpu_pool;

/* Work callback: process items [begin, end) on thread `thread` (0 = caller). */
typedef void (*ddt_cpu_task_fn)(void *ctx, int64_t begin, int64_t end, int32_t thread);

/* Threads available to this process (sched affinity / online cores), >= 1. */
int32_t ddt_cpu_default_threads(void);

/* n_threads <= 0 means ddt_cpu_default_threads(); at most DDT_CPU_MAX_THREADS. */
ddt_status ddt_cpu_pool_create(int32_t n_threads, ddt_cpu_pool **out, ddt_error *err);
void ddt_cpu_pool_destroy(ddt_cpu_pool *pool);
/* Threads including the caller; 1 for a NULL pool. */
int32_t ddt_cpu_pool_threads(const ddt_cpu_pool *pool);

/*
 * Run fn over items [0, n) and return when all are done.  pool may be NULL (runs
 * inline).  Not reentrant: fn must not call ddt_cpu_pool_run on the same pool,
 * and one pool serves one caller thread at a time.
 */
void ddt_cpu_pool_run(ddt_cpu_pool *pool, ddt_cpu_task_fn fn, void *ctx, int64_t n);

#endif
