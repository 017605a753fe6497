"""A scale's workspace and the runs it needs: where data, teacher, runs and results live, each named run's
settings, and the inputs every run reads: the data, and the teacher (the hub's, the shipped one that fits the
workspace, or the kit's own, trained); experiments/training.py trains the runs.

    ws = suite.workspace("toy", Path("runs"), Path("results"))
    pre_grow, post_grow = RunName("pre", "grow"), RunName("post", "grow")
    teacher = suite.ensure_inputs(ws)                    # the data prepared, the teacher fetched or trained
    config = suite.run_config(ws, post_grow, 42)        # a config.RunConfig, paths relative to its folder
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.table import Column, Table

import config
import data
import grow
import rundir
from experiments import prepare_shards
from experiments.presets import PRESETS, Preset, Settings, apply_overrides
from experiments.set_values import override_name
from plumbing import checkpoint, corpora, devices, errors, faults, locks, paths, tokenizer
from plumbing.hf_qwen3 import ModelConfig
from plumbing.progress import Runs


class TextConsole(Console):
    """The kit's one console: what it prints holds paths and values the user gave ("copy [v2]", ":bug:", an ESC),
    so a string is text, never rich markup or emoji codes, its control characters but line breaks escaped."""

    def print(self, *objects, **kwargs):
        text = lambda s: "\n".join(locks.printable(line, sys.maxsize) for line in s.split("\n"))
        super().print(*(text(o) if isinstance(o, str) else o for o in objects), **kwargs)


console = TextConsole(width=None if sys.stdout.isatty() else 140, markup=False, emoji=False)

# Workspace: where a scale's data, runs and results live

def run_folder(run: str, seed: int | str, variant: str = "", students: str = "") -> str:
    """A run's folder under its workspace's runs/ (the key references and records name it by) from its name, seed, variant
    ("" the suite's own run) and students of other settings (set/<...>): the runs' layout's one place; "*" globs them."""
    return str(Path(students, f"beyond/{variant}" if variant else "", f"s{seed}", run))


@dataclass(eq=False)  # hashed by identity: results computed from a workspace are cached per run
class Workspace:
    preset: Preset
    runs: Path
    results: Path
    ctx: devices.Dist
    student_runs: str = ""  # a subfolder of runs/<scale>/ for students of other settings (set/<...>)
    variant: str = ""       # a variant's folder (variants.variant_workspace): its runs beside the suite's (run_folder)
    tracker: str = ""       # rundir.TRACKERS: also log to TensorBoard or W&B
    lockstep: bool = True   # train a seed's runs together (repro.py: off on a GPU where lockstep_plan.fits says no)
    inputs: Preset | None = None  # the preset whose data and teacher these runs share (None: `preset`)
    wait: bool = True          # for another process holding a folder this command needs (False: stop, one line)
    records: Path | None = None  # a study's records (experiments/studies.py), written as each run finishes
    on_finished: Callable[[Workspace, RunName, int], None] | None = None  # studies.record_finished, where recorded
    # the command's runs, counted for its progress ("run 3 of 12"); shared by the workspaces replace() makes of it
    progress: Runs = field(default_factory=Runs, repr=False)

    @property
    def data_dir(self) -> Path:
        return self.runs / "data"

    def folder(self, run: RunName, seed: int) -> str:
        return run_folder(run.name, seed, self.variant, self.student_runs)

    def run_dir(self, run: RunName, seed: int) -> Path:
        return self.runs / self.folder(run, seed)

    @property
    def teacher_dir(self) -> Path:
        """The kit's own teacher, shared by every student of the scale (and of its student overrides)."""
        return self.runs / "teacher"

    @property
    def replay_docs(self) -> int:
        return self.preset.run["phase_steps"] * self.preset.run["global_batch"]

    @property
    def train_docs(self) -> int | None:
        """The one-phase shard, then enough fresh documents for the longest joint control (None: the
        whole corpus, for a small embedded one that the kit's own teacher also learns from)."""
        inputs = self.inputs or self.preset
        if inputs.data.get("all_documents"):
            return None
        return inputs.run["phase_steps"] * inputs.run["global_batch"] * max(inputs.long_phases)


def workspace(scale: str, runs_dir: Path, results_dir: Path | None = None, dry_run: bool = False,
              overrides: Settings | None = None, compile_flag: bool | None = None, device: str = "auto", tracker: str = "",
              lockstep: bool = True, wait: bool = True) -> Workspace:
    """A scale's folders, with `overrides` (presets.Settings, parsed from --set) applied, placed as docs/design.md
    ("A workspace") says; everything is checked before a folder is made (the folders' writability not for a dry run)."""
    overrides = overrides or {}
    preset, changes = apply_overrides(PRESETS[scale], overrides, compile_flag)
    if "seed" in changes.get("run", {}):  # --set run.seed=N is --seeds N: that seed's folder, the scale's inputs
        del changes["run"]["seed"]
        changes = {section: keys for section, keys in changes.items() if keys}
    if "data" in changes:  # the tokenizer and corpus as set exist (building them reads no document), before any folder
        d = preset.data
        try:
            corpora.vocabulary(d)
            corpus = corpora.corpus(d["source"], d["val_docs"], preset.run["seed"], **corpus_options(preset))
            if d["source"] == "local":  # its files read once now: a bad byte, line or count is one line before any folder
                corpus.validation_documents()
        except errors.DataError as e:
            raise errors.OptionError("--set", str(e)) from None
    if preset.needs_cuda and not dry_run:
        import torch
        if not torch.cuda.is_available() or device not in ("auto", "cuda"):
            command = " ".join(shlex.quote(a) for a in sys.argv[1:])
            raise errors.UsageError(f"--scale {scale} needs CUDA GPUs and this machine has none; on a GPU node "
                                   f"launch: torchrun --nproc_per_node={8 if scale == 'full' else 1} repro.py "
                                   f"{command} (or add --dry-run here to see the plan)")
    rundir.check_tracker(tracker)
    ctx = devices.setup_distributed(device)
    if not dry_run:
        paths.writable_dir(runs_dir, "--runs-dir")
        if results_dir is not None:
            paths.writable_dir(results_dir, "--results-dir")
    results_dir = results_dir or Path("results")
    ws = Workspace(preset, runs_dir / scale, results_dir / scale, ctx, tracker=tracker, lockstep=lockstep, wait=wait)
    if not changes:
        return ws
    name = override_name(changes)
    # Student settings share the scale's data and teacher, unless they need more documents than its shard holds.
    shard_docs = replace(ws, preset=PRESETS[scale]).train_docs  # None: the whole corpus
    if not set(changes) - {"run", "diag"} and (shard_docs is None or ws.train_docs <= shard_docs):
        return replace(ws, results=results_dir / f"{scale}+{name}", student_runs=f"set/{name}", inputs=PRESETS[scale])
    # Own data and teacher, named by what makes them: the data and teacher changes, and the students' batch and
    # steps where they size a cut shard (train_docs); students of other settings live in set/<those>/ beside them.
    made_by = lambda section, key: section not in ("run", "diag") or (shard_docs is not None and section == "run"
                                                                     and key in ("phase_steps", "global_batch"))
    made = {section: {k: v for k, v in values.items() if made_by(section, k)} for section, values in overrides.items()}
    inputs, input_changes = apply_overrides(PRESETS[scale], made)
    student_changes = {section: keep for section, keys in changes.items() if section in ("run", "diag")
                       and (keep := {k: v for k, v in keys.items() if k not in input_changes.get(section, {})})}
    return replace(ws, runs=runs_dir / f"{scale}+{override_name(input_changes)}", results=results_dir / f"{scale}+{name}",
                   student_runs=f"set/{override_name(student_changes)}" if student_changes else "",
                   inputs=inputs if student_changes else None)


def corpus_options(preset: Preset) -> dict:
    """corpora.corpus's options (path, revision, cache_dir) among a preset's data settings."""
    settings = ("source", "vocab_size", "max_len", "val_docs", "all_documents")
    return {k: v for k, v in preset.data.items() if k not in settings}


def data_summary(ws: Workspace, force: bool = False) -> Table:
    """`repro.py data`: the scale's shards, prepared, summarised side by side."""
    enc = corpora.vocabulary(ws.preset.data)
    summaries = {split: prepare_shards.summarize(shard, enc)
                 for split, shard in zip(("train", "validation"), prepare_data(ws, force))}
    title = f"data at scale {ws.preset.name} ({enc.name}); boundary tokens = leading <|endoftext|> per document"
    table = Table("", *(Column(split, justify="right") for split in summaries), title=title)
    for key in summaries["train"]:
        table.add_row(key, *[f"{s[key]:,}" for s in summaries.values()])
    return table


def prepare_data(ws: Workspace, force: bool = False) -> tuple[data.Shard, data.Shard]:
    """Tokenize once, on rank 0; every rank then memory-maps the shards (those of other inputs: `force` rebuilds)."""
    d = ws.preset.data
    enc = corpora.vocabulary(d)
    def prepare():  # by one process at a time (locks.held): another one preparing them is waited for
        seed = PRESETS[ws.preset.name].run["seed"]
        with locks.held([ws.data_dir], ws.wait):
            if force and (corpus := shard_corpus(ws)) is not None:
                # --force would rebuild the shards from an edited corpus under a teacher and runs trained on the old
                # content, which a later run would reuse: refused, naming what to move away.
                trained = sorted(p.name for p in ws.runs.iterdir() if p.name != "data" and not p.name.startswith("."))
                identity = lambda: corpora.corpus(d["source"], d["val_docs"], seed, **corpus_options(ws.preset)).identity
                if trained and corpus != checkpoint.loads(checkpoint.json_text(identity())):  # as a manifest reads back
                    raise errors.DataError(f"{ws.data_dir}: the corpus changed since {trained[0]} was trained on these "
                                           f"shards; --force would rebuild them under it: move {', '.join(trained)} out "
                                           f"of {ws.runs} (or choose another --runs-dir) and rerun")
            return prepare_shards.prepare(d["source"], ws.data_dir, enc, max_len=d["max_len"],
                                          n_train_docs=ws.train_docs, n_val_docs=d["val_docs"], seed=seed,
                                          progress=console.is_terminal, force=force, **corpus_options(ws.preset))
    # Rank 0 prepares (and checksums what it reuses), the others wait for it without a collective's timeout.
    shards = ws.ctx.on_main(prepare, "preparing the data")
    for split in ("train", "val"):
        ws.ctx.check_shared(ws.data_dir / split / data.MANIFEST_FILE, f"the {split} shard")
    if not ws.ctx.is_main:
        shards = data.Shard(ws.data_dir / "train", verify=False), data.Shard(ws.data_dir / "val", verify=False)
    faults.kill_point("prepared", "data")
    return shards


def shard_corpus(ws: Workspace) -> dict | None:
    """The corpus identity (source, options, content sha256) the training shard was built from, if one is there."""
    manifest = ws.data_dir / "train" / data.MANIFEST_FILE
    try:
        return checkpoint.loads(manifest.read_bytes()).get("corpus")
    except (OSError, ValueError, AttributeError):
        return None


def hub_teacher(ws: Workspace) -> Path:
    """A teacher from a local folder or the HF hub (HF_TOKEN from the environment; HF_HUB_OFFLINE=1 honoured)."""
    name = ws.preset.teacher
    if Path(name).is_dir():
        return Path(name)
    # A path (anything but owner/name) is a folder that is missing, not the hub's "Repo id must be in the form".
    if name.startswith(("/", ".", "~")) or name.count("/") != 1:
        raise errors.CheckpointError(f"teacher {name}: no such folder; point the preset's teacher at a Qwen3 "
                                    "checkpoint folder or a hub id (owner/name)")
    import huggingface_hub
    patterns = ["*.json", "*.safetensors", "tokenizer*"]
    try:
        path = ws.ctx.on_main(lambda: Path(huggingface_hub.snapshot_download(name, allow_patterns=patterns)),
                              f"downloading the teacher {name}")
        if not ws.ctx.is_main:  # rank 0's download, read from the cache every rank must share
            try:
                path = Path(huggingface_hub.snapshot_download(name, allow_patterns=patterns, local_files_only=True))
            except (OSError, ValueError):
                path = Path(huggingface_hub.constants.HF_HUB_CACHE) / name.replace("/", "--")
        ws.ctx.check_shared(path / "config.json", f"the teacher {name}")
        return path
    except (OSError, ValueError) as e:  # every hub error: not found, gated, offline and not cached, no network
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        fix = ("it is not in the local cache and HF_HUB_OFFLINE=1: fetch it once online, or point the preset at a "
               "local folder" if huggingface_hub.constants.HF_HUB_OFFLINE else
               "check the id, the network, and HF_TOKEN for a gated model")
        raise errors.CheckpointError(f"teacher {name}: cannot get it from the Hugging Face hub ({why}); {fix}") from None


# Named runs. A run is computed once and shared by every experiment that needs it.

RUN_PROTOCOLS = ("joint", "grow", "freeze", "joint-long", "joint-longer", "joint-replay")
# The run whose first phases a protocol's run shares (prefix_run: how many), computed before it (with_prefixes).
PARENT_PROTOCOLS = {"freeze": "grow", "joint-long": "joint", "joint-replay": "joint", "joint-longer": "joint-long"}


@dataclass(frozen=True)
class RunName:
    """A student run of the suite: `norm` a placement (model.PLACEMENTS), one per block ("pre,post,post") or "auto";
    `protocol` one of RUN_PROTOCOLS. Its folder and key is `name`; nothing reads its fields back from a name."""
    norm: str
    protocol: str

    def __post_init__(self):
        if self.protocol not in RUN_PROTOCOLS:
            raise ValueError(f"protocol {self.protocol!r} is not one of {', '.join(RUN_PROTOCOLS)}")

    @property
    def name(self) -> str:
        return f"{self.norm}-{self.protocol}"

    @property
    def parent(self) -> RunName | None:
        """The run whose first phases are this one's (PARENT_PROTOCOLS), if any."""
        protocol = PARENT_PROTOCOLS.get(self.protocol)
        return RunName(self.norm, protocol) if protocol else None


def prefix_run(run: RunName, ws: Workspace) -> tuple[RunName, int] | None:
    """(run, phase) whose phases 0..phase are identical to this run's first ones."""
    # a long joint control without restart_optimizer carries AdamW's moments across restarts, and kept checkpoints hold none
    if run.parent is None or (run.protocol != "freeze" and not ws.preset.run.get("restart_optimizer", True)):
        return None
    # freeze's phase 0 is grow's phase 0 (Table 2 reads it); the long controls' first phase is joint itself
    return run.parent, (ws.preset.long_phases[0] - 1 if run.protocol == "joint-longer" else 0)


def shard_paths(ws: Workspace) -> dict:
    return dict(train_data=str(ws.data_dir / "train"), val_data=str(ws.data_dir / "val"))


def run_config(ws: Workspace, run: RunName, seed: int, teacher: Path | None = None) -> config.RunConfig:
    """A named run's settings, its paths relative to its own folder (so the runs tree can be moved)."""
    # joint-replay: grow's steps (one phase per block, an LR restart at each, as grow's) on grow's shard
    protocol = run.protocol
    phases = {"joint-long": ws.preset.long_phases[0], "joint-longer": ws.preset.long_phases[1],
              "joint-replay": ws.preset.run["blocks"]}.get(protocol, 1)
    prefix = prefix_run(run, ws)
    start_from = str(ws.run_dir(prefix[0], seed) / f"phase-{prefix[1]}") if prefix else ""
    settings = {**ws.preset.run, **shard_paths(ws), "name": run.name, "seed": seed, "norm": run.norm,
                "protocol": "joint-long" if phases > 1 or protocol == "joint-replay" else protocol, "joint_phases": phases,
                "replay_docs": ws.replay_docs, "teacher": "" if scratch(ws) else str(teacher or ""),
                "start_from": start_from, **({"long_data": "replay"} if protocol == "joint-replay" else {})}
    if run.norm != "post":  # a post-norm option: other placements keep one identity whatever it is set to
        settings.pop("post_output_gain", None)
    if settings["protocol"] != "joint-long":  # likewise an option of the long joint controls only
        settings.pop("restart_optimizer", None)
    return config.RunConfig(**settings).relative_to(ws.run_dir(run, seed), ws.runs)


def teacher_config(ws: Workspace, folder: Path | None = None) -> config.RunConfig:
    """The kit's own teacher's settings as its folder stores them: the scale's own run settings under teacher_run's
    (--set run.* changes the students only), plain CE pretraining of teacher_model over the scale's vocabulary."""
    settings = {**PRESETS[ws.preset.name].run, **ws.preset.teacher_run, **shard_paths(ws), "name": "teacher",
                "protocol": "teacher", "norm": "pre", "replay_docs": len(data.Shard(ws.data_dir / "train", verify=False)),
                "teacher_config": {**ws.preset.teacher_model, "vocab_size": corpora.vocabulary(ws.preset.data).n_vocab}}
    return config.RunConfig(**settings).relative_to(folder or ws.teacher_dir, ws.runs)


def scratch(ws: Workspace) -> bool:
    """Growth from scratch (the scratch experiment's students): plain CE, no teacher loaded."""
    return ws.preset.run.get("scratch_model") is not None


def with_prefixes(runs) -> list[RunName]:
    """The runs in an order where every shared prefix is computed before the run that reuses it."""
    ordered = []
    for run in runs:
        chain = [run]
        while chain[-1].parent:
            chain.append(chain[-1].parent)
        ordered += [r for r in reversed(chain) if r not in ordered]
    return ordered


def run_status(run_dir: Path) -> str:
    if (run_dir / "done.json").is_file():
        return "done"
    steps = [r["step"] for r in rundir.read_metrics(run_dir)]
    return f"partial (step {max(steps)})" if steps else "pending"


def ensure_teacher(ws: Workspace, force: bool = False) -> Path:
    """The kit's own teacher (a hub one is hub_teacher's): the shipped one installed where it fits, else trained."""
    ws.ctx.on_main(lambda: install_shipped_teacher(ws), "installing the shipped teacher")
    grow.train(teacher_config(ws), ws.teacher_dir, force=force, ctx=ws.ctx, tracker=ws.tracker, wait=ws.wait)
    refuse_diverged_teacher(ws.teacher_dir)
    return ws.teacher_dir / "phase-0"


SHIPPED_ROOT = Path(__file__).resolve().parents[1]


def shipped_shards() -> tuple[Path, dict]:
    """teachers/shards.json, where `repro.py teacher --ship` records the shards each shipped teacher learned from,
    and what it holds, checked before any work (an entry of another shape would silently keep its teacher out)."""
    record = SHIPPED_ROOT / "teachers" / "shards.json"
    recorded = rundir.read_json(record) if record.is_file() else {}
    sums = lambda split: split is None or (isinstance(split, dict) and all(isinstance(v, str) for v in split.values()))
    for name, shards in recorded.items():  # as shard_sha256s gives them: {train, val: {file: sha256}}
        if not (isinstance(shards, dict) and sorted(shards) == ["train", "val"] and all(map(sums, shards.values()))):
            raise errors.CheckpointError(f"{record}: {name!r} holds {str(shards)[:60]}, not the sha256s of a teacher's "
                                         "train and val shards; restore the file (git checkout teachers/shards.json)")
    return record, recorded


def shard_sha256s(ws: Workspace) -> dict:
    """The workspace's train and validation shards by their manifests' sha256s: the same data, token for token."""
    return {split: rundir.read_json(ws.data_dir / split / "manifest.json").get("sha256") for split in ("train", "val")}


def shipped_teacher_for(ws: Workspace) -> str:
    """The shipped teacher trained as this workspace's would be (its config.json teacher_config's, and where
    teachers/shards.json records its data, the same shards); "" if none is. Needs the data prepared."""
    wanted, recorded, shards = teacher_config(ws), shipped_shards()[1], shard_sha256s(ws)
    for name in ws.preset.shipped_teachers:
        try:
            rundir.check_config(wanted, SHIPPED_ROOT / name)
        except errors.TrainingError:
            continue
        if recorded.get(name, shards) == shards:
            return name
    return ""


def install_shipped_teacher(ws: Workspace) -> bool:
    """The shipped teacher trained as this one would be, copied to the workspace's teacher/ if none is there,
    checksums verified; True if installed."""
    folder = ws.teacher_dir
    if (folder / "config.json").exists():
        return False
    for name, part in ((n, SHIPPED_ROOT / n / sub) for n in ws.preset.shipped_teachers for sub in ("", "phase-0")):
        why = checkpoint.damage(part) if (part / checkpoint.CHECKSUMS).is_file() else f"{checkpoint.CHECKSUMS} is missing"
        if why:  # before any is read: one damaged is refused whichever this workspace would take
            raise errors.CheckpointError(f"{part}: the shipped teacher is damaged ({why}); restore it (git checkout "
                                         f"{name}) or rebuild it: repro.py teacher --rebuild")
    if not (name := shipped_teacher_for(ws)):
        return False
    tmp = folder.with_name(f".{folder.name}.shipped.{os.getpid()}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(SHIPPED_ROOT / name, tmp)
    try:
        tmp.rename(folder)
    except OSError:  # another process installed it first
        shutil.rmtree(tmp)
        return False
    console.print(f"teacher: installed the shipped one ({name}, checksums verified) in {folder}")
    return True


def refuse_diverged_teacher(folder: Path):
    """Students never distil from a teacher that diverged."""
    if (folder / "done.json").is_file() and (record := rundir.final_eval(folder).get("diverged")):
        raise errors.TrainingError(f"{folder}: the teacher diverged at step {record['step']} ({record['why']}); no "
                                   "student distils from it: lower teacher_run.lr (--set) and rerun")


def ensure_inputs(ws: Workspace, force: bool = False) -> Path:
    """Data and teacher of a scale; the teacher's checkpoint folder. A hub teacher is fetched and checked first."""
    force = force and ws.inputs is None  # students with overrides never rebuild the data and teacher they share
    shipped_shards()
    if ws.preset.teacher:
        teacher = hub_teacher(ws)
        ModelConfig.from_hf(checkpoint.read_config(teacher), str(teacher / "config.json"))
    prepare_data(ws, force)
    if not ws.preset.teacher:
        teacher = ensure_teacher(ws, force)
    tokenizer.check_teacher_tokenizer(teacher, corpora.vocabulary(ws.preset.data))
    return teacher


def teacher_summary(ws: Workspace, runs, seeds: list[int]) -> str:
    """The kit's own teacher: its cost (cached after the first run) and its lead over the students."""
    teacher = ws.teacher_dir
    result = rundir.read_json(teacher / "done.json", "ce", "step")
    seconds = max((r.get("time", 0.0) for r in rundir.read_metrics(teacher) if not r.get("eval")), default=0.0)
    students = [(rundir.final_eval(ws.run_dir(r, s))["ce"], f"{r.name} s{s}") for r in runs for s in seeds]
    finished = [(ce, name) for ce, name in students if ce is not None]  # a diverged student has no CE
    if not finished:
        return f"teacher: validation CE {result['ce']:.4f} after {result['step']} steps; every student diverged"
    best_ce, best = min(finished)
    return (f"teacher: validation CE {result['ce']:.4f} after {result['step']} steps, trained in {seconds / 60:.1f} min "
            f"(cached in {teacher}); best student {best} at {best_ce:.4f}, {abs(best_ce - result['ce']):.4f} nats "
            f"{'above' if best_ce >= result['ce'] else 'below'} the teacher's")
