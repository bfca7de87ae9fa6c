/*
 * test_cuda_multi.c — the multi-GPU (NCCL) path on one GPU, run on the H200 by
 * scripts/gpu-test.sh (CI compiles it but has no GPU to run it).
 *
 *  1. World size 1 through NCCL: a target sharded as rank 0 of 1 with
 *     ncclAllReduce gives bitwise the logits of the unsharded target; the
 *     engine with nccl_always (the multi-GPU engine, one rank) gives token for
 *     token the single-GPU engine's output and the CPU's, greedy ar / tree and
 *     sampled tree, on the fixture pair and the shipped pair.
 *  2. World sizes 2, 3 and 4 emulated on the one GPU (test-only transport, not
 *     a product one): one host thread per rank, each rank's target holding its
 *     shard (heads, experts, and the slices of the dense MLPs and shared experts
 *     where they cut into whole units: the fixture's dense MLP at 2 GPUs, the
 *     shipped pair's dense MLP at 2 and 4 and its shared expert at 2; elsewhere on
 *     rank 0; the logits by vocabulary rows where the world cuts the vocabulary into
 *     32-row units, gathered: the shipped pair's at 2 and 4), partial sums added in
 *     rank order with a plain device add between
 *     two barriers.  Fed the unsharded greedy sequence, the sharded logits stay
 *     within a small normalised error of the unsharded ones, and on the shipped
 *     model every step's argmax is the same (= the same greedy output).  World 3
 *     leaves 4 heads unsplit: the replicated-attention path.
 *  3. Errors: more GPUs than devices, --gpus with the CPU backend.
 *  3c. Real worlds of 2, 4 and 8 GPUs over NCCL where the machine has them
 *     (test_real_worlds): greedy tree == greedy ar on the same world, and == the
 *     one GPU's ar at 2 and 4; on one GPU it says it ran none.
 *  3b. Logit rules and the JSON constraint over NCCL (one rank): the single-GPU
 *     engine's tokens (test_rules_json); scoring and log-probabilities: its values,
 *     bitwise (test_logprobs_score).
 *  4. A cancel on an emulated world of 2 engines (ddt_engine_cuda_create_rank,
 *     one thread each): rank 0's emit callback stops the generation, and every
 *     rank returns (the stop flag summed at the start of each round reaches
 *     rank 1: without it rank 1 would wait in the next round's all-reduce for
 *     ever; a 120 s watchdog fails the test instead of hanging); rank 0 emits
 *     the uncancelled run's tokens up to the cancel, stop reason cancelled, and
 *     the engines decode as before afterwards.  The engines run the auto budget
 *     under given cost tables: no CUDA graph (the emulated all-reduce
 *     synchronises, which capture forbids).  Each rank is given another table, as
 *     each would time its own GPU; created at the same time (one thread each, as
 *     the multi-GPU engine does), every rank holds rank 0's, bitwise, and builds
 *     the same trees (the same rounds and node counts on both ranks).
 * --quick (compute-sanitizer) runs the emulation on the fixture only, without
 * NCCL (whose own transports are not under test), and says so.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/nn_cuda.h"
#include "core/calibration.h"
#include "text/json_vocab.h"
#include "text/tokenizer.h"
#include "ddtree.h"
#include "engine/engine.h"
#include "engine/engine_cuda.h"
#include "io/config.h"
#include "model/target_cuda.h"
#include "cuda_test.h"

#define CHUNK 64
#define MAX_WORLD 4

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) { return ct_xorshift(&g_rng, 11); }

/* ------------------------------------------------------------------ transports */

static ddt_status nccl_reduce(void *ctx, float *buf, int64_t count, void *stream, ddt_error *err) {
    if (!buf) return DDT_OK; /* the target's reservation: ncclAllReduce needs no buffer of ours */
    ncclResult_t r = ncclAllReduce(buf, buf, (size_t)count, ncclFloat32, ncclSum, *(ncclComm_t *)ctx,
                                   (cudaStream_t)stream);
    if (r != ncclSuccess) {
        snprintf(err->msg, sizeof err->msg, "ncclAllReduce: %s", ncclGetErrorString(r));
        return DDT_ERR_INTERNAL;
    }
    return DDT_OK;
}

/* The emulated all-reduce: stage every rank's partial, then every rank sums the
 * stages in rank order (so all ranks get the same bytes, as NCCL guarantees). */
typedef struct emu_comm {
    int world;
    pthread_barrier_t bar;
    float *stage[MAX_WORLD]; /* device [cap] each */
    int64_t cap;
} emu_comm;

typedef struct emu_rank {
    emu_comm *c;
    int r;
} emu_rank;

static ddt_status emu_reduce(void *ctx, float *buf, int64_t count, void *stream, ddt_error *err) {
    emu_rank *er = ctx;
    emu_comm *c = er->c;
    cudaStream_t s = stream;
    if (!buf) return DDT_OK; /* the target's reservation: the test sizes the stages (CHUNK rows) */
    if (count > c->cap) {
        snprintf(err->msg, sizeof err->msg, "emulated all-reduce of %lld > %lld floats", (long long)count,
                 (long long)c->cap);
        return DDT_ERR_RANGE;
    }
    CU(cudaMemcpyAsync(c->stage[er->r], buf, sizeof(float) * (size_t)count, cudaMemcpyDeviceToDevice, s));
    CU(cudaStreamSynchronize(s));
    pthread_barrier_wait(&c->bar);
    CU(cudaMemcpyAsync(buf, c->stage[0], sizeof(float) * (size_t)count, cudaMemcpyDeviceToDevice, s));
    for (int k = 1; k < c->world; k++) {
        ddt_status st = ddt_cuda_add(buf, c->stage[k], count, s, err);
        if (st != DDT_OK) return st;
    }
    CU(cudaStreamSynchronize(s));
    pthread_barrier_wait(&c->bar); /* nobody restages before everyone has read */
    return DDT_OK;
}

