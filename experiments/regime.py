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

import math
from dataclasses import dataclass

import data
import model
import paper
import rundir
from experiments import figures, report, suite, tables, training
from experiments.variants import Variant, variant_workspace
from plumbing import errors

GRIDS = {  # each axis's values; the preset's own value (1 or "ones") is the point they share
    "smoke": {"budget": (0.5, 1.0), "lr": (1.0, 2.0), "gain": ("ones", "teacher")},
    "toy": {"budget": (0.25, 0.5, 1.0, 2.0), "lr": (0.5, 1.0, 2.0), "gain": ("ones", "teacher")},
    "small": {"budget": (0.25, 0.5, 1.0), "lr": (0.5, 1.0, 2.0), "gain": ("ones", "teacher")},
    "full": {"budget": (1.0,), "lr": (1.0,), "gain": ("ones", "teacher")},
}
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
            raise errors.OptionError("--grid", f"{part!r}: write AXIS=V1,V2,... with AXIS one of {', '.join(AXES)}, "
                                     "e.g. \"budget=0.5,1,2;lr=1,2\"")
        items = [v.strip() for v in values.split(",") if v.strip()]
        if axis == "gain":
            bad = [v for v in items if v not in model.OUTPUT_GAINS]
            if bad:
                raise errors.OptionError("--grid", f"gain {bad[0]!r} is unknown; choose from "
                                         f"{', '.join(model.OUTPUT_GAINS)}")
        else:
            try:
                items = [float(v) for v in items]
            except ValueError:
                raise errors.OptionError("--grid", f"{part!r}: {axis} values must be numbers, e.g. {axis}=0.5,1,2") from None
            if any(not 0 < n <= 100 for n in items):
                raise errors.OptionError("--grid", f"{part!r}: {axis} multipliers must be in (0, 100]")
        grid[axis] = tuple(dict.fromkeys(items))
    return grid


def grid_points(grid: dict) -> list[Point]:
    """One axis at a time around the preset, the preset's point once."""
    points = [Point(budget=b) for b in grid["budget"]] + [Point(lr=m) for m in grid["lr"]] \
        + [Point(gain=g) for g in grid["gain"]]
    return sorted(dict.fromkeys(points), key=lambda p: (p.gain, p.lr, p.budget))


def point_variant(ws: suite.Workspace, point: Point) -> Variant:
    """One point's settings as a variant of the preset's four main runs, in regime/<point>/ (the preset's own: none)."""
    if point.is_preset:
        return Variant(f"--grid {point.name}")
    run = ws.preset.run
    steps = max(1, round(run["phase_steps"] * point.budget))
    warmup = max(1, round(run["warmup_frac"] * run["phase_steps"]))
    per_phase = {k: max(1, round(steps * run[k] / run["phase_steps"]))
                 for k in ("eval_interval", "checkpoint_interval")}
    changes = dict(phase_steps=steps, warmup_frac=min(1.0, warmup / steps), **per_phase, snapshot_interval=0,
                   lr=run["lr"] * point.lr, min_lr=run["min_lr"] * point.lr, post_output_gain=point.gain)
    return Variant(f"--grid {point.name}", folder=point.name, settings={"run": changes}, root="regime")


def point_workspace(ws: suite.Workspace, point: Point) -> suite.Workspace:
    """The preset with one point's settings, its students in their own folder."""
    return variant_workspace(ws, point_variant(ws, point), seed=0)  # a grid point reads no other run


def run_map(ws: suite.Workspace, grid: dict, seeds: list[int], force: bool = False) -> dict:
    teacher = suite.ensure_inputs(ws, force)
    available = len(data.Shard(ws.data_dir / "train", verify=False))
    points = grid_points(grid)
    for point in points:
        pws = point_workspace(ws, point)
        if pws.replay_docs > available:
            raise errors.UsageError(f"--grid budget={point.budget:g} needs a replay shard of {pws.replay_docs:,} "
                                   f"documents and {ws.data_dir / 'train'} holds {available:,}; use a smaller budget")
        shared = [r for r in tables.MAIN_RUNS if point.pre_runs_are_the_presets and r.norm == "pre"]
        if shared and not point.is_preset:
            training.ensure_runs(ws, shared, seeds, force, teacher=teacher)
        training.ensure_runs(pws, [r for r in tables.MAIN_RUNS if r not in shared or point.is_preset], seeds, force,
                          teacher=teacher)
    return write_map(ws, points, seeds) if ws.ctx.is_main else {}


def run_workspace(ws: suite.Workspace, point: Point, run: suite.RunName) -> suite.Workspace:
    """The workspace holding one of a point's runs: the preset's own for its pre-norm runs where the
    point shares them (Point.pre_runs_are_the_presets), else the point's."""
    return ws if run.norm == "pre" and point.pre_runs_are_the_presets else point_workspace(ws, point)


# The boundary after block 0 at the end of grow, per point: the dose the paper's account says sets
# Δgrow (a heavier-tailed pre-norm boundary, a larger post-norm advantage), read from the monitor.
BOUNDARY_NUMBERS = ("kurtosis", "boundary_over_others", "massive_ratio")


