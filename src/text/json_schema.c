/*
 * json_schema.c — the schema compiler of json_schema.h.
 *
 * One recursive pass over the parsed schema: each sub-schema is checked keyword
 * by keyword (every key must be one this subset knows and that applies to the
 * node's type) and appended to the tables.  The recursion is bounded by
 * DDT_JSON_SCHEMA_MAX_DEPTH containers, so a hostile schema cannot exhaust the
 * stack.  The path in messages is written as it goes ("$.properties.a.items").
 */
#include "text/json_schema.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/json_grammar.h"

#define PATH_MAX_LEN 200

typedef struct compiler {
    ddt_json_schema *s;
    int32_t cap_nodes, cap_props, cap_strs;
    uint32_t cap_bytes;
    char path[PATH_MAX_LEN + 4];
    size_t path_len;
    ddt_error *err;
} compiler;

void ddt_json_schema_free(ddt_json_schema *s) {
    if (!s) return;
    free(s->nodes);
    free(s->names);
    free(s->prop_node);
    free(s->strs);
    free(s->bytes);
    free(s);
}

/* Grow *p (of *cap elements of size sz) to hold need; false when out of memory. */
static bool grow(void **p, int32_t *cap, int32_t need, size_t sz) {
    if (need <= *cap) return true;
    int32_t n = *cap ? *cap * 2 : 16;
    while (n < need) n *= 2;
    void *q = realloc(*p, (size_t)n * sz);
    if (!q) return false;
    *p = q;
    *cap = n;
    return true;
}

/* Append ".name" to the path (cut with "..." when long); returns the old length to restore. */
static size_t path_push(compiler *c, const char *part) {
    size_t old = c->path_len, n = strlen(part);
    if (old + 1 + n > PATH_MAX_LEN) {
        /* the buffer keeps room for one "..." past PATH_MAX_LEN; deeper parts are dropped */
        if (old <= PATH_MAX_LEN) {
            memcpy(c->path + old, "...", 4);
            c->path_len = old + 3;
        }
        return old;
    }
    c->path[old] = '.';
    memcpy(c->path + old + 1, part, n + 1);
    c->path_len = old + 1 + n;
    return old;
}

static void path_pop(compiler *c, size_t old) {
    c->path_len = old;
    c->path[old] = '\0';
}

/* A property name or enum string the byte matcher can follow (json_schema.h). */
static const char *string_problem(const char *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)b[i];
        if (ch == '"') return "a '\"'";
        if (ch == '\\') return "a '\\'";
        if (ch < 0x20) return "a control character";
    }
    return NULL;
}

static ddt_status add_bytes(compiler *c, const char *b, size_t n, ddt_json_schema_str *out) {
    ddt_json_schema *s = c->s;
    if ((size_t)s->n_bytes + n > DDT_JSON_SCHEMA_MAX_BYTES)
        return ddt_fail(c->err, DDT_ERR_RANGE, "the schema's property names and enum strings pass %d bytes (at %s)",
                        DDT_JSON_SCHEMA_MAX_BYTES, c->path);
    if (s->n_bytes + n > c->cap_bytes) {
        uint32_t cap = c->cap_bytes ? c->cap_bytes : 256;
        while (cap < s->n_bytes + n) cap *= 2;
        char *q = realloc(s->bytes, cap);
        if (!q) return ddt_fail(c->err, DDT_ERR_NOMEM, "out of memory compiling the schema");
        s->bytes = q;
        c->cap_bytes = cap;
    }
    if (n) memcpy(s->bytes + s->n_bytes, b, n);
    *out = (ddt_json_schema_str){s->n_bytes, (uint32_t)n};
    s->n_bytes += (uint32_t)n;
    return DDT_OK;
}

