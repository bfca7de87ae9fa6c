"""`ddtree serve` with the shipped pair on the CPU, on 127.0.0.1 (a free port the server picks and
prints): the official `openai` client for chat, completion, streaming and usage; greedy output over
HTTP == `ddtree generate --json`; per-request speculative settings; concurrent clients all getting
the answers they get alone; bad requests (malformed, truncated, wrong types, huge numbers, invalid
UTF-8, over the context, over the body limit, n > 16, missing or wrong API key) getting their status
codes while the server keeps serving; a disconnecting client cancelling its request; /metrics;
a clean exit on SIGTERM; chat templates (the built-in Kimi one with tools, tool calls and tool
results, and a model folder's own Jinja template) giving the ids of jinja2 + tiktoken.  Needs DDT_BUILD_DIR.  test_cli_serve_smoke also runs in the sanitizer
pass (its name has "cli")."""

import base64
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time

import pytest
from openai import OpenAI

import tiktoken

import scripted_model as sm
import tok_util as tu
from conftest import quick
from ddt_paths import ddtree_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = os.path.join(ROOT, "models", "pystdlib-target")
DRAFT = os.path.join(ROOT, "models", "pystdlib-dflash")
ENGINE = ["--model", TARGET, "--draft", DRAFT, "--mode", "tree", "--budget", "16", "--threads", "2"]
PROMPTS = ["import os\ndef ", "class Queue:\n    def __init__(self", "def parse(text):\n    \"\"\"",
           "    for key, value in "]


