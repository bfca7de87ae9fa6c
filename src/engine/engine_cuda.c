/*
 * engine_cuda.c — the ar / chain / tree loops on the CUDA backend (see
 * engine_cuda.h).  Every device buffer is allocated in create; a round only
 * launches kernels (or replays the graph that holds them) and copies its
 * emitted tokens back.
 */
#include "engine/engine_cuda.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/graph_cuda.h"
#include "backend/cuda/kv_cuda.h"
#include "backend/cuda/qmatmul_cuda.h"
#include "backend/cuda/sample_cuda.h"
#include "backend/cuda/tree_cuda.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/lookup.h"
#include "engine/choice.h"
#include "engine/emitter.h"
#include "engine/logprobs.h"
#include "engine/round.h"
#include "model/drafter.h"
#include "model/drafter_cuda.h"
#include "model/drafter_desc.h"
#include "model/target_desc.h"
#include "model/target_cuda.h"

#define N_EVENTS 6

struct ddt_engine_cuda {
    ddt_engine_options opts;
    ddt_cuda_target *target;
    ddt_cuda_drafter *drafter;
    cudaStream_t s;
    int32_t vocab, max_ctx, depth, kmax, max_nodes, n_capture;
    /* device */
    int32_t *ids;          /* [max_ctx] prompt */
    float *logits;         /* [max_nodes][vocab] */
    float *draft_logits;   /* [depth][vocab] */
    float *logq;           /* [depth][kmax] */
    int32_t *table_tok;    /* [depth][kmax] */
    void *topk_ws;
    size_t topk_ws_bytes;
    int32_t *target_next;  /* [max_nodes] */
    ddt_cuda_sample_params *sp_d; /* the settings and round the sampled graph reads */
    int32_t *emit_d;       /* [DDT_CUDA_EMIT_WORDS + 1]: the emit block, then the auto rule's bucket */
    int32_t *one;          /* [1] = 1 */
    ddt_cuda_tree tree;
    bool have_cal; /* options.draft_calibration, copied into tree.cal */
    /* the context lookup (core/lookup.h) on greedy tree rounds where the calibration rates
       it: the host proposes from the context it knows (kv_ids) into pinned prop_h ([0]
       length, [1] match length, [2..] tokens), which the round's graft kernel reads;
       lookup_d counts the device's grafted nodes, lookup_host the host builds' */
    bool lookup_on;
    int32_t *prop_h;
    int32_t *lookup_d;
    int64_t lookup_host;
    /* host (pinned where copied asynchronously) */
    int32_t *emit_h;       /* [DDT_CUDA_EMIT_WORDS + 1] */
    int32_t *walk_h;       /* [DDT_MAX_PATH + 2]: path, length, bonus for the device after a host walk */
    float *logits_h;       /* [max_nodes][vocab] (T > 0) */
    int32_t *tok_h, *par_h;/* [max_nodes] (T > 0) */
    ddt_tree htree;
    ddt_sampler *sampler;
    ddt_cuda_sample_params *sp_h; /* pinned staging of sp_d, rewritten before each sampled round */
    /* --budget auto: the cost model; on the device (greedy and device-sampled rounds)
       the builder's cost table and verify buckets (tree_cuda.h: ddt_cuda_tree_auto),
       on the host (host-sampled rounds) the CPU builder and pinned staging of table
       and tree */
    bool auto_budget;      /* this generation's setting (ddt_engine_cuda_set_speculation) */
    bool auto_ready;       /* created with --budget auto: the cost model, builder and buckets exist */
    ddt_builder *builder;
    ddt_cost_model cost;
    float cost_nodes[DDT_ENGINE_COST_POINTS], cost_verify[DDT_ENGINE_COST_POINTS];
    int32_t cost_ctx; /* the context the verify costs were measured after */
    float *vcost_d;        /* device [max_nodes]: C_verify(n), n = 0..max budget */
    float *vcost_h;        /* the same on the host (host-sampled rounds) */
    ddt_cuda_tree_auto tauto; /* the full budget's buckets */
    float *logq_h;         /* [depth][kmax] */
    int32_t *ttok_h;       /* [depth][kmax] */
    int32_t *dep_h;        /* [max_nodes] */
    uint64_t *vis_h;       /* [max_nodes][vis_words] */
    const float *capture[DDT_DRAFTER_MAX_TARGET_LAYERS];
    /* --budget auto on the device: one graph per verify bucket (bgraph[j] verifies
       bucket j's rows, its build cut at the rule's bucket or j), the host picking
       each round's from the bucket the rule chose in the round before (emit word
       DDT_CUDA_EMIT_WORDS): no switch node in the round (on the H200 a switch
       node cost ~25 us a round: its body's launch, no PDL across it). */
    cudaGraphExec_t bgraph[DDT_CUDA_TREE_MAX_BUCKETS];
    int32_t n_bgraphs;
    int32_t auto_bucket;   /* the bucket this round may verify: the rule's choice the round before */
    /* the round as graphs for the setting of graph_mode / graph_budget / graph_auto and
       the pick graph_next: one fixed round (or ar step), or with the auto budget argraph
       and the bucket graphs; captured again when a generation starts with another */
    ddt_mode graph_mode;
    bool graph_auto;
    cudaGraphExec_t graph;
    int32_t graph_budget;
    int32_t graph_kernels; /* kernel nodes of the captured round (ddt_gen_stats.round_kernels) */
    int32_t graph_pdl;     /* of its kernel-to-kernel edges, those made programmatic (ddt_gen_stats.round_pdl_edges) */
    int graph_next;        /* how the graph picks each node's token: NEXT_ARGMAX or NEXT_SAMPLE */
    /* --budget auto's fallback (round.h ddt_ar_fallback): an ar step that feeds the
       drafter (prefill of the root, its row appended, the next token), a graph
       captured with the bucket graphs */
    cudaGraphExec_t argraph;
    cudaEvent_t ev[N_EVENTS];
    /* A captured round records its phase events on a side branch (side, forked
       from s at each mark and joined once before the capture ends), so that an
       event node never sits between two kernels: an edge through it would be a
       full dependency, where kernel to kernel is programmatic (PDL). */
    cudaStream_t side;
    cudaEvent_t fork_ev, join_ev;
    bool marks_forked; /* the capture under way has forked the side branch */
    /* one rank of several (engine_multi_cuda.c): the sum over ranks of a stop flag,
       exchanged at the start of every round (emitter.h: ddt_emitter_next_round) */
    int32_t world;
    ddt_cuda_allreduce_fn allreduce;
    void *allreduce_ctx;
    float *stop_d;         /* device [1]: this rank's flag, then the sum; NULL on one GPU */
    float *stop_h;         /* pinned [2]: [0] the flag staged, [1] the sum read back */
    /* options.prefix_cache: the token of each context row, kv_ids[0..n_kv), tracked on the
       host from the prompt and the emitted rounds (a round's rows: its root, the previous
       bonus, and the accepted tokens but the new bonus); n_kv 0 after anything that lost
       track.  The drafter (chain / tree engines) appends every round's rows, so its
       context is the target's. */
    int32_t *kv_ids;       /* [max_ctx] */
    int32_t n_kv;
    /* ddt_engine_set_logprobs: where emitted token i's values go (i < lp_cap), NULL = off;
       the rows are copied back into logits_h after each round (one GPU only) */
    ddt_token_logprobs *lp_out;
    int32_t lp_cap, lp_top;
    /* ddt_engine_cuda_score: all rows' logits of a prefill chunk, made by its first call */
    float *score_d;        /* device [DDT_ENGINE_PREFILL_CHUNK][vocab] */
    float *score_h;        /* pinned, the same */
    /* ddt_engine_set_logit_rules / set_constraint: the target's choice under them
       (choice.h), made on the host: while either is set every round walks there
       (NEXT_HOST), over the verify rows copied back; its state table covers htree */
    ddt_choice ch;
};

/* How a round picks the target's token at each node: argmax (T = 0), the device
 * sampler (sample_cuda.h: the CPU's draws, inside the graph), or the host sampler
 * over copied logits (settings the device sampler does not take). */
enum { NEXT_ARGMAX = 0, NEXT_SAMPLE = 1, NEXT_HOST = 2 };

static int next_mode(const ddt_engine_cuda *e) {
    if (ddt_choice_active(&e->ch)) return NEXT_HOST;
    if (e->opts.sampling.temperature <= 0.0f) return NEXT_ARGMAX;
    if (e->opts.cuda_host_sampler) return NEXT_HOST;
    return ddt_cuda_sample_supported(&e->opts.sampling, e->vocab) ? NEXT_SAMPLE : NEXT_HOST;
}

/* Auto rounds of one rank of several stay on the host path, greedy ones too
 * (every rank under rank 0's cost table, share_cost): the emulated ranks of the
 * tests reduce on the host, which no graph can hold. */
static bool auto_host(const ddt_engine_cuda *e) { return e->auto_budget && e->world > 1; }

/* The auto budget's buckets for a round of `budget` nodes that is not the full
 * budget's (the context's last rounds): the budget alone. */
static ddt_cuda_tree_auto single_bucket(const ddt_engine_cuda *e, int32_t budget) {
    ddt_cuda_tree_auto a = e->tauto;
    a.n_buckets = 1;
    a.bucket[0] = budget;
    return a;
}

#define TRY(call)                      \
    do {                               \
        ddt_status st_ = (call);       \
        if (st_ != DDT_OK) return st_; \
    } while (0)

void ddt_engine_cuda_free(ddt_engine_cuda *e) {
    if (!e) return;
    if (e->s) cudaStreamSynchronize(e->s);
    if (e->graph) cudaGraphExecDestroy(e->graph);
    if (e->argraph) cudaGraphExecDestroy(e->argraph);
    for (int32_t j = 0; j < e->n_bgraphs; j++)
        if (e->bgraph[j]) cudaGraphExecDestroy(e->bgraph[j]);
    for (int i = 0; i < N_EVENTS; i++)
        if (e->ev[i]) cudaEventDestroy(e->ev[i]);
    if (e->fork_ev) cudaEventDestroy(e->fork_ev);
    if (e->join_ev) cudaEventDestroy(e->join_ev);
    if (e->side) cudaStreamDestroy(e->side);
    ddt_cuda_drafter_free(e->drafter);
    void *dev[] = {e->ids, e->logits, e->draft_logits, e->logq, e->table_tok, e->topk_ws, e->target_next,
                   e->emit_d, e->one, e->sp_d, e->stop_d, e->vcost_d, e->score_d, e->lookup_d};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) cudaFree(dev[i]);
    ddt_cuda_tree_free(&e->tree);
    void *pinned[] = {e->emit_h, e->walk_h, e->logits_h, e->logq_h, e->ttok_h, e->tok_h, e->par_h, e->dep_h, e->vis_h,
                      e->sp_h, e->stop_h, e->score_h, e->prop_h};
    for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++)
        if (pinned[i]) cudaFreeHost(pinned[i]);
    ddt_builder_destroy(e->builder);
    free(e->vcost_h);
    free(e->kv_ids);
    ddt_tree_free(&e->htree);
    ddt_choice_free(&e->ch);
    ddt_sampler_destroy(e->sampler);
    ddt_cuda_target_free(e->target);
    free(e);
}

