/*
 * metrics.h — the server's counters, rendered as Prometheus text for GET
 * /metrics: requests, prompt and generated tokens, decode time (so tokens/s),
 * time to first token, and the speculative-decoding counters vLLM names
 * (drafts, draft tokens proposed, draft tokens accepted; mean acceptance
 * length = 1 + accepted / drafts), each per decoding mode.  Thread-safe.
 */
#ifndef DDT_SERVER_METRICS_H
#define DDT_SERVER_METRICS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

#define DDT_METRICS_MODES 3 /* indexed by ddt_mode */

typedef struct ddt_metrics_mode {
    uint64_t requests, prompt_tokens, generation_tokens;
    uint64_t cached_tokens; /* prompt tokens whose context was reused (engine.h prefix_cache) */
    uint64_t drafts, draft_tokens, accepted_tokens;
    uint64_t lookup_tokens; /* of the draft tokens, those the context lookup grafted (core/lookup.h) */
    double decode_seconds, request_seconds, ttft_seconds;
    uint64_t ttft_count;
    double last_tokens_per_s;
} ddt_metrics_mode;

typedef struct ddt_metrics {
    pthread_mutex_t mu;
    ddt_metrics_mode mode[DDT_METRICS_MODES];
    uint64_t http_status[6]; /* by class: [2] 2xx, [4] 4xx, [5] 5xx */
    uint64_t cancelled, failed;
    int running, waiting;
} ddt_metrics;

void ddt_metrics_init(ddt_metrics *m);
void ddt_metrics_destroy(ddt_metrics *m);

/* A finished generation: its mode, stats, seconds from arrival to first token
 * (< 0: none) and to the end. */
void ddt_metrics_add_generation(ddt_metrics *m, ddt_mode mode, const ddt_gen_stats *s, double ttft,
                                double request_seconds);
void ddt_metrics_add_status(ddt_metrics *m, int http_status);
void ddt_metrics_add_outcome(ddt_metrics *m, bool cancelled, bool failed);
/* Queue gauges: waiting / running change by these amounts. */
void ddt_metrics_queue(ddt_metrics *m, int d_waiting, int d_running);

/* The Prometheus text exposition, malloc'd and NUL-terminated; NULL when out of memory. */
char *ddt_metrics_render(ddt_metrics *m, size_t *len);

#endif
