/*
 * topk.c — top-K + log-softmax of one row of logits (see topk.h); the CPU twin
 * of ddt_cuda_topk_logsoftmax in backend/cuda/tree_cuda.cu.
 */
#include "core/topk.h"

#include <math.h>

#include "core/error.h"

ddt_status ddt_topk_logsoftmax(const float *z, int32_t v, int32_t k, ddt_zid *scratch, float *logq, int32_t *tok,
                               int32_t row, ddt_error *err) {
    float m = -INFINITY;
    for (int32_t i = 0; i < v; i++) {
        if (isnan(z[i])) return ddt_fail(err, DDT_ERR_INVALID, "drafter logit [%d][%d] is NaN", row, i);
        if (z[i] > m) m = z[i];
    }
    double s = 0.0;
    for (int32_t i = 0; i < v; i++) s += exp((double)z[i] - (double)m);
    float lse = (float)((double)m + log(s));
    ddt_zid_top_k(z, v, k, scratch);
    for (int32_t i = 0; i < k; i++) {
        logq[i] = scratch[i].z - lse;
        tok[i] = scratch[i].id;
    }
    return DDT_OK;
}
