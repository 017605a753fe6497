"""The figures: each takes plain dicts and lists (diag.py's results, or a report's numbers) and a path, writes a PNG
and a PDF beside it, and returns the PNG's path. Kit values solid; the paper's hollow or dashed, labelled "paper".
No pyplot: Figure objects render through Agg and hold no global state.

    figures.fig3a_interaction({"pre": {"joint": 3.46, "grow": 3.26}, "post": {...}}, "results/toy/fig3a.png",
                              caption="toy scale, seed 42")
"""

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import matplotlib
import numpy as np
import torch
from matplotlib.figure import Figure

import diag
from paper import PAPER
from plumbing import checkpoint

STYLE = {"font.size": 8, "axes.titlesize": 9, "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
         "axes.spines.right": False, "legend.fontsize": 7, "legend.frameon": False, "savefig.dpi": 150}
NORM_COLORS = {"pre": "tab:blue", "post": "tab:orange"}
RUN_COLORS = {"pre-grow": "tab:blue", "post-grow": "tab:orange", "pre-joint": "lightsteelblue",
              "post-joint": "navajowhite"}
TYPE_STYLES = {"boundary": "-", "delimiter": "-.", "regular": "--"}
BOUNDARY_STYLES = ["-", "--", ":", "-."]


@contextmanager
def new_figure(ncols: int = 1, width: float = 4.5, height: float = 3.2, nrows: int = 1) -> Iterator[tuple[Figure, list]]:
    """A figure of nrows x ncols axes, each width x height, in STYLE while it is drawn and saved."""
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
        yield fig, [fig.add_subplot(nrows, ncols, i + 1) for i in range(nrows * ncols)]


CAPTION_BAND = 10  # points: a 6-point caption line and its padding


