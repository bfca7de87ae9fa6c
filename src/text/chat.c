/*
 * chat.c — Kimi K2's chat template (see chat.h) rendered straight to ids: the
 * role markers come from the tokenizer's special table, role names and message
 * text are encoded as ordinary text, segment by segment, which gives the same
 * ids as rendering the whole string and encoding it with special tokens
 * recognised (tiktoken encodes the text between special tokens independently).
 */
#include "text/chat.h"

#include <string.h>

#include "core/error.h"

typedef struct chat_out {
    int32_t *ids;   /* [max_ids] */
    size_t max_ids;
    size_t count;   /* ids produced, may exceed max_ids */
} chat_out;

static void out_id(chat_out *o, int32_t id) {
    if (o->count < o->max_ids) o->ids[o->count] = id;
    o->count++;
}

static ddt_status out_text(ddt_tokenizer *tok, chat_out *o, const char *text, size_t len, ddt_error *err) {
    size_t room = o->count < o->max_ids ? o->max_ids - o->count : 0;
    size_t n = 0;
    ddt_status st = ddt_tokenizer_encode(tok, text, len, 0, room ? o->ids + o->count : NULL, room, &n, err);
    if (st != DDT_OK && st != DDT_ERR_RANGE) return st;
    o->count += n;
    return DDT_OK;
}

static ddt_status special_id(ddt_tokenizer *tok, const char *name, int32_t *id, ddt_error *err) {
    *id = ddt_tokenizer_token_id(tok, name);
    if (*id < 0 || !ddt_tokenizer_is_special(tok, *id))
        return ddt_fail(err, DDT_ERR_INVALID, "chat template: the tokenizer has no special token %s", name);
    return DDT_OK;
}

ddt_status ddt_chat_encode(ddt_tokenizer *tok, const ddt_chat_message *msgs, size_t n_msgs,
                           bool add_generation_prompt, int32_t *ids, size_t max_ids, size_t *n_ids,
                           ddt_error *err) {
    if (!tok || (!msgs && n_msgs) || (!ids && max_ids) || !n_ids)
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_chat_encode: NULL argument");
    *n_ids = 0;
    static const char *const headers[3] = {"<|im_system|>", "<|im_user|>", "<|im_assistant|>"};
    static const char *const names[3] = {"system", "user", "assistant"};
    int32_t head[3], middle, end;
    ddt_status st = DDT_OK;
    for (int r = 0; r < 3 && st == DDT_OK; r++) st = special_id(tok, headers[r], &head[r], err);
    if (st == DDT_OK) st = special_id(tok, "<|im_middle|>", &middle, err);
    if (st == DDT_OK) st = special_id(tok, "<|im_end|>", &end, err);
    if (st != DDT_OK) return st;
    for (size_t i = 0; i < n_msgs; i++) {
        if ((unsigned)msgs[i].role > DDT_CHAT_ASSISTANT)
            return ddt_fail(err, DDT_ERR_INVALID, "chat template: message %zu: unknown role %d", i, (int)msgs[i].role);
        if (!msgs[i].content && msgs[i].len)
            return ddt_fail(err, DDT_ERR_INVALID, "chat template: message %zu: NULL content", i);
    }

    chat_out o = {ids, max_ids, 0};
    /* total = messages (+ the default system message) (+ the generation prompt) */
    size_t total = n_msgs + 1;
    bool add_default = n_msgs == 0 || msgs[0].role != DDT_CHAT_SYSTEM;
    for (size_t k = 0; k < total && st == DDT_OK; k++) {
        ddt_chat_role role;
        const char *content;
        size_t len;
        if (k == 0) {
            if (!add_default) continue;
            role = DDT_CHAT_SYSTEM;
            content = DDT_CHAT_KIMI_DEFAULT_SYSTEM;
            len = strlen(content);
        } else {
            role = msgs[k - 1].role;
            content = msgs[k - 1].content;
            len = msgs[k - 1].len;
        }
        out_id(&o, head[role]);
        st = out_text(tok, &o, names[role], strlen(names[role]), err);
        if (st != DDT_OK) break;
        out_id(&o, middle);
        st = out_text(tok, &o, content, len, err);
        out_id(&o, end);
    }
    if (st == DDT_OK && add_generation_prompt) {
        out_id(&o, head[DDT_CHAT_ASSISTANT]);
        st = out_text(tok, &o, names[DDT_CHAT_ASSISTANT], strlen(names[DDT_CHAT_ASSISTANT]), err);
        out_id(&o, middle);
    }
    if (st != DDT_OK) return st;
    *n_ids = o.count;
    if (o.count > max_ids)
        return ddt_fail(err, DDT_ERR_RANGE, "chat template: the conversation needs %zu ids, the buffer holds %zu",
                        o.count, max_ids);
    ddt_error_clear(err);
    return DDT_OK;
}

ddt_status ddt_chat_encode_prompt(ddt_tokenizer *tok, const char *system, const char *user, int32_t *ids,
                                  size_t max_ids, size_t *n_ids, ddt_error *err) {
    if (!user) return ddt_fail(err, DDT_ERR_INVALID, "ddt_chat_encode_prompt: NULL user message");
    ddt_chat_message msgs[2];
    size_t n = 0;
    if (system) msgs[n++] = (ddt_chat_message){DDT_CHAT_SYSTEM, system, strlen(system)};
    msgs[n++] = (ddt_chat_message){DDT_CHAT_USER, user, strlen(user)};
    return ddt_chat_encode(tok, msgs, n, true, ids, max_ids, n_ids, err);
}
