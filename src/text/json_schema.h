/*
 * json_schema.h — a subset of JSON Schema compiled into a node table that the
 * JSON recogniser (json_grammar.h) follows byte by byte, for response_format
 * {"type": "json_schema"}: the token masks then allow only text that is an
 * instance of the schema, so constrained speculation stays lossless.
 *
 * The subset (anything else is refused at compile with the keyword and its
 * path, never ignored, because a dropped keyword would let through output the
 * caller's schema forbids):
 *   - the root is an object schema ("type": "object", or a "$ref" / "anyOf"
 *     that comes to one and nothing else);
 *   - "type": "object", "array", "string", "integer", "number", "boolean",
 *     "null", or a non-empty list of them without repeats (a value of any listed
 *     type; "integer" beside "number" adds nothing);
 *   - an object needs "properties" (each value a sub-schema).  Properties are
 *     written in the declared order and no others (an instance whether
 *     "additionalProperties" is false or true: only a boolean is accepted).  The
 *     ones "required" lists (only listed properties) are always written, the
 *     others may be left out, each on its own.  Without "required" every
 *     property is optional, as JSON Schema says (OpenAI's strict mode lists
 *     every property in "required", which makes them all due);
 *   - an array needs "items" (a sub-schema); "minItems" / "maxItems" bound the
 *     count (integers 0 .. DDT_JSON_SCHEMA_MAX_BOUND);
 *   - a string may have "minLength" / "maxLength" (characters, that is code
 *     points, 0 .. DDT_JSON_SCHEMA_MAX_BOUND).  Each escape counts as one
 *     character, so in such a string a \u escape of a surrogate (D800..DFFF,
 *     which Python joins in pairs) is refused: the count stays exact;
 *   - an integer is written without fraction or exponent;
 *   - "enum" (a non-empty list) or "const": JSON scalars (strings, numbers,
 *     true, false, null), each written exactly one way: a string byte for byte
 *     (so it may not contain '"', '\' or control characters, which would need
 *     escapes), a number in canonical form (an integer in decimal; a real as the
 *     shortest %g text that reads back the same double: 1.5, 1e+20, and 2.0 as
 *     2).  Beside "type", values of other types are dropped (a real with a
 *     fraction is no "integer"), beside "minLength" / "maxLength" strings of other
 *     lengths too; at least one value must remain.  Not both "enum" and "const";
 *   - "anyOf" or "oneOf": a non-empty list of sub-schemas no two of which may
 *     start a value with the same byte.  The first bytes are '{' (object), '['
 *     (array), '"' (string), '-' or a digit (number and integer), 't' and 'f'
 *     (boolean: both; const true: 't' alone), 'n' (null), so the first byte of
 *     the value picks the branch; values of such branches never match two, so
 *     oneOf's "exactly one" is anyOf's "at least one".  Branches that share a
 *     first byte (integer | number, two object shapes) are refused;
 *   - "$ref": "#" or a JSON pointer into the same document ("#/$defs/name",
 *     "#/definitions/name"; '~0' and '~1' escapes, no percent-encoding).
 *     "$defs" / "definitions" (objects of sub-schemas, anywhere) hold what it
 *     points at; a definition is compiled only where a "$ref" reaches it, once
 *     however often it is reached, so a schema may refer to itself
 *     (recursion), though not through "$ref" and "anyOf" alone without a
 *     container in between;
 *   - beside "$ref", "anyOf" or "oneOf" only the annotations below and
 *     "$defs" / "definitions" (JSON Schema would intersect anything else);
 *   - annotations, which constrain nothing: "description", "title",
 *     "$comment" (strings), "default", "examples", "$schema".
 * Property names are matched byte for byte as written, so they too may not
 * contain '"', '\' or control characters.  Containers spelt inside one another
 * nest at most DDT_JSON_SCHEMA_MAX_DEPTH deep (the recogniser's state keeps one
 * schema position a level).  Through "$ref" a document could nest deeper: the
 * recogniser opens a container (or starts an optional property, or another array
 * item) only where an instance can still be finished within that depth, its
 * required properties and minItems items included, and a schema whose every
 * instance nests deeper is refused.  A schema has at most
 * DDT_JSON_SCHEMA_MAX_NODES nodes.
 */
