/*
 * job.c — see job.h.
 */
#include "server/job.h"

#include "text/json_schema.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"

double ddt_job_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

ddt_job *ddt_job_new(const char *const *stop, const size_t *stop_len, int n_stop) {
    ddt_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    ddt_error err;
    if (ddt_textstream_init(&j->text, stop, stop_len, n_stop, &err) != DDT_OK) {
        free(j);
        return NULL;
    }
    ddt_textstream_init(&j->reasoning, NULL, NULL, 0, &err); /* no stop strings: cannot fail */
    ddt_chat_router_init(&j->router, NULL, false);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->t_first = -1.0;
    j->logprobs = -1;
    j->call_end = j->arg_begin = -1; /* no constrained calls */
    return j;
}

void ddt_job_retain(ddt_job *j) {
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

void ddt_job_release(ddt_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left > 0) return;
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    ddt_textstream_free(&j->text);
    ddt_textstream_free(&j->reasoning);
    ddt_chat_router_free(&j->router);
    free(j->prompt);
    free(j->out);
    free(j->lp);
    free(j->prompt_lp);
    free(j->echo_text);
    ddt_json_schema_free(j->schema);
    for (int32_t k = 0; k < j->n_tools; k++) {
        free(j->tool_names ? j->tool_names[k] : NULL);
        ddt_json_schema_free(j->tool_schemas ? j->tool_schemas[k] : NULL);
    }
    free(j->tool_names);
    free(j->tool_schemas);
    free(j->bias_ids);
    free(j->bias);
    free(j);
}

bool ddt_job_set_logit_rules(ddt_job *j, const int32_t *ids, const float *bias, int32_t n, float presence,
                             float frequency, float repetition) {
    if (n > 0) {
        j->bias_ids = malloc((size_t)n * sizeof *j->bias_ids);
        j->bias = malloc((size_t)n * sizeof *j->bias);
        if (!j->bias_ids || !j->bias) return false;
        memcpy(j->bias_ids, ids, (size_t)n * sizeof *ids);
        memcpy(j->bias, bias, (size_t)n * sizeof *bias);
    }
    j->rules = (ddt_logit_rules){j->bias_ids, j->bias, n, presence, frequency, repetition};
    return true;
}

/* "stop" when a stop token ended the generation (the engine says so) or a stop
 * string the text (only the server knows those: it cancelled the engine for it). */
const char *ddt_job_finish_reason(const ddt_job *j) {
    bool stopped = j->stats.stop_reason == DDT_STOP_TOKEN || j->text.stopped;
    if (stopped && j->chat && j->router.n_calls > 0 && !j->text.stopped) return "tool_calls";
    return stopped ? "stop" : "length";
}

bool ddt_job_take_tokens(ddt_job *j, const int32_t *ids, int32_t n) {
    const ddt_tokenizer *tok = j->tok;
    pthread_mutex_lock(&j->mu);
    if (j->t_first < 0) j->t_first = ddt_job_now() - j->t_arrival;
    for (int32_t i = 0; i < n && !j->stop_hit; i++) {
        j->n_counted++;
        bool stop_id = false;
        for (int32_t s = 0; s < j->n_stop_ids; s++) stop_id |= ids[i] == j->stop_ids[s];
        if (stop_id) {
            j->stop_hit = true; /* the stop token itself is not text */
            break;
        }
        ddt_textstream *to = &j->text;
        ddt_error err;
        if (j->chat) {
            ddt_chat_channel ch;
            bool call_done;
            if (ddt_chat_route(&j->router, ids[i], &ch, &call_done, &err) != DDT_OK) {
                j->cancel = true; /* out of memory: end the request rather than lose a call silently */
                snprintf(j->error, sizeof j->error, "%s", err.msg);
                j->status = DDT_ERR_NOMEM;
                break;
            }
            if (call_done && j->one_call) {
                j->stop_hit = true; /* a forced call's end is the answer's (job.h one_call) */
                break;
            }
            if (ch != DDT_CHAT_CH_CONTENT && ch != DDT_CHAT_CH_REASONING) continue;
            if (ch == DDT_CHAT_CH_REASONING) to = &j->reasoning;
        }
        const uint8_t *b;
        size_t len;
        if (ddt_tokenizer_text_bytes(tok, ids[i], &b, &len)) {
            if (ddt_textstream_push(to, b, len, &err) != DDT_OK) {
                j->cancel = true; /* out of memory: end the request rather than lose text silently */
                snprintf(j->error, sizeof j->error, "%s", err.msg);
                j->status = DDT_ERR_NOMEM;
            }
            if (j->text.stopped) j->stop_hit = true;
        }
    }
    j->n_out += n;
    j->version++;
    bool go_on = !j->cancel && !j->stop_hit;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return go_on;
}

