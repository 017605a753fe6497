"""Bad inputs (issue 14): every one fails with exactly one line of output, "Error: ..." naming the file
or option at fault, exits non-zero, and leaves everything the user had exactly as it was (the whole
case folder, a copy of a finished smoke runs tree and its results, is hashed before and after).

Each case copies one smoke tree (`table1 --scale smoke`, built once per module), damages the copy,
and invokes the CLI in this process with click's CliRunner. A case passes only if the kit itself turned
the fault into its one-line error (an exception that escapes the kit counts as a traceback)."""
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

import repro
from experiments import presets, reference, suite
from plumbing import errors

smoke_set = lambda *items: presets.parse_overrides(presets.PRESETS["smoke"], items)  # --set items, as the CLI parses them

ROOT = Path(__file__).resolve().parents[1]
RUNS = "{R}/smoke"
PRE = f"{RUNS}/s42/pre-grow/phase-2"      # a pre-norm student checkpoint (exportable)
POST = f"{RUNS}/s42/post-grow/phase-2"    # a post-norm one
TEACHER = f"{RUNS}/teacher/phase-0"       # the kit's own teacher, a plain HF Qwen3 folder
VAL = f"{RUNS}/data/val"
TRAIN = f"{RUNS}/data/train"


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A finished smoke table1 (data, teacher, the four runs of seed 42) in R/ and its results in S/."""
    base = tmp_path_factory.mktemp("tree")
    out = subprocess.run([sys.executable, str(ROOT / "repro.py"), "table1", "--scale", "smoke", "--runs-dir",
                          str(base / "R"), "--results-dir", str(base / "S")], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return base


def tree_hash(root: Path) -> str:
    """sha256 over every path under root (folders too: a stub folder is a change) and every file's bytes."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        if path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
        digest.update(b"\1")
    return digest.hexdigest()


# ---- damage: each takes the case folder (R/, S/ and anything else a case makes) -------------------

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


def edit_tensors(template: str, change: Callable[[dict], None]):
    """Rewrite a checkpoint's model.safetensors with change(tensors) applied in place."""
    def apply(case):
        path = at(case, template) / "model.safetensors"
        tensors = load_file(path)
        change(tensors)
        save_file(tensors, path, metadata={"format": "pt"})
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


def shape(ckpt: str, **values) -> Callable:
    return edit_json(f"{ckpt}/config.json", lambda c: c["normgrow_student"].update(values))


def first_tensor(change: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[dict], None]:
    def apply(tensors):
        name = "layers.0.self_attn.q_proj.weight"
        tensors[name] = change(tensors[name])
    return apply


PICKLE = pickle.dumps(print)  # a pickle (of a harmless callable) where safetensors are expected: never unpickled


def reference_file(content: str):
    """A shipped reference for --scale smoke in the case's own references/ (never the repository's)."""
    return write("{C}/references/smoke.json", content)


GOOD_REFERENCE = json.dumps({"seeds": [42], "git_commit": "", "curves": {"pre-grow": {"24": [5.39]}},
                             "final_ce": {"pre-grow": [5.39]}, "tables": {}})


def hub_teacher(name: str):
    """The smoke preset with a teacher from the hub (or a local folder), offline, with an empty cache."""
    def setup(case, monkeypatch):
        monkeypatch.setitem(presets.PRESETS, "smoke", replace(presets.PRESETS["smoke"], teacher=name))
        import huggingface_hub.constants as hub
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(hub, "HF_HUB_CACHE", str(case / "hf-cache"))
    return setup


def local_teacher(name: str):
    """The smoke preset with a teacher from a folder of the case."""
    return lambda case, monkeypatch: hub_teacher(str(case / name))(case, monkeypatch)


# ---- the table ---------------------------------------------------------------------------------

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
FRESH = ["table1", "--scale", "smoke", "--runs-dir", "{C}/fresh", "--results-dir", "{S}"]  # an empty runs folder
TRAIN_RUN = ["train", "--scale", "smoke", "--norm", "post", "--protocol", "grow", "--runs-dir", "{R}"]
EVAL = lambda ckpt, *more: ["eval", ckpt, "--runs-dir", "{R}", "--json", *more]
SAMPLE = lambda ckpt, *more: ["sample", ckpt, "--prompt", "The Union", "--max-new-tokens", "4", "--runs-dir", "{R}",
                              *more]
EXPORT = lambda ckpt, out, *more: ["export", ckpt, out, "--runs-dir", "{R}", *more]
COMPARE = lambda target: ["compare", target, "--scale", "smoke"]
RELABEL = ("undetectable: a post-norm student's tensors have the names and shapes of a pre-norm one's, and a "
           "checkpoint without checksums.json has nothing else to check the label against")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for machines without CUDA")
not_root = pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
SET = lambda item: case(f"set {item}", [*TRAIN_RUN, "--set", item],
                        ("--set", item.split("=")[0].split(".")[-1] or item))  # the option and the key

CLI_OPTIONS = [
    case("train --seed -1", [*TRAIN_RUN, "--seed", "-1"], "--seed"),
    case("train --seed 2^63", [*TRAIN_RUN, "--seed", str(2**63)], "--seed"),
    case("train --seed text", [*TRAIN_RUN, "--seed", "x"], "--seed"),
    case("train --seed 4.2", [*TRAIN_RUN, "--seed", "4.2"], "--seed"),
    case("--seeds empty", [*TABLE1, "--seeds", ""], "--seeds"),
    case("--seeds commas only", [*TABLE1, "--seeds", ", ,"], "--seeds"),
    case("--seeds duplicate", [*TABLE1, "--seeds", "42,42"], "--seeds"),
    case("--seeds text", [*TABLE1, "--seeds", "42,x"], "--seeds"),
    case("--seeds negative", [*TABLE1, "--seeds", "42,-1"], "--seeds"),
    case("--seeds 2^63", [*TABLE1, "--seeds", str(2**63)], "--seeds"),
    case("--seeds float", [*TABLE1, "--seeds", "42.5"], "--seeds"),
    case("regime --seeds duplicate", ["regime", *RUN, "--seeds", "1,1"], "--seeds"),
    case("placements --seeds negative", ["placements", *RUN, "--seeds", "-3"], "--seeds"),
    case("reference --seeds empty", ["reference", *RUN, "--seeds", ""], "--seeds"),
    case("--gpus 0", ["all", "--scale", "full", "--dry-run", "--gpus", "0", "--runs-dir", "{R}"], "--gpus"),
    case("--gpus negative", ["all", "--scale", "full", "--dry-run", "--gpus", "-8", "--runs-dir", "{R}"], "--gpus"),
    case("--gpus text", ["all", "--scale", "full", "--dry-run", "--gpus", "eight", "--runs-dir", "{R}"], "--gpus"),
    case("--gpu unknown", ["all", "--scale", "full", "--dry-run", "--gpu", "tpu", "--runs-dir", "{R}"], "--gpu"),
    case("unknown experiment", ["tablex", *RUN], "tablex"),
    case("unknown experiment among known", ["table1", "fig9", *RUN], "fig9"),
    case("unknown scale", ["table1", "--scale", "huge", "--runs-dir", "{R}"], "--scale"),
    case("empty scale", ["table1", "--scale", "", "--runs-dir", "{R}"], "--scale"),
    case("unknown option", [*TABLE1, "--bogus"], "--bogus"),
    case("train --norm unknown", ["train", "--scale", "smoke", "--norm", "mid", "--protocol", "grow", "--runs-dir",
                                  "{R}"], "--norm"),
    case("train --norm empty", ["train", "--scale", "smoke", "--norm", "", "--protocol", "grow", "--runs-dir", "{R}"],
         "--norm"),
    case("train --norm schedule with an unknown placement",
         ["train", "--scale", "smoke", "--norm", "pre,mid,post", "--protocol", "grow", "--runs-dir", "{R}"], "--norm"),
    case("train --norm schedule of 2 for 3 blocks",
         ["train", "--scale", "smoke", "--norm", "pre,post", "--protocol", "grow", "--runs-dir", "{R}"], "--norm"),
    case("train --protocol unknown", ["train", "--scale", "smoke", "--norm", "post", "--protocol", "scratch",
                                      "--runs-dir", "{R}"], "--protocol"),
    case("train without --protocol", ["train", "--scale", "smoke", "--norm", "post", "--runs-dir", "{R}"],
         "--protocol"),
    case("--device cuda without CUDA", [*TRAIN_RUN, "--device", "cuda"], "--device cuda", marks=no_cuda),
    case("--device unknown", [*TRAIN_RUN, "--device", "tpu"], "--device"),
    case("--log unknown", [*TRAIN_RUN, "--log", "mlflow"], "--log"),
    case("--scale small without CUDA", ["teacher", "--scale", "small", "--runs-dir", "{R}"], "--scale small",
         marks=no_cuda),
    case("sample --max-new-tokens 0", SAMPLE(PRE, "--max-new-tokens", "0"), "--max-new-tokens"),
    case("sample --max-new-tokens text", SAMPLE(PRE, "--max-new-tokens", "many"), "--max-new-tokens"),
    case("sample --temperature -1", SAMPLE(PRE, "--temperature", "-1"), "--temperature"),
    case("sample --temperature nan", SAMPLE(PRE, "--temperature", "nan"), "--temperature"),
    case("sample --temperature inf", SAMPLE(PRE, "--temperature", "inf"), "--temperature"),
    case("sample --top-k -1", SAMPLE(PRE, "--top-k", "-1"), "--top-k"),
    case("sample --seed -1", SAMPLE(PRE, "--seed", "-1"), "--seed"),
    case("sample --seed 2^63", SAMPLE(PRE, "--seed", str(2**63)), "--seed"),
    case("eval --scale unknown", EVAL(PRE, "--scale", "huge"), "--scale"),
    case("eval extra argument", EVAL(PRE, PRE), "unexpected extra argument"),
    case("regime --grid unknown axis", ["regime", *RUN, "--grid", "depth=1,2"], "--grid"),
    case("regime --grid text", ["regime", *RUN, "--grid", "budget=x"], "--grid"),
    case("regime --grid unknown gain", ["regime", *RUN, "--grid", "gain=twos"], "--grid"),
    case("regime --grid zero", ["regime", *RUN, "--grid", "lr=0"], "--grid"),
    case("regime --grid empty axis", ["regime", *RUN, "--grid", "budget="], "--grid"),
    case("regime --grid nan", ["regime", *RUN, "--grid", "lr=nan"], "--grid"),
    case("regime --grid too large", ["regime", *RUN, "--grid", "budget=200"], "--grid"),
]

