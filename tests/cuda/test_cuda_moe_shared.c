/*
 * test_cuda_moe_shared.c — the shared expert's down projection inside the routed
 * experts' down launch (ddt_cuda_moe_args.shared_down, issue 13) against the
 * launches it replaces: ddt_cuda_matmul of the shared down (the target's
 * mlp_down on the FP32 path) then ddt_cuda_moe_run without it.
 *   - bitwise: the shared rows, the routed sum (no fused end), and with the
 *     target's fused end (router in the launch, residual add, next norm) the
 *     residual and the normed output; idx / w unchanged;
 *   - formats: every expert format with a shared down of the same one, and BF16
 *     beside INT4 experts (Kimi K2's layout); hidden not a multiple of 32 (nor
 *     of 4) where the format allows, a shared intermediate other than the
 *     experts', the shared rows read from the router | shared front buffer as
 *     the target lays it out (at column n_experts, aligned or not);
 *   - n = 1, 3, 17, 65 (the three warp shapes, route + sort in one block and
 *     apart); some experts get no token;
 *   - NaN poison: the workspace and every output buffer before each run, the
 *     front's padding columns (a read past the shared rows shows as NaN); the
 *     output padding must stay poison;
 *   - the CPU (ddt_cpu_matmul, ddt_cpu_moe_experts, ddt_cpu_add, ddt_cpu_rmsnorm):
 *     normalised error < 1e-5, no NaN;
 *   - one launch less: a captured stream holds one kernel node fewer fused;
 *   - refusals: a format pair without an instance, a shared down of the wrong
 *     row count, a tensor-core layer, aliased buffers.
 * --quick: fewer formats and no large layer (for compute-sanitizer).
 * Needs the CPU backend: link with src/core, src/io, src/backend/cpu.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/moe.h"
#include "backend/cpu/nn.h"
#include "backend/cpu/qmatmul.h"
#include "backend/cuda/moe_cuda.h"
#include "backend/cuda/qmatmul_cuda.h"
#include "backend_ops.h"
#include "cuda_test.h"

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static float frand(void) { return ct_frand(&g_rng); }
static uint32_t rnd(void) { return ct_xorshift(&g_rng, 16); }

static ddt_cpu_pool *g_pool;

static const char *fmt_name(int f) {
    static const char *n[] = {"F32", "BF16", "F16", "FP8", "INT4"};
    return n[f];
}

/* dense 0.2, F16 exponents up to 2^-2, FP8 / INT4 scales as test_cuda_moe's */
static const ct_weight_values k_values = {0.2f, 14, 0.002f, 0.03f};

#define TOL 1e-5

/* One layer under test: E experts of format f ([I, H] gate / up, [H, I] down) and
 * a shared down of format fs [H, S], on both sides. */
typedef struct layer_case {
    int f, fs, E, H, I, S, K;
    int pad; /* poisoned floats after the shared rows in each front row */
    ct_weight *hw;   /* [3 E] gate, up, down host weights */
    ct_weight hsd;   /* the shared down, host */
    ddt_qweight dsd; /* the shared down, device */
    ddt_cpu_mlp *cw; /* [E] */
    ddt_cpu_moe_layer cpu;
    ddt_cuda_moe_layer gpu;
} layer_case;

