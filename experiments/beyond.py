"""Beyond the paper: the experiments it names but did not run.

    python repro.py intervention --scale toy   # forward-only boundary interventions (Appendix B.1's open question)
    python repro.py placements --scale toy     # joint and grow for more norm placements, Δ against pre-norm
    python repro.py scratch --scale toy        # pre/post x joint/grow with no teacher at all

The intervention answers Appendix B.1's call for "an intervention that changes the forward boundary distribution
without changing backward updates" (docs/method.md); placements add model.PLACEMENTS and the schedule pre,post,post;
scratch is Table 1's 2 x 2 in plain pretraining, no teacher. Each writes results/<scale>/<experiment>.md and .json.
"""

from dataclasses import asdict, replace

import paper
import rundir
from experiments import figures, presets, readings, report, suite, tables, training, variants
from experiments.readings import by_row, ce_values, diverged_line, holm_family, p_text, read, reading_cell, sentence, stats
from experiments.suite import RunName
from experiments.tables import POST_GROW, PRE_GROW
from experiments.variants import Variant
from plumbing import corpora

PLACEMENT_RUNS = ("pre", "post", "sandwich", "peri", "hybrid", "deepnorm", "pre,post,post")
PRE_FREEZE, POST_FREEZE = RunName("pre", "freeze"), RunName("post", "freeze")
INTERVENTIONS = (
    Variant("pre-grow (suite)", PRE_GROW),
    Variant("post-grow (suite)", POST_GROW),
    Variant("pre-grow + boundary-norm", PRE_GROW, "boundary-norm", {"run": {"boundary": "norm"}}),
    # Unit RMS: what a post-norm boundary norm emits at its initial gain of 1.
    Variant("pre-grow + boundary-rescale-fwd", PRE_GROW, "boundary-rescale-fwd",
            {"run": {"boundary": "rescale-fwd", "boundary_scale": 1.0}}),
    Variant("post-grow + boundary-mirror-fwd", POST_GROW, "boundary-mirror-fwd", {"run": {"boundary": "mirror-fwd"}}),
    # The same forward as rescale-fwd, other backwards: only the backward channel to the prefix varies.
    Variant("pre-grow + boundary-rescale-detached", PRE_GROW, "boundary-rescale-detached",
            {"run": {"boundary": "rescale-detached", "boundary_scale": 1.0}}),
    Variant("pre-grow + boundary-rescale-full", PRE_GROW, "boundary-rescale-full",
            {"run": {"boundary": "rescale-full", "boundary_scale": 1.0}}),
    # A synthetic dose at the input of appended post-norm blocks: do heavy tails alone cost what pre-norm does?
    Variant("post-grow + dose-boundary 37x", POST_GROW, "dose-boundary-37",
            {"run": {"boundary": "dose-boundary", "boundary_scale": 37.0}}),
    Variant("post-grow + dose-channel 1000x", POST_GROW, "dose-channel-1000",
            {"run": {"boundary": "dose-channel", "boundary_scale": 1000.0}}),
    # Under freeze no gradient reaches the prefix: only the forward boundary the appended block reads differs.
    Variant("pre-freeze (suite)", PRE_FREEZE),
    Variant("pre-freeze + boundary-rescale-fwd", PRE_FREEZE, "freeze-boundary-rescale-fwd",
            {"run": {"boundary": "rescale-fwd", "boundary_scale": 1.0}}),
)


def interventions(blocks: int) -> tuple[Variant, ...]:
    """INTERVENTIONS and the transplant factorial under freeze: grow's frozen phase-0 block of one placement under
    appended blocks of the other (the diagonal is the suite's pre-freeze and post-freeze)."""
    def transplant(prefix: str, appended: str) -> RunName:
        return RunName(",".join([prefix] + [appended] * (blocks - 1)), "freeze")
    return INTERVENTIONS + (
        Variant("post-freeze (suite)", POST_FREEZE),
        Variant("transplant: pre-norm prefix, post-norm appended", transplant("pre", "post"), "transplant-pre-post"),
        Variant("transplant: post-norm prefix, pre-norm appended", transplant("post", "pre"), "transplant-post-pre"))


