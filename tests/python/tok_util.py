"""tok_util.py — helpers of the tokenizer tests: a small byte-level BPE trainer,
a tiktoken.model writer, a varied multilingual test text, Kimi's long-text
splitting (as tokenization_kimi.py does it), and a ctypes binding of the C
tokenizer in $DDT_BUILD_DIR/libddtree.so.
"""

from __future__ import annotations

import base64
import ctypes
import heapq
import json
import os
import random
import re
import sys
import unicodedata
from collections import defaultdict

# Kimi's pre-tokenisation pattern as tokenization_kimi.py hands it to tiktoken: one
# copy for the project's Python, in train/ddt_common.py (the tokenizer trainer uses it).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "train"))
from ddt_common import KIMI_PAT_STR  # noqa: E402

# Only used to cut training text into words; any reasonable split trains a usable vocabulary.
_TRAIN_SPLIT = re.compile(r"""'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d{1,3}| ?[^\s\w]+|\s+|_+""")

DDT_TOKENIZE_SPECIAL = 1
DDT_TOKENIZE_KIMI_CHUNKS = 2


def train_bpe(text: str, n_merges: int) -> dict[bytes, int]:
    """Byte-level BPE: ranks 0..255 are the single bytes, then the most frequent
    adjacent pair of the words merges, n_merges times (ties: smallest bytes).
    Pair counts are updated only in the words that hold the merged pair."""
    word_counts: dict[bytes, int] = defaultdict(int)
    for w in _TRAIN_SPLIT.findall(text):
        word_counts[w.encode("utf-8")] += 1
    ranks = {bytes([i]): i for i in range(256)}
    seqs = [[bytes([b]) for b in w] for w in word_counts]
    counts = list(word_counts.values())
    pair_count: dict[tuple[bytes, bytes], int] = defaultdict(int)
    where: dict[tuple[bytes, bytes], set[int]] = defaultdict(set)
    for wi, seq in enumerate(seqs):
        for pair in zip(seq, seq[1:]):
            pair_count[pair] += counts[wi]
            where[pair].add(wi)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    while len(ranks) < 256 + n_merges and heap:
        negc, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negc or negc == 0:
            continue  # stale entry
        merged = pair[0] + pair[1]
        if merged not in ranks:
            ranks[merged] = len(ranks)
        touched = set()
        for wi in where.pop(pair, ()):
            seq, c = seqs[wi], counts[wi]
            for p in zip(seq, seq[1:]):
                pair_count[p] -= c
                touched.add(p)
            out, i = [], 0
            while i < len(seq):
                if i + 1 < len(seq) and (seq[i], seq[i + 1]) == pair:
                    out.append(merged)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            seqs[wi] = out
            for p in zip(out, out[1:]):
                pair_count[p] += c
                where[p].add(wi)
                touched.add(p)
        pair_count.pop(pair, None)
        for p in touched:
            if pair_count.get(p, 0) > 0:
                heapq.heappush(heap, (-pair_count[p], p))
    return ranks


def write_tiktoken_model(path: str, ranks: dict[bytes, int]) -> None:
    with open(path, "wb") as f:
        for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(base64.b64encode(tok) + b" " + str(rank).encode() + b"\n")


def kimi_special_tokens(n_ranks: int, named: dict[int, str]) -> dict[str, int]:
    """Special tokens as tokenization_kimi.py builds them: 256 ids after the ranks."""
    return {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(n_ranks, n_ranks + 256)}


def write_tokenizer_config(path: str, named: dict[int, str]) -> None:
    decoder = {str(i): {"content": t, "special": True, "lstrip": False} for i, t in named.items()}
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"added_tokens_decoder": decoder, "tokenizer_class": "TikTokenTokenizer"}, f)


