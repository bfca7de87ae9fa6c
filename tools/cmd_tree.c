/*
 * cmd_tree.c — `ddtree tree`: a tool for studying draft trees.  Reads one JSON
 * problem on stdin (a draft table to build a best-first tree or a chain from, or
 * a tree given directly; optionally the target's next token per node to walk it,
 * and a cost model for the auto budget) and writes the tree as JSON, or drawn as
 * indented text with --draw.  Bad input gives {"error": "..."} and exit 2.
 */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "ddtree.h"

#define INPUT_MAX (64u << 20) /* a table of 31 x 1024 needs well under 1 MB */

static const char k_usage[] =
    "usage: ddtree tree [--draw] < problem.json\n"
    "\n"
    "Builds a DDTree draft tree and optionally walks it.  Input (one JSON object):\n"
    "  {\"logq\": [[...], ...], \"tokens\": [[...], ...], \"budget\": B | \"auto\", \"root\": r}\n"
    "      D rows of K log-probabilities (each sorted descending) and their token ids\n"
    "  or {\"tree\": {\"tokens\": [...], \"parents\": [...]}} to give a tree directly.\n"
    "Optional: \"target_next\": [one token per node] to walk the tree; \"chain\": true for\n"
    "the DFlash chain; \"vocab\": V to check token ids; \"cost\": {\"draft\": c, \"nodes\":\n"
    "[...], \"verify\": [...] or [[...], ...], \"contexts\": [...], \"context_len\": L} and\n"
    "\"max_budget\" for budget \"auto\".\n"
    "Output: {\"tokens\", \"parents\", \"depth\", \"logw\"} (+ \"accepted\", \"bonus\" when walked).\n"
    "Options:\n"
    "  --draw    print the tree as indented text instead of JSON\n"
    "  --help    this text\n";

typedef struct problem {
    ddt_error err;
    char *text;
    json_t *root;
    float *logq;
    int32_t *table_tokens;
    int32_t *tree_tokens;
    int32_t *tree_parents;
    int32_t *target_next;
    float *cost_nodes, *cost_contexts, *cost_verify;
} problem;

static void problem_free(problem *p) {
    free(p->text);
    json_decref(p->root);
    free(p->logq);
    free(p->table_tokens);
    free(p->tree_tokens);
    free(p->tree_parents);
    free(p->target_next);
    free(p->cost_nodes);
    free(p->cost_contexts);
    free(p->cost_verify);
}

static int fail(problem *p, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err.msg, sizeof p->err.msg, fmt, ap);
    va_end(ap);
    p->err.status = DDT_ERR_INVALID;
    return -1;
}

static int read_all(FILE *f, problem *p, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    p->text = malloc(cap);
    if (!p->text) return fail(p, "out of memory reading stdin");
    for (;;) {
        if (n == cap) {
            if (cap >= INPUT_MAX) return fail(p, "input larger than %u bytes", INPUT_MAX);
            char *t = realloc(p->text, cap * 2);
            if (!t) return fail(p, "out of memory reading stdin");
            p->text = t;
            cap *= 2;
        }
        size_t got = fread(p->text + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) return fail(p, "error reading stdin");
    *len = n;
    return 0;
}

/* An int32 from a JSON integer; `what` names it in the error. */
static int get_i32(problem *p, json_t *v, const char *what, int32_t *out) {
    if (!json_is_integer(v)) return fail(p, "%s must be an integer", what);
    json_int_t x = json_integer_value(v);
    if (x < INT32_MIN || x > INT32_MAX) return fail(p, "%s = %lld is out of range", what, (long long)x);
    *out = (int32_t)x;
    return 0;
}

/* A 1-D array of integers (n <= max) into a fresh array. */
static int get_int_array(problem *p, json_t *v, const char *what, size_t max, int32_t **out,
                         size_t *n) {
    if (!json_is_array(v)) return fail(p, "%s must be an array of integers", what);
    *n = json_array_size(v);
    if (*n > max) return fail(p, "%s has %zu entries, more than %zu", what, *n, max);
    *out = malloc((*n ? *n : 1) * sizeof(int32_t));
    if (!*out) return fail(p, "out of memory");
    for (size_t i = 0; i < *n; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s[%zu]", what, i);
        if (get_i32(p, json_array_get(v, i), name, &(*out)[i])) return -1;
    }
    return 0;
}

static int get_float_array(problem *p, json_t *v, const char *what, size_t max, float **out,
                           size_t *n) {
    if (!json_is_array(v)) return fail(p, "%s must be an array of numbers", what);
    *n = json_array_size(v);
    if (*n > max) return fail(p, "%s has %zu entries, more than %zu", what, *n, max);
    *out = malloc((*n ? *n : 1) * sizeof(float));
    if (!*out) return fail(p, "out of memory");
    for (size_t i = 0; i < *n; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_number(x)) {
            free(*out); /* callers keep nothing on failure */
            *out = NULL;
            return fail(p, "%s[%zu] must be a number", what, i);
        }
        (*out)[i] = (float)json_number_value(x);
    }
    return 0;
}