OVERRIDES = [SET(item) for item in (
    "lr=1", "run.lr", "bogus.lr=1", "run.=1", "run.nope=1", "run.lr=abc", "run.lr=-1", "run.lr=nan", "run.lr=inf",
    "run.phase_steps=2.5", "run.phase_steps=0", "run.blocks=0", "run.layers_per_block=0", "run.global_batch=0",
    "run.micro_batch=0", "run.micro_batch=3", "run.eval_batch=0", "run.loss_chunk=0", "run.eval_interval=0",
    "run.checkpoint_interval=0", f"run.seed={2**63}", "run.betas=0.9", "run.betas=0.9,0.95,0.99", "run.betas=0.9,x",
    "run.betas=nan,0.95", "run.betas=1.5,0.95", "run.warmup_frac=2", "run.compile=maybe", "run.precision=fp8",
    "run.post_output_gain=half", "run.boundary=wall", "run.phase_lrs=1e-3", "run.phase_lrs=1e-3,0,1e-3",
    "run.phase_warmups=5,5", "run.scratch_model=5", "run.teacher=/elsewhere/teacher", "run.joint_phases=5",
    "teacher_model.hidden_size=0", "teacher_model.num_key_value_heads=0", "teacher_model.num_attention_heads=3",
    "teacher_model.head_dim=0", "teacher_model.num_hidden_layers=0", "teacher_model.vocab_size=100",
    "teacher_model.rms_norm_eps=nan", "teacher_model.tie_word_embeddings=maybe", "teacher_run.phase_steps=0",
    "teacher_run.lr=abc", "data.vocab_size=100", "data.max_len=0", "data.val_docs=0", "data.source=nowhere",
    "data.source=local", "data.val_docs=1.5", "data.bogus=1", "diag.docs=0", "diag.max_inputs=0",
    "diag.seed=-1",
)]

FOLDERS = [
    case("--runs-dir is a file", [*TABLE1[:-4], "--runs-dir", "{C}/file", "--results-dir", "{S}"], "--runs-dir",
         write("{C}/file", "x")),
    case("--results-dir is a file", ["table1", "--scale", "smoke", "--runs-dir", "{R}", "--results-dir", "{C}/file"],
         "--results-dir", write("{C}/file", "x")),
    case("--runs-dir under a file", ["table1", "--scale", "smoke", "--runs-dir", "{C}/file/runs", "--results-dir",
                                     "{S}"], "--runs-dir", write("{C}/file", "x")),
    case("--runs-dir in /proc", ["table1", "--scale", "smoke", "--runs-dir", "/proc/normgrow-runs", "--results-dir",
                                 "{S}"], "--runs-dir"),
    case("--runs-dir read-only", ["table1", "--scale", "smoke", "--runs-dir", "{C}/ro", "--results-dir", "{S}"],
         "--runs-dir", lambda case: (case / "ro").mkdir(mode=0o555), marks=not_root),
    case("data --runs-dir is a file", ["data", "--scale", "smoke", "--runs-dir", "{C}/file"], "--runs-dir",
         write("{C}/file", "x")),
    case("teacher --runs-dir is a file", ["teacher", "--scale", "smoke", "--runs-dir", "{C}/file"], "--runs-dir",
         write("{C}/file", "x")),
    case("train --runs-dir is a file", [*TRAIN_RUN[:-1], "{C}/file"], "--runs-dir", write("{C}/file", "x")),
    case("regime --runs-dir is a file", ["regime", "--scale", "smoke", "--runs-dir", "{C}/file"], "--runs-dir",
         write("{C}/file", "x")),
    case("placements --results-dir is a file", ["placements", "--scale", "smoke", "--runs-dir", "{R}",
                                                "--results-dir", "{C}/file"], "--results-dir", write("{C}/file", "x")),
]

