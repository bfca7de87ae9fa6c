/*
 * choice.c — the target's token choice under logit rules and a JSON constraint
 * (see choice.h), shared by the CPU engine and the one-GPU engine's host walk.
 */
#include "engine/choice.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

void ddt_choice_init(ddt_choice *c, int32_t vocab, int32_t capacity) {
    memset(c, 0, sizeof *c);
    c->vocab = vocab;
    c->capacity = capacity;
}

void ddt_choice_free(ddt_choice *c) {
    if (!c) return;
    ddt_json_mask_cache_free(c->masks);
    free(c->pst);
    free(c->masked);
    ddt_logit_state_free(&c->rules);
    free(c->ruled);
    ddt_choice_init(c, c->vocab, c->capacity);
}

ddt_status ddt_choice_set_constraint(ddt_choice *c, const ddt_json_constraint *json, ddt_error *err) {
    if (json && !c->masks) {
        /* 64 masks: a document's states repeat (in a string, after a comma at a depth);
           10 MB at a 160k vocabulary */
        ddt_status st = ddt_json_mask_cache_create(c->vocab, 64, &c->masks, err);
        if (st) return st;
        c->masked = ddt_malloc_array((size_t)c->vocab, sizeof(float));
        c->pst = ddt_calloc_array((size_t)c->capacity, sizeof *c->pst);
        if (!c->masked || !c->pst) {
            free(c->pst);
            c->pst = NULL;
            free(c->masked);
            c->masked = NULL;
            ddt_json_mask_cache_free(c->masks);
            c->masks = NULL;
            return ddt_fail(err, DDT_ERR_NOMEM, "out of memory for a token mask of %d ids", c->vocab);
        }
    }
    ddt_json_mask_cache_clear(c->masks); /* another vocabulary, or none */
    c->json = json ? *json : (ddt_json_constraint){0};
    return DDT_OK;
}

ddt_status ddt_choice_set_rules(ddt_choice *c, const ddt_logit_rules *r, ddt_error *err) {
    if (r && !c->ruled) {
        ddt_status st = ddt_logit_state_init(&c->rules, c->vocab, err);
        if (st) return st;
        c->ruled = ddt_malloc_array((size_t)c->vocab, sizeof(float));
        if (!c->ruled) {
            ddt_logit_state_free(&c->rules);
            return ddt_fail(err, DDT_ERR_NOMEM, "out of memory for a logits row of %d ids", c->vocab);
        }
    }
    return c->ruled ? ddt_logit_state_set(&c->rules, r, err) : DDT_OK;
}

void ddt_choice_set_answer_start(ddt_choice *c, int32_t start) { c->answer_start = start; }

ddt_status ddt_choice_start(ddt_choice *c, const int32_t *prompt, int32_t n_prompt, const int32_t *stop,
                            int32_t n_stop, ddt_error *err) {
    if (c->json.vocab && n_stop < 1)
        return ddt_fail(err, DDT_ERR_INVALID, "JSON constraint: the generation needs a stop id to end the document "
                        "with (the stop list is empty)");
    c->stop = stop;
    c->n_stop = n_stop;
    if (c->json.vocab) {
        if (c->json.schema) ddt_json_init_schema(&c->jstate, c->json.schema);
        else ddt_json_init(&c->jstate, c->json.object_only);
    }
    if (c->rules.active) {
        ddt_logit_state_reset(&c->rules, prompt, n_prompt);
        /* the answer's ids that earlier generations wrote: the penalties go on from them */
        if (c->answer_start > 0 && c->answer_start < n_prompt)
            ddt_logit_state_push(&c->rules, prompt + c->answer_start, n_prompt - c->answer_start);
    }
    return DDT_OK;
}

