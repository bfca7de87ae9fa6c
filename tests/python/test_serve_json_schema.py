"""`ddtree serve` response_format {"type": "json_schema"} with the shipped pair on the CPU: a finished
answer's content is json.loads-able and an instance of the schema (checked by the small validator
below, which knows exactly the subset the server enforces), greedy ar and tree requests give the same
token ids (the schema's masks keep speculation lossless), in completions and chat; and schemas outside
the subset, or a malformed json_schema field, get a 400 naming response_format, the keyword and its
path.  Needs DDT_BUILD_DIR."""

import json

import pytest

# the JSON-mode tests' prompts, server (a module-scoped fixture: one server per module) and post
from test_serve_json import PROMPTS, post, server  # noqa: F401

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string"},
                         "version": {"type": "integer"},
                         "debug": {"type": "boolean"},
                         "level": {"enum": ["low", "high"]},
                         "ratio": {"type": "number"},
                         "extra": {"type": "null"},
                         "pos": {"type": "object", "properties": {"x": {"type": "integer"}}},
                         "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "version"], "additionalProperties": False}


# bounded types only: the shipped model (which likes long runs of whitespace) finishes these in budget
SMALL = {"type": "object", "properties": {"ok": {"type": "boolean"}, "level": {"enum": ["low", "high"]},
                                          "n": {"type": "integer"}}}


def fmt(schema):
    return {"type": "json_schema", "json_schema": {"name": "t", "strict": True, "schema": schema}}


def valid(v, s):
    """Whether v is an instance of s, for the subset the server accepts (all properties, in order)."""
    if "enum" in s:
        return isinstance(v, str) and v in s["enum"]
    t = s["type"]
    if t == "object":
        return isinstance(v, dict) and list(v) == list(s["properties"]) and \
            all(valid(v[k], sub) for k, sub in s["properties"].items())
    if t == "array":
        return isinstance(v, list) and all(valid(x, s["items"]) for x in v)
    if t == "string":
        return isinstance(v, str)
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "boolean":
        return isinstance(v, bool)
    return v is None


def test_validator_can_fail():
    good = {"name": "a", "version": 1, "debug": True, "level": "low", "ratio": 0.5, "extra": None,
            "pos": {"x": 1}, "tags": ["q"]}
    assert valid(good, SCHEMA)
    for bad in ({**good, "version": 1.5}, {**good, "level": "mid"}, {k: good[k] for k in list(good)[1:]},
                {**good, "more": 1}, {**good, "pos": {"x": "1"}}, {**good, "tags": [1]}, {**good, "debug": 1}):
        assert not valid(bad, SCHEMA), bad
    swapped = dict(reversed(list(good.items())))
    assert not valid(swapped, SCHEMA)


@pytest.mark.parametrize("schema", [SCHEMA, SMALL], ids=["every-type", "small"])
def test_completions_schema_instances_lossless(server, schema):
    finished = 0
    for prompt in PROMPTS:
        ref = None
        for spec in ({"mode": "ar"}, {"mode": "tree", "budget": 16}):
            got = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 200, "response_format": fmt(schema),
                                                   "return_token_ids": True, "speculative": spec})
            choice = got["choices"][0]
            if ref is None:
                ref = choice
            assert choice["token_ids"] == ref["token_ids"], spec
            assert choice["text"] == ref["text"]
        assert ref["text"].startswith('{"')
        if ref["finish_reason"] == "stop":
            doc = json.loads(ref["text"])
            assert valid(doc, schema), ref["text"]
            finished += 1
        else:
            assert ref["finish_reason"] == "length"
            # a cut answer still names the first property first
            assert ref["text"].startswith('{"' + next(iter(schema["properties"])) + '"')
    # the point of the small schema: answers finish (2 of 3 at the time of writing)
    assert finished >= (1 if schema is SMALL else 0)


def test_chat_schema_small(server):
    small = SMALL
    msgs = [{"role": "user", "content": "Answer in JSON."}]
    ref = None
    for spec in ({"mode": "ar"}, {"mode": "tree", "budget": 16}):
        got = post(server, "/v1/chat/completions", {"messages": msgs, "max_tokens": 120, "response_format": fmt(small),
                                                    "return_token_ids": True, "speculative": spec})
        choice = got["choices"][0]
        ref = ref or choice
        assert choice["token_ids"] == ref["token_ids"], spec
    content = ref["message"]["content"]
    if ref["finish_reason"] == "stop":
        assert valid(json.loads(content), small), content
    else:
        assert content.startswith('{"ok"') or content.startswith("{")


def test_refused_schemas(server):
    base = {"type": "object", "properties": {"a": {"type": "integer"}}}
    cases = [
        (fmt({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}}),
         "unsupported keyword 'minimum' at $.properties.a"),
        (fmt({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}], "type": "string"}}}),
         "unsupported keyword 'anyOf' at $.properties.a"),
        (fmt({"type": "object", "properties": {"a": {"$ref": "#/defs/x"}}}), "at $.properties.a has no 'type'"),
        (fmt({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string", "pattern": "x"}}}}),
         "unsupported keyword 'pattern' at $.properties.a.items"),
        (fmt({"type": "object", "properties": {"a": {"type": ["string", "null"]}}}), "'type' at $.properties.a is a list"),
        (fmt({"type": "object", "properties": {"a": {"enum": [1, 2]}}}), "item 0 is not a string"),
        (fmt({"type": "array", "items": {"type": "string"}}), "root schema must have \"type\": \"object\""),
        (fmt({"type": "object"}), "object at $ has no 'properties'"),
        (fmt({**base, "required": ["b"]}), "'required' at $ names \"b\""),
        ({"type": "json_schema"}, "needs a 'json_schema' object"),
        ({"type": "json_schema", "json_schema": {"schema": base}}, "json_schema.name"),
        ({"type": "json_schema", "json_schema": {"name": "t", "schema": base, "extra": 1}}, "unknown field 'extra'"),
    ]
    for rf, words in cases:
        st, got = server.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 4, "response_format": rf})
        assert st == 400, got
        assert got["error"]["param"] == "response_format" and words in got["error"]["message"], (words, got)
