/*
 * test_cuda_drafter.c — the GPU DFlash drafter (model/drafter_cuda.h) against
 * the CPU drafter (model/drafter.h) on the fixture drafters (fp32; bf16 + YaRN
 * with the legacy attention factor and the "model." prefix) for the fp32 fixture
 * target, and on the shipped pair models/pystdlib-dflash + pystdlib-target (bf16).
 *
 * Both drafters get the same random target features, appended in odd counts
 * (1, 7, 23, 31, prefixes of 61 and 67 that cross the 64-token chunk, an empty
 * append) through the capture layout (one [rows][hidden] buffer per target
 * layer, rows picked by a device rows array whose unused slots hold garbage),
 * and draft after several of them with random bonus tokens:
 *   - logits: normalised error ||gpu - cpu|| / ||cpu|| < 1e-5, argmax per row
 *     equal (a mismatch only counts when the CPU's top two differ by > 1e-5);
 *   - the logits buffer is poisoned with NaN before every draft, with one
 *     padding row after the L-1 rows that must stay untouched;
 *   - the device length follows the CPU's; an append that does not fit writes
 *     nothing, keeps the length and sets the status word;
 *   - chunking invariance, bitwise: the same 23 tokens appended as 23, 7 + 16,
 *     a prefix of 23, or a prefix of 7 + rows of 16 give the same logits;
 *   - a CUDA graph of (append_rows + draft) replayed twice equals the eager calls
 *     bit for bit (len advances on the device between replays);
 *   - the block attention alone (ddt_dflash_attention) against its CPU twin
 *     ddt_cpu_dflash_attention (backend/cpu/dflash.h) on random q / K / V: the
 *     shipped drafter's shape (4 heads over 2 kv heads of 64, a block of 16,
 *     split 32, and the split the drafter takes, ddt_dflash_attn_split_hint's
 *     256; head_dim 128 at its 128) over lengths 0..1030 in one cache of 1040 rows (tile and split
 *     edges, rows clamped at the cache's end), and odd shapes (GQA groups 1, 2,
 *     3, 4, head_dim 1..512 across the kernel's register widths and both staging
 *     paths, blocks not filling a query chunk, contexts shorter than, equal to
 *     and many times one split), through the backend-op harness: normalised
 *     error < 1e-5, cache rows past the read range NaN, the scratch poisoned
 *     before its ddt_dflash_attn_prepare, the output poisoned before every
 *     launch and one padding row after it untouched; a second launch bitwise
 *     equal, the arrival tickets back at 0 after every launch, a captured graph
 *     replayed over the lengths (len changed on the device) bitwise equal to
 *     the eager launches; refused shapes fail with DDT_ERR_INVALID;
 *   - the fused per-head norm + RoPE + K/V store (ddt_dflash_qkv_prep) against
 *     its CPU twin ddt_cpu_dflash_norm_rope (plus the append rule and a V copy)
 *     on odd shapes (head_dim 2..512 across the register widths, GQA and not,
 *     strided q/k/v slices with NaN padding, queries in place and not, no
 *     queries, a count on the device below n, appends refused by the fit rule
 *     and by max_count, query rows past the limit normed but not rotated):
 *     queries and keys normalised error < 1e-6, values bitwise, every padding
 *     value and every cache row outside the append untouched;
 *   - the same with several layers' keys / values in one launch (the append's
 *     `layers`: 1..8 layers, NaN gaps between their slices, counts on the host
 *     and the device, appends refused) against one launch per layer into
 *     separate poisoned caches: every cache bitwise equal, exactly the appended
 *     rows written; refused arguments fail with DDT_ERR_INVALID;
 *   - the append's K/V store with its advance folded in (advance_ticket: the
 *     last block advances len) against the store then the one-thread advance
 *     it replaced (test_cuda_drafter_ref.cu), each
 *     on its own caches and len/status: good appends, a count past max_count, a
 *     negative one, len + count past the limit, an empty append, a sticky
 *     status, the count on the host and the device, 5 appends in a row and a
 *     captured graph replayed 3 times; caches bitwise, len and status equal to
 *     each other and to the rule, the ticket back at 0 after every launch;
 *     refused arguments fail with DDT_ERR_INVALID;
 *   - the multi-source row gather (ddt_cuda_gather_rows_multi, the append's
 *     target layers side by side) against one ddt_cuda_gather_rows per source
 *     and the host's copy, bitwise over a poisoned destination with padding
 *     columns and a spare row (1..8 sources, odd widths, no rows); and its
 *     clamped form (ddt_cuda_gather_rows_multi_clamped, append_rows' one launch)
 *     against the clamp launch it replaced (test_cuda_drafter_ref.cu) then the
 *     plain gather, device lengths below,
 *     at and past the slots, 0 and negative;
 *   - row-stacked weights (ddt_cuda_qweight_concat_rows) in F32, BF16, FP8 and
 *     INT4: the stacked product bitwise the separate products on the FP32 path
 *     (also through a row-prefix view, as the drafter's append reads k | v),
 *     within 1e-5 on the tensor-core path (repacked), and FP8 parts off whole
 *     scale blocks refused with DDT_ERR_UNSUPPORTED.
 * Logits and the ops go through backend_ops.h (bo_compare).
 * Run from the repository root (scripts/gpu-test.sh); --quick: fixtures only
 * (for compute-sanitizer).
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/dflash_cuda.h"
#include "backend/cuda/nn_cuda.h"
#include "backend/cpu/dflash.h"
#include "backend/cpu/nn.h"
#include "backend/cpu/pool.h"
#include "backend/cuda/qmatmul_cuda.h"
#include "backend_ops.h"
#include "cuda_test.h"
#include "model/drafter.h"
#include "model/drafter_cuda.h"

#define TOL 1e-5

/* test_cuda_drafter_ref.cu: the clamp and advance launches the append ran before */
cudaError_t ref_dflash_clamp_rows(const int32_t *rows, const int32_t *m, int32_t max_m, int32_t *out, cudaStream_t s);
cudaError_t ref_dflash_advance(int32_t *len, int32_t *status, const int32_t *count_dev, int32_t count_host,
                               int32_t max_count, int32_t limit, cudaStream_t s);
#define N_ROWS 67 /* capture rows per target layer (a prefill chunk of 64 plus 3) */
#define MAX_CTX 211

static uint64_t g_rng = 0x5DEECE66Dull * 2654435761ull;
static uint32_t rnd(void) { return ct_xorshift(&g_rng, 16); }
static float rndf(void) { return (float)(rnd() & 0xffffff) / 16777216.0f * 2.0f - 1.0f; }


/* everything one model's checks share */
typedef struct pair {
    const char *name;
    ddt_drafter *cpu;
    ddt_cuda_drafter *gpu;
    int32_t H, L, V, n_tl;
    float *h_layers[DDT_DRAFTER_MAX_TARGET_LAYERS]; /* host capture [N_ROWS][H] */
    float *d_layers[DDT_DRAFTER_MAX_TARGET_LAYERS]; /* device copies */
    int32_t *d_rows, *d_m, *d_bonus;                /* device [DDT_MAX_PATH], [1], [1] */
    float *d_logits;                                /* device [L][V]: L-1 rows + one poisoned padding row */
    float *h_cpu, *h_gpu;                           /* host [L][V] */
    double worst;
    double tol, tie; /* the logits' normalised-error bound; a top-two gap below tie * (|top| + 1) is a near tie */
} pair;

/* Fresh random capture rows (scaled per layer so the layers differ in size). */
static void new_features(pair *p) {
    for (int32_t s = 0; s < p->n_tl; s++) {
        float scale = 0.5f + (float)s;
        for (size_t i = 0; i < (size_t)N_ROWS * p->H; i++) p->h_layers[s][i] = rndf() * scale;
        CU(cudaMemcpy(p->d_layers[s], p->h_layers[s], sizeof(float) * (size_t)N_ROWS * p->H, cudaMemcpyHostToDevice));
    }
}

static int32_t gpu_len(const pair *p) {
    int32_t len;
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(&len, ddt_cuda_drafter_len_device(p->gpu), sizeof len, cudaMemcpyDeviceToHost));
    return len;
}
static int32_t gpu_status(const pair *p) {
    int32_t s;
    CU(cudaMemcpy(&s, ddt_cuda_drafter_status_device(p->gpu), sizeof s, cudaMemcpyDeviceToHost));
    return s;
}

/* Append m tokens through append_rows on both (max_m >= m; GPU slots past m hold garbage). */
static void append_rows_both(pair *p, int32_t m, int32_t max_m, bool cpu_too) {
    int32_t rows[DDT_MAX_PATH];
    for (int32_t k = 0; k < DDT_MAX_PATH; k++) rows[k] = k < m ? (int32_t)(rnd() % N_ROWS) : 0x7fffff00 + k;
    CU(cudaMemcpy(p->d_rows, rows, sizeof rows, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(p->d_m, &m, sizeof m, cudaMemcpyHostToDevice));
    OK(ddt_cuda_drafter_append_rows(p->gpu, (const float *const *)p->d_layers, p->d_rows, p->d_m, max_m, NULL, &err_));
    if (cpu_too) OK(ddt_drafter_append_rows(p->cpu, (const float *const *)p->h_layers, N_ROWS, rows, m, &err_));
}

static void append_prefix_both(pair *p, int32_t m) {
    int32_t rows[N_ROWS];
    for (int32_t k = 0; k < m; k++) rows[k] = k;
    OK(ddt_cuda_drafter_append_prefix(p->gpu, (const float *const *)p->d_layers, m, NULL, &err_));
    OK(ddt_drafter_append_rows(p->cpu, (const float *const *)p->h_layers, N_ROWS, rows, m, &err_));
}

/* GPU draft into the poisoned buffer; copies all L rows to h_gpu. */
static void gpu_draft(pair *p, int32_t bonus, ddt_cuda_stream s) {
    CU(cudaMemcpy(p->d_bonus, &bonus, sizeof bonus, cudaMemcpyHostToDevice));
    CU(cudaMemset(p->d_logits, 0xFF, sizeof(float) * (size_t)p->L * p->V));
    OK(ddt_cuda_drafter_draft(p->gpu, p->d_bonus, p->d_logits, s, &err_));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(p->h_gpu, p->d_logits, sizeof(float) * (size_t)p->L * p->V, cudaMemcpyDeviceToHost));
}

static bool padding_intact(const pair *p) {
    const uint32_t *pad = (const uint32_t *)(p->h_gpu + (size_t)(p->L - 1) * p->V);
    for (int32_t i = 0; i < p->V; i++)
        if (pad[i] != 0xFFFFFFFFu) return false;
    return true;
}

/* Draft on both and compare. */
static void draft_compare(pair *p, const char *what) {
    int32_t bonus = (int32_t)(rnd() % (uint32_t)p->V);
    gpu_draft(p, bonus, NULL);
    OK(ddt_drafter_draft(p->cpu, bonus, p->h_cpu, &err_));
    const size_t n = (size_t)(p->L - 1) * p->V;
    char full[96];
    snprintf(full, sizeof full, "%s %s", p->name, what);
    const double e = bo_compare(full, p->h_gpu, p->h_cpu, n, (bo_cmp){.bound = p->tol});
    bool finite = true;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(p->h_gpu[i])) finite = false;
    int mism = 0;
    for (int32_t r = 0; r < p->L - 1; r++) {
        const float *c = p->h_cpu + (size_t)r * p->V, *g = p->h_gpu + (size_t)r * p->V;
        int32_t ac = 0, ag = 0;
        for (int32_t v = 1; v < p->V; v++) {
            if (c[v] > c[ac]) ac = v;
            if (g[v] > g[ag]) ag = v;
        }
        if (ac == ag) continue;
        float second = -INFINITY;
        for (int32_t v = 0; v < p->V; v++)
            if (v != ac && c[v] > second) second = c[v];
        if (c[ac] - second > (float)p->tie * (fabsf(c[ac]) + 1.0f)) mism++;
        else printf("    (%s row %d: near tie %g vs %g, argmax %d vs %d not counted)\n", what, r, c[ac], second, ac, ag);
    }
    if (e > p->worst) p->worst = e;
    printf("  %-14s %-34s len %3d bonus %5d: err %.3g%s\n", p->name, what, ddt_drafter_len(p->cpu), bonus, e,
           mism ? " ARGMAX MISMATCH" : "");
    CHECK(finite, "%s %s: non-finite GPU logits", p->name, what);
    CHECK(mism == 0, "%s %s: argmax differs in %d rows", p->name, what, mism);
    CHECK(padding_intact(p), "%s %s: logits padding row was written", p->name, what);
    CHECK(gpu_len(p) == ddt_drafter_len(p->cpu), "%s %s: GPU len %d, CPU len %d", p->name, what, gpu_len(p),
          ddt_drafter_len(p->cpu));
}

