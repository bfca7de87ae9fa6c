/*
 * ddtree.h — public C API of the ddtree engine.
 *
 * ddtree runs DDTree (Diffusion Draft Tree) speculative decoding for
 * DeepSeek-V3-architecture models (Kimi K2.6 and relatives).  This header is the
 * stable surface: status codes and error messages, the draft tree (build from a
 * drafter's per-depth top-K table, build a chain, take a tree as given), the walk
 * that accepts the longest path the target agrees with, the counter-based sampler
 * that makes every sample reproducible on any backend, and the cost-aware budget.
 *
 * Conventions
 *  - Every fallible function returns a ddt_status and, when `err` is not NULL,
 *    writes a human-readable message naming what was wrong and where.
 *  - No function here allocates except the *_create / *_alloc functions, so a
 *    decoding round that reuses its builder, tree and sampler never allocates.
 *  - Sizes are int32_t, token ids int32_t, log-probabilities float (fp32).
 *  - The library never calls exit() and never prints.
 */
#ifndef DDTREE_H
#define DDTREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ errors */

typedef enum ddt_status {
    DDT_OK = 0,
    DDT_ERR_INVALID = 1,     /* bad argument or malformed input (tree, table, JSON) */
    DDT_ERR_RANGE = 2,       /* a size over a documented limit */
    DDT_ERR_NOMEM = 3,       /* allocation failed */
    DDT_ERR_IO = 4,          /* a file could not be opened, read or mapped */
    DDT_ERR_FORMAT = 5,      /* a file's contents are damaged or not what they claim */
    DDT_ERR_UNSUPPORTED = 6, /* valid input this build does not handle */
    DDT_ERR_INTERNAL = 7     /* a bug: please report */
} ddt_status;

#define DDT_ERROR_MSG_MAX 512

typedef struct ddt_error {
    ddt_status status;
    char msg[DDT_ERROR_MSG_MAX]; /* NUL-terminated, empty when status == DDT_OK */
} ddt_error;

/* Short name of a status ("ok", "invalid", ...). Never NULL. */
const char *ddt_status_name(ddt_status status);

/* ------------------------------------------------------------------ limits */

#define DDT_MAX_DEPTH 31     /* draft depth D (block size - 1) */
#define DDT_MAX_TOPK 1024    /* K, candidates per depth */
#define DDT_MAX_BUDGET 1024  /* B, tree nodes not counting the root */
#define DDT_MAX_NODES (DDT_MAX_BUDGET + 1)
#define DDT_MAX_PATH (DDT_MAX_DEPTH + 1) /* root + at most D accepted nodes */

/* ------------------------------------------------------------------ draft table */

/*
 * The drafter's per-depth top-K: row d (0-based, depth d+1) holds K candidates
 * sorted by log-probability, descending.  Tokens within a row must be distinct.
 */
typedef struct ddt_draft_table {
    int32_t depth;        /* D, 1..DDT_MAX_DEPTH */
    int32_t k;            /* K, 1..DDT_MAX_TOPK */
    const float *logq;    /* [D][K] log q_d, non-increasing along each row, no NaN/+inf */
    const int32_t *token; /* [D][K] token ids */
} ddt_draft_table;

/* ------------------------------------------------------------------ tree */

/*
 * A flattened draft tree.  Node 0 is the root (the previous round's bonus token),
 * nodes 1..n-1 are in pop order, which is topological: parent[i] < i.
 * The verify position of node i is prefix_len + depth[i].
 * Visibility: node i attends to every committed token, itself and its ancestors;
 * row i of `vis` is a bitset over nodes (bit j of word j/64).
 */
typedef struct ddt_tree {
    int32_t n_nodes;       /* nodes in use, including the root */
    int32_t capacity;      /* nodes the arrays hold */
    int32_t vis_words;     /* uint64 words per visibility row: ceil(capacity/64) */
    int32_t max_depth;     /* deepest node's depth */
    int32_t *token;        /* [capacity] token id */
    int32_t *parent;       /* [capacity] parent index, -1 for the root */
    int32_t *depth;        /* [capacity] 0 for the root */
    int32_t *rank;         /* [capacity] rank in its depth's top-K row, -1 root / given trees */
    float *logw;           /* [capacity] cumulative log weight, 0 for the root */
    int32_t *first_child;  /* [capacity] -1 when none */
    int32_t *next_sibling; /* [capacity] -1 when none; children in index order */
    uint64_t *vis;         /* [capacity][vis_words] ancestor-or-self bitset */
} ddt_tree;

/* Allocate a tree able to hold `capacity` nodes (1..DDT_MAX_NODES). */
ddt_status ddt_tree_alloc(int32_t capacity, ddt_tree *tree, ddt_error *err);
void ddt_tree_free(ddt_tree *tree);

/* Workspace of the best-first builder (the heap), sized once for a max budget. */
typedef struct ddt_builder ddt_builder;

