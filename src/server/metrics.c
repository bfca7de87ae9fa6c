/*
 * metrics.c — see metrics.h.
 */
#include "server/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ddt_metrics_init(ddt_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void ddt_metrics_destroy(ddt_metrics *m) { pthread_mutex_destroy(&m->mu); }

void ddt_metrics_add_generation(ddt_metrics *m, ddt_mode mode, const ddt_gen_stats *s, double ttft,
                                double request_seconds) {
    if ((unsigned)mode >= DDT_METRICS_MODES) return;
    pthread_mutex_lock(&m->mu);
    ddt_metrics_mode *x = &m->mode[mode];
    x->requests++;
    x->prompt_tokens += (uint64_t)s->prompt_tokens;
    x->cached_tokens += (uint64_t)s->cached_tokens;
    x->generation_tokens += (uint64_t)s->tokens;
    if (mode != DDT_MODE_AR) {
        /* a round verifies one root plus its draft nodes and emits the accepted ones plus a bonus */
        x->drafts += (uint64_t)s->rounds;
        x->draft_tokens += (uint64_t)(s->nodes_verified - s->rounds);
        x->accepted_tokens += (uint64_t)(s->accepted - s->rounds);
        x->lookup_tokens += (uint64_t)s->lookup_nodes;
    }
    double decode = s->t_total - s->t_prefill;
    if (decode > 0) x->decode_seconds += decode;
    x->request_seconds += request_seconds;
    if (ttft >= 0) {
        x->ttft_seconds += ttft;
        x->ttft_count++;
    }
    x->last_tokens_per_s = s->tokens_per_s;
    pthread_mutex_unlock(&m->mu);
}

void ddt_metrics_add_status(ddt_metrics *m, int http_status) {
    int c = http_status / 100;
    if (c < 0 || c > 5) return;
    pthread_mutex_lock(&m->mu);
    m->http_status[c]++;
    pthread_mutex_unlock(&m->mu);
}

void ddt_metrics_add_outcome(ddt_metrics *m, bool cancelled, bool failed) {
    pthread_mutex_lock(&m->mu);
    m->cancelled += cancelled;
    m->failed += failed;
    pthread_mutex_unlock(&m->mu);
}

void ddt_metrics_queue(ddt_metrics *m, int d_waiting, int d_running) {
    pthread_mutex_lock(&m->mu);
    m->waiting += d_waiting;
    m->running += d_running;
    pthread_mutex_unlock(&m->mu);
}

typedef struct out_buf {
    char *s;
    size_t len, cap;
    bool oom;
} out_buf;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void put(out_buf *o, const char *fmt, ...) {
    if (o->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(o->s + o->len, o->cap - o->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            o->oom = true;
            return;
        }
        if ((size_t)n < o->cap - o->len) {
            o->len += (size_t)n;
            return;
        }
        size_t cap = o->cap * 2 + (size_t)n;
        char *s = realloc(o->s, cap);
        if (!s) {
            o->oom = true;
            return;
        }
        o->s = s;
        o->cap = cap;
    }
}

/* One metric family: HELP, TYPE and a sample per mode. */
static void family(out_buf *o, const ddt_metrics_mode *x, const char *name, const char *type, const char *help,
                   double (*get)(const ddt_metrics_mode *)) {
    put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    for (int k = 0; k < DDT_METRICS_MODES; k++)
        put(o, "%s{mode=\"%s\"} %.9g\n", name, ddt_mode_name((ddt_mode)k), get(&x[k]));
}

static double g_requests(const ddt_metrics_mode *x) { return (double)x->requests; }
static double g_prompt(const ddt_metrics_mode *x) { return (double)x->prompt_tokens; }
static double g_cached(const ddt_metrics_mode *x) { return (double)x->cached_tokens; }
static double g_gen(const ddt_metrics_mode *x) { return (double)x->generation_tokens; }
static double g_decode_s(const ddt_metrics_mode *x) { return x->decode_seconds; }
static double g_req_s(const ddt_metrics_mode *x) { return x->request_seconds; }
static double g_ttft_sum(const ddt_metrics_mode *x) { return x->ttft_seconds; }
static double g_ttft_count(const ddt_metrics_mode *x) { return (double)x->ttft_count; }
static double g_ttft_mean(const ddt_metrics_mode *x) {
    return x->ttft_count ? x->ttft_seconds / (double)x->ttft_count : 0.0;
}
static double g_tps(const ddt_metrics_mode *x) {
    return x->decode_seconds > 0 ? (double)x->generation_tokens / x->decode_seconds : 0.0;
}
static double g_last_tps(const ddt_metrics_mode *x) { return x->last_tokens_per_s; }
static double g_drafts(const ddt_metrics_mode *x) { return (double)x->drafts; }
static double g_draft_tok(const ddt_metrics_mode *x) { return (double)x->draft_tokens; }
static double g_accepted(const ddt_metrics_mode *x) { return (double)x->accepted_tokens; }
static double g_lookup(const ddt_metrics_mode *x) { return (double)x->lookup_tokens; }
static double g_accept_len(const ddt_metrics_mode *x) {
    return x->drafts ? 1.0 + (double)x->accepted_tokens / (double)x->drafts : 0.0;
}

