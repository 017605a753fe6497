"""The paper's experiments reported, by one renderer for live and shipped numbers alike: `section`, from per-seed
numbers; the results pages print it from references/<scale>.json (page_section), report_experiment from finished
runs into results/<scale>/<experiment>.md and .json, with what only live runs have (the figures).

    paper_reports.report_experiment(ws, "table1", [42, 43, 44])
    paper_reports.section("table1", {"pre_joint": [4.01, 3.99, None], ...}, [42, 43, 44], final_ce, scale="toy")
"""

import math
from pathlib import Path

from rich.text import Text

import rundir
from experiments import page_figures, report
from experiments.readings import POST_HOC, declared_p, diverged_line, read, seeds_of, sentence, stats
from experiments.suite import Workspace, console
from experiments.tables import TABLES, PaperTable


def section(name: str, numbers: dict[str, list], seeds: list[int], final_ce: dict[str, list], scale: str) -> list[str]:
    """An experiment's section, below its heading, from {key: [value per seed]} and {run: [final CE per seed]} as a
    reference ships them: its table, the rows the numbers lack, the paper's claims and the declared readings."""
    exp, st, full = TABLES[name], {key: stats(values) for key, values in numbers.items()}, scale == "full"
    rows = [r for r in exp.rows if r.key in st]
    lines = [f"{exp.about}.", "", diverged_line(final_ce, seeds, "runs this table reads"), ""]
    if exp.layout and len(rows) == len(exp.rows):
        lines += exp.layout(st, len(seeds))
    lines += report.table_markdown(rows, st, len(seeds), full)
    if absent := [r.label for r in exp.rows if r.key not in st]:
        lines += ["", f"Not in this reference (shipped before the report had them): {'; '.join(absent)}."]
    if exp.claims:
        lines += ["", "The paper's claims, checked on the kit's means (a check of direction with no interval; the "
                      "readings are the tests):", ""]
        lines += [f"- {verdict}: {claim}" for claim, verdict in claim_verdicts(exp, st)]
    labels = {r.key: r.label for r in exp.rows}
    if declared := [key for key in exp.readings if key in st]:
        notes = {declared[0]: " (the primary endpoint)"} if name == "table1" else {}
        notes |= {key: " (post hoc)" for key in POST_HOC.get(name, ())}
        p_holm = declared_p(scale, name, st)
        lines += ["", "Readings:", ""] + [
            f"- {sentence(labels[key] + notes.get(key, ''), st[key], p_holm.get(key), len(p_holm))}" for key in declared]
    return lines + ([""] + [exp.note] if exp.note else []) + [""]


def claim_verdicts(exp: PaperTable, st: dict) -> list[tuple[str, str]]:
    """(the paper's claim, its verdict on the kit's means): "agrees", "DISAGREES", or none where a mean it reads is
    null or missing."""
    verdicts = []
    for claim, agrees in exp.claims:
        try:  # a null mean is left out, so a claim that reads it stops there, as at a number the reference lacks
            verdict = "agrees" if agrees({k: s["mean"] for k, s in st.items() if not math.isnan(s["mean"])}) else "DISAGREES"
        except KeyError as e:
            verdict = "no verdict (a mean it reads is null)" if e.args[0] in st else \
                "not checkable (this reference lacks its numbers)"
        verdicts.append((claim, verdict))
    return verdicts


