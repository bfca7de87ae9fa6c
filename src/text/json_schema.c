/*
 * json_schema.c — the schema compiler of json_schema.h.
 *
 * One recursive pass over the parsed schema: each sub-schema is checked keyword
 * by keyword (every key must be one this subset knows and that applies to the
 * node's types) and appended to the tables.  A "$ref" is followed through the
 * document and its target compiled once (remembered by its json_t), which is
 * what lets a schema refer to itself.  The recursion is bounded twice: by
 * DDT_JSON_SCHEMA_MAX_DEPTH containers spelt inside one another, and by
 * MAX_FRAMES sub-schemas in all (anyOf in anyOf, chains of $ref), so a hostile
 * schema cannot exhaust the stack.  The path in messages is written as it goes
 * ("$.properties.a.items", "$.$defs.b.anyOf[1]").
 *
 * After the pass, each node's height (the fewest containers an instance opens)
 * is found by iterating to a fixed point, because recursion makes the node
 * graph cyclic; the recogniser reads the heights to open only containers that
 * can be finished within the nesting limit.
 */
#include "text/json_schema.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/json_grammar.h"

#define PATH_MAX_LEN 200
#define MAX_FRAMES 128        /* sub-schemas compiled inside one another */
#define PENDING 0x80          /* a union whose branches are still being compiled (cleared after) */

/* A "$ref" target: the node it compiled to (-1 while a chain of $refs is being followed). */
typedef struct ref_entry {
    const json_t *target;
    int32_t node;
} ref_entry;

/* A path for messages ("$.properties.a"); the buffer keeps room for one "..." past PATH_MAX_LEN. */
typedef struct json_path {
    char text[PATH_MAX_LEN + 4];
    size_t len;
} json_path;

typedef struct compiler {
    ddt_json_schema *s;
    const json_t *doc; /* the whole schema, where "$ref" pointers start */
    int32_t cap_nodes, cap_props, cap_strs;
    uint32_t cap_bytes;
    ref_entry *refs;
    int32_t n_refs, cap_refs;
    int frames;
    json_path at; /* where the sub-schema being compiled is */
    ddt_error *err;
} compiler;