static void layer_make(layer_case *c) {
    c->hw = calloc(3 * (size_t)c->E, sizeof *c->hw);
    c->cw = calloc((size_t)c->E, sizeof *c->cw);
    ddt_qweight *gw = malloc(sizeof(ddt_qweight) * 3 * (size_t)c->E);
    for (int e = 0; e < c->E; e++) {
        c->hw[e] = ct_make_weight(&g_rng, c->f, c->I, c->H, &k_values);
        c->hw[c->E + e] = ct_make_weight(&g_rng, c->f, c->I, c->H, &k_values);
        c->hw[2 * c->E + e] = ct_make_weight(&g_rng, c->f, c->H, c->I, &k_values);
        for (int k = 0; k < 3; k++) gw[k * c->E + e] = c->hw[k * c->E + e].w;
        c->cw[e] = (ddt_cpu_mlp){.gate = gw[e], .up = gw[c->E + e], .down = gw[2 * c->E + e]};
    }
    c->cpu = (ddt_cpu_moe_layer){.n_experts = c->E, .hidden = c->H, .inter = c->I, .experts = c->cw};
    OK(ddt_cuda_moe_layer_upload(gw, gw + c->E, gw + 2 * c->E, c->E, &c->gpu, &err_));
    free(gw);
    c->hsd = ct_make_weight(&g_rng, c->fs, c->H, c->S, &k_values);
    OK(ddt_cuda_qweight_upload(&c->hsd.w, &c->dsd, &err_));
}

static void layer_free(layer_case *c) {
    ddt_cuda_moe_layer_free(&c->gpu);
    ddt_cuda_qweight_free(&c->dsd);
    for (int i = 0; i < 3 * c->E; i++) ct_free_weight(&c->hw[i]);
    ct_free_weight(&c->hsd);
    free(c->hw);
    free(c->cw);
}

/* Kernel nodes of what `what` enqueues on a captured stream. */
typedef void (*enqueue_fn)(void *ctx, ddt_cuda_stream s);
static size_t captured_kernels(enqueue_fn what, void *ctx) {
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    what(ctx, (ddt_cuda_stream)s);
    cudaGraph_t g;
    CU(cudaStreamEndCapture(s, &g));
    size_t count = 0;
    CU(cudaGraphGetNodes(g, NULL, &count));
    cudaGraphNode_t *nodes = malloc(sizeof *nodes * (count ? count : 1));
    CU(cudaGraphGetNodes(g, nodes, &count));
    size_t kernels = 0;
    for (size_t i = 0; i < count; i++) {
        enum cudaGraphNodeType t;
        CU(cudaGraphNodeGetType(nodes[i], &t));
        kernels += t == cudaGraphNodeTypeKernel;
    }
    free(nodes);
    CU(cudaGraphDestroy(g));
    CU(cudaStreamDestroy(s));
    return kernels;
}

/* The device buffers of one token count, and the two runs' arguments. */
typedef struct run_bufs {
    const layer_case *c;
    int n;
    int64_t ld_front, ldy, ldo, ldr;
    float *front;       /* [n][ld_front]: router logits | shared rows | pad (poison) */
    float *x;           /* [n][H] the experts' input */
    float *nw;          /* [H] next norm */
    float *y[2];        /* [n][ldy] shared rows: separate launch, fused */
    float *out[2];      /* [n][ldo] normed output */
    float *resid[2];    /* [n][ldr] */
    float *acc[2];      /* [n][ldo] routed sum (no fused end) */
    int32_t *idx[2], *gidx;
    float *w[2], *gw;   /* [n][K]: routed (two runs), given (the no-end runs) */
    void *ws;
    size_t wsb;
    ddt_moe_route_params rp;
} run_bufs;

/* The target's layer end before issue 13: the shared down as its own product,
 * then the experts with the router and the fused end adding y[0]. */
static void enqueue_separate(void *ctx, ddt_cuda_stream s) {
    run_bufs *b = ctx;
    const layer_case *c = b->c;
    OK(ddt_cuda_matmul(&c->dsd, b->front + c->E, b->ld_front, b->n, b->y[0], b->ldy, s, &err_));
    const ddt_cuda_moe_args a = {.x = b->x, .ldx = c->H, .n = b->n, .top_k = c->K, .route = &b->rp,
                                 .logits = b->front, .ld_logits = b->ld_front, .idx = b->idx[0], .w = b->w[0],
                                 .out = b->out[0], .ldo = b->ldo, .resid = b->resid[0], .ld_resid = b->ldr,
                                 .shared = b->y[0], .ld_shared = b->ldy, .norm_w = b->nw, .eps = 1e-6f,
                                 .workspace = b->ws, .workspace_bytes = b->wsb};
    OK(ddt_cuda_moe_run(&c->gpu, &a, s, &err_));
}