def end_boundary(ws: suite.Workspace, run: suite.RunName, seed: int) -> dict:
    """BOUNDARY_NUMBERS after block 0 in a run's last monitor row; NaN (n/a) for a run trained without
    the monitor, report.DIVERGED for one that diverged (a failed run's boundary is no dose)."""
    if rundir.final_eval(ws.run_dir(run, seed)).get("diverged"):
        return dict.fromkeys(BOUNDARY_NUMBERS, report.DIVERGED)
    monitor = rundir.monitor_series(ws.run_dir(run, seed))
    last = monitor[-1]["boundaries"][1] if monitor and len(monitor[-1]["boundaries"]) > 1 else {}
    return {k: float("nan") if last.get(k) is None else last[k] for k in BOUNDARY_NUMBERS}


def write_map(ws: suite.Workspace, points: list[Point], seeds: list[int]) -> dict:
    """results/<scale>/regime.json, .md and .png."""
    rows, diverged, run_dirs = [], [], set()
    for point in points:
        pws = point_workspace(ws, point)
        for run in tables.MAIN_RUNS:  # each run once: the preset's pre-norm runs serve several points
            owner = run_workspace(ws, point, run)
            fresh = [s for s in seeds if owner.run_dir(run, s) not in run_dirs]
            run_dirs.update(owner.run_dir(run, s) for s in fresh)
            diverged += [f"{point.name}: {d}" for d in report.diverged_runs(owner, [run], fresh)]
        # Table 1's numbers of the point, per seed, from the runs' done.json
        per_seed = [tables.with_deltas({f"{r.norm}_{r.protocol}": report.final_ce(run_workspace(ws, point, r), r, s)
                                        for r in tables.MAIN_RUNS}) for s in seeds]
        run = pws.preset.run
        row = {"point": point.name, "budget": point.budget, "lr_multiplier": point.lr, "gain": point.gain,
               "phase_steps": run["phase_steps"], "lr": run["lr"], "lr_x_steps": run["lr"] * run["phase_steps"],
               "folder": str(pws.students_dir)}
        row |= {key: report.across_seeds([p[key] for p in per_seed]) for key in per_seed[0]}
        for placement in ("pre", "post"):
            grown = suite.RunName(placement, "grow")
            ends = [end_boundary(run_workspace(ws, point, grown), grown, s) for s in seeds]
            for key in BOUNDARY_NUMBERS:
                row[f"{placement}_grow_{key}"] = report.across_seeds([e[key] for e in ends])
        rows.append(row)
    cited = {k: paper.DELTAS[k] for k in ("delta_joint", "delta_grow", "interaction")}
    out = {"experiment": "regime", "scale": ws.preset.name, "seeds": seeds, "paper": cited, "points": rows,
           "diverged_runs": diverged,
           "about": __doc__.split("\n\n")[1], "numbers": report.row_numbers({r["point"]: r for r in rows})}
    out["figure"] = str(figures.fig_regime(rows, cited, ws.results / "regime.png", ws.preset.name, seeds))
    lines = markdown(rows, cited, ws.preset.name, seeds, report.diverged_line(diverged, len(run_dirs)))
    suite.console.print("\n".join(lines), markup=False)
    return report.write(ws.results, "regime", out, lines)


def markdown(rows: list[dict], cited: dict, scale: str, seeds: list[int], diverged_line: str) -> list[str]:
    lines = [f"# Regime map ({scale} scale)", "",
             f"Validation CE differences, post − pre, {report.seeds_text(seeds)}. Paper (3 × 50k steps, LR 1e-4): Δjoint "
             f"{cited['delta_joint']:+.4f}, Δgrow {cited['delta_grow']:+.4f}, interaction {cited['interaction']:+.4f}.",
             "", diverged_line, "",
             "| point | steps/phase | peak LR | LR × steps | output gain | Δjoint | Δgrow | interaction | "
             "reversal (Δgrow < 0 ≤ Δjoint) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        diverged = r["delta_grow"].get("diverged") or r["delta_joint"].get("diverged")  # no reversal from a failed run
        reversal = "no: runs diverged" if diverged else "yes" if r["delta_grow"]["mean"] < 0 <= r["delta_joint"]["mean"] \
            else "no"
        lines.append(f"| {r['point']} | {r['phase_steps']} | {r['lr']:.2g} | {r['lr_x_steps']:.2f} | {r['gain']} | "
                     f"{report.stats_cell(r['delta_joint'], True)} | {report.stats_cell(r['delta_grow'], True)} | "
                     f"{report.stats_cell(r['interaction'], True)} | {reversal} |")
    lines += ["", "The boundary after block 0 at the end of grow (the boundary monitor's last row on its training "
              "batch): Pearson kurtosis of per-token RMS, the document-boundary token's RMS over the others', and "
              "max / median |activation| (n/a: runs trained before the monitor existed).", "",
              "| point | pre-grow kurtosis | pre-grow boundary/others | pre-grow max/median | post-grow kurtosis | "
              "post-grow boundary/others | post-grow max/median |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        cells = ["n/a" if not r[f"{p}_grow_{k}"].get("diverged") and not math.isfinite(r[f"{p}_grow_{k}"]["mean"])
                 else report.stats_cell(r[f"{p}_grow_{k}"]) for p in ("pre", "post") for k in BOUNDARY_NUMBERS]
        lines.append(f"| {r['point']} | " + " | ".join(cells) + " |")
    lines += ["", "![regime](regime.png)"]
    return lines
