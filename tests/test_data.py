"""Acceptance tests of data.py, experiments/prepare_shards.py and plumbing/corpora.py (issue 3): corpora, shards, batches
(the tokenizer's are in test_tokenizer.py).

    .venv/bin/python -m pytest -q tests/test_data.py
"""

import collections
import json
import os
import shutil
from pathlib import Path

import huggingface_hub.constants
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import data
from experiments import prepare_shards
from plumbing import corpora, errors, tokenizer

# ---------------------------------------------------------------------------------------------------
# Corpora

def test_toy_validation_is_whole_held_out_speeches():
    toy = corpora.corpus("toy", n_val=300, seed=0)
    validation, training = toy.validation_documents(), list(toy.training_documents())
    speeches = corpora._sotu_speeches()
    held_out = corpora._held_out_speeches([len(p) for _, p in speeches], 300)
    years = [int(speeches[i][0][:4]) for i in held_out]
    assert min(years) < 1870 and max(years) > 1960  # spread over the years, not the first speeches
    assert validation == [p for i in held_out for p in speeches[i][1]][:300]
    rest = [p for i, (_, paragraphs) in enumerate(speeches) if i not in held_out for p in paragraphs]
    assert collections.Counter(training) == collections.Counter(rest) and training != rest  # all of them, shuffled
    reseeded = corpora.corpus("toy", n_val=300, seed=1)
    assert reseeded.validation_documents() == validation and list(reseeded.training_documents()) != training
    with pytest.raises(errors.DataError, match="n_val=30000"):
        corpora.corpus("toy", n_val=30_000).validation_documents()


def test_toy_documents_of_several_paragraphs_join_consecutive_paragraphs_of_one_speech():
    """paragraphs_per_document=k: each document is k consecutive paragraphs of one speech (its last
    document holds the rest), held-out speeches validate, and the option joins the corpus's identity
    (k = 1 leaves the identity that existing shards recorded)."""
    toy = corpora.corpus("toy", n_val=20, seed=0, paragraphs_per_document=7)
    speeches = corpora._sotu_speeches()
    grouped = [["\n\n".join(p[i:i + 7]) for i in range(0, len(p), 7)] for _, p in speeches]
    held_out = corpora._held_out_speeches([len(g) for g in grouped], 20)
    assert toy.validation_documents() == [d for i in held_out for d in grouped[i]][:20]
    rest = [d for i, g in enumerate(grouped) if i not in held_out for d in g]
    assert collections.Counter(toy.training_documents()) == collections.Counter(rest)
    assert sum(len(g) for g in grouped) == sum(-(-len(p) // 7) for _, p in speeches)
    assert toy.identity["paragraphs_per_document"] == 7
    assert "paragraphs_per_document" not in corpora.corpus("toy", n_val=20, paragraphs_per_document=1).identity
    with pytest.raises(errors.DataError, match="paragraphs_per_document=0"):
        corpora.corpus("toy", n_val=20, paragraphs_per_document=0)


def test_unknown_source_or_option_is_a_data_error():
    with pytest.raises(errors.DataError, match="'wikipedia'"):
        corpora.corpus("wikipedia", n_val=1)
    with pytest.raises(errors.DataError, match="unknown option.*revision"):
        corpora.corpus("toy", n_val=1, revision="main")


def _local_expected(tmp_path):
    texts = [f"document number {i}: " + "word " * i for i in range(12)]
    (tmp_path / "txt").mkdir()
    for i, text in enumerate(texts):
        (tmp_path / "txt" / f"{i:02d}.txt").write_text(text)
    (tmp_path / "txt" / "empty.txt").write_text("")
    with open(tmp_path / "docs.jsonl", "w") as f:
        for text in texts:
            f.write(json.dumps({"text": text, "id": 1}) + "\n")
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.table({"text": texts[:7]}), tmp_path / "pq" / "a.parquet", row_group_size=3)
    pq.write_table(pa.table({"text": texts[7:], "url": ["u"] * 5}), tmp_path / "pq" / "b.parquet", row_group_size=2)
    return texts


@pytest.mark.parametrize("where", ["txt", "docs.jsonl", "pq", "pq/a.parquet"])
def test_local_sources_give_every_document_once(tmp_path, where):
    texts = _local_expected(tmp_path)
    expected = texts[:7] if where == "pq/a.parquet" else texts
    local = corpora.corpus("local", n_val=3, seed=0, path=tmp_path / where)
    validation, training = local.validation_documents(), list(local.training_documents())
    assert len(validation) == 3
    assert sorted(validation + training) == sorted(expected)
    assert validation + training != expected  # a seeded order, not the file order
    again = corpora.corpus("local", n_val=3, seed=0, path=tmp_path / where)
    assert again.validation_documents() + list(again.training_documents()) == validation + training


def test_local_source_errors_name_the_file(tmp_path):
    with pytest.raises(errors.DataError, match="not a folder of .txt"):
        corpora.corpus("local", n_val=1, path=tmp_path / "missing")
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"txt": "typo"}\n')
    with pytest.raises(errors.DataError, match=r"bad\.jsonl:2: not a JSON object with a 'text' field"):
        corpora.corpus("local", n_val=1, path=tmp_path / "bad.jsonl").validation_documents()
    pq.write_table(pa.table({"content": ["x"]}), tmp_path / "nocol.parquet")
    with pytest.raises(errors.DataError, match=r"nocol\.parquet: no 'text' column \(columns: content\)"):
        corpora.corpus("local", n_val=1, path=tmp_path / "nocol.parquet").validation_documents()


