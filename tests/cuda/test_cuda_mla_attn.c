/*
 * test_cuda_mla_attn.c — the exact fp32 MLA attention (ddt_cuda_mla_attention,
 * mla_cuda.cu), whose (token, head) positions are split over blocks in fixed
 * slices of 64 logical positions merged by the last block to finish.
 *
 * What matters most is the engine's invariant, greedy tree == autoregressive
 * bitwise on the GPU: an output's arithmetic must depend only on the token's
 * logical positions.  So beyond closeness to the CPU twin it checks bits:
 *  - every node of a random tree gets exactly the bits of the same token in a
 *    prefill of its root-to-node path at the same cache contents (rows copied,
 *    other capacity, so another grid; causal visibility as NULL or as explicit
 *    rows), and the first half of a tree run alone gives its nodes' bits;
 *  - two launches give the same bits (the output re-poisoned between: a
 *    counter not reset by the first would leave the second's merge undone), and
 *    a CUDA graph of the launch replayed with other device-side len values (one
 *    slice, several, back to the first) gives the direct launches' bits;
 *  - the workspace is NaN-poisoned before ddt_cuda_mla_attn_prepare (which
 *    zeroes only the counters): a merge reading a partial no block wrote gives
 *    NaN; output padding and cache rows past the forward are poisoned, the
 *    nope parts of q too.
 * Closeness: normalised error < 1e-5 against ddt_cpu_mla_attention (fp32 sums
 * in another order: ~1e-7; a wrong row, mask or merge gives errors of order
 * 1), NaN exactly where the CPU has NaN (a NaN committed row: every output; a
 * NaN tree row: the outputs of the nodes that see it).  Cases: kv_lora_rank 64
 * (rope 16) and 512 (rope 64) x heads 1, 4, 7 x committed lengths 0, 1, 5, 31,
 * 33, 63, 64, 65, 127, 600 x tokens 1, 3, 17, 65 (random trees, 65 nodes = two
 * visibility words, or causal prefills), a 5000-token prefill (ancestors in
 * every slice), a 17000-row context (more slices than one merge chunk), a len
 * that puts the positions outside the cache (NaN rows, counters untouched) and
 * the launcher's errors for shapes it cannot run.
 * Usage: test_cuda_mla_attn [--quick]   (run by scripts/gpu-test.sh; --quick:
 * a few small cases, for compute-sanitizer)
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/mla.h"
#include "backend/cpu/pool.h"
#include "backend/cuda/mla_cuda.h"
#include "cuda_test.h"

#define QNOPE 8 /* the q row's nope part, poison: the attention never reads it */
#define PAD 16  /* poisoned floats past the output */

static uint64_t g_rng = 0x6A09E667F3BCC909ull;
static uint32_t rnd(void) { return ct_xorshift(&g_rng, 16); }
static float urand(void) { return (float)(rnd() & 0xFFFFFF) / 8388608.0f - 1.0f; } /* [-1, 1) */

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of host memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static ddt_cpu_pool *g_pool;
static double g_worst = 0.0;
static int g_paths = 0; /* prefills of a tree path compared bitwise */

/* One attention problem on the host: cache rows [0, len) committed, len + j
 * token j's own row; q rows [n][heads][QNOPE + rope] (nope part poison). */
typedef struct problem {
    int rank, rope, heads, len, n, capacity;
    int W;          /* visibility words per row; 0: causal prefill (vis NULL, depth j) */
    float *cache;   /* [capacity][rank + rope] */
    float *qlat;    /* [n][heads][rank] */
    float *q;       /* [n][heads][QNOPE + rope] */
    int32_t *depth; /* [n] */
    uint64_t *vis;  /* [n][W] or NULL */
    int *parent;    /* [n] parent node, -1 at a root (causal: j - 1) */
} problem;

static int p_width(const problem *p) { return p->rank + p->rope; }
static int p_qdim(const problem *p) { return QNOPE + p->rope; }
static size_t p_out_n(const problem *p) { return (size_t)p->n * p->heads * p->rank; }

