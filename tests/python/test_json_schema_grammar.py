"""The JSON recogniser following a compiled schema (src/text/json_schema.h, json_grammar.h, through
libddtree.so and Jansson) against schema_valid.py, a validator written from JSON Schema's rules, on
schemas that use the whole subset (optional properties, type lists, scalar enum / const, anyOf /
oneOf, $ref / $defs with recursion, minItems / maxItems, minLength / maxLength):
  - random instances (in declared order, enum numbers canonical) are accepted byte by byte;
  - value-level mutations (a property dropped, added or moved, a value replaced, an item added or
    removed) are accepted exactly when the mutant is still a strict instance (schema_valid.strict);
  - byte-level mutations and the recogniser's own random walks, when complete, are instances;
  - no prefix the recogniser lets through is a dead end.
Needs DDT_BUILD_DIR."""

import ctypes
import json
import random

import pytest

from schema_valid import canonical, resolve, strict, valid, SCHEMA_MAX_DEPTH
from test_json_grammar import State, mutate

SCHEMAS = {
    "optional": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"}, "idx": {"type": ["integer", "null"]}, "i": {"type": "string"},
            "kind": {"enum": ["a", "ab", 1, 2.5, -3, True, None]}, "c": {"const": "fixed"},
            "n": {"type": "number"}, "flag": {"type": "boolean", "description": "d"},
            "nested": {"type": "object", "properties": {"p": {"type": "integer"}, "q": {"const": False}},
                       "required": ["q"]},
        },
        "required": ["i", "c"],
    },
    "unions": {
        "type": "object",
        "properties": {
            "a": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}, {"type": "number"},
                            {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]}]},
            "b": {"oneOf": [{"const": True}, {"type": "array", "items": {"type": "integer"}, "maxItems": 2}]},
            "c": {"anyOf": [{"type": "integer"}, {"enum": ["p", "q"]}], "default": 1, "title": "C"},
            "d": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        },
        "required": ["a", "b", "c", "d"],
    },
    "list": {
        "$defs": {"node": {"type": "object",
                           "properties": {"v": {"type": "integer"},
                                          "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
                           "required": ["v", "next"]}},
        "$ref": "#/$defs/node",
    },
    "tree": {
        "type": "object",
        "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 4},
                       "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 3},
                       "meta": {"$ref": "#/definitions/meta"}},
        "required": ["name", "kids"],
        "definitions": {"meta": {"type": "object", "properties": {"w": {"type": "number"}}}},
    },
    "bounds": {
        "type": "object",
        "properties": {
            "a": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4},
            "s": {"type": "string", "minLength": 2, "maxLength": 5},
            "e": {"type": "array", "items": {"type": "string"}, "maxItems": 0},
            "m": {"type": "string", "minLength": 1},
            "g": {"type": "array", "items": {"type": "array", "items": {"type": "boolean"}, "minItems": 1},
                  "minItems": 1},
        },
        "required": ["a", "s", "e", "m", "g"],
    },
}

QUICK = __import__("os").environ.get("DDT_PYTEST_QUICK") == "1"


class Recogniser:
    def __init__(self, lib_path):
        self.L = L = ctypes.CDLL(lib_path)
        self.J = J = ctypes.CDLL("libjansson.so.4")
        J.json_loads.restype = ctypes.c_void_p
        J.json_loads.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p]
        J.json_delete.argtypes = [ctypes.c_void_p]
        L.ddt_json_schema_compile.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        L.ddt_json_schema_free.argtypes = [ctypes.c_void_p]
        L.ddt_json_init_schema.argtypes = [ctypes.POINTER(State), ctypes.c_void_p]
        L.ddt_json_step.argtypes = [ctypes.POINTER(State), ctypes.c_uint8]
        L.ddt_json_step.restype = ctypes.c_bool
        L.ddt_json_feed.argtypes = [ctypes.POINTER(State), ctypes.c_char_p, ctypes.c_size_t]
        L.ddt_json_feed.restype = ctypes.c_bool
        L.ddt_json_complete.argtypes = [ctypes.POINTER(State)]
        L.ddt_json_complete.restype = ctypes.c_bool
        self.compiled = []

    def compile(self, schema):
        """(the compiled schema or None, the error message)"""
        err = ctypes.create_string_buffer(4 + 512)  # ddt_error: status, msg[DDT_ERROR_MSG_MAX]
        jerr = ctypes.create_string_buffer(1024)   # json_error_t, with room to spare
        j = self.J.json_loads(json.dumps(schema).encode(), 1, jerr)  # JSON_REJECT_DUPLICATES
        assert j, jerr.raw
        out = ctypes.c_void_p()
        st = self.L.ddt_json_schema_compile(j, ctypes.byref(out), err)
        self.J.json_delete(j)
        if st:
            return None, err.raw[4:].split(b"\0")[0].decode()
        self.compiled.append(out)
        return out, ""

    def init(self, sc):
        s = State()
        self.L.ddt_json_init_schema(ctypes.byref(s), sc)
        return s

    def run(self, sc, data):
        """(every byte stepped, the document is complete)"""
        s = self.init(sc)
        ok = self.L.ddt_json_feed(ctypes.byref(s), data, len(data))
        return ok, ok and self.L.ddt_json_complete(ctypes.byref(s))

    def step(self, s, b):
        """The state after byte b, or None."""
        t = State.from_buffer_copy(s)
        return t if self.L.ddt_json_step(ctypes.byref(t), b) else None

    def complete(self, s):
        return self.L.ddt_json_complete(ctypes.byref(s))

    def close(self):
        for sc in self.compiled:
            self.L.ddt_json_schema_free(sc)


