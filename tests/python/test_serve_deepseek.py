"""`ddtree serve` on DeepSeek-format model folders: the chat output's markup is picked by the marker
tokens the tokenizer has (no flag), and /v1/chat/completions gives OpenAI-shaped tool_calls and
reasoning_content, whole and streamed, for both of DeepSeek's call layouts:

  V3 / R1:  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
  V3.1:     <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Each folder is the scripted model (scripted_model.py's construction: every layer zeroed, token k of the
script embeds as the k-th unit vector and the LM head maps it to token k + 1, so greedy decoding after
the prompt's last token writes the script) with a Hugging Face tokenizer.json written here: 256
byte-level tokens, four longer ones the script writes whole ("function", "get_weather", the opening
and the closing fence), and DeepSeek's markers as added tokens (the thinking and tool markers
non-special, as DeepSeek's own files have them).  The chat templates are written here in DeepSeek's
formats: the R1-like one opens thinking with "<think>\\n" (the prompt's last token is then the newline,
the script's first), the V3.1-like one ends in <think> or </think> by chat_template_kwargs.thinking.
Forced calls (tool_choice): V3.1's layout runs under the JSON grammar, named or "required"; V3's
"required" of several is a 400, and its named call's opening is checked through /tokenize.  Needs
DDT_BUILD_DIR."""

import json
import os
import shutil

import numpy as np
import pytest
from tokenizers import Tokenizer

import scripted_model as sm
from test_serve import ROOT, Server

FW, LB = "\uff5c", "\u2581"
CALLS_BEGIN = f"<{FW}tool{LB}calls{LB}begin{FW}>"
CALLS_END = f"<{FW}tool{LB}calls{LB}end{FW}>"
CALL_BEGIN = f"<{FW}tool{LB}call{LB}begin{FW}>"
CALL_END = f"<{FW}tool{LB}call{LB}end{FW}>"
SEP = f"<{FW}tool{LB}sep{FW}>"
BOS, EOS = f"<{FW}begin{LB}of{LB}sentence{FW}>", f"<{FW}end{LB}of{LB}sentence{FW}>"
USER, ASSISTANT = f"<{FW}User{FW}>", f"<{FW}Assistant{FW}>"

WORDS = {256: "function", 257: "get_weather", 258: "\n```json\n", 259: "\n```"}
# (id, text, special): BOS / EOS / the role markers special, the thinking and tool markers not
ADDED = [(260, BOS, True), (261, EOS, True), (262, USER, True), (263, ASSISTANT, True), (264, "<think>", False),
         (265, "</think>", False), (266, CALLS_BEGIN, False), (267, CALLS_END, False), (268, CALL_BEGIN, False),
         (269, CALL_END, False), (270, SEP, False)]
ID = {t: i for i, t, _ in ADDED}
FUNCTION, GET_WEATHER, FENCE_OPEN, FENCE_CLOSE = 256, 257, 258, 259

# V3 / R1: the prompt ends "<think>\n"; reasoning "r", content "A", one call with fenced arguments
SCRIPT_V3 = [ord("\n"), ord("r"), ID["</think>"], ord("A"), ID[CALLS_BEGIN], ID[CALL_BEGIN], FUNCTION, ID[SEP],
             GET_WEATHER, FENCE_OPEN, ord("{"), ord("}"), FENCE_CLOSE, ID[CALL_END], ID[CALLS_END], ID[EOS]]
# V3.1: the prompt ends <think> (thinking) or </think>; the call's name before the separator
SCRIPT_V31 = [ID["<think>"], ord("r"), ID["</think>"], ord("A"), ID[CALLS_BEGIN], ID[CALL_BEGIN], GET_WEATHER,
              ID[SEP], ord("{"), ord("}"), ID[CALL_END], ID[CALLS_END], ID[EOS]]