def save_png(fig: Figure, path, caption: str = "") -> Path:
    """The figure as PNG at `path` and as PDF beside it, with `caption` (e.g. "toy scale, seed 42") in its corner."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if caption:
        # A band of its own at the bottom, below the layout, and below the figure's legends (legend_below's,
        # the only ones here), which sit on the figure's bottom edge unless raised past it.
        band = CAPTION_BAND / 72 / fig.get_figheight()
        fig.get_layout_engine().set(rect=(0, band, 1, 1 - band))
        for legend in fig.legends:
            legend.borderaxespad += CAPTION_BAND / legend.prop.get_size_in_points()
        fig.text(0.995, 0.005, caption, ha="right", va="bottom", fontsize=6, color="gray")
    # No software version or date in either file: a figure committed beside a page changes only with its data.
    metadata = {"png": {"Software": None}, "pdf": {"Creator": None, "Producer": None, "CreationDate": None}}
    for file, kind in ((path, "png"), (path.with_suffix(".pdf"), "pdf")):
        buffer = io.BytesIO()
        fig.savefig(buffer, format=kind, metadata=metadata[kind])
        checkpoint.write_atomic(file, buffer.getvalue())
    return path


def legend_below(fig: Figure, *axes, ncols: int = 2):
    """Long legends go under the axes, where they cannot hide data: one for the entries of all `axes`."""
    handles, labels = zip(*[entry for ax in axes for entry in zip(*ax.get_legend_handles_labels())])
    fig.legend(handles, labels, loc="outside lower center", ncols=ncols)


def paper_marker(ax, x, y, color, label=None, marker="o"):
    ax.plot(x, y, marker=marker, markersize=7, linestyle="none", markerfacecolor="none",
            markeredgecolor=color, markeredgewidth=1.3, label=label)


def delta(ces: dict, at) -> float:
    """post − pre at `at`: a protocol (Figure 3a) or a phase (3b)."""
    return ces["post"][at] - ces["pre"][at]


def fig3a_interaction(kit: dict, path, paper: dict = PAPER["table1"], caption: str = "") -> Path:
    """Figure 3a as the effect itself: Δ = post − pre per protocol; the slope between them is the interaction.
    kit: {"pre": {"joint": ce, "grow": ce}, "post": {...}}."""
    protocols = ["joint", "grow"]
    with new_figure() as (fig, (ax,)):
        ax.plot(range(2), [delta(kit, p) for p in protocols], "o-", color="black", label="Δ post − pre (kit)")
        ax.plot(range(2), [delta(paper, p) for p in protocols], "--", color="gray", marker="o",
                markerfacecolor="none", label="Δ post − pre (paper)")
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set_xticks(range(2), protocols)
        ax.set(xlabel="protocol", ylabel="validation CE, post − pre (nats/token)",
               title=f"interaction Δgrow − Δjoint: kit {interaction(kit):+.4f}, paper {interaction(paper):+.4f}")
        ax.legend()
        return save_png(fig, path, caption)


TREND = (("delta_joint", "Δjoint = post − pre, joint"), ("delta_grow", "Δgrow = post − pre, grow"),
         ("interaction", "interaction = Δgrow − Δjoint"))


def fig_scale_trend(kit: dict, paper: dict, path, tie_margin: float, caption: str = "") -> Path:
    """Table 1's three differences at each scale beside the paper's, one panel each. kit: {scale: {key:
    report.across_seeds stats}}; paper: {key: value}, drawn hollow at the right; grey: the tie margin."""
    with new_figure(ncols=len(TREND), width=2.4, height=2.8) as (fig, axes):
        for ax, (key, title) in zip(axes, TREND):
            ax.axhspan(-tie_margin, tie_margin, color="gray", alpha=0.2, linewidth=0, label=f"a tie: ±{tie_margin:g}")
            ax.axhline(0, color="black", linewidth=0.5)
            for x, numbers in enumerate(kit.values()):
                s = numbers[key]
                lo, hi = s["ci95"] or (s["mean"], s["mean"])
                ax.errorbar([x], [s["mean"]], yerr=[[s["mean"] - lo], [hi - s["mean"]]], fmt="o", color="black",
                            capsize=3, label="kit: mean, 95% t-interval over seeds")
            paper_marker(ax, len(kit), paper[key], "black", label="paper: one run, no interval")
            ax.set_xticks(range(len(kit) + 1), [f"{scale}\n{numbers[key]['n']} seeds" for scale, numbers in kit.items()]
                          + ["paper"])
            ax.set(xlim=(-0.5, len(kit) + 0.5), title=title)
        axes[0].set_ylabel("validation CE difference (nats/token)")
        entries = dict(zip(*axes[0].get_legend_handles_labels()[::-1]))  # {label: handle}, each once
        fig.legend(list(entries.values()), list(entries), loc="outside lower center", ncols=3)
        return save_png(fig, path, caption)


def interaction(ces: dict) -> float:
    """(post - pre) under grow minus (post - pre) under joint (Table 1)."""
    return delta(ces, "grow") - delta(ces, "joint")


def fig3b_per_phase(kit: dict, path, paper: dict = PAPER["per_phase_ce"], starts: dict | None = None,
                    caption: str = "") -> Path:
    """Figure 3b. kit: {"pre": [CE at the end of phase 0, 1, ...], "post": [...]}; starts: the same at each phase's
    start, hollow at phase - 0.5 (one far above the rest at the top edge, its value beside it). Right: Δ = post −
    pre per phase against the paper's (phase 0 from Table 2, phase 2 from Table 1)."""
    starts = starts or {}
    shown = [v for ces in kit.values() for v in ces] + [v for s in starts.values() for v in s[1:]]
    span = max(shown) - min(shown) or 1.0
    top = max(shown) + 0.15 * span  # where a start far above the rest is drawn
    phases = range(max(len(c) for c in kit.values()))
    with new_figure(ncols=2, width=4.0, height=3.6) as (fig, (ax, dax)):
        for norm, ces in kit.items():
            color = NORM_COLORS[norm]
            ax.plot(range(len(ces)), ces, "o-", color=color, label=f"{norm}-norm, phase end")
            for p, start in enumerate(starts.get(norm, [])):
                ax.plot([p - 0.5, p], [min(start, top), ces[p]], ":", color=color, marker="s", markevery=[0],
                        markerfacecolor="none", label=f"{norm}-norm, phase start" if p == 0 else None)
                if start > top:
                    ax.annotate(f"start {start:.2f} ↑", (p - 0.5, top), textcoords="offset points",
                                xytext=(12, -4 - 10 * (norm == "post")), color=color, fontsize=7)
        ax.set_ylim(top=top + 0.08 * span)  # the marker drawn at `top` whole, not cut by the edge
        ax.set_title("kit: validation CE through grow")
        deltas = [delta(kit, p) for p in phases]
        dax.plot(phases, deltas, "o-", color="black", label="Δ kit, phase end")
        if starts.get("pre") and starts.get("post"):
            start_deltas = [delta(starts, p) for p in phases]
            dax.plot([p - 0.5 for p in phases], start_deltas, "s", color="black", markerfacecolor="none",
                     label="Δ kit, phase start")
            deltas += start_deltas
        marked = sorted(set(paper.get("pre", {})) & set(paper.get("post", {})))
        paper_deltas = [delta(paper, p) for p in marked]
        paper_marker(dax, marked, paper_deltas, "gray", "Δ paper (phase 0: Table 2; phase 2: Table 1)")
        dax.axhline(0, color="black", linewidth=0.5)
        dax.set_yscale("symlog", linthresh=0.05)  # a several-nat start gap and a 0.03-nat end gap, both legible
        # Limits a factor 2 past the data (symlog's autoscale leaves the extreme markers cut by the edges).
        low, high = min(deltas + paper_deltas + [0]), max(deltas + paper_deltas + [0])
        low, high = -max(-2 * low, 0.1), max(2 * high, 0.1)
        dax.set_ylim(low, high)
        # Ticks at 0 and ±10^k from 0.1 only: symlog's own put ±0.01 inside the linear band, on top of 0's label.
        ticks = [t for k in range(-1, 4) for t in (-(10.0 ** k), 10.0 ** k) if low <= t <= high]
        dax.set_yticks(sorted(ticks + [0]), [f"{t:g}" for t in sorted(ticks + [0])])
        dax.set_title("Δ post − pre per phase (symlog beyond ±0.05)")
        for a, label in ((ax, "validation CE (nats/token)"), (dax, "post − pre (nats/token)")):
            a.set(xticks=list(phases), xlabel="grow phase (active blocks = phase + 1)", ylabel=label)
        legend_below(fig, ax, dax, ncols=4)
        return save_png(fig, path, caption)


