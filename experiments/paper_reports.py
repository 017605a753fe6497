"""The paper's experiments reported: results/<scale>/<experiment>.md and .json from their finished runs (each
number's mean and 95% t-interval over seeds beside the paper's, the paper's claims on the kit's means, the declared
readings, the figures), and the same table on the terminal.

    paper_reports.report_experiment(ws, "table1", [42, 43, 44])
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import rundir
from experiments import report
from experiments.presets import TIE_MARGIN
from experiments.suite import console
from experiments.tables import EXPERIMENTS

if TYPE_CHECKING:
    from experiments.suite import Workspace


def report_experiment(ws: Workspace, name: str, seeds: list[int]) -> dict:
    exp = EXPERIMENTS[name]
    out = {"experiment": name, "about": exp.about, "scale": ws.preset.name, "seeds": seeds, "note": exp.note,
           "git_commit": rundir.git_commit(),
           "runs_config_sha256": report.configs_hash([ws.run_dir(r, s) for s in seeds for r in exp.runs])}
    md = [f"# {name} ({ws.preset.name} scale)", "", exp.about, ""]
    diverged = report.diverged_runs(ws, exp.runs, seeds)
    out["diverged_runs"] = diverged
    if diverged:
        md += [report.diverged_line(diverged, len(exp.runs) * len(seeds)), ""]
    if exp.numbers:
        per_seed = [exp.numbers(ws, s) for s in seeds]
        keys = dict.fromkeys([*per_seed[0], *(row.key for row in exp.rows)])  # a deeper student has more than the rows
        stats = {key: report.across_seeds([p[key] for p in per_seed]) for key in keys}
        out["rows"] = [{"label": r.label, "key": r.key, "paper": r.paper, **stats[r.key]} for r in exp.rows]
        full = ws.preset.name == "full"
        md += (exp.layout(stats, len(seeds)) if exp.layout else []) + \
            report.table_markdown(exp.rows, stats, len(seeds), full)
        means = {k: s["mean"] for k, s in stats.items()}
        out["claims"] = [{"claim": claim, "agrees": None if diverged else bool(agrees(means))}
                         for claim, agrees in exp.claims]
        verdict = lambda c: "no verdict (runs diverged)" if c["agrees"] is None else \
            "agrees" if c["agrees"] else "DISAGREES"
        md += ["", "The paper's claims, on the kit's means:", ""] * bool(exp.claims) + \
            [f"- {verdict(c)}: {c['claim']}" for c in out["claims"]]
        labels = {r.key: r.label for r in exp.rows}
        out["readings"] = {key: report.reading(stats[key], TIE_MARGIN) for key in exp.readings}
        out["smallest_tie_margins"] = {key: report.smallest_tie_margin(stats[key]) for key in exp.readings}
        md += ["", f"Read by the rule fixed before the results (95% interval; a tie if the 90% interval lies within "
                   f"±{TIE_MARGIN:g} nats, TOST), {report.seeds_text(seeds)}; in parentheses the smallest margin "
                   "these seeds could have called a tie within (|mean| + the 90% half-width):", ""] * bool(exp.readings) + \
            [f"- {labels[k]}{' (the primary endpoint)' * (name == 'table1' and i == 0)}: {r}"
             + (f" (±{out['smallest_tie_margins'][k]:.4f})" if math.isfinite(out["smallest_tie_margins"][k]) else "")
             for i, (k, r) in enumerate(out["readings"].items())]
        console.print(report.terminal_table(f"{name}: {exp.about}", exp.rows, stats, len(seeds), full))
    if exp.figures and any(line.startswith(f"{run.name} s{seeds[0]} ") for line in diverged for run in exp.runs):
        md += [f"No figures: a run they draw diverged on seed {seeds[0]}."]
    elif exp.figures:
        figs = exp.figures(ws, seeds[0], caption=f"normgrow, {ws.preset.name} scale, seed {seeds[0]} ({name})")
        out["figures"] = {k: str(v) for k, v in figs.items() if isinstance(v, Path)}
        out["data"] = {k: v for k, v in figs.items() if not isinstance(v, Path)}
        md += [""] + [f"![{k}]({Path(v).name})" for k, v in out["figures"].items()]
        md += ["", "The numbers plotted, beside the paper's:", ""] + report.figure_table(figs.get("table", []))
        if len(seeds) > 1:
            md += ["", f"Figures show seed {seeds[0]}."]
        if ws.ctx.is_main:
            console.print(f"[bold]{name}[/]: " + ", ".join(out["figures"].values()))
    if exp.note:
        md += ["", exp.note]
    return report.write(ws.results, name, out, md)
