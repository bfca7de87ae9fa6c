#!/usr/bin/env python3
"""serve-compare.py — the same greedy requests to two `ddtree serve` engines, token ids compared.

Made for the GPU machine (stdlib only: it has no pip), where it checks that a one-GPU server answers
JSON mode (response_format json_object), tool calls whose arguments follow the function's schema,
logit_bias, the penalties and per-request speculation (ar, chain, tree 8 / 16) with the tokens a CPU
server gives (both walk the same rules over the same
greedy choices; tests/cuda/test_cuda_target.c checks the engine itself):

    python3 scripts/serve-compare.py --build $DDT_BIN --a "--backend cpu" --b "--backend cuda"

Each engine is the shipped pair in tree mode, budget 16 (plus the --a / --b arguments), its target folder
linked into a temporary one whose tokenizer_config names Kimi's tool-call markers.  Per request
it prints one line; it exits 1 when any request differs between the two or fails its own check (the
JSON parses, the biased id is absent, the call's arguments are an object), 2 when a server does not
start.  tests/python/test_serve_compare.py runs it on two CPU engines (ar against tree).
"""

import argparse
import http.client
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(ROOT, "models", "pystdlib-target")
DRAFT = os.path.join(ROOT, "models", "pystdlib-dflash")
JSON_PROMPTS = ['CONFIG = {"name": "json", "version": 2, "debug": false}\nDEFAULTS = ',
                "def to_dict(self):\n    return "]
RULE_PROMPTS = ["for i in range(10):\n    for j in range(10):\n        ",
                "def parse_args(argv):\n    parser = "]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]


# Kimi's tool-call markers at ids the shipped tokenizer reserves (tests/python/test_serve_tool_args.py
# does the same): the untrained ids are only ever forced into the prompt or by the grammar
TOOL_MARKERS = {4107: "<|tool_calls_section_begin|>", 4108: "<|tool_calls_section_end|>",
                4109: "<|tool_call_begin|>", 4110: "<|tool_call_argument_begin|>", 4111: "<|tool_call_end|>"}


def target_with_markers(d):
    """The shipped target's folder in d (links), its tokenizer_config naming the tool markers."""
    for f in os.listdir(TARGET):
        if f != "tokenizer_config.json":
            os.symlink(os.path.join(TARGET, f), os.path.join(d, f))
    with open(os.path.join(TARGET, "tokenizer_config.json")) as f:
        cfg = json.load(f)
    for i, t in TOOL_MARKERS.items():
        cfg["added_tokens_decoder"][str(i)] = {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                               "single_word": False, "special": True}
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
    return d


class Server:
    def __init__(self, ddtree, model, extra, threads):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="serve-compare-", suffix=".log", delete=False)
        cmd = [ddtree, "serve", "--model", model, "--draft", DRAFT, "--mode", "tree", "--budget", "16",
               "--threads", str(threads), "--port", "0", *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log)
        self.port = None
        deadline = time.time() + 180
        while time.time() < deadline and self.proc.poll() is None:
            m = re.search(r"listening on http://[0-9.]+:(\d+)", self.stderr())
            if m:
                self.port = int(m.group(1))
                break
            time.sleep(0.05)
        if self.port is None:
            self.stop()
            sys.exit(f"serve-compare: {' '.join(cmd)} did not start:\n{self.stderr()}")

    def stderr(self):
        with open(self.log.name) as f:
            return f.read()

    def post(self, path, body):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        headers = {k.lower(): v for k, v in r.getheaders()}
        c.close()
        try:
            got = json.loads(raw)
        except ValueError:
            got = raw.decode("utf-8", "replace")
        return r.status, got, headers

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        os.unlink(self.log.name)