# The boundary after block 0 as the monitor read it, in the intervention and planted reports

def internal_boundary_range(ws: suite.Workspace, variant: Variant, seeds: list[int]) -> dict:
    """{"mean": [lo, hi], "kurtosis": [lo, hi]} of the boundary after block 0 once block 1 reads it, all seeds."""
    rows = [r["boundaries"][1] for s in seeds for r in rundir.monitor_series(variants.variant_dir(ws, variant, s))
            if r["step"] > ws.preset.run["phase_steps"]]
    return {key: [min(r[key] for r in rows), max(r[key] for r in rows)] for key in ("mean", "kurtosis")} if rows else {}


def range_cell(ranges: dict) -> str:
    if not ranges:
        return "n/a"
    return f"{ranges['mean'][0]:.2f}–{ranges['mean'][1]:.2f}, {ranges['kurtosis'][0]:.1f}–{ranges['kurtosis'][1]:.1f}"


# (label, minuend, subtrahend) over INTERVENTIONS' and the transplants' labels: what each contrast isolates.
SEPARATIONS = (
    ("forward only: a unit-RMS boundary under freeze", "pre-freeze + boundary-rescale-fwd", "pre-freeze (suite)"),
    ("forward only: post-norm appended blocks on a frozen pre-norm prefix",
     "transplant: pre-norm prefix, post-norm appended", "pre-freeze (suite)"),
    ("forward only: post-norm appended blocks on a frozen post-norm prefix",
     "post-freeze (suite)", "transplant: post-norm prefix, pre-norm appended"),
    ("forward only: a post-norm prefix under post-norm appended blocks",
     "post-freeze (suite)", "transplant: pre-norm prefix, post-norm appended"),
    ("forward only: a post-norm prefix under pre-norm appended blocks",
     "transplant: post-norm prefix, pre-norm appended", "pre-freeze (suite)"),
    ("backward channel: straight-through − detached statistics",
     "pre-grow + boundary-rescale-fwd", "pre-grow + boundary-rescale-detached"),
    ("backward channel: full Jacobian − detached statistics",
     "pre-grow + boundary-rescale-full", "pre-grow + boundary-rescale-detached"),
    ("dose: the boundary token at 37x on post-grow", "post-grow + dose-boundary 37x", "post-grow (suite)"),
    ("dose: one channel at 1000x on post-grow", "post-grow + dose-channel 1000x", "post-grow (suite)"),
)
# Does post-norm's gain over pre-norm in the appended blocks depend on the prefix's placement? (post − pre appended
# on a pre-norm prefix) − (the same on a post-norm prefix); the account predicts < 0. Every transplant cell also
# switches the head's interface (final norm or none), so the appended-placement effect includes that change.
TRANSPLANT_INTERACTION = (
    "transplant interaction: prefix × appended placement",
    ((1, "transplant: pre-norm prefix, post-norm appended"), (-1, "pre-freeze (suite)"),
     (-1, "post-freeze (suite)"), (1, "transplant: post-norm prefix, pre-norm appended")))


def intervention_contrasts(ce: dict) -> list[dict]:
    """SEPARATIONS and the transplant interaction over {variant label: [CE per seed]}, as one Holm family."""
    family = [(label, ((1, minuend), (-1, subtrahend))) for label, minuend, subtrahend in SEPARATIONS]
    family.append(TRANSPLANT_INTERACTION)
    rows = []
    for label, terms in family:
        per_seed = [sum(sign * ce[name][i] for sign, name in terms) for i in range(len(ce[terms[0][1]]))]
        row = {"contrast": label, "terms": [list(t) for t in terms], "delta": report.across_seeds(per_seed)}
        if len(terms) == 2:
            row |= {"minuend": terms[0][1], "subtrahend": terms[1][1]}
        rows.append(row | {"p": report.p_two_sided(row["delta"])})
    variants.holm_readings(rows, "delta")
    return rows


def contrast_runs(row: dict) -> str:
    """A contrast's runs as a signed sum: "a − b", "a − b − c + d"."""
    return " ".join(f"{'+' if sign > 0 else '−'} {name}" for sign, name in row["terms"]).removeprefix("+ ")


