"""The options repro.py's commands share and what their values become: seeds, a checked norm placement, the
experiments named, an experiment's workspace. Nothing here runs a command; repro.py declares them."""

import functools
import math
from dataclasses import replace
from pathlib import Path

import click

import model
import rundir
from experiments import presets, registry, studies, suite, tables
from plumbing import devices, errors
from tools import plan

scale_option = click.option("--scale", type=click.Choice(list(presets.PRESETS)), default="toy", show_default=True,
                            help="smoke: CI minutes; toy: laptop CPU, offline; small: one GPU; full: the paper.")
runs_option = click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True,
                           help="Where data, teachers and runs are stored (runs/<scale>/...).")
results_option = click.option("--results-dir", type=click.Path(path_type=Path), default=Path("results"),
                              show_default=True, help="Where tables and figures go (results/<scale>/...).")
set_option = click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
                          help="Change one preset field for this command, e.g. --set run.lr=3e-4 --set "
                               "data.max_len=256 (sections: run, teacher_run, teacher_model, data, diag). Runs "
                               "with overrides get their own folders.")
lockstep_option = click.option("--lockstep/--no-lockstep", default=None, help="Train the runs of a seed that read "
                               "the same batches together, on one teacher pass per batch (same results as apart). "
                               "Default: on, except on a GPU where they would not fit (see --dry-run).")
records_option = click.option("--records-dir", type=click.Path(path_type=Path), default=None, help="Each finished "
                              "run's record, read back before training (default: the kit's "
                              "references/records/; at smoke scale none; experiments/studies.py).")
force_option = click.option("--force", is_flag=True, help="Discard data, a teacher or runs made with other settings "
                            "(an edited preset) and redo them; what matches is reused.")


def seeds_option(help: str):
    return click.option("--seeds", default=None, callback=lambda c, p, v: None if v is None else parse_seeds(c, p, v),
                        help=help)


def overrides_option(f):
    """--set (repeatable), --compile/--no-compile, --device, --log and --no-wait, for every command that trains."""
    f = click.option("--no-wait", "no_wait", is_flag=True,
                     help="Stop (one line) instead of waiting when another process holds a run folder, the data or "
                          "the teacher this command needs.")(f)
    f = click.option("--log", "tracker", type=click.Choice(rundir.TRACKERS[1:]), default=None,
                     callback=lambda ctx, param, value: value or "",
                     help="Also log every step and evaluation to TensorBoard (runs/.../tensorboard/) or W&B.")(f)
    f = click.option("--device", type=click.Choice(devices.DEVICES), default="auto", show_default=True,
                     help="auto: a CUDA GPU, else Apple silicon (MPS, untested here), else the CPU.")(f)
    f = click.option("--compile/--no-compile", "compile_flag", default=None,
                     help="Compile each decoder layer with torch.compile (default: the preset's setting).")(f)
    return set_option(f)