def test_a_local_corpus_is_identified_by_its_content_and_read_as_utf8_with_or_without_a_bom(tmp_path):
    """An edited file is another corpus (its shards are refused for reuse, so they and the teacher are
    rebuilt); a BOM is accepted; a bad byte names the file, line and column."""
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text('{"text": "one"}\n{"text": "two"}\n{"text": "three"}\n')
    first = corpora.corpus("local", n_val=1, seed=0, path=corpus).identity
    assert corpora.corpus("local", n_val=1, seed=0, path=corpus).identity == first
    corpus.write_text('{"text": "one"}\n{"text": "two!"}\n{"text": "three"}\n')
    assert corpora.corpus("local", n_val=1, seed=0, path=corpus).identity["sha256"] != first["sha256"]
    corpus.write_bytes("\ufeff".encode() + corpus.read_bytes())
    documents = corpora.corpus("local", n_val=1, seed=0, path=corpus)
    assert sorted(documents.validation_documents() + list(documents.training_documents())) == ["one", "three", "two!"]
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_bytes("\ufeffa BOM, then text".encode())
    (tmp_path / "texts" / "b.txt").write_bytes(b"line one\nli\xffne two")
    with pytest.raises(errors.DataError, match=r"b\.txt:2: not UTF-8 \(byte 0xff at column 3\)"):
        corpora.corpus("local", n_val=1, seed=0, path=tmp_path / "texts").validation_documents()
    (tmp_path / "texts" / "b.txt").write_text("fine")
    texts = corpora.corpus("local", n_val=2, seed=0, path=tmp_path / "texts").validation_documents()
    assert sorted(texts) == ["a BOM, then text", "fine"]


def test_a_file_size_limit_while_preparing_data_is_one_line_and_keeps_nothing(tmp_path):
    """A real `ulimit -f` (RLIMIT_FSIZE) below the token file's size: one line, no shard and no partial
    folder left; the same command without the limit then prepares the data."""
    import subprocess
    import sys
    script = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
              "resource.setrlimit(resource.RLIMIT_FSIZE, (4000, resource.RLIM_INFINITY)); "
              "import repro; repro.cli(sys.argv[1:])")
    root = Path(__file__).resolve().parents[1]
    args = ["data", "--scale", "smoke", "--runs-dir", str(tmp_path / "runs")]
    limited = subprocess.run([sys.executable, "-c", script, *args], cwd=root, capture_output=True, text=True, timeout=300)
    assert limited.returncode == 1, limited.stderr[-2000:]
    last = limited.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: ") and "a file-size limit (ulimit -f) was reached" in last, limited.stderr[-2000:]
    assert "Traceback" not in limited.stderr
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.is_file() and p.name != "manifest.json"
                and "partial" in str(p)]
    assert not (tmp_path / "runs" / "smoke" / "data" / "train" / "manifest.json").exists()
    done = subprocess.run([sys.executable, str(root / "repro.py"), *args], cwd=root, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


# --- FineWeb-Edu through the real hf_hub_download, offline, from a hub cache the test writes

def _write_hub_cache(cache_dir, revision, rows_per_file=5):
    """The layout hf_hub_download reads: <cache>/datasets--HuggingFaceFW--fineweb-edu/snapshots/<commit>/<file>
    (real caches symlink these to blobs/; a plain file is found the same way) and refs/main -> commit."""
    repo = cache_dir / "datasets--HuggingFaceFW--fineweb-edu"
    texts = []
    for i, filename in enumerate(corpora.FINEWEB_FILES):
        file_texts = [f"fineweb file {i} row {r}" for r in range(rows_per_file)]
        path = repo / "snapshots" / revision / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"text": file_texts, "score": [3.0] * rows_per_file}), path, row_group_size=2)
        texts += file_texts
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return texts


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=1 set after huggingface_hub was imported, as a user's shell may do."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    cache = tmp_path / "hub"
    return cache, _write_hub_cache(cache, corpora.FINEWEB_REVISION)