def run_intervention(ws: suite.Workspace, seeds: list[int], force: bool = False) -> dict:
    """The interventions trained; validation CE against pre-grow and post-grow (results/<scale>/intervention.*)."""
    design = interventions(ws.preset.run["blocks"])
    variants.train_variants(ws, design, seeds, force)
    if not ws.ctx.is_main:
        return {}
    ce, diverged = variants.variant_outcomes(ws, design, seeds)
    suite_ce = {v.run: ce[v.label] for v in design if not v.folder}
    rows = [{"variant": v.label, "run": v.run.name, "folder": str(variants.variant_dir(ws, v, seeds[0])),
             "settings": v.settings, "ce": report.across_seeds(ce[v.label]),
             "minus_pre_grow": report.paired(ce[v.label], suite_ce[PRE_GROW]),
             "minus_post_grow": report.paired(ce[v.label], suite_ce[POST_GROW]),
             # the suite's same run; for a transplant, the freeze run of its prefix's placement
             "minus_suite_run": report.paired(ce[v.label],
                                              suite_ce[RunName(variants.block0_placement(v.run), v.run.protocol)]),
             "after_block_0": internal_boundary_range(ws, v, seeds)}
            for v in design]
    separations = intervention_contrasts(ce)
    figure = figures.fig_monitor({v.label: rundir.monitor_series(variants.variant_dir(ws, v, seeds[0])) for v in design},
                                 ws.results / "intervention.png",
                                 f"boundary monitor, grow runs, {ws.preset.name} scale, seed {seeds[0]}",
                                 caption=f"{ws.preset.name} scale, seed {seeds[0]}, intervention")
    out = {"experiment": "intervention", "scale": ws.preset.name, "seeds": seeds, "rows": rows,
           "diverged_runs": diverged, "separations": separations, "tie_margin": presets.TIE_MARGIN, "figure": str(figure),
           "about": __doc__.split("\n\n")[1],
           "numbers": report.row_numbers({r["variant"]: r for r in rows} | {c["contrast"]: c for c in separations})}
    lines = [f"# Boundary interventions ({ws.preset.name} scale)", "",
             f"Validation CE at the end of each run, {report.seeds_text(seeds)}; differences paired by seed.", "",
             report.diverged_line(diverged, len(design) * len(seeds)), "",
             *intervention_lines(out["numbers"], seeds),
             "How the contrasts read, as declared before these runs (README, \"Boundary interventions\"): under freeze "
             "no gradient reaches the prefix, so the freeze and transplant contrasts are forward effects alone; "
             "rescale-fwd, -detached and -full share one forward, so their differences are the backward channel alone; "
             "rescale-fwd is forward-only but not boundary-only (rescaling the stream reweights block 0's output "
             "against the embedding for every later block). A transplant also switches the head's interface (final "
             "norm or none), so its contrasts carry that change too.", "",
             "After block 0, the smallest and largest value over the boundary monitor's rows once block 1 exists "
             "(phases 1 and 2), all seeds; \"n/a\" for runs trained without the monitor (live runs only):", "",
             "| variant | after block 0: mean RMS, kurtosis |", "| --- | --- |"]
    lines += [f"| {r['variant']} | {range_cell(r['after_block_0'])} |" for r in rows]
    lines += ["", "![boundary monitor](intervention.png)"]
    return report.write(ws.results, "intervention", out, lines, echo=True)


