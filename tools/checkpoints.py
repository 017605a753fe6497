"""What the kit does with any checkpoint it reads (a teacher, a student of any placement, an export): the one a run
folder names, its scale (by its vocabulary), its trained context, its CE, and a pre-norm student's HF export.

    python repro.py eval runs/toy/s42/post-grow/phase-2 --scale toy --json
    python repro.py eval runs/toy/s42/post-grow              # the run's last phase checkpoint, named in one line
    python repro.py export runs/toy/s42/pre-grow/phase-2 out/pre-grow-hf
"""

import json
import re
import sys
from contextlib import suppress
from pathlib import Path

import checkpointing
import config as run_config
import data
import model
import nets
import rundir
from experiments import presets, scan, suite
from experiments.studies import RECORD
from plumbing import corpora, devices, errors, hf_qwen3, tokenizer
from plumbing.checkpoint import CHECKSUMS, read_config

QWEN3_EOT = 151643  # <|endoftext|> in Qwen3's full vocabulary
# A run folder (a student's or a teacher's) holds one of these beside its checkpoints; a checkpoint folder never.
RUN_FILES = ("metrics.jsonl", "done.json", "provenance.json", RECORD)
PHASE = re.compile(r"phase-(\d+)")


def is_run_folder(folder: Path) -> bool:
    return any((folder / name).is_file() for name in RUN_FILES)


def say(lines):
    """Lines about what a command took, on stderr (stdout is its output), once the checkpoint passed its checks."""
    for line in lines:
        print(line, file=sys.stderr)


def checkpoint_in(path: Path, said: list[str]) -> Path:
    """The checkpoint a user's path names: a run folder's newest phase-<p>/ (said in a line appended to `said`),
    else the path as given; a folder of runs, or a run folder without a phase checkpoint, is one line."""
    if not path.is_dir() or ((path / "config.json").is_file() and not is_run_folder(path)):
        return path
    if not is_run_folder(path):
        runs = sorted(p for p in [*path.glob("*"), *path.glob("*/*")] if p.is_dir() and is_run_folder(p))
        if runs:
            raise errors.CheckpointError(f"{path}: holds runs, not a checkpoint; pass one run folder or checkpoint, "
                                         f"e.g. {', '.join(map(str, runs[:2]))}")
        return path
    phases = sorted((int(m[1]), p) for p in path.iterdir() if (m := PHASE.fullmatch(p.name)) and p.is_dir())
    if not phases:
        raise errors.CheckpointError(f"{path}: {no_checkpoint(path)}")
    newest = phases[-1][1]
    why = "the run finished" if (path / "done.json").is_file() else "the run is unfinished: a later phase may follow"
    said.append(f"{path}: a run folder; using its newest phase checkpoint, {newest} ({why})")
    return newest


def student_checkpoint(path: Path) -> Path:
    """The student checkpoint a path names for `scan`, checked."""
    path = checkpoint_in(path, said := [])
    scan.checkpoint_blocks(path)
    say(said)
    return path


def no_checkpoint(run: Path) -> str:
    """What a run folder without a phase checkpoint holds instead, and what to do."""
    if (run / RECORD).is_file():
        return (f"a run folder restored from its record ({RECORD}: its numbers, without weights); move it away and "
                "rerun the command that made it (repro.py train --norm ... --protocol ..., or its experiment) to "
                "train it with weights")
    again = f"rerun the command that trains it (it resumes), then pass {run} again"
    if partial := sorted(p.name for p in run.glob("phase-*.tmp") if p.is_dir()):
        return (f"holds no finished checkpoint yet ({partial[-1].removesuffix('.tmp')} only partly written: "
                f"{partial[-1]}/, left by a run stopped while saving it); {again}")
    if (run / "done.json").is_file():
        return ("a finished run without its phase checkpoints (moved or deleted); put them back, or move the run "
                "away and train it again")
    steps = [row["step"] for row in rundir.read_metrics(run)]
    training = f"its first phase still training, {f'at step {max(steps)}' if steps else 'no step logged'}"
    snapshots = [p for step, p in checkpointing.checkpoints(run) if step is not None and p.name.startswith("step-")]
    if snapshots:
        return f"holds no finished checkpoint yet ({training}); pass its mid-phase snapshot {snapshots[0]}, or {again}"
    return f"holds no finished checkpoint yet ({training}); {again}"