def mark_transitions(ax, transition_steps: list[int]):
    for i, step in enumerate(transition_steps):
        ax.axvline(step, color="gray", linestyle=":", linewidth=0.8, label="block appended" if i == 0 else None)


def save_beside_paper(fig, ax, pax, transition_steps, title: str, ylabel: str, path, caption: str) -> Path:
    """Figures 4 and 5a, saved: the kit's panel `ax` beside the paper's own `pax`, both on a log axis."""
    mark_transitions(ax, transition_steps)
    for a in (ax, pax):
        a.set_yscale("log")
    pax.set_xticks([0, 1], ("first grow\ncheckpoint", "150k\n(end of grow)"))  # the paper gives no first step
    pax.set(xlim=(-0.5, 1.5), title=title, ylabel=ylabel)
    legend_below(fig, ax)
    pax.legend(fontsize=6)
    return save_png(fig, path, caption)


def fig4_boundary_std(series: dict, path, paper: dict = PAPER["boundary_std_after_block0"],
                      transition_steps: list[int] = (), caption: str = "",
                      xlabel: str = "training step of the checkpoint") -> Path:
    """Figure 4. series: {"pre": [{"step", "boundary_stats"}, ...], "post": [...]}, one entry per kept grow
    checkpoint (a reference names the checkpoint instead of its step, and says so in `xlabel`). Right: the paper's
    values after block 0 (pre-norm at its first grow checkpoint and at 150k; post-norm's stated range)."""
    with new_figure(ncols=2, width=4.0, height=4.4) as (fig, (ax, pax)):
        for norm, checkpoints in series.items():
            for b in range(1, max(len(c["boundary_stats"]) for c in checkpoints)):
                points = [(c["step"], c["boundary_stats"][b]["std"]) for c in checkpoints
                          if b < len(c["boundary_stats"])]
                ax.plot(*zip(*points), marker="o", markersize=3, color=NORM_COLORS[norm],
                        linestyle=BOUNDARY_STYLES[(b - 1) % len(BOUNDARY_STYLES)], label=f"{norm}, {diag.boundary_label(b)}")
        ax.set(xlabel=xlabel, ylabel="std of per-token RMS over tokens\n(activation units, log scale)",
               title="kit: boundary-scale spread across grow")
        first, last = paper["pre"]
        paper_marker(pax, [0, 1], [first, last], NORM_COLORS["pre"], f"pre, after block 0 ({first:g} → {last:g})")
        pax.plot([0, 1], [first, last], "--", color=NORM_COLORS["pre"], linewidth=0.8)
        low, high = paper["post_range"]
        pax.axhspan(low, high, color=NORM_COLORS["post"], alpha=0.2, label=f"post, after block 0 ({low:g}–{high:g})")
        return save_beside_paper(fig, ax, pax, transition_steps, "paper (Figure 4)", "std of per-token RMS (log scale)",
                                 path, caption)