/* The same with the shared down in the experts' down launch (into y[1]). */
static void enqueue_fused(void *ctx, ddt_cuda_stream s) {
    run_bufs *b = ctx;
    const layer_case *c = b->c;
    const ddt_cuda_moe_args a = {.x = b->x, .ldx = c->H, .n = b->n, .top_k = c->K, .route = &b->rp,
                                 .logits = b->front, .ld_logits = b->ld_front, .idx = b->idx[1], .w = b->w[1],
                                 .out = b->out[1], .ldo = b->ldo, .resid = b->resid[1], .ld_resid = b->ldr,
                                 .shared = b->y[1], .ld_shared = b->ldy, .norm_w = b->nw, .eps = 1e-6f,
                                 .workspace = b->ws, .workspace_bytes = b->wsb,
                                 .shared_down = &c->dsd, .shared_x = b->front + c->E, .ld_shared_x = b->ld_front,
                                 .shared_y = b->y[1], .ld_shared_y = b->ldy};
    OK(ddt_cuda_moe_run(&c->gpu, &a, s, &err_));
}

static float *dmalloc(size_t floats) {
    float *p;
    CU(cudaMalloc((void **)&p, sizeof(float) * (floats ? floats : 1)));
    return p;
}

static float *dhost(const float *d, size_t floats) {
    float *h = malloc(sizeof(float) * floats);
    CU(cudaMemcpy(h, d, sizeof(float) * floats, cudaMemcpyDeviceToHost));
    return h;
}

/* Padding floats [from, ld) of n rows still 0xFF bytes (bo_poison). */
static int pad_written(const float *h, int n, int64_t ld, int64_t from) {
    int bad = 0;
    const uint32_t poison = 0xFFFFFFFFu;
    for (int t = 0; t < n; t++)
        for (int64_t d = from; d < ld; d++) bad += memcmp(&h[t * ld + d], &poison, 4) != 0;
    return bad;
}

