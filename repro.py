"""normgrow: reproduce "Rethinking Normalization Placement for LLMs: Post-Norm under Curriculum Depth
Growing" at the scale you choose, with the paper's numbers printed beside the kit's.

    python repro.py --scale toy                             # the whole paper on a laptop CPU, offline
    python repro.py table1 fig3 --scale smoke               # some experiments, CI scale
    python repro.py table1 --scale toy --seeds 42,43,44     # error bars on the interaction
    python repro.py all --scale full --dry-run --gpu h100   # the plan: runs, tokens, FLOPs, GPU hours
    torchrun --nproc_per_node=8 repro.py table1 --scale full                 # one 8-GPU node
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=$HEAD:29500 \\
        repro.py all --scale full                                            # several nodes
    python repro.py regime --scale toy                      # where the post-norm advantage appears
    python repro.py train --scale toy --norm post --protocol grow            # one run
    python repro.py eval runs/toy/s42/post-grow/phase-2 --scale toy --json
    python repro.py export runs/toy/s42/pre-grow/phase-2 out/pre-grow-hf
    python repro.py data --scale toy
    python repro.py bench

Everything a scale makes lives in runs/<scale>/ (data, the kit's own teacher, s<seed>/<run>/) and
results/<scale>/ (<experiment>.md, .json and figures). Finished runs are reused, interrupted ones
resumed; runs whose first phases are identical share them.
"""
from __future__ import annotations

import functools
import json
import math
import os
import signal
import time
import warnings
from dataclasses import replace
from pathlib import Path

import click
import torch.distributed as dist
from rich.table import Table

import data
import grow
import model
import rundir
from experiments import presets, suite, tables
from plumbing import checkpoint, devices, errors, tokenizer
from tools import plan

# ----------------------------------------------------------------------------------------------
# The CLI



class Repro(click.Group):
    """Experiments are the default command: `repro.py table1 --scale toy` means `repro.py run table1 ...`."""

    def parse_args(self, ctx, args):
        if not args:  # a bare `repro.py` is a question, not a 15-30 minute run
            click.echo(BARE_USAGE)
            ctx.exit(0)
        if args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as e:  # one line, not click's usage block (nor its multi-line lists of choices)
            raise OneLineError(" ".join(e.format_message().split()), exit_code=2) from None
        except errors.KitError as e:  # anything else is a bug in the kit: a traceback
            if int(os.environ.get("RANK", 0)):  # under torchrun every rank stops; rank 0 says why
                raise SystemExit(e.exit_code) from None
            raise OneLineError(str(e), e.exit_code) from None
        except OSError as e:  # a path the user gave or made that is not what it must be: a folder where a file goes
            if e.filename is None:  # (or a file where a folder goes), a link loop, a broken link, a name too long
                raise
            raise OneLineError(suite.path_problem(e)) from None
        except RuntimeError as e:  # Python 3.11's Path.resolve says ELOOP so (3.13 raises OSError)
            if not str(e).startswith("Symlink loop from "):
                raise
            path = str(e).removeprefix("Symlink loop from ").strip("'")
            raise OneLineError(f"{path}: a symbolic link that leads back to itself; remove it, or point it at a "
                               "folder") from None
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (a scheduler's stop): every run resumes where it stopped
            if ctx.invoked_subcommand not in TRAINS:
                raise OneLineError(f"interrupted: {ctx.invoked_subcommand or 'repro.py'} stopped before it finished",
                                   130) from None
            raise OneLineError("interrupted; rerun the same command to resume: each run continues from its newest "
                               "checkpoint (latest/ or the last phase-N/), finished runs are reused", 130) from None
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


BARE_USAGE = """Usage: repro.py [EXPERIMENT ...] --scale SCALE [OPTIONS]   or   repro.py COMMAND [OPTIONS]

    python repro.py --scale toy --dry-run     # what the whole paper at toy scale costs on this machine
    python repro.py --scale toy               # run it: every table and figure, results in results/toy/

`python repro.py --help` lists the commands; `python repro.py COMMAND --help` a command's options."""
# The commands whose work an interrupted run resumes (the others write nothing a rerun needs).
TRAINS = ("run", "train", "regime", "search", "intervention", "planted", "placements", "scratch", "teacher",
          "prepare", "data")


class OneLineError(click.ClickException):
    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


scale_option = click.option("--scale", type=click.Choice(list(presets.PRESETS)), default="toy", show_default=True,
                            help="smoke: CI minutes; toy: laptop CPU, offline; small: one GPU; full: the paper.")
runs_option = click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True,
                           help="Where data, teachers and runs are stored (runs/<scale>/...).")
results_option = click.option("--results-dir", type=click.Path(path_type=Path), default=Path("results"),
                              show_default=True, help="Where tables and figures go (results/<scale>/...).")

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


set_option = click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
                          help="Change one preset field for this command, e.g. --set run.lr=3e-4 --set "
                               "data.max_len=256 (sections: run, teacher_run, teacher_model, data, diag). Runs "
                               "with overrides get their own folders.")


def dry_run_options(command):
    """--dry-run and the GPUs its estimate is for: every command that trains has them. --gpu, --gpus and
    --nodes without --dry-run are refused: a run uses the GPUs torchrun gives it, and they would do nothing."""
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