/* Arrays for p's sizes, all poison (vis zero). */
static void problem_alloc(problem *p) {
    const size_t cache_n = (size_t)p->capacity * p_width(p);
    p->cache = xmalloc(cache_n * 4);
    p->qlat = xmalloc((size_t)p->n * p->heads * p->rank * 4);
    p->q = xmalloc((size_t)p->n * p->heads * p_qdim(p) * 4);
    p->depth = xmalloc((size_t)p->n * 4);
    p->parent = xmalloc((size_t)p->n * sizeof(int));
    p->vis = p->W ? calloc((size_t)p->n * p->W, 8) : NULL;
    if (p->W && !p->vis) exit(1);
    ct_poison(p->cache, cache_n);
    ct_poison(p->qlat, (size_t)p->n * p->heads * p->rank);
    ct_poison(p->q, (size_t)p->n * p->heads * p_qdim(p));
}

static void problem_free(problem *p) {
    free(p->cache), free(p->qlat), free(p->q), free(p->depth), free(p->parent), free(p->vis);
}

/* Random rows [0, rows), queries and (W > 0) a random tree: node j's parent is
 * j - 1 a third of the time, else any earlier node. */
static void problem_random(problem *p, int rows) {
    const int width = p_width(p);
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < width; k++) p->cache[(size_t)r * width + k] = urand();
    for (size_t i = 0; i < (size_t)p->n * p->heads * p->rank; i++) p->qlat[i] = urand();
    for (int t = 0; t < p->n * p->heads; t++)
        for (int k = 0; k < p->rope; k++) p->q[(size_t)t * p_qdim(p) + QNOPE + k] = urand();
    for (int j = 0; j < p->n; j++) {
        if (p->W) {
            p->parent[j] = j == 0 ? -1 : (rnd() % 3 == 0 ? j - 1 : (int)(rnd() % (uint32_t)j));
            p->depth[j] = j == 0 ? 0 : p->depth[p->parent[j]] + 1;
            if (j > 0) memcpy(&p->vis[(size_t)j * p->W], &p->vis[(size_t)p->parent[j] * p->W], (size_t)p->W * 8);
            p->vis[(size_t)j * p->W + j / 64] |= 1ull << (j % 64);
        } else {
            p->parent[j] = j - 1;
            p->depth[j] = j;
        }
    }
}

static int p_sees(const problem *p, int i, int j) {
    return p->W ? (int)((p->vis[(size_t)i * p->W + j / 64] >> (j % 64)) & 1u) : j <= i;
}

/* The problem of the nodes nodes[0..m) of o (each node's ancestors listed
 * before it), at the same cache contents: rows [0, len) copied, row len + k =
 * o's row len + nodes[k], queries and depths of the nodes, visibility o's
 * restricted (W = 0: NULL, for a path whose depths are 0, 1, ...); capacity
 * len + m + extra, so another grid than o's. */
static void problem_sub(const problem *o, const int *nodes, int m, int W, int extra, problem *p) {
    *p = (problem){.rank = o->rank, .rope = o->rope, .heads = o->heads, .len = o->len, .n = m,
                   .capacity = o->len + m + extra, .W = W};
    problem_alloc(p);
    const size_t width = (size_t)p_width(o), qrow = (size_t)o->heads * p_qdim(o), lrow = (size_t)o->heads * o->rank;
    memcpy(p->cache, o->cache, (size_t)o->len * width * 4);
    for (int k = 0; k < m; k++) {
        memcpy(p->cache + (size_t)(o->len + k) * width, o->cache + (size_t)(o->len + nodes[k]) * width, width * 4);
        memcpy(p->q + (size_t)k * qrow, o->q + (size_t)nodes[k] * qrow, qrow * 4);
        memcpy(p->qlat + (size_t)k * lrow, o->qlat + (size_t)nodes[k] * lrow, lrow * 4);
        p->depth[k] = o->depth[nodes[k]];
        p->parent[k] = -1;
        for (int a = 0; a < k; a++)
            if (nodes[a] == o->parent[nodes[k]]) p->parent[k] = a;
        if (W)
            for (int a = 0; a < m; a++)
                if (p_sees(o, nodes[k], nodes[a])) p->vis[(size_t)k * W + a / 64] |= 1ull << (a % 64);
    }
}