CHECKPOINTS = [
    case("eval a missing folder", EVAL(f"{RUNS}/s42/pre-grow/phase-9"), "phase-9"),
    case("eval a file", EVAL(f"{RUNS}/s42/pre-grow/done.json"), "done.json"),
    case("eval without config.json", EVAL(PRE), "config.json", *unchecked(PRE, delete(f"{PRE}/config.json"))),
    case("eval config.json a folder", EVAL(PRE), "config.json",
         *unchecked(PRE, delete(f"{PRE}/config.json"), make_dir(f"{PRE}/config.json"))),
    case("eval config.json not JSON", EVAL(PRE), "config.json", *unchecked(PRE, write(f"{PRE}/config.json", "{oops"))),
    case("eval config.json empty", EVAL(PRE), "config.json", *unchecked(PRE, write(f"{PRE}/config.json", ""))),
    case("eval config.json a list", EVAL(PRE), "config.json", *unchecked(PRE, write(f"{PRE}/config.json", "[1, 2]"))),
    case("eval config.json a string", EVAL(PRE), "config.json", *unchecked(PRE, write(f"{PRE}/config.json", '"x"'))),
    case("eval config.json without model_type", EVAL(PRE), ("config.json", "model_type"),
         *unchecked(PRE, drop(f"{PRE}/config.json", "model_type"))),
    case("eval model_type llama", EVAL(PRE), ("config.json", "model_type"),
         *unchecked(PRE, config(PRE, model_type="llama"))),
    case("eval hidden_size a string", EVAL(PRE), ("config.json", "hidden_size"),
         *unchecked(PRE, config(PRE, hidden_size="32"))),
    case("eval hidden_size a list", EVAL(PRE), ("config.json", "hidden_size"), *unchecked(PRE, config(PRE, hidden_size=[]))),
    case("eval hidden_size null", EVAL(PRE), ("config.json", "hidden_size"), *unchecked(PRE, config(PRE, hidden_size=None))),
    case("eval hidden_size 0", EVAL(PRE), ("config.json", "hidden_size"), *unchecked(PRE, config(PRE, hidden_size=0))),
    case("eval hidden_size negative", EVAL(PRE), ("config.json", "hidden_size"),
         *unchecked(PRE, config(PRE, hidden_size=-32))),
    case("eval hidden_size a float", EVAL(PRE), ("config.json", "hidden_size"),
         *unchecked(PRE, config(PRE, hidden_size=32.0))),
    case("eval hidden_size true", EVAL(PRE), ("config.json", "hidden_size"), *unchecked(PRE, config(PRE, hidden_size=True))),
    case("eval without hidden_size", EVAL(PRE), ("config.json", "hidden_size"),
         *unchecked(PRE, drop(f"{PRE}/config.json", "hidden_size"))),
    case("eval num_key_value_heads 0", EVAL(PRE), ("config.json", "num_key_value_heads"),
         *unchecked(PRE, config(PRE, num_key_value_heads=0))),
    case("eval heads not a multiple of kv heads", EVAL(PRE), ("config.json", "num_attention_heads"),
         *unchecked(PRE, config(PRE, num_attention_heads=3))),
    case("eval vocab_size a string", EVAL(PRE), ("config.json", "vocab_size"),
         *unchecked(PRE, config(PRE, vocab_size="513"))),
    case("eval intermediate_size 0", EVAL(PRE), ("config.json", "intermediate_size"),
         *unchecked(PRE, config(PRE, intermediate_size=0))),
    case("eval head_dim 0", EVAL(PRE), ("config.json", "head_dim"), *unchecked(PRE, config(PRE, head_dim=0))),
    case("eval rms_norm_eps a string", EVAL(PRE), ("config.json", "rms_norm_eps"),
         *unchecked(PRE, config(PRE, rms_norm_eps="tiny"))),
    case("eval rms_norm_eps negative", EVAL(PRE), ("config.json", "rms_norm_eps"),
         *unchecked(PRE, config(PRE, rms_norm_eps=-1.0))),
    case("eval rope_theta 0", EVAL(PRE), ("config.json", "rope_theta"), *unchecked(PRE, config(PRE, rope_theta=0))),
    case("eval tie_word_embeddings a string", EVAL(PRE), ("config.json", "tie_word_embeddings"),
         *unchecked(PRE, config(PRE, tie_word_embeddings="yes"))),
    case("eval without layers_per_block", EVAL(PRE), ("config.json", "layers_per_block"),
         *unchecked(PRE, drop(f"{PRE}/config.json", "normgrow_student", "layers_per_block"))),
    case("eval without blocks", EVAL(PRE), ("config.json", "blocks"),
         *unchecked(PRE, drop(f"{PRE}/config.json", "normgrow_student", "blocks"))),
    case("eval without norm", EVAL(PRE), ("config.json", "norm"),
         *unchecked(PRE, drop(f"{PRE}/config.json", "normgrow_student", "norm"))),
    case("eval normgrow_student a list", EVAL(PRE), ("config.json", "normgrow_student"),
         *unchecked(PRE, config(PRE, normgrow_student=[3, 1, "pre"]))),
    case("eval blocks 3 -> 2 (tensors left over)", EVAL(PRE), ("phase-2", "layers.2"),
         *unchecked(PRE, shape(PRE, blocks=2))),
    case("eval blocks 3 -> 4 (tensors missing)", EVAL(PRE), ("phase-2", "layers.3"),
         *unchecked(PRE, shape(PRE, blocks=4))),
    case("eval blocks 0", EVAL(PRE), ("config.json", "blocks"), *unchecked(PRE, shape(PRE, blocks=0))),
    case("eval blocks a string", EVAL(PRE), ("config.json", "blocks"), *unchecked(PRE, shape(PRE, blocks="3"))),
    case("eval layers_per_block 3", EVAL(PRE), ("phase-2", "layers.3"), *unchecked(PRE, shape(PRE, layers_per_block=3))),
    case("eval norm unknown", EVAL(PRE), ("config.json", "mid"), *unchecked(PRE, shape(PRE, norm="mid"))),
    case("eval norm schedule of 2 for 3 blocks", EVAL(PRE), ("config.json", "pre,post"),
         *unchecked(PRE, shape(PRE, norm="pre,post"))),
    case("eval boundary unknown", EVAL(PRE), ("config.json", "wall"), *unchecked(PRE, shape(PRE, boundary="wall"))),
    case("eval config edited (checksummed)", EVAL(PRE), ("config.json", "checksum"), config(PRE, rope_theta=5000.0)),
    case("eval norm relabelled post -> pre (checksummed)", EVAL(POST), ("config.json", "checksum"),
         shape(POST, norm="pre")),
    case("eval weights with a flipped byte (checksummed)", EVAL(PRE), ("model.safetensors", "checksum"),
         flip_byte(f"{PRE}/model.safetensors")),
    case("eval checksums.json not JSON", EVAL(PRE), "checksums.json", write(f"{PRE}/checksums.json", "{")),
    case("eval checksums.json naming a missing file", EVAL(PRE), "trainer_state.json",
         delete(f"{PRE}/trainer_state.json")),
    case("eval model.safetensors truncated", EVAL(PRE), "model.safetensors",
         *unchecked(PRE, truncate(f"{PRE}/model.safetensors"))),
    case("eval model.safetensors empty", EVAL(PRE), "model.safetensors",
         *unchecked(PRE, write(f"{PRE}/model.safetensors", b""))),
    case("eval model.safetensors garbage", EVAL(PRE), "model.safetensors",
         *unchecked(PRE, write(f"{PRE}/model.safetensors", bytes(range(256)) * 16))),
    case("eval a pickle renamed model.safetensors", EVAL(PRE), "model.safetensors",
         *unchecked(PRE, write(f"{PRE}/model.safetensors", PICKLE))),
    case("eval without model.safetensors", EVAL(PRE), "model.safetensors",
         *unchecked(PRE, delete(f"{PRE}/model.safetensors"))),
    case("eval model.safetensors a folder", EVAL(PRE), "model.safetensors",
         *unchecked(PRE, delete(f"{PRE}/model.safetensors"), make_dir(f"{PRE}/model.safetensors"))),
    case("eval a NaN weight", EVAL(PRE), ("model.safetensors", "q_proj"),
         *unchecked(PRE, edit_tensors(PRE, first_tensor(lambda t: t.index_fill(0, torch.tensor([0]), float("nan")))))),
    case("eval an infinite weight", EVAL(PRE), ("model.safetensors", "q_proj"),
         *unchecked(PRE, edit_tensors(PRE, first_tensor(lambda t: t.index_fill(0, torch.tensor([1]), float("inf")))))),
    case("eval an int32 tensor", EVAL(PRE), ("model.safetensors", "q_proj"),
         *unchecked(PRE, edit_tensors(PRE, first_tensor(lambda t: t.to(torch.int32))))),
    case("eval a bool tensor", EVAL(PRE), ("model.safetensors", "q_proj"),
         *unchecked(PRE, edit_tensors(PRE, first_tensor(lambda t: t > 0)))),
    case("eval a tensor of the wrong shape", EVAL(PRE), ("model.safetensors", "q_proj"),
         *unchecked(PRE, edit_tensors(PRE, first_tensor(lambda t: t[:-1].clone())))),
    case("eval a tensor missing", EVAL(PRE), ("phase-2", "q_proj"),
         *unchecked(PRE, edit_tensors(PRE, lambda ts: ts.pop("layers.0.self_attn.q_proj.weight")))),
    case("eval an extra tensor", EVAL(PRE), ("phase-2", "surprise"),
         *unchecked(PRE, edit_tensors(PRE, lambda ts: ts.update(surprise=torch.zeros(2))))),
    case("eval index.json {}", EVAL(PRE), "model.safetensors.index.json",
         *unchecked(PRE, write(f"{PRE}/model.safetensors.index.json", "{}"))),
    case("eval index.json not JSON", EVAL(PRE), "model.safetensors.index.json",
         *unchecked(PRE, write(f"{PRE}/model.safetensors.index.json", "{"))),
    case("eval index.json a list", EVAL(PRE), "model.safetensors.index.json",
         *unchecked(PRE, write(f"{PRE}/model.safetensors.index.json", "[]"))),
    case("eval index.json naming a missing shard", EVAL(PRE), "model-00001-of-00002.safetensors",
         *unchecked(PRE, write(f"{PRE}/model.safetensors.index.json", json.dumps(
             {"weight_map": {"embed_tokens.weight": "model-00001-of-00002.safetensors"}})))),
    case("eval --scale toy on a smoke checkpoint", EVAL(PRE, "--scale", "toy"), ("phase-2", "vocabulary")),
    case("eval --data of another tokenizer", EVAL(PRE, "--data", "{C}/toy-val"), ("phase-2", "vocabulary", "toy-val"),
         copy(VAL, "{C}/toy-val"), edit_json("{C}/toy-val/manifest.json", lambda m: m.update(eot=4096))),
    case("eval --data missing", EVAL(PRE, "--data", "{C}/nowhere"), "nowhere"),
    case("eval --data not a shard", EVAL(PRE, "--data", f"{RUNS}/s42"), "s42"),
    case("eval a vocabulary no scale has", EVAL(PRE), ("config.json", "vocab"),
         *unchecked(PRE, config(PRE, vocab_size=999))),
    case("eval the teacher truncated", EVAL(TEACHER), "model.safetensors", truncate(f"{TEACHER}/model.safetensors")),
    case("eval the teacher with fewer layers", EVAL(TEACHER), ("phase-0", "layers.1"),
         *unchecked(TEACHER, config(TEACHER, num_hidden_layers=1))),
    case("eval the teacher not JSON", EVAL(TEACHER), "config.json",
         *unchecked(TEACHER, write(f"{TEACHER}/config.json", "nope"))),
    case("sample a missing folder", SAMPLE(f"{RUNS}/s42/pre-grow/phase-9"), "phase-9"),
    case("sample config.json not JSON", SAMPLE(PRE), "config.json", *unchecked(PRE, write(f"{PRE}/config.json", "{"))),
    case("sample config.json a list", SAMPLE(PRE), "config.json", *unchecked(PRE, write(f"{PRE}/config.json", "[]"))),
    case("sample a NaN weight", SAMPLE(PRE), ("model.safetensors", "q_proj"),
         *unchecked(PRE, edit_tensors(PRE, first_tensor(lambda t: t.index_fill(0, torch.tensor([0]), float("nan")))))),
    case("sample blocks 3 -> 4", SAMPLE(PRE), ("phase-2", "layers.3"), *unchecked(PRE, shape(PRE, blocks=4))),
    case("sample a pickle renamed model.safetensors", SAMPLE(PRE), "model.safetensors",
         *unchecked(PRE, write(f"{PRE}/model.safetensors", PICKLE))),
    case("sample norm relabelled (checksummed)", SAMPLE(POST), ("config.json", "checksum"), shape(POST, norm="pre")),
    case("sample a vocabulary no scale has", SAMPLE(PRE), ("config.json", "vocab"),
         *unchecked(PRE, config(PRE, vocab_size=999))),
    case("sample hidden_size a string", SAMPLE(PRE), ("config.json", "hidden_size"),
         *unchecked(PRE, config(PRE, hidden_size="32"))),
    case("export onto its own input", EXPORT(PRE, PRE), "phase-2"),
    case("export onto its own input --force", EXPORT(PRE, PRE, "--force"), "phase-2"),
    case("export onto the runs tree", EXPORT(PRE, "{R}"), "{R}"),
    case("export onto the runs tree --force", EXPORT(PRE, "{R}", "--force"), "{R}"),
    case("export onto its run folder --force", EXPORT(PRE, f"{RUNS}/s42/pre-grow", "--force"), "pre-grow"),
    case("export onto a non-export folder", EXPORT(PRE, f"{RUNS}/data"), "data"),
    case("export onto a non-export folder --force", EXPORT(PRE, f"{RUNS}/data", "--force"), ("data", "runs tree")),
    case("export onto a folder of the user's --force", EXPORT(PRE, "{C}/mine", "--force"), ("mine", "exported"),
         write("{C}/mine/notes.txt", "mine")),
    case("export onto another checkpoint --force", EXPORT(PRE, f"{RUNS}/s42/pre-grow/phase-1", "--force"),
         ("phase-1", "runs tree")),
    case("export onto a file --force", EXPORT(PRE, "{C}/file", "--force"), "file", write("{C}/file", "x")),
    case("export under a file", EXPORT(PRE, "{C}/file/out"), "file", write("{C}/file", "x")),
    case("export into /proc", EXPORT(PRE, "/proc/normgrow-export"), "/proc/normgrow-export"),
    case("export into a read-only folder", EXPORT(PRE, "{C}/ro/out"), "ro",
         lambda case: (case / "ro").mkdir(mode=0o555), marks=not_root),
    case("export a post-norm checkpoint", EXPORT(POST, "{C}/out"), ("post-grow", "post")),
    case("export a post-norm checkpoint relabelled pre (checksummed)", EXPORT(POST, "{C}/out"),
         ("config.json", "checksum"), shape(POST, norm="pre")),
    # Pre- and post-norm students have the same tensors: without checksums.json (an older kit's checkpoint,
    # or one assembled by hand) nothing in the folder tells a relabelled one apart.
    case("export a post-norm checkpoint relabelled pre (unchecked)", EXPORT(POST, "{C}/out"), ("config.json", "norm"),
         *unchecked(POST, shape(POST, norm="pre")), marks=pytest.mark.xfail(strict=True, reason=RELABEL)),
    case("eval a post-norm checkpoint relabelled pre (unchecked)", EVAL(POST), ("config.json", "norm"),
         *unchecked(POST, shape(POST, norm="pre")), marks=pytest.mark.xfail(strict=True, reason=RELABEL)),
    case("export the teacher", EXPORT(TEACHER, "{C}/out"), ("config.json", "normgrow student")),
    case("export a missing folder", EXPORT(f"{RUNS}/s42/pre-grow/phase-9", "{C}/out"), "phase-9"),
    case("export blocks 3 -> 2 (tensors left over)", EXPORT(PRE, "{C}/out"), ("phase-2", "layers.2"),
         *unchecked(PRE, shape(PRE, blocks=2))),
    case("export a NaN weight", EXPORT(PRE, "{C}/out"), ("model.safetensors", "q_proj"),
         *unchecked(PRE, edit_tensors(PRE, first_tensor(lambda t: t.index_fill(0, torch.tensor([0]), float("nan")))))),
    case("export an int32 tensor", EXPORT(PRE, "{C}/out"), ("model.safetensors", "q_proj"),
         *unchecked(PRE, edit_tensors(PRE, first_tensor(lambda t: t.to(torch.int32))))),
    case("export a flipped byte (checksummed)", EXPORT(PRE, "{C}/out"), ("model.safetensors", "checksum"),
         flip_byte(f"{PRE}/model.safetensors")),
]