/* ------------------------------------------------------------------ chunking */

/* Logits (host copy) after reset + `how` on the same 23 capture rows 0..22 and a fixed bonus. */
static void chunked(pair *p, int how, int32_t bonus, float *out) {
    OK(ddt_cuda_drafter_reset(p->gpu, NULL, &err_));
    int32_t rows[DDT_MAX_PATH], m;
    for (int32_t k = 0; k < DDT_MAX_PATH; k++) rows[k] = -1000 - k; /* garbage past m */
    switch (how) {
    case 0: /* one append of 23 with max_m 32 */
        for (int32_t k = 0; k < 23; k++) rows[k] = k;
        m = 23;
        CU(cudaMemcpy(p->d_rows, rows, sizeof rows, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(p->d_m, &m, sizeof m, cudaMemcpyHostToDevice));
        OK(ddt_cuda_drafter_append_rows(p->gpu, (const float *const *)p->d_layers, p->d_rows, p->d_m, 32, NULL, &err_));
        break;
    case 1: /* 7 then 16, exact max_m */
        for (int part = 0; part < 2; part++) {
            int32_t first = part ? 7 : 0;
            m = part ? 16 : 7;
            for (int32_t k = 0; k < DDT_MAX_PATH; k++) rows[k] = k < m ? first + k : -1000 - k;
            CU(cudaMemcpy(p->d_rows, rows, sizeof rows, cudaMemcpyHostToDevice));
            CU(cudaMemcpy(p->d_m, &m, sizeof m, cudaMemcpyHostToDevice));
            OK(ddt_cuda_drafter_append_rows(p->gpu, (const float *const *)p->d_layers, p->d_rows, p->d_m, m, NULL,
                                            &err_));
        }
        break;
    case 2: /* a prefix of 23 */
        OK(ddt_cuda_drafter_append_prefix(p->gpu, (const float *const *)p->d_layers, 23, NULL, &err_));
        break;
    default: { /* a prefix of 7, then rows 7..22 */
        OK(ddt_cuda_drafter_append_prefix(p->gpu, (const float *const *)p->d_layers, 7, NULL, &err_));
        for (int32_t k = 0; k < DDT_MAX_PATH; k++) rows[k] = k < 16 ? 7 + k : -1000 - k;
        m = 16;
        CU(cudaMemcpy(p->d_rows, rows, sizeof rows, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(p->d_m, &m, sizeof m, cudaMemcpyHostToDevice));
        OK(ddt_cuda_drafter_append_rows(p->gpu, (const float *const *)p->d_layers, p->d_rows, p->d_m, 31, NULL, &err_));
    }
    }
    gpu_draft(p, bonus, NULL);
    CHECK(gpu_len(p) == 23, "%s chunking %d: len %d", p->name, how, gpu_len(p));
    memcpy(out, p->h_gpu, sizeof(float) * (size_t)p->L * p->V);
}

static void test_chunking(pair *p) {
    size_t n = (size_t)p->L * p->V;
    float *ref = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    int32_t bonus = (int32_t)(rnd() % (uint32_t)p->V);
    chunked(p, 0, bonus, ref);
    static const char *const names[] = {"23", "7 + 16", "prefix 23", "prefix 7 + rows 16"};
    for (int how = 1; how < 4; how++) {
        chunked(p, how, bonus, got);
        bool same = !memcmp(ref, got, sizeof(float) * n);
        printf("  %-14s chunking %-20s vs one append of 23: %s\n", p->name, names[how], same ? "bitwise equal" : "DIFFER");
        CHECK(same, "%s: appending as %s changes the logits", p->name, names[how]);
    }
    chunked(p, 0, bonus, got);
    CHECK(!memcmp(ref, got, sizeof(float) * n), "%s: the same appends + draft twice differ", p->name);
    free(ref);
    free(got);
}

/* ------------------------------------------------------------------ CUDA graph */

/* reset, prefix 23, then twice (append_rows of 7 tokens, draft): eagerly on the
 * legacy stream and as a graph replayed twice; both drafts must match bitwise. */
static void test_graph(pair *p) {
    size_t n = (size_t)p->L * p->V;
    float *eager = malloc(sizeof(float) * n * 2), *graph = malloc(sizeof(float) * n * 2);
    int32_t rows[DDT_MAX_PATH], m = 7, bonus = (int32_t)(rnd() % (uint32_t)p->V);
    for (int32_t k = 0; k < DDT_MAX_PATH; k++) rows[k] = k < m ? (int32_t)(rnd() % N_ROWS) : 0x7fffff00;
    CU(cudaMemcpy(p->d_rows, rows, sizeof rows, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(p->d_m, &m, sizeof m, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(p->d_bonus, &bonus, sizeof bonus, cudaMemcpyHostToDevice));

    OK(ddt_cuda_drafter_reset(p->gpu, NULL, &err_));
    OK(ddt_cuda_drafter_append_prefix(p->gpu, (const float *const *)p->d_layers, 23, NULL, &err_));
    for (int rep = 0; rep < 2; rep++) {
        OK(ddt_cuda_drafter_append_rows(p->gpu, (const float *const *)p->d_layers, p->d_rows, p->d_m, 32, NULL, &err_));
        OK(ddt_cuda_drafter_draft(p->gpu, p->d_bonus, p->d_logits, NULL, &err_));
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(eager + rep * n, p->d_logits, sizeof(float) * (size_t)(p->L - 1) * p->V,
                      cudaMemcpyDeviceToHost));
    }

    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    OK(ddt_cuda_drafter_reset(p->gpu, (ddt_cuda_stream)s, &err_));
    OK(ddt_cuda_drafter_append_prefix(p->gpu, (const float *const *)p->d_layers, 23, (ddt_cuda_stream)s, &err_));
    CU(cudaStreamSynchronize(s));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    ddt_error e1, e2;
    ddt_status st1 = ddt_cuda_drafter_append_rows(p->gpu, (const float *const *)p->d_layers, p->d_rows, p->d_m, 32,
                                                  (ddt_cuda_stream)s, &e1);
    ddt_status st2 = ddt_cuda_drafter_draft(p->gpu, p->d_bonus, p->d_logits, (ddt_cuda_stream)s, &e2);
    cudaError_t ce = cudaStreamEndCapture(s, &g);
    CHECK(st1 == DDT_OK, "%s: append_rows under capture: %s", p->name, e1.msg);
    CHECK(st2 == DDT_OK, "%s: draft under capture: %s", p->name, e2.msg);
    CHECK(ce == cudaSuccess, "%s: graph capture: %s", p->name, cudaGetErrorString(ce));
    if (st1 == DDT_OK && st2 == DDT_OK && ce == cudaSuccess) {
        CU(cudaGraphInstantiate(&ge, g, 0));
        for (int rep = 0; rep < 2; rep++) {
            CU(cudaMemsetAsync(p->d_logits, 0xFF, sizeof(float) * n, s));
            CU(cudaGraphLaunch(ge, s));
            CU(cudaStreamSynchronize(s));
            CU(cudaMemcpy(graph + rep * n, p->d_logits, sizeof(float) * (size_t)(p->L - 1) * p->V,
                          cudaMemcpyDeviceToHost));
        }
        size_t rowb = sizeof(float) * (size_t)(p->L - 1) * p->V;
        bool same = !memcmp(eager, graph, rowb) && !memcmp(eager + n, graph + n, rowb);
        bool moved = memcmp(eager, eager + n, rowb) != 0;
        printf("  %-14s graph of append_rows(7) + draft, replayed twice: %s (len %d)\n", p->name,
               same ? "bitwise equal to eager" : "DIFFERS", gpu_len(p));
        CHECK(same, "%s: graph replay differs from eager calls", p->name);
        CHECK(moved, "%s: second replay drafted the same as the first (len not advanced?)", p->name);
        CHECK(gpu_len(p) == 23 + 14, "%s: len after two replays %d", p->name, gpu_len(p));
        CU(cudaGraphExecDestroy(ge));
        CU(cudaGraphDestroy(g));
    }
    CU(cudaStreamDestroy(s));
    free(eager);
    free(graph);
}

/* ------------------------------------------------------------------ attention op */

/* One attention geometry over one device cache of max_rows rows, as the drafter
 * uses it: one scratch, prepared once and poisoned before that (only the tickets
 * are zeroed), then for each context length len (rows [0, min(len + L, max_rows))
 * read) ddt_dflash_attention vs ddt_cpu_dflash_attention with the cache rows past
 * the read range NaN, the output poisoned before every launch and one padding row
 * after it that must stay poisoned; a second launch (output poisoned again)
 * bitwise equal to the first and the arrival tickets back at 0 after each (a
 * ticket left behind would stop the next launch's merge).  Then one captured
 * graph replayed over the same lengths, len changed on the device between
 * replays, bitwise equal to the eager launches. */
static void attention_lengths(ddt_cpu_pool *pool, int32_t L, int32_t heads, int32_t kv_heads, int32_t hd,
                              int32_t max_rows, int32_t split, const int32_t *lens, int n_lens) {
    const size_t qn = (size_t)L * heads * hd, on = qn + (size_t)heads * hd;
    const size_t row = (size_t)kv_heads * hd, kvn = (size_t)max_rows * row;
    float *q = malloc(sizeof(float) * qn), *k = malloc(sizeof(float) * kvn), *v = malloc(sizeof(float) * kvn);
    float *kn = malloc(sizeof(float) * kvn), *vn = malloc(sizeof(float) * kvn);
    float *ref = malloc(sizeof(float) * qn), *got = malloc(sizeof(float) * on), *again = malloc(sizeof(float) * on);
    float *eager = malloc(sizeof(float) * on * (size_t)n_lens);
    for (size_t i = 0; i < qn; i++) q[i] = rndf();
    for (size_t i = 0; i < kvn; i++) k[i] = rndf(), v[i] = rndf();
    const float scale = 1.0f / sqrtf((float)hd);
    ddt_dflash_attn ga = {.n_block = L, .heads = heads, .kv_heads = kv_heads, .hd = hd, .max_rows = max_rows,
                          .split = split, .scale = scale};
    const size_t scr = (size_t)ddt_dflash_attn_scratch_floats(&ga);
    const size_t splits = ((size_t)max_rows + split - 1) / split;
    const size_t parts = splits * (size_t)L * heads * (hd + 2);
    CHECK(scr > parts, "attention scratch of %zu floats for %zu partial floats", scr, parts);
    const size_t tickets = scr - parts;
    float *dq, *dk, *dv, *dscr, *dout;
    int32_t *dlen;
    CU(cudaMalloc((void **)&dq, sizeof(float) * qn));
    CU(cudaMalloc((void **)&dk, sizeof(float) * kvn));
    CU(cudaMalloc((void **)&dv, sizeof(float) * kvn));
    CU(cudaMalloc((void **)&dscr, sizeof(float) * scr));
    CU(cudaMalloc((void **)&dout, sizeof(float) * on));
    CU(cudaMalloc((void **)&dlen, sizeof(int32_t)));
    CU(cudaMemcpy(dq, q, sizeof(float) * qn, cudaMemcpyHostToDevice));
    bo_poison(dscr, sizeof(float) * scr);
    OK(ddt_dflash_attn_prepare(&ga, dscr, NULL, &err_));
    uint32_t *tk = malloc(sizeof(uint32_t) * (tickets ? tickets : 1));
    char what[160];
    for (int c = 0; c < n_lens; c++) {
        const int32_t len = lens[c];
        const int32_t rows = len + L < max_rows ? len + L : max_rows;
        /* the rows the attention must not read are NaN */
        memcpy(kn, k, sizeof(float) * kvn);
        memcpy(vn, v, sizeof(float) * kvn);
        for (size_t i = (size_t)rows * row; i < kvn; i++) kn[i] = vn[i] = NAN;
        CU(cudaMemcpy(dk, kn, sizeof(float) * kvn, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dv, vn, sizeof(float) * kvn, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dlen, &len, sizeof(int32_t), cudaMemcpyHostToDevice));
        ddt_cpu_dflash_attn ca = {.n_block = L, .heads = heads, .kv_heads = kv_heads, .hd = hd, .scale = scale,
                                  .q = q, .k = k, .v = v, .n_rows = rows, .o = ref};
        ddt_cpu_dflash_attention(pool, &ca);
        snprintf(what, sizeof what, "attention L %d heads %d/%d hd %d len %d (%d rows of %d) split %d", L, heads,
                 kv_heads, hd, len, rows, max_rows, split);
        for (int pass = 0; pass < 2; pass++) {
            bo_poison(dout, sizeof(float) * on);
            OK(ddt_dflash_attention(&ga, dq, dk, dv, dlen, dscr, dout, NULL, &err_));
            CU(cudaMemcpy(pass ? again : got, dout, sizeof(float) * on, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(tk, dscr, sizeof(uint32_t) * tickets, cudaMemcpyDeviceToHost));
            bool zero = true;
            for (size_t i = 0; i < tickets; i++) zero &= tk[i] == 0;
            CHECK(zero, "%s: an arrival ticket is not back at 0 after launch %d", what, pass + 1);
        }
        const double e = bo_compare(what, got, ref, qn, (bo_cmp){.bound = TOL});
        CHECK(!memcmp(got, again, sizeof(float) * on), "%s: a second launch differs", what);
        bool pad = true;
        for (size_t i = qn; i < on; i++) {
            uint32_t u;
            memcpy(&u, &got[i], 4);
            pad &= u == 0xFFFFFFFFu;
        }
        CHECK(pad, "%s: the row after the output was written", what);
        memcpy(eager + (size_t)c * on, got, sizeof(float) * on);
        printf("  %-72s err %.3g\n", what, e);
    }

    /* the graph, over the whole cache finite again: rows past the read range now
     * hold numbers instead of NaN, and the replays must still equal the eager launches */
    memcpy(kn, k, sizeof(float) * kvn);
    memcpy(vn, v, sizeof(float) * kvn);
    CU(cudaMemcpy(dk, kn, sizeof(float) * kvn, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dv, vn, sizeof(float) * kvn, cudaMemcpyHostToDevice));
    cudaStream_t s;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    OK(ddt_dflash_attention(&ga, dq, dk, dv, dlen, dscr, dout, s, &err_));
    CU(cudaStreamEndCapture(s, &g));
    CU(cudaGraphInstantiate(&ge, g, 0));
    bool same = true;
    for (int c = 0; c < n_lens; c++) {
        CU(cudaMemcpyAsync(dlen, &lens[c], sizeof(int32_t), cudaMemcpyHostToDevice, s));
        CU(cudaMemsetAsync(dout, 0xFF, sizeof(float) * on, s));
        CU(cudaGraphLaunch(ge, s));
        CU(cudaMemcpyAsync(got, dout, sizeof(float) * on, cudaMemcpyDeviceToHost, s));
        CU(cudaStreamSynchronize(s));
        if (memcmp(got, eager + (size_t)c * on, sizeof(float) * on)) {
            CHECK(false, "attention L %d heads %d/%d hd %d: graph replay at len %d differs from the eager launch", L,
                  heads, kv_heads, hd, lens[c]);
            same = false;
        }
    }
    if (same) printf("  %-72s bitwise\n", "  graph replays over those lengths");
    CU(cudaGraphExecDestroy(ge));
    CU(cudaGraphDestroy(g));
    CU(cudaStreamDestroy(s));
    CU(cudaFree(dq));
    CU(cudaFree(dk));
    CU(cudaFree(dv));
    CU(cudaFree(dscr));
    CU(cudaFree(dout));
    CU(cudaFree(dlen));
    free(tk);
    free(q);
    free(k);
    free(v);
    free(kn);
    free(vn);
    free(ref);
    free(got);
    free(again);
    free(eager);
}

/* A block of L rows after ctx context rows in a cache of ctx + L + 5 rows. */
static void attention_case(ddt_cpu_pool *pool, int32_t L, int32_t heads, int32_t kv_heads, int32_t hd, int32_t ctx,
                           int32_t split) {
    attention_lengths(pool, L, heads, kv_heads, hd, ctx + L + 5, split, &ctx, 1);
}

static void test_attention_op(bool quick) {
    printf("block attention vs ddt_cpu_dflash_attention:\n");
    ddt_cpu_pool *pool;
    OK(ddt_cpu_pool_create(4, &pool, &err_));
    /* the shipped drafter (pystdlib-dflash): 4 heads over 2 kv heads of 64, a block
     * of 16, the drafter's split of 32; lengths around the tiles and the splits,
     * and at and past the cache's end (rows clamped to max_rows) */
    const int32_t shipped[] = {700, 0, 5, 16, 63, 64, 65, 1024, 1030, 3};
    attention_lengths(pool, 16, 4, 2, 64, 1040, 32, shipped, (int)(sizeof shipped / sizeof shipped[0]));
    /* the same with the split the drafter takes now (ddt_dflash_attn_split_hint: 256
     * at head_dim 64, a tile for each of the kernel's 8 warps): lengths within one
     * split (no merge through the scratch), across it, and warps without a tile */
    CHECK(ddt_dflash_attn_split_hint(64) == 256 && ddt_dflash_attn_split_hint(128) == 128 &&
              ddt_dflash_attn_split_hint(129) == 32,
          "split hints %d / %d / %d", ddt_dflash_attn_split_hint(64), ddt_dflash_attn_split_hint(128),
          ddt_dflash_attn_split_hint(129));
    const int32_t hinted[] = {700, 0, 5, 16, 100, 239, 240, 241, 495, 496, 1024, 1030, 3};
    attention_lengths(pool, 16, 4, 2, 64, 1040, ddt_dflash_attn_split_hint(64), hinted,
                      (int)(sizeof hinted / sizeof hinted[0]));
    attention_lengths(pool, 16, 8, 2, 128, 600, ddt_dflash_attn_split_hint(128), hinted, 9);
    attention_lengths(pool, 7, 6, 3, 40, 600, 200, hinted, 9); /* a split not of whole tiles */
    /* odd shapes: head_dim 40 / 72 / 33 (scalar staging), group 4, group 1, a block
     * of 7 / 5 / 3 (query chunks of 8 not full), splits not whole tiles */
    const int32_t some[] = {0, 9, 40, 100, 250};
    attention_lengths(pool, 7, 6, 3, 40, 300, 32, some, 5);
    attention_lengths(pool, 5, 8, 2, 72, 300, 48, some, 5);
    attention_lengths(pool, 3, 2, 2, 33, 300, 20, some, 5);
    attention_case(pool, 16, 8, 2, 128, 0, 64);    /* empty context: the block alone */
    attention_case(pool, 16, 8, 2, 128, 48, 64);   /* ctx + L = one split exactly */
    attention_case(pool, 16, 8, 8, 128, 211, 64);  /* no GQA, several splits, a partial last one */
    attention_case(pool, 7, 6, 3, 80, 101, 32);    /* odd block, head_dim between register widths */
    attention_case(pool, 5, 4, 1, 1, 33, 32);      /* head_dim 1 */
    attention_case(pool, 3, 2, 1, 33, 9, 1);       /* a split per row */
    attention_case(pool, 4, 4, 2, 512, 70, 32);    /* the largest head_dim */
    attention_case(pool, 4, 8, 2, 200, 90, 32);    /* group 4, head_dim 200 (float4 staging, 4 registers) */
    if (!quick) {
        attention_case(pool, 16, 32, 8, 128, 4000, 64); /* long context: many splits */
        attention_case(pool, 16, 8, 2, 512, 3000, 96);  /* the largest head_dim, many splits of 3 tiles */
    }
    /* shapes the attention refuses: an error, no launch */
    ddt_error e;
    const ddt_dflash_attn bad[] = {
        {.n_block = 16, .heads = 4, .kv_heads = 2, .hd = DDT_DFLASH_MAX_HEAD_DIM + 1, .max_rows = 64, .split = 32,
         .scale = 1.0f},
        {.n_block = 16, .heads = 4, .kv_heads = 3, .hd = 64, .max_rows = 64, .split = 32, .scale = 1.0f},
        {.n_block = 16, .heads = 4, .kv_heads = 2, .hd = 64, .max_rows = 8, .split = 32, .scale = 1.0f},
        {.n_block = 16, .heads = 4, .kv_heads = 2, .hd = 64, .max_rows = 64, .split = 0, .scale = 1.0f},
    };
    float *dummy;
    int32_t *dlen;
    CU(cudaMalloc((void **)&dummy, 64 * sizeof(float)));
    CU(cudaMalloc((void **)&dlen, sizeof(int32_t)));
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(ddt_dflash_attn_scratch_floats(&bad[i]) == 0, "refused attention shape %zu has a scratch size", i);
        CHECK(ddt_dflash_attention(&bad[i], dummy, dummy, dummy, dlen, dummy, dummy, NULL, &e) == DDT_ERR_INVALID,
              "attention shape %zu not refused", i);
        CHECK(ddt_dflash_attn_prepare(&bad[i], dummy, NULL, &e) == DDT_ERR_INVALID,
              "attention prepare of shape %zu not refused", i);
    }
    CU(cudaFree(dummy));
    CU(cudaFree(dlen));
    printf("  refused shapes: %s\n", e.msg);
    ddt_cpu_pool_destroy(pool);
}

/* ------------------------------------------------------------------ q/k norm + RoPE + K/V store */

/* Every value that is NaN (poison) in ref must still be the poison bits in got. */
static size_t poison_written(const float *got, const float *ref, size_t n) {
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &got[i], 4);
        w += isnan(ref[i]) && u != 0xFFFFFFFFu;
    }
    return w;
}

typedef struct prep_case {
    int32_t n, heads, kv_heads, hd; /* heads 0: no queries */
    int32_t pad;                    /* NaN columns after each raw row (and each separate qo row) */
    bool in_place;                  /* qo = q inside the raw rows */
    int32_t len, count, max_count, limit;
    bool count_on_device;
} prep_case;

/* Raw rows [n][2 kvd + qd + pad] = k | v | q | NaN as the drafter's fused
 * product leaves them; a cache of limit rows; a random cos/sin table of limit
 * rows (the kernel reads angles, wherever they come from). */
static void prep_case_run(ddt_cpu_pool *pool, prep_case c) {
    const int32_t hd = c.hd, half = hd / 2, kvd = c.kv_heads * hd, qd = c.heads * hd;
    const int64_t ld = 2 * (int64_t)kvd + qd + c.pad, ldqo = c.in_place ? ld : qd + c.pad;
    const size_t raw_n = (size_t)c.n * ld, qo_n = (size_t)c.n * ldqo, cache_n = (size_t)c.limit * kvd;
    const size_t tab_n = (size_t)c.limit * half;
    float *raw = malloc(sizeof(float) * raw_n), *wq = malloc(sizeof(float) * hd), *wk = malloc(sizeof(float) * hd);
    float *cs = malloc(sizeof(float) * tab_n), *sn = malloc(sizeof(float) * tab_n);
    float *ref_raw = malloc(sizeof(float) * raw_n), *ref_qo = malloc(sizeof(float) * qo_n);
    float *ref_k = malloc(sizeof(float) * cache_n), *ref_v = malloc(sizeof(float) * cache_n);
    float *got = malloc(sizeof(float) * (raw_n > cache_n ? (raw_n > qo_n ? raw_n : qo_n) : (cache_n > qo_n ? cache_n : qo_n)));
    memset(raw, 0xFF, sizeof(float) * raw_n);
    for (int32_t t = 0; t < c.n; t++)
        for (int64_t i = 0; i < 2 * (int64_t)kvd + qd; i++) raw[t * ld + i] = rndf() * 3.0f;
    for (int32_t i = 0; i < hd; i++) wq[i] = 1.0f + 0.5f * rndf(), wk[i] = 1.0f + 0.5f * rndf();
    for (size_t i = 0; i < tab_n; i++) cs[i] = rndf(), sn[i] = rndf();

    /* the CPU side: the twin per row at its own position, the append rule, the V copy */
    const ddt_cpu_vec wqv = {wq, DDT_DTYPE_F32, hd}, wkv = {wk, DDT_DTYPE_F32, hd};
    const float eps = 1e-6f;
    memcpy(ref_raw, raw, sizeof(float) * raw_n);
    memset(ref_qo, 0xFF, sizeof(float) * qo_n);
    memset(ref_k, 0xFF, sizeof(float) * cache_n);
    memset(ref_v, 0xFF, sizeof(float) * cache_n);
    float *qdst = c.in_place ? ref_raw + 2 * kvd : ref_qo;
    const int32_t q_rows = c.heads > 0 ? c.n : 0;
    for (int32_t t = 0; t < q_rows; t++) {
        const int32_t pos = c.len + t;
        const float *src = raw + t * ld + 2 * kvd;
        if (pos < c.limit)
            ddt_cpu_dflash_norm_rope(pool, src, ld, 1, c.heads, hd, &wqv, eps, cs + (size_t)pos * half,
                                     sn + (size_t)pos * half, qdst + t * ldqo, ldqo);
        else
            ddt_cpu_rmsnorm(pool, src, hd, c.heads, hd, &wqv, eps, qdst + t * ldqo, hd);
    }
    const bool fits = c.count >= 0 && c.count <= c.max_count && c.len + c.count <= c.limit;
    for (int32_t t = 0; fits && t < c.count; t++) {
        const size_t r = (size_t)(c.len + t);
        ddt_cpu_dflash_norm_rope(pool, raw + t * ld, ld, 1, c.kv_heads, hd, &wkv, eps, cs + r * half, sn + r * half,
                                 ref_k + r * kvd, kvd);
        memcpy(ref_v + r * kvd, raw + t * ld + kvd, sizeof(float) * kvd);
    }

    float *draw, *dqo, *dwq, *dwk, *dcs, *dsn, *dk, *dv;
    int32_t *dlen, *dcount;
    CU(cudaMalloc((void **)&draw, sizeof(float) * raw_n));
    CU(cudaMalloc((void **)&dqo, sizeof(float) * qo_n));
    CU(cudaMalloc((void **)&dwq, sizeof(float) * hd));
    CU(cudaMalloc((void **)&dwk, sizeof(float) * hd));
    CU(cudaMalloc((void **)&dcs, sizeof(float) * tab_n));
    CU(cudaMalloc((void **)&dsn, sizeof(float) * tab_n));
    CU(cudaMalloc((void **)&dk, sizeof(float) * cache_n));
    CU(cudaMalloc((void **)&dv, sizeof(float) * cache_n));
    CU(cudaMalloc((void **)&dlen, sizeof(int32_t)));
    CU(cudaMalloc((void **)&dcount, sizeof(int32_t)));
    CU(cudaMemcpy(draw, raw, sizeof(float) * raw_n, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dwq, wq, sizeof(float) * hd, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dwk, wk, sizeof(float) * hd, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dcs, cs, sizeof(float) * tab_n, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dsn, sn, sizeof(float) * tab_n, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dlen, &c.len, sizeof(int32_t), cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dcount, &c.count, sizeof(int32_t), cudaMemcpyHostToDevice));
    bo_poison(dqo, sizeof(float) * qo_n);
    bo_poison(dk, sizeof(float) * cache_n);
    bo_poison(dv, sizeof(float) * cache_n);
    ddt_dflash_qkv p = {.q = c.heads > 0 ? draw + 2 * kvd : NULL, .ldq = ld, .qo = c.in_place ? draw + 2 * kvd : dqo,
                        .ldqo = ldqo, .q_norm = dwq, .heads = c.heads, .k = draw, .ldk = ld, .v = draw + kvd,
                        .ldv = ld, .k_norm = dwk, .kv_heads = c.kv_heads, .n = c.n, .hd = hd, .eps = eps,
                        .count_dev = c.count_on_device ? dcount : NULL, .count_host = c.count,
                        .max_count = c.max_count, .len = dlen, .limit = c.limit, .cos_t = dcs, .sin_t = dsn,
                        .k_cache = dk, .v_cache = dv};
    OK(ddt_dflash_qkv_prep(&p, NULL, &err_));
    CU(cudaDeviceSynchronize());

    char what[160];
    snprintf(what, sizeof what, "qkv_prep n %d heads %d/%d hd %d pad %d%s len %d count %d%s max %d limit %d", c.n,
             c.heads, c.kv_heads, hd, c.pad, c.in_place ? " in place" : "", c.len, c.count,
             c.count_on_device ? " (device)" : "", c.max_count, c.limit);
    double eq = 0.0, ek = 0.0;
    /* the raw rows: q normed in place (or untouched), k | v and the padding untouched */
    CU(cudaMemcpy(got, draw, sizeof(float) * raw_n, cudaMemcpyDeviceToHost));
    if (c.in_place) eq = bo_compare(what, got, ref_raw, raw_n, (bo_cmp){.bound = 1e-6});
    else bo_compare(what, got, ref_raw, raw_n, (bo_cmp){.bitwise = true});
    CHECK(poison_written(got, ref_raw, raw_n) == 0, "%s: raw padding written", what);
    if (!c.in_place) {
        CU(cudaMemcpy(got, dqo, sizeof(float) * qo_n, cudaMemcpyDeviceToHost));
        eq = bo_compare(what, got, ref_qo, qo_n, (bo_cmp){.bound = 1e-6});
        CHECK(poison_written(got, ref_qo, qo_n) == 0, "%s: query padding (or queries with no q) written", what);
    }
    CU(cudaMemcpy(got, dk, sizeof(float) * cache_n, cudaMemcpyDeviceToHost));
    ek = bo_compare(what, got, ref_k, cache_n, (bo_cmp){.bound = 1e-6});
    CHECK(poison_written(got, ref_k, cache_n) == 0, "%s: K cache rows outside the append written", what);
    CU(cudaMemcpy(got, dv, sizeof(float) * cache_n, cudaMemcpyDeviceToHost));
    bo_compare(what, got, ref_v, cache_n, (bo_cmp){.bitwise = true});
    CHECK(poison_written(got, ref_v, cache_n) == 0, "%s: V cache rows outside the append written", what);
    printf("  %-100s q err %.3g, k err %.3g%s\n", what, eq, ek, fits ? "" : " (append refused)");

    cudaFree(draw), cudaFree(dqo), cudaFree(dwq), cudaFree(dwk), cudaFree(dcs), cudaFree(dsn), cudaFree(dk);
    cudaFree(dv), cudaFree(dlen), cudaFree(dcount);
    free(raw), free(wq), free(wk), free(cs), free(sn), free(ref_raw), free(ref_qo), free(ref_k), free(ref_v);
    free(got);
}

static void test_qkv_prep_op(void) {
    printf("q/k norm + RoPE + K/V store vs ddt_cpu_dflash_norm_rope:\n");
    ddt_cpu_pool *pool;
    OK(ddt_cpu_pool_create(2, &pool, &err_));
    /* the shipped drafter's shape: a draft (count L on the host, limit = cap) */
    prep_case_run(pool, (prep_case){.n = 16, .heads = 8, .kv_heads = 2, .hd = 64, .len = 100, .count = 16,
                                    .max_count = 16, .limit = 227});
    /* odd everything: 3 pairs per head, no GQA, a row start off 16 bytes */
    prep_case_run(pool, (prep_case){.n = 9, .heads = 5, .kv_heads = 5, .hd = 6, .pad = 1, .len = 3, .count = 9,
                                    .max_count = 9, .limit = 40, .count_on_device = true});
    /* an append: no queries, count on the device below n (rows past it not stored), head_dim 2 */
    prep_case_run(pool, (prep_case){.n = 5, .heads = 0, .kv_heads = 1, .hd = 2, .pad = 3, .len = 0, .count = 3,
                                    .max_count = 5, .limit = 11, .count_on_device = true});
    /* GQA 6/3, head_dim 80 (two register widths), queries in place */
    prep_case_run(pool, (prep_case){.n = 7, .heads = 6, .kv_heads = 3, .hd = 80, .pad = 2, .in_place = true,
                                    .len = 5, .count = 7, .max_count = 7, .limit = 40});
    /* the largest head_dim (8 pairs per lane), in place */
    prep_case_run(pool, (prep_case){.n = 3, .heads = 2, .kv_heads = 1, .hd = 512, .in_place = true, .len = 9,
                                    .count = 3, .max_count = 3, .limit = 12, .count_on_device = true});
    /* refused by the fit rule (len + count > limit): no K/V; query rows past the limit normed, not rotated */
    prep_case_run(pool, (prep_case){.n = 4, .heads = 3, .kv_heads = 3, .hd = 34, .pad = 1, .len = 38, .count = 4,
                                    .max_count = 4, .limit = 40});
    /* refused by max_count (count on the device above it) */
    prep_case_run(pool, (prep_case){.n = 6, .heads = 0, .kv_heads = 2, .hd = 128, .len = 1, .count = 6,
                                    .max_count = 5, .limit = 30, .count_on_device = true});
    ddt_cpu_pool_destroy(pool);
}

/* ------------------------------------------------------------------ several layers' K/V store */

typedef struct prep_layers_case {
    int32_t layers, n, kv_heads, hd;
    int32_t gap; /* NaN columns after each layer's k | v (and one after the row) */
    int32_t len, count, max_count, limit;
    bool count_on_device;
} prep_layers_case;

/* Is every float of p[0..n) the poison bits (0xFFFFFFFF)? */
static bool all_poison(const float *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &p[i], 4);
        if (u != 0xFFFFFFFFu) return false;
    }
    return true;
}

