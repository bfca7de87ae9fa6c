/*
 * test_engine_json.c — JSON-constrained decoding (ddt_engine_set_constraint) on
 * the shipped pair (models/pystdlib-target, models/pystdlib-dflash): greedy ar,
 * chain and tree output are the same ids, their text steps the recogniser
 * (json_grammar.h) from the first byte, and a document ended by the stop id is a
 * JSON object that Jansson parses; at T > 0 every mode's output is grammatical;
 * the constraint off again gives the unconstrained output; and the clear errors
 * (a vocabulary of the wrong size, no stop id).  With a compiled schema
 * (json_schema.h) the greedy modes still agree and the text steps the schema's
 * recogniser, so a finished document is an instance.
 */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "text/json_schema.h"

#include "engine/engine.h"
#include "text/json_vocab.h"
#include "text/tokenizer.h"

#define N_GEN 160
#define EOS 4097 /* the shipped target's eos_token_id */

static char g_target[1024], g_draft[1024];

typedef struct fixture {
    ddt_engine *e;
    ddt_tokenizer *tok;
    ddt_json_vocab *v;
} fixture;

static int setup(void **state) {
    snprintf(g_target, sizeof g_target, "%s/models/pystdlib-target", DDT_SOURCE_DIR);
    snprintf(g_draft, sizeof g_draft, "%s/models/pystdlib-dflash", DDT_SOURCE_DIR);
    fixture *f = calloc(1, sizeof *f);
    ddt_engine_options o;
    memset(&o, 0, sizeof o);
    o.mode = DDT_MODE_TREE;
    o.budget = 16;
    o.reserve_budget = 16;
    o.draft_dir = g_draft;
    o.sampling.top_p = 1.0f;
    o.n_threads = 2;
    ddt_error err = {0};
    if (ddt_engine_create(g_target, &o, &f->e, &err) != DDT_OK) fail_msg("create: %s", err.msg);
    if (ddt_tokenizer_load(g_target, &f->tok, &err) != DDT_OK) fail_msg("tokenizer: %s", err.msg);
    if (ddt_json_vocab_create(f->tok, ddt_engine_vocab(f->e), &f->v, &err) != DDT_OK) fail_msg("vocab: %s", err.msg);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    ddt_json_vocab_free(f->v);
    ddt_tokenizer_free(f->tok);
    ddt_engine_free(f->e);
    free(f);
    return 0;
}

typedef struct run {
    int32_t ids[N_GEN], n;
    ddt_stop_reason why;
    int32_t rounds;
    int64_t nodes; /* verified, the roots included */
} run;

static void gen(fixture *f, const char *prompt, ddt_mode mode, int32_t max_new, run *r) {
    ddt_error err = {0};
    if (ddt_engine_set_speculation(f->e, mode, 16, false, &err)) fail_msg("speculation: %s", err.msg);
    int32_t ids[256];
    size_t n;
    if (ddt_tokenizer_encode(f->tok, prompt, strlen(prompt), 0, ids, 256, &n, &err)) fail_msg("encode: %s", err.msg);
    const int32_t stop = EOS;
    ddt_gen_stats st;
    if (ddt_engine_generate(f->e, ids, (int32_t)n, max_new, &stop, 1, r->ids, &r->n, NULL, NULL, &st, &err))
        fail_msg("generate (%s): %s", ddt_mode_name(mode), err.msg);
    r->why = st.stop_reason;
    r->rounds = st.rounds;
    r->nodes = st.nodes_verified;
}

/* The output's text steps the grammar byte by byte; a stop id ends a complete object. */
static void check_json(const fixture *f, const run *r, bool *complete) {
    char text[N_GEN * 64];
    size_t len = 0;
    ddt_json_state s;
    ddt_json_init(&s, true);
    *complete = false;
    for (int32_t i = 0; i < r->n; i++) {
        if (r->ids[i] == EOS) {
            assert_int_equal(i, r->n - 1);
            assert_true(ddt_json_complete(&s));
            *complete = true;
            break;
        }
        const uint8_t *b;
        size_t bl;
        if (!ddt_tokenizer_text_bytes(f->tok, r->ids[i], &b, &bl)) fail_msg("token %d has no text", r->ids[i]);
        if (!ddt_json_feed(&s, b, bl)) fail_msg("token %d (%.*s) breaks the grammar", r->ids[i], (int)bl, b);
        memcpy(text + len, b, bl);
        len += bl;
    }
    if (getenv("DDT_TEST_SHOW")) printf("%s %d tokens: %.*s\n", *complete ? "complete" : "cut", r->n, (int)len, text);
    if (*complete) {
        json_error_t je;
        json_t *j = json_loadb(text, len, 0, &je);
        if (!j) fail_msg("Jansson refuses the document: %s: %.*s", je.text, (int)len, text);
        assert_true(json_is_object(j));
        json_decref(j);
    }
}