/* Sort n strings by bytes without qsort's global context: insertion sort (enums are short lists). */
static void sort_strs(const ddt_json_schema *s, ddt_json_schema_str *v, int32_t n) {
    for (int32_t i = 1; i < n; i++) {
        ddt_json_schema_str x = v[i];
        int32_t j = i;
        for (; j > 0; j--) {
            const ddt_json_schema_str *a = &v[j - 1];
            uint32_t m = a->len < x.len ? a->len : x.len;
            int r = m ? memcmp(s->bytes + a->off, s->bytes + x.off, m) : 0;
            if (r < 0 || (r == 0 && a->len <= x.len)) break;
            v[j] = v[j - 1];
        }
        v[j] = x;
    }
}

static const char *const type_names[] = {"object", "array", "string", "integer", "number", "boolean", "null"};

static ddt_status compile_node(compiler *c, const json_t *js, int depth, int32_t *out);

static ddt_status compile_enum(compiler *c, const json_t *en, ddt_json_schema_node *node) {
    ddt_json_schema *s = c->s;
    if (!json_is_array(en) || json_array_size(en) == 0)
        return ddt_fail(c->err, DDT_ERR_INVALID, "'enum' at %s must be a non-empty array", c->path);
    size_t n = json_array_size(en);
    if ((size_t)s->n_strs + n > DDT_JSON_SCHEMA_MAX_NODES * 16)
        return ddt_fail(c->err, DDT_ERR_RANGE, "too many enum strings (at %s)", c->path);
    if (!grow((void **)&s->strs, &c->cap_strs, s->n_strs + (int32_t)n, sizeof *s->strs))
        return ddt_fail(c->err, DDT_ERR_NOMEM, "out of memory compiling the schema");
    int32_t first = s->n_strs;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(en, i);
        if (!json_is_string(v))
            return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "'enum' at %s: item %zu is not a string (only string enums "
                            "are supported)", c->path, i);
        const char *problem = string_problem(json_string_value(v), json_string_length(v));
        if (problem)
            return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "'enum' at %s: item %zu contains %s (enum strings must need "
                            "no escapes)", c->path, i, problem);
        ddt_status st = add_bytes(c, json_string_value(v), json_string_length(v), &s->strs[s->n_strs]);
        if (st) return st;
        s->n_strs++;
    }
    sort_strs(s, s->strs + first, (int32_t)n);
    node->type = DDT_JS_ENUM;
    node->first = (uint16_t)first;
    node->count = (uint16_t)n;
    return DDT_OK;
}

