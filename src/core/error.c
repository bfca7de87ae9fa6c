/*
 * error.c — status names and message formatting for ddt_error.
 */
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *ddt_status_name(ddt_status status) {
    switch (status) {
    case DDT_OK: return "ok";
    case DDT_ERR_INVALID: return "invalid";
    case DDT_ERR_RANGE: return "range";
    case DDT_ERR_NOMEM: return "nomem";
    case DDT_ERR_IO: return "io";
    case DDT_ERR_FORMAT: return "format";
    case DDT_ERR_UNSUPPORTED: return "unsupported";
    case DDT_ERR_INTERNAL: return "internal";
    }
    return "unknown";
}

ddt_status ddt_fail(ddt_error *err, ddt_status status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->status = status;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return status;
}

void ddt_error_clear(ddt_error *err) {
    if (err) {
        err->status = DDT_OK;
        err->msg[0] = '\0';
    }
}

void ddt_error_prefix(ddt_error *err, const char *fmt, ...) {
    if (!err) return;
    char head[DDT_ERROR_MSG_MAX];
    char old[DDT_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    old[sizeof old - 1] = '\0';
    /* truncation is fine: the message is for humans and stays NUL-terminated */
    size_t hl = strlen(head);
    memcpy(err->msg, head, hl + 1);
    size_t room = sizeof err->msg - 1 - hl;
    size_t ol = strlen(old);
    if (ol > room) ol = room;
    memcpy(err->msg + hl, old, ol);
    err->msg[hl + ol] = '\0';
}