def print_dry_run(scale: str, groups, seeds: list[int], gpu: str, gpus: int | None, nodes: int, note: str = ""):
    """The plan of a command's runs (groups: (label, workspace, plan.PlannedRun list)); one workspace in
    full (plan.print_plan), several as a row each; then the estimate for this machine's CPU."""
    gpus = gpus or (8 if scale == "full" else 1)
    if len(groups) == 1:
        _, ws, runs = groups[0]
        totals = plan.print_plan(ws, runs, seeds, gpu, gpus, suite.console, nodes)
        flops = totals["lockstep"]["flops"] + totals["diagnostics_flops"]
    else:
        flops = plan.print_groups(groups, seeds, gpu, gpus, nodes, suite.console, note)
    ws = groups[0][1]
    estimate = plan.cpu_estimate(flops, ws.preset.run["precision"], ws.results.parent / "bench.json")
    suite.console.print(f"this machine: {estimate}" + (" (CUDA needed to run it)" if ws.preset.needs_cuda else ""))


def planned(ws: suite.Workspace, names, seed: int) -> tuple[str, suite.Workspace, list]:
    return ", ".join(names), ws, plan.planned_runs(ws, names, seed)


lockstep_option = click.option(
    "--lockstep/--no-lockstep", default=None,
    help="Train the runs of a seed that read the same batches together, on one teacher pass per batch "
         "(same results as apart). Default: on, except on a GPU where they would not fit (see --dry-run).")
force_option = click.option("--force", is_flag=True, help="Discard data, a teacher or runs made with other settings "
                            "(an edited preset) and redo them; what matches is reused.")


def workspace(scale, runs_dir, results_dir=None, dry_run=False, overrides=(), compile_flag=None, device="auto",
              tracker="", lockstep: bool | None = None, wait: bool = True) -> suite.Workspace:
    """suite.workspace, with --lockstep/--no-lockstep resolved: unless given, lockstep where a seed's
    resident runs fit the GPU (plan.lockstep_default; always on a CPU)."""
    ws = suite.workspace(scale, runs_dir, results_dir, dry_run, overrides, compile_flag, device, tracker, wait=wait)
    if lockstep is None:
        lockstep = dry_run or plan.lockstep_default(ws, tables.RUNS)
    return replace(ws, lockstep=lockstep)


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


def chosen_seeds(set_seed: int, overrides, seeds: list[int] | None, default: list[int], option: str) -> list[int]:
    """--seed(s), else --set run.seed (set_seed: the preset's seed with the overrides applied), else the
    command's default; --seed(s) and --set run.seed that disagree are refused (which one should train?)."""
    if not any(item.partition("=")[0].strip() == "run.seed" for item in overrides):
        return seeds or default
    value = set_seed
    if seeds and seeds != [value]:
        raise errors.OptionError(option, f"{','.join(map(str, seeds))} conflicts with --set run.seed={value}; give "
                                 "the seed once")
    return [value]


def finite(value: float, option: str) -> float:
    """FloatRange lets nan (it compares false with every bound) and inf through."""
    if not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number", param_hint=option)
    return value


@click.group(cls=Repro, context_settings={"help_option_names": ["-h", "--help"]})
def cli():
    """Reproduce the paper's tables and figures: `repro.py [EXPERIMENT ...] --scale SCALE`.

    \b
    Experiments: table1 table2 table3 table4 tableA2 tableA3 tableA4 fig3 fig4 fig5 figA1 figA2, or all
    (the default). See `repro.py run --help` for the options.
    """


def experiment_names(wanted) -> list[str]:
    """The experiments named (none or `all`: every one); an unknown name is one line."""
    known = tables.EXPERIMENTS
    unknown = [e for e in wanted if e != "all" and e not in known]
    if unknown:
        raise click.BadParameter(f"unknown experiment {unknown[0]!r}; choose from {', '.join(known)} or all",
                                 param_hint="EXPERIMENT")
    return list(known) if not wanted or "all" in wanted else list(dict.fromkeys(wanted))


def experiment_runs(names: list[str]) -> list[str]:
    """The runs those experiments read, in the kit's order."""
    return [r for r in tables.RUNS if any(r in tables.EXPERIMENTS[e].runs for e in names)]


@cli.command("run")
@click.argument("wanted", metavar="EXPERIMENTS", nargs=-1)
@scale_option
@click.option("--seeds", default=None, callback=lambda c, p, v: None if v is None else parse_seeds(c, p, v),
              help="Comma-separated seeds, e.g. 42,43,44: every needed run per seed, mean ± std and a 95% "
                   "interval per number. Default: the paper's seed (42).")
@dry_run_options
@overrides_option
@lockstep_option
@force_option
@runs_option
@results_option
def run_experiments(wanted, scale, seeds, dry_run, gpu, gpus, nodes, overrides, compile_flag, device, tracker, no_wait,
                    lockstep, force, runs_dir, results_dir):
    """Run EXPERIMENTS (default: all) at a scale and write results/<scale>/<experiment>.md/.json/.png."""
    names = experiment_names(wanted)
    runs = experiment_runs(names)
    ws = workspace(scale, runs_dir, results_dir, dry_run, overrides, compile_flag, device, tracker, lockstep,
                   not no_wait)
    seeds = chosen_seeds(ws.preset.run["seed"], overrides, seeds, [ws.preset.run["seed"]], "--seeds")
    if dry_run:
        print_dry_run(scale, [("", ws, plan.planned_runs(ws, runs, seeds[0]))], seeds, gpu, gpus, nodes)
        return
    ws.results.mkdir(parents=True, exist_ok=True)
    started = time.time()
    suite.ensure_runs(ws, runs, seeds, force)

    def write_reports():  # rank 0's alone; the other ranks wait for it, then all leave together
        for name in names:
            tables.report_experiment(ws, name, seeds)
            rundir.kill_point("reported", name)
        if not ws.preset.teacher:
            suite.console.print(suite.teacher_summary(ws, runs, seeds))
        suite.console.print(f"done in {time.time() - started:,.0f} s; results in {ws.results}")
    ws.ctx.on_main(write_reports, "the reports and their diagnostics")