/* The emulated all-gather (the sharded logits): every rank stages its block, then
 * copies every rank's stage into recv in rank order. */
static ddt_status emu_gather(void *ctx, const float *send, int64_t count, float *recv, void *stream, ddt_error *err) {
    emu_rank *er = ctx;
    emu_comm *c = er->c;
    cudaStream_t s = stream;
    if (count > c->cap) {
        snprintf(err->msg, sizeof err->msg, "emulated all-gather of %lld > %lld floats", (long long)count,
                 (long long)c->cap);
        return DDT_ERR_RANGE;
    }
    CU(cudaMemcpyAsync(c->stage[er->r], send, sizeof(float) * (size_t)count, cudaMemcpyDeviceToDevice, s));
    CU(cudaStreamSynchronize(s));
    pthread_barrier_wait(&c->bar);
    for (int k = 0; k < c->world; k++)
        CU(cudaMemcpyAsync(recv + (size_t)k * (size_t)count, c->stage[k], sizeof(float) * (size_t)count,
                           cudaMemcpyDeviceToDevice, s));
    CU(cudaStreamSynchronize(s));
    pthread_barrier_wait(&c->bar);
    return DDT_OK;
}

/* ------------------------------------------------------------------ teacher-forced runs */

/* Prefill prompt then feed seq[0..n_new) one token at a time; logits [n_new + 1][vocab]
 * on the host: row 0 after the prompt, row i + 1 after seq[i].  seq NULL: the run
 * feeds its own argmax (and writes it to *own). */
typedef struct run_job {
    ddt_cuda_target *t;
    const int32_t *prompt, *seq;
    int np, n_new, vocab;
    float *logits;
    int32_t *own;
} run_job;

static int argmax(const float *z, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (z[i] > z[b]) b = i;
    return b;
}

static void *run_forced(void *p) {
    run_job *j = p;
    CU(cudaSetDevice(0));
    cudaStream_t s = ddt_cuda_target_stream(j->t);
    int32_t *ids;
    float *dl;
    CU(cudaMalloc((void **)&ids, sizeof(int32_t) * (size_t)(j->np + 1)));
    CU(cudaMalloc((void **)&dl, sizeof(float) * (size_t)j->vocab));
    CU(cudaMemcpy(ids, j->prompt, sizeof(int32_t) * (size_t)j->np, cudaMemcpyHostToDevice));
    OK(ddt_cuda_target_reset(j->t, &err_));
    for (int i = 0; i < j->np; i += CHUNK) {
        int c = j->np - i < CHUNK ? j->np - i : CHUNK;
        OK(ddt_cuda_target_prefill(j->t, ids + i, c, dl, false, &err_));
    }
    for (int k = 0;; k++) {
        CU(cudaMemcpyAsync(j->logits + (size_t)k * j->vocab, dl, sizeof(float) * (size_t)j->vocab,
                           cudaMemcpyDeviceToHost, s));
        CU(cudaStreamSynchronize(s));
        if (k == j->n_new) break;
        int32_t next = j->seq ? j->seq[k] : argmax(j->logits + (size_t)k * j->vocab, j->vocab);
        if (j->own) j->own[k] = next;
        CU(cudaMemcpyAsync(ids, &next, sizeof next, cudaMemcpyHostToDevice, s));
        OK(ddt_cuda_target_prefill(j->t, ids, 1, dl, false, &err_));
    }
    CU(cudaStreamSynchronize(s));
    CU(cudaFree(ids));
    CU(cudaFree(dl));
    return NULL;
}

static bool g_tc; /* load() with the tensor cores (test_emulated's tc cases) */

static ddt_cuda_target *load(const char *dir, int ctx, int rank, int world, ddt_cuda_allreduce_fn fn, void *fctx) {
    ddt_cuda_target_options o = {.max_ctx = ctx, .max_tokens = CHUNK, .shard_rank = rank, .shard_world = world,
                                 .allreduce = fn, .allreduce_ctx = fctx, .tensor_cores = g_tc,
                                 .allgather = fn == emu_reduce ? emu_gather : NULL};
    ddt_cuda_target *t;
    OK(ddt_cuda_target_load(dir, &o, &t, &err_));
    return t;
}

/* The unsharded greedy run: its tokens (own) and logits. */
static void reference(const char *dir, const int32_t *prompt, int np, int n_new, int vocab, int32_t *own,
                      float *logits) {
    ddt_cuda_target *t = load(dir, np + n_new + 1, 0, 0, NULL, NULL);
    run_job j = {t, prompt, NULL, np, n_new, vocab, logits, own};
    run_forced(&j);
    ddt_cuda_target_free(t);
}

/* 1. world 1 over NCCL: bitwise the unsharded logits. */
static void test_nccl_world1(const char *dir, const int32_t *prompt, int np, int n_new, int vocab) {
    const size_t nl = (size_t)(n_new + 1) * (size_t)vocab;
    float *ref = malloc(nl * sizeof(float)), *got = malloc(nl * sizeof(float));
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)n_new);
    reference(dir, prompt, np, n_new, vocab, seq, ref);
    ncclComm_t comm;
    int dev0 = 0;
    if (ncclCommInitAll(&comm, 1, &dev0) != ncclSuccess) {
        CHECK(0, "ncclCommInitAll over 1 GPU failed");
        return;
    }
    ddt_cuda_target *t = load(dir, np + n_new + 1, 0, 1, nccl_reduce, &comm);
    run_job j = {t, prompt, seq, np, n_new, vocab, got, NULL};
    run_forced(&j);
    ddt_cuda_target_free(t);
    ncclCommDestroy(comm);
    CHECK(!memcmp(ref, got, nl * sizeof(float)), "%s: NCCL world 1 logits differ from the unsharded target", dir);
    printf("  %s: NCCL world 1, %d steps: logits %s\n", dir, n_new + 1,
           memcmp(ref, got, nl * sizeof(float)) ? "DIFFER" : "bitwise equal");
    free(ref), free(got), free(seq);
}

