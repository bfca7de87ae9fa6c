/*
 * json_vocab.c — the vocabulary trie and token masks of json_vocab.h.
 *
 * The trie is built from the tokens sorted by their bytes: each token shares
 * with the one before it the path of their common prefix, so it adds only the
 * nodes past that prefix, always as the last child of their parent, and every
 * child list comes out sorted without searching.  Tokens of more than
 * DDT_JSON_VOCAB_MAX_TOKEN bytes are left out of the trie, which bounds the mask's
 * recursion (and so its stack) whatever the tokenizer file holds; real
 * vocabularies have none that long, and a model loses nothing by spelling such
 * a run with shorter tokens.
 */
#include "text/json_vocab.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

typedef struct trie_node {
    int32_t child;     /* first child, -1: none */
    int32_t sibling;   /* next child of the same parent (larger byte), -1: none */
    int32_t tok_start; /* the ids spelt by the path to here: ids[tok_start .. + tok_count) */
    int32_t tok_count;
    uint8_t byte;      /* the edge from the parent */
} trie_node;

struct ddt_json_vocab {
    int32_t vocab;
    uint8_t *blob;     /* every token's bytes */
    size_t *off;       /* [vocab + 1]: id i is blob[off[i] .. off[i + 1]) */
    trie_node *nodes;  /* node 0 is the root (the empty prefix) */
    int32_t n_nodes;
    int32_t *ids;      /* the trie's ids in byte order */
};

typedef struct entry {
    const uint8_t *b;
    size_t len;
    int32_t id;
} entry;

