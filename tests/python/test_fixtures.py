"""Self-consistency checks of the committed DeepSeek-V3 target fixtures (tests/fixtures/target/).

Why: the C engine's reference tests trust these files; they are produced by a torch script that CI cannot
run, so CI checks with numpy alone that the checkpoints are what their config.json says (tensor names,
shapes, dtypes, shard index, FP8/INT4 layouts), that quantised tensors decode to the recorded checksums,
and that reference.json agrees with the weights it came from (final norm and lm_head recomputed here).
"""

import json
import math
import os
import struct

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "fixtures")
TARGET = os.path.join(FIXTURES, "target")

VARIANTS = ["fp32", "bf16", "fp8", "int4", "ngroup", "qlora_null", "yarn", "dense3", "sharded", "kimi"]
GEN_TOKENS = 24
TIE_MARGIN = 1e-4
MAX_TOTAL_BYTES = 4_600_000

DTYPE_SIZE = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "I32": 4, "I64": 8}


# ------------------------------------------------------------------------------------------------
# safetensors reading (numpy only)
# ------------------------------------------------------------------------------------------------

def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)}; checks the header and that tensors tile the data area."""
    with open(path, "rb") as f:
        blob = f.read()
    assert len(blob) >= 8, f"{path}: shorter than the header length field"
    (hlen,) = struct.unpack("<Q", blob[:8])
    assert 8 + hlen <= len(blob), f"{path}: header length {hlen} runs past the file"
    header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    data = blob[8 + hlen:]
    out = {}
    spans = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (begin, end) = meta["dtype"], meta["shape"], meta["data_offsets"]
        assert dtype in DTYPE_SIZE, f"{path}: tensor {name}: unexpected dtype {dtype}"
        nbytes = DTYPE_SIZE[dtype] * int(np.prod(shape, dtype=np.int64))
        assert end - begin == nbytes, f"{path}: tensor {name}: {end - begin} bytes for shape {shape} {dtype}"
        assert 0 <= begin <= end <= len(data), f"{path}: tensor {name}: offsets outside the data area"
        spans.append((begin, end, name))
        out[name] = (dtype, list(shape), data[begin:end])
    spans.sort()
    pos = 0
    for begin, end, name in spans:
        assert begin == pos, f"{path}: tensor {name} starts at {begin}, expected {pos} (gap or overlap)"
        pos = end
    assert pos == len(data), f"{path}: {len(data) - pos} trailing bytes after the last tensor"
    return out


def bf16_to_f32(raw):
    u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
    return u.view(np.float32)


def e4m3_table():
    """float32 value of every E4M3 (fn) byte; NaN for 0x7F/0xFF."""
    vals = np.empty(256, dtype=np.float64)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 0x7
        if e == 0xF and m == 0x7:
            vals[b] = np.nan
        elif e == 0:
            vals[b] = sign * (m / 8.0) * 2.0 ** -6
        else:
            vals[b] = sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return vals.astype(np.float32)


E4M3 = e4m3_table()


def as_array(t):
    dtype, shape, raw = t
    if dtype == "F32":
        a = np.frombuffer(raw, dtype="<f4")
    elif dtype == "BF16":
        a = bf16_to_f32(raw)
    elif dtype == "F8_E4M3":
        a = E4M3[np.frombuffer(raw, dtype=np.uint8)]
    elif dtype == "I32":
        a = np.frombuffer(raw, dtype="<i4")
    elif dtype == "I64":
        a = np.frombuffer(raw, dtype="<i8")
    else:
        raise AssertionError(f"no decoder for {dtype}")
    return a.reshape(shape)


# ------------------------------------------------------------------------------------------------
# Fixture loading
# ------------------------------------------------------------------------------------------------

class Fixture:
    def __init__(self, name):
        self.name = name
        self.dir = os.path.join(TARGET, name)
        with open(os.path.join(self.dir, "config.json")) as f:
            self.file_config = json.load(f)
        with open(os.path.join(self.dir, "reference.json")) as f:
            self.ref = json.load(f)
        if self.file_config.get("model_type") == "kimi_k25":
            self.cfg = self.file_config["text_config"]
            self.prefix = "language_model."
        else:
            self.cfg = self.file_config
            self.prefix = ""
        self.tensors, self.files = self._load_tensors()

    def _load_tensors(self):
        index = os.path.join(self.dir, "model.safetensors.index.json")
        if not os.path.exists(index):
            return read_safetensors(os.path.join(self.dir, "model.safetensors")), ["model.safetensors"]
        with open(index) as f:
            idx = json.load(f)
        files = sorted(set(idx["weight_map"].values()))
        tensors = {}
        total = 0
        for fn in files:
            part = read_safetensors(os.path.join(self.dir, fn))
            for name, t in part.items():
                assert name not in tensors, f"{self.name}: {name} appears in two shards"
                assert idx["weight_map"].get(name) == fn, f"{self.name}: index maps {name} to another shard"
                tensors[name] = t
                total += len(t[2])
        assert set(tensors) == set(idx["weight_map"]), f"{self.name}: index names differ from the shards"
        assert idx["metadata"]["total_size"] == total, f"{self.name}: index total_size is not the data size"
        return tensors, files

    def storage(self):
        q = self.cfg.get("quantization_config")
        if q is None:
            return "fp32" if self.cfg["torch_dtype"] == "float32" else "bf16"
        if q["quant_method"] == "fp8":
            return "fp8"
        assert q["quant_method"] == "compressed-tensors", f"{self.name}: unknown quant_method"
        return "int4"

    def get(self, name):
        return as_array(self.tensors[self.prefix + name])


_CACHE = {}


def fixture(name):
    if name not in _CACHE:
        _CACHE[name] = Fixture(name)
    return _CACHE[name]


# ------------------------------------------------------------------------------------------------
# Expected layout, written independently of the generator
# ------------------------------------------------------------------------------------------------

def expected_linears(cfg):
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    out = {}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        if cfg["q_lora_rank"] is None:
            out[p + "self_attn.q_proj"] = [nh * qk, h]
        else:
            out[p + "self_attn.q_a_proj"] = [cfg["q_lora_rank"], h]
            out[p + "self_attn.q_b_proj"] = [nh * qk, cfg["q_lora_rank"]]
        out[p + "self_attn.kv_a_proj_with_mqa"] = [cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], h]
        out[p + "self_attn.kv_b_proj"] = [nh * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), cfg["kv_lora_rank"]]
        out[p + "self_attn.o_proj"] = [h, nh * cfg["v_head_dim"]]
        if i < cfg["first_k_dense_replace"]:
            f = cfg["intermediate_size"]
            out.update({p + "mlp.gate_proj": [f, h], p + "mlp.up_proj": [f, h], p + "mlp.down_proj": [h, f]})
        else:
            m = cfg["moe_intermediate_size"]
            for e in range(cfg["n_routed_experts"]):
                q = p + f"mlp.experts.{e}."
                out.update({q + "gate_proj": [m, h], q + "up_proj": [m, h], q + "down_proj": [h, m]})
            s = m * cfg["n_shared_experts"]
            q = p + "mlp.shared_experts."
            out.update({q + "gate_proj": [s, h], q + "up_proj": [s, h], q + "down_proj": [h, s]})
    return out


def expected_tensors(cfg, storage):
    """{name: (dtype, shape)} for the whole language model."""
    h = cfg["hidden_size"]
    plain = "F32" if storage == "fp32" else "BF16"
    out = {
        "model.embed_tokens.weight": (plain, [cfg["vocab_size"], h]),
        "model.norm.weight": (plain, [h]),
        "lm_head.weight": (plain, [cfg["vocab_size"], h]),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (plain, [h])
        out[p + "post_attention_layernorm.weight"] = (plain, [h])
        if cfg["q_lora_rank"] is not None:
            out[p + "self_attn.q_a_layernorm.weight"] = (plain, [cfg["q_lora_rank"]])
        out[p + "self_attn.kv_a_layernorm.weight"] = (plain, [cfg["kv_lora_rank"]])
        if i >= cfg["first_k_dense_replace"]:
            out[p + "mlp.gate.weight"] = (plain, [cfg["n_routed_experts"], h])
            out[p + "mlp.gate.e_score_correction_bias"] = ("F32", [cfg["n_routed_experts"]])
    for base, (o, i) in expected_linears(cfg).items():
        if storage == "fp8":
            out[base + ".weight"] = ("F8_E4M3", [o, i])
            out[base + ".weight_scale_inv"] = ("F32", [math.ceil(o / 128), math.ceil(i / 128)])
        elif storage == "int4" and ".mlp.experts." in base:
            out[base + ".weight_packed"] = ("I32", [o, i // 8])
            out[base + ".weight_scale"] = ("BF16", [o, i // 32])
            out[base + ".weight_shape"] = ("I64", [2])
        else:
            out[base + ".weight"] = (plain, [o, i])
    return out


def decode_int4(fx, base):
    packed = fx.get(base + ".weight_packed").astype(np.int64) & 0xFFFFFFFF
    scale = fx.get(base + ".weight_scale").astype(np.float64)
    o, i = fx.get(base + ".weight_shape").tolist()
    cols = np.arange(i)
    nib = (packed[:, cols // 8] >> (4 * (cols % 8))) & 0xF
    return nib, (nib - 8) * scale[:, cols // 32]


def decode_fp8(fx, base):
    # The product is rounded to fp32, as the reference (and the engine) computes it.
    q = fx.get(base + ".weight").astype(np.float32)
    s = fx.get(base + ".weight_scale_inv").astype(np.float32)
    o, i = q.shape
    return (q * s[np.arange(o)[:, None] // 128, np.arange(i)[None, :] // 128]).astype(np.float64)


def rope_expectations(cfg):
    """(inv_freq, cos/sin factor, softmax scale) from the config, DeepSeek-V3 YaRN formulas."""
    dim, base = cfg["qk_rope_head_dim"], cfg["rope_theta"]
    inv = 1.0 / base ** (np.arange(0, dim, 2) / dim)
    scale = (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5
    factor_cs = 1.0
    rs = cfg.get("rope_scaling")
    if rs:
        f, orig = rs["factor"], rs["original_max_position_embeddings"]
        cd = [dim * math.log(orig / (r * 2 * math.pi)) / (2 * math.log(base))
              for r in (rs["beta_fast"], rs["beta_slow"])]
        low, high = max(math.floor(cd[0]), 0), min(math.ceil(cd[1]), dim - 1)
        ramp = np.clip((np.arange(dim // 2) - low) / max(high - low, 1e-3), 0, 1)
        inv = inv / f * ramp + inv * (1 - ramp)
        ms = [0.1 * m * math.log(f) + 1.0 for m in (rs["mscale"], rs["mscale_all_dim"])]
        factor_cs = ms[0] / ms[1]
        scale *= ms[1] ** 2
    return inv, factor_cs, scale


# ------------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------------

def test_all_variants_present_and_small():
    assert os.path.isfile(os.path.join(FIXTURES, "make_target_fixtures.py"))
    assert os.path.isfile(os.path.join(FIXTURES, "README.md"))
    found = sorted(d for d in os.listdir(TARGET) if os.path.isdir(os.path.join(TARGET, d)))
    assert found == sorted(VARIANTS)
    total = 0
    for root, _, files in os.walk(TARGET):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    assert total <= MAX_TOTAL_BYTES, f"fixtures grew to {total} bytes"


def test_generator_script_compiles():
    path = os.path.join(FIXTURES, "make_target_fixtures.py")
    with open(path) as f:
        compile(f.read(), path, "exec")


@pytest.mark.parametrize("name", VARIANTS)
def test_tensors_match_config(name):
    fx = fixture(name)
    want = {fx.prefix + k: v for k, v in expected_tensors(fx.cfg, fx.storage()).items()}
    got = {k: (t[0], t[1]) for k, t in fx.tensors.items()}
    extra = sorted(set(got) - set(want))
    if fx.prefix:
        # Kimi checkpoints carry vision tensors next to the language model; nothing else may be extra.
        assert extra and all(k.startswith(("vision_tower.", "mm_projector.")) for k in extra), extra
    else:
        assert not extra, f"unexpected tensors {extra[:5]}"
    missing = sorted(set(want) - set(got))
    assert not missing, f"missing tensors {missing[:5]}"
    for k, v in want.items():
        assert got[k] == v, f"{name}: {k}: stored {got[k]}, config implies {v}"


@pytest.mark.parametrize("name", VARIANTS)
def test_values_finite_and_bias_nonzero(name):
    fx = fixture(name)
    for k, t in fx.tensors.items():
        if t[0] in ("F32", "BF16", "F8_E4M3"):
            assert np.isfinite(as_array(t)).all(), f"{name}: {k} has a non-finite value"
    cfg = fx.cfg
    for i in range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"]):
        b = fx.get(f"model.layers.{i}.mlp.gate.e_score_correction_bias")
        assert (np.abs(b) > 0).all() and np.ptp(b) > 0.05, f"{name}: layer {i}: router bias does not matter"


def test_variant_configs_cover_the_features():
    c = {n: fixture(n).cfg for n in VARIANTS}
    assert fixture("fp32").storage() == "fp32" and fixture("sharded").storage() == "fp32"
    assert fixture("bf16").storage() == "bf16" and fixture("kimi").storage() == "bf16"
    assert fixture("fp8").storage() == "fp8" and fixture("int4").storage() == "int4"
    assert len(fixture("sharded").files) == 3
    assert c["ngroup"]["n_group"] == 4 and c["ngroup"]["topk_group"] == 2
    assert c["qlora_null"]["q_lora_rank"] is None
    assert c["yarn"]["rope_scaling"]["type"] == "yarn"
    assert c["dense3"]["first_k_dense_replace"] == 3 and c["dense3"]["num_hidden_layers"] == 5
    assert fixture("kimi").file_config["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert c["fp8"]["hidden_size"] % 128 != 0, "fp8 must exercise partial scale blocks"
    for n in VARIANTS:
        assert c[n]["topk_method"] == "noaux_tc" and c[n]["scoring_func"] == "sigmoid"
        assert c[n]["rope_interleave"] is True and c[n]["norm_topk_prob"] is True


def test_fp8_layout_and_checksums():
    fx = fixture("fp8")
    q = fx.cfg["quantization_config"]
    assert q["weight_block_size"] == [128, 128] and q["fmt"] == "e4m3"
    sums = fx.ref["tensor_checksums"]
    bases = list(expected_linears(fx.cfg))
    saw_partial = False
    for base in bases:
        raw = np.frombuffer(fx.tensors[base + ".weight"][2], dtype=np.uint8)
        assert not np.isin(raw, [0x7F, 0xFF]).any(), f"{base}: NaN code in FP8 weight"
        s = fx.get(base + ".weight_scale_inv")
        assert (s > 0).all() and np.isfinite(s).all(), f"{base}: bad scale"
        w = decode_fp8(fx, base)
        saw_partial |= any(d % 128 for d in w.shape)
        want_sum, want_sq = sums[base + ".weight"]
        assert math.isclose(w.sum(), want_sum, rel_tol=1e-6, abs_tol=1e-6), base
        assert math.isclose((w * w).sum(), want_sq, rel_tol=1e-6), base
    assert saw_partial


def test_int4_layout_and_checksums():
    fx = fixture("int4")
    q = fx.cfg["quantization_config"]
    wq = q["config_groups"]["group_0"]["weights"]
    assert (q["quant_method"], q["format"]) == ("compressed-tensors", "pack-quantized")
    assert (wq["num_bits"], wq["group_size"], wq["symmetric"], wq["strategy"], wq["type"]) == \
        (4, 32, True, "group", "int")
    assert "lm_head" in q["ignore"]
    sums = fx.ref["tensor_checksums"]
    bases = [b for b in expected_linears(fx.cfg) if ".mlp.experts." in b]
    seen = np.zeros(16, dtype=np.int64)
    for base in bases:
        o, i = fx.get(base + ".weight_shape").tolist()
        assert [o, i] == expected_linears(fx.cfg)[base]
        nib, w = decode_int4(fx, base)
        assert nib.min() >= 0 and nib.max() <= 15
        seen += np.bincount(nib.ravel(), minlength=16)
        s = fx.get(base + ".weight_scale")
        assert (s > 0).all(), f"{base}: non-positive group scale"
        # Symmetric quantisation uses the whole range: every group reaches |q| >= 7.
        qv = (nib - 8).reshape(o, i // 32, 32)
        assert (np.abs(qv).max(axis=2) >= 7).all(), f"{base}: a group does not reach the int4 range"
        want_sum, want_sq = sums[base + ".weight"]
        assert math.isclose(w.sum(), want_sum, rel_tol=1e-6, abs_tol=1e-6), base
        assert math.isclose((w * w).sum(), want_sq, rel_tol=1e-6), base
    assert seen[0] > 0 and seen[15] > 0, "packing never uses the extreme nibbles (-8 and +7)"
    # Non-expert linears stay bf16.
    assert fx.tensors["model.layers.1.mlp.shared_experts.gate_proj.weight"][0] == "BF16"


def decoded_weights(fx):
    """Every language-model weight decoded to float64, keyed by checkpoint name without the prefix."""
    out = {}
    for name in expected_tensors(fx.cfg, fx.storage()):
        if name.endswith((".weight_scale_inv", ".weight_scale", ".weight_shape")):
            continue
        if name.endswith(".weight_packed"):
            base = name[:-len(".weight_packed")]
            out[base + ".weight"] = decode_int4(fx, base)[1]
        elif fx.tensors[fx.prefix + name][0] == "F8_E4M3":
            out[name] = decode_fp8(fx, name[:-len(".weight")])
        else:
            out[name] = fx.get(name).astype(np.float64)
    return out


@pytest.mark.parametrize("name", VARIANTS)
def test_weights_are_the_ones_the_reference_used(name):
    fx = fixture(name)
    sums = fx.ref["tensor_checksums"]
    weights = decoded_weights(fx)
    assert sorted(sums) == sorted(weights)
    for k, w in weights.items():
        want_sum, want_sq = sums[k]
        assert math.isclose(w.sum(), want_sum, rel_tol=1e-9, abs_tol=1e-9), f"{name}: {k}: sum differs"
        assert math.isclose((w * w).sum(), want_sq, rel_tol=1e-9), f"{name}: {k}: sum of squares differs"


@pytest.mark.parametrize("name", VARIANTS)
def test_reference_well_formed(name):
    fx = fixture(name)
    ref, cfg = fx.ref, fx.cfg
    assert ref["format_version"] == 1 and ref["variant"] == name
    for k in ("torch", "transformers", "seed"):
        assert k in ref["generator"]
    assert ref["model"]["compute_dtype"] == "float32"
    assert ref["model"]["tensor_prefix"] == fx.prefix
    vocab = cfg["vocab_size"]
    prompts = ref["prompts"]
    assert len(prompts) >= 3 and min(len(p["ids"]) for p in prompts) == 1
    for p in prompts:
        ids = p["ids"]
        assert all(isinstance(t, int) and 0 <= t < vocab for t in ids)
        logits = np.array(p["logits"], dtype=np.float64)
        assert logits.shape == (len(ids), vocab) and np.isfinite(logits).all()
        assert logits.std() > 0.5, "logits nearly uniform: greedy choices would be ties"
        toks, margins = p["greedy_tokens"], p["greedy_top2_margins"]
        assert len(toks) == GEN_TOKENS and len(margins) == GEN_TOKENS
        assert all(isinstance(t, int) and 0 <= t < vocab for t in toks)
        assert all(m >= 0 for m in margins)
        last = np.sort(logits[-1])[::-1]
        assert math.isclose(margins[0], last[0] - last[1], rel_tol=1e-4, abs_tol=1e-5)
        if margins[0] >= TIE_MARGIN:
            assert toks[0] == int(np.argmax(logits[-1])), "first greedy token is not the argmax of the prompt"
    # Positions must run past the original context for YaRN.
    rs = cfg.get("rope_scaling")
    if rs:
        longest = max(len(p["ids"]) for p in prompts) + GEN_TOKENS
        assert longest > rs["original_max_position_embeddings"]
    ck = ref["checks"]
    assert ck["numpy_float64_forward_max_rel_err"] < 1e-4
    assert ck["bias_changed_expert_choice_tokens"] > 0
    assert ck["min_routing_margin"] >= 1e-5
    if cfg["n_group"] > 1:
        assert ck["group_limit_changed_expert_choice_tokens"] > 0


@pytest.mark.parametrize("name", VARIANTS)
def test_reference_conventions_follow_config(name):
    fx = fixture(name)
    conv, cfg = fx.ref["conventions"], fx.cfg
    inv, factor_cs, scale = rope_expectations(cfg)
    assert np.allclose(conv["rope_inv_freq"], inv, rtol=1e-6, atol=0)
    assert math.isclose(conv["rope_attention_factor"], factor_cs, rel_tol=1e-9)
    assert math.isclose(conv["softmax_scale"], scale, rel_tol=1e-9)
    assert conv["rms_norm_eps"] == cfg["rms_norm_eps"]
    assert conv["rope_interleave"] is True


@pytest.mark.parametrize("name", VARIANTS)
def test_hidden_states_agree_with_weights(name):
    """hidden_states[L] = final norm of the last layer output, and lm_head of it gives the recorded logits."""
    fx = fixture(name)
    cfg, hs = fx.cfg, fx.ref["hidden_states"]
    n_tok = len(fx.ref["prompts"][hs["prompt_index"]]["ids"])
    layers = np.array(hs["layers"], dtype=np.float64)
    assert layers.shape == (cfg["num_hidden_layers"], n_tok, cfg["hidden_size"])
    assert np.isfinite(layers).all()
    raw = np.array(hs["last_layer_output_before_norm"], dtype=np.float64)
    assert hs["last_is_final_norm"] is True
    if cfg["num_hidden_layers"] >= 2:
        assert not np.allclose(layers[-2], layers[-1]), "layers are not distinct"
    normed = raw / np.sqrt((raw * raw).mean(-1, keepdims=True) + cfg["rms_norm_eps"]) * fx.get("model.norm.weight")
    assert np.allclose(normed, layers[-1], rtol=1e-5, atol=1e-5)
    logits = layers[-1] @ fx.get("lm_head.weight").astype(np.float64).T
    want = np.array(fx.ref["prompts"][hs["prompt_index"]]["logits"], dtype=np.float64)
    assert np.abs(logits - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


# ------------------------------------------------------------------------------------------------
# Reference precision: transformers in float32 on the stored values, not in bf16
# ------------------------------------------------------------------------------------------------

FP32_REF_TOL = 1e-5      # fp32 vs float64 on the same values: ~1e-6 observed (plus 7-digit rounding)
BF16_MISS_MIN = 1e-3     # a bf16 computation of the same model misses by far more


def logit_err(a, b):
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


def float64_logits(fx, ids, bf16_activations=False):
    import dsv3_forward
    inv, factor_cs, scale = rope_expectations(fx.cfg)
    return dsv3_forward.forward(fx.cfg, decoded_weights(fx), ids, inv, factor_cs, scale,
                                bf16_activations=bf16_activations)


@pytest.mark.parametrize("name", VARIANTS)
def test_reference_is_float32_on_the_stored_values(name):
    """Every prompt's reference logits equal an independent float64 forward on the stored values (bf16 upcast,
    FP8/INT4 dequantised) to fp32 rounding, and the model is sensitive enough that a bf16 computation would
    not: so the reference was computed in float32 on the stored bf16 values, as this engine computes."""
    fx = fixture(name)
    assert fx.ref["model"]["compute_dtype"] == "float32"
    for p in fx.ref["prompts"]:
        want = np.array(p["logits"], dtype=np.float64)
        err = logit_err(float64_logits(fx, p["ids"]), want)
        assert err <= FP32_REF_TOL, f"{name}: reference differs from a float64 forward by {err}"
    if fx.storage() != "fp32":
        # discrimination: the same forward with bf16 activations misses the reference by far more
        p = max(fx.ref["prompts"], key=lambda q: len(q["ids"]))
        miss = logit_err(float64_logits(fx, p["ids"], bf16_activations=True), np.array(p["logits"]))
        assert miss >= BF16_MISS_MIN, f"{name}: a bf16 computation is only {miss} away: the check cannot tell"


# ------------------------------------------------------------------------------------------------
# Fused-expert fixtures (tests/fixtures/fused, make_fused_fixtures.py)
# ------------------------------------------------------------------------------------------------

FUSED = os.path.join(FIXTURES, "fused")
FUSED_FROM_TARGET = ["fp32", "bf16", "kimi"]
MAX_FUSED_BYTES = 2_400_000


def test_fused_fixtures_present_and_small():
    found = sorted(d for d in os.listdir(FUSED) if os.path.isdir(os.path.join(FUSED, d)))
    assert found == sorted(FUSED_FROM_TARGET + ["fp8_experts", "fp8_fused"])
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(FUSED) for f in fs)
    assert total <= MAX_FUSED_BYTES, f"fused fixtures grew to {total} bytes"
    path = os.path.join(FIXTURES, "make_fused_fixtures.py")
    with open(path) as f:
        compile(f.read(), path, "exec")


def fused_pairs(tensors, prefix, cfg):
    """{layer: (gate_up [E, 2I, H], down [E, H, I])} decoded, checking the fused layout's names and shapes."""
    e, i, h = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["hidden_size"]
    out = {}
    for layer in range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"]):
        p = f"{prefix}model.layers.{layer}.mlp.experts."
        names = sorted(k[len(p):] for k in tensors if k.startswith(p))
        gu, dn = tensors[p + "gate_up_proj"], tensors[p + "down_proj"]
        assert gu[1] == [e, 2 * i, h] and dn[1] == [e, h, i]
        if gu[0] == "F8_E4M3":
            assert names == ["down_proj", "down_proj_scale_inv", "gate_up_proj", "gate_up_proj_scale_inv"]
            s_gu = as_array(tensors[p + "gate_up_proj_scale_inv"])
            s_dn = as_array(tensors[p + "down_proj_scale_inv"])
            assert s_gu.shape == (e, math.ceil(2 * i / 128), math.ceil(h / 128))
            assert s_dn.shape == (e, math.ceil(h / 128), math.ceil(i / 128))
            r, c = np.arange(2 * i) // 128, np.arange(h) // 128
            a = as_array(gu).astype(np.float32) * s_gu[:, r][:, :, c]
            r, c = np.arange(h) // 128, np.arange(i) // 128
            b = as_array(dn).astype(np.float32) * s_dn[:, r][:, :, c]
            out[layer] = (a.astype(np.float64), b.astype(np.float64))
        else:
            assert names == ["down_proj", "gate_up_proj"]
            out[layer] = (as_array(gu).astype(np.float64), as_array(dn).astype(np.float64))
    return out


