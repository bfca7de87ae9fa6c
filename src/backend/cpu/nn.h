/*
 * nn.h — row-wise ops of the CPU backend: RMSNorm (as Hugging Face computes it:
 * normalise in fp32, then multiply by the weight), the SiLU-gated product of
 * the MLPs, the residual add, the row gather, and the whole SiLU-gated MLP (the dense layers, the shared experts,
 * and each routed expert of backend/cpu/moe.h).  Norm weights are read in place
 * (F32/BF16/F16).
 */
#ifndef DDT_BACKEND_CPU_NN_H
#define DDT_BACKEND_CPU_NN_H

#include <stdint.h>

#include "backend/cpu/pool.h"
#include "io/safetensors.h"

/* A borrowed 1-D float vector in its checkpoint dtype (F32/BF16/F16). */
typedef struct ddt_cpu_vec {
    const void *data; /* [n] */
    ddt_dtype dtype;
    int64_t n;
} ddt_cpu_vec;

/* y[t][:] = w * (x[t][:] / sqrt(mean(x[t]^2) + eps)) for t < n rows of `dim`
 * values (row strides ldx, ldy; y may equal x). */
void ddt_cpu_rmsnorm(ddt_cpu_pool *pool, const float *x, int64_t ldx, int64_t n, int64_t dim,
                     const ddt_cpu_vec *w, float eps, float *y, int64_t ldy);

/* g[t][j] = silu(g[t][j]) * u[t][j], silu(v) = v / (1 + exp(-v)), for j < dim. */
void ddt_cpu_silu_mul(ddt_cpu_pool *pool, float *g, int64_t ldg, const float *u, int64_t ldu,
                      int64_t n, int64_t dim);

/* x[i] = x[i] + y[i] for i < count (x, y contiguous): the residual add, twin of
 * ddt_cuda_add.  Single-threaded: one read-modify-write pass is memory-bound. */
void ddt_cpu_add(float *x, const float *y, int64_t count);

/* dst[k][0..cols) = src[rows[k]][0..cols) for k < m (row strides ldd, lds): the
 * row gather, twin of ddt_cuda_gather_rows (the drafter's context append takes
 * the accepted path's rows of a capture with it).  Rows are the caller's to check. */
void ddt_cpu_gather_rows(float *dst, int64_t ldd, const float *src, int64_t lds, const int32_t *rows, int32_t m,
                         int64_t cols);

/* The weights of one SiLU-gated MLP, borrowed views:
 * gate, up [inter][hidden], down [hidden][inter]. */
typedef struct ddt_cpu_mlp {
    ddt_qweight gate;
    ddt_qweight up;
    ddt_qweight down;
} ddt_cpu_mlp;

/* out[t] = down(silu(gate x[t]) * up x[t]) for n rows: x [n][hidden] (row stride
 * ldx), out [n][hidden] (row stride ldo, must not alias x), g and u scratch
 * [n][inter] each (contiguous; g ends up holding the gated product).  Three
 * matmuls and the gate: a row's result does not depend on n (qmatmul.h). */
void ddt_cpu_mlp_forward(ddt_cpu_pool *pool, const ddt_cpu_mlp *m, const float *x, int64_t ldx, int64_t n,
                         float *g, float *u, float *out, int64_t ldo);

#endif
