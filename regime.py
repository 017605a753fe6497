"""The regime map: how the post-norm advantage under growth depends on the training regime.

    python repro.py regime --scale toy                       # the default grid, 2 seeds (about 3 hours on 2 cores)
    python repro.py regime --scale toy --seeds 42 --grid "budget=0.5,1,2;lr=1;gain=ones"
    python repro.py regime --scale smoke                     # the tests' tiny grid

The paper measures one regime (3 x 50k steps at peak LR 1e-4). The map runs the four main runs
(pre/post x joint/grow) at each point of a grid around a scale's preset and reports, per point,
delta joint = post-joint - pre-joint, delta grow = post-grow - pre-grow and their difference, the
interaction (validation CE, mean and 95% interval over seeds). A grid has three axes, each varied
with the other two at the preset's value:

- budget: steps per phase x b (the replay shard grows with it, as the paper's does with its steps;
  warmup keeps the preset's length in steps, evaluations and checkpoints keep their number per phase);
- lr: peak and minimum learning rate x m, at the preset's budget;
- gain: the post-norm output-gain initialisation, "ones" (the paper) or "teacher" (g_T; see
  model.Student.from_teacher), at the preset's budget and LR.

The point (budget 1, lr 1, gain ones) is the preset itself: its runs are the suite's own, in
runs/<scale>/s<seed>/. Every other point's runs live in runs/<scale>/regime/<point>/s<seed>/;
finished runs are reused and interrupted ones resumed, so the map can be stopped and rerun.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import click

import data
import diag
import experiments
import model
import suite

GRIDS = {  # each axis's values; the preset's own value (1 or "ones") is the point they share
    "smoke": {"budget": (0.5, 1.0), "lr": (1.0, 2.0), "gain": ("ones", "teacher")},
    "toy": {"budget": (0.25, 0.5, 1.0, 2.0), "lr": (0.5, 1.0, 2.0), "gain": ("ones", "teacher")},
    "small": {"budget": (0.25, 0.5, 1.0), "lr": (0.5, 1.0, 2.0), "gain": ("ones", "teacher")},
    "full": {"budget": (1.0,), "lr": (1.0,), "gain": ("ones", "teacher")},
}
DEFAULT_SEEDS = {"smoke": [42], "toy": [42, 43], "small": [42], "full": [42]}
AXES = ("budget", "lr", "gain")


@dataclass(frozen=True)
class Point:
    budget: float = 1.0
    lr: float = 1.0
    gain: str = "ones"

    @property
    def name(self) -> str:
        return f"budget{self.budget:g}-lr{self.lr:g}-gain-{self.gain}"

    @property
    def is_preset(self) -> bool:
        return self == Point()

    @property
    def pre_runs_are_the_presets(self) -> bool:
        """The gain option changes post-norm runs only: pre-norm ones are the preset's own."""
        return self.budget == 1 and self.lr == 1


def parse_grid(text: str) -> dict:
    """"budget=0.5,1,2;lr=1,2;gain=ones,teacher" -> {"budget": (0.5, 1.0, 2.0), ...}; an axis left out
    keeps only the preset's value."""
    grid = {"budget": (1.0,), "lr": (1.0,), "gain": ("ones",)}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        axis, _, values = part.partition("=")
        axis = axis.strip()
        if axis not in AXES or not values.strip():
            raise click.BadParameter(f"{part!r}: write AXIS=V1,V2,... with AXIS one of {', '.join(AXES)}, "
                                     "e.g. \"budget=0.5,1,2;lr=1,2\"", param_hint="--grid")
        items = [v.strip() for v in values.split(",") if v.strip()]
        if axis == "gain":
            bad = [v for v in items if v not in model.OUTPUT_GAINS]
            if bad:
                raise click.BadParameter(f"gain {bad[0]!r} is unknown; choose from "
                                         f"{', '.join(model.OUTPUT_GAINS)}", param_hint="--grid")
            grid[axis] = tuple(dict.fromkeys(items))
            continue
        try:
            numbers = [float(v) for v in items]
        except ValueError:
            raise click.BadParameter(f"{part!r}: {axis} values must be numbers, e.g. {axis}=0.5,1,2",
                                     param_hint="--grid") from None
        if any(not 0 < n <= 100 for n in numbers):
            raise click.BadParameter(f"{part!r}: {axis} multipliers must be in (0, 100]", param_hint="--grid")
        grid[axis] = tuple(dict.fromkeys(numbers))
    return grid


def grid_points(grid: dict) -> list[Point]:
    """One axis at a time around the preset, the preset's point once."""
    points = [Point(budget=b) for b in grid["budget"]] + [Point(lr=m) for m in grid["lr"]] \
        + [Point(gain=g) for g in grid["gain"]]
    return sorted(dict.fromkeys(points), key=lambda p: (p.gain, p.lr, p.budget))