bool ddt_engine_cuda_available(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

int32_t ddt_engine_cuda_vocab(const ddt_engine_cuda *e) { return e->vocab; }
const ddt_cost_model *ddt_engine_cuda_cost(const ddt_engine_cuda *e) { return e->auto_budget ? &e->cost : NULL; }
const ddt_model_config *ddt_engine_cuda_model_config(const ddt_engine_cuda *e) {
    return ddt_cuda_target_config(e->target);
}
void ddt_engine_cuda_set_sampling(ddt_engine_cuda *e, const ddt_sampling *s) { e->opts.sampling = *s; }

/* Whether the builds take the draft calibration: greedy rounds only, as on the CPU
 * (engine_cpu.c); set before every capture and host build, so a graph holds the
 * setting of its sampling mode (a change of T between 0 and > 0 changes the mode,
 * which captures the graphs again). */
static void set_calibration(ddt_engine_cuda *e) {
    e->tree.cal_on = e->have_cal && e->opts.sampling.temperature <= 0.0f;
    /* a JSON constraint tracks the grammar per built node (the CPU engine's rule too) */
    e->lookup_on = e->tree.cal_on && e->tree.cal.lookup && !e->opts.no_lookup && e->opts.mode == DDT_MODE_TREE &&
                   e->ch.json.vocab == NULL;
}

/* The lookup's proposal for the next round: the committed context kv_ids[0..n_kv)
 * and the round's root, into prop_h (the previous round has finished: the host
 * synchronised on its emitted tokens). */
static void stage_lookup(ddt_engine_cuda *e, int32_t n_kv, int32_t bonus) {
    e->kv_ids[n_kv] = bonus; /* the round's commit makes it so */
    e->prop_h[0] = ddt_lookup_propose(e->kv_ids, n_kv + 1, e->depth, e->prop_h + 2, &e->prop_h[1]);
}

static ddt_status capture_graph(ddt_engine_cuda *e, int32_t budget, int32_t k, ddt_error *err);
static ddt_status measure_cost(ddt_engine_cuda *e, ddt_error *err);
static ddt_status share_cost(ddt_engine_cuda *e, bool source, ddt_error *err);
static ddt_status setup_auto(ddt_engine_cuda *e, ddt_error *err);

/* What the drafter will hold on this GPU beside the target (its own weights as
 * stored and its cache), from the two folders' descriptions (headers only), for
 * the target's memory check before its upload.  Best effort: 0 where either
 * description does not load, whose loads then report it as before. */
static uint64_t drafter_also(const char *model_dir, const char *draft_dir, int32_t max_ctx) {
    ddt_target_desc td;
    ddt_error e;
    uint64_t b = 0;
    if (ddt_target_desc_load(model_dir, NULL, 0, &td, &e) == DDT_OK) {
        const ddt_drafter_target dt = {td.dims.hidden, td.dims.n_layers, td.dims.vocab, &td.embed, &td.lm_head};
        ddt_drafter_desc dd;
        if (ddt_drafter_desc_load(draft_dir, &dt, &dd, &e) == DDT_OK)
            b = ddt_drafter_desc_weight_bytes(&dd) + ddt_drafter_desc_cache_bytes(&dd, max_ctx);
        ddt_drafter_desc_free(&dd);
    }
    ddt_target_desc_free(&td);
    return b;
}

ddt_status ddt_engine_cuda_create(const char *model_dir, const ddt_engine_options *opts, int32_t max_ctx,
                                  ddt_engine_cuda **out, ddt_error *err) {
    return ddt_engine_cuda_create_rank(model_dir, opts, max_ctx, 0, 0, NULL, NULL, NULL, out, err);
}

ddt_status ddt_engine_cuda_create_rank(const char *model_dir, const ddt_engine_options *opts, int32_t max_ctx,
                                       int32_t rank, int32_t world, ddt_cuda_allreduce_fn allreduce,
                                       ddt_cuda_allgather_fn allgather, void *ctx, ddt_engine_cuda **out,
                                       ddt_error *err) {
    *out = NULL;
    if (opts->draft_fn)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "the CUDA backend drafts with a DFlash model only (no custom drafter)");
    if (world > 1 && !allreduce)
        return ddt_fail(err, DDT_ERR_INVALID, "rank %d of %d: no all-reduce to share the stop flag with", rank, world);
    ddt_engine_cuda *e = calloc(1, sizeof *e);
    if (!e) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory creating the engine");
    e->opts = *opts;
    e->max_ctx = max_ctx;
    e->world = world;
    e->allreduce = allreduce;
    e->allreduce_ctx = ctx;
    ddt_status st;
    ddt_drafter_config dcfg;
    const bool dflash = opts->mode != DDT_MODE_AR;
    if (dflash) {
        if ((st = ddt_drafter_config_load(opts->draft_dir, &dcfg, err)) != DDT_OK) goto fail;
        e->depth = dcfg.block_size - 1;
        e->n_capture = dcfg.n_target_layers;
    }
    e->max_nodes = opts->mode == DDT_MODE_TREE ? opts->budget + 1 : opts->mode == DDT_MODE_CHAIN ? e->depth + 1 : 1;
    ddt_cuda_target_options topt = {.max_ctx = max_ctx,
                                    .max_tokens = e->max_nodes > DDT_ENGINE_PREFILL_CHUNK ? e->max_nodes
                                                                                          : DDT_ENGINE_PREFILL_CHUNK,
                                    .capture_layers = dflash ? dcfg.target_layer_ids : NULL,
                                    .n_capture = dflash ? dcfg.n_target_layers : 0,
                                    .fast_attention = opts->fast_attention,
                                    .tensor_cores = opts->tensor_cores,
                                    .shard_rank = rank,
                                    .shard_world = world,
                                    .allreduce = allreduce,
                                    .allreduce_ctx = ctx,
                                    .allgather = allgather,
                                    .also_bytes = dflash ? drafter_also(model_dir, opts->draft_dir, max_ctx) : 0};
    if ((st = ddt_cuda_target_load(model_dir, &topt, &e->target, err)) != DDT_OK) goto fail;
    e->s = (cudaStream_t)ddt_cuda_target_stream(e->target);
    e->vocab = ddt_cuda_target_vocab(e->target);
    if (dflash) {
        const ddt_model_config *tc = ddt_cuda_target_config(e->target);
        /* on the tensor cores with the target: at K2.6's size (7168 hidden, 6 layers and the
           2.35 GB head) the draft's 16 rows would read every weight 4 times on the FP32 path */
        ddt_cuda_drafter_target dt = {tc->hidden_size, tc->num_hidden_layers, e->vocab,
                                      ddt_cuda_target_embed(e->target), ddt_cuda_target_lm_head(e->target),
                                      opts->tensor_cores ? DDT_CUDA_MM_TENSOR : DDT_CUDA_MM_FP32, 0};
        if ((st = ddt_cuda_drafter_load(opts->draft_dir, &dt, max_ctx, &e->drafter, err)) != DDT_OK) goto fail;
        for (int32_t i = 0; i < e->n_capture; i++) e->capture[i] = ddt_cuda_target_hidden(e->target, i);
    }
    e->kmax = ddt_engine_topk_cap(opts->mode == DDT_MODE_TREE ? opts->budget : 1, e->vocab);
    const size_t drows = e->depth > 0 ? (size_t)e->depth : 1, V = (size_t)e->vocab;
    if ((st = ddt_cuda_malloc_array((void **)&e->ids, (size_t)max_ctx, sizeof(int32_t), NULL, err)) ||
        (st = ddt_cuda_malloc_array((void **)&e->logits, (size_t)e->max_nodes * V, sizeof(float), NULL, err)) ||
        (st = ddt_cuda_malloc_array((void **)&e->draft_logits, drows * V, sizeof(float), NULL, err)) ||
        (st = ddt_cuda_malloc_array((void **)&e->logq, drows * (size_t)e->kmax, sizeof(float), NULL, err)) ||
        (st = ddt_cuda_malloc_array((void **)&e->table_tok, drows * (size_t)e->kmax, sizeof(int32_t), NULL, err)) ||
        (st = ddt_cuda_malloc_array((void **)&e->target_next, (size_t)e->max_nodes, sizeof(int32_t), NULL, err)) ||
        (st = ddt_cuda_malloc_array((void **)&e->emit_d, DDT_CUDA_EMIT_WORDS + 1, sizeof(int32_t), NULL, err)) ||
        (st = ddt_cuda_malloc_array((void **)&e->one, 1, sizeof(int32_t), NULL, err)))
        goto fail;
    e->topk_ws_bytes = ddt_cuda_topk_workspace_bytes((int32_t)drows, e->vocab, e->kmax);
    if ((st = ddt_cuda_malloc_array(&e->topk_ws, e->topk_ws_bytes, 1, NULL, err))) goto fail;
    if ((st = ddt_cuda_tree_alloc(e->max_nodes - 1, &e->tree, err))) goto fail;
    if (opts->draft_calibration) {
        e->tree.cal = *opts->draft_calibration;
        e->have_cal = true;
    }
    set_calibration(e);
    {
        int32_t one = 1;
        cudaError_t ce = cudaMemcpy(e->one, &one, sizeof one, cudaMemcpyHostToDevice);
        if (ce == cudaSuccess) ce = cudaMallocHost((void **)&e->emit_h, (DDT_CUDA_EMIT_WORDS + 1) * sizeof(int32_t));
        if (ce == cudaSuccess) ce = cudaMallocHost((void **)&e->walk_h, (DDT_MAX_PATH + 2) * sizeof(int32_t));
        if (ce == cudaSuccess) ce = cudaMallocHost((void **)&e->sp_h, sizeof(ddt_cuda_sample_params));
        if (ce == cudaSuccess) ce = cudaMalloc((void **)&e->sp_d, sizeof(ddt_cuda_sample_params));
        if (ce == cudaSuccess) ce = cudaMallocHost((void **)&e->logits_h, (size_t)e->max_nodes * V * sizeof(float));
        if (ce == cudaSuccess && world > 1) ce = cudaMalloc((void **)&e->stop_d, sizeof(float));
        if (ce == cudaSuccess && world > 1) ce = cudaMallocHost((void **)&e->stop_h, 2 * sizeof(float));
        if (ce == cudaSuccess) ce = cudaMallocHost((void **)&e->prop_h, (2 + DDT_MAX_DEPTH) * sizeof(int32_t));
        if (ce == cudaSuccess) ce = cudaMalloc((void **)&e->lookup_d, sizeof(int32_t));
        for (int i = 0; i < N_EVENTS && ce == cudaSuccess; i++) ce = cudaEventCreate(&e->ev[i]);
        if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&e->fork_ev, cudaEventDisableTiming);
        if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&e->join_ev, cudaEventDisableTiming);
        if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&e->side, cudaStreamNonBlocking);
        if (ce != cudaSuccess) {
            st = ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: engine buffers: %s", cudaGetErrorString(ce));
            goto fail;
        }
        memset(e->prop_h, 0, (2 + DDT_MAX_DEPTH) * sizeof(int32_t)); /* no proposal */
    }
    if ((st = ddt_tree_alloc(e->max_nodes, &e->htree, err))) goto fail;
    ddt_choice_init(&e->ch, e->vocab, e->htree.capacity);
    if ((st = ddt_sampler_create(e->vocab, &e->sampler, err))) goto fail;
    if (!(e->kv_ids = ddt_malloc_array((size_t)max_ctx, sizeof(int32_t)))) {
        st = ddt_fail(err, DDT_ERR_NOMEM, "out of memory for %d context ids", max_ctx);
        goto fail;
    }
    {
        const size_t M = (size_t)e->max_nodes, cells = drows * (size_t)e->kmax;
        cudaError_t ce = cudaMallocHost((void **)&e->tok_h, M * sizeof(int32_t));
        if (ce == cudaSuccess) ce = cudaMallocHost((void **)&e->par_h, M * sizeof(int32_t));
        if (ce == cudaSuccess) ce = cudaMallocHost((void **)&e->dep_h, M * sizeof(int32_t));
        if (ce == cudaSuccess) ce = cudaMallocHost((void **)&e->vis_h, M * (size_t)e->htree.vis_words * sizeof(uint64_t));
        if (ce == cudaSuccess) ce = cudaMallocHost((void **)&e->logq_h, cells * sizeof(float));
        if (ce == cudaSuccess) ce = cudaMallocHost((void **)&e->ttok_h, cells * sizeof(int32_t));
        if (ce != cudaSuccess) {
            st = ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: engine host buffers: %s", cudaGetErrorString(ce));
            goto fail;
        }
    }
    e->auto_budget = e->auto_ready = opts->mode == DDT_MODE_TREE && opts->budget_auto;
    if (e->auto_budget) {
        /* the host builder serves host-sampled rounds (the graph's builder the rest) */
        if ((st = ddt_builder_create(e->max_nodes - 1, &e->builder, err))) goto fail;
        /* a table the caller gave is used as given (as on the CPU); else this GPU is timed */
        if (opts->cost) ddt_engine_adopt_cost(opts->cost, e->cost_nodes, e->cost_verify, &e->cost);
        else if ((st = measure_cost(e, err))) goto fail;
        /* one rank of several: rank 0's table on every rank (each timed its own GPU) */
        if (world > 1 && (st = share_cost(e, rank == 0, err))) goto fail;
        if ((st = setup_auto(e, err))) goto fail;
    }
    /* capture the full-budget greedy round now, so that no generation pays for it */
    if (!auto_host(e) &&
        (st = capture_graph(e, dflash ? e->max_nodes - 1 : 0, opts->mode == DDT_MODE_TREE ? e->kmax : 1, err)))
        goto fail;
    *out = e;
    return DDT_OK;