/* What both qkv_prep tests store from, on the device: raw rows [n][layers * lc +
 * 1] holding layer i's k | v at columns i * lc (lc = 2 kvd + gap), fresh random
 * values, NaN in the gaps; each layer's random k_norm; rope tables; and a
 * poisoned cache area dcache [2 sets][layers][2 (K, V)][limit rows x kvd]. */
typedef struct {
    int64_t lc, ld;
    size_t raw_n, cache_n, tab_n;
    float *draw, *dwk, *dcs, *dsn, *dcache;
} prep_inputs;

static prep_inputs prep_inputs_make(const prep_layers_case *c) {
    const int32_t hd = c->hd, half = hd / 2, kvd = c->kv_heads * hd, L = c->layers;
    prep_inputs in;
    in.lc = 2 * (int64_t)kvd + c->gap;
    in.ld = L * in.lc + 1;
    in.raw_n = (size_t)c->n * in.ld, in.cache_n = (size_t)c->limit * kvd, in.tab_n = (size_t)c->limit * half;
    float *raw = malloc(sizeof(float) * in.raw_n), *wk = malloc(sizeof(float) * (size_t)L * hd);
    float *cs = malloc(sizeof(float) * in.tab_n), *sn = malloc(sizeof(float) * in.tab_n);
    memset(raw, 0xFF, sizeof(float) * in.raw_n);
    for (int32_t t = 0; t < c->n; t++)
        for (int32_t l = 0; l < L; l++)
            for (int64_t i = 0; i < 2 * (int64_t)kvd; i++) raw[t * in.ld + l * in.lc + i] = rndf() * 3.0f;
    for (int32_t i = 0; i < L * hd; i++) wk[i] = 1.0f + 0.5f * rndf();
    for (size_t i = 0; i < in.tab_n; i++) cs[i] = rndf(), sn[i] = rndf();
    CU(cudaMalloc((void **)&in.draw, sizeof(float) * in.raw_n));
    CU(cudaMalloc((void **)&in.dwk, sizeof(float) * (size_t)L * hd));
    CU(cudaMalloc((void **)&in.dcs, sizeof(float) * in.tab_n));
    CU(cudaMalloc((void **)&in.dsn, sizeof(float) * in.tab_n));
    CU(cudaMalloc((void **)&in.dcache, sizeof(float) * 4 * (size_t)L * in.cache_n));
    CU(cudaMemcpy(in.draw, raw, sizeof(float) * in.raw_n, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(in.dwk, wk, sizeof(float) * (size_t)L * hd, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(in.dcs, cs, sizeof(float) * in.tab_n, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(in.dsn, sn, sizeof(float) * in.tab_n, cudaMemcpyHostToDevice));
    bo_poison(in.dcache, sizeof(float) * 4 * (size_t)L * in.cache_n);
    free(raw), free(wk), free(cs), free(sn);
    return in;
}

static void prep_inputs_free(prep_inputs *in) {
    cudaFree(in->draw), cudaFree(in->dwk), cudaFree(in->dcs), cudaFree(in->dsn), cudaFree(in->dcache);
}

/* The drafter's append store (prep_inputs: each layer its own poisoned K and V
 * caches of limit rows).  One ddt_dflash_qkv_prep with `layers` against one one-layer
 * launch per layer into a second set of caches: every cache bitwise equal, the
 * appended rows [len, len + count) written and every other row still poison
 * (all of them when the append rule refuses). */
static void prep_layers_run(prep_layers_case c) {
    const int32_t hd = c.hd, kvd = c.kv_heads * hd, L = c.layers;
    prep_inputs in = prep_inputs_make(&c);
    const int64_t lc = in.lc, ld = in.ld;
    const size_t cache_n = in.cache_n;
    float *const draw = in.draw, *const dwk = in.dwk, *const dcs = in.dcs, *const dsn = in.dsn;
    float *const dcache = in.dcache; /* [2 (one, many)][L][2 (K, V)][cache_n] */
    float *one = malloc(sizeof(float) * cache_n), *many = malloc(sizeof(float) * cache_n);
    int32_t *dlen, *dcount;
    CU(cudaMalloc((void **)&dlen, sizeof(int32_t)));
    CU(cudaMalloc((void **)&dcount, sizeof(int32_t)));
    CU(cudaMemcpy(dlen, &c.len, sizeof(int32_t), cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dcount, &c.count, sizeof(int32_t), cudaMemcpyHostToDevice));
#define CACHE(set, l, kv) (dcache + ((((size_t)(set) * L + (size_t)(l)) * 2 + (kv)) * cache_n))

    const ddt_dflash_qkv base = {.ldk = ld, .ldv = ld, .kv_heads = c.kv_heads, .n = c.n, .hd = hd, .eps = 1e-6f,
                                 .count_dev = c.count_on_device ? dcount : NULL, .count_host = c.count,
                                 .max_count = c.max_count, .len = dlen, .limit = c.limit, .cos_t = dcs,
                                 .sin_t = dsn};
    for (int32_t l = 0; l < L; l++) { /* the reference: a launch per layer, as the append made them */
        ddt_dflash_qkv p = base;
        p.k = draw + l * lc;
        p.v = p.k + kvd;
        p.k_norm = dwk + (size_t)l * hd;
        p.k_cache = CACHE(0, l, 0);
        p.v_cache = CACHE(0, l, 1);
        OK(ddt_dflash_qkv_prep(&p, NULL, &err_));
    }
    ddt_dflash_qkv p = base;
    p.k = draw;
    p.v = draw + kvd;
    p.layers = L;
    p.layer_cols = lc;
    for (int32_t l = 0; l < L; l++) {
        p.k_norms[l] = dwk + (size_t)l * hd;
        p.k_caches[l] = CACHE(1, l, 0);
        p.v_caches[l] = CACHE(1, l, 1);
    }
    OK(ddt_dflash_qkv_prep(&p, NULL, &err_));
    CU(cudaDeviceSynchronize());

    const bool fits = c.count >= 0 && c.count <= c.max_count && c.len + c.count <= c.limit;
    const int32_t r0 = fits ? c.len : 0, r1 = fits ? c.len + c.count : 0; /* rows the append writes */
    char what[160];
    snprintf(what, sizeof what, "qkv_prep %d layers n %d kv heads %d hd %d gap %d len %d count %d%s max %d limit %d",
             L, c.n, c.kv_heads, hd, c.gap, c.len, c.count, c.count_on_device ? " (device)" : "", c.max_count,
             c.limit);
    bool same = true;
    for (int32_t l = 0; l < L; l++)
        for (int kv = 0; kv < 2; kv++) {
            CU(cudaMemcpy(one, CACHE(0, l, kv), sizeof(float) * cache_n, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(many, CACHE(1, l, kv), sizeof(float) * cache_n, cudaMemcpyDeviceToHost));
            const bool eq = !memcmp(one, many, sizeof(float) * cache_n);
            CHECK(eq, "%s: layer %d %c cache differs from the one-layer launch", what, l, kv ? 'V' : 'K');
            same &= eq;
            bool written = true;
            for (int32_t r = r0; r < r1; r++)
                for (int32_t i = 0; i < kvd; i++) {
                    uint32_t u;
                    memcpy(&u, &many[(size_t)r * kvd + i], 4);
                    written &= u != 0xFFFFFFFFu && !isnan(many[(size_t)r * kvd + i]);
                }
            CHECK(written, "%s: layer %d %c cache rows %d..%d not all written", what, l, kv ? 'V' : 'K', r0, r1 - 1);
            CHECK(all_poison(many, (size_t)r0 * kvd) && all_poison(many + (size_t)r1 * kvd, cache_n - (size_t)r1 * kvd),
                  "%s: layer %d %c cache rows outside the append written", what, l, kv ? 'V' : 'K');
        }
#undef CACHE
    printf("  %-100s %s%s\n", what, same ? "bitwise the one-layer launches" : "DIFFERS", fits ? "" : " (append refused)");

    prep_inputs_free(&in);
    cudaFree(dlen), cudaFree(dcount);
    free(one), free(many);
}

static void test_qkv_prep_layers_op(void) {
    printf("several layers' K/V store in one qkv_prep vs a launch per layer:\n");
    /* the shipped drafter's append: 4 layers of 2 kv heads x 64, a path of 16 (count on the device) */
    prep_layers_run((prep_layers_case){.layers = 4, .n = 16, .kv_heads = 2, .hd = 64, .len = 100, .count = 13,
                                       .max_count = 16, .limit = 211, .count_on_device = true});
    /* odd everything: 5 layers, 3 kv heads of 34, NaN gaps between the layers' slices */
    prep_layers_run((prep_layers_case){.layers = 5, .n = 7, .kv_heads = 3, .hd = 34, .gap = 3, .len = 4,
                                       .count = 7, .max_count = 7, .limit = 23});
    /* the most layers a launch takes, the largest head_dim */
    prep_layers_run((prep_layers_case){.layers = DDT_DFLASH_MAX_KV_LAYERS, .n = 5, .kv_heads = 1, .hd = 512,
                                       .gap = 1, .len = 0, .count = 3, .max_count = 5, .limit = 9,
                                       .count_on_device = true});
    /* one layer through the arrays, head_dim 6 (register width 1 with lanes idle) */
    prep_layers_run((prep_layers_case){.layers = 1, .n = 9, .kv_heads = 2, .hd = 6, .gap = 2, .len = 2,
                                       .count = 9, .max_count = 9, .limit = 13});
    /* refused by the fit rule, and by max_count: nothing written in any layer */
    prep_layers_run((prep_layers_case){.layers = 3, .n = 6, .kv_heads = 2, .hd = 128, .len = 20, .count = 6,
                                       .max_count = 6, .limit = 24});
    prep_layers_run((prep_layers_case){.layers = 2, .n = 4, .kv_heads = 1, .hd = 80, .gap = 5, .len = 1,
                                       .count = 4, .max_count = 3, .limit = 30, .count_on_device = true});

    /* arguments it refuses: too many layers, queries with layers, a NULL layer cache */
    float *dummy;
    int32_t *dlen;
    CU(cudaMalloc((void **)&dummy, 64 * sizeof(float)));
    CU(cudaMalloc((void **)&dlen, sizeof(int32_t)));
    ddt_dflash_qkv p = {.k = dummy, .ldk = 8, .v = dummy, .ldv = 8, .kv_heads = 1, .n = 1, .hd = 2, .eps = 1e-6f,
                        .count_host = 1, .max_count = 1, .len = dlen, .limit = 4, .cos_t = dummy, .sin_t = dummy,
                        .layers = 2, .layer_cols = 4};
    for (int32_t l = 0; l < 2; l++) p.k_norms[l] = dummy, p.k_caches[l] = dummy, p.v_caches[l] = dummy;
    ddt_error e;
    ddt_dflash_qkv bad = p;
    bad.layers = DDT_DFLASH_MAX_KV_LAYERS + 1;
    CHECK(ddt_dflash_qkv_prep(&bad, NULL, &e) == DDT_ERR_INVALID, "qkv_prep: %d layers accepted", bad.layers);
    bad = p;
    bad.q = dummy, bad.qo = dummy, bad.q_norm = dummy, bad.heads = 1, bad.ldq = 8, bad.ldqo = 8;
    CHECK(ddt_dflash_qkv_prep(&bad, NULL, &e) == DDT_ERR_INVALID, "qkv_prep: queries with 2 layers accepted");
    bad = p;
    bad.v_caches[1] = NULL;
    CHECK(ddt_dflash_qkv_prep(&bad, NULL, &e) == DDT_ERR_INVALID, "qkv_prep: a NULL layer cache accepted");
    CU(cudaDeviceSynchronize());
    CU(cudaFree(dummy));
    CU(cudaFree(dlen));
    printf("  refused arguments: %s\n", e.msg);
}

/* ------------------------------------------------------------------ the append's folded advance */

/*
 * The append's K/V store with its advance folded in (advance_ticket set: one
 * launch) against the unfused sequence (the same store without the ticket, then
 * ref_dflash_advance), each on its own poisoned caches, len and status word, from
 * the same state: for `steps` appends in a row (the count on the device, counts[k]
 * at step k, or c.count from the host), eagerly or as one captured graph replayed
 * once per step, after every step the caches bitwise equal, len and status equal
 * to each other and to the host rule (len += count when the append fits, else
 * the status set, sticky; status0 is the status word before the first append) and
 * the ticket back at 0.
 */
static void prep_advance_run(prep_layers_case c, const int32_t *counts, int steps, int32_t status0, bool graph) {
    const int32_t hd = c.hd, kvd = c.kv_heads * hd, L = c.layers;
    prep_inputs in = prep_inputs_make(&c);
    const int64_t lc = in.lc, ld = in.ld;
    const size_t cache_n = in.cache_n;
    float *const draw = in.draw, *const dwk = in.dwk, *const dcs = in.dcs, *const dsn = in.dsn;
    float *const dcache = in.dcache; /* [2 (unfused, fused)][L][2 (K, V)][cache_n] */
    float *one = malloc(sizeof(float) * cache_n), *fused = malloc(sizeof(float) * cache_n);
    int32_t *dstate, *dcount; /* dstate: len, status of the unfused run, then of the fused one */
    uint32_t *dticket;
    CU(cudaMalloc((void **)&dstate, 4 * sizeof(int32_t)));
    CU(cudaMalloc((void **)&dcount, sizeof(int32_t)));
    CU(cudaMalloc((void **)&dticket, sizeof(uint32_t)));
    const int32_t state0[4] = {c.len, status0, c.len, status0};
    CU(cudaMemcpy(dstate, state0, sizeof state0, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dcount, &c.count, sizeof(int32_t), cudaMemcpyHostToDevice));
    CU(cudaMemset(dticket, 0, sizeof(uint32_t)));
    CU(cudaDeviceSynchronize()); /* before the non-blocking stream reads any of it */
#define CACHE(set, l, kv) (dcache + ((((size_t)(set) * L + (size_t)(l)) * 2 + (kv)) * cache_n))

    ddt_dflash_qkv p[2];
    for (int set = 0; set < 2; set++) {
        p[set] = (ddt_dflash_qkv){.k = draw, .ldk = ld, .v = draw + kvd, .ldv = ld, .kv_heads = c.kv_heads,
                                  .n = c.n, .hd = hd, .eps = 1e-6f, .count_dev = c.count_on_device ? dcount : NULL,
                                  .count_host = c.count, .max_count = c.max_count, .len = dstate + 2 * set,
                                  .limit = c.limit, .cos_t = dcs, .sin_t = dsn, .layers = L, .layer_cols = lc};
        for (int32_t l = 0; l < L; l++) {
            p[set].k_norms[l] = dwk + (size_t)l * hd;
            p[set].k_caches[l] = CACHE(set, l, 0);
            p[set].v_caches[l] = CACHE(set, l, 1);
        }
    }
    p[1].advance_ticket = dticket;
    p[1].advance_len = dstate + 2;
    p[1].advance_status = dstate + 3;

    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    if (graph) {
        CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        ddt_error e;
        const ddt_status st = ddt_dflash_qkv_prep(&p[1], (ddt_cuda_stream)s, &e);
        CU(cudaStreamEndCapture(s, &g));
        CHECK(st == DDT_OK, "qkv_prep with its advance under capture: %s", e.msg);
        if (st != DDT_OK) exit(1);
        CU(cudaGraphInstantiate(&ge, g, 0));
    }
    int32_t len_h = c.len, status_h = status0;
    bool same = true;
    for (int step = 0; step < steps; step++) {
        const int32_t count = c.count_on_device ? counts[step] : c.count;
        CU(cudaMemcpyAsync(dcount, &count, sizeof count, cudaMemcpyHostToDevice, s));
        /* the unfused sequence, then the fused launch (or its graph), on one stream */
        OK(ddt_dflash_qkv_prep(&p[0], (ddt_cuda_stream)s, &err_));
        CU(ref_dflash_advance(dstate, dstate + 1, p[0].count_dev, c.count, c.max_count, c.limit, s));
        if (graph) CU(cudaGraphLaunch(ge, s));
        else OK(ddt_dflash_qkv_prep(&p[1], (ddt_cuda_stream)s, &err_));
        CU(cudaStreamSynchronize(s));
        const bool fits = count >= 0 && count <= c.max_count && (int64_t)len_h + count <= c.limit;
        if (fits) len_h += count;
        else status_h = DDT_DFLASH_BAD_APPEND;

        int32_t state[4];
        uint32_t ticket;
        CU(cudaMemcpy(state, dstate, sizeof state, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(&ticket, dticket, sizeof ticket, cudaMemcpyDeviceToHost));
        char what[200];
        snprintf(what, sizeof what,
                 "folded advance %s %d/%d: %d layers n %d kv heads %d hd %d count %d%s max %d limit %d status0 %d",
                 graph ? "graph replay" : "eager", step + 1, steps, L, c.n, c.kv_heads, hd, count,
                 c.count_on_device ? " (device)" : "", c.max_count, c.limit, status0);
        for (int32_t l = 0; l < L; l++)
            for (int kv = 0; kv < 2; kv++) {
                CU(cudaMemcpy(one, CACHE(0, l, kv), sizeof(float) * cache_n, cudaMemcpyDeviceToHost));
                CU(cudaMemcpy(fused, CACHE(1, l, kv), sizeof(float) * cache_n, cudaMemcpyDeviceToHost));
                const bool eq = !memcmp(one, fused, sizeof(float) * cache_n);
                CHECK(eq, "%s: layer %d %c cache differs from the unfused sequence", what, l, kv ? 'V' : 'K');
                same &= eq;
            }
        CHECK(state[2] == state[0] && state[3] == state[1], "%s: len %d status %d, unfused len %d status %d", what,
              state[2], state[3], state[0], state[1]);
        CHECK(state[0] == len_h && state[1] == status_h, "%s: unfused len %d status %d, the rule says %d, %d", what,
              state[0], state[1], len_h, status_h);
        CHECK(ticket == 0, "%s: ticket left at %u", what, ticket);
        same &= state[2] == state[0] && state[3] == state[1] && ticket == 0;
        printf("  %-118s %s (len %d status %d)\n", what, same ? "equal" : "DIFFERS", state[2], state[3]);
    }
#undef CACHE
    if (graph) {
        CU(cudaGraphExecDestroy(ge));
        CU(cudaGraphDestroy(g));
    }
    CU(cudaStreamDestroy(s));
    prep_inputs_free(&in);
    cudaFree(dstate), cudaFree(dcount), cudaFree(dticket);
    free(one), free(fused);
}

static void test_qkv_prep_advance_op(void) {
    printf("the append's qkv_prep with its advance folded in vs qkv_prep + the one-thread advance:\n");
    /* the shipped drafter's append (4 layers, 2 kv heads x 64, a path slot of 16, the count on the device):
       good appends, one past max_count, one past the limit; then 5 in a row */
    const int32_t one13[1] = {13}, over_max[1] = {17}, neg[1] = {-1}, zero[1] = {0};
    prep_advance_run((prep_layers_case){.layers = 4, .n = 16, .kv_heads = 2, .hd = 64, .len = 100, .count = 13,
                                        .max_count = 16, .limit = 211, .count_on_device = true},
                     one13, 1, DDT_DFLASH_OK, false);
    prep_advance_run((prep_layers_case){.layers = 4, .n = 16, .kv_heads = 2, .hd = 64, .len = 100, .count = 13,
                                        .max_count = 16, .limit = 211, .count_on_device = true},
                     over_max, 1, DDT_DFLASH_OK, false);
    prep_advance_run((prep_layers_case){.layers = 4, .n = 16, .kv_heads = 2, .hd = 64, .len = 200, .count = 13,
                                        .max_count = 16, .limit = 211, .count_on_device = true},
                     one13, 1, DDT_DFLASH_OK, false); /* 200 + 13 > 211 */
    prep_advance_run((prep_layers_case){.layers = 2, .n = 5, .kv_heads = 1, .hd = 6, .len = 3, .count = 0,
                                        .max_count = 5, .limit = 20, .count_on_device = true},
                     neg, 1, DDT_DFLASH_OK, false); /* a negative count */
    prep_advance_run((prep_layers_case){.layers = 2, .n = 5, .kv_heads = 1, .hd = 6, .len = 3, .count = 0,
                                        .max_count = 5, .limit = 20, .count_on_device = true},
                     zero, 1, DDT_DFLASH_OK, false); /* an empty append: fits, len stays */
    /* a sticky status: a good append advances len and leaves the status word set */
    prep_advance_run((prep_layers_case){.layers = 3, .n = 7, .kv_heads = 3, .hd = 34, .gap = 3, .len = 4,
                                        .count = 7, .max_count = 7, .limit = 40},
                     NULL, 1, DDT_DFLASH_BAD_APPEND, false);
    /* the count on the host: good, then refused by the limit on the third of three */
    prep_advance_run((prep_layers_case){.layers = 5, .n = 7, .kv_heads = 3, .hd = 34, .gap = 3, .len = 4,
                                        .count = 7, .max_count = 7, .limit = 23},
                     NULL, 3, DDT_DFLASH_OK, false);
    /* 5 appends in a row (the ticket must come back to 0 every time), bad ones among them */
    const int32_t five[5] = {16, 3, 17, 1, 11};
    prep_advance_run((prep_layers_case){.layers = 4, .n = 16, .kv_heads = 2, .hd = 64, .len = 0, .count = 0,
                                        .max_count = 16, .limit = 60, .count_on_device = true},
                     five, 5, DDT_DFLASH_OK, false);
    /* the most layers a launch takes, the largest head_dim (the widest grid and register width) */
    const int32_t small[5] = {3, 5, 0, 2, 4};
    prep_advance_run((prep_layers_case){.layers = DDT_DFLASH_MAX_KV_LAYERS, .n = 5, .kv_heads = 1, .hd = 512,
                                        .gap = 1, .len = 0, .count = 0, .max_count = 5, .limit = 14,
                                        .count_on_device = true},
                     small, 5, DDT_DFLASH_OK, false);
    /* a captured graph replayed 3 times, len moving on the device; and one whose second replay is refused */
    const int32_t three[3] = {13, 16, 9}, three_bad[3] = {13, 20, 9};
    prep_advance_run((prep_layers_case){.layers = 4, .n = 16, .kv_heads = 2, .hd = 64, .len = 23, .count = 0,
                                        .max_count = 16, .limit = 100, .count_on_device = true},
                     three, 3, DDT_DFLASH_OK, true);
    prep_advance_run((prep_layers_case){.layers = 1, .n = 16, .kv_heads = 4, .hd = 128, .len = 5, .count = 0,
                                        .max_count = 16, .limit = 50, .count_on_device = true},
                     three_bad, 3, DDT_DFLASH_OK, true);

    /* arguments it refuses: a ticket without a status word, or with a len other than the one read */
    float *dummy;
    int32_t *dlen;
    uint32_t *dticket;
    CU(cudaMalloc((void **)&dummy, 64 * sizeof(float)));
    CU(cudaMalloc((void **)&dlen, 2 * sizeof(int32_t)));
    CU(cudaMalloc((void **)&dticket, sizeof(uint32_t)));
    ddt_dflash_qkv q = {.k = dummy, .ldk = 8, .v = dummy, .ldv = 8, .kv_heads = 1, .n = 1, .hd = 2, .eps = 1e-6f,
                        .count_host = 1, .max_count = 1, .len = dlen, .limit = 4, .cos_t = dummy, .sin_t = dummy,
                        .layers = 1, .layer_cols = 4, .advance_ticket = dticket, .advance_len = dlen,
                        .advance_status = dlen + 1};
    q.k_norms[0] = dummy, q.k_caches[0] = dummy, q.v_caches[0] = dummy;
    ddt_error e;
    ddt_dflash_qkv bad = q;
    bad.advance_status = NULL;
    CHECK(ddt_dflash_qkv_prep(&bad, NULL, &e) == DDT_ERR_INVALID, "qkv_prep: an advance without a status accepted");
    bad = q;
    bad.advance_len = dlen + 1;
    CHECK(ddt_dflash_qkv_prep(&bad, NULL, &e) == DDT_ERR_INVALID, "qkv_prep: an advance of another len accepted");
    CU(cudaDeviceSynchronize());
    CU(cudaFree(dummy));
    CU(cudaFree(dlen));
    CU(cudaFree(dticket));
    printf("  refused arguments: %s\n", e.msg);
}

/* ------------------------------------------------------------------ multi-source gather */

/* count random sources [41][cols + 3] (NaN past cols), m random rows (repeats
 * allowed) into dst [m + 1][count * cols + pad], poisoned: the one
 * ddt_cuda_gather_rows_multi launch against count ddt_cuda_gather_rows launches
 * into another poisoned dst, and against the host's copy, bitwise over the
 * whole buffer (the pad columns and the extra row untouched). */
static void gather_multi_case(int32_t count, int32_t m, int32_t cols, int32_t pad) {
    const int32_t src_rows = 41;
    const int64_t lds = cols + 3, ldd = (int64_t)count * cols + pad;
    const size_t sn = (size_t)src_rows * lds, dn = (size_t)(m + 1) * ldd;
    float *h_src[DDT_CUDA_GATHER_MAX_SRC], *d_src[DDT_CUDA_GATHER_MAX_SRC];
    for (int32_t i = 0; i < count; i++) {
        h_src[i] = malloc(sizeof(float) * sn);
        for (size_t j = 0; j < sn; j++) h_src[i][j] = (int64_t)(j % lds) < cols ? rndf() * (float)(i + 1) : NAN;
        CU(cudaMalloc((void **)&d_src[i], sizeof(float) * sn));
        CU(cudaMemcpy(d_src[i], h_src[i], sizeof(float) * sn, cudaMemcpyHostToDevice));
    }
    int32_t rows[64] = {0}, *drows;
    for (int32_t k = 0; k < m; k++) rows[k] = (int32_t)(rnd() % (uint32_t)src_rows);
    CU(cudaMalloc((void **)&drows, sizeof rows));
    CU(cudaMemcpy(drows, rows, sizeof rows, cudaMemcpyHostToDevice));
    float *ref = malloc(sizeof(float) * dn), *one = malloc(sizeof(float) * dn), *many = malloc(sizeof(float) * dn);
    memset(ref, 0xFF, sizeof(float) * dn);
    for (int32_t k = 0; k < m; k++)
        for (int32_t i = 0; i < count; i++)
            memcpy(ref + (size_t)k * ldd + (size_t)i * cols, h_src[i] + (size_t)rows[k] * lds, sizeof(float) * cols);
    float *done, *dmany;
    CU(cudaMalloc((void **)&done, sizeof(float) * dn));
    CU(cudaMalloc((void **)&dmany, sizeof(float) * dn));
    bo_poison(done, sizeof(float) * dn);
    bo_poison(dmany, sizeof(float) * dn);
    for (int32_t i = 0; i < count; i++)
        OK(ddt_cuda_gather_rows(done + (size_t)i * cols, ldd, d_src[i], lds, drows, m, cols, NULL, &err_));
    OK(ddt_cuda_gather_rows_multi(dmany, ldd, (const float *const *)d_src, count, lds, drows, m, cols, NULL, &err_));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(one, done, sizeof(float) * dn, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(many, dmany, sizeof(float) * dn, cudaMemcpyDeviceToHost));
    const bool vs_one = !memcmp(one, many, sizeof(float) * dn), vs_ref = !memcmp(ref, many, sizeof(float) * dn);
    printf("  %d sources, %2d rows of %3d, pad %d: %s\n", count, m, cols, pad,
           vs_one && vs_ref ? "bitwise the single gathers and the host copy" : "DIFFERS");
    CHECK(vs_one, "gather_rows_multi %d x %d x %d: differs from %d single gathers", count, m, cols, count);
    CHECK(vs_ref, "gather_rows_multi %d x %d x %d: differs from the host copy (or wrote past it)", count, m, cols);
    for (int32_t i = 0; i < count; i++) {
        free(h_src[i]);
        CU(cudaFree(d_src[i]));
    }
    CU(cudaFree(drows));
    CU(cudaFree(done));
    CU(cudaFree(dmany));
    free(ref), free(one), free(many);
}

/* The append_rows gather: the clamp launch (ref_dflash_clamp_rows) then ddt_cuda_gather_rows_multi
 * (the sequence the drafter ran) against ddt_cuda_gather_rows_multi_clamped (the
 * one launch it runs now), bitwise over poisoned destinations with a spare row
 * and pad columns, for a device length n below, at and above m, 1, 0 and
 * negative; the row slots past n hold indices far outside the sources (reading
 * one would fault or differ). */
static void gather_clamped_case(int32_t count, int32_t m, int32_t cols, int32_t pad, int32_t n) {
    const int32_t src_rows = 37;
    const int64_t lds = cols + 1, ldd = (int64_t)count * cols + pad;
    const size_t sn = (size_t)src_rows * lds, dn = (size_t)(m + 1) * ldd;
    float *h, *d_src[DDT_CUDA_GATHER_MAX_SRC];
    h = malloc(sizeof(float) * sn);
    for (int32_t i = 0; i < count; i++) {
        for (size_t j = 0; j < sn; j++) h[j] = rndf() * (float)(i + 1);
        CU(cudaMalloc((void **)&d_src[i], sizeof(float) * sn));
        CU(cudaMemcpy(d_src[i], h, sizeof(float) * sn, cudaMemcpyHostToDevice));
    }
    int32_t rows[DDT_MAX_PATH], *drows, *dn_dev, *dclamped;
    for (int32_t k = 0; k < DDT_MAX_PATH; k++)
        rows[k] = k < n ? (int32_t)(rnd() % (uint32_t)src_rows) : 0x7fffff00 + k;
    CU(cudaMalloc((void **)&drows, sizeof rows));
    CU(cudaMalloc((void **)&dn_dev, sizeof(int32_t)));
    CU(cudaMalloc((void **)&dclamped, sizeof rows));
    CU(cudaMemcpy(drows, rows, sizeof rows, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dn_dev, &n, sizeof n, cudaMemcpyHostToDevice));
    float *dref, *dgot, *ref = malloc(sizeof(float) * dn), *got = malloc(sizeof(float) * dn);
    CU(cudaMalloc((void **)&dref, sizeof(float) * dn));
    CU(cudaMalloc((void **)&dgot, sizeof(float) * dn));
    bo_poison(dref, sizeof(float) * dn);
    bo_poison(dgot, sizeof(float) * dn);
    CU(ref_dflash_clamp_rows(drows, dn_dev, m, dclamped, NULL));
    OK(ddt_cuda_gather_rows_multi(dref, ldd, (const float *const *)d_src, count, lds, dclamped, m, cols, NULL,
                                  &err_));
    OK(ddt_cuda_gather_rows_multi_clamped(dgot, ldd, (const float *const *)d_src, count, lds, drows, dn_dev, m, cols,
                                          NULL, &err_));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(ref, dref, sizeof(float) * dn, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(got, dgot, sizeof(float) * dn, cudaMemcpyDeviceToHost));
    const bool eq = !memcmp(ref, got, sizeof(float) * dn);
    printf("  %d sources, %2d rows of %3d, pad %d, device length %3d: %s\n", count, m, cols, pad, n,
           eq ? "bitwise clamp_rows + gather" : "DIFFERS");
    CHECK(eq, "gather_rows_multi_clamped %d x %d x %d, length %d: differs from clamp_rows + gather", count, m, cols, n);
    for (int32_t i = 0; i < count; i++) CU(cudaFree(d_src[i]));
    CU(cudaFree(drows));
    CU(cudaFree(dn_dev));
    CU(cudaFree(dclamped));
    CU(cudaFree(dref));
    CU(cudaFree(dgot));
    free(h), free(ref), free(got);
}

static void test_gather_multi_op(void) {
    printf("multi-source row gather vs single gathers:\n");
    gather_multi_case(1, 1, 1, 0);
    gather_multi_case(3, 7, 37, 5);
    gather_multi_case(4, 32, 256, 0);  /* the shipped drafter's append_rows: 4 target layers of 256 */
    gather_multi_case(DDT_CUDA_GATHER_MAX_SRC, 29, 300, 3); /* the most sources, rows wider than a block */
    gather_multi_case(5, 0, 11, 2);    /* no rows: nothing written */
    /* the append_rows form: the path's rows clamped to its device length inside the gather */
    const int32_t lengths[] = {7, 1, 0, -3, 16, 32, 40, 1000};
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++)
        gather_clamped_case(4, 16, 256, 0, lengths[i]); /* the shipped drafter: 4 layers of 256, slots of 16 */
    gather_clamped_case(3, DDT_MAX_PATH, 37, 5, 19);
    gather_clamped_case(DDT_CUDA_GATHER_MAX_SRC, DDT_MAX_PATH, 300, 3, DDT_MAX_PATH);
    gather_clamped_case(1, 1, 5, 1, 3);
    /* arguments it refuses */
    float *d;
    int32_t *drows;
    CU(cudaMalloc((void **)&d, 64 * sizeof(float)));
    CU(cudaMalloc((void **)&drows, sizeof(int32_t)));
    CU(cudaMemset(drows, 0, sizeof(int32_t)));
    const float *srcs[DDT_CUDA_GATHER_MAX_SRC + 1];
    for (int i = 0; i <= DDT_CUDA_GATHER_MAX_SRC; i++) srcs[i] = d;
    ddt_error e;
    CHECK(ddt_cuda_gather_rows_multi(d, 64, srcs, 0, 4, drows, 1, 4, NULL, &e) == DDT_ERR_INVALID,
          "gather_rows_multi: 0 sources accepted");
    CHECK(ddt_cuda_gather_rows_multi(d, 64, srcs, DDT_CUDA_GATHER_MAX_SRC + 1, 4, drows, 1, 4, NULL, &e) ==
              DDT_ERR_INVALID,
          "gather_rows_multi: %d sources accepted", DDT_CUDA_GATHER_MAX_SRC + 1);
    CHECK(ddt_cuda_gather_rows_multi(d, 7, srcs, 2, 4, drows, 1, 4, NULL, &e) == DDT_ERR_INVALID,
          "gather_rows_multi: a row stride below count * cols accepted");
    srcs[1] = NULL;
    CHECK(ddt_cuda_gather_rows_multi(d, 8, srcs, 2, 4, drows, 1, 4, NULL, &e) == DDT_ERR_INVALID,
          "gather_rows_multi: a NULL source accepted");
    srcs[1] = d;
    CHECK(ddt_cuda_gather_rows_multi_clamped(d, 8, srcs, 2, 4, drows, NULL, 1, 4, NULL, &e) == DDT_ERR_INVALID,
          "gather_rows_multi_clamped: a NULL length accepted");
    CU(cudaDeviceSynchronize());
    CU(cudaFree(d));
    CU(cudaFree(drows));
    printf("  refused arguments: %s\n", e.msg);
}

/* ------------------------------------------------------------------ stacked weights */

/* n tokens through `count` random parts of one format, separately and stacked. */
static void concat_case(ddt_qformat fmt, ddt_dtype dtype, const int64_t *rows, int32_t count, int64_t cols,
                        const char *name) {
    const int32_t n = 5;
    ddt_qweight part[3], whole;
    const ddt_qweight *pp[3];
    int64_t total = 0;
    for (int32_t i = 0; i < count; i++) {
        OK(ddt_cuda_qweight_random(fmt, dtype, rows[i], cols, fmt == DDT_Q_FP8_BLOCK ? 0.01f : 0.05f,
                                   0x1234u + 77u * (uint64_t)i, &part[i], &err_));
        pp[i] = &part[i];
        total += rows[i];
    }
    const int64_t ldy = total + 3;
    const size_t yn = (size_t)n * ldy, xn = (size_t)n * cols;
    float *x = malloc(sizeof(float) * xn), *ysep = malloc(sizeof(float) * yn), *ycat = malloc(sizeof(float) * yn);
    for (size_t i = 0; i < xn; i++) x[i] = rndf();
    float *dx, *dy;
    void *mws; /* the tensor path's split activations */
    const size_t mws_bytes = ddt_cuda_matmul_workspace_bytes(cols, 1, n);
    CU(cudaMalloc((void **)&dx, sizeof(float) * xn));
    CU(cudaMalloc((void **)&dy, sizeof(float) * yn));
    CU(cudaMalloc(&mws, mws_bytes));
    CU(cudaMemcpy(dx, x, sizeof(float) * xn, cudaMemcpyHostToDevice));
    char what[128];

    const bool ok = ddt_cuda_qweight_concat_ok(pp, count);
    ddt_error e;
    const ddt_status st = ddt_cuda_qweight_concat_rows(pp, count, &whole, &e);
    if (fmt == DDT_Q_FP8_BLOCK && rows[0] % DDT_FP8_BLOCK != 0) {
        /* a first part ending inside a scale block cannot stack */
        CHECK(!ok && st == DDT_ERR_UNSUPPORTED && !whole.data, "%s: FP8 parts off whole blocks stacked (%d)", name,
              (int)st);
        printf("  %-44s refused: %s\n", name, e.msg);
    } else {
        CHECK(ok && st == DDT_OK && whole.rows == total, "%s: stacking failed: %s", name, st == DDT_OK ? "" : e.msg);
        for (int32_t mode = 0; mode < 2 && st == DDT_OK; mode++) {
            const ddt_cuda_mm_mode mm = mode ? DDT_CUDA_MM_TENSOR : DDT_CUDA_MM_FP32;
            if (mode) { /* the packed layout, then a stack of packed parts is packed too */
                if (!ddt_cuda_qweight_tc_eligible(&part[0])) break;
                ddt_cuda_qweight_free(&whole);
                for (int32_t i = 0; i < count; i++) OK(ddt_cuda_qweight_pack(&part[i], &err_));
                OK(ddt_cuda_qweight_concat_rows(pp, count, &whole, &err_));
                /* packed when its parts are (bf16 on wgmma has no packed copy: none is read) */
                CHECK((ddt_cuda_qweight_packed_bytes(&whole) > 0) == (part[0].mma != NULL),
                      "%s: stack of packed parts not packed, or of unpacked ones packed", name);
            }
            bo_poison(dy, sizeof(float) * yn);
            int64_t off = 0;
            for (int32_t i = 0; i < count; i++) {
                OK(ddt_cuda_matmul_mode(&part[i], mm, dx, cols, n, dy + off, ldy, mws, mws_bytes, NULL, &err_));
                off += rows[i];
            }
            CU(cudaMemcpy(ysep, dy, sizeof(float) * yn, cudaMemcpyDeviceToHost));
            bo_poison(dy, sizeof(float) * yn);
            OK(ddt_cuda_matmul_mode(&whole, mm, dx, cols, n, dy, ldy, mws, mws_bytes, NULL, &err_));
            CU(cudaMemcpy(ycat, dy, sizeof(float) * yn, cudaMemcpyDeviceToHost));
            snprintf(what, sizeof what, "%s %s stacked vs separate", name, mode ? "tensor" : "fp32");
            const double err = bo_compare(what, ycat, ysep, yn, mode ? (bo_cmp){.bound = 1e-5} : (bo_cmp){.bitwise = true});
            CHECK(poison_written(ycat, ysep, yn) == 0, "%s: padding columns written", what);
            printf("  %-44s err %.3g\n", what, err);
            if (!mode && count > 1) { /* a row-prefix view: the first count - 1 parts, as the append reads k | v */
                ddt_qweight view = whole;
                view.rows = total - rows[count - 1];
                view.mma = NULL;
                view.mma_scale = NULL;
                bo_poison(dy, sizeof(float) * yn);
                OK(ddt_cuda_matmul(&view, dx, cols, n, dy, ldy, NULL, &err_));
                CU(cudaMemcpy(ycat, dy, sizeof(float) * yn, cudaMemcpyDeviceToHost));
                for (int32_t t = 0; t < n; t++) /* the last part's columns stay poisoned on the view's side */
                    for (int64_t o = view.rows; o < total; o++) ysep[t * ldy + o] = NAN;
                snprintf(what, sizeof what, "%s prefix view of %d parts", name, count - 1);
                size_t diff = 0;
                for (size_t i = 0; i < yn; i++)
                    diff += isnan(ysep[i]) ? !isnan(ycat[i]) : memcmp(&ycat[i], &ysep[i], sizeof(float)) != 0;
                CHECK(diff == 0, "%s: %zu values differ from the separate products (or written past the view)",
                      what, diff);
            }
        }
        ddt_cuda_qweight_free(&whole);
    }
    for (int32_t i = 0; i < count; i++) ddt_cuda_qweight_free(&part[i]);
    cudaFree(dx), cudaFree(dy), cudaFree(mws);
    free(x), free(ysep), free(ycat);
}

static void test_concat_op(void) {
    printf("row-stacked weights vs separate products:\n");
    const int64_t kvq[3] = {37, 37, 150}, fp8[3] = {128, 256, 77}, fp8_bad[2] = {100, 28};
    concat_case(DDT_Q_DENSE, DDT_DTYPE_F32, kvq, 3, 160, "F32 [37, 37, 150] x 160");
    concat_case(DDT_Q_DENSE, DDT_DTYPE_BF16, kvq, 3, 160, "BF16 [37, 37, 150] x 160");
    concat_case(DDT_Q_INT4_GROUP, DDT_DTYPE_I32, kvq, 3, 160, "INT4 [37, 37, 150] x 160");
    concat_case(DDT_Q_FP8_BLOCK, DDT_DTYPE_F8_E4M3, fp8, 3, 160, "FP8 [128, 256, 77] x 160");
    concat_case(DDT_Q_FP8_BLOCK, DDT_DTYPE_F8_E4M3, fp8_bad, 2, 160, "FP8 [100, 28] x 160");
}

/* ------------------------------------------------------------------ one model */

/* tc: the drafter on the tensor cores (ddt_cuda_drafter_target.mm): its bf16 products
 * of at least tc_min bytes (0: the default 4 MiB, which none of these small models'
 * weights reach; 1: all) and the LM head on wgmma, want_tc of them; logits within 1e-3 of the CPU's (split
 * bf16 activations, ~1e-5 a product), every bitwise check (chunking, graphs) as on the
 * FP32 path, which batch invariance keeps. */
static void test_model_mode(const char *name, const char *drafter_dir, const char *target_dir, bool tc, int want_tc,
                            uint64_t tc_min) {
    printf("%s (%s%s):\n", name, drafter_dir, tc ? ", tensor cores" : "");
    pair P = {.name = name, .tol = tc ? 1e-3 : TOL, .tie = tc ? 1e-3 : 1e-5}, *p = &P;
    ddt_drafter_head *head;
    OK(ddt_drafter_head_open(target_dir, &head, &err_));
    const ddt_drafter_target *ht = ddt_drafter_head_target(head);
    ddt_drafter_options o = {.max_ctx = MAX_CTX, .n_threads = 4};
    OK(ddt_drafter_load(drafter_dir, ht, &o, &p->cpu, &err_));
    ddt_qweight d_embed, d_lm;
    OK(ddt_cuda_qweight_upload(ht->embed, &d_embed, &err_));
    OK(ddt_cuda_qweight_upload(ht->lm_head, &d_lm, &err_));
    ddt_cuda_drafter_target gt = {.hidden_size = ht->hidden_size, .num_layers = ht->num_layers,
                                  .vocab_size = ht->vocab_size, .embed = &d_embed, .lm_head = &d_lm,
                                  .mm = tc ? DDT_CUDA_MM_TENSOR : DDT_CUDA_MM_FP32,
                                  .tensor_min_bytes = tc_min};

    /* the CPU's load checks, with its messages */
    ddt_cuda_drafter *bad = NULL;
    ddt_error e;
    ddt_cuda_drafter_target gt_bad = gt;
    gt_bad.hidden_size += 1;
    CHECK(ddt_cuda_drafter_load(drafter_dir, &gt_bad, MAX_CTX, &bad, &e) != DDT_OK && !bad &&
              strstr(e.msg, "hidden_size"),
          "%s: a target of another hidden size was accepted (%s)", name, e.msg);
    CHECK(ddt_cuda_drafter_load(drafter_dir, &gt, 0, &bad, &e) != DDT_OK && !bad, "%s: max_ctx 0 was accepted", name);

    OK(ddt_cuda_drafter_load(drafter_dir, &gt, MAX_CTX, &p->gpu, &err_));
    CHECK(ddt_cuda_drafter_tensor_products(p->gpu) == want_tc, "%s: %d products on the tensor cores, want %d", name,
          ddt_cuda_drafter_tensor_products(p->gpu), want_tc);
    const ddt_drafter_config *c = ddt_cuda_drafter_config(p->gpu);
    p->H = c->hidden_size;
    p->L = ddt_cuda_drafter_block_size(p->gpu);
    p->V = ht->vocab_size;
    p->n_tl = c->n_target_layers;
    CHECK(p->L == ddt_drafter_block_size(p->cpu), "%s: block size %d vs CPU %d", name, p->L,
          ddt_drafter_block_size(p->cpu));
    printf("  %-14s H %d, L %d, V %d, %d feature layers; device weights %.2f MB, state %.2f MB\n", name, p->H, p->L,
           p->V, p->n_tl, ddt_cuda_drafter_weight_bytes(p->gpu) / 1e6, ddt_cuda_drafter_state_bytes(p->gpu) / 1e6);
    for (int32_t s = 0; s < p->n_tl; s++) {
        p->h_layers[s] = malloc(sizeof(float) * (size_t)N_ROWS * p->H);
        CU(cudaMalloc((void **)&p->d_layers[s], sizeof(float) * (size_t)N_ROWS * p->H));
    }
    CU(cudaMalloc((void **)&p->d_rows, sizeof(int32_t) * DDT_MAX_PATH));
    CU(cudaMalloc((void **)&p->d_m, sizeof(int32_t)));
    CU(cudaMalloc((void **)&p->d_bonus, sizeof(int32_t)));
    CU(cudaMalloc((void **)&p->d_logits, sizeof(float) * (size_t)p->L * p->V));
    p->h_cpu = malloc(sizeof(float) * (size_t)p->L * p->V);
    p->h_gpu = malloc(sizeof(float) * (size_t)p->L * p->V);

    /* an empty context first: the block attends to itself only */
    new_features(p);
    draft_compare(p, "empty context");
    append_rows_both(p, 1, 1, true);
    new_features(p);
    append_rows_both(p, 7, 32, true);
    draft_compare(p, "rows 1 + 7 (max_m 32)");
    new_features(p);
    append_rows_both(p, 23, 23, true);
    draft_compare(p, "+ rows 23");
    new_features(p);
    append_prefix_both(p, 61);
    draft_compare(p, "+ prefix 61");
    append_rows_both(p, 0, 5, true);
    new_features(p);
    append_rows_both(p, 31, 32, true);
    draft_compare(p, "+ rows 0, + rows 31");
    draft_compare(p, "again, another bonus");
    new_features(p);
    append_prefix_both(p, 67);
    draft_compare(p, "+ prefix 67 (64 + 3)");
    /* 190 + 23 > 211: must store nothing and flag it */
    CHECK(gpu_status(p) == DDT_DFLASH_OK, "%s: status set before the overflow", name);
    append_rows_both(p, 23, 23, false);
    CHECK(gpu_len(p) == 190, "%s: len %d after an append past the context", name, gpu_len(p));
    CHECK(gpu_status(p) == DDT_DFLASH_BAD_APPEND, "%s: status %d after an append past the context", name,
          gpu_status(p));
    draft_compare(p, "after a refused append");
    append_rows_both(p, 21, 23, true);
    draft_compare(p, "+ rows 21 (context full)");
    OK(ddt_cuda_drafter_reset(p->gpu, NULL, &err_));
    CHECK(gpu_len(p) == 0 && gpu_status(p) == DDT_DFLASH_OK, "%s: reset left len %d status %d", name, gpu_len(p),
          gpu_status(p));

    test_chunking(p);
    test_graph(p);
    printf("  %-14s worst normalised logit error %.3g\n", name, p->worst);

    for (int32_t s = 0; s < p->n_tl; s++) {
        free(p->h_layers[s]);
        CU(cudaFree(p->d_layers[s]));
    }
    CU(cudaFree(p->d_rows));
    CU(cudaFree(p->d_m));
    CU(cudaFree(p->d_bonus));
    CU(cudaFree(p->d_logits));
    free(p->h_cpu);
    free(p->h_gpu);
    ddt_cuda_drafter_free(p->gpu);
    ddt_cuda_qweight_free(&d_embed);
    ddt_cuda_qweight_free(&d_lm);
    ddt_drafter_free(p->cpu);
    ddt_drafter_head_close(head);
}

static void test_model(const char *name, const char *drafter_dir, const char *target_dir) {
    test_model_mode(name, drafter_dir, target_dir, false, 0, 0);
}

int main(int argc, char **argv) {
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    test_attention_op(quick);
    test_qkv_prep_op();
    test_qkv_prep_layers_op();
    test_qkv_prep_advance_op();
    test_gather_multi_op();
    test_concat_op();
    printf("GPU DFlash drafter vs CPU drafter:\n");
    test_model("fixture fp32", "tests/fixtures/drafter/fp32", "tests/fixtures/target/fp32");
    test_model("fixture yarn", "tests/fixtures/drafter/yarn_legacy", "tests/fixtures/target/fp32");
    /* the tensor cores: the bf16 yarn drafter's 4 products a layer (2 layers) with the fp32
       fixture's head on the FP32 path; the shipped pair's 4 x 4 and its bf16 head */
    test_model_mode("fixture yarn", "tests/fixtures/drafter/yarn_legacy", "tests/fixtures/target/fp32", true, 8, 1);
    if (!quick) {
        test_model("pystdlib", "models/pystdlib-dflash", "models/pystdlib-target");
        test_model_mode("pystdlib", "models/pystdlib-dflash", "models/pystdlib-target", true, 17, 1);
        /* the default threshold: the shipped drafter's weights (at most 2.2 MB) stay on the FP32 path */
        test_model_mode("pystdlib", "models/pystdlib-dflash", "models/pystdlib-target", true, 0, 0);
    }
    if (g_failures) printf("test_cuda_drafter: %d FAILURES\n", g_failures);
    else printf("test_cuda_drafter: all passed\n");
    return g_failures ? 1 : 0;
}
