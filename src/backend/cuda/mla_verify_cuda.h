/*
 * mla_verify_cuda.h — tree-verify attention of absorbed MLA on the GPU (Hopper,
 * sm_90a): the role FlashMLA plays in production stacks, with DDTree's ancestor
 * mask over the tree's own rows.
 *
 * Semantics are those of ddt_cpu_mla_attention (src/backend/cpu/mla.h) with
 * K2.6's widths fixed: every cache row holds 576 bf16 values (latent c, 512, then
 * the rotated k_rope, 64), shared by all heads; the value is the row's first 512.
 * For query token t and head h:
 *   s_j = scale * (q[t][h][0:576] . kv_j[0:576])   over the rows j visible to t
 *   out[t][h] = sum_j softmax(s)_j kv_j[0:512]
 * Visible: the committed rows [0, n_prefix) for every token, and the tree's row
 * n_prefix + j when bit j of vis[t] is set (ancestors and self).
 *
 * n_prefix is read from DEVICE memory, so the whole round can be captured in a
 * CUDA graph: the grid and the workspace are sized for max_prefix at launch and
 * the kernel works out from *n_prefix how many of its blocks have work.  The
 * split of the prefix between blocks is a function of (*n_prefix, T, H) only,
 * and every reduction runs in a fixed order, so the same inputs give the same
 * bits on every run, whatever max_prefix or the launch path.
 *
 * Shapes: T = 1..64 tree tokens (one 64-bit vis word per token); any H >= 1
 * (queries are processed as T*H flat rows in tiles of 64, K2.6 has H = 64).
 * A bad *n_prefix (< 0, > max_prefix, or n_prefix + T > kv_rows) is not a fault:
 * every output is written as NaN so the error cannot pass unnoticed.
 */
#ifndef DDT_CUDA_MLA_VERIFY_H
#define DDT_CUDA_MLA_VERIFY_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/cuda_types.h"
#include "ddtree.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    DDT_MLA_DK = 576,      /* key width: latent rank 512 + rope 64 */
    DDT_MLA_DV = 512,      /* value width: the latent part */
    DDT_MLA_MAX_TOKENS = 64
};

/* How the per-split partial results are merged (both give identical bits). */
enum {
    DDT_MLA_PATH_AUTO = 0,    /* cluster when the splits of a query tile fit one cluster */
    DDT_MLA_PATH_GLOBAL = 1,  /* partials through the workspace + a combine kernel */
    DDT_MLA_PATH_CLUSTER = 2, /* partials through distributed shared memory (<= 8 splits; a build
                                 with -DDDT_MLA_GROUPED=1 also past 8, in clusters of 8 whose
                                 group partials a last kernel merges) */
    DDT_MLA_PATH_GLOBAL_STAGED = 3 /* GLOBAL with the combine kernel that stages every split's rows in
                                      shared memory at once, which GLOBAL takes past 8 splits; at any
                                      split count (for tests: the same bits again) */
};

typedef struct ddt_cuda_mla_verify {
    int32_t n_tokens;         /* T, 1..64 */
    int32_t n_heads;          /* H >= 1 */
    const uint16_t *q;        /* bf16 [T][H][576], contiguous: q_lat (512) | q_rope (64); 16-byte aligned */
    const uint16_t *kv;       /* bf16 latent cache [kv_rows][kv_ld], 576 used; 16-byte aligned */
    int64_t kv_ld;            /* elements per cache row, >= 576, a multiple of 8 */
    int64_t kv_rows;          /* rows allocated (the committed prefix + the tree's rows must fit) */
    const int32_t *n_prefix;  /* DEVICE [1]: committed rows; the tree's rows follow at n_prefix.. */
    int64_t max_prefix;       /* host bound on *n_prefix: sizes the grid and the workspace */
    const uint64_t *vis;      /* DEVICE [T]: bit j of vis[t] = tree row j visible to token t */
    float scale;              /* softmax scale, > 0 */
    void *out;                /* DEVICE [T][H] rows of 512 at out_ld elements: bf16 or fp32 */
    int32_t out_fp32;         /* 0: bf16 out, 1: fp32 out */
    int64_t out_ld;           /* elements between (t,h) rows, >= 512 */
    float *lse;               /* DEVICE [T][H] or NULL: ln sum_j exp(s_j), summed over the bf16-rounded
                                 weights that also normalise out (|error| <= ~2e-3) */
    void *workspace;          /* DEVICE, ddt_cuda_mla_verify_workspace() bytes, 16-byte aligned */
    int32_t path;             /* DDT_MLA_PATH_* (AUTO unless testing) */
    ddt_cuda_split_planes out_planes; /* optional (hi NULL: none; fp32 out only): the output's bf16 split
                                 (cuda_types.h) as W_UV's grouped product reads it, head h's token t at
                                 plane row h * T + t, so that product needs no split launch */
} ddt_cuda_mla_verify;

/* Workspace bytes for any T' <= n_tokens tokens, H heads and contexts up to
 * max_prefix rows.  Call it at load time: it also sets the kernels' attributes
 * and measures which clusters fit the GPU, so that run() makes no such calls
 * while a graph is being captured. */
size_t ddt_cuda_mla_verify_workspace(int32_t n_tokens, int32_t n_heads, int64_t max_prefix);

/* Split plan for a given prefix (what the kernel computes on the device), for
 * tests and benchmarks: splits used and blocks of 64 rows per split. */
void ddt_cuda_mla_verify_plan(int32_t n_tokens, int32_t n_heads, int64_t n_prefix, int32_t *splits,
                              int32_t *blocks_per_split);

/* Splits of the launch grid for max_prefix (its y extent before clusters round it up): every
 * n_prefix <= max_prefix plans at most this many, and the workspace holds this many partials
 * (0 for sizes out of range).  For tests. */
int32_t ddt_cuda_mla_verify_grid_splits(int32_t n_tokens, int32_t n_heads, int64_t max_prefix);

/* The merge path DDT_MLA_PATH_AUTO takes for these sizes (CLUSTER or GLOBAL). */
int32_t ddt_cuda_mla_verify_auto_path(int32_t n_tokens, int32_t n_heads, int64_t max_prefix);

/* One or two launches on `stream`; allocates nothing. */
ddt_status ddt_cuda_mla_verify_run(const ddt_cuda_mla_verify *a, ddt_cuda_stream stream, ddt_error *err);

#ifdef __cplusplus
}
#endif
#endif
