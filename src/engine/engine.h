/*
 * engine.h — the decoding engine: autoregressive, DFlash chain and DDTree
 * decoding of a target with a drafter, on the CPU backend or (engine_cuda.h)
 * the CUDA backend.
 *
 * One round (chain and tree modes), every buffer allocated once at create:
 *   draft   the drafter drafts the block [bonus, MASK...] after the committed
 *           context: logits for depths 1..D
 *   build   top-K log-probabilities per depth, then the best-first tree under
 *           the budget (or the chain of rank-0 tokens)
 *   verify  one target forward over the tree with the ancestor-only mask
 *   walk    the longest agreed path and the bonus, drawing the target's next
 *           token (argmax, or a sample keyed by (seed, round, node)) only at
 *           the nodes the walk visits
 *   commit  the path's KV moves into the target's cache; the path's target
 *           features are appended to the drafter's context
 * AR mode is the round with no draft: the tree is the root alone.
 *
 * Output equals the target's own: greedy output is token for token the AR
 * output, and at T > 0 every emitted token is a target sample (sample-and-match).
 */
#ifndef DDT_ENGINE_ENGINE_H
#define DDT_ENGINE_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "ddtree.h"
#include "io/config.h"
#include "text/json_vocab.h"

typedef enum ddt_mode {
    DDT_MODE_AR = 0,
    DDT_MODE_CHAIN = 1, /* DFlash: the drafter's greedy token at every depth */
    DDT_MODE_TREE = 2   /* DDTree */
} ddt_mode;

/* Parse "ar", "chain" (or "dflash"), "tree" (or "ddtree"); false when unknown. */
bool ddt_mode_parse(const char *s, ddt_mode *out);
const char *ddt_mode_name(ddt_mode m);

/*
 * A drafter other than the DFlash model (tests, studies): fill the per-depth
 * top-K table for the block after `position` whose first token is `bonus`:
 * logq [depth][k] sorted descending with distinct tokens per row.
 */
typedef ddt_status (*ddt_draft_fn)(void *ctx, int32_t bonus, int32_t position, int32_t depth,
                                   int32_t k, float *logq, int32_t *token, ddt_error *err);

typedef enum ddt_backend {
    DDT_BACKEND_CPU = 0,
    DDT_BACKEND_CUDA = 1, /* the whole round on the GPU (builds with nvcc only) */
    DDT_BACKEND_AUTO = 2  /* cuda when built with it and a GPU is present, else cpu */
} ddt_backend;

/* Parse "cpu", "cuda" or "auto"; false when unknown. */
bool ddt_backend_parse(const char *s, ddt_backend *out);
/* Whether this build has the CUDA backend compiled in. */
bool ddt_backend_cuda_built(void);
const char *ddt_backend_name(ddt_backend b);

#define DDT_ENGINE_MAX_GPUS 64

/* The programmatic edges of a CUDA engine's round graphs (ddt_engine_options.cuda_pdl_edges):
 * DEFAULT every kernel-to-kernel edge of a chain / tree round, and in an ar step only the
 * edges into kernels that do work before their grid wait (ddt_cuda_kernel_waits_late: the
 * x W products load weights there), each measured fastest on the H200 (BENCHMARKS.md: ar
 * +12% against plain edges, which every edge programmatic does not beat); ALL every edge in
 * every mode; PRODUCTS only the edges into those kernels, in every mode.  --no-pdl: none. */
enum { DDT_PDL_EDGES_DEFAULT = 0, DDT_PDL_EDGES_ALL = 1, DDT_PDL_EDGES_PRODUCTS = 2 };