char *ddt_metrics_render(ddt_metrics *m, size_t *len) {
    out_buf o = {malloc(4096), 0, 4096, false};
    if (!o.s) return NULL;
    pthread_mutex_lock(&m->mu);
    ddt_metrics_mode x[DDT_METRICS_MODES];
    memcpy(x, m->mode, sizeof x);
    uint64_t st[6], cancelled = m->cancelled, failed = m->failed;
    memcpy(st, m->http_status, sizeof st);
    int running = m->running, waiting = m->waiting;
    pthread_mutex_unlock(&m->mu);

    family(&o, x, "ddtree_requests_total", "counter", "Generations finished.", g_requests);
    family(&o, x, "ddtree_prompt_tokens_total", "counter", "Prompt tokens processed.", g_prompt);
    family(&o, x, "ddtree_prompt_cached_tokens_total", "counter",
           "Prompt tokens whose context was reused from the previous request.", g_cached);
    family(&o, x, "ddtree_generation_tokens_total", "counter", "Tokens generated.", g_gen);
    family(&o, x, "ddtree_decode_seconds_total", "counter", "Decode time (after the prompt pass).", g_decode_s);
    family(&o, x, "ddtree_request_seconds_total", "counter", "Time from arrival to the last token.", g_req_s);
    family(&o, x, "ddtree_generation_tokens_per_second", "gauge", "Generated tokens over decode time, all requests.",
           g_tps);
    family(&o, x, "ddtree_last_request_tokens_per_second", "gauge", "Decode tokens/s of the last request.",
           g_last_tps);
    family(&o, x, "ddtree_time_to_first_token_seconds_sum", "counter", "Time from arrival to the first token, summed.",
           g_ttft_sum);
    family(&o, x, "ddtree_time_to_first_token_seconds_count", "counter", "Requests that produced a first token.",
           g_ttft_count);
    family(&o, x, "ddtree_time_to_first_token_seconds_mean", "gauge", "Mean time to first token.", g_ttft_mean);
    family(&o, x, "ddtree_spec_decode_num_drafts_total", "counter", "Speculative rounds (drafts verified).",
           g_drafts);
    family(&o, x, "ddtree_spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed (tree nodes).",
           g_draft_tok);
    family(&o, x, "ddtree_spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", g_accepted);
    family(&o, x, "ddtree_spec_decode_num_lookup_tokens_total", "counter",
           "Of the draft tokens, those the context lookup grafted onto the trees.", g_lookup);
    family(&o, x, "ddtree_spec_decode_mean_acceptance_length", "gauge",
           "1 + accepted / drafts: tokens emitted per round.", g_accept_len);
    put(&o, "# HELP ddtree_http_responses_total HTTP responses by status class.\n"
            "# TYPE ddtree_http_responses_total counter\n");
    for (int c = 2; c <= 5; c++) put(&o, "ddtree_http_responses_total{code=\"%dxx\"} %llu\n", c, (unsigned long long)st[c]);
    put(&o, "# HELP ddtree_requests_cancelled_total Generations stopped because the client went away.\n"
            "# TYPE ddtree_requests_cancelled_total counter\nddtree_requests_cancelled_total %llu\n",
        (unsigned long long)cancelled);
    put(&o, "# HELP ddtree_requests_failed_total Generations the engine failed.\n"
            "# TYPE ddtree_requests_failed_total counter\nddtree_requests_failed_total %llu\n",
        (unsigned long long)failed);
    put(&o, "# HELP ddtree_requests_running Generations on the engine now.\n"
            "# TYPE ddtree_requests_running gauge\nddtree_requests_running %d\n", running);
    put(&o, "# HELP ddtree_requests_waiting Requests queued for the engine.\n"
            "# TYPE ddtree_requests_waiting gauge\nddtree_requests_waiting %d\n", waiting);
    if (o.oom) {
        free(o.s);
        return NULL;
    }
    if (len) *len = o.len;
    return o.s;
}