static void run_n(const layer_case *c, int n) {
    const int E = c->E, H = c->H, S = c->S, K = c->K;
    run_bufs b;
    memset(&b, 0, sizeof b);
    b.c = c;
    b.n = n;
    b.ld_front = E + S + c->pad;
    b.ldy = H + 5;
    b.ldo = H + 3;
    b.ldr = H + (H % 2 ? 1 : 8); /* the norm's strided and register paths (by H's parity) */
    const size_t nf = (size_t)n * b.ld_front, ny = (size_t)n * b.ldy, no = (size_t)n * b.ldo,
                 nr = (size_t)n * b.ldr, nx = (size_t)n * H, nk = (size_t)n * K;
    /* host inputs: logits, shared rows (silu(gate) * up in the target: any sign), pad poison */
    float *front = malloc(sizeof(float) * nf), *x = malloc(sizeof(float) * nx), *resid = malloc(sizeof(float) * nr),
          *nw = malloc(sizeof(float) * H);
    ct_poison(front, nf);
    for (int t = 0; t < n; t++) {
        for (int e = 0; e < E; e++) front[t * b.ld_front + e] = 4.0f * frand();
        for (int j = 0; j < S; j++) front[t * b.ld_front + E + j] = frand();
    }
    for (size_t i = 0; i < nx; i++) x[i] = frand();
    for (size_t i = 0; i < nr; i++) resid[i] = 2.0f * frand();
    for (int i = 0; i < H; i++) nw[i] = 1.0f + 0.5f * frand();
    /* given routing for the runs without a router: experts E-2 and E-1 never
       chosen, tokens 1, 4, ... share the first token's first two experts */
    int32_t *gidx = malloc(sizeof(int32_t) * nk);
    float *gwt = malloc(sizeof(float) * nk);
    for (int t = 0; t < n; t++)
        for (int k = 0; k < K; k++) {
            int e, dup, share = t % 3 == 1 && k < 2;
            do {
                e = share ? gidx[k] : (int)(rnd() % (uint32_t)(E - 2));
                share = 0;
                dup = 0;
                for (int j = 0; j < k; j++) dup |= gidx[t * K + j] == e;
            } while (dup);
            gidx[t * K + k] = e;
            gwt[t * K + k] = 0.5f + 0.5f * frand();
        }
    b.front = ct_dev_copy(front, sizeof(float) * nf);
    b.x = ct_dev_copy(x, sizeof(float) * nx);
    b.nw = ct_dev_copy(nw, sizeof(float) * H);
    b.gidx = ct_dev_copy(gidx, sizeof(int32_t) * nk);
    b.gw = ct_dev_copy(gwt, sizeof(float) * nk);
    for (int k = 0; k < 2; k++) {
        b.y[k] = dmalloc(ny);
        b.out[k] = dmalloc(no);
        b.acc[k] = dmalloc(no);
        b.resid[k] = ct_dev_copy(resid, sizeof(float) * nr);
        CU(cudaMalloc((void **)&b.idx[k], sizeof(int32_t) * nk));
        b.w[k] = dmalloc(nk);
        bo_poison(b.y[k], sizeof(float) * ny);
        bo_poison(b.out[k], sizeof(float) * no);
        bo_poison(b.acc[k], sizeof(float) * no);
        bo_poison(b.idx[k], sizeof(int32_t) * nk);
        bo_poison(b.w[k], sizeof(float) * nk);
    }
    b.wsb = ddt_cuda_moe_workspace_bytes(&c->gpu, n, K);
    CU(cudaMalloc(&b.ws, b.wsb));
    b.rp = (ddt_moe_route_params){E, K, 1, 1, true, 2.5f, NULL};

    char what[128];
    snprintf(what, sizeof what, "%s experts + %s shared E=%d [%d, %d] S=%d top%d pad %d n=%d", fmt_name(c->f),
             fmt_name(c->fs), E, H, c->I, S, K, c->pad, n);

    /* 1. the target's layer end: separate, then fused (workspace poisoned before each) */
    bo_poison(b.ws, b.wsb);
    enqueue_separate(&b, NULL);
    bo_poison(b.ws, b.wsb);
    enqueue_fused(&b, NULL);
    CU(cudaDeviceSynchronize());
    float *y[2], *out[2], *rs[2];
    int32_t *ih[2] = {malloc(sizeof(int32_t) * nk), malloc(sizeof(int32_t) * nk)};
    float *wh[2];
    for (int k = 0; k < 2; k++) {
        y[k] = dhost(b.y[k], ny), out[k] = dhost(b.out[k], no), rs[k] = dhost(b.resid[k], nr);
        wh[k] = dhost(b.w[k], nk);
        CU(cudaMemcpy(ih[k], b.idx[k], sizeof(int32_t) * nk, cudaMemcpyDeviceToHost));
    }
    CHECK(memcmp(ih[0], ih[1], sizeof(int32_t) * nk) == 0, "%s: routed indices differ", what);
    CHECK(memcmp(wh[0], wh[1], sizeof(float) * nk) == 0, "%s: routing weights differ", what);
    CHECK(memcmp(y[1], y[0], sizeof(float) * ny) == 0, "%s: shared rows not bitwise the separate product", what);
    CHECK(memcmp(rs[1], rs[0], sizeof(float) * nr) == 0, "%s: residual not bitwise the separate launches'", what);
    CHECK(memcmp(out[1], out[0], sizeof(float) * no) == 0, "%s: output not bitwise the separate launches'", what);
    CHECK(pad_written(y[1], n, b.ldy, H) == 0, "%s: shared rows' padding written", what);
    CHECK(pad_written(out[1], n, b.ldo, H) == 0, "%s: output padding written", what);

    /* 2. no fused end, the given routing: the routed sum bitwise ddt_cuda_moe_experts,
          the shared rows bitwise again */
    bo_poison(b.ws, b.wsb);
    OK(ddt_cuda_moe_experts(&c->gpu, b.x, H, n, b.gidx, b.gw, K, b.acc[0], b.ldo, b.ws, b.wsb, NULL, &err_));
    bo_poison(b.ws, b.wsb);
    bo_poison(b.y[1], sizeof(float) * ny);
    const ddt_cuda_moe_args a = {.x = b.x, .ldx = H, .n = n, .top_k = K, .idx = b.gidx, .w = b.gw, .out = b.acc[1],
                                 .ldo = b.ldo, .workspace = b.ws, .workspace_bytes = b.wsb, .shared_down = &c->dsd,
                                 .shared_x = b.front + E, .ld_shared_x = b.ld_front, .shared_y = b.y[1],
                                 .ld_shared_y = b.ldy};
    OK(ddt_cuda_moe_run(&c->gpu, &a, NULL, &err_));
    CU(cudaDeviceSynchronize());
    float *acc[2] = {dhost(b.acc[0], no), dhost(b.acc[1], no)}, *y2 = dhost(b.y[1], ny);
    CHECK(memcmp(acc[1], acc[0], sizeof(float) * no) == 0, "%s: routed sum not bitwise ddt_cuda_moe_experts'", what);
    CHECK(memcmp(y2, y[0], sizeof(float) * ny) == 0, "%s: shared rows (no fused end) not bitwise", what);
    CHECK(pad_written(acc[1], n, b.ldo, H) == 0, "%s: routed sum's padding written", what);

    /* 3. the CPU twins: the shared down, the routed sum (the GPU's routing), the end */
    float *c_y = malloc(sizeof(float) * ny), *c_acc = malloc(sizeof(float) * no), *c_out = malloc(sizeof(float) * no),
          *c_sum = malloc(sizeof(float) * nx);
    ct_poison(c_y, ny);
    ct_poison(c_acc, no);
    ct_poison(c_out, no);
    ddt_cpu_matmul(g_pool, &c->hsd.w, front + E, b.ld_front, n, c_y, b.ldy);
    void *cws = malloc(ddt_cpu_moe_workspace_bytes(&c->cpu, n, K));
    ddt_cpu_moe_experts(g_pool, &c->cpu, x, H, n, gidx, gwt, K, c_acc, b.ldo, cws);
    char w2[160];
    snprintf(w2, sizeof w2, "%s shared rows vs CPU", what);
    const double ey = bo_compare(w2, y[1], c_y, ny, (bo_cmp){.bound = TOL});
    snprintf(w2, sizeof w2, "%s routed sum vs CPU", what);
    const double ea = bo_compare(w2, acc[1], c_acc, no, (bo_cmp){.bound = TOL});
    /* the end with the router's picks: shared + routed (that order), resid + it, norm */
    ddt_cpu_moe_experts(g_pool, &c->cpu, x, H, n, ih[1], wh[1], K, c_acc, b.ldo, cws);
    for (int t = 0; t < n; t++) {
        memcpy(c_sum + (size_t)t * H, c_y + (size_t)t * b.ldy, sizeof(float) * H);
        ddt_cpu_add(c_sum + (size_t)t * H, c_acc + (size_t)t * b.ldo, H);
        ddt_cpu_add(resid + (size_t)t * b.ldr, c_sum + (size_t)t * H, H);
    }
    const ddt_cpu_vec wv = {nw, DDT_DTYPE_F32, H};
    ddt_cpu_rmsnorm(g_pool, resid, b.ldr, n, H, &wv, 1e-6f, c_out, b.ldo);
    snprintf(w2, sizeof w2, "%s normed output vs CPU", what);
    const double eo = bo_compare(w2, out[1], c_out, no, (bo_cmp){.bound = TOL});
    CHECK(!isnan(ey) && !isnan(ea) && !isnan(eo), "%s: a normalised error is NaN", what);

    /* 4. one kernel fewer in a captured layer end */
    const size_t k_sep = captured_kernels(enqueue_separate, &b), k_fused = captured_kernels(enqueue_fused, &b);
    CHECK(k_fused + 1 == k_sep, "%s: %zu kernels fused against %zu separate (one fewer expected)", what, k_fused,
          k_sep);
    printf("%s: bitwise the separate launches; CPU err shared %.2e routed %.2e out %.2e; kernels %zu -> %zu\n", what,
           ey, ea, eo, k_sep, k_fused);

    for (int k = 0; k < 2; k++) {
        CU(cudaFree(b.y[k]));
        CU(cudaFree(b.out[k]));
        CU(cudaFree(b.acc[k]));
        CU(cudaFree(b.resid[k]));
        CU(cudaFree(b.idx[k]));
        CU(cudaFree(b.w[k]));
        free(y[k]), free(out[k]), free(rs[k]), free(ih[k]), free(wh[k]), free(acc[k]);
    }
    CU(cudaFree(b.front));
    CU(cudaFree(b.x));
    CU(cudaFree(b.nw));
    CU(cudaFree(b.gidx));
    CU(cudaFree(b.gw));
    CU(cudaFree(b.ws));
    free(front), free(x), free(resid), free(nw), free(gidx), free(gwt), free(y2);
    free(c_y), free(c_acc), free(c_out), free(c_sum), free(cws);
}

