"""The paper's seven proposed improvements (its summary; issue 33), each an option of the kit, measured
over seeds against the run it changes, by the rule pre-registered in docs/preregistrations.md (2026-12-02):

    python repro.py ideas --scale toy --seeds 42,43,44    # results/<scale>/ideas.md and .json

1 transition-aware LR (run.transition_schedule), 2 freeze-aware init (append_init), 3 block-importance
remedy (importance_remedy), 4 per-phase placement search (every {pre, post} schedule on a search seed, the
best run on the evaluation seeds), 5 boundary correction (boundary_correction), 6 structural-token norm
(structural_norm), 7 --norm auto. Ideas 1-4 read against the suite's own runs; 5-7 against the planted
outlier's. One primary contrast per idea; the seven form one family, Holm-adjusted.
"""

import itertools
import math
from dataclasses import dataclass

import rundir
from experiments import presets, readouts, report, studies, suite, tables, training
from experiments.readings import RULE, p_text
from experiments.suite import RunName
from experiments.variants import Variant, holm_readings, train_variants, variant_dir, variant_outcomes, variant_workspace

SEARCH_SEED = 41  # idea 4's search seed, outside the evaluation seeds (42, 43, 44)
DOSE = {"run": {"boundary": "dose-boundary", "boundary_scale": 37.0}}
CHANNEL = {"run": {"boundary": "dose-channel", "boundary_scale": 1000.0}}

PRE, POST = tables.PRE_GROW, tables.POST_GROW                              # the runs the options change
PRE_F, POST_F = RunName("pre", "freeze"), RunName("post", "freeze")
PRE_GROW, POST_GROW = Variant("pre-grow", PRE), Variant("post-grow", POST)  # and the suite's own, as variants
PRE_FREEZE, POST_FREEZE = Variant("pre-freeze", PRE_F), Variant("post-freeze", POST_F)
# The planted runs, in the planted experiment's folders (the same settings: the same runs).
PRE_DOSE = Variant("pre-grow + boundary 37x", PRE, "dose-boundary-37", DOSE)
POST_DOSE = Variant("post-grow + boundary 37x", POST, "dose-boundary-37", DOSE)
PRE_CHANNEL = Variant("pre-grow + channel 1000x", PRE, "dose-channel-1000", CHANNEL)
AUTO = RunName("auto", "grow")


@dataclass(frozen=True)
class Contrast:
    idea: int
    variant: Variant
    baseline: Variant
    primary: bool
    cost: str = ""  # what the option adds to a run, counted from its design