fail:
    ddt_engine_cuda_free(e);
    return st;
}

/* ------------------------------------------------------------------ round */

/* A phase timestamp.  Inside stream capture the record must be an external
 * event node, else capture turns it into a mere dependency and the event is
 * never recorded when the graph replays (and timing it is an error). */
static cudaError_t mark(ddt_engine_cuda *e, int i) {
    if (e->opts.cuda_no_phase_times) return cudaSuccess; /* the round's phases are not timed */
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t ce = cudaStreamIsCapturing(e->s, &cs);
    if (ce != cudaSuccess) return ce;
    if (cs != cudaStreamCaptureStatusActive) return cudaEventRecord(e->ev[i], e->s);
    /* captured: the event node on the side branch, after everything s holds so far
       (the same moment), with nothing on s waiting for it (see `side`) */
    ce = cudaEventRecord(e->fork_ev, e->s);
    if (ce == cudaSuccess) ce = cudaStreamWaitEvent(e->side, e->fork_ev, 0);
    if (ce == cudaSuccess) ce = cudaEventRecordWithFlags(e->ev[i], e->side, cudaEventRecordExternal);
    if (ce == cudaSuccess) e->marks_forked = true;
    return ce;
}

/* The end of a capture on s: the side branch of the phase events joined first
   (a capture must end with every forked stream joined). */
static cudaError_t end_capture(ddt_engine_cuda *e, cudaGraph_t *g) {
    cudaError_t ce = cudaSuccess;
    if (e->marks_forked) {
        ce = cudaEventRecord(e->join_ev, e->side);
        if (ce == cudaSuccess) ce = cudaStreamWaitEvent(e->s, e->join_ev, 0);
        e->marks_forked = false;
    }
    cudaError_t ce2 = cudaStreamEndCapture(e->s, g);
    return ce != cudaSuccess ? ce : ce2;
}

/* Draft, top-K and build on the device: the tree of budget nodes (chain: k = 1),
 * or with the auto budget (a) the cost-aware tree padded to its verify bucket. */
static ddt_status launch_draft_build(ddt_engine_cuda *e, int32_t budget, int32_t k, const ddt_cuda_tree_auto *a,
                                     ddt_error *err) {
    TRY(ddt_cuda_drafter_draft(e->drafter, e->tree.root_token, e->draft_logits, e->s, err));
    DDT_CUDA_TRY(mark(e, 1), err);
    TRY(ddt_cuda_topk_logsoftmax(e->draft_logits, e->depth, e->vocab, k, e->logq, e->table_tok, e->topk_ws,
                                 e->topk_ws_bytes, e->s, err));
    if (a) TRY(ddt_cuda_tree_build_auto(&e->tree, e->logq, e->table_tok, e->depth, k, budget, e->vocab, a, e->s, err));
    else TRY(ddt_cuda_tree_build(&e->tree, e->logq, e->table_tok, e->depth, k, budget, e->vocab, e->s, err));
    /* the auto budget's cut stands: the lookup competes within the nodes it kept */
    if (e->lookup_on) TRY(ddt_cuda_tree_graft(&e->tree, e->prop_h, budget, a != NULL, e->lookup_d, e->s, err));
    DDT_CUDA_TRY(mark(e, 2), err);
    return DDT_OK;
}

static ddt_status launch_verify(ddt_engine_cuda *e, int32_t n, ddt_error *err) {
    TRY(ddt_cuda_target_verify(e->target, e->tree.token, e->tree.depth, e->tree.vis, e->tree.vis_words, n,
                               e->logits, err));
    DDT_CUDA_TRY(mark(e, 3), err);
    return DDT_OK;
}

/* Commit the path in tree.path / path_len, feed the drafter, pack the emitted tokens.
 * The drafter's append computes max_m rows and stores path_len of them: a path is
 * the root and at most depth nodes (the build's table has depth rows, the lookup
 * proposes at most depth tokens), so depth + 1 rows, 16 for the shipped drafter
 * where DDT_MAX_PATH would be 32 (a path longer than max_m would be refused by the
 * append, its status word set, never stored in part). */
static ddt_status launch_commit(ddt_engine_cuda *e, ddt_error *err) {
    TRY(ddt_cuda_target_commit(e->target, e->tree.path, e->tree.path_len, err));
    const int32_t max_m = e->depth + 1 < DDT_MAX_PATH ? e->depth + 1 : DDT_MAX_PATH;
    TRY(ddt_cuda_drafter_append_rows(e->drafter, e->capture, e->tree.path, e->tree.path_len, max_m, e->s, err));
    TRY(ddt_cuda_tree_emit(&e->tree, e->emit_d, e->s, err));
    DDT_CUDA_TRY(mark(e, 5), err);
    return DDT_OK;
}

/* The target's token at each of the n rows of logits (n_dev: the same count on
 * the device, as the argmax kernel reads it): argmax, or the device sampler with
 * the settings and round in sp_d. */
static ddt_status launch_next(ddt_engine_cuda *e, int mode, int32_t n, const int32_t *n_dev, int32_t *out,
                              ddt_error *err) {
    if (mode == NEXT_SAMPLE) return ddt_cuda_sample_nodes_dev(e->logits, e->vocab, n, e->vocab, e->sp_d, 0, out, e->s, err);
    return ddt_cuda_argmax_rows(e->logits, n, n_dev, e->vocab, out, e->s, err);
}

/* Stage the settings and this round's counter for the device sampler (the
 * previous round was synchronised, so the pinned buffer is free). */
static ddt_status stage_sampling(ddt_engine_cuda *e, uint64_t round, ddt_error *err) {
    const ddt_sampling *sm = &e->opts.sampling;
    *e->sp_h = (ddt_cuda_sample_params){sm->temperature, sm->top_k, sm->top_p, 0u, sm->seed, round};
    DDT_CUDA_TRY(cudaMemcpyAsync(e->sp_d, e->sp_h, sizeof *e->sp_h, cudaMemcpyHostToDevice, e->s), err);
    return DDT_OK;
}

/* A chain / tree round on the device verifying `rows` rows: draft, top-K, the
 * build (under the auto budget's rule a, or NULL for a fixed budget), verify, each
 * node's token, accept, commit.  The auto budget's graphs verify a bucket's rows
 * (bgraph: the build capped at that bucket), other rounds budget + 1. */
static ddt_status launch_tree_rows(ddt_engine_cuda *e, int32_t budget, int32_t k, const ddt_cuda_tree_auto *a,
                                   int32_t rows, ddt_error *err) {
    const int mode = e->graph_next;
    DDT_CUDA_TRY(mark(e, 0), err);
    TRY(launch_draft_build(e, budget, k, a, err));
    TRY(launch_verify(e, rows, err));
    TRY(launch_next(e, mode, rows, e->tree.n_nodes, e->target_next, err));
    TRY(ddt_cuda_tree_accept(&e->tree, e->target_next, e->vocab, e->s, err));
    DDT_CUDA_TRY(mark(e, 4), err);
    return launch_commit(e, err);
}