RERUNS = [
    case("rerun: done.json not JSON", TABLE1, "pre-grow/done.json", write(f"{RUNS}/s42/pre-grow/done.json", "{")),
    case("rerun: done.json empty", TABLE1, "pre-grow/done.json", write(f"{RUNS}/s42/pre-grow/done.json", "")),
    case("rerun: done.json a list", TABLE1, "pre-grow/done.json", write(f"{RUNS}/s42/pre-grow/done.json", "[5.3]")),
    case("rerun: done.json without ce", TABLE1, ("pre-grow/done.json", "ce"),
         drop(f"{RUNS}/s42/pre-grow/done.json", "ce")),
    case("rerun: done.json ce a string", TABLE1, ("pre-grow/done.json", "ce"),
         edit_json(f"{RUNS}/s42/pre-grow/done.json", lambda d: d.update(ce="low"))),
    case("rerun: done.json ce null", TABLE1, ("pre-grow/done.json", "ce"),
         edit_json(f"{RUNS}/s42/pre-grow/done.json", lambda d: d.update(ce=None))),
    case("rerun: config.json not JSON", TABLE1, "post-joint/config.json",
         write(f"{RUNS}/s42/post-joint/config.json", "{")),
    case("rerun: config.json a list", TABLE1, "post-joint/config.json",
         write(f"{RUNS}/s42/post-joint/config.json", "[]")),
    case("rerun: config.json {}", TABLE1, "post-joint", write(f"{RUNS}/s42/post-joint/config.json", "{}")),
    case("rerun: config.json edited", TABLE1, ("post-joint", "lr"),
         edit_json(f"{RUNS}/s42/post-joint/config.json", lambda c: c.update(lr=0.5))),
    case("rerun: teacher done.json not JSON", TABLE1, "teacher/done.json", write(f"{RUNS}/teacher/done.json", "x")),
    case("rerun: teacher config.json not JSON", TABLE1, "teacher/config.json", write(f"{RUNS}/teacher/config.json", "")),
    case("rerun: teacher checkpoint config.json not JSON", TABLE1, "phase-0/config.json",
         write(f"{TEACHER}/config.json", "{")),
    case("rerun: teacher weights truncated", TABLE1, ("phase-0", "model.safetensors"),
         truncate(f"{TEACHER}/model.safetensors")),
    case("rerun: teacher weights a flipped byte", TABLE1, ("phase-0", "model.safetensors"),
         flip_byte(f"{TEACHER}/model.safetensors")),
    case("rerun: teacher config with fewer layers (unchecked)", TABLE1, ("phase-0", "layers.1"),
         *unchecked(TEACHER, config(TEACHER, num_hidden_layers=1))),
    case("rerun: teacher checkpoint deleted", TABLE1, "phase-0", delete(TEACHER)),
    case("rerun: val tokens truncated", TABLE1, "val/tokens.u32", truncate(f"{VAL}/tokens.u32")),
    case("rerun: val tokens deleted", TABLE1, "val/tokens.u32", delete(f"{VAL}/tokens.u32")),
    case("rerun: val offsets deleted", TABLE1, "val/offsets.i64", delete(f"{VAL}/offsets.i64")),
    case("rerun: val tokens a flipped byte", TABLE1, "val/tokens.u32", flip_byte(f"{VAL}/tokens.u32", 4)),
    case("rerun: val manifest not JSON", TABLE1, "val/manifest.json", write(f"{VAL}/manifest.json", "{")),
    case("rerun: val manifest a list", TABLE1, "val/manifest.json", write(f"{VAL}/manifest.json", "[1]")),
    case("rerun: val manifest without n_docs", TABLE1, ("val/manifest.json", "n_docs"),
         drop(f"{VAL}/manifest.json", "n_docs")),
    case("rerun: val manifest n_docs a string", TABLE1, ("val/manifest.json", "n_docs"),
         edit_json(f"{VAL}/manifest.json", lambda m: m.update(n_docs="16"))),
    case("rerun: val manifest of another format", TABLE1, "val/manifest.json",
         edit_json(f"{VAL}/manifest.json", lambda m: m.update(format=99))),
    case("rerun: train tokens truncated", TABLE1, "train/tokens.u32", truncate(f"{TRAIN}/tokens.u32")),
    case("rerun: train manifest not JSON", TABLE1, "train/manifest.json", write(f"{TRAIN}/manifest.json", "")),
    case("rerun: train manifest deleted", TABLE1, "train", delete(f"{TRAIN}/manifest.json")),
    case("rerun: train shard a file", TABLE1, "train", delete(TRAIN), write(TRAIN, "x")),
    case("data: val manifest not JSON", ["data", "--scale", "smoke", "--runs-dir", "{R}"], "val/manifest.json",
         write(f"{VAL}/manifest.json", "{")),
    case("train: teacher weights truncated", TRAIN_RUN, ("phase-0", "model.safetensors"),
         truncate(f"{TEACHER}/model.safetensors")),
    case("train --set: teacher weights truncated", [*TRAIN_RUN, "--set", "run.lr=0.006"], ("phase-0", "model.safetensors"),
         truncate(f"{TEACHER}/model.safetensors")),
    # Into an empty runs folder: a teacher that cannot be had fails before any data is prepared.
    case("hub teacher not cached, offline", FRESH, ("normgrow-tests/no-such-model", "HF_HUB_OFFLINE"),
         make_dir("{C}/fresh"), setup=hub_teacher("normgrow-tests/no-such-model")),
    case("hub teacher id malformed", FRESH, "normgrow-tests/a/b", make_dir("{C}/fresh"),
         setup=hub_teacher("normgrow-tests/a/b")),
    case("local teacher folder missing", FRESH, "/nonexistent/normgrow-teacher", make_dir("{C}/fresh"),
         setup=hub_teacher("/nonexistent/normgrow-teacher")),
    case("local teacher folder empty", FRESH, ("teacher-dir", "config.json"), make_dir("{C}/fresh"),
         make_dir("{C}/teacher-dir"), setup=local_teacher("teacher-dir")),
    case("local teacher config not Qwen3", FRESH, ("teacher-dir", "model_type"), make_dir("{C}/fresh"),
         write("{C}/teacher-dir/config.json", '{"model_type": "llama"}'),
         setup=local_teacher("teacher-dir")),
    case("runs made with another teacher", TABLE1, ("pre-joint", "teacher"), make_dir("{C}/teacher-dir"),
         setup=local_teacher("teacher-dir")),
]

