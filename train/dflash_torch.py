"""dflash_torch.py — the DFlash drafter as a trainable PyTorch module, computing what the C engine
computes (src/model/drafter.h; reference.md section 2), batched over many draft blocks at once.

Parameter names are the checkpoint's (fc.weight, hidden_norm.weight, norm.weight,
layers.{i}.self_attn.{q,k,v,o}_proj.weight, layers.{i}.self_attn.{q,k}_norm.weight,
layers.{i}.{input,post_attention}_layernorm.weight, layers.{i}.mlp.{gate,up,down}_proj.weight), so
state_dict() is the export.  The target's embed_tokens and lm_head are passed in, frozen.

Math (one block; the batched form below is the same with a mask):
  ctx   = hidden_norm(fc(features of committed tokens))                         positions 0..a-1
  x     = embed([token a, MASK x (L-1)])                                         positions a..a+L-1
  layer: h = input_layernorm(x); q = rope(q_norm(q_proj(h)));
         k = rope(k_norm(k_proj([ctx; h]))); v = v_proj([ctx; h])                 (context at its positions)
         x += o_proj(softmax(q k^T / sqrt(head_dim)) v)                          non-causal, GQA
         x += down(silu(gate(post_attention_layernorm(x))) * up(...))
  logits = lm_head(norm(x))[1:]                                                  row i-1 predicts token a+i
RoPE is Qwen3's rotate_half over head_dim, inv_freq = theta^(-2j/head_dim), no scaling.

check_against_reference() runs tests/fixtures/make_drafter_fixtures.py's draft_forward (the PyTorch
reference the C engine matches to 1e-6) on the same weights and compares.
"""

from __future__ import annotations

import copy
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return self.weight.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps))


