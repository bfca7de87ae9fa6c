/*
 * cuda_bench_draft.c — one DFlash draft (the block of L rows through every drafter
 * layer and the target's LM head) and one round's append (16 context rows) at a
 * real drafter's size, on the FP32 path and on the tensor cores
 * (ddt_cuda_drafter_target.mm, what --tensor-cores gives the drafter), against the
 * floor (the bytes the draft reads over the copy bandwidth measured in the same
 * run) and against cuBLAS bf16 (cublasGemmEx) running the draft's products alone at
 * the same shapes.  The drafter comes from a folder (bench/make_dflash.py writes
 * one of Kimi-K2.6-DFlash's shape with random weights: a draft's time depends on the
 * shapes only); the target's embedding and LM head are random bf16 on the device.
 *
 *   python3 bench/make_dflash.py /tmp/k26-dflash --preset k26
 *   cuda_bench_draft /tmp/k26-dflash [--quick]        (markdown on stdout)
 *
 * Why: the FP32 path reads a weight once for every 4 rows, so a draft of 16 rows
 * reads Kimi-K2.6-DFlash's 6.3 GB and the 2.35 GB head 4 times, on every GPU
 * (every rank drafts).
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/cuda/cuda_test.h"
#include "io/drafter_config.h"
#include "model/drafter_cuda.h"

#define CTX 4096    /* the drafter's context */
#define PRIMED 512  /* context rows appended before timing */
#define CHUNK 64