/*
 * Cost model for the cost-aware ("auto") budget of CaDDTree:
 *   theta(n) = (1 + Phi(n)) / (draft + verify(n, context_len))
 * where Phi(n) sums exp(logw) over the first n popped nodes.  verify(n, c) is
 * interpolated linearly in n and c from the measured table (clamped at its
 * ends); n counts tree nodes without the root.  Building stops at the first n
 * where theta(n+1) <= theta(n).
 */
typedef struct ddt_cost_model {
    float draft;            /* cost of one drafter pass, same unit as verify */
    int32_t n_nodes;        /* number of node-count points, 1..64 */
    const float *nodes;     /* [n_nodes] strictly increasing node counts, >= 0 */
    int32_t n_contexts;     /* number of context-length points, 1..64 */
    const float *contexts;  /* [n_contexts] strictly increasing, may be NULL when n_contexts == 1 */
    const float *verify;    /* [n_contexts][n_nodes] verify cost, finite and > 0 */
    float context_len;      /* the current context length */
} ddt_cost_model;

/* Check a cost model; DDT_OK or DDT_ERR_INVALID with a message. */
ddt_status ddt_cost_check(const ddt_cost_model *cost, ddt_error *err);
/* Interpolated verify cost for n tree nodes at the model's context length. */
float ddt_cost_verify(const ddt_cost_model *cost, float n);
/* Throughput theta for n nodes whose popped weights sum to phi. */
float ddt_cost_theta(const ddt_cost_model *cost, float n, float phi);
/* The auto budget when verify runs at fixed sizes ("buckets": a CUDA graph holds
 * one verify per size, so a node inside a bucket costs nothing and CaDDTree's
 * stop where theta stops rising becomes the best bucket end).  logw[1..n) are
 * the log-weights of a best-first tree's nodes in pop order (logw[0], the root,
 * is not read); vcost[b] = C_verify(b) for b = 0..bucket[n_buckets - 1];
 * bucket[] rising, >= 0.  Bucket j offers the first min(bucket[j], n - 1) nodes
 * at theta_j = (1 + phi) / (C_draft + vcost[bucket[j]]), phi the sum of their
 * exp(logw) in pop order in double (exp_det: the GPU computes the same bits);
 * the first bucket of the highest theta wins.  Returns the nodes kept (root
 * included) and the bucket's index in *index. */
int32_t ddt_cost_bucket_cut(const float *logw, int32_t n, const float *vcost, float draft, const int32_t *bucket,
                            int32_t n_buckets, int32_t *index);

ddt_status ddt_builder_create(int32_t max_budget, ddt_builder **out, ddt_error *err);
void ddt_builder_destroy(ddt_builder *b);

/*
 * Build the DDTree best-first tree: the `budget` heaviest prefixes of the table
 * (fewer when the table holds fewer), ties broken by the rank tuple,
 * lexicographically, a prefix before its extensions.  With `cost` not NULL the
 * build also stops where the cost model's throughput stops rising (budget is
 * then the cap).  `vocab` > 0 checks every token id against it.
 * Needs tree->capacity >= min(budget, table size) + 1.
 */
ddt_status ddt_tree_build(ddt_builder *b, const ddt_draft_table *table, int32_t root_token,
                          int32_t budget, const ddt_cost_model *cost, int32_t vocab,
                          ddt_tree *tree, ddt_error *err);

/*
 * A predicate on the best-first build's candidates (ddt_tree_build_filtered):
 * whether `token` may follow the path of node `parent` (an accepted node, or the
 * root 0).  `node` is the index the candidate takes if accepted, so the callee
 * can keep per-node state (e.g. a grammar's state after the node's path) in an
 * array of tree capacity and read it back as the parent of later candidates.
 * Called once per popped candidate, in pop order; a refused candidate's index is
 * offered again to the next one, and an accepted one may still be left out by the
 * cost model's stop (it is then past n_nodes).  It must not fail or allocate.
 */
typedef bool (*ddt_tree_allow_fn)(void *ctx, int32_t parent, int32_t node, int32_t token);

/*
 * ddt_tree_build with candidates filtered by allow (NULL: exactly ddt_tree_build):
 * a refused candidate is skipped with its whole subtree and takes none of the
 * budget, and the next rank at its depth is still a candidate, so the tree is the
 * `budget` heaviest prefixes every node of which allow accepts (fewer when the
 * table holds fewer), in the same order and with the same ties.
 */
ddt_status ddt_tree_build_filtered(ddt_builder *b, const ddt_draft_table *table, int32_t root_token,
                                   int32_t budget, const ddt_cost_model *cost, int32_t vocab,
                                   ddt_tree_allow_fn allow, void *allow_ctx, ddt_tree *tree,
                                   ddt_error *err);

/* The DFlash chain: the rank-0 token at depths 1..min(length, D). */
ddt_status ddt_tree_build_chain(const ddt_draft_table *table, int32_t root_token, int32_t length,
                                int32_t vocab, ddt_tree *tree, ddt_error *err);

/*
 * Take a tree as given (tokens + parents), check it (root first with parent -1,
 * every other parent below its child, depth <= DDT_MAX_DEPTH, tokens in
 * [0, vocab) when vocab > 0, no two siblings with the same token) and fill
 * depth, child lists and visibility.
 */
