"""A run's folder: config.json (the run it holds, checked before it is resumed or discarded), provenance.json (the
commit, torch, machine and precision that trained it), metrics.jsonl (and a tracker), done.json and its final
evaluation, a shared prefix adopted. Its checkpoints (phase-<p>/, step-<n>/, latest/) are written, found and read
back by checkpointing.py.
"""

import json
import math
import os
import re
import shutil
import subprocess
from dataclasses import MISSING, asdict, fields
from functools import partial
from pathlib import Path

import torch

import config
from plumbing import checkpoint
from plumbing.devices import cpu_instructions, cpu_model
from plumbing.errors import TrainingError
from plumbing.locks import printable
from plumbing.writer import wait_for_writes

# Settings that only observe training (the boundary monitor changes nothing): runs differing only in them are one.
OBSERVING = {"monitor_interval", "monitor_rms_warn", "monitor_kurtosis_warn"}


def comparable(settings: dict, run_dir: Path) -> dict:
    """A config as it trains: paths absolute (a moved runs tree is the same run), observing settings left out."""
    return {k: v for k, v in {**settings, **config.absolute_paths(settings, run_dir)}.items()
            if k not in OBSERVING | {"relative_to_run"}}


def check_config(config, run_dir: Path):
    """A TrainingError unless run_dir's config.json reads and trains the same run as `config`."""
    wanted = json.loads(json.dumps(asdict(config)))
    # A field added to RunConfig after the run was made reads as its default: the same run.
    defaults = json.loads(json.dumps({f.name: f.default for f in fields(config) if f.default is not MISSING}))
    stored = {**{k: v for k, v in defaults.items() if k in wanted}, **read_json(run_dir / "config.json")}
    a, b = comparable(stored, run_dir), comparable(wanted, run_dir)
    if a != b:
        changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        raise TrainingError(f"{run_dir}: holds a run with another config (differs in {', '.join(changed)}); "
                            "pass --force to discard it and start over, or choose another output folder")


# What a run folder holds that the kit wrote: its files, checkpoints (with a kill's .tmp/.old), trackers.
KIT_WRITES = re.compile(r"(?:config|provenance|done|diagnostics|record)\.json|metrics\.jsonl|(?:phase-\d+|step-\d+|latest)"
                        r"(?:\.tmp|\.old)?|tensorboard|wandb|\..+\.tmp")


def check_discardable(run_dir: Path):
    """--force discards a run folder only if the kit made everything in it, and never through a symlink."""
    if run_dir.is_symlink():
        raise TrainingError(f"{run_dir}: a symbolic link; --force never deletes through one: remove the link (or "
                            "choose another runs folder) and rerun")
    foreign = sorted(p.name for p in run_dir.iterdir() if not KIT_WRITES.fullmatch(p.name))
    if foreign:
        raise TrainingError(f"{run_dir / foreign[0]}: not written by the kit, and --force would delete it with the run; "
                            "move it out of the run folder and rerun")


def finished(config, run_dir: Path) -> bool:
    """Done under this very config: reused as it is and never written, so it need not be held."""
    try:
        check_config(config, Path(run_dir))
    except TrainingError:  # another config, or none
        return False
    return (Path(run_dir) / "done.json").is_file()


def prepare_run_dir(config, run_dir: Path, force: bool, ctx, provenance: dict) -> bool:
    """Create or check the run directory; True if the run is already done. Another config's run is an error, or
    with `force` discarded."""
    if (run_dir / "config.json").is_file():
        try:
            check_config(config, run_dir)
        except TrainingError:  # another config, or a damaged one the kit wrote: --force redoes the run
            if not force:
                raise
            if ctx.is_main:
                check_discardable(run_dir)
                shutil.rmtree(run_dir)
        else:
            if (run_dir / "done.json").is_file():
                return True
            check_resumed_precision(run_dir, provenance["precision"], provenance["precision_reason"])
    ctx.barrier()
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        checkpoint.write_json(run_dir / "config.json", json.loads(json.dumps(asdict(config))))
        checkpoint.write_json(run_dir / "provenance.json", provenance)
    ctx.barrier()
    return False


CHECKPOINT_FOLDER = re.compile(r"phase-\d+|step-\d+|latest")  # checkpointing.py's kept and rolling ones (not .tmp/.old)