REPORTS = [
    case("compare without a shipped reference", COMPARE(RUNS), "smoke.json"),
    case("compare a missing folder", COMPARE("{R}/nowhere"), "nowhere", reference_file(GOOD_REFERENCE)),
    case("compare a file", COMPARE(f"{RUNS}/s42/pre-grow/done.json"), "done.json", reference_file(GOOD_REFERENCE)),
    case("compare an empty folder", COMPARE("{C}/empty"), "empty", reference_file(GOOD_REFERENCE), make_dir("{C}/empty")),
    case("compare with a reference not JSON", COMPARE(RUNS), "smoke.json", reference_file("{")),
    case("compare with a reference {}", COMPARE(RUNS), "smoke.json", reference_file("{}")),
    case("compare results with a report not JSON", COMPARE("{S}/smoke"), "table1.json", reference_file(GOOD_REFERENCE),
         write("{S}/smoke/table1.json", "{")),
    case("compare a run whose done.json is not JSON", COMPARE(f"{RUNS}/s42/pre-grow"), "done.json",
         reference_file(GOOD_REFERENCE), write(f"{RUNS}/s42/pre-grow/done.json", "{")),
    case("reference of seeds never run", ["reference", *RUN, "--seeds", "7"], "7"),
    case("reference of an empty seed folder", ["reference", *RUN, "--seeds", "7"], "7", make_dir(f"{RUNS}/s7")),
    case("reference with a done.json not JSON", ["reference", *RUN, "--seeds", "42"], "done.json",
         write(f"{RUNS}/s42/pre-grow/done.json", "{")),
    case("reference with a report not JSON", ["reference", *RUN, "--seeds", "42"], "table1.json",
         write("{S}/smoke/table1.json", "{")),
]

LOCAL = lambda path: [*FRESH, "--set", "data.source=local", "--set", f"data.path={path}"]
DIVERGED_TEACHER = json.dumps({"ce": None, "ppl": None, "kd": None, "step": 10, "diverged": {
    "step": 10, "why": "a non-finite validation CE or PPL", "last_good_checkpoint": None, "values": {}}})
NESTED = "[" * 100_000 + "]" * 100_000  # deeper than Python's recursion limit


def symlinked(template: str):
    """The folder moved beside the runs tree and a symbolic link left in its place."""
    def apply(case):
        path = at(case, template)
        outside = case / "elsewhere"
        shutil.move(path, outside)
        path.symlink_to(outside, target_is_directory=True)
    return apply


OTHER_CONFIG = edit_json(f"{RUNS}/s42/post-grow/config.json", lambda c: c.update(lr=1.0))  # --force discards it
RELIABILITY = [
    case("local corpus with invalid UTF-8", LOCAL("{C}/bad.jsonl"), ("bad.jsonl:2", "UTF-8", "column 11"),
         make_dir("{C}/fresh"), write("{C}/bad.jsonl", b'{"text": "fine"}\n{"text": "\xff"}\n')),
    case("local .txt with invalid UTF-8", LOCAL("{C}/texts"), ("b.txt:3", "UTF-8"), make_dir("{C}/fresh"),
         write("{C}/texts/a.txt", "fine"), write("{C}/texts/b.txt", b"one\ntwo\nthr\xffee")),
    case("local jsonl text a number", LOCAL("{C}/n.jsonl"), ("n.jsonl:1", "int"), make_dir("{C}/fresh"),
         write("{C}/n.jsonl", '{"text": 123}\n')),
    case("local jsonl empty", LOCAL("{C}/empty.jsonl"), ("empty.jsonl", "empty"), make_dir("{C}/fresh"),
         write("{C}/empty.jsonl", "")),
    case("local jsonl too few documents", LOCAL("{C}/few.jsonl"), ("few.jsonl", "data.val_docs"), make_dir("{C}/fresh"),
         write("{C}/few.jsonl", '{"text": "one"}\n{"text": "two"}\n')),
    case("local jsonl nested too deep", LOCAL("{C}/deep.jsonl"), "deep.jsonl:1", make_dir("{C}/fresh"),
         write("{C}/deep.jsonl", NESTED + "\n")),
    case("eval latest/ (a resume point)", EVAL(f"{RUNS}/s42/pre-grow/latest"), ("latest", "resume point", "phase-N"),
         copy(PRE, f"{RUNS}/s42/pre-grow/latest"), delete(f"{RUNS}/s42/pre-grow/latest/config.json")),
    case("export inside a run folder", EXPORT(PRE, f"{RUNS}/s42/pre-grow/my-export"), ("my-export", "runs tree")),
    case("export inside the runs folder", EXPORT(PRE, "{R}/exports/pre"), ("exports", "runs tree")),
    case("reference over a shipped one", ["reference", *RUN, "--seeds", "42"], ("smoke.json", "--force"),
         reference_file(GOOD_REFERENCE)),
    case("done.json nested too deep", TABLE1, "done.json", write(f"{RUNS}/s42/pre-grow/done.json", NESTED)),
    case("done.json ce NaN", TABLE1, ("done.json", "NaN"),
         write(f"{RUNS}/s42/pre-grow/done.json", '{"ce": NaN, "ppl": 1.0, "kd": 1.0, "step": 24}')),
    case("done.json ce Infinity", TABLE1, ("done.json", "Infinity"),
         write(f"{RUNS}/s42/pre-grow/done.json", '{"ce": Infinity, "ppl": 1.0, "kd": 1.0, "step": 24}')),
    case("done.json diverged not a record", TABLE1, ("done.json", "diverged"),
         write(f"{RUNS}/s42/pre-grow/done.json", '{"ce": null, "ppl": null, "kd": null, "step": 24, "diverged": 1}')),
    case("eval config.json nested too deep", EVAL(PRE), "config.json", *unchecked(PRE, write(f"{PRE}/config.json", NESTED))),
    case("metrics.jsonl with NaN", COMPARE(f"{RUNS}/s42/pre-grow"), "metrics.jsonl", reference_file(GOOD_REFERENCE),
         write(f"{RUNS}/s42/pre-grow/metrics.jsonl", '{"step": 1, "loss": NaN}\n')),
    case("teacher diverged", TABLE1, ("teacher", "diverged", "teacher_run.lr"),
         write(f"{RUNS}/teacher/done.json", DIVERGED_TEACHER)),
    case("train --force on a symlinked run folder", [*TRAIN_RUN, "--force"], ("post-grow", "symbolic link"),
         OTHER_CONFIG, symlinked(f"{RUNS}/s42/post-grow")),
    case("train --force with a user's file in the run folder", [*TRAIN_RUN, "--force"], ("notes.txt", "not written by"),
         OTHER_CONFIG, write(f"{RUNS}/s42/post-grow/notes.txt", "my notes")),
]



def link(template: str, target: str):
    """A symbolic link at `template` (whatever was there moved away first) pointing at `target`: itself
    (a loop) or a path that does not exist (an unmounted disk)."""
    def apply(case):
        path = at(case, template)
        if path.exists():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(at(case, target))
    return apply


LONG = "x" * 300  # a name past the 255 bytes a file system allows
DRY = ["--dry-run", "--runs-dir", "{C}/none"]
DAMAGED_LOG = lambda keep: edit_metrics(f"{RUNS}/s42/pre-grow/metrics.jsonl", keep)


def edit_metrics(template: str, keep: Callable[[dict], bool]):
    """A metrics.jsonl with only the rows `keep` accepts (an edited or cut log)."""
    def apply(case):
        path = at(case, template)
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows if keep(r)))
    return apply