# The assistant turn and tool results, shared by both templates; CALL renders one call.
TEMPLATE = """{%- for m in messages -%}
{%- if m.role == 'system' -%}{{ m.content }}
{%- elif m.role == 'user' -%}""" + USER + """{{ m.content }}
{%- elif m.role == 'tool' -%}""" + USER + """[result {{ m.tool_call_id }}] {{ m.content }}
{%- elif m.role == 'assistant' -%}""" + ASSISTANT + """{{ m.content or '' }}
{%- if m.tool_calls -%}""" + CALLS_BEGIN + """{%- for c in m.tool_calls -%}""" + CALL_BEGIN + """CALL""" \
    + CALL_END + """{%- endfor -%}""" + CALLS_END + """{%- endif -%}""" + EOS + """
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}""" + ASSISTANT + """OPEN{%- endif -%}"""
TEMPLATE_V3 = (TEMPLATE.replace("CALL" + CALL_END, "function" + SEP + "{{ c.function.name }}\n```json\n"
                                "{{ c.function.arguments }}\n```" + CALL_END)
               .replace("OPEN", "{%- if thinking is not defined or thinking -%}<think>\n{% endif -%}"))
TEMPLATE_V31 = (TEMPLATE.replace("CALL" + CALL_END, "{{ c.function.name }}" + SEP + "{{ c.function.arguments }}"
                                 + CALL_END)
                .replace("OPEN", "{%- if thinking is defined and thinking -%}<think>{%- else -%}</think>"
                                 "{%- endif -%}"))

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}},
         {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]
WEATHER = {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}


