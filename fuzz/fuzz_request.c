/*
 * fuzz_request.c — libFuzzer target for the server's request parser: any body
 * (the first byte picks chat or completion) must be refused with a message, or
 * give a request whose fields are within their documented bounds.  An accepted
 * request's stop strings and text then go through the text stream (pushed in
 * pieces the input decides) and the response JSON, whose deltas must be valid
 * UTF-8 and join to the whole text.  Log-probabilities made of the input's bytes
 * (any float: NaN, infinities, denormals; any ids) must render in both shapes.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"
#include "server/request.h"
#include "server/textstream.h"
#include "text/utf8.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Log-probability entries made of the input's bytes. */
#define FZ_LP 6
static int32_t fuzz_logprobs(const uint8_t *d, size_t n, ddt_token_logprobs *lp, int32_t *ids) {
    size_t at = 0;
    int32_t k = 0;
    for (; k < FZ_LP && at + 9 <= n; k++) {
        memcpy(&lp[k].logprob, d + at, 4);
        memcpy(&ids[k], d + at + 4, 4);
        lp[k].n_top = d[at + 8] % (DDT_MAX_TOP_LOGPROBS + 1);
        at += 9;
        for (int32_t j = 0; j < lp[k].n_top; j++) {
            lp[k].top_id[j] = at < n ? (int32_t)d[at] - 3 : j; /* negative ids too */
            lp[k].top_logprob[j] = at + 1 < n ? (float)(int8_t)d[at + 1] / (d[at] % 5 ? 7.0f : 0.0f) : -INFINITY;
            at += 2;
        }
    }
    return k;
}

/* Stream text through a textstream with the request's stop strings. */
static void check_stream(const ddt_api_request *r, const uint8_t *text, size_t n, uint8_t seed) {
    ddt_textstream a, b;
    ddt_error err;
    if (ddt_textstream_init(&a, r->stop, r->stop_len, r->n_stop, &err) != DDT_OK) __builtin_trap();
    if (ddt_textstream_init(&b, r->stop, r->stop_len, r->n_stop, &err) != DDT_OK) __builtin_trap();
    char *joined = malloc(n * 3 + 1);
    if (!joined) __builtin_trap();
    size_t jl = 0, step = (size_t)(seed % 7) + 1;
    for (size_t i = 0; i <= n; i += step) {
        size_t k = n - i < step ? n - i : step;
        if (ddt_textstream_push(&a, text + i, k, &err) != DDT_OK) __builtin_trap();
        char *d;
        size_t dl;
        if (ddt_textstream_take(&a, i + k >= n, &d, &dl, &err) != DDT_OK) __builtin_trap();
        if (d) {
            if (!ddt_utf8_valid(d, dl)) __builtin_trap();
            memcpy(joined + jl, d, dl);
            jl += dl;
            free(d);
        }
        if (i + k >= n) break;
    }
    if (ddt_textstream_push(&b, text, n, &err) != DDT_OK) __builtin_trap();
    char *whole;
    size_t wl;
    if (ddt_textstream_take(&b, true, &whole, &wl, &err) != DDT_OK) __builtin_trap();
    if (wl != jl || (wl && memcmp(whole, joined, wl))) __builtin_trap();
    ddt_api_ids ids = {r->kind, "id-1", 1, "m"};
    ddt_token_logprobs lp[FZ_LP];
    int32_t lp_ids[FZ_LP];
    int64_t offset = 0;
    ddt_api_logprobs lpa = {lp, lp_ids, 0, fuzz_logprobs(text, n, lp, lp_ids), NULL, &offset};
    ddt_api_result res = {whole ? whole : "", wl, "stop", 1, 2, 1, NULL, 0, NULL, DDT_MODE_AR,
                          r->logprobs >= 0 ? &lpa : NULL};
    size_t len;
    const ddt_api_result two[2] = {res, res};
    char *body = ddt_api_response_body(&ids, two, r->n > 1 ? 2 : 1, &len);
    if (!body) __builtin_trap();
    free(body);
    char *ev = ddt_api_chunk_event(&ids, true, whole ? whole : "", wl, NULL, r->logprobs >= 0 ? &lpa : NULL, &len);
    if (!ev) __builtin_trap();
    free(ev);
    ev = ddt_api_usage_event(&ids, 3, 4, 2, &len);
    if (!ev) __builtin_trap();
    free(ev);
    free(whole);
    free(joined);
    ddt_textstream_free(&a);
    ddt_textstream_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    ddt_api_kind kind = data[0] & 1 ? DDT_API_COMPLETION : DDT_API_CHAT;
    ddt_api_request r;
    ddt_error err;
    err.msg[0] = '\0';
    if (ddt_api_request_parse(kind, (const char *)data + 1, size - 1, &r, &err) != DDT_OK) {
        if (err.msg[0] == '\0' || r.msgs || r.prompt_ids || r.owned_) __builtin_trap();
        return 0;
    }
    if (kind == DDT_API_CHAT && (r.n_msgs < 1 || r.n_msgs > DDT_API_MAX_MESSAGES)) __builtin_trap();
    if (kind == DDT_API_COMPLETION && !r.prompt_ids && (!r.prompt || r.prompt_len == 0)) __builtin_trap();
    if (r.have_max_tokens && (r.max_tokens < (r.echo ? 0 : 1) || r.max_tokens > DDT_API_MAX_TOKENS)) __builtin_trap();
    if (r.echo && (kind == DDT_API_CHAT || r.stream)) __builtin_trap();
    if (r.have_temperature && !(r.temperature >= 0.0f && r.temperature <= 2.0f)) __builtin_trap();
    if (r.have_top_p && !(r.top_p > 0.0f && r.top_p <= 1.0f)) __builtin_trap();
    if (r.n_stop < 0 || r.n_stop > DDT_API_MAX_STOP) __builtin_trap();
    for (int i = 0; i < r.n_stop; i++)
        if (r.stop_len[i] == 0 || r.stop_len[i] > DDT_API_MAX_STOP_LEN) __builtin_trap();
    if (r.have_budget && !r.budget_auto && (r.budget < 1 || r.budget > DDT_MAX_BUDGET)) __builtin_trap();
    if (r.logprobs < -1 || r.logprobs > DDT_API_MAX_TOP_LOGPROBS) __builtin_trap();
    if (r.n < 1 || r.n > DDT_API_MAX_N || (r.n > 1 && r.stream)) __builtin_trap();
    /* the text the request carries stands in for generated text */
    const uint8_t *text = kind == DDT_API_CHAT ? (const uint8_t *)r.msgs[r.n_msgs - 1].content
                                               : (const uint8_t *)(r.prompt ? r.prompt : "");
    size_t n = kind == DDT_API_CHAT ? r.msgs[r.n_msgs - 1].len : r.prompt ? r.prompt_len : 0;
    if (n && !ddt_utf8_valid((const char *)text, n)) __builtin_trap(); /* JSON strings are UTF-8 */
    check_stream(&r, text, n, data[0]);
    ddt_api_request_free(&r);
    return 0;
}
