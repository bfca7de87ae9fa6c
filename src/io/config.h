/*
 * config.h — reader of a Hugging Face config.json for DeepSeek-V3-architecture
 * targets: DeepseekV3ForCausalLM / model_type deepseek_v3, kimi_k2, and
 * KimiK25ForConditionalGeneration (fields under text_config, tensors under
 * "language_model."), with quantization_config for FP8 block and
 * compressed-tensors INT4 (honouring its ignore list), and q_lora_rank null.
 * Unknown architectures and missing fields are errors that name them.
 */
#ifndef DDT_IO_CONFIG_H
#define DDT_IO_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddtree.h"

typedef enum ddt_quant_method {
    DDT_QUANT_NONE = 0,
    DDT_QUANT_FP8_BLOCK,  /* quant_method "fp8", weight_block_size [128,128] */
    DDT_QUANT_INT4_PACK   /* quant_method "compressed-tensors", format pack-quantized, num_bits 4 */
} ddt_quant_method;

typedef struct ddt_model_config {
    char architecture[64];     /* e.g. "DeepseekV3ForCausalLM" */
    char tensor_prefix[32];    /* "" or "language_model." (K2.5/K2.6) */
    int32_t hidden_size;
    int32_t num_hidden_layers;
    int32_t num_attention_heads;
    int32_t q_lora_rank;       /* 0 when null: q_proj [heads*(nope+rope), hidden] */
    int32_t kv_lora_rank;
    int32_t qk_nope_head_dim;
    int32_t qk_rope_head_dim;
    int32_t v_head_dim;
    int32_t vocab_size;
    int32_t intermediate_size;       /* dense MLP layers */
    int32_t moe_intermediate_size;
    int32_t n_routed_experts;        /* 0 = no MoE layers */
    int32_t num_experts_per_tok;
    int32_t n_shared_experts;
    int32_t first_k_dense_replace;
    int32_t moe_layer_freq;
    int32_t n_group;
    int32_t topk_group;
    bool norm_topk_prob;
    float routed_scaling_factor;
    char scoring_func[16];           /* "sigmoid" (softmax rejected as unsupported) */
    char topk_method[16];            /* "noaux_tc" or "greedy" */
    float rms_norm_eps;
    float rope_theta;
    int32_t max_position_embeddings;
    bool rope_interleave;            /* rope dims stored pair-interleaved (HF default true) */
    bool tie_word_embeddings;
    /* rope_scaling (YaRN); has_yarn false = plain RoPE */
    bool has_yarn;
    float yarn_factor;
    float yarn_original_max_position;
    float yarn_beta_fast;
    float yarn_beta_slow;
    float yarn_mscale;
    float yarn_mscale_all_dim;
    /* quantization_config */
    ddt_quant_method quant;
    int32_t fp8_block[2];
    int32_t int4_group;
    int32_t n_ignore;
    char **ignore;                   /* owned; module names or "re:" regexes left out of quantisation */
    int32_t bos_token_id;            /* -1 when absent */
    int32_t eos_token_id;            /* -1 when absent */
    /* Private to config.c (owned): compiled "re:" ignore patterns and the
     * compressed-tensors targets.  Zeroed by parse; never copy a parsed config by
     * value and free both copies. */
    void *priv;
} ddt_model_config;

/* Parse config.json text; `where` names the file in messages.  *cfg is zeroed
 * first; on failure it holds nothing to free (ddt_config_free is still safe). */
ddt_status ddt_config_parse(const char *text, size_t len, const char *where,
                            ddt_model_config *cfg, ddt_error *err);
/* Read and parse a file (path to config.json or to the model folder). */
ddt_status ddt_config_load(const char *path, ddt_model_config *cfg, ddt_error *err);
void ddt_config_free(ddt_model_config *cfg);

/* Whether linear module `module` (e.g. "model.layers.1.mlp.experts.0.up_proj") is
 * quantised under cfg's quantization_config (false when in the ignore list).
 * The name may carry tensor_prefix or not, and a trailing ".weight" is ignored.
 * Ignore entries are exact names or "re:<POSIX ERE>" anchored at the start of the
 * name only (Python re.match, as compressed-tensors and vLLM apply them).
 * FP8: attention and MLP/expert *_proj linears unless ignored (never lm_head or the
 * router).  INT4: *_proj linears and lm_head that match a config_groups target and
 * no ignore entry.  Advisory: the engine also reads the format from tensor names. */
bool ddt_config_is_quantized(const ddt_model_config *cfg, const char *module);

/* Softmax scale of MLA: (nope+rope)^-0.5 * mscale^2 with YaRN's mscale. */
float ddt_config_softmax_scale(const ddt_model_config *cfg);
/* Whether layer l has a MoE MLP (else dense). */
bool ddt_config_layer_is_moe(const ddt_model_config *cfg, int32_t layer);

#endif
