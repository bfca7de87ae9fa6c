/*
 * tree_cuda.h — the DDTree round's tree kernels on the GPU: per-depth top-K of
 * the drafter's logits, the best-first tree build, the argmax of the target's
 * logits per node, and the bounded walk ("accept").  Every launcher takes a
 * stream and reads its data-dependent inputs (the root token, the node count)
 * from device memory, so a round runs with no host synchronisation and can be
 * captured in a CUDA graph.
 *
 * Device-side faults (a table with NaN or unsorted rows, a malformed tree) do
 * not trap: the kernel writes a non-zero code into the status word and a safe
 * result (a root-only tree, an empty walk), and the host reads the status when
 * it next synchronises.
 */
#ifndef DDT_CUDA_TREE_H
#define DDT_CUDA_TREE_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend/cuda/cuda_types.h"
#include "core/calibration.h"
#include "ddtree.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes written by the kernels into ddt_cuda_tree.status. */
enum {
    DDT_CUDA_TREE_OK = 0,
    DDT_CUDA_TREE_BAD_TABLE = 1, /* NaN / +inf / unsorted row / token out of range */
    DDT_CUDA_TREE_BAD_TREE = 2,  /* walk input malformed */
    DDT_CUDA_TREE_BAD_TARGET = 3 /* target_next out of range */
};

/* Device buffers of one tree, sized once for a maximum budget. All pointers are
 * device pointers. */
typedef struct ddt_cuda_tree {
    int32_t capacity;      /* max nodes incl. root */
    int32_t vis_words;     /* ceil(capacity / 64) */
    int32_t *token;        /* [capacity] */
    int32_t *parent;       /* [capacity] */
    int32_t *depth;        /* [capacity] */
    int32_t *rank;         /* [capacity] */
    float *logw;           /* [capacity] */
    uint64_t *vis;         /* [capacity][vis_words] */
    int32_t *n_nodes;      /* [1] nodes built, incl. root */
    int32_t *status;       /* [1] DDT_CUDA_TREE_* */
    int32_t *root_token;   /* [1] the root (previous bonus); the walk writes the next one */
    int32_t *path;         /* [DDT_MAX_PATH] accepted node ids */
    int32_t *path_len;     /* [1] */
    int32_t *bonus;        /* [1] */
    /* host-side settings, passed by value to the build: with cal_on the table's weights are
       calibrated (core/calibration.h: each cell mapped, then each row's running minimum) before
       the build, the bits ddt_cal_apply gives on the CPU; the caller sets it before a launch
       (or a graph capture) */
    bool cal_on;
    ddt_draft_calibration cal;
} ddt_cuda_tree;

ddt_status ddt_cuda_tree_alloc(int32_t max_budget, ddt_cuda_tree *t, ddt_error *err);
void ddt_cuda_tree_free(ddt_cuda_tree *t);

/* Top-K per row: logits [rows][vocab] fp32 -> logq [rows][k] = z - logsumexp(z),
 * sorted descending (ties: lower token id first; -0.0 and +0.0 are equal, as on
 * the CPU), token [rows][k].  k <= 1024.  `workspace` is device memory of
 * ddt_cuda_topk_workspace_bytes(rows, vocab, k); vocabularies up to 16384 take
 * a one-launch path that does not touch it (the size stays what the chunked
 * path needs, so callers size it the same way for any vocabulary). */
size_t ddt_cuda_topk_workspace_bytes(int32_t rows, int32_t vocab, int32_t k);
ddt_status ddt_cuda_topk_logsoftmax(const float *logits, int32_t rows, int32_t vocab, int32_t k,
                                    float *logq, int32_t *token, void *workspace,
                                    size_t workspace_bytes, ddt_cuda_stream stream, ddt_error *err);

/* Best-first build from a device table [depth][k] with *t->root_token as root:
 * the tree ddt_tree_build gives for a fixed budget (no cost model), node for
 * node and bitwise, ties included (with t->cal_on: for the table ddt_cal_apply
 * makes of this one).  Unlike the CPU it does not reject a row
 * whose used ranks repeat a token. */
ddt_status ddt_cuda_tree_build(ddt_cuda_tree *t, const float *logq, const int32_t *token,
                               int32_t depth, int32_t k, int32_t budget, int32_t vocab,
                               ddt_cuda_stream stream, ddt_error *err);

