/*
 * file.c — whole small files read into memory under a size bound (see file.h).
 */
#include "core/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

ddt_status ddt_read_file(const char *path, size_t limit, bool optional, char **data, size_t *len, ddt_error *err) {
    *data = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (optional && errno == ENOENT) return DDT_OK;
        return ddt_fail(err, DDT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    ddt_status st = DDT_OK;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n == cap) {
            if (cap > limit) {
                st = ddt_fail(err, DDT_ERR_RANGE, "%s: larger than the limit %zu bytes", path, limit);
                break;
            }
            cap = cap * 2 > limit ? limit + 1 : cap * 2;
            char *nb = realloc(buf, cap);
            if (!nb) break;
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) st = ddt_fail(err, DDT_ERR_IO, "%s: read error", path);
            else if (n > limit) st = ddt_fail(err, DDT_ERR_RANGE, "%s: larger than the limit %zu bytes", path, limit);
            fclose(f);
            if (st != DDT_OK) {
                free(buf);
                return st;
            }
            *data = buf;
            *len = n;
            return DDT_OK;
        }
    }
    fclose(f);
    free(buf);
    if (st != DDT_OK) return st;
    return ddt_fail(err, DDT_ERR_NOMEM, "%s: out of memory reading the file", path);
}
