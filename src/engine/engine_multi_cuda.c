/*
 * engine_multi_cuda.c — the CUDA engine over several GPUs with NCCL (see
 * engine_multi_cuda.h): communicators from ncclCommInitAll, one engine_cuda per
 * rank, and one host thread per rank for create and generate.
 *
 * Every rank takes the same decisions from the same bytes, so errors that come
 * from the inputs (a bad prompt, a full context) happen on every rank alike.  The
 * one decision only rank 0 sees, the caller's emit callback asking to stop,
 * reaches the other ranks through a stop flag summed over the ranks at the start
 * of every round (engine_cuda.c stop_exchange, emitter.h ddt_emitter_next_round):
 * rank 0 runs one round more to say so, and every rank ends after it.  A fault on
 * one GPU only (a device error) would leave the others waiting in a collective:
 * such a failure is not recovered from here.
 */
#include "engine/engine_multi_cuda.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "engine/engine_cuda.h"
#include "engine/rank_sum_cuda.h"
#include "engine/round.h"
#include "model/shard.h"

_Static_assert(DDT_ENGINE_MAX_GPUS == DDT_SHARD_MAX_WORLD, "engine and shard limits on GPUs differ");

struct ddt_engine_multi {
    int32_t world, max_ctx;
    bool have_comms;
    ncclComm_t comm[DDT_ENGINE_MAX_GPUS];
    ddt_rank_sum rs[DDT_ENGINE_MAX_GPUS]; /* the ranks' sums (rank_sum_cuda.h) */
    ddt_engine_cuda *rank[DDT_ENGINE_MAX_GPUS];
    int32_t *scratch; /* [world][max_ctx + DDT_MAX_PATH]: the tokens ranks >= 1 emit (and drop) */
};

_Static_assert(DDT_ENGINE_COST_WIRE <= DDT_RANK_SUM_MIN, "the cost table's all-reduce fits the gather buffer");

/* ------------------------------------------------------------------ rank threads */

typedef struct rank_job {
    ddt_engine_multi *m;
    int32_t r;
    ddt_status (*fn)(struct rank_job *j);
    /* create */
    const char *dir;
    const ddt_engine_options *opts;
    /* generate */
    const int32_t *prompt, *stop;
    int32_t n_prompt, max_new, n_stop, n_out;
    int32_t *out;
    ddt_emit_fn emit;
    void *emit_ctx;
    ddt_gen_stats *stats;
    /* score */
    const int32_t *ids;
    int32_t n_ids, n_top;
    ddt_token_logprobs *lp;
    /* result */
    ddt_status st;
    ddt_error err;
} rank_job;

/* Threads start together or not at all: a rank that began a collective while
 * another rank's thread could not be started would wait for ever. */
typedef struct start_gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int go; /* 0 wait, 1 run, -1 give up */
} start_gate;

typedef struct thread_arg {
    rank_job *job;
    start_gate *gate;
} thread_arg;

static void run_job(rank_job *j) {
    cudaError_t ce = cudaSetDevice(j->r);
    if (ce != cudaSuccess) {
        j->st = ddt_fail(&j->err, DDT_ERR_INTERNAL, "CUDA: cudaSetDevice(%d) failed: %s", j->r,
                         cudaGetErrorString(ce));
        return;
    }
    j->st = j->fn(j);
}

static void *rank_thread(void *p) {
    thread_arg *a = p;
    pthread_mutex_lock(&a->gate->mu);
    while (a->gate->go == 0) pthread_cond_wait(&a->gate->cv, &a->gate->mu);
    int go = a->gate->go;
    pthread_mutex_unlock(&a->gate->mu);
    if (go > 0) run_job(a->job);
    else a->job->st = ddt_fail(&a->job->err, DDT_ERR_INTERNAL, "rank %d not started", a->job->r);
    return NULL;
}