void ddt_json_schema_free(ddt_json_schema *s) {
    if (!s) return;
    free(s->nodes);
    free(s->names);
    free(s->prop_node);
    free(s->prop_required);
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

static void path_root(json_path *p) {
    memcpy(p->text, "$", 2);
    p->len = 1;
}

/* Append sep and part to the path (cut with "..." when long); returns the old length to restore. */
static size_t path_add(json_path *p, const char *sep, const char *part, const char *end) {
    size_t old = p->len, n = strlen(sep) + strlen(part) + strlen(end);
    if (old + n > PATH_MAX_LEN) {
        /* deeper parts are dropped */
        if (old <= PATH_MAX_LEN) {
            memcpy(p->text + old, "...", 4);
            p->len = old + 3;
        }
        return old;
    }
    snprintf(p->text + old, sizeof p->text - old, "%s%s%s", sep, part, end);
    p->len = old + n;
    return old;
}

static size_t path_push(json_path *p, const char *part) { return path_add(p, ".", part, ""); }

static size_t path_push_index(json_path *p, size_t i) {
    char num[24];
    snprintf(num, sizeof num, "%zu", i);
    return path_add(p, "[", num, "]");
}

static void path_pop(json_path *p, size_t old) {
    p->len = old;
    p->text[old] = '\0';
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
        return ddt_fail(c->err, DDT_ERR_RANGE, "the schema's property names and enum values pass %d bytes (at %s)",
                        DDT_JSON_SCHEMA_MAX_BYTES, c->at.text);
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

/* ---- types */

enum { T_OBJECT = 1, T_ARRAY = 2, T_STRING = 4, T_INTEGER = 8, T_NUMBER = 16, T_BOOLEAN = 32, T_NULL = 64 };
static const char *const type_names[] = {"object", "array", "string", "integer", "number", "boolean", "null"};
static const char *const class_names[DDT_JK_COUNT] = {"an object ('{')", "an array ('[')", "a string ('\"')",
                                                      "a number", "true", "false", "null"};

/* "type" (a name or a list of names) into T_* bits. */
static ddt_status parse_type(compiler *c, const json_t *type, unsigned *out) {
    *out = 0;
    const bool list = json_is_array(type);
    if (!list && !json_is_string(type))
        return ddt_fail(c->err, DDT_ERR_INVALID, "'type' at %s must be a string or a list of strings", c->at.text);
    const size_t n = list ? json_array_size(type) : 1;
    if (n == 0) return ddt_fail(c->err, DDT_ERR_INVALID, "'type' at %s is an empty list", c->at.text);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = list ? json_array_get(type, i) : type;
        if (!json_is_string(v))
            return ddt_fail(c->err, DDT_ERR_INVALID, "'type' at %s: item %zu is not a string", c->at.text, i);
        int t = -1;
        for (int k = 0; k < 7; k++)
            if (!strcmp(json_string_value(v), type_names[k])) t = k;
        if (t < 0) {
            if (list)
                return ddt_fail(c->err, DDT_ERR_INVALID, "'type' at %s: item %zu is \"%.40s\" (object, array, string, "
                                "integer, number, boolean or null)", c->at.text, i, json_string_value(v));
            return ddt_fail(c->err, DDT_ERR_INVALID, "'type' at %s is \"%.40s\" (object, array, string, integer, "
                            "number, boolean or null)", c->at.text, json_string_value(v));
        }
        if (*out & (1u << t))
            return ddt_fail(c->err, DDT_ERR_INVALID, "'type' at %s lists \"%s\" twice", c->at.text, type_names[t]);
        *out |= 1u << t;
    }
    return DDT_OK;
}

/* A count keyword (minItems, maxLength, ...): absent leaves *out. */
static ddt_status parse_bound(compiler *c, const json_t *js, const char *key, uint16_t *out) {
    const json_t *v = json_object_get(js, key);
    if (!v) return DDT_OK;
    /* JSON Schema takes 3.0 for 3; a fraction is no count */
    double d = json_is_integer(v) ? (double)json_integer_value(v) : json_is_real(v) ? json_real_value(v) : -1.0;
    if (!json_is_number(v) || d < 0 || d != floor(d))
        return ddt_fail(c->err, DDT_ERR_INVALID, "'%s' at %s must be a non-negative integer", key, c->at.text);
    if (d > DDT_JSON_SCHEMA_MAX_BOUND)
        return ddt_fail(c->err, DDT_ERR_RANGE, "'%s' at %s is past %d (this server's limit)", key, c->at.text,
                        DDT_JSON_SCHEMA_MAX_BOUND);
    *out = (uint16_t)d;
    return DDT_OK;
}

static bool is_annotation(const char *key) {
    return !strcmp(key, "description") || !strcmp(key, "title") || !strcmp(key, "$comment") ||
           !strcmp(key, "default") || !strcmp(key, "examples") || !strcmp(key, "$schema");
}

/* Annotations that must be strings are; "$defs" / "definitions" are objects of schemas. */
static ddt_status check_side_keyword(compiler *c, const char *key, const json_t *v) {
    if ((!strcmp(key, "description") || !strcmp(key, "title") || !strcmp(key, "$comment") ||
         !strcmp(key, "$schema")) && !json_is_string(v))
        return ddt_fail(c->err, DDT_ERR_INVALID, "'%s' at %s must be a string", key, c->at.text);
    if ((!strcmp(key, "$defs") || !strcmp(key, "definitions")) && !json_is_object(v))
        return ddt_fail(c->err, DDT_ERR_INVALID, "'%s' at %s must be an object of schemas", key, c->at.text);
    return DDT_OK;
}

static ddt_status compile_node(compiler *c, const json_t *js, int depth, int32_t memo, int32_t *out);

/* ---- enum and const */

/* The number of characters (code points) of UTF-8 text: its bytes that are not continuations. */
static size_t utf8_chars(const char *b, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)b[i] & 0xC0) != 0x80;
    return k;
}

/* The one text a number of an enum is written as (json_schema.h): integers in
 * decimal, whole reals below 1e17 too, other reals as the shortest %g that reads
 * back the same double.  Checked against the grammar, so a locale's decimal
 * comma could not slip in. */
static ddt_status number_text(compiler *c, const json_t *v, const char *what, size_t i, char *buf, size_t cap) {
    if (json_is_integer(v)) {
        snprintf(buf, cap, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    } else {
        const double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 1e17) {
            snprintf(buf, cap, "%.0f", d);
        } else {
            for (int p = 1; p <= 17; p++) {
                snprintf(buf, cap, "%.*g", p, d);
                if (strtod(buf, NULL) == d) break;
            }
        }
    }
    ddt_json_state st;
    ddt_json_init(&st, false);
    if (!ddt_json_feed(&st, (const uint8_t *)buf, strlen(buf)) || !ddt_json_complete(&st))
        return ddt_fail(c->err, DDT_ERR_INTERNAL, "'%s' at %s: item %zu printed as \"%s\", not a JSON number", what,
                        c->at.text, i, buf);
    return DDT_OK;
}

