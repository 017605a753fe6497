"""Shards prepared: a corpus (plumbing/corpora.py) tokenized, once and on one process, into the on-disk shards
data.Shard memory-maps, and their counts for `repro.py data`. A document is `[eot] + tokens(text) + [eot]`, cut to
max_len + 1 tokens; a shard is always complete once it has a manifest (its layout: data.py).

    enc = tokenizer.qwen3_tokenizer(vocab_size=8192)   # ranks 0..8191 + <|endoftext|> = 8192; enc.n_vocab == 8193
    train, val = prepare_shards.prepare("toy", "data_cache/toy", enc, max_len=256,
                                        n_train_docs=None, n_val_docs=500, seed=0)   # None: every training document
    print(prepare_shards.summarize(train, enc))
"""

import hashlib
import json
import os
import shutil
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from itertools import chain, islice
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from data import MANIFEST_FILE, OFFSETS_FILE, SHARD_FORMAT, TOKENS_FILE, Shard, read_manifest
from plumbing import checkpoint, corpora
from plumbing.errors import DataError, DiskFull, disk_full_reason
from plumbing.tokenizer import Tokenizer

# Manifest keys that say what a shard was built from; two shards with equal values are the same shard.
INPUT_KEYS = ("format", "split", "corpus", "tokenizer", "max_len", "n_docs_requested")
CHUNK_DOCS = 256  # documents per tokenization task


def prepare(source: str, out_dir: str | Path, enc: Tokenizer, *, max_len: int, n_train_docs: int | None,
            n_val_docs: int, seed: int = 0, workers: int | None = None, force: bool = False,
            verify: bool = True, progress: bool = True, **source_options) -> tuple[Shard, Shard]:
    """Tokenize `source` into out_dir/val (its first n_val_docs documents) and out_dir/train (the following
    n_train_docs, None: all), or reuse shards built from the same inputs (sha256-checked with `verify`). A shard
    built from other inputs, or a broken one, is an error; force=True rebuilds those. On one process only."""
    if max_len < 1:
        raise DataError(f"max_len={max_len}: a document needs at least one target; use max_len >= 1")
    if n_train_docs is not None and n_train_docs < 1:
        raise DataError(f"n_train_docs={n_train_docs}: need at least one training document (None = all)")
    documents = corpora.corpus(source, n_val_docs, seed, **source_options)
    workers = workers or min(os.cpu_count() or 1, 8)
    shards = {}
    for split, read, n_docs in (("val", documents.validation_documents, n_val_docs),
                                ("train", documents.training_documents, n_train_docs)):
        inputs = {"format": SHARD_FORMAT, "split": split, "corpus": documents.identity,
                  "tokenizer": {"name": enc.name, "fingerprint": enc.fingerprint},
                  "max_len": max_len, "n_docs_requested": n_docs}
        path = Path(out_dir) / split
        if _reusable(path, inputs, force):
            try:
                shards[split] = Shard(path, verify=verify)
                continue
            except DataError:
                if not force:
                    raise
        texts = _exactly(read(), n_docs, f"source {source} ({split})")
        chunks = _tokenized_chunks(texts, enc, max_len, workers)
        _write_shard(path, inputs, _with_progress(chunks, f"{source} {split}", n_docs, progress), enc,
                     documents.unchanged)
        shards[split] = Shard(path, verify=False)  # checksummed as it was written
    return shards["train"], shards["val"]


def _reusable(path: Path, inputs: dict, force: bool) -> bool:
    """True if `path` is a shard built from `inputs`; False if absent, or if force and it is not (rebuild it).
    Anything else there is a DataError: prepare replaces nothing it did not make, unless forced."""
    if not path.exists():
        return False
    if not path.is_dir():
        raise DataError(f"{path}: exists and is not a shard directory; move it away or choose another output dir")
    try:
        if not (path / MANIFEST_FILE).exists():
            raise DataError(f"{path}: exists but is not a finished shard (no {MANIFEST_FILE}); move it away "
                            f"or pass force=True (--force) to replace it")
        manifest = read_manifest(path)
        expected = json.loads(json.dumps(inputs))  # as a manifest holds them (tuples as lists)
        differing = [k for k in INPUT_KEYS if manifest.get(k) != expected[k]]
        was, now = manifest.get("corpus"), expected["corpus"]
        if differing == ["corpus"] and isinstance(was, dict) and {**was, "sha256": None} == {**now, "sha256": None}:
            # the same file (or folder) with other content: the user edited their corpus
            raise DataError(f"{path}: built from another corpus: {now.get('path')} was edited since (sha256 "
                            f"{str(was.get('sha256'))[:12]}..., now {str(now.get('sha256'))[:12]}...); restore it, or "
                            "rerun with --force to rebuild the shards from it as it is now (a teacher and runs trained "
                            "on the old text are not retrained: --force names them, to be moved away)")
        if differing:
            first = differing[0]
            raise DataError(f"{path}: existing shard was built with another {', '.join(differing)} "
                            f"({first}: {json.dumps(manifest.get(first))} != {json.dumps(inputs[first])}); "
                            f"pass force=True (--force) to rebuild it or choose another output directory")
    except DataError:
        if force:
            return False
        raise
    return True


def _exactly(documents: Iterator[str], n: int | None, what: str) -> Iterator[str]:
    """The first n documents (all if None); a DataError at the end if the source had fewer."""
    count = 0
    for document in islice(documents, n):
        count += 1
        yield document
    if n is not None and count < n:
        raise DataError(f"{what}: the source ran out after {count} documents, {n} requested; "
                        f"request fewer documents or use a larger source")


