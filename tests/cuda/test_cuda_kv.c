/*
 * test_cuda_kv.c — GPU KV commit (ddt_cuda_kv_commit) against its CPU twin
 * ddt_cpu_kv_commit (backend/cpu/kv.h) through the backend-op harness
 * (backend_ops.h, bitwise) on random caches and paths (odd layer counts,
 * bf16-sized and fp32-sized rows, rows wider than one staging slab, paths whose
 * rows overlap their destinations), comparing every bit of the cache (rows
 * outside the move must not change) and len; bad paths move nothing on the GPU
 * (the bytes as they were) and set the status.
 *
 * Every case runs both ways the commit launches: without an arrival ticket (the
 * copy kernel, then the one-thread advance) and with one (one launch, the last
 * block advancing), each from the same bytes, each bitwise against the CPU, the
 * ticket back at 0 after every fused commit.  Then random paths (1..DDT_MAX_PATH
 * long, odd layer counts, row widths random multiples of 16) good and bad (a root
 * off 0, a step that does not increase, an empty or too long path, a last row at
 * or past capacity), and sequences of commits on one cache (5 in a row eagerly,
 * and one captured CUDA graph replayed with a new path each time, bad paths
 * among them) against a CPU model of commit + advance after every commit: a
 * ticket left behind would make the next commit skip its advance or advance
 * twice.  Run by scripts/gpu-test.sh.
 */
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kv.h"
#include "backend/cuda/kv_cuda.h"
#include "backend_ops.h"
#include "cuda_test.h"

static uint64_t g_rng = 0x243F6A8885A308D3ull;
static uint32_t rnd(void) { return ct_xorshift(&g_rng, 16); }

/* The commit rule, on the host: what every block and the advance decide. */
static bool path_ok_host(const int32_t *path, int m, int len, int cap) {
    if (m < 1 || m > DDT_MAX_PATH || len < 0 || path[0] != 0) return false;
    for (int k = 1; k < m; k++)
        if (path[k] <= path[k - 1]) return false;
    return len + path[m - 1] < cap;
}

/* A device cache of layers x cap rows of rb bytes with len, status and (fused)
 * a zeroed ticket. */
static ddt_cuda_kv kv_alloc(int layers, int cap, int rb, bool fused) {
    ddt_cuda_kv kv = {0};
    kv.n_layers = layers;
    kv.capacity = cap;
    kv.row_bytes = rb;
    CU(cudaMalloc(&kv.data, (size_t)layers * cap * rb));
    CU(cudaMalloc((void **)&kv.len, 4));
    CU(cudaMalloc((void **)&kv.status, 4));
    if (fused) {
        CU(cudaMalloc((void **)&kv.ticket, 4));
        CU(cudaMemset(kv.ticket, 0, 4));
    }
    return kv;
}

static void kv_release(ddt_cuda_kv *kv) {
    CU(cudaFree(kv->data));
    CU(cudaFree(kv->len));
    CU(cudaFree(kv->status));
    if (kv->ticket) CU(cudaFree(kv->ticket));
}

