#!/usr/bin/env python3
"""make_dflash.py — write a DFlash drafter folder of a given shape with random bf16 weights, for
benchmarks of the draft at real sizes (cuda_bench_draft): no released drafter can be downloaded
here, and the time of a draft depends on the shapes only.

    python3 bench/make_dflash.py OUT --preset k26      # Kimi-K2.6-DFlash's shape: hidden 7168, 6 layers,
                                                      # 64 / 8 heads of 128, intermediate 18432 (~7 GB)
    python3 bench/make_dflash.py OUT --preset pystdlib # the shipped drafter's shape (tests)

config.json as the released drafters write it (DFlashDraftModel, dflash_config with the mask token
and the target layers, YaRN for k26) and one model.safetensors.  The weights are one random block
(normal, std 0.02, rounded to bf16) repeated, norms 1: finite values of the right dtype and shape;
the tokens such a drafter proposes mean nothing."""

import argparse
import json
import os
import struct
import sys

import numpy as np

PRESETS = {
    "k26": dict(hidden=7168, layers=6, heads=64, kv_heads=8, head_dim=128, inter=18432, vocab=163840, block=16,
                target_layers=[1, 12, 24, 35, 47, 58], num_target_layers=61, mask=163838,
                rope_scaling={"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
                              "beta_fast": 32.0, "beta_slow": 1.0}, rope_theta=50000.0, max_pos=262144),
    "pystdlib": dict(hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64, inter=1024, vocab=4352, block=16,
                     target_layers=[1, 2, 3, 4], num_target_layers=6, mask=4350, rope_scaling=None,
                     rope_theta=10000.0, max_pos=1024),
}


def tensors(p):
    """(name, shape) of every tensor, in file order"""
    H, hd = p["hidden"], p["head_dim"]
    out = [("fc.weight", [H, len(p["target_layers"]) * H]), ("hidden_norm.weight", [H]), ("norm.weight", [H])]
    for i in range(p["layers"]):
        pre = f"layers.{i}"
        out += [(f"{pre}.input_layernorm.weight", [H]), (f"{pre}.post_attention_layernorm.weight", [H]),
                (f"{pre}.self_attn.q_proj.weight", [p["heads"] * hd, H]),
                (f"{pre}.self_attn.k_proj.weight", [p["kv_heads"] * hd, H]),
                (f"{pre}.self_attn.v_proj.weight", [p["kv_heads"] * hd, H]),
                (f"{pre}.self_attn.o_proj.weight", [H, p["heads"] * hd]),
                (f"{pre}.self_attn.q_norm.weight", [hd]), (f"{pre}.self_attn.k_norm.weight", [hd]),
                (f"{pre}.mlp.gate_proj.weight", [p["inter"], H]), (f"{pre}.mlp.up_proj.weight", [p["inter"], H]),
                (f"{pre}.mlp.down_proj.weight", [H, p["inter"]])]
    return out


def config(p):
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": p["hidden"],
            "num_hidden_layers": p["layers"], "num_attention_heads": p["heads"],
            "num_key_value_heads": p["kv_heads"], "head_dim": p["head_dim"], "intermediate_size": p["inter"],
            "hidden_act": "silu", "attention_bias": False, "rms_norm_eps": 1e-6, "rope_theta": p["rope_theta"],
            "rope_scaling": p["rope_scaling"], "max_position_embeddings": p["max_pos"], "vocab_size": p["vocab"],
            "tie_word_embeddings": False, "block_size": p["block"], "num_target_layers": p["num_target_layers"],
            "dflash_config": {"mask_token_id": p["mask"], "target_layer_ids": p["target_layers"]},
            "torch_dtype": "bfloat16"}


def write(out, p, seed=0):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config(p), f, indent=2)
    ts = tensors(p)
    header, off = {}, 0
    for name, shape in ts:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    hj = json.dumps(header).encode()
    hj += b" " * (-len(hj) % 8)
    rng = np.random.default_rng(seed)
    block = (rng.standard_normal(1 << 22, dtype=np.float32) * 0.02).view(np.uint32)
    block = ((block + 0x8000) >> 16).astype(np.uint16).tobytes()  # bf16, rounded
    one = np.full(1 << 16, 0x3F80, dtype=np.uint16).tobytes()  # bf16 1.0
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for name, shape in ts:
            left = int(np.prod(shape)) * 2
            src = one if len(shape) == 1 else block
            while left > 0:
                k = min(left, len(src))
                f.write(src[:k])
                left -= k
    return off


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="k26")
    ap.add_argument("--layers", type=int, help="override the preset's layer count")
    a = ap.parse_args(argv)
    p = dict(PRESETS[a.preset])
    if a.layers is not None:
        if a.layers < 1:
            ap.error("--layers must be >= 1")
        p["layers"] = a.layers
    n = write(a.out, p)
    print(f"{a.out}: {a.preset} drafter, {p['layers']} layers, {n / 1e9:.2f} GB of bf16 weights")
    return 0


if __name__ == "__main__":
    sys.exit(main())