/* One target step on the root token: its row committed, the next token (mode)
 * into root_token; feed: the row also appended to the drafter's context (the auto
 * budget's fallback steps, after which a round may draft again). */
static ddt_status launch_ar_step(ddt_engine_cuda *e, int mode, bool feed, ddt_error *err) {
    DDT_CUDA_TRY(mark(e, 0), err);
    TRY(ddt_cuda_target_prefill(e->target, e->tree.root_token, 1, e->logits, false, err));
    if (feed) TRY(ddt_cuda_drafter_append_prefix(e->drafter, e->capture, 1, e->s, err));
    if (mode != NEXT_HOST) TRY(launch_next(e, mode, 1, e->one, e->tree.root_token, err));
    DDT_CUDA_TRY(mark(e, 3), err);
    return DDT_OK;
}

/* The whole device round (the graph's body), greedy or with the device sampler
 * (mode); AR (budget 0): one target step. */
static ddt_status launch_device_round(ddt_engine_cuda *e, int32_t budget, int32_t k, ddt_error *err) {
    /* an engine with a drafter feeds it in ar steps too, so that it can draft again
       after a switch (ddt_engine_cuda_set_speculation) with its context the target's */
    if (e->opts.mode == DDT_MODE_AR) return launch_ar_step(e, e->graph_next, e->drafter != NULL, err);
    /* the auto budget outside the graph (the context's last rounds): one verify
       bucket, the whole budget, since the host cannot see the device's choice */
    const ddt_cuda_tree_auto one_bucket = single_bucket(e, budget);
    return launch_tree_rows(e, budget, k, e->auto_budget ? &one_bucket : NULL, budget + 1, err);
}

static int32_t count_kernels(cudaGraph_t g) {
    size_t nn = 0;
    int32_t count = 0;
    if (cudaGraphGetNodes(g, NULL, &nn) != cudaSuccess || nn == 0) return 0;
    cudaGraphNode_t *nodes = ddt_calloc_array(nn, sizeof *nodes);
    if (nodes && cudaGraphGetNodes(g, nodes, &nn) == cudaSuccess)
        for (size_t i = 0; i < nn; i++) {
            enum cudaGraphNodeType ty;
            if (cudaGraphNodeGetType(nodes[i], &ty) == cudaSuccess && ty == cudaGraphNodeTypeKernel) count++;
        }
    free(nodes);
    return count;
}

/* Programmatic dependent launch for a captured round graph
 * (ddt_cuda_graph_programmatic): the round's kernel-to-kernel edges fire when
 * the first kernel's blocks have all started, so on a small model whose kernels
 * last a few microseconds the second kernel's launch gap overlaps the first.
 * Only for one GPU without NCCL: a multi-GPU round also holds NCCL's kernels,
 * which do not wait.  *converted counts the edges changed. */
static ddt_status programmatic_edges(const ddt_engine_cuda *e, cudaGraph_t g, bool ar_step, int32_t *converted,
                                     ddt_error *err) {
    const bool products_only = e->opts.cuda_pdl_edges == DDT_PDL_EDGES_PRODUCTS ||
                               (e->opts.cuda_pdl_edges == DDT_PDL_EDGES_DEFAULT && ar_step);
    return ddt_cuda_graph_programmatic(g, products_only, converted, err);
}

/* world 0 = the single-GPU engine; a rank (even the one rank of --gpus 1 over
   NCCL) has an all-reduce whose kernels are not ours.  Which edges: see
   DDT_PDL_EDGES_* (engine.h); an ar step takes only those into the products by
   default (with every edge programmatic it ran 0.98x plain edges, with those
   alone 1.12x: the others only add early-resident blocks that wait). */
static bool use_pdl(const ddt_engine_cuda *e) {
    return e->world <= 1 && !e->allreduce && !e->opts.cuda_no_pdl;
}

/* The auto budget's graphs, one per verify bucket: bgraph[j] builds the
 * cost-aware tree over every bucket, writes the rule's bucket for the host,
 * cuts the tree at that bucket or j and verifies bucket j's rows.  graph_kernels:
 * the largest one's kernels; graph_pdl: its programmatic edges. */
static ddt_status capture_bucket_graphs(ddt_engine_cuda *e, int32_t budget, int32_t k, ddt_error *err) {
    for (int32_t j = 0; j < e->n_bgraphs; j++)
        if (e->bgraph[j]) {
            DDT_CUDA_TRY(cudaGraphExecDestroy(e->bgraph[j]), err);
            e->bgraph[j] = NULL;
        }
    e->n_bgraphs = 0;
    for (int32_t j = 0; j < e->tauto.n_buckets; j++) {
        ddt_cuda_tree_auto a = e->tauto;
        a.capped = true;
        a.cap = j;
        a.choice = e->emit_d + DDT_CUDA_EMIT_WORDS;
        cudaGraph_t g = NULL;
        DDT_CUDA_TRY(cudaStreamBeginCapture(e->s, cudaStreamCaptureModeThreadLocal), err);
        ddt_status st = launch_tree_rows(e, budget, k, &a, a.bucket[j] + 1, err);
        cudaError_t ce = end_capture(e, &g);
        int32_t pdl = 0;
        if (st == DDT_OK && ce == cudaSuccess) e->graph_kernels = count_kernels(g);
        if (st == DDT_OK && ce == cudaSuccess && use_pdl(e)) st = programmatic_edges(e, g, false, &pdl, err);
        if (st == DDT_OK && ce == cudaSuccess) ce = cudaGraphInstantiate(&e->bgraph[j], g, 0);
        if (g) cudaGraphDestroy(g);
        if (st != DDT_OK) return st;
        if (ce != cudaSuccess)
            return ddt_fail(err, DDT_ERR_INTERNAL, "CUDA graph of the auto budget's bucket %d (%d rows): %s", j,
                            a.bucket[j] + 1, cudaGetErrorString(ce));
        e->n_bgraphs = j + 1;
        e->graph_pdl = pdl;
    }
    e->graph_budget = budget;
    return DDT_OK;
}

/* The auto budget's fallback step as a graph (launch_ar_step feeding the drafter),
 * its edges as an ar engine's. */
static ddt_status capture_ar_graph(ddt_engine_cuda *e, ddt_error *err) {
    if (e->argraph) {
        DDT_CUDA_TRY(cudaGraphExecDestroy(e->argraph), err);
        e->argraph = NULL;
    }
    cudaGraph_t g = NULL;
    int32_t pdl = 0;
    DDT_CUDA_TRY(cudaStreamBeginCapture(e->s, cudaStreamCaptureModeThreadLocal), err);
    ddt_status st = launch_ar_step(e, e->graph_next, true, err);
    cudaError_t ce = end_capture(e, &g);
    if (st == DDT_OK && ce == cudaSuccess && use_pdl(e)) st = programmatic_edges(e, g, true, &pdl, err);
    if (st == DDT_OK && ce == cudaSuccess) ce = cudaGraphInstantiate(&e->argraph, g, 0);
    if (g) cudaGraphDestroy(g);
    if (st != DDT_OK) return st;
    if (ce != cudaSuccess) {
        e->argraph = NULL;
        return ddt_fail(err, DDT_ERR_INTERNAL, "CUDA graph of the auto budget's ar step: %s", cudaGetErrorString(ce));
    }
    return DDT_OK;
}

/* The graphs of the current setting (mode, auto) for rounds of `budget` nodes and
 * k candidates a depth (an ar step: 0, 1); those of another setting go first. */
static ddt_status capture_graph(ddt_engine_cuda *e, int32_t budget, int32_t k, ddt_error *err) {
    if (e->graph) {
        DDT_CUDA_TRY(cudaGraphExecDestroy(e->graph), err);
        e->graph = NULL;
    }
    if (e->argraph) {
        DDT_CUDA_TRY(cudaGraphExecDestroy(e->argraph), err);
        e->argraph = NULL;
    }
    for (int32_t j = 0; j < e->n_bgraphs; j++)
        if (e->bgraph[j]) {
            DDT_CUDA_TRY(cudaGraphExecDestroy(e->bgraph[j]), err);
            e->bgraph[j] = NULL;
        }
    e->n_bgraphs = 0;
    e->graph_budget = -1; /* nothing captured, until the end */
    e->graph_next = next_mode(e) == NEXT_SAMPLE ? NEXT_SAMPLE : NEXT_ARGMAX;
    e->graph_mode = e->opts.mode;
    e->graph_auto = e->auto_budget;
    cudaGraph_t g = NULL;
    ddt_status st;
    cudaError_t ce = cudaSuccess;
    e->graph_pdl = 0;
    if (e->auto_budget) {
        TRY(capture_ar_graph(e, err));
        return capture_bucket_graphs(e, budget, k, err);
    }
    DDT_CUDA_TRY(cudaStreamBeginCapture(e->s, cudaStreamCaptureModeThreadLocal), err);
    st = launch_device_round(e, budget, k, err);
    ce = end_capture(e, &g);
    /* the round's kernels, counted before the graph goes (what the launch-bound small model pays) */
    if (st == DDT_OK && ce == cudaSuccess) e->graph_kernels = count_kernels(g);
    if (st == DDT_OK && ce == cudaSuccess && use_pdl(e))
        st = programmatic_edges(e, g, e->opts.mode == DDT_MODE_AR, &e->graph_pdl, err);
    if (st != DDT_OK) {
        if (g) cudaGraphDestroy(g);
        return st;
    }
    if (ce != cudaSuccess) return ddt_fail(err, DDT_ERR_INTERNAL, "CUDA graph capture: %s", cudaGetErrorString(ce));
    ce = cudaGraphInstantiate(&e->graph, g, 0);
    cudaGraphDestroy(g);
    if (ce != cudaSuccess) {
        e->graph = NULL;
        return ddt_fail(err, DDT_ERR_INTERNAL, "CUDA graph instantiate: %s", cudaGetErrorString(ce));
    }
    e->graph_budget = budget;
    return DDT_OK;
}

typedef struct host_walk {
    ddt_engine_cuda *e;
    uint64_t round;
} host_walk;

static ddt_status sample_node(void *ctx, int32_t node, int32_t *token, ddt_error *err) {
    const host_walk *hw = ctx;
    ddt_engine_cuda *e = hw->e;
    return ddt_choice_pick_node(&e->ch, e->sampler, &e->opts.sampling, &e->htree,
                                e->logits_h + (size_t)node * (size_t)e->vocab, node, hw->round, token, err);
}

static ddt_status walk_on_host(ddt_engine_cuda *e, uint64_t round, ddt_error *err);