def intervention_lines(numbers: dict, seeds: list[int]) -> list[str]:
    """The intervention report's one renderer, for its live and its shipped numbers ({"<row>: <quantity>": values})."""
    rows, ce = by_row(numbers), ce_values(numbers)
    contrasts = intervention_contrasts(ce)
    lines = ["## intervention", "", "Boundary interventions: validation CE per variant and differences paired by "
             "seed (a transplant against the suite's freeze run of its prefix's placement). The paper ran none of "
             "these; Appendix B.1 asks for them.", "",
             diverged_line({row: q["ce"] for row, q in rows.items() if "ce" in q}, seeds, "runs"), "",
             "| variant | validation CE | − the suite's same run | − pre-grow | − post-grow |",
             "| --- | --- | --- | --- | --- |"]
    for row, q in rows.items():
        if "ce" in q:
            cells = [report.stats_cell(stats(q["ce"]))] + [report.stats_cell(stats(q[k]), True) for k in
                                                            ("minus_suite_run", "minus_pre_grow", "minus_post_grow")]
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines += ["", f"What separates what: one family of {len(contrasts)} contrasts, Holm-adjusted "
              "(beyond.intervention_contrasts).", "", "| contrast | runs | Δ CE | p (Holm) | reading |",
              "| --- | --- | --- | --- | --- |"]
    lines += [f"| {c['contrast']} | {contrast_runs(c)} | {report.stats_cell(c['delta'], True)} | "
              f"{p_text(c['p_holm'])} | {reading_cell(c['delta'], c['p_holm'])} |" for c in contrasts]
    lines += ["", "Readings:", ""]
    post_hoc = lambda c: " (post hoc)" if c["contrast"] in readings.POST_HOC["intervention"] else ""
    lines += [f"- {sentence(c['contrast'] + post_hoc(c), c['delta'], c['p_holm'], len(contrasts))}" for c in contrasts]
    return lines + [""]


# planted: the mechanism put in by hand, in both placements (docs/preregistrations.md, 2026-12-02)

DOSES = (("dose-boundary", 37.0, "dose-boundary-37", "the boundary token at 37x"),
         ("dose-channel", 1000.0, "dose-channel-1000", "one channel at 1000x"))


def planted_variants() -> tuple[Variant, ...]:
    """Placement (pre, post) x planted outlier (none, each of DOSES), grow; the dosed post-grow runs are the
    intervention's."""
    dosed = tuple(Variant(f"{p}-grow + {label}", RunName(p, "grow"), folder,
                          {"run": {"boundary": kind, "boundary_scale": ratio}})
                  for kind, ratio, folder, label in DOSES for p in tables.NORMS)
    return (Variant("pre-grow (suite)", PRE_GROW), Variant("post-grow (suite)", POST_GROW)) + dosed


def planted_interactions(ce: dict) -> list[dict]:
    """Per dose d, I_d = (pre_d - pre_none) - (post_d - post_none) paired by seed, Holm over the doses."""
    interaction = lambda label: report.across_seeds([(pd - pn) - (qd - qn) for pd, pn, qd, qn in zip(
        ce[f"pre-grow + {label}"], ce["pre-grow (suite)"], ce[f"post-grow + {label}"], ce["post-grow (suite)"])])
    rows = [{"dose": label, "interaction": interaction(label)} for *_, label in DOSES]
    variants.holm_readings(rows, "interaction")
    return rows


def run_planted(ws: suite.Workspace, seeds: list[int], force: bool = False) -> dict:
    """The planted 2 x 3 trained; the dose x placement interaction by its pre-registered rule (results/<scale>/planted.*)."""
    design = planted_variants()
    variants.train_variants(ws, design, seeds, force)
    if not ws.ctx.is_main:
        return {}
    ce, diverged = variants.variant_outcomes(ws, design, seeds)
    rows = [{"variant": v.label, "run": v.run.name, "settings": v.settings, "ce": report.across_seeds(ce[v.label]),
             "minus_undosed": report.paired(ce[v.label], ce[f"{v.run.name} (suite)"]),
             "after_block_0": internal_boundary_range(ws, v, seeds)}
            for v in design]
    delta_grow = {"none": report.paired(ce["post-grow (suite)"], ce["pre-grow (suite)"])}
    delta_grow.update({label: report.paired(ce[f"post-grow + {label}"], ce[f"pre-grow + {label}"]) for *_, label in DOSES})
    interactions = planted_interactions(ce)
    out = {"experiment": "planted", "scale": ws.preset.name, "seeds": seeds, "rows": rows, "delta_grow": delta_grow,
           "interactions": interactions, "diverged_runs": diverged, "tie_margin": presets.TIE_MARGIN,
           "precision": ws.preset.run.get("precision", ""),
           # Δgrow is one row of the doses: "delta_grow: <dose>"
           "numbers": report.row_numbers({r["variant"]: r for r in rows} | {r["dose"]: r for r in interactions}
                                         | {"delta_grow": delta_grow})}
    lines = [f"# The planted mechanism: placement x boundary outlier under growth ({ws.preset.name} scale)", "",
             f"Validation CE at the end of each grow run, {report.seeds_text(seeds)}; differences paired by seed. "
             "The outlier is added at the input of every appended block (phases 1-2) as a constant, so the "
             "backward form is unchanged (docs/preregistrations.md, 2026-12-02).", "",
             report.diverged_line(diverged, len(design) * len(seeds)), "",
             *planted_lines(out["numbers"], seeds),
             "After block 0, as the monitor read the boundary once block 1 reads it (mean RMS, kurtosis; live runs only):",
             "", "| run | after block 0 |", "| --- | --- |"]
    lines += [f"| {r['variant']} | {range_cell(r['after_block_0'])} |" for r in rows]
    return report.write(ws.results, "planted", out, lines, echo=True)


