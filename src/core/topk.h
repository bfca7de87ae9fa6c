/*
 * topk.h — per-depth top-K of the drafter's logits as log-probabilities, the
 * table the best-first tree build (tree.c) reads.  The CPU reference of the GPU
 * kernel ddt_cuda_topk_logsoftmax (backend/cuda/tree_cuda.cu), which computes
 * the same K ids in the same order (ties: lower id first); the log-probabilities
 * agree to rounding (the GPU sums exps in fp32 in its own order).
 * Pure C over core/zsort.h: no allocation, no backend.
 */
#ifndef DDT_CORE_TOPK_H
#define DDT_CORE_TOPK_H

#include <stdint.h>

#include "core/zsort.h"
#include "ddtree.h"

/*
 * The top k of z[0..v) by (z desc, id asc) as log-probabilities
 * logq[i] = z[id_i] - logsumexp(z) (max in fp32, sum of exp(z - max) in double),
 * tok[i] = id_i, i < k (1 <= k <= v).  scratch holds v pairs.  A NaN logit is an
 * error naming row `row` and its index.
 */
ddt_status ddt_topk_logsoftmax(const float *z, int32_t v, int32_t k, ddt_zid *scratch, float *logq, int32_t *tok,
                               int32_t row, ddt_error *err);

#endif
