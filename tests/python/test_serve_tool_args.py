"""`ddtree serve` tool_choice "required" / named on the CPU: the forced call's arguments are decoded
under the JSON grammar, so a finished call's arguments are json.loads-able and an instance of the
function's "parameters" schema (the validator of test_serve_json_schema.py) when that schema is in
the supported subset, a JSON object otherwise (the x-ddtree-tool-arguments header says which, the
-note header why); the call's <|tool_call_end|> ends the answer (finish_reason "tool_calls").
Greedy ar, chain and tree requests give the same token ids, whole and streamed.

The shipped pair's tokenizer has no tool-call markers, so its model folder is copied here with
Kimi's five markers named at Kimi's offsets (ids 4107..4111, reserved in the shipped tokenizer):
the untrained ids are only ever forced into the prompt or by the grammar.  "required" of several
functions, where the model itself must open a call and name it, runs on the scripted model
(scripted_model.py), which writes `<call> g:0 <args> { } <call end>`.  Needs DDT_BUILD_DIR."""

import http.client
import json
import os

import pytest

import scripted_model as sm
from test_serve import DRAFT, ROOT, TARGET, Server
from test_serve_json_schema import SCHEMA, SMALL, valid

TOOL_MARKERS = {4107: "<|tool_calls_section_begin|>", 4108: "<|tool_calls_section_end|>",
                4109: "<|tool_call_begin|>", 4110: "<|tool_call_argument_begin|>", 4111: "<|tool_call_end|>"}
CALL_END = 4111
QUESTIONS = ["What is the weather in Paris?", "Look up the config.", "def main():"]
SPECS = ({"mode": "ar"}, {"mode": "chain"}, {"mode": "tree", "budget": 16})


def shipped_with_markers(d):
    """The shipped target's folder in d (links), its tokenizer_config naming the tool markers."""
    for f in os.listdir(TARGET):
        if f != "tokenizer_config.json":
            os.symlink(os.path.join(TARGET, f), d / f)
    cfg = json.load(open(os.path.join(TARGET, "tokenizer_config.json")))
    for i, t in TOOL_MARKERS.items():
        assert str(i) not in cfg["added_tokens_decoder"]
        cfg["added_tokens_decoder"][str(i)] = {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                               "single_word": False, "special": True}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("tool-markers")
    shipped_with_markers(d)
    s = Server(engine=["--model", str(d), "--draft", DRAFT, "--mode", "tree", "--budget", "16", "--threads", "2"])
    yield s
    assert s.stop() == 0, s.stderr()
    s.kill()


def post(server, body):
    """(parsed body, headers) of a 200 chat completion."""
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
    c.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    raw = r.read()
    c.close()
    assert r.status == 200, raw
    return json.loads(raw), {k.lower(): v for k, v in r.getheaders()}


