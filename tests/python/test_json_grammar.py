"""The JSON recogniser of JSON mode (src/text/json_grammar.h, through libddtree.so) against Python's json
module: random documents (nested objects and arrays, escapes, non-ASCII and astral characters, numbers of
every shape, several layouts) are accepted and every prefix of them steps; random mutations of them
(bytes deleted, inserted, replaced, truncated, slices repeated) are accepted exactly when Python reads
them, after the recogniser's documented differences: no whitespace before the document, whitespace
runs capped, NaN / Infinity refused (Python reads them unless told not to), text that is not UTF-8
refused (Python reads str).  Needs DDT_BUILD_DIR."""

import ctypes
import json
import random

import pytest

MAX_WS = 24  # DDT_JSON_MAX_WS
WS = b" \t\n\r"


SCHEMA_MAX_DEPTH = 8  # DDT_JSON_SCHEMA_MAX_DEPTH


class State(ctypes.Structure):  # ddt_json_state, field for field (json_grammar.h)
    _fields_ = [("schema", ctypes.c_void_p), ("stack", ctypes.c_uint64),
                ("snode", ctypes.c_uint16 * SCHEMA_MAX_DEPTH), ("sidx", ctypes.c_uint16 * SCHEMA_MAX_DEPTH),
                ("spos", ctypes.c_uint32), ("slo", ctypes.c_uint32)] + \
               [(n, ctypes.c_uint8) for n in ("depth", "mode", "sub", "lit", "lo", "hi", "ws", "flags")]


@pytest.fixture(scope="module")
def rec(libddtree_path):
    L = ctypes.CDLL(libddtree_path)
    L.ddt_json_init.argtypes = [ctypes.POINTER(State), ctypes.c_bool]
    L.ddt_json_feed.argtypes = [ctypes.POINTER(State), ctypes.c_char_p, ctypes.c_size_t]
    L.ddt_json_feed.restype = ctypes.c_bool
    L.ddt_json_complete.argtypes = [ctypes.POINTER(State)]
    L.ddt_json_complete.restype = ctypes.c_bool

    def run(data, object_only):
        """(every byte stepped, the document is complete)"""
        s = State()
        L.ddt_json_init(ctypes.byref(s), object_only)
        ok = L.ddt_json_feed(ctypes.byref(s), data, len(data))
        return ok, ok and L.ddt_json_complete(ctypes.byref(s))
    return run