/* ------------------------------------------------------------------ device */

typedef struct dev_run {
    float *cache, *qlat, *q, *out;
    int32_t *depth, *len;
    uint64_t *vis;
    void *ws;
    ddt_cuda_mla_attn_args a;
} dev_run;

/* p on the device with a workspace for max_tokens tokens, NaN-poisoned (every
 * byte 0xFF) and then prepared: the counters zero, the partials NaN. */
static void dev_setup(dev_run *d, const problem *p, int max_tokens) {
    const size_t width = (size_t)p_width(p);
    d->cache = ct_dev_copy(p->cache, (size_t)p->capacity * width * 4);
    d->qlat = ct_dev_copy(p->qlat, (size_t)p->n * p->heads * p->rank * 4);
    d->q = ct_dev_copy(p->q, (size_t)p->n * p->heads * p_qdim(p) * 4);
    d->depth = ct_dev_copy(p->depth, (size_t)p->n * 4);
    const int32_t len = p->len;
    d->len = ct_dev_copy(&len, 4);
    d->vis = p->W ? ct_dev_copy(p->vis, (size_t)p->n * p->W * 8) : NULL;
    CU(cudaMalloc((void **)&d->out, (p_out_n(p) + PAD) * 4));
    const size_t wsb = ddt_cuda_mla_attn_workspace(max_tokens, p->heads, p->rank, p->rope, p->capacity);
    if (wsb == 0) {
        fprintf(stderr, "no workspace size for rank %d heads %d capacity %d\n", p->rank, p->heads, p->capacity);
        exit(1);
    }
    CU(cudaMalloc(&d->ws, wsb));
    CU(cudaMemset(d->ws, 0xFF, wsb));
    OK(ddt_cuda_mla_attn_prepare(d->ws, max_tokens, p->heads, p->rank, p->rope, p->capacity, NULL, &err_));
    d->a = (ddt_cuda_mla_attn_args){.n = p->n, .heads = p->heads, .rank = p->rank, .rope = p->rope,
                                    .q_lat = d->qlat, .q_rope = d->q + QNOPE,
                                    .q_rope_ld_t = (int64_t)p->heads * p_qdim(p), .q_rope_ld_h = p_qdim(p),
                                    .cache = d->cache, .capacity = p->capacity, .len = d->len, .depth = d->depth,
                                    .vis = d->vis, .vis_words = p->W, .scale = 1.0f / sqrtf((float)width),
                                    .workspace = d->ws, .max_tokens = max_tokens, .out = d->out};
}

static void dev_free(dev_run *d) {
    CU(cudaFree(d->cache));
    CU(cudaFree(d->qlat));
    CU(cudaFree(d->q));
    CU(cudaFree(d->depth));
    CU(cudaFree(d->len));
    if (d->vis) CU(cudaFree(d->vis));
    CU(cudaFree(d->out));
    CU(cudaFree(d->ws));
}

/* Poison the output and its padding (on stream s), so a launch must write every output. */
static void out_poison(dev_run *d, const problem *p, cudaStream_t s) {
    float *h = xmalloc((p_out_n(p) + PAD) * 4);
    ct_poison(h, p_out_n(p) + PAD);
    CU(cudaMemcpyAsync(d->out, h, (p_out_n(p) + PAD) * 4, cudaMemcpyHostToDevice, s));
    CU(cudaStreamSynchronize(s));
    free(h);
}

static void out_fetch(dev_run *d, const problem *p, float *got) {
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(got, d->out, (p_out_n(p) + PAD) * 4, cudaMemcpyDeviceToHost));
}

/* One direct launch into got ([out_n + PAD]) from a poisoned output. */
static void dev_launch(dev_run *d, const problem *p, float *got) {
    out_poison(d, p, NULL);
    OK(ddt_cuda_mla_attention(&d->a, NULL, &err_));
    out_fetch(d, p, got);
}

/* Every output written, no padding. */
static void check_written(const problem *p, const float *got, const char *what) {
    size_t unwritten = 0, padhit = 0;
    for (size_t i = 0; i < p_out_n(p); i++) unwritten += ct_is_poison(&got[i]);
    for (size_t i = p_out_n(p); i < p_out_n(p) + PAD; i++) padhit += !ct_is_poison(&got[i]);
    CHECK(unwritten == 0 && padhit == 0, "%s rank %d heads %d len %d n %d: %zu outputs unwritten, %zu padding written",
          what, p->rank, p->heads, p->len, p->n, unwritten, padhit);
}

