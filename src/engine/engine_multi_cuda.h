/*
 * engine_multi_cuda.h — the CUDA engine on several GPUs of one host (internal
 * to the engine layer; callers set engine options gpus / nccl_always).
 *
 * One CUDA engine (engine_cuda.h) per GPU, each with its rank's part of the
 * target (model/shard.h: attention heads, routed experts and MLP rows split, partial
 * outputs summed inside the forward: ncclAllGather, then the partials added in
 * rank order on every rank, an order that does not depend on the token count, so
 * that a tree's verify and an ar step sum a token alike).  Every rank then holds
 * bitwise identical activations, logits and trees: every rank runs the same
 * round (drafter, tree build, verify, walk, commit) redundantly, captures it in
 * its own CUDA graph (NCCL calls are capturable), and takes the same decisions
 * without any host synchronisation beyond the single-GPU engine's.  One host
 * thread per rank drives it; rank 0 runs on the caller's thread and emits.
 */
#ifndef DDT_ENGINE_ENGINE_MULTI_CUDA_H
#define DDT_ENGINE_ENGINE_MULTI_CUDA_H

#include "engine/engine.h"

typedef struct ddt_engine_multi ddt_engine_multi;

/* opts->gpus GPUs (at least 1; devices 0..gpus-1); more than cudaGetDeviceCount
 * is an error naming both numbers. */
ddt_status ddt_engine_multi_create(const char *model_dir, const ddt_engine_options *opts, int32_t max_ctx,
                                   ddt_engine_multi **out, ddt_error *err);
void ddt_engine_multi_free(ddt_engine_multi *m);
int32_t ddt_engine_multi_vocab(const ddt_engine_multi *m);
/* The auto budget's cost table, rank 0's (every rank measures its own GPU at
 * creation, then all take rank 0's, engine_cuda.c share_cost, so that they build
 * the same trees); NULL without --budget auto. */
const ddt_cost_model *ddt_engine_multi_cost(const ddt_engine_multi *m);
const ddt_model_config *ddt_engine_multi_model_config(const ddt_engine_multi *m);
void ddt_engine_multi_set_sampling(ddt_engine_multi *m, const ddt_sampling *s);
/* ddt_engine_set_logprobs: rank 0 reports them (every rank holds the same logits). */
void ddt_engine_multi_set_logprobs(ddt_engine_multi *m, ddt_token_logprobs *out, int32_t capacity, int32_t n_top);
/* ddt_engine_score: every rank runs the prefill forwards, rank 0's values are out's. */
ddt_status ddt_engine_multi_score(ddt_engine_multi *m, const int32_t *ids, int32_t n, int32_t n_top,
                                  ddt_token_logprobs *out, ddt_error *err);
/* ddt_engine_set_constraint / set_logit_rules / set_answer_start: every rank takes
 * them (engine_cuda.h: host-walk rounds, the same picks on every rank). */
ddt_status ddt_engine_multi_set_constraint(ddt_engine_multi *m, const ddt_json_constraint *c, ddt_error *err);
ddt_status ddt_engine_multi_set_logit_rules(ddt_engine_multi *m, const ddt_logit_rules *r, ddt_error *err);
void ddt_engine_multi_set_answer_start(ddt_engine_multi *m, int32_t start);
/* As ddt_engine_cuda_generate; emit_fn is called on the caller's thread (rank 0).
 * When it returns false every rank stops after the next round (whose tokens are
 * dropped), so generate returns on all of them. */
ddt_status ddt_engine_multi_generate(ddt_engine_multi *m, const int32_t *prompt, int32_t n_prompt, int32_t max_new,
                                     const int32_t *stop, int32_t n_stop, int32_t *out, int32_t *n_out,
                                     ddt_emit_fn emit_fn, void *emit_ctx, ddt_gen_stats *stats, ddt_error *err);

#endif