class Server:
    """A `ddtree serve` subprocess; its stderr goes to a file, from which the port is read."""

    def __init__(self, *extra, timeout=120, engine=None):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="ddtree-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([ddtree_path(), "serve", *(engine or ENGINE), "--port", "0", *extra],
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + timeout
        self.port = None
        while time.time() < deadline:
            m = re.search(r"listening on http://[0-9.]+:(\d+)", self.stderr())
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if self.port is None:
            self.kill()
            pytest.fail(f"ddtree serve did not start:\n{self.stderr()}", pytrace=False)

    def stderr(self):
        with open(self.log.name) as f:
            return f.read()

    def url(self):
        return f"http://127.0.0.1:{self.port}/v1"

    def client(self, key="none"):
        return OpenAI(base_url=self.url(), api_key=key, max_retries=0, timeout=120)

    def request(self, method, path, body=None, headers=None, timeout=120):
        """(status, parsed JSON or text) of one request on a fresh connection."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        c.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        c.close()
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, raw.decode("utf-8", "replace")

    def stop(self, sig=signal.SIGTERM):
        """Signal the server and return its exit status (killed and failed after 30 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(f"ddtree serve did not exit on {sig!r}:\n{self.stderr()}", pytrace=False)
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if os.path.exists(self.log.name):
            os.unlink(self.log.name)


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    rc = s.stop()
    log = s.stderr()
    s.kill()
    assert rc == 0, log
    assert "SIGTERM: stopping" in log


def generate_json(*args):
    r = subprocess.run([ddtree_path(), "generate", *ENGINE, "--json", *args], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def complete(server, prompt, **kw):
    st, body = server.request("POST", "/v1/completions", {"prompt": prompt, **kw})
    assert st == 200, body
    return body


def metric(text, name, mode=None):
    label = f'{{mode="{mode}"}}' if mode else ""
    m = re.search(rf"^{re.escape(name + label)} (\S+)$", text, re.M)
    assert m, f"{name}{label} missing from /metrics"
    return float(m.group(1))


# ---------------------------------------------------------------------------- the openai client


def test_openai_chat_completion_and_usage(server):
    c = server.client()
    r = c.chat.completions.create(model="pystdlib-target", max_tokens=24,
                                  messages=[{"role": "system", "content": "You write Python."},
                                            {"role": "user", "content": "def add(a, b):"},
                                            {"role": "assistant", "content": "    return a + b"},
                                            {"role": "user", "content": "def sub(a, b):"}])
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert isinstance(r.choices[0].message.content, str)
    assert "<|im_" not in r.choices[0].message.content  # special tokens stay out of the text
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 20  # three turns plus the template's markers
    assert 1 <= r.usage.completion_tokens <= 24
    if r.choices[0].finish_reason == "length":
        assert r.usage.completion_tokens == 24
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    models = c.models.list()
    assert [m.id for m in models.data] == ["pystdlib-target"]


def test_openai_completion_and_stop_string(server):
    c = server.client()
    r = c.completions.create(model="m", prompt=PROMPTS[0], max_tokens=40, temperature=0)
    text = r.choices[0].text
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 40
    # a stop string cuts the text before it and finishes with "stop"
    cut = text[3:9]
    assert cut and cut in text
    s = c.completions.create(model="m", prompt=PROMPTS[0], max_tokens=40, temperature=0, stop=[cut])
    assert s.choices[0].finish_reason == "stop"
    assert s.choices[0].text == text[:text.index(cut)]
    assert s.usage.completion_tokens < 40


def test_openai_streaming_equals_whole(server):
    c = server.client()
    for kind in ("chat", "completion"):
        if kind == "chat":
            kw = dict(model="m", messages=[{"role": "user", "content": "import sys"}], max_tokens=30)
            whole = c.chat.completions.create(**kw)
            chunks = list(c.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
            deltas = [ch.choices[0].delta.content or "" for ch in chunks if ch.choices]
            want = whole.choices[0].message.content
            assert chunks[0].choices[0].delta.role == "assistant"
        else:
            kw = dict(model="m", prompt=PROMPTS[1], max_tokens=30)
            whole = c.completions.create(**kw)
            chunks = list(c.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
            deltas = [ch.choices[0].text for ch in chunks if ch.choices]
            want = whole.choices[0].text
        assert "".join(deltas) == want  # no token of a multi-token round dropped
        assert sum(1 for d in deltas if d) >= 3  # streamed in pieces, not one blob
        finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        assert finals == [whole.choices[0].finish_reason]
        last = chunks[-1]  # the usage chunk: no choices
        assert last.choices == [] and last.usage is not None
        assert last.usage.completion_tokens == whole.usage.completion_tokens
        assert last.usage.prompt_tokens == whole.usage.prompt_tokens
        # without include_usage no usage chunk comes
        plain = list(c.completions.create(model="m", prompt=PROMPTS[1], max_tokens=5, stream=True))
        assert all(ch.choices for ch in plain)


def test_sse_wire_format(server):
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    c.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": PROMPTS[2], "max_tokens": 12, "stream": True, "stream_options": {"include_usage": True}}))
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/event-stream")
    raw = r.read().decode()
    c.close()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    usage = json.loads(events[-2][6:])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12


# ---------------------------------------------------------------------------- same output as generate


def test_greedy_http_equals_generate(server):
    for prompt in PROMPTS[:2]:
        ref = generate_json("--prompt", prompt, "--max-tokens", "48", "--stop-at-eos")
        got = complete(server, prompt, max_tokens=48, return_token_ids=True)
        assert got["choices"][0]["token_ids"] == ref["ids"]
        assert got["choices"][0]["text"] == ref["text"]
        # every per-request mode gives the same greedy ids
        for spec in ({"mode": "ar"}, {"mode": "chain"}, {"mode": "tree", "budget": 4}, {"budget": "auto"}):
            other = complete(server, prompt, max_tokens=48, return_token_ids=True, speculative=spec)
            assert other["choices"][0]["token_ids"] == ref["ids"], spec
            assert other["ddtree"]["mode"] == spec.get("mode", "tree")
    chat = "def greet(name):"
    ref = generate_json("--chat", chat, "--max-tokens", "32", "--stop-at-eos")
    st, got = server.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": chat}],
                                                               "max_tokens": 32, "return_token_ids": True})
    assert st == 200, got
    assert got["choices"][0]["token_ids"] == ref["ids"]
    assert got["usage"]["prompt_tokens"] == ref["stats"]["prompt_tokens"]


def test_prefix_cache_multi_turn(server):
    """A conversation re-sends what came before: the server reuses the previous request's context
    up to the first token where the prompts differ (usage.prompt_tokens_details.cached_tokens), and
    the tokens are those of a fresh `ddtree generate` of the whole prompt."""
    base = generate_json("--prompt", PROMPTS[1], "--max-tokens", "40")["ids"]
    p1 = base[:30]
    r1 = complete(server, p1, max_tokens=16, return_token_ids=True)
    o1 = r1["choices"][0]["token_ids"]
    # the next turn: the first prompt, part of its answer, then new text
    p2 = p1 + o1[:10] + base[30:36]
    r2 = complete(server, p2, max_tokens=16, return_token_ids=True)
    cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert len(p1) <= cached <= len(p2) - 1, r2["usage"]
    ref = generate_json("--prompt-ids", ",".join(map(str, p2)), "--max-tokens", "16")
    assert r2["choices"][0]["token_ids"] == ref["ids"]
    # the same prompt again: all but its last token reused, the same tokens (streamed too)
    st, ev = server.request("POST", "/v1/completions", {"prompt": p2, "max_tokens": 16, "stream": True,
                                                        "stream_options": {"include_usage": True}})
    assert st == 200
    usage = [json.loads(e[6:]) for e in ev.split("\n\n") if e.startswith("data: {")][-1]["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == len(p2) - 1
    r3 = complete(server, p2, max_tokens=16, return_token_ids=True)
    assert r3["usage"]["prompt_tokens_details"]["cached_tokens"] == len(p2) - 1
    assert r3["choices"][0]["token_ids"] == ref["ids"]
    # an unrelated prompt reuses nothing it does not share
    r4 = complete(server, [p2[0] ^ 1, 8, 9], max_tokens=4)
    assert r4["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    text = server.request("GET", "/metrics")[1]
    assert metric(text, "ddtree_prompt_cached_tokens_total", "tree") >= cached + 2 * (len(p2) - 1)


def test_logprobs(server):
    """Log-probabilities in OpenAI's shapes: chat (logprobs + top_logprobs, also streamed), completions
    (logprobs: N with text_offset); greedy, the emitted token is the most likely; the same values in
    every decoding mode."""
    c = server.client()
    msgs = [{"role": "user", "content": "def add(a, b):"}]
    r = c.chat.completions.create(model="m", messages=msgs, max_tokens=12, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    text = b""
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob  # greedy
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token or "\ufffd" in e.token
        if not (e.token.startswith("<|") and e.token.endswith("|>")):
            text += bytes(e.bytes)
    assert text.decode() == r.choices[0].message.content
    # streamed: the chunks' entries, in order, are the whole response's
    chunks = list(c.chat.completions.create(model="m", messages=msgs, max_tokens=12, logprobs=True, top_logprobs=3,
                                            stream=True))
    streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]
    # without top_logprobs: the token's own value, no alternatives; without logprobs: none
    r0 = c.chat.completions.create(model="m", messages=msgs, max_tokens=4, logprobs=True)
    assert all(e.top_logprobs == [] for e in r0.choices[0].logprobs.content)
    assert c.chat.completions.create(model="m", messages=msgs, max_tokens=4).choices[0].logprobs is None
    # completions: tokens, token_logprobs, top_logprobs {text: logprob}, text_offset
    outs = []
    for spec in ({"mode": "ar"}, {"mode": "tree", "budget": 8}, {"mode": "chain"}):
        b = complete(server, PROMPTS[0], max_tokens=20, logprobs=2, speculative=spec)
        lp = b["choices"][0]["logprobs"]
        n = b["usage"]["completion_tokens"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
        assert all(len(d) <= 2 for d in lp["top_logprobs"])
        text = b["choices"][0]["text"]
        for i, t in enumerate(lp["tokens"]):
            assert lp["text_offset"][i] == len("".join(lp["tokens"][:i]))
            assert max(lp["top_logprobs"][i].values()) == lp["token_logprobs"][i]
        assert "".join(lp["tokens"]) == text
        outs.append(lp)
    assert outs[0] == outs[1] == outs[2]  # tree and chain verify rows are ar's, bit for bit
    st, body = server.request("POST", "/v1/chat/completions", {"messages": msgs, "top_logprobs": 2})
    assert st == 400 and body["error"]["param"] == "top_logprobs"


def test_echo_scores_the_prompt(server):
    """Completions' echo (what lm-eval's loglikelihood requests send): the prompt comes back before
    the completion, and with logprobs its tokens are scored (the first has none), with the values
    `ddtree perplexity` gives; max_tokens 0 scores the prompt alone."""
    prompt = PROMPTS[1]
    r = subprocess.run([ddtree_path(), "perplexity", "--model", TARGET, "--text", prompt, "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    ppl = json.loads(r.stdout)
    n = ppl["tokens"]
    b = complete(server, prompt, max_tokens=0, echo=True, logprobs=1)
    lp = b["choices"][0]["logprobs"]
    assert b["choices"][0]["text"] == prompt and b["usage"]["completion_tokens"] == 0
    assert "".join(lp["tokens"]) == prompt and len(lp["tokens"]) == n == b["usage"]["prompt_tokens"]
    assert lp["token_logprobs"] == ppl["logprobs"]  # None first, then bit-for-bit the same values
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(n)]
    # with a completion: the prompt's entries, then the completion's as without echo
    plain = complete(server, prompt, max_tokens=6, logprobs=1)
    both = complete(server, prompt, max_tokens=6, logprobs=1, echo=True)
    assert both["choices"][0]["text"] == prompt + plain["choices"][0]["text"]
    bl, pl = both["choices"][0]["logprobs"], plain["choices"][0]["logprobs"]
    assert bl["token_logprobs"] == ppl["logprobs"] + pl["token_logprobs"]
    assert bl["tokens"][n:] == pl["tokens"] and bl["top_logprobs"][n:] == pl["top_logprobs"]
    assert bl["text_offset"][n:] == [len(prompt) + o for o in pl["text_offset"]]
    # echo without logprobs: the text only; token-id prompts (as lm-eval sends them) work too
    e = complete(server, prompt, max_tokens=3, echo=True)
    assert e["choices"][0]["text"].startswith(prompt) and e["choices"][0]["logprobs"] is None
    ids = generate_json("--prompt", prompt, "--max-tokens", "8")["ids"]
    t = complete(server, ids, max_tokens=1, echo=True, logprobs=1)
    assert len(t["choices"][0]["logprobs"]["tokens"]) == len(ids) + 1
    assert t["choices"][0]["logprobs"]["token_logprobs"][0] is None
    for body, param in (({"prompt": prompt, "echo": True, "stream": True}, "echo"),
                        ({"prompt": prompt, "max_tokens": 0}, "max_tokens")):
        st, err = server.request("POST", "/v1/completions", body)
        assert st == 400 and err["error"]["param"] == param, err
    st, err = server.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                              "echo": True})
    assert st == 400 and err["error"]["param"] == "echo"


def test_n_choices(server):
    """n choices: decoded one after the other, choice k with the seed + k, so each is the single
    request with that seed; usage counts the prompt once and every completion; greedy choices are
    equal; chat through the openai client."""
    kw = {"max_tokens": 12, "temperature": 1.0, "seed": 40}
    b = complete(server, PROMPTS[3], n=3, return_token_ids=True, **kw)
    ch = b["choices"]
    assert [c["index"] for c in ch] == [0, 1, 2]
    for k in range(3):
        one = complete(server, PROMPTS[3], return_token_ids=True, **{**kw, "seed": 40 + k})
        assert ch[k]["token_ids"] == one["choices"][0]["token_ids"], k
        assert ch[k]["text"] == one["choices"][0]["text"]
    assert len({tuple(c["token_ids"]) for c in ch}) > 1  # different seeds, different samples
    assert b["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in ch)
    assert b["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    g = complete(server, PROMPTS[3], n=2, max_tokens=8)
    assert g["choices"][0]["text"] == g["choices"][1]["text"]
    r = server.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "x = "}], n=2,
                                                max_tokens=6, temperature=1.0, seed=3)
    assert len(r.choices) == 2 and [c.index for c in r.choices] == [0, 1]


def test_n_choices_streamed(server):
    """n choices streamed: one choice after another, each chunk with its index, each choice's text
    and finish reason those of the unstreamed answer; the usage chunk counts the prompt once and
    every completion; chat through the openai client: each choice opens with its role."""
    kw = {"max_tokens": 12, "temperature": 1.0, "seed": 40, "n": 3}
    whole = complete(server, PROMPTS[3], **kw)
    chunks = list(server.client().completions.create(model="m", prompt=PROMPTS[3], stream=True,
                                                     stream_options={"include_usage": True}, **kw))
    texts, finish, order = ["", "", ""], [None] * 3, []
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] += c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
            if not order or order[-1] != c.index:
                order.append(c.index)
    assert order == [0, 1, 2]  # one choice after another
    assert texts == [c["text"] for c in whole["choices"]]
    assert finish == [c["finish_reason"] for c in whole["choices"]]
    usage = [ch.usage for ch in chunks if ch.usage]
    assert len(usage) == 1 and usage[0].completion_tokens == whole["usage"]["completion_tokens"]
    assert usage[0].prompt_tokens == whole["usage"]["prompt_tokens"]
    msgs = [{"role": "user", "content": "x = "}]
    c = server.client()
    plain = c.chat.completions.create(model="m", messages=msgs, n=2, max_tokens=6, temperature=1.0, seed=3)
    roles, content = {}, ["", ""]
    for ch in c.chat.completions.create(model="m", messages=msgs, n=2, max_tokens=6, temperature=1.0, seed=3,
                                        stream=True):
        for d in ch.choices:
            if d.delta.role:
                roles[d.index] = roles.get(d.index, 0) + 1
            content[d.index] += d.delta.content or ""
    assert roles == {0: 1, 1: 1}
    assert content == [ch.message.content for ch in plain.choices]


def test_sampling_seeded_and_prompt_ids(server):
    a = complete(server, PROMPTS[3], max_tokens=20, temperature=1.0, top_p=0.9, seed=5)
    b = complete(server, PROMPTS[3], max_tokens=20, temperature=1.0, top_p=0.9, seed=5)
    c = complete(server, PROMPTS[3], max_tokens=20, temperature=1.0, top_p=0.9, seed=6)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert a["choices"][0]["text"] != c["choices"][0]["text"]
    ref = generate_json("--prompt-ids", "5,6,7", "--max-tokens", "10", "--temperature", "1", "--seed", "9",
                        "--stop-at-eos")
    got = complete(server, [5, 6, 7], max_tokens=10, temperature=1.0, seed=9, return_token_ids=True)
    assert got["choices"][0]["token_ids"] == ref["ids"]


# ---------------------------------------------------------------------------- concurrency


def test_concurrent_requests_get_their_own_answers(server):
    """8 threads x 5 requests, mixing modes, streaming and seeded sampling: each answer equals the
    one the same request got alone, so queued requests do not disturb each other."""
    reqs = []
    for i in range(8):
        p = PROMPTS[i % len(PROMPTS)]
        if i % 4 == 1:
            reqs.append(dict(prompt=p, max_tokens=16, temperature=0.8, seed=100 + i))
        elif i % 4 == 2:
            reqs.append(dict(prompt=p, max_tokens=16, speculative={"mode": "chain"}))
        else:
            reqs.append(dict(prompt=p, max_tokens=16))
    alone = [complete(server, **r)["choices"][0]["text"] for r in reqs]
    errors, got = [], {}
    client = server.client()

    def worker(i):
        try:
            for k in range(5):
                r = reqs[(i + k) % len(reqs)]
                if k % 2:
                    chunks = client.completions.create(model="m", stream=True, extra_body={
                        kk: v for kk, v in r.items() if kk == "speculative"},
                        **{kk: v for kk, v in r.items() if kk != "speculative"})
                    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
                else:
                    text = complete(server, **r)["choices"][0]["text"]
                got[(i, k)] = (text, alone[(i + k) % len(reqs)])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert len(got) == 40
    for key, (text, want) in got.items():
        assert text == want, key


# ---------------------------------------------------------------------------- bad requests


def raw_request(port, data, timeout=30):
    """Send raw bytes, return the status line's code (0 when the server closed without one)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        resp = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            resp += chunk
            if b"\r\n\r\n" in resp:
                head, _, rest = resp.partition(b"\r\n\r\n")
                m = re.search(rb"Content-Length: (\d+)", head, re.I)
                if m and len(rest) >= int(m.group(1)):
                    break
    finally:
        s.close()
    m = re.match(rb"HTTP/1\.[01] (\d{3})", resp)
    return int(m.group(1)) if m else 0


BAD = [
    ("/v1/completions", b'{"prompt": "import os"', 400, None),  # truncated JSON
    ("/v1/completions", b"not json at all", 400, None),
    ("/v1/completions", b"[1, 2, 3]", 400, None),
    ("/v1/completions", b'{"prompt": "a", "max_tokens": "5"}', 400, "max_tokens"),
    ("/v1/completions", b'{"prompt": "a", "temperature": "hot"}', 400, "temperature"),
    ("/v1/completions", b'{"prompt": 12}', 400, "prompt"),
    ("/v1/completions", b'{"prompt": "a", "max_tokens": 1e999}', 400, None),
    ("/v1/completions", b'{"prompt": "a", "max_tokens": 123456789012345678901234567890}', 400, None),
    ("/v1/completions", b'{"prompt": "a", "max_tokens": 9223372036854775807}', 400, "max_tokens"),
    ("/v1/completions", b'{"prompt": "a", "seed": 1e308}', 400, "seed"),
    ("/v1/completions", b'{"prompt": "\xff\xfe\xfd"}', 400, None),  # invalid UTF-8
    ("/v1/completions", b'{"prompt": "a", "n": 17}', 400, "n"),
    ("/v1/completions", b'{"prompt": "a", "n": 2, "stream": true, "echo": true}', 400, "echo"),
    ("/v1/completions", b'{"prompt": "a", "max_tokens": 5000}', 400, "max_tokens"),  # over the context
    ("/v1/completions", json.dumps({"prompt": [7] * 1100}).encode(), 400, "prompt"),  # prompt over the context
    ("/v1/completions", b'{"prompt": [999999]}', 400, "prompt"),  # outside the vocabulary
    ("/v1/completions", b'{"prompt": "a", "speculative": {"mode": "beam"}}', 400, "speculative.mode"),
    ("/v1/completions", b'{"prompt": "a", "speculative": {"budget": 500}}', 400, "speculative"),
    ("/v1/chat/completions", b'{"messages": []}', 400, "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "function", "content": "x"}]}', 400, "messages[0].role"),
    ("/v1/chat/completions", b'{"messages": [{"role": "tool", "content": "x"}]}', 400, "messages[0].tool_call_id"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}', 400,
     "tool_choice"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": {"a": 1}}]}', 400,
     "messages[0].content"),
    ("/v1/chat/completions", b'{"messages": "hello"}', 400, "messages"),
]


def check_bad_requests(server):
    for path, body, code, param in BAD:
        st, resp = server.request("POST", path, body)
        assert st == code, (body[:80], st, resp)
        assert isinstance(resp, dict) and resp["error"]["message"], resp
        assert resp["error"]["type"] == "invalid_request_error"
        if param:
            assert resp["error"]["param"] == param, (body[:80], resp)
    assert server.request("GET", "/v1/nothing")[0] == 404
    assert server.request("GET", "/v1/completions")[0] == 405
    assert server.request("POST", "/health", b"{}")[0] == 405


def test_bad_requests_get_status_codes(server):
    check_bad_requests(server)
    # a body over the limit (1 MiB): 413, after reading it, by Content-Length and chunked
    big = b'{"prompt": "' + b"a" * (1 << 20) + b'"}'
    st, resp = server.request("POST", "/v1/completions", big)
    assert st == 413 and resp["error"]["code"] == "request_too_large"
    # one announced far over the limit is refused before its body is sent
    assert raw_request(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                    b"Content-Length: 1000000000000\r\n\r\n") == 413
    chunked = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
               b"".join(b"%x\r\n%s\r\n" % (65536, b"a" * 65536) for _ in range(17)) + b"0\r\n\r\n")
    assert raw_request(server.port, chunked) == 413
    # a body shorter than its Content-Length, then the client gives up
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"prompt\": ")
    s.close()
    # request lines that are not HTTP/1.x (a binary one gets no answer: the server waits, then drops it)
    assert raw_request(server.port, b"NOT HTTP AT ALL\r\n\r\n") == 400
    assert raw_request(server.port, b"GET /health HTTP/9.9\r\n\r\n") == 505
    assert raw_request(server.port, b"\x00\x01\x02garbage\r\n\r\n", timeout=1) in (0, 400)
    # still serving, with the same answers
    assert server.request("GET", "/health") == (200, {"status": "ok"})
    a = complete(server, PROMPTS[0], max_tokens=8)
    b = complete(server, PROMPTS[0], max_tokens=8)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


def test_disconnect_cancels_request(server):
    before = server.request("GET", "/metrics")[1]
    cancelled0 = metric(before, "ddtree_requests_cancelled_total")
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": PROMPTS[0], "max_tokens": 1000,
                                                          "stream": True, "speculative": {"mode": "ar"}}))
    r = c.getresponse()
    assert r.status == 200
    r.fp.readline()  # the first event has come: the request is running
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    t0 = time.time()
    # the next request is served long before 1000 ar tokens would have been decoded
    complete(server, PROMPTS[1], max_tokens=4)
    deadline = time.time() + 20
    while time.time() < deadline:
        now = metric(server.request("GET", "/metrics")[1], "ddtree_requests_cancelled_total")
        if now > cancelled0:
            break
        time.sleep(0.1)
    assert now == cancelled0 + 1
    assert time.time() - t0 < 20


def test_metrics(server):
    complete(server, PROMPTS[0], max_tokens=16)
    st, text = server.request("GET", "/metrics")
    assert st == 200 and isinstance(text, str)
    assert metric(text, "ddtree_requests_total", "tree") >= 1
    assert metric(text, "ddtree_generation_tokens_total", "tree") >= 16
    assert metric(text, "ddtree_generation_tokens_per_second", "tree") > 0
    assert metric(text, "ddtree_time_to_first_token_seconds_count", "tree") >= 1
    drafts = metric(text, "ddtree_spec_decode_num_drafts_total", "tree")
    accepted = metric(text, "ddtree_spec_decode_num_accepted_tokens_total", "tree")
    proposed = metric(text, "ddtree_spec_decode_num_draft_tokens_total", "tree")
    assert drafts >= 1 and proposed >= accepted >= 0
    assert proposed >= metric(text, "ddtree_spec_decode_num_lookup_tokens_total", "tree") >= 0
    assert metric(text, "ddtree_spec_decode_mean_acceptance_length", "tree") == pytest.approx(
        1 + accepted / drafts, rel=1e-6)
    assert "# TYPE ddtree_requests_total counter" in text


# ---------------------------------------------------------------------------- api key, signals, sanitizers


def test_api_key():
    s = Server("--api-key", "sekrit", "--served-model-name", "kimi-mini")
    try:
        body = {"prompt": "x", "max_tokens": 2}
        assert s.request("POST", "/v1/completions", body)[0] == 401
        st, resp = s.request("POST", "/v1/completions", body, {"Authorization": "Bearer wrong"})
        assert st == 401 and resp["error"]["type"] == "authentication_error"
        assert s.request("POST", "/v1/completions", body, {"Authorization": "sekrit"})[0] == 401
        assert s.request("GET", "/v1/models")[0] == 401
        assert s.request("GET", "/health")[0] == 200  # health and metrics stay open
        r = s.client("sekrit").completions.create(model="kimi-mini", prompt="x", max_tokens=2)
        assert r.model == "kimi-mini" and r.usage.completion_tokens == 2
        assert s.client("sekrit").models.list().data[0].id == "kimi-mini"
    finally:
        rc = s.stop(signal.SIGINT)
        log = s.stderr()
        s.kill()
    assert rc == 0 and "SIGINT: stopping" in log, log


def test_serve_bad_flags():
    r = subprocess.run([ddtree_path(), "serve", "--model", TARGET, "--port", "70000"], capture_output=True, text=True)
    assert r.returncode == 2 and "--port" in r.stderr
    r = subprocess.run([ddtree_path(), "serve", "--model", TARGET, "--mode", "tree"], capture_output=True, text=True)
    assert r.returncode == 2 and "--draft" in r.stderr
    r = subprocess.run([ddtree_path(), "serve", "--model", TARGET, "--host", "example.com", "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--host" in r.stderr
    r = subprocess.run([ddtree_path(), "serve", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--api-key" in r.stdout and "--budget" in r.stdout


def test_cli_serve_smoke():
    """A short run that the sanitizer pass repeats: bad bodies, a completion, a stream, a stream
    abandoned mid-way, and SIGTERM while a request is queued — then a clean exit."""
    s = Server(timeout=600)
    try:
        check_bad_requests(s)
        n = 3 if quick() else 12
        r = complete(s, PROMPTS[0], max_tokens=n)
        assert r["usage"]["completion_tokens"] == n
        chunks = list(s.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                         max_tokens=n, stream=True))
        assert chunks and chunks[0].choices[0].delta.role == "assistant"
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
        c.request("POST", "/v1/completions", body=json.dumps({"prompt": "x", "max_tokens": 200, "stream": True}))
        c.getresponse().fp.readline()
        c.close()
        # a request still in flight when the signal comes must not keep the server from exiting
        def late():
            try:
                s.request("POST", "/v1/completions", {"prompt": "y", "max_tokens": 500}, timeout=60)
            except (OSError, http.client.HTTPException):
                pass  # the server may close it while stopping

        pending = threading.Thread(target=late, daemon=True)
        pending.start()
        time.sleep(0.2)
    finally:
        rc = s.stop()
        log = s.stderr()
        s.kill()
    assert rc == 0, log
    assert "ERROR: AddressSanitizer" not in log and "runtime error" not in log, log


# ---------------------------------------------------------------------------- chat templates and tools


def shipped_encoding():
    """tiktoken with the shipped tokenizer's ranks and specials (as tokenization_kimi.py builds them)."""
    ranks = {}
    with open(os.path.join(TARGET, "tiktoken.model"), "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    with open(os.path.join(TARGET, "tokenizer_config.json"), encoding="utf-8") as f:
        named = {int(k): v["content"] for k, v in json.load(f)["added_tokens_decoder"].items()}
    return tiktoken.Encoding("pystdlib", pat_str=tu.KIMI_PAT_STR, mergeable_ranks=ranks,
                             special_tokens=tu.kimi_special_tokens(len(ranks), named))


WEATHER_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city — °C",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
TOOL_TURNS = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "functions.get_weather:0", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny, 21 °C"},
]


def chat_ids(server, body):
    st, got = server.request("POST", "/v1/chat/completions", {"max_tokens": 1, "return_token_ids": True, **body})
    assert st == 200, got
    return got["prompt_token_ids"], got


def test_builtin_template_tools_and_tool_turns(server):
    """The built-in Kimi K2 template: tools declared first, the assistant's call in its section, the tool's
    result as a `tool` system message: the ids of that text with special tokens recognised."""
    enc = shipped_encoding()
    ids, got = chat_ids(server, {"messages": TOOL_TURNS, "tools": WEATHER_TOOLS})
    call = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>" \
           '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>'
    tools_json = json.dumps(WEATHER_TOOLS, ensure_ascii=False, separators=(",", ":"))
    text = ("<|im_system|>tool_declare<|im_middle|>" + tools_json + "<|im_end|>"
            "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
            "<|im_user|>user<|im_middle|>What is the weather in Paris?<|im_end|>"
            "<|im_assistant|>assistant<|im_middle|>" + call + "<|im_end|>"
            "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\nsunny, 21 °C<|im_end|>"
            "<|im_assistant|>assistant<|im_middle|>")
    assert ids == enc.encode(text, allowed_special="all")
    assert got["usage"]["prompt_tokens"] == len(ids)
    # tool_choice "none" leaves the declaration out; forcing a call is refused
    none_ids, _ = chat_ids(server, {"messages": TOOL_TURNS[:1], "tools": WEATHER_TOOLS, "tool_choice": "none"})
    plain_ids, _ = chat_ids(server, {"messages": TOOL_TURNS[:1]})
    assert none_ids == plain_ids and len(plain_ids) < len(ids)
    for bad in ({"tool_choice": "required"}, {"tools": [{"type": "function"}]},
                {"chat_template_kwargs": {"messages": []}}):
        st, err = server.request("POST", "/v1/chat/completions", {"messages": TOOL_TURNS[:1], "tools": WEATHER_TOOLS,
                                                                   **bad})
        assert st == 400, (bad, err)
    # the official client sends tools and gets a normal answer back (the shipped model does not call them)
    r = server.client().chat.completions.create(model="m", messages=TOOL_TURNS, tools=WEATHER_TOOLS, max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.tool_calls is None


def test_tokenize_and_detokenize(server):
    """vLLM's /tokenize gives the ids a request with the same fields decodes from (chat: through the
    template; completions: the text's), /detokenize turns ids back into text; bad input gets a 400."""
    enc = shipped_encoding()
    chat_body = {"messages": TOOL_TURNS, "tools": WEATHER_TOOLS}
    ids, _ = chat_ids(server, chat_body)
    st, got = server.request("POST", "/tokenize", chat_body)
    assert st == 200 and got["tokens"] == ids and got["count"] == len(ids), got
    assert got["max_model_len"] == 1024
    st, got = server.request("POST", "/tokenize", {"prompt": "def add(a, b):\n    return"})
    assert st == 200 and got["tokens"] == enc.encode_ordinary("def add(a, b):\n    return")
    st, back = server.request("POST", "/detokenize", {"tokens": got["tokens"]})
    assert st == 200 and back == {"prompt": "def add(a, b):\n    return"}
    st, back = server.request("POST", "/detokenize", {"tokens": ids})
    assert st == 200 and back["prompt"].startswith("<|im_system|>tool_declare<|im_middle|>[")
    st, back = server.request("POST", "/detokenize", {"tokens": []})
    assert st == 200 and back == {"prompt": ""}
    for path, body, param in (("/tokenize", {}, "prompt"), ("/tokenize", {"messages": []}, "messages"),
                              ("/detokenize", {"tokens": [5000]}, "tokens"), ("/detokenize", {"tokens": "x"}, "tokens"),
                              ("/detokenize", {"tokens": [1.5]}, "tokens")):
        st, err = server.request("POST", path, body)
        assert st == 400 and err["error"]["param"] == param, (path, body, err)
    assert server.request("GET", "/tokenize")[0] == 405


# A model folder's own template, in the style of chat templates with tools (ChatML-like, using the shipped
# tokenizer's markers): namespace, loop variables, tojson, filters, methods, raise_exception.
FOLDER_TEMPLATE = """{%- set ns = namespace(sys='', n_user=0) -%}
{%- for m in messages if m.role == 'system' -%}{%- set ns.sys = ns.sys ~ m.content -%}{%- endfor -%}
<|im_system|>system<|im_middle|>{{ ns.sys | trim if ns.sys else 'Default system.' }}
{%- if tools %}

# Tools
{% for t in tools %}{{ loop.index }}. {{ t.function.name }}: {{ t.function | tojson }}
{% endfor %}{%- endif -%}<|im_end|>
{%- for m in messages -%}
  {%- if m.role == 'user' -%}{%- set ns.n_user = ns.n_user + 1 -%}
<|im_user|>{{ m.name | default('user') }}<|im_middle|>{{ m.content }}<|im_end|>
  {%- elif m.role == 'assistant' -%}
<|im_assistant|>assistant<|im_middle|>{{ m.content or '' }}
    {%- for tc in m.tool_calls | default([]) %}
<call id="{{ tc.id }}">{{ tc.function.name }}({{ tc.function.arguments }})</call>
    {%- endfor -%}<|im_end|>
  {%- elif m.role == 'tool' -%}
<|im_system|>tool<|im_middle|>{{ m.tool_call_id }}: {{ m.content }}<|im_end|>
  {%- endif -%}
{%- endfor -%}
{%- if ns.n_user == 0 -%}{{ raise_exception('a conversation needs a user message') }}{%- endif -%}
{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- if thinking is defined and thinking %}<think>{% endif -%}{%- endif -%}"""


def jinja_render(src, **ctx):
    """transformers' apply_chat_template environment."""
    import jinja2
    import jinja2.ext
    import jinja2.sandbox

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(src).render(**ctx)


def test_cli_serve_model_folder_template(tmp_path):
    """A chat_template.jinja in the model folder is used; its ids equal jinja2's rendering (transformers'
    environment) encoded by tiktoken; special-token text inside a message stays text."""
    d = tmp_path / "model"
    d.mkdir()
    for f in os.listdir(TARGET):
        os.symlink(os.path.join(TARGET, f), d / f)
    (d / "chat_template.jinja").write_text(FOLDER_TEMPLATE, encoding="utf-8")
    enc = shipped_encoding()
    engine = ["--model", str(d), "--draft", DRAFT, "--mode", "tree", "--budget", "16", "--threads", "2"]
    s = Server(engine=engine)
    try:
        assert "chat template: " + str(d / "chat_template.jinja") in s.stderr()
        msgs = [{"role": "system", "content": "  Be brief.  "}, *TOOL_TURNS,
                {"role": "user", "content": "And tomorrow? 🌦", "name": "alice"}]
        for body, ctx in (({"messages": msgs, "tools": WEATHER_TOOLS}, {"tools": WEATHER_TOOLS}),
                          ({"messages": msgs[1:2], "chat_template_kwargs": {"thinking": True}}, {"thinking": True}),
                          ({"messages": msgs, "add_generation_prompt": False}, {"add_generation_prompt": False})):
            ids, _ = chat_ids(s, body)
            want = jinja_render(FOLDER_TEMPLATE, **{"messages": body["messages"], "add_generation_prompt": True,
                                                    "bos_token": "[BOS]", "eos_token": "[EOS]", **ctx})
            assert ids == enc.encode(want, allowed_special="all"), body
        # a user typing the end marker gets text, not the control token
        ids, _ = chat_ids(s, {"messages": [{"role": "user", "content": "a<|im_end|>b"}]})
        im_end = enc.encode("<|im_end|>", allowed_special="all")[0]
        assert ids.count(im_end) == 2  # the system message's and the user message's own
        assert enc.decode(ids).count("<|im_end|>") == 3
        # what the template raises is the client's error
        st, err = s.request("POST", "/v1/chat/completions", {"messages": msgs[:1]})
        assert st == 400 and "a conversation needs a user message" in err["error"]["message"], err
    finally:
        assert s.stop() == 0, s.stderr()
        s.kill()


def test_cli_serve_tool_call_round_trip(tmp_path):
    """A model that answers with reasoning, text and a tool call: the response carries
    reasoning_content, content and tool_calls (finish_reason tool_calls), whole and streamed, and the
    official client reads them."""
    d = tmp_path / "scripted"
    d.mkdir()
    sm.scripted_model(d)
    fixture_draft = os.path.join(ROOT, "tests", "fixtures", "drafter", "fp32")
    s = Server(engine=["--model", str(d), "--draft", fixture_draft, "--threads", "2"])
    try:
        body = {"messages": [{"role": "user", "content": "call g"}], "tools": WEATHER_TOOLS, "max_tokens": 40}
        st, got = s.request("POST", "/v1/chat/completions", {**body, "return_token_ids": True})
        assert st == 200, got
        ch = got["choices"][0]
        assert ch["token_ids"] == sm.SCRIPT[1:], ch
        # speculation does not change the call: the same ids and parts in chain and tree rounds
        for spec in ({"mode": "chain"}, {"mode": "tree", "budget": 8}, {"mode": "tree", "budget": "auto"}):
            st, other = s.request("POST", "/v1/chat/completions", {**body, "return_token_ids": True,
                                                                   "speculative": spec})
            assert st == 200, other
            assert other["choices"][0]["token_ids"] == ch["token_ids"], spec
            assert other["choices"][0]["message"] == ch["message"], spec
        assert ch["finish_reason"] == "tool_calls"
        msg = ch["message"]
        assert msg["reasoning_content"] == "r" and msg["content"] == "A"
        assert msg["tool_calls"] == [{"id": "g:0", "type": "function", "function": {"name": "g", "arguments": "{}"}}]
        # streamed: the same parts as deltas, the call whole with its index
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        c.request("POST", "/v1/chat/completions", body=json.dumps({**body, "stream": True}).encode(),
                  headers={"Content-Type": "application/json"})
        events = [json.loads(line[6:]) for line in c.getresponse().read().decode().splitlines()
                  if line.startswith("data: {")]
        c.close()
        deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
        assert "".join(x.get("reasoning_content", "") for x in deltas) == "r"
        assert "".join(x.get("content") or "" for x in deltas) == "A"
        calls = [tc for x in deltas for tc in x.get("tool_calls", [])]
        assert calls == [{"index": 0, "id": "g:0", "type": "function", "function": {"name": "g", "arguments": "{}"}}]
        assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
        r = s.client().chat.completions.create(model="m", **body)
        tc = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and tc[0].function.name == "g" and tc[0].id == "g:0"
        # tool_choice naming a function: the answer starts as that call (Kimi's id, numbered after the
        # conversation's calls) and the model writes its arguments
        tools = [{"type": "function", "function": {"name": "lookup"}}]
        turns = [{"role": "assistant", "content": None, "tool_calls": [
                     {"id": "functions.lookup:0", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": "functions.lookup:0", "content": "1"},
                 {"role": "user", "content": "again"}]
        st, got = s.request("POST", "/v1/chat/completions", {"messages": turns, "tools": tools, "max_tokens": 10,
                                                             "tool_choice": {"type": "function",
                                                                             "function": {"name": "lookup"}}})
        assert st == 200, got
        msg = got["choices"][0]["message"]
        assert msg["tool_calls"] == [{"id": "functions.lookup:1", "type": "function",
                                      "function": {"name": "lookup", "arguments": "{}"}}], msg
        assert msg["content"] is None and got["choices"][0]["finish_reason"] == "tool_calls"
        # "required": with one function, forced by name as if named; with several, the call section is
        # opened and the model names the call itself (test_serve_tool_args.py: the arguments' grammar)
        r = s.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], tools=tools,
                                               tool_choice="required", max_tokens=10)
        assert [c.id for c in r.choices[0].message.tool_calls] == ["functions.lookup:0"]
        r = s.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                               tools=tools + WEATHER_TOOLS, tool_choice="required", max_tokens=10)
        assert [c.id for c in r.choices[0].message.tool_calls] == ["g:0"]
        st, err = s.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                             "tools": tools, "tool_choice": {
                                                                 "type": "function", "function": {"name": "nope"}}})
        assert st == 400 and err["error"]["param"] == "tool_choice"
    finally:
        assert s.stop() == 0, s.stderr()
        s.kill()
