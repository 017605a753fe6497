"""normgrow: reproduce "Rethinking Normalization Placement for LLMs: Post-Norm under Curriculum Depth
Growing" at the scale you choose, with the paper's numbers printed beside the kit's.

    python repro.py --scale toy                             # the whole paper on a laptop CPU, offline
    python repro.py table1 fig3 --scale smoke               # some experiments, CI scale
    python repro.py table1 --scale toy --seeds 42,43,44     # error bars on the interaction
    python repro.py all --scale full --dry-run --gpu h100   # the plan: runs, tokens, FLOPs, GPU hours
    torchrun --nproc_per_node=8 repro.py table1 --scale full                 # one 8-GPU node
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=$HEAD:29500 \\
        repro.py all --scale full                                            # several nodes
    python repro.py train --scale toy --norm post --protocol grow            # one run
    python repro.py export runs/toy/s42/pre-grow/phase-2 out/pre-grow-hf
    python repro.py results --scale toy                     # docs/results/toy.md from references/toy.json

A scale's data, teacher and runs (s<seed>/<run>/) live in runs/<scale>/, its reports in results/<scale>/.
Finished runs are reused, interrupted ones resumed; runs whose first phases are identical share them.
"""
import json
import signal
import sys
import time
from pathlib import Path

try:  # started outside the kit's virtualenv (`python3 repro.py`): how to install, in one line, not a traceback
    import click
    import torch.distributed as dist

    import data
    import model
    from experiments import presets, registry, studies, suite, training
    from plumbing import devices, errors, paths
    from plumbing.locks import printable
    from tools import checkpoints, cli_options, preflight
except ModuleNotFoundError as e:
    sys.exit(f"Error: {e.name.partition('.')[0]} is not installed; run `make install`, then `.venv/bin/python repro.py ...`")
except KeyboardInterrupt:  # Ctrl-C (or SIGTERM's default) while torch and the kit import: nothing was started yet
    print("Error: interrupted: repro.py stopped while it loaded, before it started anything", file=sys.stderr)
    sys.exit(130)

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
            if not devices.prints_errors():  # under torchrun every rank stops; rank 0 says why
                raise SystemExit(e.exit_code) from None
            raise OneLineError(str(e), e.exit_code) from None
        except OSError as e:  # a path the user gave or made that is not what it must be: a folder where a file goes
            if e.filename is None:  # (or a file where a folder goes), a link loop, a broken link, a name too long
                raise
            raise OneLineError(paths.path_problem(e)) from None
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
TRAINS = ("run", "train", *registry.STUDIES, "teacher", "prepare", "data")


class OneLineError(click.ClickException):
    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(printable(message, sys.maxsize))  # a path's newline or ESC shown escaped: one line, as text
        self.exit_code = exit_code


def say(ws: suite.Workspace, line: str) -> None:
    """A launch's result, printed once: under torchrun every rank returns the same line."""
    if ws.ctx.is_main:
        suite.console.print(line)


cli = Repro("cli", context_settings={"help_option_names": ["-h", "--help"]},
            help="Reproduce the paper's tables and figures: `repro.py [EXPERIMENT ...] --scale SCALE`.\n\n\b\n"
                 f"Experiments: {' '.join(registry.PAPER_TABLES)}, or all\n(the default); beyond the paper, each "
                 f"also a command: {' '.join(registry.STUDIES)}.\nSee `repro.py run --help` for the options.")


# The paper's experiments and the ones beyond it

@cli.command("run")
@click.argument("wanted", metavar="EXPERIMENTS", nargs=-1)
@cli_options.scale_option
@cli_options.seeds_option("Comma-separated seeds, e.g. 42,43,44: every needed run per seed, mean ± std and a 95% "
                          "interval per number. Default: the paper's seed (42).")
@cli_options.records_option
@cli_options.experiment_options
def run_experiments(wanted, scale, seeds, records_dir, dry_run, gpu, gpus, nodes, force, **options):
    """Run EXPERIMENTS (default: all, the paper's tables and figures; a study beyond the paper by its name, as
    `repro.py <study>` runs it) at a scale and write results/<scale>/<experiment>.md/.json/.png."""
    names, runs = cli_options.chosen_experiments(wanted)
    tables_named = [name for name in names if registry.EXPERIMENTS[name].table]
    if tables_named:
        run_tables(tables_named, runs, scale, seeds, records_dir, dry_run, gpu, gpus, nodes, force, **options)
    for name in names:
        if name not in tables_named:
            run_study(name, scale, seeds, records_dir, dry_run, gpu, gpus, nodes, force, **options)


