/*
 * alloc.c — overflow-checked array allocation.
 */
#include "core/alloc.h"

#include <stdlib.h>

void *ddt_calloc_array(size_t n, size_t sz) {
    size_t total;
    if (!ddt_mul_size(n, sz, &total)) return NULL;
    return calloc(total ? n : 1, total ? sz : 1);
}

void *ddt_malloc_array(size_t n, size_t sz) {
    size_t total;
    if (!ddt_mul_size(n, sz, &total)) return NULL;
    return malloc(total ? total : 1);
}