typedef struct ddt_engine_options {
    ddt_mode mode;
    ddt_backend backend;       /* cpu (default) or cuda */
    bool fast_attention;       /* cuda: bf16 latent cache + tensor-core attention (MLA 512/64 models,
                                  <= 64 tokens per forward); off = the exact fp32 path, under which
                                  greedy tree output is bitwise ar output */
    bool tensor_cores;         /* cuda: projections, routed experts and LM head on the tensor cores
                                  (bf16 mma, split-bf16 activations, qmatmul_cuda.h); batch invariant,
                                  so greedy tree == ar still holds, but not bitwise the fp32 path */
    int32_t gpus;              /* cuda: GPUs of this host the target is split over, 0 or 1 = one GPU,
                                  up to DDT_ENGINE_MAX_GPUS (engine_multi_cuda.h: NCCL) */
    bool nccl_always;          /* cuda: run the multi-GPU (NCCL) code even for one GPU (tests: it must
                                  give the single-GPU path's output bit for bit) */
    const char *draft_dir;     /* DFlash drafter folder (chain / tree), unless draft_fn */
    ddt_draft_fn draft_fn;     /* custom drafter (overrides draft_dir) */
    void *draft_ctx;
    int32_t draft_depth;       /* D for draft_fn (1..DDT_MAX_DEPTH); the DFlash depth is block_size-1 */
    int32_t budget;            /* tree nodes without the root, 0..DDT_MAX_BUDGET */
    bool budget_auto;          /* cost-aware budget (CaDDTree), capped by `budget`; on the CPU it also
                                  runs plain ar steps while the rounds' tokens per cost fall below
                                  an ar step's (the same tokens greedy: every mode is the target's) */
    const ddt_cost_model *cost;/* verify cost table for auto; NULL = measure one at create */
    ddt_sampling sampling;     /* temperature 0 = greedy */
    int32_t max_ctx;           /* context tokens (prompt + generated); <= 0 = the model's maximum */
    int32_t n_threads;         /* CPU threads; <= 0 = every core */
    int32_t reserve_budget;    /* cpu: also allocate for ddt_engine_set_speculation to switch later
                                  generations to any mode up to a tree of this budget (loads the
                                  drafter even in ar mode); 0 = only the mode and budget above */
    bool cuda_host_sampler;    /* cuda, tests: sample at T > 0 on the host over copied logits even
                                  where the device sampler (sample_cuda.h) takes the settings */
    bool cuda_no_pdl;          /* cuda: keep the round graphs' plain kernel-to-kernel edges instead of
                                  programmatic ones (programmatic dependent launch: a kernel's blocks
                                  are scheduled while the kernel before it runs); for comparison */
    int32_t cuda_pdl_edges;    /* cuda, with PDL: which kernel-to-kernel edges of the round graphs become
                                  programmatic (DDT_PDL_EDGES_*; default 0); for measuring the choice */
    bool prefix_cache;         /* cpu: keep the context of the last generation and start the next from
                                  its longest common prefix with the new prompt instead of an empty
                                  one (multi-turn chat re-sends the conversation): the same output
                                  bit for bit, since every cached row is what a prefill of its token
                                  computes (batch invariance).  CPU and CUDA engines. */
    const struct ddt_draft_calibration *draft_calibration;
                               /* the drafter's calibration (core/calibration.h), copied at create, NULL =
                                  none: greedy trees are built from calibrated weights, a better tree for
                                  the same budget, and where it rates the context lookup, its path grafted
                                  onto them (T > 0 keeps the drafter's own q and no lookup; the output is
                                  the target's either way).  Every backend (the device build applies it,
                                  bitwise the CPU's; on several GPUs every rank does) */
    bool no_lookup;            /* with a draft calibration that rates the context lookup (core/lookup.h):
                                  graft no lookup path onto the greedy trees (for comparison) */
    bool cuda_no_phase_times;  /* cuda: no timing events inside the round graph (each is a node that no
                                  programmatic edge crosses); the per-phase seconds then read 0, the
                                  totals stay; for measuring what the timing costs */
} ddt_engine_options;

/* The backend an engine created with these options runs on (auto resolved). */
ddt_backend ddt_engine_backend(const ddt_engine_options *o);

/* Why a generation ended (ddt_gen_stats.stop_reason).  When one round meets
 * several, a stop id wins over max_new, and both over the callback. */
typedef enum ddt_stop_reason {
    DDT_STOP_NONE = 0,       /* not finished (stats of a failed call) */
    DDT_STOP_MAX_TOKENS = 1, /* max_new tokens emitted (also max_new = 0) */
    DDT_STOP_TOKEN = 2,      /* an id of the stop list was emitted (it is the last token) */
    DDT_STOP_CONTEXT = 3,    /* the context is full */
    DDT_STOP_CANCELLED = 4   /* the emit callback returned false */
} ddt_stop_reason;