def post_stream(server, body):
    """(events, headers) of a streamed chat completion."""
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
    c.request("POST", "/v1/chat/completions", body=json.dumps({**body, "stream": True}).encode(),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    raw = r.read().decode()
    c.close()
    assert r.status == 200, raw
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
    return events, {k.lower(): v for k, v in r.getheaders()}


def tools_of(*fns):
    return [{"type": "function", "function": f} for f in fns]


def named(name):
    return {"type": "function", "function": {"name": name}}


def lossless_call(server, body, specs=SPECS):
    """The choice of a greedy request, after checking that every speculative mode gives its token ids."""
    ref = None
    for spec in specs:
        got, headers = post(server, {**body, "return_token_ids": True, "speculative": spec})
        choice = got["choices"][0]
        ref = ref or (choice, headers)
        assert choice["token_ids"] == ref[0]["token_ids"], spec
        assert choice["message"] == ref[0]["message"], spec
        assert choice["finish_reason"] == ref[0]["finish_reason"]
    return ref


@pytest.mark.parametrize("schema", [SMALL, SCHEMA], ids=["small", "every-type"])
def test_named_call_arguments_are_instances(server, schema):
    tools = tools_of({"name": "other", "parameters": {"type": "object", "properties": {"z": {"type": "null"}}}},
                     {"name": "configure", "description": "set things", "parameters": schema})
    finished = 0
    for q in QUESTIONS:
        body = {"messages": [{"role": "user", "content": q}], "tools": tools, "tool_choice": named("configure"),
                "max_tokens": 120}
        choice, headers = lossless_call(server, body)
        assert headers["x-ddtree-tool-arguments"] == "schema"
        assert "x-ddtree-tool-arguments-note" not in headers
        msg = choice["message"]
        assert not msg["content"]  # the answer is the call: no text (null with a call, "" without)
        if choice["finish_reason"] == "tool_calls":
            (call,) = msg["tool_calls"]
            assert call["id"] == "functions.configure:0" and call["function"]["name"] == "configure"
            args = json.loads(call["function"]["arguments"])
            assert valid(args, schema), call
            # the call's end marker is the answer's last token, the grammar's only way out
            assert choice["token_ids"][-1] == CALL_END
            finished += 1
        else:
            # cut by max_tokens: a call without its end is never reported, and what was written is the
            # schema's start (its first property first)
            assert choice["finish_reason"] == "length" and msg.get("tool_calls") is None
            assert CALL_END not in choice["token_ids"]
            st, back = server.request("POST", "/detokenize", {"tokens": choice["token_ids"]})
            assert st == 200 and back["prompt"].startswith('{"' + next(iter(schema["properties"])) + '"'), back
    # the small schema's answers finish (3 of 3 at the time of writing); the long one's run out
    assert finished >= (2 if schema is SMALL else 0)


def test_required_of_one_function_forces_it(server):
    tools = tools_of({"name": "get_weather", "parameters": SMALL})
    # a question after which the model, held to SMALL, closes the object within max_tokens
    body = {"messages": [{"role": "user", "content": QUESTIONS[1]}], "tools": tools, "tool_choice": "required",
            "max_tokens": 120}
    choice, headers = lossless_call(server, body)
    assert headers["x-ddtree-tool-arguments"] == "schema"
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    assert call["id"] == "functions.get_weather:0"
    assert valid(json.loads(call["function"]["arguments"]), SMALL)
    # and the official client reads it
    r = server.client().chat.completions.create(model="m", messages=body["messages"], tools=tools,
                                                tool_choice="required", max_tokens=120)
    tc = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and tc[0].function.name == "get_weather"
    assert tc[0].function.arguments == call["function"]["arguments"]


def test_streamed_call_equals_whole(server):
    tools = tools_of({"name": "get_weather", "parameters": SMALL})
    body = {"messages": [{"role": "user", "content": QUESTIONS[1]}], "tools": tools,
            "tool_choice": named("get_weather"), "max_tokens": 120}
    whole, _ = post(server, body)
    for spec in SPECS:
        events, headers = post_stream(server, {**body, "speculative": spec})
        assert headers["x-ddtree-tool-arguments"] == "schema"
        deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
        calls = [tc for x in deltas for tc in x.get("tool_calls", [])]
        want = whole["choices"][0]["message"]["tool_calls"]
        assert calls == [{**want[0], "index": 0}], spec
        assert "".join(x.get("content") or "" for x in deltas) == ""
        assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert valid(json.loads(calls[0]["function"]["arguments"]), SMALL)


@pytest.mark.parametrize("params, words", [
    ({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}},
     "tools[0].function.parameters: unsupported keyword 'minimum' at $.properties.a"),
    ({"type": "object"}, "tools[0].function.parameters: object at $ has no 'properties'"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}, "'required' at $ names \"b\""),
    (None, "tools[0].function.parameters: no 'parameters'"),
], ids=["keyword", "free-form", "malformed", "none"])
def test_parameters_outside_the_subset_get_a_json_object(server, params, words):
    fn = {"name": "f"} if params is None else {"name": "f", "parameters": params}
    body = {"messages": [{"role": "user", "content": QUESTIONS[1]}], "tools": tools_of(fn), "tool_choice": named("f"),
            "max_tokens": 120}
    choice, headers = lossless_call(server, body, SPECS[::2])
    assert headers["x-ddtree-tool-arguments"] == "json_object"
    assert words in headers["x-ddtree-tool-arguments-note"], headers
    if choice["finish_reason"] == "tool_calls":
        (call,) = choice["message"]["tool_calls"]
        assert isinstance(json.loads(call["function"]["arguments"]), dict), call
    else:
        assert choice["finish_reason"] == "length" and CALL_END not in choice["token_ids"]
        st, back = server.request("POST", "/detokenize", {"tokens": choice["token_ids"]})
        assert st == 200 and back["prompt"].startswith("{"), back


