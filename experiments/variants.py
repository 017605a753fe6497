"""A Variant: the one way a run differs from its preset (its label, the suite's run it changes, its folder
runs/<scale>/beyond/<folder>/, its settings as `--set` parses them), and what every experiment that trains one
does with its variants: their workspaces, their training, their outcomes, a declared family's readings (Holm).

    variants.train_variants(ws, [Variant("pre-grow + dose-channel 10x", PRE_GROW, "dose-channel-10",
                                         {"run": {"boundary": "dose-channel", "boundary_scale": 10.0}})], seeds)
"""

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import config
import grow
from experiments import presets, report, suite, training
from experiments.suite import RunName
from plumbing import locks


@dataclass(frozen=True)
class Variant:
    label: str                     # how the report names it
    run: RunName | None = None     # the run it changes (pre-grow, ...)
    folder: str = ""               # runs/<scale>/beyond/<folder>/; "" for the suite's own run
    settings: presets.Settings = field(default_factory=dict)  # as --set parses them: {"run": {"boundary": ...}}


def variant_workspace(ws: suite.Workspace, variant: Variant, seed: int) -> suite.Workspace:
    """The workspace a variant's run lives in (the suite's own for a run without changes)."""
    if not variant.folder:
        return ws
    settings = {section: dict(values) for section, values in variant.settings.items()}
    if settings.get("run", {}).get("boundary") == "mirror-fwd":  # the matching pre-norm run of the same seed
        settings["run"]["boundary_source"] = str(ws.run_dir(replace(variant.run, norm="pre"), seed))
    return replace(ws, preset=presets.with_settings(ws.preset, settings, f"the variant {variant.label!r}"),
                   variant=variant.folder)


def variant_dir(ws: suite.Workspace, variant: Variant, seed: int) -> Path:
    return variant_workspace(ws, variant, seed).run_dir(variant.run, seed)


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
        for group in [list(range(len(jobs)))] if ws.lockstep else ([i] for i in locks.free_first([f for _, f in jobs])):
            grow.train_together([jobs[i] for i in group], force=force, ctx=ws.ctx, tracker=ws.tracker, wait=ws.wait,
                                counted=ws.progress)
            for i in group:
                if ws.on_finished is not None and ws.ctx.is_main:
                    ws.on_finished(*named[seed][i], seed)


def job_config(vws: suite.Workspace, run: RunName, seed: int, teacher: Path) -> config.RunConfig:
    """A run's settings in its workspace; a variant's freeze run starts from the suite's grow phase 0 (of block 0's
    placement): no intervention acts while one block is active."""
    settings = suite.run_config(vws, run, seed, teacher=teacher)
    if settings.start_from and run.protocol == "freeze" and vws.variant:
        suite_ws = replace(vws, variant="")
        shared = suite_ws.run_dir(RunName(block0_placement(run), "grow"), seed) / "phase-0"
        settings = replace(settings, start_from=os.path.relpath(shared, vws.run_dir(run, seed)))
    return settings


def variant_outcomes(ws: suite.Workspace, variants, seeds: list[int]) -> tuple[dict, list[str]]:
    """({variant label: its final CE per seed}, the variants' diverged runs)."""
    ce = {v.label: [report.final_ce(variant_workspace(ws, v, s), v.run, s) for s in seeds] for v in variants}
    diverged = [d for v in variants for s in seeds
                for d in report.diverged_runs(variant_workspace(ws, v, s), [v.run], [s])]
    return ce, diverged


def holm_readings(rows: list[dict], key: str, untested: float = math.nan):
    """A declared family, read into each of its rows: row[key]'s p adjusted by Holm over the rows (p_holm; NaN
    where it has no test, which enters as `untested`), its reading and the smallest tie margin its seeds allowed."""
    raw = [report.p_two_sided(row[key]) for row in rows]
    for row, p, p_holm in zip(rows, raw, report.holm([untested if math.isnan(p) else p for p in raw])):
        row["p_holm"] = math.nan if math.isnan(p) else p_holm
        row["reading"] = report.reading(row[key], presets.TIE_MARGIN, p_holm)
        row["smallest_tie_margin"] = report.smallest_tie_margin(row[key])


def suite_runs(variants) -> list[RunName]:
    """The suite's own runs among the variants (those without a folder of their own), each once, by name."""
    return sorted({v.run for v in variants if not v.folder}, key=lambda run: run.name)


def block0_placement(run: RunName) -> str:
    return run.norm.split(",")[0].strip()