static size_t bits_differ(const float *x, const float *y, size_t n) {
    size_t diff = 0;
    for (size_t i = 0; i < n; i++) diff += memcmp(&x[i], &y[i], 4) != 0;
    return diff;
}

/* Against the CPU twin: NaN exactly where it has NaN, normalised error < 1e-5
 * over the rest; the error (or -1 when every output is NaN). */
static double check_cpu(const problem *p, const float *got, const char *what) {
    const size_t out_n = p_out_n(p);
    float *ref = xmalloc(out_n * 4);
    ddt_mla_attn at = {.n = p->n, .n_heads = p->heads, .rank = p->rank, .rope_dim = p->rope, .q_lat = p->qlat,
                       .q_lat_ld_t = (int64_t)p->heads * p->rank, .q_lat_ld_h = p->rank, .q_rope = p->q + QNOPE,
                       .q_rope_ld_t = (int64_t)p->heads * p_qdim(p), .q_rope_ld_h = p_qdim(p), .kv = p->cache,
                       .kv_ld = p_width(p), .n_prefix = p->len, .vis = p->vis, .vis_words = p->W,
                       .scale = 1.0f / sqrtf((float)p_width(p)), .out = ref, .out_ld_t = (int64_t)p->heads * p->rank,
                       .out_ld_h = p->rank};
    ddt_cpu_mla_attention(g_pool, &at);
    double num = 0, den = 0;
    size_t nan_diff = 0, finite = 0;
    for (size_t i = 0; i < out_n; i++) {
        if (isnan(got[i]) || isnan(ref[i])) {
            nan_diff += isnan(got[i]) != isnan(ref[i]);
            continue;
        }
        const double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
        finite++;
    }
    double e = finite ? sqrt(num / (den > 0 ? den : 1.0)) : -1.0;
    if (e != e) e = INFINITY; /* an infinity: the worst */
    if (e > g_worst) g_worst = e;
    CHECK(nan_diff == 0, "%s rank %d heads %d len %d n %d: %zu outputs NaN on one side only", what, p->rank, p->heads,
          p->len, p->n, nan_diff);
    CHECK(e < 1e-5, "%s rank %d heads %d len %d n %d: normalised error %.3g against the CPU", what, p->rank, p->heads,
          p->len, p->n, e);
    free(ref);
    return e;
}

/* sub's outputs (tokens k) bitwise o's outputs of nodes[k]. */
static void check_sub_bits(const problem *o, const float *o_out, const int *nodes, int m, int W, int extra,
                           const char *what) {
    problem p;
    problem_sub(o, nodes, m, W, extra, &p);
    dev_run d;
    dev_setup(&d, &p, m);
    float *got = xmalloc((p_out_n(&p) + PAD) * 4);
    dev_launch(&d, &p, got);
    check_written(&p, got, what);
    const size_t row = (size_t)o->heads * o->rank;
    size_t diff = 0;
    for (int k = 0; k < m; k++) diff += bits_differ(got + (size_t)k * row, o_out + (size_t)nodes[k] * row, row);
    CHECK(diff == 0, "%s rank %d heads %d len %d: %zu of %zu outputs of a %d-token forward differ from the tree's", what,
          o->rank, o->heads, o->len, diff, (size_t)m * row, m);
    free(got);
    dev_free(&d);
    problem_free(&p);
}

/* The batch invariance of a tree's outputs: each node's path as a prefill
 * (visibility NULL for even nodes, explicit causal rows for odd ones), and the
 * tree's first half as a forward of its own. */