def report_experiment(ws: Workspace, name: str, seeds: list[int]) -> dict:
    exp, full = TABLES[name], ws.preset.name == "full"  # the terminal table's columns
    out = {"experiment": name, "about": exp.about, "scale": ws.preset.name, "seeds": seeds, "note": exp.note,
           "git_commit": rundir.git_commit(),
           "runs_config_sha256": report.configs_hash([ws.run_dir(r, s) for s in seeds for r in exp.runs]),
           "diverged_runs": report.diverged_runs(ws, exp.runs, seeds), "numbers": {}}  # none for a figure of one seed
    # The numbers as the reference will ship them (null: diverged, n/a, never), so the section reads as on the page.
    final_ce = {run.name: report.finite([report.final_ce(ws, run, s) for s in seeds]) for run in exp.runs}
    md = [f"# {name} ({ws.preset.name} scale)", ""]
    if exp.numbers:
        per_seed = [exp.numbers(ws, s) for s in seeds]
        numbers = {key: report.finite([p[key] for p in per_seed]) for key in per_seed[0]}  # a deeper student has more
        st = {key: stats(values) for key, values in numbers.items()}
        rows, declared = [r for r in exp.rows if r.key in st], [key for key in exp.readings if key in st]
        out["rows"] = [{"label": r.label, "key": r.key, "paper": r.paper, **st[r.key]} for r in rows]
        out["numbers"] = {r.key: numbers[r.key] for r in rows}  # what `reference` ships, by the rows' keys
        out["claims"] = [{"claim": claim, "agrees": {"agrees": True, "DISAGREES": False}.get(verdict)}
                         for claim, verdict in claim_verdicts(exp, st)]
        p_holm = declared_p(ws.preset.name, name, st)
        out["readings"] = {key: read(st[key], p_holm.get(key)) for key in declared}
        out["smallest_tie_margins"] = {key: report.smallest_tie_margin(st[key]) for key in declared}
        md += section(name, numbers, seeds, final_ce, ws.preset.name)
        console.print(report.terminal_table(f"{name}: {exp.about}", rows, st, len(seeds), full))
    else:
        md += [f"{exp.about}.", "", diverged_line(final_ce, seeds, "runs this figure draws"), ""]
    if exp.figures and any(ce[0] is None for ce in final_ce.values()):
        md += [f"No figures: a run they draw diverged on seed {seeds[0]}."]
    elif exp.figures:
        figs = exp.figures(ws, seeds[0], caption=f"normgrow, {ws.preset.name} scale, seed {seeds[0]} ({name})")
        out["figures"] = {k: str(v) for k, v in figs.items() if isinstance(v, Path)}
        out["data"] = {k: v for k, v in figs.items() if not isinstance(v, Path)}
        md += [f"![{k}]({Path(v).name})" for k, v in out["figures"].items()]
        md += ["", "The numbers plotted, beside the paper's:", ""] + report.figure_table(figs.get("table", []))
        md += ["", f"Figures show seed {seeds[0]}."] * (len(seeds) > 1)
        if ws.ctx.is_main:
            console.print(Text.assemble((name, "bold"), ": " + ", ".join(out["figures"].values())))
    return report.write(ws.results, name, out, md[:-1] if md[-1] == "" else md)


def with_phase_deltas(numbers: dict, curves: dict) -> dict:
    """Table 2 with Δ CE (post-grow − pre-grow) at every phase end from the grow runs' curves, where the reference
    predates those rows: the evaluations tables.table2_numbers reads."""
    if "delta_ce_phase_0" in numbers or not {"pre-grow", "post-grow"} <= set(curves):
        return numbers
    pre, post = curves["pre-grow"], curves["post-grow"]
    minus = lambda a, b: [None if x is None or y is None else x - y for x, y in zip(a, b)]
    ends = page_figures.phase_points(pre)[1]
    out = dict(numbers) | {f"delta_ce_phase_{p}": minus(post[e], pre[e]) for p, e in enumerate(ends)}
    out["delta_ce_last_minus_phase_0"] = minus(out[f"delta_ce_phase_{len(ends) - 1}"], out["delta_ce_phase_0"])
    return out


def page_section(name: str, reference: dict, scale: str) -> list[str]:
    """A paper experiment's section from the reference's per-seed numbers, by the renderer the live report uses."""
    if not (numbers := reference["tables"][name]):
        return [f"## {name}", "", f"{TABLES[name].about}.", "",
                "A figure of one seed: the reference holds no per-seed numbers for it.", ""]
    if name == "table2":
        numbers = with_phase_deltas(numbers, reference["curves"])
    final_ce = {run.name: reference["final_ce"][run.name] for run in TABLES[name].runs
                if run.name in reference["final_ce"]}
    return [f"## {name}", ""] + section(name, numbers, seeds_of(reference, name), final_ce, scale)
