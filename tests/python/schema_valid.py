"""schema_valid.py — a JSON Schema validator for the subset that response_format json_schema accepts
(src/text/json_schema.h), written for the tests from JSON Schema's own rules, keyword by keyword, so
that it shares nothing with the C compiler: `valid` says whether a value is an instance.  `strict`
adds what the recogniser asks beyond the schema (and so what every document it lets through also
has): an object's properties in their declared order and no others, containers nested at most
SCHEMA_MAX_DEPTH deep.  `canonical` writes a value as the recogniser expects enum numbers."""

import json

SCHEMA_MAX_DEPTH = 8  # DDT_JSON_SCHEMA_MAX_DEPTH


def resolve(ref, root):
    """The schema a local "$ref" ("#" or "#/a/b", ~0 / ~1 escapes) points at."""
    assert ref == "#" or ref.startswith("#/"), ref
    node = root
    for part in ref[2:].split("/") if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def has_type(v, t):
    if t == "object":
        return isinstance(v, dict)
    if t == "array":
        return isinstance(v, list)
    if t == "string":
        return isinstance(v, str)
    if t == "integer":  # JSON Schema: a number with no fraction, 2.0 included
        return is_number(v) and float(v).is_integer()
    if t == "number":
        return is_number(v)
    if t == "boolean":
        return isinstance(v, bool)
    assert t == "null", t
    return v is None


def same(a, b):
    """JSON equality: numbers by value, true is not 1."""
    if is_number(a) and is_number(b):
        return a == b
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b
    return type(a) is type(b) and a == b


def valid(v, s, root=None, strict=False, depth=0):
    root = s if root is None else root
    if "$ref" in s:
        return valid(v, resolve(s["$ref"], root), root, strict, depth)
    if "anyOf" in s:
        return any(valid(v, b, root, strict, depth) for b in s["anyOf"])
    if "oneOf" in s:
        return sum(valid(v, b, root, strict, depth) for b in s["oneOf"]) == 1
    if "const" in s and not same(v, s["const"]):
        return False
    if "enum" in s and not any(same(v, e) for e in s["enum"]):
        return False
    if "type" in s:
        types = [s["type"]] if isinstance(s["type"], str) else s["type"]
        if not any(has_type(v, t) for t in types):
            return False
    if isinstance(v, (dict, list)) and strict and depth + 1 > SCHEMA_MAX_DEPTH:
        return False
    if isinstance(v, dict) and "properties" in s:
        props = s["properties"]
        if not all(k in v for k in s.get("required", [])):
            return False
        if s.get("additionalProperties", True) is False and any(k not in props for k in v):
            return False
        if strict:
            order = list(props)
            at = [order.index(k) if k in props else -1 for k in v]
            if -1 in at or at != sorted(at):
                return False
        if not all(valid(x, props[k], root, strict, depth + 1) for k, x in v.items() if k in props):
            return False
    if isinstance(v, list) and "items" in s:
        if len(v) < s.get("minItems", 0) or len(v) > s.get("maxItems", len(v)):
            return False
        if not all(valid(x, s["items"], root, strict, depth + 1) for x in v):
            return False
    if isinstance(v, str):
        if len(v) < s.get("minLength", 0) or len(v) > s.get("maxLength", len(v)):
            return False
    return True


def strict(v, s):
    return valid(v, s, strict=True)


def canonical(v, **kw):
    """json.dumps, whole reals below 1e17 written as integers (the recogniser's enum form; JSON Schema
    reads 2 and 2.0 as one value)."""
    def fix(x):
        if isinstance(x, float) and x.is_integer() and abs(x) < 1e17:
            return int(x)
        if isinstance(x, dict):
            return {k: fix(y) for k, y in x.items()}
        if isinstance(x, list):
            return [fix(y) for y in x]
        return x
    return json.dumps(fix(v), **kw)
