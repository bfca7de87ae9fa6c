/*
 * json_schema.h — a small subset of JSON Schema compiled into a node table that
 * the JSON recogniser (json_grammar.h) follows byte by byte, for
 * response_format {"type": "json_schema"}: the token masks then allow only text
 * that is an instance of the schema, so constrained speculation stays lossless.
 *
 * The subset (anything else is refused at compile with the keyword and its
 * path, never ignored, because a dropped keyword would let through output the
 * caller's schema forbids):
 *   - the root is {"type": "object", ...};
 *   - "type": "object" with "properties" (each value a sub-schema).  Every listed
 *     property is emitted, in the declared order, and nothing else: that is an
 *     instance whatever "required" lists (which may name only listed properties)
 *     and whether "additionalProperties" is false or true (only a boolean);
 *   - "type": "array" with "items" (a sub-schema; any number of items);
 *   - "type": "string", "integer" (no fraction or exponent), "number",
 *     "boolean", "null";
 *   - "enum": a non-empty list of strings (with or without "type": "string");
 *   - "description" and "title", which constrain nothing.
 * Property names and enum strings are matched byte for byte as written, so they
 * may not contain '"', '\' or control characters (the model could spell them
 * with escapes, which the matcher does not follow).  Containers nest at most
 * DDT_JSON_SCHEMA_MAX_DEPTH deep (the recogniser's state keeps one schema
 * position a level), and a schema has at most DDT_JSON_SCHEMA_MAX_NODES nodes.
 */
#ifndef DDT_TEXT_JSON_SCHEMA_H
#define DDT_TEXT_JSON_SCHEMA_H

#include <jansson.h>
#include <stdint.h>

#include "ddtree.h"

#define DDT_JSON_SCHEMA_MAX_NODES 1024
#define DDT_JSON_SCHEMA_MAX_BYTES 65536 /* property names and enum strings together */

enum {
    DDT_JS_OBJECT,
    DDT_JS_ARRAY,
    DDT_JS_STRING,
    DDT_JS_INTEGER,
    DDT_JS_NUMBER,
    DDT_JS_BOOLEAN,
    DDT_JS_NULL,
    DDT_JS_ENUM
};

typedef struct ddt_json_schema_node {
    uint8_t type;    /* DDT_JS_* */
    uint16_t first;  /* object: its properties are props[first ..]; enum: strs[first ..]; array: the items node */
    uint16_t count;  /* object: properties; enum: strings (sorted by bytes) */
} ddt_json_schema_node;

typedef struct ddt_json_schema_str {
    uint32_t off, len; /* bytes[off .. off + len) */
} ddt_json_schema_str;

/* Read-only once compiled, so one schema may serve several states at once. */
typedef struct ddt_json_schema {
    ddt_json_schema_node *nodes; /* node 0 is the root */
    int32_t n_nodes;
    ddt_json_schema_str *names;  /* property names, in declared order per object */
    uint16_t *prop_node;         /* the value schema of each property */
    int32_t n_props;
    ddt_json_schema_str *strs;   /* enum strings */
    int32_t n_strs;
    char *bytes;
    uint32_t n_bytes;
} ddt_json_schema;

/*
 * Compile schema (the value of json_schema.schema).  DDT_ERR_UNSUPPORTED for a
 * keyword or form outside the subset and DDT_ERR_INVALID for a malformed one, with
 * a message naming the keyword and its path ("$.properties.age"); DDT_ERR_RANGE
 * past the size limits.  *out is NULL on failure.
 */
ddt_status ddt_json_schema_compile(const json_t *schema, ddt_json_schema **out, ddt_error *err);

/* A deep copy of src into *out (for another owner; a schema is otherwise read-only). */
ddt_status ddt_json_schema_copy(const ddt_json_schema *src, ddt_json_schema **out, ddt_error *err);

void ddt_json_schema_free(ddt_json_schema *s);

#endif