def kimi_split(text: str) -> list[str]:
    """TikTokenTokenizer.encode's splitting: 400000-character chunks, then no run
    of more than 25000 whitespace or non-whitespace characters."""
    out = []
    for i in range(0, len(text), 400_000):
        s = text[i : i + 400_000]
        run, is_space, start = 0, s[0].isspace() if s else False, 0
        for j, ch in enumerate(s):
            now = ch.isspace()
            if is_space ^ now:
                run, is_space = 1, now
            else:
                run += 1
                if run > 25_000:
                    out.append(s[start:j])
                    start, run = j, 1
        out.append(s[start:])
    return out


# Fragments of the test text: prose, code, many scripts, emoji, combining marks,
# odd whitespace, digits, contractions in every case.
FRAGMENTS = [
    "The quick brown fox jumps over the lazy dog. It's 9:45 and we're late; they'll wait, won't they?",
    "I'M SURE YOU'LL SEE IT'S FINE. WE'VE DONE IT, HE'D SAY. 'S 'LL 'RE 'VE 'M 'D 'T",
    "Don't stop believin'. She's got a ticket to ride, and she don't care. it'ſ odd. O'Neil's café.",
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "int main(void) {\r\n\tfor (int i = 0; i < 10; ++i) {\r\n\t\tprintf(\"%d\\n\", i * i);\r\n\t}\r\n\treturn 0;\r\n}\r\n",
    "    x = [1, 2, 3]  # a list\n\n\n    y = {'a': 1, \"b\": 2}\t\t\n  \n",
    "SELECT id, name FROM users WHERE age >= 18 AND email LIKE '%@example.com';",
    "<html><body><div class=\"main\">Hello &amp; welcome!</div></body></html>",
    "人工智能是计算机科学的一个分支，它企图了解智能的实质。北京欢迎你！2024年3月15日。",
    "自然语言处理（NLP）是人工智能和语言学领域的分支学科。〇一二三，々，〆切。",
    "日本語のテキストです。カタカナとひらがなと漢字が混ざっています。コーヒーを飲みましょう！",
    "東京タワーは1958年に完成しました。ラーメン、すし、てんぷら。",
    "한국어 텍스트입니다. 안녕하세요, 세계! 대한민국 서울특별시.",
    "Привет, мир! Москва — столица России. ЁЛКА и ёлка. ПРИВЕТ'S",
    "Γειά σου Κόσμε! ΑΘΗΝΑ είναι η πρωτεύουσα. ǅemal ǈubljana ᾈᾉ",
    "مرحبا بالعالم! هذا نص عربي مع أرقام ١٢٣٤٥ وتشكيل: مُحَمَّدٌ",
    "नमस्ते दुनिया! हिन्दी में लिखा गया पाठ। क्षत्रिय ज्ञान",
    "สวัสดีครับ ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "שלום עולם! עברית נכתבת מימין לשמאל.",
    "Emoji: 👍🏽 👨‍👩‍👧‍👦 🇯🇵🇫🇷 ❤️ 🤖🚀✨ 😂😂😂 #️⃣ 🏳️‍🌈",
    "Combining: e\u0301 a\u0308 o\u0302\u0323 Z\u0351\u0352\u0353 n\u0303o\u0303 \u0301\u0302 x\u20dd",
    "Whitespace:   three\t\ttabs\u00a0nbsp\u3000ideographic\u2003em\u180emvs\u2028ls\u2029ps\x0bvt\x0cff\x85nel   \n\n \t\n",
    "Digits: 1234567890 3.14159265358979 1,000,000 00042 ①②③ ⅫⅣ ٣٤٥ ௧௨௩ 𝟙𝟚𝟛",
    "Mixed: abc123def ABC123DEF a1b2c3 iPhone15Pro McDonald's camelCaseWord snake_case_word SCREAMING_CASE",
    "Symbols: !@#$%^&*()_+-=[]{}|;':\",./<>?`~ «quotes» “smart” ‘single’ … — – ‐ • ° ± × ÷ ≠ ≤ ≥ ∞ √ ∑ ∫",
    "Math: \u2200x\u2208\u211d, \u2203y: x\u00b2 + y\u00b2 = r\u00b2; \U0001d4d0\U0001d4d1 \U0001d400\U0001d401",
    "ʰʲʷ modifier ˈstress ー長音 ｶﾀｶﾅ ＡＢＣ ａｂｃ １２３ ・ 「かぎ」『二重』【隅付き】",
    "中文English混合text测试123数字ABC大写abc小写，标点。End",
    "\r\n\r\n\r\nCRLF lines\r\nand \r alone \n\r mixed\n\n\n\n",
    "tone marks 〪〭〫〬 and 〱〲〳 and 〻 ideographic iteration",
    "Math fonts 𝐀𝐁𝐂 and old italic 𐌀𐌁 and cuneiform 𒀀𒀁 and deseret 𐐀𐐨",
    "URLs: https://example.com/path?query=1&x=y#frag mailto:someone@example.org C:\\Users\\Name",
    "JSON: {\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
]