def started_precision(run_dir: Path) -> str | None:
    """The precision a run folder's run computed in (its provenance.json), where it holds done.json or a checkpoint
    to resume from; else None."""
    run_dir = Path(run_dir)
    if not (run_dir / "provenance.json").is_file() or not ((run_dir / "done.json").is_file() or any(
            CHECKPOINT_FOLDER.fullmatch(p.name) and p.is_dir() for p in run_dir.iterdir())):
        return None
    precision = read_json(run_dir / "provenance.json").get("precision")
    return precision if isinstance(precision, str) else printable(repr(precision), 40)


def check_resumed_precision(run_dir: Path, precision: str, why: str):
    """A run resumes in the precision it started in, or is refused: its provenance is never rewritten."""
    kept = None if (Path(run_dir) / "done.json").is_file() else started_precision(run_dir)
    if kept is not None and kept != precision:
        raise TrainingError(f"{run_dir}: started in {kept} (its provenance.json), and this command would continue it "
                            f"in {precision} ({why}); a run keeps the precision it started in: continue it where {kept} "
                            "is chosen, or move the folder away to train it again")


def provenance(ctx, dtype: torch.dtype, why: str) -> dict:
    """What provenance.json records (the CPU's instructions too: AVX2 and AVX-512 round differently)."""
    device = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else ctx.device.type
    return {"git_commit": git_commit(), "torch": torch.__version__, "device": device, "world_size": ctx.world,
            "cpu": cpu_model(), "cpu_capability": cpu_instructions(),
            "threads": torch.get_num_threads(), "precision": str(dtype).removeprefix("torch."), "precision_reason": why}


def git_commit() -> str:
    """The kit's commit, with "+changes" when the working tree differs from it ("" outside git)."""
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=Path(__file__).parent).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        return commit + ("+changes" if commit and git("status", "--porcelain", "--untracked-files=no") else "")
    except OSError:
        return ""


def read_json(path: Path, *keys: str) -> dict:
    """A JSON object the kit wrote, with `keys` present; anything else is one line naming the file."""
    try:
        value = checkpoint.loads(Path(path).read_text())
    except OSError as e:
        raise TrainingError(f"{path}: cannot be read ({e.strerror})") from None
    except ValueError as e:
        raise TrainingError(f"{path}: not valid JSON ({e}); the file is damaged: move it away (or rerun with "
                            "--force for a run's config) and rerun") from None
    if not isinstance(value, dict):  # every file the kit writes as JSON holds an object
        raise TrainingError(f"{path}: a JSON {type(value).__name__}, not the object the kit writes; the file is "
                            "damaged or not the kit's: move it away and rerun")
    if missing := [k for k in keys if k not in value]:
        raise TrainingError(f"{path}: lacks {', '.join(missing)}; the file is damaged or not the kit's: move it "
                            "away and rerun")
    return value


RESULT_KEYS = ("ce", "ppl", "kd")  # in every done.json; the reports read them
# done.json repeats its run's last logged evaluation, bit for bit but where a run killed after its last
# checkpoint evaluated again on resume (another world size: ~1e-15 relative; a GPU's reductions ~1e-7): 1e-6
# relative holds those and no edit of a printed (4-decimal) number.
AGREE = 1e-6


def write_done(run_dir: Path, final: dict | None, step: int, diverged: dict | None, ctx):
    """done.json: the scheduled endpoint's evaluation at `step`, or for a diverged run null numbers and the
    divergence. A finished run is not resumed: its latest/ goes, once its background writes are in place."""
    wait_for_writes(run_dir)
    done = {**final, "step": step} if diverged is None else \
        {**{k: None for k in RESULT_KEYS}, "step": step, "diverged": diverged}
    if ctx.is_main:
        checkpoint.write_json(run_dir / "done.json", done)
        if diverged is None:  # a diverged run keeps its resume point beside the last good checkpoint
            shutil.rmtree(run_dir / "latest", ignore_errors=True)
    ctx.barrier()