/* "max tokens", "stop token", "context full", "cancelled" or "none". */
const char *ddt_stop_reason_name(ddt_stop_reason r);

typedef struct ddt_gen_stats {
    int32_t prompt_tokens;
    int32_t cached_tokens;     /* of those, the leading ones whose context rows were reused from the
                                  previous generation (options.prefix_cache), not recomputed */
    int32_t tokens;            /* emitted */
    int32_t rounds;            /* verify forwards after the prompt (AR: one per token) */
    int32_t ar_rounds;         /* of those, the plain ar steps an auto-budget tree generation ran while
                                  speculation did not pay (CPU engine; see engine_cpu.c) */
    int32_t auto_capped_rounds; /* of the speculative rounds of an auto-budget generation on the GPU, those
                                  whose rule chose a larger verify bucket than the round verified: each
                                  round's graph verifies the bucket the round before chose, so a tree
                                  that grows is cut there (engine_cuda.c); 0 on the CPU */
    int64_t nodes_verified;    /* tree nodes scored, roots included */
    int64_t accepted;          /* tokens emitted by rounds (accepted nodes + bonus) */
    double mean_acceptance;    /* accepted / rounds: tau */
    double expected_acceptance; /* the drafter's own forecast of tau: the mean over speculative rounds of
                                   1 + the sum of exp(logw) over the verified nodes (what the auto
                                   budget's Phi assumes); the CPU backend's host-built trees, else 0 */
    double t_prefill, t_draft, t_build, t_verify, t_walk, t_commit, t_total; /* seconds */
    double tokens_per_s;       /* emitted tokens over decode time (prefill excluded) */
    ddt_stop_reason stop_reason; /* why it ended, from the engine (callers need not guess) */
    bool draft_calibrated;     /* the trees were built from calibrated weights (options.draft_calibration) */
    int64_t lookup_nodes;      /* tree nodes that came from the context lookup (core/lookup.h): grafted onto
                                  the greedy trees where a calibration rates it */
    int32_t round_kernels;     /* kernel launches in one round's CUDA graph (0: the round is no graph) */
    int32_t round_pdl_edges;   /* its kernel-to-kernel edges made programmatic (0: --no-pdl,
                                  several GPUs or no graph) */
} ddt_gen_stats;

/* Called with each round's emitted tokens, in order, as soon as they are known.
 * Returns true to go on; false stops the generation after this round (a server's
 * client went away): generate then returns DDT_OK with the tokens so far. */
typedef bool (*ddt_emit_fn)(void *ctx, const int32_t *ids, int32_t n);

typedef struct ddt_engine ddt_engine;

ddt_status ddt_engine_create(const char *model_dir, const ddt_engine_options *opts,
                             ddt_engine **out, ddt_error *err);
void ddt_engine_free(ddt_engine *e);

int32_t ddt_engine_vocab(const ddt_engine *e);
int32_t ddt_engine_max_ctx(const ddt_engine *e);
/* The target's parsed config.json (eos_token_id, sizes, ...). */
const ddt_model_config *ddt_engine_model_config(const ddt_engine *e);
/* Change the sampling settings (temperature, top-k, top-p, seed) for later generations. */
ddt_status ddt_engine_set_sampling(ddt_engine *e, const ddt_sampling *s, ddt_error *err);
/*
 * Switch later generations to another mode / budget (budget_auto: cost-aware,
 * capped by budget) without reloading the model.  CPU engines and one GPU, only
 * within what create allocated (CPU: opts.reserve_budget, or the mode it was made
 * for; one GPU: chain and tree up to the created budget where a drafter was
 * loaded, the auto budget only where created with it); a value outside gives
 * DDT_ERR_RANGE or DDT_ERR_UNSUPPORTED with a message.  On the CPU the first auto
 * budget on an engine not created with one measures its cost table.
 */
ddt_status ddt_engine_set_speculation(ddt_engine *e, ddt_mode mode, int32_t budget, bool budget_auto,
                                      ddt_error *err);
/* The mode, budget and auto flag later generations run with. */
void ddt_engine_speculation(const ddt_engine *e, ddt_mode *mode, int32_t *budget, bool *budget_auto);
/* The node counts (0, 1, 2, 4, 8, 10, 12, 16, 20, 24, 32, ... and budget itself, at most max_points) at which
 * the CPU and CUDA engines measure C_verify for the auto budget; returns how many. */
