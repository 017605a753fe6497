"""The paper's figures on a results page, drawn from a shipped reference alone by experiments/figures.py (the
functions that draw a live run's): docs/results/<scale>/<figure>.png, each kit value the mean over seeds.

    page_figures.section("toy", reference.load("toy"))   # the page's lines: a link per figure, or why none
    page_figures.draw("toy", reference.load("toy"))      # {"fig3a.png": PNG bytes, ...}: pages.main writes them
"""

import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import paper
from experiments import figures, presets, readings, tables
from plumbing import checkpoint

NORMS, PROTOCOLS = tables.NORMS, ("joint", "grow")


class NullSeed(Exception):
    """A seed without a value (a diverged run) among those a figure would average: no figure from part of them."""


def mean(values: list) -> float:
    if any(v is None for v in values):
        raise NullSeed
    return statistics.fmean(values)


def phase_points(curve: dict) -> tuple[list[str], list[str]]:
    """(starts, ends) of a grow run's curve (reference.points): the points that start and end each phase."""
    steps = sorted({int(point.split()[0]) for point in curve})
    starts = sorted((point for point in curve if point.endswith(" start")), key=lambda point: int(point.split()[0]))
    return starts, [point.split()[0] for point in starts[1:]] + [str(steps[-1])]


# Each figure's arguments from a reference; a KeyError (a table or curve it lacks) or a NullSeed means not drawn

def fig3a(ref: dict) -> dict:
    return {"kit": {n: {p: mean(ref["tables"]["table1"][f"{n}_{p}"]) for p in PROTOCOLS} for n in NORMS}}


def fig3b(ref: dict) -> dict:
    curves = {n: ref["curves"][f"{n}-grow"] for n in NORMS}
    points = {n: phase_points(curve) for n, curve in curves.items()}
    return {"kit": {n: [mean(curves[n][p]) for p in points[n][1]] for n in NORMS},
            "starts": {n: [mean(curves[n][p]) for p in points[n][0]] for n in NORMS}}


def fig4(ref: dict) -> dict:
    """After block 0 (boundary 1) only, at the first and last kept grow checkpoint: the steps are not shipped."""
    numbers = ref["tables"]["fig4"]
    return {"series": {n: [{"step": f"{when} grow\ncheckpoint", "boundary_stats": [{}, {"std": mean(numbers[key])}]}
                           for when, key in (("first", f"{n}_std_first"), ("last", f"{n}_std_end"))] for n in NORMS},
            "xlabel": "kept grow checkpoint (the reference ships no steps)"}


def fig5b(ref: dict) -> dict:
    curves = {n: ref["curves"][f"{n}-grow"] for n in NORMS}
    rows = {n: [{"step": int(point.split()[0]), "eval": True, "ce": mean(ces)} for point, ces in curve.items()]
            for n, curve in curves.items()}
    return {"runs": rows, "transition_steps": [int(point.split()[0]) for point in phase_points(curves["pre"])[0][1:]]}


def figA2(ref: dict) -> dict:
    table4 = ref["tables"]["table4"]
    blocks = lambda run: range(sum(key.startswith(f"{run}_dce_") for key in table4))
    return {"results": {run: [{"block": b, "delta_ce": mean(table4[f"{run}_dce_{b}"]),
                               "angular_distance": mean(table4[f"{run}_angular_{b}"])} for b in blocks(run)]
                        for run in (run_name.name for run_name in tables.TABLE4_TITLES)}}  # a live run's Figure A2's order


@dataclass(frozen=True)
class PageFigure:
    name: str                                  # the PNG's stem, e.g. fig3a
    title: str
    source: str                                # where in the reference its kit values are
    args: Callable[[dict], dict] | None        # the plotter's arguments from a reference; None: never from one
    plot: Callable | None = None               # the figures.py function
    table: str | None = None                   # the experiment whose seeds it averages (None: the reference's)
    never: str = ""                            # why a figure with args None is drawn from no reference


FIGURES = [
    PageFigure("fig3a", "Figure 3a: post − pre per protocol, and the interaction", "`tables.table1`", fig3a,
               figures.fig3a_interaction, "table1"),
    PageFigure("fig3b", "Figure 3b: validation CE at each phase's start and end under grow",
               "`curves.pre-grow` and `curves.post-grow`", fig3b, figures.fig3b_per_phase),
    PageFigure("fig4", "Figure 4: std of per-token RMS after block 0, first and last kept grow checkpoint",
               "`tables.fig4`", fig4, figures.fig4_boundary_std, "fig4"),
    PageFigure("fig5a", "Figure 5a: per-token RMS by token type across checkpoints", "`tables.fig5`", None,
               never="the reference holds the boundary / regular RMS ratio at the last checkpoint (`tables.fig5`), "
                     "not each token type's RMS across checkpoints"),
    PageFigure("fig5b", "Figure 5b: validation CE through grow, transitions marked",
               "`curves.pre-grow` and `curves.post-grow`", fig5b, figures.fig5b_validation),
    PageFigure("figA1", "Figure A1: per-token RMS histograms at the final checkpoint", "`tables.figA1`", None,
               never="the reference holds the kurtosis (`tables.figA1`), not the per-token RMS values a histogram draws"),
    PageFigure("figA2", "Figure A2: whole-block removal", "`tables.table4`", figA2, figures.figA2_block_removal,
               "table4"),
]