@pytest.mark.parametrize("name", FUSED_FROM_TARGET)
def test_fused_fixture_holds_the_target_values(name):
    """fused/<v> is target/<v> with every layer's experts as gate_up_proj = [gate_e; up_e] and down_proj = down_e,
    everything else (config included) byte-identical."""
    fx = fixture(name)
    d = os.path.join(FUSED, name)
    with open(os.path.join(d, "config.json"), "rb") as f, open(os.path.join(fx.dir, "config.json"), "rb") as g:
        assert f.read() == g.read()
    fused = read_safetensors(os.path.join(d, "model.safetensors"))
    expert = ".mlp.experts."
    assert {k: v for k, v in fused.items() if expert not in k} == \
        {k: v for k, v in fx.tensors.items() if expert not in k}
    pairs = fused_pairs(fused, fx.prefix, fx.cfg)
    i = fx.cfg["moe_intermediate_size"]
    for layer, (gu, dn) in pairs.items():
        for e in range(fx.cfg["n_routed_experts"]):
            q = f"model.layers.{layer}.mlp.experts.{e}."
            assert np.array_equal(gu[e, :i], fx.get(q + "gate_proj.weight")), f"{name}: layer {layer} expert {e} gate"
            assert np.array_equal(gu[e, i:], fx.get(q + "up_proj.weight")), f"{name}: layer {layer} expert {e} up"
            assert np.array_equal(dn[e], fx.get(q + "down_proj.weight")), f"{name}: layer {layer} expert {e} down"