def test_forced_call_and_json_mode_refused(server):
    st, got = server.request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x"}], "tools": tools_of({"name": "f", "parameters": SMALL}),
        "tool_choice": "required", "response_format": {"type": "json_object"}})
    assert st == 400 and got["error"]["param"] == "response_format", got


# ---------------------------------------------------------------------------- several functions: the model names one

@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    d = tmp_path_factory.mktemp("scripted")
    sm.scripted_model(d)
    s = Server(engine=["--model", str(d), "--draft", os.path.join(ROOT, "tests", "fixtures", "drafter", "fp32"),
                       "--threads", "2"])
    yield s
    assert s.stop() == 0, s.stderr()
    s.kill()


EMPTY = {"type": "object", "properties": {}}           # "{}" is its one instance
NEEDS_Q = {"type": "object", "properties": {"q": {"type": "boolean"}}, "required": ["q"]}  # "{}" is not one
SCRIPT_CALL = sm.SCRIPT[6:14]  # <call> g : 0 <args> { } <call end>


def test_required_of_several_constrains_the_named_function(scripted):
    """The scripted model opens a call to g and writes {}: under g's schema (EMPTY) the call goes
    through whatever the other function's schema says; under a g that needs a property, "}" is
    refused and the arguments never close; under a g outside the subset, any object does."""
    msgs = [{"role": "user", "content": "x"}]
    for other in (NEEDS_Q, EMPTY, None):
        lookup = {"name": "lookup"} if other is None else {"name": "lookup", "parameters": other}
        body = {"messages": msgs, "tools": tools_of(lookup, {"name": "g", "parameters": EMPTY}),
                "tool_choice": "required", "max_tokens": 30}
        choice, headers = lossless_call(scripted, body, ({"mode": "ar"}, {"mode": "chain"},
                                                          {"mode": "tree", "budget": 8}))
        assert headers["x-ddtree-tool-arguments"] == ("schema" if other else "mixed")
        assert choice["token_ids"] == SCRIPT_CALL, choice
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["tool_calls"] == [{"id": "g:0", "type": "function",
                                                     "function": {"name": "g", "arguments": "{}"}}]
        # with logprobs: one entry per token over both generations (the name's, then the arguments')
        got, _ = post(scripted, {**body, "logprobs": True, "top_logprobs": 1})
        assert len(got["choices"][0]["logprobs"]["content"]) == len(SCRIPT_CALL)
    # g's own schema is the one applied: one that "{}" is no instance of holds the model in the object
    body = {"messages": msgs, "tools": tools_of({"name": "lookup", "parameters": EMPTY}, {"name": "g",
                                                                                        "parameters": NEEDS_Q}),
            "tool_choice": "required", "max_tokens": 30}
    choice, headers = lossless_call(scripted, body, ({"mode": "ar"}, {"mode": "tree", "budget": 8}))
    ids = choice["token_ids"]
    assert ids[:6] == SCRIPT_CALL[:6] and ids[6] != ord("}"), ids
    assert choice["finish_reason"] == "length" and choice["message"].get("tool_calls") is None
    # g outside the subset: a JSON object, so the model's {} goes through
    body["tools"][1]["function"]["parameters"] = {"type": "object", "properties": {"q": {"type": "boolean"}},
                                                  "minProperties": 1}
    choice, headers = lossless_call(scripted, body, ({"mode": "ar"}, {"mode": "tree", "budget": 8}))
    assert headers["x-ddtree-tool-arguments"] == "mixed"
    assert "tools[1].function.parameters: unsupported keyword 'minProperties'" in \
        headers["x-ddtree-tool-arguments-note"]
    assert choice["token_ids"] == SCRIPT_CALL and choice["finish_reason"] == "tool_calls"
    # streamed: the same call, once, and the finish reason
    events, _ = post_stream(scripted, body)
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert [tc for x in deltas for tc in x.get("tool_calls", [])] == [
        {"index": 0, "id": "g:0", "type": "function", "function": {"name": "g", "arguments": "{}"}}]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_required_of_several_cut_before_the_arguments(scripted):
    """max_tokens running out while the model names the call, or right at its arguments' opening:
    no second generation, no call reported, "length"."""
    body = {"messages": [{"role": "user", "content": "x"}],
            "tools": tools_of({"name": "lookup", "parameters": EMPTY}, {"name": "g", "parameters": EMPTY}),
            "tool_choice": "required"}
    for n in (3, 5):
        got, _ = post(scripted, {**body, "max_tokens": n, "return_token_ids": True})
        choice = got["choices"][0]
        assert choice["finish_reason"] == "length" and choice["message"].get("tool_calls") is None
        assert choice["token_ids"] == SCRIPT_CALL[:n]