def trained_context(checkpoint: Path, config: dict) -> tuple[int, str]:
    """The most positions a checkpoint was trained on (RoPE positions past the longest training document never
    were, whatever max_position_embeddings allows), and where that is said."""
    run = checkpoint.parent
    if is_run_folder(run) and (run / "config.json").is_file():
        with suppress(errors.KitError, KeyError, TypeError):  # moved or gone (a shipped teacher's): the scale's
            shard = Path(run_config.absolute_paths(rundir.read_json(run / "config.json"), run)["train_data"])
            max_len = rundir.read_json(shard / data.MANIFEST_FILE)["max_len"]
            if isinstance(max_len, int) and max_len > 0:
                return max_len, f"data.max_len of its training shard {shard}"
    kits = is_run_folder(run) or "normgrow_student" in config or (checkpoint / hf_qwen3.EXPORT_MARKER).is_file()
    fitting = scales_for(config["vocab_size"]) if kits else []
    if fitting:
        scale = max(fitting, key=lambda s: presets.PRESETS[s].data["max_len"])
        return presets.PRESETS[scale].data["max_len"], f"data.max_len of the {scale} preset"
    return hf_qwen3.ModelConfig.from_hf(config).max_position_embeddings, "max_position_embeddings"


def load_checkpoint(checkpoint: Path, config: dict) -> model.Qwen3 | model.Student:
    """A student (its config.json, `config`, with a normgrow_student entry) or a plain Qwen3, fp32, in eval mode."""
    return (model.Student.load(checkpoint) if "normgrow_student" in config else model.load_qwen3(checkpoint)).eval()


def checkpoint_config(checkpoint: Path) -> dict:
    """A checkpoint's config.json with its model fields checked before its vocabulary picks a scale; a student
    checkpoint without checksums.json in its run's folder must have the run's placement (pre- and post-norm
    tensors have the same names and shapes, so a relabelled one would load as the other placement)."""
    config = read_config(checkpoint)
    hf_qwen3.ModelConfig.from_hf(config, str(checkpoint / "config.json"))
    shape, run = config.get("normgrow_student"), checkpoint.parent
    if not (checkpoint / CHECKSUMS).exists() and isinstance(shape, dict) and (run / "metrics.jsonl").is_file() \
            and (run / "config.json").is_file():
        norm = rundir.read_json(run / "config.json").get("norm")
        if isinstance(norm, str) and norm != "auto" and shape.get("norm") != norm:
            raise errors.CheckpointError(f"{checkpoint / 'config.json'}: norm {shape.get('norm')!r}, where its run "
                                         f"trained {norm!r} ({run / 'config.json'}), and without {CHECKSUMS} nothing tells "
                                         "which is right; restore the checkpoint's config.json (or its checksums.json)")
    return config


def vocabulary_fits(vocab: int, eot: int) -> bool:
    """A truncated vocabulary (smoke, toy) must end at the tokenizer's <|endoftext|>; Qwen3's own must hold it."""
    return not ((vocab < QWEN3_EOT and vocab != eot + 1) or vocab <= eot)


def scales_for(vocab: int) -> list[str]:
    return [s for s, p in presets.PRESETS.items() if vocabulary_fits(vocab, corpora.vocabulary(p.data).eot)]


def scale_of(config: dict, runs_dir: Path, checkpoint: Path) -> str:
    """The scale whose vocabulary a checkpoint has (of several, the one whose data exists under runs_dir)."""
    if not (matches := scales_for(config["vocab_size"])):
        raise errors.UsageError(f"{checkpoint / 'config.json'}: vocab_size {config['vocab_size']} fits no scale's "
                                "tokenizer; the checkpoint is not the kit's, or its config.json was edited")
    return next((s for s in matches if (runs_dir / s / "data" / "val").is_dir()), matches[0])


def check_vocabulary(val: data.Shard, vocab: int, checkpoint: Path):
    """A checkpoint and a shard from different tokenizers."""
    if not vocabulary_fits(vocab, val.eot):
        raise errors.DataError(f"{checkpoint}: its vocabulary ({vocab} ids) is not the one {val.path} was tokenized "
                               f"with (<|endoftext|> = {val.eot}); pass the matching --scale or --data")


def evaluate(checkpoint: Path, scale: str | None, data_dir: Path | None, runs_dir: Path) -> dict:
    """CE and PPL of a checkpoint on a validation shard (the scale's unless data_dir is given)."""
    checkpoint = checkpoint_in(checkpoint, said := [])
    config = checkpoint_config(checkpoint)
    fitting = scales_for(config["vocab_size"])
    if scale and not data_dir and scale not in fitting:  # said before its shard is looked for (it may not exist)
        raise errors.DataError(f"{checkpoint}: its vocabulary ({config['vocab_size']} ids) is not --scale {scale}'s; "
                               + (f"pass --scale {fitting[0]}" if fitting else "pass --data with the shard it was made for"))
    scale = scale or scale_of(config, runs_dir, checkpoint)
    ws = suite.Workspace(presets.PRESETS[scale], runs_dir / scale, Path("results"), devices.Dist())
    val = data.Shard(data_dir or ws.data_dir / "val")
    check_vocabulary(val, config["vocab_size"], checkpoint)
    net = load_checkpoint(checkpoint, config)
    say(said)
    settings = suite.run_config(ws, suite.RunName("post", "joint"), ws.preset.run["seed"])
    dtype, _ = devices.precision_choice(settings.precision, ws.ctx.device)
    scores = nets.evaluate(settings, net, None, val, active_blocks=None, ctx=ws.ctx, dtype=dtype)
    return {"checkpoint": str(checkpoint), "data": str(val.path), "ce": scores["ce"], "ppl": scores["ppl"],
            "tokens": scores["val_tokens"]}


