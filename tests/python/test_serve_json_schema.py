"""`ddtree serve` response_format {"type": "json_schema"} with the shipped pair on the CPU: a finished
answer's content is json.loads-able and an instance of the schema (checked by schema_valid.py, a
validator written from JSON Schema's rules, and in the declared property order the recogniser keeps),
greedy ar and tree requests give the same token ids (the schema's masks keep speculation lossless), in
completions and chat, for schemas across the subset (optional properties, type lists, scalar enums,
anyOf, $ref / $defs recursion, array and string bounds); and schemas outside the subset, or a
malformed json_schema field, get a 400 naming response_format, the keyword and its path.  Needs
DDT_BUILD_DIR."""

import json

import pytest

# the JSON-mode tests' prompts, server (a module-scoped fixture: one server per module) and post
from schema_valid import strict, valid
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
                                          "n": {"type": "integer"}},
         "required": ["ok", "level", "n"]}

# the extended subset, one schema each, all properties optional unless listed
OPTIONAL = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": ["boolean", "null"]},
                                             "c": {"enum": [1, 2.5, "x", True, None]}, "d": {"const": "k"}}}
UNIONS = {"type": "object",
          "properties": {"v": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"},
                                         {"type": "object", "properties": {"k": {"type": "integer"}},
                                          "required": ["k"]}]},
                         "w": {"oneOf": [{"type": "boolean"}, {"type": "array", "items": {"type": "integer"},
                                                                "minItems": 1, "maxItems": 2}]}},
          "required": ["v", "w"]}
RECURSIVE = {"$defs": {"node": {"type": "object",
                                "properties": {"v": {"type": "integer"},
                                               "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
                                "required": ["v", "next"]}},
             "$ref": "#/$defs/node"}
BOUNDS = {"type": "object", "properties": {"s": {"type": "string", "minLength": 1, "maxLength": 6},
                                           "l": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
          "required": ["s", "l"]}
EXTENDED = {"optional": OPTIONAL, "unions": UNIONS, "recursive": RECURSIVE, "bounds": BOUNDS}


def fmt(schema):
    return {"type": "json_schema", "json_schema": {"name": "t", "strict": True, "schema": schema}}


def test_validator_can_fail():
    good = {"name": "a", "version": 1, "debug": True, "level": "low", "ratio": 0.5, "extra": None,
            "pos": {"x": 1}, "tags": ["q"]}
    assert valid(good, SCHEMA) and strict(good, SCHEMA)
    assert strict({"name": "a", "version": 1}, SCHEMA)  # the others are optional
    for bad in ({**good, "version": 1.5}, {**good, "level": "mid"}, {k: good[k] for k in list(good)[1:]},
                {**good, "more": 1}, {**good, "pos": {"x": "1"}}, {**good, "tags": [1]}, {**good, "debug": 1}):
        assert not valid(bad, SCHEMA), bad
    swapped = dict(reversed(list(good.items())))
    assert valid(swapped, SCHEMA) and not strict(swapped, SCHEMA)  # JSON Schema ignores the order
    assert valid({"v": 1, "next": {"v": 2, "next": None}}, RECURSIVE)
    assert not valid({"v": 1, "next": {"v": 2}}, RECURSIVE)
    assert not valid({"v": "", "w": [1, 2, 3]}, UNIONS) and not valid({"v": 1, "w": True}, UNIONS)
    assert not valid({"s": "", "l": []}, BOUNDS) and not valid({"d": "j"}, OPTIONAL)


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
            assert valid(doc, schema) and strict(doc, schema), ref["text"]
            finished += 1
        else:
            assert ref["finish_reason"] == "length"
            # a cut answer still names the first property first (both schemas require it)
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
        assert strict(json.loads(content), small), content
    else:
        assert content.startswith('{"ok"')


@pytest.mark.parametrize("name", list(EXTENDED))
def test_extended_schemas_lossless(server, name):
    """Greedy ar and tree give the same ids under each extended schema, in completions and chat, and a
    finished answer is an instance (in declared order)."""
    schema = EXTENDED[name]
    finished = 0
    requests = [("/v1/completions", {"prompt": p}) for p in PROMPTS[:2]] + \
        [("/v1/chat/completions", {"messages": [{"role": "user", "content": "Answer in JSON."}]})]
    for path, body in requests:
        ref = None
        for spec in ({"mode": "ar"}, {"mode": "tree", "budget": 16}):
            got = post(server, path, {**body, "max_tokens": 120, "response_format": fmt(schema),
                                      "return_token_ids": True, "speculative": spec})
            choice = got["choices"][0]
            ref = ref or choice
            assert choice["token_ids"] == ref["token_ids"], (path, spec)
        text = ref["text"] if "text" in ref else ref["message"]["content"]
        assert text.startswith("{")
        if ref["finish_reason"] == "stop":
            doc = json.loads(text)
            assert valid(doc, schema) and strict(doc, schema), text
            finished += 1
        else:
            assert ref["finish_reason"] == "length"
    # every schema here has short instances; the shipped model finishes at least one of three
    assert finished >= 1, name


def test_refused_schemas(server):
    base = {"type": "object", "properties": {"a": {"type": "integer"}}}
    cases = [
        (fmt({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}}),
         "unsupported keyword 'minimum' at $.properties.a"),
        (fmt({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}], "type": "string"}}}),
         "'type' beside 'anyOf' at $.properties.a"),
        (fmt({"type": "object", "properties": {"a": {"anyOf": [{"type": "integer"}, {"type": "number"}]}}}),
         "'anyOf' at $.properties.a: branches 0 and 1 can both start with a number"),
        (fmt({"type": "object", "properties": {"a": {"oneOf": [{"type": "string"}, {"enum": ["x", None]}]}}}),
         "'oneOf' at $.properties.a: branches 0 and 1 can both start with a string"),
        (fmt({"type": "object", "properties": {"a": {"$ref": "#/defs/x"}}}),
         "'$ref' at $.properties.a: \"#/defs/x\" points to nothing"),
        (fmt({"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}}),
         "'$ref' at $.properties.a is \"https://example.com/s.json\" (only references inside the schema"),
        (fmt({"type": "object", "properties": {"a": {"$ref": "#/$defs/d"}}, "$defs": {"d": {"type": "string",
                                                                                          "format": "date"}}}),
         "unsupported keyword 'format' at $.$defs.d"),
        (fmt({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}]}}}),
         "the schema at $.properties.a has no 'type'"),
        (fmt({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string", "pattern": "x"}}}}),
         "unsupported keyword 'pattern' at $.properties.a.items"),
        (fmt({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "null"},
                                                     "uniqueItems": True}}}),
         "unsupported keyword 'uniqueItems' at $.properties.a"),
        (fmt({"type": "object", "properties": {}, "patternProperties": {"x": {"type": "null"}}}),
         "unsupported keyword 'patternProperties' at $"),
        (fmt({"type": "object", "properties": {"a": {"enum": [[1]]}}}), "'enum' at $.properties.a: item 0 is an array"),
        (fmt({"type": "object", "properties": {"self": {"$ref": "#"}}, "required": ["self"]}),
         "every instance of the schema nests containers deeper than 8"),
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