def arguments(figure: PageFigure, ref: dict) -> dict | None:
    """The plotter's arguments from `ref`, or None where it lacks their numbers (or a seed's is null)."""
    if figure.args is None:
        return None
    try:
        return figure.args(ref)
    except (KeyError, NullSeed):  # figures.py draws no gap
        return None


def seeds(figure: PageFigure, ref: dict) -> str:
    return ", ".join(map(str, readings.seeds_of(ref, figure.table)))


def section(scale: str, ref: dict) -> list[str]:
    """The page's figures section: each figure linked (docs/results/<scale>/<name>.png), or why it is not drawn."""
    lines = ["## Figures", "", f"Drawn by `experiments/figures.py` from `references/{scale}.json` alone (`python repro.py "
             f"results --scale {scale}` writes them to `docs/results/{scale}/`): each kit value is the mean over the "
             "seeds of the per-seed values the reference ships (their spread is in the tables below); the paper's "
             "values are drawn hollow, dashed or hatched, as each legend says.", ""]
    for figure in FIGURES:
        if arguments(figure, ref) is not None:
            lines += [f"**{figure.title}** (kit: {figure.source}, seeds {seeds(figure, ref)}):",
                      "", f"![{figure.title}]({scale}/{figure.name}.png)", ""]
        else:
            why = figure.never or f"this reference holds no numbers for it ({figure.source} is missing, empty or has a null)"
            lines += [f"**{figure.title}**: not drawn: {why}.", ""]
    return lines


# The scale trend: Table 1's differences at every scale with a shipped reference, beside the paper's (one figure,
# docs/results/scale-trend.png, on every results page and the README)

TREND_FILE = "scale-trend.png"


def trend_args(references: dict[str, dict | None]) -> dict | None:
    """The trend's arguments: each shipped scale's Table 1 differences over its seeds, and the paper's; None where
    no reference holds them all (or a seed's is null)."""
    kit = {}
    for scale, ref in references.items():
        try:
            values = {key: ref["tables"]["table1"][key] for key, _ in figures.TREND} if ref else None
        except KeyError:
            values = None
        if values and not any(v is None for vs in values.values() for v in vs):
            kit[scale] = {key: readings.stats(vs) for key, vs in values.items()}
    return {"kit": kit, "paper": {key: paper.DELTAS[key] for key, _ in figures.TREND},
            "tie_margin": presets.TIE_MARGIN} if kit else None


def trend_lines(references: dict[str, dict | None], link: str) -> list[str]:
    """The trend figure linked at `link` (relative to the page), with what it draws, or why it is not drawn."""
    args = trend_args(references)
    title = "**Scale trend: Table 1's Δjoint, Δgrow and interaction at each scale beside the paper's**"
    if args is None:
        return [f"{title}: not drawn: no shipped reference holds Table 1's differences on every seed.", ""]
    seeds = lambda scale: ", ".join(map(str, readings.seeds_of(references[scale], "table1")))
    sources = "; ".join(f"`references/{scale}.json`, seeds {seeds(scale)}" for scale in args["kit"])
    return [f"{title} (kit: `tables.table1` of {sources}; each kit point the mean with its 95% t-interval over seeds, "
            "the paper's one run without one, the grey band the tie margin):", "", f"![Scale trend]({link})", ""]


def draw_trend(references: dict[str, dict | None]) -> bytes | None:
    """The trend's PNG bytes (None: not drawn), drawn as draw() draws the others."""
    args = trend_args(references)
    if args is None:
        return None
    with tempfile.TemporaryDirectory() as scratch:
        caption = f"normgrow, {', '.join(args['kit'])} and the paper, references/*.json and paper.py"
        return figures.fig_scale_trend(path=Path(scratch) / TREND_FILE, caption=caption, **args).read_bytes()


def draw(scale: str, ref: dict) -> dict[str, bytes]:
    """{"<name>.png": its bytes} of every figure `ref` holds the numbers of (drawn in a scratch folder: not the PDFs)."""
    out = {}
    with tempfile.TemporaryDirectory() as scratch:
        for figure in FIGURES:
            args = arguments(figure, ref)
            if args is not None:
                caption = f"normgrow, {scale} scale, mean over seeds {seeds(figure, ref)}, references/{scale}.json"
                path = figure.plot(path=Path(scratch) / f"{figure.name}.png", caption=caption, **args)
                out[path.name] = path.read_bytes()
    return out


def write(folder: Path, drawn: dict[str, bytes]) -> None:
    """The drawn figures into `folder` (docs/results/<scale>/), each whole; a figure no longer drawn is removed."""
    if drawn:
        folder.mkdir(parents=True, exist_ok=True)
    for figure in FIGURES:
        name = f"{figure.name}.png"
        if name in drawn:
            checkpoint.write_atomic(folder / name, drawn[name])
        else:
            (folder / name).unlink(missing_ok=True)
