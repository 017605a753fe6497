"""Before a launch: what it trains and what that costs (--dry-run; plan.py prices a command's groups of runs, each
(label, workspace, lockstep_plan.PlannedRun list)), its rehearsal on this CPU, and the kit's own teacher.

    python repro.py all --scale full --dry-run --gpu h100     # the whole paper: runs, tokens, FLOPs, GPU hours
    python repro.py rehearse table1 --scale full --gpus 8     # one step at full size, the driver at reduced size
"""

import io
import math
import os
import re
import shutil
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

import torch
from rich.console import Console

import data
import grow
import nets
import rundir
from experiments import paper_reports, presets, registry, studies, suite, training, variants
from plumbing import checkpoint, devices, errors, faults
from plumbing.flops import forward_flops_per_token
from tools import cpu_estimate, lockstep_plan, plan, rehearse, rehearse_real


def print_dry_run(scale: str, groups, seeds: list[int], gpu: str, gpus: int | None, nodes: int):
    """The plan of a command's runs (one workspace in full, several a row each), then this CPU's estimate."""
    gpus, ws = gpus or (8 if scale == "full" else 1), groups[0][1]
    if len(groups) == 1:
        totals = plan.print_plan(ws, groups[0][2], seeds, gpu, gpus, suite.console, nodes)
        flops = totals["lockstep"]["flops"] + totals["diagnostics_flops"]
    else:
        flops = plan.print_groups(groups, seeds, gpu, gpus, nodes, suite.console)
    pretraining, line = teacher_pretraining(ws)
    if line:
        suite.console.print(line)
    if ws.records is None:  # else the study's records decide what trains: print_study gives the one estimate
        print_estimate(ws, flops + pretraining, bool(pretraining))
    return flops + pretraining


def print_estimate(ws: suite.Workspace, flops: float, pretraining: bool = False):
    estimate = cpu_estimate.cpu_estimate(flops, run_precision(ws), ws.results.parent / "bench.json")
    suite.console.print(f"this machine: {estimate}" + (" (CUDA needed to run it)" if ws.preset.needs_cuda else "")
                        + (", the teacher's pretraining included" if pretraining else ""))


def teacher_pretraining(ws: suite.Workspace) -> tuple[float, str]:
    """(FLOPs, a line) of pretraining the kit's own teacher first, where a command would: none is in the runs
    folder, and the scale neither downloads nor ships one (a shipped one is assumed to fit)."""
    if ws.preset.teacher or ws.preset.shipped_teachers or (ws.teacher_dir / "done.json").exists():
        return 0.0, ""
    teacher, run = presets.teacher_shape(ws.preset), {**ws.preset.run, **ws.preset.teacher_run}
    doc_tokens = min(ws.preset.doc_tokens, ws.preset.data["max_len"])  # as rehearse.step_costs counts a document
    tokens = run["phase_steps"] * run["global_batch"] * doc_tokens
    layers, head = forward_flops_per_token(teacher, teacher.num_hidden_layers, doc_tokens / 2)
    flops = 3 * tokens * (layers + head)  # a training step: the forward, and a backward of twice its FLOPs
    return flops, (f"the kit's own teacher is not in {ws.teacher_dir}: it is pretrained first, {run['phase_steps']:,} "
                   f"steps of {run['global_batch']} documents ({tokens / 1e6:.1f}M tokens, {plan.flops_text(flops)})")


def print_study(study: registry.Experiment, ws: suite.Workspace, seeds: list[int], flops: float):
    """A study's records and the one estimate of what remains (without a manifest, of its `flops`)."""
    if ws.records is None:
        return
    if study.manifest is None:
        return print_estimate(ws, flops)
    print_records(ws, *study.manifest(ws, seeds))


