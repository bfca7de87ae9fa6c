"""test_tokenizer_json.py — the C tokenizer's tokenizer.json format (src/text/tokenizer_json.c)
against PyPI's `tokenizers` (the Hugging Face library) on vocabularies trained at test time.

The main vocabulary: a byte-level BPE of 256 + ~3000 merges trained by `tokenizers` on part of
the varied test text (tok_util.make_text) and some Python standard-library source, with
DeepSeek-V3's pre-tokenizer (its three Split regexes, then ByteLevel without regex), DeepSeek's
special tokens in model.vocab at ids 0..2 (as DeepSeek-V3's file has them), more added tokens
after the vocabulary (special and not, normalized and not), a BOS-adding post-processor, and
the ByteLevel decoder.  HF's encode(add_special_tokens=False) is the reference: the post-processor
is not ddtree's business (chat templates write the BOS).  Without DDT_TOKENIZE_SPECIAL the reference
is HF with encode_special_tokens = True.  Other tests swap in GPT-2's ByteLevel regex and every Split
behaviour on the same vocabulary.
"""

from __future__ import annotations

import glob
import json
import os
import random
import sysconfig

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

import tok_util as tu

DDT_ERR_INVALID = 1

# DeepSeek-V3's tokenizer.json pre_tokenizer: the Regex strings of its three Split entries (data).
DEEPSEEK_V3_SPLITS = [
    "\\p{N}{1,3}",
    "[一-龥\u3040-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
# (content, special, normalized): added after training, so their ids follow the vocabulary.
ADDED = [
    ("<｜User｜>", False, True),
    ("<｜Assistant｜>", False, True),
    ("<think>", False, True),
    ("</think>", False, True),
    ("<｜tool▁calls▁begin｜>", True, False),
    ("<｜tool▁call▁end｜>", True, False),
    ("<|EOT|>", True, False),
    ("<|place▁holder▁no▁7|>", True, True),
]


def deepseek_pre_tokenizer():
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in DEEPSEEK_V3_SPLITS]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def training_texts() -> list[str]:
    texts = [tu.make_text(150_000, seed=21)]
    stdlib = sysconfig.get_paths()["stdlib"]
    for path in sorted(glob.glob(os.path.join(stdlib, "*.py")))[:40]:
        with open(path, encoding="utf-8", errors="replace") as f:
            texts.append(f.read())
    assert sum(len(t) for t in texts) > 400_000
    return texts


