/*
 * test_engine_rules.c — logit_bias and the presence / frequency penalties
 * (ddt_engine_set_logit_rules), and the repetition penalty, on the shipped pair (models/pystdlib-target,
 * models/pystdlib-dflash):
 *   - greedy ar, chain and tree output are the same ids under a bias, under the
 *     penalties, and under both;
 *   - every greedy token is the argmax of the reference row: the target's own
 *     logits for the whole text (a separate ddt_target, one prefill of prompt +
 *     output, all rows) plus the bias, divided / multiplied by the repetition
 *     penalty for every id of the prompt or generated before it, minus count *
 *     frequency + presence for every id generated before it;
 *   - the rules change the output (a -100 bias removes a token the plain output
 *     uses; the penalties make another text), and set to NULL give the plain
 *     output back;
 *   - at T = 1 a +100 bias makes every token that id, in every mode;
 *   - with a JSON constraint too (the rules first, then the mask): ar == chain == tree;
 *   - an answer split into two generations, the second prompted with the first's
 *     ids after ddt_engine_set_answer_start, is the one-generation answer under
 *     the penalties (and without the setting, it is not);
 *   - refusals (an id outside the vocabulary or given twice, a bias or penalty
 *     out of range, too many ids) name what is wrong and keep the rules before.
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

#include "engine/engine.h"
#include "model/target.h"
#include "text/json_vocab.h"
#include "text/tokenizer.h"

#define N_GEN 96
#define EOS 4097 /* the shipped target's eos_token_id */

static char g_target[1024], g_draft[1024];

typedef struct fixture {
    ddt_engine *e;
    ddt_tokenizer *tok;
    ddt_target *ref; /* the reference's own target */
    int32_t vocab;
    float *rows;     /* [max_ctx][vocab] */
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
    const ddt_target_options to = {.max_ctx = 512, .max_tokens = 512, .n_threads = 2};
    if (ddt_target_load(g_target, &to, &f->ref, &err) != DDT_OK) fail_msg("reference target: %s", err.msg);
    f->vocab = ddt_target_vocab(f->ref);
    assert_int_equal(f->vocab, ddt_engine_vocab(f->e));
    f->rows = malloc(sizeof(float) * 512 * (size_t)f->vocab);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    free(f->rows);
    ddt_target_free(f->ref);
    ddt_tokenizer_free(f->tok);
    ddt_engine_free(f->e);
    free(f);
    return 0;
}

typedef struct run {
    int32_t prompt[128], n_prompt;
    int32_t ids[N_GEN], n;
} run;

static void gen(fixture *f, const char *prompt, ddt_mode mode, float temperature, run *r) {
    ddt_error err = {0};
    if (ddt_engine_set_speculation(f->e, mode, 16, false, &err)) fail_msg("speculation: %s", err.msg);
    ddt_sampling s = {.temperature = temperature, .top_p = 1.0f, .seed = 7};
    if (ddt_engine_set_sampling(f->e, &s, &err)) fail_msg("sampling: %s", err.msg);
    size_t n;
    if (ddt_tokenizer_encode(f->tok, prompt, strlen(prompt), 0, r->prompt, 128, &n, &err))
        fail_msg("encode: %s", err.msg);
    r->n_prompt = (int32_t)n;
    const int32_t stop = EOS;
    ddt_gen_stats st;
    if (ddt_engine_generate(f->e, r->prompt, r->n_prompt, N_GEN, &stop, 1, r->ids, &r->n, NULL, NULL, &st, &err))
        fail_msg("generate (%s): %s", ddt_mode_name(mode), err.msg);
}

static void set_rules(fixture *f, const ddt_logit_rules *rules) {
    ddt_error err = {0};
    if (ddt_engine_set_logit_rules(f->e, rules, &err)) fail_msg("rules: %s", err.msg);
}

static bool same(const run *a, const run *b) {
    return a->n == b->n && memcmp(a->ids, b->ids, sizeof(int32_t) * (size_t)a->n) == 0;
}

