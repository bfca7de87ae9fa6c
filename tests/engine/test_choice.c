/*
 * test_choice.c — the target's choice under logit rules and the JSON constraint
 * (engine/choice.h) on a small byte vocabulary, without a model:
 *   - the state table of a tree built without the grammar (ddt_choice_tree_states,
 *     what the one-GPU engine's host walk reads): every allowed node holds the
 *     state after its path, stepped by hand here; a refused node (and anything
 *     under it) holds its parent's; the predicate ddt_choice_allows agrees;
 *   - the masked choice takes the best allowed id, a stop id only once the
 *     document is complete, and an exhausted grammar is a clear error;
 *   - a node's draft path counts as generated under the penalties (the same row
 *     gives another token at a node whose path used the best id);
 *   - the errors: a constraint without a stop id, a taken token the grammar
 *     refuses; the active flag follows set / clear.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/error.h"
#include "engine/choice.h"
#include "text/json_grammar.h"
#include "text/json_vocab.h"

/* ids: 0 "{", 1 "}", 2 "\"a\"", 3 ":", 4 "1", 5 " ", 6 "x", 7 ",", 8 the stop id (no bytes) */
enum { V = 9, OPEN = 0, CLOSE = 1, KEY = 2, COLON = 3, ONE = 4, SPACE = 5, X = 6, COMMA = 7, EOS = 8 };
static const char *const spell[V] = {"{", "}", "\"a\"", ":", "1", " ", "x", ",", ""};
static const int32_t stop_ids[1] = {EOS};

typedef struct fixture {
    ddt_json_vocab *v;
    ddt_sampler *smp;
    ddt_choice c;
    ddt_tree t;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    const uint8_t *bytes[V];
    size_t len[V];
    for (int i = 0; i < V; i++) bytes[i] = (const uint8_t *)spell[i], len[i] = strlen(spell[i]);
    ddt_error err = {0};
    if (ddt_json_vocab_create_bytes(bytes, len, V, &f->v, &err)) fail_msg("vocab: %s", err.msg);
    if (ddt_sampler_create(V, &f->smp, &err)) fail_msg("sampler: %s", err.msg);
    if (ddt_tree_alloc(16, &f->t, &err)) fail_msg("tree: %s", err.msg);
    ddt_choice_init(&f->c, V, f->t.capacity);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    ddt_choice_free(&f->c);
    ddt_tree_free(&f->t);
    ddt_sampler_destroy(f->smp);
    ddt_json_vocab_free(f->v);
    free(f);
    return 0;
}

static void set_json(fixture *f) {
    ddt_error err = {0};
    const ddt_json_constraint jc = {f->v, true, NULL};
    assert_int_equal(ddt_choice_set_constraint(&f->c, &jc, &err), DDT_OK);
    const int32_t prompt[2] = {X, X};
    assert_int_equal(ddt_choice_start(&f->c, prompt, 2, stop_ids, 1, &err), DDT_OK);
}

/* state s stepped by id (which the grammar must take) */
static ddt_json_state step(const ddt_json_vocab *v, ddt_json_state s, int32_t id) {
    assert_true(ddt_json_vocab_advance(v, &s, id));
    return s;
}