def final_eval(run_dir: Path) -> dict:
    """A finished run's done.json, the scheduled endpoint's evaluation. It is data, not a fact: its numbers must be
    what a cross-entropy can be (0 to log V + the run's diverged_above_uniform: past that the run would have been
    recorded as diverged) and what its metrics.jsonl logged; anything else is one line naming the file."""
    path = Path(run_dir) / "done.json"
    result = read_json(path, *RESULT_KEYS)
    if result.get("diverged") is not None:  # an outcome with null numbers (training.check_result checks the record)
        return result
    fix = "the file was edited or damaged: move the run away and rerun it"
    for key in RESULT_KEYS:
        if isinstance(result[key], bool) or not isinstance(result[key], (int, float)):
            raise TrainingError(f"{path}: {key} is {printable(repr(result[key]), 60)}, not a number; {fix}")
    # the vocabulary from the last phase checkpoint's config.json (None without one); the margin 1 if unreadable
    phases = sorted((int(p.name[6:]), p) for p in Path(run_dir).glob("phase-*") if p.name[6:].isdigit())
    vocabulary = stored_number(phases[-1][1] / "config.json", "vocab_size", None,
                               lambda v: isinstance(v, int) and v > 1) if phases else None
    ce, margin = result["ce"], stored_number(Path(run_dir) / "config.json", "diverged_above_uniform", 1.0, lambda v: v >= 0)
    if ce < 0 or vocabulary and ce > math.log(vocabulary) + margin:
        bounds = f"0 to log V + {margin:g} = {math.log(vocabulary) + margin:.4f}" if vocabulary else "at least 0"
        raise TrainingError(f"{path}: ce {ce!r} is not what a cross-entropy can be ({bounds}); {fix}")
    last = last_evaluation(Path(run_dir))
    if last is None:
        raise TrainingError(f"{path}: the run's metrics.jsonl holds no evaluation for its numbers to agree with; {fix}")
    differ = [k for k in RESULT_KEYS if not (isinstance(last.get(k), (int, float))
                                             and math.isclose(last[k], result[k], rel_tol=AGREE, abs_tol=AGREE))]
    if differ or result.get("step", last["step"]) != last["step"]:
        k = differ[0] if differ else "step"
        raise TrainingError(f"{path}: {k} {result.get(k)!r}, but the run's last evaluation in metrics.jsonl (step "
                            f"{last['step']}) logged {last.get(k)!r}; {fix}")
    return result


def stored_number(path: Path, key: str, default, valid):
    """`key` of a JSON file the kit wrote, where it reads and is a number `valid` accepts; else `default`."""
    try:
        value = read_json(path).get(key, default)
    except TrainingError:
        return default
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and valid(value) else default


def read_metrics(run_dir: Path) -> list[dict]:
    """Parsed metrics.jsonl, each row an object with its step. A last line cut short by a kill is dropped while
    the run is unfinished (its resume rewrites the log); any other line the kit cannot have written is one line
    naming the file and line."""
    path = Path(run_dir) / "metrics.jsonl"
    lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
    torn_ok = not (Path(run_dir) / "done.json").is_file()
    rows = [_row(path, number, line, torn_ok and number == len(lines)) for number, line in enumerate(lines, 1)]
    return [row for row in rows if row is not None]