/* D x K matrix of numbers (is_int = 0) or integers (is_int = 1), row-major. */
static int get_matrix(problem *p, json_t *v, const char *what, int is_int, void **out,
                      int32_t *rows, int32_t *cols) {
    if (!json_is_array(v) || json_array_size(v) == 0)
        return fail(p, "%s must be a non-empty array of rows", what);
    size_t d = json_array_size(v);
    if (d > DDT_MAX_DEPTH) return fail(p, "%s has %zu rows, more than the depth limit %d", what, d, DDT_MAX_DEPTH);
    json_t *r0 = json_array_get(v, 0);
    if (!json_is_array(r0) || json_array_size(r0) == 0)
        return fail(p, "%s[0] must be a non-empty array", what);
    size_t k = json_array_size(r0);
    if (k > DDT_MAX_TOPK) return fail(p, "%s rows have %zu entries, more than K limit %d", what, k, DDT_MAX_TOPK);
    void *m = malloc(d * k * 4);
    if (!m) return fail(p, "out of memory");
    *out = m;
    for (size_t i = 0; i < d; i++) {
        json_t *row = json_array_get(v, i);
        if (!json_is_array(row) || json_array_size(row) != k)
            return fail(p, "%s[%zu] must be an array of %zu entries like row 0", what, i, k);
        for (size_t j = 0; j < k; j++) {
            json_t *x = json_array_get(row, j);
            char name[64];
            snprintf(name, sizeof name, "%s[%zu][%zu]", what, i, j);
            if (is_int) {
                if (get_i32(p, x, name, (int32_t *)m + i * k + j)) return -1;
            } else {
                if (!json_is_number(x)) return fail(p, "%s must be a number", name);
                ((float *)m)[i * k + j] = (float)json_number_value(x);
            }
        }
    }
    *rows = (int32_t)d;
    *cols = (int32_t)k;
    return 0;
}

static int parse_cost(problem *p, json_t *c, ddt_cost_model *cm) {
    if (!json_is_object(c)) return fail(p, "cost must be an object");
    json_t *draft = json_object_get(c, "draft");
    if (!json_is_number(draft)) return fail(p, "cost.draft must be a number");
    cm->draft = (float)json_number_value(draft);
    size_t nn, nc = 1;
    if (get_float_array(p, json_object_get(c, "nodes"), "cost.nodes", 64, &p->cost_nodes, &nn)) return -1;
    cm->nodes = p->cost_nodes;
    cm->n_nodes = (int32_t)nn;
    json_t *ctx = json_object_get(c, "contexts");
    if (ctx) {
        if (get_float_array(p, ctx, "cost.contexts", 64, &p->cost_contexts, &nc)) return -1;
        cm->contexts = p->cost_contexts;
    }
    cm->n_contexts = (int32_t)nc;
    json_t *ver = json_object_get(c, "verify");
    if (!json_is_array(ver)) return fail(p, "cost.verify must be an array");
    p->cost_verify = malloc((nc * nn > 0 ? nc * nn : 1) * sizeof(float));
    if (!p->cost_verify) return fail(p, "out of memory");
    if (!ctx) {
        size_t n;
        float *row;
        if (get_float_array(p, ver, "cost.verify", 64, &row, &n)) return -1;
        memcpy(p->cost_verify, row, (n < nn ? n : nn) * sizeof(float));
        free(row);
        if (n != nn) return fail(p, "cost.verify has %zu entries, cost.nodes %zu", n, nn);
    } else {
        if (json_array_size(ver) != nc)
            return fail(p, "cost.verify must have one row per context (%zu)", nc);
        for (size_t j = 0; j < nc; j++) {
            size_t n;
            float *row;
            char name[48];
            snprintf(name, sizeof name, "cost.verify[%zu]", j);
            if (get_float_array(p, json_array_get(ver, j), name, 64, &row, &n)) return -1;
            memcpy(p->cost_verify + j * nn, row, (n < nn ? n : nn) * sizeof(float));
            free(row);
            if (n != nn) return fail(p, "%s has %zu entries, cost.nodes %zu", name, n, nn);
        }
    }
    cm->verify = p->cost_verify;
    json_t *cl = json_object_get(c, "context_len");
    if (cl && !json_is_number(cl)) return fail(p, "cost.context_len must be a number");
    cm->context_len = cl ? (float)json_number_value(cl) : 0.0f;
    if (ddt_cost_check(cm, &p->err)) return -1;
    return 0;
}

