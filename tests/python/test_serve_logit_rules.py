"""`ddtree serve` logit_bias, presence_penalty and frequency_penalty (and vLLM's repetition_penalty)
with the shipped pair on the CPU:
greedy ar, chain, tree and auto requests give the same token ids under each (the rules are applied at
every tree node with its path counted, so speculation stays lossless); a -100 bias keeps a token out
of the answer and a +100 bias at T = 1 makes every token that one; the penalties change the text and
a frequency penalty cuts the repeats of a repetitive answer; the openai client's fields reach the
server; bad values (ids past the vocabulary, biases past 100, penalties past 2, keys that are no ids,
too many entries) get a 400 naming the field.  Needs DDT_BUILD_DIR."""

from collections import Counter

import pytest

from test_serve import Server

PROMPTS = ["for i in range(10):\n    for j in range(10):\n        ",
           "def parse_args(argv):\n    parser = "]
SPECS = ({"mode": "ar"}, {"mode": "chain"}, {"mode": "tree", "budget": 16}, {"budget": "auto"})


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    assert s.stop() == 0, s.stderr()
    s.kill()


def post(server, body, path="/v1/completions"):
    st, got = server.request("POST", path, body)
    assert st == 200, got
    return got["choices"][0]


def ids_across_modes(server, body):
    ref = None
    for spec in SPECS:
        choice = post(server, dict(body, return_token_ids=True, speculative=spec))
        if ref is None:
            ref = choice
        assert choice["token_ids"] == ref["token_ids"], (spec, body)
        assert choice["text"] == ref["text"]
    return ref["token_ids"]


def test_bias_lossless_and_keeps_a_token_out(server):
    for prompt in PROMPTS:
        plain = ids_across_modes(server, {"prompt": prompt, "max_tokens": 64})
        top = Counter(plain).most_common(1)[0][0]
        biased = ids_across_modes(server, {"prompt": prompt, "max_tokens": 64,
                                           "logit_bias": {str(top): -100, "32": 3}})
        assert top not in biased
        assert biased != plain


def test_penalties_lossless_and_cut_repeats(server):
    prompt = PROMPTS[0]
    plain = ids_across_modes(server, {"prompt": prompt, "max_tokens": 80})
    pen = ids_across_modes(server, {"prompt": prompt, "max_tokens": 80, "frequency_penalty": 1.5,
                                    "presence_penalty": 0.5})
    assert pen != plain
    assert max(Counter(pen).values()) < max(Counter(plain).values())
    both = ids_across_modes(server, {"prompt": PROMPTS[1], "max_tokens": 64, "frequency_penalty": 0.7,
                                     "logit_bias": {"10": 2}})
    assert len(both) > 0


def test_repetition_penalty_lossless(server):
    prompt = PROMPTS[0]
    plain = ids_across_modes(server, {"prompt": prompt, "max_tokens": 64})
    assert ids_across_modes(server, {"prompt": prompt, "max_tokens": 64, "repetition_penalty": 1.0}) == plain
    rep = ids_across_modes(server, {"prompt": prompt, "max_tokens": 64, "repetition_penalty": 1.4})
    assert rep != plain


def test_rules_do_not_outlive_their_request(server):
    body = {"prompt": PROMPTS[1], "max_tokens": 48, "return_token_ids": True}
    before = post(server, body)["token_ids"]
    post(server, dict(body, frequency_penalty=2, logit_bias={str(before[0]): -100}))
    assert post(server, body)["token_ids"] == before


def test_sampled_bias_forces_a_token(server):
    for spec in SPECS:
        choice = post(server, {"prompt": PROMPTS[1], "max_tokens": 20, "temperature": 1.0, "seed": 3,
                               "logit_bias": {"300": 100}, "return_token_ids": True, "speculative": spec})
        assert choice["token_ids"] == [300] * 20, spec


def test_chat_through_the_openai_client(server):
    c = server.client()
    msgs = [{"role": "user", "content": "Write a loop."}]
    plain = c.chat.completions.create(model="m", messages=msgs, max_tokens=40, temperature=0)
    pen = c.chat.completions.create(model="m", messages=msgs, max_tokens=40, temperature=0, frequency_penalty=2.0,
                                    presence_penalty=2.0)
    assert pen.choices[0].message.content != plain.choices[0].message.content
    chunks = list(c.chat.completions.create(model="m", messages=msgs, max_tokens=40, temperature=0,
                                            frequency_penalty=2.0, presence_penalty=2.0, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == pen.choices[0].message.content


@pytest.mark.parametrize("extra,field", [
    ({"logit_bias": {"999999": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"a5": 1}}, "logit_bias"),
    ({"logit_bias": {str(i): 1 for i in range(1025)}}, "logit_bias"),
    ({"logit_bias": [1, 2]}, "logit_bias"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": 11}, "repetition_penalty"),
])
def test_bad_values_get_400(server, extra, field):
    st, got = server.request("POST", "/v1/completions", dict({"prompt": "x", "max_tokens": 4}, **extra))
    assert st == 400, got
    assert got["error"]["param"] == field, got