#define CB(call)                                                                          \
    do {                                                                                  \
        cublasStatus_t s_ = (call);                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                \
            fprintf(stderr, "cuBLAS error %d at %s:%d\n", (int)s_, __FILE__, __LINE__);   \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

static int cmp_f(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* median ms of reps runs of work(arg) on stream s (after two warm-ups), between events */
static float time_median(void (*work)(void *arg, cudaStream_t s), void *arg, cudaStream_t s, int reps) {
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    float v[64];
    for (int r = -2; r < reps; r++) {
        CU(cudaEventRecord(e0, s));
        work(arg, s);
        CU(cudaEventRecord(e1, s));
        CU(cudaEventSynchronize(e1));
        if (r >= 0) CU(cudaEventElapsedTime(&v[r], e0, e1));
    }
    CU(cudaEventDestroy(e0));
    CU(cudaEventDestroy(e1));
    qsort(v, (size_t)reps, sizeof v[0], cmp_f);
    return v[reps / 2];
}

static void launch_graph(void *g, cudaStream_t s) { CU(cudaGraphLaunch((cudaGraphExec_t)g, s)); }

typedef struct copy_job {
    void *dst;
    const void *src;
    size_t bytes;
} copy_job;
static void copy_work(void *arg, cudaStream_t s) {
    const copy_job *c = arg;
    CU(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, s));
}

/* d2d copy bandwidth, bytes read + written per second */
static double copy_bw(cudaStream_t s) {
    copy_job c = {.bytes = (size_t)1 << 30};
    CU(cudaMalloc(&c.dst, c.bytes));
    CU(cudaMalloc((void **)&c.src, c.bytes));
    CU(cudaMemset((void *)c.src, 0, c.bytes));
    const float ms = time_median(copy_work, &c, s, 7);
    CU(cudaFree(c.dst));
    CU(cudaFree((void *)c.src));
    return 2.0 * (double)c.bytes / (ms * 1e-3);
}

typedef struct timing {
    float draft_ms, append_ms;
    int tc_products;
} timing;

/* Load the drafter in mode mm, prime its context, time a draft and a 16-row append (graphs). */
static timing run_mode(const char *dir, const ddt_cuda_drafter_target *base, ddt_cuda_mm_mode mm, int n_tl,
                       float *const *feat, int reps, cudaStream_t s) {
    ddt_cuda_drafter_target t = *base;
    t.mm = mm;
    ddt_cuda_drafter *d;
    OK(ddt_cuda_drafter_load(dir, &t, CTX, &d, &err_));
    timing out = {.tc_products = ddt_cuda_drafter_tensor_products(d)};
    const int32_t L = ddt_cuda_drafter_block_size(d), V = t.vocab_size;
    float *logits;
    int32_t *bonus, *rows, *m;
    CU(cudaMalloc((void **)&logits, sizeof(float) * (size_t)L * (size_t)V));
    CU(cudaMalloc((void **)&bonus, sizeof(int32_t)));
    CU(cudaMalloc((void **)&rows, sizeof(int32_t) * DDT_MAX_PATH));
    CU(cudaMalloc((void **)&m, sizeof(int32_t)));
    int32_t hrows[DDT_MAX_PATH], hm = 16, hb = 7;
    for (int i = 0; i < DDT_MAX_PATH; i++) hrows[i] = i % CHUNK;
    CU(cudaMemcpy(rows, hrows, sizeof hrows, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(m, &hm, sizeof hm, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(bonus, &hb, sizeof hb, cudaMemcpyHostToDevice));
    OK(ddt_cuda_drafter_reset(d, s, &err_));
    for (int k = 0; k < PRIMED / CHUNK; k++)
        OK(ddt_cuda_drafter_append_prefix(d, (const float *const *)feat, CHUNK, s, &err_));
    (void)n_tl;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    OK(ddt_cuda_drafter_draft(d, bonus, logits, s, &err_));
    CU(cudaStreamEndCapture(s, &g));
    CU(cudaGraphInstantiate(&ge, g, 0));
    out.draft_ms = time_median(launch_graph, ge, s, reps);
    CU(cudaGraphExecDestroy(ge));
    CU(cudaGraphDestroy(g));
    /* the round's append: 16 accepted rows (len grows by 16 a replay; CTX leaves room) */
    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    OK(ddt_cuda_drafter_append_rows(d, (const float *const *)feat, rows, m, 16, s, &err_));
    CU(cudaStreamEndCapture(s, &g));
    CU(cudaGraphInstantiate(&ge, g, 0));
    out.append_ms = time_median(launch_graph, ge, s, reps);
    CU(cudaGraphExecDestroy(ge));
    CU(cudaGraphDestroy(g));
    CU(cudaStreamSynchronize(s));
    int32_t st;
    CU(cudaMemcpy(&st, ddt_cuda_drafter_status_device(d), sizeof st, cudaMemcpyDeviceToHost));
    if (st != 0) {
        fprintf(stderr, "drafter status %d after the appends\n", st);
        exit(1);
    }
    CU(cudaFree(logits));
    CU(cudaFree(bonus));
    CU(cudaFree(rows));
    CU(cudaFree(m));
    ddt_cuda_drafter_free(d);
    return out;
}

/* The draft's products on cuBLAS: weights w[i] of shape kind[i] (rows, cols) */
typedef struct cublas_job {
    cublasHandle_t h;
    int nw, L;
    void **w, *x, *y;
    const int64_t (*shapes)[2];
} cublas_job;
static void cublas_work(void *arg, cudaStream_t s) {
    (void)s; /* the handle's stream */
    const cublas_job *j = arg;
    const float one = 1.0f, zero = 0.0f;
    for (int i = 0; i < j->nw; i++) {
        const int k = i == j->nw - 1 ? 4 : i % 4, n = k == 4 ? j->L - 1 : j->L;
        const int rows = (int)j->shapes[k][0], cols = (int)j->shapes[k][1];
        /* column-major: y [rows][n] = W^T-stored [cols][rows]^T x [cols][n] */
        CB(cublasGemmEx(j->h, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, j->w[i], CUDA_R_16BF, cols, j->x,
                        CUDA_R_16BF, cols, &zero, j->y, CUDA_R_16BF, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
}

/* cuBLAS bf16 for the draft's products alone: per layer k|v|q, o, gate|up, down, then
 * the head, L (L - 1 for the head) bf16 activation rows, bf16 out, fp32 accumulate. */
static float cublas_draft_ms(const ddt_drafter_config *c, int64_t V, int reps, cudaStream_t s) {
    const int64_t H = c->hidden_size, qd = (int64_t)c->num_attention_heads * c->head_dim,
                  kvd = (int64_t)c->num_key_value_heads * c->head_dim, I = c->intermediate_size;
    const int L = c->block_size;
    const int64_t shapes[5][2] = {{2 * kvd + qd, H}, {H, qd}, {2 * I, H}, {H, I}, {V, H}}; /* rows, cols */
    size_t wmax = 0, xmax = 0, ymax = 0;
    for (int i = 0; i < 5; i++) {
        if ((size_t)(shapes[i][0] * shapes[i][1]) > wmax) wmax = (size_t)(shapes[i][0] * shapes[i][1]);
        if ((size_t)shapes[i][1] > xmax) xmax = (size_t)shapes[i][1];
        if ((size_t)shapes[i][0] > ymax) ymax = (size_t)shapes[i][0];
    }
    /* one weight buffer a product kind per layer, so no product reads another's bytes from L2 */
    const int nw = 4 * c->num_hidden_layers + 1;
    void **w = malloc(sizeof(void *) * (size_t)nw), *x, *y;
    for (int i = 0; i < nw; i++) {
        const int k = i == nw - 1 ? 4 : i % 4;
        CU(cudaMalloc(&w[i], (size_t)(shapes[k][0] * shapes[k][1]) * 2));
        CU(cudaMemset(w[i], 0, (size_t)(shapes[k][0] * shapes[k][1]) * 2));
    }
    CU(cudaMalloc(&x, xmax * (size_t)L * 2));
    CU(cudaMalloc(&y, ymax * (size_t)L * 2));
    CU(cudaMemset(x, 0, xmax * (size_t)L * 2));
    cublas_job j = {.nw = nw, .L = L, .w = w, .x = x, .y = y, .shapes = shapes};
    CB(cublasCreate(&j.h));
    CB(cublasSetStream(j.h, s));
    const float ms = time_median(cublas_work, &j, s, reps);
    CB(cublasDestroy(j.h));
    for (int i = 0; i < nw; i++) CU(cudaFree(w[i]));
    free(w);
    CU(cudaFree(x));
    CU(cudaFree(y));
    return ms;
}

int main(int argc, char **argv) {
    const char *dir = NULL;
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "usage: cuda_bench_draft DRAFTER_DIR [--quick]  (bench/make_dflash.py writes one)\n");
            return 2;
        } else dir = argv[i];
    }
    if (!dir) {
        fprintf(stderr, "usage: cuda_bench_draft DRAFTER_DIR [--quick]  (bench/make_dflash.py writes one)\n");
        return 2;
    }
    ddt_drafter_config c;
    OK(ddt_drafter_config_load(dir, &c, &err_));
    if (c.vocab_size < 1) {
        fprintf(stderr, "%s/config.json: no vocab_size (the bench sizes the target's head from it)\n", dir);
        return 2;
    }
    int32_t n_layers = c.num_target_layers;
    for (int i = 0; i < c.n_target_layers; i++)
        if (c.target_layer_ids[i] + 1 > n_layers) n_layers = c.target_layer_ids[i] + 1;
    const int reps = quick ? 5 : 21;
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const double bw = copy_bw(s);
    ddt_qweight embed, head;
    OK(ddt_cuda_qweight_random(DDT_Q_DENSE, DDT_DTYPE_BF16, c.vocab_size, c.hidden_size, 0.02f, 1, &embed, &err_));
    OK(ddt_cuda_qweight_random(DDT_Q_DENSE, DDT_DTYPE_BF16, c.vocab_size, c.hidden_size, 0.02f, 2, &head, &err_));
    const ddt_cuda_drafter_target base = {.hidden_size = c.hidden_size, .num_layers = n_layers,
                                         .vocab_size = c.vocab_size, .embed = &embed, .lm_head = &head};
    float *feat[DDT_DRAFTER_MAX_TARGET_LAYERS];
    for (int i = 0; i < c.n_target_layers; i++) {
        CU(cudaMalloc((void **)&feat[i], sizeof(float) * CHUNK * (size_t)c.hidden_size));
        OK(ddt_cuda_fill_uniform(feat[i], (int64_t)CHUNK * c.hidden_size, -1.0f, 1.0f, 10 + (uint64_t)i, s, &err_));
    }
    const timing fp = run_mode(dir, &base, DDT_CUDA_MM_FP32, c.n_target_layers, feat, reps, s);
    const timing tc = run_mode(dir, &base, DDT_CUDA_MM_TENSOR, c.n_target_layers, feat, reps, s);
    const float cub = cublas_draft_ms(&c, c.vocab_size, reps, s);
    /* the bytes a draft reads: every layer's q, k, v, o, gate, up, down (bf16) and the head */
    const double H = c.hidden_size, qd = (double)c.num_attention_heads * c.head_dim,
                 kvd = (double)c.num_key_value_heads * c.head_dim, I = c.intermediate_size;
    const double bytes = 2.0 * (c.num_hidden_layers * ((qd + 2 * kvd) * H + H * qd + 3 * I * H) + c.vocab_size * H);
    const double floor_ms = bytes / bw * 1e3; /* bytes read over the copy rate (read + write), as every bench here */
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("# One DFlash draft at %s's shape (%s)\n\n", dir, prop.name);
    printf("hidden %d, %d layers, %d / %d heads of %d, intermediate %d, vocab %d, block %d; context %d rows.\n"
           "Copy bandwidth measured in this run: %.0f GB/s (read + write); a draft reads %.2f GB (weights and head, "
           "bf16): floor %.3f ms.  Graph replays, median of %d.\n\n",
           c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
           c.intermediate_size, c.vocab_size, c.block_size, PRIMED, bw * 1e-9, bytes * 1e-9, floor_ms, reps);
    printf("| path | products on tensor cores | draft ms | of floor | GB/s | append 16 rows ms |\n"
           "|---|---:|---:|---:|---:|---:|\n");
    printf("| FP32 | %d | %.3f | %.2fx | %.0f | %.3f |\n", fp.tc_products, fp.draft_ms, fp.draft_ms / floor_ms,
           bytes / (fp.draft_ms * 1e-3) * 1e-9, fp.append_ms);
    printf("| tensor cores | %d | %.3f | %.2fx | %.0f | %.3f |\n", tc.tc_products, tc.draft_ms, tc.draft_ms / floor_ms,
           bytes / (tc.draft_ms * 1e-3) * 1e-9, tc.append_ms);
    printf("| cuBLAS bf16, the products alone | - | %.3f | %.2fx | %.0f | - |\n\n", cub, cub / floor_ms,
           bytes / (cub * 1e-3) * 1e-9);
    printf("tensor cores against FP32: %.2fx faster a draft; against cuBLAS's products alone: %.2fx\n",
           fp.draft_ms / tc.draft_ms, tc.draft_ms / cub);
    for (int i = 0; i < c.n_target_layers; i++) CU(cudaFree(feat[i]));
    ddt_cuda_qweight_free(&embed);
    ddt_cuda_qweight_free(&head);
    CU(cudaStreamDestroy(s));
    return g_failures ? 1 : 0;
}