def test_fineweb_reads_the_hub_cache_offline_and_lazily(offline_hub, monkeypatch):
    cache, texts = offline_hub
    fetched = []
    download = corpora.download_fineweb_file
    monkeypatch.setattr(corpora, "download_fineweb_file", lambda name, *a: fetched.append(name) or download(name, *a))
    fineweb = corpora.corpus("fineweb-edu", n_val=4, seed=0, cache_dir=cache)
    validation = fineweb.validation_documents()
    assert len(fetched) == 1 and validation[0].startswith(f"fineweb file {corpora.FINEWEB_FILES.index(fetched[0])} ")
    training = list(fineweb.training_documents())
    assert sorted(validation + training) == sorted(texts) and len(validation + training) == 70
    assert [d.split()[2] for d in validation + training] != sorted(d.split()[2] for d in texts)  # files shuffled
    other_seed = corpora.corpus("fineweb-edu", n_val=4, seed=1, cache_dir=cache).validation_documents()
    assert other_seed != validation


def test_fineweb_missing_from_cache_offline_is_a_clear_error(offline_hub):
    cache, _ = offline_hub
    with pytest.raises(errors.DataError, match="cannot get it .*HF_HUB_OFFLINE is set"):
        corpora.corpus("fineweb-edu", n_val=4, seed=0, cache_dir=cache, revision="0" * 40).validation_documents()


def test_fineweb_prepare_end_to_end(offline_hub, tmp_path):
    cache, _ = offline_hub
    enc = tokenizer.qwen3_tokenizer(512)
    train, val = prepare_shards.prepare("fineweb-edu", tmp_path / "shards", enc, max_len=64, n_train_docs=20, n_val_docs=4,
                                        seed=0, workers=1, progress=False, cache_dir=cache)
    fineweb = corpora.corpus("fineweb-edu", n_val=4, seed=0, cache_dir=cache)
    assert [enc.decode(val.document(i)[1:-1]) for i in range(4)] == fineweb.validation_documents()
    assert enc.decode(train.document(19)[1:-1]) == list(fineweb.training_documents())[19]
    assert train.manifest["corpus"] == {"source": "fineweb-edu", "repo": corpora.FINEWEB_REPO,
                                        "revision": corpora.FINEWEB_REVISION, "n_val": 4, "seed": 0}


# ---------------------------------------------------------------------------------------------------
# Shards

TOY = dict(max_len=64, n_train_docs=300, n_val_docs=40, seed=0, progress=False)


@pytest.fixture(scope="module")
def toy_shards(tmp_path_factory):
    """Built once, with two worker processes and the progress bar on."""
    enc = tokenizer.qwen3_tokenizer(2048)
    out = tmp_path_factory.mktemp("toy")
    train, val = prepare_shards.prepare("toy", out, enc, workers=2, **{**TOY, "progress": True})
    return enc, out, train, val


def test_prepare_stores_eot_text_eot_truncated(toy_shards):
    enc, _, train, val = toy_shards
    toy = corpora.corpus("toy", n_val=40, seed=0)
    for shard, texts in ((val, toy.validation_documents()), (train, list(toy.training_documents())[:300])):
        assert len(shard) == len(texts)
        for i, text in enumerate(texts):
            assert shard.document(i).tolist() == ([enc.eot] + enc.encode(text) + [enc.eot])[:65]
    assert train.lengths.max() == 65 and (train.lengths < 65).any()
    manifest = train.manifest
    assert manifest["tokenizer"] == {"name": "qwen3-v2048", "fingerprint": enc.fingerprint}
    assert (manifest["n_docs"], manifest["n_tokens"], manifest["eot"]) == (300, train.n_tokens, 2048)
    assert train.tokens.dtype == np.uint32 and train.offsets.dtype == np.int64