ddt_status ddt_tree_from_parents(const int32_t *tokens, const int32_t *parents, int32_t n,
                                 int32_t vocab, ddt_tree *tree, ddt_error *err);

/*
 * Graft a draft path onto a best-first tree (the context lookup, src/core/lookup.h):
 * tree nodes 1..n-1 in pop order (logw non-increasing, as ddt_tree_build leaves
 * them), path[0..len) the tokens below the root with v[0..len) the log-chance that
 * each of its prefixes is accepted (<= 0, non-increasing).  The result holds the
 * `budget` heaviest of both: a prefix of the pop order and a prefix of the path,
 * merged by weight (the tree's node first on ties), a path prefix the kept tree
 * already holds counted once; the path's other nodes follow the kept ones (rank -1,
 * logw from v).  *grafted: the nodes appended.  Needs n_nodes <= budget + 1.
 */
ddt_status ddt_tree_graft(ddt_tree *tree, const int32_t *path, const float *v, int32_t len, int32_t budget,
                          int32_t vocab, int32_t *grafted, ddt_error *err);
/* The graft's plan without changing the tree (for a device twin's tests): twin[j]
 * the tree's node for the path's first j + 1 tokens (-1: none), *keep the tree
 * nodes kept (root included); returns the path tokens taken. */
int32_t ddt_tree_graft_plan(const ddt_tree *tree, const int32_t *path, const float *v, int32_t len, int32_t budget,
                            int32_t *twin, int32_t *keep);

/* ------------------------------------------------------------------ walk */

typedef struct ddt_walk_result {
    int32_t path[DDT_MAX_PATH]; /* accepted node indices, path[0] = 0 (the root) */
    int32_t length;             /* entries of path, >= 1; tau = length (accepted + bonus) */
    int32_t bonus;              /* the target's token after the last accepted node */
} ddt_walk_result;

/*
 * Walk the tree: from the root, while the target's next token at the current
 * node equals the token of one of its children, move to that child.
 * target_next[i] is the target's next token at node i (argmax at T = 0, a sample
 * at T > 0).  Checks its input first — n within capacity and limits, parent[0] =
 * -1, parent[i] in [0, i), depth <= DDT_MAX_DEPTH, tokens and target_next in
 * [0, vocab) when vocab > 0 — and is bounded by the node count, so a malformed
 * tree returns an error, never loops or overruns.
 */
ddt_status ddt_tree_walk(const ddt_tree *tree, const int32_t *target_next, int32_t vocab,
                         ddt_walk_result *out, ddt_error *err);

/*
 * The same walk with the target's next token computed on demand: next(ctx, node,
 * &token, err) is called only for the nodes the walk visits (at most
 * DDT_MAX_PATH), in path order, so a caller sampling from per-node logits draws
 * a handful of samples instead of one per node.  A token outside [0, vocab)
 * (vocab > 0) or a failing callback ends the walk with an error.
 */
typedef ddt_status (*ddt_next_token_fn)(void *ctx, int32_t node, int32_t *token, ddt_error *err);
ddt_status ddt_tree_walk_fn(const ddt_tree *tree, ddt_next_token_fn next, void *ctx, int32_t vocab,
                            ddt_walk_result *out, ddt_error *err);

/* ------------------------------------------------------------------ sampling */

/* Philox4x32-10 (Salmon et al., SC'11): counter-based, so any node's sample can be
 * recomputed anywhere from (seed, round, node) alone. */
void ddt_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);

/* Uniform float in [0, 1) with 24 random bits, keyed by (seed, round, node, lane). */
float ddt_rng_uniform(uint64_t seed, uint64_t round, uint32_t node, uint32_t lane);

typedef struct ddt_sampling {
    float temperature; /* 0 = greedy (argmax, lowest id on ties) */
    int32_t top_k;     /* 0 = off */
    float top_p;       /* 1 = off; (0, 1] */
    uint64_t seed;
} ddt_sampling;

/* Check sampling settings; names the bad field. */
ddt_status ddt_sampling_check(const ddt_sampling *s, ddt_error *err);

/* Workspace for sampling over a vocabulary, allocated once. */
typedef struct ddt_sampler ddt_sampler;
ddt_status ddt_sampler_create(int32_t vocab, ddt_sampler **out, ddt_error *err);
void ddt_sampler_destroy(ddt_sampler *s);

/*
 * The target's next token from its logits at one node: argmax at T = 0, else a
 * sample from softmax(logits / T) restricted by top-k then top-p, drawn with
 * the uniform keyed by (seed, round, node).  The arithmetic order is fixed
 * (see sampler.c) so another backend can reproduce it bit for bit.
 */
ddt_status ddt_sample_token(ddt_sampler *smp, const float *logits, int32_t vocab,
                            const ddt_sampling *s, uint64_t round, uint32_t node,
                            int32_t *out_token, ddt_error *err);

#ifdef __cplusplus
}
#endif
#endif /* DDTREE_H */