@cli.command()
@scale_option
@click.option("--seeds", default=None, callback=lambda c, p, v: None if v is None else parse_seeds(c, p, v),
              help="Comma-separated seeds. Default: 42,43 at toy scale, 42 elsewhere.")
@click.option("--grid", "grid_text", default=None, metavar="SPEC",
              help='Points to run, e.g. "budget=0.25,0.5,1,2;lr=0.5,1,2;gain=ones,teacher" (multipliers of the '
                   "preset's steps per phase and LR; post-norm output-gain init). Default: the scale's grid.")
@dry_run_options
@overrides_option
@lockstep_option
@force_option
@runs_option
@results_option
def regime(scale, seeds, grid_text, dry_run, gpu, gpus, nodes, overrides, compile_flag, device, tracker, no_wait,
           lockstep, force, runs_dir, results_dir):
    """The regime map: delta joint, delta grow and the interaction over a grid of step budgets, peak
    LRs and post-norm output-gain inits (results/<scale>/regime.md/.json/.png). Not part of `all`."""
    from experiments import regime as regime_map
    grid = regime_map.parse_grid(grid_text) if grid_text else regime_map.GRIDS[scale]
    ws = workspace(scale, runs_dir, results_dir, dry_run, overrides=overrides, compile_flag=compile_flag, device=device,
                   tracker=tracker, lockstep=lockstep, wait=not no_wait)
    seeds = chosen_seeds(ws.preset.run["seed"], overrides, seeds, presets.DEFAULT_SEEDS["regime"][scale], "--seeds")
    if dry_run:  # each point's runs (regime.run_map: a point's pre-norm runs may be the preset's own)
        groups = [(point.name, *planned(regime_map.point_workspace(ws, point), tables.MAIN_RUNS, seeds[0])[1:])
                  for point in regime_map.grid_points(grid)]
        print_dry_run(scale, groups, seeds, gpu, gpus, nodes, "; every point's four runs, an upper bound: a point "
                      "whose pre-norm runs are the preset's trains them once")
        return
    ws.results.mkdir(parents=True, exist_ok=True)
    regime_map.run_map(ws, grid, seeds, force)
    ws.ctx.barrier()


@cli.command()
@scale_option
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=None, help="The pilot seed (default: the preset's, 42).")
@click.option("--ladder", type=click.Choice(list(presets.LADDERS)), default=None,
              help="The ladder to climb (default: the scale's own; `second`: the second search at toy scale).")
@dry_run_options
@overrides_option
@force_option
@runs_option
@results_option
def search(scale, seed, ladder, dry_run, gpu, gpus, nodes, overrides, compile_flag, device, tracker, no_wait, force,
           runs_dir, results_dir):
    """The miniature search: a ladder of presets (presets.LADDERS), pre-norm grow only, until the mechanism's
    criterion holds or a rung would cost more than the ladder's budget (results/<scale>/search[-<ladder>].md/.json)."""
    from experiments import regime as regime_map
    ladder = ladder or scale
    if ladder not in presets.LADDERS:
        raise click.UsageError(f"--scale {scale} has no ladder; the search runs at {', '.join(presets.LADDERS)}")
    if presets.LADDER_SCALES.get(ladder, ladder) != scale:
        raise click.UsageError(f"--ladder {ladder} runs at --scale {presets.LADDER_SCALES.get(ladder, ladder)}, not {scale}")
    ws = suite.workspace(scale, runs_dir, results_dir, dry_run, compile_flag=compile_flag, device=device,
                         tracker=tracker, wait=not no_wait)
    seed = chosen_seeds(presets.apply_overrides(ws.preset, overrides)[0].run["seed"], overrides,
                        None if seed is None else [seed], [ws.preset.run["seed"]], "--seed")[0]
    if dry_run:  # every rung: the search stops at the first that meets the criterion, so at most this
        rungs = presets.LADDERS[ladder]
        spaces = [suite.workspace(scale, runs_dir, results_dir, True, (*regime_map.rung_overrides(rungs, i), *overrides))
                  for i in range(len(rungs))]  # regime.rung_workspace's, made for a dry run: no folder
        print_dry_run(scale, [(rung.name, *planned(rws, [regime_map.SEARCH_RUN], seed)[1:])
                              for rung, rws in zip(rungs, spaces)], [seed], gpu, gpus, nodes,
                      "; every rung, although the search stops at the first that meets its criterion")
        return
    regime_map.run_search(ws, seed, force, overrides, ladder)
    ws.ctx.barrier()


@cli.command()
@scale_option
@click.argument("checkpoints", nargs=-1, type=click.Path(path_type=Path))
@runs_option
@results_option
def scan(scale, checkpoints, runs_dir, results_dir):
    """The layer-by-layer scan: massive activations (max |activation| / median, with channel and token) and sink
    heads at every layer's output of the scale's teacher and of each student CHECKPOINT given (a run's
    phase-<p>/ or step-<n>/ folder), on the fixed diagnostic batch (results/<scale>/scan.md, .json, .png)."""
    ws = suite.workspace(scale, runs_dir, results_dir)
    for path in checkpoints:
        tables.scan_checkpoint_blocks(path)  # a wrong path is one line before data or teacher is made
    tables.run_scan(ws, suite.ensure_inputs(ws), list(checkpoints))


