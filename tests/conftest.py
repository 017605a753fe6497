"""Shared fixtures and helpers: tiny token shards from the embedded corpus, a tiny random Qwen3 teacher,
tiny run settings, the CLI run in this process, a two-rank torchrun of tests/run_grow.py, a checkpoint's weights,
and the bad-input table's paths, commands and damage (test_bad_inputs.py and its bad_*.py cases)."""
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch

from plumbing import checkpoint, tokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Two cores: several processes each spinning two threads slow everything down; tests use one.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import model  # noqa: E402
from config import RunConfig  # noqa: E402
from experiments import prepare_shards  # noqa: E402
from plumbing.hf_qwen3 import ModelConfig, save_qwen3  # noqa: E402

TINY_VOCAB = 512
# The tests' model: a 2-layer Qwen3 over the tiny vocabulary (512 ranks + <|endoftext|>), tied head.
TINY_MODEL = ModelConfig(vocab_size=TINY_VOCAB + 1, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)


def make_config(**overrides) -> RunConfig:
    """Tiny run settings in fp32 (the same numbers on every CPU); keywords replace any of them."""
    base = dict(name="t", protocol="grow", norm="post", seed=42, blocks=3, layers_per_block=2, phase_steps=200,
                global_batch=8, micro_batch=2, lr=1e-3, min_lr=1e-5, warmup_frac=0.05, betas=(0.9, 0.95),
                eps=1e-8, weight_decay=0.0, grad_clip=0.5, alpha=0.7, gamma=0.3, tau=1.0, loss_chunk=64,
                train_data="", val_data="", replay_docs=64, eval_interval=100, eval_batch=4,
                checkpoint_interval=50, precision="fp32")
    return RunConfig(**{**base, **overrides})


def distil_config(shards, teacher_dir, **overrides) -> RunConfig:
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


def suite_config(scale: str, norm: str, protocol: str, seed: int) -> str:
    """The config.json the kit writes for the suite's run (norm, protocol) at `scale` and `seed` (paths relative)."""
    from experiments import suite
    ws = suite.workspace(scale, Path("runs"), dry_run=True)
    return json.dumps(asdict(suite.run_config(ws, suite.RunName(norm, protocol), seed)))


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
    """tests/run_grow.py on two gloo ranks (the OS picks the port), one thread each; fails the test on an error."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "tests" / "run_grow.py"), str(config_file), "--run-dir", str(run_dir), *extra]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]


def two_ranks_and_one_process(c: RunConfig, tmp_path: Path) -> dict:
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


def phase_weights(run_dir, phase):
    """A phase checkpoint's tensors: model.safetensors (one process) or the files of its HF index (FSDP2)."""
    return kept_weights(Path(run_dir) / f"phase-{phase}")


def kept_weights(folder: Path) -> dict:
    from safetensors.torch import load_file
    return {k: v for file in sorted(set(checkpoint.tensor_files(folder).values())) for k, v in load_file(file).items()}


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory):
    """(train, val) shards: 400 training paragraphs of the toy corpus, 16 validation ones."""
    enc = tokenizer.qwen3_tokenizer(vocab_size=TINY_VOCAB)
    return prepare_shards.prepare("toy", tmp_path_factory.mktemp("data"), enc, max_len=32, n_train_docs=400,
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
    """Tests built on test_smoke_suite.py's whole smoke suite (`smoke`) are slow too; the bad-input table's
    `tree` (one smoke table1, built once for ~290 cases) is not."""
    for item in items:
        if "smoke" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


# ---- the bad-input table (tests/test_bad_inputs.py and its cases: bad_*.py) ----------------------
# Paths in the finished smoke tree it builds, the commands run on it, and the damage a case does.
RUNS = "{R}/smoke"
PRE = f"{RUNS}/s42/pre-grow/phase-2"      # a pre-norm student checkpoint (exportable)
POST = f"{RUNS}/s42/post-grow/phase-2"    # a post-norm one
TEACHER = f"{RUNS}/teacher/phase-0"       # the kit's own teacher, a plain HF Qwen3 folder
VAL = f"{RUNS}/data/val"
TRAIN = f"{RUNS}/data/train"


def at(case: Path, template: str) -> Path:
    return Path(template.format(R=case / "R", S=case / "S", C=case))


def edit_json(template: str, change: Callable):
    """Rewrite a JSON file with change(value) (which may edit in place and return None)."""
    def apply(case):
        path = at(case, template)
        value = json.loads(path.read_text())
        new = change(value)
        path.write_text(json.dumps(value if new is None else new, indent=1))
    return apply


def write(template: str, content: str | bytes):
    def apply(case):
        path = at(case, template)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return apply


def truncate(template: str, keep: float = 0.5):
    def apply(case):
        path = at(case, template)
        path.write_bytes(path.read_bytes()[:int(path.stat().st_size * keep)])
    return apply


def delete(template: str):
    def apply(case):
        path = at(case, template)
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return apply


def copy(source: str, target: str):
    return lambda case: shutil.copytree(at(case, source), at(case, target))


def make_dir(template: str):
    return lambda case: at(case, template).mkdir(parents=True, exist_ok=True)


def flip_byte(template: str, offset_from_end: int = 16):
    def apply(case):
        path = at(case, template)
        data = bytearray(path.read_bytes())
        data[-offset_from_end] ^= 0xFF
        path.write_bytes(bytes(data))
    return apply


def unchecked(ckpt: str, *more: Callable) -> list[Callable]:
    """A checkpoint without checksums.json (an older kit's, or one assembled by hand): the damage
    that follows must be caught by validating its contents, not by a checksum."""
    return [delete(f"{ckpt}/checksums.json"), *more]


def config(ckpt: str, **values) -> Callable:
    """Set fields of a checkpoint's config.json."""
    return edit_json(f"{ckpt}/config.json", lambda c: c.update(values))


def drop(template: str, *keys: str) -> Callable:
    def change(value):
        target = value
        for k in keys[:-1]:
            target = target[k]
        del target[keys[-1]]
    return edit_json(template, change)


GOOD_REFERENCE = json.dumps({"seeds": [42], "git_commit": "", "curves": {"pre-grow": {"24": [5.39]}},
                             "final_ce": {"pre-grow": [5.39]}, "tables": {}})


@dataclass
class Case:
    args: list[str]                 # {R}: the runs folder, {S}: the results folder, {C}: the case folder
    names: str | tuple[str, ...]    # what the one line must contain: the option, or the file at fault
    damage: list[Callable] = field(default_factory=list)
    setup: Callable | None = None   # (case folder, monkeypatch): a preset or environment for the case


def case(id, args, names, *damage, setup=None, marks=()):
    return pytest.param(Case(list(args), names, list(damage), setup), id=id, marks=marks)


RUN = ["--scale", "smoke", "--runs-dir", "{R}", "--results-dir", "{S}"]
TABLE1 = ["table1", *RUN]
TRAIN_RUN = ["train", "--scale", "smoke", "--norm", "post", "--protocol", "grow", "--runs-dir", "{R}"]
EVAL = lambda ckpt, *more: ["eval", ckpt, "--runs-dir", "{R}", "--json", *more]
SAMPLE = lambda ckpt, *more: ["sample", ckpt, "--prompt", "The Union", "--max-new-tokens", "4", "--runs-dir", "{R}",
                              *more]
EXPORT = lambda ckpt, out, *more: ["export", ckpt, out, "--runs-dir", "{R}", *more]
not_root = pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