/* Append one enum value's text to the strs table. */
static ddt_status add_value(compiler *c, const char *b, size_t n) {
    ddt_json_schema *s = c->s;
    if (s->n_strs >= DDT_JSON_SCHEMA_MAX_NODES * 16)
        return ddt_fail(c->err, DDT_ERR_RANGE, "too many enum values (at %s)", c->at.text);
    if (!grow((void **)&s->strs, &c->cap_strs, s->n_strs + 1, sizeof *s->strs))
        return ddt_fail(c->err, DDT_ERR_NOMEM, "out of memory compiling the schema");
    ddt_status st = add_bytes(c, b, n, &s->strs[s->n_strs]);
    if (!st) s->n_strs++;
    return st;
}

/*
 * The values of "enum" (a list) or "const" (one value) into node index: the
 * classes they start with, and the strings' and numbers' texts (each kind's
 * contiguous, then sorted).  types (T_* bits, 0: no "type") drops values of
 * other types, as do the string length bounds already in the node.
 */
static ddt_status compile_enum(compiler *c, const json_t *values, const char *what, unsigned types, int32_t index) {
    ddt_json_schema *s = c->s;
    const bool list = !strcmp(what, "enum");
    if (list && (!json_is_array(values) || json_array_size(values) == 0))
        return ddt_fail(c->err, DDT_ERR_INVALID, "'enum' at %s must be a non-empty array", c->at.text);
    const size_t n = list ? json_array_size(values) : 1;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = list ? json_array_get(values, i) : values;
        if (json_is_object(v) || json_is_array(v))
            return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "'%s' at %s: item %zu is %s (only strings, numbers, true, "
                            "false and null are supported)", what, c->at.text, i,
                            json_is_object(v) ? "an object" : "an array");
        if (json_is_string(v)) {
            const char *problem = string_problem(json_string_value(v), json_string_length(v));
            if (problem)
                return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "'%s' at %s: item %zu contains %s (enum strings must "
                                "need no escapes)", what, c->at.text, i, problem);
        }
    }
    /* strings first, then numbers, so that each kind's texts are contiguous */
    uint8_t kinds = 0;
    const uint16_t min_len = s->nodes[index].min_len, max_len = s->nodes[index].max_len;
    const int32_t str_first = s->n_strs;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = list ? json_array_get(values, i) : values;
        if (!json_is_string(v) || (types && !(types & T_STRING))) continue;
        const size_t chars = utf8_chars(json_string_value(v), json_string_length(v));
        if (chars < min_len || (max_len != DDT_JSON_SCHEMA_UNBOUNDED && chars > max_len)) continue;
        ddt_status st = add_value(c, json_string_value(v), json_string_length(v));
        if (st) return st;
        kinds |= 1u << DDT_JK_STRING;
    }
    const int32_t num_first = s->n_strs;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = list ? json_array_get(values, i) : values;
        if (!json_is_number(v)) continue;
        /* JSON Schema calls a whole real (2.0) an integer */
        const bool whole = json_is_integer(v) || json_real_value(v) == floor(json_real_value(v));
        if (types && !(types & T_NUMBER) && !((types & T_INTEGER) && whole)) continue;
        char buf[64];
        ddt_status st = number_text(c, v, what, i, buf, sizeof buf);
        if (!st) st = add_value(c, buf, strlen(buf));
        if (st) return st;
        kinds |= 1u << DDT_JK_NUMBER;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *v = list ? json_array_get(values, i) : values;
        if (json_is_true(v) && (!types || (types & T_BOOLEAN))) kinds |= 1u << DDT_JK_TRUE;
        if (json_is_false(v) && (!types || (types & T_BOOLEAN))) kinds |= 1u << DDT_JK_FALSE;
        if (json_is_null(v) && (!types || (types & T_NULL))) kinds |= 1u << DDT_JK_NULL;
    }
    if (!kinds)
        return ddt_fail(c->err, DDT_ERR_INVALID, "'%s' at %s: no value fits the schema's 'type', 'minLength' and "
                        "'maxLength'", what, c->at.text);
    ddt_json_schema_node *node = &s->nodes[index];
    node->kinds = kinds;
    node->flags |= DDT_JN_STR_ENUM | DDT_JN_NUM_ENUM;
    node->str_first = (uint16_t)str_first;
    node->str_count = (uint16_t)(num_first - str_first);
    node->num_first = (uint16_t)num_first;
    node->num_count = (uint16_t)(s->n_strs - num_first);
    /* strs is NULL while no string has been added: no pointer arithmetic on it then */
    if (node->str_count) sort_strs(s, s->strs + str_first, node->str_count);
    if (node->num_count) sort_strs(s, s->strs + num_first, node->num_count);
    return DDT_OK;
}