def beyond_command(name: str, doc: str, module: str = "beyond"):
    """A `repro.py <name>` command for an experiment of beyond.py or ideas.py (not part of `all`)."""
    @cli.command(name, help=doc)
    @scale_option
    @click.option("--seeds", default=None, callback=lambda c, p, v: None if v is None else parse_seeds(c, p, v),
                  help="Comma-separated seeds. Default: 42,43,44 at toy scale, 42 elsewhere.")
    @dry_run_options
    @overrides_option
    @lockstep_option
    @force_option
    @runs_option
    @results_option
    def command(scale, seeds, dry_run, gpu, gpus, nodes, overrides, compile_flag, device, tracker, no_wait, lockstep,
                force, runs_dir, results_dir):
        from experiments import beyond, ideas
        experiment = {"beyond": beyond, "ideas": ideas}[module]
        ws = workspace(scale, runs_dir, results_dir, dry_run, overrides=overrides, compile_flag=compile_flag,
                       device=device, tracker=tracker, lockstep=lockstep, wait=not no_wait)
        seeds = chosen_seeds(ws.preset.run["seed"], overrides, seeds, presets.DEFAULT_SEEDS["beyond"][scale], "--seeds")
        if dry_run:
            print_dry_run(scale, beyond_groups(beyond, name, ws, seeds[0]), seeds, gpu, gpus, nodes)
            return
        getattr(experiment, f"run_{name}")(ws, seeds, force)
        ws.ctx.barrier()
    return command


def beyond_groups(beyond, name: str, ws: suite.Workspace, seed: int) -> list:
    """The runs a beyond.py experiment trains, as print_dry_run's groups: its suite runs, then each
    variant's one run in its own folder (a freeze variant starts from the suite's grow phase 0)."""
    if name == "placements":
        return [planned(ws, beyond.placement_names(), seed)]
    if name == "scratch":
        return [planned(beyond.scratch_workspace(ws), tables.MAIN_RUNS, seed)]
    if name == "ideas":  # idea 4's search on its own seed, then every option's runs and their baselines
        from experiments import ideas
        search = planned(ws, [f"{s}-grow" for s in ideas.schedules(ws.preset.run["blocks"])], ideas.SEARCH_SEED)
        contrasts = ideas.fixed_contrasts()
        variants = list({v.label: v for c in contrasts for v in (c.variant, c.baseline)}.values())
        return [search] + variant_groups(beyond, ws, variants, seed)
    variants = beyond.interventions(ws.preset.run["blocks"]) if name == "intervention" else beyond.planted_variants()
    return variant_groups(beyond, ws, variants, seed)


def variant_groups(beyond, ws: suite.Workspace, variants, seed: int) -> list:
    """print_dry_run's groups of beyond.Variant runs: the suite's own, then each variant's in its folder."""
    groups = [planned(ws, sorted({v.run for v in variants if not v.folder}), seed)]
    for v in variants:
        if v.folder:
            vws = beyond.variant_workspace(ws, v, seed)
            shared = 1 if v.run.endswith("-freeze") else 0
            groups.append((v.label, vws, [plan.PlannedRun(v.run, suite.run_config(vws, v.run, seed), shared)]))
    return groups


beyond_command("intervention", "Boundary interventions on grow runs (the paper's Appendix B.1 asks for one that "
               "changes the forward alone): a boundary norm, rescales with one forward and different backwards, the "
               "mirror, the rescale under freeze, the transplant factorial and a synthetic dose, each trained; "
               "validation CE against pre-grow and post-grow (results/<scale>/intervention.md/.json/.png).")
beyond_command("planted", "Placement (pre, post) x a planted boundary outlier (none, the boundary token at 37x, "
               "one channel at 1000x) under growth; the dose x placement interaction, read by the rule pre-registered "
               "in docs/preregistrations.md (results/<scale>/planted.md/.json).")
beyond_command("placements", "Joint and grow for every placement (pre, post, sandwich, peri, hybrid, deepnorm) "
               "and the schedule pre,post,post, with Δ against pre-norm (results/<scale>/placements.md/.json/.png).")
beyond_command("ideas", "The paper's seven proposed improvements, each an option (transition_schedule, append_init, "
               "importance_remedy, the placement search, boundary_correction, structural_norm, --norm auto), against "
               "the run it changes; one primary contrast each, Holm over the seven, as pre-registered in "
               "docs/preregistrations.md (results/<scale>/ideas.md/.json).", module="ideas")
beyond_command("scratch", "Table 1's 2 x 2 without a teacher: plain CE, embedding and head trained from the "
               "seed (results/<scale>/scratch.md/.json).")


@cli.command()
@scale_option
def ratios(scale):
    """The scale's dimensionless ratios beside the paper's, as a Markdown table (README, "The toy preset")."""
    click.echo("\n".join(presets.ratios_markdown(presets.PRESETS[scale])))


@cli.command()
@scale_option
@click.option("--rebuild", is_flag=True, help="Train the shipped teacher again from its seed, into "
              "runs/<scale>/teacher-rebuilt/ (the installed one untouched), and say whether it equals it bit for bit.")
@overrides_option
@force_option
@runs_option
def teacher(scale, rebuild, overrides, compile_flag, device, tracker, no_wait, force, runs_dir):
    """Pretrain the kit's own teacher for a scale (smoke, toy) and print its validation CE (toy: the
    shipped one is installed; --rebuild trains it again)."""
    ws = suite.workspace(scale, runs_dir, overrides=overrides, compile_flag=compile_flag, device=device, tracker=tracker,
                         wait=not no_wait)
    if ws.preset.teacher:
        raise click.UsageError(f"--scale {scale} distils from {ws.preset.teacher}; there is no teacher to pretrain")
    if rebuild and not ws.preset.shipped_teacher:
        raise errors.OptionError("--rebuild", f"--scale {scale} ships no teacher; `repro.py teacher` trains its own")
    suite.prepare_data(ws, force)
    if rebuild:
        suite.console.print(suite.rebuild_teacher(ws, force))
        return
    path = suite.ensure_teacher(ws, force)
    result = rundir.read_json(ws.run_dir("teacher", 0) / "done.json", "ce", "ppl")
    suite.console.print(f"teacher: validation CE {result['ce']:.4f} (PPL {result['ppl']:.1f}); HF checkpoint in {path}")