#ifndef DDT_TEXT_JSON_SCHEMA_H
#define DDT_TEXT_JSON_SCHEMA_H

#include <jansson.h>
#include <stdint.h>

#include "ddtree.h"

#define DDT_JSON_SCHEMA_MAX_NODES 1024
#define DDT_JSON_SCHEMA_MAX_BYTES 65536 /* property names and enum values' text together */
#define DDT_JSON_SCHEMA_MAX_BOUND 65534 /* minItems, maxItems, minLength, maxLength */
#define DDT_JSON_SCHEMA_UNBOUNDED 0xFFFF /* max_items / max_len: no maximum */
#define DDT_JSON_SCHEMA_NO_FIT 0xFF      /* a height: no instance fits the nesting limit */

/* The classes of a value's first byte; a node's kinds has bit 1 << class for each it allows. */
enum {
    DDT_JK_OBJECT, /* '{' */
    DDT_JK_ARRAY,  /* '[' */
    DDT_JK_STRING, /* '"' */
    DDT_JK_NUMBER, /* '-', '0' .. '9' */
    DDT_JK_TRUE,   /* 't' */
    DDT_JK_FALSE,  /* 'f' */
    DDT_JK_NULL,   /* 'n' */
    DDT_JK_COUNT
};

enum {
    DDT_JN_UNION = 1,    /* anyOf / oneOf: the value of class k follows node alt[k] */
    DDT_JN_INTEGER = 2,  /* numbers have neither fraction nor exponent */
    DDT_JN_STR_ENUM = 4, /* strings only from strs[str_first ..] */
    DDT_JN_NUM_ENUM = 8  /* numbers only the texts strs[num_first ..] */
};

typedef struct ddt_json_schema_node {
    uint8_t kinds;     /* the DDT_JK_* classes a value may start with (bits) */
    uint8_t flags;     /* DDT_JN_* */
    uint8_t h;         /* the fewest containers an instance opens (itself included), DDT_JSON_SCHEMA_NO_FIT: none fits */
    uint8_t h_object;  /* the same for the object form alone, and the array form alone */
    uint8_t h_array;
    uint16_t first;    /* object: its properties are names[first .. first + count) */
    uint16_t count;
    uint16_t req_end;  /* object: the properties from first + req_end on are all optional */
    uint16_t items;    /* array: the items' node */
    uint16_t min_items, max_items; /* max: DDT_JSON_SCHEMA_UNBOUNDED for none */
    uint16_t min_len, max_len;     /* string, in characters */
    uint16_t str_first, str_count; /* DDT_JN_STR_ENUM: the allowed strings, sorted by bytes */
    uint16_t num_first, num_count; /* DDT_JN_NUM_ENUM: the allowed numbers' texts, sorted by bytes */
    uint16_t alt[DDT_JK_COUNT];    /* DDT_JN_UNION: the (non-union) node of each class in kinds */
} ddt_json_schema_node;

typedef struct ddt_json_schema_str {
    uint32_t off, len; /* bytes[off .. off + len) */
} ddt_json_schema_str;

/* Read-only once compiled, so one schema may serve several states at once. */
typedef struct ddt_json_schema {
    ddt_json_schema_node *nodes;
    int32_t n_nodes;
    uint16_t root;               /* the root's node: an object, or a union of an object alone */
    ddt_json_schema_str *names;  /* property names, in declared order per object */
    uint16_t *prop_node;         /* the value schema of each property */
    uint8_t *prop_required;      /* 1: the property is in its object's "required" */
    int32_t n_props;
    ddt_json_schema_str *strs;   /* enum strings and numbers' texts */
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
