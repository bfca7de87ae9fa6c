"""ddt_common.py — what the training scripts share: paths, the tokenizer layout (byte ranks + 256
Kimi-style specials), the model configurations of the shipped pair, a token-stream loader, and
small helpers (seeding, JSON, timing).

Everything here is deterministic; the scripts seed every generator from --seed.
"""

from __future__ import annotations

import json
import os
import random
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA_DIR = os.path.join(HERE, "data")
MODELS_DIR = os.path.join(ROOT, "models")
TARGET_DIR = os.path.join(MODELS_DIR, "pystdlib-target")
DRAFTER_DIR = os.path.join(MODELS_DIR, "pystdlib-dflash")
TOKENIZER_DIR = os.path.join(DATA_DIR, "tokenizer")  # trained here, copied into the target folder

# ------------------------------------------------------------------------------------ tokenizer

N_RANKS = 4096                 # 256 single bytes + 3840 merges
N_SPECIAL = 256                # ids N_RANKS .. N_RANKS+255, as Kimi puts 256 specials after its ranks
VOCAB = N_RANKS + N_SPECIAL    # 4352
# Kimi K2's named specials at the same offsets from the end of the ranks (163584 + k there).
NAMED_SPECIALS = {
    N_RANKS + 0: "[BOS]",
    N_RANKS + 1: "[EOS]",
    N_RANKS + 2: "<|im_end|>",
    N_RANKS + 3: "<|im_user|>",
    N_RANKS + 4: "<|im_assistant|>",
    N_RANKS + 10: "<|im_system|>",
    N_RANKS + 17: "<|im_middle|>",
    N_RANKS + 254: "[UNK]",
    N_RANKS + 255: "[PAD]",
}
BOS_ID = N_RANKS + 0
EOS_ID = N_RANKS + 1           # also the separator written between corpus files
MASK_ID = N_RANKS + 254        # [UNK]: the drafter's mask token, as Kimi's DFlash drafter uses [UNK]

# Kimi's pre-tokenisation pattern exactly as tokenization_kimi.py hands it to tiktoken
# (fancy-regex syntax with && class intersections); the C tokenizer uses the same one.
KIMI_PAT_STR = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


