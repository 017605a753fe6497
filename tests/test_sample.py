"""Sampling with a KV cache against recomputing the whole sequence, and an export that transformers
tokenizes and generates from exactly as the kit does."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from conftest import repro_cli

import model
from plumbing import corpora, errors, tokenizer
from plumbing.hf_qwen3 import ModelConfig, save_qwen3
from tools import checkpoints, sample

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
    ours = sample.generate(checkpoints.load_checkpoint(folder, checkpoints.checkpoint_config(folder)), ids, 20, enc.eot)
    assert ours == theirs and len(ours) > 1
    out = subprocess.run([sys.executable, str(ROOT / "repro.py"), "sample", str(folder), "--prompt", prompt,
                          "--max-new-tokens", "20"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip("\n") == prompt + enc.decode([t for t in ours if t != enc.eot])


# ---- issue 47: the paths users type -------------------------------------------------------------

SHIPPED = ROOT / "teachers" / "toy"


def test_a_teacher_folder_samples_its_newest_phase_and_says_so():
    """`sample teachers/toy` (the README's folder) took its config.json of run settings for a checkpoint's and
    asked for a Qwen3 one; now it samples teachers/toy/phase-0, the same text, and says so on stderr."""
    args = ["--prompt", "The Union", "--max-new-tokens", "12"]
    folder, phase = repro_cli("sample", SHIPPED, *args), repro_cli("sample", SHIPPED / "phase-0", *args)
    assert folder.stdout == phase.stdout and phase.stdout.startswith("The Union") and len(phase.stdout) > 20
    assert folder.stderr.strip() == f"{SHIPPED}: a run folder; using its newest phase checkpoint, {SHIPPED / 'phase-0'} " \
                                    "(the run finished)" and phase.stderr == ""


def test_max_new_tokens_past_the_trained_context_is_one_line_naming_the_limit():
    """The toy trained on data.max_len 128: 5,000 new tokens were accepted against Qwen3's 40,960 positions; now
    one line naming the option and the limit (128 less the prompt's 4 tokens)."""
    out = repro_cli("sample", SHIPPED / "phase-0", "--prompt", "The Union", "--max-new-tokens", "5000", check=False)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "Error: Invalid value for --max-new-tokens: 5,000: with the prompt's 4 token(s) that passes the 128 positions "
        f"{SHIPPED / 'phase-0'} was trained on (data.max_len of the toy preset); ask for at most 124"]
    assert repro_cli("sample", SHIPPED / "phase-0", "--prompt", "The Union", "--max-new-tokens", "124").returncode == 0


def test_without_max_new_tokens_at_most_64_or_what_the_trained_context_leaves(monkeypatch, tmp_path):
    asked = []
    monkeypatch.setattr(sample, "generate", lambda net, ids, n, *args, **kwargs: asked.append((len(ids), n)) or [])
    prompt = " Union" * 40  # 2 tokens each
    for text in ("The Union", prompt):
        sample.continue_prompt(SHIPPED / "phase-0", text, None, 0.0, 0, 0, tmp_path, lambda *a, **k: None)
    (short, new), (long, rest) = asked
    assert new == 64 and 64 > rest == 128 - long > 0
    with pytest.raises(errors.OptionError, match=r"--prompt: .* fill the 128 positions"):
        sample.continue_prompt(SHIPPED / "phase-0", prompt * 4, None, 0.0, 0, 0, tmp_path, lambda *a, **k: None)


def test_the_trained_context_is_the_runs_shard_else_its_scales_else_max_position_embeddings(tiny_shards, tmp_path):
    """A student in a run folder: its training shard's max_len (tiny_shards: 32); the same checkpoint outside
    one (an export, a copy): the largest data.max_len of the scales of its vocabulary (smoke's 32, of 513
    ids); a Qwen3 that is not the kit's (a hub teacher): its max_position_embeddings."""
    run = tmp_path / "run"
    student = model.Student.from_teacher(tiny_teacher(513), 2, 1, "post", seed=1)
    student.save(run / "phase-1")
    (run / "metrics.jsonl").write_text("")
    (run / "config.json").write_text(json.dumps({"train_data": "../data/train", "relative_to_run": True}))
    shutil.copytree(tiny_shards[0].path, tmp_path / "data" / "train")
    big = json.loads((tmp_path / "data" / "train" / "manifest.json").read_text())
    (tmp_path / "data" / "train" / "manifest.json").write_text(json.dumps({**big, "max_len": 48}))
    config = checkpoints.checkpoint_config(run / "phase-1")
    assert checkpoints.trained_context(run / "phase-1", config) == (48, f"data.max_len of its training shard "
                                                                        f"{(tmp_path / 'data' / 'train').resolve()}")
    shutil.copytree(run / "phase-1", tmp_path / "copy")
    assert checkpoints.trained_context(tmp_path / "copy", config) == (32, "data.max_len of the smoke preset")
    save_qwen3(tiny_teacher(513), tmp_path / "hub")
    hub = checkpoints.checkpoint_config(tmp_path / "hub")
    assert checkpoints.trained_context(tmp_path / "hub", hub) == (40960, "max_position_embeddings")


def make_phase(run: Path, p: int):
    (run / f"phase-{p}").mkdir(parents=True)
    (run / f"phase-{p}" / "config.json").write_text("{}")


def test_a_run_folder_is_its_newest_phase_checkpoint_and_a_run_without_one_says_what_it_holds(tmp_path):
    run = tmp_path / "runs" / "toy" / "s42" / "post-grow"
    said = []
    for p in (0, 1, 2):
        make_phase(run, p)
    (run / "step-20").mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 30, "ce": 5.0}) + "\n")
    assert checkpoints.checkpoint_in(run, said) == run / "phase-2"
    assert said == [f"{run}: a run folder; using its newest phase checkpoint, {run / 'phase-2'} (the run is "
                    "unfinished: a later phase may follow)"]
    (run / "done.json").write_text("{}")
    assert checkpoints.checkpoint_in(run, said) == run / "phase-2" and said[-1].endswith("(the run finished)")
    assert checkpoints.checkpoint_in(run / "phase-1", said) == run / "phase-1" and len(said) == 2
    with pytest.raises(errors.CheckpointError, match=r"runs/toy: holds runs, not a checkpoint; pass one run folder or "
                                                     r"checkpoint, e.g. .*s42/post-grow"):
        checkpoints.checkpoint_in(tmp_path / "runs" / "toy", said)
    for p in (0, 1, 2):
        shutil.rmtree(run / f"phase-{p}")
    (run / "done.json").unlink()
    with pytest.raises(errors.CheckpointError, match=r"post-grow: holds no finished checkpoint yet \(its first phase "
                                                     r"still training, at step 30\); rerun the command"):
        checkpoints.checkpoint_in(run, said)
    (run / "phase-0.tmp").mkdir()
    with pytest.raises(errors.CheckpointError, match=r"post-grow: holds no finished checkpoint yet \(phase-0 only partly "
                                                     r"written: phase-0.tmp/"):
        checkpoints.checkpoint_in(run, said)
    (run / "record.json").write_text("{}")
    with pytest.raises(errors.CheckpointError, match=r"post-grow: a run folder restored from its record \(record.json: "
                                                     r"its numbers, without weights\); move it away"):
        checkpoints.checkpoint_in(run, said)
