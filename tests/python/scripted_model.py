"""scripted_model.py — a model folder built at test time whose greedy output is a fixed script.

Every layer of the fp32 fixture target (tests/fixtures/target/fp32) is zeroed but its norms (o_proj
and the down projections zero, so each layer adds nothing): the last hidden state is the current
token's embedding.  Token k of SCRIPT embeds as the k-th unit vector and the LM head maps it to token
k + 1, so greedy decoding after the prompt's last token (<|im_assistant|>, which the folder's chat
template ends with) writes SCRIPT out, whatever came before.  Its tokenizer (the fixture's
tiktoken.model) names the thinking and Kimi tool-call markers, so the answer is reasoning ("r"),
text ("A") and one tool call (id "g:0", arguments "{}").  For the serve and generate tests of the
chat output.  TWO_CALLS is a graph of the same kind whose answer under a frequency penalty makes
two calls (tool_choice "auto" in test_serve_tool_args.py).
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


# The same beginning, then two calls where penalties steer it: after a call's end the model would
# rather open another (logit 10) than close the section (7), after <call> write g (10) than h (9),
# after ":" 0 (10) than 1 (9).  Under frequency_penalty 2 every id already written loses 2 a time,
# so one generation of the whole answer writes
#   ... <section> <call> g:0 <args> { } <call end> <call> h:1 <args> { } <call end> <section end> <|im_end|>
# (a second <call> is 10 - 2 = 8 > 7, a third 6 < 7), and one that forgets the first call's ids
# loops on g:0.  Logits in these units (the weights are scaled by the final norm's sqrt(hidden)).
TWO_CALLS = {270: [(288, 10)], 288: [(ord("r"), 10)], ord("r"): [(289, 10)], 289: [(ord("A"), 10)],
             ord("A"): [(277, 10)], 277: [(279, 10)], 279: [(ord("g"), 10), (ord("h"), 9)],
             ord("g"): [(ord(":"), 10)], ord("h"): [(ord(":"), 10)], ord(":"): [(ord("0"), 10), (ord("1"), 9)],
             ord("0"): [(280, 10)], ord("1"): [(280, 10)], 280: [(ord("{"), 10)], ord("{"): [(ord("}"), 10)],
             ord("}"): [(281, 10)], 281: [(279, 10), (278, 7)], 278: [(268, 10)]}
TWO_CALLS_SCRIPT = [270, 288, ord("r"), 289, ord("A"), 277, 279, ord("g"), ord(":"), ord("0"), 280, ord("{"),
                    ord("}"), 281, 279, ord("h"), ord(":"), ord("1"), 280, ord("{"), ord("}"), 281, 278, 268]


def scripted_model(d, graph=None):
    """Writes the model folder into d (a pathlib.Path): SCRIPT's, or with graph ({token: [(next,
    logit), ...]}) a model whose logits after each token are those (0 for every other id)."""
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
    if graph is None:
        assert len(SCRIPT) < hidden and max(SCRIPT) < vocab
        for k, tok in enumerate(SCRIPT[:-1]):
            emb[tok, k] = 1.0           # token k of the script: the k-th unit vector
            head[SCRIPT[k + 1], k] = 10.0  # whose logits favour the next token of the script
    else:
        # the final norm scales a unit vector to sqrt(hidden): logit = weight * sqrt(hidden)
        assert len(graph) < hidden
        for k, (tok, nexts) in enumerate(graph.items()):
            emb[tok, k] = 1.0
            for nxt, logit in nexts:
                head[nxt, k] = logit / np.sqrt(hidden)
    write_safetensors(str(d / "model.safetensors"),
                      {n: ("F32", list(a.shape), a.tobytes()) for n, a in out.items()}, meta)
    shutil.copy(os.path.join(ROOT, "tests", "fixtures", "tokenizer", "tiktoken.model"), d / "tiktoken.model")
    tu.write_tokenizer_config(str(d / "tokenizer_config.json"), SCRIPTED_SPECIALS)
    (d / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}<|im_assistant|>")
