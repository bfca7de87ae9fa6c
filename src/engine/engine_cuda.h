/*
 * engine_cuda.h — the decoding engine's CUDA backend (internal to the engine
 * layer; callers use engine.h with options.backend = DDT_BACKEND_CUDA).
 *
 * The round (draft, top-K, tree build, verify, argmax + walk, KV commit,
 * drafter context append, emit) is a sequence of launches on one stream whose
 * data-dependent inputs all live on the device, captured once in a CUDA graph
 * and replayed; the host copies the round's emitted tokens back (one
 * synchronisation per round, which streaming output needs anyway).  Greedy
 * decoding walks on the device, and at T > 0 so does the device sampler (the same
 * Philox draws as the CPU backend) where it takes the settings; otherwise, and
 * under logit rules or a JSON constraint, the verify logits come back and the CPU
 * sampler walks the tree.
 */
#ifndef DDT_ENGINE_ENGINE_CUDA_H
#define DDT_ENGINE_ENGINE_CUDA_H

#include "engine/engine.h"
#include "model/target_cuda.h"

typedef struct ddt_engine_cuda ddt_engine_cuda;

/* A CUDA device is present and usable. */
bool ddt_engine_cuda_available(void);

ddt_status ddt_engine_cuda_create(const char *model_dir, const ddt_engine_options *opts, int32_t max_ctx,
                                  ddt_engine_cuda **out, ddt_error *err);
/* One rank of a multi-GPU engine (engine_multi_cuda.h), on the calling thread's
 * current device: its target holds rank `rank` of `world` (model/shard.h), sums
 * partial results with allreduce(ctx, ...) and gathers its logits' vocabulary
 * blocks with allgather(ctx, ...) (NULL: every rank computes all the logits).  Everything else (drafter,
 * tree, walk) runs whole on every rank, on the same bytes.  With world > 1 every
 * round also sums a one-float stop flag over the ranks first (allreduce, not
 * synchronised on its own), so a cancel by rank 0's emit callback ends every
 * rank after the same round (emitter.h: ddt_emitter_next_round). */
ddt_status ddt_engine_cuda_create_rank(const char *model_dir, const ddt_engine_options *opts, int32_t max_ctx,
                                       int32_t rank, int32_t world, ddt_cuda_allreduce_fn allreduce,
                                       ddt_cuda_allgather_fn allgather, void *ctx, ddt_engine_cuda **out,
                                       ddt_error *err);
void ddt_engine_cuda_free(ddt_engine_cuda *e);
int32_t ddt_engine_cuda_vocab(const ddt_engine_cuda *e);
/* The auto budget's cost model (measured on this GPU at create, or the one the
 * caller gave); NULL without --budget auto. */
const ddt_cost_model *ddt_engine_cuda_cost(const ddt_engine_cuda *e);
const ddt_model_config *ddt_engine_cuda_model_config(const ddt_engine_cuda *e);
void ddt_engine_cuda_set_sampling(ddt_engine_cuda *e, const ddt_sampling *s);
ddt_status ddt_engine_cuda_generate(ddt_engine_cuda *e, const int32_t *prompt, int32_t n_prompt, int32_t max_new,
                                    const int32_t *stop, int32_t n_stop, int32_t *out, int32_t *n_out,
                                    ddt_emit_fn emit_fn, void *emit_ctx, ddt_gen_stats *stats, ddt_error *err);
/* ddt_engine_set_logprobs on one GPU: each round's emitted rows are copied back
 * and log-softmaxed on the host (logprobs.h), two synchronisations a round. */
void ddt_engine_cuda_set_logprobs(ddt_engine_cuda *e, ddt_token_logprobs *out, int32_t capacity, int32_t n_top);
/* ddt_engine_score on one GPU (arguments checked by engine.c): prefill chunks with
 * every row's logits, copied back and log-softmaxed on the host (logprobs.h). */
ddt_status ddt_engine_cuda_score(ddt_engine_cuda *e, const int32_t *ids, int32_t n, int32_t n_top,
                                 ddt_token_logprobs *out, ddt_error *err);
/* ddt_engine_set_speculation on one GPU (a rank of several refuses): ar always;
 * chain and tree with a drafter, within what create allocated (chain: a budget of
 * at least the draft depth; tree: budgets up to the created one); the auto budget
 * only on an engine created with it, at its budget.  The round's graphs are
 * captured again at the next generation's start (a few ms).  A speculative
 * engine's ar steps feed the drafter, so its context stays the target's. */
ddt_status ddt_engine_cuda_set_speculation(ddt_engine_cuda *e, ddt_mode mode, int32_t budget, bool budget_auto,
                                          ddt_error *err);
/* ddt_engine_set_constraint / set_logit_rules / set_answer_start (one GPU, or a
 * rank of several: the ranks' logits are the same bytes, so are their picks):
 * while a constraint or a rule is set, every choice is made on the host
 * (engine/choice.h) over the rows copied back, the ar step and the round run as
 * launches (no graph) with the walk on the host, as a host-sampled round does;
 * the tree is the device builder's, without the grammar (refused nodes are
 * verified but never reached), and the drafts do not see the bias. */
ddt_status ddt_engine_cuda_set_constraint(ddt_engine_cuda *e, const ddt_json_constraint *c, ddt_error *err);
ddt_status ddt_engine_cuda_set_logit_rules(ddt_engine_cuda *e, const ddt_logit_rules *r, ddt_error *err);
void ddt_engine_cuda_set_answer_start(ddt_engine_cuda *e, int32_t start);

#endif