/* Every emitted token is the argmax (lowest id on ties) of its reference row. */
static void check_reference(fixture *f, const run *r, const ddt_logit_rules *rules) {
    ddt_error err = {0};
    int32_t text[128 + N_GEN];
    memcpy(text, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    memcpy(text + r->n_prompt, r->ids, sizeof(int32_t) * (size_t)r->n);
    const int32_t n_text = r->n_prompt + r->n;
    if (ddt_target_rollback(f->ref, 0, &err)) fail_msg("rollback: %s", err.msg);
    if (ddt_target_prefill(f->ref, text, n_text, f->rows, true, &err)) fail_msg("prefill: %s", err.msg);
    int32_t *count = calloc((size_t)f->vocab, sizeof(int32_t));
    uint8_t *in_prompt = calloc((size_t)f->vocab, 1);
    for (int32_t i = 0; i < r->n_prompt; i++) in_prompt[r->prompt[i]] = 1;
    float *row = malloc(sizeof(float) * (size_t)f->vocab);
    for (int32_t i = 0; i < r->n; i++) {
        /* token i comes from the row after text[0 .. n_prompt + i) */
        memcpy(row, f->rows + (size_t)(r->n_prompt + i - 1) * (size_t)f->vocab, sizeof(float) * (size_t)f->vocab);
        for (int32_t k = 0; k < rules->n_bias; k++) row[rules->bias_ids[k]] += rules->bias[k];
        if (rules->repetition != 0.0f)
            for (int32_t j = 0; j < f->vocab; j++)
                if (count[j] > 0 || in_prompt[j]) row[j] = row[j] > 0.0f ? row[j] / rules->repetition
                                                                        : row[j] * rules->repetition;
        for (int32_t j = 0; j < f->vocab; j++)
            if (count[j] > 0) row[j] = row[j] - (float)count[j] * rules->frequency - rules->presence;
        int32_t best = 0;
        for (int32_t j = 1; j < f->vocab; j++)
            if (row[j] > row[best]) best = j;
        if (best != r->ids[i])
            fail_msg("token %d: %d emitted, the reference row's argmax is %d (%g against %g)", i, r->ids[i], best,
                     (double)row[r->ids[i]], (double)row[best]);
        count[r->ids[i]]++;
    }
    free(count);
    free(in_prompt);
    free(row);
}

static const char *const prompts[] = {
    "def parse_args(argv):\n    parser = ",
    "class Counter(dict):\n    def __init__(self, iterable=None):\n        ",
    "for i in range(10):\n    for j in range(10):\n        ",
};

/* The id the plain greedy output uses most (ties: the lower id). */
static int32_t most_used(const run *r, int32_t vocab) {
    int32_t *c = calloc((size_t)vocab, sizeof(int32_t)), best = r->ids[0];
    for (int32_t i = 0; i < r->n; i++)
        if (++c[r->ids[i]] > c[best] || (c[r->ids[i]] == c[best] && r->ids[i] < best)) best = r->ids[i];
    free(c);
    return best;
}

static void check_modes(fixture *f, const ddt_logit_rules *rules, const char *what) {
    int changed = 0;
    for (size_t p = 0; p < sizeof prompts / sizeof *prompts; p++) {
        run plain, ar, chain, tree;
        set_rules(f, NULL);
        gen(f, prompts[p], DDT_MODE_AR, 0.0f, &plain);
        set_rules(f, rules);
        gen(f, prompts[p], DDT_MODE_AR, 0.0f, &ar);
        gen(f, prompts[p], DDT_MODE_CHAIN, 0.0f, &chain);
        gen(f, prompts[p], DDT_MODE_TREE, 0.0f, &tree);
        if (!same(&ar, &chain) || !same(&ar, &tree))
            fail_msg("%s, prompt %zu: ar %d tokens, chain %d (%s), tree %d (%s)", what, p, ar.n, chain.n,
                     same(&ar, &chain) ? "same" : "differs", tree.n, same(&ar, &tree) ? "same" : "differs");
        check_reference(f, &ar, rules);
        changed += !same(&ar, &plain);
        /* off again: the plain output */
        set_rules(f, NULL);
        run back;
        gen(f, prompts[p], DDT_MODE_TREE, 0.0f, &back);
        assert_true(same(&back, &plain));
    }
    printf("%s: ar == chain == tree on %zu prompts, each token the reference's argmax; %d outputs changed\n", what,
           sizeof prompts / sizeof *prompts, changed);
    assert_true(changed > 0);
}

static void test_bias(void **state) {
    fixture *f = *state;
    run plain;
    set_rules(f, NULL);
    gen(f, prompts[0], DDT_MODE_AR, 0.0f, &plain);
    const int32_t banned = most_used(&plain, f->vocab);
    /* the banned id, a small push on two others, one pull */
    const int32_t ids[4] = {banned, 32, 261, 1000};
    const float bias[4] = {-100.0f, 2.5f, 1.0f, -3.0f};
    const ddt_logit_rules rules = {ids, bias, 4, 0.0f, 0.0f, 0.0f};
    check_modes(f, &rules, "logit_bias");
    set_rules(f, &rules);
    run ar;
    gen(f, prompts[0], DDT_MODE_TREE, 0.0f, &ar);
    for (int32_t i = 0; i < ar.n; i++) assert_int_not_equal(ar.ids[i], banned);
    set_rules(f, NULL);
}

static void test_penalties(void **state) {
    fixture *f = *state;
    const ddt_logit_rules rules = {NULL, NULL, 0, 0.4f, 0.9f, 0.0f};
    check_modes(f, &rules, "presence 0.4, frequency 0.9");
    const ddt_logit_rules neg = {NULL, NULL, 0, -0.5f, 0.0f, 0.0f}; /* a negative penalty favours repeats */
    check_modes(f, &neg, "presence -0.5");
}

static void test_repetition(void **state) {
    fixture *f = *state;
    const ddt_logit_rules rules = {NULL, NULL, 0, 0.0f, 0.0f, 1.3f};
    check_modes(f, &rules, "repetition 1.3");
    const ddt_logit_rules mixed = {NULL, NULL, 0, 0.3f, 0.2f, 0.8f}; /* below 1 favours repeats */
    check_modes(f, &mixed, "repetition 0.8 + presence 0.3 + frequency 0.2");
}

static void test_both(void **state) {
    fixture *f = *state;
    const int32_t ids[2] = {10, 11};
    const float bias[2] = {1.5f, -7.0f};
    const ddt_logit_rules rules = {ids, bias, 2, 0.2f, 1.3f, 0.0f};
    check_modes(f, &rules, "bias + penalties");
}

/* Repetitive text under small frequency penalties: the choice flips after a count
 * of repeats, and a tree round's accepted path holds several of them, so a node's
 * row must count its own path (without it the tree takes a repeat ar refused). */
static void test_counts_inside_a_round(void **state) {
    fixture *f = *state;
    static const char *const rep[] = {
        "ZEROS = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, ",
        "x = 1\nx = 1\nx = 1\nx = 1\nx = 1\nx = 1\n",
        "    pass\n    pass\n    pass\n    pass\n",
    };
    static const float freq[] = {0.02f, 0.05f, 0.1f, 0.2f, 0.4f};
    int flips = 0;
    for (size_t p = 0; p < sizeof rep / sizeof *rep; p++)
        for (size_t k = 0; k < sizeof freq / sizeof *freq; k++) {
            const ddt_logit_rules rules = {NULL, NULL, 0, 0.0f, freq[k], 0.0f};
            run plain, ar, tree;
            set_rules(f, NULL);
            gen(f, rep[p], DDT_MODE_AR, 0.0f, &plain);
            set_rules(f, &rules);
            gen(f, rep[p], DDT_MODE_AR, 0.0f, &ar);
            gen(f, rep[p], DDT_MODE_TREE, 0.0f, &tree);
            if (!same(&ar, &tree)) fail_msg("prompt %zu, frequency %g: tree differs from ar", p, (double)freq[k]);
            check_reference(f, &ar, &rules);
            flips += !same(&ar, &plain);
        }
    set_rules(f, NULL);
    printf("repetitive prompts: ar == tree under 5 small frequency penalties, %d of 15 outputs changed\n", flips);
    assert_true(flips > 0);
}

/* The answer of one generation, written by two: the first's k ids, then a second
 * prompted with the prompt and those ids, the answer starting at the prompt's end
 * (start) or not (0).  *n the ids in all. */
static void split_gen(fixture *f, const run *whole, ddt_mode mode, int32_t k, int32_t start, int32_t *ids, int32_t *n) {
    ddt_error err = {0};
    if (ddt_engine_set_speculation(f->e, mode, 16, false, &err)) fail_msg("speculation: %s", err.msg);
    const int32_t stop = EOS;
    ddt_gen_stats st;
    int32_t n1, n2, ctx[128 + N_GEN];
    if (ddt_engine_generate(f->e, whole->prompt, whole->n_prompt, k, &stop, 1, ids, &n1, NULL, NULL, &st, &err))
        fail_msg("generate: %s", err.msg);
    memcpy(ctx, whole->prompt, sizeof(int32_t) * (size_t)whole->n_prompt);
    memcpy(ctx + whole->n_prompt, ids, sizeof(int32_t) * (size_t)n1);
    ddt_engine_set_answer_start(f->e, start);
    ddt_status s = ddt_engine_generate(f->e, ctx, whole->n_prompt + n1, N_GEN - n1, &stop, 1, ids + n1, &n2, NULL,
                                       NULL, &st, &err);
    ddt_engine_set_answer_start(f->e, 0);
    if (s) fail_msg("generate: %s", err.msg);
    *n = n1 + n2;
}

static void test_answer_start(void **state) {
    fixture *f = *state;
    static const char *const rep[] = {
        "ZEROS = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, ",
        "x = 1\nx = 1\nx = 1\nx = 1\nx = 1\nx = 1\n",
    };
    const ddt_logit_rules rules = {NULL, NULL, 0, 0.3f, 0.2f, 1.1f};
    int without = 0;
    for (size_t p = 0; p < sizeof rep / sizeof *rep; p++) {
        run whole;
        set_rules(f, &rules);
        gen(f, rep[p], DDT_MODE_AR, 0.0f, &whole);
        for (int32_t k = 8; k < whole.n; k += 24) {
            for (int m = 0; m < 2; m++) {
                const ddt_mode mode = m ? DDT_MODE_TREE : DDT_MODE_AR;
                int32_t ids[N_GEN], n;
                split_gen(f, &whole, mode, k, whole.n_prompt, ids, &n);
                if (n != whole.n || memcmp(ids, whole.ids, sizeof(int32_t) * (size_t)n))
                    fail_msg("prompt %zu split at %d (%s): not the one-generation answer", p, k, ddt_mode_name(mode));
                split_gen(f, &whole, mode, k, 0, ids, &n);
                without += n != whole.n || memcmp(ids, whole.ids, sizeof(int32_t) * (size_t)n) != 0;
            }
        }
    }
    set_rules(f, NULL);
    printf("answers split in two: the one-generation ids with the answer's start; %d splits differ without\n", without);
    assert_true(without > 0);
}

static void test_with_json_constraint(void **state) {
    fixture *f = *state;
    ddt_error err = {0};
    ddt_json_vocab *v = NULL;
    if (ddt_json_vocab_create(f->tok, f->vocab, &v, &err)) fail_msg("json vocab: %s", err.msg);
    const ddt_json_constraint c = {v, true, NULL};
    if (ddt_engine_set_constraint(f->e, &c, &err)) fail_msg("constraint: %s", err.msg);
    const int32_t ids[1] = {34}; /* '"' in the shipped vocabulary's byte range: pushed, so keys come more */
    const float bias[1] = {2.0f};
    const ddt_logit_rules rules = {ids, bias, 1, 0.3f, 0.6f, 0.0f};
    set_rules(f, &rules);
    static const char *const jp[] = {"CONFIG = json.loads('", "def to_dict(self):\n    return "};
    for (size_t p = 0; p < 2; p++) {
        run ar, chain, tree;
        gen(f, jp[p], DDT_MODE_AR, 0.0f, &ar);
        gen(f, jp[p], DDT_MODE_CHAIN, 0.0f, &chain);
        gen(f, jp[p], DDT_MODE_TREE, 0.0f, &tree);
        assert_true(same(&ar, &chain) && same(&ar, &tree));
    }
    set_rules(f, NULL);
    if (ddt_engine_set_constraint(f->e, NULL, &err)) fail_msg("constraint off: %s", err.msg);
    ddt_json_vocab_free(v);
}

static void test_sampled_bias(void **state) {
    fixture *f = *state;
    const int32_t forced = 300;
    const float bias = 100.0f;
    const ddt_logit_rules rules = {&forced, &bias, 1, 0.0f, 0.0f, 0.0f};
    set_rules(f, &rules);
    const ddt_mode modes[3] = {DDT_MODE_AR, DDT_MODE_CHAIN, DDT_MODE_TREE};
    for (int m = 0; m < 3; m++) {
        run r;
        gen(f, prompts[1], modes[m], 1.0f, &r);
        assert_int_equal(r.n, N_GEN);
        for (int32_t i = 0; i < r.n; i++) assert_int_equal(r.ids[i], forced);
    }
    set_rules(f, NULL);
}

static void test_refusals(void **state) {
    fixture *f = *state;
    ddt_error err = {0};
    const int32_t good_id = 5;
    const float good_bias = -100.0f;
    const ddt_logit_rules good = {&good_id, &good_bias, 1, 0.0f, 0.0f, 0.0f};
    set_rules(f, &good);
    const int32_t out_id = f->vocab, neg_id = -1, twice[2] = {7, 7};
    const float b1 = 1.0f, b2[2] = {1.0f, 2.0f}, big = 100.5f, nan_b = NAN;
    static int32_t many_ids[DDT_LOGIT_BIAS_MAX + 1];
    static float many_b[DDT_LOGIT_BIAS_MAX + 1];
    for (int i = 0; i <= DDT_LOGIT_BIAS_MAX; i++) many_ids[i] = i;
    const struct {
        ddt_logit_rules r;
        ddt_status want;
        const char *says;
    } bad[] = {
        {{&out_id, &b1, 1, 0.0f, 0.0f, 0.0f}, DDT_ERR_RANGE, "outside this model"},
        {{&neg_id, &b1, 1, 0.0f, 0.0f, 0.0f}, DDT_ERR_RANGE, "outside this model"},
        {{twice, b2, 2, 0.0f, 0.0f, 0.0f}, DDT_ERR_INVALID, "given twice"},
        {{&good_id, &big, 1, 0.0f, 0.0f, 0.0f}, DDT_ERR_RANGE, "bias"},
        {{&good_id, &nan_b, 1, 0.0f, 0.0f, 0.0f}, DDT_ERR_RANGE, "bias"},
        {{NULL, NULL, 0, 2.5f, 0.0f, 0.0f}, DDT_ERR_RANGE, "presence_penalty"},
        {{NULL, NULL, 0, 0.0f, -2.5f, 0.0f}, DDT_ERR_RANGE, "frequency_penalty"},
        {{NULL, NULL, 0, 0.0f, NAN, 0.0f}, DDT_ERR_RANGE, "frequency_penalty"},
        {{many_ids, many_b, DDT_LOGIT_BIAS_MAX + 1, 0.0f, 0.0f, 0.0f}, DDT_ERR_RANGE, "entries"},
        {{NULL, &b1, 1, 0.0f, 0.0f, 0.0f}, DDT_ERR_RANGE, "entries"},
        {{NULL, NULL, 0, 0.0f, 0.0f, -1.0f}, DDT_ERR_RANGE, "repetition_penalty"},
        {{NULL, NULL, 0, 0.0f, 0.0f, 10.5f}, DDT_ERR_RANGE, "repetition_penalty"},
        {{NULL, NULL, 0, 0.0f, 0.0f, NAN}, DDT_ERR_RANGE, "repetition_penalty"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const ddt_status st = ddt_engine_set_logit_rules(f->e, &bad[i].r, &err);
        if (st != bad[i].want || !strstr(err.msg, bad[i].says))
            fail_msg("refusal %zu: status %d (%d expected), message '%s' (should name '%s')", i, (int)st,
                     (int)bad[i].want, err.msg, bad[i].says);
    }
    /* the rules before the refusals still hold: id 5 never comes */
    run r;
    gen(f, prompts[2], DDT_MODE_TREE, 0.0f, &r);
    check_reference(f, &r, &good);
    for (int32_t i = 0; i < r.n; i++) assert_int_not_equal(r.ids[i], good_id);
    set_rules(f, NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bias),         cmocka_unit_test(test_penalties), cmocka_unit_test(test_repetition),
        cmocka_unit_test(test_both),
        cmocka_unit_test(test_counts_inside_a_round), cmocka_unit_test(test_with_json_constraint),
        cmocka_unit_test(test_sampled_bias), cmocka_unit_test(test_refusals), cmocka_unit_test(test_answer_start),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
