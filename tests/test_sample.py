"""Sampling with a KV cache against recomputing the whole sequence, and an export that transformers
tokenizes and generates from exactly as the kit does."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

import model
from plumbing import corpora, tokenizer
from plumbing.hf_qwen3 import ModelConfig
from tools import sample

ROOT = Path(__file__).resolve().parents[1]
TOY_VOCAB = 4096  # the toy preset's: ranks 0..4095, <|endoftext|> = 4096


def tiny_teacher(vocab_size: int) -> model.Qwen3:
    config = ModelConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    teacher = model.Qwen3(config)
    teacher.init_weights(0)
    with torch.no_grad():
        for p in teacher.parameters():  # sharper logits than at init, so greedy choices are clear-cut
            p.mul_(8.0 if p.ndim > 1 else 1.0)
    return teacher.eval()


def recomputed_greedy(net, prompt, steps, eos):
    ids, out = list(prompt), []
    for _ in range(steps):
        with torch.no_grad():
            token = int(net(torch.tensor([ids]))[0, -1].argmax())
        out.append(token)
        if token == eos:
            break
        ids.append(token)
    return out


@pytest.mark.parametrize("kind", ["teacher", "pre", "post"])
def test_cached_generation_equals_recomputing_the_whole_sequence(kind):
    teacher = tiny_teacher(60)
    net = teacher if kind == "teacher" else model.Student.from_teacher(teacher, 3, 1, kind, seed=1).eval()
    prompt, never = [59, 3, 7, 11], -1
    greedy = sample.generate(net, prompt, 16, eos_id=never)
    assert greedy == recomputed_greedy(net, prompt, 16, never) and len(greedy) == 16
    assert len(set(greedy)) > 1  # not one token over and over: the cache's positions matter
    eos = greedy[5]
    assert sample.generate(net, prompt, 16, eos) == greedy[:greedy.index(eos) + 1]  # stops at eos, included
    assert sample.generate(net, prompt, 16, never, temperature=1.0, top_k=1) == greedy  # top-1 is greedy
    drawn = sample.generate(net, prompt, 16, never, temperature=1.0, seed=3)
    assert drawn == sample.generate(net, prompt, 16, never, temperature=1.0, seed=3)  # reproducible by seed
    assert all(0 <= t < 60 for t in drawn)
    seen = []  # streamed: told each token as it comes, the ids so far
    assert sample.generate(net, prompt, 16, never, on_token=lambda ids: seen.append(list(ids))) == greedy
    assert seen == [greedy[:i] for i in range(1, 17)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A pre-norm student over the toy vocabulary, exported with `repro.py export`."""
    tmp = tmp_path_factory.mktemp("export")
    enc = tokenizer.qwen3_tokenizer(TOY_VOCAB)
    student = model.Student.from_teacher(tiny_teacher(enc.n_vocab), 2, 1, "pre", seed=1)
    student.save(tmp / "student")
    out = subprocess.run([sys.executable, str(ROOT / "repro.py"), "export", str(tmp / "student"), str(tmp / "hf"),
                          "--runs-dir", str(tmp / "runs")], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return tmp / "hf", enc


def test_exported_tokenizer_gives_the_kits_ids(exported):
    folder, enc = exported
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    documents = corpora.corpus("toy", n_val=200, seed=42).validation_documents()
    documents += ["café ﬁ Ångström 日本語 😀 \r\n\t  x", "12345 $+= ..."]
    for text in documents:
        assert hf(text, add_special_tokens=False)["input_ids"] == enc.encode(text), text[:60]
        assert hf.decode(enc.encode(text)) == enc.decode(enc.encode(text))
    # Special-token text becomes its id in HF tokenizers, as in Qwen3's own; the kit does so when asked.
    text = "<|endoftext|> as text"
    assert hf(text, add_special_tokens=False)["input_ids"] == enc.encode(text, allowed_special="all")
    assert hf.eos_token_id == hf.pad_token_id == enc.eot and len(hf) == enc.n_vocab


def test_transformers_generate_on_an_export_equals_repro_sample(exported):
    folder, enc = exported
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    prompt = "The state of the Union"
    ids = [enc.eot] + enc.encode(prompt)
    with torch.no_grad():
        theirs = hf.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False)[0, len(ids):].tolist()
    ours = sample.generate(sample.load_checkpoint(folder), ids, 20, enc.eot)
    assert ours == theirs and len(ours) > 1
    out = subprocess.run([sys.executable, str(ROOT / "repro.py"), "sample", str(folder), "--prompt", prompt,
                          "--max-new-tokens", "20"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip("\n") == prompt + enc.decode([t for t in ours if t != enc.eot])