static int cmp_entry(const void *pa, const void *pb) {
    const entry *a = pa, *b = pb;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = n ? memcmp(a->b, b->b, n) : 0;
    if (c) return c;
    if (a->len != b->len) return a->len < b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

void ddt_json_vocab_free(ddt_json_vocab *v) {
    if (!v) return;
    free(v->blob);
    free(v->off);
    free(v->nodes);
    free(v->ids);
    free(v);
}

int32_t ddt_json_vocab_size(const ddt_json_vocab *v) { return v ? v->vocab : 0; }

static ddt_status build_trie(ddt_json_vocab *v, ddt_error *err) {
    const int32_t vocab = v->vocab;
    size_t m = 0, total = 0;
    for (int32_t i = 0; i < vocab; i++) {
        size_t len = v->off[i + 1] - v->off[i];
        if (len > 0 && len <= DDT_JSON_VOCAB_MAX_TOKEN) m++, total += len;
    }
    if (total + 1 > (size_t)INT32_MAX) return ddt_fail(err, DDT_ERR_RANGE, "vocabulary of %zu bytes is too large", total);
    entry *es = ddt_malloc_array(m ? m : 1, sizeof *es);
    int32_t *last = ddt_malloc_array(total + 1, sizeof *last);
    v->nodes = ddt_malloc_array(total + 1, sizeof *v->nodes);
    v->ids = ddt_malloc_array(m ? m : 1, sizeof *v->ids);
    if (!es || !last || !v->nodes || !v->ids) {
        free(es);
        free(last);
        return ddt_fail(err, DDT_ERR_NOMEM, "out of memory for the JSON mask's trie (%zu tokens)", m);
    }
    m = 0;
    for (int32_t i = 0; i < vocab; i++) {
        size_t len = v->off[i + 1] - v->off[i];
        if (len > 0 && len <= DDT_JSON_VOCAB_MAX_TOKEN) es[m++] = (entry){v->blob + v->off[i], len, i};
    }
    qsort(es, m, sizeof *es, cmp_entry);
    int32_t path[DDT_JSON_VOCAB_MAX_TOKEN + 1];
    v->nodes[0] = (trie_node){-1, -1, 0, 0, 0};
    last[0] = -1;
    v->n_nodes = 1;
    path[0] = 0;
    for (size_t i = 0; i < m; i++) {
        size_t lcp = 0;
        if (i > 0) {
            size_t n = es[i].len < es[i - 1].len ? es[i].len : es[i - 1].len;
            while (lcp < n && es[i].b[lcp] == es[i - 1].b[lcp]) lcp++;
        }
        for (size_t d = lcp; d < es[i].len; d++) {
            int32_t parent = path[d], n = v->n_nodes++;
            v->nodes[n] = (trie_node){-1, -1, 0, 0, es[i].b[d]};
            last[n] = -1;
            if (last[parent] < 0) v->nodes[parent].child = n;
            else v->nodes[last[parent]].sibling = n;
            last[parent] = n;
            path[d + 1] = n;
        }
        trie_node *leaf = &v->nodes[path[es[i].len]];
        if (leaf->tok_count == 0) leaf->tok_start = (int32_t)i;
        leaf->tok_count++;
        v->ids[i] = es[i].id;
    }
    free(es);
    free(last);
    return DDT_OK;
}

ddt_status ddt_json_vocab_create_bytes(const uint8_t *const *bytes, const size_t *len, int32_t vocab,
                                       ddt_json_vocab **out, ddt_error *err) {
    if (!out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_json_vocab_create_bytes: NULL out");
    *out = NULL;
    if (!bytes || !len || vocab < 1)
        return ddt_fail(err, DDT_ERR_INVALID, "JSON vocabulary: %d ids (at least 1) and their bytes", vocab);
    ddt_json_vocab *v = calloc(1, sizeof *v);
    if (!v) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory for the JSON vocabulary");
    v->vocab = vocab;
    v->off = ddt_malloc_array((size_t)vocab + 1, sizeof *v->off);
    size_t total = 0;
    for (int32_t i = 0; i < vocab; i++) total += bytes[i] ? len[i] : 0;
    v->blob = malloc(total ? total : 1);
    if (!v->off || !v->blob) {
        ddt_json_vocab_free(v);
        return ddt_fail(err, DDT_ERR_NOMEM, "out of memory for the JSON vocabulary (%zu bytes)", total);
    }
    size_t at = 0;
    for (int32_t i = 0; i < vocab; i++) {
        v->off[i] = at;
        if (bytes[i] && len[i]) memcpy(v->blob + at, bytes[i], len[i]), at += len[i];
    }
    v->off[vocab] = at;
    ddt_status st = build_trie(v, err);
    if (st) {
        ddt_json_vocab_free(v);
        return st;
    }
    *out = v;
    return DDT_OK;
}

ddt_status ddt_json_vocab_create(const ddt_tokenizer *tok, int32_t vocab, ddt_json_vocab **out, ddt_error *err) {
    if (!out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_json_vocab_create: NULL out");
    *out = NULL;
    if (!tok || vocab < 1) return ddt_fail(err, DDT_ERR_INVALID, "JSON vocabulary: no tokenizer, or %d ids", vocab);
    const uint8_t **bytes = ddt_malloc_array((size_t)vocab, sizeof *bytes);
    size_t *len = ddt_malloc_array((size_t)vocab, sizeof *len);
    if (!bytes || !len) {
        free(bytes);
        free(len);
        return ddt_fail(err, DDT_ERR_NOMEM, "out of memory for %d tokens' bytes", vocab);
    }
    for (int32_t i = 0; i < vocab; i++)
        if (!ddt_tokenizer_text_bytes(tok, i, &bytes[i], &len[i])) bytes[i] = NULL, len[i] = 0;
    ddt_status st = ddt_json_vocab_create_bytes(bytes, len, vocab, out, err);
    free(bytes);
    free(len);
    return st;
}

/* Mark the tokens below node (whose path led to state s); depth is bounded by
 * DDT_JSON_VOCAB_MAX_TOKEN. */
static void visit(const ddt_json_vocab *v, int32_t node, const ddt_json_state *s, uint8_t *allow) {
    for (int32_t c = v->nodes[node].child; c >= 0; c = v->nodes[c].sibling) {
        const trie_node *n = &v->nodes[c];
        ddt_json_state t = *s;
        if (!ddt_json_step(&t, n->byte)) continue;
        for (int32_t k = 0; k < n->tok_count; k++) allow[v->ids[n->tok_start + k]] = 1;
        if (n->child >= 0) visit(v, c, &t, allow);
    }
}

int32_t ddt_json_vocab_mask(const ddt_json_vocab *v, const ddt_json_state *s, const int32_t *stop, int32_t n_stop,
                            uint8_t *allow) {
    memset(allow, 0, (size_t)v->vocab);
    const bool complete = ddt_json_complete(s);
    if (!complete) visit(v, 0, s, allow);
    for (int32_t i = 0; i < n_stop; i++)
        if (stop[i] >= 0 && stop[i] < v->vocab) allow[stop[i]] = complete;
    int32_t n = 0;
    for (int32_t i = 0; i < v->vocab; i++) n += allow[i];
    return n;
}

bool ddt_json_vocab_advance(const ddt_json_vocab *v, ddt_json_state *s, int32_t id) {
    if (id < 0 || id >= v->vocab) return false;
    size_t a = v->off[id], b = v->off[id + 1];
    if (a == b) return false;
    ddt_json_state t = *s;
    if (!ddt_json_feed(&t, v->blob + a, b - a)) return false;
    *s = t;
    return true;
}

/* ------------------------------------------------------------------ mask cache */

struct ddt_json_mask_cache {
    int32_t vocab, entries, used;
    ddt_json_state *key;
    uint64_t *last;   /* the lookup that last used each entry (LRU) */
    int32_t *count;
    uint8_t *masks;   /* [entries][vocab] */
    uint64_t tick;
    int64_t hits, misses;
    int32_t stop[DDT_JSON_MASK_CACHE_MAX_STOP], n_stop; /* the stop ids the masks hold (-1: none yet) */
};

ddt_status ddt_json_mask_cache_create(int32_t vocab, int32_t entries, ddt_json_mask_cache **out, ddt_error *err) {
    *out = NULL;
    if (vocab < 1 || entries < 1 || entries > 4096)
        return ddt_fail(err, DDT_ERR_INVALID, "JSON mask cache: %d masks of %d ids", entries, vocab);
    ddt_json_mask_cache *c = calloc(1, sizeof *c);
    if (!c) return ddt_fail(err, DDT_ERR_NOMEM, "JSON mask cache");
    c->vocab = vocab;
    c->entries = entries;
    c->n_stop = -1;
    c->key = ddt_calloc_array((size_t)entries, sizeof *c->key);
    c->last = ddt_calloc_array((size_t)entries, sizeof *c->last);
    c->count = ddt_calloc_array((size_t)entries, sizeof *c->count);
    c->masks = ddt_calloc_array((size_t)entries, (size_t)vocab);
    if (!c->key || !c->last || !c->count || !c->masks) {
        ddt_json_mask_cache_free(c);
        return ddt_fail(err, DDT_ERR_NOMEM, "JSON mask cache: %d masks of %d ids", entries, vocab);
    }
    *out = c;
    return DDT_OK;
}

void ddt_json_mask_cache_free(ddt_json_mask_cache *c) {
    if (!c) return;
    free(c->key);
    free(c->last);
    free(c->count);
    free(c->masks);
    free(c);
}

void ddt_json_mask_cache_clear(ddt_json_mask_cache *c) {
    if (c) c->used = 0;
}

/* The state with what the grammar never reads zeroed: the stack bits and schema
 * positions past the depth. */
static ddt_json_state cache_key(const ddt_json_state *s) {
    ddt_json_state k = *s;
    k.stack = k.depth >= 64 ? k.stack : k.stack & ((UINT64_C(1) << k.depth) - 1u);
    for (int d = k.depth; d < DDT_JSON_SCHEMA_MAX_DEPTH; d++) k.snode[d] = k.sidx[d] = 0;
    return k;
}

/* The whole state, schema position included (json_grammar.h lays it out without padding). */
static bool same_state(const ddt_json_state *a, const ddt_json_state *b) { return !memcmp(a, b, sizeof *a); }

const uint8_t *ddt_json_mask_cache_get(ddt_json_mask_cache *c, const ddt_json_vocab *v, const ddt_json_state *s,
                                       const int32_t *stop, int32_t n_stop, int32_t *count) {
    /* the masks of another stop list are another cache */
    bool same = n_stop == c->n_stop;
    for (int32_t i = 0; same && i < n_stop; i++) same = stop[i] == c->stop[i];
    if (!same) {
        c->used = 0;
        c->n_stop = n_stop <= DDT_JSON_MASK_CACHE_MAX_STOP ? n_stop : -1;
        for (int32_t i = 0; i < c->n_stop; i++) c->stop[i] = stop[i];
    }
    const ddt_json_state k = cache_key(s);
    c->tick++;
    int32_t slot = -1;
    for (int32_t i = 0; i < c->used; i++)
        if (same_state(&c->key[i], &k)) {
            slot = i;
            break;
        }
    if (slot >= 0) {
        c->hits++;
    } else {
        c->misses++;
        if (c->used < c->entries) {
            slot = c->used++;
        } else {
            slot = 0;
            for (int32_t i = 1; i < c->entries; i++)
                if (c->last[i] < c->last[slot]) slot = i;
        }
        c->key[slot] = k;
        c->count[slot] = ddt_json_vocab_mask(v, &k, stop, n_stop, c->masks + (size_t)slot * (size_t)c->vocab);
    }
    c->last[slot] = c->tick;
    *count = c->count[slot];
    return c->masks + (size_t)slot * (size_t)c->vocab;
}

void ddt_json_mask_cache_stats(const ddt_json_mask_cache *c, int64_t *hits, int64_t *misses) {
    if (hits) *hits = c ? c->hits : 0;
    if (misses) *misses = c ? c->misses : 0;
}
