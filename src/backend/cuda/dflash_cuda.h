/*
 * dflash_cuda.h — the kernels only the DFlash drafter needs on the GPU (its
 * model code is model/drafter_cuda.c; generic pieces such as matmul, RMSNorm,
 * SiLU and row gathers come from qmatmul_cuda.h / nn_cuda.h):
 *
 *   - the per-head q_norm / k_norm, Qwen3 rotate_half RoPE and K/V store of a
 *     layer (or the keys / values of several layers) in one launch
 *     (ddt_dflash_qkv_prep), reading the q / k / v projections as strided
 *     column slices of one fused product, the angles from a host-precomputed
 *     cos/sin table [rows][head_dim/2] (bitwise the CPU's ddt_cpu_rope_cos_sin
 *     values) at positions len + t with len read from device memory, keys
 *     rotated into the drafter's cache rows len + t;
 *   - non-causal GQA attention of the block's queries over cache rows
 *     [0, len + n_block) (split over rows, combined in a fixed order);
 *   - the bookkeeping of an append whose token count lives on the device.
 *
 * Everything that changes between rounds (the context length len, an append's
 * count m) is read from device memory, so a round needs no host sync and can be
 * captured in a CUDA graph; grids are sized for the largest case at the call
 * site and blocks with nothing to do exit.  Per-row results depend only on that
 * row (and, for attention, on the cache rows it reads), never on how many rows
 * are processed together, and every reduction has a fixed order.
 * All pointers are device pointers.
 */
#ifndef DDT_CUDA_DFLASH_H
#define DDT_CUDA_DFLASH_H

#include <stdint.h>

#include "backend/cuda/qmatmul_cuda.h"
#include "ddtree.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Status word of a drafter (sticky: an append that fails keeps it set until reset). */
enum { DDT_DFLASH_OK = 0, DDT_DFLASH_BAD_APPEND = 1 };

/* Largest head_dim the attention kernel holds in registers (32 lanes x 16). */
#define DDT_DFLASH_MAX_HEAD_DIM 512

/*
 * Whether an append of count tokens is valid: count in [0, max_count] and
 * len + count <= limit.  The same rule gates the K/V store and the len advance,
 * so a bad append writes nothing and moves nothing.
 * count = *count_dev when count_dev is not NULL, else count_host.
 */

/*
 * Everything between a layer's q/k/v projections and its attention, in one
 * launch: Qwen3's per-head RMSNorm (q_norm, k_norm), rotate_half RoPE and the K/V
 * store.  One warp per (row, head); for row t < n:
 *   - queries (when q is not NULL): qo[t][h] = RoPE(rmsnorm(q[t][h]) * q_norm) at
 *     position p = *len + t for h < heads; a row with p >= limit is normed, not
 *     rotated (it has no angles);
 *   - keys / values: for t < count, under the append rule above (nothing written
 *     otherwise), cache row r = *len + t gets
 *     k_cache[r][g] = RoPE(rmsnorm(k[t][g]) * k_norm) at position r and
 *     v_cache[r][g] = v[t][g] for g < kv_heads.
 * A head's mean of squares is summed per lane over pairs (j, j + hd/2),
 * j = lane + 32 i in increasing i, then by a xor butterfly; the scaling is
 * w * (x * inv) and the rotation ddt_cpu_rope_rotate's, so the result is the CPU
 * drafter's (ddt_cpu_dflash_norm_rope) up to the order of that one sum.
 *
 * Several layers' keys / values in one launch (layers >= 1; the drafter's
 * append, whose one product leaves every layer's k | v side by side in a row):
 * no queries; layer i < layers reads k + i * layer_cols and v + i * layer_cols
 * (row strides ldk, ldv as above) and stores with k_norms[i] into k_caches[i] /
 * v_caches[i], under the one append rule (every layer reads the same *len and
 * count).  Each (row, head, layer) runs the one-layer code on that layer's
 * pointers, so the caches get bitwise what `layers` one-layer calls store.
 * layers 0 is the one layer of k_norm / k_cache / v_cache (the arrays unread).
 *
 * The append's advance folded into the launch (advance_ticket not NULL; the
 * draft's prep, which must not advance, leaves it NULL): after every block has
 * done its rows, the last block to finish applies the append rule above to len
 * and count: len += count when the append is valid, else *advance_status =
 * DDT_DFLASH_BAD_APPEND and len unchanged (what a separate one-thread launch did
 * after it, one launch fewer; tests/cuda/test_cuda_drafter_ref.cu keeps it).  advance_len must be len (the same word, written); the ticket must be 0
 * before the launch and is 0 again after it (graph replays included), and is
 * used by one launch at a time.
 */