static ddt_status compile_object(compiler *c, const json_t *js, int depth, int32_t index) {
    ddt_json_schema *s = c->s;
    const json_t *props = json_object_get(js, "properties");
    if (!props)
        return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "object at %s has no 'properties' (free-form objects are not "
                        "supported)", c->path);
    if (!json_is_object(props))
        return ddt_fail(c->err, DDT_ERR_INVALID, "'properties' at %s must be an object", c->path);
    const json_t *ap = json_object_get(js, "additionalProperties");
    if (ap && !json_is_boolean(ap))
        return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "'additionalProperties' at %s must be false or true (a schema "
                        "is not supported)", c->path);
    const json_t *req = json_object_get(js, "required");
    if (req) {
        if (!json_is_array(req))
            return ddt_fail(c->err, DDT_ERR_INVALID, "'required' at %s must be an array of property names", c->path);
        for (size_t i = 0; i < json_array_size(req); i++) {
            const json_t *r = json_array_get(req, i);
            if (!json_is_string(r))
                return ddt_fail(c->err, DDT_ERR_INVALID, "'required' at %s: item %zu is not a string", c->path, i);
            if (!json_object_get(props, json_string_value(r)) || strlen(json_string_value(r)) != json_string_length(r))
                return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "'required' at %s names \"%.60s\", which is not in "
                                "'properties'", c->path, json_string_value(r));
        }
    }
    size_t n = json_object_size(props);
    if ((size_t)s->n_props + n > DDT_JSON_SCHEMA_MAX_NODES)
        return ddt_fail(c->err, DDT_ERR_RANGE, "the schema has more than %d properties (at %s)",
                        DDT_JSON_SCHEMA_MAX_NODES, c->path);
    /* the object's properties are contiguous: reserve them before the sub-schemas add their own */
    int32_t first = s->n_props;
    if (!grow((void **)&s->names, &c->cap_props, first + (int32_t)n, sizeof *s->names))
        return ddt_fail(c->err, DDT_ERR_NOMEM, "out of memory compiling the schema");
    /* prop_node shares the capacity of names */
    uint16_t *pn = realloc(s->prop_node, (size_t)c->cap_props * sizeof *pn);
    if (!pn) return ddt_fail(c->err, DDT_ERR_NOMEM, "out of memory compiling the schema");
    s->prop_node = pn;
    s->n_props += (int32_t)n;
    s->nodes[index].first = (uint16_t)first;
    s->nodes[index].count = (uint16_t)n;
    /* Jansson keeps an object's keys in document order (since 2.8), which is the emitted order */
    int32_t k = first;
    for (void *it = json_object_iter((json_t *)props); it; it = json_object_iter_next((json_t *)props, it)) {
        const char *key = json_object_iter_key(it);
        const size_t key_len = json_object_iter_key_len(it);
        const json_t *sub = json_object_iter_value(it);
        size_t old = path_push(c, "properties");
        path_push(c, key);
        const char *problem = string_problem(key, key_len);
        if (problem) {
            ddt_status st = ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "property name at %s contains %s (names must need "
                                     "no escapes)", c->path, problem);
            path_pop(c, old);
            return st;
        }
        ddt_status st = add_bytes(c, key, key_len, &s->names[k]);
        int32_t child = 0;
        if (!st) st = compile_node(c, sub, depth, &child);
        path_pop(c, old);
        if (st) return st;
        s->prop_node[k++] = (uint16_t)child;
    }
    return DDT_OK;
}

/* Compile one sub-schema into a new node; depth counts the containers above it. */
static ddt_status compile_node(compiler *c, const json_t *js, int depth, int32_t *out) {
    ddt_json_schema *s = c->s;
    if (!json_is_object(js)) return ddt_fail(c->err, DDT_ERR_INVALID, "the schema at %s must be an object", c->path);
    if (s->n_nodes >= DDT_JSON_SCHEMA_MAX_NODES)
        return ddt_fail(c->err, DDT_ERR_RANGE, "the schema has more than %d nodes (at %s)", DDT_JSON_SCHEMA_MAX_NODES,
                        c->path);
    if (!grow((void **)&s->nodes, &c->cap_nodes, s->n_nodes + 1, sizeof *s->nodes))
        return ddt_fail(c->err, DDT_ERR_NOMEM, "out of memory compiling the schema");
    const int32_t index = s->n_nodes++;
    s->nodes[index] = (ddt_json_schema_node){0};
    *out = index;
    const json_t *type = json_object_get(js, "type"), *en = json_object_get(js, "enum");
    int t = -1;
    if (type) {
        if (json_is_array(type))
            return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "'type' at %s is a list (only one type is supported)", c->path);
        if (!json_is_string(type)) return ddt_fail(c->err, DDT_ERR_INVALID, "'type' at %s must be a string", c->path);
        for (int k = 0; k < 7; k++)
            if (!strcmp(json_string_value(type), type_names[k])) t = k;
        if (t < 0)
            return ddt_fail(c->err, DDT_ERR_INVALID, "'type' at %s is \"%.40s\" (object, array, string, integer, "
                            "number, boolean or null)", c->path, json_string_value(type));
    } else if (!en) {
        return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "the schema at %s has no 'type' (nor 'enum')", c->path);
    }
    if (depth == 0 && t != DDT_JS_OBJECT)
        return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "the root schema must have \"type\": \"object\"");
    if (en && type && t != DDT_JS_STRING)
        return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "'enum' at %s with type \"%s\" (only string enums are "
                        "supported)", c->path, type_names[t]);
    /* every keyword must be known and apply to this type: a dropped one would loosen the schema */
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)js, key, v) {
        bool ok = !strcmp(key, "type") || !strcmp(key, "description") || !strcmp(key, "title") ||
                  (!strcmp(key, "enum")) ||
                  (t == DDT_JS_OBJECT && (!strcmp(key, "properties") || !strcmp(key, "required") ||
                                          !strcmp(key, "additionalProperties"))) ||
                  (t == DDT_JS_ARRAY && !strcmp(key, "items"));
        if (!strcmp(key, "description") || !strcmp(key, "title"))
            if (!json_is_string(v))
                return ddt_fail(c->err, DDT_ERR_INVALID, "'%s' at %s must be a string", key, c->path);
        if (!ok)
            return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "unsupported keyword '%.60s' at %s (this server's subset: "
                            "type, properties, required, additionalProperties, items, enum, description, title)",
                            key, c->path);
    }
    if (en) return compile_enum(c, en, &s->nodes[index]);
    s->nodes[index].type = (uint8_t)t;
    if (t == DDT_JS_OBJECT || t == DDT_JS_ARRAY) {
        if (depth >= DDT_JSON_SCHEMA_MAX_DEPTH)
            return ddt_fail(c->err, DDT_ERR_RANGE, "the schema nests containers deeper than %d (at %s)",
                            DDT_JSON_SCHEMA_MAX_DEPTH, c->path);
    }
    if (t == DDT_JS_OBJECT) return compile_object(c, js, depth + 1, index);
    if (t == DDT_JS_ARRAY) {
        const json_t *items = json_object_get(js, "items");
        if (!items) return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "array at %s has no 'items'", c->path);
        size_t old = path_push(c, "items");
        int32_t child = 0;
        ddt_status st = compile_node(c, items, depth + 1, &child);
        path_pop(c, old);
        if (st) return st;
        s->nodes[index].first = (uint16_t)child;
    }
    return DDT_OK;
}