/* The engine's per-round callback. */
static bool on_tokens(void *ctx, const int32_t *ids, int32_t n) { return ddt_job_take_tokens(ctx, ids, n); }

static void finish_job(ddt_job *j, ddt_status st, const char *msg) {
    pthread_mutex_lock(&j->mu);
    if (st != DDT_OK && j->status == DDT_OK) {
        j->status = st;
        snprintf(j->error, sizeof j->error, "%s", msg ? msg : "");
    }
    j->done = true;
    j->version++;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* Stats of one answer made of several generations (generate_call): counts and times
 * add up, the prompt and its cache are the first's, the end is the last's. */
static void merge_stats(ddt_gen_stats *a, const ddt_gen_stats *b) {
    const int32_t rounds = a->rounds + b->rounds;
    a->expected_acceptance = rounds ? (a->expected_acceptance * a->rounds + b->expected_acceptance * b->rounds) / rounds
                                    : 0.0;
    a->tokens += b->tokens;
    a->rounds = rounds;
    a->ar_rounds += b->ar_rounds;
    a->auto_capped_rounds += b->auto_capped_rounds;
    a->nodes_verified += b->nodes_verified;
    a->accepted += b->accepted;
    a->mean_acceptance = rounds ? (double)a->accepted / rounds : 0.0;
    a->t_prefill += b->t_prefill;
    a->t_draft += b->t_draft;
    a->t_build += b->t_build;
    a->t_verify += b->t_verify;
    a->t_walk += b->t_walk;
    a->t_commit += b->t_commit;
    a->t_total += b->t_total;
    const double decode = a->t_total - a->t_prefill;
    a->tokens_per_s = decode > 0 ? a->tokens / decode : 0.0;
    a->stop_reason = b->stop_reason;
}

const struct ddt_json_schema *ddt_job_tool_schema(const ddt_job *j, const char *name, bool *declared) {
    *declared = false;
    for (int32_t k = 0; name && k < j->n_tools; k++)
        if (!strcmp(name, j->tool_names[k])) {
            *declared = true;
            return j->tool_schemas[k]; /* a name declared twice: its first declaration, as request.c */
        }
    return NULL;
}

ddt_call_next ddt_job_call_next(const ddt_job *j, bool in_args, int32_t n_new, int32_t last, int32_t done,
                                bool go_on, bool args_open) {
    /* a stop id or string, a cancel, or an engine that had nothing left to give */
    if (!go_on || n_new == 0) return DDT_CALL_END;
    if (in_args) {
        /* the grammar's only way out is call_end: without it the generation ran out of tokens */
        if (last != j->call_end || j->one_call) return DDT_CALL_END;
        /* one generation would have run on after the call, so a budget spent on its end is a cut */
        return done >= j->max_new ? DDT_CALL_CUT : DDT_CALL_FREE;
    }
    /* free text ends at arg_begin or a stop id (then go_on is false): anything else ran out */
    if (j->arg_begin < 0 || last != j->arg_begin) return DDT_CALL_END;
    if (done >= j->max_new) return DDT_CALL_CUT;
    /* arg_begin outside a call (a stray one, or in the reasoning) opens nothing: the text goes on */
    return args_open ? DDT_CALL_ARGS : DDT_CALL_FREE;
}

/* The function whose call's arguments the router is at (job.h arg_begin): *open
 * whether one is, *schema its grammar (ddt_job_tool_schema). */
static ddt_status schema_of_call(ddt_job *j, const ddt_json_schema **schema, bool *open, ddt_error *err) {
    char *name = NULL;
    pthread_mutex_lock(&j->mu);
    ddt_status st = ddt_chat_router_args_name(&j->router, &name, err);
    pthread_mutex_unlock(&j->mu);
    *open = name != NULL;
    bool declared;
    *schema = ddt_job_tool_schema(j, name, &declared);
    free(name);
    return st;
}

/*
 * One more generation of the answer: from the prompt and the answer's first
 * done tokens (ctx, [n_prompt + max_new], holds the prompt and gets them copied
 * in; the prefix cache keeps that context), at most max_new - done tokens into
 * out + done, their log-probabilities at lp + done.  The first writes *stats,
 * later ones are merged into it; after the first the seed changes with done, so
 * no generation replays another's random draws.
 */
static ddt_status generate_more(ddt_job_queue *q, ddt_job *j, int32_t *ctx, int32_t done, const int32_t *stop,
                                int32_t n_stop, int32_t *n_new, ddt_gen_stats *stats, ddt_error *err) {
    *n_new = 0;
    const int32_t *p = j->prompt;
    ddt_status st = DDT_OK;
    if (done > 0) {
        memcpy(ctx + j->n_prompt, j->out, (size_t)done * sizeof *ctx);
        p = ctx;
        ddt_sampling s2 = j->sampling;
        s2.seed ^= 0x9E3779B97F4A7C15ull * (uint64_t)done;
        st = ddt_engine_set_sampling(q->eng, &s2, err);
        if (st == DDT_OK && j->lp)
            st = ddt_engine_set_logprobs(q->eng, j->lp + done, j->max_new - done, j->logprobs, err);
    }
    ddt_gen_stats more;
    memset(&more, 0, sizeof more);
    if (st == DDT_OK)
        st = ddt_engine_generate(q->eng, p, j->n_prompt + done, j->max_new - done, stop, n_stop, j->out + done, n_new,
                                 on_tokens, j, done > 0 ? &more : stats, err);
    if (done > 0) merge_stats(stats, &more);
    return st;
}

/*
 * An answer with constrained tool calls (job.h call_end): one logical generation
 * made of engine generations that alternate between the model's own text,
 * unconstrained, stopping at <|tool_call_argument_begin|> or the turn's stop ids,
 * and a call's arguments, under the grammar of the function the call names,
 * stopping at <|tool_call_end|> (the only stop id they get, so the document
 * cannot end the turn unclosed); ddt_job_call_next decides what follows each.  A
 * forced call by name starts at its arguments (arg_begin -1); a forced call ends
 * the answer with its end (one_call, which take_tokens stops at); "auto" goes on
 * unconstrained after every call.  out, the log-probabilities, the callbacks'
 * counts and the stats run on across the generations, so the answer reads as one
 * generation: the same ids a single unconstrained one would give wherever the
 * grammar allows the model's choice, and greedy modes stay equal (each part is).
 */
static ddt_status generate_call(ddt_job_queue *q, ddt_job *j, int32_t *n_out, ddt_gen_stats *stats, ddt_error *err) {
    int32_t free_stop[3] = {j->arg_begin}, n_free_stop = 1;
    for (int32_t k = 0; k < j->n_stop_ids && k < 2; k++) free_stop[n_free_stop++] = j->stop_ids[k];
    const int32_t args_stop[1] = {j->call_end};
    /* the answer so far after the prompt, for every generation after the first: made once, here,
       as nothing may allocate once rounds run */
    int32_t *ctx = malloc(((size_t)j->n_prompt + (size_t)j->max_new) * sizeof *ctx);
    if (!ctx) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory for a tool call's context");
    memcpy(ctx, j->prompt, (size_t)j->n_prompt * sizeof *ctx);
    ddt_json_constraint c = j->json;
    ddt_engine_set_answer_start(q->eng, j->n_prompt); /* the penalties count the whole answer */
    bool in_args = j->arg_begin < 0; /* a forced call by name: the prompt ends at its arguments */
    int32_t done = 0, n_new = 0;
    ddt_status st = DDT_OK;
    for (;;) {
        st = ddt_engine_set_constraint(q->eng, in_args ? &c : NULL, err);
        if (st == DDT_OK)
            st = generate_more(q, j, ctx, done, in_args ? args_stop : free_stop, in_args ? 1 : n_free_stop, &n_new,
                               stats, err);
        done += n_new;
        if (st != DDT_OK) break;
        pthread_mutex_lock(&j->mu);
        bool go_on = !j->cancel && !j->stop_hit;
        pthread_mutex_unlock(&j->mu);
        bool open = false;
        const ddt_json_schema *called = NULL;
        if (!in_args && go_on && n_new > 0 && j->out[done - 1] == j->arg_begin &&
            (st = schema_of_call(j, &called, &open, err)) != DDT_OK)
            break;
        ddt_call_next next = ddt_job_call_next(j, in_args, n_new, n_new ? j->out[done - 1] : -1, done, go_on, open);
        if (next == DDT_CALL_CUT) stats->stop_reason = DDT_STOP_MAX_TOKENS; /* not the model's stop */
        if (next == DDT_CALL_END || next == DDT_CALL_CUT) break;
        in_args = next == DDT_CALL_ARGS;
        c.schema = called;
    }
    *n_out = done;
    free(ctx);
    ddt_engine_set_answer_start(q->eng, 0);
    return st;
}

static void run_job(ddt_job_queue *q, ddt_job *j) {
    ddt_error err = {0};
    pthread_mutex_lock(&j->mu);
    bool skip = j->cancel;
    j->started = true;
    pthread_mutex_unlock(&j->mu);
    if (skip) {
        finish_job(j, DDT_OK, NULL);
        ddt_metrics_add_outcome(q->metrics, true, false);
        return;
    }
    ddt_status st = ddt_engine_set_sampling(q->eng, &j->sampling, &err);
    if (st == DDT_OK && q->can_switch) st = ddt_engine_set_speculation(q->eng, j->mode, j->budget, j->budget_auto, &err);
    ddt_engine_speculation(q->eng, &j->ran_mode, NULL, NULL);
    if (st == DDT_OK) {
        j->out = malloc((size_t)(j->max_new > 0 ? j->max_new : 1) * sizeof(int32_t));
        if (!j->out) st = ddt_fail(&err, DDT_ERR_NOMEM, "out of memory for %d output tokens", j->max_new);
    }
    /* log-probabilities: written by the engine before each round's callback */
    if (st == DDT_OK && j->logprobs >= 0) {
        j->lp = malloc((size_t)(j->max_new > 0 ? j->max_new : 1) * sizeof *j->lp);
        if (!j->lp) st = ddt_fail(&err, DDT_ERR_NOMEM, "out of memory for %d tokens' log-probabilities", j->max_new);
    }
    if (st == DDT_OK) st = ddt_engine_set_logprobs(q->eng, j->lp, j->lp ? j->max_new : 0, j->lp ? j->logprobs : 0, &err);
    /* every job sets its own constraint and logit rules (or none), so none outlives its request */
    if (st == DDT_OK) st = ddt_engine_set_constraint(q->eng, j->json.vocab ? &j->json : NULL, &err);
    if (st == DDT_OK) st = ddt_engine_set_logit_rules(q->eng, &j->rules, &err);
    /* echo with logprobs: the prompt's own tokens scored first (a one-token prompt has nothing to score) */
    if (st == DDT_OK && j->echo && j->logprobs >= 0) {
        j->prompt_lp = malloc((size_t)j->n_prompt * sizeof *j->prompt_lp);
        if (!j->prompt_lp) st = ddt_fail(&err, DDT_ERR_NOMEM, "out of memory for the prompt's log-probabilities");
        else if (j->n_prompt >= 2) st = ddt_engine_score(q->eng, j->prompt, j->n_prompt, j->logprobs, j->prompt_lp, &err);
        else j->prompt_lp[0] = (ddt_token_logprobs){.logprob = NAN, .n_top = 0};
    }
    ddt_gen_stats stats;
    memset(&stats, 0, sizeof stats);
    int32_t n_out = 0;
    if (st == DDT_OK && j->max_new > 0 && j->call_end >= 0) {
        j->tok = q->tok;
        st = generate_call(q, j, &n_out, &stats, &err);
    } else if (st == DDT_OK && j->max_new > 0) { /* echo may ask for none */
        j->tok = q->tok;
        st = ddt_engine_generate(q->eng, j->prompt, j->n_prompt, j->max_new, j->stop_ids, j->n_stop_ids, j->out,
                                 &n_out, on_tokens, j, &stats, &err);
    }
    if (j->lp) ddt_engine_set_logprobs(q->eng, NULL, 0, 0, NULL); /* the job's buffer outlives no request */
    if (st == DDT_OK && j->max_new == 0) { /* echo alone: the prompt, scored or not */
        stats.prompt_tokens = j->n_prompt;
        stats.stop_reason = DDT_STOP_MAX_TOKENS;
    }
    pthread_mutex_lock(&j->mu);
    j->stats = stats;
    bool cancelled = j->cancel && j->status == DDT_OK;
    pthread_mutex_unlock(&j->mu);
    finish_job(j, st, err.msg);
    if (st == DDT_OK && !cancelled) {
        pthread_mutex_lock(&j->mu);
        double total = ddt_job_now() - j->t_arrival, ttft = j->t_first;
        ddt_mode m = j->ran_mode;
        pthread_mutex_unlock(&j->mu);
        ddt_metrics_add_generation(q->metrics, m, &stats, ttft, total);
    }
    ddt_metrics_add_outcome(q->metrics, cancelled, st != DDT_OK);
}

static void *worker_main(void *arg) {
    ddt_job_queue *q = arg;
    for (;;) {
        pthread_mutex_lock(&q->mu);
        while (!q->head && !q->stopping) pthread_cond_wait(&q->cv, &q->mu);
        ddt_job *j = q->head;
        if (!j) {
            pthread_mutex_unlock(&q->mu);
            break;
        }
        q->head = j->next;
        if (!q->head) q->tail = NULL;
        j->next = NULL;
        q->len--;
        q->running = j;
        if (q->stopping) {
            pthread_mutex_lock(&j->mu);
            j->cancel = true;
            pthread_mutex_unlock(&j->mu);
        }
        pthread_mutex_unlock(&q->mu);
        ddt_metrics_queue(q->metrics, -1, 1);
        run_job(q, j);
        ddt_metrics_queue(q->metrics, 0, -1);
        pthread_mutex_lock(&q->mu);
        q->running = NULL;
        pthread_mutex_unlock(&q->mu);
        ddt_job_release(j);
    }
    return NULL;
}

ddt_status ddt_job_queue_start(ddt_job_queue *q, ddt_engine *eng, const ddt_tokenizer *tok, bool can_switch,
                               int max, ddt_metrics *m, ddt_error *err) {
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->eng = eng;
    q->tok = tok;
    q->can_switch = can_switch;
    q->max = max;
    q->metrics = m;
    q->initialised = true;
    if (pthread_create(&q->thread, NULL, worker_main, q) != 0)
        return ddt_fail(err, DDT_ERR_NOMEM, "cannot start the engine's worker thread");
    q->thread_started = true;
    return DDT_OK;
}

ddt_status ddt_job_queue_push(ddt_job_queue *q, ddt_job *j, ddt_error *err) {
    pthread_mutex_lock(&q->mu);
    if (q->stopping) {
        pthread_mutex_unlock(&q->mu);
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "the server is shutting down");
    }
    if (q->len >= q->max) {
        int n = q->len;
        pthread_mutex_unlock(&q->mu);
        return ddt_fail(err, DDT_ERR_RANGE, "the server is busy: %d requests are waiting; try again later", n);
    }
    ddt_job_retain(j);
    j->next = NULL;
    if (q->tail) q->tail->next = j;
    else q->head = j;
    q->tail = j;
    q->len++;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    ddt_metrics_queue(q->metrics, 1, 0);
    return DDT_OK;
}

void ddt_job_queue_stop(ddt_job_queue *q) {
    if (!q->thread_started) return;
    pthread_mutex_lock(&q->mu);
    q->stopping = true;
    for (ddt_job *j = q->head; j; j = j->next) {
        pthread_mutex_lock(&j->mu);
        j->cancel = true;
        pthread_mutex_unlock(&j->mu);
    }
    if (q->running) {
        pthread_mutex_lock(&q->running->mu);
        q->running->cancel = true;
        pthread_mutex_unlock(&q->running->mu);
    }
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL);
    q->thread_started = false;
}

void ddt_job_queue_destroy(ddt_job_queue *q) {
    if (!q->initialised) return;
    ddt_job_queue_stop(q);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    q->initialised = false;
}
