/*
 * moe_route.h — the parameters of the DeepSeek-V3 router ("noaux_tc"), one
 * struct for both backends' routers (backend/cpu/moe.h: ddt_cpu_moe_route, and
 * its GPU twin backend/cuda/moe_cuda.h: ddt_cuda_moe_route), as row_groups.h is
 * for the grouped matmuls.  The correction bias is fp32 in the memory of the
 * backend that reads it (host for the CPU, device for CUDA): a checkpoint's
 * bf16 / f16 bias is converted once at load on both, which changes no value
 * (every bf16 and f16 is an fp32).
 */
#ifndef DDT_BACKEND_MOE_ROUTE_H
#define DDT_BACKEND_MOE_ROUTE_H

#include <stdbool.h>
#include <stdint.h>

#define DDT_MOE_MAX_EXPERTS 4096

typedef struct ddt_moe_route_params {
    int32_t n_experts;           /* 1..DDT_MOE_MAX_EXPERTS */
    int32_t top_k;               /* 1..n_experts (the GPU: <= 16) */
    int32_t n_group;             /* divides n_experts; 1 = no group limit */
    int32_t topk_group;          /* 1..n_group */
    bool norm_topk_prob;
    float routed_scaling_factor;
    const float *bias;           /* [n_experts] e_score_correction_bias (fp32, the backend's memory), or NULL */
} ddt_moe_route_params;

#endif