def cases():
    """(name, path, body, check) for each request; check(choice, headers) -> error text or None."""
    out = []
    for i, p in enumerate(JSON_PROMPTS):
        def json_ok(ch, _h):
            text = ch["text"]
            if not text.startswith("{"):
                return f"not an object: {text[:40]!r}"
            if ch["finish_reason"] == "stop":
                try:
                    if not isinstance(json.loads(text), dict):
                        return "not an object"
                except ValueError as e:
                    return f"no JSON: {e}"
            return None
        out.append((f"json_object {i}", "/v1/completions",
                    {"prompt": p, "max_tokens": 160, "response_format": {"type": "json_object"}}, json_ok))
    for i, p in enumerate(RULE_PROMPTS):
        out.append((f"penalties {i}", "/v1/completions",
                    {"prompt": p, "max_tokens": 64, "frequency_penalty": 1.5, "presence_penalty": 0.5,
                     "repetition_penalty": 1.2}, None))
    tool_body = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "max_tokens": 120,
                 "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}

    def tool_ok(ch, h):
        calls = ch.get("message", {}).get("tool_calls") or []
        if not calls:
            return f"no tool call ({ch.get('finish_reason')})"
        if h.get("x-ddtree-tool-arguments") != "schema":
            return f"arguments held to {h.get('x-ddtree-tool-arguments')!r}, not the schema"
        if ch.get("finish_reason") == "tool_calls":
            try:
                if not isinstance(json.loads(calls[0]["function"]["arguments"]), dict):
                    return "arguments not an object"
            except ValueError as e:
                return f"arguments no JSON: {e}"
        return None
    out.append(("forced tool call", "/v1/chat/completions", tool_body, tool_ok))
    # per-request speculation: every mode's greedy ids are the same (a GPU engine switches its graphs)
    for spec in ({"mode": "ar"}, {"mode": "chain"}, {"mode": "tree", "budget": 8}, {"mode": "tree", "budget": 16}):
        name = "speculative " + spec["mode"] + (f" {spec['budget']}" if "budget" in spec else "")
        out.append((name, "/v1/completions", {"prompt": RULE_PROMPTS[0], "max_tokens": 64, "speculative": spec},
                    None))
    return out


def choice_ids(got):
    ch = got["choices"][0]
    if "token_ids" in ch:
        return ch["token_ids"]
    return json.dumps(ch.get("message"), sort_keys=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True, help="the folder holding the ddtree binary")
    ap.add_argument("--a", default="--backend cpu", help="engine A's extra serve arguments")
    ap.add_argument("--b", default="--backend cuda", help="engine B's extra serve arguments")
    ap.add_argument("--threads", type=int, default=max(1, min(16, os.cpu_count() or 1)))
    args = ap.parse_args()
    ddtree = os.path.join(args.build, "ddtree")
    model = target_with_markers(tempfile.mkdtemp(prefix="serve-compare-model-"))
    servers = [Server(ddtree, model, shlex.split(x), args.threads) for x in (args.a, args.b)]
    bad = 0
    try:
        # the bias: against the plain answer's first token
        st, plain, _ = servers[0].post("/v1/completions", {"prompt": RULE_PROMPTS[1], "max_tokens": 48,
                                                           "return_token_ids": True, "temperature": 0})
        top = plain["choices"][0]["token_ids"][0] if st == 200 else 0
        extra = [("logit_bias", "/v1/completions",
                  {"prompt": RULE_PROMPTS[1], "max_tokens": 48, "logit_bias": {str(top): -100, "32": 3}},
                  lambda ch, _h: f"biased-out id {top} emitted" if top in ch["token_ids"] else None)]
        for name, path, body, check in cases() + extra:
            body = dict(body, temperature=0)
            if path == "/v1/completions":
                body["return_token_ids"] = True
            res = [s.post(path, body) for s in servers]
            errs = []
            for (st, got, h), tag in zip(res, "AB"):
                if st != 200:
                    errs.append(f"{tag}: HTTP {st} {str(got)[:200]}")
                elif check:
                    e = check(got["choices"][0], h)
                    if e:
                        errs.append(f"{tag}: {e}")
            if not errs and choice_ids(res[0][1]) != choice_ids(res[1][1]):
                errs.append("A and B differ")
            n = len(res[0][1]["choices"][0].get("token_ids", [])) if res[0][0] == 200 else 0
            print(f"{name:20s} {'ok' if not errs else 'FAIL'}  ({n} tokens){'  ' + '; '.join(errs) if errs else ''}")
            bad += bool(errs)
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(model, ignore_errors=True)
    print(f"serve-compare: {bad} of the requests failed" if bad else "serve-compare: all requests agree")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
