"""test_tokenizer.py — the C tokenizer (src/text/tokenizer.c, chat.c) against
PyPI's tiktoken with Kimi's pattern, on a vocabulary trained at test time.

The vocabulary: ranks 0..255 are the single bytes, then ~4000 BPE merges
trained on part of a varied text (tok_util.train_bpe); tiktoken gets the same
ranks and Kimi's pattern exactly as tokenization_kimi.py passes it.
"""

from __future__ import annotations

import os
import random
import unicodedata

import pytest
import tiktoken

import tok_util as tu

DDT_ERR_INVALID = 1
DDT_ERR_RANGE = 2

# Kimi's layout of named specials, relative to n_ranks (reference.md section 3).
KIMI_NAMED = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
              10: "<|im_system|>", 17: "<|im_middle|>", 254: "[UNK]", 255: "[PAD]"}


@pytest.fixture(scope="module")
def text() -> str:
    t = tu.make_text(260_000, seed=1)
    assert len(t.encode()) >= 200_000
    return t


@pytest.fixture(scope="module")
def vocab(tmp_path_factory, text):
    """(folder, ranks, tiktoken encoding with Kimi's specials, C tokenizer)."""
    d = tmp_path_factory.mktemp("kimi_like")
    ranks = tu.train_bpe(text[:120_000], 4000)
    assert len(ranks) == 256 + 4000
    assert all(ranks[bytes([i])] == i for i in range(256))
    tu.write_tiktoken_model(str(d / "tiktoken.model"), ranks)
    named = {len(ranks) + k: v for k, v in KIMI_NAMED.items()}
    tu.write_tokenizer_config(str(d / "tokenizer_config.json"), named)
    enc = tiktoken.Encoding("kimi_like", pat_str=tu.KIMI_PAT_STR, mergeable_ranks=ranks,
                            special_tokens=tu.kimi_special_tokens(len(ranks), named))
    tok = tu.CTokenizer(str(d))
    yield str(d), ranks, enc, tok
    tok.close()


def assert_same(c_ids, tt_ids, enc, label=""):
    i = tu.first_mismatch(c_ids, tt_ids)
    if i < 0:
        return
    ctx_c = [enc.decode_single_token_bytes(x) for x in c_ids[max(0, i - 4):i + 4]]
    ctx_t = [enc.decode_single_token_bytes(x) for x in tt_ids[max(0, i - 4):i + 4]]
    pytest.fail(f"{label}: ids differ at {i} (C {len(c_ids)} ids, tiktoken {len(tt_ids)}):\n"
                f"  C:        {ctx_c}\n  tiktoken: {ctx_t}")


def test_large_text_matches_tiktoken(vocab, text):
    _, _, enc, tok = vocab
    data = text.encode()
    c_ids = tok.encode(data)
    assert_same(c_ids, enc.encode_ordinary(text), enc, "large text")
    assert len(c_ids) > 50_000  # the merges are used, not just bytes
    assert tok.decode(c_ids) == data
    assert enc.decode_bytes(c_ids) == data


def test_other_texts_match_tiktoken(vocab):
    """Texts the vocabulary was not trained on, including random code points."""
    _, _, enc, tok = vocab
    for seed in (2, 3):
        t = tu.make_text(60_000, seed=seed)
        assert_same(tok.encode(t.encode()), enc.encode_ordinary(t), enc, f"seed {seed}")
    rng = random.Random(7)
    for k in range(400):
        chars = []
        for _ in range(rng.randint(1, 30)):
            c = chr(rng.randint(0x20, 0x2FFFF))
            if tu.assigned_long_ago(c):
                chars.append(c + rng.choice(["", "a", "A", " ", "  ", "中", "1", "'s", "'LL", "\n", "\u0301"]))
        t = "".join(chars)
        assert_same(tok.encode(t.encode()), enc.encode_ordinary(t), enc, f"random {k}: {t!r}")


EDGE_CASES = [
    "", " ", "  ", "\n", "\r\n", " \n ", "a  ", "a  b", "   a", "\t\n\t", "x\n\n\n", "  \n\n  \n",
    "'s", "'S", "I'M", "YOU'LL'VE", "it'ſ", "don't", "DON'T", "'", "''", "a'", "a'x",
    "123456789", "1234a5678", "٣٤٥٦٧", "①②③④", "ⅫⅣ",
    "中文", "〆切", "、中。", "〇一", "々々", "中〪文", "〱〲ひら", "漢字カタカナ", "ー中",
    "AbC", "ABCdef", "abcDEF", "ǅx", "ǅǅ", "ʰʲ", "e\u0301", "\u0301\u0301", "中\u0301", "A\u0301B",
    "\u180e", "a\u180e b", "\u00a0\u00a0x", "\u3000中", "x\u2028\u2029y", "\x85\x85",
    "👍🏽", "👨‍👩‍👧‍👦", "!!!\n\n", " !!!", "  !!!", "!\r\n\r\n", "#️⃣",
    "a\x00b", "\x00\x01\x02", "\x7f",
]


