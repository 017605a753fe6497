"""A Variant: the one way a run differs from its preset, for every experiment that trains one (the interventions,
the planted doses, the ideas, the causal test, a newcomer's own): its label, the suite's run it changes, its
folder under runs/<scale>/beyond/ and its settings, checked as `--set` values are (presets.with_settings). Here
too what every such experiment does with its variants: their workspaces, training them after the suite's own
runs (a seed's variants in lockstep), their settings as a study records them, and their outcomes.

    variants.train_variants(ws, [Variant("pre-grow + dose-channel 10x", PRE_GROW, "dose-channel-10",
                                         {"boundary": "dose-channel", "boundary_scale": 10.0})], seeds)
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import config
import grow
import rundir
from experiments import presets, report, suite, training
from experiments.suite import RunName
from plumbing import locks


@dataclass(frozen=True)
class Variant:
    label: str                 # how the report names it
    run: RunName               # the run it changes (pre-grow, ...)
    folder: str = ""           # runs/<scale>/beyond/<folder>/; "" for the suite's own run
    settings: dict = field(default_factory=dict)  # RunConfig fields it changes


def variant_workspace(ws: suite.Workspace, variant: Variant, seed: int) -> suite.Workspace:
    """The workspace a variant's run lives in (the suite's own for a run without changes)."""
    if not variant.folder:
        return ws
    settings = dict(variant.settings)
    if settings.get("boundary") == "mirror-fwd":  # the matching pre-norm run of the same seed
        settings["boundary_source"] = str(ws.run_dir(replace(variant.run, norm="pre"), seed))
    return replace(ws, preset=presets.with_settings(ws.preset, {"run": settings}, f"the variant {variant.label!r}"),
                   student_runs=str(Path(ws.student_runs) / "beyond" / variant.folder), suite_runs=ws.student_runs)


def train_variants(ws: suite.Workspace, variants, seeds: list[int], force: bool = False):
    """The suite's runs first (the mirror reads pre-grow), then each seed's variant runs in lockstep."""
    teacher = suite.ensure_inputs(ws, force)
    named = {seed: [(variant_workspace(ws, v, seed), v.run) for v in variants if v.folder] for seed in seeds}
    planned = {seed: [(job_config(vws, run, seed, teacher), vws.run_dir(run, seed)) for vws, run in named[seed]]
               for seed in seeds}
    ws.progress.plan([job for seed in seeds for job in planned[seed]])  # counted from the suite's first run on
    training.ensure_runs(ws, suite_runs(variants), seeds, force, teacher=teacher)
    for seed in seeds:
        jobs = planned[seed]
        # in lockstep a seed's variants train together; apart, each alone, so a study records each as it
        # finishes, a run another process is training left for later (two processes share out one study)
        apart = locks.free_first([folder for _, folder in jobs])
        for group in [list(range(len(jobs)))] if ws.lockstep else ([i] for i in apart):
            grow.train_together([jobs[i] for i in group], force=force, ctx=ws.ctx, tracker=ws.tracker, wait=ws.wait,
                                counted=ws.progress)
            for i in group:
                if ws.on_finished is not None and ws.ctx.is_main:
                    ws.on_finished(*named[seed][i], seed)


def job_config(vws: suite.Workspace, run: RunName, seed: int, teacher: Path) -> config.RunConfig:
    """A run's settings in its workspace; a variant's freeze run (in beyond/<folder>/) starts from the suite's
    grow phase 0 (of block 0's placement): no intervention acts while one block is active, and a transplant's
    prefix is that block."""
    settings = suite.run_config(vws, run, seed, teacher=teacher)
    if settings.start_from and run.protocol == "freeze" and vws.suite_runs is not None:
        suite_ws = replace(vws, student_runs=vws.suite_runs, suite_runs=None)
        shared = suite_ws.run_dir(RunName(block0_placement(run), "grow"), seed) / "phase-0"
        settings = replace(settings, start_from=os.path.relpath(shared, vws.run_dir(run, seed)))
    return settings


def variant_outcomes(ws: suite.Workspace, variants, seeds: list[int]) -> tuple[dict, list[str]]:
    """({variant label: its final CE per seed}, the variants' diverged runs)."""
    ce = {v.label: [report.final_ce(variant_workspace(ws, v, s), v.run, s) for s in seeds] for v in variants}
    diverged = [d for v in variants for s in seeds
                for d in report.diverged_runs(variant_workspace(ws, v, s), [v.run], [s])]
    return ce, diverged


def suite_runs(variants) -> list[RunName]:
    """The suite's own runs among the variants (those without a folder of their own), each once, by name."""
    return sorted({v.run for v in variants if not v.folder}, key=lambda run: run.name)


def internal_boundary_range(run_dirs: list[Path], phase_steps: int) -> dict:
    """{"mean": [lo, hi], "kurtosis": [lo, hi]} of the boundary after block 0 over the runs' monitor
    rows once block 1 reads it (after the first phase); {} where the runs have no such rows."""
    rows = [r["boundaries"][1] for d in run_dirs for r in rundir.monitor_series(d) if r["step"] > phase_steps]
    return {key: [min(r[key] for r in rows), max(r[key] for r in rows)] for key in ("mean", "kurtosis")} if rows else {}


def range_cell(ranges: dict) -> str:
    if not ranges:
        return "n/a"
    return f"{ranges['mean'][0]:.2f}–{ranges['mean'][1]:.2f}, {ranges['kurtosis'][0]:.1f}–{ranges['kurtosis'][1]:.1f}"


def block0_placement(run: RunName) -> str:
    """The placement of a run's block 0 (a transplant's prefix)."""
    return run.norm.split(",")[0].strip()