/* 2. world W emulated on one GPU; tc: every target (the reference too) on the tensor
 * cores, where want_fronts >= 0 is the number of MoE layers each rank must run with
 * the router stacked with its slice of the shared expert (only where every rank
 * holds one). */
static void test_emulated_tc(const char *dir, const int32_t *prompt, int np, int n_new, int vocab, int world,
                             bool need_argmax, bool tc, int want_fronts) {
    g_tc = tc;
    const size_t nl = (size_t)(n_new + 1) * (size_t)vocab;
    float *ref = malloc(nl * sizeof(float));
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)n_new);
    reference(dir, prompt, np, n_new, vocab, seq, ref);
    emu_comm c = {.world = world};
    pthread_barrier_init(&c.bar, NULL, (unsigned)world);
    ddt_cuda_target *t[MAX_WORLD];
    emu_rank er[MAX_WORLD];
    run_job jobs[MAX_WORLD];
    pthread_t th[MAX_WORLD];
    float *got[MAX_WORLD];
    for (int r = 0; r < world; r++) {
        er[r] = (emu_rank){&c, r};
        t[r] = load(dir, np + n_new + 1, r, world, emu_reduce, &er[r]);
        /* the logits by vocabulary rows where the world cuts the vocabulary into 32-row units */
        const int64_t want_head = vocab % world == 0 && (vocab / world) % 32 == 0 ? vocab / world : vocab;
        CHECK(ddt_cuda_target_head_rows(t[r]) == want_head, "%s world %d rank %d: logits of %lld vocabulary rows, want %lld",
              dir, world, r, (long long)ddt_cuda_target_head_rows(t[r]), (long long)want_head);
        if (want_fronts >= 0)
            CHECK(ddt_cuda_target_stacked_fronts(t[r]) == want_fronts, "%s world %d rank %d: %d stacked fronts, want %d",
                  dir, world, r, ddt_cuda_target_stacked_fronts(t[r]), want_fronts);
        const ddt_model_config *cfg = ddt_cuda_target_config(t[r]);
        /* a forward's hidden rows, or (the logits' gather) its rows of a rank's vocabulary block */
        c.cap = (int64_t)CHUNK * (cfg->hidden_size > cfg->vocab_size ? cfg->hidden_size : cfg->vocab_size);
        got[r] = malloc(nl * sizeof(float));
        jobs[r] = (run_job){t[r], prompt, seq, np, n_new, vocab, got[r], NULL};
    }
    for (int r = 0; r < world; r++) CU(cudaMalloc((void **)&c.stage[r], sizeof(float) * (size_t)c.cap));
    for (int r = 0; r < world; r++) pthread_create(&th[r], NULL, run_forced, &jobs[r]);
    for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
    /* every rank holds the same bytes; the sum order differs from the unsharded run */
    for (int r = 1; r < world; r++)
        CHECK(!memcmp(got[0], got[r], nl * sizeof(float)), "%s world %d: rank %d's logits differ from rank 0's", dir,
              world, r);
    double num = 0.0, den = 0.0;
    int same = 0;
    for (int k = 0; k <= n_new; k++) {
        const float *a = ref + (size_t)k * vocab, *b = got[0] + (size_t)k * vocab;
        for (int v = 0; v < vocab; v++) num += ((double)a[v] - b[v]) * ((double)a[v] - b[v]), den += (double)a[v] * a[v];
        same += argmax(a, vocab) == argmax(b, vocab);
    }
    double rel = sqrt(num / (den > 0 ? den : 1));
    printf("  %s: world %d emulated%s, %d steps: normalised logit error %.2e, argmax equal at %d/%d steps\n", dir,
           world, tc ? " (tensor cores)" : "", n_new + 1, rel, same, n_new + 1);
    /* on the tensor cores the sharded router's product has another shape than the whole
       one (a front of the rank's shared rows), so its logits differ in the last bits and a
       near tie in the routing may pick another expert at a step: a looser bound, which a
       wrong slice or gather (an error of order 1) still fails */
    const double bound = tc ? 1e-2 : 1e-4;
    CHECK(rel < bound, "%s world %d%s: normalised logit error %.3e (bound %.0e)", dir, world,
          tc ? " (tensor cores)" : "", rel, bound);
    if (need_argmax) CHECK(same == n_new + 1, "%s world %d: greedy token differs at %d steps", dir, world, n_new + 1 - same);
    for (int r = 0; r < world; r++) {
        ddt_cuda_target_free(t[r]);
        CU(cudaFree(c.stage[r]));
        free(got[r]);
    }
    pthread_barrier_destroy(&c.bar);
    free(ref), free(seq);
    g_tc = false;
}

static void test_emulated(const char *dir, const int32_t *prompt, int np, int n_new, int vocab, int world,
                          bool need_argmax) {
    test_emulated_tc(dir, prompt, np, n_new, vocab, world, need_argmax, false, -1);
}

/* ------------------------------------------------------------------ engine */

typedef struct run_out {
    int32_t ids[512];
    int32_t n;
} run_out;