def fixed_contrasts() -> list[Contrast]:
    """Every contrast but idea 4's (whose variant is the search's choice), in the pre-registered order."""
    asym = {"run": {"transition_schedule": "asymmetric"}}
    matched, preserve = {"run": {"append_init": "matched"}}, {"run": {"append_init": "preserve-output"}}
    reinit, correct = {"run": {"importance_remedy": "reinit"}}, {"run": {"boundary_correction": "norm"}}
    structural = {"run": {"structural_norm": True}}
    forward = "one prefix forward over the step's batch at each transition"
    return [
        Contrast(1, Variant("post-grow + asymmetric LR", POST, "idea1-asymmetric", asym), POST_GROW, True, "none"),
        Contrast(1, Variant("pre-grow + asymmetric LR", PRE, "idea1-asymmetric", asym), PRE_GROW, False, "none"),
        Contrast(2, Variant("post-freeze + matched init", POST_F, "idea2-matched", matched), POST_FREEZE, True, forward),
        Contrast(2, Variant("pre-freeze + matched init", PRE_F, "idea2-matched", matched), PRE_FREEZE, False, forward),
        Contrast(2, Variant("post-grow + preserve-output", POST, "idea2-preserve-output", preserve), POST_GROW, False,
                 forward),
        Contrast(3, Variant("pre-grow + reinit", PRE, "idea3-reinit", reinit), PRE_GROW, True,
                 "p + 2 forwards over the step's batch at transition p (the prefix, and each block bypassed)"),
        Contrast(3, Variant("post-grow + reinit", POST, "idea3-reinit", reinit), POST_GROW, False,
                 "p + 2 forwards over the step's batch at transition p"),
        Contrast(5, Variant("pre-grow + boundary 37x + correction", PRE, "idea5-correction-dose-boundary-37",
                            presets.merged(DOSE, correct)), PRE_DOSE, True,
                 forward + "; one RMSNorm per boundary that fires"),
        Contrast(5, Variant("post-grow + boundary 37x + correction", POST, "idea5-correction-dose-boundary-37",
                            presets.merged(DOSE, correct)), POST_DOSE, False, forward),
        Contrast(5, Variant("pre-grow + channel 1000x + correction", PRE, "idea5-correction-dose-channel-1000",
                            presets.merged(CHANNEL, correct)), PRE_CHANNEL, False, forward),
        Contrast(6, Variant("pre-grow + boundary 37x + structural", PRE, "idea6-structural-dose-boundary-37",
                            presets.merged(DOSE, structural)), PRE_DOSE, True,
                 "one token's rescale at each appended block's input per forward; one scalar per appended block"),
        Contrast(6, Variant("pre-grow + structural", PRE, "idea6-structural", structural), PRE_GROW, False, "as above"),
        Contrast(6, Variant("pre-grow + channel 1000x + structural", PRE, "idea6-structural-dose-channel-1000",
                            presets.merged(CHANNEL, structural)), PRE_CHANNEL, False, "as above"),
        Contrast(7, Variant("auto-grow + boundary 37x", AUTO, "dose-boundary-37", DOSE), PRE_DOSE, True, forward),
        Contrast(7, Variant("auto-grow", AUTO), PRE_GROW, False, forward),
    ]


# Idea 4: the placement search

def schedules(blocks: int) -> list[str]:
    """Every {pre, post} schedule over the blocks, a uniform one under its plain name (pre-grow's "pre")."""
    return [names[0] if len(set(names)) == 1 else ",".join(names)
            for names in itertools.product(("pre", "post"), repeat=blocks)]


def search_runs(blocks: int) -> list[RunName]:
    return [RunName(s, "grow") for s in schedules(blocks)]


def search(ws: suite.Workspace, force: bool = False) -> tuple[RunName | None, dict]:
    """Grow with every schedule on SEARCH_SEED: (the chosen run, the search's report)."""
    runs = search_runs(ws.preset.run["blocks"])
    training.ensure_runs(ws, runs, [SEARCH_SEED], force)
    ce = {run: report.final_ce(ws, run, SEARCH_SEED) for run in runs}
    chosen = choose(ce)
    return chosen, {"seed": SEARCH_SEED, "ce": {run.name: value for run, value in ce.items()},
                    "chosen": chosen.name if chosen else None, "diverged": report.diverged_runs(ws, runs, [SEARCH_SEED])}


def contrast_of(variant: str, baseline: str) -> Contrast:
    """The contrast a report row names by its variant's and baseline's labels (idea 4's: the chosen schedule's)."""
    for c in fixed_contrasts():
        if (c.variant.label, c.baseline.label) == (variant, baseline):
            return c
    if variant.endswith(f" (chosen on seed {SEARCH_SEED})") and baseline in (POST_GROW.label, PRE_GROW.label):
        return Contrast(4, Variant(variant, POST), POST_GROW if baseline == POST_GROW.label else PRE_GROW,
                        baseline == POST_GROW.label)
    raise KeyError(f"ideas: {variant} against {baseline}")


def choose(ce: dict[RunName, float]) -> RunName | None:
    """The search's rule: the lowest final validation CE; a diverged run (not finite) is never chosen."""
    finite = {run: value for run, value in ce.items() if math.isfinite(value)}
    return min(finite, key=finite.get) if finite else None