/* ---- containers */

static ddt_status compile_object(compiler *c, const json_t *js, int depth, int32_t index) {
    ddt_json_schema *s = c->s;
    const json_t *props = json_object_get(js, "properties");
    if (!props)
        return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "object at %s has no 'properties' (free-form objects are not "
                        "supported)", c->at.text);
    if (!json_is_object(props))
        return ddt_fail(c->err, DDT_ERR_INVALID, "'properties' at %s must be an object", c->at.text);
    const json_t *ap = json_object_get(js, "additionalProperties");
    if (ap && !json_is_boolean(ap))
        return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "'additionalProperties' at %s must be false or true (a schema "
                        "is not supported)", c->at.text);
    const json_t *req = json_object_get(js, "required");
    if (req) {
        if (!json_is_array(req))
            return ddt_fail(c->err, DDT_ERR_INVALID, "'required' at %s must be an array of property names", c->at.text);
        for (size_t i = 0; i < json_array_size(req); i++) {
            const json_t *r = json_array_get(req, i);
            if (!json_is_string(r))
                return ddt_fail(c->err, DDT_ERR_INVALID, "'required' at %s: item %zu is not a string", c->at.text, i);
            if (!json_object_get(props, json_string_value(r)) || strlen(json_string_value(r)) != json_string_length(r))
                return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "'required' at %s names \"%.60s\", which is not in "
                                "'properties'", c->at.text, json_string_value(r));
        }
    }
    size_t n = json_object_size(props);
    if ((size_t)s->n_props + n > DDT_JSON_SCHEMA_MAX_NODES)
        return ddt_fail(c->err, DDT_ERR_RANGE, "the schema has more than %d properties (at %s)",
                        DDT_JSON_SCHEMA_MAX_NODES, c->at.text);
    /* the object's properties are contiguous: reserve them before the sub-schemas add their own */
    int32_t first = s->n_props;
    const int32_t old_cap = c->cap_props;
    if (!grow((void **)&s->names, &c->cap_props, first + (int32_t)n, sizeof *s->names))
        return ddt_fail(c->err, DDT_ERR_NOMEM, "out of memory compiling the schema");
    if (c->cap_props != old_cap) {
        /* prop_node and prop_required share the capacity of names */
        uint16_t *pn = realloc(s->prop_node, (size_t)c->cap_props * sizeof *pn);
        if (pn) s->prop_node = pn;
        uint8_t *pr = realloc(s->prop_required, (size_t)c->cap_props);
        if (pr) s->prop_required = pr;
        if (!pn || !pr) return ddt_fail(c->err, DDT_ERR_NOMEM, "out of memory compiling the schema");
    }
    s->n_props += (int32_t)n;
    s->nodes[index].first = (uint16_t)first;
    s->nodes[index].count = (uint16_t)n;
    /* Jansson keeps an object's keys in document order (since 2.8), which is the emitted order */
    int32_t k = first;
    uint16_t req_end = 0;
    for (void *it = json_object_iter((json_t *)props); it; it = json_object_iter_next((json_t *)props, it)) {
        const char *key = json_object_iter_key(it);
        const size_t key_len = json_object_iter_key_len(it);
        const json_t *sub = json_object_iter_value(it);
        bool required = false;
        for (size_t i = 0; req && i < json_array_size(req); i++) {
            const json_t *r = json_array_get(req, i);
            required |= json_string_length(r) == key_len && !memcmp(json_string_value(r), key, key_len);
        }
        s->prop_required[k] = required;
        if (required) req_end = (uint16_t)(k - first + 1);
        size_t old = path_push(&c->at, "properties");
        path_push(&c->at, key);
        const char *problem = string_problem(key, key_len);
        if (problem) {
            ddt_status st = ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "property name at %s contains %s (names must need "
                                     "no escapes)", c->at.text, problem);
            path_pop(&c->at, old);
            return st;
        }
        ddt_status st = add_bytes(c, key, key_len, &s->names[k]);
        int32_t child = 0;
        if (!st) st = compile_node(c, sub, depth, -1, &child);
        path_pop(&c->at, old);
        if (st) return st;
        s->prop_node[k++] = (uint16_t)child;
    }
    s->nodes[index].req_end = req_end;
    return DDT_OK;
}