def test_truncated_token_file_and_wrong_checksum_are_detected(toy_shards, tmp_path):
    enc, out, _, _ = toy_shards
    shard = tmp_path / "train"
    shutil.copytree(out / "train", shard)
    shutil.copytree(out / "val", tmp_path / "val")
    tokens = (shard / "tokens.u32").read_bytes()
    (shard / "tokens.u32").write_bytes(tokens[:-4])
    with pytest.raises(errors.DataError, match=r"tokens\.u32: \d+ bytes, the manifest says \d+; the shard is truncated"):
        data.Shard(shard, verify=False)
    flipped = bytearray(tokens)
    flipped[100] ^= 1
    (shard / "tokens.u32").write_bytes(bytes(flipped))
    assert len(data.Shard(shard, verify=False)) == 300  # same size: only the checksum can tell
    with pytest.raises(errors.DataError, match=r"tokens\.u32: checksum differs"):
        data.Shard(shard)
    with pytest.raises(errors.DataError, match=r"tokens\.u32: checksum differs"):  # prepare does not reuse it
        prepare_shards.prepare("toy", tmp_path, enc, workers=1, **TOY)
    rebuilt, _ = prepare_shards.prepare("toy", tmp_path, enc, workers=1, force=True, **TOY)
    assert rebuilt.tokens.tobytes() == tokens


