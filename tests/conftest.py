"""Shared fixtures and helpers: tiny token shards from the embedded corpus, a tiny random Qwen3 teacher,
tiny run settings, the CLI run in this process, and a two-rank torchrun of grow.py."""
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
import torch

from plumbing import tokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Two cores: several processes each spinning two threads slow everything down; tests use one.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import config  # noqa: E402
import data  # noqa: E402
import model  # noqa: E402
from plumbing.hf_qwen3 import ModelConfig, save_qwen3  # noqa: E402

TINY_VOCAB = 512
# The tests' model: a 2-layer Qwen3 over the tiny vocabulary (512 ranks + <|endoftext|>), tied head.
TINY_MODEL = ModelConfig(vocab_size=TINY_VOCAB + 1, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)


def make_config(**overrides) -> config.RunConfig:
    """Tiny run settings in fp32 (the same numbers on every CPU); keywords replace any of them."""
    base = dict(name="t", protocol="grow", norm="post", seed=42, blocks=3, layers_per_block=2, phase_steps=200,
                global_batch=8, micro_batch=2, lr=1e-3, min_lr=1e-5, warmup_frac=0.05, betas=(0.9, 0.95),
                eps=1e-8, weight_decay=0.0, grad_clip=0.5, alpha=0.7, gamma=0.3, tau=1.0, loss_chunk=64,
                train_data="", val_data="", replay_docs=64, eval_interval=100, eval_batch=4,
                checkpoint_interval=50, precision="fp32")
    return config.RunConfig(**{**base, **overrides})


def distil_config(shards, teacher_dir, **overrides) -> config.RunConfig:
    """A short distillation run on the tiny shards and teacher (6 steps a phase, 8 documents a step)."""
    train, val = shards
    base = dict(train_data=str(train.path), val_data=str(val.path), teacher=str(teacher_dir), layers_per_block=1,
                phase_steps=6, global_batch=8, micro_batch=4, replay_docs=40, eval_interval=3, eval_batch=8,
                checkpoint_interval=2, loss_chunk=50, lr=3e-3, min_lr=3e-5, warmup_frac=0.2)
    return make_config(**{**base, **overrides})


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def repro_cli(*args, check: bool = True) -> CliResult:
    """`repro.py ARGS` in this process (click's CliRunner: no interpreter start-up), as a subprocess's
    result would read. A kit error is its one line on stderr and a non-zero code; any other exception is
    a bug and is raised here. check: fail the test unless the command succeeded."""
    from click.testing import CliRunner

    import repro
    result = CliRunner().invoke(repro.cli, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    out = CliResult(result.exit_code, result.stdout, result.stderr)
    if check:
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def torchrun(config_file, run_dir, *extra):
    """grow.py on two gloo ranks (the OS picks the port), one thread each; fails the test on an error."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "grow.py"), str(config_file), "--run-dir", str(run_dir), *extra]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]


def two_ranks_and_one_process(c: config.RunConfig, tmp_path: Path) -> dict:
    """The run `c` in one process (tmp_path/single) and on two torchrun ranks (tmp_path/fsdp), whose final CE
    must be the same to the bit; the one process's result."""
    import grow
    single = grow.train(c, tmp_path / "single")
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(asdict(c)))
    torchrun(config_file, tmp_path / "fsdp")
    assert json.loads((tmp_path / "fsdp" / "provenance.json").read_text())["world_size"] == 2
    assert json.loads((tmp_path / "fsdp" / "done.json").read_text())["ce"] == single["ce"]
    return single


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory):
    """(train, val) shards: 400 training paragraphs of the toy corpus, 16 validation ones."""
    enc = tokenizer.qwen3_tokenizer(vocab_size=TINY_VOCAB)
    return data.prepare("toy", tmp_path_factory.mktemp("data"), enc, max_len=32, n_train_docs=400,
                        n_val_docs=16, seed=0, workers=1, progress=False)


@pytest.fixture(scope="session")
def tiny_teacher_dir(tmp_path_factory):
    """A random 2-layer Qwen3 over the tiny vocabulary, saved as a HF checkpoint (tied head)."""
    teacher = model.Qwen3(TINY_MODEL)
    teacher.init_weights(seed=7)
    with torch.no_grad():
        for p in teacher.parameters():  # a larger scale than init, so the teacher's logits are not flat
            p.mul_(8.0 if p.ndim > 1 else 1.0)
    path = tmp_path_factory.mktemp("teacher") / "qwen3"
    save_qwen3(teacher, path)
    return path


def pytest_collection_modifyitems(items):
    """Tests built on test_repro.py's whole smoke suite (`smoke`) are slow too; the bad-input table's
    `tree` (one smoke table1, built once for ~290 cases) is not."""
    for item in items:
        if "smoke" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
