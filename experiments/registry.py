"""Every experiment declared once: the paper's tables and figures (tables.EXPERIMENTS, run together by `repro.py run`
over their shared runs) and the experiments beyond them, each a command of its own. For every one, the section of the
results page its shipped numbers make (SECTIONS, in the page's order, by the renderer its live report uses); for each
one beyond the paper, what `repro.py <name>` trains and reports, what its dry run plans, and which runs its study
records. repro.py makes a command of every study; tools/preflight.py plans and prices each the same way; pages.py
renders each section. Adding one is one file (its runs and its report) and one line here.

    python repro.py tail --scale toy --dry-run     # STUDIES["tail"]: its groups planned, its records surveyed
    python repro.py planted --scale toy            # STUDIES["planted"].run(ws, seeds, force)

A study's `groups(ws, seed)` lists (label, workspace, runs, seed) for the dry run: the suite's runs in the
workspace itself, each variant's in its own folder (variants.variant_workspace). Its `manifest(ws, seeds)` is
the study's runs, restored from their records before anything trains, and a note for the dry run (None: it
records its runs but trains them all, whatever their records say). Its `page(reference, scale)` is its section of
the results page; `shipped=False`: its numbers are its committed records, not the reference's (the causal test).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

from experiments import beyond, ideas, paper_reports, presets, studies, tables, tail
from experiments.readings import seeds_of
from experiments.suite import RunName, Workspace
from experiments.variants import Variant, suite_runs, variant_workspace
from plumbing import devices

Group = tuple[str, Workspace, list[RunName], int]


@dataclass(frozen=True)
class Study:
    run: Callable[[Workspace, list[int], bool], dict]            # trains what remains, writes its report
    groups: Callable[[Workspace, int], list[Group]]                # what the dry run plans for one seed
    # its section of the results page; None: its shipped numbers as intervals (pages.other_section)
    page: Callable[[dict, str], list[str]] | None = None
    # (the runs its records stand in for, a note for the dry run); None: it records its runs but trains them all
    manifest: Callable[[Workspace, list[int]], tuple[list[studies.Job], str]] | None = None
    shipped: bool = True                                           # its numbers ship in references/<scale>.json
    # its page section names what trained its runs itself (the ideas' table of recorded machines)
    names_its_machines: bool = False


def variant_groups(variants: list[Variant]) -> Callable[[Workspace, int], list[Group]]:
    """Variant runs as groups: the suite's own, then each variant's one run in its folder."""
    def groups(ws: Workspace, seed: int) -> list[Group]:
        own = [(", ".join(r.name for r in suite_runs(variants)), ws, suite_runs(variants), seed)]
        return own + [(v.label, variant_workspace(ws, v, seed), [v.run], seed) for v in variants if v.folder]
    return groups


def ideas_groups(ws: Workspace, seed: int) -> list[Group]:
    """Idea 4's search on its own seed, then every option's runs and their baselines."""
    search = ideas.search_runs(ws.preset.run["blocks"])
    _, variants = ideas.study_variants(None)  # before the search has chosen: the fixed contrasts' runs
    return [(", ".join(r.name for r in search), ws, search, ideas.SEARCH_SEED)] + variant_groups(variants)(ws, seed)


def placements_groups(ws: Workspace, seed: int) -> list[Group]:
    runs = beyond.placement_runs()
    return [(", ".join(r.name for r in runs), ws, runs, seed)]


def scratch_groups(ws: Workspace, seed: int) -> list[Group]:
    return [("scratch", beyond.scratch_workspace(ws), list(tables.MAIN_RUNS), seed)]


def interventions_groups(ws: Workspace, seed: int) -> list[Group]:
    return variant_groups(list(beyond.interventions(ws.preset.run["blocks"])))(ws, seed)


def shipped_lines(name: str, lines: Callable) -> Callable[[dict, str], list[str]]:
    """A section from the reference's per-seed numbers of `name` by its report's renderer, lines(numbers, seeds)."""
    return lambda reference, scale: lines(reference["tables"][name], seeds_of(reference, name))


def placements_page(reference: dict, scale: str) -> list[str]:
    return beyond.placements_lines(reference["tables"]["placements"], seeds_of(reference, "placements"),
                                   steps_caveat(reference["curves"]))


def steps_caveat(curves: dict) -> str:
    """How many times joint's steps grow's students take, from the curves' last evaluations."""
    if not {"pre-grow", "pre-joint"} <= set(curves):
        return ""
    last = lambda run: max(int(point.split()[0]) for point in curves[run])
    return (f" Grow's students take {last('pre-grow') / last('pre-joint'):g}× the steps of joint's (their curves end at "
            f"step {last('pre-grow')} and {last('pre-joint')}), so grow − joint is not growth against joint training at "
            "equal steps: Table 3 compares those.")


def ideas_page(reference: dict, scale: str) -> list[str]:
    """The seven ideas as their live report renders them, and each run's machine, from its committed record."""
    lines = ideas.section_lines(reference["tables"]["ideas"], seeds_of(reference, "ideas"))
    return ["## ideas", "", *lines, "", *studies.recorded_machines(scale), ""]


def tail_page(reference: dict, scale: str) -> list[str]:
    """The causal test's section from its committed records, at the scales it has them for."""
    return tail.page_section(scale, studies.RECORDS_DIR) if scale in tail.REGULAR_RMS and scale != "smoke" else []


# In the results page's order, after the paper's own.
STUDIES = {
    "placements": Study(beyond.run_placements, placements_groups, placements_page),
    "intervention": Study(beyond.run_intervention, interventions_groups,
                          shipped_lines("intervention", beyond.intervention_lines)),
    "planted": Study(beyond.run_planted, variant_groups(list(beyond.planted_variants())),
                     shipped_lines("planted", beyond.planted_lines)),
    "scratch": Study(beyond.run_scratch, scratch_groups, shipped_lines("scratch", beyond.scratch_lines)),
    "ideas": Study(ideas.run_ideas, ideas_groups, ideas_page, ideas.recorded_manifest, names_its_machines=True),
    "tail": Study(tail.run_tail, lambda ws, seed: variant_groups(tail.ws_variants(ws))(ws, seed), tail_page,
                  lambda ws, seeds: (tail.manifest(ws, seeds), ""), shipped=False),
}

# Each experiment's section of the results page, from a reference: the paper's, then those beyond it.
SECTIONS = {**{name: partial(paper_reports.page_section, name) for name in tables.EXPERIMENTS},
            **{name: study.page for name, study in STUDIES.items() if study.shipped and study.page}}


def section_folders(name: str, scale: str, seeds: list[int]) -> list[str]:
    """The run folders under runs/<scale>/ whose numbers an experiment's page section reads, so that the section can
    name what trained them from the reference's provenance: a paper table's runs, a study's planned groups (what its
    dry run plans)."""
    ws = Workspace(presets.PRESETS[scale], Path("runs") / scale, Path("results") / scale, devices.Dist())
    if name in tables.EXPERIMENTS:
        groups = [(name, ws, list(tables.EXPERIMENTS[name].runs), seed) for seed in seeds]
    elif name in STUDIES and not STUDIES[name].names_its_machines:
        groups = [group for seed in seeds for group in STUDIES[name].groups(ws, seed)]
    else:  # a table the kit has no entry for (pages.other_section), or one naming its machines itself
        groups = []
    return [str(gws.run_dir(run, seed).relative_to(ws.runs)) for _, gws, runs, seed in groups for run in runs]