#define DDT_DFLASH_MAX_KV_LAYERS 8
typedef struct ddt_dflash_qkv {
    const float *q;        /* [n][ldq]: heads x hd raw q_proj values per row; NULL: no queries */
    int64_t ldq;
    float *qo;             /* [n][ldqo]: normed, rotated queries (may equal q with ldqo == ldq) */
    int64_t ldqo;
    const float *q_norm;   /* [hd] */
    int32_t heads;
    const float *k, *v;    /* [n][ldk], [n][ldv]: kv_heads x hd raw k_proj / v_proj values per row */
    int64_t ldk, ldv;
    const float *k_norm;   /* [hd] */
    int32_t kv_heads;
    int32_t n;             /* rows, 1..65535 */
    int32_t hd;            /* head_dim: even, 2..DDT_DFLASH_MAX_HEAD_DIM */
    float eps;
    const int32_t *count_dev; /* the append's count (NULL: count_host) */
    int32_t count_host, max_count; /* max_count <= n */
    const int32_t *len;    /* [1] the cache's length before this append */
    int32_t limit;         /* cache rows and RoPE table rows available (<= either) */
    const float *cos_t, *sin_t; /* [limit][hd/2] */
    float *k_cache, *v_cache;   /* [limit][kv_heads * hd] */
    int32_t layers;             /* 0: one layer, the fields above; 1..DDT_DFLASH_MAX_KV_LAYERS: the arrays below */
    int64_t layer_cols;         /* columns from one layer's k (and v) to the next's */
    const float *k_norms[DDT_DFLASH_MAX_KV_LAYERS];          /* [hd] each */
    float *k_caches[DDT_DFLASH_MAX_KV_LAYERS], *v_caches[DDT_DFLASH_MAX_KV_LAYERS]; /* [limit][kv_heads * hd] */
    uint32_t *advance_ticket;   /* [1] 0 between launches; NULL: no advance (the fields below unread) */
    int32_t *advance_len;       /* == len */
    int32_t *advance_status;    /* [1] the drafter's status word */
} ddt_dflash_qkv;

ddt_status ddt_dflash_qkv_prep(const ddt_dflash_qkv *p, ddt_cuda_stream stream, ddt_error *err);

/* Geometry of the block attention. */
typedef struct ddt_dflash_attn {
    int32_t n_block;    /* query rows (the block, L) */
    int32_t heads;      /* query heads */
    int32_t kv_heads;   /* divides heads; query head h reads kv head h / (heads / kv_heads) */
    int32_t hd;         /* head_dim, 1..DDT_DFLASH_MAX_HEAD_DIM */
    int32_t max_rows;   /* cache rows (rows read are [0, *len + n_block) <= max_rows) */
    int32_t split;      /* rows per partial (fixed per drafter: the combine order depends on it only);
                           a multiple of 32 wastes no tile */
    float scale;        /* softmax scale, head_dim^-0.5 */
} ddt_dflash_attn;

/* Rows per split that suit the attention's kernel for this head_dim: 256 for
 * head_dim <= 64, 128 up to 128 (one 32-row tile for each of the block's warps,
 * so a context that short is one block per column, with no merge through the
 * scratch), 32 above.  Any split works; this one wastes no warp. */
int32_t ddt_dflash_attn_split_hint(int32_t hd);

/* Scratch floats the attention needs: its arrival tickets (kv_heads * ceil(n_block *
 * heads / kv_heads / 8), rounded up to 4) then, per split of ceil(max_rows /
 * split), n_block * heads * (hd + 2) partial results.  0 for a shape the
 * attention refuses. */
uint64_t ddt_dflash_attn_scratch_floats(const ddt_dflash_attn *a);

/*
 * Once per scratch, before its first attention (outside graph capture): zero the
 * arrival tickets at the head of the scratch (every attention leaves them zero
 * again; the partials need no initial value) and grant the kernel the shared
 * memory a large head_dim needs.  DDT_ERR_INVALID for a shape the attention
 * refuses, DDT_ERR_UNSUPPORTED when the device lacks the shared memory.
 */
ddt_status ddt_dflash_attn_prepare(const ddt_dflash_attn *a, float *scratch, ddt_cuda_stream stream,
                                   ddt_error *err);

/*
 * o[t][h*hd + j] = sum_r softmax_r(scale * q_t,h . k_r) v_r[j] over cache rows
 * r < *len + n_block (no mask), q [n_block][heads*hd], k/v cache [max_rows][kv_heads*hd].
 * Each split of `split` rows keeps an online softmax over its rows, taken 32 rows
 * at a time (head_dim <= 128: tile t by warp t mod the block's warps, the warps
 * combined in increasing order); the splits are combined in increasing order by
 * the last split to finish.  One launch; the scratch must have been through ddt_dflash_attn_prepare
 * and is used by one attention at a time (calls on one stream, or ordered).
 */
ddt_status ddt_dflash_attention(const ddt_dflash_attn *a, const float *q, const float *k_cache,
                                const float *v_cache, const int32_t *len, float *scratch, float *o,
                                ddt_cuda_stream stream, ddt_error *err);

#ifdef __cplusplus
}
#endif
#endif