@cli.command()
@scale_option
@click.option("--norm", required=True, callback=lambda c, p, v: check_norm(v),
              help=f"Norm placement ({', '.join(model.PLACEMENTS)}), or one per block: pre,post,post; or auto (pre-norm, "
                   "each appended block post-norm where the boundary it reads drifts: transitions.py).")
@click.option("--protocol", type=click.Choice(["joint", "grow", "freeze", "joint-long", "joint-longer", "joint-replay"]),
              required=True, help="joint, grow, freeze, or the joint controls (Table 3; joint-replay: grow's steps on "
              "grow's shard).")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=None, help="Default: the preset's (42).")
@dry_run_options
@overrides_option
@force_option
@runs_option
def train(scale, norm, protocol, seed, dry_run, gpu, gpus, nodes, overrides, compile_flag, device, tracker, no_wait,
          force, runs_dir):
    """Train one named run (and any run whose phases it shares), e.g. --norm post --protocol grow."""
    ws = suite.workspace(scale, runs_dir, dry_run=dry_run, overrides=overrides, compile_flag=compile_flag,
                         device=device, tracker=tracker, wait=not no_wait)
    seed = chosen_seeds(ws.preset.run["seed"], overrides, None if seed is None else [seed], [ws.preset.run["seed"]],
                        "--seed")[0]
    try:  # a schedule names one placement per block, and --set run.blocks may change the count
        if norm != "auto":
            model.block_norms(norm, ws.preset.run["blocks"])
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--norm") from None
    name = f"{norm}-{protocol}"
    if dry_run:
        print_dry_run(scale, [planned(ws, [name], seed)], [seed], gpu, gpus, nodes)
        return
    suite.check_before_work(ws, [(job, seed) for job in suite.with_prefixes([name])], force)
    path = suite.ensure_inputs(ws, force)
    for job in suite.with_prefixes([name]):
        result = grow.train(suite.run_config(ws, job, seed, teacher=path), ws.run_dir(job, seed), force=force, ctx=ws.ctx,
                            tracker=ws.tracker, wait=ws.wait)
    suite.console.print(f"{name}: validation CE {result['ce']:.4f}, KD {result['kd']:.4f}, PPL {result['ppl']:.2f}; "
                  f"run folder {ws.run_dir(name, seed)}")


def check_norm(norm: str) -> str:
    if norm.strip() == "auto":
        return "auto"
    names = [n.strip() for n in norm.split(",")]
    unknown = [n for n in names if n not in model.PLACEMENTS]
    if unknown:
        raise click.BadParameter(f"{unknown[0]!r} is not a placement; choose from {', '.join(model.PLACEMENTS)}, or "
                                 "one per block separated by commas (pre,post,post), or auto", param_hint="--norm")
    return ",".join(names)


def checkpoint_config(checkpoint: Path) -> dict:
    """A checkpoint's config.json with its model fields checked (model.config_problem), before its
    vocabulary is used to pick a scale."""
    config = model.read_config(checkpoint)
    model.ModelConfig.from_hf(config, str(checkpoint / "config.json"))
    return config


def scales_for(vocab: int) -> list[str]:
    """The scales whose tokenizer a checkpoint's vocabulary fits (smoke and toy truncate Qwen3's; small
    and full share it, padded as Qwen3's checkpoints pad it)."""
    return [s for s, p in presets.PRESETS.items()
            if vocabulary_fits(vocab, tokenizer.qwen3_tokenizer(p.data["vocab_size"]).eot)]


def scale_of(config: dict, runs_dir: Path, checkpoint: Path) -> str:
    """The scale whose vocabulary a checkpoint has (small and full share it: then the one whose data
    exists under runs_dir is taken)."""
    matches = scales_for(config["vocab_size"])
    if not matches:
        raise click.UsageError(f"{checkpoint / 'config.json'}: vocab_size {config['vocab_size']} fits no scale's "
                               "tokenizer; the checkpoint is not the kit's, or its config.json was edited")
    return next((s for s in matches if (runs_dir / s / "data" / "val").is_dir()), matches[0])


def vocabulary_fits(vocab: int, eot: int) -> bool:
    """A truncated vocabulary (smoke, toy) must end at the tokenizer's <|endoftext|>; Qwen3's own must hold it."""
    return not ((vocab < QWEN3_EOT and vocab != eot + 1) or vocab <= eot)


def check_vocabulary(val: data.Shard, vocab: int, checkpoint: Path):
    """A checkpoint and a shard from different tokenizers."""
    if not vocabulary_fits(vocab, val.eot):
        raise errors.DataError(f"{checkpoint}: its vocabulary ({vocab} ids) is not the one {val.path} was tokenized "
                             f"with (<|endoftext|> = {val.eot}); pass the matching --scale or --data")


QWEN3_EOT = 151643  # <|endoftext|> in Qwen3's full vocabulary


@cli.command("eval")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--scale", type=click.Choice(list(presets.PRESETS)), default=None,
              help="Whose validation shard and evaluation settings (default: read from the checkpoint's vocabulary).")