# Issue 34, causes 5-8: paths the kit did not expect, values without bounds, options that did nothing.
ISSUE34 = [
    case("results scale folder is a file", TABLE1, ("smoke", "a file, where a folder goes"), delete("{S}/smoke"),
         write("{S}/smoke", "x")),
    case("run folder a symlink loop", TABLE1, ("pre-grow", "leads back to itself"), link(f"{RUNS}/s42/pre-grow",
                                                                                        f"{RUNS}/s42/pre-grow")),
    case("teacher folder a symlink loop", TABLE1, ("teacher", "leads back to itself"),
         link(f"{RUNS}/teacher", f"{RUNS}/teacher")),
    case("export target a symlink loop", EXPORT(PRE, "{C}/out"), ("out", "leads back to itself"),
         link("{C}/out", "{C}/out")),
    case("data/ a dangling symlink (an unmounted disk)", TABLE1, ("data", "does not exist", "mount it"),
         link(f"{RUNS}/data", "{C}/unmounted/data")),
    case("data command, data/ a dangling symlink", ["data", "--scale", "smoke", "--runs-dir", "{R}"],
         ("data", "does not exist"), link(f"{RUNS}/data", "{C}/unmounted/data")),
    case("--runs-dir a symlink loop", ["table1", "--scale", "smoke", "--runs-dir", "{C}/loop", "--results-dir", "{S}"],
         ("--runs-dir", "symbolic link loop"), link("{C}/loop", "{C}/loop")),
    case("--results-dir a symlink loop", ["table1", "--scale", "smoke", "--runs-dir", "{R}", "--results-dir",
                                          "{C}/loop"], ("--results-dir", "symbolic link loop"),
         link("{C}/loop", "{C}/loop")),
    case("--runs-dir a dangling symlink", ["table1", "--scale", "smoke", "--runs-dir", "{C}/gone", "--results-dir",
                                           "{S}"], ("--runs-dir", "does not exist"), link("{C}/gone", "{C}/unmounted")),
    case("eval, a 300-character name", EVAL(f"{{R}}/{LONG}"), ("File name too long", "shorter path")),
    case("sample, a 300-character name", SAMPLE(f"{{R}}/{LONG}"), ("File name too long", "shorter path")),
    case("export to a 300-character name", EXPORT(PRE, f"{{C}}/{LONG}"), ("File name too long", "shorter path")),
    case("--results-dir a 300-character name", [*TABLE1[:-1], f"{{C}}/{LONG}"], "--results-dir"),
    SET("run.phase_steps=1000000000000"), SET("run.blocks=100000"), SET("run.blocks=129"), SET("run.lr=1e300"),
    SET("run.tau=0"), SET("run.eps=2"), SET("run.global_batch=1099511627776"), SET("run.phase_warmups=0,5,5"),
    SET("run.boundary_scale=0"), SET("run.monitor_interval=1e20"), SET("teacher_model.hidden_size=1000000000"),
    SET("teacher_model.rope_theta=0"), SET("teacher_run.phase_steps=1000000000000"),
    SET("data.max_len=1000000000000"), SET("data.val_docs=1000000000"), SET("data.paragraphs_per_document=0"),
    SET("diag.docs=1000000"), SET("diag.seed=9223372036854775808"),
    case("dry run, --set run.phase_steps=1e12", ["table1", "--scale", "smoke", "--set", "run.phase_steps=1000000000000",
                                                 *DRY], ("--set", "phase_steps")),
    case("--nodes 2000", ["all", "--scale", "full", "--nodes", "2000", *DRY], "--nodes"),
    case("--gpus 1e12", ["all", "--scale", "full", "--gpus", "1000000000000", *DRY], "--gpus"),
    case("--gpus without --dry-run", [*TABLE1, "--gpus", "8"], ("--gpus", "--dry-run")),
    case("train --nodes without --dry-run", [*TRAIN_RUN, "--nodes", "2"], ("--nodes", "--dry-run")),
    case("train --seed 44 --set run.seed=43", [*TRAIN_RUN, "--seed", "44", "--set", "run.seed=43"],
         ("--seed", "run.seed=43")),
    case("table1 --seeds 44 --set run.seed=43", [*TABLE1, "--seeds", "44", "--set", "run.seed=43"],
         ("--seeds", "run.seed=43")),
    case("placements --seeds 1,2 --set run.seed=2", ["placements", *RUN, "--seeds", "1,2", "--set", "run.seed=2"],
         ("--seeds", "run.seed=2")),
    case("search --seed 1 --set run.seed=2", ["search", *RUN, "--seed", "1", "--set", "run.seed=2"],
         ("--seed", "run.seed=2")),
    case("sample --max-new-tokens past the context", SAMPLE(PRE, "--max-new-tokens", "100000000"),
         ("--max-new-tokens", "max_position_embeddings")),
    case("sample --top-k above the vocabulary", SAMPLE(PRE, "--temperature", "1", "--top-k", "1000000000000"),
         ("--top-k", "vocabulary")),
    case("rehearse --device", ["rehearse", "--scale", "smoke", "--device", "cuda"], "--device"),
    case("rehearse --log", ["rehearse", "--scale", "smoke", "--log", "wandb"], "--log"),
    case("rehearse --compile", ["rehearse", "--scale", "smoke", "--compile"], "--compile"),
    case("rehearse --no-wait", ["rehearse", "--scale", "smoke", "--no-wait"], "--no-wait"),
]

# Logs damaged where only a report reads them: the finished runs are reused (a line each), then one error line.
DAMAGED_LOGS = [
    case("fig3, a log missing a phase-end evaluation", ["fig3", *RUN], ("metrics.jsonl", "end of phase 1", "missing"),
         DAMAGED_LOG(lambda r: not (r.get("eval") and r["step"] == 16 and not r.get("phase_start")))),
    case("fig3, a log missing a phase-start evaluation", ["fig3", *RUN], ("metrics.jsonl", "start of phase 2"),
         DAMAGED_LOG(lambda r: not (r.get("phase_start") and r.get("phase") == 2))),
    case("fig3, a log with no phase-start evaluations", ["fig3", *RUN], ("metrics.jsonl", "start of phase 0"),
         DAMAGED_LOG(lambda r: not r.get("phase_start"))),
]

CASES = CLI_OPTIONS + OVERRIDES + FOLDERS + CHECKPOINTS + RERUNS + REPORTS + RELIABILITY + ISSUE34


def test_the_table_has_at_least_100_distinct_cases():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 100


