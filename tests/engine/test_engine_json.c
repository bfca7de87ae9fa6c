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
 *
 * The tree under the constraint is built of allowed nodes only
 * (ddt_tree_build_filtered with the grammar's predicate), so the budget a refused
 * draft token would have taken goes to the next allowed one: with a scripted
 * drafter whose tables the test keeps, every round verifies exactly
 * 1 + min(budget, allowed prefixes of its table) rows, more than pruning the
 * unfiltered tree would leave; with the shipped drafter the rounds verify more
 * rows and accept at least as many tokens a round as pruning did.
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

#include "core/error.h"

#include "engine/engine.h"
#include "io/draft_calibration.h"
#include "text/json_vocab.h"
#include "text/tokenizer.h"
#include "ddtree.h"

#define N_GEN 160
#define EOS 4097 /* the shipped target's eos_token_id */

static char g_target[1024], g_draft[1024];

typedef struct fixture {
    ddt_engine *e;
    ddt_tokenizer *tok;
    ddt_json_vocab *v;
} fixture;

/* The shipped pair's tree-16 engine (switchable to every mode), under cal (NULL: none). */
static ddt_engine *pair_engine(const ddt_draft_calibration *cal) {
    ddt_engine_options o;
    memset(&o, 0, sizeof o);
    o.mode = DDT_MODE_TREE;
    o.budget = 16;
    o.reserve_budget = 16;
    o.draft_dir = g_draft;
    o.sampling.top_p = 1.0f;
    o.n_threads = 2;
    o.draft_calibration = cal;
    ddt_engine *e;
    ddt_error err = {0};
    if (ddt_engine_create(g_target, &o, &e, &err) != DDT_OK) fail_msg("create: %s", err.msg);
    return e;
}

static int setup(void **state) {
    snprintf(g_target, sizeof g_target, "%s/models/pystdlib-target", DDT_SOURCE_DIR);
    snprintf(g_draft, sizeof g_draft, "%s/models/pystdlib-dflash", DDT_SOURCE_DIR);
    fixture *f = calloc(1, sizeof *f);
    ddt_error err = {0};
    f->e = pair_engine(NULL);
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
    /* draft nodes the grammar refuses are never verified, and their budget goes to allowed
       ones.  When the build pruned the unfiltered tree instead (commit ebd8edb), these six
       documents took 96 rounds and 958 rows for their 300 tokens: 3.125 tokens a round.
       Now rounds fill their 17 rows (16 nodes and the root) wherever the drafter's table
       holds 16 allowed prefixes, so more rows are verified, and a bigger tree of the same
       prefixes accepts at least as much each round (the ids are ar's either way). */
    const double before = 300.0 / 96.0, now = (double)tokens / (double)tree_rounds;
    printf("json tree: %lld rows in %lld rounds (%.2f a round), %d tokens: %.3f tokens a round; "
           "pruned before: 958 rows in 96 rounds (9.98 a round), 300 tokens: %.3f a round\n",
           (long long)tree_nodes, (long long)tree_rounds, (double)tree_nodes / (double)tree_rounds, tokens, now,
           before);
    assert_int_equal(tokens, 300); /* the same documents as the numbers before were measured on */
    assert_true(tree_nodes > 958);
    assert_true(tree_nodes <= 17 * tree_rounds);
    assert_true(now >= before);
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

/* ------------------------------------------------------------------ the refill, exactly */

#define SD_DEPTH 6
#define SD_BUDGET 16
#define SD_MAX_ROUNDS N_GEN

/* A scripted drafter over a known continuation (the greedy ar output): each depth's
 * row holds the right token at rank 0 most of the time, at a lower rank or not at
 * all otherwise, and random ids elsewhere, many of which the grammar refuses.
 * Every table is kept with its position, so the test can count its allowed prefixes. */
typedef struct scripted {
    const int32_t *truth;
    int32_t n_truth, n_prompt, vocab;
    uint64_t rng;
    int32_t rounds;
    bool bad_bonus; /* a round's bonus was not the continuation's token at its position */
    int32_t pos[SD_MAX_ROUNDS], k[SD_MAX_ROUNDS];
    float logq[SD_MAX_ROUNDS][SD_DEPTH * SD_BUDGET];
    int32_t tok[SD_MAX_ROUNDS][SD_DEPTH * SD_BUDGET];
} scripted;

static uint32_t sd_rand(scripted *sd) {
    sd->rng = sd->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(sd->rng >> 33);
}

static ddt_status scripted_draft(void *ctx, int32_t bonus, int32_t position, int32_t depth, int32_t k, float *logq,
                                 int32_t *tok, ddt_error *err) {
    scripted *sd = ctx;
    if (sd->rounds >= SD_MAX_ROUNDS || depth != SD_DEPTH || k > SD_BUDGET)
        return ddt_fail(err, DDT_ERR_INTERNAL, "scripted drafter: round %d, depth %d, k %d", sd->rounds, depth, k);
    /* the emitted ids so far end with the bonus; the committed context is the prompt and the rest */
    const int32_t m = position - sd->n_prompt + 1;
    if (m < 1 || m > sd->n_truth || sd->truth[m - 1] != bonus) sd->bad_bonus = true;
    for (int32_t d = 0; d < depth; d++) {
        const int32_t at = m + d < sd->n_truth ? sd->truth[m + d] : -1;
        const uint32_t roll = sd_rand(sd) % 100;
        const int32_t rank = at < 0 || roll >= 85 ? -1 : roll < 60 ? 0 : 1 + (int32_t)(sd_rand(sd) % 3);
        int32_t *row = tok + (size_t)d * (size_t)k;
        for (int32_t r = 0; r < k; r++) {
            logq[(size_t)d * (size_t)k + r] = -0.05f - 0.25f * (float)r - 0.01f * (float)d;
            if (r == rank) {
                row[r] = at;
                continue;
            }
            bool dup;
            do { /* distinct ids in a row, never the right one off its rank */
                row[r] = (int32_t)(sd_rand(sd) % (uint32_t)sd->vocab);
                dup = row[r] == at;
                for (int32_t q = 0; q < r; q++) dup |= row[q] == row[r];
            } while (dup);
        }
    }
    const int32_t i = sd->rounds++;
    sd->pos[i] = position;
    sd->k[i] = k;
    memcpy(sd->logq[i], logq, sizeof(float) * (size_t)depth * (size_t)k);
    memcpy(sd->tok[i], tok, sizeof(int32_t) * (size_t)depth * (size_t)k);
    return DDT_OK;
}

/* The grammar's rule for a draft token after a path (engine_cpu.c's): a stop id
 * once the document is complete (the state unchanged), any other id while it is
 * not and its bytes step the grammar. */
static bool sd_allowed(const ddt_json_vocab *v, const ddt_json_state *s, int32_t id, ddt_json_state *next) {
    *next = *s;
    if (id == EOS) return ddt_json_complete(next);
    return !ddt_json_complete(next) && ddt_json_vocab_advance(v, next, id);
}

/* Prefixes of the table under depth d whose every token is allowed, counted up to cap. */
static int32_t count_allowed(const ddt_json_vocab *v, const ddt_json_state *s, const int32_t *tok, int32_t d,
                             int32_t k, int32_t cap) {
    int32_t n = 0;
    for (int32_t r = 0; r < k && n < cap && d < SD_DEPTH; r++) {
        ddt_json_state next;
        if (!sd_allowed(v, s, tok[(size_t)d * (size_t)k + r], &next)) continue;
        n++;
        n += count_allowed(v, &next, tok, d + 1, k, cap - n);
    }
    return n < cap ? n : cap;
}

/* What pruning the unfiltered tree left: its nodes whose whole path is allowed. */
static int32_t pruned_size(const ddt_json_vocab *v, const ddt_json_state *root, const ddt_tree *t) {
    static ddt_json_state st[SD_BUDGET + 1];
    static bool ok[SD_BUDGET + 1];
    st[0] = *root;
    ok[0] = true;
    int32_t kept = 0;
    for (int32_t i = 1; i < t->n_nodes; i++) {
        const int32_t p = t->parent[i];
        ok[i] = ok[p] && sd_allowed(v, &st[p], t->token[i], &st[i]);
        kept += ok[i];
    }
    return kept;
}

static void test_tree_refills_budget(void **state) {
    fixture *f = *state;
    ddt_error err = {0};
    ddt_json_constraint c = {f->v, true, NULL};
    static scripted sd;
    ddt_engine_options o;
    memset(&o, 0, sizeof o);
    o.mode = DDT_MODE_TREE;
    o.budget = SD_BUDGET;
    o.draft_fn = scripted_draft;
    o.draft_ctx = &sd;
    o.draft_depth = SD_DEPTH;
    o.sampling.top_p = 1.0f;
    o.n_threads = 2;
    ddt_engine *e;
    if (ddt_engine_create(g_target, &o, &e, &err)) fail_msg("create: %s", err.msg);
    if (ddt_engine_set_constraint(e, &c, &err)) fail_msg("constraint: %s", err.msg);
    if (ddt_engine_set_constraint(f->e, &c, &err)) fail_msg("constraint: %s", err.msg);
    ddt_builder *b;
    ddt_tree t;
    assert_int_equal(ddt_builder_create(SD_BUDGET, &b, NULL), DDT_OK);
    assert_int_equal(ddt_tree_alloc(SD_BUDGET + 1, &t, NULL), DDT_OK);
    int64_t rows = 0, rows_pruned = 0, rounds = 0, full = 0, short_rounds = 0, refilled = 0, chain_cut = 0;
    for (size_t q = 0; q < 2 * sizeof prompts / sizeof *prompts; q++) {
        /* each prompt as a tree, then as a chain (cut before its first refused token) */
        const size_t p = q / 2;
        const bool chain = q % 2;
        if (ddt_engine_set_speculation(e, chain ? DDT_MODE_CHAIN : DDT_MODE_TREE, SD_BUDGET, false, &err))
            fail_msg("speculation: %s", err.msg);
        run ar;
        gen(f, prompts[p], DDT_MODE_AR, N_GEN, &ar);
        int32_t ids[256];
        size_t n;
        if (ddt_tokenizer_encode(f->tok, prompts[p], strlen(prompts[p]), 0, ids, 256, &n, &err))
            fail_msg("encode: %s", err.msg);
        memset(&sd, 0, sizeof sd);
        sd.truth = ar.ids;
        sd.n_truth = ar.n;
        sd.n_prompt = (int32_t)n;
        sd.vocab = ddt_engine_vocab(e);
        sd.rng = 0x5eed0000u + p;
        const int32_t stop = EOS;
        int32_t out[N_GEN], n_out;
        ddt_gen_stats st;
        if (ddt_engine_generate(e, ids, (int32_t)n, N_GEN, &stop, 1, out, &n_out, NULL, NULL, &st, &err))
            fail_msg("generate: %s", err.msg);
        assert_int_equal(n_out, ar.n);
        assert_memory_equal(out, ar.ids, (size_t)ar.n * sizeof(int32_t));
        assert_false(sd.bad_bonus);
        assert_int_equal(sd.rounds, st.rounds);
        /* each round: the root and the budget's worth of allowed prefixes, or all the table has */
        int64_t want = 0;
        for (int32_t r = 0; r < sd.rounds; r++) {
            const int32_t m = sd.pos[r] - sd.n_prompt + 1;
            ddt_json_state root;
            ddt_json_init(&root, true);
            for (int32_t i = 0; i < m; i++) {
                ddt_json_state next;
                assert_true(sd_allowed(f->v, &root, ar.ids[i], &next));
                root = next;
            }
            if (chain) {
                assert_int_equal(sd.k[r], 1);
                int32_t len = 0;
                for (ddt_json_state s0 = root, s1; len < SD_DEPTH && sd_allowed(f->v, &s0, sd.tok[r][len], &s1); len++)
                    s0 = s1;
                want += 1 + len;
                chain_cut += len < SD_DEPTH;
                continue;
            }
            const int32_t allowed = count_allowed(f->v, &root, sd.tok[r], 0, sd.k[r], SD_BUDGET);
            want += 1 + allowed;
            full += allowed == SD_BUDGET;
            short_rounds += allowed < SD_BUDGET;
            /* the old way: the unfiltered tree of the same table, pruned */
            ddt_draft_table tb = {SD_DEPTH, sd.k[r], sd.logq[r], sd.tok[r]};
            const int32_t bonus = ar.ids[m - 1];
            assert_int_equal(ddt_tree_build(b, &tb, bonus, SD_BUDGET, NULL, 0, &t, NULL), DDT_OK);
            const int32_t pruned = pruned_size(f->v, &root, &t);
            assert_true(pruned <= allowed);
            rows_pruned += 1 + pruned;
            refilled += pruned < allowed;
        }
        assert_int_equal(st.nodes_verified, want);
        if (chain) continue;
        rows += st.nodes_verified;
        rounds += st.rounds;
    }
    printf("scripted drafter: %lld rows in %lld rounds (%lld full, %lld short of allowed prefixes, %lld refilled); "
           "pruning would have verified %lld; %lld chain rounds cut\n", (long long)rows, (long long)rounds,
           (long long)full, (long long)short_rounds, (long long)refilled, (long long)rows_pruned, (long long)chain_cut);
    /* the script covers both kinds of round, and the refill does fill */
    assert_true(full > 0 && short_rounds > 0 && refilled > 0 && chain_cut > 0);
    assert_true(rows > rows_pruned);
    ddt_tree_free(&t);
    ddt_builder_destroy(b);
    ddt_engine_free(e);
    assert_int_equal(ddt_engine_set_constraint(f->e, NULL, &err), DDT_OK);
}

/* Under the shipped pair's draft calibration the constrained trees are built from
 * calibrated weights (the refusals still filter the build) and take no context
 * lookup path (a grafted node would carry no grammar state): greedy tree output is
 * still ar's, complete documents end with the stop id, and the stats say so. */
static void test_calibrated_constrained(void **state) {
    fixture *f = *state;
    char path[1100];
    snprintf(path, sizeof path, "%s/%s", g_draft, DDT_CALIBRATION_FILE);
    ddt_draft_calibration cal;
    ddt_error err = {0};
    if (ddt_calibration_load(path, &cal, &err)) fail_msg("calibration: %s", err.msg);
    assert_int_equal(cal.lookup, 1);
    fixture g = *f;
    g.e = pair_engine(&cal);
    ddt_json_constraint c = {f->v, true, NULL};
    if (ddt_engine_set_constraint(f->e, &c, &err) || ddt_engine_set_constraint(g.e, &c, &err))
        fail_msg("constraint: %s", err.msg);
    for (size_t p = 0; p < 3; p++) {
        run ar;
        gen(f, prompts[p], DDT_MODE_AR, N_GEN, &ar);
        int32_t ids[256], out[N_GEN], n_out;
        size_t n;
        if (ddt_tokenizer_encode(f->tok, prompts[p], strlen(prompts[p]), 0, ids, 256, &n, &err))
            fail_msg("encode: %s", err.msg);
        const int32_t stop = EOS;
        ddt_gen_stats st;
        if (ddt_engine_generate(g.e, ids, (int32_t)n, N_GEN, &stop, 1, out, &n_out, NULL, NULL, &st, &err))
            fail_msg("generate: %s", err.msg);
        assert_int_equal(n_out, ar.n);
        assert_memory_equal(out, ar.ids, (size_t)ar.n * sizeof(int32_t));
        assert_true(st.draft_calibrated);
        assert_int_equal(st.lookup_nodes, 0);
    }
    assert_int_equal(ddt_engine_set_constraint(f->e, NULL, &err), DDT_OK);
    ddt_engine_free(g.e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_modes_agree),
        cmocka_unit_test(test_tree_refills_budget),
        cmocka_unit_test(test_sampled_is_grammatical),
        cmocka_unit_test(test_off_again_and_errors),
        cmocka_unit_test(test_schema_greedy_modes_agree),
        cmocka_unit_test(test_calibrated_constrained),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