def dry_run_options(command):
    """--dry-run and the GPUs its estimate is for (refused without --dry-run: a run uses torchrun's GPUs)."""
    @functools.wraps(command)
    def f(*args, **kwargs):
        ctx = click.get_current_context()
        given = [name for name in ("gpu", "gpus", "nodes")
                 if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
        if given and not kwargs["dry_run"]:
            raise click.UsageError(f"--{given[0]} sets what --dry-run's estimate is for and does nothing else; add "
                                   "--dry-run (a run uses the GPUs torchrun launches it on)")
        return command(*args, **kwargs)
    f = click.option("--nodes", type=click.IntRange(1, 1024), default=1, show_default=True,
                     help="Nodes for --dry-run's estimate.")(f)
    f = click.option("--gpus", type=click.IntRange(1, 1024), default=None,
                     help="GPUs per node for --dry-run's estimate (default: 8 at full scale, 1 at the others).")(f)
    f = click.option("--gpu", type=click.Choice(list(plan.GPU_BF16_PEAK)), default="h100", show_default=True,
                     help="GPU type for --dry-run's hour estimate.")(f)
    return click.option("--dry-run", is_flag=True, help="Print what would be trained and its cost (this CPU, "
                        "and GPU hours), and stop: nothing is made or read but the data's measured lengths.")(f)


def experiment_options(command):
    """The options of every command that runs an experiment over seeds (run, beyond.py's, ideas)."""
    for option in (results_option, runs_option, force_option, lockstep_option, overrides_option, dry_run_options):
        command = option(command)
    return command


def seeded_workspace(scale, seeds, default_seeds, records_dir, dry_run, lockstep,
                     **options) -> tuple[suite.Workspace, list[int]]:
    """The workspace of an experiment over seeds (preset_workspace's), --lockstep resolved, its records attached."""
    ws, seeds = preset_workspace(scale, seeds=seeds, default_seeds=default_seeds, option="--seeds", dry_run=dry_run,
                                 **options)
    if lockstep is None:
        lockstep = dry_run or plan.lockstep_default(ws, tables.RUNS)
    return studies.attach(replace(ws, lockstep=lockstep), records_dir, dry_run), seeds


def parse_seeds(ctx, param, value: str) -> list[int]:
    try:
        seeds = [int(s) for s in value.split(",") if s.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers, e.g. 42,43,44") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise click.BadParameter(f"{value!r}: give one or more distinct seeds, e.g. 42,43,44")
    if any(not 0 <= s < 2**63 for s in seeds):
        raise click.BadParameter(f"{value!r}: seeds must be in 0 .. 2^63 - 1 (torch's generator range)")
    return seeds


def chosen_seeds(overrides, seeds: list[int] | None, default: list[int], option: str) -> list[int]:
    """--seed(s), else --set run.seed, else the command's default; the two that disagree are refused."""
    value = overrides.get("run", {}).get("seed")
    if value is None:
        return seeds or default
    if seeds and seeds != [value]:
        raise errors.OptionError(option, f"{','.join(map(str, seeds))} conflicts with --set run.seed={value}; give "
                                 "the seed once")
    return [value]


def finite(value: float, option: str) -> float:
    """FloatRange lets nan (it compares false with every bound) and inf through."""
    if not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number", param_hint=option)
    return value


def check_norm(norm: str, blocks: int | None = None) -> str:
    """--norm: a placement, one per block separated by commas (as many as `blocks`), or auto."""
    if norm.strip() == "auto":
        return "auto"
    names = [n.strip() for n in norm.split(",")]
    if unknown := [n for n in names if n not in model.PLACEMENTS]:
        raise click.BadParameter(f"{unknown[0]!r} is not a placement; choose from {', '.join(model.PLACEMENTS)}, or "
                                 "one per block separated by commas (pre,post,post), or auto", param_hint="--norm")
    try:
        model.block_norms(norm, blocks or len(names))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--norm") from None
    return ",".join(names)


def chosen_experiments(wanted) -> tuple[list[str], list[suite.RunName]]:
    """The experiments named (none or `all`: every paper table, and the studies named beside it), and the runs the
    paper's tables among them read, in the kit's order (a study plans and trains its own)."""
    known = registry.EXPERIMENTS
    if unknown := [e for e in wanted if e != "all" and e not in known]:
        raise click.BadParameter(f"unknown experiment {unknown[0]!r}; choose from {', '.join(known)} or all",
                                 param_hint="EXPERIMENT")
    named = list(dict.fromkeys(e for e in wanted if e != "all"))
    names = registry.PAPER_TABLES + [e for e in named if e not in registry.PAPER_TABLES] \
        if not wanted or "all" in wanted else named
    return names, [r for r in tables.RUNS if any(r in known[e].table.runs for e in names if known[e].table)]


def preset_workspace(scale: str, overrides, seeds: list[int] | None = None, default_seeds: list[int] | None = None,
                     option: str = "--seed", no_wait: bool = False,
                     **workspace_options) -> tuple[suite.Workspace, list[int]]:
    """A command's workspace with its --set parsed once, and its seeds (chosen_seeds)."""
    overrides = presets.parse_overrides(presets.PRESETS[scale], overrides)
    seeds = chosen_seeds(overrides, seeds, default_seeds or [presets.PRESETS[scale].run["seed"]], option)
    return suite.workspace(scale, overrides=overrides, wait=not no_wait, **workspace_options), seeds
