/*
 * checkpoint.c — a checkpoint as one table of tensors over one or many mmapped
 * safetensors files (a single file, or the shards named by
 * model.safetensors.index.json), plus checked lookups: plain tensors and the
 * weight views of dense, FP8-block and INT4 pack-quantized linears.
 *
 * Files are mapped read-only and never copied, so a 600 GB checkpoint costs only
 * page-table entries until a backend touches the bytes.  The table is sorted by
 * name once, so lookups are a binary search and duplicates (the same tensor in two
 * shards, which would make the result depend on shard order) are found in one pass.
 */
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"



struct ddt_checkpoint {
    char *path;              /* what the caller opened, for messages */
    int32_t n_files;
    char **files;            /* [n_files] path of each shard */
    void **maps;             /* [n_files] read-only mapping, NULL for an empty file */
    size_t *sizes;           /* [n_files] mapping length in bytes */
    int32_t n_tensors;
    ddt_st_tensor *tensors;  /* [n_tensors] sorted by name; names owned, data borrowed from maps */
};

static char *str_dup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name), n;
    if (!ddt_add_size(a, b, &n) || !ddt_add_size(n, 2, &n)) return NULL;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

void ddt_checkpoint_close(ddt_checkpoint *ck) {
    if (!ck) return;
    ddt_st_tensors_free(ck->tensors, ck->n_tensors);
    for (int32_t i = 0; i < ck->n_files; i++) {
        if (ck->maps && ck->maps[i]) munmap(ck->maps[i], ck->sizes[i]);
        if (ck->files) free(ck->files[i]);
    }
    free(ck->files);
    free(ck->maps);
    free(ck->sizes);
    free(ck->path);
    free(ck);
}

static ddt_checkpoint *checkpoint_new(const char *path, int32_t n_files) {
    ddt_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck) return NULL;
    ck->path = str_dup(path);
    ck->files = ddt_calloc_array((size_t)n_files, sizeof *ck->files);
    ck->maps = ddt_calloc_array((size_t)n_files, sizeof *ck->maps);
    ck->sizes = ddt_calloc_array((size_t)n_files, sizeof *ck->sizes);
    ck->n_files = n_files;
    if (!ck->path || !ck->files || !ck->maps || !ck->sizes) {
        ddt_checkpoint_close(ck);
        return NULL;
    }
    return ck;
}

/* Map file i of ck and parse it; on success *tensors holds its sorted table. */
static ddt_status map_and_parse(ddt_checkpoint *ck, int32_t i, const char *named_by,
                                ddt_st_tensor **tensors, int32_t *count, ddt_error *err) {
    const char *file = ck->files[i];
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (named_by)
            return ddt_fail(err, DDT_ERR_IO, "file %s (named by %s): cannot open: %s", file,
                            named_by, strerror(errno));
        return ddt_fail(err, DDT_ERR_IO, "file %s: cannot open: %s", file, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return ddt_fail(err, DDT_ERR_IO, "file %s: not a regular file", file);
    }
    if ((uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return ddt_fail(err, DDT_ERR_RANGE, "file %s: too large to map", file);
    }
    size_t size = (size_t)sb.st_size;
    static const uint8_t empty[1];
    const uint8_t *buf = empty;
    if (size > 0) {
        void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return ddt_fail(err, DDT_ERR_IO, "file %s: cannot map %zu bytes: %s", file, size,
                            strerror(e));
        }
        ck->maps[i] = m;
        ck->sizes[i] = size;
        buf = m;
    }
    close(fd); /* the mapping stays valid without the descriptor */
    ddt_status st = ddt_st_parse(buf, size, file, tensors, count, err);
    if (st != DDT_OK) return st;
    for (int32_t k = 0; k < *count; k++) (*tensors)[k].file_index = i;
    return DDT_OK;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const ddt_st_tensor *)a)->name, ((const ddt_st_tensor *)b)->name);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static const ddt_st_tensor *find_in(const ddt_st_tensor *ts, int32_t n, const char *name) {
    ddt_st_tensor key;
    memset(&key, 0, sizeof key);
    key.name = (char *)name;
    return bsearch(&key, ts, (size_t)n, sizeof *ts, cmp_name);
}