def fig5a_token_types(series: dict, path, boundary: int = 1, paper: dict = PAPER["token_type_rms"],
                      transition_steps: list[int] = (), caption: str = "") -> Path:
    """Figure 5a. series as for fig4, with "token_type_rms": mean per-token RMS by token type at one boundary
    (default: after block 0; the paper does not say which), beside the paper's values."""
    with new_figure(ncols=2, width=4.0, height=4.4) as (fig, (ax, pax)):
        for norm, checkpoints in series.items():
            color = NORM_COLORS[norm]
            for name, style in TYPE_STYLES.items():
                points = [(c["step"], c["token_type_rms"][boundary][f"{name}_rms"]) for c in checkpoints
                          if boundary < len(c["token_type_rms"]) and c["token_type_rms"][boundary][f"{name}_rms"]]
                if points:
                    ax.plot(*zip(*points), marker="o", markersize=3, color=color, linestyle=style,
                            label=f"{norm}, {name} tokens")
            for name, (first, last) in paper.get(norm, {}).items():
                xs, ys = zip(*[(x, y) for x, y in ((0, first), (1, last)) if y is not None])
                paper_marker(pax, xs, ys, color, f"{norm}, {name} ({' → '.join(f'{y:g}' for y in ys)})",
                             marker="s" if name == "boundary" else "o")
        ax.set(xlabel="training step of the checkpoint", title="kit: token-type attribution of boundary scale",
               ylabel=f"mean per-token RMS, {diag.boundary_label(boundary)}\n(activation units, log scale)")
        return save_beside_paper(fig, ax, pax, transition_steps, "paper (Figure 5a)", "mean per-token RMS (log scale)",
                                 path, caption)


def fig5b_validation(runs: dict, path, transition_steps: list[int], smooth: int | None = None,
                     paper: dict = PAPER["table1"], caption: str = "") -> Path:
    """Figure 5b. runs: {"pre": metrics rows, "post": ...}: validation CE at every evaluation; with `smooth`, the
    training CE term as a trailing `smooth`-step mean; the paper's final CE hollow."""
    with new_figure(width=5.5, height=4.4) as (fig, (ax,)):
        for norm, rows in runs.items():
            color = NORM_COLORS[norm]
            evals = [(r["step"], r["ce"]) for r in rows if r.get("eval")]
            ax.plot(*zip(*evals), "o-", markersize=3, color=color, label=f"{norm}-norm, validation CE")
            if smooth:
                steps, ces = zip(*sorted(diag.training_losses(rows, "ce").items()))
                mean = np.convolve(ces, np.ones(smooth) / smooth, mode="valid")
                ax.plot(steps[smooth - 1:], mean, color=color, alpha=0.4, linewidth=0.8,
                        label=f"{norm}-norm, training CE ({smooth}-step mean)")
            if norm in paper:
                paper_marker(ax, [evals[-1][0]], [paper[norm]["grow"]], color,
                             f"paper: {norm}-grow at 150k, drawn at the kit's last step")
        mark_transitions(ax, transition_steps)
        ax.set(xlabel="training step", ylabel="CE (nats/token)", title="validation CE through grow, transitions marked")
        legend_below(fig, ax, ncols=1)  # its labels are long: two columns run past the edges
        return save_png(fig, path, caption)


def figA1_rms_histograms(token_rms_by_norm: dict, path, label: str = "after block 0",
                         paper_kurtosis: float = PAPER["final_kurtosis_pre_above"], cap: float | None = None,
                         caption: str = "") -> Path:
    """Figure A1. token_rms_by_norm: {"pre": [per-token RMS], "post": [...]} at the final checkpoint, log bins and
    counts; the legend gives each one's Pearson kurtosis and, with `cap`, the largest the batch's shape allows."""
    values = {norm: np.asarray(v, dtype=np.float64) for norm, v in token_rms_by_norm.items()}
    pooled = np.concatenate(list(values.values()))
    positive = pooled[pooled > 0]
    bins = np.geomspace(positive.min(), positive.max() * 1.001, 60) if positive.max() > positive.min() else 10
    with new_figure(width=5.5) as (fig, (ax,)):
        for norm, v in values.items():
            stats = diag.summarize(torch.from_numpy(v))
            kurtosis = "undefined" if stats["kurtosis"] is None else f"{stats['kurtosis']:.1f}"
            ax.hist(v, bins=bins, histtype="stepfilled", alpha=0.5, color=NORM_COLORS[norm],
                    label=f"{norm}-norm: {len(v)} tokens, Pearson kurtosis {kurtosis}")
        ax.plot([], [], " ", label=f"paper: pre-norm kurtosis > {paper_kurtosis:g}")
        if cap is not None:
            ax.plot([], [], " ", label=f"largest kurtosis this batch's shape allows: {cap:.0f}")
        ax.set(xscale="log", yscale="log", xlabel=f"per-token RMS, {label} (activation units, log scale)",
               ylabel="tokens (log scale)", title="per-token RMS distribution at the final checkpoint")
        ax.legend()
        return save_png(fig, path, caption)