/*
 * The cost-aware budget on the device, for a round that stays inside one CUDA
 * graph.  Verify runs at fixed sizes, the buckets (one verify per size is
 * captured), so the build grows the best-first tree towards the budget and
 * cuts it where ddt_cost_bucket_cut (src/core/budget.c) does: at the bucket end
 * of the highest theta = (1 + phi) / (C_draft + C_verify(bucket)), the same
 * doubles, so *n_nodes is the CPU's.  It stops growing once no bucket still
 * unfilled can beat the best filled one (a bound on its theta; the kept nodes
 * are a prefix of the full build, so the result is the same to the bit).
 * The rows between the kept nodes and the bucket (there are some only when
 * the tree runs out of table first) are padding:
 * the root's token under the root, seeing the root and itself, whose logits
 * nobody reads; a node's logits do not depend on the other rows (batch
 * invariance), so padding changes nothing.  Uncapped, the tree is padded to
 * the picked bucket; `capped`, the graph is one bucket's (see the fields).
 */
#define DDT_CUDA_TREE_MAX_BUCKETS 28 /* the cost points of any budget (DDT_ENGINE_COST_POINTS) */
typedef struct ddt_cuda_tree_auto {
    const float *vcost;   /* device [budget + 1]: C_verify(n) for n = 0..budget (ddt_cost_verify) */
    float draft_cost;     /* C_draft, same unit */
    int32_t n_buckets;    /* 1..DDT_CUDA_TREE_MAX_BUCKETS */
    int32_t bucket[DDT_CUDA_TREE_MAX_BUCKETS]; /* verify sizes (nodes after the root), rising, last = budget */
    int32_t *built;       /* device [1] or NULL: nodes built (root included) before the early
                             stop, >= *n_nodes (not written for a bad table); for the tests,
                             which check that the build stops early */
    /* A graph per bucket (the engine's auto rounds; a switch node cost ~25 us): `capped`, the
       graph verifies bucket[cap]'s rows, so the tree is cut at the bucket the rule
       picks or at cap if that is smaller, and padded to bucket[cap]; *choice (when
       not NULL) gets the bucket the rule picked before the cap (not written for a
       bad table), for the host to pick the next round's graph. */
    bool capped;
    int32_t cap;
    int32_t *choice;
} ddt_cuda_tree_auto;

/* ddt_cuda_tree_build with the cost-aware stop and the padding above (the
 * nodes up to the chosen bucket are written; *n_nodes counts the real ones). */
ddt_status ddt_cuda_tree_build_auto(ddt_cuda_tree *t, const float *logq, const int32_t *token,
                                    int32_t depth, int32_t k, int32_t budget, int32_t vocab,
                                    const ddt_cuda_tree_auto *a, ddt_cuda_stream stream,
                                    ddt_error *err);

/*
 * The context lookup's path (core/lookup.h) grafted onto the tree the build left:
 * the tree ddt_tree_graft gives, node for node and bitwise, from the proposal in
 * `prop` ([0] its length, 0..DDT_MAX_DEPTH, [1] the match length, [2..] its tokens:
 * host memory the device can read, e.g. cudaMallocHost's, written before the
 * launch) weighted by t->cal's lookup rating (nothing happens unless t->cal_on and
 * the calibration rates the lookup), within `budget` nodes (use_n: the built
 * tree's own count - 1, the auto budget's cut).  Rows the graft frees up to the
 * old count are padded as the auto build pads (root token under the root).
 * *count (device) adds the nodes appended.  One block, no host synchronisation.
 */
ddt_status ddt_cuda_tree_graft(ddt_cuda_tree *t, const int32_t *prop, int32_t budget, bool use_n, int32_t *count,
                               ddt_cuda_stream stream, ddt_error *err);

/* target_next[i] = argmax over logits[i][:] (lowest id on ties) for i < *n_nodes. */
ddt_status ddt_cuda_argmax_rows(const float *logits, int32_t max_rows, const int32_t *n_rows,
                                int32_t vocab, int32_t *target_next, ddt_cuda_stream stream,
                                ddt_error *err);

/* Walk: path, path_len, bonus; and *root_token = bonus for the next round. */
ddt_status ddt_cuda_tree_accept(ddt_cuda_tree *t, const int32_t *target_next, int32_t vocab,
                                ddt_cuda_stream stream, ddt_error *err);

/* The round's result in one small block for one device-to-host copy:
 * out[0] = tokens emitted m (path_len: the accepted nodes after the root, then
 * the bonus; 0 when the walk failed), out[1] = *status,
 * out[2 .. 2+m) = token[path[1..path_len)] then the bonus,
 * out[DDT_CUDA_EMIT_NODES] = *n_nodes (the tree's size: the auto budget's choice).
 * out: device [DDT_CUDA_EMIT_WORDS]. */
#define DDT_CUDA_EMIT_NODES (DDT_MAX_PATH + 2)
#define DDT_CUDA_EMIT_WORDS (DDT_MAX_PATH + 3)
ddt_status ddt_cuda_tree_emit(const ddt_cuda_tree *t, int32_t *out, ddt_cuda_stream stream, ddt_error *err);

#ifdef __cplusplus
}
#endif
#endif
