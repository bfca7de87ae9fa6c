/*
 * cuda_types.h — the CUDA backend's one vocabulary of handle types for C callers
 * that do not include the CUDA headers: a stream is a ddt_cuda_stream everywhere
 * (cudaStream_t is a pointer to the same opaque struct, so the two convert freely).
 */
#ifndef DDT_CUDA_TYPES_H
#define DDT_CUDA_TYPES_H

#include <stdint.h>

typedef struct CUstream_st *ddt_cuda_stream; /* cudaStream_t without including CUDA */

struct ddt_cuda_mla_rope_args; /* mla_cuda.h */

/* The bf16 hi / lo planes of a tensor-core product's activations (x_hi = bf16(x),
 * x_lo = bf16(x - x_hi), round to nearest), row t at hi + t * pitch and lo + t *
 * pitch: where ddt_cuda_matmul_split_planes says the product reads them, written by
 * the kernel that produces x (a norm), so that the product needs no split launch of
 * its own.  hi == NULL: none. */
typedef struct {
    uint16_t *hi, *lo;
    int64_t pitch; /* elements */
} ddt_cuda_split_planes;

/* A product's output as the split planes of the product that reads it next (the
 * wgmma path's epilogue, ddt_cuda_matmul_grouped_next): output column c of token t
 * is column c % width of the next product's group c / width, whose token t is
 * plane row (c / width) * n + t; a group's columns from `cols` on are not written
 * (the next product reads cols of each width: W_UK^T reads the nope part of each
 * head's qk row). */
typedef struct {
    ddt_cuda_split_planes planes; /* hi NULL: none (then b16 or rope must be set) */
    int64_t width, cols;
    /* and/or the output as bf16 (round to nearest, __float2bfloat16): token t's value
       of group g, row r at b16 + t * b16_ld + g * b16_gstride + r; NULL: none (W_UK^T
       writes the latent part of the MLA's bf16 query q16 so, which the pack launch
       wrote) */
    uint16_t *b16;
    int64_t b16_ld, b16_gstride;
    /* or NULL: MLA's query rope in the epilogue (mla_cuda.h), as ddt_cuda_mla_rope_write
       applies it to the rows (one group of rope->heads heads of rope->qdim rows: nope
       plain, then the rope rows in interleaved pairs, stored de-interleaved), and with
       rope->q16 their bf16 into the query's rope part; the cache row is the norm
       launch's (ddt_cuda_mla_norm_write).  The planes above cover nope columns only */
    const struct ddt_cuda_mla_rope_args *rope;
} ddt_cuda_next_planes;

#endif