static void check_invariance(const problem *o, const float *o_out) {
    int *path = xmalloc((size_t)o->n * sizeof(int));
    for (int i = 0; i < o->n; i++) {
        const int m = o->depth[i] + 1;
        int j = i;
        for (int k = m - 1; k >= 0; k--) {
            path[k] = j;
            j = o->parent[j];
        }
        if (j != -1 || path[0] != 0) {
            CHECK(0, "test bug: node %d's path does not reach the root", i);
            continue;
        }
        check_sub_bits(o, o_out, path, m, i % 2 ? (m + 63) / 64 : 0, 7 + i % 5, "path prefill");
        g_paths++;
    }
    if (o->n > 2) {
        const int m = o->n / 2 + 1;
        for (int k = 0; k < m; k++) path[k] = k;
        check_sub_bits(o, o_out, path, m, (m + 63) / 64, 3, "tree prefix");
    }
    free(path);
}

typedef struct attn_case {
    int rank, rope, heads, len, n;
    int tree;    /* 1: a random ancestor tree (visibility rows); 0: causal prefill (vis NULL) */
    int nan_row; /* 1: a committed row of NaN; 2: the row of the forward's middle token */
    int paths;   /* also the batch invariance (trees) */
} attn_case;

static void run_case(const attn_case *c) {
    problem p = {.rank = c->rank, .rope = c->rope, .heads = c->heads, .len = c->len, .n = c->n,
                 .capacity = c->len + c->n + 9, /* 9 rows past the forward: poison */
                 .W = c->tree ? (c->n + 63) / 64 : 0};
    problem_alloc(&p);
    problem_random(&p, p.len + p.n);
    const int width = p_width(&p);
    if (c->nan_row == 1 && p.len > 2)
        for (int k = 0; k < width; k++) p.cache[(size_t)(p.len / 2) * width + k] = NAN;
    if (c->nan_row == 2)
        for (int k = 0; k < width; k++) p.cache[(size_t)(p.len + p.n / 2) * width + k] = NAN;

    dev_run d;
    dev_setup(&d, &p, p.n);
    float *got = xmalloc((p_out_n(&p) + PAD) * 4), *again = xmalloc((p_out_n(&p) + PAD) * 4);
    dev_launch(&d, &p, got);
    dev_launch(&d, &p, again); /* the counters the first launch left */
    const size_t rediff = bits_differ(got, again, p_out_n(&p));
    CHECK(rediff == 0, "rank %d heads %d len %d n %d: %zu outputs differ between two launches", p.rank, p.heads,
          p.len, p.n, rediff);
    check_written(&p, got, "case");
    const double e = check_cpu(&p, got, c->tree ? "tree" : "causal");
    if (c->paths && c->tree) check_invariance(&p, got);
    printf("rank %3d rope %2d heads %d len %5d n %4d %-6s%s: relaunch %s, CPU error %.2e%s\n", p.rank, p.rope, p.heads,
           p.len, p.n, c->tree ? "tree" : "causal", c->nan_row ? (c->nan_row == 1 ? " NaN ctx row" : " NaN node row") : "",
           rediff ? "DIFFERS" : "bitwise ==", e, c->paths && c->tree ? ", paths bitwise checked" : "");
    free(got), free(again);
    dev_free(&d);
    problem_free(&p);
}

/* The launch captured in a CUDA graph, replayed with other device-side len
 * values (the grid is the capacity's): the direct launches' bits and the CPU's
 * values; then lens that put the positions outside the cache (NaN rows, no
 * counter touched), and the first len again. */
