/*
 * file.h — read a whole file (a tokenizer's model, a JSON config, a chat
 * template) into memory, refusing one larger than a limit, so that a hostile
 * or mistaken path gives a clear error instead of exhausting memory.
 */
#ifndef DDT_CORE_FILE_H
#define DDT_CORE_FILE_H

#include <stdbool.h>
#include <stddef.h>

#include "ddtree.h"

/*
 * *data: malloc'd contents (not NUL-terminated; one spare byte is not
 * guaranteed), *len bytes.  optional: a missing file (ENOENT) gives DDT_OK with
 * *data NULL.  DDT_ERR_IO naming the path when it cannot be opened or read,
 * DDT_ERR_RANGE when it holds more than limit bytes.
 */
ddt_status ddt_read_file(const char *path, size_t limit, bool optional, char **data, size_t *len, ddt_error *err);

#endif
