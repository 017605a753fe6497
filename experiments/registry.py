"""Every experiment declared once, in one dict of one type (EXPERIMENTS, in the results page's order): the paper's tables and
figures, then those beyond them (STUDIES), each a command of its own. repro.py, tools/cli_options.py, tools/preflight.py and
pages.py iterate it; adding one is one file and one line here (docs/design.md, "Adding an experiment").

    python repro.py tail --scale toy --dry-run       # EXPERIMENTS["tail"]: its groups planned, its records surveyed
    python repro.py planted --scale toy              # EXPERIMENTS["planted"].run(ws, seeds, force)
"""

from dataclasses import dataclass
from functools import partial
from typing import Callable

from experiments import beyond, ideas, paper_reports, studies, tables, tail
from experiments.readings import seeds_of
from experiments.suite import RunName, Workspace
from experiments.tables import PaperTable
from experiments.variants import Variant, suite_runs, variant_workspace

Group = tuple[str, Workspace, list[RunName], int]


@dataclass(frozen=True)
class Experiment:
    groups: Callable[[Workspace, int], list[Group]]                # the runs it reads for one seed
    # its section of the results page; None: its shipped numbers as intervals (pages.other_section)
    page: Callable[[dict, str], list[str]] | None = None
    # `repro.py <name>`: trains what remains, writes its report; None: a table of the paper's (`repro.py run`)
    run: Callable[[Workspace, list[int], bool], dict] | None = None
    # (the runs its records stand in for, a note for the dry run); None: it records its runs but trains them all
    manifest: Callable[[Workspace, list[int]], tuple[list[studies.Job], str]] | None = None
    shipped: bool = True                                           # its numbers ship in references/<scale>.json
    # its page section names what trained its runs itself (the ideas' table of recorded machines)
    names_its_machines: bool = False
    table: PaperTable | None = None                                # a table of the paper's: its runs, rows and numbers
    # what it cannot give at a scale, check(scale): one line naming --scale, before any folder is made (repro.py)
    check: Callable[[str], None] | None = None


def paper_table(name: str) -> Experiment:
    """One of the paper's tables and figures: the runs tables.TABLES declares, its section by paper_reports."""
    return Experiment(lambda ws, seed: [(name, ws, list(tables.TABLES[name].runs), seed)],
                      partial(paper_reports.page_section, name), table=tables.TABLES[name])


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


def shipped_lines(name: str, lines: Callable) -> Callable[[dict, str], list[str]]:
    """A section from the reference's per-seed numbers of `name` by its report's renderer, lines(numbers, seeds)."""
    return lambda reference, scale: lines(reference["tables"][name], seeds_of(reference, name))


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
    seeds = seeds_of(reference, "ideas")
    lines = ideas.section_lines(reference["tables"]["ideas"], seeds, ideas.recorded_firings(scale, seeds))
    return ["## ideas", "", *lines, "", *studies.recorded_machines(scale), ""]


EXPERIMENTS = {  # in the results page's order: the paper's own, then those beyond it
    **{name: paper_table(name) for name in tables.TABLES},
    "placements": Experiment(lambda ws, seed: [("placements", ws, beyond.placement_runs(), seed)],
                             lambda reference, scale: beyond.placements_lines(
                                 reference["tables"]["placements"], seeds_of(reference, "placements"),
                                 steps_caveat(reference["curves"])), run=beyond.run_placements),
    "intervention": Experiment(
        lambda ws, seed: variant_groups(list(beyond.interventions(ws.preset.run["blocks"])))(ws, seed),
        shipped_lines("intervention", beyond.intervention_lines), run=beyond.run_intervention),
    "planted": Experiment(variant_groups(list(beyond.planted_variants())), shipped_lines("planted", beyond.planted_lines),
                          run=beyond.run_planted),
    "scratch": Experiment(lambda ws, seed: [("scratch", beyond.scratch_workspace(ws), list(tables.MAIN_RUNS), seed)],
                          shipped_lines("scratch", beyond.scratch_lines), run=beyond.run_scratch),
    "ideas": Experiment(ideas_groups, ideas_page, run=ideas.run_ideas, manifest=ideas.recorded_manifest,
                        names_its_machines=True),
    # its section from its committed records, at the scales it has them for
    "tail": Experiment(lambda ws, seed: variant_groups(tail.ws_variants(ws))(ws, seed),
                       lambda reference, scale: tail.markdown(tail.recorded_outcome(scale))
                       if scale in tail.REGULAR_RMS and scale != "smoke" else [], run=tail.run_tail,
                       manifest=lambda ws, seeds: (tail.manifest(ws, seeds), ""), shipped=False, check=tail.check_scale),
}
STUDIES = {name: experiment for name, experiment in EXPERIMENTS.items() if experiment.run}  # each `repro.py <name>`
PAPER_TABLES = [name for name, experiment in EXPERIMENTS.items() if experiment.table]  # `repro.py run all`
SECTIONS = {name: experiment.page for name, experiment in EXPERIMENTS.items() if experiment.shipped and experiment.page}


def section_folders(name: str, scale: str, seeds: list[int]) -> list[str]:
    """The run folders under runs/<scale>/ whose numbers an experiment's page section reads (its groups)."""
    experiment = EXPERIMENTS.get(name)
    if experiment is None or experiment.names_its_machines:  # a table the kit has no entry for (pages.other_section)
        return []
    ws = studies.page_workspace(scale, None)  # runs/<scale>/, as a page places a study's runs
    return [gws.folder(run, s) for seed in seeds for _, gws, runs, s in experiment.groups(ws, seed) for run in runs]