ddt_status ddt_choice_pick(ddt_choice *c, ddt_sampler *sampler, const ddt_sampling *sampling, const float *row,
                           const ddt_json_state *s, const int32_t *path, int32_t n_path, uint64_t round,
                           uint32_t node, int32_t *token, ddt_error *err) {
    if (c->rules.active) {
        ddt_logit_state_apply(&c->rules, row, path, n_path, c->ruled);
        row = c->ruled;
    }
    if (!c->json.vocab) return ddt_sample_token(sampler, row, c->vocab, sampling, round, node, token, err);
    int32_t n_allowed = 0;
    const uint8_t *allow = ddt_json_mask_cache_get(c->masks, c->json.vocab, s, c->stop, c->n_stop, &n_allowed);
    if (n_allowed == 0)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "JSON constraint: no token of this vocabulary can continue the "
                        "document here");
    for (int32_t i = 0; i < c->vocab; i++) c->masked[i] = allow[i] ? row[i] : -INFINITY;
    return ddt_sample_token(sampler, c->masked, c->vocab, sampling, round, node, token, err);
}

ddt_status ddt_choice_pick_node(ddt_choice *c, ddt_sampler *sampler, const ddt_sampling *sampling, const ddt_tree *t,
                                const float *row, int32_t node, uint64_t round, int32_t *token, ddt_error *err) {
    /* the state after the node's path, from the table the build (or tree_states) filled */
    const ddt_json_state *s = c->json.vocab ? &c->pst[node] : &c->jstate;
    /* the node's draft path below the root (the root was emitted already): the
       penalties count it as generated */
    int32_t path[DDT_MAX_PATH], n_path = 0;
    if (c->rules.active)
        for (int32_t v = node; v > 0 && n_path < DDT_MAX_PATH; v = t->parent[v]) path[n_path++] = t->token[v];
    return ddt_choice_pick(c, sampler, sampling, row, s, path, n_path, round, (uint32_t)node, token, err);
}

static bool is_stop(const ddt_choice *c, int32_t id) {
    for (int32_t i = 0; i < c->n_stop; i++)
        if (c->stop[i] == id) return true;
    return false;
}

ddt_status ddt_choice_take(ddt_choice *c, const int32_t *ids, int32_t n, ddt_error *err) {
    /* a stop id ends the document and leaves the state as it is (nothing after it is emitted) */
    if (c->json.vocab)
        for (int32_t i = 0; i < n; i++)
            if (!is_stop(c, ids[i]) && !ddt_json_vocab_advance(c->json.vocab, &c->jstate, ids[i]))
                return ddt_fail(err, DDT_ERR_INTERNAL,
                                "token %d was chosen under the JSON mask but the grammar refuses it", ids[i]);
    if (c->rules.active) ddt_logit_state_push(&c->rules, ids, n);
    return DDT_OK;
}

void ddt_choice_root(ddt_choice *c) {
    if (c->json.vocab) c->pst[0] = c->jstate;
}

bool ddt_choice_allows(void *ctx, int32_t parent, int32_t node, int32_t token) {
    ddt_choice *c = ctx;
    /* stepped in place: a refused candidate's slot is simply the next one's */
    ddt_json_state *s = &c->pst[node];
    *s = c->pst[parent];
    if (is_stop(c, token)) return ddt_json_complete(s);
    return !ddt_json_complete(s) && ddt_json_vocab_advance(c->json.vocab, s, token);
}

void ddt_choice_tree_states(ddt_choice *c, const ddt_tree *t) {
    if (!c->json.vocab) return;
    ddt_choice_root(c);
    /* a parent precedes its children in every tree the builders make (ddt_tree_from_parents
       checks); a refused node keeps its parent's state (the grammar steps atomically) */
    for (int32_t v = 1; v < t->n_nodes && v < c->capacity; v++)
        (void)ddt_choice_allows(c, t->parent[v], v, t->token[v]);
}

void ddt_choice_bias_rows(const ddt_choice *c, float *rows, int32_t n_rows) {
    if (c->rules.active) ddt_logit_state_bias_rows(&c->rules, rows, n_rows);
}
