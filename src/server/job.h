/*
 * job.h — one generation request on its way through the server, and the FIFO
 * queue + worker thread that feed jobs to the single engine in arrival order.
 *
 * A job is shared by the HTTP thread that made it and the worker: its inputs
 * are fixed before it is queued; its outputs (text, counts, status) change
 * under its mutex, and every change is broadcast on its condition variable.
 * The HTTP side sets `cancel` when its client leaves; the worker's per-round
 * callback sees it and stops the engine.  Reference counted: each side drops
 * its reference with ddt_job_release.
 */
#ifndef DDT_SERVER_JOB_H
#define DDT_SERVER_JOB_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "ddtree.h"
#include "engine/engine.h"
#include "server/metrics.h"
#include "server/textstream.h"
#include "text/chat_output.h"
#include "text/tokenizer.h"

typedef struct ddt_job {
    struct ddt_job *next;
    /* inputs, fixed once queued */
    int32_t *prompt;         /* owned */
    int32_t n_prompt, max_new;
    int32_t stop_ids[2];
    int32_t n_stop_ids;
    ddt_sampling sampling;
    ddt_mode mode;
    int32_t budget;
    bool budget_auto;
    double t_arrival;        /* monotonic seconds */
    const ddt_tokenizer *tok;/* the worker's, for the text (NULL: ids only) */
    int32_t logprobs;        /* -1: none; else alternatives per token (ddt_engine_set_logprobs) */
    bool echo;               /* completions' echo: with logprobs, the prompt is scored first (prompt_lp) */
    char *echo_text;         /* owned: the prompt as the response repeats it (echo) */
    size_t echo_len;
    bool chat;               /* chat: the output is routed (router) into content, reasoning, tool calls */
    ddt_json_constraint json;/* response_format json_object / json_schema: the engine's constraint (vocab NULL: none) */
    struct ddt_json_schema *schema; /* owned: json.schema, a copy of the request's (it outlives the request) */
    /* Tool calls under the grammar (CPU engines): a call's arguments are a JSON document
     * (json's vocab and object_only; its schema that of the function called), decoded with
     * <|tool_call_end|> as its only stop id, so a document cannot end the turn unclosed.  The
     * answer is then one logical generation made of several engine generations (generate_call):
     * the model's own text unconstrained, each call's arguments constrained. */
    int32_t call_end;        /* >= 0: <|tool_call_end|>: arguments are constrained, and end at it */
    int32_t arg_begin;       /* >= 0: the model opens calls itself (tool_choice "auto", or "required" of
                                several functions): an unconstrained generation stops at
                                <|tool_call_argument_begin|>, and when that opened a call's arguments
                                the next one is under the grammar of the function the call names
                                (json's object_only when the name matches none or its schema did not
                                compile); -1: the prompt already ends at the one forced call's
                                arguments, a single generation under json */
    bool one_call;           /* a forced call: its <|tool_call_end|> ends the answer (routed like any id,
                                then the text ends as at a stop id); false ("auto"): the model goes on
                                after each call, unconstrained, and may call again */
    char **tool_names;       /* owned, [n_tools]: arg_begin's functions, and their compiled parameters */
    struct ddt_json_schema **tool_schemas; /* owned, [n_tools], NULL entries: a JSON object only */
    int32_t n_tools;
    /* logit_bias and the penalties (engine.h ddt_engine_set_logit_rules), set for the job's
     * generations; rules.n_bias 0 and both penalties 0: none */
    ddt_logit_rules rules;
    int32_t *bias_ids; /* owned: rules.bias_ids */
    float *bias;       /* owned: rules.bias */
    /* shared state, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    bool cancel;             /* the client went away (or the server stops) */
    bool started, done;
    uint64_t version;        /* bumped on every change the waiters may care about */
    ddt_textstream text;     /* the content (chat) or the completion's text */
    ddt_textstream reasoning;/* chat: a thinking model's reasoning_content (no stop strings) */
    ddt_chat_router router;  /* chat: set up by the server before queueing; calls[0..n_calls) final */
    int32_t *out;            /* [max_new] the engine's output */
    ddt_token_logprobs *lp;  /* [max_new] their log-probabilities when asked (logprobs >= 0), else NULL;
                                entries below n_counted are final once counted */
    ddt_token_logprobs *prompt_lp; /* [n_prompt] echo + logprobs: the prompt's (entry 0 has none) */
    int32_t n_out;           /* tokens emitted (the engine's count once done) */
    int32_t n_counted;       /* completion tokens up to and with the one that ended the text */
    bool stop_hit;           /* a stop token or stop string ended the text */
    double t_first;          /* arrival to first token, < 0 until then */
    ddt_status status;
    char error[DDT_ERROR_MSG_MAX];
    ddt_gen_stats stats;
    ddt_mode ran_mode;       /* the mode it was decoded in */
} ddt_job;