def run_tables(names, runs, scale, seeds, records_dir, dry_run, gpu, gpus, nodes, force, **options):
    """The paper's tables and figures named, trained together over their shared runs, then each one's report."""
    ws, seeds = cli_options.seeded_workspace(scale, seeds, None, records_dir, dry_run, **options)
    if dry_run:
        preflight.print_dry_run(scale, [preflight.planned(ws, runs, seeds[0])], seeds, gpu, gpus, nodes)
        preflight.print_suite_records(ws, names, runs, seeds)
        return
    ws.results.mkdir(parents=True, exist_ok=True)
    started = time.time()
    studies.restore_study(ws, studies.restorable_jobs(ws, names, runs, seeds), force)  # the others train
    training.ensure_runs(ws, runs, seeds, force)
    ws.ctx.on_main(lambda: preflight.write_reports(ws, names, runs, seeds, started), "the reports and their diagnostics")


def run_study(name, scale, seeds, records_dir, dry_run, gpu, gpus, nodes, force, **options):
    """One study beyond the paper (registry.STUDIES): its dry run, or what remains of it trained and its report."""
    study = registry.STUDIES[name]
    if study.check is not None:  # what the scale cannot give, said before any folder is made
        study.check(scale)
    default_seeds = presets.DEFAULT_SEEDS.get(name, presets.DEFAULT_SEEDS["beyond"])[scale]
    ws, seeds = cli_options.seeded_workspace(scale, seeds, default_seeds, records_dir, dry_run, **options)
    if dry_run:
        flops = preflight.print_dry_run(scale, preflight.study_groups(study, ws, seeds[0]), seeds, gpu, gpus, nodes)
        preflight.print_study(study, ws, seeds, flops)
        return
    study.run(ws, seeds, force)
    ws.ctx.barrier()


@cli.command()
@cli_options.scale_option
@click.argument("paths", metavar="CHECKPOINTS", nargs=-1, type=click.Path(path_type=Path))
@cli_options.set_option
@cli_options.runs_option
@cli_options.results_option
def scan(scale, paths, overrides, runs_dir, results_dir):
    """The layer-by-layer scan: massive activations (max/median |activation|) and sink heads at every layer of the scale's
    teacher (--set: that workspace's) and each student CHECKPOINT given, on the diagnostic batch (results/<scale>/scan.*)."""
    from experiments import scan as layer_scan
    ws, _ = cli_options.preset_workspace(scale, overrides, runs_dir=runs_dir, results_dir=results_dir)
    students = [checkpoints.student_checkpoint(path) for path in paths]  # one line before data or teacher is made
    layer_scan.run_scan(ws, suite.ensure_inputs(ws), students)


def study_command(name: str, study: registry.Experiment):
    """`repro.py <name>` for an experiment of experiments/registry.py (not part of `all`): `repro.py run <name>`; its
    help is its run's docstring."""
    @cli.command(name, help=study.run.__doc__)
    @cli_options.scale_option
    @cli_options.seeds_option("Comma-separated seeds. Default: 42,43,44 at toy scale (the causal test's: 42-49), 42 "
                              "elsewhere.")
    @cli_options.records_option
    @cli_options.experiment_options
    def command(scale, seeds, records_dir, dry_run, gpu, gpus, nodes, force, **options):
        run_study(name, scale, seeds, records_dir, dry_run, gpu, gpus, nodes, force, **options)


for study_name, declared in registry.STUDIES.items():
    study_command(study_name, declared)


# One run, the teacher, the data

@cli.command()
@cli_options.scale_option
@click.option("--norm", required=True, callback=lambda c, p, v: cli_options.check_norm(v),
              help=f"Norm placement ({', '.join(model.PLACEMENTS)}), or one per block: pre,post,post; or auto (pre-norm, "
                   "each appended block post-norm where the boundary it reads drifts: transitions.py).")
@click.option("--protocol", type=click.Choice(suite.RUN_PROTOCOLS), required=True,
              help="joint, grow, freeze, or the joint controls (Table 3; joint-replay: grow's steps on grow's shard).")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=None, help="Default: the preset's (42).")
@cli_options.dry_run_options
@cli_options.overrides_option
@cli_options.force_option
@cli_options.runs_option
def train(scale, norm, protocol, seed, dry_run, gpu, gpus, nodes, force, **options):
    """Train one named run (and any run whose phases it shares), e.g. --norm post --protocol grow."""
    ws, [seed] = cli_options.preset_workspace(scale, seeds=None if seed is None else [seed], dry_run=dry_run, **options)
    cli_options.check_norm(norm, ws.preset.run["blocks"])
    run = suite.RunName(norm, protocol)
    if dry_run:
        preflight.print_dry_run(scale, [preflight.planned(ws, [run], seed)], [seed], gpu, gpus, nodes)
        return
    say(ws, preflight.train_one(ws, run, seed, force))


