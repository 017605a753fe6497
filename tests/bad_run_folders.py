"""The bad-input table's cases (run by tests/test_bad_inputs.py) of what a rerun reads: finished run
folders, shards, teachers, reports and references damaged before it, teachers that cannot be had, and
local corpora that cannot be read."""
import json
import shutil
from dataclasses import replace
from pathlib import Path

from conftest import (
    EVAL,
    EXPORT,
    GOOD_REFERENCE,
    PRE,
    RUN,
    RUNS,
    TABLE1,
    TEACHER,
    TRAIN,
    TRAIN_RUN,
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
    truncate,
    unchecked,
    write,
)

from experiments import presets, suite
from plumbing import checkpoint
from tools.preflight import SHIPPED_FILES


def reference_file(content: str):
    """A shipped reference for --scale smoke in the case's own references/ (never the repository's)."""
    return write("{C}/references/smoke.json", content)


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


FRESH = ["table1", "--scale", "smoke", "--runs-dir", "{C}/fresh", "--results-dir", "{S}"]  # an empty runs folder
COMPARE = lambda target: ["compare", target, "--scale", "smoke"]


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
    # issue 59 §1c: a run killed while it trained in bfloat16 is never continued in float32 (its provenance rewritten)
    case("rerun: a run started in bfloat16, resumed by a float32 command", TABLE1,
         ("s42/post-grow: started in bfloat16", "float32"), delete(f"{RUNS}/s42/post-grow/done.json"),
         edit_json(f"{RUNS}/s42/post-grow/provenance.json", lambda p: p.update(precision="bfloat16"))),
    case("train: a run started in bfloat16, resumed in float32", TRAIN_RUN, ("s42/post-grow: started in bfloat16",),
         delete(f"{RUNS}/s42/post-grow/done.json"),
         edit_json(f"{RUNS}/s42/post-grow/provenance.json", lambda p: p.update(precision="bfloat16"))),
    case("rerun: a finished run whose provenance names precision float16", TABLE1, ("post-grow", "'float16'"),
         edit_json(f"{RUNS}/s42/post-grow/provenance.json", lambda p: p.update(precision="float16"))),
    case("rerun: a finished bfloat16 run beside float32 ones", TABLE1, ("s42/post-grow: trained in bfloat16", "float32"),
         edit_json(f"{RUNS}/s42/post-grow/provenance.json", lambda p: p.update(precision="bfloat16"))),
]


REPORTS = [
    case("compare without a shipped reference", COMPARE(RUNS), "smoke.json"),
    case("compare a missing folder", COMPARE("{R}/nowhere"), "nowhere", reference_file(GOOD_REFERENCE)),
    case("compare a file", COMPARE(f"{RUNS}/s42/pre-grow/done.json"), "done.json", reference_file(GOOD_REFERENCE)),
    case("compare an empty folder", COMPARE("{C}/empty"), "empty", reference_file(GOOD_REFERENCE), make_dir("{C}/empty")),
    case("compare, without --scale, a folder that names no scale", ["compare", "{C}/empty"], ("--scale", "names no scale"),
         make_dir("{C}/empty")),
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


LOCAL_DATA = ["data", "--scale", "smoke", "--runs-dir", "{C}/fresh", "--set", "data.source=local", "--set",
              "data.path={C}/c.jsonl"]


def edited_corpus(*trained: str):
    """{C}/c.jsonl tokenized into {C}/fresh's workspace for it (where LOCAL_DATA prepares it), the folders `trained`
    made beside the shards (stand-ins for a teacher and runs trained on them), then the file edited."""
    def apply(case):
        docs = lambda word: "".join(json.dumps({"text": f"document {i} about the {word} fox"}) + "\n" for i in range(200))
        (case / "c.jsonl").write_text(docs("lazy"))
        local = presets.parse_overrides(presets.PRESETS["smoke"], ["data.source=local", f"data.path={case / 'c.jsonl'}"])
        ws = suite.workspace("smoke", case / "fresh", overrides=local, device="cpu")
        suite.prepare_data(ws)
        for name in trained:
            (ws.runs / name).mkdir()
        (case / "c.jsonl").write_text(docs("quick"))
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
    # Issue 34 §8, an edited corpus (before: "pass force=True (--force) ... or choose another output directory").
    case("local corpus edited since its shards were built", LOCAL_DATA,
         ("c.jsonl was edited since", "restore it", "rerun with --force"), edited_corpus()),
    # --force over it with a teacher and runs trained on the old text: prepare_data rebuilt the shards, then named
    # what to move, and a plain rerun reused them with the new shards. Refused before anything is rebuilt.
    case("data --force over an edited corpus, a teacher trained on the old text", [*LOCAL_DATA, "--force"],
         ("teacher", "s42", "--force"), edited_corpus("teacher", "s42")),
]


def shipped_teacher(shards: str):
    """The smoke preset shipping the tree's own teacher as teachers/smoke (in a kit folder of the case,
    checksummed as `teacher --ship` writes it), with teachers/shards.json holding `shards`."""
    def setup(case, monkeypatch):
        source, kit = at(case, f"{RUNS}/teacher"), case / "kit" / "teachers"
        shutil.copytree(source, kit / "smoke", ignore=lambda folder, files: [] if Path(folder) != source else
                        [f for f in files if f not in SHIPPED_FILES])
        checkpoint.write_checksums(kit / "smoke")
        (kit / "shards.json").write_text(shards)
        monkeypatch.setattr(suite, "SHIPPED_ROOT", case / "kit")
        smoke = replace(presets.PRESETS["smoke"], shipped_teachers=("teachers/smoke",))
        monkeypatch.setitem(presets.PRESETS, "smoke", smoke)
    return setup


TEACHER_CMD = ["teacher", "--scale", "smoke", "--runs-dir"]
# Issue 40: shipping a teacher, and installing one, read their inputs before any work.
SHIPPING = [
    case("teacher --ship ''", [*TEACHER_CMD, "{R}", "--ship", ""], "--ship"),
    case("teacher --ship a bad name, into an empty runs folder", [*TEACHER_CMD, "{C}/fresh", "--ship", "Bad_Name"],
         ("--ship", "Bad_Name"), make_dir("{C}/fresh")),
    case("teacher --ship a name taken, into an empty runs folder", [*TEACHER_CMD, "{C}/fresh", "--ship", "toy"],
         ("--ship", "teachers/toy", "exists"), make_dir("{C}/fresh")),
    case("shards.json: an entry a string", FRESH, ("shards.json", "teachers/smoke", "git checkout"), make_dir("{C}/fresh"),
         setup=shipped_teacher('{"teachers/smoke": "abc"}')),
    case("shards.json: an entry without val", FRESH, ("shards.json", "teachers/smoke"), make_dir("{C}/fresh"),
         setup=shipped_teacher('{"teachers/smoke": {"train": {"tokens.u32": "ab"}}}')),
    case("shards.json: a sha256 a number", FRESH, ("shards.json", "teachers/smoke"), make_dir("{C}/fresh"),
         setup=shipped_teacher('{"teachers/smoke": {"train": {"tokens.u32": 5}, "val": {}}}')),
    case("shards.json: a list", FRESH, "shards.json", make_dir("{C}/fresh"), setup=shipped_teacher("[]")),
    case("shards.json: not JSON", FRESH, "shards.json", make_dir("{C}/fresh"), setup=shipped_teacher("{")),
    case("teacher, shards.json an entry a string", [*TEACHER_CMD, "{C}/fresh"], ("shards.json", "teachers/smoke"),
         make_dir("{C}/fresh"), setup=shipped_teacher('{"teachers/smoke": "abc"}')),
]