@pytest.fixture(scope="module")
def hf_json(tmp_path_factory) -> str:
    """The trained tokenizer.json's text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = deepseek_pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=256 + 3 + 3000, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[BOS, EOS, PAD])
    tok.train_from_iterator(training_texts(), trainer)
    tok.add_tokens([AddedToken(c, special=s, normalized=n) for c, s, n in ADDED if not s])
    tok.add_special_tokens([AddedToken(c, special=s, normalized=n) for c, s, n in ADDED if s])
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 0)])
    assert tok.token_to_id(BOS) == 0 and tok.get_vocab_size() > 3000
    return tok.to_str()


def write(tmp_path, text: str, folder: str = "m") -> str:
    d = tmp_path / folder
    d.mkdir(exist_ok=True)
    (d / "tokenizer.json").write_text(text, encoding="utf-8")
    return str(d)


@pytest.fixture(scope="module")
def pair(hf_json, tmp_path_factory):
    """(HF tokenizer, C tokenizer) on the DeepSeek-style file, loaded from a model folder."""
    d = write(tmp_path_factory.mktemp("dsv3"), hf_json)
    tok = tu.CTokenizer(d)
    yield Tokenizer.from_str(hf_json), tok
    tok.close()


def hf_ids(hf: Tokenizer, text: str, special: bool) -> list[int]:
    hf.encode_special_tokens = not special
    try:
        return hf.encode(text, add_special_tokens=False).ids
    finally:
        hf.encode_special_tokens = False


def check_same(hf: Tokenizer, c: tu.CTokenizer, text: str, label: str = "") -> list[int]:
    """Ids of both with and without special tokens, the decode of both, the round trip."""
    out = None
    for special in (True, False):
        want = hf_ids(hf, text, special)
        got = c.encode(text.encode(), tu.DDT_TOKENIZE_SPECIAL if special else 0)
        if got != want:
            i = tu.first_mismatch(got, want)
            pytest.fail(f"{label or repr(text[:80])} special={special}: ids differ at {i} "
                        f"(C {len(got)}, HF {len(want)}):\n  C:  {[hf.id_to_token(x) for x in got[max(0, i - 3):i + 4]]}"
                        f"\n  HF: {[hf.id_to_token(x) for x in want[max(0, i - 3):i + 4]]}")
        assert c.decode(got).decode("utf-8", errors="replace") == hf.decode(want, skip_special_tokens=False)
        assert c.decode(got) == text.encode()
        out = out or got
    return out


EDGE_CASES = [
    "", " ", "  ", "\n", "\r\n", " \n ", "a  ", "a  b", "   a", "\t\n\t", "x\n\n\n", "  \n\n  \n",
    "'s", "don't", "DON'T", "'", "''", ".abc", "!Abc", "#include", "@@x", "a.b.c", "-x", "--flag",
    "1", "12", "123", "1234", "1234567", "12345678901", "3.14159", "1,000,000", "a1b22c333d4444",
    "٣٤٥٦٧", "①②③④", "ⅫⅣ", "１２３４", "x²³",
    "中文", "中文字符测试", "ひらがなカタカナ漢字", "〆切", "、中。", "ー中", "龥龦", "ゟ゠", "한국어", "中a文1",
    "e\u0301", "\u0301\u0301", "中\u0301", "A\u0301B", " \u0301x", "\u0915\u094d\u0937",
    "\u180e", "a\u180e b", "\u00a0\u00a0x", "\u3000中", "x\u2028\u2029y", "\x85\x85", "\x0b\x0c",
    "👍🏽", "👨‍👩‍👧‍👦", "!!!\n\n", " !!!", "  !!!", "!\r\n\r\n", "#️⃣", "🇯🇵🇫🇷", " 🤖🚀",
    "a\x00b", "\x00\x01\x02", "\x7f", "\t\t\tx",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    BOS, EOS + EOS, f"x{BOS}y", "<｜User｜>hi<｜Assistant｜>", "<think>why</think>answer", "<think", "</think>>",
    "<｜tool▁calls▁begin｜><｜tool▁call▁end｜>", "<|EOT|><|EOT|", "<|place▁holder▁no▁7|>", "<<|EOT|>>",
    f" {BOS} ", f"\n{PAD}\n", "<｜User｜<｜User｜>",
]


def test_edge_cases_match_hf(pair):
    hf, c = pair
    for t in EDGE_CASES + tu.FRAGMENTS:
        check_same(hf, c, t)


def test_large_texts_match_hf(pair):
    hf, c = pair
    t = tu.make_text(120_000, seed=22)
    ids = check_same(hf, c, t, "seed 22")
    assert len(ids) < len(t.encode()) / 2  # the merges are used, not just bytes
    stdlib = sysconfig.get_paths()["stdlib"]
    for path in sorted(glob.glob(os.path.join(stdlib, "*.py")))[60:70]:
        with open(path, encoding="utf-8", errors="replace") as f:
            check_same(hf, c, f.read(), path)


def test_random_strings_match_hf(pair):
    hf, c = pair
    rng = random.Random(5)
    pieces = ["", "a", "A", " ", "  ", "中", "カ", "1", "22", "'s", "\n", "\r\n", "\t", "\u0301", ".", "!!", "x.y",
              BOS, "<think>", "<|EOT|>", "<｜User｜>", "🤖"]
    n = 150 if os.environ.get("DDT_PYTEST_QUICK") else 600
    for k in range(n):
        chars = []
        for _ in range(rng.randint(1, 30)):
            ch = chr(rng.randint(0x20, 0x2FFFF))
            if tu.assigned_long_ago(ch):
                chars.append(ch + rng.choice(pieces))
        check_same(hf, c, "".join(chars), f"random {k}")


def test_special_tokens(pair):
    hf, c = pair
    assert c.token_id(BOS) == 0 and c.token_id(EOS) == 1
    for content, _, _ in ADDED:
        assert c.token_id(content) == hf.token_to_id(content), content
    assert c.token_id("<｜nope｜>") == -1
    assert c.token_id("a") == hf.token_to_id("a")
    assert c.vocab_size() == hf.get_vocab_size()
    text = f"{BOS}<｜User｜>Hello <think>x</think><|EOT|>{EOS}"
    with_sp = c.encode(text.encode(), tu.DDT_TOKENIZE_SPECIAL)
    without = c.encode(text.encode())
    assert with_sp[0] == 0 and with_sp[-1] == 1 and 0 not in without and 1 not in without
    # non-special added tokens are matched either way, as HF does
    assert hf.token_to_id("<think>") in without and hf.token_to_id("<｜User｜>") in without
    assert hf.token_to_id("<|EOT|>") not in without


def test_invalid_utf8_round_trips(pair):
    """Bytes HF cannot take (its input is a str) still encode and decode back."""
    hf, c = pair
    rng = random.Random(8)
    cases = [b"\xff", b"\x80", b"\xe4\xb8", b"abc\xffdef", b"12\xff34", b"\xe4\xb8\xad\xff\xe6\x96\x87", b"<think>\xff"]
    base = tu.make_text(10_000, seed=9).encode()
    for _ in range(100):
        a = rng.randrange(len(base) - 200)
        chunk = bytearray(base[a:a + 200])
        for _ in range(rng.randint(1, 4)):
            chunk.insert(rng.randrange(len(chunk) + 1), rng.choice([0xff, 0x80, 0xc3, 0xe4, 0xf0]))
        cases.append(bytes(chunk))
    for x in cases:
        for flags in (0, tu.DDT_TOKENIZE_SPECIAL):
            assert c.decode(c.encode(x, flags)) == x, x
    # an invalid byte splits like a boundary: the valid parts are encoded as alone
    for a, b in [("Hello world", "Second part"), ("中文", "abc"), ("x = 12345;", "y")]:
        ids = c.encode(a.encode() + b"\xff" + b.encode())
        assert ids == hf_ids(hf, a, True) + [hf.token_to_id("ÿ")] + hf_ids(hf, b, True)


def variant(hf_json: str, pre_tokenizer: dict) -> str:
    d = json.loads(hf_json)
    d["pre_tokenizer"] = pre_tokenizer
    return json.dumps(d, ensure_ascii=False)


def byte_level(use_regex: bool) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def split(pattern: dict, behavior: str, invert: bool = False) -> dict:
    return {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": invert}


PRE_TOKENIZERS = {
    "gpt2": byte_level(True),
    "bytes_only": byte_level(False),
    "removed": {"type": "Sequence", "pretokenizers": [split({"Regex": "\\s+"}, "Removed"), byte_level(True)]},
    "merged_prev": {"type": "Sequence", "pretokenizers": [split({"Regex": "\\p{P}+"}, "MergedWithPrevious"),
                                                          byte_level(False)]},
    "merged_next": {"type": "Sequence", "pretokenizers": [split({"Regex": "[ \\t]+"}, "MergedWithNext"),
                                                          byte_level(False)]},
    "contiguous": {"type": "Sequence", "pretokenizers": [split({"Regex": "\\d"}, "Contiguous"),
                                                         split({"Regex": "\\w+"}, "Isolated"), byte_level(False)]},
    "inverted": {"type": "Sequence", "pretokenizers": [split({"Regex": "\\p{L}+"}, "Isolated", invert=True),
                                                       split({"Regex": " "}, "Removed", invert=True),
                                                       byte_level(False)]},
    "string": {"type": "Sequence", "pretokenizers": [split({"String": "中"}, "MergedWithNext"),
                                                     split({"String": ". "}, "Isolated"), byte_level(True)]},
    "escapes": {"type": "Sequence", "pretokenizers": [
        split({"Regex": "\\h+|\\v|(?i:the)|\\u4e2d|.\\S|\\w\\W|\\d\\D"}, "Isolated"),
        byte_level(False)]},
}


@pytest.mark.parametrize("kind", sorted(PRE_TOKENIZERS))
def test_pre_tokenizer_variants_match_hf(hf_json, tmp_path, kind):
    text = variant(hf_json, PRE_TOKENIZERS[kind])
    hf = Tokenizer.from_str(text)
    with tu.CTokenizer(write(tmp_path, text)) as c:
        for t in EDGE_CASES[:60] + tu.FRAGMENTS + [tu.make_text(20_000, seed=23)]:
            want = hf_ids(hf, t, True)
            got = c.encode(t.encode(), tu.DDT_TOKENIZE_SPECIAL)
            assert got == want, (kind, t[:80], tu.first_mismatch(got, want))


def test_legacy_string_merges(pair, hf_json, tmp_path):
    """Older files list merges as "a b" strings (and may start with a #version line)."""
    hf, _ = pair
    d = json.loads(hf_json)
    assert all(isinstance(m, list) and " " not in m[0] + m[1] for m in d["model"]["merges"])
    d["model"]["merges"] = ["#version: 0.2"] + [" ".join(m) for m in d["model"]["merges"]]
    text = json.dumps(d, ensure_ascii=False)
    legacy = Tokenizer.from_str(text)
    with tu.CTokenizer(write(tmp_path, text)) as c:
        t = tu.make_text(20_000, seed=24)
        assert c.encode(t.encode(), tu.DDT_TOKENIZE_SPECIAL) == hf_ids(legacy, t, True) == hf_ids(hf, t, True)


def test_json_file_path_and_folder_choice(hf_json, tmp_path):
    """A .json path loads directly; a folder with tiktoken.model prefers it."""
    p = tmp_path / "x.json"
    p.write_text(hf_json, encoding="utf-8")
    with tu.CTokenizer(str(p)) as c:
        assert c.token_id(BOS) == 0
    d = write(tmp_path, hf_json, "both")
    tu.write_tiktoken_model(os.path.join(d, "tiktoken.model"), {bytes([i]): i for i in range(256)})
    with tu.CTokenizer(d) as c:
        assert c.vocab_size() == 256 and c.token_id(BOS) == -1
    empty = tmp_path / "none"
    empty.mkdir()
    with pytest.raises(tu.TokError) as e:
        tu.CTokenizer(str(empty))
    assert "neither tiktoken.model nor tokenizer.json" in e.value.msg


def test_errors_name_the_json_path(hf_json, tmp_path):
    d = json.loads(hf_json)
    bad_pt = dict(d, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, byte_level(False)]})
    bad_merge = json.loads(hf_json)
    bad_merge["model"]["merges"][5] = ["Ġ", "zzzqqq"]
    cases = [
        (json.dumps(bad_pt), "pre_tokenizer.pretokenizers[0].type: unsupported pre-tokenizer \"Digits\""),
        (json.dumps(bad_merge), "model.merges[5]: the right token \"zzzqqq\" is not in model.vocab"),
        (json.dumps(dict(d, decoder={"type": "WordPiece"})), "decoder: unsupported decoder WordPiece"),
        (hf_json[:1000], "tokenizer.json line 1 column"),
    ]
    for k, (text, msg) in enumerate(cases):
        with pytest.raises(tu.TokError) as e:
            tu.CTokenizer(write(tmp_path, text, f"bad{k}"))
        assert msg in e.value.msg and "tokenizer.json" in e.value.msg, (msg, e.value.msg)


def test_missing_byte_is_an_error(hf_json, tmp_path):
    """HF drops a character its vocabulary lacks; ddtree refuses instead of losing text."""
    d = json.loads(hf_json)
    del d["model"]["vocab"]["ÿ"]  # byte 0xff
    d["model"]["merges"] = [m for m in d["model"]["merges"] if "ÿ" not in (m if isinstance(m, str) else "".join(m))]
    with tu.CTokenizer(write(tmp_path, json.dumps(d))) as c:
        assert c.decode(c.encode(b"ok")) == b"ok"
        with pytest.raises(tu.TokError) as e:
            c.encode(b"ok \xff")
        assert e.value.status == DDT_ERR_INVALID and "0xff at offset 3" in e.value.msg