class Attn(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, nh, kvh, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.nh, self.kvh, self.hd = nh, kvh, hd
        self.q_proj = nn.Linear(H, nh * hd, bias=False)
        self.k_proj = nn.Linear(H, kvh * hd, bias=False)
        self.v_proj = nn.Linear(H, kvh * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.q_norm = RMSNorm(hd, cfg["rms_norm_eps"])
        self.k_norm = RMSNorm(hd, cfg["rms_norm_eps"])


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, it = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(H, it, bias=False)
        self.up_proj = nn.Linear(H, it, bias=False)
        self.down_proj = nn.Linear(it, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.self_attn = Attn(cfg)
        self.mlp = MLP(cfg)


def rotate(x, cos, sin):
    """rotate_half RoPE; x [..., T, d], cos/sin broadcastable to [..., T, d/2]."""
    h = x.shape[-1] // 2
    c = torch.cat([cos, cos], -1)
    s = torch.cat([sin, sin], -1)
    return x * c + torch.cat([-x[..., h:], x[..., :h]], -1) * s


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.cfg = cfg
        H = cfg["hidden_size"]
        n_ids = len(cfg["dflash_config"]["target_layer_ids"])
        self.fc = nn.Linear(n_ids * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, cfg["rms_norm_eps"])
        self.norm = RMSNorm(H, cfg["rms_norm_eps"])
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg["num_hidden_layers"])])
        hd = cfg["head_dim"]
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).to(torch.float32) / hd))
        self.register_buffer("inv_freq", inv, persistent=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)

    def cos_sin(self, positions):
        ang = positions.to(torch.float32)[..., None] * self.inv_freq
        return ang.cos(), ang.sin()

    def forward(self, features, anchors, block_ids, embed, lm_head):
        """features [B, S, n_ids*H] of tokens at positions 0..S-1; anchors [B, A] (the block of anchor a
        sits at positions a..a+L-1 and sees context positions < a); block_ids [B, A, L] input ids
        (token a then MASK).  Returns logits [B, A, L-1, V] (row i-1 predicts the token at a+i)."""
        cfg = self.cfg
        B, S, _ = features.shape
        A, L = block_ids.shape[1], block_ids.shape[2]
        nq = A * L
        dev = features.device
        ctx = self.hidden_norm(self.fc(features))                                     # [B, S, H]
        pos_ctx = torch.arange(S, device=dev)
        pos_blk = (anchors[:, :, None] + torch.arange(L, device=dev)).reshape(B, nq)  # [B, nq]
        cos_c, sin_c = self.cos_sin(pos_ctx)                                          # [S, hd/2]
        cos_b, sin_b = self.cos_sin(pos_blk)                                          # [B, nq, hd/2]
        cos_b, sin_b = cos_b[:, None], sin_b[:, None]
        # mask [B, 1, nq, S + nq]: context key j visible to anchor a iff j < a; block keys of the same anchor
        a_of_q = anchors.repeat_interleave(L, dim=1)                                  # [B, nq]
        m_ctx = pos_ctx[None, None, :] < a_of_q[:, :, None]                           # [B, nq, S]
        blk_of = torch.arange(A, device=dev).repeat_interleave(L)
        m_blk = (blk_of[:, None] == blk_of[None, :]).expand(B, nq, nq)
        mask = torch.cat([m_ctx, m_blk], -1)[:, None]
        x = embed[block_ids.reshape(B, nq)].to(torch.float32)                         # [B, nq, H]
        for layer in self.layers:
            at = layer.self_attn
            nh, kvh, hd = at.nh, at.kvh, at.hd
            h = layer.input_layernorm(x)
            q = at.q_proj(h).view(B, nq, nh, hd).transpose(1, 2)
            q = rotate(at.q_norm(q), cos_b, sin_b)
            kb = at.k_proj(h).view(B, nq, kvh, hd).transpose(1, 2)
            kb = rotate(at.k_norm(kb), cos_b, sin_b)
            vb = at.v_proj(h).view(B, nq, kvh, hd).transpose(1, 2)
            kc = at.k_proj(ctx).view(B, S, kvh, hd).transpose(1, 2)
            kc = rotate(at.k_norm(kc), cos_c, sin_c)
            vc = at.v_proj(ctx).view(B, S, kvh, hd).transpose(1, 2)
            k = torch.cat([kc, kb], 2).repeat_interleave(nh // kvh, 1)
            v = torch.cat([vc, vb], 2).repeat_interleave(nh // kvh, 1)
            dt = v.dtype if v.dtype != torch.float32 else q.dtype
            o = F.scaled_dot_product_attention(q.to(dt), k.to(dt), v.to(dt), attn_mask=mask,
                                               scale=1.0 / math.sqrt(hd))
            x = x + at.o_proj(o.transpose(1, 2).reshape(B, nq, nh * hd))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        x = self.norm(x).view(B, A, L, -1)[:, :, 1:]
        return F.linear(x, lm_head.to(x.dtype))


def check_against_reference(model: DFlashDrafter, features, tokens, anchor: int, embed, lm_head) -> float:
    """Relative difference between this module's logits and make_drafter_fixtures.draft_forward's for
    one block (fp32, no autocast).  features [S, n_ids*H], tokens [S]."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "tests", "fixtures"))
    import make_drafter_fixtures as ref  # noqa: E402
    cfg = model.cfg
    W = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    f = features[:anchor].float().cpu()
    inv, factor = ref.rope_params(cfg["head_dim"], cfg["rope_theta"], None, False)
    emb, head = embed.float().cpu(), lm_head.float().cpu()
    with torch.no_grad():
        ks, vs = ref.context_kv(W, cfg, f, torch.arange(anchor), inv, factor)
        want = ref.draft_forward(W, cfg, emb, head, ks, vs, int(tokens[anchor]), anchor, inv, factor)
        L = cfg["block_size"]
        ids = torch.tensor([[[int(tokens[anchor])] + [cfg["dflash_config"]["mask_token_id"]] * (L - 1)]])
        m = copy.deepcopy(model).float().cpu()
        got = m(features[None].float().cpu(), torch.tensor([[anchor]]), ids, emb, head)[0, 0]
    return float((got - want).norm() / want.norm())
