/*
 * test_cuda_tree.c — GPU tests of the tree kernels against the CPU core, run on
 * the H200 by scripts/gpu-test.sh (CI compiles it but has no GPU to run it).
 *
 *  - top-K + log-softmax vs its CPU twin ddt_topk_logsoftmax (core/topk.c) through
 *    the backend-op harness (backend_ops.h): ids exactly (ties to the lowest id),
 *    log-probabilities by normalised error, no NaN poison left (not yet run on a GPU);
 *    (small vocabularies take the one-launch path, larger ones the chunked one;
 *    ties at the threshold, -0.0 with +0.0, -inf entries, k up to the vocab);
 *  - best-first build vs ddt_tree_build on the same table: every node bitwise;
 *    visibility rows; a bad table gives the status code and a root-only tree;
 *  - the cost-aware build (auto budget) vs ddt_tree_build under the same random
 *    cost model: the same node count and nodes, padding up to the verify bucket;
 *    its early stop (it read through ddt_cuda_tree_auto.built): never below the
 *    kept nodes, never with a positive logq, and at the expected points under
 *    crafted cost tables (steps, steep, flat, tied buckets);
 *  - argmax per row vs CPU (lowest id on ties, the two zeros equal), float4 and
 *    single-float loads, rows past the device-side count left untouched;
 *  - the draft calibration applied by the build (fixed and auto) vs ddt_cal_apply +
 *    the CPU builder, bitwise, under random calibrations;
 *  - the context lookup's graft vs ddt_tree_graft, bitwise, fixed and auto budgets;
 *  - walk vs ddt_tree_walk; damaged trees and targets give status codes.
 * Output buffers are poisoned (0xFF bytes: NaN floats, -1 ints) before each
 * launch so unwritten entries show.  Exit status 0 only when every check passes.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/tree_cuda.h"
#include "core/calibration.h"
#include "core/lookup.h"
#include "core/topk.h"
#include "ddtree.h"
#include "backend_ops.h"
#include "cuda_test.h"

static uint64_t g_rng = 88172645463325252ull;
static uint32_t rnd(void) { return ct_xorshift(&g_rng, 11); }
static float rndf(void) { return (float)(rnd() & 0xffffff) / 16777216.0f; }

/* ------------------------------------------------------------------ top-K */

/* Logits of kind TOPK_ZEROS: about k/2 positives a row, the rest -0.0, +0.0 and
 * a few -inf, so the k-th largest is (nearly always) a zero: the ties at the
 * threshold mix the two zeros, which must count as equal (lowest ids kept, as
 * on the CPU), and k = vocab keeps -inf entries. */
enum { TOPK_RANDOM = 0, TOPK_TIES = 1, TOPK_ZEROS = 2 };

static float topk_logit(int kind, int vocab, int k) {
    if (kind == TOPK_TIES) return (float)((int)(rnd() % 33) - 16) * 0.25f;
    if (kind != TOPK_ZEROS) return 8.0f * rndf() - 4.0f;
    if ((int)(rnd() % (uint32_t)vocab) < k / 2) return 4.0f * rndf() + 0.5f;
    const uint32_t r = rnd() % 16;
    return r == 0 ? -INFINITY : (r & 1) ? -0.0f : 0.0f;
}

static void test_topk(int rows, int vocab, int k, int kind) {
    size_t n = (size_t)rows * (size_t)vocab, nk = (size_t)rows * (size_t)k;
    float *z = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) z[i] = topk_logit(kind, vocab, k);
    float *dz, *dq;
    int32_t *dt;
    CU(cudaMalloc((void **)&dz, n * sizeof(float)));
    CU(cudaMalloc((void **)&dq, nk * sizeof(float)));
    CU(cudaMalloc((void **)&dt, nk * sizeof(int32_t)));
    CU(cudaMemcpy(dz, z, n * sizeof(float), cudaMemcpyHostToDevice));
    bo_poison(dq, nk * sizeof(float));
    bo_poison(dt, nk * sizeof(int32_t));
    size_t wsb = ddt_cuda_topk_workspace_bytes(rows, vocab, k);
    void *ws;
    CU(cudaMalloc(&ws, wsb));
    bo_poison(ws, wsb);
    OK(ddt_cuda_topk_logsoftmax(dz, rows, vocab, k, dq, dt, ws, wsb, NULL, &err_));
    CU(cudaDeviceSynchronize());
    float *q = malloc(nk * sizeof(float));
    int32_t *t = malloc(nk * sizeof(int32_t));
    CU(cudaMemcpy(q, dq, nk * sizeof(float), cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(t, dt, nk * sizeof(int32_t), cudaMemcpyDeviceToHost));
    /* the CPU twin, row by row (core/topk.c) */
    float *ref_q = malloc(nk * sizeof(float));
    int32_t *ref_t = malloc(nk * sizeof(int32_t));
    ddt_zid *scratch = malloc((size_t)vocab * sizeof(ddt_zid));
    for (int r = 0; r < rows; r++)
        OK(ddt_topk_logsoftmax(z + (size_t)r * (size_t)vocab, vocab, k, scratch, ref_q + (size_t)r * k,
                               ref_t + (size_t)r * k, r, &err_));
    int id_mismatch = 0;
    for (size_t i = 0; i < nk; i++) id_mismatch += t[i] != ref_t[i];
    int unsorted = 0;
    for (int r = 0; r < rows; r++)
        for (int j = 1; j < k; j++)
            if (!(q[r * k + j] <= q[r * k + j - 1]) && unsorted++ < 3)
                fprintf(stderr, "top-K rows %d vocab %d k %d kind %d: row %d not sorted at %d: %g (id %d) after %g (id %d)\n",
                        rows, vocab, k, kind, r, j, (double)q[r * k + j], t[r * k + j], (double)q[r * k + j - 1],
                        t[r * k + j - 1]);
    CHECK(unsorted == 0, "top-K rows %d vocab %d k %d kind %d: %d log-probabilities out of order", rows, vocab, k, kind,
          unsorted);
    CHECK(id_mismatch == 0, "top-K rows %d vocab %d k %d kind %d: %d ids differ", rows, vocab, k,
          kind, id_mismatch);
    /* a -inf log-probability must be -inf on both sides; then both become 0 so the
     * normalised error (inf - inf is NaN) covers the finite ones */
    int inf_mismatch = 0;
    for (size_t i = 0; i < nk; i++)
        if (isinf(ref_q[i])) {
            inf_mismatch += q[i] != ref_q[i];
            q[i] = ref_q[i] = 0.0f;
        }
    CHECK(inf_mismatch == 0, "top-K rows %d vocab %d k %d kind %d: %d infinite log-probabilities differ", rows,
          vocab, k, kind, inf_mismatch);
    char what[96];
    snprintf(what, sizeof what, "top-K rows %d vocab %d k %d kind %d", rows, vocab, k, kind);
    double nerr = bo_compare(what, q, ref_q, nk, (bo_cmp){.bound = 1e-6});
    printf("topk rows %d vocab %d k %d kind %d: %s, normalised error %.2e\n", rows, vocab, k, kind,
           id_mismatch ? "IDS DIFFER" : "ids equal", nerr);
    free(z);
    free(q);
    free(t);
    free(ref_q);
    free(ref_t);
    free(scratch);
    CU(cudaFree(dz));
    CU(cudaFree(dq));
    CU(cudaFree(dt));
    CU(cudaFree(ws));
}

/* ------------------------------------------------------------------ build + walk */

typedef struct host_tree {
    int32_t n, status, token[DDT_MAX_NODES], parent[DDT_MAX_NODES], depth[DDT_MAX_NODES],
        rank[DDT_MAX_NODES];
    float logw[DDT_MAX_NODES];
    uint64_t vis[DDT_MAX_NODES * ((DDT_MAX_NODES + 63) / 64)];
} host_tree;