@pytest.mark.parametrize("bad", CASES)
def test_bad_input_is_one_line_and_changes_nothing(bad: Case, tree, tmp_path, monkeypatch):
    # A case that damages nothing reads the shared tree itself (hashed like a copy); one that damages a
    # file, or passes --force (which may replace folders), works on its own copy.
    case_dir = tmp_path / "case"
    own_copy = bool(bad.damage or bad.setup or "--force" in bad.args)
    if own_copy:
        shutil.copytree(tree, case_dir)
    else:
        case_dir.mkdir()
    runs, results = (case_dir if own_copy else tree) / "R", (case_dir if own_copy else tree) / "S"
    monkeypatch.chdir(case_dir)  # a default path (runs/, results/) lands here, inside a hashed folder
    monkeypatch.setattr(reference, "REFERENCES", case_dir / "references")
    for damage in bad.damage:
        damage(case_dir)
    if bad.setup:
        bad.setup(case_dir, monkeypatch)
    hashed = (case_dir,) if own_copy else (case_dir, tree)
    before = [tree_hash(folder) for folder in hashed]
    fill = lambda text: text.format(R=runs, S=results, C=case_dir)
    result = CliRunner().invoke(repro.cli, [fill(a) for a in bad.args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        pytest.fail("a traceback escaped the kit:\n" + "".join(traceback.format_exception(result.exception)))
    out = result.output.strip()
    lines = out.splitlines()
    assert result.exit_code != 0, out
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in out, out
    for name in (bad.names,) if isinstance(bad.names, str) else bad.names:
        assert fill(name) in lines[0], out
    assert [tree_hash(folder) for folder in hashed] == before, f"the command changed what was there: {out}"
    shutil.rmtree(case_dir)  # up to 5 MB a case: kept only where a case fails, to look at


def test_the_undamaged_tree_passes_every_command_the_table_breaks(tree, tmp_path, monkeypatch):
    """The cases fail because of their damage: the same commands succeed on the tree as it was built."""
    case_dir = tmp_path / "case"
    shutil.copytree(tree, case_dir)
    monkeypatch.chdir(case_dir)
    fill = lambda args: [a.format(R=case_dir / "R", S=case_dir / "S", C=case_dir) for a in args]
    for args in (EVAL(PRE), EVAL(POST), EVAL(TEACHER), SAMPLE(PRE), SAMPLE(POST), EXPORT(PRE, "{C}/out"),
                 ["data", "--scale", "smoke", "--runs-dir", "{R}"], TABLE1):
        result = CliRunner().invoke(repro.cli, fill(args))
        assert result.exit_code == 0, (args, result.output, result.exception)


def strict_json_files(root: Path) -> int:
    """Parse every .json and .jsonl file under root as strict JSON (NaN, Infinity refused); their count."""
    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON")
    count = 0
    for path in sorted(root.rglob("*.json*")):
        if path.suffix == ".json":
            json.loads(path.read_text(), parse_constant=refuse)
        elif path.suffix == ".jsonl":
            for line in path.read_text().splitlines():
                json.loads(line, parse_constant=refuse)
        else:
            continue
        count += 1
    return count


def test_every_json_of_a_smoke_tree_is_strict_diverged_runs_included(tree, tmp_path, monkeypatch):
    """Every JSON file of a finished smoke tree, and of one whose students all diverged (lr 50: their CE
    and PPL overflow), parses with a strict parser; the diverged table shows "diverged", no verdict."""
    shutil.copytree(tree, tmp_path / "t")
    monkeypatch.chdir(tmp_path / "t")
    result = CliRunner().invoke(repro.cli, [*[a.format(R="R", S="S") for a in TABLE1], "--set", "run.lr=50"])
    assert result.exit_code == 0, result.output
    table = (tmp_path / "t" / "S" / "smoke+run.lr=50.0" / "table1.md").read_text()
    assert "Diverged: 4 of 4 runs" in table and "| diverged (1 of 1 diverged) |" in table
    assert "same sign" not in table and "agrees" not in table.replace("no verdict", "")
    run_dir = tmp_path / "t" / "R" / "smoke" / "set" / "run.lr=50.0" / "s42" / "pre-grow"
    done = json.loads((run_dir / "done.json").read_text())
    assert done["ce"] is None and done["diverged"]["step"] >= 1
    assert strict_json_files(tmp_path / "t") >= 40


LIMITED = ("import resource, signal, sys; from pathlib import Path; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
           "resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.RLIM_INFINITY)); "
           "import reference, repro; reference.REFERENCES = Path(sys.argv[2]); repro.cli(sys.argv[3:])")


@pytest.mark.slow
def test_a_file_size_limit_during_each_kind_of_results_write_keeps_the_previous_files(tree, tmp_path, monkeypatch):
    """A real `ulimit -f` (RLIMIT_FSIZE) below the size of a report, a figure and a reference: each command
    stops with one line naming the file and the limit, and every previous file is byte-identical."""
    shutil.copytree(tree, tmp_path / "t")
    refs = tmp_path / "t" / "references"
    def run(limit, *args):
        return subprocess.run([sys.executable, "-c", LIMITED, str(limit), str(refs), *args], cwd=tmp_path / "t",
                              capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    run_args = ["--scale", "smoke", "--runs-dir", "R", "--results-dir", "S"]
    commands = {"report": ["table1", *run_args], "figure": ["fig3", *run_args],
                "reference": ["reference", *run_args, "--seeds", "42", "--force"]}
    for kind in ("figure", "reference"):  # the previous files, written without a limit (the tree has table1's)
        monkeypatch.chdir(tmp_path / "t")
        monkeypatch.setattr(reference, "REFERENCES", refs)
        result = CliRunner().invoke(repro.cli, commands[kind])
        assert result.exit_code == 0, result.output
    files = sorted(p for p in [*(tmp_path / "t" / "S").rglob("*"), *refs.rglob("*")] if p.is_file())
    before = {p: p.read_bytes() for p in files}
    assert min(len(b) for p, b in before.items() if p.suffix in (".json", ".png")) > 1000
    for kind, command in commands.items():
        limited = run(1000, *command)
        last = limited.stderr.strip().splitlines()[-1] if limited.stderr.strip() else limited.stdout
        assert limited.returncode == 1 and last.startswith("Error: ") and "Traceback" not in limited.stderr, \
            (kind, limited.stderr[-2000:])
        assert "a file-size limit (ulimit -f) was reached while writing it; the previous file is intact" in last, last
        assert {p: p.read_bytes() for p in files} == before, kind
        assert not [p for p in (tmp_path / "t").rglob("*.tmp")], kind


def test_force_with_student_overrides_never_rebuilds_the_shared_data_or_teacher(tree, tmp_path, monkeypatch):
    """`--set run.lr=... --force` in a finished workspace trains the overridden students beside the scale's
    data and teacher and leaves both byte for byte as they were, also with the data folder a symlink to
    another disk; `--set run.seed=43` is `--seeds 43`: the scale's own folders, no override folder."""
    shutil.copytree(tree, tmp_path / "t")
    smoke = tmp_path / "t" / "R" / "smoke"
    shutil.move(smoke / "data", tmp_path / "other-disk")
    (smoke / "data").symlink_to(tmp_path / "other-disk", target_is_directory=True)
    shared = {name: tree_hash(tmp_path / name) for name in ("other-disk", "t/R/smoke/teacher")}
    monkeypatch.chdir(tmp_path / "t")
    run = [a.format(R="R", S="S") for a in TABLE1]
    result = CliRunner().invoke(repro.cli, [*run, "--set", "run.lr=0.004", "--force"])
    assert result.exit_code == 0, result.output
    assert (smoke / "set" / "run.lr=0.004" / "s42" / "pre-grow" / "done.json").is_file()
    assert {name: tree_hash(tmp_path / name) for name in shared} == shared
    ws = suite.workspace("smoke", tmp_path / "t" / "R", overrides=smoke_set("run.seed=43"), dry_run=True)
    assert ws.runs == smoke and ws.student_runs == "" and ws.preset.run["seed"] == 43
    assert ws.run_dir(suite.RunName("pre", "grow"), 43) == smoke / "s43" / "pre-grow"


@pytest.mark.parametrize("bad", DAMAGED_LOGS)
def test_a_log_damaged_where_only_a_report_reads_it_ends_in_one_line(bad: Case, tree, tmp_path, monkeypatch):
    """fig3 reads each phase's start and end evaluation from the grow runs' metrics.jsonl: a row cut out
    of a finished run's log is one error line naming the file and the row (before: StopIteration), after
    the reuse lines, and nothing is written."""
    shutil.copytree(tree, tmp_path / "case")
    monkeypatch.chdir(tmp_path / "case")
    for damage in bad.damage:
        damage(tmp_path / "case")
    before = tree_hash(tmp_path / "case")
    fill = lambda text: text.format(R=tmp_path / "case" / "R", S=tmp_path / "case" / "S", C=tmp_path / "case")
    result = CliRunner().invoke(repro.cli, [fill(a) for a in bad.args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and lines[-1].startswith("Error: ") and "Traceback" not in result.output
    assert all(line.endswith(("reusing " + str(tmp_path / "case" / "R" / "smoke" / "teacher"))) or ": done, reusing " in line
               for line in lines[:-1]), lines
    for name in bad.names:
        assert name in lines[-1], lines[-1]
    assert tree_hash(tmp_path / "case") == before


# ---- issue 34: values by value -------------------------------------------------------------------

def test_bare_repro_py_prints_usage_and_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(repro.cli, [])
    assert result.exit_code == 0 and result.output.startswith("Usage: repro.py"), result.output
    assert "python repro.py --scale toy --dry-run" in result.output and "python repro.py --scale toy " in result.output
    assert list(tmp_path.iterdir()) == []  # no runs/, no results/


DRY_RUNS = {"run": ["table1"], "train": ["train", "--norm", "post", "--protocol", "grow"], "regime": ["regime"],
            "search": ["search"], "placements": ["placements"], "intervention": ["intervention"],
            "scratch": ["scratch"], "planted": ["planted"]}


@pytest.mark.parametrize("command", list(DRY_RUNS))
def test_every_experiment_command_has_a_dry_run_that_makes_nothing(command, tmp_path, monkeypatch):
    """Each prints its runs' plan and an estimate for this CPU; no folder is made."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(repro.cli, [*DRY_RUNS[command], "--scale", "smoke", "--dry-run", "--runs-dir",
                                            str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert "this machine: about " in result.output and "GPU-h" in result.output
    assert list(tmp_path.iterdir()) == []


def test_the_dry_run_is_closed_form_at_the_largest_accepted_values(tmp_path):
    """The teacher passes of a lockstep seed are a union of step spans, merged without a set of steps: at
    a billion steps a phase and 128 blocks the numbers are the formula's. The paper's 3 blocks of S steps:
    grow covers steps 0..3S, joint 0..S inside it, freeze shares grow's phase 0 and adds 1..3S."""
    from tools import plan
    assert plan.union_length([range(0, 10), range(5, 20), range(30, 31), range(0, 0), range(19, 25)]) == 26
    S, K = 10**9, 128
    ws = suite.workspace("smoke", tmp_path / "runs", overrides=smoke_set(f"run.phase_steps={S}", f"run.blocks={K}"),
                         dry_run=True)
    runs = plan.planned_runs(ws, [suite.RunName(*run) for run in (("pre", "joint"), ("pre", "grow"), ("pre", "freeze"),
                                                                  ("post", "joint-long"))], 42)
    assert [r.name for r in runs] == ["pre-joint", "pre-grow", "pre-freeze", "post-joint", "post-joint-long"]
    joint_long = 2 * S - S  # its own phase after post-joint's (with_prefixes adds post-joint, which it shares)
    assert plan.teacher_passes(runs, lockstep=True) == K * S + joint_long   # grow's span holds every replay run's
    assert plan.teacher_passes(runs, lockstep=False) == S + K * S + (K - 1) * S + S + joint_long
    result = CliRunner().invoke(repro.cli, ["all", "--scale", "smoke", "--set", f"run.phase_steps={S}", "--set",
                                            f"run.blocks={K}", "--set", "run.layers_per_block=128", "--dry-run",
                                            "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0 and "this machine: about " in result.output, result.output


def test_every_number_a_set_can_change_has_a_range():
    """Each numeric field of every --set section is bounded above and below: one past its upper end is a
    one-line error naming the key, its ends are accepted."""
    preset = presets.PRESETS["smoke"]
    numbers = {}
    for section, cls in presets.OVERRIDABLE.items():
        known = {f.name: f.default for f in __import__("dataclasses").fields(cls)} if cls else {}
        known.update({**(presets.DATA_OPTIONS if section == "data" else {}), **getattr(preset, section)})
        for name, value in known.items():
            if name in presets.SET_BY_KIT.get(section, ()) or isinstance(value, (bool, str, dict)):
                continue
            if isinstance(value, (int, float, tuple)) or value is None:
                numbers[f"{section}.{name}"] = name
    assert len(numbers) >= 40
    missing = sorted(key for key, name in numbers.items() if name not in presets.RANGES)
    assert not missing, f"no range for {missing}"
    for key, name in numbers.items():
        low, high = presets.RANGES[name]
        too_big = high * 10 + 1 if isinstance(high, int) else high * 10
        value = ",".join([str(too_big)] * 2 if name == "betas" else [str(too_big)])
        with pytest.raises(errors.OptionError, match=f"{key.split('.')[1]}=.*expected"):
            presets.parse_overrides(preset, [f"{key}={value}"])
    assert presets.apply_overrides(preset, smoke_set("run.blocks=128", "run.phase_steps=1000000000"))[0].run["blocks"] == 128


def test_the_dry_runs_estimate_for_this_cpu_uses_the_benchs_measured_speed(tmp_path):
    """From results/bench.json: the kit's toy step of 2 GFLOP in 0.5 s is 4 GFLOP/s, so 360 GFLOP take
    90 s = 1.5 min; bf16 where the preset would use it and the bench measured it."""
    from tools import plan
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"environment": {"date": "2026-12-02"}, "train_step": {
        "step_gflop": 2.0, "kit_post_fp32_s": 0.5, "kit_post_bf16_s": 0.25}}))
    assert plan.cpu_estimate(360e9, "fp32", bench).startswith("about 1.5 min on this CPU (4.0 GFLOP/s")
    assert plan.cpu_estimate(360e9, "auto", bench).startswith("about 45 s on this CPU (8.0 GFLOP/s")
    assert plan.duration_text(0.2) == "under a second" and plan.duration_text(7200) == "2.0 h"


def test_the_toy_dry_run_says_no_zero_durations_or_sizes(tmp_path):
    result = CliRunner().invoke(repro.cli, ["--scale", "toy", "--dry-run", "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "about 0 s" not in text and "(0 GB" not in text and "about 0 min" not in text and "~0 of" not in text
    assert "this machine: about " in text


def test_sample_top_k_1_is_greedy_at_any_temperature(tree, monkeypatch):
    """1e300 is finite; in fp32 it is inf, and logits / inf made every token equally likely."""
    monkeypatch.chdir(tree)
    pre = PRE.format(R=tree / "R")
    def text(*more):
        result = CliRunner().invoke(repro.cli, ["sample", pre, "--prompt", "The", "--max-new-tokens", "12",
                                                "--runs-dir", str(tree / "R"), *more])
        assert result.exit_code == 0, result.output
        return result.output
    greedy = text()
    assert text("--temperature", "1e300", "--top-k", "1") == greedy
    assert text("--temperature", "1e-30", "--top-k", "1") == greedy


def test_sigterm_during_sample_does_not_promise_a_resume(tree, monkeypatch):
    from tools import sample
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(sample, "generate", interrupted)
    result = CliRunner().invoke(repro.cli, ["sample", PRE.format(R=tree / "R"), "--runs-dir", str(tree / "R")])
    assert result.exit_code == 130 and "sample stopped before it finished" in result.output
    assert "resume" not in result.output


def test_ratios_of_a_scale_whose_teacher_shares_the_students_batch():
    """smoke's teacher_run sets no global_batch (the students' 4): 20 teacher steps x 4 documents over
    the longest student's 3 x 8 x 4."""
    result = CliRunner().invoke(repro.cli, ["ratios", "--scale", "smoke"])
    assert result.exit_code == 0, result.output
    assert "| teacher documents / documents of the longest-trained student | ≫ 1 (a pretrained LLM) | 0.8333 |" \
        in result.output


def test_the_precision_cache_is_read_as_strictly_as_it_is_written(tmp_path, monkeypatch):
    from plumbing import devices
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "normgrow").mkdir()
    for damaged in ('{"another machine": NaN}', '{"x": 1e999}', "[1]", "{"):
        (tmp_path / "normgrow" / "cpu-precision.json").write_text(damaged)
        devices.cpu_bf16_speedup.cache_clear()
        speedup = devices.cpu_bf16_speedup()
        written = json.loads((tmp_path / "normgrow" / "cpu-precision.json").read_text(),
                             parse_constant=lambda c: pytest.fail(c))
        assert speedup > 0 and list(written.values()) == [speedup]
    devices.cpu_bf16_speedup.cache_clear()


def test_export_to_an_empty_folder_and_a_reference_over_a_shipped_one(tree, tmp_path, monkeypatch):
    """An empty folder holds nothing to lose: export uses it, with --force too. `reference` over a
    shipped file says --force is missing, not that an absent --force is invalid."""
    shutil.copytree(tree, tmp_path / "t")
    monkeypatch.chdir(tmp_path / "t")
    pre = PRE.format(R=tmp_path / "t" / "R")
    for more in ((), ("--force",)):
        shutil.rmtree(tmp_path / "empty", ignore_errors=True)
        (tmp_path / "empty").mkdir()
        result = CliRunner().invoke(repro.cli, ["export", pre, str(tmp_path / "empty"), "--runs-dir",
                                                str(tmp_path / "t" / "R"), *more])
        assert result.exit_code == 0 and (tmp_path / "empty" / "model.safetensors").is_file(), result.output
    monkeypatch.setattr(reference, "REFERENCES", tmp_path / "refs")
    (tmp_path / "refs").mkdir()
    (tmp_path / "refs" / "smoke.json").write_text(GOOD_REFERENCE)
    result = CliRunner().invoke(repro.cli, ["reference", "--scale", "smoke", "--seeds", "42", "--runs-dir", "R",
                                            "--results-dir", "S"])
    assert result.exit_code == 2 and "Invalid value" not in result.output and "add --force" in result.output
    assert (tmp_path / "refs" / "smoke.json").read_text() == GOOD_REFERENCE


def test_the_teacher_summary_says_which_side_of_the_teacher_the_best_student_is(tree):
    ws = suite.workspace("smoke", tree / "R", dry_run=True)
    teacher = json.loads((tree / "R" / "smoke" / "teacher" / "done.json").read_text())["ce"]
    best = min(json.loads((tree / "R" / "smoke" / "s42" / n / "done.json").read_text())["ce"]
               for n in ("pre-grow", "post-grow", "pre-joint", "post-joint"))
    line = suite.teacher_summary(ws, [suite.RunName(n, p) for n, p in (("pre", "grow"), ("post", "grow"), ("pre", "joint"),
                                                                       ("post", "joint"))], [42])
    side = "above" if best >= teacher else "below"
    assert f"{abs(best - teacher):.4f} nats {side} the teacher's" in line and "leads by" not in line


def test_data_takes_set_and_prepares_where_those_runs_read(tmp_path):
    result = CliRunner().invoke(repro.cli, ["data", "--scale", "smoke", "--set", "data.val_docs=12", "--runs-dir",
                                            str(tmp_path)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "smoke+data.val_docs=12" / "data" / "val" / "manifest.json").read_text())
    assert manifest["n_docs"] == 12
    assert not (tmp_path / "smoke").exists()


def test_force_after_an_edited_corpus_never_reuses_what_the_old_one_trained(tmp_path):
    """--force rebuilds the shards of an edited local corpus; a teacher and runs trained on the old content
    (a stand-in folder here) are then named in one line, never silently reused with the new shards."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i} about the lazy fox"}) + "\n" for i in range(200)))
    local = smoke_set("data.source=local", f"data.path={corpus}")
    ws = suite.workspace("smoke", tmp_path / "runs", overrides=local, device="cpu")
    suite.prepare_data(ws)
    first = suite.shard_corpus(ws)["sha256"]
    (ws.runs / "teacher").mkdir()
    corpus.write_text(corpus.read_text().replace("lazy", "quick"))
    with pytest.raises(errors.DataError, match="another corpus"):  # unforced: the shards are refused
        suite.prepare_data(suite.workspace("smoke", tmp_path / "runs", overrides=local, device="cpu"))
    with pytest.raises(errors.DataError, match=r"data: rebuilt from the corpus .* move teacher out of"):
        suite.prepare_data(suite.workspace("smoke", tmp_path / "runs", overrides=local, device="cpu"), force=True)
    assert suite.shard_corpus(ws)["sha256"] != first