static void shared_case(int f, int fs, int E, int H, int I, int S, int K, int pad) {
    layer_case c = {.f = f, .fs = fs, .E = E, .H = H, .I = I, .S = S, .K = K, .pad = pad};
    layer_make(&c);
    CHECK(ddt_cuda_moe_shared_down_ok(&c.gpu, &c.dsd), "%s experts + %s shared: not taken", fmt_name(f),
          fmt_name(fs));
    static const int ns[] = {1, 3, 17, 65};
    for (int i = 0; i < 4; i++) run_n(&c, ns[i]);
    layer_free(&c);
}

/* What ddt_cuda_moe_shared_down_ok and ddt_cuda_moe_run refuse. */
static void refusals(void) {
    const int E = 6, H = 64, I = 32, K = 2, n = 2;
    layer_case c = {.f = 1, .fs = 3, .E = E, .H = H, .I = I, .S = 32, .K = K}; /* BF16 experts, FP8 shared */
    layer_make(&c);
    CHECK(!ddt_cuda_moe_shared_down_ok(&c.gpu, &c.dsd), "BF16 experts + FP8 shared taken (no such instance)");
    ddt_qweight wrong = c.dsd;
    wrong.rows = H - 1;
    CHECK(!ddt_cuda_moe_shared_down_ok(&c.gpu, &wrong), "a shared down of %d rows taken for hidden %d", H - 1, H);
    CHECK(!ddt_cuda_moe_shared_down_ok(&c.gpu, NULL), "no shared down taken");
    ddt_cuda_moe_layer tc = c.gpu;
    tc.mode = DDT_CUDA_MM_TENSOR;
    ct_weight bf = ct_make_weight(&g_rng, 1, H, 32, &k_values);
    ddt_qweight dbf;
    OK(ddt_cuda_qweight_upload(&bf.w, &dbf, &err_));
    CHECK(ddt_cuda_moe_shared_down_ok(&c.gpu, &dbf), "BF16 experts + BF16 shared refused");
    CHECK(!ddt_cuda_moe_shared_down_ok(&tc, &dbf), "a tensor-core layer taken");
    /* ddt_cuda_moe_run's answers */
    float *x = dmalloc((size_t)n * H), *sx = dmalloc((size_t)n * 32), *y = dmalloc((size_t)n * H),
          *out = dmalloc((size_t)n * H), *w = dmalloc((size_t)n * K);
    CU(cudaMemset(x, 0, sizeof(float) * (size_t)n * H)); /* defined inputs for the one call that runs */
    CU(cudaMemset(sx, 0, sizeof(float) * (size_t)n * 32));
    CU(cudaMemset(w, 0, sizeof(float) * (size_t)n * K));
    int32_t idx[4] = {0, 1, 2, 3};
    int32_t *didx = ct_dev_copy(idx, sizeof idx);
    const size_t wsb = ddt_cuda_moe_workspace_bytes(&c.gpu, n, K);
    void *ws;
    CU(cudaMalloc(&ws, wsb));
    ddt_cuda_moe_args a = {.x = x, .ldx = H, .n = n, .top_k = K, .idx = didx, .w = w, .out = out, .ldo = H,
                           .workspace = ws, .workspace_bytes = wsb, .shared_down = &c.dsd, .shared_x = sx,
                           .ld_shared_x = 32, .shared_y = y, .ld_shared_y = H};
    ddt_error e;
    ddt_status st = ddt_cuda_moe_run(&c.gpu, &a, NULL, &e);
    CHECK(st == DDT_ERR_UNSUPPORTED, "BF16 experts + FP8 shared: status %d", (int)st);
    a.shared_down = &dbf;
    a.shared_y = sx; /* onto its own input */
    st = ddt_cuda_moe_run(&c.gpu, &a, NULL, &e);
    CHECK(st == DDT_ERR_INVALID, "shared_y == shared_x: status %d", (int)st);
    a.shared_y = out;
    st = ddt_cuda_moe_run(&c.gpu, &a, NULL, &e);
    CHECK(st == DDT_ERR_INVALID, "shared_y == out: status %d", (int)st);
    a.shared_y = y, a.ld_shared_x = 31;
    st = ddt_cuda_moe_run(&c.gpu, &a, NULL, &e);
    CHECK(st == DDT_ERR_INVALID, "shared_x row stride shorter than its rows: status %d", (int)st);
    a.ld_shared_x = 32, a.ld_shared_y = H - 1;
    st = ddt_cuda_moe_run(&c.gpu, &a, NULL, &e);
    CHECK(st == DDT_ERR_INVALID, "shared_y row stride shorter than hidden: status %d", (int)st);
    a.ld_shared_y = H, a.shared_x = NULL;
    st = ddt_cuda_moe_run(&c.gpu, &a, NULL, &e);
    CHECK(st == DDT_ERR_INVALID, "no shared_x: status %d", (int)st);
    a.shared_x = sx;
    OK(ddt_cuda_moe_run(&c.gpu, &a, NULL, &err_)); /* and the valid call runs */
    CU(cudaDeviceSynchronize());
    printf("refusals: as expected\n");
    CU(cudaFree(x));
    CU(cudaFree(sx));
    CU(cudaFree(y));
    CU(cudaFree(out));
    CU(cudaFree(w));
    CU(cudaFree(didx));
    CU(cudaFree(ws));
    ddt_cuda_qweight_free(&dbf);
    ct_free_weight(&bf);
    layer_free(&c);
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    OK(ddt_cpu_pool_create(4, &g_pool, &err_));
    /* formats: 0 F32, 1 BF16, 2 F16, 3 FP8, 4 INT4 */
    shared_case(1, 1, 8, 256, 192, 192, 2, 0);  /* the shipped target's MoE layer, aligned front rows */
    shared_case(4, 1, 12, 160, 64, 72, 4, 3);   /* INT4 experts + BF16 shared (Kimi K2) */
    shared_case(1, 1, 12, 203, 75, 150, 4, 3);  /* hidden odd, two experts' width of shared rows */
    if (!quick) {
        shared_case(0, 0, 12, 203, 75, 75, 4, 1);  /* F32 */
        shared_case(2, 2, 10, 96, 40, 40, 3, 0);   /* F16 */
        shared_case(3, 3, 10, 300, 130, 130, 3, 3); /* FP8, partial 128-blocks */
        shared_case(4, 4, 12, 160, 96, 96, 4, 0);  /* INT4 + INT4 */
        shared_case(4, 1, 40, 256, 224, 224, 8, 3); /* a larger layer, top 8 */
    }
    refusals();
    ddt_cpu_pool_destroy(g_pool);
    return ct_report("test_cuda_moe_shared");
}