@pytest.fixture(scope="module")
def rec(libddtree_path):
    r = Recogniser(libddtree_path)
    yield r
    r.close()


@pytest.fixture(scope="module")
def compiled(rec):
    out = {}
    for name, schema in SCHEMAS.items():
        sc, msg = rec.compile(schema)
        assert sc, (name, msg)
        out[name] = sc
    return out


# ---------------------------------------------------------------------------- random instances

FAIL = object()
STRING_POOL = ["a", "Z", " ", '"', "\\", "/", "\n", "\x01", "é", "中", "x" * 3]  # no astral: a bounded string
# written with ensure_ascii would spell one as a surrogate pair, which such strings refuse


def gen(s, root, r, depth):
    """A random instance of s (FAIL where none fits the nesting left); depth: containers above it."""
    if "$ref" in s:
        return gen(resolve(s["$ref"], root), root, r, depth)
    for key in ("anyOf", "oneOf"):
        if key in s:
            branches = list(s[key])
            r.shuffle(branches)
            for b in branches:
                v = gen(b, root, r, depth)
                if v is not FAIL:
                    return v
            return FAIL
    if "const" in s:
        return s["const"]
    if "enum" in s:
        fits = [e for e in s["enum"] if valid(e, s, root)]
        return r.choice(fits)
    types = [s["type"]] if isinstance(s["type"], str) else list(s["type"])
    r.shuffle(types)
    for t in types:
        v = gen_type(t, s, root, r, depth)
        if v is not FAIL:
            return v
    return FAIL


def gen_type(t, s, root, r, depth):
    if t in ("object", "array") and depth + 1 > SCHEMA_MAX_DEPTH:
        return FAIL
    keep = 0.7 * (1 - depth / (SCHEMA_MAX_DEPTH + 1))  # optional parts thin out deeper down
    if t == "object":
        out = {}
        for k, sub in s["properties"].items():
            if k in s.get("required", []) or r.random() < keep:
                v = gen(sub, root, r, depth + 1)
                if v is FAIL and k in s.get("required", []):
                    return FAIL
                if v is not FAIL:
                    out[k] = v
        return out
    if t == "array":
        lo = s.get("minItems", 0)
        hi = min(s.get("maxItems", lo + 3), lo + 3)
        n = r.randint(lo, hi) if r.random() < keep or lo > 0 else 0
        items = []
        for _ in range(n):
            v = gen(s["items"], root, r, depth + 1)
            if v is FAIL:
                break
            items.append(v)
        return items if len(items) >= lo else FAIL
    if t == "string":
        lo = s.get("minLength", 0)
        hi = min(s.get("maxLength", lo + 6), lo + 6)
        return "".join(r.choice(STRING_POOL)[0] for _ in range(r.randint(lo, hi)))
    if t == "integer":
        return r.choice([0, -1, 7, 123456, -(2 ** 40)])
    if t == "number":
        return r.choice([0, 1.5, -2.25e-3, 1e100, 12, -0.5])
    if t == "boolean":
        return r.random() < 0.5
    assert t == "null"
    return None


def layout(r):
    return r.choice([dict(), dict(indent=2), dict(separators=(",", ":")), dict(separators=(" , ", " : "))])


def text_of(v, r):
    return canonical(v, ensure_ascii=r.random() < 0.5, **layout(r)).encode()


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_random_instances_accepted(rec, compiled, name):
    schema, sc = SCHEMAS[name], compiled[name]
    r = random.Random(name)
    made = 0
    for _ in range(60 if QUICK else 400):
        v = gen(schema, schema, r, 0)
        assert v is not FAIL
        assert valid(v, schema) and strict(v, schema), v  # the generator makes instances
        doc = text_of(v, r)
        assert rec.run(sc, doc) == (True, True), doc
        made += 1
    assert made > 0


# ---------------------------------------------------------------------------- mutations

OTHER_VALUES = [1, 1.5, -3, "x", "", "abcdefgh", None, True, False, [], {}, [1], [True], {"k": 1}, {"v": 1}]


