"""scripted_model.py — a model folder built at test time whose greedy output is a fixed script.

Every layer of the fp32 fixture target (tests/fixtures/target/fp32) is zeroed but its norms (o_proj
and the down projections zero, so each layer adds nothing): the last hidden state is the current
token's embedding.  Token k of SCRIPT embeds as the k-th unit vector and the LM head maps it to token
k + 1, so greedy decoding after the prompt's last token (<|im_assistant|>, which the folder's chat
template ends with) writes SCRIPT out, whatever came before.  Its tokenizer (the fixture's
tiktoken.model) names the thinking and Kimi tool-call markers, so the answer is reasoning ("r"),
text ("A") and one tool call (id "g:0", arguments "{}").  For the serve and generate tests of the
chat output.
"""

import json
import os
import shutil
import sys

import numpy as np

import tok_util as tu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))
from make_fused_fixtures import read_safetensors, write_safetensors  # noqa: E402

SCRIPTED_SPECIALS = {266: "[BOS]", 267: "[EOS]", 268: "<|im_end|>", 270: "<|im_assistant|>",
                     277: "<|tool_calls_section_begin|>", 278: "<|tool_calls_section_end|>",
                     279: "<|tool_call_begin|>", 280: "<|tool_call_argument_begin|>", 281: "<|tool_call_end|>",
                     288: "<think>", 289: "</think>"}
# <|im_assistant|> -> <think> r </think> A <section> <call> g : 0 <args> { } <call end> <section end> <|im_end|>
SCRIPT = [270, 288, ord("r"), 289, ord("A"), 277, 279, ord("g"), ord(":"), ord("0"), 280, ord("{"), ord("}"),
          281, 278, 268]


def scripted_model(d):
    """Writes the model folder into d (a pathlib.Path)."""
    fixture = os.path.join(ROOT, "tests", "fixtures", "target", "fp32")
    cfg = json.load(open(os.path.join(fixture, "config.json")))
    cfg["eos_token_id"] = 268
    (d / "config.json").write_text(json.dumps(cfg))
    tensors, meta = read_safetensors(os.path.join(fixture, "model.safetensors"))
    hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
    out = {}
    for name, (dtype, shape, _) in tensors.items():
        a = np.ones(shape, np.float32) if name.endswith("norm.weight") else np.zeros(shape, np.float32)
        out[name] = a
    emb, head = out["model.embed_tokens.weight"], out["lm_head.weight"]
    assert len(SCRIPT) < hidden and max(SCRIPT) < vocab
    for k, tok in enumerate(SCRIPT[:-1]):
        emb[tok, k] = 1.0           # token k of the script: the k-th unit vector
        head[SCRIPT[k + 1], k] = 10.0  # whose logits favour the next token of the script
    write_safetensors(str(d / "model.safetensors"),
                      {n: ("F32", list(a.shape), a.tobytes()) for n, a in out.items()}, meta)
    shutil.copy(os.path.join(ROOT, "tests", "fixtures", "tokenizer", "tiktoken.model"), d / "tiktoken.model")
    tu.write_tokenizer_config(str(d / "tokenizer_config.json"), SCRIPTED_SPECIALS)
    (d / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}<|im_assistant|>")
