/*
 * cuda_bench_inflight.h — the streaming probe's launcher (cuda_bench_inflight_kernels.cu),
 * for cuda_bench_inflight.c: a bench's own kernel, not the library's.
 */
#ifndef DDT_BENCH_CUDA_BENCH_INFLIGHT_H
#define DDT_BENCH_CUDA_BENCH_INFLIGHT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* once, before any launch: the dynamic shared memory a launch may ask for (at most max_smem bytes; the
   cap only, not the occupancy); nonzero on a CUDA error */
int bench_probe_init(int max_smem);
/* ctas CTAs, each streaming per_cta bytes of src (a multiple of stage_bytes, itself a multiple
   of 16 x bench_probe_threads()) through a ring of `stages` (2, 3, 4 or 6) stages, waiting spin
   clock cycles a stage; nonzero on a CUDA error */
int bench_probe_launch(const uint8_t *src, int64_t per_cta, int ctas, int stage_bytes, int stages, int spin,
                       uint32_t *sink, void *stream);
int bench_probe_threads(void);

#ifdef __cplusplus
}
#endif

#endif