/* A sampled round: draft, build and verify on the device, the walk on the host. */
static ddt_status sampled_round(ddt_engine_cuda *e, int32_t budget, int32_t k, uint64_t round, ddt_error *err) {
    DDT_CUDA_TRY(mark(e, 0), err);
    TRY(launch_draft_build(e, budget, k, NULL, err));
    const int32_t n = budget + 1;
    TRY(launch_verify(e, n, err));
    DDT_CUDA_TRY(cudaMemcpyAsync(e->logits_h, e->logits, sizeof(float) * (size_t)n * e->vocab,
                                 cudaMemcpyDeviceToHost, e->s), err);
    DDT_CUDA_TRY(cudaMemcpyAsync(e->emit_h, e->tree.n_nodes, sizeof(int32_t), cudaMemcpyDeviceToHost, e->s), err);
    DDT_CUDA_TRY(cudaMemcpyAsync(e->emit_h + 1, e->tree.status, sizeof(int32_t), cudaMemcpyDeviceToHost, e->s), err);
    DDT_CUDA_TRY(cudaStreamSynchronize(e->s), err);
    if (e->emit_h[1] != DDT_CUDA_TREE_OK || e->emit_h[0] != n)
        return ddt_fail(err, DDT_ERR_INTERNAL, "device tree build: status %d, %d nodes (expected %d)", e->emit_h[1],
                        e->emit_h[0], n);
    DDT_CUDA_TRY(cudaMemcpy(e->tok_h, e->tree.token, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost), err);
    DDT_CUDA_TRY(cudaMemcpy(e->par_h, e->tree.parent, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost), err);
    TRY(ddt_tree_from_parents(e->tok_h, e->par_h, n, e->vocab, &e->htree, err));
    return walk_on_host(e, round, err);
}

/* The walk of e->htree on the host over the verify logits in logits_h (the CPU
 * sampler's draws), the path handed back to the device, then the commit. */
static ddt_status walk_on_host(ddt_engine_cuda *e, uint64_t round, ddt_error *err) {
    host_walk hw = {e, round};
    /* the grammar's state after each node's path: the trees here were built without it */
    ddt_choice_tree_states(&e->ch, &e->htree);
    ddt_walk_result w;
    TRY(ddt_tree_walk_fn(&e->htree, sample_node, &hw, e->vocab, &w, err));
    DDT_CUDA_TRY(mark(e, 4), err);
    /* the device walk's outputs, as the greedy round's accept kernel leaves them */
    memcpy(e->walk_h, w.path, sizeof(int32_t) * (size_t)w.length);
    e->walk_h[DDT_MAX_PATH] = w.length;
    e->walk_h[DDT_MAX_PATH + 1] = w.bonus;
    DDT_CUDA_TRY(cudaMemcpyAsync(e->tree.path, e->walk_h, sizeof(int32_t) * DDT_MAX_PATH, cudaMemcpyHostToDevice,
                                 e->s), err);
    DDT_CUDA_TRY(cudaMemcpyAsync(e->tree.path_len, e->walk_h + DDT_MAX_PATH, sizeof(int32_t), cudaMemcpyHostToDevice,
                                 e->s), err);
    DDT_CUDA_TRY(cudaMemcpyAsync(e->tree.bonus, e->walk_h + DDT_MAX_PATH + 1, sizeof(int32_t),
                                 cudaMemcpyHostToDevice, e->s), err);
    DDT_CUDA_TRY(cudaMemcpyAsync(e->tree.root_token, e->walk_h + DDT_MAX_PATH + 1, sizeof(int32_t),
                                 cudaMemcpyHostToDevice, e->s), err);
    return launch_commit(e, err);
}

/*
 * A round with --budget auto off the graph: host-sampled (settings the device
 * sampler does not take) or one rank of several (auto_host); the other rounds
 * build on the device inside the graph.  The drafter and top-K run on the
 * device, the D x K table comes to the host, where the CPU builder grows the
 * tree and cuts it at the best verify bucket, as the device does; the tree goes
 * back to the device for verify, then the device walk (greedy) or the logits to
 * the host for the host walk.  *capped counts the rounds cut at the bucket the
 * round before chose (the bucket graphs' rule, kept so both paths verify the same).
 */
static ddt_status auto_round(ddt_engine_cuda *e, int32_t budget, int32_t k, int32_t bonus, uint64_t round,
                             bool greedy, int32_t *n_out, int32_t *capped, ddt_error *err) {
    const size_t cells = (size_t)e->depth * (size_t)k;
    DDT_CUDA_TRY(mark(e, 0), err);
    TRY(ddt_cuda_drafter_draft(e->drafter, e->tree.root_token, e->draft_logits, e->s, err));
    DDT_CUDA_TRY(mark(e, 1), err);
    TRY(ddt_cuda_topk_logsoftmax(e->draft_logits, e->depth, e->vocab, k, e->logq, e->table_tok, e->topk_ws,
                                 e->topk_ws_bytes, e->s, err));
    DDT_CUDA_TRY(cudaMemcpyAsync(e->logq_h, e->logq, sizeof(float) * cells, cudaMemcpyDeviceToHost, e->s), err);
    DDT_CUDA_TRY(cudaMemcpyAsync(e->ttok_h, e->table_tok, sizeof(int32_t) * cells, cudaMemcpyDeviceToHost, e->s),
                 err);
    DDT_CUDA_TRY(cudaStreamSynchronize(e->s), err);
    if (e->tree.cal_on) ddt_cal_apply(&e->tree.cal, e->logq_h, e->depth, k, k); /* the device build's weights */
    ddt_draft_table tb = {e->depth, k, e->logq_h, e->ttok_h};
    /* the graph round's rule on the host: the full tree, cut at the best verify
       bucket (ddt_cost_bucket_cut; the device's cut is the same), so host- and
       device-sampled rounds verify the same trees */
    TRY(ddt_tree_build(e->builder, &tb, bonus, budget, NULL, e->vocab, &e->htree, err));
    const ddt_cuda_tree_auto a =
        budget == e->tauto.bucket[e->tauto.n_buckets - 1] ? e->tauto : single_bucket(e, budget);
    int32_t j;
    int32_t keep =
        ddt_cost_bucket_cut(e->htree.logw, e->htree.n_nodes, e->vcost_h, a.draft_cost, a.bucket, a.n_buckets, &j);
    if (a.n_buckets == e->tauto.n_buckets) { /* the bucket graphs' rule, as the device runs it */
        if (j > e->auto_bucket) {
            const int32_t b = a.bucket[e->auto_bucket];
            ++*capped;
            keep = (b < e->htree.n_nodes - 1 ? b : e->htree.n_nodes - 1) + 1;
        }
        e->auto_bucket = j;
    }
    if (e->lookup_on) { /* the graft keeps at most the cut's nodes and leaves a walkable tree */
        float v[DDT_MAX_DEPTH];
        const int32_t len = e->prop_h[0];
        if (len > 0) ddt_cal_lookup_weights(&e->tree.cal, e->prop_h[1], len, v);
        int32_t grafted;
        TRY(ddt_tree_graft(&e->htree, e->prop_h + 2, v, len, keep - 1, e->vocab, &grafted, err));
        e->lookup_host += grafted;
    } else if (keep < e->htree.n_nodes) { /* the kept prefix as a walkable tree of its own */
        memcpy(e->tok_h, e->htree.token, sizeof(int32_t) * (size_t)keep);
        memcpy(e->par_h, e->htree.parent, sizeof(int32_t) * (size_t)keep);
        TRY(ddt_tree_from_parents(e->tok_h, e->par_h, keep, e->vocab, &e->htree, err));
    }
    const int32_t n = e->htree.n_nodes;
    if (e->htree.vis_words != e->tree.vis_words)
        return ddt_fail(err, DDT_ERR_INTERNAL, "auto budget: host tree rows of %d words, device %d",
                        e->htree.vis_words, e->tree.vis_words);
    /* pinned staging, so the copies stay asynchronous */
    memcpy(e->tok_h, e->htree.token, sizeof(int32_t) * (size_t)n);
    memcpy(e->par_h, e->htree.parent, sizeof(int32_t) * (size_t)n);
    memcpy(e->dep_h, e->htree.depth, sizeof(int32_t) * (size_t)n);
    memcpy(e->vis_h, e->htree.vis, sizeof(uint64_t) * (size_t)n * (size_t)e->htree.vis_words);
    e->emit_h[0] = n;
    e->emit_h[1] = DDT_CUDA_TREE_OK;
    const enum cudaMemcpyKind h2d = cudaMemcpyHostToDevice;
    DDT_CUDA_TRY(cudaMemcpyAsync(e->tree.token, e->tok_h, sizeof(int32_t) * (size_t)n, h2d, e->s), err);
    DDT_CUDA_TRY(cudaMemcpyAsync(e->tree.parent, e->par_h, sizeof(int32_t) * (size_t)n, h2d, e->s), err);
    DDT_CUDA_TRY(cudaMemcpyAsync(e->tree.depth, e->dep_h, sizeof(int32_t) * (size_t)n, h2d, e->s), err);
    DDT_CUDA_TRY(cudaMemcpyAsync(e->tree.vis, e->vis_h, sizeof(uint64_t) * (size_t)n * (size_t)e->tree.vis_words,
                                 h2d, e->s), err);
    DDT_CUDA_TRY(cudaMemcpyAsync(e->tree.n_nodes, e->emit_h, sizeof(int32_t), h2d, e->s), err);
    DDT_CUDA_TRY(cudaMemcpyAsync(e->tree.status, e->emit_h + 1, sizeof(int32_t), h2d, e->s), err);
    DDT_CUDA_TRY(mark(e, 2), err);
    TRY(launch_verify(e, n, err));
    *n_out = n;
    if (greedy) { /* several ranks (auto_host) */
        TRY(ddt_cuda_argmax_rows(e->logits, n, e->tree.n_nodes, e->vocab, e->target_next, e->s, err));
        TRY(ddt_cuda_tree_accept(&e->tree, e->target_next, e->vocab, e->s, err));
        DDT_CUDA_TRY(mark(e, 4), err);
        return launch_commit(e, err);
    }
    DDT_CUDA_TRY(cudaMemcpyAsync(e->logits_h, e->logits, sizeof(float) * (size_t)n * e->vocab,
                                 cudaMemcpyDeviceToHost, e->s), err);
    DDT_CUDA_TRY(cudaStreamSynchronize(e->s), err);
    return walk_on_host(e, round, err);
}

/* The seconds between events 0 and 1 once 1 has happened, as the float
 * ms * 1e-3f (the value this engine has always stored). */