static ddt_status compile_array(compiler *c, const json_t *js, int depth, int32_t index) {
    const json_t *items = json_object_get(js, "items");
    if (!items) return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "array at %s has no 'items'", c->at.text);
    uint16_t lo = 0, hi = DDT_JSON_SCHEMA_UNBOUNDED;
    ddt_status st = parse_bound(c, js, "minItems", &lo);
    if (!st) st = parse_bound(c, js, "maxItems", &hi);
    if (st) return st;
    if (hi != DDT_JSON_SCHEMA_UNBOUNDED && lo > hi)
        return ddt_fail(c->err, DDT_ERR_INVALID, "'minItems' at %s is more than 'maxItems'", c->at.text);
    c->s->nodes[index].min_items = lo;
    c->s->nodes[index].max_items = hi;
    size_t old = path_push(&c->at, "items");
    int32_t child = 0;
    st = compile_node(c, items, depth, -1, &child);
    path_pop(&c->at, old);
    if (st) return st;
    c->s->nodes[index].items = (uint16_t)child;
    return DDT_OK;
}

/* ---- anyOf / oneOf, $ref */

static ddt_status compile_union(compiler *c, const json_t *list, const char *what, int depth, int32_t index) {
    ddt_json_schema *s = c->s;
    if (!json_is_array(list) || json_array_size(list) == 0)
        return ddt_fail(c->err, DDT_ERR_INVALID, "'%s' at %s must be a non-empty array of schemas", what, c->at.text);
    s->nodes[index].flags = DDT_JN_UNION | PENDING;
    int32_t owner[DDT_JK_COUNT];
    for (int k = 0; k < DDT_JK_COUNT; k++) owner[k] = -1;
    for (size_t i = 0; i < json_array_size(list); i++) {
        size_t old = path_push(&c->at, what);
        path_push_index(&c->at, i);
        int32_t b = 0;
        ddt_status st = compile_node(c, json_array_get(list, i), depth, -1, &b);
        path_pop(&c->at, old);
        if (st) return st;
        const ddt_json_schema_node branch = s->nodes[b];
        if (branch.flags & PENDING)
            return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "'%s' at %s: branch %zu comes back to this %s through $ref "
                            "with no container in between", what, c->at.text, i, what);
        for (int k = 0; k < DDT_JK_COUNT; k++) {
            if (!(branch.kinds >> k & 1u)) continue;
            if (owner[k] >= 0)
                return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "'%s' at %s: branches %d and %zu can both start with %s, "
                                "so the first byte of a value cannot tell them apart (each branch must start its "
                                "values differently: object, array, string, number, true, false, null)", what,
                                c->at.text, (int)owner[k], i, class_names[k]);
            owner[k] = (int32_t)i;
            s->nodes[index].kinds |= (uint8_t)(1u << k);
            /* unions are flattened: a class leads to a node that is not one */
            s->nodes[index].alt[k] = (branch.flags & DDT_JN_UNION) ? branch.alt[k] : (uint16_t)b;
        }
    }
    s->nodes[index].flags &= (uint8_t)~PENDING;
    return DDT_OK;
}