ddt_status ddt_json_schema_compile(const json_t *schema, ddt_json_schema **out, ddt_error *err) {
    if (!out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_json_schema_compile: NULL out");
    *out = NULL;
    compiler c = {.err = err};
    c.s = calloc(1, sizeof *c.s);
    if (!c.s) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory compiling the schema");
    c.path[0] = '$';
    c.path[1] = '\0';
    c.path_len = 1;
    int32_t root = 0;
    ddt_status st = schema ? compile_node(&c, schema, 0, &root)
                           : ddt_fail(err, DDT_ERR_INVALID, "no schema");
    if (st) {
        ddt_json_schema_free(c.s);
        return st;
    }
    *out = c.s;
    return DDT_OK;
}

static void *dup_bytes(const void *p, size_t n) {
    void *q = malloc(n ? n : 1);
    if (q && n) memcpy(q, p, n);
    return q;
}

ddt_status ddt_json_schema_copy(const ddt_json_schema *src, ddt_json_schema **out, ddt_error *err) {
    *out = NULL;
    ddt_json_schema *s = calloc(1, sizeof *s);
    if (!s) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory copying a schema");
    *s = *src;
    s->nodes = dup_bytes(src->nodes, (size_t)src->n_nodes * sizeof *s->nodes);
    s->names = dup_bytes(src->names, (size_t)src->n_props * sizeof *s->names);
    s->prop_node = dup_bytes(src->prop_node, (size_t)src->n_props * sizeof *s->prop_node);
    s->strs = dup_bytes(src->strs, (size_t)src->n_strs * sizeof *s->strs);
    s->bytes = dup_bytes(src->bytes, src->n_bytes);
    if (!s->nodes || !s->names || !s->prop_node || !s->strs || !s->bytes) {
        ddt_json_schema_free(s);
        return ddt_fail(err, DDT_ERR_NOMEM, "out of memory copying a schema");
    }
    *out = s;
    return DDT_OK;
}