/* A job with one reference and the given stop strings; NULL when out of memory. */
ddt_job *ddt_job_new(const char *const *stop, const size_t *stop_len, int n_stop);
void ddt_job_retain(ddt_job *j);
void ddt_job_release(ddt_job *j);

/* Copy logit_bias (ids[i] -> bias[i], n of them) and the penalties (repetition 0:
 * none) into j->rules; false when out of memory. */
bool ddt_job_set_logit_rules(ddt_job *j, const int32_t *ids, const float *bias, int32_t n, float presence,
                             float frequency, float repetition);
/* "stop", "length" or "tool_calls" for a finished job (call under its mutex):
 * from the engine's stop reason, the stop strings the text matched, and the
 * tool calls a chat answer made (which end a turn that stopped by itself). */
const char *ddt_job_finish_reason(const ddt_job *j);
/* One round's emitted ids into the job (the engine's callback; takes the job's
 * mutex): stop ids, then the text (chat: routed into content, reasoning and
 * tool calls), counts, and a broadcast.  Returns whether to go on. */
bool ddt_job_take_tokens(ddt_job *j, const int32_t *ids, int32_t n);

/* What an answer with constrained tool calls (call_end >= 0) does after one of its
 * engine generations (generate_call in job.c). */
typedef enum ddt_call_next {
    DDT_CALL_END,  /* it is over, for the reason the generation ended (a stop id or string, the
                      forced call's end, a cancel, max_tokens or the context) */
    DDT_CALL_CUT,  /* it is over at max_tokens right where the model would go on (a call opened or
                      closed on the last token): the stop reason is max_tokens, whatever id it was */
    DDT_CALL_ARGS, /* next: a call's arguments, under its function's grammar */
    DDT_CALL_FREE  /* next: the model's own text again, unconstrained */
} ddt_call_next;

/* After a generation that emitted n_new ids, the last one `last`, `done` in the answer so
 * far: in_args whether it was a call's arguments, go_on whether the job takes more (no stop,
 * no cancel: ddt_job_take_tokens's answer), args_open whether the router is now inside a
 * call's arguments (ddt_chat_router_args_name gives a name). */
ddt_call_next ddt_job_call_next(const ddt_job *j, bool in_args, int32_t n_new, int32_t last, int32_t done,
                                bool go_on, bool args_open);
/* The grammar of the arguments of a call to `name` (NULL: none is being read): its function's
 * compiled parameters, or NULL (a JSON object) when no declared function has that name or its
 * schema did not compile.  *declared says whether one has it. */
const struct ddt_json_schema *ddt_job_tool_schema(const ddt_job *j, const char *name, bool *declared);

typedef struct ddt_job_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ddt_job *head, *tail;
    int len, max;
    bool stopping;
    ddt_job *running;
    ddt_engine *eng;
    const ddt_tokenizer *tok; /* token bytes for the text (read only: safe beside encoding) */
    bool can_switch;
    ddt_metrics *metrics;
    pthread_t thread;
    bool thread_started, initialised;
} ddt_job_queue;

/* Start the worker thread that owns eng. */
ddt_status ddt_job_queue_start(ddt_job_queue *q, ddt_engine *eng, const ddt_tokenizer *tok, bool can_switch,
                               int max, ddt_metrics *m, ddt_error *err);
/* Queue a job (the queue takes its own reference): DDT_ERR_RANGE when full,
 * DDT_ERR_UNSUPPORTED when the server is stopping. */
ddt_status ddt_job_queue_push(ddt_job_queue *q, ddt_job *j, ddt_error *err);
/* Cancel every job and wait for the worker to finish; later pushes fail. */
void ddt_job_queue_stop(ddt_job_queue *q);
/* Stop (if not yet) and free the queue's locks; nothing may use it after. */
void ddt_job_queue_destroy(ddt_job_queue *q);

/* Seconds on the monotonic clock. */
double ddt_job_now(void);

#endif
