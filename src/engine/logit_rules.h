/*
 * logit_rules.h — OpenAI's logit_bias, presence_penalty and frequency_penalty, and
 * the repetition penalty of Hugging Face / vLLM, as a transform of the target's
 * logits row before each choice (engine.h ddt_engine_set_logit_rules), for the
 * engines that hold their logits on the host.
 *
 * Why speculation stays lossless.  The penalties depend on the tokens generated
 * so far, so the row a tree node's choice is made from must be penalised with
 * the generated tokens plus the node's own draft path (the tokens it would have
 * emitted by then), which is exactly the history a one-token-at-a-time decode has
 * at that position: the chain / tree walk then takes ar's tokens.  The state here
 * counts the emitted tokens; a node's path is added for the one row and taken out
 * again, so nothing is copied per node and nothing allocates during a generation.
 *
 * The arithmetic: l[j] + bias[j] first; then, with a repetition penalty r, every
 * id in the prompt or generated so far: l / r where l > 0, else l * r (vLLM's);
 * then OpenAI's l - c[j] * frequency - (c[j] > 0) * presence, c[j] = how many
 * times j was generated in this generation (the prompt does not count); in float,
 * in that order.
 */
#ifndef DDT_ENGINE_LOGIT_RULES_H
#define DDT_ENGINE_LOGIT_RULES_H

#include <stdbool.h>
#include <stdint.h>

#include "ddtree.h"
#include "engine/engine.h"

typedef struct ddt_logit_state {
    int32_t vocab;
    int32_t n_bias;
    int32_t *bias_ids; /* [DDT_LOGIT_BIAS_MAX] */
    float *bias;       /* [DDT_LOGIT_BIAS_MAX] */
    float presence, frequency;
    float repetition;  /* 0: none */
    bool active;       /* any rule set */
    int32_t *count;    /* [vocab] generated-token counts */
    int32_t *seen;     /* [vocab] the ids with a count, in the order they first came */
    int32_t n_seen;
    uint8_t *in_prompt;   /* [vocab] 1: the id is in this generation's prompt */
    int32_t *prompt_seen; /* [vocab] the ids marked in in_prompt */
    int32_t n_prompt_seen;
} ddt_logit_state;

/* Allocate the state for a vocabulary (counts, the seen lists: 13 bytes an id). */
ddt_status ddt_logit_state_init(ddt_logit_state *s, int32_t vocab, ddt_error *err);
void ddt_logit_state_free(ddt_logit_state *s);

/* Take the rules (NULL: none), checking every id and value; on an error the
 * previous rules stay. */
ddt_status ddt_logit_state_set(ddt_logit_state *s, const ddt_logit_rules *r, ddt_error *err);

/* A new generation after prompt[0..n_prompt): no token generated yet (ids outside
 * the vocabulary are skipped; the engines check the prompt before). */
void ddt_logit_state_reset(ddt_logit_state *s, const int32_t *prompt, int32_t n_prompt);

/* Count the emitted ids[0..n). */
void ddt_logit_state_push(ddt_logit_state *s, const int32_t *ids, int32_t n);

/* out[0..vocab) = row transformed under the rules with the generated tokens plus
 * path[0..n_path) counted (a node's draft path; the state is left as it was).
 * out may be row. */
void ddt_logit_state_apply(ddt_logit_state *s, const float *row, const int32_t *path, int32_t n_path, float *out);

/* The bias added to draft logits rows (depth rows of vocab): the drafter then
 * proposes what the biased target will take. */
void ddt_logit_state_bias_rows(const ddt_logit_state *s, float *rows, int32_t n_rows);

#endif