def test_edge_cases_match_tiktoken(vocab):
    _, _, enc, tok = vocab
    for t in EDGE_CASES + tu.FRAGMENTS:
        assert_same(tok.encode(t.encode()), enc.encode_ordinary(t), enc, repr(t))


def test_special_tokens(vocab, text):
    d, ranks, enc, tok = vocab
    n = len(ranks)
    assert tok.vocab_size() == n + 256
    assert tok.token_id("<|im_end|>") == n + 2
    assert tok.token_id("<|im_middle|>") == n + 17
    assert tok.token_id("[PAD]") == n + 255
    assert tok.token_id(f"<|reserved_token_{n + 5}|>") == n + 5
    assert tok.token_id("<|no_such_token|>") == -1
    assert tok.token_id("a") == ranks[b"a"]
    specials = ["<|im_end|>", "[BOS]", "<|im_user|>", f"<|reserved_token_{n + 100}|>", "[EOS]", "<|im_middle|>"]
    rng = random.Random(3)
    pieces = []
    for k in range(300):
        a = rng.randrange(len(text) - 200)
        pieces.append(text[a:a + rng.randint(0, 200)])
        pieces.append(rng.choice(specials + ["<|im_", "[BO", "<|reserved_token_1|>"]))
    t = "".join(pieces) + "<|im_end|>"
    c_ids = tok.encode(t.encode(), tu.DDT_TOKENIZE_SPECIAL)
    assert_same(c_ids, enc.encode(t, allowed_special="all"), enc, "with specials")
    assert c_ids[-1] == n + 2
    assert sum(1 for x in c_ids if x >= n) >= 150  # about 2/3 of the 300 inserts are specials
    # Without the flag, special text is ordinary bytes.
    plain = tok.encode(t.encode())
    assert_same(plain, enc.encode_ordinary(t), enc, "specials as text")
    assert all(x < n for x in plain)
    assert tok.decode(c_ids) == t.encode()


def test_chat_template(vocab):
    _, _, enc, tok = vocab
    user = "Write a haiku about 中文 and emoji 🤖.\nThanks!"
    rendered = ("<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
                f"<|im_user|>user<|im_middle|>{user}<|im_end|><|im_assistant|>assistant<|im_middle|>")
    ids = tok.chat_prompt(None, user)
    assert_same(ids, enc.encode(rendered, allowed_special="all"), enc, "default system")
    rendered2 = ("<|im_system|>system<|im_middle|>Be terse.<|im_end|>"
                 f"<|im_user|>user<|im_middle|>{user}<|im_end|><|im_assistant|>assistant<|im_middle|>")
    assert_same(tok.chat_prompt("Be terse.", user), enc.encode(rendered2, allowed_special="all"), enc, "system")
    # A user cannot inject a control token: the marker text stays ordinary bytes.
    ids3 = tok.chat_prompt("", "hi <|im_end|> there")
    assert ids3.count(tok.token_id("<|im_end|>")) == 2


def test_invalid_utf8_round_trips(vocab):
    _, _, enc, tok = vocab
    rng = random.Random(11)
    cases = [b"\xff", b"\x80", b"\xc3", b"\xe4\xb8", b"\xf0\x9f\x98", b"\xc0\xaf", b"\xed\xa0\x80",
             b"\xf4\x90\x80\x80", b"abc\xffdef", b"\xe4\xb8\xad\xff\xe6\x96\x87", b"   \xff  x", b"'\xffs"]
    for _ in range(300):
        cases.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))))
    base = tu.make_text(20_000, seed=5).encode()
    for _ in range(100):  # valid text with invalid bytes or cut sequences inside
        a = rng.randrange(len(base) - 300)
        chunk = bytearray(base[a:a + 300])
        for _ in range(rng.randint(1, 5)):
            chunk.insert(rng.randrange(len(chunk) + 1), rng.choice([0xff, 0xfe, 0x80, 0xc3, 0xe4, 0xf0, 0xbf]))
        cases.append(bytes(chunk))
    for x in cases:
        ids = tok.encode(x)
        assert tok.decode(ids) == x, x
        assert enc.decode_bytes(ids) == x, x
    # An invalid byte splits the text like a boundary: the valid parts are encoded as alone.
    for a, b in [("Hello world", "Second part"), ("中文", "abc"), ("x = 1;", "y")]:
        ids = tok.encode(a.encode() + b"\xff" + b.encode())
        assert ids == enc.encode_ordinary(a) + [255] + enc.encode_ordinary(b)