@click.option("--data", "data_dir", type=click.Path(path_type=Path), default=None,
              help="A validation shard folder (default: the scale's, runs/<scale>/data/val).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@runs_option
def evaluate(checkpoint, scale, data_dir, as_json, runs_dir):
    """CE and PPL of any teacher (HF Qwen3) or student checkpoint on a validation shard."""
    config = checkpoint_config(checkpoint)
    fitting = scales_for(config["vocab_size"])
    if scale and not data_dir and scale not in fitting:  # said before its shard is looked for (it may not exist)
        raise errors.DataError(f"{checkpoint}: its vocabulary ({config['vocab_size']} ids) is not --scale {scale}'s; "
                             + (f"pass --scale {fitting[0]}" if fitting else "pass --data with the shard it was made for"))
    scale = scale or scale_of(config, runs_dir, checkpoint)
    ws = suite.Workspace(presets.PRESETS[scale], runs_dir / scale, Path("results"), devices.Dist())
    val = data.Shard(data_dir or ws.data_dir / "val")
    check_vocabulary(val, config.get("vocab_size", 0), checkpoint)
    net = model.Student.load(checkpoint) if "normgrow_student" in config else model.load_qwen3(checkpoint)
    # The scale's evaluation settings (batch, chunk, precision), as its runs use them; no teacher: CE only.
    settings = suite.run_config(ws, "post-joint", ws.preset.run["seed"])
    dtype, _ = devices.precision_choice(settings.precision, ws.ctx.device)
    scores = grow.evaluate(settings, net, None, val, active_blocks=None, ctx=ws.ctx, dtype=dtype)
    ce, tokens = scores["ce"], scores["val_tokens"]
    result = {"checkpoint": str(checkpoint), "data": str(val.path), "ce": ce, "ppl": scores["ppl"], "tokens": tokens}
    if as_json:
        click.echo(json.dumps(result))
    else:
        suite.console.print(f"{checkpoint}: CE {ce:.4f} nats/token, PPL {scores['ppl']:.2f} over {tokens:,} tokens of "
                            f"{val.path}")


@cli.command("reference")
@scale_option
@click.option("--seeds", required=True, callback=parse_seeds, help="The seeds whose runs and tables to ship.")
@click.option("--force", is_flag=True, help="Replace the shipped references/<scale>.json.")
@click.option("--tables", default=None, metavar="NAMES",
              help="Replace only these tables (comma-separated report names, e.g. planted,scratch) of the shipped "
                   "reference, from an experiment rerun in a runs folder of its own; the rest stays as shipped.")
@runs_option
@results_option
def make_reference(scale, seeds, force, tables, runs_dir, results_dir):
    """Write references/<scale>.json from finished runs and reports (what `compare` checks against)."""
    from experiments import reference
    if tables is not None:
        return update_reference_tables(scale, seeds, force, [t for t in tables.split(",") if t.strip()], runs_dir,
                                       results_dir)
    missing = [seed for seed in seeds if not (runs_dir / scale / f"s{seed}").is_dir()]
    if missing:
        raise click.UsageError(f"{runs_dir / scale / f's{missing[0]}'}: no runs of seed {missing[0]}; run them first")
    check_reports(results_dir / scale)
    content = reference.collect(runs_dir / scale, results_dir / scale, seeds)
    if not content["curves"]:
        raise click.UsageError(f"no finished runs of seeds {seeds} under {runs_dir / scale}; run them first")
    reference.REFERENCES.mkdir(exist_ok=True)
    path = reference.REFERENCES / f"{scale}.json"
    if path.exists() and not force:  # shipped with the kit: what every user's `compare` checks against
        raise errors.UsageError(f"{path} exists (seeds {rundir.read_json(path).get('seeds')}): the kit ships it and "
                                "`compare` checks against it; add --force to replace it (git checkout restores it)")
    checkpoint.write_json(path, content, indent=1)
    suite.console.print(f"wrote {path}: {len(content['curves'])} runs, {len(content['tables'])} tables, seeds {seeds}")


def update_reference_tables(scale: str, seeds: list[int], force: bool, names: list[str], runs_dir: Path,
                            results_dir: Path):
    """`reference --tables`: the shipped file's named tables taken anew (reference.with_tables)."""
    from experiments import reference
    path = reference.REFERENCES / f"{scale}.json"
    if not path.is_file():
        raise errors.UsageError(f"{path}: no shipped reference to update; write it whole (without --tables)")
    shipped = rundir.read_json(path)
    if sorted(seeds) != sorted(shipped["seeds"]):
        raise errors.OptionError("--seeds", f"{path} ships seeds {shipped['seeds']}; its tables take the same seeds")
    if not names or not force:
        raise errors.UsageError(f"{path}: the kit ships it and `compare` checks against it; name the tables and add "
                                "--force to replace them (git checkout restores it)")
    check_reports(results_dir / scale)
    content = reference.with_tables(shipped, runs_dir / scale, results_dir / scale, names)
    checkpoint.write_json(path, content, indent=1)
    suite.console.print(f"wrote {path}: tables {', '.join(names)} from {results_dir / scale}, seeds {seeds}")


def check_reports(folder: Path):
    """Every JSON file in a folder (reports, or a run's own files) reads as an object, each one that
    does not named in one line: reference.py reads them with json alone."""
    for file in sorted(folder.glob("*.json")):
        rundir.read_json(file)


@cli.command("compare")
@click.argument("target", type=click.Path(exists=True, file_okay=False, path_type=Path))
@scale_option
def compare_with_reference(target, scale):
    """Is a run (or a scale's runs, or its results) within the band of the kit's shipped seeds? Exits 1 if not."""
    from experiments import reference
    path = reference.REFERENCES / f"{scale}.json"
    if not path.is_file():
        raise click.UsageError(f"no shipped reference for --scale {scale} ({path}); make one with `repro.py reference`")
    shipped = rundir.read_json(path, "curves", "final_ce", "tables", "seeds")
    check_reports(target)
    rows = reference.compare(target, shipped)
    if not rows:
        raise click.UsageError(f"{target}: holds no run or table that {path} has numbers for")
    table = Table(title=f"{target} against {path.name} (seeds {shipped['seeds']})")
    for column in ("number", "value", "band", "within"):
        table.add_column(column)
    outside = [r for r in rows if not r["within"]]
    for r in outside or rows[:20]:
        table.add_row(r["name"], f"{r['value']:.4f}", f"[{r['band'][0]:.4f}, {r['band'][1]:.4f}]",
                      "yes" if r["within"] else "NO")
    suite.console.print(table)
    suite.console.print(f"{len(rows) - len(outside)} of {len(rows)} numbers within the band")
    if outside:
        raise OneLineError(f"{len(outside)} of {len(rows)} numbers of {target} are outside the shipped seeds' band "
                           f"(first: {outside[0]['name']} = {outside[0]['value']:.4f})")


@cli.command("sample")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--prompt", default="", help="Text to continue (encoded as a document: <|endoftext|> first).")
@click.option("--max-new-tokens", type=click.IntRange(1), default=64, show_default=True,
              help="At most the checkpoint's context (max_position_embeddings) less the prompt's tokens.")
@click.option("--temperature", type=click.FloatRange(0), default=0.0, show_default=True,
              help="0: greedy; any finite value above (with --top-k 1: greedy too).",
              callback=lambda c, p, v: finite(v, "--temperature"))
@click.option("--top-k", type=click.IntRange(0), default=0, show_default=True,
              help="0: every token; at most the checkpoint's vocabulary.")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True)
