"""A command's runs trained: what every run will read back checked before any work (check_before_work), then the
data, the teacher and every run each seed needs (ensure_runs), done runs reused, partial ones resumed, in lockstep
where they read the same batches; experiments/suite.py names the runs and places them.

    ws = suite.workspace("toy", Path("runs"), Path("results"))
    training.ensure_runs(ws, [RunName("pre", "grow"), RunName("post", "grow")], seeds=[42, 43])
"""

from collections import Counter
from pathlib import Path
from typing import NamedTuple

from rich.table import Table

import data
import grow
import model
import rundir
from experiments import suite
from experiments.suite import RunName, Workspace, run_config, run_status, scratch, with_prefixes
from plumbing import devices, errors
from plumbing.locks import printable


def check_before_work(ws: Workspace, jobs: list[tuple[RunName, int]], force: bool, teacher: Path | None = None):
    """What a command will read back, read before anything is made or printed, so that a bad setting or a damaged
    file is one line that changes nothing: every run's settings, then (unless --force) the config.json and done.json
    of every run it would reuse or resume, and the kit's own teacher once trained, its checkpoint loaded whole."""
    teacher, precisions = teacher or expected_teacher(ws), []
    for run, seed in jobs:
        try:
            config = run_config(ws, run, seed, teacher=teacher)
        except errors.ConfigError as e:  # RunConfig's own checks: a placement schedule, per-phase LRs and warmups
            raise errors.OptionError("--set", f"run {run.name}: {e}") from None
        folder, discarded = ws.run_dir(run, seed), False
        if not (folder / "done.json").exists():  # one it will train: refused as the dry run refuses it
            data.check_split(config.global_batch, ws.ctx.world, config.micro_batch)
        if (folder / "config.json").exists() and (teacher is not None or scratch(ws)):
            try:
                rundir.check_config(config, folder)
            except errors.TrainingError:
                if not force:
                    raise
                rundir.check_discardable(folder)  # --force discards what does not match, if the kit made all of it
                discarded = True
        elif (folder / "config.json").exists() and not force:
            rundir.read_json(folder / "config.json")  # a hub teacher's cache path is known only once fetched
        if (folder / "done.json").exists() and not force:  # --force: nothing else to read first
            check_result(folder / "done.json")
        precisions.append(run_precision(ws, config, folder, discarded))
    check_one_precision(precisions)
    if force or ws.preset.teacher or scratch(ws):
        return
    own_teacher = ws.teacher_dir
    if (own_teacher / "config.json").exists():
        rundir.read_json(own_teacher / "config.json")
    if (own_teacher / "done.json").exists():
        check_result(own_teacher / "done.json")
        suite.refuse_diverged_teacher(own_teacher)
        if not (own_teacher / "phase-0").is_dir():
            raise errors.TrainingError(f"{own_teacher / 'phase-0'}: missing, although {own_teacher / 'done.json'} says "
                                       f"the teacher is trained; move {own_teacher} away and rerun to train it again")
        model.load_qwen3(own_teacher / "phase-0")


# The precision rule (docs/method.md, "Precision in a study"): the runs a command combines are of one precision,
# each known from what trained it; the dry run, a study's restore and check_before_work all take this one check.

PRECISIONS = tuple(str(dtype).removeprefix("torch.") for dtype in devices.DTYPES.values())  # float32, bfloat16


class RunPrecision(NamedTuple):
    where: str       # the run folder or record that says it
    precision: str   # as provenance.json names it
    how: str         # "trained in", "started in", "recorded in", "trains in"
    fix: str         # what moves it out of the command


def run_precision(ws: Workspace, settings, folder: Path, discarded: bool = False) -> RunPrecision:
    """A run's precision: its provenance.json's where its folder holds a run the command keeps (finished, or a
    checkpoint it resumes from), else the one this command trains it in (its config's, "auto" the study's)."""
    dtype, why = devices.precision_choice(settings.precision, ws.ctx.device, ws.ctx.auto_precision)
    trains = str(dtype).removeprefix("torch.")
    kept = None if discarded else rundir.started_precision(folder)
    if kept is None:
        return RunPrecision(str(folder), trains, "trains in", "")
    if kept in PRECISIONS:  # a resumed run keeps its precision (a damaged name is refused below, named as such)
        rundir.check_resumed_precision(folder, trains, why)
    how = "trained in" if (folder / "done.json").is_file() else "started in"
    return RunPrecision(str(folder), kept, how, f"move {folder} away (its run then trains again)")