/* The engines of these tests: seed 11, two CPU threads. */
static const ddt_draft_calibration *g_cal; /* engine_opts' options.draft_calibration */

static ddt_engine_options engine_opts(ddt_backend be, ddt_mode mode, const char *draft, int budget, float temp,
                                      int gpus, bool nccl) {
    ddt_engine_options o = {0};
    o.draft_calibration = g_cal;
    o.mode = mode;
    o.backend = be;
    o.draft_dir = draft;
    o.budget = budget;
    o.sampling = (ddt_sampling){temp, 0, 1.0f, 11};
    o.n_threads = 2;
    o.gpus = gpus;
    o.nccl_always = nccl;
    return o;
}

static ddt_status run_engine(const char *model, const char *draft, ddt_backend be, ddt_mode mode, int budget,
                             float temp, int gpus, bool nccl, const int32_t *prompt, int np, int max_new, run_out *r,
                             ddt_error *err) {
    const ddt_engine_options o = engine_opts(be, mode, draft, budget, temp, gpus, nccl);
    ddt_engine *e;
    ddt_status st = ddt_engine_create(model, &o, &e, err);
    if (st != DDT_OK) return st;
    st = ddt_engine_generate(e, prompt, np, max_new, NULL, 0, r->ids, &r->n, NULL, NULL, NULL, err);
    ddt_engine_free(e);
    return st;
}

static bool same_out(const run_out *a, const run_out *b) {
    return a->n == b->n && !memcmp(a->ids, b->ids, sizeof(int32_t) * (size_t)a->n);
}

static void test_engine(const char *model, const char *draft, const int32_t *prompt, int np, int max_new) {
    static run_out cpu, one, multi;
    OK(run_engine(model, draft, DDT_BACKEND_CPU, DDT_MODE_AR, 0, 0.0f, 0, false, prompt, np, max_new, &cpu, &err_));
    OK(run_engine(model, draft, DDT_BACKEND_CUDA, DDT_MODE_AR, 0, 0.0f, 1, true, prompt, np, max_new, &multi, &err_));
    CHECK(same_out(&cpu, &multi), "%s: greedy ar over NCCL (1 GPU) != CPU ar", model);
    const int budgets[] = {1, 16, 63};
    for (int b = 0; b < 3; b++) {
        OK(run_engine(model, draft, DDT_BACKEND_CUDA, DDT_MODE_TREE, budgets[b], 0.0f, 0, false, prompt, np, max_new,
                      &one, &err_));
        OK(run_engine(model, draft, DDT_BACKEND_CUDA, DDT_MODE_TREE, budgets[b], 0.0f, 1, true, prompt, np, max_new,
                      &multi, &err_));
        CHECK(same_out(&one, &multi), "%s: greedy tree %d over NCCL != single-GPU tree", model, budgets[b]);
        CHECK(same_out(&cpu, &multi), "%s: greedy tree %d over NCCL != CPU ar", model, budgets[b]);
    }
    /* a draft calibration: every rank builds the calibrated tree, the tokens stay the single GPU's and ar's */
    ddt_draft_calibration cal;
    ddt_cal_identity(&cal);
    cal.w[0][0] = 3.0f;
    for (int b = 1; b < DDT_CAL_BUCKETS; b++) cal.w[b][0] = -2.0f;
    cal.lookup = 1; /* every rank grafts the same lookup path (the same context on each) */
    for (int m = 0; m < DDT_CAL_LOOKUP_LENS; m++) cal.lookup_first[m] = 0.9f;
    cal.lookup_next = 0.95f;
    g_cal = &cal;
    OK(run_engine(model, draft, DDT_BACKEND_CUDA, DDT_MODE_TREE, 16, 0.0f, 0, false, prompt, np, max_new, &one, &err_));
    OK(run_engine(model, draft, DDT_BACKEND_CUDA, DDT_MODE_TREE, 16, 0.0f, 1, true, prompt, np, max_new, &multi, &err_));
    g_cal = NULL;
    CHECK(same_out(&one, &multi) && same_out(&cpu, &multi), "%s: calibrated greedy tree 16 over NCCL != single GPU / ar",
          model);
    OK(run_engine(model, draft, DDT_BACKEND_CUDA, DDT_MODE_TREE, 16, 1.0f, 0, false, prompt, np, max_new, &one, &err_));
    OK(run_engine(model, draft, DDT_BACKEND_CUDA, DDT_MODE_TREE, 16, 1.0f, 1, true, prompt, np, max_new, &multi, &err_));
    CHECK(same_out(&one, &multi), "%s: sampled tree (T=1) over NCCL != single-GPU sampled tree", model);
    printf("  %s: engine over NCCL (1 GPU), %d tokens: ar vs CPU ar, tree 1/16/63 (and 16 calibrated) vs single-GPU "
           "tree and CPU ar, T=1 tree vs single-GPU (failures so far: %d)\n", model, multi.n, g_failures);
}

/* 5. Real worlds over NCCL, 2, 4 and 8 GPUs as the machine has them: greedy tree
 * (budgets 16 and 63) on W GPUs gives W GPUs' greedy ar tokens, the lossless claim
 * across ranks (the engine's all-reduce adds the partials in rank order at every
 * token count, engine_multi_cuda.c); at W = 2 and 4, which the emulation checks on
 * this pair against the unsharded model, also the one GPU's ar; a sampled tree
 * (T = 1) twice the same.  One GPU: says so, runs none. */