def export(student_dir: Path, out_dir: Path, force: bool, runs_dir: Path) -> model.Student:
    """A pre-norm student checkpoint as a standard HF Qwen3 folder with the kit's tokenizer; the student."""
    student_dir = checkpoint_in(student_dir, said := [])
    enc = corpora.vocabulary(presets.PRESETS[scale_of(checkpoint_config(student_dir), runs_dir, student_dir)].data)
    generation = {"bos_token_id": enc.eot, "eos_token_id": enc.eot, "pad_token_id": enc.eot, "do_sample": False}
    extra_files = {**tokenizer.hf_tokenizer_files(enc), "generation_config.json": json.dumps(generation)}
    # What export_hf writes: an HF checkpoint (config.json, model.safetensors), these files and the kit's marker.
    written = {"config.json", "model.safetensors", hf_qwen3.EXPORT_MARKER, *extra_files}
    check_export_target(student_dir, out_dir, force, runs_dir, written)
    student = model.Student.load(student_dir)
    say(said)
    try:
        hf_qwen3.export_hf(student, out_dir, source=str(student_dir), extra_files=extra_files)
    except OSError as e:  # a read-only place, a path through a file: its first mkdir fails
        raise errors.CheckpointError(f"{out_dir}: cannot write the export there ({e.strerror or e}); choose a folder "
                                     "you can write to") from None
    return student


def check_export_target(student_dir: Path, out_dir: Path, force: bool, runs_dir: Path, written: set[str]):
    """Never inside a runs tree (a run's --force may delete its folder); --force replaces only an earlier export
    holding nothing but the files an export writes (`written`), never the checkpoint or a folder that holds it;
    <out>.tmp and <out>.old, which an export writes through, hold nothing else either."""
    source, target = student_dir.resolve(), out_dir.resolve()
    runs = [p for p in target.parents if p == runs_dir.resolve() or (p / "metrics.jsonl").is_file()]
    if runs:  # a run folder, or the runs folder: a rerun with --force may delete what is in it
        raise errors.CheckpointError(f"{out_dir}: inside a runs tree ({runs[0]}), where a rerun with --force may "
                                     "delete it; export to a folder outside it")
    for sibling in (out_dir.with_name(out_dir.name + ".tmp"), out_dir.with_name(out_dir.name + ".old")):
        if sibling.is_symlink() or sibling.is_file() or (sibling.is_dir() and not_exported(sibling, written)):
            raise errors.CheckpointError(f"{sibling}: not written by the kit, and an export to {out_dir} writes through "
                                         "it and then removes it; move it away or export to another folder")
    if not out_dir.exists():
        return
    if source == target or target in source.parents:
        raise errors.CheckpointError(f"{out_dir}: is or holds the checkpoint being exported; choose another output folder")
    if out_dir.is_dir() and not any(out_dir.iterdir()):  # an empty folder holds nothing to lose: used as a new one
        return
    if not force:
        raise errors.CheckpointError(f"{out_dir}: already exists; choose another folder, or pass --force to replace "
                                     "an earlier export")
    if not (out_dir / hf_qwen3.EXPORT_MARKER).is_file():
        raise errors.CheckpointError(f"{out_dir}: not a folder the kit exported (no {hf_qwen3.EXPORT_MARKER}); --force only "
                                     "replaces earlier exports, so choose a new or empty folder")
    if foreign := not_exported(out_dir, written):
        raise errors.CheckpointError(f"{out_dir / foreign[0]}: not written by the kit, and --force would delete it with "
                                     "the earlier export; move it out of the folder and rerun")


def not_exported(folder: Path, written: set[str]) -> list[str]:
    """What in a folder an export did not write (write_atomic's temporary files aside)."""
    made = lambda p: p.is_file() and not p.is_symlink() and (p.name in written or re.fullmatch(r"\..+\.\d+\.tmp", p.name))
    return sorted(p.name for p in folder.iterdir() if not made(p))