def figA2_block_removal(results: dict, path, paper: dict = PAPER["table4"], caption: str = "") -> Path:
    """Figure A2. results: {run: block_removal(...)}. Top row: the kit's bars; bottom row: Table 4's, on their own
    axes (the paper's ~8-nat block 0 would flatten the kit's smaller bars on a shared axis)."""
    metrics = [("delta_ce", "ΔCE when the block is skipped (nats/token)"),
               ("angular_distance", "angular distance in → out (fraction of π)")]
    width = 0.8 / len(results)
    n_blocks = max(len(b) for b in results.values())
    with new_figure(ncols=2, width=4.2, height=3.2, nrows=2) as (fig, axes):
        for col, (metric, ylabel) in enumerate(metrics):
            for row, source in enumerate(("kit", "paper (Table 4)")):
                ax = axes[2 * row + col]
                for i, (run, blocks) in enumerate(results.items()):
                    values = [r[metric] for r in blocks] if row == 0 else list(paper.get(run, {}).get(metric, ()))
                    xs = [b - 0.4 + width * (i + 0.5) for b in range(len(values))]
                    ax.bar(xs, values, width, color=RUN_COLORS.get(run), edgecolor="black", linewidth=0.4,
                           hatch="//" if row else None, label=run)
                ax.set_xticks(range(n_blocks), [f"block {b}" for b in range(n_blocks)])
                ax.set(title=source, xlabel="skipped block", ylabel=ylabel)
        fig.suptitle("whole-block removal")
        legend_below(fig, axes[1], ncols=5)
        return save_png(fig, path, caption)


def fig_monitor(series: dict, path, title: str, caption: str = "") -> Path:
    """The boundary monitor against steps, {run label: [monitor rows]}: the mean and the kurtosis of per-token RMS
    at each internal block boundary (a colour per run, a line style per boundary)."""
    with new_figure(ncols=2, width=4.2, height=3.4) as (fig, (rms_ax, kurt_ax)):
        for i, (label, rows) in enumerate((k, v) for k, v in series.items() if v):
            color = f"C{i}"
            for b in range(1, max(len(r["boundaries"]) for r in rows)):
                points = [(r["step"], r["boundaries"][b]) for r in rows if len(r["boundaries"]) > b]
                style = BOUNDARY_STYLES[(b - 1) % len(BOUNDARY_STYLES)]
                for ax, key in ((rms_ax, "mean"), (kurt_ax, "kurtosis")):
                    if xy := [(step, row[key]) for step, row in points if row[key] is not None]:
                        ax.plot(*zip(*xy), linestyle=style, color=color, linewidth=1,
                                label=f"{label}, {points[0][1]['label']}")
        for ax, ylabel in ((rms_ax, "mean per-token RMS"), (kurt_ax, "kurtosis of per-token RMS")):
            ax.set(yscale="log", xlabel="step", ylabel=ylabel)
        fig.suptitle(title)
        legend_below(fig, rms_ax, ncols=3)
        return save_png(fig, path, caption)


def fig_scan(scans: dict, path, massive: float, sink_heads: float, sink_attention: float, caption: str = "") -> Path:
    """The layer-by-layer scan (diag.layer_scan) of several models, {name: rows}: (a) max |activation| / median per
    layer, (b) the share of sink heads per layer, each threshold dashed and named in its panel's title."""
    with new_figure(2) as (fig, (a, b)):
        for name, rows in scans.items():
            layers = [r["layer"] for r in rows]
            a.plot(layers, [r["massive_ratio"] for r in rows], marker="o", markersize=3, label=name)
            b.plot(layers, [r["sink_heads"] for r in rows], marker="o", markersize=3, label=name)
        a.axhline(massive, color="gray", linestyle="--", linewidth=0.8)
        b.axhline(sink_heads, color="gray", linestyle="--", linewidth=0.8)
        a.set(yscale="log", xlabel="layer (its output)", ylabel="max |activation| / median",
              title=f"(a) massive activations\n(dashed: the threshold, massive at ≥ {massive:g})")
        b.set(xlabel="layer", ylabel=f"share of heads with ≥ {sink_attention:g} on position 0", ylim=(-0.05, 1.05),
              title=f"(b) sink heads\n(dashed: the threshold, a sink layer at ≥ {sink_heads:g})")
        legend_below(fig, a, ncols=min(3, len(scans)))
        return save_png(fig, path, caption)