@cli.command()
@cli_options.scale_option
@click.option("--rebuild", is_flag=True, help="Train the shipped teacher again, beside it, and say if it is bit-identical.")
@click.option("--ship", metavar="NAME", callback=preflight.check_ship_name,
              help="Then copy it into this repository: teachers/NAME, its shards recorded.")
@cli_options.overrides_option
@cli_options.force_option
@cli_options.runs_option
def teacher(scale, rebuild, ship, force, **options):
    """Pretrain the kit's own teacher for a scale and print its validation CE (a shipped one is installed)."""
    ws, _ = cli_options.preset_workspace(scale, **options)
    say(ws, preflight.pretrain_teacher(ws, rebuild, force, ship))


@cli.command("prepare")
@cli_options.scale_option
@cli_options.overrides_option
@cli_options.force_option
@cli_options.runs_option
def prepare_inputs(scale, device, force, **options):
    """A scale's data and teacher, before any GPU: tokenize the corpus into shards and download the hub
    teacher (or train the kit's own). Run it on a login node before torchrun, so that no rank waits."""
    ws, _ = cli_options.preset_workspace(scale, dry_run=True, device="cpu", **options)
    paths.writable_dir(ws.runs.parent, "--runs-dir")
    teacher = suite.ensure_inputs(ws, force)
    shards = ", ".join(f"{split} {len(data.Shard(ws.data_dir / split, verify=False)):,} documents"
                       for split in ("train", "val"))
    suite.console.print(f"{scale}: data in {ws.data_dir} ({shards}); teacher in {teacher}; launch torchrun now")


@cli.command("data")
@cli_options.scale_option
@cli_options.set_option
@cli_options.force_option
@cli_options.runs_option
def prepare(scale, overrides, force, runs_dir):
    """Tokenize a scale's corpus into shards (reused when unchanged) and summarise them; with --set
    data.*, the shards those settings make, where the runs with them would read them."""
    ws, _ = cli_options.preset_workspace(scale, overrides, runs_dir=runs_dir, device="cpu")
    suite.console.print(suite.data_summary(ws, force))


@cli.command()
@cli_options.scale_option
def ratios(scale):
    """The scale's dimensionless ratios beside the paper's, as a Markdown table (README, "The toy preset")."""
    click.echo("\n".join(presets.ratios_markdown(presets.PRESETS[scale])))


# Checkpoints: evaluate, sample, export

@cli.command("eval")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--scale", type=click.Choice(list(presets.PRESETS)), default=None,
              help="Whose validation shard and evaluation settings (default: read from the checkpoint's vocabulary).")
@click.option("--data", "data_dir", type=click.Path(path_type=Path), default=None,
              help="A validation shard folder (default: the scale's, runs/<scale>/data/val).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@cli_options.runs_option
def evaluate(checkpoint, scale, data_dir, as_json, runs_dir):
    """CE and PPL of any teacher (HF Qwen3) or student checkpoint on a validation shard."""
    result = checkpoints.evaluate(checkpoint, scale, data_dir, runs_dir)
    if as_json:
        click.echo(json.dumps(result))
    else:
        suite.console.print(f"{result['checkpoint']}: CE {result['ce']:.4f} nats/token, PPL {result['ppl']:.2f} over "
                            f"{result['tokens']:,} tokens of {result['data']}")


@cli.command("sample")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--prompt", default="", help="Text to continue (encoded as a document: <|endoftext|> first).")
@click.option("--max-new-tokens", type=click.IntRange(1), default=None, help="At most the context the checkpoint was "
              "trained on (data.max_len) less the prompt's tokens. Default: 64, or that if fewer.")
@click.option("--temperature", type=click.FloatRange(0), default=0.0, show_default=True,
              help="0: greedy; any finite value above (with --top-k 1: greedy too).",
              callback=lambda c, p, v: cli_options.finite(v, "--temperature"))
@click.option("--top-k", type=click.IntRange(0), default=0, show_default=True,
              help="0: every token; at most the checkpoint's vocabulary.")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True)
@cli_options.runs_option
def sample_text(checkpoint, prompt, max_new_tokens, temperature, top_k, seed, runs_dir):
    """Continue a prompt with any teacher, student (pre or post) or exported checkpoint, with a KV cache."""
    from tools import sample
    sample.continue_prompt(checkpoint, prompt, max_new_tokens, temperature, top_k, seed, runs_dir, click.echo)