def planted_lines(numbers: dict, seeds: list[int]) -> list[str]:
    """The planted report's one renderer, for its live and its shipped numbers ({"<row>: <quantity>": values})."""
    rows, ce = by_row(numbers), ce_values(numbers)
    interactions = planted_interactions(ce)
    lines = ["## planted", "", "Placement (pre, post) × a planted boundary outlier under growth; the primary "
             "endpoint is each dose's interaction I = (pre dosed − pre) − (post dosed − post), which the paper's "
             "account predicts above 0; one family over the doses, Holm-adjusted. The paper ran none of these.", "",
             diverged_line({row: q["ce"] for row, q in rows.items() if "ce" in q}, seeds, "runs"), "",
             "| run | validation CE | − the same run undosed | its reading (post hoc, alone) |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {row} | {report.stats_cell(stats(q['ce']))} | {report.stats_cell(stats(q['minus_undosed']), True)} | "
              f"{'' if row.endswith('(suite)') else reading_cell(stats(q['minus_undosed']))} |"
              for row, q in rows.items() if "ce" in q and "minus_undosed" in q]
    lines += ["", "| outlier | Δgrow = post − pre |", "| --- | --- |"]
    lines += [f"| {dose} | {report.stats_cell(stats(v), True)} |" for dose, v in rows.get("delta_grow", {}).items()]
    lines += ["", f"The paper's Δgrow: {paper.DELTAS['delta_grow']:+.4f}.", "", "| outlier | I | p (Holm) | reading |",
              "| --- | --- | --- | --- |"]
    lines += [f"| {r['dose']} | {report.stats_cell(r['interaction'], True)} | {p_text(r['p_holm'])} | "
              f"{reading_cell(r['interaction'], r['p_holm'])} |" for r in interactions]
    lines += ["", "Readings (the primary endpoint):", ""]
    lines += [f"- {sentence('I, ' + r['dose'], r['interaction'], r['p_holm'], len(interactions))}" for r in interactions]
    return lines + ["", "Each I is pre-norm's dose effect minus post-norm's; each effect read alone by the rule (post hoc, "
                        "no family):", ""] + [f"- {dose_parts(rows, r)}" for r in interactions] + [""]


def dose_parts(rows: dict, interaction: dict) -> str:
    """One dose's I beside its two parts, each placement's dosed − undosed read alone (planted_lines' rows)."""
    effect = {norm: stats(rows[f"{norm}-grow + {interaction['dose']}"]["minus_undosed"]) for norm in tables.NORMS}
    parts = "; ".join(f"{norm}-norm's {report.stats_cell(s, True)} reads {read(s)}" for norm, s in effect.items())
    return f"{interaction['dose']}: I reads {interaction['reading']}; {parts}"


def placement_runs() -> list[RunName]:
    return [RunName(p, protocol) for p in PLACEMENT_RUNS for protocol in ("joint", "grow")]