# ---------------------------------------------------------------------------- tool_choice "auto": the model decides

@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The shipped pair as shipped: its tokenizer has no tool-call markers."""
    s = Server(engine=["--model", TARGET, "--draft", DRAFT, "--mode", "tree", "--budget", "16", "--threads", "2"])
    yield s
    assert s.stop() == 0, s.stderr()
    s.kill()


def test_auto_text_answer_is_unchanged(server, plain):
    """With tools and tool_choice auto (the default) the shipped model answers in text (its marker ids
    are untrained): one unconstrained generation, the ids, text and finish reason of a server whose
    tokenizer has no markers, where auto cannot be constrained and the headers say so.  Greedy ar,
    chain and tree alike; streamed as whole."""
    tools = tools_of({"name": "get_weather", "parameters": SMALL}, {"name": "f"})
    for q in QUESTIONS:
        body = {"messages": [{"role": "user", "content": q}], "tools": tools, "max_tokens": 40}
        choice, headers = lossless_call(server, body)
        assert headers["x-ddtree-tool-arguments"] == "mixed"
        assert "tools[1].function.parameters: no 'parameters'" in headers["x-ddtree-tool-arguments-note"]
        today, plain_headers = lossless_call(plain, body, SPECS[:1])
        assert plain_headers["x-ddtree-tool-arguments"] == "unconstrained"
        assert "no Kimi tool-call markers" in plain_headers["x-ddtree-tool-arguments-note"]
        assert choice["token_ids"] == today["token_ids"] and len(choice["token_ids"]) > 0
        assert choice["message"] == today["message"] and choice["finish_reason"] == today["finish_reason"]
        assert choice["message"].get("tool_calls") is None and choice["message"]["content"]
        assert not set(choice["token_ids"]) & set(TOOL_MARKERS)
    events, _ = post_stream(server, body)
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]) == \
        choice["message"]["content"]
    assert events[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]
    # "none" leaves the tools out: no header; response_format's answer is one JSON document: no call
    _, headers = post(server, {**body, "tool_choice": "none"})
    assert "x-ddtree-tool-arguments" not in headers
    _, headers = post(server, {**body, "response_format": {"type": "json_object"}})
    assert "x-ddtree-tool-arguments" not in headers


@pytest.fixture(scope="module")
def two_calls(tmp_path_factory):
    d = tmp_path_factory.mktemp("two-calls")
    sm.scripted_model(d, sm.TWO_CALLS)
    s = Server(engine=["--model", str(d), "--draft", os.path.join(ROOT, "tests", "fixtures", "drafter", "fp32"),
                       "--threads", "2"])
    yield s
    assert s.stop() == 0, s.stderr()
    s.kill()


TWO = sm.TWO_CALLS_SCRIPT[1:]  # the answer: <think> r </think> A, calls g:0 and h:1, <|im_end|>
FIRST_ARGS, SECOND_ARGS = TWO.index(280) + 1, len(TWO) - 1 - TWO[::-1].index(280) + 1  # where each "{" is
SPECS8 = ({"mode": "ar"}, {"mode": "chain"}, {"mode": "tree", "budget": 8})
GH = [{"id": "g:0", "type": "function", "function": {"name": "g", "arguments": "{}"}},
      {"id": "h:1", "type": "function", "function": {"name": "h", "arguments": "{}"}}]


def two_body(g, h, **kw):
    """A request to the two-calls model: frequency_penalty 2 (which makes its second call h:1), g's and
    h's parameters (None: none)."""
    fns = [{"name": n} if p is None else {"name": n, "parameters": p} for n, p in (("g", g), ("h", h))]
    return {"messages": [{"role": "user", "content": "x"}], "tools": tools_of(*fns), "frequency_penalty": 2.0,
            "max_tokens": 40, **kw}