static void test_real_worlds(const char *model, const char *draft, const int32_t *prompt, int np, int max_new) {
    int n_dev = 0;
    CU(cudaGetDeviceCount(&n_dev));
    if (n_dev < 2) {
        printf("  real worlds over NCCL: %d device, none run (2, 4 and 8 GPUs run where the machine has them)\n",
               n_dev);
        return;
    }
    static run_out one, ar, tree, again;
    OK(run_engine(model, draft, DDT_BACKEND_CUDA, DDT_MODE_AR, 0, 0.0f, 0, false, prompt, np, max_new, &one, &err_));
    for (int world = 2; world <= 8 && world <= n_dev; world *= 2) {
        OK(run_engine(model, draft, DDT_BACKEND_CUDA, DDT_MODE_AR, 0, 0.0f, world, false, prompt, np, max_new, &ar,
                      &err_));
        const bool as_one = same_out(&ar, &one);
        if (world <= 4) CHECK(as_one, "%s: greedy ar on %d GPUs != one GPU's", model, world);
        const int budgets[] = {16, 63};
        for (int b = 0; b < 2; b++) {
            OK(run_engine(model, draft, DDT_BACKEND_CUDA, DDT_MODE_TREE, budgets[b], 0.0f, world, false, prompt, np,
                          max_new, &tree, &err_));
            CHECK(same_out(&tree, &ar), "%s: greedy tree %d on %d GPUs != greedy ar on %d GPUs", model, budgets[b],
                  world, world);
        }
        OK(run_engine(model, draft, DDT_BACKEND_CUDA, DDT_MODE_TREE, 16, 1.0f, world, false, prompt, np, max_new, &tree,
                      &err_));
        OK(run_engine(model, draft, DDT_BACKEND_CUDA, DDT_MODE_TREE, 16, 1.0f, world, false, prompt, np, max_new,
                      &again, &err_));
        CHECK(same_out(&tree, &again), "%s: sampled tree 16 on %d GPUs differs between two runs", model, world);
        printf("  %s on %d GPUs, %d tokens: greedy tree 16 / 63 == its ar; ar %s one GPU's; sampled tree 16 "
               "reproducible (failures so far: %d)\n", model, world, ar.n, as_one ? "==" : "differs from (not "
               "checked past 4 GPUs)", g_failures);
    }
}

/* Logit rules and the JSON constraint on the multi-GPU engine (one rank over NCCL):
 * every rank walks on the host over the same logits, so the tokens are the
 * single-GPU engine's under the same rules, greedy ar and tree 16. */
static ddt_status ruled_engine(const char *model, const char *draft, ddt_mode mode, int gpus, bool nccl,
                               const ddt_logit_rules *rules, const ddt_json_vocab *v, const int32_t *prompt, int np,
                               int max_new, run_out *r, ddt_error *err) {
    const ddt_engine_options o =
        engine_opts(DDT_BACKEND_CUDA, mode, mode == DDT_MODE_AR ? NULL : draft, 16, 0.0f, gpus, nccl);
    ddt_engine *e;
    ddt_status st = ddt_engine_create(model, &o, &e, err);
    if (st != DDT_OK) return st;
    const ddt_json_constraint jc = {v, true, NULL};
    const int32_t eos = 4097; /* the shipped target's eos_token_id */
    if ((st = ddt_engine_set_logit_rules(e, rules, err)) == DDT_OK &&
        (st = ddt_engine_set_constraint(e, v ? &jc : NULL, err)) == DDT_OK)
        st = ddt_engine_generate(e, prompt, np, max_new, &eos, 1, r->ids, &r->n, NULL, NULL, NULL, err);
    ddt_engine_free(e);
    return st;
}

static void test_rules_json(const char *model, const char *draft, const int32_t *prompt, int np) {
    ddt_tokenizer *tok;
    ddt_json_vocab *v;
    OK(ddt_tokenizer_load(model, &tok, &err_));
    OK(ddt_json_vocab_create(tok, 4352, &v, &err_));
    static run_out plain, one, multi;
    OK(ruled_engine(model, draft, DDT_MODE_AR, 0, false, NULL, NULL, prompt, np, 48, &plain, &err_));
    const int32_t ids[2] = {plain.ids[0], plain.ids[1]};
    const float bias[2] = {-8.0f, 2.0f};
    const ddt_logit_rules rules = {ids, bias, 2, 0.6f, 0.4f, 1.2f};
    int runs = 0;
    for (int c = 0; c < 2; c++)
        for (int m = 0; m < 2; m++) {
            const ddt_mode mode = m ? DDT_MODE_TREE : DDT_MODE_AR;
            OK(ruled_engine(model, draft, mode, 0, false, &rules, c ? v : NULL, prompt, np, 48, &one, &err_));
            OK(ruled_engine(model, draft, mode, 1, true, &rules, c ? v : NULL, prompt, np, 48, &multi, &err_));
            CHECK(same_out(&one, &multi), "%s: mode %d, rules%s: over NCCL != single GPU", model, (int)mode,
                  c ? " + json" : "");
            CHECK(!same_out(&one, &plain), "%s: mode %d: the rules changed nothing", model, (int)mode);
            runs++;
        }
    printf("  %s: rules and the JSON constraint over NCCL (1 GPU) == single GPU, ar and tree 16 (%d runs)\n", model,
           runs);
    ddt_json_vocab_free(v);
    ddt_tokenizer_free(tok);
}

/* Scoring and log-probabilities on the multi-GPU engine (one rank over NCCL): the
 * single-GPU engine's values, bitwise (the same logits). */
