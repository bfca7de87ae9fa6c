/*
 * drafter_cuda.h — the DFlash block-diffusion drafter on the CUDA backend, the
 * GPU twin of model/drafter.h (read that header for the model: context
 * features -> fc -> hidden_norm -> per-layer cached K/V; the block
 * [bonus, MASK...] attends, without a mask, to the context and itself).
 *
 * Loading reads the drafter description first (model/drafter_desc.h: config,
 * every tensor's presence / dtype / shape, the target checks), the one the CPU
 * drafter runs on, so both accept and refuse the same folders with the same
 * messages, then uploads its weight views as stored (bf16 / FP8 / INT4 stay
 * quantised; qmatmul_cuda.h) and allocates all run state: the context K/V cache for max_ctx tokens plus one block, a RoPE
 * cos/sin table for every position it can reach (computed on the host by the
 * CPU's rope code, so the angles are bitwise the CPU's), and the activations of
 * one block and one append chunk.  Nothing allocates after load.
 *
 * The context length lives in DEVICE memory and only kernels read or advance
 * it: appends whose token count is known only on the device (the accepted path
 * of a tree verify) and drafts run with no host synchronisation and can be
 * captured in a CUDA graph.  Positions are implicit: context token k sits at
 * position k (the CPU drafter's positions when appended contiguously from 0),
 * the block at len .. len + L - 1.  An append that does not fit (len + m >
 * max_ctx, or m outside 0..max_m) writes nothing, leaves len alone and sets a
 * sticky status word (ddt_cuda_drafter_status_device) that reset clears.
 *
 * Arithmetic: fp32 activations, per element as the CPU does it where the order
 * is not a reduction (RoPE, residual adds, SiLU); reductions (matmul, norms,
 * attention) have a fixed order of their own, so GPU and CPU logits agree to
 * about 1e-6 relative, and a token's context K/V are bitwise the same however
 * the tokens are split across appends.
 *
 * All calls are asynchronous on the given stream (cudaStream_t; NULL = legacy
 * default stream); one drafter must be used from one stream at a time.
 */
#ifndef DDT_MODEL_DRAFTER_CUDA_H
#define DDT_MODEL_DRAFTER_CUDA_H

#include <stdint.h>

#include "backend/cuda/qmatmul_cuda.h"
#include "ddtree.h"
#include "model/drafter.h"

typedef struct ddt_cuda_drafter ddt_cuda_drafter;

/* What the drafter borrows from its target; the weights are DEVICE weights
 * (ddt_cuda_qweight_upload'ed by the caller) and must outlive the drafter. */
typedef struct ddt_cuda_drafter_target {
    int32_t hidden_size, num_layers, vocab_size;
    const ddt_qweight *embed, *lm_head; /* [vocab][hidden] */
    /* DDT_CUDA_MM_TENSOR (the target's --tensor-cores): the products of bf16 weights
       (the drafter's own and the borrowed LM head) of at least tensor_min_bytes on
       wgmma, each weight byte read once for the whole block, where the FP32 path
       reads it once for every 4 rows; logits then ~1e-5 off the CPU's, still
       batch-invariant and deterministic.  Smaller weights (L2-resident: four reads
       cost less than the tensor path's extra launch), the other formats, and
       DDT_CUDA_MM_FP32 (0) on the FP32 path.  A property of the weights, never of n. */
    ddt_cuda_mm_mode mm;
    uint64_t tensor_min_bytes; /* 0: DDT_CUDA_DRAFTER_TC_MIN_BYTES; 1: every bf16 product (tests) */
} ddt_cuda_drafter_target;

#define DDT_CUDA_DRAFTER_TC_MIN_BYTES (4u << 20)

/* Tokens one append_prefix launch handles (a prefill chunk); longer prefixes loop. */
#define DDT_CUDA_DRAFTER_PREFIX_CHUNK 64

/* Load the drafter in `dir` for target t with a context of max_ctx tokens (same checks as ddt_drafter_load). */
ddt_status ddt_cuda_drafter_load(const char *dir, const ddt_cuda_drafter_target *t, int32_t max_ctx,
                                 ddt_cuda_drafter **out, ddt_error *err);
void ddt_cuda_drafter_free(ddt_cuda_drafter *d);

const ddt_drafter_config *ddt_cuda_drafter_config(const ddt_cuda_drafter *d);
int32_t ddt_cuda_drafter_block_size(const ddt_cuda_drafter *d); /* L */
int32_t ddt_cuda_drafter_max_ctx(const ddt_cuda_drafter *d);
/* Device int32 [1]: cached context tokens (len). */
const int32_t *ddt_cuda_drafter_len_device(const ddt_cuda_drafter *d);
/* Device int32 [1]: DDT_DFLASH_OK, or DDT_DFLASH_BAD_APPEND once an append did not fit (dflash_cuda.h). */
const int32_t *ddt_cuda_drafter_status_device(const ddt_cuda_drafter *d);
/* How many of the draft's products run on the tensor cores (target.mm and bf16
 * weights): k | v | q, o, gate | up, down a layer, and the LM head; 0 on the FP32
 * path.  Tests. */
int32_t ddt_cuda_drafter_tensor_products(const ddt_cuda_drafter *d);
/* Device bytes: uploaded weights (the borrowed embed / lm_head excluded), and run state. */
uint64_t ddt_cuda_drafter_weight_bytes(const ddt_cuda_drafter *d);
uint64_t ddt_cuda_drafter_state_bytes(const ddt_cuda_drafter *d);

/* Forget the context: len = 0, status = OK. */
ddt_status ddt_cuda_drafter_reset(ddt_cuda_drafter *d, ddt_cuda_stream s, ddt_error *err);
/* Keep the first len rows of the context (len no more than it holds, which the
 * caller knows: the device value is not read back): len = len, status = OK. */
ddt_status ddt_cuda_drafter_rollback(ddt_cuda_drafter *d, int32_t len, ddt_cuda_stream s, ddt_error *err);

/*
 * Append m tokens' target features: layers[i] (host array of n_target_layers
 * DEVICE pointers) is the [n_rows][hidden] capture of target layer
 * target_layer_ids[i] (row stride hidden); rows (DEVICE [max_m]) picks the row
 * of token k < m (entries past m are never read); m is a DEVICE int; max_m, a
 * host bound for launch sizes, is 1..DDT_MAX_PATH.  Positions len .. len+m-1;
 * len += m on the device.  Work is done for max_m rows whatever m is.
 */
ddt_status ddt_cuda_drafter_append_rows(ddt_cuda_drafter *d, const float *const *layers, const int32_t *rows,
                                        const int32_t *m, int32_t max_m, ddt_cuda_stream s, ddt_error *err);

/* Same with host m >= 0 and rows 0..m-1 (after a prefill of m tokens), in chunks of
 * DDT_CUDA_DRAFTER_PREFIX_CHUNK; bitwise the same cache as append_rows of those rows. */
ddt_status ddt_cuda_drafter_append_prefix(ddt_cuda_drafter *d, const float *const *layers, int32_t m,
                                          ddt_cuda_stream s, ddt_error *err);

/*
 * Draft the block [*bonus (DEVICE), MASK x (L-1)] at positions len .. len+L-1:
 * logits DEVICE [L-1][vocab] (row stride vocab), row i-1 for block position i.
 * A bonus outside the vocabulary gives NaN logits.  The context is unchanged.
 */
ddt_status ddt_cuda_drafter_draft(ddt_cuda_drafter *d, const int32_t *bonus, float *logits, ddt_cuda_stream s,
                                  ddt_error *err);

#endif