/* Concatenate the per-file tables into ck (taking ownership of the names), sort,
 * and reject a name held by two files. */
static ddt_status merge_tables(ddt_checkpoint *ck, ddt_st_tensor **tabs, int32_t *counts,
                               ddt_error *err) {
    int64_t total = 0;
    for (int32_t i = 0; i < ck->n_files; i++) total += counts[i];
    if (total > INT32_MAX)
        return ddt_fail(err, DDT_ERR_RANGE, "checkpoint %s: %lld tensors, too many", ck->path,
                        (long long)total);
    ck->tensors = ddt_calloc_array((size_t)total, sizeof *ck->tensors);
    if (!ck->tensors) return ddt_fail(err, DDT_ERR_NOMEM, "checkpoint %s: out of memory", ck->path);
    int32_t n = 0;
    for (int32_t i = 0; i < ck->n_files; i++) {
        if (counts[i]) memcpy(ck->tensors + n, tabs[i], (size_t)counts[i] * sizeof *ck->tensors);
        n += counts[i];
        free(tabs[i]); /* names now belong to ck->tensors */
        tabs[i] = NULL;
        counts[i] = 0;
    }
    ck->n_tensors = n;
    qsort(ck->tensors, (size_t)n, sizeof *ck->tensors, cmp_name);
    for (int32_t i = 1; i < n; i++) {
        if (strcmp(ck->tensors[i - 1].name, ck->tensors[i].name) == 0)
            return ddt_fail(err, DDT_ERR_FORMAT, "checkpoint %s: tensor %s is in both file %s and file %s",
                            ck->path, ck->tensors[i].name, ck->files[ck->tensors[i - 1].file_index],
                            ck->files[ck->tensors[i].file_index]);
    }
    return DDT_OK;
}

static ddt_status open_single(const char *file, ddt_checkpoint **out, ddt_error *err) {
    ddt_checkpoint *ck = checkpoint_new(file, 1);
    if (!ck || !(ck->files[0] = str_dup(file))) {
        ddt_checkpoint_close(ck);
        return ddt_fail(err, DDT_ERR_NOMEM, "file %s: out of memory", file);
    }
    ddt_st_tensor *tab = NULL;
    int32_t count = 0;
    ddt_status st = map_and_parse(ck, 0, NULL, &tab, &count, err);
    if (st == DDT_OK) st = merge_tables(ck, &tab, &count, err);
    ddt_st_tensors_free(tab, count);
    if (st != DDT_OK) {
        ddt_checkpoint_close(ck);
        return st;
    }
    *out = ck;
    return DDT_OK;
}

/* A shard name from the index must be a plain file in the index's folder: a path
 * would let a hostile index point the reader anywhere on the machine. */