def last_evaluation(run_dir: Path) -> dict | None:
    """A finished run's last evaluation row (not a phase start's), read from the log's end (150k rows at full)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    with open(path, "rb") as f:
        for line, number in _lines_last_first(f):
            try:
                row = _row(path, 0, line, torn_ok=False)
            except TrainingError:  # said again naming its line, whose number costs a read of the lines before it
                _row(path, number(), line, torn_ok=False)
                raise
            if row.get("eval") and not row.get("phase_start"):
                return row
    return None


def _lines_last_first(f, block: int = 1 << 16):
    """(line, a function giving its number) of a binary file, the last line first, read from its end."""
    size, given = f.seek(0, os.SEEK_END), 0  # given: lines yielded so far, from the end
    while True:
        start = max(size - block, 0)
        f.seek(start)
        tail = f.read(size - start)
        block *= 2
        if start and b"\n" not in tail:
            continue
        first = start + tail.index(b"\n") + 1 if start else 0  # where the first whole line of the tail begins
        lines = tail[first - start:].decode(errors="replace").splitlines()
        for i in range(len(lines) - given - 1, -1, -1):
            yield lines[i], partial(_line_number, f, first, i)
        given = len(lines)
        if not start:
            return


def _line_number(f, offset: int, i: int) -> int:
    """The number of the line i lines after `offset` (a line's start: a newline before it cannot be cut)."""
    f.seek(0)
    return len(f.read(offset).decode(errors="replace").splitlines()) + i + 1


def _row(path: Path, number: int, line: str, torn_ok: bool) -> dict | None:
    """Line `number` of a metrics log; None for a line cut short by a kill where one may be (torn_ok)."""
    try:
        row = checkpoint.loads(line)
    except json.JSONDecodeError as e:
        if torn_ok:
            return None
        raise TrainingError(f"{path}:{number}: cut short or not JSON ({e}); the file is damaged: move the run away "
                            "and rerun") from None
    except ValueError as e:
        raise TrainingError(f"{path}:{number}: {e}; the file is damaged: move the run away and rerun") from None
    if not (isinstance(row, dict) and isinstance(row.get("step"), int) and not isinstance(row["step"], bool)):
        raise TrainingError(f"{path}:{number}: not a row the kit writes (an object with its step); the file is "
                            "damaged: move the run away and rerun")
    return row


def monitor_series(run_dir: Path) -> list[dict]:
    """The boundary monitor's rows of a run ({"step", "boundaries"}), in step order."""
    return [r for r in read_metrics(run_dir) if r.get("monitor")]


def truncate_metrics(run_dir: Path, upto_step: int, source: Path | None = None):
    """Keep the log (or `source`'s) up to a checkpoint's step, but the next phase's start: the resume logs it."""
    rows = [r for r in read_metrics(source or run_dir)
            if r["step"] < upto_step or (r["step"] == upto_step and not r.get("phase_start"))]
    checkpoint.write_atomic(run_dir / "metrics.jsonl", "".join(checkpoint.json_text(r, None) for r in rows))


def adopt_shared_prefix(config, run_dir: Path):
    """Copy another run's phase-end checkpoint whose phases equal our first ones, and its log up to it."""
    src = Path(config.start_from)
    state_file = src / "trainer_state.json"
    if not state_file.is_file():
        raise TrainingError(f"{src}: not a finished phase checkpoint (no trainer_state.json); run its run first")
    shutil.copytree(src, run_dir / src.name, dirs_exist_ok=True)
    truncate_metrics(run_dir, read_json(state_file, "step")["step"], source=src.parent)


# The metrics log: metrics.jsonl, and TensorBoard or W&B when asked for (imported only then)

TRACKERS = ("", "tensorboard", "wandb")


class MetricsLog:
    """Rows (already reduced over ranks) appended to metrics.jsonl on rank 0, and fed to a tracker."""

    def __init__(self, run_dir: Path, config, ctx, tracker: str = ""):
        if tracker not in TRACKERS:
            raise TrainingError(f"--log {tracker}: unknown; choose tensorboard or wandb")
        self.file = open(run_dir / "metrics.jsonl", "a") if ctx.is_main else None
        self.send, self.finish = (open_tracker(tracker, run_dir, config) if ctx.is_main and tracker
                                  else (None, None))

    def write(self, row: dict):
        if self.file:
            self.file.write(checkpoint.json_text(row, None))
            self.file.flush()
        if self.send:
            if row.get("monitor"):
                self.send({f"monitor/{r['label']}/{k}": r[k] for r in row["boundaries"]
                           for k in ("mean", "std", "kurtosis", "boundary_over_others", "massive_ratio")
                           if r.get(k) is not None}, row["step"])
                return
            kind = "phase_start" if row.get("phase_start") else "eval" if row.get("eval") else "train"
            self.send({f"{kind}/{k}": v for k, v in row.items() if k not in ("step", "eval", "phase_start")
                       and isinstance(v, (int, float)) and not isinstance(v, bool)}, row["step"])

    def close(self):
        if self.file:
            self.file.close()
        if self.finish:
            self.finish()


def check_tracker(kind: str):
    """Fail before any work if the tracker's package is missing (one line with the install command)."""
    if kind:
        try:
            __import__(kind)  # the package of each of TRACKERS is named as it is
        except ImportError:
            raise TrainingError(f"--log {kind}: the {kind} package is not installed; pip install {kind}") from None


def open_tracker(kind: str, run_dir: Path, config):
    """(send(values, step), finish()) for TensorBoard (run_dir/tensorboard/) or W&B (project normgrow)."""
    check_tracker(kind)
    if kind == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

        def send(values, step):
            for key, value in values.items():
                writer.add_scalar(key, value, step)
            writer.flush()
        return send, writer.close
    import wandb
    run = wandb.init(project="normgrow", name=f"{run_dir.parent.name}/{run_dir.name}", config=asdict(config),
                     dir=str(run_dir), reinit=True)
    return (lambda values, step: run.log(values, step=step)), run.finish