def point_workspace(ws: suite.Workspace, point: Point) -> suite.Workspace:
    """The preset with one point's settings, its students in their own folder."""
    if point.is_preset:
        return ws
    run = dict(ws.preset.run)
    steps = max(1, round(run["phase_steps"] * point.budget))
    warmup = max(1, round(run["warmup_frac"] * run["phase_steps"]))
    per_phase = {k: max(1, round(steps * run[k] / run["phase_steps"]))
                 for k in ("eval_interval", "checkpoint_interval")}
    run.update(phase_steps=steps, warmup_frac=min(1.0, warmup / steps), **per_phase, snapshot_interval=0,
               lr=run["lr"] * point.lr, min_lr=run["min_lr"] * point.lr, post_output_gain=point.gain)
    return replace(ws, preset=replace(ws.preset, run=run),
                   student_runs=str(Path(ws.student_runs) / "regime" / point.name))


def run_map(ws: suite.Workspace, grid: dict, seeds: list[int], force: bool = False) -> dict:
    teacher = suite.ensure_inputs(ws, force)
    available = len(data.Shard(ws.data_dir / "train", verify=False))
    points = grid_points(grid)
    for point in points:
        pws = point_workspace(ws, point)
        if pws.replay_docs > available:
            raise click.UsageError(f"--grid budget={point.budget:g} needs a replay shard of {pws.replay_docs:,} "
                                   f"documents and {ws.data_dir / 'train'} holds {available:,}; use a smaller budget")
        shared = [n for n in experiments.MAIN_RUNS if point.pre_runs_are_the_presets and n.startswith("pre")]
        if shared and not point.is_preset:
            suite.ensure_runs(ws, shared, seeds, force, teacher=teacher)
        suite.ensure_runs(pws, [n for n in experiments.MAIN_RUNS if n not in shared or point.is_preset], seeds, force,
                          teacher=teacher)
    return report(ws, points, seeds) if ws.ctx.is_main else {}


def point_numbers(ws: suite.Workspace, point: Point, seed: int) -> dict:
    """Table 1's numbers of one point and seed, from the runs' done.json."""
    pws = point_workspace(ws, point)
    ce = {f"{n}_{p}": experiments.final_eval(ws if n == "pre" and point.pre_runs_are_the_presets else pws,
                                       f"{n}-{p}", seed)["ce"] for n in ("pre", "post") for p in ("joint", "grow")}
    return experiments.with_deltas(ce)


def report(ws: suite.Workspace, points: list[Point], seeds: list[int]) -> dict:
    """results/<scale>/regime.json, .md and .png."""
    rows = []
    for point in points:
        pws = point_workspace(ws, point)
        per_seed = [point_numbers(ws, point, s) for s in seeds]
        run = pws.preset.run
        row = {"point": point.name, "budget": point.budget, "lr_multiplier": point.lr, "gain": point.gain,
               "phase_steps": run["phase_steps"], "lr": run["lr"], "lr_x_steps": run["lr"] * run["phase_steps"],
               "folder": str(pws.run_dir("pre-joint", seeds[0]).parent.parent)}
        for key in ("pre_joint", "post_joint", "pre_grow", "post_grow", "delta_joint", "delta_grow", "interaction"):
            row[key] = experiments.across_seeds([p[key] for p in per_seed])
        rows.append(row)
    paper = {"delta_joint": 0.0004, "delta_grow": -0.0328, "interaction": -0.0332}
    out = {"experiment": "regime", "scale": ws.preset.name, "seeds": seeds, "paper": paper, "points": rows,
           "about": __doc__.split("\n\n")[1]}
    out["figure"] = str(diag.fig_regime(rows, paper, ws.results / "regime.png", ws.preset.name, seeds))
    (ws.results / "regime.json").write_text(json.dumps(out, indent=2) + "\n")
    (ws.results / "regime.md").write_text("\n".join(markdown(rows, paper, ws.preset.name, seeds)) + "\n")
    suite.console.print("\n".join(markdown(rows, paper, ws.preset.name, seeds)), markup=False)
    return out


def cell(s: dict) -> str:
    if s["n"] == 1:
        return f"{s['mean']:+.4f}"
    lo, hi = s["ci95"]
    return f"{s['mean']:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def markdown(rows: list[dict], paper: dict, scale: str, seeds: list[int]) -> list[str]:
    interval = f"mean [95% t-interval] over seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else \
        f"seed {seeds[0]}"
    lines = [f"# Regime map ({scale} scale)", "",
             f"Validation CE differences, post − pre, {interval}. Paper (3 × 50k steps, LR 1e-4): Δjoint "
             f"{paper['delta_joint']:+.4f}, Δgrow {paper['delta_grow']:+.4f}, interaction {paper['interaction']:+.4f}.",
             "", "| point | steps/phase | peak LR | LR × steps | output gain | Δjoint | Δgrow | interaction | "
                 "reversal (Δgrow < 0 ≤ Δjoint) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        reversal = "yes" if r["delta_grow"]["mean"] < 0 <= r["delta_joint"]["mean"] else "no"
        lines.append(f"| {r['point']} | {r['phase_steps']} | {r['lr']:.2g} | {r['lr_x_steps']:.2f} | {r['gain']} | "
                     f"{cell(r['delta_joint'])} | {cell(r['delta_grow'])} | {cell(r['interaction'])} | {reversal} |")
    lines += ["", "![regime](regime.png)"]
    return lines