def search_contrasts(chosen: RunName) -> list[Contrast]:
    found = Variant(f"{chosen.name} (chosen on seed {SEARCH_SEED})", chosen)
    cost = "8 grow runs on the search seed"
    return [Contrast(4, found, POST_GROW, True, cost), Contrast(4, found, PRE_GROW, False, cost)]


def transition_events(run_dir) -> list[dict]:
    """The transition rows a run logged (transitions.py): block, what fired, what was kept, re-drawn."""
    return [{k: r.get(k) for k in ("block", "fired", "keep", "reinitialized")}
            for r in rundir.read_metrics(run_dir) if r.get("event") == "transition"]


def transition_jump(ws: suite.Workspace, run: RunName, seed: int) -> float:
    """The mean over transitions of the CE at a phase's start minus the previous phase's end's; NaN if diverged."""
    try:
        start, end = readouts.phase_start_eval, readouts.phase_end_eval
        jumps = [start(ws, run, seed, p)["ce"] - end(ws, run, seed, p - 1)["ce"] for p in range(1, ws.preset.run["blocks"])]
        return sum(jumps) / len(jumps)
    except StopIteration:
        return math.nan


def last_block_removal(ws: suite.Workspace, run: RunName, seed: int) -> float:
    """ΔCE of bypassing the last block at the run's endpoint, on the diagnostic batch (Table 4's)."""
    if not math.isfinite(report.final_ce(ws, run, seed)):
        return report.DIVERGED
    return readouts.block_removal(ws, run, seed)[-1]["delta_ce"]


def events_text(per_seed: list[list[dict]]) -> str:
    """What the transitions did over the seeds, e.g. "block 1: fired 3/3, {'corrected': True} 3/3"."""
    parts = []
    for b in sorted({e["block"] for events in per_seed for e in events}):
        rows = [e for events in per_seed for e in events if e["block"] == b]
        fired = sum(bool(e["fired"]) for e in rows)
        kept = sorted({str(e["keep"]) for e in rows if e["keep"]})
        redrawn = sum(bool(e.get("reinitialized")) for e in rows)
        parts.append(f"block {b}: fired {fired}/{len(rows)}" + (f", kept {' / '.join(kept)}" if kept else "")
                     + (f", re-drawn blocks on {redrawn}/{len(rows)}" if redrawn else ""))
    return "; ".join(parts) or "no transition rows"


def remedy_firings(runs: list[tuple[list[dict], float]]) -> dict:
    """Where idea 3's remedy could have acted, from each run's (logged rows, identity_threshold): the transitions
    that measured removal costs, those where one fell below the threshold, those that re-drew a block, the lowest."""
    rows = [(row, threshold) for metrics, threshold in runs for row in metrics
            if row.get("event") == "transition" and row.get("removal_costs")]
    lowest = [min(row["removal_costs"].values()) for row, _ in rows]
    return {"transitions": len(rows), "fired": sum(cost < t for cost, (_, t) in zip(lowest, rows)),
            "logged": sum(bool(row.get("reinitialized")) for row, _ in rows), "lowest": min(lowest, default=math.nan),
            "thresholds": sorted({t for _, t in rows})}


def remedy_variants() -> list[Variant]:
    return [c.variant for c in fixed_contrasts() if c.variant.settings.get("run", {}).get("importance_remedy", "none")
            != "none"]


def recorded_firings(scale: str, seeds: list[int]) -> dict[str, dict]:
    """remedy_firings of each remedy variant over `seeds`, from its committed records (studies.page_records)."""
    if not (studies.RECORDS_DIR / scale).is_dir():  # nothing recorded at this scale
        return {}
    ws = studies.page_workspace(scale, studies.RECORDS_DIR)
    jobs = {v.label: [studies.Job(variant_workspace(ws, v, s), v.run, s) for s in seeds] for v in remedy_variants()}
    found = studies.page_records([job for runs in jobs.values() for job in runs])
    logged = lambda job: (found[job.label]["metrics"], found[job.label]["config"]["identity_threshold"])
    return {label: remedy_firings([logged(job) for job in runs])
            for label, runs in jobs.items() if all(job.label in found for job in runs)}