def byte_chars():
    """GPT-2's byte-level alphabet: byte b -> the character that stands for it."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def tokenizer_json():
    bc = byte_chars()
    vocab = {bc[b]: b for b in range(256)}
    for i, w in WORDS.items():
        vocab["".join(bc[b] for b in w.encode())] = i
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": sp} for i, t, sp in ADDED],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": []}}


def deepseek_folder(d, script, template):
    """The scripted model (scripted_model.py's construction) for script, with this tokenizer and template."""
    fixture = os.path.join(ROOT, "tests", "fixtures", "target", "fp32")
    cfg = json.load(open(os.path.join(fixture, "config.json")))
    cfg["bos_token_id"], cfg["eos_token_id"] = ID[BOS], ID[EOS]
    (d / "config.json").write_text(json.dumps(cfg))
    tensors, meta = sm.read_safetensors(os.path.join(fixture, "model.safetensors"))
    out = {name: (np.ones if name.endswith("norm.weight") else np.zeros)(shape, np.float32)
           for name, (dtype, shape, _) in tensors.items()}
    emb, head = out["model.embed_tokens.weight"], out["lm_head.weight"]
    assert len(set(script)) == len(script) and len(script) < cfg["hidden_size"] and max(script) < cfg["vocab_size"]
    for k, tok in enumerate(script[:-1]):
        emb[tok, k] = 1.0
        head[script[k + 1], k] = 10.0
    sm.write_safetensors(str(d / "model.safetensors"),
                         {n: ("F32", list(a.shape), a.tobytes()) for n, a in out.items()}, meta)
    (d / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    (d / "chat_template.jinja").write_text(template)


DRAFT = os.path.join(ROOT, "tests", "fixtures", "drafter", "fp32")


def start(tmp_path_factory, name, script, template):
    d = tmp_path_factory.mktemp(name)
    deepseek_folder(d, script, template)
    return d, Server(engine=["--model", str(d), "--draft", DRAFT, "--threads", "2"])


@pytest.fixture(scope="module")
def v3(tmp_path_factory):
    d, s = start(tmp_path_factory, "ds-v3", SCRIPT_V3, TEMPLATE_V3)
    yield d, s
    assert s.stop() == 0, s.stderr()
    s.kill()


@pytest.fixture(scope="module")
def v31(tmp_path_factory):
    d, s = start(tmp_path_factory, "ds-v31", SCRIPT_V31, TEMPLATE_V31)
    yield d, s
    assert s.stop() == 0, s.stderr()
    s.kill()


def streamed(s, body):
    """(reasoning, content, tool-call deltas, last finish_reason) of a streamed chat completion."""
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
    c.request("POST", "/v1/chat/completions", body=json.dumps({**body, "stream": True}).encode(),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    raw = r.read().decode()
    c.close()
    assert r.status == 200, raw
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    return ("".join(x.get("reasoning_content") or "" for x in deltas), "".join(x.get("content") or "" for x in deltas),
            [tc for x in deltas for tc in x.get("tool_calls", [])], events[-1]["choices"][0]["finish_reason"])


def test_tokenizer_has_the_markers_as_written():
    """The test's tokenizer.json is what PyPI's tokenizers reads: the markers encode to their ids."""
    t = Tokenizer.from_str(json.dumps(tokenizer_json()))
    assert t.encode(CALLS_BEGIN + "x" + SEP, add_special_tokens=False).ids == [ID[CALLS_BEGIN], ord("x"), ID[SEP]]
    assert t.decode([FENCE_OPEN, FUNCTION], skip_special_tokens=False) == "\n```json\nfunction"


def test_v3_r1_reasoning_and_call(v3):
    """R1-like: the prompt opens thinking ("<think>\\n"), so the answer starts as reasoning; the V3 call's
    name comes after the separator and its arguments inside the fence; ids are made up ("call_K")."""
    _, s = v3
    body = {"messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS, "max_tokens": 40}
    st, got = s.request("POST", "/v1/chat/completions", {**body, "return_token_ids": True})
    assert st == 200, got
    ch = got["choices"][0]
    assert ch["token_ids"] == SCRIPT_V3[1:], ch
    assert ch["finish_reason"] == "tool_calls"
    assert ch["message"]["reasoning_content"] == "r" and ch["message"]["content"] == "A"
    assert ch["message"]["tool_calls"] == [WEATHER]
    for spec in ({"mode": "chain"}, {"mode": "tree", "budget": 8}):
        st, other = s.request("POST", "/v1/chat/completions", {**body, "speculative": spec})
        assert st == 200 and other["choices"][0]["message"] == ch["message"], (spec, other)
    assert streamed(s, body) == ("r", "A", [{"index": 0, **WEATHER}], "tool_calls")
    # the official client reads both fields
    r = s.client().chat.completions.create(model="m", **body)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert m.tool_calls[0].id == "call_0" and m.tool_calls[0].function.name == "get_weather"
    assert json.loads(m.tool_calls[0].function.arguments) == {}
    assert (m.model_extra or {}).get("reasoning_content") == "r"
    # a conversation that already made a call: the next id goes on from it
    turns = [{"role": "user", "content": "weather?"},
             {"role": "assistant", "content": None, "tool_calls": [WEATHER]},
             {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
             {"role": "user", "content": "again"}]
    st, got = s.request("POST", "/v1/chat/completions", {"messages": turns, "tools": TOOLS, "max_tokens": 40})
    assert st == 200, got
    assert got["choices"][0]["message"]["tool_calls"] == [{**WEATHER, "id": "call_1"}]


def test_v3_forced_calls(v3):
    """V3's layout: a forced call opens as "function<sep>NAME\\n```json\\n" in the prompt (seen through
    /tokenize); "required" of several functions cannot be served (the name follows the separator as
    text), nor any forced call while the prompt opens thinking."""
    d, s = v3
    base = {"messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS}
    st, got = s.request("POST", "/v1/chat/completions", {**base, "tool_choice": "required", "max_tokens": 5})
    assert st == 400 and got["error"]["param"] == "tool_choice" and "thinking" in got["error"]["message"], got
    off = {**base, "chat_template_kwargs": {"thinking": False}}
    st, got = s.request("POST", "/v1/chat/completions", {**off, "tool_choice": "required", "max_tokens": 5})
    assert st == 400 and got["error"]["param"] == "tool_choice", got
    assert "required" in got["error"]["message"] and "name the function" in got["error"]["message"], got
    named = {**off, "tool_choice": {"type": "function", "function": {"name": "lookup"}}}
    st, plain = s.request("POST", "/tokenize", off)
    assert st == 200, plain
    st, forced = s.request("POST", "/tokenize", named)
    assert st == 200, forced
    t = Tokenizer.from_str((d / "tokenizer.json").read_text())
    head = ([ID[CALLS_BEGIN], ID[CALL_BEGIN]] + t.encode("function", add_special_tokens=False).ids + [ID[SEP]]
            + t.encode("lookup\n```json\n", add_special_tokens=False).ids)
    assert forced["tokens"] == plain["tokens"] + head


def test_v31_auto(v31):
    """V3.1-like: thinking off (the prompt ends </think>) gives content and the call; thinking on
    (<think>) reasoning first; whole and streamed."""
    _, s = v31
    body = {"messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS, "max_tokens": 40}
    st, got = s.request("POST", "/v1/chat/completions", {**body, "return_token_ids": True})
    assert st == 200, got
    ch = got["choices"][0]
    assert ch["token_ids"] == SCRIPT_V31[3:], ch
    assert ch["message"]["content"] == "A" and not ch["message"].get("reasoning_content")
    assert ch["message"]["tool_calls"] == [WEATHER] and ch["finish_reason"] == "tool_calls"
    think = {**body, "chat_template_kwargs": {"thinking": True}}
    st, got = s.request("POST", "/v1/chat/completions", think)
    assert st == 200, got
    m = got["choices"][0]["message"]
    assert (m["reasoning_content"], m["content"], m["tool_calls"]) == ("r", "A", [WEATHER])
    assert streamed(s, think) == ("r", "A", [{"index": 0, **WEATHER}], "tool_calls")
    assert streamed(s, body) == ("", "A", [{"index": 0, **WEATHER}], "tool_calls")
    r = s.client().chat.completions.create(model="m", extra_body={"chat_template_kwargs": {"thinking": True}}, **body)
    assert (r.choices[0].message.model_extra or {}).get("reasoning_content") == "r"
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_v31_forced_calls(v31):
    """V3.1's layout under the grammar: a named call starts "<calls><call>NAME<sep>" in the prompt and the
    model writes the arguments; "required" of several lets the model name it (it writes get_weather),
    then the arguments follow that function's parameters.  Either ends at <｜tool▁call▁end｜>."""
    d, s = v31
    base = {"messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS, "max_tokens": 20}
    named = {**base, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    st, plain = s.request("POST", "/tokenize", base)
    st2, forced = s.request("POST", "/tokenize", named)
    assert st == 200 and st2 == 200, (plain, forced)
    t = Tokenizer.from_str((d / "tokenizer.json").read_text())
    assert forced["tokens"] == (plain["tokens"] + [ID[CALLS_BEGIN], ID[CALL_BEGIN]]
                                + t.encode("get_weather", add_special_tokens=False).ids + [ID[SEP]])
    for body in (named, {**base, "tool_choice": "required"}):
        st, got = s.request("POST", "/v1/chat/completions", {**body, "return_token_ids": True})
        assert st == 200, got
        ch = got["choices"][0]
        assert ch["message"]["tool_calls"] == [WEATHER], (body["tool_choice"], ch)
        assert ch["finish_reason"] == "tool_calls" and ch["token_ids"][-1] == ID[CALL_END], ch
        assert streamed(s, body) == ("", "", [{"index": 0, **WEATHER}], "tool_calls")
    # thinking on: the prompt opens a thinking block, a forced call is refused
    st, got = s.request("POST", "/v1/chat/completions", {**named, "chat_template_kwargs": {"thinking": True}})
    assert st == 400 and "thinking" in got["error"]["message"], got


def test_layout_unknown_refuses_forced_calls(tmp_path):
    """A DeepSeek-marker tokenizer whose template writes no tool calls: auto still parses the model's
    calls, but a forced call is a 400 that says the layout cannot be told."""
    d = tmp_path / "ds-plain"
    d.mkdir()
    deepseek_folder(d, SCRIPT_V31, "{% for m in messages %}" + USER + "{{ m.content }}{% endfor %}"
                    + ASSISTANT + "</think>")
    s = Server(engine=["--model", str(d), "--threads", "2"])
    try:
        body = {"messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS, "max_tokens": 20}
        st, got = s.request("POST", "/v1/chat/completions", body)
        assert st == 200 and got["choices"][0]["message"]["tool_calls"] == [WEATHER], got
        st, got = s.request("POST", "/v1/chat/completions", {**body, "tool_choice": "required"})
        assert st == 400 and "layout" in got["error"]["message"], got
    finally:
        assert s.stop() == 0, s.stderr()
        s.kill()
