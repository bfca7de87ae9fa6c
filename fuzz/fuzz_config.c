/*
 * fuzz_config.c — libFuzzer target for the config.json reader: any text must be
 * rejected with a status and message, or give a config whose sizes are positive
 * and whose query functions run cleanly (including the compiled ignore regexes).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "io/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ddt_model_config cfg;
    ddt_error err;
    if (ddt_config_parse((const char *)data, size, "fuzz/config.json", &cfg, &err) != DDT_OK) {
        if (err.msg[0] == '\0' || cfg.ignore != NULL || cfg.priv != NULL) __builtin_trap();
        return 0;
    }
    if (cfg.hidden_size <= 0 || cfg.num_hidden_layers <= 0 || cfg.num_attention_heads <= 0 ||
        cfg.vocab_size <= 0 || cfg.qk_rope_head_dim % 2 != 0)
        __builtin_trap();
    if (cfg.n_routed_experts > 0 &&
        (cfg.num_experts_per_tok < 1 || cfg.num_experts_per_tok > cfg.n_routed_experts ||
         cfg.n_routed_experts % cfg.n_group != 0 || cfg.topk_group > cfg.n_group))
        __builtin_trap();
    static const char *names[] = {
        "model.layers.1.mlp.experts.0.up_proj",
        "language_model.model.layers.1.self_attn.q_a_proj",
        "model.layers.0.mlp.shared_experts.down_proj.weight",
        "lm_head",
        "model.layers.2.mlp.gate",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) (void)ddt_config_is_quantized(&cfg, names[i]);
    float s = ddt_config_softmax_scale(&cfg);
    if (!(s > 0.0f) || isinf(s)) __builtin_trap();
    for (int32_t l = 0; l < cfg.num_hidden_layers && l < 64; l++) (void)ddt_config_layer_is_moe(&cfg, l);
    ddt_config_free(&cfg);
    return 0;
}