int32_t ddt_engine_cost_points(int32_t budget, float *nodes, int32_t max_points);
/* The cost model in use for the auto budget (measured or given), NULL otherwise. */
const ddt_cost_model *ddt_engine_cost(const ddt_engine *e);

/* Per emitted token: its log-probability under the target's distribution at that
 * position, the log-softmax of the raw logits (before temperature, top-k and
 * top-p, as vLLM reports them), and the n_top most likely tokens with theirs,
 * most likely first (ties: the lower id first). */
#define DDT_MAX_TOP_LOGPROBS 20
typedef struct ddt_token_logprobs {
    float logprob;
    int32_t n_top;
    int32_t top_id[DDT_MAX_TOP_LOGPROBS];
    float top_logprob[DDT_MAX_TOP_LOGPROBS];
} ddt_token_logprobs;

/*
 * Later generations write out[i] for their emitted token i < capacity, each
 * before the emit callback that hands over that token; n_top alternatives
 * (0..DDT_MAX_TOP_LOGPROBS).  out NULL turns it off (the default).  A tree round
 * reads the verify logits of the accepted path, which are bitwise the logits of
 * a one-token-at-a-time decode, so every mode gives ar's values.  Every backend
 * (the CUDA engines copy each round's emitted rows back to the host; on several
 * GPUs rank 0 does).
 */
ddt_status ddt_engine_set_logprobs(ddt_engine *e, ddt_token_logprobs *out, int32_t capacity, int32_t n_top,
                                   ddt_error *err);

/*
 * Grammar-constrained decoding: later generations emit only text that the JSON
 * recogniser (text/json_grammar.h) accepts, starting from an empty document
 * (object_only: the top-level value must be an object; schema non-NULL: an
 * instance of that compiled schema, text/json_schema.h, which the caller keeps
 * alive while the setting lasts), and end with a stop id
 * as soon as the document is complete (which needs n_stop >= 1 at generate).
 * At every position where the target chooses a token (the first token, each ar
 * step, each node a chain / tree walk visits, at that node's path), the tokens
 * the grammar refuses get -inf before argmax or sampling, so the output is the
 * masked target's: greedy chain / tree output equals greedy ar output token for
 * token, and at T > 0 each token is a sample of the masked distribution.  Draft
 * tokens the grammar refuses simply never match.  Log-probabilities stay those of
 * the raw logits (as vLLM reports them).  vocab is the caller's, shared read-only,
 * and must outlive the setting; c NULL (or c->vocab NULL) turns it off.  The first
 * call allocates a mask of the vocabulary.  Every backend: the CUDA engines' rounds
 * then walk on the host (engine_cuda.h; on several GPUs every rank does, over the
 * same logits).
 */
typedef struct ddt_json_constraint {
    const ddt_json_vocab *vocab; /* built for this engine's vocabulary (ddt_json_vocab_create) */
    bool object_only;            /* json_object: the top-level value is an object */
    const struct ddt_json_schema *schema; /* json_schema: the compiled schema (NULL: any JSON) */
} ddt_json_constraint;

ddt_status ddt_engine_set_constraint(ddt_engine *e, const ddt_json_constraint *c, ddt_error *err);

/*
 * OpenAI's logit_bias and presence / frequency penalties, and the repetition
 * penalty of Hugging Face / vLLM: at every position where the target chooses a
 * token (as the JSON constraint above), the logits row gets bias[i] added at
 * bias_ids[i]; then, with a repetition penalty r (0 or 1: none), every id in the
 * prompt or generated so far becomes l / r where l > 0, else l * r; then every id
 * j generated c_j > 0 times so far in this generation (the prompt does not count)
 * loses c_j * frequency + presence.  At a tree node the node's draft path counts as
 * generated, so the row is the one a one-token-at-a-time decode would choose from
 * there, and greedy chain / tree output equals greedy ar output token for token.
 * The bias is also added to the drafter's logits, so drafts follow it.  Ids
 * distinct and in the vocabulary (at most DDT_LOGIT_BIAS_MAX), biases within
 * +-DDT_LOGIT_BIAS_LIMIT, penalties within +-DDT_PENALTY_LIMIT (OpenAI's ranges),
 * r in (0, DDT_REPETITION_LIMIT]; anything else is refused and the previous rules
 * stay.  r NULL (or all zero) turns them off.  The values are copied.
 * Log-probabilities stay those of the raw logits.  The first call allocates the
 * counts (13 bytes an id).  Every backend: the CUDA engines' rounds then walk on
 * the host, the drafts without the bias (engine_cuda.h).
 */