def python_reads(data, object_only):
    def no_constant(name):
        raise ValueError(name)
    try:
        v = json.loads(data.decode("utf-8"), parse_constant=no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(v, dict) or not object_only


def max_ws_run(data):
    best = run = 0
    for b in data:
        run = run + 1 if b in WS else 0
        best = max(best, run)
    return best


def rand_string(r):
    pool = ["a", "Z", " ", "\"", "\\", "/", "\n", "\t", "\x00", "\x1f", "é", "€", "中", "😀", "\U0010FFFF",
            "\ud800", "x" * 5]
    return "".join(r.choice(pool) for _ in range(r.randrange(0, 8)))


def rand_number(r):
    return r.choice([0, -0, 1, -7, 123456789, 2 ** 70, 0.5, -1.25e-10, 3e300, 1.0, r.random() * 10 ** r.randrange(-5, 9)])


def rand_value(r, depth):
    k = r.randrange(8 if depth < 5 else 5)
    if k == 0:
        return rand_string(r)
    if k == 1:
        return rand_number(r)
    if k == 2:
        return r.choice([True, False, None])
    if k in (3, 4):
        return r.randrange(-1000, 1000)
    if k in (5, 6):
        return {rand_string(r): rand_value(r, depth + 1) for _ in range(r.randrange(0, 4))}
    return [rand_value(r, depth + 1) for _ in range(r.randrange(0, 4))]


def rand_doc(r):
    top = {rand_string(r): rand_value(r, 1) for _ in range(r.randrange(0, 4))} if r.random() < 0.7 \
        else rand_value(r, 0)
    layout = r.choice([dict(), dict(indent=2), dict(separators=(",", ":")), dict(indent="\t"),
                       dict(separators=(" , ", " : "))])
    text = json.dumps(top, ensure_ascii=r.random() < 0.5, **layout)
    return text.encode("utf-8", "surrogatepass")


def mutate(r, data):
    data = bytearray(data)
    interesting = b'{}[]",:\\-+.eE0123456789tfnrulsa \n\t\x00\x1f\x7f\x80\x8f\x90\x9f\xa0\xbf\xc0\xc1\xc2\xc3' \
        b'\xdf\xe0\xe2\xed\xef\xf0\xf4\xf5\xff'
    for _ in range(r.randrange(1, 3)):
        op = r.randrange(5)
        i = r.randrange(len(data) + 1)
        if op == 0 and data:
            del data[min(i, len(data) - 1)]
        elif op == 1:
            data.insert(i, r.choice(interesting))
        elif op == 2 and data:
            data[min(i, len(data) - 1)] = r.choice(interesting)
        elif op == 3:
            del data[i:]
        else:
            j = r.randrange(i, len(data) + 1)
            data[i:i] = data[i:j]
    return bytes(data)


def test_random_documents_and_prefixes(rec):
    r = random.Random(8259)
    for _ in range(1500):
        doc = rand_doc(r)
        if max_ws_run(doc) > MAX_WS:
            continue
        for object_only in (False, True):
            want = python_reads(doc, object_only)
            ok, complete = rec(doc, object_only)
            assert complete == want, (doc, object_only)
            if want:
                # every prefix steps (a valid document never passes through a dead end)
                for cut in sorted({r.randrange(len(doc) + 1) for _ in range(4)}):
                    assert rec(doc[:cut], object_only)[0], doc[:cut]


def test_mutations_agree_with_python(rec):
    r = random.Random(20)
    seen = {True: 0, False: 0}
    for _ in range(6000):
        data = mutate(r, rand_doc(r))
        if max_ws_run(data) > MAX_WS or data[:1] in (b" ", b"\t", b"\n", b"\r"):
            continue  # the recogniser's documented limits, where it differs on purpose
        for object_only in (False, True):
            want = python_reads(data, object_only)
            assert rec(data, object_only)[1] == want, (data, object_only)
            seen[want] += 1
    assert seen[True] > 500 and seen[False] > 500  # both sides of the line were exercised


def test_bytes_inside_strings(rec):
    """Strings of random bytes around the UTF-8 boundaries (lead bytes, continuation ranges, overlongs,
    surrogates, past U+10FFFF) and escapes: accepted exactly when Python reads them."""
    r = random.Random(3629)
    pool = [bytes([b]) for b in b"\x00\x1f\x20a\x7f\x80\x8f\x90\x9f\xa0\xbf\xc0\xc1\xc2\xdf\xe0\xe1\xec\xed\xee"
                                b"\xef\xf0\xf1\xf3\xf4\xf5\xff"] + [b"\\n", b"\\u00e9", b"\\uD83D", b"\\x", b"\\u12g4", b"\\"]
    seen = {True: 0, False: 0}
    for _ in range(20000):
        body = b"".join(r.choice(pool) for _ in range(r.randrange(1, 6)))
        data = b'{"k": "' + body + b'"}'
        want = python_reads(data, True)
        assert rec(data, True)[1] == want, data
        seen[want] += 1
    assert seen[True] > 500 and seen[False] > 500


def test_number_shapes(rec):
    """Short strings over the number alphabet, alone and as an array element: accepted exactly when
    Python reads them (leading zeros, lone signs and dots, exponents without digits)."""
    r = random.Random(754)
    seen = {True: 0, False: 0}
    for _ in range(20000):
        num = bytes(r.choice(b"-+0019.eE") for _ in range(r.randrange(1, 7)))
        for data in (num, b"[" + num + b"]"):
            want = python_reads(data, False)
            assert rec(data, False)[1] == want, data
            seen[want] += 1
    assert seen[True] > 500 and seen[False] > 500


def test_documented_differences(rec):
    assert not rec(b" {}", False)[0]  # Python reads it; a generation starts with its value
    assert rec(b"{} ", False)[1]
    deep = b"[" * 64 + b"]" * 64
    assert rec(deep, False)[1] and not rec(b"[" * 65, False)[0]
    assert not rec(b"[" + b" " * (MAX_WS + 1) + b"]", False)[0]
    for const in (b"NaN", b"Infinity", b"-Infinity", b"[NaN]"):
        assert not rec(const, False)[0]