def test_interrupted_prepare_leaves_no_shard_and_a_rerun_completes(toy_shards, tmp_path, monkeypatch):
    enc, reference, _, _ = toy_shards
    calls = []
    tokenize = prepare_shards._tokenize_chunk

    def dies_midway(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # what Ctrl-C raises in the middle of the tokenization
        return tokenize(*args)

    monkeypatch.setattr(prepare_shards, "CHUNK_DOCS", 50)
    monkeypatch.setattr(prepare_shards, "_tokenize_chunk", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        prepare_shards.prepare("toy", tmp_path, enc, workers=1, **TOY)
    assert (tmp_path / "val" / "manifest.json").exists()  # val finished before train started
    assert sorted(p.name for p in tmp_path.iterdir()) == ["val"]
    with pytest.raises(errors.DataError, match="not a finished shard"):
        data.Shard(tmp_path / "train")

    (tmp_path / ".train.partial").mkdir()  # what a SIGKILL leaves behind
    (tmp_path / ".train.partial" / "tokens.u32").write_bytes(b"\0" * 64)
    monkeypatch.setattr(prepare_shards, "_tokenize_chunk", tokenize)
    train, _ = prepare_shards.prepare("toy", tmp_path, enc, workers=1, **TOY)
    assert np.array_equal(train.tokens, data.Shard(reference / "train").tokens)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train", "val"]


def test_same_inputs_reuse_the_shard_without_tokenizing(toy_shards, monkeypatch):
    enc, out, train, _ = toy_shards
    mtime = os.stat(out / "train" / "tokens.u32").st_mtime_ns
    monkeypatch.setattr(prepare_shards, "_tokenize_chunk", lambda *a: pytest.fail("re-tokenized a reusable shard"))
    again, _ = prepare_shards.prepare("toy", out, enc, workers=2, **TOY)
    assert np.array_equal(again.tokens, train.tokens)
    assert os.stat(out / "train" / "tokens.u32").st_mtime_ns == mtime


def test_changed_inputs_are_detected_and_force_rebuilds(toy_shards, tmp_path):
    enc, _, _, _ = toy_shards
    prepare_shards.prepare("toy", tmp_path, enc, workers=1, **{**TOY, "n_train_docs": 30, "n_val_docs": 5})
    other = tokenizer.qwen3_tokenizer(1024)
    with pytest.raises(errors.DataError, match=r"val: existing shard was built with another tokenizer .*force=True"):
        prepare_shards.prepare("toy", tmp_path, other, workers=1, **{**TOY, "n_train_docs": 30, "n_val_docs": 5})
    with pytest.raises(errors.DataError, match=r"another corpus, n_docs_requested"):
        prepare_shards.prepare("toy", tmp_path, enc, workers=1, **{**TOY, "n_train_docs": 30, "n_val_docs": 6})
    train, val = prepare_shards.prepare("toy", tmp_path, other, workers=1, force=True,
                                        **{**TOY, "n_train_docs": 30, "n_val_docs": 5})
    assert train.manifest["tokenizer"]["name"] == "qwen3-v1024" and val.eot == 1024
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train", "val"]


def test_prepare_never_replaces_what_it_did_not_make(toy_shards, tmp_path):
    enc, _, _, _ = toy_shards
    (tmp_path / "val").mkdir()
    (tmp_path / "val" / "notes.txt").write_text("mine")
    with pytest.raises(errors.DataError, match=r"val: exists but is not a finished shard .*force=True"):
        prepare_shards.prepare("toy", tmp_path, enc, workers=1, **TOY)
    assert (tmp_path / "val" / "notes.txt").read_text() == "mine"


def test_too_few_source_documents_is_a_data_error(tmp_path):
    (tmp_path / "docs").mkdir()
    for i in range(5):
        (tmp_path / "docs" / f"{i}.txt").write_text(f"text {i}")
    with pytest.raises(errors.DataError,
                       match=r"source local \(train\): the source ran out after 3 documents, 10 requested"):
        prepare_shards.prepare("local", tmp_path / "out", tokenizer.qwen3_tokenizer(512), max_len=8, n_train_docs=10,
                               n_val_docs=2, workers=1, progress=False, path=tmp_path / "docs")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["val"]


def test_summarize(toy_shards):
    enc, _, train, _ = toy_shards
    summary = prepare_shards.summarize(train, enc)
    lengths = np.diff(train.offsets)
    assert summary["documents"] == 300 and summary["tokens"] == lengths.sum()
    assert summary["targets"] == lengths.sum() - 300 and summary["boundary_tokens"] == 300
    assert summary["truncated"] == sum(train.document(i)[-1] != enc.eot for i in range(300)) > 0
    assert summary["length_max"] == 65 and summary["length_p50"] == int(round(np.median(lengths)))
    with pytest.raises(errors.DataError, match="built with tokenizer qwen3-v2048, not qwen3"):
        prepare_shards.summarize(train, tokenizer.qwen3_tokenizer())


# ---------------------------------------------------------------------------------------------------
# Batches, on a synthetic shard whose documents identify themselves: document i = [eot] + [i] * (1 + i % 9) + [eot]

EOT_ID = 256


def write_synthetic_shard(path, n_docs):
    enc = tokenizer.qwen3_tokenizer(256)
    documents = [[EOT_ID] + [i] * (1 + i % 9) + [EOT_ID] for i in range(n_docs)]
    tokens = np.array([t for d in documents for t in d], dtype=np.uint32)
    inputs = {"format": data.SHARD_FORMAT, "split": "train", "corpus": {"source": "synthetic"},
              "tokenizer": {"name": enc.name, "fingerprint": enc.fingerprint}, "max_len": 16, "n_docs_requested": n_docs}
    prepare_shards._write_shard(path, inputs, iter([(tokens, np.array([len(d) for d in documents]))]), enc)
    return data.Shard(path)


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    return write_synthetic_shard(tmp_path_factory.mktemp("synthetic") / "train", 100)


def rows(step):
    """{doc id: (inputs, targets)} of a StepBatch's documents: padded rows cut by length, a packed row split."""
    out = {}
    for batch in step.micro_batches:
        if batch.doc_lengths is None:
            for row, doc in enumerate(batch.doc_ids):
                n = int(batch.lengths[row])
                out[doc] = (batch.input_ids[row, :n].tolist(), batch.targets[row, :n].tolist())
        else:
            parts = zip(batch.input_ids[0].split(batch.doc_lengths), batch.targets[0].split(batch.doc_lengths))
            out.update({doc: (i.tolist(), t.tolist()) for doc, (i, t) in zip(batch.doc_ids, parts)})
    return out


def test_a_packed_batch_lays_its_documents_end_to_end_with_no_padding(shard):
    """The step's documents, longest first (ties in the step's order), so that documents of one length lie side by
    side for attention to batch them."""
    step = next(data.Batcher(shard, global_batch=8, seed=0))
    batch = step.micro_batches[0]
    lengths = [1 + (1 + doc % 9) for doc in batch.doc_ids]
    assert sorted(batch.doc_ids) == sorted(step.doc_ids) and batch.doc_ids != step.doc_ids
    assert batch.doc_ids == sorted(step.doc_ids, key=lambda doc: (-(1 + (1 + doc % 9)), step.doc_ids.index(doc)))
    assert batch.doc_lengths == tuple(lengths) and batch.lengths.tolist() == lengths
    assert batch.input_ids.shape == batch.targets.shape == batch.mask.shape == (1, sum(lengths)) and batch.mask.all()
    assert batch.n_targets == sum(lengths) == step.global_targets
    expected = [([EOT_ID] + [doc] * (n - 1), [doc] * (n - 1) + [EOT_ID]) for doc, n in zip(batch.doc_ids, lengths)]
    assert list(rows(step).values()) == expected  # each document's inputs and targets, in order
    starts = np.cumsum([0] + lengths[:-1])
    assert batch.first_positions()[0].nonzero().flatten().tolist() == starts.tolist()
    assert batch.input_ids[0, starts].eq(EOT_ID).all()  # every document opens with its boundary token


def test_batch_rows_are_shifted_documents_masked_by_length(shard):
    step = next(data.Batcher(shard, global_batch=8, seed=0))
    batch = data.make_batch(shard, step.doc_ids)  # right-padded rows: a compiled run's and the diagnostics'
    assert batch.doc_lengths is None and batch.first_positions()[:, 0].all() and batch.first_positions().sum() == 8
    assert batch.input_ids.dtype == batch.targets.dtype == torch.long and batch.mask.dtype == torch.bool
    assert batch.doc_ids == step.doc_ids and len(batch.doc_ids) == 8
    for row, doc in enumerate(batch.doc_ids):
        n = 1 + (1 + doc % 9)
        assert batch.lengths[row] == n
        assert batch.input_ids[row, :n].tolist() == [EOT_ID] + [doc] * (n - 1)
        assert batch.targets[row, :n].tolist() == [doc] * (n - 1) + [EOT_ID]
        # The document's real final target is <|endoftext|>, right beside padding made of the same id:
        # only the length tells them apart.
        assert batch.mask[row, n - 1] and batch.targets[row, n - 1] == EOT_ID
        assert not batch.mask[row, n:].any() and (batch.targets[row, n:] == EOT_ID).all()
        assert (batch.input_ids[row, n:] == EOT_ID).all()
    assert batch.input_ids.shape[1] == int(batch.lengths.max())
    assert batch.n_targets == int(batch.mask.sum()) == step.global_targets == step.global_tokens
    assert step.global_targets == sum(1 + d % 9 + 1 for d in step.doc_ids)


@pytest.mark.parametrize("world_size", [2, 4])
def test_union_over_ranks_is_the_single_process_batch(shard, world_size):
    single = data.Batcher(shard, global_batch=8, seed=3, replay_docs=60)
    ranks = [data.Batcher(shard, global_batch=8, seed=3, replay_docs=60, rank=r, world_size=world_size, micro_batch=2)
             for r in range(world_size)]
    for _ in range(10):  # crosses an epoch boundary at 60 documents
        whole = next(single)
        parts = [next(b) for b in ranks]
        assert [d for p in parts for d in p.doc_ids] == whole.doc_ids
        assert {k: v for p in parts for k, v in rows(p).items()} == rows(whole)
        assert all(p.global_targets == whole.global_targets for p in parts)
        assert all(len(p.micro_batches) == 8 // world_size // 2 for p in parts)


def test_resume_from_saved_state_gives_the_same_batches(shard):
    first = data.Batcher(shard, global_batch=8, seed=5, replay_docs=60)
    for _ in range(7):
        next(first)
    state = json.loads(json.dumps(first.state_dict()))
    expected = [next(first) for _ in range(5)]
    resumed = data.Batcher(shard, global_batch=8, seed=5, replay_docs=60)
    resumed.load_state_dict(state)
    assert [rows(next(resumed)) for _ in range(5)] == [rows(s) for s in expected]
    on_two_ranks = data.Batcher(shard, global_batch=8, seed=5, replay_docs=60, rank=1, world_size=2)
    on_two_ranks.load_state_dict(state)
    assert next(on_two_ranks).doc_ids == expected[0].doc_ids[4:]
    with pytest.raises(errors.DataError, match="saved with seed=5 but this run has 6"):
        data.Batcher(shard, global_batch=8, seed=6, replay_docs=60).load_state_dict(state)


def test_replay_wraps_within_the_shard_with_a_new_order_each_epoch(shard):
    batcher = data.Batcher(shard, global_batch=8, seed=0, mode="replay", replay_docs=36)
    stream = [d for _ in range(9) for d in next(batcher).doc_ids]  # 72 documents = 2 epochs
    epoch0, epoch1 = stream[:36], stream[36:]
    assert sorted(epoch0) == sorted(epoch1) == list(range(36))  # step 4 straddles the wrap
    assert epoch0 != epoch1
    batcher.reset()
    assert next(batcher).doc_ids == epoch0[:8]


def test_fresh_never_repeats_and_stops_with_a_clear_error(shard):
    replay = data.Batcher(shard, global_batch=8, seed=0, mode="replay", replay_docs=40)
    fresh = data.Batcher(shard, global_batch=8, seed=0, mode="fresh", replay_docs=40)
    seen = [next(fresh).doc_ids for _ in range(12)]
    assert seen[:5] == [next(replay).doc_ids for _ in range(5)]  # the first phase is the grow run's
    flat = [d for ids in seen for d in ids]
    assert len(set(flat)) == len(flat) == 96 and flat[40:] == list(range(40, 96))
    with pytest.raises(errors.DataError, match=r"fresh mode: step 12 needs 104 training documents but .* holds 100; "
                                             r"prepare more \(n_train_docs\)"):
        next(fresh)


@pytest.mark.parametrize("options, message", [
    (dict(global_batch=10, world_size=4), "global_batch=10: must be a positive multiple of world_size=4"),
    (dict(global_batch=8, world_size=2, micro_batch=3), "micro_batch=3: must divide the 4 documents per rank"),
    (dict(global_batch=8, replay_docs=101), "replay_docs=101: must be between global_batch=8"),
    (dict(global_batch=8, rank=2, world_size=2), "rank=2, world_size=2"),
    (dict(global_batch=8, mode="shuffle"), "mode='shuffle'"),
])
def test_bad_batching_options_are_data_errors(shard, options, message):
    with pytest.raises(errors.DataError, match=message.replace("(", r"\(")):
        data.Batcher(shard, seed=0, **options)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_eval_batches_cover_every_document_once_with_equal_counts(tmp_path, world_size):
    small = write_synthetic_shard(tmp_path / "val", 23)
    per_rank = [list(data.eval_batches(small, batch_size=4, rank=r, world_size=world_size)) for r in range(world_size)]
    assert len({len(batches) for batches in per_rank}) == 1  # every rank runs the same forward passes
    assert sorted(d for batches in per_rank for b in batches for d in b.doc_ids) == list(range(23))
    empty = [b for batches in per_rank for b in batches if not b.doc_ids]
    assert all(b.input_ids.shape == (1, 1) and not b.mask.any() and b.n_targets == 0 for b in empty)
    assert len(empty) == {1: 0, 2: 0, 4: 2}[world_size]  # 6 batches: step 1 holds two, ranks 2, 3 idle


@pytest.mark.parametrize("batch_size", [1, 4])
def test_eval_batches_are_the_same_batches_on_any_ranks_placed_by_length(tmp_path, batch_size):
    """The evaluation sums over every token of every rank, so where a batch runs changes only the order
    of its float64 additions: on 1, 2 or 4 ranks the batches are the same, one process takes them in
    order (its numbers unchanged), and several ranks take them longest first, so each step waits for
    less: the work of a step being its ranks' count times its costliest batch (rows x longest document),
    less than the in-order placement's (documents 3 to 11 tokens long, 1 + i % 9 + 2)."""
    small = write_synthetic_shard(tmp_path / "val", 23)
    in_order = [tuple(range(s, min(s + batch_size, 23))) for s in range(0, 23, batch_size)]

    def batches(world):
        return [tuple(sorted(b.doc_ids)) for r in range(world) for b in data.eval_batches(small, batch_size, r, world)
                if b.doc_ids]  # each batch's documents (a packed row lays them longest first)
    assert batches(1) == in_order
    assert sorted(batches(2)) == sorted(batches(4)) == in_order
    work = lambda steps, world: sum(world * max(len(d) * int(small.lengths[list(d)].max()) for d in step if d)
                                    for step in steps)
    for world in (2, 4):
        placed = [[tuple(d) for d in step] for step in data.eval_placement(small.lengths, batch_size, world)]
        ordered = [in_order[i:i + world] for i in range(0, len(in_order), world)]
        assert work(placed, world) < work(ordered, world)
        assert all(max(len(d) for d in step) for step in placed)  # no step without a document
