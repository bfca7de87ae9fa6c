/*
 * fuzz_request.c — libFuzzer target for the server's request parser: any body
 * (the first byte picks chat or completion) must be refused with a message, or
 * give a request whose fields are within their documented bounds.  An accepted
 * request's stop strings and text then go through the text stream (pushed in
 * pieces the input decides) and the response JSON, whose deltas must be valid
 * UTF-8 and join to the whole text.  Log-probabilities made of the input's bytes
 * (any float: NaN, infinities, denormals; any ids) must render in both shapes.
 * A chat request's conversation, tools and template variables go through the
 * built-in chat template, and a tool call made of the input's bytes through the
 * chat response shapes.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"
#include "server/request.h"
#include "server/textstream.h"
#include "text/chat.h"
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
    ddt_api_ids ids = {r->kind, "id-1", 1, "m", 0};
    ddt_token_logprobs lp[FZ_LP];
    int32_t lp_ids[FZ_LP];
    int64_t offset = 0;
    ddt_api_logprobs lpa = {lp, lp_ids, 0, fuzz_logprobs(text, n, lp, lp_ids), NULL, &offset};
    /* a tool call and reasoning made of the raw text: any bytes, invalid UTF-8 too */
    char *raw = malloc(n + 1);
    if (!raw) __builtin_trap();
    if (n) memcpy(raw, text, n);
    raw[n] = '\0';
    ddt_chat_tool_call call = {raw, raw, raw};
    ddt_api_extra ex = {whole ? whole : "", wl, &call, 0, 1};
    ddt_api_result res = {whole ? whole : "", wl, "stop", 1, 2, 1, lp_ids, lpa.n, lp_ids, lpa.n, NULL, DDT_MODE_AR,
                          r->logprobs >= 0 ? &lpa : NULL, ex};
    size_t len;
    const ddt_api_result two[2] = {res, res};
    char *body = ddt_api_response_body(&ids, two, r->n > 1 ? 2 : 1, &len);
    if (!body) __builtin_trap();
    free(body);
    char *ev = ddt_api_chunk_event(&ids, true, whole ? whole : "", wl, &ex, NULL, r->logprobs >= 0 ? &lpa : NULL,
                                   &len);
    if (!ev) __builtin_trap();
    free(ev);
    free(raw);
    ev = ddt_api_usage_event(&ids, 3, 4, 2, &len);
    if (!ev) __builtin_trap();
    free(ev);
    free(whole);
    free(joined);
    ddt_textstream_free(&a);
    ddt_textstream_free(&b);
}

/* The built-in template, parsed once for the whole run. */
static const ddt_chat_template *chat_template(void) {
    static ddt_chat_template *t;
    if (!t && ddt_chat_template_create(NULL, 0, NULL, NULL, 0, &t, NULL) != DDT_OK) __builtin_trap();
    return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    ddt_api_kind kind = data[0] & 1 ? DDT_API_COMPLETION : DDT_API_CHAT;
    ddt_api_request r;
    ddt_error err;
    err.msg[0] = '\0';
    if (ddt_api_request_parse(kind, (const char *)data + 1, size - 1, &r, &err) != DDT_OK) {
        if (err.msg[0] == '\0' || r.messages || r.tools || r.template_kwargs || r.prompt_ids || r.owned_)
            __builtin_trap();
        return 0;
    }
    if (kind == DDT_API_CHAT && (r.n_msgs < 1 || r.n_msgs > DDT_API_MAX_MESSAGES ||
                                 json_array_size(r.messages) != r.n_msgs))
        __builtin_trap();
    if (kind == DDT_API_CHAT) {
        /* the conversation through the built-in chat template: any request the parser takes renders
         * or is refused with a message, and every data byte of the output is marked as data */
        ddt_chat_input in = {r.messages, r.tools, r.template_kwargs, r.add_generation_prompt};
        ddt_jinja_text out;
        ddt_error terr;
        terr.msg[0] = '\0';
        ddt_status ts = ddt_chat_render(chat_template(), &in, &out, &terr);
        if (ts != DDT_OK && terr.msg[0] == '\0') __builtin_trap();
        if (ts == DDT_OK) {
            if (!out.bytes || out.bytes[out.len] != '\0') __builtin_trap();
            ddt_jinja_text_free(&out);
        }
    }
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
    /* n > 1 streams too (serve sends the choices one after another, each chunk with its index) */
    if (r.n < 1 || r.n > DDT_API_MAX_N) __builtin_trap();
    /* the text the request carries stands in for generated text */
    const uint8_t *text = (const uint8_t *)(r.prompt ? r.prompt : "");
    size_t n = r.prompt ? r.prompt_len : 0;
    if (kind == DDT_API_CHAT) {
        json_t *c = json_object_get(json_array_get(r.messages, r.n_msgs - 1), "content");
        text = (const uint8_t *)(json_is_string(c) ? json_string_value(c) : "");
        n = json_is_string(c) ? json_string_length(c) : 0;
    }
    if (n && !ddt_utf8_valid((const char *)text, n)) __builtin_trap(); /* JSON strings are UTF-8 */
    check_stream(&r, text, n, data[0]);
    ddt_api_request_free(&r);
    return 0;
}