def live_firings(ws: suite.Workspace, seeds: list[int]) -> dict[str, dict]:
    """remedy_firings of each remedy variant over `seeds`, from its run folders (the live report's)."""
    folders = lambda v: [variant_dir(ws, v, s) for s in seeds]
    return {v.label: remedy_firings([(rundir.read_metrics(f), rundir.read_json(f / "config.json")["identity_threshold"])
                                     for f in folders(v)]) for v in remedy_variants()}


def firing_text(firings: dict, deltas: list) -> str:
    """What a row's remedy did, from remedy_firings: never fired (its runs then its baseline's), or how often."""
    n, k = firings["transitions"], firings["fired"]
    if not n:
        return "no transition measured removal costs"
    threshold = " / ".join(f"{t:g}" for t in firings["thresholds"])
    if k:
        return f"the remedy fired at {k} of its {n} transitions (a removal ΔCE below {threshold})"
    same = "; its CE equals its baseline's on every seed" if deltas and all(d == 0 for d in deltas) else ""
    return (f"a no-op: the remedy never fired, at 0 of its {n} transitions (lowest removal ΔCE {firings['lowest']:.3f}, "
            f"its threshold {threshold}){same}")


def read_family(rows: list[dict]):
    """Holm over the primary contrasts (one per idea), an untestable one entering as p = 1 so that the family keeps
    its size; idea 4's has none where the search chose post-grow, its baseline, itself."""
    primaries = [r for r in rows if r["primary"]]
    for row in primaries:
        row["p"] = report.p_two_sided(row["delta"])
    holm_readings(primaries, "delta", untested=1.0)
    for row in rows:
        if not row["primary"]:
            row["reading"] = "secondary: interval only"
        elif row["idea"] == 4 and row["variant"] == f"{POST.name} (chosen on seed {SEARCH_SEED})":
            row["reading"] = "0 by construction: the search chose post-grow itself"


def contrast_numbers(rows: list[dict]) -> dict[str, list]:
    """The report's `numbers`, each contrast's under "<variant> against <baseline>" (as section_lines reads them)."""
    return report.row_numbers({f"{r['variant']} against {r['baseline']}": r for r in rows})


def section_lines(numbers: dict[str, list], seeds: list[int], firings: dict[str, dict] | None = None) -> list[str]:
    """The study's contrasts from the report's `numbers` as a reference ships them, the live report's and the
    results page's one rendering: the primaries read by read_family, the secondaries as intervals, and whether
    each remedy ever fired (`firings`: remedy_firings by variant)."""
    rows = []
    for key in numbers:
        if key.endswith(": delta"):
            variant, _, baseline = key.removesuffix(": delta").partition(" against ")
            contrast = contrast_of(variant, baseline)
            rows.append({"idea": contrast.idea, "primary": contrast.primary, "variant": variant, "baseline": baseline,
                         "delta": report.across_seeds([report.DIVERGED if v is None else v for v in numbers[key]]),
                         "seeds": report.per_seed_text(numbers[key])})  # a null Δ: a run diverged (a CE is never n/a)
    rows.sort(key=lambda r: (r["idea"], not r["primary"]))
    read_family(rows)
    did = {r["variant"]: firing_text(firings[r["variant"]], r["delta"]["values"]) for r in rows
           if r["variant"] in (firings or {})}
    for row in rows:
        row["reading"] += f"; {did[row['variant']]}" if row["primary"] and row["variant"] in did else ""
    lines = [f"The paper's seven proposed improvements, each against the run it changes: Δ = option − that run, final "
             f"validation CE paired by seed ({report.seeds_text(seeds)}; negative: the option helps). One primary "
             "contrast per idea; the seven are one family, Holm-adjusted.", "",
             f"| idea | option | against | Δ CE | Δ per seed ({', '.join(map(str, seeds))}) | p (Holm) | reading | "
             "smallest tie margin |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['idea']} | {r['variant']} | {r['baseline']} | {report.stats_cell(r['delta'], True)} | {r['seeds']} | "
              f"{p_text(r['p_holm'])} | {r['reading']} | {report.fmt(r['smallest_tie_margin'], 4)} |"
              for r in rows if r["primary"]]
    lines += ["", "Secondary contrasts (intervals only):", "", "| idea | option | against | Δ CE | Δ per seed |",
              "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['idea']} | {r['variant']} | {r['baseline']} | {report.stats_cell(r['delta'], True)} | {r['seeds']} |"
              for r in rows if not r["primary"]]
    lines += ["", "What each remedy did at its transitions (the runs' logged removal ΔCE against their threshold):", ""]\
        + [f"- {variant}: {text}" for variant, text in did.items()] if did else []
    return lines + ["", "Readings (the primary endpoints):", ""] + \
        [f"- idea {r['idea']}: {r['reading']}" for r in rows if r["primary"]]


