/*
 * test_cuda_mla_verify.c — the GPU tree-verify MLA attention against the CPU
 * reference (ddt_cpu_mla_attention) on random bf16 inputs: odd prefix lengths
 * (0 .. 20001) x tree sizes (1 .. 64) x random ancestor trees, H = 64 and odd
 * head counts whose rows straddle the 64-row query tiles, bf16 and fp32 output,
 * a cache pitch wider than 576, cache rows past the tree and pitch padding
 * poisoned with NaN (bf16 0x7FC0), the workspace and the output pitch padding
 * poisoned too.  Checks: normalised error ||gpu - ref|| / ||ref|| < 1e-2 (the GPU
 * rounds P to bf16 for the tensor cores: relative rounding 2^-9 per weight, about
 * 1e-3 in the output, and a bf16 output adds as much again, so ~2e-3 is
 * expected; 1e-2 leaves room and still catches any wrong row or mask), the
 * log-sum-exp on the small cases (< 4e-3, see LSE_BOUND), two runs bitwise
 * equal, every merge path (cluster, the global combine in rounds of 8 splits
 * and staged; the cluster path refused past 8 grid splits) bitwise equal, padding untouched, and a bad n_prefix giving NaN; with fp32
 * output, the output's split planes for W_UV (out_planes, head-major rows) from
 * the auto and the global merge: the output the same bits, the planes its exact
 * bf16 split, their pitch padding untouched, a short pitch refused.
 * Usage: test_cuda_mla_verify [--quick]   (run by scripts/gpu-test.sh)
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/mla.h"
#include "backend/cpu/pool.h"
#include "backend/cuda/mla_verify_cuda.h"
#include "cuda_test.h"

#define ERR_BOUND 1e-2
/* The kernel's row sums add the bf16-rounded weights (so that they normalise
 * exactly what the tensor cores multiplied): each weight is off by at most 2^-9
 * relative, so the sum is too and ln(sum) by at most ~2e-3; with few visible
 * rows the error does not average out (1.8e-3 seen on the H200). */
#define LSE_BOUND 4e-3

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) { return ct_xorshift(&g_rng, 16); }
static float urand(void) { return (float)(rnd() & 0xFFFFFF) / 8388608.0f - 1.0f; } /* [-1, 1) */