static void fetch_tree(const ddt_cuda_tree *dt, host_tree *h) {
    CU(cudaMemcpy(&h->n, dt->n_nodes, sizeof(int32_t), cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(&h->status, dt->status, sizeof(int32_t), cudaMemcpyDeviceToHost));
    size_t c = (size_t)dt->capacity;
    CU(cudaMemcpy(h->token, dt->token, c * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(h->parent, dt->parent, c * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(h->depth, dt->depth, c * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(h->rank, dt->rank, c * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(h->logw, dt->logw, c * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(h->vis, dt->vis, c * (size_t)dt->vis_words * 8, cudaMemcpyDeviceToHost));
}

static void poison_tree(const ddt_cuda_tree *dt) {
    size_t c = (size_t)dt->capacity;
    CU(cudaMemset(dt->token, 0xff, c * 4));
    CU(cudaMemset(dt->parent, 0xff, c * 4));
    CU(cudaMemset(dt->depth, 0xff, c * 4));
    CU(cudaMemset(dt->rank, 0xff, c * 4));
    CU(cudaMemset(dt->logw, 0xff, c * 4));
    CU(cudaMemset(dt->vis, 0xff, c * (size_t)dt->vis_words * 8));
    CU(cudaMemset(dt->path, 0xff, DDT_MAX_PATH * 4));
}

static int cmp_fdesc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Device and host state shared by the build comparisons. */
typedef struct build_ctx {
    ddt_cuda_tree dt;
    ddt_builder *b;
    ddt_tree ct;
    float *dq;
    int32_t *dtok, *dnext, *dbuilt;
    int mismatched, compared, walks, long_walks, cut, stopped, capped, capped_below;
    int last_built, last_bucket; /* of the latest auto build: nodes built before the stop, bucket index */
} build_ctx;

/* The buffers of the build comparisons, for the largest budget and table. */
static void build_ctx_open(build_ctx *c) {
    memset(c, 0, sizeof *c);
    OK(ddt_cuda_tree_alloc(DDT_MAX_BUDGET, &c->dt, &err_));
    OK(ddt_builder_create(DDT_MAX_BUDGET, &c->b, &err_));
    OK(ddt_tree_alloc(DDT_MAX_NODES, &c->ct, &err_));
    CU(cudaMalloc((void **)&c->dq, DDT_MAX_DEPTH * DDT_MAX_TOPK * sizeof(float)));
    CU(cudaMalloc((void **)&c->dtok, DDT_MAX_DEPTH * DDT_MAX_TOPK * sizeof(int32_t)));
    CU(cudaMalloc((void **)&c->dnext, DDT_MAX_NODES * 4));
    CU(cudaMalloc((void **)&c->dbuilt, 4));
}

static void build_ctx_close(build_ctx *c) {
    CU(cudaFree(c->dq));
    CU(cudaFree(c->dtok));
    CU(cudaFree(c->dnext));
    CU(cudaFree(c->dbuilt));
    ddt_cuda_tree_free(&c->dt);
    ddt_tree_free(&c->ct);
    ddt_builder_destroy(c->b);
}

static float g_logq[DDT_MAX_DEPTH * DDT_MAX_TOPK];
static int32_t g_tok[DDT_MAX_DEPTH * DDT_MAX_TOPK];
/* With g_cal set the GPU builds take it (dt.cal_on) over the raw table and the CPU
 * builds the table ddt_cal_apply made of it: they must agree bitwise. */
static const ddt_draft_calibration *g_cal;
static float g_calq[DDT_MAX_DEPTH * DDT_MAX_TOPK];

/* The table the CPU builds from, and the GPU's calibration setting to match. */
static const float *cpu_table(build_ctx *c, int D, int K) {
    c->dt.cal_on = g_cal != NULL;
    if (!g_cal) return g_logq;
    c->dt.cal = *g_cal;
    memcpy(g_calq, g_logq, (size_t)D * (size_t)K * sizeof(float));
    ddt_cal_apply(g_cal, g_calq, D, K, K);
    return g_calq;
}

/* Builds g_logq/g_tok ([D][K]) on the CPU and the GPU and compares every node
 * bitwise, the visibility rows, then a random walk.  Returns 1 when they differ. */
static int compare_build(build_ctx *c, int D, int K, int B, const char *what) {
    static host_tree h;
    int32_t root = (int32_t)(rnd() % 5000);
    ddt_draft_table tb = {D, K, cpu_table(c, D, K), g_tok};
    OK(ddt_tree_build(c->b, &tb, root, B, NULL, 5000, &c->ct, &err_));
    const ddt_tree *ct = &c->ct;
    poison_tree(&c->dt);
    CU(cudaMemcpy(c->dq, g_logq, (size_t)D * (size_t)K * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(c->dtok, g_tok, (size_t)D * (size_t)K * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(c->dt.root_token, &root, 4, cudaMemcpyHostToDevice));
    OK(ddt_cuda_tree_build(&c->dt, c->dq, c->dtok, D, K, B, 5000, NULL, &err_));
    CU(cudaDeviceSynchronize());
    fetch_tree(&c->dt, &h);
    c->compared++;
    int bad = h.status != 0 || h.n != ct->n_nodes, first = -1;
    for (int i = 0; !bad && i < h.n; i++) {
        bad |= h.token[i] != ct->token[i] || h.parent[i] != ct->parent[i] ||
               h.depth[i] != ct->depth[i] || h.rank[i] != ct->rank[i] ||
               memcmp(&h.logw[i], &ct->logw[i], 4) != 0;
        bad |= memcmp(h.vis + (size_t)i * (size_t)c->dt.vis_words,
                      ct->vis + (size_t)i * (size_t)ct->vis_words, (size_t)ct->vis_words * 8) != 0;
        if (bad) first = i;
    }
    if (bad) {
        c->mismatched++;
        if (c->mismatched < 8)
            fprintf(stderr,
                    "build mismatch (%s): D %d K %d B %d: gpu n %d status %d, cpu n %d; first "
                    "differing node %d\n",
                    what, D, K, B, h.n, h.status, ct->n_nodes, first);
        return 1;
    }
    /* walk: the target follows a random root-to-node path, then disagrees */
    static int32_t next[DDT_MAX_NODES];
    for (int i = 0; i < ct->n_nodes; i++) {
        int ch = ct->first_child[i], pick = (int)(rnd() % 4);
        while (ch >= 0 && pick-- > 0 && ct->next_sibling[ch] >= 0) ch = ct->next_sibling[ch];
        next[i] = (ch >= 0 && rnd() % 8) ? ct->token[ch] : (int32_t)(rnd() % 5000);
    }
    ddt_walk_result w;
    OK(ddt_tree_walk(ct, next, 5000, &w, &err_));
    CU(cudaMemcpy(c->dnext, next, (size_t)ct->n_nodes * 4, cudaMemcpyHostToDevice));
    OK(ddt_cuda_tree_accept(&c->dt, c->dnext, 5000, NULL, &err_));
    int32_t path[DDT_MAX_PATH], len, bonus, status, nroot;
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(&len, c->dt.path_len, 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(&bonus, c->dt.bonus, 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(&status, c->dt.status, 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(&nroot, c->dt.root_token, 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(path, c->dt.path, sizeof path, cudaMemcpyDeviceToHost));
    CHECK(status == 0 && len == w.length && bonus == w.bonus && nroot == w.bonus &&
              memcmp(path, w.path, (size_t)len * 4) == 0,
          "walk mismatch (%s): D %d K %d B %d: gpu len %d bonus %d status %d, cpu len %d bonus %d",
          what, D, K, B, len, bonus, status, w.length, w.bonus);
    c->walks++;
    c->long_walks += w.length > 3;
    return 0;
}

/* Table fillers: [D][K], rows sorted descending, tokens distinct within a row. */
static void fill_tokens(int D, int K) {
    for (int i = 0; i < D * K; i++) g_tok[i] = (i % K) * 3 + (int)(rnd() % 3);
}

enum { FILL_UNIFORM, FILL_TIES, FILL_ZERO, FILL_NEGINF, FILL_SIGNED_ZERO, FILL_POSITIVE, FILL_INTS };

static void fill_table(int D, int K, int kind) {
    for (int d = 0; d < D; d++) {
        float *row = g_logq + d * K;
        int ninf = kind == FILL_NEGINF ? (int)(rnd() % (unsigned)(K + 1)) : 0; /* may be all */
        for (int r = 0; r < K; r++) {
            switch (kind) {
            case FILL_TIES: row[r] = -(float)(rnd() % 6) * 0.5f; break;  /* sums collide across depths */
            case FILL_ZERO: row[r] = 0.0f; break;                         /* order by rank tuple only */
            case FILL_NEGINF: row[r] = r >= K - ninf ? -INFINITY : -6.0f * rndf(); break;
            case FILL_SIGNED_ZERO: row[r] = rnd() % 2 ? -0.0f : (rnd() % 2 ? 0.0f : -1.0f); break;
            case FILL_POSITIVE: row[r] = 4.0f * rndf() - 2.0f; break;     /* children may outweigh parents */
            case FILL_INTS: row[r] = -(float)(rnd() % 3); break;
            default: row[r] = -6.0f * rndf(); break;
            }
        }
        /* sort descending without reordering -inf or the signs of zeros wrongly:
         * cmp_fdesc sees -0 == +0, so their order is arbitrary, which is fine */
        qsort(row, (size_t)K, sizeof(float), cmp_fdesc);
    }
    fill_tokens(D, K);
}

static void test_build_and_walk(int iters) {
    static build_ctx c;
    build_ctx_open(&c);
    for (int it = 0; it < iters; it++) {
        int D = 1 + (int)(rnd() % (it % 3 ? 15 : 31));
        int K = (it % 5 == 0) ? 1 + (int)(rnd() % 1024) : 1 + (int)(rnd() % 64);
        int B = (int)(rnd() % 1025);
        fill_table(D, K, it % 4 == 0 ? FILL_TIES : FILL_UNIFORM);
        compare_build(&c, D, K, B, "random");
    }
    int random_bad = c.mismatched;
    CHECK(random_bad == 0, "%d of %d random builds differ from the CPU", random_bad, iters);
    printf("build: %d random problems, %d differ from the CPU; walk: %d compared (%d longer than 3)\n",
           iters, random_bad, c.walks, c.long_walks);

    /* edge cases, each compared node for node */
    static const struct {
        int D, K, B, kind;
        const char *what;
    } edges[] = {
        {1, 1, 1, FILL_UNIFORM, "D 1 K 1"},
        {1, 1, 1024, FILL_UNIFORM, "D 1 K 1, budget over the table"},
        {1, 700, 1024, FILL_UNIFORM, "D 1, budget over the table"},
        {1, 1024, 1024, FILL_TIES, "D 1, long sibling runs with ties"},
        {31, 1, 1024, FILL_UNIFORM, "K 1, a chain of 31"},
        {31, 1, 5, FILL_UNIFORM, "K 1, budget below D"},
        {2, 3, 1024, FILL_UNIFORM, "budget over the table (12 nodes)"},
        {5, 4, 1024, FILL_TIES, "budget over the table with ties (1364 > 1024)"},
        {7, 9, 0, FILL_UNIFORM, "budget 0"},
        {31, 1024, 0, FILL_UNIFORM, "budget 0, largest table"},
        {31, 1024, 1024, FILL_UNIFORM, "largest table and budget"},
        {31, 4, 1024, FILL_ZERO, "all-zero table: pure rank-tuple order"},
        {5, 1024, 1024, FILL_ZERO, "all-zero table, wide"},
        {31, 2, 1024, FILL_ZERO, "all-zero table, binary"},
        {31, 40, 1024, FILL_INTS, "integer weights: exact ties across depths"},
        {12, 3, 700, FILL_INTS, "integer weights, narrow"},
        {15, 64, 1024, FILL_NEGINF, "rows with -inf tails"},
        {31, 8, 1024, FILL_NEGINF, "rows with -inf tails, deep"},
        {15, 30, 600, FILL_SIGNED_ZERO, "-0 and +0 in rows"},
        {15, 64, 1024, FILL_POSITIVE, "positive logq: children outweigh parents"},
        {31, 3, 1024, FILL_POSITIVE, "positive logq, deep"},
    };
    int edge_bad = 0;
    for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++) {
        for (int rep = 0; rep < 3; rep++) {
            fill_table(edges[e].D, edges[e].K, edges[e].kind);
            edge_bad += compare_build(&c, edges[e].D, edges[e].K, edges[e].B, edges[e].what);
        }
    }
    /* a row of -inf only, and -inf in the first row: -inf candidates are legal */
    fill_table(6, 16, FILL_UNIFORM);
    for (int r = 0; r < 16; r++) g_logq[2 * 16 + r] = -INFINITY;
    edge_bad += compare_build(&c, 6, 16, 300, "a row of -inf");
    fill_table(4, 5, FILL_UNIFORM);
    for (int r = 2; r < 5; r++) g_logq[r] = -INFINITY;
    edge_bad += compare_build(&c, 4, 5, 1024, "-inf at depth 1");
    /* every kind at random sizes */
    for (int it = 0; it < (iters < 50 ? 14 : 140); it++) {
        int kind = it % 7;
        int D = 1 + (int)(rnd() % 31), K = 1 + (int)(rnd() % (it % 2 ? 8 : 300));
        int B = (int)(rnd() % 1025);
        fill_table(D, K, kind);
        edge_bad += compare_build(&c, D, K, B, "random kind");
    }
    CHECK(edge_bad == 0, "%d edge-case builds differ from the CPU", edge_bad);
    printf("build edge cases (K 1, D 1, budget 0, budget over the table, -inf, +-0, ties, "
           "positive logq): %d compared in all, %d differ\n",
           c.compared - iters, edge_bad);

    ddt_cuda_tree dt = c.dt;
    static host_tree h;
    float *dq = c.dq;
    int32_t *dtok = c.dtok, *dnext = c.dnext;
    float *logq = g_logq;
    int32_t *tok = g_tok;

    /* a table with NaN: status, and a root-only tree */
    int D = 3, K = 4;
    for (int i = 0; i < D * K; i++) {
        logq[i] = -(float)(i % K);
        tok[i] = i;
    }
    logq[6] = NAN;
    int32_t root = 17;
    CU(cudaMemcpy(dq, logq, (size_t)D * (size_t)K * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dtok, tok, (size_t)D * (size_t)K * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dt.root_token, &root, 4, cudaMemcpyHostToDevice));
    poison_tree(&dt);
    OK(ddt_cuda_tree_build(&dt, dq, dtok, D, K, 10, 5000, NULL, &err_));
    CU(cudaDeviceSynchronize());
    fetch_tree(&dt, &h);
    CHECK(h.status == DDT_CUDA_TREE_BAD_TABLE && h.n == 1 && h.token[0] == 17 && h.vis[0] == 1,
          "NaN table: status %d n %d", h.status, h.n);
    /* unsorted row */
    logq[6] = 0.5f;
    CU(cudaMemcpy(dq, logq, (size_t)D * (size_t)K * 4, cudaMemcpyHostToDevice));
    OK(ddt_cuda_tree_build(&dt, dq, dtok, D, K, 10, 5000, NULL, &err_));
    CU(cudaDeviceSynchronize());
    fetch_tree(&dt, &h);
    CHECK(h.status == DDT_CUDA_TREE_BAD_TABLE && h.n == 1, "unsorted table: status %d", h.status);
    /* a good table, then a damaged tree: a parent pointing forward (a cycle) */
    logq[6] = -2.0f;
    CU(cudaMemcpy(dq, logq, (size_t)D * (size_t)K * 4, cudaMemcpyHostToDevice));
    OK(ddt_cuda_tree_build(&dt, dq, dtok, D, K, 10, 5000, NULL, &err_));
    int32_t next[11] = {0}, cyc = 5;
    CU(cudaMemcpy(dnext, next, sizeof next, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dt.parent + 3, &cyc, 4, cudaMemcpyHostToDevice));
    OK(ddt_cuda_tree_accept(&dt, dnext, 5000, NULL, &err_));
    int32_t status, len;
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(&status, dt.status, 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(&len, dt.path_len, 4, cudaMemcpyDeviceToHost));
    CHECK(status == DDT_CUDA_TREE_BAD_TREE && len == 0, "cyclic tree: status %d len %d", status, len);
    /* target out of vocabulary */
    OK(ddt_cuda_tree_build(&dt, dq, dtok, D, K, 10, 5000, NULL, &err_));
    next[2] = 999999;
    CU(cudaMemcpy(dnext, next, sizeof next, cudaMemcpyHostToDevice));
    OK(ddt_cuda_tree_accept(&dt, dnext, 5000, NULL, &err_));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(&status, dt.status, 4, cudaMemcpyDeviceToHost));
    CHECK(status == DDT_CUDA_TREE_BAD_TARGET, "bad target: status %d", status);
    printf("bad table / damaged tree / bad target: status codes checked\n");

    build_ctx_close(&c);
}

/* The device pipeline: top-K from logits, build from that table; the CPU builds
 * from the GPU's table and must agree node for node. */
static void test_pipeline(void) {
    enum { D = 15, V = 32003, K = 256, B = 256 };
    float *z = malloc((size_t)D * V * sizeof(float));
    for (size_t i = 0; i < (size_t)D * V; i++) z[i] = 6.0f * rndf() + ((i % V) == 7 ? 5.0f : 0.0f);
    float *dz, *dq;
    int32_t *dtok;
    CU(cudaMalloc((void **)&dz, (size_t)D * V * sizeof(float)));
    CU(cudaMalloc((void **)&dq, (size_t)D * K * sizeof(float)));
    CU(cudaMalloc((void **)&dtok, (size_t)D * K * sizeof(int32_t)));
    CU(cudaMemcpy(dz, z, (size_t)D * V * sizeof(float), cudaMemcpyHostToDevice));
    ddt_cuda_tree dt;
    OK(ddt_cuda_tree_alloc(B, &dt, &err_));
    int32_t root = 3;
    CU(cudaMemcpy(dt.root_token, &root, 4, cudaMemcpyHostToDevice));
    size_t wsb = ddt_cuda_topk_workspace_bytes(D, V, K);
    void *ws;
    CU(cudaMalloc(&ws, wsb));
    OK(ddt_cuda_topk_logsoftmax(dz, D, V, K, dq, dtok, ws, wsb, NULL, &err_));
    OK(ddt_cuda_tree_build(&dt, dq, dtok, D, K, B, V, NULL, &err_));
    CU(cudaDeviceSynchronize());
    static float logq[D * K];
    static int32_t tok[D * K];
    static host_tree h;
    CU(cudaMemcpy(logq, dq, sizeof logq, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(tok, dtok, sizeof tok, cudaMemcpyDeviceToHost));
    fetch_tree(&dt, &h);
    ddt_builder *b;
    ddt_tree ct;
    OK(ddt_builder_create(B, &b, &err_));
    OK(ddt_tree_alloc(B + 1, &ct, &err_));
    ddt_draft_table tb = {D, K, logq, tok};
    OK(ddt_tree_build(b, &tb, root, B, NULL, V, &ct, &err_));
    int same = h.n == ct.n_nodes && h.status == 0;
    for (int i = 0; same && i < h.n; i++)
        same = h.token[i] == ct.token[i] && h.parent[i] == ct.parent[i];
    CHECK(same, "pipeline: GPU tree differs from the CPU tree built on the GPU's table");
    printf("pipeline top-K -> build (D %d, V %d, K %d, B %d): %s\n", D, V, K, B, same ? "equal" : "DIFFERENT");
    ddt_builder_destroy(b);
    ddt_tree_free(&ct);
    ddt_cuda_tree_free(&dt);
    free(z);
    CU(cudaFree(dz));
    CU(cudaFree(dq));
    CU(cudaFree(dtok));
    CU(cudaFree(ws));
}

/* argmax of `rows` rows of which the first `used` are live (the rest must stay
 * untouched); the logits start `shift` floats into their buffer, so shift 1
 * takes the single-float path even when vocab % 4 == 0.  zeros: every row's
 * maximum is 0.0, held by -0.0 and +0.0 entries among negatives and -inf (the
 * lowest id of either sign must win); otherwise integers 0..49, many ties. */
static void test_argmax_at(int rows, int vocab, int used, int shift, int zeros) {
    size_t n = (size_t)rows * (size_t)vocab;
    float *z = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        const uint32_t r = rnd();
        if (!zeros)
            z[i] = (float)(r % 50);
        else
            z[i] = r % 64 == 0 ? -0.0f : r % 64 == 1 ? 0.0f : r % 8 == 2 ? -INFINITY : -1.0f - (float)(r % 7);
    }
    float *dbuf, *dz;
    int32_t *dout, *dn;
    CU(cudaMalloc((void **)&dbuf, (n + (size_t)shift) * sizeof(float)));
    dz = dbuf + shift;
    CU(cudaMalloc((void **)&dout, (size_t)rows * 4));
    CU(cudaMalloc((void **)&dn, 4));
    CU(cudaMemcpy(dz, z, n * sizeof(float), cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dn, &used, 4, cudaMemcpyHostToDevice));
    CU(cudaMemset(dout, 0xff, (size_t)rows * 4));
    OK(ddt_cuda_argmax_rows(dz, rows, dn, vocab, dout, NULL, &err_));
    CU(cudaDeviceSynchronize());
    int32_t *out = malloc((size_t)rows * 4);
    CU(cudaMemcpy(out, dout, (size_t)rows * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int r = 0; r < rows; r++) {
        int32_t want = -1;
        if (r < used) {
            want = 0;
            for (int i = 1; i < vocab; i++)
                if (z[(size_t)r * vocab + i] > z[(size_t)r * vocab + want]) want = i;
        }
        bad += out[r] != want;
    }
    CHECK(bad == 0, "argmax rows %d (%d live) vocab %d shift %d zeros %d: %d rows differ", rows, used, vocab, shift,
          zeros, bad);
    printf("argmax rows %d (%d live) vocab %d shift %d zeros %d: %d differ\n", rows, used, vocab, shift, zeros, bad);
    free(z);
    free(out);
    CU(cudaFree(dbuf));
    CU(cudaFree(dout));
    CU(cudaFree(dn));
}

static void test_argmax(int rows, int vocab) { test_argmax_at(rows, vocab, rows - 2, 0, 0); }

/* ------------------------------------------------------------------ auto budget */

/* A random cost model: node points 0, 1, 2, 4, ... (the engine's kind) or random
 * rising ones, a verify cost rising from flat to steep, a draft cost. */
static void random_cost(int B, float *nodes, float *verify, ddt_cost_model *cm) {
    int np = 0;
    const int kind = (int)(rnd() % 3);
    if (kind == 0) {
        for (int n = 0; n <= B && np < 12; n = n ? 2 * n : 1) nodes[np++] = (float)n;
        if (np < 12 && nodes[np - 1] < (float)B) nodes[np++] = (float)B;
    } else {
        float x = kind == 1 ? 0.0f : 0.5f * rndf();
        for (np = 0; np < 1 + (int)(rnd() % 10); np++) {
            nodes[np] = x;
            x += 0.5f + (float)(rnd() % 40) * rndf();
        }
    }
    const float base = 0.2f + rndf(), slope = 0.05f * rndf() * rndf(), curve = 0.002f * rndf() * rndf();
    for (int i = 0; i < np; i++) {
        verify[i] = base + slope * nodes[i] + curve * nodes[i] * nodes[i] + 1e-4f * (float)i;
        if (i && !(verify[i] > verify[i - 1])) verify[i] = verify[i - 1] * 1.0001f + 1e-6f;
    }
    *cm = (ddt_cost_model){rnd() % 4 ? 0.3f * rndf() : 0.0f, np, nodes, 1, NULL, verify, 0.0f};
}

/* The build of one bucket's graph (capped at bucket j, as the engine's per-bucket
 * graphs build): *choice = the uncapped rule's bucket bj; the tree is the
 * uncapped one when j >= bj, else its first min(bucket[j], built - 1) + 1 nodes
 * (pop order), bitwise the CPU's full tree there; the padding runs to bucket j's
 * end whatever the cut, and nothing past it is written.  A switch with a cap is
 * refused.  Returns 1 when anything differs. */
static int check_capped(build_ctx *c, int D, int K, int B, int32_t root, const ddt_cuda_tree_auto *a0, int j,
                        int bj, int keep, int built) {
    static host_tree h;
    static int32_t *dchoice;
    if (!dchoice) CU(cudaMalloc((void **)&dchoice, 4));
    const ddt_tree *ct = &c->ct;
    ddt_cuda_tree_auto a = *a0;
    a.built = NULL;
    a.capped = true;
    a.cap = j;
    a.choice = dchoice;
    poison_tree(&c->dt);
    CU(cudaMemset(dchoice, 0xff, 4));
    OK(ddt_cuda_tree_build_auto(&c->dt, c->dq, c->dtok, D, K, B, 5000, &a, NULL, &err_));
    CU(cudaDeviceSynchronize());
    fetch_tree(&c->dt, &h);
    int32_t choice = -2;
    CU(cudaMemcpy(&choice, dchoice, 4, cudaMemcpyDeviceToHost));
    const int want = j >= bj ? keep : (a.bucket[j] < built - 1 ? a.bucket[j] : built - 1) + 1;
    const int rows = a.bucket[j] + 1;
    int bad = h.status != 0 || h.n != want || choice != bj, first = -1;
    for (int i = 0; !bad && i < h.n; i++) {
        bad |= h.token[i] != ct->token[i] || h.parent[i] != ct->parent[i] || h.depth[i] != ct->depth[i] ||
               h.rank[i] != ct->rank[i] || memcmp(&h.logw[i], &ct->logw[i], 4) != 0;
        if (bad) first = i;
    }
    for (int i = h.n; !bad && i < rows; i++) {
        bad |= h.token[i] != root || h.parent[i] != 0 || h.depth[i] != 1;
        if (bad) first = i;
    }
    for (int i = rows; !bad && i < c->dt.capacity && i < rows + 4; i++) bad |= h.token[i] != -1;
    if (bad && c->mismatched < 8)
        fprintf(stderr, "capped auto build mismatch: D %d K %d B %d cap %d (bucket %d): n %d (want %d), choice %d "
                        "(want %d), rows %d; node %d\n", D, K, B, j, a.bucket[j], h.n, want, choice, bj, rows, first);
    ddt_error e;
    a.cap = a.n_buckets;
    bad |= ddt_cuda_tree_build_auto(&c->dt, c->dq, c->dtok, D, K, B, 5000, &a, NULL, &e) != DDT_ERR_INVALID;
    c->capped++;
    c->capped_below += j < bj;
    return bad;
}

/* The device's cost-aware build of g_logq/g_tok vs the CPU's: ddt_tree_build at
 * the full budget cut by ddt_cost_bucket_cut under the cost table vc[0..B],
 * a->draft_cost and a->bucket; the node count and every kept node bitwise, then
 * the padding up to the chosen bucket and nothing written past it.  The nodes
 * built before the early stop (a->built) lie between the kept ones and the full
 * tree, and are the full tree when some depth's logq is positive (the stop's
 * bound needs weights that never rise).  Returns 1 when anything differs. */
static int check_auto(build_ctx *c, int D, int K, int B, int32_t root, const float *vc, ddt_cuda_tree_auto *a,
                      float *dvcost) {
    static host_tree h;
    ddt_draft_table tb = {D, K, cpu_table(c, D, K), g_tok};
    OK(ddt_tree_build(c->b, &tb, root, B, NULL, 5000, &c->ct, &err_));
    const ddt_tree *ct = &c->ct;
    a->vcost = dvcost;
    a->built = c->dbuilt;
    int32_t bj = -1, built = -1;
    const int keep = ddt_cost_bucket_cut(ct->logw, ct->n_nodes, vc, a->draft_cost, a->bucket, a->n_buckets, &bj);
    int positive = 0;
    for (int d = 0; d < D; d++) positive |= tb.logq[d * K] > 0.0f;
    poison_tree(&c->dt);
    CU(cudaMemset(c->dbuilt, 0xff, 4));
    CU(cudaMemcpy(dvcost, vc, (size_t)(B + 1) * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(c->dq, g_logq, (size_t)D * (size_t)K * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(c->dtok, g_tok, (size_t)D * (size_t)K * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(c->dt.root_token, &root, 4, cudaMemcpyHostToDevice));
    OK(ddt_cuda_tree_build_auto(&c->dt, c->dq, c->dtok, D, K, B, 5000, a, NULL, &err_));
    CU(cudaDeviceSynchronize());
    fetch_tree(&c->dt, &h);
    CU(cudaMemcpy(&built, c->dbuilt, 4, cudaMemcpyDeviceToHost));
    c->compared++;
    c->last_built = built;
    c->last_bucket = bj;
    int bad = h.status != 0 || h.n != keep || bj < 0, first = -1;
    const int bad_built = built < keep || built > ct->n_nodes || (positive && built != ct->n_nodes);
    bad |= bad_built;
    for (int i = 0; !bad && i < h.n; i++) {
        bad |= h.token[i] != ct->token[i] || h.parent[i] != ct->parent[i] || h.depth[i] != ct->depth[i] ||
               h.rank[i] != ct->rank[i] || memcmp(&h.logw[i], &ct->logw[i], 4) != 0;
        bad |= memcmp(h.vis + (size_t)i * (size_t)c->dt.vis_words, ct->vis + (size_t)i * (size_t)ct->vis_words,
                      (size_t)ct->vis_words * 8) != 0;
        if (bad) first = i;
    }
    const int rows = bad ? 0 : a->bucket[bj] + 1;
    if (!bad && rows < h.n) bad = 1;
    for (int i = h.n; !bad && i < rows; i++) { /* padding: the root's token under the root */
        const uint64_t *v = h.vis + (size_t)i * (size_t)c->dt.vis_words;
        bad |= h.token[i] != root || h.parent[i] != 0 || h.depth[i] != 1;
        for (int w = 0; w < c->dt.vis_words; w++)
            bad |= v[w] != ((w == 0 ? 1ull : 0ull) | (w == (i >> 6) ? 1ull << (i & 63) : 0ull));
        if (bad) first = i;
    }
    /* past the bucket nothing is written (the poison stays) */
    for (int i = rows; !bad && i < c->dt.capacity && i < rows + 4; i++) bad |= h.token[i] != -1;
    if (bad) {
        c->mismatched++;
        if (c->mismatched < 8)
            fprintf(stderr,
                    "auto build mismatch: D %d K %d B %d: gpu n %d status %d built %d%s, cpu cut %d of %d, rows %d; "
                    "node %d\n",
                    D, K, B, h.n, h.status, built, bad_built ? " (WRONG)" : "", keep, ct->n_nodes, rows, first);
        return 1;
    }
    c->cut += keep < ct->n_nodes;
    c->stopped += built < ct->n_nodes;
    /* the per-bucket graphs' capped builds: a random cap and the bucket just below the rule's */
    int capped_bad = check_capped(c, D, K, B, root, a, (int)(rnd() % (uint32_t)a->n_buckets), bj, keep, built);
    if (bj > 0) capped_bad |= check_capped(c, D, K, B, root, a, bj - 1, bj, keep, built);
    if (capped_bad) c->mismatched++;
    return capped_bad;
}

/* check_auto under a random cost model and random buckets. */
static int compare_build_auto(build_ctx *c, int D, int K, int B, float *dvcost) {
    static float nodes[16], verify[16], vc[DDT_MAX_NODES];
    ddt_cost_model cm;
    random_cost(B, nodes, verify, &cm);
    for (int n = 0; n <= B; n++) vc[n] = ddt_cost_verify(&cm, (float)n);
    int32_t root = (int32_t)(rnd() % 5000);
    /* buckets: random rising sizes below B, then B */
    ddt_cuda_tree_auto a;
    memset(&a, 0, sizeof a);
    a.draft_cost = cm.draft;
    for (int b = (int)(rnd() % 3); b < B && a.n_buckets < DDT_CUDA_TREE_MAX_BUCKETS - 1; b += 1 + (int)(rnd() % 9))
        a.bucket[a.n_buckets++] = b;
    a.bucket[a.n_buckets++] = B;
    return check_auto(c, D, K, B, root, vc, &a, dvcost);
}

/* An auto-budget description of bucket ends set[0..n) at draft cost 0.3 (the cost
 * table itself comes with check_auto). */
static ddt_cuda_tree_auto stop_buckets(const int32_t *set, int n) {
    ddt_cuda_tree_auto a;
    memset(&a, 0, sizeof a);
    a.draft_cost = 0.3f;
    a.n_buckets = n;
    memcpy(a.bucket, set, sizeof(int32_t) * (size_t)n);
    return a;
}

/*
 * The early stop at known points, on tables whose full tree has B = 64 nodes
 * (the node counts below are for that tree, root included: 65 in full):
 *  - a step in the verify cost after s nodes (cost 1 up to s, 1000 past it): the
 *    largest bucket <= s wins, and the build stops in the step that adds node
 *    s, so with at most 31 nodes a step it has built s + 1 .. s + 31;
 *  - steep cost: a small bucket wins and the build stops early;
 *  - flat cost: the largest bucket wins, the whole tree is built;
 *  - tied buckets: logq -100 past rank 3 makes nodes 5.. weigh exp_det = 0, so
 *    buckets 4 and 8 at the same cost tie; the first must win, and the stop
 *    comes in the first step (bucket 64 costs twice as much);
 *  - the same with a flat cost: 4, 8 and 64 all tie, which the stop's margin
 *    never calls a loss, so the build runs on; the first still wins.
 */
static void test_build_auto_stops(build_ctx *c, float *dvcost) {
    static float vc[DDT_MAX_NODES];
    const int B = 64;
    const int32_t sets[3][8] = {{1, 2, 4, 8, 16, 32, 64}, {0, 4, 8, 16, 32, 48, 64}, {3, 5, 11, 20, 33, 64}};
    const int nsets[3] = {7, 7, 6};
    int bad = 0, stops_seen = 0, prev_stop = -1;
    for (int set = 0; set < 3; set++) {
        const int steps[4] = {4, 8, 16, 32};
        for (int si = 0; si < 4; si++) {
            const int s = steps[si];
            fill_table(8, 16, FILL_UNIFORM);
            ddt_cuda_tree_auto a = stop_buckets(sets[set], nsets[set]);
            for (int n = 0; n <= B; n++) vc[n] = n <= s ? 1.0f : 1000.0f;
            bad += check_auto(c, 8, 16, B, (int32_t)(rnd() % 5000), vc, &a, dvcost);
            int want_j = 0; /* the largest bucket <= s */
            for (int j = 0; j < a.n_buckets; j++)
                if (a.bucket[j] <= s) want_j = j;
            const int built = c->last_built, end = a.bucket[want_j];
            const int ok = c->ct.n_nodes == B + 1 && c->last_bucket == want_j && built >= end + 1 &&
                           built <= end + 31 && built < B + 1;
            CHECK(ok, "auto stop, bucket set %d, cost step after %d: bucket %d (want %d), built %d of %d (want %d..%d)",
                  set, s, c->last_bucket, want_j, built, c->ct.n_nodes, end + 1, end + 31);
            stops_seen += built != prev_stop;
            prev_stop = built;
        }
        for (int steep = 0; steep < 2; steep++) { /* steep, then flat */
            fill_table(8, 16, FILL_UNIFORM);
            ddt_cuda_tree_auto a = stop_buckets(sets[set], nsets[set]);
            for (int n = 0; n <= B; n++) vc[n] = steep ? 0.5f + 0.5f * (float)n : 1.0f;
            bad += check_auto(c, 8, 16, B, (int32_t)(rnd() % 5000), vc, &a, dvcost);
            if (steep)
                CHECK(c->last_bucket < a.n_buckets - 1 && c->last_built < B + 1,
                      "auto stop, bucket set %d, steep cost: bucket %d, built %d: no early stop", set, c->last_bucket,
                      c->last_built);
            else
                CHECK(c->last_bucket == a.n_buckets - 1 && c->last_built == B + 1,
                      "auto stop, bucket set %d, flat cost: bucket %d, built %d: want the whole tree", set,
                      c->last_bucket, c->last_built);
        }
    }
    for (int flat = 0; flat < 2; flat++) { /* tied buckets */
        const int K = 64;
        for (int r = 0; r < K; r++) g_logq[r] = r < 4 ? -0.1f * (float)(r + 1) : -100.0f;
        fill_tokens(1, K);
        ddt_cuda_tree_auto a;
        memset(&a, 0, sizeof a);
        a.draft_cost = 0.1f;
        a.n_buckets = 3;
        a.bucket[0] = 4;
        a.bucket[1] = 8;
        a.bucket[2] = B;
        for (int n = 0; n <= B; n++) vc[n] = flat || n <= 8 ? 1.0f : 2.0f;
        bad += check_auto(c, 1, K, B, (int32_t)(rnd() % 5000), vc, &a, dvcost);
        CHECK(c->last_bucket == 0 && (flat ? c->last_built == B + 1 : c->last_built < B + 1),
              "auto stop, tied buckets (%s): bucket %d (want 0), built %d", flat ? "all tied" : "4 and 8",
              c->last_bucket, c->last_built);
    }
    CHECK(bad == 0, "%d crafted cost-aware builds differ from the CPU", bad);
    CHECK(stops_seen >= 4, "the crafted cost steps stopped the build at only %d distinct points", stops_seen);
    printf("auto build early stop: crafted cost tables, %d differ from the CPU, %d distinct stop points\n", bad,
           stops_seen);
}

static void test_build_auto(int iters) {
    static build_ctx c;
    build_ctx_open(&c);
    float *dvcost;
    CU(cudaMalloc((void **)&dvcost, DDT_MAX_NODES * 4));
    int bad = 0;
    for (int it = 0; it < iters; it++) {
        int D = 1 + (int)(rnd() % (it % 3 ? 15 : 31));
        int K = (it % 5 == 0) ? 1 + (int)(rnd() % 300) : 1 + (int)(rnd() % 64);
        int B = it % 4 ? (int)(rnd() % 129) : (int)(rnd() % 1025);
        fill_table(D, K, it % 6 == 0 ? FILL_TIES : it % 6 == 1 ? FILL_POSITIVE : FILL_UNIFORM);
        bad += compare_build_auto(&c, D, K, B, dvcost);
    }
    CHECK(bad == 0, "%d of %d cost-aware builds differ from the CPU", bad, iters);
    CHECK(c.cut * 5 >= iters, "only %d of %d cost-aware builds were cut below the full tree: the test misses the cut",
          c.cut, iters);
    CHECK(c.stopped > 0, "none of %d cost-aware builds stopped early", iters);
    CHECK(c.capped_below * 10 >= iters, "only %d of %d capped builds cut below the rule's bucket", c.capped_below,
          c.capped);
    printf("capped auto builds (one graph per bucket): %d, %d of them below the rule's bucket\n", c.capped,
           c.capped_below);
    printf("auto build: %d random problems with random cost models, %d differ from the CPU (%d cut below the "
           "budget, %d stopped early)\n", iters, bad, c.cut, c.stopped);
    test_build_auto_stops(&c, dvcost);
    /* bad arguments are refused with a message, never launched */
    ddt_error e;
    ddt_cuda_tree_auto a;
    memset(&a, 0, sizeof a);
    a.vcost = dvcost;
    a.n_buckets = 2;
    a.bucket[0] = 8;
    a.bucket[1] = 4;
    CHECK(ddt_cuda_tree_build_auto(&c.dt, c.dq, c.dtok, 3, 4, 4, 5000, &a, NULL, &e) != DDT_OK,
          "falling buckets accepted");
    a.bucket[0] = 2;
    CHECK(ddt_cuda_tree_build_auto(&c.dt, c.dq, c.dtok, 3, 4, 5, 5000, &a, NULL, &e) != DDT_OK,
          "a last bucket other than the budget accepted");
    a.vcost = NULL;
    CHECK(ddt_cuda_tree_build_auto(&c.dt, c.dq, c.dtok, 3, 4, 4, 5000, &a, NULL, &e) != DDT_OK,
          "no cost table accepted");
    build_ctx_close(&c);
    CU(cudaFree(dvcost));
}

/* The draft calibration in the device build (fixed and auto budgets) against
 * ddt_cal_apply + the CPU builder, bitwise: random weights whose buckets disagree
 * (rows the running minimum flattens), tables with ties, -inf and zeros of both
 * signs, rows of up to 1024 ranks (many chunks of the warp's min-scan). */
static void test_build_calibrated(int iters) {
    static build_ctx c;
    build_ctx_open(&c);
    float *dvcost;
    CU(cudaMalloc((void **)&dvcost, DDT_MAX_NODES * 4));
    ddt_draft_calibration cal;
    int bad = 0, bad_auto = 0;
    static const int kinds[] = {FILL_UNIFORM, FILL_TIES, FILL_NEGINF, FILL_SIGNED_ZERO, FILL_INTS, FILL_ZERO};
    for (int it = 0; it < iters; it++) {
        for (int b = 0; b < DDT_CAL_BUCKETS; b++) {
            cal.w[b][0] = 6.0f * rndf() - 3.0f;
            cal.w[b][1] = 0.1f + 2.0f * rndf();
            cal.w[b][2] = 4.0f * rndf() - 2.0f;
        }
        g_cal = &cal;
        int D = 1 + (int)(rnd() % (it % 3 ? 15 : 31));
        int K = (it % 5 == 0) ? 1 + (int)(rnd() % 1024) : 1 + (int)(rnd() % 64);
        int B = it % 4 ? (int)(rnd() % 129) : (int)(rnd() % 1025);
        fill_table(D, K, kinds[it % 6]);
        bad += compare_build(&c, D, K, B, "calibrated");
        bad_auto += compare_build_auto(&c, D, K, B < 256 ? B : 256, dvcost);
    }
    g_cal = NULL;
    c.dt.cal_on = false;
    CHECK(bad == 0 && bad_auto == 0, "calibrated builds: %d fixed and %d auto of %d differ from the CPU", bad, bad_auto,
          iters);
    printf("calibrated build: %d random problems with random calibrations, %d fixed and %d auto differ from the CPU\n",
           iters, bad, bad_auto);
    build_ctx_close(&c);
    CU(cudaFree(dvcost));
}

/* The lookup graft on the device (ddt_cuda_tree_graft) against ddt_tree_graft on
 * the CPU, after calibrated builds of random tables: fixed budgets, and the auto
 * budget's cut (use_n: the graft keeps within the nodes the device kept); paths
 * that follow the tree's ranks for a while (shared prefixes) or leave it at once,
 * of every length up to the depth; the nodes bitwise, the visibility rows, the
 * freed rows padded, the count of grafted nodes, and nothing done when the
 * proposal is empty or the calibration rates no lookup. */
static void test_graft(int iters) {
    static build_ctx c;
    static host_tree h;
    build_ctx_open(&c);
    int32_t *prop_h, *dcount;
    CU(cudaMallocHost((void **)&prop_h, (2 + DDT_MAX_DEPTH) * sizeof(int32_t)));
    CU(cudaMalloc((void **)&dcount, 4));
    float *dvcost;
    CU(cudaMalloc((void **)&dvcost, DDT_MAX_NODES * 4));
    ddt_draft_calibration cal;
    int bad = 0, grafted_total = 0, cut = 0;
    for (int it = 0; it < iters; it++) {
        ddt_cal_identity(&cal);
        for (int b = 0; b < DDT_CAL_BUCKETS; b++) {
            cal.w[b][0] = 4.0f * rndf() - 2.0f;
            cal.w[b][1] = 0.2f + 1.5f * rndf();
        }
        cal.lookup = it % 10 != 9; /* one in ten: no rating, no graft */
        for (int m = 0; m < DDT_CAL_LOOKUP_LENS; m++) cal.lookup_first[m] = 0.05f + 0.95f * rndf();
        cal.lookup_next = 0.5f + 0.5f * rndf();
        g_cal = &cal;
        const int D = 1 + (int)(rnd() % 15), K = 1 + (int)(rnd() % 16), B = 1 + (int)(rnd() % 96);
        const bool autob = it % 3 == 2;
        fill_table(D, K, it % 4 == 0 ? FILL_TIES : FILL_UNIFORM);
        const int32_t root = (int32_t)(rnd() % 5000);
        /* the proposal: the tree's own ranks for a while, then other tokens */
        const int len = it % 8 == 0 ? 0 : 1 + (int)(rnd() % (uint32_t)D), ml = DDT_LOOKUP_MIN + (int)(rnd() % 7);
        const int along = (int)(rnd() % (uint32_t)(len + 1));
        prop_h[0] = len;
        prop_h[1] = ml;
        for (int j = 0; j < len; j++) prop_h[2 + j] = j < along ? g_tok[j * K + (int)(rnd() % 2 < 1 || K < 2 ? 0 : 1)]
                                                                : 4000 + (int)(rnd() % 999);
        /* the device: build (fixed or auto), graft */
        const float *cq = cpu_table(&c, D, K);
        CU(cudaMemcpy(c.dq, g_logq, (size_t)D * (size_t)K * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(c.dtok, g_tok, (size_t)D * (size_t)K * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(c.dt.root_token, &root, 4, cudaMemcpyHostToDevice));
        CU(cudaMemset(dcount, 0, 4));
        poison_tree(&c.dt);
        if (autob) {
            static float nodes[16], verify[16], vc[DDT_MAX_NODES];
            ddt_cost_model cm;
            random_cost(B, nodes, verify, &cm);
            for (int q = 0; q <= B; q++) vc[q] = ddt_cost_verify(&cm, (float)q);
            CU(cudaMemcpy(dvcost, vc, (size_t)(B + 1) * 4, cudaMemcpyHostToDevice));
            ddt_cuda_tree_auto a;
            memset(&a, 0, sizeof a);
            a.draft_cost = cm.draft;
            a.vcost = dvcost;
            for (int q = (int)(rnd() % 3); q < B && a.n_buckets < DDT_CUDA_TREE_MAX_BUCKETS - 1; q += 1 + (int)(rnd() % 9))
                a.bucket[a.n_buckets++] = q;
            a.bucket[a.n_buckets++] = B;
            OK(ddt_cuda_tree_build_auto(&c.dt, c.dq, c.dtok, D, K, B, 5000, &a, NULL, &err_));
        } else {
            OK(ddt_cuda_tree_build(&c.dt, c.dq, c.dtok, D, K, B, 5000, NULL, &err_));
        }
        int32_t n_built = 0;
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(&n_built, c.dt.n_nodes, 4, cudaMemcpyDeviceToHost));
        OK(ddt_cuda_tree_graft(&c.dt, prop_h, B, autob, dcount, NULL, &err_));
        CU(cudaDeviceSynchronize());
        fetch_tree(&c.dt, &h);
        int32_t count = -1;
        CU(cudaMemcpy(&count, dcount, 4, cudaMemcpyDeviceToHost));
        /* the CPU: the built prefix (pop order) and the same graft */
        ddt_draft_table tb = {D, K, cq, g_tok};
        OK(ddt_tree_build(c.b, &tb, root, n_built - 1, NULL, 5000, &c.ct, &err_));
        int32_t grafted = 0;
        if (cal.lookup && len > 0) {
            float v[DDT_MAX_DEPTH];
            ddt_cal_lookup_weights(&cal, ml, len, v);
            OK(ddt_tree_graft(&c.ct, prop_h + 2, v, len, autob ? n_built - 1 : B, 5000, &grafted, &err_));
        }
        const ddt_tree *ct = &c.ct;
        int wrong = h.status != 0 || h.n != ct->n_nodes || count != grafted, first = -1;
        for (int i = 0; !wrong && i < h.n; i++) {
            wrong |= h.token[i] != ct->token[i] || h.parent[i] != ct->parent[i] || h.depth[i] != ct->depth[i] ||
                     h.rank[i] != ct->rank[i] || memcmp(&h.logw[i], &ct->logw[i], 4) != 0;
            wrong |= memcmp(h.vis + (size_t)i * (size_t)c.dt.vis_words, ct->vis + (size_t)i * (size_t)ct->vis_words,
                            (size_t)ct->vis_words * 8) != 0;
            if (wrong) first = i;
        }
        for (int i = h.n; !wrong && i < n_built; i++) { /* freed rows: padding */
            const uint64_t *vr = h.vis + (size_t)i * (size_t)c.dt.vis_words;
            wrong |= h.token[i] != root || h.parent[i] != 0 || h.depth[i] != 1;
            for (int w = 0; w < c.dt.vis_words; w++)
                wrong |= vr[w] != ((w == 0 ? 1ull : 0ull) | (w == (i >> 6) ? 1ull << (i & 63) : 0ull));
            if (wrong) first = i;
        }
        if (wrong) {
            if (bad < 8)
                fprintf(stderr, "graft mismatch: D %d K %d B %d auto %d len %d (along %d) match %d: gpu n %d status %d "
                                "count %d, cpu n %d grafted %d, built %d; row %d\n",
                        D, K, B, (int)autob, len, along, ml, h.n, h.status, count, ct->n_nodes, grafted, n_built, first);
            bad++;
        }
        grafted_total += grafted;
        cut += ct->n_nodes - grafted < n_built;
    }
    g_cal = NULL;
    c.dt.cal_on = false;
    CHECK(bad == 0, "%d of %d grafts differ from the CPU", bad, iters);
    CHECK(grafted_total > iters && cut * 4 > iters, "the grafts were too few to test: %d nodes, %d cut trees",
          grafted_total, cut);
    printf("graft: %d random problems (a third under the auto budget), %d differ from the CPU; %d nodes grafted, %d "
           "trees cut for them\n", iters, bad, grafted_total, cut);
    CU(cudaFreeHost(prop_h));
    CU(cudaFree(dcount));
    CU(cudaFree(dvcost));
    build_ctx_close(&c);
}

int main(int argc, char **argv) {
    int quick = argc > 1 && !strcmp(argv[1], "--quick"); /* for compute-sanitizer */
    setvbuf(stdout, NULL, _IONBF, 0); /* failures (stderr) print beside the case they belong to */
    test_topk(3, 1001, 1, 0);
    test_topk(5, 1001, 7, 1);
    test_topk(2, 50257, 64, 0);
    test_topk(3, 163840, 1024, 1);
    test_topk(1, 1000, 1000, 1);
    test_topk(2, 8197, 64, 1);     /* a last chunk shorter than k */
    test_topk(1, 16390, 1024, 0);
    if (!quick) test_topk(15, 163840, 512, 0);
    /* the one-launch path (vocab <= 16384): the shipped drafter's 4352 at the
     * round's shapes (D = 15 or 16 rows), tied thresholds, mixed zeros and -inf,
     * k = vocab, a tiny row, both sides of the path's bound */
    test_topk(1, 4352, 1, TOPK_ZEROS);
    test_topk(15, 4352, 7, TOPK_TIES);
    test_topk(16, 4352, 64, TOPK_RANDOM);
    test_topk(16, 4352, 64, TOPK_TIES);
    test_topk(15, 4352, 64, TOPK_ZEROS);
    test_topk(quick ? 3 : 65, 4352, 256, TOPK_TIES);
    test_topk(16, 4352, 256, TOPK_ZEROS);
    test_topk(2, 4352, 1024, TOPK_RANDOM);
    test_topk(1, 1000, 1000, TOPK_ZEROS);
    test_topk(3, 33, 5, TOPK_ZEROS);
    test_topk(3, 33, 33, TOPK_TIES);
    test_topk(2, 16384, 1024, TOPK_TIES);
    test_topk(2, 16384, 3, TOPK_ZEROS);
    test_topk(2, 16385, 64, TOPK_ZEROS); /* just above: the chunked path, same ties rule */
    if (!quick) test_topk(65, 16384, 64, TOPK_RANDOM);
    test_build_and_walk(quick ? 20 : 400);
    test_build_auto(quick ? 20 : 600);
    test_build_calibrated(quick ? 20 : 300);
    test_graft(quick ? 30 : 600);
    test_pipeline();
    test_argmax(37, 50257);
    test_argmax(5, 163840);
    /* the shipped drafter's vocabulary: float4 loads; then the single-float
     * path by an odd vocabulary and by a misaligned base */
    test_argmax_at(1, 4352, 1, 0, 0);
    test_argmax_at(15, 4352, 15, 0, 1);
    test_argmax_at(65, 4352, 63, 0, 0);
    test_argmax_at(65, 4353, 65, 0, 1);
    test_argmax_at(15, 4352, 14, 1, 0);
    test_argmax_at(3, 163843, 3, 0, 1); /* single floats, 1024 threads */
    test_argmax_at(4, 4352, 0, 0, 0);   /* no live row: nothing written */
    if (g_failures) {
        printf("test_cuda_tree: %d FAILED checks\n", g_failures);
        return 1;
    }
    printf("test_cuda_tree: all checks passed\n");
    return 0;
}