def study_variants(chosen: RunName | None) -> tuple[list[Contrast], list[Variant]]:
    """The contrasts (idea 4's once the search has chosen) in idea order, and every run they read, once."""
    contrasts = sorted(fixed_contrasts() + (search_contrasts(chosen) if chosen else []), key=lambda c: c.idea)
    return contrasts, list({(v.folder, v.run, v.label): v for c in contrasts for v in (c.variant, c.baseline)}.values())


def manifest(ws: suite.Workspace, seeds: list[int], chosen: RunName | None = None) -> list[studies.Job]:
    """Every run the study needs: the search's on its seed, then each seed's variants and baselines."""
    jobs = [studies.Job(ws, run, SEARCH_SEED) for run in search_runs(ws.preset.run["blocks"])]
    jobs += [studies.Job(variant_workspace(ws, v, s), v.run, s) for s in seeds for v in study_variants(chosen)[1]]
    return studies.unique(jobs)


def recorded_manifest(ws: suite.Workspace, seeds: list[int]) -> tuple[list[studies.Job], str]:
    """The study's runs as its records stand now (the dry run's): with the search recorded, its choice's runs too."""
    status = studies.survey(manifest(ws, seeds), training.expected_teacher(ws), check_data=False)
    search = {job.run: math.nan if record["done"].get("diverged") else record["done"]["ce"]  # NaN: never chosen
              for job, record in status.recorded if job.seed == SEARCH_SEED}
    chosen = choose(search) if len(search) == len(search_runs(ws.preset.run["blocks"])) else None
    return manifest(ws, seeds, chosen), "" if chosen else \
        "; and the search's chosen schedule on each seed unless it is pre-grow or post-grow"