/* Follow ref ("#" or "#/a/b") from the document's root: the node its target compiles to. */
static ddt_status compile_ref(compiler *c, const json_t *ref, int32_t *out) {
    if (!json_is_string(ref)) return ddt_fail(c->err, DDT_ERR_INVALID, "'$ref' at %s must be a string", c->at.text);
    const char *r = json_string_value(ref);
    if (r[0] != '#' || (r[1] && r[1] != '/') || strlen(r) != json_string_length(ref))
        return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "'$ref' at %s is \"%.60s\" (only references inside the schema "
                        "are supported: \"#\" or \"#/$defs/name\")", c->at.text, r);
    if (strchr(r, '%'))
        return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "'$ref' at %s: \"%.60s\" is percent-encoded (not supported)",
                        c->at.text, r);
    json_path at; /* where the target is, for messages there */
    path_root(&at);
    const json_t *cur = c->doc;
    for (const char *p = r + 1; *p == '/';) {
        char seg[256];
        size_t n = 0;
        for (p++; *p && *p != '/'; p++) {
            char ch = *p;
            if (ch == '~') {
                if (p[1] != '0' && p[1] != '1')
                    return ddt_fail(c->err, DDT_ERR_INVALID, "'$ref' at %s: \"%.60s\" has a '~' that is not ~0 or ~1",
                                    c->at.text, r);
                ch = *++p == '0' ? '~' : '/';
            }
            if (n + 1 >= sizeof seg)
                return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "'$ref' at %s: \"%.60s\" has a name past %zu bytes",
                                c->at.text, r, sizeof seg - 1);
            seg[n++] = ch;
        }
        seg[n] = '\0';
        if (json_is_object(cur)) {
            cur = json_object_get(cur, seg);
            path_push(&at, seg);
        } else if (json_is_array(cur) && n > 0 && n < 10 && strspn(seg, "0123456789") == n && (seg[0] != '0' || n == 1)) {
            size_t i = (size_t)strtoul(seg, NULL, 10);
            cur = json_array_get(cur, i);
            path_push_index(&at, i);
        } else {
            cur = NULL;
        }
        if (!cur)
            return ddt_fail(c->err, DDT_ERR_INVALID, "'$ref' at %s: \"%.60s\" points to nothing in the schema", c->at.text,
                            r);
    }
    if (!json_is_object(cur))
        return ddt_fail(c->err, DDT_ERR_INVALID, "'$ref' at %s: \"%.60s\" points to something that is not a schema "
                        "(an object)", c->at.text, r);
    for (int32_t i = 0; i < c->n_refs; i++) {
        if (c->refs[i].target != cur) continue;
        if (c->refs[i].node < 0)
            return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "'$ref' at %s: \"%.60s\" comes back to itself through $ref "
                            "alone (no type in between)", c->at.text, r);
        *out = c->refs[i].node;
        return DDT_OK;
    }
    if (!grow((void **)&c->refs, &c->cap_refs, c->n_refs + 1, sizeof *c->refs))
        return ddt_fail(c->err, DDT_ERR_NOMEM, "out of memory compiling the schema");
    const int32_t memo = c->n_refs++;
    c->refs[memo] = (ref_entry){cur, -1};
    /* compiled where it is written: messages name its path, and containers count from 0 there */
    const json_path saved = c->at;
    c->at = at;
    ddt_status st = compile_node(c, cur, 0, memo, out);
    c->at = saved;
    if (!st) c->refs[memo].node = *out;
    return st;
}

/* ---- one sub-schema */