def print_suite_records(ws: suite.Workspace, names: list[str], runs, seeds: list[int]):
    """`repro.py run`'s study: the runs restored from records (studies.restorable_jobs) and those that train anyway."""
    jobs = studies.restorable_jobs(ws, names, runs, seeds)
    restored = {job.folder for job in jobs}  # a set: comparing whole jobs (their workspaces) is slow at 2,000 seeds
    others = [job for job in studies.suite_jobs(ws, runs, seeds) if job.folder not in restored]
    print_records(ws, jobs, unrestored=others, why="an experiment asked reads their weights or every step")


def run_precision(ws: suite.Workspace) -> str:
    """The precision the command's runs train in on this CPU: fp32 or bf16."""
    dtype, _ = devices.precision_choice(ws.preset.run["precision"], torch.device("cpu"), ws.ctx.auto_precision)
    return {v: k for k, v in devices.DTYPES.items()}[dtype]


def print_records(ws: suite.Workspace, jobs: list[studies.Job], more: str = "", unrestored: list[studies.Job] = (),
                  why: str = ""):
    """A study's dry run: its runs recorded (and where), stale (and why) or remaining, those that train whatever
    their records (`unrestored`), and the one estimate of what trains."""
    if ws.records is None:
        return
    teacher = training.expected_teacher(ws)
    status = studies.survey(jobs, teacher, check_data=False)
    studies.check_precision(status, teacher)  # the study's one precision, as restoring it checks it
    machines = Counter(studies.machine(record) for _, record in status.recorded)
    trains = studies.unique(status.remaining + [job for job, _ in status.stale] + list(unrestored))
    flops = remaining_flops(trains, teacher)
    total = len(status.recorded) + len(status.stale) + len(status.remaining)
    dtype = str(devices.DTYPES[run_precision(ws)]).removeprefix("torch.")
    lines = [f"records in {ws.records / ws.runs.name}: {len(status.recorded)} of {total} runs recorded"
             + "".join(f"; {n} on {m}" for m, n in machines.items()),
             *(f"stale: {studies.record_path(job)} ({why})" for job, why in status.stale),
             *([f"trained whatever their records ({why}): {', '.join(job.label for job in unrestored)}"]
               if unrestored else []),
             *([f"to train: {', '.join(job.label for job in trains)}"] if trains else ["to train: nothing"]),
             f"remaining: {len(trains)} runs in {dtype}, {plan.flops_text(flops)}" + more
             + (f": {cpu_estimate.cpu_estimate(flops, run_precision(ws), ws.results.parent / 'bench.json')}"
                if flops else ""),
             "(the data and teacher checksums are compared when it runs)"]
    suite.console.print("\n".join(lines), markup=False)


def write_reports(ws: suite.Workspace, names: list[str], runs, seeds: list[int], started: float):
    """`repro.py run`'s reports, on rank 0 (the other ranks wait for it, then all leave together)."""
    for name in names:
        paper_reports.report_experiment(ws, name, seeds)
        faults.kill_point("reported", name)
    if not ws.preset.teacher:
        suite.console.print(suite.teacher_summary(ws, runs, seeds))
    suite.console.print(f"done in {time.time() - started:,.0f} s; results in {ws.results}")


def remaining_flops(trains: list[studies.Job], teacher) -> float:
    """The FLOPs of the runs a study still trains, as training computes them: a seed's runs of a workspace as
    planned_group plans them (the phases a prefix computes for them not paid again), one teacher pass a batch for
    each lockstep group; a variant's runs each alone, as before. Each run alone, its prefix paid again, made the
    toy's estimate twice its time."""
    groups: dict[tuple, list[studies.Job]] = {}
    for job in trains:
        groups.setdefault((id(job.ws), job.seed), []).append(job)
    flops = 0.0
    for jobs in groups.values():
        ws, seed, names = jobs[0].ws, jobs[0].seed, {job.run.name for job in jobs}
        runs = [run for run in planned_group(ws, [job.run for job in jobs], seed, teacher) if run.name in names]
        way = "lockstep" if ws.lockstep and not ws.variant else "separate"
        # one CPU process keeps the teacher's states of the shard's first epoch where they fit (nets.Teacher)
        kept = nets.first_epoch_bytes(ws.replay_docs * ws.preset.doc_tokens, presets.teacher_shape(ws.preset)
                                      .hidden_size) <= nets.first_epoch_budget(ws.ctx)
        flops += plan.print_plan(ws, runs, [seed], "h100", 1, Console(file=io.StringIO()),
                                 first_epoch_kept=kept)[way]["flops"]
    return flops


