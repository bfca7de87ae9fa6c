"""`ddtree serve` JSON mode (response_format {"type": "json_object"}) with the shipped pair on the CPU:
the content of a finished answer is one JSON object that json.loads reads, in chat and completions,
whole and streamed; greedy ar, chain and tree requests give the same token ids (the constraint is
lossless under speculation); an answer cut by max_tokens says "length"; sampled answers are JSON too;
a json_schema outside the supported subset (test_serve_json_schema.py) and unknown types get a 400
naming the field.  Needs DDT_BUILD_DIR."""

import json

import pytest

from test_serve import Server

# prompts after which the shipped model, held to the grammar, finishes an object within the budget
PROMPTS = ['CONFIG = {"name": "json", "version": 2, "debug": false}\nDEFAULTS = ',
           "def to_dict(self):\n    return ",
           "data = {'a': [1, 2, 3], 'b': {'c': None}}\nexpected = "]
JSON = {"type": "json_object"}


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    assert s.stop() == 0, s.stderr()
    s.kill()


def post(server, path, body):
    st, got = server.request("POST", path, body)
    assert st == 200, got
    return got


def test_completions_json_object_lossless_across_modes(server):
    finished = 0
    for prompt in PROMPTS:
        ref = None
        for spec in ({"mode": "ar"}, {"mode": "chain"}, {"mode": "tree", "budget": 16}, {"budget": "auto"}):
            got = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 160, "response_format": JSON,
                                                   "return_token_ids": True, "speculative": spec})
            choice = got["choices"][0]
            if ref is None:
                ref = choice
            assert choice["token_ids"] == ref["token_ids"], spec
            assert choice["text"] == ref["text"]
        assert ref["text"].startswith("{")
        if ref["finish_reason"] == "stop":
            assert isinstance(json.loads(ref["text"]), dict)
            finished += 1
        else:
            assert ref["finish_reason"] == "length"
    assert finished >= 2
    # without the format the model writes something else (or the test shows nothing)
    plain = post(server, "/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 40})
    assert not plain["choices"][0]["text"].startswith("{")


def test_chat_json_object_whole_and_streamed(server):
    c = server.client()
    msgs = [{"role": "user", "content": "Give the settings as a JSON object."}]
    whole = c.chat.completions.create(model="m", messages=msgs, max_tokens=200, response_format=JSON)
    content = whole.choices[0].message.content
    assert content.startswith("{")
    if whole.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)
    chunks = list(c.chat.completions.create(model="m", messages=msgs, max_tokens=200, response_format=JSON,
                                            stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == content
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]


def test_cut_by_max_tokens_says_length(server):
    got = post(server, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 3, "response_format": JSON})
    assert got["choices"][0]["finish_reason"] == "length"
    assert got["choices"][0]["text"].startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(got["choices"][0]["text"])


def test_sampled_answers_are_json(server):
    for seed in range(4):
        got = post(server, "/v1/completions", {"prompt": PROMPTS[seed % 3], "max_tokens": 200, "temperature": 0.9,
                                               "seed": seed, "response_format": JSON})
        choice = got["choices"][0]
        if choice["finish_reason"] == "stop":
            assert isinstance(json.loads(choice["text"]), dict)
        else:
            assert choice["finish_reason"] == "length" and choice["text"].startswith("{")


def test_json_schema_and_unknown_types_refused(server):
    for fmt, words in (({"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}},
                        "json_schema"), ({"type": "yaml"}, "unknown type"), ({}, "'type'")):
        st, got = server.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 4, "response_format": fmt})
        assert st == 400, got
        assert got["error"]["param"] == "response_format" and words in got["error"]["message"], got
    # text is the default and changes nothing
    a = post(server, "/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 8, "response_format": {"type": "text"}})
    b = post(server, "/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 8})
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