def kimi_pattern_for_regex_module() -> str:
    """The same pattern for Python's `regex` module: each class `[X&&[^\\p{Han}]]` becomes the
    equivalent `(?:(?!\\p{Han})[X])` (the module's own && syntax differs from fancy-regex's)."""
    pat = KIMI_PAT_STR
    for cls in (r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"):
        inner = cls[1:-len("&&[^\\p{Han}]]")]
        pat = pat.replace(cls, r"(?:(?!\p{Han})[" + inner + "])")
    assert "&&" not in pat
    return pat


def special_tokens() -> dict[str, int]:
    """All 256 specials as tokenization_kimi.py names them (unnamed ids: <|reserved_token_ID|>)."""
    return {NAMED_SPECIALS.get(i, f"<|reserved_token_{i}|>"): i for i in range(N_RANKS, VOCAB)}


def load_ranks(path: str) -> dict[bytes, int]:
    import base64
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def tiktoken_encoding(tokenizer_dir: str):
    """A PyPI tiktoken Encoding over the trained ranks with the Kimi pattern and specials."""
    import tiktoken
    ranks = load_ranks(os.path.join(tokenizer_dir, "tiktoken.model"))
    return tiktoken.Encoding(name="ddt-pystdlib", pat_str=KIMI_PAT_STR, mergeable_ranks=ranks,
                             special_tokens=special_tokens())


# ------------------------------------------------------------------------------------ models

def target_config(tiny: bool = False) -> dict:
    """The DeepSeek-V3 target (HF DeepseekV3Config keyword arguments).  --tiny shrinks it for the
    CPU smoke test only; the shipped model uses the full one."""
    cfg = dict(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=768, moe_intermediate_size=192,
        num_hidden_layers=6, num_nextn_predict_layers=0, num_attention_heads=4, num_key_value_heads=4,
        n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2, routed_scaling_factor=2.5,
        kv_lora_rank=64, q_lora_rank=128, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
        topk_method="noaux_tc", scoring_func="sigmoid", n_group=1, topk_group=1, norm_topk_prob=True,
        moe_layer_freq=1, first_k_dense_replace=1, hidden_act="silu", max_position_embeddings=1024,
        initializer_range=0.02, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None,
        rope_interleave=True, attention_bias=False, attention_dropout=0.0, bos_token_id=BOS_ID,
        eos_token_id=EOS_ID, tie_word_embeddings=False, use_cache=True,
    )
    if tiny:
        cfg.update(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4,
                   kv_lora_rank=32, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                   n_routed_experts=4)
    return cfg


def default_target_layer_ids(n_draft_layers: int, n_target_layers: int) -> list[int]:
    """reference.md section 2: N = 1 -> [T/2], else round(1 + i*(T-4)/(N-1))."""
    if n_draft_layers == 1:
        return [n_target_layers // 2]
    return [int(round(1 + i * (n_target_layers - 4) / (n_draft_layers - 1))) for i in range(n_draft_layers)]


def drafter_config(target_cfg: dict, tiny: bool = False, n_layers: int = 2, intermediate: int | None = None,
                   target_layer_ids: list[int] | None = None) -> dict:
    """The DFlash drafter's config.json (HF DFlash layout plus the keys the C loader reads).  The
    defaults are the shipped drafter's: 2 layers, intermediate 768, target layers by the default rule."""
    heads, kv_heads, head_dim, inter = (4, 2, 64, 768) if not tiny else (4, 2, 16, 128)
    if intermediate:
        inter = intermediate
    if target_layer_ids is None:
        target_layer_ids = default_target_layer_ids(n_layers, target_cfg["num_hidden_layers"])
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": target_cfg["hidden_size"],
        "num_hidden_layers": n_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": inter,
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "max_position_embeddings": target_cfg["max_position_embeddings"],
        "vocab_size": target_cfg["vocab_size"],
        "tie_word_embeddings": False,
        "block_size": 16,
        "num_target_layers": target_cfg["num_hidden_layers"],
        "dflash_config": {
            "mask_token_id": MASK_ID,
            "target_layer_ids": list(target_layer_ids),
        },
        "torch_dtype": "bfloat16",
    }


# ------------------------------------------------------------------------------------ data

def load_tokens(name: str, data_dir: str = DATA_DIR) -> np.ndarray:
    """train/data/<name>.bin: uint16 token ids, files separated by EOS_ID."""
    return np.fromfile(os.path.join(data_dir, f"{name}.bin"), dtype=np.uint16)


# ------------------------------------------------------------------------------------ acceptance

def chain_walk(acc) -> tuple[int, int]:
    """Greedy chain decoding's (tokens committed, rounds) over one continuation, given acc[j] = tokens
    that one round anchored at generated token j commits (1 + leading drafts equal to the target's
    tokens; the target's own next token included).  The engine's rounds do not start at every j: the
    first is anchored at j = 0 (the prefill's token) and each next one where the previous one ended,
    j += acc[j], while j < len(acc).  tokens / rounds is what `ddtree generate --mode chain` reports
    as mean acceptance on that continuation when run for len(acc) + 1 tokens; it is not mean(acc),
    which weights a run of easy positions by its length although one round crosses it."""
    j = tokens = rounds = 0
    while j < len(acc):
        n = int(acc[j])
        if n < 1:
            raise ValueError(f"acceptance at {j} is {n}: a round commits at least the target's token")
        tokens += n
        rounds += 1
        j += n
    return tokens, rounds


# ------------------------------------------------------------------------------------ misc

def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    try:
        import torch
        torch.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)
    except ImportError:
        pass


def write_json(path: str, obj) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def read_json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class Log:
    """Prints with elapsed seconds and appends to a file (the device run tees it to $OUT too)."""

    def __init__(self, path: str | None = None):
        self.t0 = time.time()
        self.f = open(path, "a", encoding="utf-8") if path else None

    def __call__(self, *args):
        line = f"[{time.time() - self.t0:7.1f}s] " + " ".join(str(a) for a in args)
        print(line, flush=True)
        if self.f:
            self.f.write(line + "\n")
            self.f.flush()