static bool shard_name_ok(const char *s) {
    return s[0] != '\0' && strchr(s, '/') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static ddt_status open_index(const char *index_path, const char *dir, ddt_checkpoint **out,
                             ddt_error *err) {
    json_error_t jerr;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return ddt_fail(err, DDT_ERR_FORMAT, "file %s: not valid JSON: %s (line %d)", index_path,
                        jerr.text, jerr.line);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        json_decref(root);
        return ddt_fail(err, DDT_ERR_FORMAT, "file %s: \"weight_map\" missing or not an object",
                        index_path);
    }

    ddt_status st = DDT_OK;
    size_t n_entries = json_object_size(wm);
    char **names = ddt_calloc_array(n_entries, sizeof *names); /* borrowed from root */
    size_t n_names = 0;
    const char *key;
    json_t *val;
    if (!names) st = ddt_fail(err, DDT_ERR_NOMEM, "file %s: out of memory", index_path);
    if (st == DDT_OK) {
        json_object_foreach(wm, key, val) {
            if (!json_is_string(val) || !shard_name_ok(json_string_value(val))) {
                st = ddt_fail(err, DDT_ERR_FORMAT,
                              "file %s: tensor %s: weight_map value is not a plain file name",
                              index_path, key);
                break;
            }
            names[n_names++] = (char *)json_string_value(val);
        }
    }
    size_t n_unique = 0;
    if (st == DDT_OK) {
        qsort(names, n_names, sizeof *names, cmp_str);
        for (size_t i = 0; i < n_names; i++)
            if (n_unique == 0 || strcmp(names[n_unique - 1], names[i]) != 0) names[n_unique++] = names[i];
        if (n_unique == 0)
            st = ddt_fail(err, DDT_ERR_FORMAT, "file %s: weight_map names no tensors", index_path);
        else if (n_unique > (size_t)INT32_MAX)
            st = ddt_fail(err, DDT_ERR_RANGE, "file %s: too many shards", index_path);
    }

    ddt_checkpoint *ck = NULL;
    ddt_st_tensor **tabs = NULL;
    int32_t *counts = NULL;
    if (st == DDT_OK) {
        ck = checkpoint_new(index_path, (int32_t)n_unique);
        tabs = ddt_calloc_array(n_unique, sizeof *tabs);
        counts = ddt_calloc_array(n_unique, sizeof *counts);
        if (!ck || !tabs || !counts)
            st = ddt_fail(err, DDT_ERR_NOMEM, "file %s: out of memory", index_path);
    }
    for (size_t i = 0; st == DDT_OK && i < n_unique; i++) {
        if (!(ck->files[i] = path_join(dir, names[i])))
            st = ddt_fail(err, DDT_ERR_NOMEM, "file %s: out of memory", index_path);
        else
            st = map_and_parse(ck, (int32_t)i, index_path, &tabs[i], &counts[i], err);
    }
    /* Every tensor the index promises must be in the shard it names. */
    if (st == DDT_OK) {
        json_object_foreach(wm, key, val) {
            const char **hit = bsearch(&(const char *){json_string_value(val)}, names, n_unique,
                                       sizeof *names, cmp_str);
            int32_t fi = (int32_t)((char **)hit - names);
            if (!find_in(tabs[fi], counts[fi], key)) {
                st = ddt_fail(err, DDT_ERR_FORMAT,
                              "file %s: tensor %s is mapped to file %s, which does not hold it",
                              index_path, key, ck->files[fi]);
                break;
            }
        }
    }
    if (st == DDT_OK) st = merge_tables(ck, tabs, counts, err);

    for (size_t i = 0; tabs && i < n_unique; i++) ddt_st_tensors_free(tabs[i], counts[i]);
    free(tabs);
    free(counts);
    free(names);
    json_decref(root);
    if (st != DDT_OK) {
        ddt_checkpoint_close(ck);
        return st;
    }
    *out = ck;
    return DDT_OK;
}

ddt_status ddt_checkpoint_open(const char *path, ddt_checkpoint **out, ddt_error *err) {
    if (!out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_checkpoint_open: out is NULL");
    *out = NULL;
    if (!path) return ddt_fail(err, DDT_ERR_INVALID, "ddt_checkpoint_open: path is NULL");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return ddt_fail(err, DDT_ERR_IO, "checkpoint %s: %s", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) {
        if (ends_with(path, ".json")) {
            /* An index file: its shards live beside it. */
            char *dir = str_dup(path);
            if (!dir) return ddt_fail(err, DDT_ERR_NOMEM, "checkpoint %s: out of memory", path);
            char *slash = strrchr(dir, '/');
            if (slash == dir) slash[1] = '\0';
            else if (slash) *slash = '\0';
            else strcpy(dir, ".");
            ddt_status st = open_index(path, dir, out, err);
            free(dir);
            return st;
        }
        return open_single(path, out, err);
    }
    char *index = path_join(path, "model.safetensors.index.json");
    char *single = path_join(path, "model.safetensors");
    ddt_status st;
    if (!index || !single) st = ddt_fail(err, DDT_ERR_NOMEM, "checkpoint %s: out of memory", path);
    else if (stat(index, &sb) == 0) st = open_index(index, path, out, err);
    else if (stat(single, &sb) == 0) st = open_single(single, out, err);
    else
        st = ddt_fail(err, DDT_ERR_IO,
                      "checkpoint %s: folder holds neither model.safetensors.index.json nor "
                      "model.safetensors",
                      path);
    free(index);
    free(single);
    return st;
}

int32_t ddt_checkpoint_count(const ddt_checkpoint *ck) { return ck ? ck->n_tensors : 0; }

const ddt_st_tensor *ddt_checkpoint_at(const ddt_checkpoint *ck, int32_t i) {
    if (!ck || i < 0 || i >= ck->n_tensors) return NULL;
    return &ck->tensors[i];
}

const ddt_st_tensor *ddt_checkpoint_find(const ddt_checkpoint *ck, const char *name) {
    if (!ck || !name) return NULL;
    return find_in(ck->tensors, ck->n_tensors, name);
}

int32_t ddt_checkpoint_prefix_range(const ddt_checkpoint *ck, const char *prefix, int32_t *first) {
    if (first) *first = 0;
    if (!ck || !prefix || !first) return 0;
    /* every name that starts with prefix sorts at or after it, and before any name
     * that does not start with it but sorts after it: find the lower bound */
    int32_t lo = 0, hi = ck->n_tensors;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (strcmp(ck->tensors[mid].name, prefix) < 0) lo = mid + 1;
        else hi = mid;
    }
    size_t len = strlen(prefix);
    int32_t n = 0;
    while (lo + n < ck->n_tensors && strncmp(ck->tensors[lo + n].name, prefix, len) == 0) n++;
    *first = lo;
    return n;
}