#define DDT_LOGIT_BIAS_MAX 1024
#define DDT_LOGIT_BIAS_LIMIT 100.0f
#define DDT_PENALTY_LIMIT 2.0f
#define DDT_REPETITION_LIMIT 10.0f

typedef struct ddt_logit_rules {
    const int32_t *bias_ids;
    const float *bias;
    int32_t n_bias;
    float presence, frequency;
    float repetition; /* 0 (or 1): none; else in (0, DDT_REPETITION_LIMIT] */
} ddt_logit_rules;

ddt_status ddt_engine_set_logit_rules(ddt_engine *e, const ddt_logit_rules *r, ddt_error *err);

/*
 * Where the answer starts in later generations' prompts, for the penalties above:
 * the prompt's ids from index start on count as generated.  An answer made of
 * several generations, each prompted with the original prompt (start ids) and
 * the ids the earlier ones wrote (as a server does to constrain only parts of an
 * answer), is then penalised as one generation of the whole answer would be.
 * start < 1 (the default): none of the prompt counts.  The setting stays until
 * changed; engines without logit rules take it and ignore it.
 */
void ddt_engine_set_answer_start(ddt_engine *e, int32_t start);

/*
 * Fit data for the draft calibration (core/calibration.h, `ddtree calibrate`):
 * greedy-decode max_new tokens after the prompt as an ar generation does (the
 * engine's logit rules and constraint apply; its temperature must be 0), and at
 * every step draft the block after the committed context, the table a round there
 * would build from, and take the context lookup's proposal (core/lookup.h); each
 * goes into stats (ddt_cal_stats_add_table, _add_lookup) against the tokens the
 * decode emitted next.  *n_out: tokens decoded.  Needs a DFlash
 * drafter or draft_fn; CPU engine only.  The prefix cache is cleared.
 */
struct ddt_cal_stats;
ddt_status ddt_engine_calibration_data(ddt_engine *e, const int32_t *prompt, int32_t n_prompt, int32_t max_new,
                                       struct ddt_cal_stats *stats, int32_t *n_out, ddt_error *err);

/*
 * Score a text: out[i] for 1 <= i < n = ids[i]'s log-probability after ids[0..i)
 * (and n_top alternatives), from prefill forwards over an empty context, the
 * values a generation reports for the same tokens (bit for bit: the rows do not
 * depend on how many go through a forward).  out[0] gets a NaN logprob and no
 * alternatives (nothing predicts the first token).  2 <= n <= the context.  The
 * prefix cache is cleared.  Every backend (a CUDA engine's first call allocates
 * a logits buffer of DDT_ENGINE_PREFILL_CHUNK rows; on several GPUs every rank
 * runs the forwards).
 */
ddt_status ddt_engine_score(ddt_engine *e, const int32_t *ids, int32_t n, int32_t n_top, ddt_token_logprobs *out,
                            ddt_error *err);

/*
 * Generate up to max_new tokens after prompt[0..n_prompt) (n_prompt >= 1) from a
 * fresh context (with options.prefix_cache, from the previous generation's
 * context cut to its longest common prefix with the prompt, which gives the same
 * tokens; stats->cached_tokens says how many were reused); stops early after any id in stop[0..n_stop) (which is emitted)
 * or when the context is full.  out [max_new] receives the emitted ids;
 * stats->stop_reason says which of these ended it.
 */
ddt_status ddt_engine_generate(ddt_engine *e, const int32_t *prompt, int32_t n_prompt,
                               int32_t max_new, const int32_t *stop, int32_t n_stop,
                               int32_t *out, int32_t *n_out, ddt_emit_fn emit, void *emit_ctx,
                               ddt_gen_stats *stats, ddt_error *err);

#endif