def train_one(ws: suite.Workspace, run: suite.RunName, seed: int, force: bool) -> str:
    """`repro.py train`: one named run and any whose phases it shares; its result in a line."""
    training.check_before_work(ws, [(job, seed) for job in suite.with_prefixes([run])], force)
    path = suite.ensure_inputs(ws, force)
    for job in suite.with_prefixes([run]):
        result = grow.train(suite.run_config(ws, job, seed, teacher=path), ws.run_dir(job, seed), force=force,
                            ctx=ws.ctx, tracker=ws.tracker, wait=ws.wait)
    return (f"{run.name}: validation CE {result['ce']:.4f}, KD {result['kd']:.4f}, PPL {result['ppl']:.2f}; "
            f"run folder {ws.run_dir(run, seed)}")


def planned(ws: suite.Workspace, runs, seed: int) -> tuple[str, suite.Workspace, list]:
    """One group: the runs (suite.RunName) in a workspace, and those whose phases they share."""
    return ", ".join(run.name for run in runs), ws, plan.planned_runs(ws, runs, seed)


def planned_group(gws: suite.Workspace, runs, seed: int, teacher: Path | None = None) -> list:
    """A group's runs as the plan prices them: a workspace's own with the runs whose phases they share; a variant's
    in its folder alone, each with its variant's settings (a freeze run's phase 0 the suite's grow's)."""
    if not gws.variant:
        return plan.planned_runs(gws, runs, seed)
    return [lockstep_plan.PlannedRun(run.name, variants.job_config(gws, run, seed, teacher),
                                     1 if run.protocol == "freeze" else 0) for run in runs]


def study_groups(study: registry.Experiment, ws: suite.Workspace, seed: int) -> list:
    """A study's groups as the plan prices them (planned_group)."""
    return [(label, gws, planned_group(gws, runs, s)) for label, gws, runs, s in study.groups(ws, seed)]


def rehearse_launch(ws: suite.Workspace, launch: rehearse.Launch, runs, mode: str, replicate_teacher: bool,
                    label: str) -> Path:
    """The rehearsal of a launch of `runs` (mode fake, real or both), printed and written; the file's path."""
    for run in plan.planned_runs(ws, runs, ws.preset.run["seed"]):  # the launch's own check, before any work
        data.check_split(run.config.global_batch, launch.world, run.config.micro_batch)
    out = {}
    if mode in ("both", "fake"):
        with warnings.catch_warnings():  # the memory tracker's module hooks, on a student whose inputs need no gradient
            warnings.filterwarnings("ignore", "Full backward hook is firing", UserWarning)
            out["apart"] = rehearse.rehearse(ws, launch, replicate_teacher=replicate_teacher)
            out["lockstep"] = rehearse.rehearse_segments(ws, launch, runs, replicate_teacher=replicate_teacher)
        suite.console.print("\n".join(rehearse.segments_markdown(out["apart"], out["lockstep"])), markup=False)
    if mode in ("both", "real"):
        with tempfile.TemporaryDirectory() as tmp:
            out["real"] = rehearse_real.rehearse(ws.preset, launch, runs, Path(tmp))
        suite.console.print("\n".join(rehearse_real.markdown(out["real"])), markup=False)
    return rehearse.write(out, ws.results.parent, ws.preset.name, launch, label, replicate_teacher)