def test_fused_fp8_pair_holds_the_same_values():
    per = read_safetensors(os.path.join(FUSED, "fp8_experts", "model.safetensors"))
    fused = read_safetensors(os.path.join(FUSED, "fp8_fused", "model.safetensors"))
    with open(os.path.join(FUSED, "fp8_fused", "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(FUSED, "fp8_experts", "config.json")) as f:
        assert json.load(f) == cfg
    assert cfg["moe_intermediate_size"] % 128 == 0 and cfg["hidden_size"] % 128 != 0
    expert = ".mlp.experts."
    assert {k: v for k, v in fused.items() if expert not in k} == {k: v for k, v in per.items() if expert not in k}
    i = cfg["moe_intermediate_size"]

    def deq(base):
        q = as_array(per[base + ".weight"]).astype(np.float32)
        s = as_array(per[base + ".weight_scale_inv"])
        return (q * s[np.arange(q.shape[0])[:, None] // 128, np.arange(q.shape[1])[None, :] // 128]).astype(np.float64)

    for layer, (gu, dn) in fused_pairs(fused, "", cfg).items():
        for e in range(cfg["n_routed_experts"]):
            q = f"model.layers.{layer}.mlp.experts.{e}."
            assert np.array_equal(gu[e, :i], deq(q + "gate_proj"))
            assert np.array_equal(gu[e, i:], deq(q + "up_proj"))
            assert np.array_equal(dn[e], deq(q + "down_proj"))
        for k, t in per.items():
            if k.endswith(".weight") and t[0] == "F8_E4M3":
                raw = np.frombuffer(t[2], dtype=np.uint8)
                assert not np.isin(raw, [0x7F, 0xFF]).any(), f"{k}: NaN code"
