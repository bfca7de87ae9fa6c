"""A DeepSeek-V3 forward in numpy float64, written from tests/fixtures/README.md ("Conventions the C engine
must follow"), independent of the fixture generator and of the C engine.

Why: the fixtures' reference logits must be transformers in float32 on the stored (bf16 / dequantised)
values, not a bf16 computation. Recomputing them here in float64 from the stored values tells the two apart:
an fp32 computation agrees to ~1e-6 of the largest logit, a bf16 one (activations rounded to bf16 after every
linear and norm, as a bf16 torch model does) misses by ~1e-2. `bf16_activations=True` emulates the latter so
a test can show that the check would catch it.
"""

import numpy as np


def bf16_round(a):
    """Round to the nearest bf16 (ties to even), back in float64."""
    u = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def forward(cfg, w, ids, inv_freq, rope_factor, softmax_scale, bf16_activations=False):
    """Logits [len(ids)][vocab] of a cache-free causal forward at positions 0..n-1.

    w: {checkpoint name without prefix: float64 array} with per-expert names (mlp.experts.{e}.*).
    """
    rnd = bf16_round if bf16_activations else (lambda a: a)
    eps = cfg["rms_norm_eps"]

    def lin(name, x):
        return rnd(x @ w[name + ".weight"].T)

    def norm(x, name, e):
        return rnd(x / np.sqrt((x * x).mean(-1, keepdims=True) + e) * w[name + ".weight"])

    def mlp(p, x):
        g = lin(p + "gate_proj", x)
        return lin(p + "down_proj", rnd(g / (1.0 + np.exp(-g)) * lin(p + "up_proj", x)))

    def rope(x, pos):
        # checkpoint pairs (2i, 2i+1) rotated in place by pos * inv_freq[i]
        ang = pos[:, None] * inv_freq[None, :]
        cos, sin = np.cos(ang) * rope_factor, np.sin(ang) * rope_factor
        shp = (x.shape[0],) + (1,) * (x.ndim - 2) + (len(inv_freq),)
        cos, sin = cos.reshape(shp), sin.reshape(shp)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = b * cos + a * sin
        return out

    n = len(ids)
    heads, nope, rdim = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
    vdim, rank = cfg["v_head_dim"], cfg["kv_lora_rank"]
    pos = np.arange(n, dtype=np.float64)
    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    causal = np.tril(np.ones((n, n), dtype=bool))
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = norm(x, p + "input_layernorm", eps)
        if cfg["q_lora_rank"] is None:
            q = lin(p + "self_attn.q_proj", h)
        else:
            q = lin(p + "self_attn.q_b_proj", norm(lin(p + "self_attn.q_a_proj", h), p + "self_attn.q_a_layernorm", 1e-6))
        q = q.reshape(n, heads, nope + rdim)
        kv = lin(p + "self_attn.kv_a_proj_with_mqa", h)
        c = norm(kv[:, :rank], p + "self_attn.kv_a_layernorm", 1e-6)
        k_rope = rope(kv[:, rank:], pos)
        q_rope = rope(q[:, :, nope:], pos)
        kvb = lin(p + "self_attn.kv_b_proj", c).reshape(n, heads, nope + vdim)
        k_nope, v = kvb[:, :, :nope], kvb[:, :, nope:]
        s = (np.einsum("thd,shd->hts", q[:, :, :nope], k_nope) + np.einsum("thd,sd->hts", q_rope, k_rope))
        s = np.where(causal[None], s * softmax_scale, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = rnd(np.einsum("hts,shd->thd", s, v).reshape(n, heads * vdim))
        x = x + lin(p + "self_attn.o_proj", o)
        h = norm(x, p + "post_attention_layernorm", eps)
        if layer < cfg["first_k_dense_replace"]:
            x = x + mlp(p + "mlp.", h)
            continue
        n_exp, top_k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
        n_group, topk_group = max(cfg["n_group"], 1), max(cfg["topk_group"], 1)
        score = 1.0 / (1.0 + np.exp(-(h @ w[p + "mlp.gate.weight"].T)))  # the router stays in fp32 in HF
        choice = score + w[p + "mlp.gate.e_score_correction_bias"]
        if n_group > 1:
            grouped = choice.reshape(n, n_group, n_exp // n_group)
            gscore = np.sort(grouped, -1)[..., -2:].sum(-1)
            keep = np.argsort(-gscore, -1, kind="stable")[:, :topk_group]
            mask = np.zeros((n, n_group), dtype=bool)
            np.put_along_axis(mask, keep, True, -1)
            choice = np.where(np.repeat(mask, n_exp // n_group, -1), choice, -np.inf)
        sel = np.argsort(-choice, -1, kind="stable")[:, :top_k]
        wt = np.take_along_axis(score, sel, -1)
        if cfg["norm_topk_prob"]:
            wt = wt / (wt.sum(-1, keepdims=True) + 1e-20)
        wt = wt * cfg["routed_scaling_factor"]
        y = mlp(p + "mlp.shared_experts.", h) if cfg["n_shared_experts"] else np.zeros_like(h)
        for t in range(n):
            for k in range(top_k):
                y[t] += wt[t, k] * mlp(p + f"mlp.experts.{sel[t, k]}.", h[t:t + 1])[0]
        x = x + rnd(y)
    return norm(x, "model.norm", eps) @ w["lm_head.weight"].T