static void test_tree_states(void **state) {
    fixture *f = *state;
    set_json(f);
    ddt_error err = {0};
    const int32_t open = OPEN;
    assert_int_equal(ddt_choice_take(&f->c, &open, 1, &err), DDT_OK); /* the root, emitted */
    /* node: 0 root "{", 1 "\"a\"", 2 "x" (refused), 3 ":" under 1, 4 "}" (complete), 5 "1" under 3,
       6 the stop id under 4 (taken: complete), 7 "1" under 2, 8 the stop id under 1 (refused:
       incomplete), 9 "," under 4 (refused: nothing after a complete document) */
    const int32_t tok[10] = {OPEN, KEY, X, COLON, CLOSE, ONE, EOS, ONE, EOS, COMMA};
    const int32_t par[10] = {-1, 0, 0, 1, 0, 3, 4, 2, 1, 4};
    assert_int_equal(ddt_tree_from_parents(tok, par, 10, V, &f->t, &err), DDT_OK);
    ddt_choice_tree_states(&f->c, &f->t);
    ddt_json_state e[10];
    e[0] = f->c.jstate;
    e[1] = step(f->v, e[0], KEY);
    e[2] = e[0];
    e[3] = step(f->v, e[1], COLON);
    e[4] = step(f->v, e[0], CLOSE);
    e[5] = step(f->v, e[3], ONE);
    e[6] = e[4];
    e[7] = e[2];
    e[8] = e[1];
    e[9] = e[4];
    assert_true(ddt_json_complete(&e[4]));
    for (int i = 0; i < 10; i++)
        if (memcmp(&e[i], &f->c.pst[i], sizeof e[i])) fail_msg("node %d: the state is not its path's", i);
    /* the predicate: the allowed ones above, stepping the slot it is given */
    const bool allowed[10] = {true, true, false, true, true, true, true, false, false, false};
    for (int i = 1; i < 10; i++)
        assert_int_equal(ddt_choice_allows(&f->c, par[i], i, tok[i]), allowed[i]);
}

static void test_masked_pick(void **state) {
    fixture *f = *state;
    set_json(f);
    ddt_error err = {0};
    const ddt_sampling greedy = {0.0f, 0, 1.0f, 3};
    float row[V];
    for (int i = 0; i < V; i++) row[i] = (float)i * 0.1f;
    row[X] = 9.0f;
    row[EOS] = 8.0f;
    row[SPACE] = 7.5f; /* no whitespace before the document */
    row[OPEN] = 1.0f;
    int32_t tok = -1;
    /* at the start only "{" opens an object: x, the stop id and the space are refused */
    assert_int_equal(ddt_choice_pick(&f->c, f->smp, &greedy, row, &f->c.jstate, NULL, 0, 0, 0, &tok, &err), DDT_OK);
    assert_int_equal(tok, OPEN);
    assert_float_equal(row[X], 9.0f, 0.0f); /* the row itself is left as it was */
    /* after "{}": only the stop id (or whitespace) */
    const int32_t doc[2] = {OPEN, CLOSE};
    assert_int_equal(ddt_choice_take(&f->c, doc, 2, &err), DDT_OK);
    row[SPACE] = -1.0f;
    assert_int_equal(ddt_choice_pick(&f->c, f->smp, &greedy, row, &f->c.jstate, NULL, 0, 0, 0, &tok, &err), DDT_OK);
    assert_int_equal(tok, EOS);
    /* at T = 1 every draw is allowed */
    const ddt_sampling hot = {1.0f, 0, 1.0f, 5};
    set_json(f);
    for (uint32_t node = 0; node < 64; node++) {
        assert_int_equal(ddt_choice_pick(&f->c, f->smp, &hot, row, &f->c.jstate, NULL, 0, 1, node, &tok, &err),
                         DDT_OK);
        assert_int_equal(tok, OPEN);
    }
    /* a state no id continues: a vocabulary of "x" only */
    const uint8_t *xb[2] = {(const uint8_t *)"x", (const uint8_t *)"x"};
    const size_t xl[2] = {1, 1};
    ddt_json_vocab *xv;
    assert_int_equal(ddt_json_vocab_create_bytes(xb, xl, 2, &xv, &err), DDT_OK);
    ddt_choice c2;
    ddt_choice_init(&c2, 2, 4);
    const ddt_json_constraint jc = {xv, false, NULL};
    assert_int_equal(ddt_choice_set_constraint(&c2, &jc, &err), DDT_OK);
    const int32_t stop1[1] = {1};
    assert_int_equal(ddt_choice_start(&c2, doc, 1, stop1, 1, &err), DDT_OK);
    assert_int_equal(ddt_choice_pick(&c2, f->smp, &greedy, row, &c2.jstate, NULL, 0, 0, 0, &tok, &err),
                     DDT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "no token"));
    ddt_choice_free(&c2);
    ddt_json_vocab_free(xv);
}