static ddt_status event_seconds(ddt_engine_cuda *e, double *seconds, ddt_error *err) {
    DDT_CUDA_TRY(cudaEventSynchronize(e->ev[1]), err);
    float ms = 0.0f;
    DDT_CUDA_TRY(cudaEventElapsedTime(&ms, e->ev[0], e->ev[1]), err);
    *seconds = (double)(ms * 1e-3f);
    return DDT_OK;
}

/* What a round's work costs in the round's own graph: fn captured in a graph,
 * replayed once to warm up, then timed over one replay.  Timing launches from
 * the host instead would measure the host's launch rate (a small model's
 * kernels are shorter than their launches) and call every size equally dear. */
typedef ddt_status (*graph_work_fn)(ddt_engine_cuda *e, int32_t n, ddt_error *err);

static ddt_status time_in_graph(ddt_engine_cuda *e, graph_work_fn fn, int32_t n, double *seconds, ddt_error *err) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    DDT_CUDA_TRY(cudaStreamBeginCapture(e->s, cudaStreamCaptureModeThreadLocal), err);
    ddt_status st = fn(e, n, err);
    cudaError_t ce = end_capture(e, &g);
    int32_t converted = 0; /* the cost of the round's work as the round's graph runs it */
    if (st == DDT_OK && ce == cudaSuccess && use_pdl(e))
        st = programmatic_edges(e, g, e->opts.mode == DDT_MODE_AR, &converted, err);
    if (st == DDT_OK && ce == cudaSuccess) ce = cudaGraphInstantiate(&x, g, 0);
    if (g) cudaGraphDestroy(g);
    if (st == DDT_OK && ce == cudaSuccess) ce = cudaGraphLaunch(x, e->s);
    if (st == DDT_OK && ce == cudaSuccess) ce = cudaEventRecord(e->ev[0], e->s);
    if (st == DDT_OK && ce == cudaSuccess) ce = cudaGraphLaunch(x, e->s);
    if (st == DDT_OK && ce == cudaSuccess) ce = cudaEventRecord(e->ev[1], e->s);
    if (st == DDT_OK && ce != cudaSuccess)
        st = ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: timing the auto budget's cost in a graph: %s", cudaGetErrorString(ce));
    if (st == DDT_OK) st = event_seconds(e, seconds, err);
    if (x) cudaGraphExecDestroy(x);
    return st;
}

/* A forward of n tokens after a context of e->cost_ctx rows (filled once by
 * measure_cost), with the LM head on all n rows and the argmax launch (its rows
 * run side by side, so one row's count stands for n): what verifying n - 1 nodes
 * costs.  (Without the LM head the table was flatter than a round: on the H200
 * the head is the product that grows most with n, and the auto budget overshot,
 * picking 32 where 16 was best; from an empty cache the attention's growth with
 * n was missing too.) */
static ddt_status forward_work(ddt_engine_cuda *e, int32_t n, ddt_error *err) {
    TRY(ddt_cuda_target_rewind(e->target, e->cost_ctx, err));
    TRY(ddt_cuda_target_prefill(e->target, e->ids, n, e->logits, true, err));
    return ddt_cuda_argmax_rows(e->logits, n, e->one, e->vocab, e->target_next, e->s, err);
}

/* The rest of a round that grows with nothing: draft, top-K and the build of the
 * full budget. */
static ddt_status draft_work(ddt_engine_cuda *e, int32_t n, ddt_error *err) {
    (void)n;
    TRY(ddt_cuda_drafter_draft(e->drafter, e->ids, e->draft_logits, e->s, err));
    TRY(ddt_cuda_topk_logsoftmax(e->draft_logits, e->depth, e->vocab, e->kmax, e->logq, e->table_tok, e->topk_ws,
                                 e->topk_ws_bytes, e->s, err));
    return ddt_cuda_tree_build(&e->tree, e->logq, e->table_tok, e->depth, e->kmax, e->max_nodes - 1, e->vocab, e->s,
                               err);
}

static ddt_status time_forward(void *ctx, int32_t n, double *seconds, ddt_error *err) {
    return time_in_graph(ctx, forward_work, n, seconds, err);
}

static ddt_status time_draft(void *ctx, int32_t n, double *seconds, ddt_error *err) {
    return time_in_graph(ctx, draft_work, n, seconds, err);
}

/* Measure C_verify(n) and the draft cost on this GPU for the auto budget
 * (round.h: best of three after a warm-up, non-decreasing), timed with events
 * around graph replays. */
static ddt_status measure_cost(ddt_engine_cuda *e, ddt_error *err) {
    DDT_CUDA_TRY(cudaMemsetAsync(e->ids, 0, sizeof(int32_t) * (size_t)e->max_nodes, e->s), err);
    /* verify at a typical context (random cache rows; a round's attention reads
       them all), never past the room a round needs */
    const int32_t room = e->max_ctx - e->max_nodes - 1;
    e->cost_ctx = room < DDT_ENGINE_COST_CONTEXT ? (room > 0 ? room : 0) : DDT_ENGINE_COST_CONTEXT;
    if (e->cost_ctx > 0) TRY(ddt_cuda_target_fake_context(e->target, e->cost_ctx, 0x5eedc057ull, err));
    ddt_cost_model cost;
    TRY(ddt_engine_measure_cost(e->max_nodes - 1, time_forward, time_draft, e, e->cost_nodes, e->cost_verify, &cost,
                                err));
    TRY(ddt_cuda_target_reset(e->target, err));
    TRY(ddt_cuda_drafter_reset(e->drafter, e->s, err));
    DDT_CUDA_TRY(cudaStreamSynchronize(e->s), err);
    e->cost = cost;
    return DDT_OK;
}

/* The ranks of a multi-GPU engine each measured (or were given) a cost table, but
 * must build the same trees, so they agree on rank 0's: one all-reduce of rank 0's
 * packed table and every other rank's zeros (round.h, ddt_engine_cost_pack), eager,
 * at creation, where every rank's thread creates its engine at the same time
 * (engine_multi_cuda.c run_ranks).  Every rank measures, though only rank 0's table
 * is kept: the timed forwards of a sharded target hold its all-reduces, which need
 * every rank. */
static ddt_status share_cost(ddt_engine_cuda *e, bool source, ddt_error *err) {
    float h[DDT_ENGINE_COST_WIRE];
    ddt_engine_cost_pack(&e->cost, source, h);
    float *d = NULL;
    TRY(ddt_cuda_malloc_array((void **)&d, DDT_ENGINE_COST_WIRE, sizeof(float), NULL, err));
    ddt_status st = DDT_OK;
    cudaError_t ce = cudaMemcpyAsync(d, h, sizeof h, cudaMemcpyHostToDevice, e->s);
    if (ce == cudaSuccess) st = e->allreduce(e->allreduce_ctx, d, DDT_ENGINE_COST_WIRE, e->s, err);
    if (ce == cudaSuccess && st == DDT_OK) ce = cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, e->s);
    if (ce == cudaSuccess && st == DDT_OK) ce = cudaStreamSynchronize(e->s);
    cudaFree(d);
    if (st != DDT_OK) return st;
    if (ce != cudaSuccess)
        return ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: sharing the auto budget's cost table: %s",
                        cudaGetErrorString(ce));
    return ddt_engine_cost_unpack(h, e->cost_nodes, e->cost_verify, &e->cost, err);
}

/* The auto budget's device side: the verify cost per node count the CPU builder
 * would use (ddt_cost_verify at n = 0..max budget, the engine's one context row),
 * and the verify buckets: the cost table's node counts rounded up (the sizes whose
 * cost was measured, so a tree's real price is its bucket's entry), then the
 * budget.  Nothing here runs per round. */
static ddt_status setup_auto(ddt_engine_cuda *e, ddt_error *err) {
    const int32_t budget = e->max_nodes - 1;
    float *v = e->vcost_h = ddt_calloc_array((size_t)e->max_nodes, sizeof *v);
    if (!v) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory for the auto budget's cost table");
    for (int32_t n = 0; n <= budget; n++) v[n] = ddt_cost_verify(&e->cost, (float)n);
    ddt_status st = ddt_cuda_malloc_array((void **)&e->vcost_d, (size_t)e->max_nodes, sizeof(float), NULL, err);
    cudaError_t ce = st == DDT_OK ? cudaMemcpy(e->vcost_d, v, sizeof(float) * (size_t)e->max_nodes,
                                               cudaMemcpyHostToDevice)
                                  : cudaSuccess;
    if (st) return st;
    DDT_CUDA_TRY(ce, err);
    ddt_cuda_tree_auto *a = &e->tauto;
    memset(a, 0, sizeof *a);
    a->vcost = e->vcost_d;
    a->draft_cost = e->cost.draft;
    for (int32_t i = 0; i < e->cost.n_nodes && a->n_buckets < DDT_CUDA_TREE_MAX_BUCKETS - 1; i++) {
        const float x = ceilf(e->cost.nodes[i]);
        if (!(x < (float)budget)) break;
        const int32_t b = x > 0.0f ? (int32_t)x : 0;
        if (a->n_buckets == 0 || b > a->bucket[a->n_buckets - 1]) a->bucket[a->n_buckets++] = b;
    }
    a->bucket[a->n_buckets++] = budget;
    return DDT_OK;
}

/* Lockstep ranks (world > 1): this rank's stop flag in, the sum over the ranks
 * back to stop_h[1], read after the round's own synchronisation (no extra one).
 * Issued on every rank at the start of every round, before the round's
 * collectives, so the ranks' collectives stay in the same order. */
static ddt_status stop_exchange(ddt_engine_cuda *e, float flag, ddt_error *err) {
    e->stop_h[0] = flag; /* the previous round was synchronised: the pinned word is free */
    DDT_CUDA_TRY(cudaMemcpyAsync(e->stop_d, e->stop_h, sizeof(float), cudaMemcpyHostToDevice, e->s), err);
    TRY(e->allreduce(e->allreduce_ctx, e->stop_d, 1, e->s, err));
    DDT_CUDA_TRY(cudaMemcpyAsync(e->stop_h + 1, e->stop_d, sizeof(float), cudaMemcpyDeviceToHost, e->s), err);
    return DDT_OK;
}

/* After the round's synchronisation: some rank's caller cancelled, every rank ends
 * here and drops the round's tokens. */
static bool stop_all(const ddt_engine_cuda *e) { return e->stop_d && e->stop_h[1] > 0.0f; }