@runs_option
def sample_text(checkpoint, prompt, max_new_tokens, temperature, top_k, seed, runs_dir):
    """Continue a prompt with any teacher, student (pre or post) or exported checkpoint, with a KV cache."""
    from tools import sample
    config = checkpoint_config(checkpoint)
    enc = tokenizer.qwen3_tokenizer(presets.PRESETS[scale_of(config, runs_dir, checkpoint)].data["vocab_size"])
    prompt_ids = [enc.eot] + enc.encode(prompt)
    context = model.ModelConfig.from_hf(config).max_position_embeddings
    if len(prompt_ids) + max_new_tokens > context:  # past the positions the model was made for
        raise errors.OptionError("--max-new-tokens", f"{max_new_tokens:,}: with the prompt's {len(prompt_ids):,} tokens "
                                 f"that passes {checkpoint}'s context of {context:,} positions (max_position_embeddings); "
                                 f"ask for at most {max(context - len(prompt_ids), 0):,}")
    if top_k > config["vocab_size"]:
        raise errors.OptionError("--top-k", f"{top_k:,}: above {checkpoint}'s vocabulary of {config['vocab_size']:,} "
                                 "tokens; 0 means every token")
    net = sample.load_checkpoint(checkpoint)
    shown = [""]

    def stream(tokens, last=False):  # each token's text as it comes; a character split across tokens waits
        text = enc.decode([t for t in tokens if t != enc.eot])
        if last or not text.endswith("\ufffd"):
            click.echo(text[len(shown[0]):], nl=last)
            shown[0] = text
    click.echo(prompt, nl=False)
    try:
        new = sample.generate(net, prompt_ids, max_new_tokens, enc.eot, temperature, top_k, seed, on_token=stream)
    except KeyboardInterrupt:
        click.echo()  # the text so far ends its line; the one error line follows on its own
        raise
    stream(new, last=True)


@cli.command()
@click.argument("student_dir", type=click.Path(path_type=Path))
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Replace OUT_DIR if it holds an earlier export (never anything else).")
@runs_option
def export(student_dir: Path, out_dir: Path, force: bool, runs_dir: Path):
    """Write a pre-norm student checkpoint as a standard HF Qwen3 directory that transformers loads
    (AutoModelForCausalLM, AutoTokenizer with the kit's exact ids, generate with <|endoftext|> as eos)."""
    check_export_target(student_dir, out_dir, force, runs_dir)
    student = model.Student.load(student_dir)
    scale = scale_of(checkpoint_config(student_dir), runs_dir, student_dir)
    enc = tokenizer.qwen3_tokenizer(presets.PRESETS[scale].data["vocab_size"])
    generation = {"bos_token_id": enc.eot, "eos_token_id": enc.eot, "pad_token_id": enc.eot, "do_sample": False}
    try:
        model.export_hf(student, out_dir, source=str(student_dir),
                        extra_files={**tokenizer.hf_tokenizer_files(enc), "generation_config.json": json.dumps(generation)})
    except OSError as e:  # a read-only place, a path through a file: its first mkdir fails
        raise errors.CheckpointError(f"{out_dir}: cannot write the export there ({e.strerror or e}); choose a folder "
                                    "you can write to") from None
    suite.console.print(f"exported {student.config.num_hidden_layers}-layer pre-norm student with its tokenizer to "
                        f"{out_dir}")


def check_export_target(student_dir: Path, out_dir: Path, force: bool, runs_dir: Path = Path("runs")):
    """Never inside a runs tree (a run's --force may delete its folder), and --force replaces only a folder
    the kit exported before, never the checkpoint itself or a folder that holds it."""
    source, target = student_dir.resolve(), out_dir.resolve()
    runs = [p for p in target.parents if p == runs_dir.resolve() or (p / "metrics.jsonl").is_file()]
    if runs:  # a run folder, or the runs folder: a rerun with --force may delete what is in it
        raise errors.CheckpointError(f"{out_dir}: inside a runs tree ({runs[0]}), where a rerun with --force may "
                                     "delete it; export to a folder outside it")
    if not out_dir.exists():
        return
    if source == target or target in source.parents:
        raise errors.CheckpointError(f"{out_dir}: is or holds the checkpoint being exported; choose another output folder")
    if out_dir.is_dir() and not any(out_dir.iterdir()):  # an empty folder holds nothing to lose: used as a new one
        return
    if not force:
        raise errors.CheckpointError(f"{out_dir}: already exists; choose another folder, or pass --force to replace "
                              "an earlier export")
    if not (out_dir / model.EXPORT_MARKER).is_file():
        raise errors.CheckpointError(f"{out_dir}: not a folder the kit exported (no {model.EXPORT_MARKER}); --force only "
                              "replaces earlier exports, so choose a new or empty folder")


