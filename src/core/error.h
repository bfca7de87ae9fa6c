/*
 * error.h — internal helpers for ddt_error: set a status with a printf-style
 * message and return it, so error paths read `return ddt_fail(err, ...)`.
 */
#ifndef DDT_CORE_ERROR_H
#define DDT_CORE_ERROR_H

#include "ddtree.h"

#if defined(__GNUC__)
#define DDT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DDT_PRINTF(a, b)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Record status and message in err (when not NULL); returns status. */
ddt_status ddt_fail(ddt_error *err, ddt_status status, const char *fmt, ...) DDT_PRINTF(3, 4);
/* Reset err to DDT_OK with an empty message. */
void ddt_error_clear(ddt_error *err);
/* Prefix the existing message with more context ("file.safetensors: " + msg). */
void ddt_error_prefix(ddt_error *err, const char *fmt, ...) DDT_PRINTF(2, 3);

#ifdef __cplusplus
}
#endif

#endif
