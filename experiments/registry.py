"""The experiments beyond the paper's tables, one declaration each: what `repro.py <name>` trains and reports, what
its dry run plans, and which runs its study records. repro.py makes a command of every entry; tools/preflight.py
plans and prices every entry the same way. Adding one is one file (its runs and its report) and one line here.

    python repro.py tail --scale toy --dry-run     # STUDIES["tail"]: its groups planned, its records surveyed
    python repro.py planted --scale toy            # STUDIES["planted"].run(ws, seeds, force)

An entry's `groups(ws, seed)` lists (label, workspace, runs, seed) for the dry run: the suite's runs in the
workspace itself, each variant's in its own folder (variants.variant_workspace). Its `manifest(ws, seeds)` is
the study's runs, restored from their records before anything trains, and a note for the dry run (None: it
records its runs but trains them all, whatever their records say).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from experiments import beyond, ideas, studies, tables, tail
from experiments.suite import RunName, Workspace
from experiments.variants import Variant, suite_runs, variant_workspace

Group = tuple[str, Workspace, list[RunName], int]


@dataclass(frozen=True)
class Study:
    run: Callable[[Workspace, list[int], bool], dict]            # trains what remains, writes its report
    groups: Callable[[Workspace, int], list[Group]]                # what the dry run plans for one seed
    # (the runs its records stand in for, a note for the dry run); None: it records its runs but trains them all
    manifest: Callable[[Workspace, list[int]], tuple[list[studies.Job], str]] | None = None


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


STUDIES = {
    "intervention": Study(beyond.run_intervention, interventions_groups),
    "planted": Study(beyond.run_planted, variant_groups(list(beyond.planted_variants()))),
    "placements": Study(beyond.run_placements, placements_groups),
    "scratch": Study(beyond.run_scratch, scratch_groups),
    "ideas": Study(ideas.run_ideas, ideas_groups, ideas.recorded_manifest),
    "tail": Study(tail.run_tail, lambda ws, seed: variant_groups(tail.ws_variants(ws))(ws, seed),
                  lambda ws, seeds: (tail.manifest(ws, seeds), "")),
}