static void draw(const ddt_tree *t, int32_t node, const ddt_walk_result *w, FILE *f) {
    int accepted = 0;
    for (int32_t i = 0; w && i < w->length; i++) accepted |= w->path[i] == node;
    fprintf(f, "%*s%s[%d] token %d", 2 * t->depth[node], "", accepted ? "* " : "", node, t->token[node]);
    if (node == 0) fprintf(f, " (root)");
    else fprintf(f, "  logw %.4f", (double)t->logw[node]);
    fputc('\n', f);
    for (int32_t c = t->first_child[node]; c >= 0; c = t->next_sibling[c]) draw(t, c, w, f);
}

static json_t *int_array(const int32_t *v, int32_t n) {
    json_t *a = json_array();
    for (int32_t i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

static int run(problem *p, int draw_text) {
    size_t len = 0;
    if (read_all(stdin, p, &len)) return -1;
    json_error_t jerr;
    p->root = json_loadb(p->text, len, 0, &jerr);
    if (!p->root) return fail(p, "JSON: line %d column %d: %s", jerr.line, jerr.column, jerr.text);
    if (!json_is_object(p->root)) return fail(p, "input must be a JSON object");

    int32_t vocab = 0;
    json_t *jv = json_object_get(p->root, "vocab");
    if (jv) {
        if (get_i32(p, jv, "vocab", &vocab)) return -1;
        if (vocab < 1) return fail(p, "vocab must be >= 1");
    }

    ddt_tree tree;
    if (ddt_tree_alloc(DDT_MAX_NODES, &tree, &p->err)) return -1;
    int rc = -1;
    ddt_builder *b = NULL;
    json_t *jtree = json_object_get(p->root, "tree");
    if (jtree) {
        if (!json_is_object(jtree)) { fail(p, "tree must be an object"); goto out; }
        size_t nt, np;
        if (get_int_array(p, json_object_get(jtree, "tokens"), "tree.tokens", DDT_MAX_NODES, &p->tree_tokens, &nt)) goto out;
        if (get_int_array(p, json_object_get(jtree, "parents"), "tree.parents", DDT_MAX_NODES, &p->tree_parents, &np)) goto out;
        if (nt != np) { fail(p, "tree.tokens has %zu entries but tree.parents %zu", nt, np); goto out; }
        if (nt == 0) { fail(p, "tree must have at least the root"); goto out; }
        if (ddt_tree_from_parents(p->tree_tokens, p->tree_parents, (int32_t)nt, vocab, &tree, &p->err)) goto out;
    } else {
        ddt_draft_table tb;
        int32_t rows, cols, rows2, cols2;
        json_t *jl = json_object_get(p->root, "logq"), *jt = json_object_get(p->root, "tokens");
        if (!jl || !jt) { fail(p, "input needs \"logq\" and \"tokens\", or \"tree\""); goto out; }
        if (get_matrix(p, jl, "logq", 0, (void **)&p->logq, &rows, &cols)) goto out;
        if (get_matrix(p, jt, "tokens", 1, (void **)&p->table_tokens, &rows2, &cols2)) goto out;
        if (rows != rows2 || cols != cols2) {
            fail(p, "logq is %d x %d but tokens is %d x %d", rows, cols, rows2, cols2);
            goto out;
        }
        tb = (ddt_draft_table){rows, cols, p->logq, p->table_tokens};
        int32_t root = 0;
        json_t *jr = json_object_get(p->root, "root");
        if (jr && get_i32(p, jr, "root", &root)) goto out;
        json_t *jb = json_object_get(p->root, "budget");
        json_t *jc = json_object_get(p->root, "chain");
        if (jc && !json_is_boolean(jc)) { fail(p, "chain must be true or false"); goto out; }
        int32_t budget = 0;
        int is_auto = 0;
        if (!jb) { fail(p, "budget is missing (a node count, or \"auto\")"); goto out; }
        if (json_is_string(jb) && !strcmp(json_string_value(jb), "auto")) is_auto = 1;
        else if (get_i32(p, jb, "budget", &budget)) { fail(p, "budget must be a node count or \"auto\""); goto out; }
        if (!is_auto && (budget < 0 || budget > DDT_MAX_BUDGET)) {
            fail(p, "budget %d outside 0..%d", budget, DDT_MAX_BUDGET);
            goto out;
        }
        if (jc && json_is_true(jc)) {
            if (is_auto) { fail(p, "budget \"auto\" applies to trees, not chains"); goto out; }
            if (ddt_tree_build_chain(&tb, root, budget, vocab, &tree, &p->err)) goto out;
        } else {
            ddt_cost_model cm = {0};
            if (is_auto) {
                json_t *jcost = json_object_get(p->root, "cost");
                if (!jcost) { fail(p, "budget \"auto\" needs a \"cost\" object"); goto out; }
                if (parse_cost(p, jcost, &cm)) goto out;
                budget = DDT_MAX_BUDGET;
                json_t *jm = json_object_get(p->root, "max_budget");
                if (jm && get_i32(p, jm, "max_budget", &budget)) goto out;
                if (budget < 0 || budget > DDT_MAX_BUDGET) {
                    fail(p, "max_budget %d outside 0..%d", budget, DDT_MAX_BUDGET);
                    goto out;
                }
            }
            if (ddt_builder_create(DDT_MAX_BUDGET, &b, &p->err)) goto out;
            if (ddt_tree_build(b, &tb, root, budget, is_auto ? &cm : NULL, vocab, &tree, &p->err)) goto out;
        }
    }

    ddt_walk_result walk;
    int walked = 0;
    json_t *jn = json_object_get(p->root, "target_next");
    if (jn) {
        size_t n;
        if (get_int_array(p, jn, "target_next", DDT_MAX_NODES, &p->target_next, &n)) goto out;
        if (n != (size_t)tree.n_nodes) {
            fail(p, "target_next has %zu entries but the tree has %d nodes (one per node, root first)",
                 n, tree.n_nodes);
            goto out;
        }
        if (ddt_tree_walk(&tree, p->target_next, vocab, &walk, &p->err)) goto out;
        walked = 1;
    }

    if (draw_text) {
        draw(&tree, 0, walked ? &walk : NULL, stdout);
        if (walked) printf("accepted %d node(s), bonus token %d\n", walk.length, walk.bonus);
    } else {
        json_t *o = json_object();
        json_object_set_new(o, "tokens", int_array(tree.token, tree.n_nodes));
        json_object_set_new(o, "parents", int_array(tree.parent, tree.n_nodes));
        json_object_set_new(o, "depth", int_array(tree.depth, tree.n_nodes));
        json_t *lw = json_array();
        for (int32_t i = 0; i < tree.n_nodes; i++) json_array_append_new(lw, json_real(tree.logw[i]));
        json_object_set_new(o, "logw", lw);
        if (walked) {
            json_object_set_new(o, "accepted", int_array(walk.path, walk.length));
            json_object_set_new(o, "bonus", json_integer(walk.bonus));
        }
        char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
        json_decref(o);
        if (!s) { fail(p, "out of memory writing JSON"); goto out; }
        puts(s);
        free(s);
    }
    rc = 0;
out:
    ddt_builder_destroy(b);
    ddt_tree_free(&tree);
    return rc;
}

int ddt_cmd_tree(int argc, char **argv) {
    int draw_text = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--draw")) draw_text = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(k_usage, stdout);
            return 0;
        } else {
            fprintf(stderr, "ddtree tree: unknown option '%s'\n%s", argv[i], k_usage);
            return 2;
        }
    }
    problem p;
    memset(&p, 0, sizeof p);
    int rc = run(&p, draw_text);
    if (rc) {
        json_t *o = json_pack("{s:s}", "error", p.err.msg[0] ? p.err.msg : "unknown error");
        char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
        puts(s ? s : "{\"error\": \"out of memory\"}");
        free(s);
        json_decref(o);
    }
    problem_free(&p);
    return rc ? 2 : 0;
}