static float bf2f(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint16_t f2bf(float f) { /* round to nearest even; inputs here are finite */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#define BF16_NAN 0x7FC0u

typedef struct mla_case {
    int np, T, H, out_fp32, kv_ld, out_ld;
} mla_case;

static ddt_cpu_pool *g_pool;
static int g_diag = 0;

/* the paths whose merge goes through the workspace or may (auto), each run by the plane check;
   the cluster path has its own condition in run_case (the bad-prefix check runs all four) */
static const int32_t k_global_paths[3] = {DDT_MLA_PATH_AUTO, DDT_MLA_PATH_GLOBAL, DDT_MLA_PATH_GLOBAL_STAGED};
static const char *const k_global_path_names[3] = {"auto", "global", "staged global"};
static double g_worst = 0.0;

/* One GPU run into *out (poisoned first); the output bytes and lse in host memory.
 * Returns the run's status (nothing copied unless DDT_OK), the error in *e. */
static ddt_status try_run(ddt_cuda_mla_verify *a, size_t out_bytes, size_t ws_bytes, int path, void *host_out,
                          float *host_lse, size_t lse_n, ddt_error *e) {
    CU(cudaMemset(a->out, 0xFF, out_bytes));
    CU(cudaMemset(a->workspace, 0xFF, ws_bytes));
    CU(cudaMemset(a->lse, 0xFF, lse_n * 4));
    a->path = path;
    const ddt_status st = ddt_cuda_mla_verify_run(a, NULL, e);
    if (st != DDT_OK) return st;
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(host_out, a->out, out_bytes, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(host_lse, a->lse, lse_n * 4, cudaMemcpyDeviceToHost));
    return DDT_OK;
}

/* try_run that must succeed. */
static void gpu_run(ddt_cuda_mla_verify *a, size_t out_bytes, size_t ws_bytes, int path, void *host_out, float *host_lse,
                    size_t lse_n) {
    OK(try_run(a, out_bytes, ws_bytes, path, host_out, host_lse, lse_n, &err_));
}

static void run_case(const mla_case *c, int check_paths) {
    const int T = c->T, H = c->H, np = c->np, rows_used = np + T;
    const int kv_rows = rows_used + 45, max_prefix = np + 333;
    const size_t n_rows = (size_t)T * H;
    const float scale = 0.14468f; /* K2.6: 192^-0.5 * mscale^2 */

    /* random ancestor tree: node 0 is the root, parent[j] < j */
    uint64_t vis[64];
    int parent[64];
    for (int j = 0; j < T; j++) {
        parent[j] = j == 0 ? -1 : (rnd() % 3 == 0 ? j - 1 : (int)(rnd() % (uint32_t)j));
        vis[j] = (j == 0 ? 0ull : vis[parent[j]]) | (1ull << j);
    }

    /* inputs: bf16 q and cache; NaN past the tree's rows and in the pitch padding */
    const size_t q_n = n_rows * DDT_MLA_DK, kv_n = (size_t)kv_rows * c->kv_ld;
    uint16_t *hq = malloc(q_n * 2), *hkv = malloc(kv_n * 2);
    float *qf = malloc(q_n * 4), *kvf = malloc((size_t)rows_used * DDT_MLA_DK * 4);
    for (size_t i = 0; i < q_n; i++) {
        hq[i] = f2bf(urand());
        qf[i] = bf2f(hq[i]);
    }
    for (int r = 0; r < kv_rows; r++)
        for (int k = 0; k < c->kv_ld; k++) {
            uint16_t v = (r < rows_used && k < DDT_MLA_DK) ? f2bf(urand()) : (uint16_t)BF16_NAN;
            hkv[(size_t)r * c->kv_ld + k] = v;
            if (r < rows_used && k < DDT_MLA_DK) kvf[(size_t)r * DDT_MLA_DK + k] = bf2f(v);
        }

    /* CPU reference */
    float *ref = malloc(n_rows * DDT_MLA_DV * 4);
    ddt_mla_attn at = {0};
    at.n = T;
    at.n_heads = H;
    at.rank = DDT_MLA_DV;
    at.rope_dim = DDT_MLA_DK - DDT_MLA_DV;
    at.q_lat = qf;
    at.q_lat_ld_t = (int64_t)H * DDT_MLA_DK;
    at.q_lat_ld_h = DDT_MLA_DK;
    at.q_rope = qf + DDT_MLA_DV;
    at.q_rope_ld_t = at.q_lat_ld_t;
    at.q_rope_ld_h = DDT_MLA_DK;
    at.kv = kvf;
    at.kv_ld = DDT_MLA_DK;
    at.n_prefix = np;
    at.vis = vis;
    at.vis_words = 1;
    at.scale = scale;
    at.out = ref;
    at.out_ld_t = (int64_t)H * DDT_MLA_DV;
    at.out_ld_h = DDT_MLA_DV;
    ddt_cpu_mla_attention(g_pool, &at);

    /* device buffers */
    ddt_cuda_mla_verify a = {0};
    const size_t esz = c->out_fp32 ? 4 : 2, out_bytes = n_rows * (size_t)c->out_ld * esz;
    const size_t ws = ddt_cuda_mla_verify_workspace(T, H, max_prefix);
    void *dq, *dkv, *dout, *dws;
    int32_t *dnp;
    uint64_t *dvis;
    float *dlse;
    CU(cudaMalloc(&dq, q_n * 2));
    CU(cudaMalloc(&dkv, kv_n * 2));
    CU(cudaMalloc(&dout, out_bytes));
    CU(cudaMalloc(&dws, ws));
    CU(cudaMalloc((void **)&dnp, 4));
    CU(cudaMalloc((void **)&dvis, 64 * 8));
    CU(cudaMalloc((void **)&dlse, n_rows * 4));
    CU(cudaMemcpy(dq, hq, q_n * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dkv, hkv, kv_n * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dnp, &np, 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dvis, vis, (size_t)T * 8, cudaMemcpyHostToDevice));
    a.n_tokens = T;
    a.n_heads = H;
    a.q = dq;
    a.kv = dkv;
    a.kv_ld = c->kv_ld;
    a.kv_rows = kv_rows;
    a.n_prefix = dnp;
    a.max_prefix = max_prefix;
    a.vis = dvis;
    a.scale = scale;
    a.out = dout;
    a.out_fp32 = c->out_fp32;
    a.out_ld = c->out_ld;
    a.lse = dlse;
    a.workspace = dws;

    unsigned char *got = malloc(out_bytes), *again = malloc(out_bytes);
    float *lse = malloc(n_rows * 4), *lse2 = malloc(n_rows * 4);
    gpu_run(&a, out_bytes, ws, DDT_MLA_PATH_AUTO, got, lse, n_rows);

    /* error against the reference; the pitch padding must still hold the poison */
    double num = 0.0, den = 0.0, maxabs = 0.0;
    int bad_pad = 0, nonfinite = 0;
    for (size_t r = 0; r < n_rows; r++) {
        for (int k = 0; k < c->out_ld; k++) {
            size_t idx = r * (size_t)c->out_ld + k;
            if (k >= DDT_MLA_DV) {
                unsigned char *b = got + idx * esz;
                for (size_t e = 0; e < esz; e++) bad_pad += b[e] != 0xFF;
                continue;
            }
            float g = c->out_fp32 ? ((float *)got)[idx] : bf2f(((uint16_t *)got)[idx]);
            float rv = ref[r * DDT_MLA_DV + k];
            if (!isfinite(g)) nonfinite++;
            double d = (double)g - rv;
            num += d * d;
            den += (double)rv * rv;
            if (fabs(d) > maxabs) maxabs = fabs(d);
        }
    }
    double nerr = sqrt(num / (den > 0 ? den : 1.0));
    if (nerr > g_worst) g_worst = nerr;

    /* log-sum-exp, on the cases small enough for a plain double loop */
    double lse_err = -1.0;
    if ((double)n_rows * rows_used <= 4e6) {
        lse_err = 0.0;
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                const float *qr = qf + ((size_t)t * H + h) * DDT_MLA_DK;
                double mx = -INFINITY, sum = 0.0;
                double *sc = malloc(sizeof(double) * (size_t)rows_used);
                int n_sc = 0;
                for (int j = 0; j < rows_used; j++) {
                    if (j >= np && !((vis[t] >> (j - np)) & 1)) continue;
                    double d = 0.0;
                    for (int k = 0; k < DDT_MLA_DK; k++) d += (double)qr[k] * kvf[(size_t)j * DDT_MLA_DK + k];
                    sc[n_sc++] = d * scale;
                    if (d * scale > mx) mx = d * scale;
                }
                for (int j = 0; j < n_sc; j++) sum += exp(sc[j] - mx);
                free(sc);
                double e = fabs(lse[(size_t)t * H + h] - (mx + log(sum)));
                if (!(e <= lse_err)) lse_err = e; /* NaN propagates */
            }
        CHECK(lse_err < LSE_BOUND, "np %d T %d H %d: lse error %.3g", np, T, H, lse_err);
    }

    if ((nerr >= ERR_BOUND || nonfinite) && g_diag++ < 3) {
        /* where it goes wrong: per 64-column chunk (warpgroup halves, V tiles) and per
         * 16-row group of the 64-row query tiles (warps); lse right + output wrong = P V */
        printf("  diagnosis np %d T %d H %d: error by column chunk:", np, T, H);
        for (int ch = 0; ch < 8; ch++) {
            double ea = 0, eb = 0;
            for (size_t r = 0; r < n_rows; r++)
                for (int k = ch * 64; k < ch * 64 + 64; k++) {
                    size_t idx = r * (size_t)c->out_ld + k;
                    float g = c->out_fp32 ? ((float *)got)[idx] : bf2f(((uint16_t *)got)[idx]);
                    double d = (double)g - ref[r * DDT_MLA_DV + k];
                    ea += d * d;
                    eb += (double)ref[r * DDT_MLA_DV + k] * ref[r * DDT_MLA_DV + k];
                }
            printf(" %.2g", sqrt(ea / (eb > 0 ? eb : 1)));
        }
        printf("\n  by row group (row %% 64 / 16):");
        for (int rg = 0; rg < 4; rg++) {
            double ea = 0, eb = 0;
            for (size_t r = 0; r < n_rows; r++) {
                if ((int)(r % 64) / 16 != rg) continue;
                for (int k = 0; k < DDT_MLA_DV; k++) {
                    size_t idx = r * (size_t)c->out_ld + k;
                    float g = c->out_fp32 ? ((float *)got)[idx] : bf2f(((uint16_t *)got)[idx]);
                    double d = (double)g - ref[r * DDT_MLA_DV + k];
                    ea += d * d;
                    eb += (double)ref[r * DDT_MLA_DV + k] * ref[r * DDT_MLA_DV + k];
                }
            }
            printf(" %.2g", sqrt(ea / (eb > 0 ? eb : 1)));
        }
        printf("\n  row 0: gpu");
        for (int k = 0; k < 6; k++)
            printf(" %.4f", c->out_fp32 ? ((float *)got)[k] : bf2f(((uint16_t *)got)[k]));
        printf("  ref");
        for (int k = 0; k < 6; k++) printf(" %.4f", ref[k]);
        printf("  lse gpu %.5f\n", lse[0]);
    }
    CHECK(nonfinite == 0, "np %d T %d H %d: %d non-finite outputs", np, T, H, nonfinite);
    CHECK(nerr < ERR_BOUND, "np %d T %d H %d: normalised error %.3g", np, T, H, nerr);
    CHECK(bad_pad == 0, "np %d T %d H %d: %d padding bytes written", np, T, H, bad_pad);

    /* determinism: the same launch again, and each merge path, bit for bit */
    gpu_run(&a, out_bytes, ws, DDT_MLA_PATH_AUTO, again, lse2, n_rows);
    CHECK(memcmp(got, again, out_bytes) == 0 && memcmp(lse, lse2, n_rows * 4) == 0,
          "np %d T %d H %d: second run differs", np, T, H);
    int paths = 1;
    if (check_paths) {
        gpu_run(&a, out_bytes, ws, DDT_MLA_PATH_GLOBAL, again, lse2, n_rows);
        CHECK(memcmp(got, again, out_bytes) == 0 && memcmp(lse, lse2, n_rows * 4) == 0,
              "np %d T %d H %d: global-merge path differs", np, T, H);
        paths++;
        /* the staged combine kernel (GLOBAL's past 8 splits) at this case's split count */
        gpu_run(&a, out_bytes, ws, DDT_MLA_PATH_GLOBAL_STAGED, again, lse2, n_rows);
        CHECK(memcmp(got, again, out_bytes) == 0 && memcmp(lse, lse2, n_rows * 4) == 0,
              "np %d T %d H %d: staged global-merge path differs", np, T, H);
        paths++;
        /* the cluster path: taken whenever the grid's splits (the bound on S for max_prefix)
           fit one cluster of 8, refused past 8 */
        const int one_cluster = ddt_cuda_mla_verify_grid_splits(T, H, max_prefix) <= 8;
        ddt_error e;
        const ddt_status cst = try_run(&a, out_bytes, ws, DDT_MLA_PATH_CLUSTER, again, lse2, n_rows, &e);
        CHECK(one_cluster ? cst == DDT_OK : cst == DDT_ERR_UNSUPPORTED, "np %d T %d H %d: cluster path %s (%s)", np,
              T, H, one_cluster ? "refused" : "taken past 8 grid splits", cst == DDT_OK ? "" : e.msg);
        if (cst == DDT_OK) {
            CHECK(memcmp(got, again, out_bytes) == 0 && memcmp(lse, lse2, n_rows * 4) == 0,
                  "np %d T %d H %d: cluster-merge path differs", np, T, H);
            paths++;
        }
    }
    /* fp32 output: its split planes as W_UV reads them (head-major rows h * T + t, a
       pitch past 512), written beside it by the merge of either path; the output the
       same bits, the planes its bf16 split, the rest of the planes poison */
    if (c->out_fp32) {
        const int64_t pitch = DDT_MLA_DV + 8;
        const size_t pn = (size_t)H * (size_t)T * (size_t)pitch;
        uint16_t *dpl, *hpl = malloc(2 * pn * 2);
        CU(cudaMalloc((void **)&dpl, 2 * pn * 2));
        for (int pass = 0; pass < (check_paths ? 3 : 1); pass++) {
            CU(cudaMemset(dpl, 0xFF, 2 * pn * 2));
            a.out_planes = (ddt_cuda_split_planes){dpl, dpl + pn, pitch};
            gpu_run(&a, out_bytes, ws, k_global_paths[pass], again, lse2, n_rows);
            a.out_planes = (ddt_cuda_split_planes){NULL, NULL, 0};
            CU(cudaMemcpy(hpl, dpl, 2 * pn * 2, cudaMemcpyDeviceToHost));
            int64_t bad = 0, stray = 0;
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++)
                    for (int64_t k = 0; k < pitch; k++) {
                        const size_t r = ((size_t)h * T + t) * (size_t)pitch + (size_t)k;
                        if (k >= DDT_MLA_DV) {
                            stray += hpl[r] != 0xFFFF || hpl[pn + r] != 0xFFFF;
                            continue;
                        }
                        const float v = ((const float *)got)[((size_t)t * H + h) * (size_t)c->out_ld + (size_t)k];
                        const uint16_t hi = f2bf(v), lo = f2bf(v - bf2f(hi));
                        bad += hpl[r] != hi || hpl[pn + r] != lo;
                    }
            CHECK(memcmp(got, again, out_bytes) == 0 && bad == 0 && stray == 0,
                  "np %d T %d H %d %s path: output with split planes %s, %lld planes values not its split, %lld stray",
                  np, T, H, k_global_path_names[pass], memcmp(got, again, out_bytes) ? "differs" : "the same",
                  (long long)bad, (long long)stray);
        }
        /* refused: planes of bf16 output, a pitch under 512 */
        a.out_planes = (ddt_cuda_split_planes){dpl, dpl + pn, DDT_MLA_DV - 4};
        ddt_error e;
        CHECK(ddt_cuda_mla_verify_run(&a, NULL, &e) == DDT_ERR_INVALID && strstr(e.msg, "pitch") != NULL,
              "split planes of pitch %d accepted (%s)", DDT_MLA_DV - 4, e.msg);
        a.out_planes = (ddt_cuda_split_planes){NULL, NULL, 0};
        CU(cudaFree(dpl));
        free(hpl);
    }

    int32_t S, bps;
    ddt_cuda_mla_verify_plan(T, H, np, &S, &bps);
    char lse_txt[32];
    if (lse_err < 0)
        snprintf(lse_txt, sizeof lse_txt, "n/a");
    else
        snprintf(lse_txt, sizeof lse_txt, "%.1e", lse_err);
    printf("np %5d T %2d H %2d %s: splits %3d x %3d blocks  err %.2e  max|d| %.2e  lse %s  paths %d\n", np, T, H,
           c->out_fp32 ? "f32" : "b16", S, bps, nerr, maxabs, lse_txt, paths);
    fflush(stdout);

    CU(cudaFree(dq));
    CU(cudaFree(dkv));
    CU(cudaFree(dout));
    CU(cudaFree(dws));
    CU(cudaFree(dnp));
    CU(cudaFree(dvis));
    CU(cudaFree(dlse));
    free(hq);
    free(hkv);
    free(qf);
    free(kvf);
    free(ref);
    free(got);
    free(again);
    free(lse);
    free(lse2);
}