static void graph_case(int rank, int rope, int heads, int n) {
    const int lens[] = {5, 70, 200, 5, 130};
    problem p = {.rank = rank, .rope = rope, .heads = heads, .len = 0, .n = n, .capacity = 200 + n + 40,
                 .W = (n + 63) / 64};
    problem_alloc(&p);
    problem_random(&p, p.capacity); /* every row: the forward's rows move with len */
    dev_run d;
    dev_setup(&d, &p, n);
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    OK(ddt_cuda_mla_attention(&d.a, st, &err_));
    CU(cudaStreamEndCapture(st, &g));
    CU(cudaGraphInstantiate(&ge, g, 0));
    const size_t out_n = p_out_n(&p);
    float *gout = xmalloc((out_n + PAD) * 4), *dout = xmalloc((out_n + PAD) * 4);
    float *first = xmalloc((out_n + PAD) * 4);
    for (int r = 0; r < (int)(sizeof lens / sizeof lens[0]); r++) {
        const int32_t len = lens[r];
        p.len = len;
        CU(cudaMemcpy(d.len, &len, 4, cudaMemcpyHostToDevice));
        out_poison(&d, &p, st);
        CU(cudaGraphLaunch(ge, st));
        CU(cudaStreamSynchronize(st));
        out_fetch(&d, &p, gout);
        dev_launch(&d, &p, dout);
        const size_t diff = bits_differ(gout, dout, out_n);
        CHECK(diff == 0, "graph replay len %d: %zu of %zu outputs differ from a direct launch", len, diff, out_n);
        check_written(&p, gout, "graph");
        const double e = check_cpu(&p, gout, "graph");
        if (r == 0) memcpy(first, gout, out_n * 4);
        if (lens[r] == lens[0] && r > 0)
            CHECK(bits_differ(first, gout, out_n) == 0, "graph replay len %d: not the first replay's bits", len);
        printf("graph rank %d heads %d n %d, replay %d at len %3d: %s direct launch, CPU error %.2e\n", rank, heads, n,
               r, len, diff ? "DIFFERS from" : "bitwise ==", e);
    }
    /* positions past the capacity, and before position 0: every output NaN */
    const int32_t bad[] = {p.capacity, -100};
    for (int r = 0; r < 2; r++) {
        CU(cudaMemcpy(d.len, &bad[r], 4, cudaMemcpyHostToDevice));
        out_poison(&d, &p, st);
        CU(cudaGraphLaunch(ge, st));
        CU(cudaStreamSynchronize(st));
        out_fetch(&d, &p, gout);
        check_written(&p, gout, "bad len");
        size_t finite = 0;
        for (size_t i = 0; i < out_n; i++) finite += !isnan(gout[i]);
        CHECK(finite == 0, "len %d outside the cache: %zu outputs are not NaN", bad[r], finite);
    }
    const int32_t len0 = lens[0];
    p.len = len0;
    CU(cudaMemcpy(d.len, &len0, 4, cudaMemcpyHostToDevice));
    out_poison(&d, &p, st);
    CU(cudaGraphLaunch(ge, st));
    CU(cudaStreamSynchronize(st));
    out_fetch(&d, &p, gout);
    CHECK(bits_differ(first, gout, out_n) == 0, "graph replay after the bad lens: not the first replay's bits");
    printf("graph rank %d heads %d n %d: bad lens give NaN rows, then len %d again %s\n", rank, heads, n, len0,
           bits_differ(first, gout, out_n) ? "DIFFERS" : "bitwise ==");
    CU(cudaGraphExecDestroy(ge));
    CU(cudaGraphDestroy(g));
    CU(cudaStreamDestroy(st));
    free(gout), free(dout), free(first);
    dev_free(&d);
    problem_free(&p);
}

/* The launcher's and the workspace query's answers to shapes they cannot run
 * (nothing is launched: the pointers are never read). */