static ddt_status compile_inner(compiler *c, const json_t *js, int depth, int32_t memo, int32_t *out) {
    ddt_json_schema *s = c->s;
    const json_t *ref = json_object_get(js, "$ref"), *any = json_object_get(js, "anyOf"),
                 *one = json_object_get(js, "oneOf");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)js, key, v) {
        ddt_status st = check_side_keyword(c, key, v);
        if (st) return st;
    }
    if (ref || any || one) {
        const char *what = ref ? "$ref" : any ? "anyOf" : "oneOf";
        /* beside these, JSON Schema would intersect: only what constrains nothing may stand there */
        json_object_foreach((json_t *)js, key, v) {
            if (!strcmp(key, what) || is_annotation(key) || !strcmp(key, "$defs") || !strcmp(key, "definitions"))
                continue;
            return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "'%.60s' beside '%s' at %s (beside $ref, anyOf and oneOf "
                            "only description, title, default, examples, $comment, $schema, $defs and definitions are "
                            "supported)", key, what, c->at.text);
        }
        if (ref) return compile_ref(c, ref, out);
    }
    if (s->n_nodes >= DDT_JSON_SCHEMA_MAX_NODES)
        return ddt_fail(c->err, DDT_ERR_RANGE, "the schema has more than %d nodes (at %s)", DDT_JSON_SCHEMA_MAX_NODES,
                        c->at.text);
    if (!grow((void **)&s->nodes, &c->cap_nodes, s->n_nodes + 1, sizeof *s->nodes))
        return ddt_fail(c->err, DDT_ERR_NOMEM, "out of memory compiling the schema");
    const int32_t index = s->n_nodes++;
    s->nodes[index] = (ddt_json_schema_node){.max_items = DDT_JSON_SCHEMA_UNBOUNDED,
                                             .max_len = DDT_JSON_SCHEMA_UNBOUNDED};
    *out = index;
    /* A $ref inside the target finds it from here on.  The entries still unresolved
     * are the chain of $refs that led here ("#" -> "#/$defs/a" -> this), all of
     * them this node: any earlier chain was resolved when its own node was made. */
    if (memo >= 0)
        for (int32_t i = 0; i < c->n_refs; i++)
            if (c->refs[i].node < 0) c->refs[i].node = index;
    if (any || one) return compile_union(c, any ? any : one, any ? "anyOf" : "oneOf", depth, index);

    const json_t *type = json_object_get(js, "type"), *en = json_object_get(js, "enum"),
                 *cst = json_object_get(js, "const");
    unsigned types = 0;
    if (type) {
        ddt_status st = parse_type(c, type, &types);
        if (st) return st;
    } else if (!en && !cst) {
        return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "the schema at %s has no 'type' (nor 'enum', 'const', 'anyOf', "
                        "'oneOf' or '$ref')", c->at.text);
    }
    if (en && cst)
        return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "'enum' and 'const' together at %s (one or the other)", c->at.text);
    /* every keyword must be known and apply to this node's types: a dropped one would loosen the schema */
    json_object_foreach((json_t *)js, key, v) {
        bool ok = !strcmp(key, "type") || !strcmp(key, "enum") || !strcmp(key, "const") || is_annotation(key) ||
                  !strcmp(key, "$defs") || !strcmp(key, "definitions") ||
                  ((types & T_OBJECT) && (!strcmp(key, "properties") || !strcmp(key, "required") ||
                                          !strcmp(key, "additionalProperties"))) ||
                  ((types & T_ARRAY) && (!strcmp(key, "items") || !strcmp(key, "minItems") ||
                                         !strcmp(key, "maxItems"))) ||
                  ((types & T_STRING) && (!strcmp(key, "minLength") || !strcmp(key, "maxLength")));
        if (!ok)
            return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "unsupported keyword '%.60s' at %s (this server's subset: "
                            "type, properties, required, additionalProperties, items, minItems, maxItems, minLength, "
                            "maxLength, enum, const, anyOf, oneOf, $ref, $defs, annotations; each beside its type)",
                            key, c->at.text);
    }
    if (types & T_STRING) {
        uint16_t lo = 0, hi = DDT_JSON_SCHEMA_UNBOUNDED;
        ddt_status st = parse_bound(c, js, "minLength", &lo);
        if (!st) st = parse_bound(c, js, "maxLength", &hi);
        if (st) return st;
        if (hi != DDT_JSON_SCHEMA_UNBOUNDED && lo > hi)
            return ddt_fail(c->err, DDT_ERR_INVALID, "'minLength' at %s is more than 'maxLength'", c->at.text);
        s->nodes[index].min_len = lo;
        s->nodes[index].max_len = hi;
    }
    if (en || cst) return compile_enum(c, en ? en : cst, en ? "enum" : "const", types, index);

    /* the node's classes are known before its children compile: a $ref back into it may merge them */
    uint8_t kinds = 0;
    if (types & T_OBJECT) kinds |= 1u << DDT_JK_OBJECT;
    if (types & T_ARRAY) kinds |= 1u << DDT_JK_ARRAY;
    if (types & T_STRING) kinds |= 1u << DDT_JK_STRING;
    if (types & (T_INTEGER | T_NUMBER)) kinds |= 1u << DDT_JK_NUMBER;
    if (types & T_BOOLEAN) kinds |= 1u << DDT_JK_TRUE | 1u << DDT_JK_FALSE;
    if (types & T_NULL) kinds |= 1u << DDT_JK_NULL;
    s->nodes[index].kinds = kinds;
    if ((types & T_INTEGER) && !(types & T_NUMBER)) s->nodes[index].flags |= DDT_JN_INTEGER;
    if (types & (T_OBJECT | T_ARRAY)) {
        if (depth >= DDT_JSON_SCHEMA_MAX_DEPTH)
            return ddt_fail(c->err, DDT_ERR_RANGE, "the schema nests containers deeper than %d (at %s)",
                            DDT_JSON_SCHEMA_MAX_DEPTH, c->at.text);
    }
    if (types & T_OBJECT) {
        ddt_status st = compile_object(c, js, depth + 1, index);
        if (st) return st;
    }
    if (types & T_ARRAY) return compile_array(c, js, depth + 1, index);
    return DDT_OK;
}

/* Compile one sub-schema: the node it is (a new one, or a $ref's target); depth
 * counts the containers spelt above it, memo is its $ref entry or -1. */
static ddt_status compile_node(compiler *c, const json_t *js, int depth, int32_t memo, int32_t *out) {
    if (!json_is_object(js)) return ddt_fail(c->err, DDT_ERR_INVALID, "the schema at %s must be an object", c->at.text);
    if (c->frames >= MAX_FRAMES)
        return ddt_fail(c->err, DDT_ERR_RANGE, "the schema nests sub-schemas (properties, items, anyOf, $ref) deeper "
                        "than %d (at %s)", MAX_FRAMES, c->at.text);
    c->frames++;
    ddt_status st = compile_inner(c, js, depth, memo, out);
    c->frames--;
    return st;
}

/* ---- heights */