static const char *const prompts[] = {
    "import json\n\nCONFIG = json.loads('",
    "def to_dict(self):\n    return ",
    "# settings\nDEFAULTS = ",
    "CONFIG = {\"name\": \"json\", \"version\": 2, \"debug\": false}\nDEFAULTS = ",
    "_escapes = {\"\\n\": \"n\", \"\\t\": \"t\", \"\\\\\": \"\\\\\"}\n_other = ",
    "data = {'a': [1, 2, 3], 'b': {'c': None}}\nexpected = ",
};

static void test_greedy_modes_agree(void **state) {
    fixture *f = *state;
    ddt_error err = {0};
    ddt_json_constraint c = {f->v, true, NULL};
    if (ddt_engine_set_constraint(f->e, &c, &err)) fail_msg("constraint: %s", err.msg);
    int complete = 0, spec_rounds = 0, tokens = 0;
    int64_t tree_nodes = 0, tree_rounds = 0;
    for (size_t p = 0; p < sizeof prompts / sizeof *prompts; p++) {
        run ar, chain, tree;
        gen(f, prompts[p], DDT_MODE_AR, N_GEN, &ar);
        gen(f, prompts[p], DDT_MODE_CHAIN, N_GEN, &chain);
        gen(f, prompts[p], DDT_MODE_TREE, N_GEN, &tree);
        assert_int_equal(ar.n, chain.n);
        assert_int_equal(ar.n, tree.n);
        assert_memory_equal(ar.ids, chain.ids, (size_t)ar.n * sizeof(int32_t));
        assert_memory_equal(ar.ids, tree.ids, (size_t)ar.n * sizeof(int32_t));
        assert_int_equal(ar.why, tree.why);
        bool done;
        check_json(f, &ar, &done);
        complete += done;
        spec_rounds += tree.rounds;
        tokens += tree.n;
        tree_nodes += tree.nodes;
        tree_rounds += tree.rounds;
        /* a cut document ends for the length, never with a stop id */
        run cut;
        gen(f, prompts[p], DDT_MODE_TREE, 5, &cut);
        assert_int_equal(cut.n, ar.n < 5 ? ar.n : 5);
        assert_memory_equal(cut.ids, ar.ids, (size_t)cut.n * sizeof(int32_t));
    }
    /* the point of the test: some documents finish, and trees accept more than one token a round */
    assert_true(complete >= 1);
    assert_true(spec_rounds < tokens);
    /* draft nodes the grammar refuses are pruned before the verify (a 16-node tree of this
       depth-15 drafter always fills its budget unpruned: 17 rows a round with the root) */
    if (getenv("DDT_TEST_SHOW")) printf("tree: %lld rows in %lld rounds\n", (long long)tree_nodes, (long long)tree_rounds);
    assert_true(tree_nodes < 17 * tree_rounds);
    assert_int_equal(ddt_engine_set_constraint(f->e, NULL, &err), DDT_OK);
    /* unconstrained, nothing is pruned: every round verifies the whole budget */
    run plain;
    gen(f, prompts[0], DDT_MODE_TREE, 40, &plain);
    assert_int_equal(plain.nodes, 17 * (int64_t)plain.rounds);
}

static void test_sampled_is_grammatical(void **state) {
    fixture *f = *state;
    ddt_error err = {0};
    ddt_json_constraint c = {f->v, true, NULL};
    assert_int_equal(ddt_engine_set_constraint(f->e, &c, &err), DDT_OK);
    const ddt_mode modes[3] = {DDT_MODE_AR, DDT_MODE_CHAIN, DDT_MODE_TREE};
    for (uint64_t seed = 1; seed <= 3; seed++)
        for (int m = 0; m < 3; m++) {
            ddt_sampling s = {.temperature = 1.0f, .top_p = 1.0f, .seed = seed};
            assert_int_equal(ddt_engine_set_sampling(f->e, &s, &err), DDT_OK);
            run r;
            gen(f, prompts[seed % 3], modes[m], N_GEN, &r);
            bool done;
            check_json(f, &r, &done);
        }
    ddt_sampling greedy = {.temperature = 0.0f, .top_p = 1.0f};
    assert_int_equal(ddt_engine_set_sampling(f->e, &greedy, &err), DDT_OK);
    assert_int_equal(ddt_engine_set_constraint(f->e, NULL, &err), DDT_OK);
}