/* The device cache against the expected bytes, len and status (and a ticket at 0). */
static void kv_expect(const char *what, const ddt_cuda_kv *kv, const void *want, int32_t want_len,
                      int32_t want_status, unsigned char *scratch) {
    const size_t bytes = (size_t)kv->n_layers * kv->capacity * kv->row_bytes;
    int32_t len, status;
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(scratch, kv->data, bytes, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(&len, kv->len, 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(&status, kv->status, 4, cudaMemcpyDeviceToHost));
    bo_compare(what, (const float *)scratch, want, bytes / 4, (bo_cmp){.bitwise = true});
    CHECK(len == want_len, "%s: len %d, want %d", what, len, want_len);
    CHECK(status == want_status, "%s: status %d, want %d", what, status, want_status);
    if (kv->ticket) {
        uint32_t t;
        CU(cudaMemcpy(&t, kv->ticket, 4, cudaMemcpyDeviceToHost));
        CHECK(t == 0, "%s: ticket left at %u", what, t);
    }
}

/* rb: row bytes, a multiple of 16 (so a whole number of floats for the CPU cache).
 * The cache holds random bytes, every float bit pattern (NaNs included): both
 * commits move bits, and the comparison is bitwise.  expect_ok: the test's own
 * claim, checked against the host rule; both launch forms run from the same bytes. */
static void run_case(int layers, int cap, int rb, int len, const int32_t *path, int m, int expect_ok) {
    size_t bytes = (size_t)layers * cap * rb;
    unsigned char *h = malloc(bytes), *got = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) h[i] = (unsigned char)rnd();
    CHECK(path_ok_host(path, m, len, cap) == (expect_ok != 0), "case layers %d cap %d len %d m %d: the rule says %d",
          layers, cap, len, m, !expect_ok);
    /* the CPU twin on the same bytes; a path the GPU refuses must leave them as they were */
    ddt_cpu_kv ref;
    OK(ddt_cpu_kv_alloc(layers, rb / 4, cap, &ref, &err_));
    memcpy(ref.data, h, bytes);
    ref.len = len;
    if (expect_ok) OK(ddt_cpu_kv_commit(&ref, path, m, &err_));
    int32_t *dpath, *dm;
    CU(cudaMalloc((void **)&dpath, DDT_MAX_PATH * 4));
    CU(cudaMalloc((void **)&dm, 4));
    CU(cudaMemcpy(dpath, path, (size_t)(m > 0 && m <= DDT_MAX_PATH ? m : 1) * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dm, &m, 4, cudaMemcpyHostToDevice));
    for (int fused = 0; fused < 2; fused++) {
        ddt_cuda_kv kv = kv_alloc(layers, cap, rb, fused);
        /* a status the commit must overwrite either way */
        const int32_t stale = expect_ok ? DDT_CUDA_KV_BAD_PATH : DDT_CUDA_KV_OK;
        CU(cudaMemcpy(kv.data, h, bytes, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(kv.len, &len, 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(kv.status, &stale, 4, cudaMemcpyHostToDevice));
        ddt_error err;
        if (ddt_cuda_kv_commit(&kv, dpath, dm, NULL, &err) != DDT_OK) {
            fprintf(stderr, "commit: %s\n", err.msg);
            exit(1);
        }
        char what[128];
        snprintf(what, sizeof what, "kv commit (%s) layers %d cap %d row %d len %d m %d",
                 fused ? "one launch" : "two launches", layers, cap, rb, len, m);
        kv_expect(what, &kv, ref.data, expect_ok ? len + m : len,
                  expect_ok ? DDT_CUDA_KV_OK : DDT_CUDA_KV_BAD_PATH, got);
        CHECK(!expect_ok || ref.len == len + m, "%s: CPU len %d", what, ref.len);
        kv_release(&kv);
    }
    CU(cudaFree(dpath));
    CU(cudaFree(dm));
    ddt_cpu_kv_free(&ref);
    free(h);
    free(got);
}

/* A random path of m rows (0, then strictly increasing steps of 1..max_step). */
static void random_path(int32_t *path, int m, int max_step) {
    path[0] = 0;
    for (int k = 1; k < m; k++) path[k] = path[k - 1] + 1 + (int)(rnd() % (uint32_t)max_step);
}

/* Random paths, good and broken in each way the rule refuses, through run_case. */
static int random_cases(void) {
    int cases = 0;
    for (int it = 0; it < 160; it++) {
        const int layers = 1 + 2 * (int)(rnd() % 5);                /* odd: 1..9 */
        const int rb = 16 * (1 + (int)(rnd() % 300));                /* 16..4800, past one slab */
        const int m = 1 + (int)(rnd() % DDT_MAX_PATH), step = 1 + (int)(rnd() % 3);
        int32_t path[DDT_MAX_PATH];
        random_path(path, m, step);
        const int cap = path[m - 1] + 2 + (int)(rnd() % 200);
        int len = (int)(rnd() % (uint32_t)(cap - path[m - 1])); /* len + path[m-1] < cap */
        int mm = m;
        switch (it % 8) {
        case 0: case 1: case 2: break;                                  /* good */
        case 3: len = cap - 1 - path[m - 1]; break;                     /* good, the last row at cap - 1 */
        case 4: len = cap - path[m - 1] + (int)(rnd() % 3); break;      /* last row at or past capacity */
        case 5: path[0] = 1 + (int)(rnd() % 3); break;                  /* the root is not 0 */
        case 6:                                                          /* a step that does not increase */
            if (m < 2) { path[0] = 1; break; }
            { const int k = 1 + (int)(rnd() % (uint32_t)(m - 1)); path[k] = path[k - 1] - (int)(rnd() % 2); }
            break;
        case 7: mm = rnd() % 2 ? 0 : DDT_MAX_PATH + 1 + (int)(rnd() % 5); break; /* empty or too long */
        }
        run_case(layers, cap, rb, len, path, mm, path_ok_host(path, mm, len, cap));
        cases++;
    }
    return cases;
}

/* One cache, `steps` commits with a new random path each (good, and bad at the
 * steps `bad` marks: bit k for step k), from len0: eagerly, or as one captured
 * graph replayed (the path and its length written to device memory between
 * replays), against the CPU twin + the host rule after every commit. */
static void commit_sequence(int layers, int cap, int rb, int len0, int steps, unsigned bad, bool graph) {
    const size_t bytes = (size_t)layers * cap * rb;
    unsigned char *h = malloc(bytes), *got = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) h[i] = (unsigned char)rnd();
    ddt_cpu_kv ref;
    OK(ddt_cpu_kv_alloc(layers, rb / 4, cap, &ref, &err_));
    memcpy(ref.data, h, bytes);
    ref.len = len0;
    ddt_cuda_kv kv = kv_alloc(layers, cap, rb, true);
    int32_t *dpath, *dm, status = DDT_CUDA_KV_OK;
    CU(cudaMalloc((void **)&dpath, DDT_MAX_PATH * 4));
    CU(cudaMalloc((void **)&dm, 4));
    CU(cudaMemcpy(kv.data, h, bytes, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(kv.len, &len0, 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(kv.status, &status, 4, cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize()); /* the copies landed before anything on the non-blocking stream reads them */
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    if (graph) {
        CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        ddt_error e;
        const ddt_status st = ddt_cuda_kv_commit(&kv, dpath, dm, (ddt_cuda_stream)s, &e);
        CU(cudaStreamEndCapture(s, &g));
        CHECK(st == DDT_OK, "commit under capture: %s", e.msg);
        if (st != DDT_OK) exit(1);
        CU(cudaGraphInstantiate(&ge, g, 0));
    }
    for (int step = 0; step < steps; step++) {
        int32_t path[DDT_MAX_PATH] = {0};
        int m = 1 + (int)(rnd() % DDT_MAX_PATH);
        /* keep the good paths inside the cache: shorter ones when it fills up */
        while (m > 1 && ref.len + 2 * m > cap) m--;
        random_path(path, m, 2);
        while (path[m - 1] >= cap - ref.len && m > 1) m--;
        if (bad >> step & 1) {
            if (step % 2) path[0] = 2;
            else path[m - 1] = cap - ref.len + (int)(rnd() % 4); /* past capacity */
            if (m == 1 && step % 2 == 0) path[0] = 0, m = 0;      /* (an empty path instead) */
        }
        const bool ok = path_ok_host(path, m, ref.len, cap);
        CHECK(ok == !(bad >> step & 1), "sequence step %d: the test built a %s path by mistake", step,
              ok ? "good" : "bad");
        const int32_t want_len = ok ? ref.len + m : ref.len;
        if (ok) OK(ddt_cpu_kv_commit(&ref, path, m, &err_));
        status = ok ? DDT_CUDA_KV_OK : DDT_CUDA_KV_BAD_PATH;
        /* on the commit's stream, so the path is in place when it runs */
        CU(cudaMemcpyAsync(dpath, path, sizeof path, cudaMemcpyHostToDevice, s));
        CU(cudaMemcpyAsync(dm, &m, 4, cudaMemcpyHostToDevice, s));
        if (graph) CU(cudaGraphLaunch(ge, s));
        else OK(ddt_cuda_kv_commit(&kv, dpath, dm, (ddt_cuda_stream)s, &err_));
        CU(cudaStreamSynchronize(s));
        char what[128];
        snprintf(what, sizeof what, "kv commit %s %d of %d: layers %d cap %d row %d m %d (%s)",
                 graph ? "graph replay" : "eager", step + 1, steps, layers, cap, rb, m, ok ? "good" : "bad");
        kv_expect(what, &kv, ref.data, want_len, status, got);
        CHECK(ref.len == want_len, "%s: CPU len %d", what, ref.len);
    }
    if (graph) {
        CU(cudaGraphExecDestroy(ge));
        CU(cudaGraphDestroy(g));
    }
    CU(cudaStreamDestroy(s));
    kv_release(&kv);
    CU(cudaFree(dpath));
    CU(cudaFree(dm));
    ddt_cpu_kv_free(&ref);
    free(h);
    free(got);
}

/* The launcher refuses what it cannot run, with a message, and launches nothing. */
static void refused(void) {
    ddt_cuda_kv kv = kv_alloc(1, 8, 16, true);
    int32_t *d;
    CU(cudaMalloc((void **)&d, DDT_MAX_PATH * 4));
    ddt_error e;
    ddt_cuda_kv bad = kv;
    bad.row_bytes = 24;
    CHECK(ddt_cuda_kv_commit(&bad, d, d, NULL, &e) == DDT_ERR_RANGE, "a row of 24 bytes accepted");
    bad = kv;
    bad.n_layers = 0;
    CHECK(ddt_cuda_kv_commit(&bad, d, d, NULL, &e) == DDT_ERR_RANGE, "0 layers accepted");
    CHECK(ddt_cuda_kv_commit(&kv, NULL, d, NULL, &e) == DDT_ERR_INVALID, "a NULL path accepted");
    printf("  refused arguments: %s\n", e.msg);
    CU(cudaFree(d));
    kv_release(&kv);
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
    const int more = random_cases();
    printf("kv commit: %d random good and bad paths, one launch and two, bit for bit\n", more);
    /* the counter must come back to 0 after every commit, good or bad */
    commit_sequence(3, 400, 1152, 7, 5, 0u, false);
    commit_sequence(5, 300, 2304 + 16, 0, 5, 0x0Au, false); /* steps 2 and 4 bad */
    commit_sequence(1, 200, 16, 3, 5, 0x15u, false);        /* steps 1, 3, 5 bad */
    commit_sequence(7, 500, 4096 + 48, 11, 3, 0u, true);     /* a graph replayed 3 times */
    commit_sequence(3, 300, 576, 0, 3, 0x2u, true);          /* ... its second replay a bad path */
    commit_sequence(9, 120, 64, 40, 6, 0x24u, true);
    printf("kv commit: sequences of 5 eager commits and graphs replayed 3..6 times match commit + advance\n");
    refused();
    if (g_failures) {
        printf("test_cuda_kv: %d FAILED checks\n", g_failures);
        return 1;
    }
    printf("test_cuda_kv: all checks passed\n");
    return 0;
}