const char *ddt_checkpoint_file_name(const ddt_checkpoint *ck, int32_t file_index) {
    if (!ck || file_index < 0 || file_index >= ck->n_files) return "?";
    return ck->files[file_index];
}

/* ---- checked lookups ----------------------------------------------------- */

static void format_shape(const int64_t *shape, int32_t ndim, char *buf, size_t cap) {
    size_t used = 0;
    int n = snprintf(buf, cap, "[");
    used = n > 0 ? (size_t)n : 0;
    for (int32_t d = 0; d < ndim && used < cap; d++) {
        if (shape[d] < 0) n = snprintf(buf + used, cap - used, "%s*", d ? ", " : "");
        else n = snprintf(buf + used, cap - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
        if (n < 0) return;
        used += (size_t)n;
    }
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

/* Check t against dtype (DDT_DTYPE_COUNT = any) and shape (ndim < 0 = any; -1
 * entries = any); the message names tensor, file, expected and found. */
static ddt_status check_tensor(const ddt_checkpoint *ck, const ddt_st_tensor *t, ddt_dtype dtype,
                               int32_t ndim, const int64_t *shape, ddt_error *err) {
    bool ok = dtype == DDT_DTYPE_COUNT || t->dtype == dtype;
    if (ndim >= 0) {
        if (t->ndim != ndim) ok = false;
        for (int32_t d = 0; ok && shape && d < ndim; d++)
            if (shape[d] >= 0 && shape[d] != t->shape[d]) ok = false;
    }
    if (ok) return DDT_OK;
    char want[160], got[160];
    if (ndim >= 0 && shape) format_shape(shape, ndim, want, sizeof want);
    else if (ndim >= 0) snprintf(want, sizeof want, "(%d dims)", (int)ndim);
    else snprintf(want, sizeof want, "(any shape)");
    format_shape(t->shape, t->ndim, got, sizeof got);
    return ddt_fail(err, DDT_ERR_FORMAT, "file %s: tensor %s: expected %s %s, found %s %s",
                    ddt_checkpoint_file_name(ck, t->file_index), t->name,
                    dtype == DDT_DTYPE_COUNT ? "(any dtype)" : ddt_dtype_name(dtype), want,
                    ddt_dtype_name(t->dtype), got);
}

ddt_status ddt_checkpoint_tensor(const ddt_checkpoint *ck, const char *name, ddt_dtype dtype,
                                 int32_t ndim, const int64_t *shape, const ddt_st_tensor **out,
                                 ddt_error *err) {
    if (!ck || !name || !out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_checkpoint_tensor: NULL argument");
    *out = NULL;
    if (ndim > DDT_ST_MAX_DIMS)
        return ddt_fail(err, DDT_ERR_INVALID, "tensor %s: ndim %d over %d", name, (int)ndim,
                        DDT_ST_MAX_DIMS);
    const ddt_st_tensor *t = ddt_checkpoint_find(ck, name);
    if (!t) return ddt_fail(err, DDT_ERR_FORMAT, "checkpoint %s: tensor %s is missing", ck->path, name);
    ddt_status st = check_tensor(ck, t, dtype, ndim, shape, err);
    if (st == DDT_OK) *out = t;
    return st;
}

static ddt_status name_with(const char *base, const char *suffix, char *buf, size_t cap,
                            ddt_error *err) {
    int n = snprintf(buf, cap, "%s%s", base, suffix);
    if (n < 0 || (size_t)n >= cap)
        return ddt_fail(err, DDT_ERR_INVALID, "weight %.64s...: name too long", base);
    return DDT_OK;
}

static int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

ddt_status ddt_checkpoint_weight(const ddt_checkpoint *ck, const char *base, int64_t rows,
                                 int64_t cols, ddt_qweight *out, ddt_error *err) {
    if (!ck || !base || !out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_checkpoint_weight: NULL argument");
    memset(out, 0, sizeof *out);
    char name[512];
    ddt_status st;
    const ddt_st_tensor *w, *s;
    if ((st = name_with(base, ".weight", name, sizeof name, err)) != DDT_OK) return st;
    w = ddt_checkpoint_find(ck, name);
    if (w) {
        int64_t want[2] = {rows > 0 ? rows : -1, cols > 0 ? cols : -1};
        if (w->dtype != DDT_DTYPE_F32 && w->dtype != DDT_DTYPE_BF16 && w->dtype != DDT_DTYPE_F16 &&
            w->dtype != DDT_DTYPE_F8_E4M3)
            return ddt_fail(err, DDT_ERR_FORMAT,
                            "file %s: tensor %s: expected F32, BF16, F16 or F8_E4M3, found %s",
                            ddt_checkpoint_file_name(ck, w->file_index), w->name,
                            ddt_dtype_name(w->dtype));
        if ((st = check_tensor(ck, w, w->dtype, 2, want, err)) != DDT_OK) return st;
        out->dtype = w->dtype;
        out->rows = w->shape[0];
        out->cols = w->shape[1];
        out->data = w->data;
        if (w->dtype != DDT_DTYPE_F8_E4M3) {
            out->format = DDT_Q_DENSE;
            return DDT_OK;
        }
        if ((st = name_with(base, ".weight_scale_inv", name, sizeof name, err)) != DDT_OK) return st;
        s = ddt_checkpoint_find(ck, name);
        if (!s)
            return ddt_fail(err, DDT_ERR_FORMAT,
                            "checkpoint %s: tensor %s.weight is F8_E4M3 but tensor %s is missing",
                            ck->path, base, name);
        int64_t sshape[2] = {ceil_div(out->rows, DDT_FP8_BLOCK), ceil_div(out->cols, DDT_FP8_BLOCK)};
        if ((st = check_tensor(ck, s, DDT_DTYPE_F32, 2, sshape, err)) != DDT_OK) return st;
        out->format = DDT_Q_FP8_BLOCK;
        out->scale_inv = s->data;
        out->block = DDT_FP8_BLOCK;
        return DDT_OK;
    }

    if ((st = name_with(base, ".weight_packed", name, sizeof name, err)) != DDT_OK) return st;
    w = ddt_checkpoint_find(ck, name);
    if (!w)
        return ddt_fail(err, DDT_ERR_FORMAT,
                        "checkpoint %s: weight %s is missing (neither %s.weight nor "
                        "%s.weight_packed)",
                        ck->path, base, base, base);
    /* weight_shape is the only record of the logical [rows, cols]; trust nothing
     * else about the size before it is checked. */
    if ((st = name_with(base, ".weight_shape", name, sizeof name, err)) != DDT_OK) return st;
    const ddt_st_tensor *ws = ddt_checkpoint_find(ck, name);
    if (!ws)
        return ddt_fail(err, DDT_ERR_FORMAT,
                        "checkpoint %s: tensor %s.weight_packed is present but tensor %s is missing",
                        ck->path, base, name);
    const int64_t two[1] = {2};
    if ((st = check_tensor(ck, ws, DDT_DTYPE_I64, 1, two, err)) != DDT_OK) return st;
    int64_t shp[2];
    memcpy(shp, ws->data, sizeof shp);
    if (shp[0] <= 0 || shp[1] <= 0 || (rows > 0 && shp[0] != rows) || (cols > 0 && shp[1] != cols))
        return ddt_fail(err, DDT_ERR_FORMAT, "file %s: tensor %s: holds [%lld, %lld], expected [%lld, %lld]",
                        ddt_checkpoint_file_name(ck, ws->file_index), ws->name, (long long)shp[0],
                        (long long)shp[1], (long long)(rows > 0 ? rows : shp[0]),
                        (long long)(cols > 0 ? cols : shp[1]));
    if (shp[1] % DDT_INT4_GROUP != 0)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                        "file %s: tensor %s: %lld columns, not a multiple of the INT4 group %d",
                        ddt_checkpoint_file_name(ck, ws->file_index), ws->name, (long long)shp[1],
                        DDT_INT4_GROUP);
    const int64_t pshape[2] = {shp[0], shp[1] / 8};
    if ((st = check_tensor(ck, w, DDT_DTYPE_I32, 2, pshape, err)) != DDT_OK) return st;
    if ((st = name_with(base, ".weight_scale", name, sizeof name, err)) != DDT_OK) return st;
    s = ddt_checkpoint_find(ck, name);
    if (!s)
        return ddt_fail(err, DDT_ERR_FORMAT,
                        "checkpoint %s: tensor %s.weight_packed is present but tensor %s is missing",
                        ck->path, base, name);
    const int64_t sshape[2] = {shp[0], shp[1] / DDT_INT4_GROUP};
    if ((st = check_tensor(ck, s, DDT_DTYPE_BF16, 2, sshape, err)) != DDT_OK) return st;
    out->format = DDT_Q_INT4_GROUP;
    out->dtype = DDT_DTYPE_I32;
    out->rows = shp[0];
    out->cols = shp[1];
    out->data = w->data;
    out->scale = s->data;
    out->group = DDT_INT4_GROUP;
    return DDT_OK;
}

/* ---- stacked (3-D) weights ----------------------------------------------- */

ddt_status ddt_checkpoint_weight_stack(const ddt_checkpoint *ck, const char *name, int64_t count, int64_t rows,
                                       int64_t cols, ddt_qweight_stack *out, ddt_error *err) {
    if (!ck || !name || !out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_checkpoint_weight_stack: NULL argument");
    memset(out, 0, sizeof *out);
    if (count <= 0 || rows <= 0 || cols <= 0)
        return ddt_fail(err, DDT_ERR_INVALID, "tensor %s: asked for a stack of %lld x [%lld, %lld]", name,
                        (long long)count, (long long)rows, (long long)cols);
    const ddt_st_tensor *w = ddt_checkpoint_find(ck, name);
    if (!w) return ddt_fail(err, DDT_ERR_FORMAT, "checkpoint %s: tensor %s is missing", ck->path, name);
    const char *file = ddt_checkpoint_file_name(ck, w->file_index);
    if (w->dtype == DDT_DTYPE_I32 || w->dtype == DDT_DTYPE_I64 || w->dtype == DDT_DTYPE_I16 ||
        w->dtype == DDT_DTYPE_I8 || w->dtype == DDT_DTYPE_U8)
        /* compressed-tensors quantises Linear modules one by one: an integer expert
         * stack would need a packing and a scale layout no tool defines, so guessing
         * one could silently decode garbage */
        return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                        "file %s: tensor %s: %s stacked expert weights (packed integer) are not supported; "
                        "store such experts per expert (experts.{e}.*_proj.weight_packed)",
                        file, name, ddt_dtype_name(w->dtype));
    if (w->dtype != DDT_DTYPE_F32 && w->dtype != DDT_DTYPE_BF16 && w->dtype != DDT_DTYPE_F16 &&
        w->dtype != DDT_DTYPE_F8_E4M3)
        return ddt_fail(err, DDT_ERR_FORMAT, "file %s: tensor %s: expected F32, BF16, F16 or F8_E4M3, found %s", file,
                        name, ddt_dtype_name(w->dtype));
    const int64_t want[3] = {count, rows, cols};
    ddt_status st = check_tensor(ck, w, w->dtype, 3, want, err);
    if (st != DDT_OK) return st;
    out->format = DDT_Q_DENSE;
    out->dtype = w->dtype;
    out->count = count;
    out->rows = rows;
    out->cols = cols;
    out->data = w->data;
    out->name = w->name;
    if (w->dtype != DDT_DTYPE_F8_E4M3) return DDT_OK;
    char sname[512];
    if ((st = name_with(name, "_scale_inv", sname, sizeof sname, err)) != DDT_OK) return st;
    const ddt_st_tensor *s = ddt_checkpoint_find(ck, sname);
    if (!s)
        return ddt_fail(err, DDT_ERR_FORMAT, "checkpoint %s: tensor %s is F8_E4M3 but tensor %s is missing", ck->path,
                        name, sname);
    const int64_t sshape[3] = {count, ceil_div(rows, DDT_FP8_BLOCK), ceil_div(cols, DDT_FP8_BLOCK)};
    if ((st = check_tensor(ck, s, DDT_DTYPE_F32, 3, sshape, err)) != DDT_OK) return st;
    out->format = DDT_Q_FP8_BLOCK;
    out->scale_inv = s->data;
    out->block = DDT_FP8_BLOCK;
    return DDT_OK;
}

ddt_status ddt_qweight_stack_view(const ddt_qweight_stack *s, int64_t i, int64_t row0, int64_t n_rows,
                                  ddt_qweight *out, ddt_error *err) {
    if (!s || !out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_qweight_stack_view: NULL argument");
    memset(out, 0, sizeof *out);
    const char *name = s->name ? s->name : "(stack)";
    if (i < 0 || i >= s->count || row0 < 0 || n_rows <= 0 || row0 > s->rows - n_rows)
        return ddt_fail(err, DDT_ERR_RANGE, "tensor %s: rows [%lld, %lld) of matrix %lld outside %lld x [%lld, %lld]",
                        name, (long long)row0, (long long)row0 + n_rows, (long long)i, (long long)s->count,
                        (long long)s->rows, (long long)s->cols);
    /* the element offset is below count*rows*cols, which the reader bounded by the
     * file size; checked anyway, since a stack may come from elsewhere */
    size_t off, esz = ddt_dtype_size(s->dtype);
    if (!ddt_mul_size((size_t)i, (size_t)s->rows, &off) || !ddt_add_size(off, (size_t)row0, &off) ||
        !ddt_mul_size(off, (size_t)s->cols, &off) || !ddt_mul_size(off, esz, &off))
        return ddt_fail(err, DDT_ERR_RANGE, "tensor %s: matrix %lld offset overflows", name, (long long)i);
    if (s->format == DDT_Q_FP8_BLOCK) {
        const int64_t blk = s->block;
        if (blk <= 0 || !s->scale_inv)
            return ddt_fail(err, DDT_ERR_INVALID, "tensor %s: FP8 stack without scales", name);
        if (row0 % blk != 0 || (n_rows % blk != 0 && row0 + n_rows != s->rows))
            return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                            "tensor %s: rows [%lld, %lld) of each matrix do not start and end on %lld-row FP8 "
                            "scale blocks, so they share scales with their neighbours and have no scale grid "
                            "of their own",
                            name, (long long)row0, (long long)row0 + n_rows, (long long)blk);
        const int64_t srows = ceil_div(s->rows, blk), scols = ceil_div(s->cols, blk);
        out->scale_inv = s->scale_inv + ((size_t)i * (size_t)srows + (size_t)(row0 / blk)) * (size_t)scols;
        out->block = (int32_t)blk;
    }
    out->format = s->format;
    out->dtype = s->dtype;
    out->rows = n_rows;
    out->cols = s->cols;
    out->data = (const uint8_t *)s->data + off;
    return DDT_OK;
}