static void open_gate(start_gate *g, int go) {
    pthread_mutex_lock(&g->mu);
    g->go = go;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* Run jobs[0..world) on their devices, rank 0 on this thread; the first failing
 * rank's error is returned. */
static ddt_status run_ranks(ddt_engine_multi *m, rank_job *jobs, ddt_error *err) {
    const int32_t W = m->world;
    pthread_t th[DDT_ENGINE_MAX_GPUS];
    thread_arg args[DDT_ENGINE_MAX_GPUS];
    start_gate gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    int32_t started = 1;
    for (int32_t r = 1; r < W; r++, started++) {
        args[r] = (thread_arg){&jobs[r], &gate};
        if (pthread_create(&th[r], NULL, rank_thread, &args[r]) != 0) break;
    }
    int prev = 0;
    cudaError_t ce = cudaGetDevice(&prev);
    if (started < W || ce != cudaSuccess) {
        open_gate(&gate, -1);
        for (int32_t r = 1; r < started; r++) pthread_join(th[r], NULL);
        if (ce != cudaSuccess)
            return ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: cudaGetDevice failed: %s", cudaGetErrorString(ce));
        return ddt_fail(err, DDT_ERR_NOMEM, "cannot start the host thread of GPU %d of %d", started, W);
    }
    open_gate(&gate, 1);
    run_job(&jobs[0]);
    for (int32_t r = 1; r < W; r++) pthread_join(th[r], NULL);
    cudaSetDevice(prev); /* the caller's device, as it was */
    for (int32_t r = 0; r < W; r++)
        if (jobs[r].st != DDT_OK) {
            if (err) *err = jobs[r].err;
            ddt_error_prefix(err, "GPU %d of %d: ", r, W);
            return jobs[r].st;
        }
    return DDT_OK;
}

/* ------------------------------------------------------------------ create */

static ddt_status create_job(rank_job *j) {
    ddt_engine_multi *m = j->m;
    return ddt_engine_cuda_create_rank(j->dir, j->opts, m->max_ctx, j->r, m->world, ddt_rank_sum_allreduce,
                                       ddt_rank_sum_allgather, &m->rs[j->r], &m->rank[j->r], &j->err);
}

void ddt_engine_multi_free(ddt_engine_multi *m) {
    if (!m) return;
    int prev = 0;
    bool have_prev = cudaGetDevice(&prev) == cudaSuccess;
    for (int32_t r = 0; r < m->world; r++) {
        if (!m->rank[r] && !m->have_comms) continue;
        if (cudaSetDevice(r) != cudaSuccess) continue; /* nothing can be freed on a device that is gone */
        ddt_engine_cuda_free(m->rank[r]);
        ddt_rank_sum_release(&m->rs[r]);
        if (m->have_comms) ncclCommDestroy(m->comm[r]);
    }
    if (have_prev) cudaSetDevice(prev);
    free(m->scratch);
    free(m);
}

ddt_status ddt_engine_multi_create(const char *model_dir, const ddt_engine_options *opts, int32_t max_ctx,
                                   ddt_engine_multi **out, ddt_error *err) {
    *out = NULL;
    const int32_t W = opts->gpus > 1 ? opts->gpus : 1;
    if (W > DDT_ENGINE_MAX_GPUS)
        return ddt_fail(err, DDT_ERR_RANGE, "--gpus %d: at most %d", W, DDT_ENGINE_MAX_GPUS);
    int n_dev = 0;
    cudaError_t ce = cudaGetDeviceCount(&n_dev);
    if (ce != cudaSuccess) return ddt_fail(err, DDT_ERR_UNSUPPORTED, "--gpus %d: no CUDA device: %s", W,
                                           cudaGetErrorString(ce));
    if (W > n_dev)
        return ddt_fail(err, DDT_ERR_RANGE, "--gpus %d: only %d CUDA device%s visible on this host", W, n_dev,
                        n_dev == 1 ? " is" : "s are");
    ddt_engine_multi *m = calloc(1, sizeof *m);
    if (!m) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory creating the multi-GPU engine");
    m->world = W;
    m->max_ctx = max_ctx;
    m->scratch = ddt_malloc_array((size_t)W * (size_t)(max_ctx + DDT_MAX_PATH), sizeof(int32_t));
    if (!m->scratch) {
        free(m);
        return ddt_fail(err, DDT_ERR_NOMEM, "out of memory creating the multi-GPU engine");
    }
    int devs[DDT_ENGINE_MAX_GPUS];
    for (int32_t r = 0; r < W; r++) devs[r] = r;
    ncclResult_t nr = ncclCommInitAll(m->comm, W, devs);
    if (nr != ncclSuccess) {
        ddt_engine_multi_free(m);
        return ddt_fail(err, DDT_ERR_INTERNAL, "NCCL: ncclCommInitAll over %d GPUs failed: %s", W,
                        ncclGetErrorString(nr));
    }
    m->have_comms = true;
    for (int32_t r = 0; r < W; r++) m->rs[r] = ddt_rank_sum_make(m->comm[r], W);
    rank_job jobs[DDT_ENGINE_MAX_GPUS];
    memset(jobs, 0, sizeof(rank_job) * (size_t)W);
    for (int32_t r = 0; r < W; r++) jobs[r] = (rank_job){.m = m, .r = r, .fn = create_job, .dir = model_dir,
                                                        .opts = opts};
    ddt_status st = run_ranks(m, jobs, err);
    if (st != DDT_OK) {
        ddt_engine_multi_free(m);
        return st;
    }
    *out = m;
    return DDT_OK;
}

int32_t ddt_engine_multi_vocab(const ddt_engine_multi *m) { return ddt_engine_cuda_vocab(m->rank[0]); }
/* every rank holds rank 0's table (engine_cuda.c share_cost) */
const ddt_cost_model *ddt_engine_multi_cost(const ddt_engine_multi *m) { return ddt_engine_cuda_cost(m->rank[0]); }
const ddt_model_config *ddt_engine_multi_model_config(const ddt_engine_multi *m) {
    return ddt_engine_cuda_model_config(m->rank[0]);
}
void ddt_engine_multi_set_sampling(ddt_engine_multi *m, const ddt_sampling *s) {
    for (int32_t r = 0; r < m->world; r++) ddt_engine_cuda_set_sampling(m->rank[r], s);
}

/* Log-probabilities: rank 0 alone copies its rows back (every rank holds the same
 * logits), after the round's synchronisation, so the others never wait for it. */
void ddt_engine_multi_set_logprobs(ddt_engine_multi *m, ddt_token_logprobs *out, int32_t capacity, int32_t n_top) {
    ddt_engine_cuda_set_logprobs(m->rank[0], out, capacity, n_top);
}

static ddt_status score_job(rank_job *j) {
    return ddt_engine_cuda_score(j->m->rank[j->r], j->ids, j->n_ids, j->n_top, j->lp, &j->err);
}

/* Every rank runs the prefill forwards (their all-reduces must match); rank 0's
 * values go to out, the others' to a scratch array made for the call (scoring is no
 * decoding round). */
ddt_status ddt_engine_multi_score(ddt_engine_multi *m, const int32_t *ids, int32_t n, int32_t n_top,
                                  ddt_token_logprobs *out, ddt_error *err) {
    ddt_token_logprobs *scratch = NULL;
    if (m->world > 1 && !(scratch = ddt_calloc_array((size_t)(m->world - 1) * (size_t)n, sizeof *scratch)))
        return ddt_fail(err, DDT_ERR_NOMEM, "out of memory scoring %d tokens on %d GPUs", n, m->world);
    rank_job jobs[DDT_ENGINE_MAX_GPUS];
    memset(jobs, 0, sizeof(rank_job) * (size_t)m->world);
    for (int32_t r = 0; r < m->world; r++)
        jobs[r] = (rank_job){.m = m, .r = r, .fn = score_job, .ids = ids, .n_ids = n, .n_top = n_top,
                             .lp = r == 0 ? out : scratch + (size_t)(r - 1) * (size_t)n};
    const ddt_status st = run_ranks(m, jobs, err);
    free(scratch);
    return st;
}

/* Every rank takes the same constraint and rules (its own state and masks). */
ddt_status ddt_engine_multi_set_constraint(ddt_engine_multi *m, const ddt_json_constraint *c, ddt_error *err) {
    for (int32_t r = 0; r < m->world; r++) {
        ddt_status st = ddt_engine_cuda_set_constraint(m->rank[r], c, err);
        if (st != DDT_OK) return st;
    }
    return DDT_OK;
}

ddt_status ddt_engine_multi_set_logit_rules(ddt_engine_multi *m, const ddt_logit_rules *rl, ddt_error *err) {
    for (int32_t r = 0; r < m->world; r++) {
        ddt_status st = ddt_engine_cuda_set_logit_rules(m->rank[r], rl, err);
        if (st != DDT_OK) return st;
    }
    return DDT_OK;
}

void ddt_engine_multi_set_answer_start(ddt_engine_multi *m, int32_t start) {
    for (int32_t r = 0; r < m->world; r++) ddt_engine_cuda_set_answer_start(m->rank[r], start);
}

/* ------------------------------------------------------------------ generate */

static ddt_status generate_job(rank_job *j) {
    return ddt_engine_cuda_generate(j->m->rank[j->r], j->prompt, j->n_prompt, j->max_new, j->stop, j->n_stop, j->out,
                                    &j->n_out, j->emit, j->emit_ctx, j->stats, &j->err);
}

ddt_status ddt_engine_multi_generate(ddt_engine_multi *m, const int32_t *prompt, int32_t n_prompt, int32_t max_new,
                                     const int32_t *stop, int32_t n_stop, int32_t *out, int32_t *n_out,
                                     ddt_emit_fn emit_fn, void *emit_ctx, ddt_gen_stats *stats, ddt_error *err) {
    rank_job jobs[DDT_ENGINE_MAX_GPUS];
    memset(jobs, 0, sizeof(rank_job) * (size_t)m->world);
    for (int32_t r = 0; r < m->world; r++) {
        /* every rank decodes the same tokens; only rank 0's reach the caller (the
           context bounds what a generation emits: at most max_ctx tokens) */
        jobs[r] = (rank_job){.m = m, .r = r, .fn = generate_job, .prompt = prompt, .n_prompt = n_prompt,
                             .max_new = max_new, .stop = stop, .n_stop = n_stop,
                             .out = r == 0 ? out : m->scratch + (size_t)r * (size_t)(m->max_ctx + DDT_MAX_PATH),
                             .emit = r == 0 ? emit_fn : NULL, .emit_ctx = r == 0 ? emit_ctx : NULL,
                             .stats = r == 0 ? stats : NULL};
    }
    ddt_status st = run_ranks(m, jobs, err);
    *n_out = jobs[0].n_out;
    return st;
}