def check_one_precision(runs: list[RunPrecision]):
    """The runs of a command in one precision, or one line naming a run of the odd one out and one of the rest."""
    for run in runs:
        if run.precision not in PRECISIONS:
            raise errors.TrainingError(f"{run.where}: {run.how} {printable(run.precision, 40)!r}, not a precision the "
                                       f"kit trains in ({', '.join(PRECISIONS)}); {run.fix or 'restore it'}")
    kinds = Counter(run.precision for run in runs)
    if len(kinds) < 2:
        return
    trains = [run.precision for run in runs if run.how == "trains in"]
    main = trains[0] if trains else kinds.most_common(1)[0][0]
    odd, like = (next(run for run in runs if (run.precision == main) == same) for same in (False, True))
    raise errors.TrainingError(f"{odd.where}: {odd.how} {odd.precision}, but {like.where} {like.how} {main} "
                               f"({kinds[main]} of the {len(runs)} runs the command combines); a table combines one "
                               f"precision: {odd.fix}, or run it as a study of its own (--set run.precision=...)")


def expected_teacher(ws: Workspace) -> Path | None:
    """The teacher path the runs' configs record, where it is known before the teacher is trained or fetched."""
    if not ws.preset.teacher:
        return ws.teacher_dir / "phase-0"
    return Path(ws.preset.teacher) if Path(ws.preset.teacher).is_dir() else None


def check_result(path: Path):
    """A done.json whose numbers the reports can print (rundir.final_eval), or a divergence they show as one."""
    record = rundir.final_eval(path.parent).get("diverged")
    if record is not None and not (isinstance(record, dict) and isinstance(record.get("step"), int)
                                   and isinstance(record.get("why"), str)):
        raise errors.TrainingError(f"{path}: diverged is {record!r}, not the kit's record (step, why); the file is "
                                   "damaged: move it away and rerun")


def ensure_runs(ws: Workspace, runs, seeds: list[int], force: bool = False, teacher: Path | None = None):
    """Data, teacher (unless given), then every run each seed needs (--force: a folder of another config is
    discarded). In lockstep the runs of a seed that read the same batches train together on one teacher pass per
    batch: a group for grow's replayed shard, then one for the long joint controls' fresh documents."""
    jobs = [(run, seed) for seed in seeds for run in with_prefixes(runs)]
    check_before_work(ws, jobs, force, teacher)
    if scratch(ws):
        suite.prepare_data(ws, force)  # growth from scratch: no teacher at all
    else:
        teacher = teacher or suite.ensure_inputs(ws, force)
    if ws.ctx.is_main and any(run_status(ws.run_dir(*job)) != "done" for job in jobs):
        # once, before the work; each run then announces itself
        overview = Table("run", "seed", "status", "folder", title=f"runs at scale {ws.preset.name}")
        for run, seed in jobs:
            overview.add_row(run.name, str(seed), run_status(ws.run_dir(run, seed)), str(ws.run_dir(run, seed)))
        suite.console.print(overview)
    # Done runs too: training reuses one whose config matches and refuses a stale one.
    planned = {seed: [(run_config(ws, run, seed, teacher=teacher), ws.run_dir(run, seed)) for run in with_prefixes(runs)]
               for seed in seeds}
    ws.progress.plan([job for seed in seeds for job in planned[seed]])  # every seed's, before the first trains
    for seed in seeds:
        named = {run_dir: run for run, (_, run_dir) in zip(with_prefixes(runs), planned[seed])}
        for group in grow.lockstep_groups(planned[seed]) if ws.lockstep else [[job] for job in planned[seed]]:
            grow.train_together(group, force=force, ctx=ws.ctx, tracker=ws.tracker, wait=ws.wait, counted=ws.progress)
            for _, run_dir in group:
                if ws.on_finished is not None and ws.ctx.is_main:  # a study records each run as it finishes
                    ws.on_finished(ws, named[run_dir], seed)
