/*
 * cuda_bench_inflight.c — what read rate an SM reaches with a given number of bytes in
 * flight (Little's law on this card), by a probe kernel that only streams: CTAs of 512
 * threads copying their share of a buffer into a shared-memory ring by cp.async.cg, 16 bytes
 * a thread a copy, stages - 1 stages in flight while one is read (the INT4 experts' pattern,
 * wgmma_experts.cuh: 2 CTAs an SM, a ring of 2 stages of ~36 KB).  Each row: CTAs an SM, the
 * ring, the bytes an SM keeps in flight, a stand-in for a stage's compute (clock cycles spun
 * after the stage lands), and the rate over all SMs as a share of the device-to-device copy
 * bandwidth measured in the same run (ct_copy_bandwidth), for a long stream (4 MB a CTA) and
 * for the experts' share at n = 1 (448 KB a CTA: K2.6's gate/up, 256 CTAs).
 *   cuda_bench_inflight            (markdown on stdout)
 * Why: the experts at n = 1 stream at ~58% of copy bandwidth on the H200, ~76% on the H100; if
 * an SM's bytes in flight cap its rate, a deeper ring (not fewer instructions) is the lever.
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "../tests/cuda/cuda_test.h"
#include "cuda_bench_inflight.h"

/* mean ms of reps launches after one warm-up */
static double time_probe(const uint8_t *src, int64_t per_cta, int ctas, int stage, int stages, int spin,
                         uint32_t *sink, int reps) {
    if (bench_probe_launch(src, per_cta, ctas, stage, stages, spin, sink, NULL)) {
        fprintf(stderr, "probe launch failed: %s\n", cudaGetErrorString(cudaGetLastError()));
        g_failures++;
        return -1.0;
    }
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    CU(cudaEventRecord(e0, 0));
    for (int r = 0; r < reps; r++)
        if (bench_probe_launch(src, per_cta, ctas, stage, stages, spin, sink, NULL)) {
            fprintf(stderr, "probe launch failed: %s\n", cudaGetErrorString(cudaGetLastError()));
            g_failures++;
            break;
        }
    CU(cudaEventRecord(e1, 0));
    CU(cudaEventSynchronize(e1));
    CU(cudaGetLastError());
    float ms;
    CU(cudaEventElapsedTime(&ms, e0, e1));
    CU(cudaEventDestroy(e0));
    CU(cudaEventDestroy(e1));
    return ms / reps;
}

int main(void) {
    int dev, sms, smem_sm;
    CU(cudaGetDevice(&dev));
    CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CU(cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    if (bench_probe_init(232448)) { /* the most a Hopper CTA may use, set once outside the timed launches */
        fprintf(stderr, "probe init failed: %s\n", cudaGetErrorString(cudaGetLastError()));
        return 1;
    }
    const double bw = ct_copy_bandwidth();
    const int64_t long_cta = (int64_t)4 << 20, short_cta = (int64_t)448 << 10;
    const size_t bytes = (size_t)2 * sms * long_cta;
    uint8_t *src;
    uint32_t *sink;
    CU(cudaMalloc((void **)&src, bytes));
    CU(cudaMemset(src, 1, bytes));
    CU(cudaMalloc((void **)&sink, 64));
    printf("# Bytes in flight and an SM's read rate (cp.async.cg, 16 bytes a thread, %d threads a CTA)\n\n",
           bench_probe_threads());
    printf("%d SMs, %d KB of shared memory an SM; device copy bandwidth (d2d, read + write): %.0f GB/s\n\n", sms,
           smem_sm >> 10, bw * 1e-9);
    printf("| CTAs an SM | stages | stage KB | in flight an SM, KB | spin cycles a stage | 4 MB a CTA: GB/s | of copy bw | "
           "448 KB a CTA: GB/s | of copy bw |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    static const int per_sm[] = {1, 2}, ring[] = {2, 3, 4, 6}, stage_kb[] = {8, 16, 32, 48}, spins[] = {0, 1600};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 4; c++)
                for (int d = 0; d < 2; d++) {
                    const int C = per_sm[a], S = ring[b], stage = stage_kb[c] << 10, spin = spins[d];
                    if ((int64_t)C * ((int64_t)S * stage + 1024) > smem_sm || (int64_t)S * stage > 232448) continue;
                    const int ctas = C * sms;
                    double gbs[2];
                    for (int k = 0; k < 2; k++) {
                        const int64_t per = (k == 0 ? long_cta : short_cta) / stage * stage;
                        const double ms = time_probe(src, per, ctas, stage, S, spin, sink, k == 0 ? 5 : 50);
                        gbs[k] = ms > 0 ? (double)per * ctas / (ms * 1e-3) * 1e-9 : 0.0;
                    }
                    printf("| %d | %d | %d | %d | %d | %.0f | %.0f%% | %.0f | %.0f%% |\n", C, S, stage_kb[c],
                           C * (S - 1) * stage_kb[c], spin, gbs[0], 100.0 * gbs[0] / (bw * 1e-9), gbs[1],
                           100.0 * gbs[1] / (bw * 1e-9));
                    fflush(stdout);
                }
    CU(cudaFree(src));
    CU(cudaFree(sink));
    return g_failures ? 1 : 0;
}
