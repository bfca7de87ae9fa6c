/*
 * test_cuda_sample.c — the device sampler (sample_cuda.h) against the CPU's
 * ddt_sample_token, token for token: vocabularies of 3001, 4352 (the shipped
 * pair) and 163840 (Kimi), 33 nodes per call, temperatures 0 / 0.7 / 1 / 1.3,
 * top-k off, 1, 40, 1023, 1024 with top-p 1 / 0.9 / 0.5, several rounds and seeds,
 * the round read from a device counter, every setting read from device memory
 * (ddt_cuda_sample_nodes_dev, as the engine's captured graph does) or passed by
 * value, on four kinds of logit rows:
 *   random (N(0, 3^2)), peaked (one token far ahead), quantised to steps of 0.5
 *   (ties everywhere, +0.0 and -0.0 mixed, so the top-k boundary cuts through
 *   equal logits and the lowest ids must win), and rows with -inf entries.
 * Every token must be the CPU's (bitwise same logits in: the same arithmetic).
 * Also: a NaN row gives -1; top-p without top-k is refused (UNSUPPORTED); the
 * time of one call at 4352 x 65 (the shipped tree) and 163840 x 33 is printed.  The token frequencies match by
 * construction, so no separate chi-square is needed here (the CPU sampler's own
 * tests check its distribution).
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/sample_cuda.h"
#include "cuda_test.h"

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void) { return ct_xorshift(&g_rng, 16); }
static float gauss(void) {
    float u1 = ((float)(rnd() % 1000000) + 0.5f) / 1000000.0f, u2 = (float)(rnd() % 1000000) / 1000000.0f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

static void fill_row(float *z, int V, int kind) {
    for (int i = 0; i < V; i++) {
        float v = 3.0f * gauss();
        if (kind == 1 && i == (int)(rnd() % (uint32_t)V)) v = 40.0f;
        if (kind == 2) {
            v = roundf(v * 2.0f) * 0.5f;
            if (v == 0.0f && (rnd() & 1)) v = -0.0f;
        }
        if (kind == 3 && rnd() % 5 == 0) v = -INFINITY;
        z[i] = v;
    }
    if (kind == 1) z[rnd() % (uint32_t)V] = 40.0f;
}

static int run_case(int V, int nodes, float T, int top_k, float top_p, uint64_t seed, uint64_t round, int kind,
                    bool round_on_device, float *dz, int32_t *dtok, uint64_t *dround, ddt_sampler *smp) {
    float *z = malloc(sizeof(float) * (size_t)V * nodes);
    for (int n = 0; n < nodes; n++) fill_row(z + (size_t)n * V, V, kind);
    CU(cudaMemcpy(dz, z, sizeof(float) * (size_t)V * nodes, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dround, &round, sizeof round, cudaMemcpyHostToDevice));
    CU(cudaMemset(dtok, 0xFF, sizeof(int32_t) * (size_t)nodes));
    ddt_sampling s = {T, top_k, top_p, seed};
    if (round_on_device && (kind & 1)) { /* every setting from device memory, as the engine's graph reads them */
        ddt_cuda_sample_params p = {T, top_k, top_p, 0u, seed, round};
        CU(cudaMemcpy(dround + 1, &p, sizeof p, cudaMemcpyHostToDevice));
        OK(ddt_cuda_sample_nodes_dev(dz, V, nodes, V, (const ddt_cuda_sample_params *)(dround + 1), 5, dtok, NULL,
                                     &err_));
    } else {
        OK(ddt_cuda_sample_nodes(dz, V, nodes, V, &s, round_on_device ? dround : NULL, round, 5, dtok, NULL, &err_));
    }
    int32_t got[64];
    CU(cudaMemcpy(got, dtok, sizeof(int32_t) * (size_t)nodes, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int n = 0; n < nodes; n++) {
        int32_t want;
        OK(ddt_sample_token(smp, z + (size_t)n * V, V, &s, round, 5 + (uint32_t)n, &want, &err_));
        if (want != got[n]) {
            if (bad < 3)
                fprintf(stderr, "  V=%d T=%g k=%d p=%g kind %d node %d: gpu %d cpu %d\n", V, (double)T, top_k,
                        (double)top_p, kind, n, got[n], want);
            bad++;
        }
    }
    free(z);
    return bad;
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    static const int vocabs[] = {3001, 4352, 163840};
    static const struct {
        float T;
        int k;
        float p;
    } set[] = {{1.0f, 0, 1.0f},  {0.7f, 0, 1.0f},    {1.3f, 40, 1.0f}, {1.0f, 40, 0.9f}, {0.8f, 1024, 0.5f},
               {1.0f, 1, 1.0f},  {1.0f, 1023, 0.95f}, {0.0f, 0, 1.0f}, {0.0f, 40, 0.9f}, {1.0f, 1024, 1.0f}};
    const int nodes = 33, NV = 3, NS = (int)(sizeof set / sizeof set[0]);
    float *dz;
    int32_t *dtok;
    uint64_t *dround;
    CU(cudaMalloc((void **)&dz, sizeof(float) * 163840 * nodes));
    CU(cudaMalloc((void **)&dtok, sizeof(int32_t) * 128)); /* the timed 65-node call too */
    CU(cudaMalloc((void **)&dround, sizeof(uint64_t) * 8)); /* [0] a round, [1..] a ddt_cuda_sample_params */
    ddt_sampler *smp;
    OK(ddt_sampler_create(163840, &smp, &err_));
    int cases = 0;
    for (int vi = 0; vi < NV; vi++)
        for (int si = 0; si < NS; si++)
            for (int kind = 0; kind < 4; kind++) {
                if (quick && (kind % 2 == 1 || vi == 2) && !(vi == 2 && si == 0 && kind == 0)) continue;
                const int V = vocabs[vi];
                const uint64_t seed = 1000u + (uint64_t)(si * 7 + kind), round = (uint64_t)(vi * 31 + si) << (kind * 9);
                const int bad = run_case(V, nodes, set[si].T, set[si].k, set[si].p, seed, round, kind, (si + kind) % 2,
                                         dz, dtok, dround, smp);
                CHECK(bad == 0, "V=%d T=%g top_k=%d top_p=%g kind %d: %d of %d nodes differ from the CPU sampler", V,
                      (double)set[si].T, set[si].k, (double)set[si].p, kind, bad, nodes);
                cases++;
            }
    /* a NaN row: -1, the others as the CPU */
    {
        const int V = 4352;
        float *z = malloc(sizeof(float) * V * 2);
        for (int i = 0; i < 2 * V; i++) z[i] = gauss();
        z[V + 17] = NAN;
        CU(cudaMemcpy(dz, z, sizeof(float) * V * 2, cudaMemcpyHostToDevice));
        ddt_sampling s = {1.0f, 0, 1.0f, 9};
        OK(ddt_cuda_sample_nodes(dz, V, 2, V, &s, NULL, 3, 0, dtok, NULL, &err_));
        int32_t got[2], want;
        CU(cudaMemcpy(got, dtok, sizeof got, cudaMemcpyDeviceToHost));
        OK(ddt_sample_token(smp, z, V, &s, 3, 0, &want, &err_));
        CHECK(got[0] == want && got[1] == -1, "NaN row: got %d %d (want %d, -1)", got[0], got[1], want);
        free(z);
    }
    /* top-p alone is left to the host, with a message */
    {
        ddt_sampling s = {1.0f, 0, 0.9f, 1};
        ddt_error e2;
        ddt_status st = ddt_cuda_sample_nodes(dz, 4352, 1, 4352, &s, NULL, 0, 0, dtok, NULL, &e2);
        CHECK(st == DDT_ERR_UNSUPPORTED && !ddt_cuda_sample_supported(&s, 4352), "top-p alone: status %d", (int)st);
    }
    /* time: the shipped pair's 4352 ids at a 65-node tree (nodes above 33 reuse rows);
       Kimi's vocabulary, 33 nodes, plain temperature and top-k 40 / top-p 0.9 */
    {
        cudaEvent_t e0, e1;
        CU(cudaEventCreate(&e0));
        CU(cudaEventCreate(&e1));
        for (int j = 0; j < 3; j++) {
            const int V = j == 0 ? 4352 : 163840, nn = j == 0 ? 65 : nodes;
            ddt_sampling s = {1.0f, j == 2 ? 40 : 0, j == 2 ? 0.9f : 1.0f, 1};
            for (int w = 0; w < 3; w++) OK(ddt_cuda_sample_nodes(dz, V, nn, V, &s, NULL, 0, 0, dtok, NULL, &err_));
            CU(cudaEventRecord(e0, 0));
            for (int r = 0; r < 20; r++) OK(ddt_cuda_sample_nodes(dz, V, nn, V, &s, NULL, (uint64_t)r, 0, dtok, NULL, &err_));
            CU(cudaEventRecord(e1, 0));
            CU(cudaEventSynchronize(e1));
            float ms;
            CU(cudaEventElapsedTime(&ms, e0, e1));
            printf("sample %d nodes x %d (%s): %.1f us per call\n", nn, V, j == 2 ? "top-k 40, top-p 0.9" : "temperature 1",
                   ms * 1e3 / 20);
        }
    }
    ddt_sampler_destroy(smp);
    CU(cudaFree(dz));
    CU(cudaFree(dtok));
    CU(cudaFree(dround));
    if (g_failures) {
        fprintf(stderr, "test_cuda_sample: %d failures\n", g_failures);
        return 1;
    }
    printf("test_cuda_sample: %d cases x %d nodes equal to the CPU sampler; all passed\n", cases, nodes);
    return 0;
}