static void error_cases(void) {
    float *dummy;
    CU(cudaMalloc((void **)&dummy, 256));
    int32_t *di = (int32_t *)dummy;
    const ddt_cuda_mla_attn_args good = {.n = 2, .heads = 1, .rank = 64, .rope = 16, .q_lat = dummy, .q_rope = dummy,
                                         .cache = dummy, .capacity = 100, .len = di, .depth = di, .scale = 1.0f,
                                         .workspace = dummy, .max_tokens = 2, .out = dummy};
    ddt_error e;
    ddt_cuda_mla_attn_args a = good;
    a.n = 3; /* more tokens than the workspace holds */
    CHECK(ddt_cuda_mla_attention(&a, NULL, &e) == DDT_ERR_INVALID, "n > max_tokens accepted");
    a = good;
    a.workspace = NULL;
    CHECK(ddt_cuda_mla_attention(&a, NULL, &e) == DDT_ERR_INVALID, "a NULL workspace accepted");
    a = good;
    a.capacity = 65535 * 64 + 1; /* one slice more than grid.y holds */
    CHECK(ddt_cuda_mla_attention(&a, NULL, &e) == DDT_ERR_UNSUPPORTED, "capacity past 65535 slices accepted");
    printf("error: %s\n", e.msg);
    a = good;
    a.rank = 8000; /* shared memory */
    CHECK(ddt_cuda_mla_attention(&a, NULL, &e) == DDT_ERR_UNSUPPORTED, "rank 8000 accepted");
    printf("error: %s\n", e.msg);
    a = good;
    a.vis = (const uint64_t *)dummy;
    a.vis_words = 0;
    CHECK(ddt_cuda_mla_attention(&a, NULL, &e) == DDT_ERR_INVALID, "0 visibility words accepted");
    CHECK(ddt_cuda_mla_attn_workspace(2, 1, 64, 16, 65535 * 64 + 1) == 0, "workspace for 65536 slices");
    CHECK(ddt_cuda_mla_attn_workspace(0, 1, 64, 16, 100) == 0, "workspace for 0 tokens");
    CHECK(ddt_cuda_mla_attn_workspace(2, 1, 64, 16, 65535 * 64) > 0, "no workspace for 65535 slices");
    CHECK(ddt_cuda_mla_attn_prepare(NULL, 2, 1, 64, 16, 100, NULL, &e) == DDT_ERR_INVALID, "prepare of NULL");
    CU(cudaGetLastError()); /* no launch failed: nothing pending */
    CU(cudaFree(dummy));
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    OK(ddt_cpu_pool_create(0, &g_pool, &err_));
    error_cases();
    static const int ranks[][2] = {{64, 16}, {512, 64}};
    static const int heads[] = {1, 4, 7};
    static const int lens[] = {0, 1, 5, 31, 33, 63, 64, 65, 127, 600};
    static const int ns[] = {1, 3, 17, 65};
    const int n_lens = (int)(sizeof lens / sizeof lens[0]);
    int cases = 0;
    for (int r = 0; r < 2; r++)
        for (int h = 0; h < 3; h++)
            for (int l = 0; l < n_lens; l++)
                for (int k = 0; k < 4; k++) {
                    /* quick: rank 64 at heads 1 and 4 over a few lengths, one rank-512 case */
                    if (quick && (r == 1 ? !(h == 1 && l == 4 && k == 2) : (h == 2 || l % 3 != 1 || k == 1)))
                        continue;
                    attn_case c = {ranks[r][0], ranks[r][1], heads[h], lens[l], ns[k],
                                   .tree = ns[k] > 1 && (h + l + k) % 4 != 0, .nan_row = 0,
                                   /* the paths of every tree at rank 64, of some at rank 512 (time) */
                                   .paths = r == 0 || (h + l) % 3 == 0};
                    run_case(&c);
                    cases++;
                }
    /* NaN rows: a committed one (every output NaN), a tree node's (its subtree's outputs) */
    run_case(&(attn_case){64, 16, 4, 33, 17, 1, 1, 1});
    run_case(&(attn_case){512, 64, 2, 127, 3, 1, 1, 0});
    run_case(&(attn_case){64, 16, 3, 70, 17, 1, 2, 1});
    run_case(&(attn_case){64, 16, 2, 5, 65, 0, 2, 0});
    cases += 4;
    /* more slices than one merge chunk (17000 rows: 266 slices) */
    run_case(&(attn_case){64, 16, 2, 17000, 3, 1, 0, 1});
    cases++;
    if (!quick) { /* a long prefill: ancestors in every one of its 79 slices */
        run_case(&(attn_case){512, 64, 1, 3, 5000, 0, 0, 0});
        run_case(&(attn_case){64, 16, 2, 0, 5000, 0, 0, 0});
        run_case(&(attn_case){512, 64, 2, 5000, 17, 1, 0, 1});
        cases += 3;
    }
    graph_case(64, 16, 4, 17);
    if (!quick) graph_case(512, 64, 3, 65);
    ddt_cpu_pool_destroy(g_pool);
    printf("mla attention: %d cases, %d tree paths compared bitwise with their prefills, worst CPU error %.3g\n", cases,
           g_paths, g_worst);
    if (g_failures) {
        printf("test_cuda_mla_attn: %d FAILED checks\n", g_failures);
        return 1;
    }
    printf("test_cuda_mla_attn: all checks passed\n");
    return 0;
}
