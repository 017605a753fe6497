"""The bad-input table's cases (run by tests/test_bad_inputs.py) of checkpoints that eval, sample
and export are given: missing, damaged file by file (with and without checksums.json), of another
vocabulary or placement, and export targets that would overwrite what the user has."""
import json
import pickle
import shutil
from typing import Callable

import torch
from conftest import (
    EVAL,
    EXPORT,
    POST,
    PRE,
    RUNS,
    SAMPLE,
    TEACHER,
    VAL,
    at,
    case,
    config,
    copy,
    delete,
    drop,
    edit_json,
    flip_byte,
    make_dir,
    not_root,
    truncate,
    unchecked,
    write,
)
from safetensors.torch import load_file, save_file


def edit_tensors(template: str, change: Callable[[dict], None]):
    """Rewrite a checkpoint's model.safetensors with change(tensors) applied in place."""
    def apply(case):
        path = at(case, template) / "model.safetensors"
        tensors = load_file(path)
        change(tensors)
        save_file(tensors, path, metadata={"format": "pt"})
    return apply


def shape(ckpt: str, **values) -> Callable:
    return edit_json(f"{ckpt}/config.json", lambda c: c["normgrow_student"].update(values))


def first_tensor(change: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[dict], None]:
    def apply(tensors):
        name = "layers.0.self_attn.q_proj.weight"
        tensors[name] = change(tensors[name])
    return apply


PICKLE = pickle.dumps(print)  # a pickle (of a harmless callable) where safetensors are expected: never unpickled
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
    # beside the checkpoint's own model.safetensors: which holds the weights is asked first (issue 50's recheck)
    case("eval index.json naming a missing shard", EVAL(PRE), ("model.safetensors.index.json", "one or the other"),
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
    # or one assembled by hand) only its run's config.json, where it still lies in its run folder, tells a
    # relabelled one apart (issue 40: these two were the table's expected failures).
    case("export a post-norm checkpoint relabelled pre (unchecked)", EXPORT(POST, "{C}/out"),
         ("phase-2/config.json", "'post'"), *unchecked(POST, shape(POST, norm="pre"))),
    case("eval a post-norm checkpoint relabelled pre (unchecked)", EVAL(POST), ("phase-2/config.json", "'post'"),
         *unchecked(POST, shape(POST, norm="pre"))),
    case("sample a post-norm checkpoint relabelled pre (unchecked)", SAMPLE(POST), ("phase-2/config.json", "'post'"),
         *unchecked(POST, shape(POST, norm="pre"))),
    case("eval a pre-norm checkpoint relabelled post (unchecked)", EVAL(PRE), ("phase-2/config.json", "'pre'"),
         *unchecked(PRE, shape(PRE, norm="post"))),
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


def exported(template: str):
    """An export the kit made, at `template`."""
    from tools import checkpoints
    return lambda case: checkpoints.export(at(case, PRE), at(case, template), False, case / "R")


# Issue 40: --force replaces only what the kit wrote; an export never removes a folder of the user's beside it.
EXPORTS = [
    case("export --force onto an earlier export holding a user's file", EXPORT(PRE, "{C}/out", "--force"),
         ("out/notes.txt", "not written by the kit"), exported("{C}/out"), write("{C}/out/notes.txt", "mine")),
    case("export --force onto an earlier export holding a user's folder", EXPORT(PRE, "{C}/out", "--force"),
         ("out/mine", "not written by the kit"), exported("{C}/out"), write("{C}/out/mine/notes.txt", "mine")),
    case("export beside a user's folder named <out>.old", EXPORT(PRE, "{C}/out"), ("out.old", "not written by the kit"),
         write("{C}/out.old/notes.txt", "mine")),
    case("export beside a user's folder named <out>.tmp", EXPORT(PRE, "{C}/out"), ("out.tmp", "not written by the kit"),
         write("{C}/out.tmp/notes.txt", "mine")),
    case("export --force beside a user's file named <out>.old", EXPORT(PRE, "{C}/out", "--force"), "out.old",
         exported("{C}/out"), write("{C}/out.old", "mine")),
    # issue 59 §3: a name that is rich markup is text in the line (before: MarkupError once the export was written)
    case("export --force onto a user's folder named like markup", EXPORT(PRE, "{C}/exp [/v2]", "--force"),
         ("exp [/v2]/notes.txt", "not written by the kit"), exported("{C}/exp [/v2]"),
         write("{C}/exp [/v2]/notes.txt", "mine")),
]


def without_checkpoints(run: str):
    """A run folder without its phase-<p>/ and step-<n>/ checkpoints."""
    def apply(case):
        for folder in at(case, run).glob("*-*"):
            if folder.is_dir() and folder.name.split("-")[0] in ("phase", "step"):
                shutil.rmtree(folder)
    return apply


# Issue 47: eval, sample, export and scan take a run folder (its newest phase-<p>/); one without a checkpoint says
# what it holds instead.
RUN_FOLDERS = [
    case("sample a run restored from its record, without weights", SAMPLE(f"{RUNS}/s42/pre-grow"),
         (f"{RUNS}/s42/pre-grow", "restored from its record", "without weights", "move it away"),
         without_checkpoints(f"{RUNS}/s42/pre-grow"), write(f"{RUNS}/s42/pre-grow/record.json", "{}")),
    case("eval a run whose phase-0 is partly written", EVAL(f"{RUNS}/s42/post-grow"),
         (f"{RUNS}/s42/post-grow", "no finished checkpoint yet", "phase-0 only partly written"),
         without_checkpoints(f"{RUNS}/s42/post-grow"), delete(f"{RUNS}/s42/post-grow/done.json"),
         make_dir(f"{RUNS}/s42/post-grow/phase-0.tmp")),
    case("eval a finished run without its checkpoints", EVAL(f"{RUNS}/s42/post-grow"),
         (f"{RUNS}/s42/post-grow", "a finished run without its phase checkpoints"),
         without_checkpoints(f"{RUNS}/s42/post-grow")),
    case("export a run whose first phase is training", EXPORT(f"{RUNS}/s42/pre-joint", "{C}/out"),
         (f"{RUNS}/s42/pre-joint", "no finished checkpoint yet", "first phase still training"),
         without_checkpoints(f"{RUNS}/s42/pre-joint"), delete(f"{RUNS}/s42/pre-joint/done.json")),
    case("export a folder of runs", EXPORT(RUNS, "{C}/out"), (RUNS, "holds runs", "s42/")),
    case("scan a folder of runs", ["scan", f"{RUNS}/s42", "--scale", "smoke", "--runs-dir", "{R}", "--results-dir", "{S}"],
         (f"{RUNS}/s42", "holds runs")),
    case("sample a run folder, --max-new-tokens past its trained context",
         SAMPLE(f"{RUNS}/teacher", "--max-new-tokens", "40"),  # smoke's data.max_len 32, less "The Union"'s 7 tokens
         ("--max-new-tokens", f"the 32 positions {TEACHER} was trained on", "data.max_len", "at most 25")),
]