@cli.command("prepare")
@scale_option
@overrides_option
@force_option
@runs_option
def prepare_inputs(scale, overrides, compile_flag, device, tracker, no_wait, force, runs_dir):
    """A scale's data and teacher, before any GPU: tokenize the corpus into shards and download the hub
    teacher (or train the kit's own). Run it on a login node before torchrun, so that no rank waits."""
    ws = suite.workspace(scale, runs_dir, dry_run=True, overrides=overrides, compile_flag=compile_flag, device="cpu",
                         tracker=tracker, wait=not no_wait)
    suite.writable_dir(ws.runs.parent, "--runs-dir")
    teacher = suite.ensure_inputs(ws, force)
    shards = ", ".join(f"{split} {len(data.Shard(ws.data_dir / split, verify=False)):,} documents"
                       for split in ("train", "val"))
    suite.console.print(f"{scale}: data in {ws.data_dir} ({shards}); teacher in {teacher}; launch torchrun now")


@cli.command("data")
@scale_option
@set_option
@force_option
@runs_option
def prepare(scale, overrides, force, runs_dir):
    """Tokenize a scale's corpus into shards (reused when unchanged) and summarise them; with --set
    data.*, the shards those settings make, where the runs with them would read them."""
    ws = suite.workspace(scale, runs_dir, overrides=overrides, device="cpu")
    train_shard, val_shard = suite.prepare_data(ws, force)
    enc = tokenizer.qwen3_tokenizer(ws.preset.data["vocab_size"])
    table = Table(title=f"data at scale {scale} ({enc.name}); boundary tokens = leading <|endoftext|> per document")
    summaries = {"train": data.summarize(train_shard, enc), "validation": data.summarize(val_shard, enc)}
    table.add_column("")
    for split in summaries:
        table.add_column(split, justify="right")
    for key in summaries["train"]:
        table.add_row(key, *[f"{s[key]:,}" for s in summaries.values()])
    suite.console.print(table)


@cli.command()
@click.argument("wanted", metavar="EXPERIMENTS", nargs=-1)
@scale_option
@click.option("--gpus", type=click.IntRange(1, 1024), default=None,
              help="GPUs per node (default: 8 at full scale, 1 at the others).")
@click.option("--nodes", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Nodes; above 1, HSDP: shard within a node, replicate across nodes.")
@click.option("--mode", type=click.Choice(["both", "fake", "real"]), default="both", show_default=True,
              help="fake: one step at full size with fake tensors (memory, collectives, operators); real: the "
                   "launch's own driver at reduced size with real tensors on its mesh, two ranks a dimension (crashes, "
                   "dtypes, resume).")
@click.option("--replicate-teacher", is_flag=True, help="Rehearse the teacher whole on every GPU instead of sharded.")
@set_option
@runs_option
@results_option
def rehearse(wanted, scale, gpus, nodes, mode, replicate_teacher, overrides, runs_dir, results_dir):
    """Rehearse a launch of EXPERIMENTS (default table1; all) on this CPU, no GPU needed: one step at full
    size on a fake process group with fake tensors (per-rank memory by category, collectives and their
    bytes, operators, against the plan), and the launch's own driver at reduced size with real tensors in
    the preset's precision on the launch's mesh at two ranks a dimension, every phase of every run, with
    evaluations, checkpoints and a resume on another world size (results/rehearse-<scale>-*.json)."""
    import tempfile

    from tools import rehearse as rehearsal
    from tools import rehearse_real
    names = experiment_names(wanted or ("table1",))
    runs = experiment_runs(names)
    ws = suite.workspace(scale, runs_dir, results_dir, dry_run=True, overrides=overrides, device="cpu")
    launch = rehearsal.Launch(gpus or (8 if scale == "full" else 1), nodes)
    out = {}
    if mode in ("both", "fake"):
        with warnings.catch_warnings():  # the memory tracker's module hooks, on a student whose inputs need no gradient
            warnings.filterwarnings("ignore", "Full backward hook is firing", UserWarning)
            out["apart"] = rehearsal.rehearse(ws, launch, replicate_teacher=replicate_teacher)
            out["lockstep"] = rehearsal.rehearse_segments(ws, launch, runs, replicate_teacher=replicate_teacher)
        suite.console.print("\n".join(rehearsal.segments_markdown(out["apart"], out["lockstep"])), markup=False)
    if mode in ("both", "real"):
        with tempfile.TemporaryDirectory() as tmp:
            out["real"] = rehearse_real.rehearse(ws.preset, launch, runs, Path(tmp))
        suite.console.print("\n".join(rehearse_real.markdown(out["real"])), markup=False)
    label = "all" if "all" in wanted else "-".join(names)
    path = rehearsal.write(out, ws.results.parent, scale, launch, label, replicate_teacher)
    suite.console.print(f"wrote {path}")


@cli.command()
def bench():
    """Speed and memory against references, measured in one run on this machine (results/bench.json)."""
    from tools import bench as bench_module
    bench_module.main()


def terminated(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, terminated)  # SIGTERM ends as Ctrl-C does
    cli()