def run_ideas(ws: suite.Workspace, seeds: list[int], force: bool = False) -> dict:
    """The seven ideas' runs trained (those recorded restored) and their report (results/<scale>/ideas.md/.json)."""
    studies.restore_study(ws, manifest(ws, seeds), force)
    chosen, found = search(ws, force)
    if chosen not in (None, PRE, POST):
        studies.restore_study(ws, manifest(ws, seeds, chosen), force)
    contrasts, variants = study_variants(chosen)
    train_variants(ws, variants, seeds, force)
    if not ws.ctx.is_main:
        return {}
    ce, diverged = variant_outcomes(ws, variants, seeds)
    rows = []
    both = lambda c, read: [[read(variant_workspace(ws, v, s), v.run, s) for s in seeds] for v in (c.variant, c.baseline)]
    for c in contrasts:
        delta = report.paired(ce[c.variant.label], ce[c.baseline.label])
        events = [transition_events(variant_dir(ws, c.variant, s)) for s in seeds]
        jumps = both(c, transition_jump)
        rows.append({"idea": c.idea, "primary": c.primary, "variant": c.variant.label, "baseline": c.baseline.label,
                     "settings": c.variant.settings, "variant_ce": report.across_seeds(ce[c.variant.label]),
                     "baseline_ce": report.across_seeds(ce[c.baseline.label]), "delta": delta, "cost": c.cost,
                     "transitions": events_text(events), "jump": report.across_seeds(jumps[0]),
                     "baseline_jump": report.across_seeds(jumps[1]), "jump_delta": report.paired(*jumps)})
        if c.idea == 3:  # the remedy's target: a near-identity last block
            removal = both(c, last_block_removal)
            rows[-1]["last_block_removal"] = {"option": report.across_seeds(removal[0]),
                                              "baseline": report.across_seeds(removal[1]),
                                              "delta": report.paired(*removal)}
    read_family(rows)
    out = {"experiment": "ideas", "scale": ws.preset.name, "seeds": seeds, "search": found, "rows": rows,
           "diverged_runs": diverged, "tie_margin": presets.TIE_MARGIN, "precision": ws.preset.run.get("precision", ""),
           "about": __doc__.split("\n\n")[1],
           "machines": [studies.folder_machine_row(job.label, job.folder) for job in manifest(ws, seeds, chosen)],
           "numbers": contrast_numbers(rows), "firings": live_firings(ws, seeds)}
    lines = markdown(out, len(variants)) + [""] + studies.machines_markdown(out["machines"])
    return report.write(ws.results, "ideas", out, lines, echo=True)


def markdown(out: dict, n_variants: int) -> list[str]:
    """The live report: section_lines, and what only the runs say (the transitions' jumps and events, idea 3's last
    block, the search, each option's cost)."""
    seeds, found, rows = out["seeds"], out["search"], out["rows"]
    lines = [f"# The paper's seven proposed improvements ({out['scale']} scale)", "",
             report.diverged_line(out["diverged_runs"], n_variants * len(seeds)), "", RULE, "",
             *section_lines(out["numbers"], seeds, out.get("firings")), "",
             "## Transition jumps (descriptive)", "",
             "The CE at a phase's start (after the transition's changes, before its first update) minus the CE at "
             "the previous phase's end, averaged over the transitions.", "",
             "| idea | option | option's jump | against | its jump | Δ |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['idea']} | {r['variant']} | {report.stats_cell(r['jump'], True)} | {r['baseline']} | "
              f"{report.stats_cell(r['baseline_jump'], True)} | {report.stats_cell(r['jump_delta'], True)} |" for r in rows]
    lines += ["", "## Idea 3: the last block's removal ΔCE at the end (descriptive)", "",
              "CE with the last block bypassed minus the CE of the whole student, at the run's endpoint, on the "
              "diagnostic batch (Table 4's).", "", "| option | its last block | against | its last block | Δ |",
              "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['variant']} | {report.stats_cell(r['last_block_removal']['option'])} | {r['baseline']} | "
              f"{report.stats_cell(r['last_block_removal']['baseline'])} | "
              f"{report.stats_cell(r['last_block_removal']['delta'], True)} |" for r in rows if "last_block_removal" in r]
    lines += ["", "## What the transitions did", "", "| option | transitions over the seeds |", "| --- | --- |"]
    lines += [f"| {r['variant']} | {r['transitions']} |" for r in rows if r["transitions"] != "no transition rows"]
    lines += ["", f"## Idea 4: the search on seed {found['seed']}", "",
              f"Chosen: {found['chosen'] or 'none (every search run diverged)'}. "
              + report.diverged_line(found["diverged"], len(found["ce"])), "",
              "| schedule | validation CE |", "| --- | --- |"]
    lines += [f"| {name} | {report.fmt(value, 4)} |" for name, value in found["ce"].items()]
    lines += ["", "## Cost: what each option adds to a run, counted from its design", "",
              "| idea | option | against | cost |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['idea']} | {r['variant']} | {r['baseline']} | {r['cost']} |" for r in rows]
    return lines + ["", "Each run's wall time is listed below with its machine (runs in lockstep share one clock; "
                        "machines differ in speed)."]
