/*
 * alloc.h — checked allocation: size products are overflow-checked before any
 * allocation, and allocation failure is returned (never aborts), because the
 * library's callers decide how to recover.
 */
#ifndef DDT_CORE_ALLOC_H
#define DDT_CORE_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* *out = a * b; false on overflow. */
static inline bool ddt_mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return false;
    *out = a * b;
    return true;
}
static inline bool ddt_add_size(size_t a, size_t b, size_t *out) {
    if (b > SIZE_MAX - a) return false;
    *out = a + b;
    return true;
}
/* Zeroed array of n elements of size sz, NULL on overflow or out of memory. */
void *ddt_calloc_array(size_t n, size_t sz);
/* Uninitialised array of n elements of size sz, NULL on overflow or out of memory. */
void *ddt_malloc_array(size_t n, size_t sz);

#endif
