/*
 * choice.h — the target's token choice under a request's rules, for every engine
 * that makes the choice on the host: the logit rules (logit_rules.h: bias,
 * penalties) and the JSON constraint (json_vocab.h: the grammar's token mask at
 * the state after the tokens before).  The CPU engine makes every choice here;
 * the one-GPU engine runs its rounds with the walk on the host while any rule or
 * constraint is set (engine_cuda.c), so both give the same tokens from the same
 * logits.
 *
 * Why chain / tree stay lossless: a tree node's choice is made from its row
 * under the rules with the node's draft path counted as generated, masked at the
 * grammar state after that path, which is the choice a one-token-at-a-time
 * decode makes at that position.  A node whose token the grammar refuses is
 * never reached (the masked choice at its parent never takes it), so trees built
 * without the grammar (the device builder) stay correct, only less useful.
 *
 * Everything is allocated when a rule or constraint is first set; a generation
 * allocates nothing.
 */
#ifndef DDT_ENGINE_CHOICE_H
#define DDT_ENGINE_CHOICE_H

#include <stdbool.h>
#include <stdint.h>

#include "ddtree.h"
#include "engine/engine.h"
#include "engine/logit_rules.h"
#include "text/json_vocab.h"

typedef struct ddt_choice {
    int32_t vocab;
    int32_t capacity;           /* tree nodes the state table holds */
    /* ddt_engine_set_constraint: the grammar (json.vocab NULL = off); during a
       generation, the recogniser's state after every emitted token */
    ddt_json_constraint json;
    ddt_json_state jstate;
    ddt_json_mask_cache *masks; /* the grammar's masks by state, made by the first constraint */
    ddt_json_state *pst;        /* [capacity] the state after each tree node's path */
    float *masked;              /* [vocab] the row being chosen from, -inf outside the mask */
    /* ddt_engine_set_logit_rules (rules.vocab 0 until the first call) */
    ddt_logit_state rules;
    float *ruled;               /* [vocab] */
    int32_t answer_start;       /* ddt_engine_set_answer_start (0: none) */
    const int32_t *stop;        /* this generation's stop ids: they end a document */
    int32_t n_stop;
} ddt_choice;

/* An empty choice (no rule, no constraint) for a vocabulary and trees of up to
 * `capacity` nodes; nothing is allocated until a rule or constraint is set. */
void ddt_choice_init(ddt_choice *c, int32_t vocab, int32_t capacity);
void ddt_choice_free(ddt_choice *c);

/* ddt_engine_set_constraint / set_logit_rules / set_answer_start (engine.h). */
ddt_status ddt_choice_set_constraint(ddt_choice *c, const ddt_json_constraint *json, ddt_error *err);
ddt_status ddt_choice_set_rules(ddt_choice *c, const ddt_logit_rules *r, ddt_error *err);
void ddt_choice_set_answer_start(ddt_choice *c, int32_t start);

/* Whether any choice needs more than the sampler: a constraint or a rule. */
static inline bool ddt_choice_active(const ddt_choice *c) { return c->json.vocab || c->rules.active; }

/* A generation after prompt[0..n_prompt) with these stop ids (kept, not copied):
 * the grammar at its start, the penalties' counts from the answer's earlier ids.
 * A constraint needs a stop id to end its document with. */
ddt_status ddt_choice_start(ddt_choice *c, const int32_t *prompt, int32_t n_prompt, const int32_t *stop,
                            int32_t n_stop, ddt_error *err);

/* The target's token from a logits row (left as it is, for the log-probabilities):
 * under the rules with path[0..n_path) counted as generated, masked at grammar
 * state s, drawn by the sampler keyed (round, node). */
ddt_status ddt_choice_pick(ddt_choice *c, ddt_sampler *sampler, const ddt_sampling *sampling, const float *row,
                           const ddt_json_state *s, const int32_t *path, int32_t n_path, uint64_t round,
                           uint32_t node, int32_t *token, ddt_error *err);

/* The choice at node `node` of tree t from its logits row: the node's state in
 * the state table (ddt_choice_root + the build's ddt_choice_allows, or
 * ddt_choice_tree_states) and its draft path below the root counted. */
ddt_status ddt_choice_pick_node(ddt_choice *c, ddt_sampler *sampler, const ddt_sampling *sampling, const ddt_tree *t,
                                const float *row, int32_t node, uint64_t round, int32_t *token, ddt_error *err);

/* The emitted ids[0..n): the grammar steps over them, the penalties count them. */
ddt_status ddt_choice_take(ddt_choice *c, const int32_t *ids, int32_t n, ddt_error *err);

/* Before a tree build with ddt_choice_allows as its predicate: the root's state is
 * the emitted tokens' (no-op without a constraint). */
void ddt_choice_root(ddt_choice *c);

/* The builder's predicate (ddtree.h ddt_tree_build_filtered; ctx = the choice):
 * whether the grammar takes `token` after node parent's path, stepping node's
 * state.  A stop id only once the document is complete, any other id only
 * before.  Conservative: the mask is a subset of what the grammar takes. */
bool ddt_choice_allows(void *ctx, int32_t parent, int32_t node, int32_t token);

/* The state table for a tree built without the predicate (the device builder):
 * each node's state after its path; a node the grammar refuses keeps its parent's
 * (it can never be reached: see the top of the file). */
void ddt_choice_tree_states(ddt_choice *c, const ddt_tree *t);

/* The bias added to draft logits rows (n_rows of vocab): drafts follow what the
 * biased target will choose.  No-op without rules. */
void ddt_choice_bias_rows(const ddt_choice *c, float *rows, int32_t n_rows);

#endif