static void test_path_counts(void **state) {
    fixture *f = *state;
    ddt_error err = {0};
    const ddt_logit_rules rules = {NULL, NULL, 0, 2.0f, 0.0f, 0.0f}; /* presence 2 */
    assert_int_equal(ddt_choice_set_rules(&f->c, &rules, &err), DDT_OK);
    assert_true(ddt_choice_active(&f->c));
    const int32_t prompt[1] = {ONE}; /* the prompt does not count */
    assert_int_equal(ddt_choice_start(&f->c, prompt, 1, NULL, 0, &err), DDT_OK);
    /* a chain root -> "1" -> "," */
    const int32_t tok[3] = {X, ONE, COMMA};
    const int32_t par[3] = {-1, 0, 1};
    assert_int_equal(ddt_tree_from_parents(tok, par, 3, V, &f->t, &err), DDT_OK);
    const ddt_sampling greedy = {0.0f, 0, 1.0f, 3};
    float row[V];
    for (int i = 0; i < V; i++) row[i] = 0.0f;
    row[ONE] = 3.0f;
    row[SPACE] = 2.0f;
    int32_t at0, at1, at2;
    assert_int_equal(ddt_choice_pick_node(&f->c, f->smp, &greedy, &f->t, row, 0, 1, &at0, &err), DDT_OK);
    assert_int_equal(ddt_choice_pick_node(&f->c, f->smp, &greedy, &f->t, row, 1, 1, &at1, &err), DDT_OK);
    assert_int_equal(ddt_choice_pick_node(&f->c, f->smp, &greedy, &f->t, row, 2, 1, &at2, &err), DDT_OK);
    assert_int_equal(at0, ONE);   /* nothing generated yet */
    assert_int_equal(at1, SPACE); /* its path generated "1": 3 - 2 < 2 */
    assert_int_equal(at2, SPACE);
    /* once "1" is emitted the root's choice moves too; the path was taken out again */
    const int32_t one = ONE;
    assert_int_equal(ddt_choice_take(&f->c, &one, 1, &err), DDT_OK);
    assert_int_equal(ddt_choice_pick_node(&f->c, f->smp, &greedy, &f->t, row, 0, 2, &at0, &err), DDT_OK);
    assert_int_equal(at0, SPACE);
    assert_int_equal(ddt_choice_set_rules(&f->c, NULL, &err), DDT_OK);
    assert_false(ddt_choice_active(&f->c));
}

static void test_errors(void **state) {
    fixture *f = *state;
    ddt_error err = {0};
    const ddt_json_constraint jc = {f->v, true, NULL};
    assert_int_equal(ddt_choice_set_constraint(&f->c, &jc, &err), DDT_OK);
    assert_true(ddt_choice_active(&f->c));
    const int32_t prompt[1] = {X};
    assert_int_equal(ddt_choice_start(&f->c, prompt, 1, NULL, 0, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "stop id"));
    assert_int_equal(ddt_choice_start(&f->c, prompt, 1, stop_ids, 1, &err), DDT_OK);
    const int32_t bad = COLON; /* no document opens with ":" */
    assert_int_equal(ddt_choice_take(&f->c, &bad, 1, &err), DDT_ERR_INTERNAL);
    assert_non_null(strstr(err.msg, "token 3"));
    /* a stop id is taken and leaves the state */
    ddt_json_state before = f->c.jstate;
    const int32_t eos = EOS;
    assert_int_equal(ddt_choice_take(&f->c, &eos, 1, &err), DDT_OK);
    assert_memory_equal(&before, &f->c.jstate, sizeof before);
    assert_int_equal(ddt_choice_set_constraint(&f->c, NULL, &err), DDT_OK);
    assert_false(ddt_choice_active(&f->c));
    /* without a constraint the start needs no stop id, and tree_states is a no-op */
    assert_int_equal(ddt_choice_start(&f->c, prompt, 1, NULL, 0, &err), DDT_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_tree_states, setup, teardown),
        cmocka_unit_test_setup_teardown(test_masked_pick, setup, teardown),
        cmocka_unit_test_setup_teardown(test_path_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