ddt_status ddt_engine_cuda_set_speculation(ddt_engine_cuda *e, ddt_mode mode, int32_t budget, bool budget_auto,
                                          ddt_error *err) {
    if (e->world > 1)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "switching the mode: one GPU or the CPU backend only");
    if (mode != DDT_MODE_AR && !e->drafter)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "mode %s needs a drafter, and this engine was started in ar mode",
                        ddt_mode_name(mode));
    if (mode == DDT_MODE_CHAIN && e->depth + 1 > e->max_nodes)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "mode chain verifies %d nodes, the engine holds %d (start it with "
                        "a budget of at least %d)", e->depth + 1, e->max_nodes, e->depth);
    if (mode == DDT_MODE_TREE && (budget < 1 || budget > e->max_nodes - 1))
        return ddt_fail(err, DDT_ERR_RANGE, "budget %d outside the 1..%d nodes this engine allocated", budget,
                        e->max_nodes - 1);
    if (mode == DDT_MODE_TREE && budget_auto && (!e->auto_ready || budget != e->max_nodes - 1))
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "the auto budget on the GPU needs an engine started with it (its "
                        "cost table and verify buckets are made then), and its budget (%d)", e->max_nodes - 1);
    /* the graphs follow at the next generation's start */
    e->opts.mode = mode;
    if (mode == DDT_MODE_TREE) e->opts.budget = budget;
    e->auto_budget = e->opts.budget_auto = mode == DDT_MODE_TREE && budget_auto;
    return DDT_OK;
}

/* A rank of several takes them too: every rank holds the same logits after each
 * all-reduce, so every rank's host walk picks the same tokens. */
ddt_status ddt_engine_cuda_set_constraint(ddt_engine_cuda *e, const ddt_json_constraint *c, ddt_error *err) {
    return ddt_choice_set_constraint(&e->ch, c, err);
}

ddt_status ddt_engine_cuda_set_logit_rules(ddt_engine_cuda *e, const ddt_logit_rules *r, ddt_error *err) {
    return ddt_choice_set_rules(&e->ch, r, err);
}

void ddt_engine_cuda_set_answer_start(ddt_engine_cuda *e, int32_t start) { ddt_choice_set_answer_start(&e->ch, start); }

void ddt_engine_cuda_set_logprobs(ddt_engine_cuda *e, ddt_token_logprobs *out, int32_t capacity, int32_t n_top) {
    e->lp_out = out;
    e->lp_cap = capacity;
    e->lp_top = n_top;
}

/* ddt_engine_set_logprobs: the values of the m tokens emitted from output index
 * `index` on, token i chosen from verify row rows[i] of e->logits (path: rows is
 * the device walk's path, else row 0).  The rows come back into logits_h (a
 * round's host walk is done with it by now); two synchronisations a round. */
static ddt_status record_logprobs(ddt_engine_cuda *e, bool path, const int32_t *toks, int32_t m, int32_t index,
                                  ddt_error *err) {
    if (!e->lp_out || index >= e->lp_cap) return DDT_OK;
    if (m > e->lp_cap - index) m = e->lp_cap - index;
    const size_t V = (size_t)e->vocab;
    if (path) {
        DDT_CUDA_TRY(cudaMemcpyAsync(e->walk_h, e->tree.path, sizeof(int32_t) * (size_t)m, cudaMemcpyDeviceToHost,
                                     e->s),
                     err);
        DDT_CUDA_TRY(cudaStreamSynchronize(e->s), err);
    }
    for (int32_t i = 0; i < m; i++) {
        const int32_t row = path ? e->walk_h[i] : 0;
        if (row < 0 || row >= e->max_nodes)
            return ddt_fail(err, DDT_ERR_INTERNAL, "logprobs: path node %d outside the %d verified rows", row,
                            e->max_nodes);
        DDT_CUDA_TRY(cudaMemcpyAsync(e->logits_h + (size_t)i * V, e->logits + (size_t)row * V, V * sizeof(float),
                                     cudaMemcpyDeviceToHost, e->s),
                     err);
    }
    DDT_CUDA_TRY(cudaStreamSynchronize(e->s), err);
    for (int32_t i = 0; i < m; i++)
        ddt_logprobs_of_row(e->logits_h + (size_t)i * V, e->vocab, toks[i], e->lp_top, &e->lp_out[index + i]);
    return DDT_OK;
}

/* The first token (after the prompt) or an AR step's token from logits row 0. */
static ddt_status next_token(ddt_engine_cuda *e, uint64_t round, int32_t *tok, ddt_error *err) {
    const int mode = next_mode(e);
    if (mode != NEXT_HOST) {
        if (mode == NEXT_SAMPLE) TRY(stage_sampling(e, round, err));
        TRY(launch_next(e, mode, 1, e->one, e->tree.root_token, err));
        DDT_CUDA_TRY(cudaMemcpyAsync(e->emit_h, e->tree.root_token, sizeof(int32_t), cudaMemcpyDeviceToHost, e->s),
                     err);
        DDT_CUDA_TRY(cudaStreamSynchronize(e->s), err);
        *tok = e->emit_h[0];
        if (*tok < 0) return ddt_fail(err, DDT_ERR_INVALID, "the target's logits hold a NaN or an infinity");
        return DDT_OK;
    }
    DDT_CUDA_TRY(cudaMemcpyAsync(e->logits_h, e->logits, sizeof(float) * (size_t)e->vocab, cudaMemcpyDeviceToHost,
                                 e->s), err);
    DDT_CUDA_TRY(cudaStreamSynchronize(e->s), err);
    TRY(ddt_choice_pick(&e->ch, e->sampler, &e->opts.sampling, e->logits_h, &e->ch.jstate, NULL, 0, round, 0, tok,
                        err));
    e->walk_h[0] = *tok;
    DDT_CUDA_TRY(cudaMemcpyAsync(e->tree.root_token, e->walk_h, sizeof(int32_t), cudaMemcpyHostToDevice, e->s), err);
    return DDT_OK;
}

static ddt_status check_kv(ddt_engine_cuda *e, ddt_error *err) {
    int32_t st_h = 0;
    DDT_CUDA_TRY(cudaMemcpy(&st_h, ddt_cuda_target_kv(e->target)->status, sizeof st_h, cudaMemcpyDeviceToHost), err);
    if (st_h != DDT_CUDA_KV_OK) return ddt_fail(err, DDT_ERR_INTERNAL, "device KV cache: status %d", st_h);
    return DDT_OK;
}

static float elapsed(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) return 0.0f;
    return ms * 1e-3f;
}