static void test_off_again_and_errors(void **state) {
    fixture *f = *state;
    ddt_error err = {0};
    run plain, json, again;
    gen(f, prompts[1], DDT_MODE_TREE, 40, &plain);
    ddt_json_constraint c = {f->v, true, NULL};
    assert_int_equal(ddt_engine_set_constraint(f->e, &c, &err), DDT_OK);
    gen(f, prompts[1], DDT_MODE_TREE, 40, &json);
    /* the unconstrained model does not write a JSON object here, or the test shows nothing */
    assert_true(plain.n != json.n || memcmp(plain.ids, json.ids, (size_t)plain.n * sizeof(int32_t)) != 0);
    assert_int_equal(ddt_engine_set_constraint(f->e, NULL, &err), DDT_OK);
    gen(f, prompts[1], DDT_MODE_TREE, 40, &again);
    assert_int_equal(plain.n, again.n);
    assert_memory_equal(plain.ids, again.ids, (size_t)plain.n * sizeof(int32_t));
    /* no stop id: a finished document could not end */
    assert_int_equal(ddt_engine_set_constraint(f->e, &c, &err), DDT_OK);
    int32_t p[2] = {261, 809}, out[4], n;
    assert_int_equal(ddt_engine_generate(f->e, p, 2, 4, NULL, 0, out, &n, NULL, NULL, NULL, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "stop id"));
    assert_int_equal(ddt_engine_set_constraint(f->e, NULL, &err), DDT_OK);
    /* a vocabulary built for another model */
    ddt_json_vocab *small;
    assert_int_equal(ddt_json_vocab_create(f->tok, 100, &small, &err), DDT_OK);
    ddt_json_constraint bad = {small, true, NULL};
    assert_int_equal(ddt_engine_set_constraint(f->e, &bad, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "vocabulary of 100 ids"));
    ddt_json_vocab_free(small);
}

/* The same under a schema: the modes agree, and the text is a prefix of an
 * instance (every byte steps the schema's recogniser), complete when it ends. */
static void test_schema_greedy_modes_agree(void **state) {
    fixture *f = *state;
    ddt_error err = {0};
    json_error_t je;
    json_t *js = json_loads("{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, "
                            "\"n\": {\"type\": \"integer\"}, \"ok\": {\"type\": \"boolean\"}, "
                            "\"kind\": {\"enum\": [\"a\", \"bc\"]}}}", 0, &je);
    assert_non_null(js);
    ddt_json_schema *sc = NULL;
    if (ddt_json_schema_compile(js, &sc, &err)) fail_msg("compile: %s", err.msg);
    json_decref(js);
    ddt_json_constraint c = {f->v, true, sc};
    if (ddt_engine_set_constraint(f->e, &c, &err)) fail_msg("constraint: %s", err.msg);
    for (size_t p = 0; p < sizeof prompts / sizeof *prompts; p++) {
        run ar, tree;
        gen(f, prompts[p], DDT_MODE_AR, N_GEN, &ar);
        gen(f, prompts[p], DDT_MODE_TREE, N_GEN, &tree);
        assert_int_equal(ar.n, tree.n);
        assert_memory_equal(ar.ids, tree.ids, (size_t)ar.n * sizeof(int32_t));
        ddt_json_state s;
        ddt_json_init_schema(&s, sc);
        for (int32_t i = 0; i < ar.n; i++) {
            if (ar.ids[i] == EOS) {
                assert_true(ddt_json_complete(&s));
                break;
            }
            const uint8_t *b;
            size_t bl;
            if (!ddt_tokenizer_text_bytes(f->tok, ar.ids[i], &b, &bl)) fail_msg("token %d has no text", ar.ids[i]);
            if (!ddt_json_feed(&s, b, bl)) fail_msg("token %d (%.*s) breaks the schema", ar.ids[i], (int)bl, b);
        }
    }
    assert_int_equal(ddt_engine_set_constraint(f->e, NULL, &err), DDT_OK);
    ddt_json_schema_free(sc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_modes_agree),
        cmocka_unit_test(test_sampled_is_grammatical),
        cmocka_unit_test(test_off_again_and_errors),
        cmocka_unit_test(test_schema_greedy_modes_agree),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