def spots(v, path=()):
    """Every (path, value) in v, v itself first."""
    yield path, v
    if isinstance(v, dict):
        for k, x in v.items():
            yield from spots(x, path + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from spots(x, path + (i,))


def replaced(v, path, new):
    if not path:
        return new
    if isinstance(v, dict):
        return {k: (replaced(x, path[1:], new) if k == path[0] else x) for k, x in v.items()}
    return [replaced(x, path[1:], new) if i == path[0] else x for i, x in enumerate(v)]


def mutate_value(v, r):
    places = list(spots(v))
    path, at = r.choice(places)
    op = r.randrange(5)
    if op == 0 and isinstance(at, dict) and at:  # drop a property
        k = r.choice(list(at))
        return replaced(v, path, {a: b for a, b in at.items() if a != k})
    if op == 1 and isinstance(at, dict):  # add one, named like a real one or not
        names = [k for _, x in places if isinstance(x, dict) for k in x] + ["zz", "i"]
        return replaced(v, path, {**at, r.choice(names): r.choice(OTHER_VALUES)})
    if op == 2 and isinstance(at, dict) and len(at) > 1:  # move one
        items = list(at.items())
        i, j = r.sample(range(len(items)), 2)
        items[i], items[j] = items[j], items[i]
        return replaced(v, path, dict(items))
    if op == 3 and isinstance(at, list):  # an item more or fewer
        if at and r.random() < 0.5:
            return replaced(v, path, at[:-1])
        return replaced(v, path, at + [r.choice(at + OTHER_VALUES) if at else r.choice(OTHER_VALUES)])
    return replaced(v, path, r.choice(OTHER_VALUES)) if path else v


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_value_mutations_exact(rec, compiled, name):
    schema, sc = SCHEMAS[name], compiled[name]
    r = random.Random("m" + name)
    seen = {True: 0, False: 0}
    for _ in range(150 if QUICK else 1500):
        v = gen(schema, schema, r, 0)
        for _ in range(r.randrange(1, 3)):
            v = mutate_value(v, r)
        doc = canonical(v, ensure_ascii=False, **layout(r)).encode()
        want = strict(v, schema)
        got = rec.run(sc, doc)[1]
        assert got == want, (doc, want)
        if got:
            assert valid(v, schema)
        seen[want] += 1
    assert seen[True] > 20 and seen[False] > 20, seen


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_byte_mutations_sound(rec, compiled, name):
    schema, sc = SCHEMAS[name], compiled[name]
    r = random.Random("b" + name)
    accepted = 0
    for _ in range(150 if QUICK else 1500):
        doc = mutate(r, text_of(gen(schema, schema, r, 0), r))
        if rec.run(sc, doc)[1]:
            v = json.loads(doc.decode("utf-8", "surrogatepass"))
            assert valid(v, schema) and strict(v, schema), doc
            accepted += 1
    assert accepted > 5


# ---------------------------------------------------------------------------- the recogniser's own documents

@pytest.mark.parametrize("name", list(SCHEMAS))
def test_random_walks_are_instances_and_never_stuck(rec, compiled, name):
    """Bytes chosen at random among those that step (from the schema's own bytes and JSON's), then,
    after a while, the first of a few that close things: every state on the way has a byte that
    steps or is complete, and a finished walk is an instance."""
    schema, sc = SCHEMAS[name], compiled[name]
    alphabet = sorted(set(json.dumps(schema).encode()) | set(b'{}[]",:0123456789-.eE+tfnrul \n\\') | {0xC3, 0xA9})
    r = random.Random("w" + name)
    finished = 0
    walks = 12 if QUICK else 60
    for w in range(walks):
        s, doc = rec.init(sc), bytearray()
        for n in range(1500):
            if rec.complete(s):
                break
            nexts = [(b, t) for b in alphabet for t in [rec.step(s, b)] if t is not None]
            assert nexts, bytes(doc)  # never stuck
            b, t = r.choice(nexts)
            if n > 30 + w:
                for want in b'"}]0,':
                    hit = [(b2, t2) for b2, t2 in nexts if b2 == want]
                    if hit:
                        b, t = hit[0]
                        break
            s = t
            doc.append(b)
        if rec.complete(s):
            v = json.loads(bytes(doc).decode("utf-8", "surrogatepass"))
            assert valid(v, schema) and strict(v, schema), bytes(doc)
            finished += 1
    assert finished > walks // 2


def test_compile_messages(rec):
    """The compiler's refusals reach a caller intact (the server's 400s quote them)."""
    for schema, words in [
        ({"type": "object", "properties": {"a": {"anyOf": [{"type": "integer"}, {"type": "number"}]}}},
         "'anyOf' at $.properties.a: branches 0 and 1 can both start with a number"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}}, "points to nothing"),
        ({"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}},
         "unsupported keyword 'pattern' at $.properties.a"),
    ]:
        sc, msg = rec.compile(schema)
        assert sc is None and words in msg, msg
