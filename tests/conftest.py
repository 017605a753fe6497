"""Shared fixtures: tiny token shards from the embedded corpus and a tiny random Qwen3 teacher."""
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Two cores: several processes each spinning two threads slow everything down; tests use one.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import data  # noqa: E402
import model  # noqa: E402

TINY_VOCAB = 512


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory):
    """(train, val) shards: 400 training paragraphs of the toy corpus, 16 validation ones."""
    enc = data.qwen3_tokenizer(vocab_size=TINY_VOCAB)
    return data.prepare("toy", tmp_path_factory.mktemp("data"), enc, max_len=32, n_train_docs=400,
                        n_val_docs=16, seed=0, workers=1, progress=False)


@pytest.fixture(scope="session")
def tiny_teacher_dir(tmp_path_factory):
    """A random 2-layer Qwen3 over the tiny vocabulary, saved as a HF checkpoint (tied head)."""
    config = model.ModelConfig(vocab_size=TINY_VOCAB + 1, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)
    teacher = model.Qwen3(config)
    teacher.init_weights(seed=7)
    with torch.no_grad():
        for p in teacher.parameters():  # a larger scale than init, so the teacher's logits are not flat
            p.mul_(8.0 if p.ndim > 1 else 1.0)
    path = tmp_path_factory.mktemp("teacher") / "qwen3"
    model.save_qwen3(teacher, path)
    return path


def pytest_collection_modifyitems(items):
    """Tests built on the whole smoke suite (tests/test_repro.py's `smoke` fixture) are slow too."""
    for item in items:
        if "smoke" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