def test_auto_several_calls_each_validated(two_calls):
    """Two calls in one answer, each one's arguments generated under its own function's grammar, the
    model free around them: the answer is the one generation of the same request without a grammar
    (tool_choice "none": tools out of the prompt, which this model does not read) token for token,
    with its log-probabilities; the penalties count the whole answer (else the model loops on g:0)."""
    ref, _ = post(two_calls, {**two_body(EMPTY, EMPTY), "tool_choice": "none", "return_token_ids": True,
                              "logprobs": True})
    ref = ref["choices"][0]
    assert ref["token_ids"] == TWO and ref["message"]["tool_calls"] == GH
    for g, h, header in ((EMPTY, EMPTY, "schema"), (EMPTY, None, "mixed"), (None, None, "json_object")):
        choice, headers = lossless_call(two_calls, two_body(g, h), SPECS8)
        assert headers["x-ddtree-tool-arguments"] == header
        assert choice["token_ids"] == TWO, choice
        assert choice["finish_reason"] == "tool_calls"
        msg = choice["message"]
        assert msg["content"] == "A" and msg["reasoning_content"] == "r"
        assert msg["tool_calls"] == GH
        for call, schema in zip(msg["tool_calls"], (g, h)):
            args = json.loads(call["function"]["arguments"])
            assert valid(args, schema) if schema else isinstance(args, dict)
        got, _ = post(two_calls, {**two_body(g, h), "logprobs": True, "top_logprobs": 2})
        lp = got["choices"][0]["logprobs"]["content"]
        assert len(lp) == len(TWO) == got["usage"]["completion_tokens"]
        assert [x["logprob"] for x in lp] == [x["logprob"] for x in ref["logprobs"]["content"]]
        assert all(len(x["top_logprobs"]) == 2 for x in lp)