static void test_logprobs_score(const char *model, const char *draft, const int32_t *prompt, int np) {
    enum { NS = 100, NG = 24 };
    static ddt_token_logprobs a[NS], b[NS], la[NG], lb[NG];
    static run_out ra, rb;
    ddt_engine *e[2];
    for (int k = 0; k < 2; k++) { /* one GPU, then one rank over NCCL */
        const ddt_engine_options o = engine_opts(DDT_BACKEND_CUDA, DDT_MODE_TREE, draft, 16, 0.0f, k, k == 1);
        OK(ddt_engine_create(model, &o, &e[k], &err_));
    }
    const int n = np < NS ? np : NS;
    OK(ddt_engine_score(e[0], prompt, n, 5, a, &err_));
    OK(ddt_engine_score(e[1], prompt, n, 5, b, &err_));
    int diff = 0;
    for (int i = 1; i < n; i++)
        diff += memcmp(&a[i].logprob, &b[i].logprob, sizeof(float)) != 0 || a[i].n_top != b[i].n_top ||
                memcmp(a[i].top_id, b[i].top_id, sizeof(int32_t) * (size_t)a[i].n_top) != 0;
    CHECK(diff == 0, "%s: score over NCCL: %d of %d tokens differ from the single GPU's", model, diff, n - 1);
    OK(ddt_engine_set_logprobs(e[0], la, NG, 3, &err_));
    OK(ddt_engine_set_logprobs(e[1], lb, NG, 3, &err_));
    OK(ddt_engine_generate(e[0], prompt, np < 40 ? np : 40, NG, NULL, 0, ra.ids, &ra.n, NULL, NULL, NULL, &err_));
    OK(ddt_engine_generate(e[1], prompt, np < 40 ? np : 40, NG, NULL, 0, rb.ids, &rb.n, NULL, NULL, NULL, &err_));
    diff = 0;
    for (int i = 0; i < NG; i++)
        diff += memcmp(&la[i].logprob, &lb[i].logprob, sizeof(float)) != 0 || la[i].n_top != 3 ||
                memcmp(la[i].top_id, lb[i].top_id, 3 * sizeof(int32_t)) != 0;
    CHECK(same_out(&ra, &rb) && diff == 0, "%s: logprobs over NCCL: %d of %d tokens differ", model, diff, NG);
    printf("  %s: score (%d tokens) and tree-16 logprobs over NCCL (1 GPU) == single GPU, bitwise\n", model, n - 1);
    ddt_engine_free(e[0]);
    ddt_engine_free(e[1]);
}

static void test_errors(void) {
    int n_dev = 0;
    CU(cudaGetDeviceCount(&n_dev));
    static run_out r;
    int32_t prompt[4] = {1, 2, 3, 4};
    ddt_error err = {0};
    ddt_status st = run_engine("tests/fixtures/target/fp32", NULL, DDT_BACKEND_CUDA, DDT_MODE_AR, 0, 0.0f, n_dev + 1,
                               false, prompt, 4, 4, &r, &err);
    char want_a[64], want_b[64];
    snprintf(want_a, sizeof want_a, "--gpus %d", n_dev + 1);
    snprintf(want_b, sizeof want_b, "only %d CUDA device", n_dev);
    CHECK(st == DDT_ERR_RANGE && strstr(err.msg, want_a) && strstr(err.msg, want_b),
          "more GPUs than devices: status %d, '%s'", (int)st, err.msg);
    printf("  --gpus %d on %d device(s): %s\n", n_dev + 1, n_dev, err.msg);
    st = run_engine("tests/fixtures/target/fp32", NULL, DDT_BACKEND_CPU, DDT_MODE_AR, 0, 0.0f, 2, false, prompt, 4, 4,
                    &r, &err);
    CHECK(st == DDT_ERR_INVALID && strstr(err.msg, "--gpus 2 needs the CUDA backend"), "--gpus with cpu: %d '%s'",
          (int)st, err.msg);
    printf("  --gpus 2 --backend cpu: %s\n", err.msg);
}

/* ------------------------------------------------------------------ cancel in lockstep */

typedef struct gen_job {
    ddt_engine_cuda *e;
    const int32_t *prompt;
    int np, max_new, cancel_call, calls;
    int32_t out[256], n;
    ddt_gen_stats st;
    ddt_status status;
    ddt_error err;
    /* watchdog */
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    int *finished;
} gen_job;

static bool cancel_emit(void *ctx, const int32_t *ids, int32_t n) {
    (void)ids;
    (void)n;
    gen_job *j = ctx;
    return ++j->calls != j->cancel_call;
}

/* A rank's thread counting itself done (all_finished waits for the count). */
static void mark_finished(pthread_mutex_t *mu, pthread_cond_t *cv, int *finished) {
    pthread_mutex_lock(mu);
    (*finished)++;
    pthread_cond_broadcast(cv);
    pthread_mutex_unlock(mu);
}

static void *gen_thread(void *p) {
    gen_job *j = p;
    CU(cudaSetDevice(0));
    j->calls = 0;
    j->status = ddt_engine_cuda_generate(j->e, j->prompt, j->np, j->max_new, NULL, 0, j->out, &j->n,
                                         j->cancel_call ? cancel_emit : NULL, j, &j->st, &j->err);
    mark_finished(j->mu, j->cv, j->finished);
    return NULL;
}

/* Whether `world` threads counted themselves in *finished (under mu, signalling cv)
 * within 120 s: a watchdog, so a rank left waiting in a collective fails the test
 * instead of hanging it. */
static bool all_finished(pthread_mutex_t *mu, pthread_cond_t *cv, int *finished, int world) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 120;
    pthread_mutex_lock(mu);
    while (*finished < world)
        if (pthread_cond_timedwait(cv, mu, &dl) != 0) break;
    const bool all = *finished == world;
    pthread_mutex_unlock(mu);
    return all;
}

/* Generate on every rank at once (rank 0 with a callback cancelling on call
 * cancel_call, 0 = never); false when some rank did not return in 120 s. */
