"""`ddtree inspect`: each GPU's share of a target, checked against an independent reading of the
safetensors headers (this file parses them itself: tensor names, dtypes and shapes, no weights
read) with the split of model/shard.h (heads' rows of q_b / q_proj and kv_b and columns of o_proj,
routed experts by floor division, dense MLPs and shared experts sliced along their intermediate
dimension where it cuts into whole units, else on GPU 0, the rest everywhere) and what one token
reads on each GPU (its rows of the LM head where the vocabulary splits, its expected share of the
routed experts), on
every fixture format and GPU counts 1..8; the KV cache a position; --gpu-memory's verdict and exit
status at the edge; bad arguments exiting 2 with a message.  Needs DDT_BUILD_DIR."""

import json
import math
import os
import struct
import subprocess

import pytest

from ddt_paths import ddtree_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = ["models/pystdlib-target"] + [f"tests/fixtures/target/{v}" for v in
                                        ("fp32", "bf16", "fp8", "int4", "kimi", "dense3", "qlora_null", "ngroup")]
DTYPE_BYTES = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "I32": 4, "I64": 8, "U8": 1, "I8": 1}


def run(*args):
    return subprocess.run([ddtree_path(), "inspect", *args], capture_output=True, text=True, timeout=60)


def headers(model):
    """name -> (dtype, shape) of every tensor of the folder's safetensors files."""
    out = {}
    for f in sorted(os.listdir(model)):
        if not f.endswith(".safetensors"):
            continue
        with open(os.path.join(model, f), "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            h = json.loads(fh.read(n))
        for k, v in h.items():
            if k != "__metadata__":
                out[k] = (v["dtype"], v["shape"])
    return out


def nbytes(dtype, shape):
    return math.prod(shape) * DTYPE_BYTES[dtype]


class Ref:
    """Each weight's stored bytes, and the bytes of a slice of its rows or columns."""

    def __init__(self, model):
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
        self.cfg = cfg.get("text_config", cfg)
        self.t = headers(model)
        self.prefix = "language_model." if any(k.startswith("language_model.") for k in self.t) else ""
        q = self.cfg.get("quantization_config") or {}
        self.block = (q.get("weight_block_size") or [128, 128])[0]

    def unit(self, base, rows):
        """the elements weight `base` may be cut in: FP8 blocks (rows or columns), INT4 groups (columns)"""
        base = self.prefix + base
        if base + ".weight_packed" in self.t:
            _, (pr, pc) = self.t[base + ".weight_packed"]
            _, (sr, sc) = self.t[base + ".weight_scale"]
            return 1 if rows else pc * 8 // sc
        return self.block if base + ".weight_scale_inv" in self.t else 1

    def mlp_share(self, pre, r, world):
        """bytes of GPU r's slice of the MLP at `pre`: an equal share of its intermediate rows where
        the world cuts them into multiples of 32 and of its weights' blocks and groups, else all on
        GPU 0"""
        down = self.prefix + pre + ".down_proj"
        if down + ".weight_packed" in self.t:  # INT4: 8 columns a packed word
            inter = self.t[down + ".weight_packed"][1][1] * 8
        else:
            inter = self.t[down + ".weight"][1][1]
        unit = math.lcm(32, self.unit(pre + ".gate_proj", True), self.unit(pre + ".up_proj", True),
                        self.unit(pre + ".down_proj", False))
        if world > 1 and inter % world == 0 and (inter // world) % unit == 0:
            n = inter // world
            return self.weight(pre + ".gate_proj", rows=n) + self.weight(pre + ".up_proj", rows=n) + \
                self.weight(pre + ".down_proj", cols=n)
        return self.mlp(pre) if r == 0 else 0

    def weight(self, base, rows=None, cols=None):
        """bytes of weight `base` (its rows or columns cut to the given count)"""
        base = self.prefix + base
        if base + ".weight_packed" in self.t:  # INT4: packed int32 words, bf16 scales a group
            r, c = self.t[base + ".weight_shape"][1], None
            _, (pr, pc) = self.t[base + ".weight_packed"]
            _, (sr, sc) = self.t[base + ".weight_scale"]
            group = pc * 8 // sc
            R, C = pr, pc * 8
            R = rows if rows is not None else R
            C = cols if cols is not None else C
            return R * C // 2 + 2 * R * (C // group)
        dtype, (R, C) = self.t[base + ".weight"]
        R = rows if rows is not None else R
        C = cols if cols is not None else C
        if base + ".weight_scale_inv" in self.t:  # FP8 blocks: one fp32 scale a block
            b = self.block
            return R * C + 4 * (-(-R // b)) * (-(-C // b))
        return R * C * DTYPE_BYTES[dtype]

    def vec(self, name):
        return nbytes(*self.t[self.prefix + name])

    def mlp(self, pre):
        return sum(self.weight(f"{pre}.{p}_proj") for p in ("gate", "up", "down"))

    def is_moe(self, layer):
        c = self.cfg
        return (c.get("n_routed_experts") or 0) > 0 and layer >= c.get("first_k_dense_replace", 0) and \
            layer % c.get("moe_layer_freq", 1) == 0

    def rank(self, r, world):
        """{"embed", "attention", "router", "dense", "routed"} of GPU r of world"""
        c = self.cfg
        H, E = c["num_attention_heads"], c.get("n_routed_experts") or 0
        nope, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        split = H % world == 0
        heads = H // world if split else H
        e0, e1 = r * E // world, (r + 1) * E // world
        b = dict(embed=self.weight("model.embed_tokens") + self.vec("model.norm.weight"), attention=0, router=0,
                 dense=0, routed=0)
        if not c.get("tie_word_embeddings", False):
            b["embed"] += self.weight("lm_head")
        for l in range(c["num_hidden_layers"]):
            p = f"model.layers.{l}"
            a = self.vec(f"{p}.input_layernorm.weight") + self.vec(f"{p}.post_attention_layernorm.weight")
            if c.get("q_lora_rank"):
                a += self.weight(f"{p}.self_attn.q_a_proj") + self.vec(f"{p}.self_attn.q_a_layernorm.weight")
                a += self.weight(f"{p}.self_attn.q_b_proj", rows=heads * (nope + rope))
            else:
                a += self.weight(f"{p}.self_attn.q_proj", rows=heads * (nope + rope))
            a += self.weight(f"{p}.self_attn.kv_a_proj_with_mqa") + self.vec(f"{p}.self_attn.kv_a_layernorm.weight")
            a += self.weight(f"{p}.self_attn.kv_b_proj", rows=heads * (nope + v))
            a += self.weight(f"{p}.self_attn.o_proj", cols=heads * v)
            b["attention"] += a
            if not self.is_moe(l):
                b["dense"] += self.mlp_share(f"{p}.mlp", r, world)
                continue
            b["router"] += self.weight(f"{p}.mlp.gate") + self.vec(f"{p}.mlp.gate.e_score_correction_bias")
            b["routed"] += sum(self.mlp(f"{p}.mlp.experts.{e}") for e in range(e0, e1))
            if c.get("n_shared_experts"):
                b["dense"] += self.mlp_share(f"{p}.mlp.shared_experts", r, world)
        b["total"] = sum(b.values())
        return b

    def token(self, r, world, b):
        """what one token reads on GPU r of world whose bytes are b: an embedding row of an untied table,
        the GPU's vocabulary rows of the LM head where the world cuts the vocabulary into 32-row units,
        its expected share (top_k / n_experts of its experts) of the routed experts, the rest whole"""
        c = self.cfg
        V, E, k = c["vocab_size"], c.get("n_routed_experts") or 0, c.get("num_experts_per_tok") or 0
        tied = c.get("tie_word_embeddings", False)
        emb = self.weight("model.embed_tokens")
        step = b["total"]
        if not tied:
            step = step - emb + emb // V
        if world > 1 and V % world == 0 and (V // world) % 32 == 0:
            head = emb if tied else self.weight("lm_head")
            step = step - head + head // world
        ne = (r + 1) * E // world - r * E // world
        if E and ne:
            per = b["routed"] // ne
            step = step - b["routed"] + per * k * ne // E
        return step


def valid_worlds(cfg):
    E = cfg.get("n_routed_experts") or 0
    return [w for w in range(1, 9) if E == 0 or w <= E]


@pytest.mark.parametrize("model", MODELS)
def test_ranks_match_the_headers(model):
    path = os.path.join(ROOT, model)
    ref = Ref(path)
    # the whole target is every stored tensor of the language model (a K2.6 folder also holds a
    # vision tower) but INT4's shape records and layers past num_hidden_layers (DeepSeek-V3's
    # next-token-prediction layer, which the engine does not load)
    n_layers = ref.cfg["num_hidden_layers"]

    def counted(k):
        if not k.startswith(ref.prefix) or k.endswith(".weight_shape"):
            return False
        parts = k[len(ref.prefix):].split(".")
        return not (parts[:2] == ["model", "layers"] and int(parts[2]) >= n_layers)

    whole = sum(nbytes(*v) for k, v in ref.t.items() if counted(k))
    for w in valid_worlds(ref.cfg):
        r = run("--model", path, "--gpus", str(w), "--json")
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert got["gpus"] == w and len(got["ranks"]) == w
        if w == 1:
            assert got["weights"]["total"] == whole
            assert got["weights"] == got["ranks"][0]["bytes"]
        for i, g in enumerate(got["ranks"]):
            assert g["rank"] == i
            assert g["bytes"] == ref.rank(i, w), (model, w, i)
            assert g["token_bytes"] == ref.token(i, w, g["bytes"]), (model, w, i)
            assert g["need"] == g["bytes"]["total"] + got["kv_bytes"]
        c = ref.cfg
        per_pos = c["num_hidden_layers"] * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * 4
        assert got["kv_bytes_per_position"] == per_pos
        assert got["kv_bytes"] == per_pos * got["ctx"]
        assert got["ctx"] == min(c["max_position_embeddings"], 8192)
        # one token reads an embedding row (untied), top_k of the routed experts, the rest whole
        emb = ref.weight("model.embed_tokens")
        E, k = c.get("n_routed_experts") or 0, c.get("num_experts_per_tok") or 0
        one = got["weights"]["total"]
        if not c.get("tie_word_embeddings", False):
            one += emb // c["vocab_size"] - emb
        if E and any(ref.is_moe(l) for l in range(n_layers)):
            one += got["weights"]["routed"] // E * k - got["weights"]["routed"]
        assert got["decode_step_bytes"] == one


def test_drafter():
    """--draft: the drafter's weights are every tensor of its folder (it shares the target's embedding
    and LM head), its cache every layer's K and V rows of fp32 for ctx + one block, both on every GPU"""
    target, draft = os.path.join(ROOT, "models/pystdlib-target"), os.path.join(ROOT, "models/pystdlib-dflash")
    with open(os.path.join(draft, "config.json")) as f:
        dc = json.load(f)
    plain = json.loads(run("--model", target, "--gpus", "2", "--json").stdout)
    r = run("--model", target, "--draft", draft, "--gpus", "2", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    weights = sum(nbytes(*v) for v in headers(draft).values())
    kv = dc["num_hidden_layers"] * 2 * dc["num_key_value_heads"] * dc["head_dim"] * 4 * (got["ctx"] + dc["block_size"])
    assert got["drafter"] == {"weights": weights, "kv_bytes": kv}
    for g, p in zip(got["ranks"], plain["ranks"]):
        assert g["need"] == p["need"] + weights + kv
    # the verdict counts the drafter: the target alone fits what target + drafter does not
    gib = got["ranks"][0]["need"] / 2 ** 30
    assert run("--model", target, "--gpus", "2", "--gpu-memory", repr(gib * 0.9999)).returncode == 0
    short = run("--model", target, "--draft", draft, "--gpus", "2", "--gpu-memory", repr(gib * 0.9999))
    assert short.returncode == 1 and "the drafter's" in short.stdout
    bad = run("--model", target, "--draft", os.path.join(ROOT, "tests/fixtures/target/int4"))
    assert bad.returncode == 2 and "drafter" in bad.stderr


def test_formats_and_text():
    int4 = json.loads(run("--model", os.path.join(ROOT, "tests/fixtures/target/int4"), "--json").stdout)
    assert int4["formats"]["routed"] == "INT4 g32"
    fp8 = json.loads(run("--model", os.path.join(ROOT, "tests/fixtures/target/fp8"), "--json").stdout)
    assert "FP8 b" in fp8["formats"]["routed"]
    r = run("--model", os.path.join(ROOT, "models/pystdlib-target"), "--gpus", "2")
    assert r.returncode == 0, r.stderr
    assert "| 0 | 0-1 | 0-3 |" in r.stdout and "| 1 | 2-3 | 4-7 |" in r.stdout
    assert "| a token reads |" in r.stdout
    assert "8 routed experts (2 a token) + 1 shared" in r.stdout


def test_gpu_memory_edge():
    path = os.path.join(ROOT, "models/pystdlib-target")
    got = json.loads(run("--model", path, "--ctx", "512", "--fast-attention", "--json").stdout)
    assert got["kv_bytes_per_position"] * 2 == json.loads(run("--model", path, "--json").stdout)["kv_bytes_per_position"]
    need = got["ranks"][0]["need"]
    gib = need / 2 ** 30
    # a little above the need fits (exit 0), a little below does not (exit 1, the advice)
    fit = run("--model", path, "--ctx", "512", "--fast-attention", "--gpu-memory", repr(gib * 1.0001), "--json")
    assert fit.returncode == 0, fit.stderr
    assert json.loads(fit.stdout)["fits"] is True
    short = run("--model", path, "--ctx", "512", "--fast-attention", "--gpu-memory", repr(gib * 0.9999))
    assert short.returncode == 1
    assert "**no**" in short.stdout and "--gpus 2 would need" in short.stdout and "--ctx" in short.stdout


@pytest.mark.parametrize("args, words", [
    ([], "--model is required"),
    (["--model", "models/pystdlib-target", "--gpus", "0"], "--gpus '0'"),
    (["--model", "models/pystdlib-target", "--gpus", "9"], "8 routed experts"),
    (["--model", "models/pystdlib-target", "--ctx", "4096"], "longer than the model's maximum 1024"),
    (["--model", "models/pystdlib-target", "--gpu-memory", "-1"], "--gpu-memory '-1'"),
    (["--model", "models/pystdlib-target", "--gpu-memory", "lots"], "--gpu-memory 'lots'"),
    (["--model", "models/pystdlib-target", "--bogus"], "unknown option '--bogus'"),
    (["--model", "tests/fixtures/tokenizer"], "config.json"),
])
def test_bad_arguments(args, words):
    r = subprocess.run([ddtree_path(), "inspect", *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert words in r.stderr, r.stderr