ddt_status ddt_engine_cuda_generate(ddt_engine_cuda *e, const int32_t *prompt, int32_t n_prompt, int32_t max_new,
                                    const int32_t *stop, int32_t n_stop, int32_t *out, int32_t *n_out,
                                    ddt_emit_fn emit_fn, void *emit_ctx, ddt_gen_stats *stats, ddt_error *err) {
    /* the grammar at its start, the penalties' counts; a constraint needs a stop id */
    TRY(ddt_choice_start(&e->ch, prompt, n_prompt, stop, n_stop, err));
    ddt_gen_stats s;
    memset(&s, 0, sizeof s);
    const int mode = next_mode(e);
    const bool on_device = mode != NEXT_HOST; /* the round runs as the graph, argmax or device sampler */
    set_calibration(e);
    e->lookup_host = 0;
    DDT_CUDA_TRY(cudaMemsetAsync(e->lookup_d, 0, sizeof(int32_t), e->s), err);
    /* settings changed since the graphs were captured (set_sampling, set_speculation):
       capture them again for the full round, before the first one */
    int32_t full_k = 1;
    const int32_t full = e->opts.mode == DDT_MODE_AR ? 0
                       : ddt_engine_round_nodes(e->opts.mode, e->opts.budget, e->depth, e->max_ctx, e->kmax, &full_k);
    if (on_device && !auto_host(e) &&
        (e->graph_next != mode || e->graph_mode != e->opts.mode || e->graph_budget != full ||
         e->graph_auto != e->auto_budget))
        TRY(capture_graph(e, full, full_k, err));
    /* options.prefix_cache: the rows of the longest common prefix of the last context
       and this prompt stay (not the prompt's last token: its logits give the first new
       token); every rank computes the same from the same ids */
    int32_t keep = 0;
    if (e->opts.prefix_cache) {
        const int32_t lim = e->n_kv < n_prompt - 1 ? e->n_kv : n_prompt - 1;
        while (keep < lim && e->kv_ids[keep] == prompt[keep]) keep++;
    }
    e->n_kv = 0; /* until the prefill below is issued */
    TRY(ddt_cuda_kv_set_len(ddt_cuda_target_kv(e->target), keep, e->s, err));
    if (e->drafter) TRY(ddt_cuda_drafter_rollback(e->drafter, keep, e->s, err));
    ddt_emitter em = ddt_emitter_start(out, max_new, stop, n_stop, emit_fn, emit_ctx);
    double t_start = ddt_engine_now();
    s.prompt_tokens = n_prompt;
    s.cached_tokens = keep;
    DDT_CUDA_TRY(cudaMemcpyAsync(e->ids, prompt, sizeof(int32_t) * (size_t)n_prompt, cudaMemcpyHostToDevice, e->s),
                 err);
    for (int32_t i = keep; i < n_prompt; i += DDT_ENGINE_PREFILL_CHUNK) {
        int32_t c = n_prompt - i < DDT_ENGINE_PREFILL_CHUNK ? n_prompt - i : DDT_ENGINE_PREFILL_CHUNK;
        TRY(ddt_cuda_target_prefill(e->target, e->ids + i, c, e->logits, false, err));
        if (e->drafter) TRY(ddt_cuda_drafter_append_prefix(e->drafter, e->capture, c, e->s, err));
    }
    memcpy(e->kv_ids, prompt, sizeof(int32_t) * (size_t)n_prompt);
    int32_t n_kv = n_prompt; /* e->n_kv once the generation ends well */
    int32_t bonus;
    TRY(next_token(e, 0, &bonus, err));
    TRY(check_kv(e, err));
    TRY(ddt_choice_take(&e->ch, &bonus, 1, err));
    TRY(record_logprobs(e, false, &bonus, 1, em.n, err));
    double t_decode = ddt_engine_now();
    s.t_prefill = t_decode - t_start;
    ddt_emitter_push(&em, &bonus, 1);
    int32_t len = n_prompt;
    const bool lockstep = e->stop_d != NULL; /* several GPUs: every rank ends after the same round */
    e->auto_bucket = e->tauto.n_buckets - 1; /* the auto budget's first round: every bucket open */
    /* --budget auto's fallback to ar steps where speculation does not pay (round.h);
       one GPU only (a rank of several keeps its lockstep rounds) */
    ddt_ar_fallback fb;
    ddt_ar_fallback_start(&fb, e->auto_budget && !auto_host(e) && e->argraph);
    for (uint64_t round = 1;; round++) {
        float stop_flag;
        if (!ddt_emitter_next_round(&em, lockstep, &stop_flag)) break;
        const int32_t room = e->max_ctx - len - 1;
        if (room < 0) break; /* the same on every rank */
        if (lockstep) TRY(stop_exchange(e, stop_flag, err));
        double t0 = ddt_engine_now();
        int32_t n = 0, m;
        if (e->opts.mode == DDT_MODE_AR && on_device) {
            if (mode == NEXT_SAMPLE) TRY(stage_sampling(e, round, err));
            DDT_CUDA_TRY(cudaGraphLaunch(e->graph, e->s), err);
            DDT_CUDA_TRY(cudaMemcpyAsync(e->emit_h, e->tree.root_token, sizeof(int32_t), cudaMemcpyDeviceToHost, e->s),
                         err);
            DDT_CUDA_TRY(cudaStreamSynchronize(e->s), err);
            if (stop_all(e)) break;
            e->kv_ids[n_kv++] = bonus; /* the step's row: the token it ran */
            bonus = e->emit_h[0];
            if (bonus < 0) return ddt_fail(err, DDT_ERR_INVALID, "the target's logits hold a NaN or an infinity");
            n = m = 1;
            if (!e->opts.cuda_no_phase_times) s.t_verify += elapsed(e->ev[0], e->ev[3]);
            TRY(record_logprobs(e, false, &bonus, 1, em.n, err));
            ddt_emitter_push(&em, &bonus, 1);
        } else if (e->opts.mode == DDT_MODE_AR) {
            TRY(launch_ar_step(e, NEXT_HOST, e->drafter != NULL, err));
            e->kv_ids[n_kv++] = bonus;
            TRY(next_token(e, round, &bonus, err)); /* synchronises */
            if (stop_all(e)) break;
            n = m = 1;
            s.t_verify += ddt_engine_now() - t0;
            TRY(ddt_choice_take(&e->ch, &bonus, 1, err));
            TRY(record_logprobs(e, false, &bonus, 1, em.n, err));
            ddt_emitter_push(&em, &bonus, 1);
        } else if (ddt_ar_fallback_step(&fb)) {
            /* an ar step of an auto-budget engine: the drafter is fed its row */
            if (on_device) {
                if (mode == NEXT_SAMPLE) TRY(stage_sampling(e, round, err));
                DDT_CUDA_TRY(cudaGraphLaunch(e->argraph, e->s), err);
                DDT_CUDA_TRY(cudaMemcpyAsync(e->emit_h, e->tree.root_token, sizeof(int32_t), cudaMemcpyDeviceToHost,
                                             e->s), err);
                DDT_CUDA_TRY(cudaStreamSynchronize(e->s), err);
                if (stop_all(e)) break;
                e->kv_ids[n_kv++] = bonus;
                bonus = e->emit_h[0];
                if (bonus < 0) return ddt_fail(err, DDT_ERR_INVALID, "the target's logits hold a NaN or an infinity");
                if (!e->opts.cuda_no_phase_times) s.t_verify += elapsed(e->ev[0], e->ev[3]);
            } else {
                TRY(launch_ar_step(e, NEXT_HOST, true, err));
                e->kv_ids[n_kv++] = bonus;
                TRY(next_token(e, round, &bonus, err)); /* synchronises */
                if (stop_all(e)) break;
                s.t_verify += ddt_engine_now() - t0;
            }
            n = m = 1;
            s.ar_rounds++;
            TRY(ddt_choice_take(&e->ch, &bonus, 1, err));
            TRY(record_logprobs(e, false, &bonus, 1, em.n, err));
            ddt_emitter_push(&em, &bonus, 1);
        } else {
            /* room 0 (one row left): budget 0, the root alone is verified and its
               token emitted, as the CPU loop does (the build, sampler and walk
               kernels take a tree of one node) */
            int32_t k, budget = ddt_engine_round_nodes(e->opts.mode, e->opts.budget, e->depth, room, e->kmax, &k);
            if (e->lookup_on) stage_lookup(e, n_kv, bonus);
            if (e->auto_budget && (!on_device || auto_host(e))) {
                TRY(auto_round(e, budget, k, bonus, round, mode == NEXT_ARGMAX, &n, &s.auto_capped_rounds, err));
            } else if (on_device) {
                if (mode == NEXT_SAMPLE) TRY(stage_sampling(e, round, err));
                if (budget == e->graph_budget && e->n_bgraphs > 0) {
                    DDT_CUDA_TRY(cudaGraphLaunch(e->bgraph[e->auto_bucket], e->s), err);
                } else if (budget == e->graph_budget) {
                    DDT_CUDA_TRY(cudaGraphLaunch(e->graph, e->s), err);
                } else {
                    TRY(launch_device_round(e, budget, k, err)); /* the context's last rounds */
                }
            } else {
                TRY(sampled_round(e, budget, k, round, err));
            }
            /* with the bucket graphs, one word more: the bucket the rule chose */
            const size_t words = DDT_CUDA_EMIT_WORDS + (e->n_bgraphs > 0 ? 1 : 0);
            DDT_CUDA_TRY(cudaMemcpyAsync(e->emit_h, e->emit_d, sizeof(int32_t) * words, cudaMemcpyDeviceToHost, e->s),
                         err);
            DDT_CUDA_TRY(cudaStreamSynchronize(e->s), err);
            if (stop_all(e)) break;
            m = e->emit_h[0];
            if (m < 1 || m > DDT_MAX_PATH || e->emit_h[1] != DDT_CUDA_TREE_OK)
                return ddt_fail(err, DDT_ERR_INTERNAL, "device round %llu failed: tree status %d, %d tokens",
                                (unsigned long long)round, e->emit_h[1], m);
            if (!e->auto_budget) n = budget + 1;
            else if (on_device && !auto_host(e)) n = e->emit_h[DDT_CUDA_EMIT_NODES]; /* the device builder's choice */
            /* the next round's graph: the bucket this round's rule chose (the tree
               sizes of consecutive rounds follow each other; a round whose cap was
               below the rule's choice verified its cap's prefix) */
            if (e->n_bgraphs > 0 && budget == e->graph_budget && on_device && !auto_host(e)) {
                /* (a host-built round set auto_bucket itself; the device word is stale then) */
                const int32_t c = e->emit_h[DDT_CUDA_EMIT_WORDS];
                if (c > e->auto_bucket) s.auto_capped_rounds++;
                e->auto_bucket = c >= 0 && c < e->n_bgraphs ? c : e->n_bgraphs - 1;
            }
            if (!e->opts.cuda_no_phase_times) {
                s.t_draft += elapsed(e->ev[0], e->ev[1]);
                s.t_build += elapsed(e->ev[1], e->ev[2]);
                s.t_verify += elapsed(e->ev[2], e->ev[3]);
                s.t_walk += elapsed(e->ev[3], e->ev[4]);
                s.t_commit += elapsed(e->ev[4], e->ev[5]);
            }
            /* the round committed its root (the previous bonus) and the accepted tokens */
            e->kv_ids[n_kv++] = bonus;
            for (int32_t i = 0; i + 1 < m; i++) e->kv_ids[n_kv++] = e->emit_h[2 + i];
            bonus = e->emit_h[1 + m];
            for (int32_t i = 0; i < m; i++) /* the device sampler's mark of a NaN / infinite logits row */
                if (e->emit_h[2 + i] < 0)
                    return ddt_fail(err, DDT_ERR_INVALID, "round %llu: the target's logits hold a NaN or an infinity",
                                    (unsigned long long)round);
            TRY(ddt_choice_take(&e->ch, e->emit_h + 2, m, err));
            TRY(record_logprobs(e, true, e->emit_h + 2, m, em.n, err));
            ddt_emitter_push(&em, e->emit_h + 2, m);
            ddt_ar_fallback_after_round(&fb, round, m, n, &e->cost);
        }
        len += m;
        s.rounds++;
        s.nodes_verified += n;
        s.accepted += m;
    }
    TRY(check_kv(e, err));
    (void)bonus;
    e->n_kv = n_kv;
    double t_end = ddt_engine_now();
    ddt_emitter_finish_stats(&em, t_start, t_decode, t_end, &s);
    s.round_kernels = on_device && !auto_host(e) ? e->graph_kernels : 0;
    s.draft_calibrated = e->tree.cal_on && e->opts.mode != DDT_MODE_AR;
    {
        int32_t dev = 0;
        DDT_CUDA_TRY(cudaMemcpy(&dev, e->lookup_d, sizeof(int32_t), cudaMemcpyDeviceToHost), err);
        s.lookup_nodes = (int64_t)dev + e->lookup_host;
    }
    s.round_pdl_edges = on_device && !auto_host(e) ? e->graph_pdl : 0;
    *n_out = em.n;
    if (stats) *stats = s;
    return DDT_OK;
}

ddt_status ddt_engine_cuda_score(ddt_engine_cuda *e, const int32_t *ids, int32_t n, int32_t n_top,
                                 ddt_token_logprobs *out, ddt_error *err) {
    const size_t rows = DDT_ENGINE_PREFILL_CHUNK, V = (size_t)e->vocab;
    if (!e->score_d) {
        TRY(ddt_cuda_malloc_array((void **)&e->score_d, rows * V, sizeof(float), NULL, err));
        DDT_CUDA_TRY(cudaMallocHost((void **)&e->score_h, rows * V * sizeof(float)), err);
    }
    e->n_kv = 0; /* the context becomes the scored text, which the drafter has not seen */
    TRY(ddt_cuda_target_reset(e->target, err));
    if (e->drafter) TRY(ddt_cuda_drafter_reset(e->drafter, e->s, err));
    DDT_CUDA_TRY(cudaMemcpyAsync(e->ids, ids, sizeof(int32_t) * (size_t)(n - 1), cudaMemcpyHostToDevice, e->s), err);
    out[0].logprob = NAN;
    out[0].n_top = 0;
    /* row r of a chunk starting at i predicts token i + r + 1: the CPU engine's loop,
       with the rows copied back */
    for (int32_t i = 0; i < n - 1; i += (int32_t)rows) {
        const int32_t c = n - 1 - i < (int32_t)rows ? n - 1 - i : (int32_t)rows;
        TRY(ddt_cuda_target_prefill(e->target, e->ids + i, c, e->score_d, true, err));
        DDT_CUDA_TRY(cudaMemcpyAsync(e->score_h, e->score_d, (size_t)c * V * sizeof(float), cudaMemcpyDeviceToHost,
                                     e->s),
                     err);
        DDT_CUDA_TRY(cudaStreamSynchronize(e->s), err);
        for (int32_t r = 0; r < c; r++)
            ddt_logprobs_of_row(e->score_h + (size_t)r * V, e->vocab, ids[i + r + 1], n_top, &out[i + r + 1]);
    }
    return check_kv(e, err);
}