/* *n_prefix past max_prefix: every output must come out NaN (no fault), on every path;
 * the cluster path refused past 8 grid splits. */
static void bad_prefix_case(int T, int max_prefix) {
    const int H = 64, np = max_prefix + 1, kv_rows = 300;
    ddt_cuda_mla_verify a = {0};
    size_t n_rows = (size_t)T * H, out_bytes = n_rows * DDT_MLA_DV * 2, ws = ddt_cuda_mla_verify_workspace(T, H, max_prefix);
    void *dq, *dkv, *dout, *dws;
    int32_t *dnp;
    uint64_t *dvis;
    CU(cudaMalloc(&dq, n_rows * DDT_MLA_DK * 2));
    CU(cudaMalloc(&dkv, (size_t)kv_rows * DDT_MLA_DK * 2));
    CU(cudaMalloc(&dout, out_bytes));
    CU(cudaMalloc(&dws, ws));
    CU(cudaMalloc((void **)&dnp, 4));
    CU(cudaMalloc((void **)&dvis, 64 * 8));
    CU(cudaMemset(dq, 0, n_rows * DDT_MLA_DK * 2));
    CU(cudaMemset(dkv, 0, (size_t)kv_rows * DDT_MLA_DK * 2));
    CU(cudaMemset(dout, 0, out_bytes));
    CU(cudaMemset(dvis, 0xFF, 64 * 8));
    CU(cudaMemcpy(dnp, &np, 4, cudaMemcpyHostToDevice));
    a.n_tokens = T;
    a.n_heads = H;
    a.q = dq;
    a.kv = dkv;
    a.kv_ld = DDT_MLA_DK;
    a.kv_rows = kv_rows;
    a.n_prefix = dnp;
    a.max_prefix = max_prefix;
    a.vis = dvis;
    a.scale = 0.1f;
    a.out = dout;
    a.out_ld = DDT_MLA_DV;
    a.workspace = dws;
    static const int32_t all_paths[4] = {DDT_MLA_PATH_AUTO, DDT_MLA_PATH_GLOBAL, DDT_MLA_PATH_GLOBAL_STAGED,
                                         DDT_MLA_PATH_CLUSTER};
    for (int pi = 0; pi < 4; pi++) {
        const int32_t path = all_paths[pi];
        a.path = path;
        CU(cudaMemset(dout, 0, out_bytes));
        ddt_error e;
        const ddt_status st = ddt_cuda_mla_verify_run(&a, NULL, &e);
        if (path == DDT_MLA_PATH_CLUSTER && st == DDT_ERR_UNSUPPORTED && ddt_cuda_mla_verify_grid_splits(T, H, max_prefix) > 8)
            continue; /* past 8 grid splits: refused, as it must be */
        CHECK(st == DDT_OK, "bad n_prefix, T %d, max prefix %d, path %d: %s", T, max_prefix, path, e.msg);
        CU(cudaDeviceSynchronize());
        uint16_t *h = malloc(out_bytes);
        CU(cudaMemcpy(h, dout, out_bytes, cudaMemcpyDeviceToHost));
        int nan = 0;
        for (size_t i = 0; i < out_bytes / 2; i++) nan += isnan(bf2f(h[i]));
        CHECK(nan == (int)(out_bytes / 2), "bad n_prefix, T %d, max prefix %d, path %d: %d of %zu outputs NaN", T,
              max_prefix, path, nan, out_bytes / 2);
        free(h);
    }
    CU(cudaFree(dq));
    CU(cudaFree(dkv));
    CU(cudaFree(dout));
    CU(cudaFree(dws));
    CU(cudaFree(dnp));
    CU(cudaFree(dvis));
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    OK(ddt_cpu_pool_create(0, &g_pool, &err_));
    const int nps[] = {1, 37, 1000, 4099, 20001};
    const int Ts[] = {1, 3, 16, 33, 64};
    int cases = 0;
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 5; j++) {
            if (quick && (nps[i] > 1000 || Ts[j] > 16)) continue;
            mla_case c = {nps[i], Ts[j], 64, (i + j) % 2, (i + j) % 3 == 0 ? 584 : 576, (i + 2 * j) % 3 == 0 ? 520 : 512};
            run_case(&c, nps[i] <= 4099);
            cases++;
        }
    /* no prefix; odd head counts (partial query tiles, heads straddling tiles); more sizes */
    const mla_case extra[] = {{0, 3, 64, 0, 576, 512},    {37, 3, 16, 1, 576, 512},   {1000, 5, 24, 0, 584, 520},
                              {130, 17, 64, 1, 576, 512}, {63, 64, 64, 0, 576, 512},  {64, 2, 64, 0, 576, 512},
                              {777, 9, 8, 1, 576, 512},   {4099, 40, 64, 0, 576, 512}, {9001, 1, 64, 1, 576, 512},
                              {5003, 2, 64, 0, 584, 512}};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        if (quick && extra[i].np > 1000) continue;
        run_case(&extra[i], 1);
        cases++;
    }
    bad_prefix_case(3, 100);
    bad_prefix_case(1, 20000);
    ddt_cpu_pool_destroy(g_pool);
    printf("mla verify: %d cases, worst normalised error %.3g (bound %.0e)\n", cases, g_worst, ERR_BOUND);
    if (g_failures) {
        printf("test_cuda_mla_verify: %d FAILED checks\n", g_failures);
        return 1;
    }
    printf("test_cuda_mla_verify: all checks passed\n");
    return 0;
}