def test_byte_only_vocabulary(tmp_path):
    """256 single-byte ranks, no merges: every byte is its own id, any input encodes."""
    ranks = {bytes([i]): i for i in range(256)}
    tu.write_tiktoken_model(str(tmp_path / "tiktoken.model"), ranks)
    enc = tiktoken.Encoding("bytes", pat_str=tu.KIMI_PAT_STR, mergeable_ranks=ranks, special_tokens={})
    with tu.CTokenizer(str(tmp_path / "tiktoken.model")) as tok:
        assert tok.vocab_size() == 256
        t = tu.make_text(20_000, seed=9)
        assert tok.encode(t.encode()) == list(t.encode()) == enc.encode_ordinary(t)
        x = bytes(range(256)) * 3
        assert tok.encode(x) == list(x)


def test_sparse_ranks_match_tiktoken(tmp_path, vocab):
    """Ranks need not be dense: r -> 3r + 7 keeps the merge order."""
    _, ranks, _, _ = vocab
    sparse = {k: 3 * r + 7 for k, r in ranks.items()}
    tu.write_tiktoken_model(str(tmp_path / "tiktoken.model"), sparse)
    enc = tiktoken.Encoding("sparse", pat_str=tu.KIMI_PAT_STR, mergeable_ranks=sparse, special_tokens={})
    t = tu.make_text(40_000, seed=4)
    with tu.CTokenizer(str(tmp_path)) as tok:
        assert tok.vocab_size() == 3 * max(ranks.values()) + 8
        ids = tok.encode(t.encode())
        assert_same(ids, enc.encode_ordinary(t), enc, "sparse")
        assert tok.decode(ids) == t.encode()
        with pytest.raises(tu.TokError) as e:
            tok.decode([8])  # a gap between ranks
        assert e.value.status == DDT_ERR_INVALID and "id 8" in e.value.msg


def test_missing_byte_is_an_error(tmp_path):
    ranks = {bytes([i]): i for i in range(255)}  # no 0xff
    ranks[b"ab"] = 255
    tu.write_tiktoken_model(str(tmp_path / "tiktoken.model"), ranks)
    with tu.CTokenizer(str(tmp_path)) as tok:
        assert tok.encode(b"abab") == [255, 255]
        with pytest.raises(tu.TokError) as e:
            tok.encode(b"ok \xff")
        assert e.value.status == DDT_ERR_INVALID and "offset 3" in e.value.msg


def test_counts_and_buffer_limits(vocab):
    _, _, enc, tok = vocab
    t = "Counting tokens without a buffer, 中文 too."
    st, n = tok.count(t.encode())
    assert st == DDT_ERR_RANGE and n == len(enc.encode_ordinary(t))
    st, n = tok.count(b"")
    assert st == 0 and n == 0
    with pytest.raises(tu.TokError) as e:
        tok.decode([1, 2, 10 ** 9])
    assert "id 1000000000 at position 2" in e.value.msg


def test_kimi_long_text_chunking(vocab):
    """DDT_TOKENIZE_KIMI_CHUNKS gives TikTokenTokenizer.encode's ids: 400000-character
    chunks, runs of more than 25000 (non-)whitespace characters cut."""
    _, _, enc, tok = vocab
    t = tu.make_text(200_000, seed=6) + "xyz" * 10_000 + " " * 26_000 + tu.make_text(230_000, seed=8)
    assert len(t) > 400_000
    expect = [i for part in tu.kimi_split(t) for i in enc.encode_ordinary(part)]
    got = tok.encode(t.encode(), tu.DDT_TOKENIZE_KIMI_CHUNKS)
    assert_same(got, expect, enc, "kimi chunks")
    assert got != tok.encode(t.encode())  # the cuts change ids: the flag is exercised
    assert tok.decode(got) == t.encode()


def test_loader_rejects_bad_files(tmp_path):
    cases = {
        "empty": (b"", "no tokens"),
        "bad_b64": (b"YQ== 0\nY!== 1\n", "line 2: bad base64"),
        "dup_rank": (b"YQ== 0\nYg== 0\n", "line 2: rank 0 repeats line 1"),
        "dup_bytes": (b"YQ== 0\nYQ== 1\n", "line 2: token bytes repeat rank 0"),
        "overflow": (b"YQ== 99999999999999999999\n", "line 1: rank over the limit"),
        "no_rank": (b"YQ==\n", "line 1: expected 'base64 rank'"),
    }
    for name, (data, msg) in cases.items():
        p = tmp_path / f"{name}.model"
        p.write_bytes(data)
        with pytest.raises(tu.TokError) as e:
            tu.CTokenizer(str(p))
        assert str(p) in e.value.msg and msg in e.value.msg, (name, e.value.msg)
    ok = tmp_path / "ok.model"
    ok.write_bytes(b"YQ== 0\r\n\r\nYg== 1")  # CRLF, blank line, no final newline
    with tu.CTokenizer(str(ok)) as tok:
        assert tok.encode(b"ab") == [0, 1]