def _tokenize_chunk(enc: Tokenizer, max_len: int, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Flat tokens and per-document lengths of `[eot] + text + [eot]`, each cut to max_len + 1."""
    documents = [[enc.eot, *enc.encode(text), enc.eot][:max_len + 1] for text in texts]
    tokens = np.array(list(chain.from_iterable(documents)), dtype=np.uint32)
    return tokens, np.array([len(d) for d in documents], dtype=np.int64)


def _tokenized_chunks(texts: Iterator[str], enc: Tokenizer, max_len: int,
                      workers: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """`_tokenize_chunk` over chunks of CHUNK_DOCS texts, in order, on `workers` threads."""
    chunks = iter(lambda: list(islice(texts, CHUNK_DOCS)), [])
    if workers == 1:
        for chunk in chunks:
            yield _tokenize_chunk(enc, max_len, chunk)
        return
    # Threads: tiktoken's encoder runs without the GIL, and a process forked from one with threads can hang.
    with ThreadPoolExecutor(workers) as pool:
        pending = deque()  # a few chunks ahead only, not the whole corpus in the queue
        for chunk in chunks:
            pending.append(pool.submit(_tokenize_chunk, enc, max_len, chunk))
            if len(pending) > 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _with_progress(chunks: Iterator[tuple[np.ndarray, np.ndarray]], label: str, total: int | None,
                   enabled: bool) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The same chunks, with a rich progress bar of documents, documents/s and tokens/s."""
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rates]}"), TimeElapsedColumn())
    with Progress(*columns, disable=not enabled) as bar:
        task = bar.add_task(label, total=total, rates="")
        start, n_docs, n_tokens = time.perf_counter(), 0, 0
        for tokens, lengths in chunks:
            n_docs, n_tokens = n_docs + len(lengths), n_tokens + len(tokens)
            seconds = max(time.perf_counter() - start, 1e-9)
            bar.update(task, completed=n_docs, rates=f"{n_docs / seconds:,.0f} docs/s  {n_tokens / seconds:,.0f} tokens/s")
            yield tokens, lengths


def _write_shard(path: Path, inputs: dict, chunks: Iterator[tuple[np.ndarray, np.ndarray]], enc: Tokenizer,
                 unchanged: Callable[[], None] = lambda: None) -> None:
    """Write chunks as a shard at `path`, atomically, once `unchanged` says the source is what the manifest names."""
    partial = path.with_name(f".{path.name}.partial")
    if partial.exists():
        shutil.rmtree(partial)  # left by a killed prepare; it has no manifest and never was a shard
    partial.mkdir(parents=True)
    try:
        digest, lengths = hashlib.sha256(), [np.zeros(0, np.int64)]  # the tokens' sha256, each chunk's lengths
        with open(partial / TOKENS_FILE, "wb") as f:  # streamed: the corpus's tokens are never all in memory
            for tokens, chunk_lengths in chunks:
                block = tokens.astype(np.uint32).tobytes()
                f.write(block)
                digest.update(block)
                lengths.append(chunk_lengths)
            f.flush()
            os.fsync(f.fileno())
        lengths = np.concatenate(lengths)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        checkpoint.write_atomic(partial / OFFSETS_FILE, offsets.tobytes())
        manifest = {**inputs, "n_docs": len(lengths), "n_tokens": int(offsets[-1]), "eot": enc.eot,
                    "n_vocab": enc.n_vocab,
                    "sha256": {TOKENS_FILE: digest.hexdigest(), OFFSETS_FILE: hashlib.sha256(offsets.tobytes()).hexdigest()}}
        checkpoint.write_json(partial / MANIFEST_FILE, manifest, indent=1)
        checkpoint.fsync_folder(partial)
        unchanged()
        checkpoint.replace_folder(partial, path)  # force: the old shard goes only once the new one is complete
    except BaseException as e:
        shutil.rmtree(partial, ignore_errors=True)
        why = disk_full_reason(e)
        if why and not isinstance(e, DiskFull):
            raise DiskFull(f"{path}: {why} while writing the shard; nothing was kept: free some space (or raise the "
                           "limit) and rerun", getattr(e, "errno", None)) from None
        raise


def summarize(shard: Shard, enc: Tokenizer) -> dict:
    """Counts for the `repro.py data` table (tokens include both <|endoftext|>s of each document)."""
    if shard.manifest["tokenizer"]["fingerprint"] != enc.fingerprint:
        raise DataError(f"{shard.path}: built with tokenizer {shard.manifest['tokenizer']['name']}, not {enc.name}; "
                        f"summarize it with that tokenizer or rebuild the shard")
    starts, ends = shard.offsets[:-1], shard.offsets[1:]
    percentiles = np.percentile(shard.lengths, [10, 50, 90, 99, 100]) if len(shard) else np.zeros(5)
    return {"documents": len(shard), "tokens": shard.n_tokens, "targets": shard.n_tokens - len(shard),
            "boundary_tokens": int(np.count_nonzero(shard.tokens[starts] == enc.eot)),
            "truncated": int(np.count_nonzero(shard.tokens[ends - 1] != enc.eot)),
            **{f"length_{name}": int(round(v)) for name, v in zip(("p10", "p50", "p90", "p99", "max"), percentiles)}}