static bool gen_all(ddt_engine_cuda **e, int world, const int32_t *prompt, int np, int max_new, int cancel_call,
                    gen_job *jobs) {
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    int finished = 0;
    pthread_t th[MAX_WORLD];
    for (int r = 0; r < world; r++) {
        jobs[r] = (gen_job){.e = e[r], .prompt = prompt, .np = np, .max_new = max_new,
                            .cancel_call = r == 0 ? cancel_call : 0, .mu = &mu, .cv = &cv, .finished = &finished};
        pthread_create(&th[r], NULL, gen_thread, &jobs[r]);
    }
    /* the stuck threads are left behind: the caller exits */
    if (!all_finished(&mu, &cv, &finished, world)) return false;
    for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
    return true;
}

/* One rank's engine made on its own thread: the ranks of a world are created at
 * the same time, as engine_multi_cuda.c does (creation shares rank 0's cost table
 * through the all-reduce). */
typedef struct create_job {
    const char *model;
    const ddt_engine_options *o;
    int ctx, r, world;
    emu_rank *er;
    ddt_engine_cuda *e;
    ddt_status st;
    ddt_error err;
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    int *finished;
} create_job;

static void *create_thread(void *p) {
    create_job *j = p;
    CU(cudaSetDevice(0));
    j->st = ddt_engine_cuda_create_rank(j->model, j->o, j->ctx, j->r, j->world, emu_reduce, emu_gather, j->er, &j->e,
                                        &j->err);
    mark_finished(j->mu, j->cv, j->finished);
    return NULL;
}