# Code point ranges of the random soup: wide coverage of letters, marks, numbers,
# symbols of stable Unicode blocks.
_SOUP_RANGES = [
    (0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF),
    (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x1E00, 0x1FFF),
    (0x2000, 0x206F), (0x2070, 0x209F), (0x20A0, 0x20CF), (0x2100, 0x214F), (0x2190, 0x22FF),
    (0x2460, 0x24FF), (0x3000, 0x303F), (0x3040, 0x30FF), (0x3400, 0x3450), (0x4E00, 0x4F00),
    (0xAC00, 0xAD00), (0xFF00, 0xFFEF), (0x1F300, 0x1F64F), (0x1D400, 0x1D4FF), (0x20000, 0x20100),
]


def assigned_long_ago(c: str) -> bool:
    """True for a code point assigned since Unicode 3.2 (not a surrogate or private
    use): its properties agree across the Unicode versions of PCRE2, Rust's regex
    and Python, whereas a newly assigned one may be unassigned in one of them."""
    return unicodedata.ucd_3_2_0.category(c) not in ("Cn", "Cs", "Co")


def _soup(rng: random.Random, n: int) -> str:
    out = []
    while len(out) < n:
        lo, hi = rng.choice(_SOUP_RANGES)
        c = chr(rng.randint(lo, hi))
        if assigned_long_ago(c):
            out.append(c)
    return "".join(out)


def make_text(n_chars: int, seed: int = 1) -> str:
    """Deterministic varied text of about n_chars characters."""
    rng = random.Random(seed)
    parts, total = [], 0
    seps = [" ", "\n", "", "\r\n", "  ", "\t", "\n\n", " \n"]
    while total < n_chars:
        r = rng.random()
        if r < 0.75:
            frag = rng.choice(FRAGMENTS)
            if rng.random() < 0.3:  # cut fragments at random places: pieces meet differently
                a = rng.randrange(len(frag))
                frag = frag[a:] + frag[:a]
        elif r < 0.85:
            frag = _soup(rng, rng.randint(1, 40))
        elif r < 0.92:
            frag = " " * rng.randint(1, 20) + rng.choice(["x", "\n", "", "1", "中", "\t"])
        else:
            frag = str(rng.randint(0, 10 ** rng.randint(1, 15)))
        parts.append(frag)
        parts.append(rng.choice(seps))
        total += len(frag) + 1
    return "".join(parts)


class ErrorStruct(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int), ("msg", ctypes.c_char * 512)]


class TokError(Exception):
    def __init__(self, status: int, msg: str):
        super().__init__(f"status {status}: {msg}")
        self.status = status
        self.msg = msg


