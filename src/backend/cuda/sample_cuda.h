/*
 * sample_cuda.h — the target's next token at every tree node on the GPU, at any
 * temperature: argmax at T = 0, and at T > 0 the sample of core/sampler.c
 * (softmax(z / T) restricted by top-k then top-p, Philox4x32-10 keyed by
 * (seed, round, node)), computed in the same pinned arithmetic order, so a node
 * gets the CPU's token bit for bit from the same logits.  With it the sampled
 * round's walk needs no logits on the host: the walk matches these tokens
 * against the tree exactly as the greedy walk matches argmaxes.
 *
 * Covered on the device: any temperature; top-k off or 1..DDT_CUDA_SAMPLE_MAX_TOPK;
 * top-p with top-k on (top-p alone needs a sort of the whole vocabulary: the
 * caller keeps the host sampler for it, ddt_cuda_sample_supported says which).
 */
#ifndef DDT_CUDA_SAMPLE_H
#define DDT_CUDA_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/cuda/cuda_types.h"
#include "ddtree.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDT_CUDA_SAMPLE_MAX_TOPK 1024

/* The settings and round a captured graph reads from device memory each replay
 * (the host rewrites them between rounds). */
typedef struct ddt_cuda_sample_params {
    float temperature;
    int32_t top_k;
    float top_p;
    uint32_t pad;
    uint64_t seed;
    uint64_t round;
} ddt_cuda_sample_params;

/* Can the device sample with these settings? (false: use the host sampler) */
bool ddt_cuda_sample_supported(const ddt_sampling *s, int32_t vocab);

/*
 * tokens[i] = the sample of node node0 + i from logits row i (row stride ld),
 * i < n_nodes, for round *round_dev (a device counter, so a captured graph
 * samples each replay's round) or, when round_dev is NULL, `round`.  A row with a
 * NaN logit, or whose logits are all -inf or one is +inf, gets token -1 (the CPU
 * sampler reports those as errors).  No allocation, no host sync.
 */
ddt_status ddt_cuda_sample_nodes(const float *logits, int64_t ld, int32_t n_nodes, int32_t vocab,
                                 const ddt_sampling *s, const uint64_t *round_dev, uint64_t round, uint32_t node0,
                                 int32_t *tokens, ddt_cuda_stream stream, ddt_error *err);

/* The same with settings and round read from device memory (params_dev, e.g.
 * inside a CUDA graph); the caller has checked them with ddt_cuda_sample_supported
 * (settings it does not take give every node -1). */
ddt_status ddt_cuda_sample_nodes_dev(const float *logits, int64_t ld, int32_t n_nodes, int32_t vocab,
                                     const ddt_cuda_sample_params *params_dev, uint32_t node0, int32_t *tokens,
                                     ddt_cuda_stream stream, ddt_error *err);

#ifdef __cplusplus
}
#endif
#endif