static void test_cancel_lockstep(const char *model, const char *draft, const int32_t *prompt, int np) {
    enum { W = 2, MAX_NEW = 48, CANCEL = 4 };
    /* each rank is given its own table (as each would time its own GPU): rank 1's
       steep one alone would cut every tree to the root; every rank must take rank 0's */
    static const float nodes[2] = {0.0f, 8.0f}, flat[2] = {1e-3f, 1e-3f};
    static const float nodes1[3] = {0.0f, 4.0f, 8.0f}, steep[3] = {1e-3f, 5e-2f, 1.0f};
    const ddt_cost_model cost[W] = {{0.0f, 2, nodes, 1, NULL, flat, 0.0f}, {2e-3f, 3, nodes1, 1, NULL, steep, 0.0f}};
    ddt_engine_options o[W];
    for (int r = 0; r < W; r++) {
        memset(&o[r], 0, sizeof o[r]);
        o[r].mode = DDT_MODE_TREE;
        o[r].budget = 8;
        o[r].budget_auto = true;
        o[r].cost = &cost[r];
        o[r].draft_dir = draft;
        o[r].sampling = (ddt_sampling){0.0f, 0, 1.0f, 0};
    }
    emu_comm c = {.world = W};
    pthread_barrier_init(&c.bar, NULL, W);
    ddt_model_config cfg;
    OK(ddt_config_load(model, &cfg, &err_));
    c.cap = (int64_t)CHUNK * cfg.hidden_size;
    ddt_config_free(&cfg);
    for (int r = 0; r < W; r++) CU(cudaMalloc((void **)&c.stage[r], sizeof(float) * (size_t)c.cap));
    emu_rank er[W];
    ddt_engine_cuda *e[W];
    create_job cj[W];
    pthread_t th[W];
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    int finished = 0;
    for (int r = 0; r < W; r++) {
        er[r] = (emu_rank){&c, r};
        cj[r] = (create_job){.model = model, .o = &o[r], .ctx = np + MAX_NEW + 16, .r = r, .world = W, .er = &er[r],
                             .mu = &mu, .cv = &cv, .finished = &finished};
        pthread_create(&th[r], NULL, create_thread, &cj[r]);
    }
    /* a rank that fails before the shared table leaves the others in the all-reduce:
       a watchdog fails the test instead of hanging */
    if (!all_finished(&mu, &cv, &finished, W)) {
        fprintf(stderr, "FAIL %s: the ranks' creation did not end within 120 s (hung sharing the cost table)\n",
                model);
        exit(1);
    }
    for (int r = 0; r < W; r++) {
        pthread_join(th[r], NULL);
        if (cj[r].st != DDT_OK) {
            fprintf(stderr, "FAIL %s: rank %d of %d: create: %s\n", model, r, W, cj[r].err.msg);
            exit(1);
        }
        e[r] = cj[r].e;
    }
    /* every rank holds rank 0's table, bit for bit */
    for (int r = 0; r < W; r++) {
        const ddt_cost_model *h = ddt_engine_cuda_cost(e[r]);
        bool same = h && h->n_nodes == cost[0].n_nodes && h->n_contexts == 1 &&
                    !memcmp(&h->draft, &cost[0].draft, sizeof h->draft);
        for (int i = 0; same && i < cost[0].n_nodes; i++)
            same = !memcmp(&h->nodes[i], &cost[0].nodes[i], sizeof(float)) &&
                   !memcmp(&h->verify[i], &cost[0].verify[i], sizeof(float));
        CHECK(same, "%s rank %d: its cost table is not rank 0's (%d points, draft %g)", model, r, h ? h->n_nodes : -1,
              h ? (double)h->draft : -1.0);
    }
    static gen_job ref[W], cut[W], again[W];
    bool ok = gen_all(e, W, prompt, np, MAX_NEW, 0, ref) && gen_all(e, W, prompt, np, MAX_NEW, CANCEL, cut) &&
              gen_all(e, W, prompt, np, MAX_NEW, 0, again);
    if (!ok) {
        fprintf(stderr, "FAIL %s: a rank did not return within 120 s of a cancel in lockstep (hung in a collective)\n",
                model);
        exit(1);
    }
    for (int r = 0; r < W; r++) {
        CHECK(ref[r].status == DDT_OK && cut[r].status == DDT_OK && again[r].status == DDT_OK,
              "%s rank %d: generate failed: %s %s %s", model, r, ref[r].err.msg, cut[r].err.msg, again[r].err.msg);
        CHECK(ref[r].n == MAX_NEW && !memcmp(ref[r].out, ref[0].out, sizeof(int32_t) * MAX_NEW),
              "%s rank %d: uncancelled output differs from rank 0's", model, r);
        CHECK(ref[r].st.rounds == ref[0].st.rounds && ref[r].st.nodes_verified == ref[0].st.nodes_verified,
              "%s rank %d: %d rounds of %lld nodes, rank 0 %d of %lld (not the same trees)", model, r,
              ref[r].st.rounds, (long long)ref[r].st.nodes_verified, ref[0].st.rounds,
              (long long)ref[0].st.nodes_verified);
        CHECK(again[r].n == MAX_NEW && !memcmp(again[r].out, ref[0].out, sizeof(int32_t) * MAX_NEW),
              "%s rank %d: the run after the cancel differs", model, r);
    }
    CHECK(cut[0].st.stop_reason == DDT_STOP_CANCELLED, "%s: rank 0 stop reason %s", model,
          ddt_stop_reason_name(cut[0].st.stop_reason));
    CHECK(cut[0].calls == CANCEL, "%s: rank 0's callback called %d times after cancelling on call %d", model,
          cut[0].calls, CANCEL);
    CHECK(cut[0].n > 0 && cut[0].n < MAX_NEW && !memcmp(cut[0].out, ref[0].out, sizeof(int32_t) * (size_t)cut[0].n),
          "%s: rank 0 emitted %d tokens, not a prefix of the uncancelled run", model, cut[0].n);
    CHECK(cut[1].n >= cut[0].n && !memcmp(cut[1].out, cut[0].out, sizeof(int32_t) * (size_t)cut[0].n),
          "%s: rank 1's tokens do not extend rank 0's", model);
    CHECK(cut[1].st.rounds == cut[0].st.rounds, "%s: rank 1 counted %d rounds, rank 0 %d", model, cut[1].st.rounds,
          cut[0].st.rounds);
    printf("  %s: emulated world %d, cancel on rank 0's call %d: every rank returned, rank 0 %d tokens (%s), "
           "rank 1 %d; uncancelled %d\n", model, W, CANCEL, cut[0].n, ddt_stop_reason_name(cut[0].st.stop_reason),
           cut[1].n, ref[0].n);
    for (int r = 0; r < W; r++) {
        ddt_engine_cuda_free(e[r]);
        CU(cudaFree(c.stage[r]));
    }
    pthread_barrier_destroy(&c.bar);
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    const char *fx = "tests/fixtures/target/fp32";
    int32_t fprompt[40];
    for (int i = 0; i < 40; i++) fprompt[i] = (int32_t)(rnd() % 300u);
    printf("emulated world sizes on one GPU (fixture, 4 heads, 4 experts):\n");
    test_emulated(fx, fprompt, 40, quick ? 6 : 32, 300, 2, false);
    test_cancel_lockstep(fx, "tests/fixtures/drafter/fp32", fprompt, 40);
    if (quick) {
        printf("--quick: NCCL, the shipped pair and worlds 3 / 4 are run without --quick only\n");
    } else {
        test_emulated(fx, fprompt, 40, 32, 300, 3, false); /* 4 heads over 3: replicated attention */
        test_emulated(fx, fprompt, 40, 32, 300, 4, false);
        test_emulated("tests/fixtures/target/int4", fprompt, 40, 32, 300, 2, false);
        printf("NCCL at world size 1:\n");
        test_nccl_world1(fx, fprompt, 40, 32, 300);
        test_engine(fx, "tests/fixtures/drafter/fp32", fprompt, 40, 64);
        printf("shipped pair on a held-out prompt:\n");
        static int32_t ids[8192];
        size_t n_ids;
        if (!cuda_test_heldout_ids(ids, 8192, &n_ids)) return 1;
        const char *sm = "models/pystdlib-target";
        const int V = 4352;
        test_nccl_world1(sm, ids, (int)n_ids, 64, V);
        test_emulated(sm, ids, (int)n_ids, 64, V, 2, true);
        test_emulated(sm, ids, (int)n_ids, 64, V, 4, true);
        /* the tensor cores: at 2 GPUs every rank holds 96 of the shared expert's 192 rows and
           runs its router stacked with them (5 MoE layers); at 4 (48 rows, not a whole
           32-row unit) the shared expert is rank 0's and no rank stacks */
        test_emulated_tc(sm, ids, (int)n_ids, 64, V, 2, false, true, 5);
        test_emulated_tc(sm, ids, (int)n_ids, 64, V, 4, false, true, 0);
        test_engine(sm, "models/pystdlib-dflash", ids, (int)n_ids, 128);
        printf("real worlds over NCCL:\n");
        test_real_worlds(sm, "models/pystdlib-dflash", ids, (int)n_ids, 64);
        test_rules_json(sm, "models/pystdlib-dflash", ids, (int)n_ids < 60 ? (int)n_ids : 60);
        test_logprobs_score(sm, "models/pystdlib-dflash", ids, (int)n_ids);
        printf("errors:\n");
        test_errors();
    }
    if (g_failures) printf("test_cuda_multi: %d FAILURES\n", g_failures);
    else printf("test_cuda_multi: all passed\n");
    return g_failures ? 1 : 0;
}
