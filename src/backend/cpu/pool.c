/*
 * pool.c — persistent pthread pool (see pool.h).
 *
 * A decoding step hands the pool hundreds of small jobs in a row (a tiny model's
 * product is tens of microseconds), so the hand-off must cost far less than a
 * futex wake-up (~20-50 us a job measured on 2 cores, which made 2 threads
 * slower than 1).  Workers therefore spin on the job counter for a while after
 * each job (DDT_CPU_SPIN_US) and only then sleep on a condition variable, as the
 * caller does while it waits for the last worker: during a decode nobody
 * sleeps, and a pool left idle stops using its cores within that time, because
 * the CPU backend shares small machines with other work.
 *
 * The sleeping hand-shakes are Dekker pairs on sequentially consistent atomics:
 * the poster bumps `generation` then reads `sleepers`; a worker going to sleep
 * bumps `sleepers` then re-reads `generation` under the mutex.  One of the two
 * sees the other, so a job is never posted past a sleeping worker.  Likewise
 * for the caller's wait: it sets `caller_sleeping` then re-reads `pending`, the
 * last worker drops `pending` then reads `caller_sleeping`.
 */
#include "backend/cpu/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"

struct ddt_cpu_pool {
    int32_t n_threads;          /* including the caller (thread 0) */
    pthread_t *workers;         /* [n_threads - 1] */
    int32_t n_started;          /* workers actually started (for teardown on failure) */
    pthread_mutex_t mu;
    pthread_cond_t cv_start;    /* signalled when a job is posted (and a worker sleeps) or on stop */
    pthread_cond_t cv_done;     /* signalled when the last worker finishes (and the caller sleeps) */
    atomic_uint_fast64_t generation; /* incremented per job; workers run each once */
    atomic_int pending;         /* workers still busy with the current job */
    atomic_int sleepers;        /* workers asleep on cv_start, or about to be */
    atomic_int caller_sleeping; /* the caller is asleep on cv_done, or about to be */
    atomic_bool stop;
    /* the current job: written before generation's increment, read after it */
    ddt_cpu_task_fn fn;
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

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Poll until done(arg) holds or DDT_CPU_SPIN_US pass; true when it held.  The
 * clock is read every 64 polls only. */
static bool spin_until(bool (*done)(ddt_cpu_pool *, uint64_t), ddt_cpu_pool *pool, uint64_t arg) {
    int64_t t0 = -1;
    for (uint32_t i = 1;; i++) {
        if (done(pool, arg)) return true;
        /* past the first polls, give the core away each time: with more threads
           than free cores (a loaded machine, --threads above the cores), the
           thread this one waits for may need it */
        if (i < 256) cpu_relax();
        else sched_yield();
        if ((i & 63) == 0) {
            int64_t t = now_us();
            if (t0 < 0) t0 = t;
            else if (t - t0 >= DDT_CPU_SPIN_US) return false;
        }
    }
}

static bool job_posted(ddt_cpu_pool *pool, uint64_t seen) {
    return atomic_load(&pool->generation) != seen || atomic_load(&pool->stop);
}

static bool job_done(ddt_cpu_pool *pool, uint64_t unused) {
    (void)unused;
    return atomic_load(&pool->pending) == 0;
}

static void *worker_main(void *p) {
    worker_arg *wa = p;
    ddt_cpu_pool *pool = wa->pool;
    int32_t index = wa->index;
    free(wa);
    uint64_t seen = 0;
    for (;;) {
        if (!spin_until(job_posted, pool, seen)) {
            pthread_mutex_lock(&pool->mu);
            atomic_fetch_add(&pool->sleepers, 1);
            while (!job_posted(pool, seen)) pthread_cond_wait(&pool->cv_start, &pool->mu);
            atomic_fetch_sub(&pool->sleepers, 1);
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load(&pool->stop)) return NULL;
        seen = atomic_load(&pool->generation);
        int64_t b, e;
        slice_of(pool->n_items, index, pool->n_threads, &b, &e);
        if (b < e) pool->fn(pool->ctx, b, e, index);

        if (atomic_fetch_sub(&pool->pending, 1) == 1 && atomic_load(&pool->caller_sleeping)) {
            pthread_mutex_lock(&pool->mu);
            pthread_cond_signal(&pool->cv_done);
            pthread_mutex_unlock(&pool->mu);
        }
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
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->pending, 0);
    atomic_init(&pool->sleepers, 0);
    atomic_init(&pool->caller_sleeping, 0);
    atomic_init(&pool->stop, false);
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
    atomic_store(&pool->stop, true);
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
    /* a worker reads the job only after it sees the new generation */
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_items = n;
    atomic_store(&pool->pending, pool->n_threads - 1);
    atomic_fetch_add(&pool->generation, 1);
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->mu);
        pthread_cond_broadcast(&pool->cv_start);
        pthread_mutex_unlock(&pool->mu);
    }

    int64_t b, e;
    slice_of(n, 0, pool->n_threads, &b, &e);
    if (b < e) fn(ctx, b, e, 0);

    if (!spin_until(job_done, pool, 0)) {
        pthread_mutex_lock(&pool->mu);
        atomic_store(&pool->caller_sleeping, 1);
        while (atomic_load(&pool->pending) > 0) pthread_cond_wait(&pool->cv_done, &pool->mu);
        atomic_store(&pool->caller_sleeping, 0);
        pthread_mutex_unlock(&pool->mu);
    }
}