static uint8_t cap_height(unsigned h) { return h > DDT_JSON_SCHEMA_MAX_DEPTH ? DDT_JSON_SCHEMA_NO_FIT : (uint8_t)h; }

/* Each node's height: the fewest containers an instance opens, itself included
 * (json_schema.h).  The equations are cyclic under recursion; starting from
 * "none fits" and lowering until nothing changes gives the least solution, and
 * heights are capped past the limit, so few passes suffice. */
static void compute_heights(ddt_json_schema *s) {
    for (int32_t i = 0; i < s->n_nodes; i++)
        s->nodes[i].h = s->nodes[i].h_object = s->nodes[i].h_array = DDT_JSON_SCHEMA_NO_FIT;
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t i = 0; i < s->n_nodes; i++) {
            ddt_json_schema_node *n = &s->nodes[i];
            const ddt_json_schema_node *o = n, *a = n;
            if (n->flags & DDT_JN_UNION) {
                o = &s->nodes[n->alt[DDT_JK_OBJECT]];
                a = &s->nodes[n->alt[DDT_JK_ARRAY]];
            }
            unsigned ho = DDT_JSON_SCHEMA_NO_FIT, ha = DDT_JSON_SCHEMA_NO_FIT, h = DDT_JSON_SCHEMA_NO_FIT;
            if (n->kinds & (1u << DDT_JK_OBJECT)) {
                if (n->flags & DDT_JN_UNION) {
                    ho = o->h_object;
                } else {
                    unsigned m = 0;
                    for (uint16_t p = 0; p < n->count; p++)
                        if (s->prop_required[n->first + p] && s->nodes[s->prop_node[n->first + p]].h > m)
                            m = s->nodes[s->prop_node[n->first + p]].h;
                    ho = cap_height(m + 1);
                }
                h = ho;
            }
            if (n->kinds & (1u << DDT_JK_ARRAY)) {
                ha = (n->flags & DDT_JN_UNION) ? a->h_array
                                               : cap_height(1u + (n->min_items ? s->nodes[n->items].h : 0u));
                if (ha < h) h = ha;
            }
            if (n->kinds & ~(1u << DDT_JK_OBJECT | 1u << DDT_JK_ARRAY)) h = 0;
            if (ho != n->h_object || ha != n->h_array || h != n->h) {
                n->h_object = (uint8_t)ho;
                n->h_array = (uint8_t)ha;
                n->h = (uint8_t)h;
                changed = true;
            }
        }
    }
}

ddt_status ddt_json_schema_compile(const json_t *schema, ddt_json_schema **out, ddt_error *err) {
    if (!out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_json_schema_compile: NULL out");
    *out = NULL;
    if (!schema) return ddt_fail(err, DDT_ERR_INVALID, "no schema");
    compiler c = {.err = err, .doc = schema};
    c.s = calloc(1, sizeof *c.s);
    if (!c.s) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory compiling the schema");
    path_root(&c.at);
    int32_t root = 0;
    ddt_status st = DDT_OK;
    /* the root is a $ref target too ("#") */
    if (!grow((void **)&c.refs, &c.cap_refs, 1, sizeof *c.refs)) st = ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    if (!st) {
        c.refs[c.n_refs++] = (ref_entry){schema, -1};
        st = compile_node(&c, schema, 0, 0, &root);
    }
    if (!st && c.s->nodes[root].kinds != 1u << DDT_JK_OBJECT)
        st = ddt_fail(err, DDT_ERR_UNSUPPORTED, "the root schema must have \"type\": \"object\" (an object and no "
                      "other type)");
    if (!st) {
        compute_heights(c.s);
        if (c.s->nodes[root].h > DDT_JSON_SCHEMA_MAX_DEPTH)
            st = ddt_fail(err, DDT_ERR_RANGE, "every instance of the schema nests containers deeper than %d (its "
                          "required properties and minItems, through $ref)", DDT_JSON_SCHEMA_MAX_DEPTH);
    }
    free(c.refs);
    if (st) {
        ddt_json_schema_free(c.s);
        return st;
    }
    c.s->root = (uint16_t)root;
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
    s->prop_required = dup_bytes(src->prop_required, (size_t)src->n_props);
    s->strs = dup_bytes(src->strs, (size_t)src->n_strs * sizeof *s->strs);
    s->bytes = dup_bytes(src->bytes, src->n_bytes);
    if (!s->nodes || !s->names || !s->prop_node || !s->prop_required || !s->strs || !s->bytes) {
        ddt_json_schema_free(s);
        return ddt_fail(err, DDT_ERR_NOMEM, "out of memory copying a schema");
    }
    *out = s;
    return DDT_OK;
}