def pretrain_teacher(ws: suite.Workspace, rebuild: bool = False, force: bool = False, ship: str | None = None) -> str:
    """`repro.py teacher`: the scale's data, then its own teacher (installed if shipped, else trained), or with
    `rebuild` the shipped one trained again in runs/<scale>/teacher-rebuilt/ and compared bit for bit; then with
    `ship` copied into this repository; the lines that say what came out."""
    if ws.preset.teacher:
        raise errors.UsageError(f"--scale {ws.preset.name} distils from {ws.preset.teacher}; there is no teacher to "
                                "pretrain")
    suite.shipped_shards()  # read before the data is prepared
    suite.prepare_data(ws, force)
    if not rebuild:
        path = suite.ensure_teacher(ws, force)
        result = rundir.read_json(ws.teacher_dir / "done.json", "ce", "ppl")
        line = f"teacher: validation CE {result['ce']:.4f} (PPL {result['ppl']:.1f}); HF checkpoint in {path}"
    elif not (name := suite.shipped_teacher_for(ws)):
        raise errors.OptionError("--rebuild", f"--scale {ws.preset.name} ships no teacher with these settings; "
                                 "`repro.py teacher` trains its own")
    else:
        from safetensors.torch import load_file
        folder = ws.runs / "teacher-rebuilt"
        grow.train(suite.teacher_config(ws, folder), folder, force=force, ctx=ws.ctx, tracker=ws.tracker, wait=ws.wait)
        shipped = load_file(suite.SHIPPED_ROOT / name / "phase-0" / "model.safetensors")
        rebuilt = load_file(folder / "phase-0" / "model.safetensors")
        if shipped.keys() == rebuilt.keys() and all(shipped[k].equal(rebuilt[k]) for k in shipped):
            line = f"teacher: rebuilt in {folder}, bit-identical to the shipped {name}"
        else:
            worst = max(((shipped[k] - rebuilt[k]).abs().max().item() for k in shipped.keys() & rebuilt.keys()),
                        default=math.inf)
            line = (f"teacher: rebuilt in {folder}; it differs from the shipped {name} (largest |difference| "
                    f"{worst:.3g}): another kind of CPU, thread count or precision rounds differently")
    return line + (f"\n{ship_teacher(ws, ship)}" if ship else "")


def ship_teacher(ws: suite.Workspace, name: str) -> str:
    """`repro.py teacher --ship NAME`: the finished teacher copied as teachers/NAME (SHIPPED_FILES), its checksums
    written and its shards' sha256s recorded in teachers/shards.json, so that a preset listing it installs it
    only for the very data it learned from. Nothing there is replaced."""
    source, target = ws.teacher_dir, suite.SHIPPED_ROOT / "teachers" / check_ship_name(None, None, name)
    rundir.read_json(source / "done.json", "ce")  # finished
    suite.refuse_diverged_teacher(source)
    checkpoint.check_checksums(source / "phase-0")
    tmp = target.with_name(f".{name}.{os.getpid()}.tmp")
    shutil.copytree(source, tmp, ignore=lambda folder, files: [f for f in files if Path(folder) == source and
                                                               f not in SHIPPED_FILES])
    checkpoint.write_checksums(tmp)
    record, recorded = suite.shipped_shards()
    checkpoint.write_json(record, {**recorded, f"teachers/{name}": suite.shard_sha256s(ws)}, indent=1)
    tmp.rename(target)
    return f"teacher: shipped as {target} (add \"teachers/{name}\" to the preset's shipped_teachers to install it)"


def check_ship_name(ctx, param, name: str | None) -> str | None:
    """--ship NAME, checked when the command line is read (click's callback): a new folder under teachers/."""
    if name is None:
        return None
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,63}", name):
        raise errors.OptionError("--ship", f"{name!r}: a folder name of lowercase letters, digits and '-'")
    if (suite.SHIPPED_ROOT / "teachers" / name).exists():
        raise errors.OptionError("--ship", f"{suite.SHIPPED_ROOT / 'teachers' / name} exists; choose another name "
                                 "(nothing shipped is replaced)")
    return name


SHIPPED_FILES = ("config.json", "provenance.json", "metrics.jsonl", "done.json", "phase-0")  # what teachers/toy holds
