/*
 * test_cuda_kv.c — GPU KV commit (ddt_cuda_kv_commit) against its CPU twin
 * ddt_cpu_kv_commit (backend/cpu/kv.h) through the backend-op harness
 * (backend_ops.h, bitwise) on random caches and paths (odd layer counts,
 * bf16-sized and fp32-sized rows, rows wider than one staging slab, paths whose
 * rows overlap their destinations), comparing every bit of the cache (rows
 * outside the move must not change) and len; bad paths move nothing on the GPU
 * (the bytes as they were) and set the status.  Run by scripts/gpu-test.sh.
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kv.h"
#include "backend/cuda/kv_cuda.h"
#include "backend_ops.h"
#include "cuda_test.h"

static uint64_t g_rng = 0x243F6A8885A308D3ull;
static uint32_t rnd(void) { return ct_xorshift(&g_rng, 16); }

/* rb: row bytes, a multiple of 16 (so a whole number of floats for the CPU cache).
 * The cache holds random bytes, every float bit pattern (NaNs included): both
 * commits move bits, and the comparison is bitwise. */
static void run_case(int layers, int cap, int rb, int len, const int32_t *path, int m, int expect_ok) {
    size_t bytes = (size_t)layers * cap * rb;
    unsigned char *h = malloc(bytes), *got = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) h[i] = (unsigned char)rnd();
    /* the CPU twin on the same bytes; a path the GPU refuses must leave them as they were */
    ddt_cpu_kv ref;
    OK(ddt_cpu_kv_alloc(layers, rb / 4, cap, &ref, &err_));
    memcpy(ref.data, h, bytes);
    ref.len = len;
    if (expect_ok) OK(ddt_cpu_kv_commit(&ref, path, m, &err_));
    ddt_cuda_kv kv = {0};
    kv.n_layers = layers;
    kv.capacity = cap;
    kv.row_bytes = rb;
    int32_t *dpath, *dm;
    CU(cudaMalloc(&kv.data, bytes));
    CU(cudaMalloc((void **)&kv.len, 4));
    CU(cudaMalloc((void **)&kv.status, 4));
    CU(cudaMalloc((void **)&dpath, DDT_MAX_PATH * 4));
    CU(cudaMalloc((void **)&dm, 4));
    CU(cudaMemcpy(kv.data, h, bytes, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(kv.len, &len, 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dpath, path, (size_t)(m > 0 && m <= DDT_MAX_PATH ? m : 1) * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dm, &m, 4, cudaMemcpyHostToDevice));
    ddt_error err;
    if (ddt_cuda_kv_commit(&kv, dpath, dm, NULL, &err) != DDT_OK) {
        fprintf(stderr, "commit: %s\n", err.msg);
        exit(1);
    }
    CU(cudaDeviceSynchronize());
    int32_t new_len, status;
    CU(cudaMemcpy(got, kv.data, bytes, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(&new_len, kv.len, 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(&status, kv.status, 4, cudaMemcpyDeviceToHost));
    char what[96];
    snprintf(what, sizeof what, "kv commit layers %d cap %d row %d len %d m %d", layers, cap, rb, len, m);
    bo_compare(what, (const float *)got, ref.data, bytes / 4, (bo_cmp){.bitwise = true});
    CHECK(new_len == ref.len, "%s: len %d, CPU %d", what, new_len, ref.len);
    CHECK(new_len == (expect_ok ? len + m : len), "%s: len %d, want %d", what, new_len, expect_ok ? len + m : len);
    CHECK(status == (expect_ok ? DDT_CUDA_KV_OK : DDT_CUDA_KV_BAD_PATH), "status %d", status);
    CU(cudaFree(kv.data));
    CU(cudaFree(kv.len));
    CU(cudaFree(kv.status));
    CU(cudaFree(dpath));
    CU(cudaFree(dm));
    ddt_cpu_kv_free(&ref);
    free(h);
    free(got);
}

int main(void) {
    int cases = 0;
    const int row_bytes[] = {1152, 2304, 16, 4096 + 48};
    for (int it = 0; it < 120; it++) {
        int layers = 1 + (int)(rnd() % 7), rb = row_bytes[it % 4], cap = 40 + (int)(rnd() % 300);
        int m = 1 + (int)(rnd() % DDT_MAX_PATH), len = (int)(rnd() % (cap - 2 * m > 1 ? cap - 2 * m : 1));
        int32_t path[DDT_MAX_PATH];
        path[0] = 0;
        for (int k = 1; k < m; k++) path[k] = path[k - 1] + 1 + (int)(rnd() % (it % 2 ? 1 : 3));
        if (len + path[m - 1] >= cap) continue;
        run_case(layers, cap, rb, len, path, m, 1);
        cases++;
    }
    int32_t overlap[3] = {0, 2, 3}; /* row 2 is read for k = 1 and written for k = 2 */
    run_case(3, 64, 1152, 10, overlap, 3, 1);
    int32_t bad_root[2] = {1, 2}, not_inc[3] = {0, 3, 3}, past[2] = {0, 60};
    run_case(2, 64, 1152, 5, bad_root, 2, 0);
    run_case(2, 64, 1152, 5, not_inc, 3, 0);
    run_case(2, 64, 1152, 5, past, 2, 0);
    run_case(2, 64, 1152, 5, overlap, 0, 0); /* empty path */
    printf("kv commit: %d random cases + overlap + 4 bad paths checked bit for bit against ddt_cpu_kv_commit\n",
           cases);
    if (g_failures) {
        printf("test_cuda_kv: %d FAILED checks\n", g_failures);
        return 1;
    }
    printf("test_cuda_kv: all checks passed\n");
    return 0;
}
