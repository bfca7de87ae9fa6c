/*
 * pool.c — persistent pthread pool (see pool.h).  Workers sleep on a condition
 * variable between jobs rather than spinning, because the CPU backend shares
 * small machines with other work and a spinning pool would steal their cores.
 */
#include "backend/cpu/pool.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"

struct ddt_cpu_pool {
    int32_t n_threads;          /* including the caller (thread 0) */
    pthread_t *workers;         /* [n_threads - 1] */
    int32_t n_started;          /* workers actually started (for teardown on failure) */
    pthread_mutex_t mu;
    pthread_cond_t cv_start;    /* signalled when a job is posted or on stop */
    pthread_cond_t cv_done;     /* signalled when the last worker finishes a job */
    uint64_t generation;        /* incremented per job; workers run each once */
    int32_t pending;            /* workers still busy with the current job */
    bool stop;
    ddt_cpu_task_fn fn;         /* current job */
    void *ctx;
    int64_t n_items;
};

typedef struct worker_arg {
    ddt_cpu_pool *pool;
    int32_t index;
} worker_arg;

/* The slice of [0, n) owned by thread i of t: contiguous and balanced.  Item
 * counts are far below 2^55, so n * t cannot overflow. */
static void slice_of(int64_t n, int32_t i, int32_t t, int64_t *b, int64_t *e) {
    *b = n * i / t;
    *e = n * (i + 1) / t;
}

static void *worker_main(void *p) {
    worker_arg *wa = p;
    ddt_cpu_pool *pool = wa->pool;
    int32_t index = wa->index;
    free(wa);
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&pool->mu);
        while (pool->generation == seen && !pool->stop) pthread_cond_wait(&pool->cv_start, &pool->mu);
        if (pool->stop) {
            pthread_mutex_unlock(&pool->mu);
            return NULL;
        }
        seen = pool->generation;
        ddt_cpu_task_fn fn = pool->fn;
        void *ctx = pool->ctx;
        int64_t n = pool->n_items;
        pthread_mutex_unlock(&pool->mu);

        int64_t b, e;
        slice_of(n, index, pool->n_threads, &b, &e);
        if (b < e) fn(ctx, b, e, index);

        pthread_mutex_lock(&pool->mu);
        if (--pool->pending == 0) pthread_cond_signal(&pool->cv_done);
        pthread_mutex_unlock(&pool->mu);
    }
}

int32_t ddt_cpu_default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) return 1;
    if (n > DDT_CPU_MAX_THREADS) return DDT_CPU_MAX_THREADS;
    return (int32_t)n;
}

ddt_status ddt_cpu_pool_create(int32_t n_threads, ddt_cpu_pool **out, ddt_error *err) {
    *out = NULL;
    if (n_threads <= 0) n_threads = ddt_cpu_default_threads();
    if (n_threads > DDT_CPU_MAX_THREADS)
        return ddt_fail(err, DDT_ERR_RANGE, "cpu pool: %d threads requested, at most %d", n_threads,
                        DDT_CPU_MAX_THREADS);
    ddt_cpu_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return ddt_fail(err, DDT_ERR_NOMEM, "cpu pool: out of memory");
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv_start, NULL);
    pthread_cond_init(&pool->cv_done, NULL);
    if (n_threads > 1) {
        pool->workers = ddt_calloc_array((size_t)n_threads - 1, sizeof *pool->workers);
        if (!pool->workers) {
            ddt_cpu_pool_destroy(pool);
            return ddt_fail(err, DDT_ERR_NOMEM, "cpu pool: out of memory");
        }
        for (int32_t i = 1; i < n_threads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (!wa) {
                ddt_cpu_pool_destroy(pool);
                return ddt_fail(err, DDT_ERR_NOMEM, "cpu pool: out of memory");
            }
            wa->pool = pool;
            wa->index = i;
            if (pthread_create(&pool->workers[i - 1], NULL, worker_main, wa) != 0) {
                free(wa);
                ddt_cpu_pool_destroy(pool);
                return ddt_fail(err, DDT_ERR_INTERNAL, "cpu pool: could not start thread %d of %d", i,
                                n_threads);
            }
            pool->n_started = i;
        }
    }
    *out = pool;
    return DDT_OK;
}

void ddt_cpu_pool_destroy(ddt_cpu_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    pool->stop = true;
    pthread_cond_broadcast(&pool->cv_start);
    pthread_mutex_unlock(&pool->mu);
    for (int32_t i = 0; i < pool->n_started; i++) pthread_join(pool->workers[i], NULL);
    pthread_cond_destroy(&pool->cv_done);
    pthread_cond_destroy(&pool->cv_start);
    pthread_mutex_destroy(&pool->mu);
    free(pool->workers);
    free(pool);
}

int32_t ddt_cpu_pool_threads(const ddt_cpu_pool *pool) { return pool ? pool->n_threads : 1; }

void ddt_cpu_pool_run(ddt_cpu_pool *pool, ddt_cpu_task_fn fn, void *ctx, int64_t n) {
    if (n <= 0) return;
    /* One item, or no workers: the thread hand-off would cost more than it saves. */
    if (!pool || pool->n_threads == 1 || n == 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&pool->mu);
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_items = n;
    pool->pending = pool->n_threads - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->cv_start);
    pthread_mutex_unlock(&pool->mu);

    int64_t b, e;
    slice_of(n, 0, pool->n_threads, &b, &e);
    if (b < e) fn(ctx, b, e, 0);

    pthread_mutex_lock(&pool->mu);
    while (pool->pending > 0) pthread_cond_wait(&pool->cv_done, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
}