def _lib() -> ctypes.CDLL:
    build = os.environ.get("DDT_BUILD_DIR")
    assert build, "set DDT_BUILD_DIR to the build folder holding libddtree.so"
    lib = ctypes.CDLL(os.path.join(build, "libddtree.so"))
    P, E = ctypes.c_void_p, ctypes.POINTER(ErrorStruct)
    lib.ddt_tokenizer_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(P), E]
    lib.ddt_tokenizer_free.argtypes = [P]
    lib.ddt_tokenizer_encode.argtypes = [P, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint32,
                                         ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t,
                                         ctypes.POINTER(ctypes.c_size_t), E]
    lib.ddt_tokenizer_decode.argtypes = [P, ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t, ctypes.c_char_p,
                                         ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), E]
    lib.ddt_tokenizer_token_id.argtypes = [P, ctypes.c_char_p]
    lib.ddt_tokenizer_token_id.restype = ctypes.c_int32
    lib.ddt_tokenizer_vocab_size.argtypes = [P]
    lib.ddt_tokenizer_vocab_size.restype = ctypes.c_int32
    lib.ddt_chat_encode_prompt.argtypes = [P, P, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32),
                                           ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), E]
    for f in ("ddt_tokenizer_load", "ddt_tokenizer_encode", "ddt_tokenizer_decode", "ddt_chat_encode_prompt"):
        getattr(lib, f).restype = ctypes.c_int
    return lib


class CTokenizer:
    """The C tokenizer through ctypes; errors raise TokError."""

    def __init__(self, path: str):
        self.lib = _lib()
        self.h = ctypes.c_void_p()
        err = ErrorStruct()
        st = self.lib.ddt_tokenizer_load(path.encode(), ctypes.byref(self.h), ctypes.byref(err))
        if st:
            raise TokError(st, err.msg.decode(errors="replace"))

    def close(self):
        if self.h:
            self.lib.ddt_tokenizer_free(self.h)
            self.h = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def encode(self, data: bytes, flags: int = 0) -> list[int]:
        n = ctypes.c_size_t()
        err = ErrorStruct()
        cap = len(data) + 16
        buf = (ctypes.c_int32 * cap)()
        st = self.lib.ddt_tokenizer_encode(self.h, data, len(data), flags, buf, cap, ctypes.byref(n),
                                           ctypes.byref(err))
        if st:
            raise TokError(st, err.msg.decode(errors="replace"))
        return list(buf[: n.value])

    def count(self, data: bytes, flags: int = 0) -> tuple[int, int]:
        """(status, count) of an encode into no buffer."""
        n = ctypes.c_size_t()
        err = ErrorStruct()
        st = self.lib.ddt_tokenizer_encode(self.h, data, len(data), flags, None, 0, ctypes.byref(n),
                                           ctypes.byref(err))
        return st, n.value

    def decode(self, ids: list[int]) -> bytes:
        arr = (ctypes.c_int32 * max(len(ids), 1))(*ids)
        need = ctypes.c_size_t()
        err = ErrorStruct()
        st = self.lib.ddt_tokenizer_decode(self.h, arr, len(ids), None, 0, ctypes.byref(need), ctypes.byref(err))
        if st and st != 2:  # 2 = DDT_ERR_RANGE: the length is in need
            raise TokError(st, err.msg.decode(errors="replace"))
        buf = ctypes.create_string_buffer(max(need.value, 1))
        n = ctypes.c_size_t()
        st = self.lib.ddt_tokenizer_decode(self.h, arr, len(ids), buf, need.value, ctypes.byref(n), ctypes.byref(err))
        if st:
            raise TokError(st, err.msg.decode(errors="replace"))
        return buf.raw[: n.value]

    def token_id(self, text: str) -> int:
        return self.lib.ddt_tokenizer_token_id(self.h, text.encode())

    def vocab_size(self) -> int:
        return self.lib.ddt_tokenizer_vocab_size(self.h)

    def chat_prompt(self, system: str | None, user: str) -> list[int]:
        n = ctypes.c_size_t()
        err = ErrorStruct()
        cap = 4 * len(user.encode()) + 1024
        buf = (ctypes.c_int32 * cap)()
        st = self.lib.ddt_chat_encode_prompt(None, self.h, system.encode() if system is not None else None,
                                             user.encode(), buf, cap, ctypes.byref(n), ctypes.byref(err))
        if st:
            raise TokError(st, err.msg.decode(errors="replace"))
        return list(buf[: n.value])


def first_mismatch(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b)) if len(a) != len(b) else -1