def run_placements(ws: suite.Workspace, seeds: list[int], force: bool = False) -> dict:
    """Joint and grow for every placement, with Δ against pre-norm (results/<scale>/placements.md/.json/.png)."""
    runs = placement_runs()
    training.ensure_runs(ws, runs, seeds, force)
    if not ws.ctx.is_main:
        return {}
    diverged = report.diverged_runs(ws, runs, seeds)
    ce = {run: [report.final_ce(ws, run, s) for s in seeds] for run in runs}
    rows = []
    for p in PLACEMENT_RUNS:
        joint, grown = ce[RunName(p, "joint")], ce[RunName(p, "grow")]
        rows.append({"placement": p, "joint": report.across_seeds(joint), "grow": report.across_seeds(grown),
                     "delta_joint": report.paired(joint, ce[RunName("pre", "joint")]),
                     "delta_grow": report.paired(grown, ce[PRE_GROW]),
                     "grow_minus_joint": report.across_seeds([g - j for g, j in zip(grown, joint)])})
    # Holm over every placement-vs-pre comparison of the table (both protocols)
    family = [r[key] for r in rows if r["placement"] != "pre" for key in ("delta_joint", "delta_grow")]
    for delta, p_holm in zip(family, report.holm([report.p_two_sided(d) for d in family])):
        delta |= {"p_holm": p_holm, "reading": report.reading(delta, presets.TIE_MARGIN, p_holm),
                  "smallest_tie_margin": report.smallest_tie_margin(delta)}
    grown = [RunName(p, "grow") for p in PLACEMENT_RUNS]
    figure = figures.fig_monitor({run.name: rundir.monitor_series(ws.run_dir(run, seeds[0])) for run in grown},
                                 ws.results / "placements.png",
                                 f"boundary monitor, grow runs, {ws.preset.name} scale, seed {seeds[0]}",
                                 caption=f"{ws.preset.name} scale, seed {seeds[0]}, placements")
    out = {"experiment": "placements", "scale": ws.preset.name, "seeds": seeds, "rows": rows,
           "diverged_runs": diverged, "figure": str(figure),
           "about": __doc__.split("\n\n")[1], "numbers": report.row_numbers({r["placement"]: r for r in rows})}
    lines = [f"# Norm placements under joint training and growth ({ws.preset.name} scale)", "",
             f"Validation CE, {report.seeds_text(seeds)}.", "", report.diverged_line(diverged, len(runs) * len(seeds)), "",
             *placements_lines(out["numbers"], seeds)]
    lines += ["", "![boundary monitor](placements.png)"]
    return report.write(ws.results, "placements", out, lines, echo=True)


def placement_family(numbers: dict) -> tuple[dict, dict]:
    """({(placement, quantity): stats}, {(placement, Δ): Holm-adjusted p}): the family is every Δ against pre-norm."""
    st = {(p, q): stats(v) for p, quantities in by_row(numbers).items() for q, v in quantities.items()}
    family = [(p, q) for p, q in st if p != "pre" and q in ("delta_joint", "delta_grow")]
    return st, dict(zip(family, holm_family([st[m] for m in family])))