def test_auto_each_call_under_its_own_grammar(two_calls):
    """A function whose schema "{}" is no instance of (NEEDS_Q) holds its call's arguments open, and
    only its call's: under h's, the first call (g) writes "{}" and the second's "}" is refused; under
    g's, the first call's "}" is refused, and the grammar leads the model to {"q": false}, valid,
    before its second call writes "{}" under h's.  With the grammar off for auto, the model's "{}"
    would pass both times."""
    schemas = {"g": EMPTY, "h": NEEDS_Q}
    choice, headers = lossless_call(two_calls, two_body(EMPTY, NEEDS_Q), SPECS8)
    assert headers["x-ddtree-tool-arguments"] == "schema"
    ids = choice["token_ids"]
    assert ids[:SECOND_ARGS + 1] == TWO[:SECOND_ARGS + 1] and ids[SECOND_ARGS + 1] != ord("}"), ids
    calls = choice["message"]["tool_calls"]
    assert calls[0] == GH[0] and len(calls) <= 2
    for call in calls:
        assert valid(json.loads(call["function"]["arguments"]), schemas[call["function"]["name"]]), call
    assert choice["finish_reason"] == ("tool_calls" if len(calls) == 2 else "length")

    schemas = {"g": NEEDS_Q, "h": EMPTY}
    choice, _ = lossless_call(two_calls, two_body(NEEDS_Q, EMPTY, max_tokens=80), SPECS8)
    ids = choice["token_ids"]
    assert ids[:FIRST_ARGS + 1] == TWO[:FIRST_ARGS + 1] and ids[FIRST_ARGS + 1] != ord("}"), ids
    calls = choice["message"]["tool_calls"]
    assert [c["id"] for c in calls] == ["g:0", "h:1"] and choice["finish_reason"] == "tool_calls", choice
    assert json.loads(calls[0]["function"]["arguments"]) == {"q": False}
    for call in calls:
        assert valid(json.loads(call["function"]["arguments"]), schemas[call["function"]["name"]]), call
    assert calls[1] == GH[1] and ids[-1] == 268


def test_auto_streamed_equals_whole(two_calls):
    body = two_body(EMPTY, EMPTY)
    for spec in SPECS8:
        events, headers = post_stream(two_calls, {**body, "speculative": spec})
        assert headers["x-ddtree-tool-arguments"] == "schema"
        deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
        assert [tc for x in deltas for tc in x.get("tool_calls", [])] == [{**c, "index": k} for k, c in enumerate(GH)]
        assert "".join(x.get("content") or "" for x in deltas) == "A"
        assert "".join(x.get("reasoning_content") or "" for x in deltas) == "r"
        assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_auto_max_tokens_anywhere(two_calls):
    """max_tokens at every length: the ids, message and finish reason of the one unconstrained
    generation, "length" whenever the answer is cut (inside arguments, right at an opening or at a
    call's end, where the answer would go on), the calls finished by then reported."""
    for n in range(1, len(TWO) + 1):
        specs = SPECS8 if n in (FIRST_ARGS, FIRST_ARGS + 1, SECOND_ARGS + 2, TWO.index(281) + 1) else SPECS8[:1]
        ref, _ = post(two_calls, {**two_body(EMPTY, EMPTY), "tool_choice": "none", "max_tokens": n,
                                  "return_token_ids": True})
        ref = ref["choices"][0]
        choice, _ = lossless_call(two_calls, two_body(EMPTY, EMPTY, max_tokens=n), specs)
        assert choice["token_ids"] == TWO[:n] == ref["token_ids"], n
        assert choice["finish_reason"] == ref["finish_reason"] == ("tool_calls" if n == len(TWO) else "length"), n
        assert choice["message"] == ref["message"], n


def test_auto_sampled_calls_are_valid_and_reproducible(two_calls):
    """At T = 1 (each later generation with a seed derived from the first's): the same seed gives the
    same answer, and every finished call's arguments are an instance of its function's schema."""
    schemas, calls = {"g": NEEDS_Q, "h": EMPTY}, 0
    for seed in range(4):
        body = two_body(NEEDS_Q, EMPTY, max_tokens=80, temperature=1.0, seed=seed, return_token_ids=True)
        a, _ = post(two_calls, body)
        b, _ = post(two_calls, body)
        assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]
        for call in a["choices"][0]["message"].get("tool_calls") or []:
            # at T = 1 the name may come out as anything: one declared nowhere gets a JSON object
            args, schema = json.loads(call["function"]["arguments"]), schemas.get(call["function"]["name"])
            assert valid(args, schema) if schema else isinstance(args, dict), call
            calls += 1
    assert calls > 0