@cli.command()
@click.argument("student_dir", type=click.Path(path_type=Path))
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Replace OUT_DIR if it holds an earlier export (never anything else).")
@cli_options.runs_option
def export(student_dir: Path, out_dir: Path, force: bool, runs_dir: Path):
    """Write a pre-norm student checkpoint as a standard HF Qwen3 directory that transformers loads
    (AutoModelForCausalLM, AutoTokenizer with the kit's exact ids, generate with <|endoftext|> as eos)."""
    student = checkpoints.export(student_dir, out_dir, force, runs_dir)
    suite.console.print(f"exported {student.config.num_hidden_layers}-layer pre-norm student with its tokenizer to "
                        f"{out_dir}")


# The shipped references, the rehearsal of a launch, the benchmarks

@cli.command("reference")
@cli_options.scale_option
@click.option("--seeds", required=True, callback=cli_options.parse_seeds, help="The seeds whose runs and tables to ship.")
@click.option("--force", is_flag=True, help="Replace the shipped references/<scale>.json.")
@click.option("--tables", default=None, metavar="NAMES",
              help="Replace only these tables (comma-separated report names, e.g. planted,scratch) of the shipped "
                   "reference, from an experiment rerun in a runs folder of its own; the rest stays as shipped.")
@cli_options.runs_option
@cli_options.results_option
def make_reference(scale, seeds, force, tables, runs_dir, results_dir):
    """Write references/<scale>.json from finished runs and reports (what `compare` checks against)."""
    from experiments import reference
    if tables is None:
        line = reference.write(scale, seeds, force, runs_dir / scale, results_dir / scale)
    else:
        names = [t for t in tables.split(",") if t.strip()]
        line = reference.write_tables(scale, seeds, force, names, runs_dir / scale, results_dir / scale)
    suite.console.print(line)


@cli.command("compare")
@click.argument("target", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--scale", type=click.Choice(list(presets.PRESETS)), default=None,
              help="Whose shipped reference (default: the scale TARGET's runs' settings or its reports name).")
def compare_with_reference(target, scale):
    """Is a run (or a scale's runs, or its results) finished and within the band of the shipped seeds? Exits 1 if not."""
    from experiments import comparison
    comparison.check(target, scale)


@cli.command("results")
@cli_options.scale_option
def results_pages(scale):
    """docs/results/<scale>.md, its figures and the README's headline, rendered from references/<scale>.json."""
    from experiments import pages
    suite.console.print(f"wrote {pages.main(scale)}, its figures and the README's headline")


@cli.command()
@click.argument("wanted", metavar="EXPERIMENTS", nargs=-1)
@cli_options.scale_option
@click.option("--gpus", type=click.IntRange(1, 1024), default=None,
              help="GPUs per node (default: 8 at full scale, 1 at the others).")
@click.option("--nodes", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Nodes; above 1, HSDP: shard within a node, replicate across nodes.")
@click.option("--mode", type=click.Choice(["both", "fake", "real"]), default="both", show_default=True,
              help="fake: one step at full size with fake tensors (memory, collectives, operators); real: the launch's "
                   "driver at reduced size, real tensors, its mesh at two ranks a dimension (crashes, dtypes, resume).")
@click.option("--replicate-teacher", is_flag=True, help="Rehearse the teacher whole on every GPU instead of sharded.")
@cli_options.set_option
@cli_options.runs_option
@cli_options.results_option
def rehearse(wanted, scale, gpus, nodes, mode, replicate_teacher, **options):
    """Rehearse a launch of EXPERIMENTS (default table1; all) on this CPU, no GPU needed: one step at full
    size on a fake process group with fake tensors (per-rank memory by category, collectives and their
    bytes, operators, against the plan), and the launch's own driver at reduced size with real tensors in
    the preset's precision on the launch's mesh at two ranks a dimension, every phase of every run, with
    evaluations, checkpoints and a resume on another world size (results/rehearse-<scale>-*.json)."""
    from tools import rehearse as rehearsal
    names, runs = cli_options.chosen_experiments(wanted or ("table1",))
    if beyond := [name for name in names if not registry.EXPERIMENTS[name].table]:
        raise click.BadParameter(f"{beyond[0]!r} is a study beyond the paper; rehearse takes the paper's tables "
                                 f"({', '.join(registry.PAPER_TABLES)}) or all", param_hint="EXPERIMENTS")
    ws, _ = cli_options.preset_workspace(scale, dry_run=True, device="cpu", **options)
    launch = rehearsal.Launch(gpus or (8 if scale == "full" else 1), nodes)
    label = "all" if "all" in wanted else "-".join(names)
    suite.console.print(f"wrote {preflight.rehearse_launch(ws, launch, runs, mode, replicate_teacher, label)}")


@cli.command()
def bench():
    """Speed and memory against references, measured in one run on this machine (results/bench.json)."""
    from tools import bench as bench_module
    bench_module.main()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM ends as Ctrl-C does
    cli()
