/*
 * bench_fallback_model.c — the auto budget's fallback to ar steps (round.h
 * ddt_ar_fallback) under a GPU's cost table, played on the CPU: the shipped pair
 * decodes the held-out prompts with the CPU engine (greedy tokens and trees are the
 * GPU's; at T > 0 the draws too, up to rounding), the cost table given to the engine
 * (options.cost), so the fallback and the bucket rule decide as the GPU's would, and
 * the decode is priced with that table: ar steps at C_verify(0), speculative rounds
 * at C_draft + C_verify(mean nodes).  A model, not a measurement: it ranks settings
 * (DDT_AR_FALLBACK_DECAY) without a GPU; bench/e2e.py on the GPU is the measurement.
 *
 *   bench_fallback_model [draft_s verify0_s slope_s [temperature [max_tokens [calibration.json]]]]
 *
 * Defaults: the shipped pair on the H100 of the fourteenth session (an ar step 253 us,
 * a tree-16 round 500 us: draft 220 us, verify 253 us + 1.7 us a node).  Prints one
 * line per setting: fixed budget 16 (no fallback), then auto under each decay; with a
 * draft calibration (core/calibration.h) each setting again with it, since the
 * calibrated weights change both the trees and the auto budget's Phi.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "io/draft_calibration.h"
#include "text/tokenizer.h"

#define MAX_PROMPT 8192

typedef struct model_run {
    long tokens, rounds, ar_rounds;
    double seconds; /* modeled */
} model_run;

static int run(const char *target, const char *draft_dir, json_t *prompts, ddt_tokenizer *tok, bool autob,
               const ddt_cost_model *cm, const ddt_draft_calibration *cal, float temperature, int32_t max_new,
               model_run *out) {
    ddt_engine_options o;
    memset(&o, 0, sizeof o);
    o.mode = DDT_MODE_TREE;
    o.budget = 16;
    o.budget_auto = autob;
    o.cost = autob ? cm : NULL;
    o.draft_dir = draft_dir;
    o.draft_calibration = cal;
    o.n_threads = 1;
    o.sampling = (ddt_sampling){temperature, 0, 1.0f, 1};
    ddt_error err = {0};
    ddt_engine *e;
    if (ddt_engine_create(target, &o, &e, &err)) {
        fprintf(stderr, "bench_fallback_model: %s\n", err.msg);
        return 1;
    }
    static int32_t ids[MAX_PROMPT], outv[4096];
    memset(out, 0, sizeof *out);
    const double v0 = ddt_cost_verify(cm, 0.0f);
    for (size_t i = 0; i < json_array_size(prompts); i++) {
        const char *text = json_string_value(json_object_get(json_array_get(prompts, i), "text"));
        size_t n = 0;
        int32_t no = 0;
        ddt_gen_stats st;
        if (!text || ddt_tokenizer_encode(tok, text, strlen(text), 0, ids, MAX_PROMPT, &n, &err) ||
            ddt_engine_generate(e, ids, (int32_t)n, max_new, NULL, 0, outv, &no, NULL, NULL, &st, &err)) {
            fprintf(stderr, "bench_fallback_model: prompt %zu: %s\n", i, text ? err.msg : "no text");
            ddt_engine_free(e);
            return 1;
        }
        const long spec = st.rounds - st.ar_rounds, spec_nodes = (long)st.nodes_verified - st.ar_rounds;
        const float mean_n = spec ? (float)spec_nodes / (float)spec : 1.0f;
        out->seconds += (double)st.ar_rounds * v0 +
                        (double)spec * ((double)cm->draft + (double)ddt_cost_verify(cm, mean_n - 1.0f));
        out->tokens += no - 1; /* the first token comes from the prompt pass */
        out->rounds += st.rounds;
        out->ar_rounds += st.ar_rounds;
    }
    ddt_engine_free(e);
    return 0;
}

int main(int argc, char **argv) {
    const float draft = argc > 1 ? (float)atof(argv[1]) : 220e-6f, v0 = argc > 2 ? (float)atof(argv[2]) : 253e-6f,
                slope = argc > 3 ? (float)atof(argv[3]) : 1.7e-6f;
    const float temperature = argc > 4 ? (float)atof(argv[4]) : 0.0f;
    const int32_t max_new = argc > 5 ? atoi(argv[5]) : 128;
    if (!(draft > 0.0f && v0 > 0.0f && slope >= 0.0f && temperature >= 0.0f && max_new > 0 && max_new <= 4096)) {
        fprintf(stderr, "usage: bench_fallback_model [draft_s verify0_s slope_s [temperature [max_tokens "
                        "[calibration.json]]]]\n");
        return 2;
    }
    ddt_draft_calibration calv;
    const bool with_cal = argc > 6;
    if (with_cal) {
        ddt_error cerr = {0};
        if (ddt_calibration_load(argv[6], &calv, &cerr)) {
            fprintf(stderr, "bench_fallback_model: %s\n", cerr.msg);
            return 2;
        }
    }
    static float nodes[6] = {0, 1, 2, 4, 8, 16}, verify[6];
    for (int i = 0; i < 6; i++) verify[i] = v0 + nodes[i] * slope;
    const ddt_cost_model cm = {draft, 6, nodes, 1, NULL, verify, 0.0f};
    const char *target = DDT_SOURCE_DIR "/models/pystdlib-target", *draft_dir = DDT_SOURCE_DIR "/models/pystdlib-dflash";
    json_error_t je;
    json_t *doc = json_load_file(DDT_SOURCE_DIR "/models/heldout_prompts.json", 0, &je);
    json_t *prompts = doc ? json_object_get(doc, "prompts") : NULL;
    ddt_error err = {0};
    ddt_tokenizer *tok = NULL;
    if (!json_is_array(prompts) || ddt_tokenizer_load(target, &tok, &err)) {
        fprintf(stderr, "bench_fallback_model: %s\n", prompts ? err.msg : "models/heldout_prompts.json unreadable");
        json_decref(doc);
        return 1;
    }
    printf("cost table: draft %.0f us, verify %.0f us + %.2f us a node; T = %g; %zu prompts x %d tokens; "
           "ar alone: %.1f tokens/s (modeled)\n",
           draft * 1e6, v0 * 1e6, slope * 1e6, (double)temperature, json_array_size(prompts), max_new, 1.0 / v0);
    printf("| setting | tokens | rounds | ar steps | modeled tokens/s | vs ar |\n|---|---:|---:|---:|---:|---:|\n");
    static const char *const decays[] = {NULL, "0.75", "0.8", "0.85", "0.9"};
    int rc = 0;
    for (size_t k = 0; k < sizeof decays / sizeof decays[0] && !rc; k++)
        for (int c = 0; c <= (int)with_cal && !rc; c++) {
            model_run r;
            if (decays[k]) setenv("DDT_AR_FALLBACK_DECAY", decays[k], 1);
            rc = run(target, draft_dir, prompts, tok, decays[k] != NULL, &cm, c ? &calv : NULL, temperature, max_new,
                     &r);
            if (!rc)
                printf("| %s%s%s | %ld | %ld | %ld | %.1f | %.3f |\n", decays[k] ? "auto, decay " : "tree 16 (fixed)",
                       decays[k] ? decays[k] : "", c ? ", calibrated" : "", r.tokens, r.rounds, r.ar_rounds,
                       (double)r.tokens / r.seconds, (double)r.tokens / r.seconds * (double)v0);
        }
    ddt_tokenizer_free(tok);
    json_decref(doc);
    return rc;
}