def placements_lines(numbers: dict, seeds: list[int], caveat: str = "") -> list[str]:
    """The placements report's one renderer, for its live and its shipped numbers; `caveat`: the page's on steps."""
    rows = by_row(numbers)
    st, p_holm = placement_family(numbers)
    family = list(p_holm)
    lines = ["## placements", "", "Joint and grow for every placement, Δ = the placement's CE − pre-norm's under "
             "the same protocol, paired by seed (negative: better than pre-norm). The paper ran pre and post only: "
             f"joint {paper.PAPER['table1']['pre']['joint']:.4f} / {paper.PAPER['table1']['post']['joint']:.4f}, grow "
             f"{paper.PAPER['table1']['pre']['grow']:.4f} / {paper.PAPER['table1']['post']['grow']:.4f} (Table 1).", "",
             diverged_line({f"{p}-{q}": v for p, quantities in rows.items() for q, v in quantities.items()
                            if q in ("joint", "grow")}, seeds, "runs"), "",
             "| placement | joint | grow | Δ joint vs pre | p (Holm) | reading | Δ grow vs pre | p (Holm) | reading "
             "| grow − joint |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in rows:
        cells = [report.stats_cell(st[p, "joint"]), report.stats_cell(st[p, "grow"])]
        for q in ("delta_joint", "delta_grow"):
            cells += [report.stats_cell(st[p, q], True)] + ([p_text(p_holm[p, q]), reading_cell(st[p, q], p_holm[p, q])]
                                                           if (p, q) in p_holm else ["", ""])
        lines.append(f"| {p} | " + " | ".join(cells + [report.stats_cell(st[p, "grow_minus_joint"], True)]) + " |")
    lines += ["", f"The family: the {len(family)} comparisons with pre-norm, Holm-adjusted. grow − joint is read by its "
              f"own 95% interval, as declared.{caveat}", "", "Readings:", ""]
    names = {"delta_joint": "Δjoint vs pre", "delta_grow": "Δgrow vs pre"}
    lines += [f"- {sentence(p + ': ' + names[q], st[p, q], p_holm[p, q], len(family))}" for p, q in family]
    lines += [f"- {sentence(p + ': grow − joint', st[p, 'grow_minus_joint'])}" for p in rows]
    return lines + [""]


def scratch_workspace(ws: suite.Workspace) -> suite.Workspace:
    """The scale with no teacher: plain CE, the student shaped as the teacher would be, with the data's vocabulary."""
    shape = {**asdict(presets.teacher_shape(ws.preset)), "vocab_size": corpora.vocabulary(ws.preset.data).n_vocab}
    run = {**ws.preset.run, "alpha": 0.0, "gamma": 1.0, "scratch_model": shape}
    return replace(ws, preset=replace(ws.preset, run=run), variant="scratch")


def run_scratch(ws: suite.Workspace, seeds: list[int], force: bool = False) -> dict:
    """Table 1's 2 x 2 without a teacher: plain CE, every weight from the seed (results/<scale>/scratch.md/.json)."""
    sws = scratch_workspace(ws)
    training.ensure_runs(sws, tables.MAIN_RUNS, seeds, force)
    if not ws.ctx.is_main:
        return {}
    per_seed = [tables.table1_numbers(sws, s) for s in seeds]
    numbers = {k: [p[k] for p in per_seed] for k in per_seed[0]}
    diverged = report.diverged_runs(sws, tables.MAIN_RUNS, seeds)
    cited = {k: paper.DELTAS[k] for k in ("delta_joint", "delta_grow", "interaction")}
    out = {"experiment": "scratch", "scale": ws.preset.name, "seeds": seeds, "numbers": report.finite(numbers),
           "stats": {k: report.across_seeds(values) for k, values in numbers.items()},
           "folder": str(sws.run_dir(tables.MAIN_RUNS[0], seeds[0]).parents[1]),  # its seeds' folders: beyond/scratch/
           "paper_with_teacher": cited, "diverged_runs": diverged, "about": __doc__.split("\n\n")[1]}
    lines = [f"# Growth from scratch ({ws.preset.name} scale): no teacher, plain CE", "",
             f"Validation CE, {report.seeds_text(seeds)}.", "",
             report.diverged_line(diverged, len(tables.MAIN_RUNS) * len(seeds)), "",
             *scratch_lines(out["numbers"], seeds)]
    return report.write(ws.results, "scratch", out, lines, echo=True)


def scratch_lines(numbers: dict, seeds: list[int]) -> list[str]:
    """The scratch report's one renderer, for its live and its shipped numbers, beside the paper's with its teacher."""
    rows = tables.TABLES["table1"].rows
    st = {key: stats(values) for key, values in numbers.items()}
    runs = {key: numbers[key] for key in ("pre_joint", "post_joint", "pre_grow", "post_grow") if key in numbers}
    return ["## scratch", "", "Table 1's 2 × 2 without a teacher (plain CE, every weight drawn from the seed). The "
            "paper's numbers beside it are with its teacher. No reading rule was declared for this experiment: its "
            "numbers are intervals only.", "", diverged_line(runs, seeds, "runs"), "",
            "| quantity | kit, from scratch | paper (with its teacher) |", "| --- | --- | --- |"] + \
        [f"| {r.label} | {report.stats_cell(st[r.key], r.key.startswith(('delta', 'interaction')))} | "
         f"{report.fmt(r.paper, r.digits)} |" for r in rows if r.key in st] + [""]
