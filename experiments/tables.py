"""The paper's tables and figures: which named runs each needs and how it turns them into numbers per seed (the
paper's value beside each) and figures, read from finished runs; nothing here trains.

    python repro.py table1 fig3 --scale smoke
    python repro.py table1 --scale toy --seeds 42,43,44
"""

import math
from dataclasses import dataclass, field
from typing import Callable

import diag
import nets
from experiments import figures, readouts, report
from experiments.suite import RunName
from paper import DELTAS, PAPER
from plumbing import errors

NORMS = ("pre", "post")  # the paper's two placements
MAIN_RUNS = tuple(RunName(norm, protocol) for protocol in ("joint", "grow") for norm in NORMS)
PRE_GROW, POST_GROW = RunName("pre", "grow"), RunName("post", "grow")
RUNS = (*MAIN_RUNS, *(RunName(norm, "freeze") for norm in NORMS),
        *(RunName(norm, protocol) for norm in NORMS for protocol in ("joint-long", "joint-longer")),
        *(RunName(norm, "joint-replay") for norm in NORMS))

# The paper's tables and figures; experiments/registry.py makes each one experiment (Experiment.table).

@dataclass
class PaperTable:
    about: str
    runs: tuple[RunName, ...]
    rows: list[report.Row] = field(default_factory=list)
    numbers: Callable | None = None   # (ws, seed) -> {key: value}
    figures: Callable | None = None   # (ws, seed, caption) -> {name: png path, ...extra JSON}
    layout: Callable | None = None    # (stats, seeds) -> Markdown lines in the paper's layout, above the rows
    claims: list = field(default_factory=list)  # (the paper's claim, {key: mean} -> does the kit agree?)
    note: str = ""
    # Differences read by the rule fixed before any result (report.reading); Table 1's first is the primary endpoint.
    readings: tuple[str, ...] = ()


def table1_numbers(ws, seed):
    return with_deltas({f"{run.norm}_{run.protocol}": report.final_ce(ws, run, seed) for run in MAIN_RUNS})


def with_deltas(ce: dict, protocols=("joint", "grow"), interaction="interaction") -> dict:
    """CEs ({pre,post}_<protocol>) with each protocol's post - pre, and the second's minus the first's (Table 1, A3)."""
    first, second = (ce[f"post_{p}"] - ce[f"pre_{p}"] for p in protocols)
    return {**ce, f"delta_{protocols[0]}": first, f"delta_{protocols[1]}": second, interaction: second - first}


def table2_numbers(ws, seed):
    out = {}
    for norm in NORMS:
        end = readouts.phase_end_eval(ws, RunName(norm, "grow"), seed, 0)
        start = readouts.phase_start_eval(ws, RunName(norm, "grow"), seed, 0)
        out |= {f"{norm}_{m}": end[m] for m in ("ce", "kd", "kl", "ppl")}
        out |= {f"{norm}_{m}_step0": start[m] for m in ("ce", "kd")}
    out["delta_ce_step0"] = out["post_ce_step0"] - out["pre_ce_step0"]
    out["delta_ce"] = out["post_ce"] - out["pre_ce"]
    # Beyond phase 0: Δ at every phase end, so the table says how post-norm's lead after one block moves as
    # blocks are appended (the paper's crossover is pre-norm ahead at phase 0, post-norm after it).
    for phase in range(ws.preset.run["blocks"]):
        ends = {norm: readouts.phase_end_eval(ws, RunName(norm, "grow"), seed, phase)["ce"] for norm in NORMS}
        out[f"delta_ce_phase_{phase}"] = ends["post"] - ends["pre"]
    out["delta_ce_last_minus_phase_0"] = out[f"delta_ce_phase_{ws.preset.run['blocks'] - 1}"] - out["delta_ce_phase_0"]
    return out


TABLE3_RUNS = tuple(RunName(norm, p) for norm in ("post", "pre")
                    for p in ("joint", "joint-long", "joint-longer", "joint-replay", "grow"))


def table3_numbers(ws, seed):
    """Table 3's joint controls for both placements, and whether growth beats more steps or the same shard."""
    ce = {run.name: report.final_ce(ws, run, seed) for run in TABLE3_RUNS}
    out = ce | {"interaction": (ce["post-grow"] - ce["pre-grow"]) - (ce["post-joint"] - ce["pre-joint"])}  # Table 1's
    for control in ("longer", "replay"):
        grow_minus = {norm: ce[f"{norm}-grow"] - ce[f"{norm}-joint-{control}"] for norm in NORMS}
        out |= {f"{norm}_grow_minus_{control}": grow_minus[norm] for norm in NORMS}
        # the same interaction against a joint control of grow's own steps: Δgrow − Δjoint-longer (-replay)
        out[f"interaction_{control}"] = grow_minus["post"] - grow_minus["pre"]
    return out


TABLE_A2_RUNS = tuple(RunName("post", p) for p in ("joint", "grow", "joint-long", "joint-longer"))


def table_a2_numbers(ws, seed):
    out = {}
    for run in TABLE_A2_RUNS:
        unique, total = readouts.unique_and_total_tokens(ws, run, seed)
        last = [r for r in readouts.metrics(ws.run_dir(run, seed)) if not r.get("eval") and not r.get("monitor")][-1]
        if last["total_tokens"] != total:
            raise errors.TrainingError(f"{ws.run_dir(run, seed)}: its log counts {last['total_tokens']} tokens but its "
                                     f"batches hold {total}; rerun it with --force")
        name = run.name
        out.update({f"{name}_total": total, f"{name}_unique": unique, f"{name}_active_layer": last["active_layer_tokens"]})
    out["grow_over_joint_total"] = out["post-grow_total"] / out["post-joint_total"]
    out["long_over_grow_active_layer"] = out["post-joint-long_active_layer"] / out["post-grow_active_layer"]
    out["longer_over_grow_total"] = out["post-joint-longer_total"] / out["post-grow_total"]
    return out


def table_a3_numbers(ws, seed):
    ce = {f"{n}_{p}": report.final_ce(ws, RunName(n, p), seed) for n in NORMS for p in ("grow", "freeze")}
    gaps = {f"ppl_gap_{p}": nets.perplexity(ce[f"post_{p}"]) - nets.perplexity(ce[f"pre_{p}"]) for p in ("grow", "freeze")}
    return with_deltas(ce, ("grow", "freeze"), "delta_freeze_minus_grow") | gaps


TABLE4_TITLES = {PRE_GROW: "Pre-Grow", POST_GROW: "Post-Grow", RunName("pre", "joint"): "Pre-Joint",
                 RunName("post", "joint"): "Post-Joint"}
# Per removed block: (diag.block_removal's key and the paper's, the kit's key, the label)
TABLE4_METRICS = (("delta_ce", "dce", "ΔCE when removed"), ("angular_distance", "angular", "angular distance / π"))


def table4_grid(stats: dict, n_seeds: int) -> list[str]:
    """Table 4 as the paper prints it, each cell "kit (paper)", the kit's mean over seeds."""
    blocks = sum(1 for key in stats if key.startswith("pre-grow_dce_"))  # K (the paper's 3, or a deeper student's)

    def paper(name, metric, b):
        values = PAPER["table4"][name][metric]
        return f" ({values[b]:.3f})" if b < len(values) else " (—)"
    head = " | ".join(f"block {b} {m}" for m in ("ΔCE", "angle / π") for b in range(blocks))
    lines = [f"| run | {head} |", "|" + " --- |" * (1 + 2 * blocks)]
    for run, title in TABLE4_TITLES.items():
        cells = [f"{stats[f'{run.name}_{short}_{b}']['mean']:.3f}{paper(run.name, metric, b)}"
                 for metric, short, _ in TABLE4_METRICS for b in range(blocks)]
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return lines + ["", f"Each cell: kit{' (mean over ' + str(n_seeds) + ' seeds)' if n_seeds > 1 else ''} "
                        "(paper). Every number with its spread:", ""]


def table4_numbers(ws, seed):
    return {f"{run.name}_{short}_{r['block']}": r[metric] for run in MAIN_RUNS for r in readouts.block_removal(ws, run, seed)
            for metric, short, _ in TABLE4_METRICS}


def table_a4_numbers(ws, seed):
    out = {}
    S, K = ws.preset.run["phase_steps"], ws.preset.run["blocks"]
    for norm in NORMS:
        logged = readouts.metrics(ws.run_dir(RunName(norm, "grow"), seed))
        for t, r in enumerate(diag.transition_responses(logged, S, K), start=1):
            # recovery: NaN (n/a) where the loss never rose, inf where it never came back within the phase
            recovery = r["recovery_steps"] if r["recovery_steps"] is not None else math.inf if r["rose"] else math.nan
            out.update({f"{norm}_{t}_jump": r["jump"], f"{norm}_{t}_immediate_jump": r["immediate_jump"],
                        f"{norm}_{t}_auc_1k": r["abs_auc_1k"], f"{norm}_{t}_auc_5k": r["abs_auc_5k"],
                        f"{norm}_{t}_signed_auc_1k": r["auc_1k"], f"{norm}_{t}_signed_auc_5k": r["auc_5k"],
                        f"{norm}_{t}_recovery": recovery})
    return out


def fig3_figures(ws, seed, caption=""):
    kit = {n: {p: report.final_ce(ws, RunName(n, p), seed) for p in ("joint", "grow")} for n in NORMS}
    K = ws.preset.run["blocks"]
    per_phase = {n: [readouts.phase_end_eval(ws, RunName(n, "grow"), seed, p)["ce"] for p in range(K)] for n in NORMS}
    starts = {n: [readouts.phase_start_eval(ws, RunName(n, "grow"), seed, p)["ce"] for p in range(K)] for n in NORMS}
    paper, per_phase_paper = P["table1"], P["per_phase_ce"]
    table = [(f"{n}-norm, {p}", kit[n][p], paper[n][p]) for n in NORMS for p in ("joint", "grow")]
    table += [(f"Δ{p} (post − pre)", figures.delta(kit, p), figures.delta(paper, p)) for p in ("joint", "grow")]
    table += [("interaction Δgrow − Δjoint", figures.interaction(kit), figures.interaction(paper))]
    for p in range(K):
        table += [(f"{n}-grow, phase {p}: start / end", f"{starts[n][p]:.4f} / {per_phase[n][p]:.4f}",
                   per_phase_paper[n].get(p)) for n in ("pre", "post")]
        paper_delta = (per_phase_paper["post"][p] - per_phase_paper["pre"][p]) if p in per_phase_paper["pre"] else None
        table += [(f"Δ phase {p} end (post − pre)", per_phase["post"][p] - per_phase["pre"][p], paper_delta)]
    return {"fig3a": figures.fig3a_interaction(kit, ws.results / "fig3a.png", caption=caption),
            "fig3b": figures.fig3b_per_phase(per_phase, ws.results / "fig3b.png", starts=starts, caption=caption),
            "per_phase_ce": per_phase, "phase_start_ce": starts, "table": table}


def boundary_series(ws, seed):
    return {n: readouts.series(ws, RunName(n, "grow"), seed) for n in NORMS}


def boundary_numbers(ws, seed):
    """After block 0 in grow, per seed, what the figures draw for one: the RMS's spread, ratio and kurtosis."""
    out = {}
    for n, snapshots in boundary_series(ws, seed).items():
        first, last = snapshots[0]["boundary_stats"][1], snapshots[-1]["boundary_stats"][1]
        out |= {f"{n}_std_first": first["std"], f"{n}_std_end": last["std"],
                f"{n}_boundary_over_regular": snapshots[-1]["token_type_rms"][1]["boundary_over_regular"],
                f"{n}_kurtosis": last["kurtosis"], f"{n}_kurtosis_distinct": last["kurtosis_distinct"]}
    return out


def boundary_figure(about: str, kind: str, draw: Callable) -> PaperTable:
    """Figures 4, 5 and A1: drawn for one seed (`draw`), and over seeds the rows of boundary_numbers of `kind`."""
    paper, types = P["boundary_std_after_block0"], P["token_type_rms"]
    post_range = "–".join(f"{v:g}" for v in paper["post_range"])
    rows = {"std": [report.Row("pre-grow, std of per-token RMS after block 0, first snapshot", "pre_std_first",
                               paper["pre"][0], 3),
                    report.Row("pre-grow, the same, last snapshot", "pre_std_end", paper["pre"][1], 3),
                    report.Row(f"post-grow, the same, first snapshot (paper: {post_range} throughout)",
                               "post_std_first", None, 4),
                    report.Row("post-grow, the same, last snapshot", "post_std_end", None, 4)],
            "ratio": [report.Row(f"{n}-grow, boundary / regular RMS after block 0, last snapshot",
                                 f"{n}_boundary_over_regular", types[n]["boundary"][1] / types[n]["regular"][1], 3)
                      for n in ("pre", "post")],
            "kurtosis": [report.Row(f"pre-grow, Pearson kurtosis of per-token RMS after block 0, last snapshot "
                                    f"(paper: > {P['final_kurtosis_pre_above']:g})", "pre_kurtosis", None, 2),
                         report.Row("post-grow, the same (paper: far lighter)", "post_kurtosis", None, 2),
                         report.Row("pre-grow, the same over distinct states", "pre_kurtosis_distinct", None, 2),
                         report.Row("post-grow, the same over distinct states", "post_kurtosis_distinct", None, 2)]}
    return PaperTable(about, (PRE_GROW, POST_GROW), rows[kind], boundary_numbers, draw)


def transition_steps(ws) -> list[int]:
    S, K = ws.preset.run["phase_steps"], ws.preset.run["blocks"]
    return [p * S for p in range(1, K)]


def fig4_figures(ws, seed, caption=""):
    s = boundary_series(ws, seed)
    std = {n: [{"step": c["step"], "std": [b["std"] for b in c["boundary_stats"]],
                "kurtosis": [b["kurtosis"] for b in c["boundary_stats"]]} for c in s[n]] for n in s}
    paper = P["boundary_std_after_block0"]
    cited = {"pre": " → ".join(f"{v:g}" for v in paper["pre"]), "post": "–".join(f"{v:g}" for v in paper["post_range"])}
    table = []
    for n in s:
        last = s[n][-1]
        for b in range(1, len(last["boundary_stats"])):
            # a block appended later has no value at the first snapshot: its first is a later one
            since = next(c for c in s[n] if b < len(c["boundary_stats"]))
            kit = f"{since['boundary_stats'][b]['std']:.4g} → {last['boundary_stats'][b]['std']:.4g}"
            table.append((f"{n}-grow, std of per-token RMS {diag.boundary_label(b)}, steps {since['step']} → "
                          f"{last['step']}", kit, cited[n] if b == 1 else None))
    return {"fig4": figures.fig4_boundary_std(s, ws.results / "fig4.png", transition_steps=transition_steps(ws),
                                              caption=caption),
            "boundary_std": std, "table": table}


def fig5_figures(ws, seed, caption=""):
    s = boundary_series(ws, seed)
    S = ws.preset.run["phase_steps"]
    rows = {n: readouts.metrics(ws.run_dir(RunName(n, "grow"), seed)) for n in NORMS}
    types = {n: [{"step": c["step"], **c["token_type_rms"][1]} for c in s[n]] for n in s}
    paper = P["token_type_rms"]
    table = []
    for n in s:
        first, last = types[n][0], types[n][-1]
        for name in ("boundary", "delimiter", "regular"):
            cited = paper[n].get(name)
            table.append((f"{n}-grow, {name}-token RMS after block 0, steps {first['step']} → {last['step']}",
                          f"{first[f'{name}_rms']:.4g} → {last[f'{name}_rms']:.4g}",
                          " → ".join(f"{v:g}" for v in cited if v is not None) if cited else None))
        ratio = paper[n]["boundary"][1] / paper[n]["regular"][1]
        table.append((f"{n}-grow, boundary / regular RMS at the end", last["boundary_over_regular"],
                      f"{ratio:.1f} (at 150k)"))
    for n in rows:
        ends = [r["ce"] for r in rows[n] if r.get("eval") and not r.get("phase_start") and r["step"] % S == 0]
        table.append((f"{n}-grow, validation CE at each phase end", " / ".join(f"{v:.4f}" for v in ends),
                      P["table1"][n]["grow"]))
    return {"fig5a": figures.fig5a_token_types(s, ws.results / "fig5a.png", transition_steps=transition_steps(ws),
                                                caption=caption),
            "fig5b": figures.fig5b_validation(rows, ws.results / "fig5b.png", transition_steps(ws),
                                              smooth=diag.paper_scaled(200, S), caption=caption),
            "token_type_rms_after_block0": types, "definition": diag.TOKEN_TYPE_DEFINITION, "table": table}


def fig_a1_figures(ws, seed, caption=""):
    s = boundary_series(ws, seed)
    final = {n: s[n][-1]["token_rms"][1] for n in s}
    stats = {n: s[n][-1]["boundary_stats"][1] for n in s}
    batch = readouts.diagnostic_batch(ws)
    rows, tokens = batch.mask.shape[0], int(batch.mask.sum())
    cap = diag.kurtosis_cap(rows, tokens)
    table = [(f"{n}-grow, Pearson kurtosis of per-token RMS after block 0 ({stats[n]['tokens']} tokens)",
              stats[n]["kurtosis"], f"> {P['final_kurtosis_pre_above']:g}" if n == "pre" else "far lighter")
             for n in s]
    table += [(f"{n}-grow, the same over distinct states ({stats[n]['distinct_tokens']})", stats[n]["kurtosis_distinct"],
               None) for n in s]
    table += [(f"largest kurtosis a batch of {rows} rows and {tokens} tokens allows (one boundary outlier per row)",
               cap, f"{diag.kurtosis_cap(2, 2 * 2048):.0f} for the paper's 2 x 2048")]
    return {"figA1": figures.figA1_rms_histograms(final, ws.results / "figA1.png", cap=cap, caption=caption),
            "pearson_kurtosis": {n: stats[n]["kurtosis"] for n in s},
            "kurtosis_distinct": {n: stats[n]["kurtosis_distinct"] for n in s}, "kurtosis_cap": cap, "table": table}


def fig_a2_figures(ws, seed, caption=""):
    results = {run.name: readouts.block_removal(ws, run, seed) for run in TABLE4_TITLES}
    table = [(f"{title}, block {r['block']}: {label}", r[metric], P["table4"][run.name][metric][r["block"]])
             for run, title in TABLE4_TITLES.items() for metric, _, label in TABLE4_METRICS for r in results[run.name]]
    return {"figA2": figures.figA2_block_removal(results, ws.results / "figA2.png", caption=caption),
            "block_removal": results, "table": table}


P = PAPER
TABLES = {
    "table1": PaperTable(
        "Table 1: validation CE under unique-token-matched budgets; delta = post - pre", MAIN_RUNS,
        [report.Row(f"{n}-norm, {p}", f"{n}_{p}", P["table1"][n][p]) for n in NORMS for p in ("joint", "grow")]
        + [report.Row("delta joint", "delta_joint", DELTAS["delta_joint"]),
           report.Row("delta grow", "delta_grow", DELTAS["delta_grow"], sign=True),
           report.Row("interaction = delta grow - delta joint", "interaction", DELTAS["interaction"], sign=True)],
        numbers=table1_numbers, readings=("interaction", "delta_joint", "delta_grow"),
        claims=[("post-norm and pre-norm nearly tie under joint training (|delta joint| < |delta grow|)",
                 lambda m: abs(m["delta_joint"]) < abs(m["delta_grow"]))]),
    "table2": PaperTable(
        "Table 2: single block (phase 0 of grow). KD = soft-target cross-entropy H(q_T, q_S) = KL + H(q_T), "
        "the scale of the paper's KD column; KL shown too", (PRE_GROW, POST_GROW),
        [report.Row(f"{n}-norm {m}", f"{n}_{m}", P["table2"][n].get(m), 2 if m == "ppl" else 4)
         for n in ("pre", "post") for m in ("ce", "kd", "kl", "ppl")]
        + [report.Row("delta CE (post - pre)", "delta_ce", P["table2"]["post"]["ce"] - P["table2"]["pre"]["ce"], sign=True)]
        + [report.Row(f"{n}-norm {m} at step 0 (before any update)", f"{n}_{m}_step0", None)
           for n in ("pre", "post") for m in ("ce", "kd")]
        + [report.Row("delta CE at step 0 (post - pre): the output-interface gap", "delta_ce_step0", None)]
        + [report.Row(f"delta CE at the end of phase {p} (post - pre)", f"delta_ce_phase_{p}",
                      P["per_phase_ce"]["post"][p] - P["per_phase_ce"]["pre"][p] if p in P["per_phase_ce"]["pre"] else None,
                      sign=True) for p in range(3)]
        + [report.Row("delta CE, last phase end - phase 0 end (how post-norm's lead moves as blocks are appended)",
                      "delta_ce_last_minus_phase_0", None)],
        numbers=table2_numbers, readings=tuple(f"delta_ce_phase_{p}" for p in range(3)) + ("delta_ce_last_minus_phase_0",)),
    "table3": PaperTable(
        "Table 3: joint budget controls for both placements (validation CE); beyond the paper, the pre-norm "
        "controls and a joint control that replays grow's shard for grow's steps (joint-replay)",
        TABLE3_RUNS,
        [report.Row("Post-Joint (unique tokens)", "post-joint", P["table3"]["post-joint"]),
         report.Row("Post-Joint-long (active-layer tokens)", "post-joint-long", P["table3"]["post-joint-long"]),
         report.Row("Post-Joint-longer (total tokens)", "post-joint-longer", P["table3"]["post-joint-longer"]),
         report.Row("Post-Joint-replay (grow's steps on grow's shard)", "post-joint-replay", None),
         report.Row("Post-Grow (comparison)", "post-grow", P["table3"]["post-grow"]),
         *(report.Row(f"Pre-{run.protocol.capitalize()}", run.name, None) for run in TABLE3_RUNS if run.norm == "pre"),
         report.Row("post: grow - joint-longer (does growth beat more steps?)", "post_grow_minus_longer",
                    P["table3"]["post-grow"] - P["table3"]["post-joint-longer"], sign=True),
         report.Row("pre: grow - joint-longer", "pre_grow_minus_longer", None),
         report.Row("post: grow - joint-replay (the same shard and steps)", "post_grow_minus_replay", None),
         report.Row("pre: grow - joint-replay", "pre_grow_minus_replay", None),
         report.Row("Table 1's interaction, beside them", "interaction", DELTAS["interaction"], sign=True),
         report.Row("the interaction at grow's steps: Δgrow − Δjoint-longer", "interaction_longer", None, sign=True),
         report.Row("the interaction on grow's shard: Δgrow − Δjoint-replay", "interaction_replay", None, sign=True)],
        numbers=table3_numbers, readings=(*(f"{n}_grow_minus_{c}" for c in ("longer", "replay") for n in ("post", "pre")),
                                          "interaction", "interaction_longer", "interaction_replay"),
        claims=[("Post-Grow is below every post-norm joint control, the longest included",
                 lambda m: m["post-grow"] < min(m["post-joint"], m["post-joint-long"], m["post-joint-longer"]))]),
    "tableA2": PaperTable(
        "Table A2: training budgets in non-padding tokens, counted from the runs' batches; active-layer tokens "
        "= tokens x active decoder layers", TABLE_A2_RUNS,
        [report.Row(f"{name} {kind.replace('_', '-')} tokens", f"{name}_{kind}",
             P["table_a2"][name][i] * 1e9 if i < 2 else None, report.TOKENS, compare=False)  # scale-bound counts
         for name in (run.name for run in TABLE_A2_RUNS)
         for i, kind in enumerate(("total", "unique", "active_layer"))]
        + [report.Row("grow / joint, total tokens", "grow_over_joint_total", 9.34 / 3.11, 3),
           report.Row("joint-long / grow, active-layer tokens (proxy match)", "long_over_grow_active_layer", 1.0, 3),
           report.Row("joint-longer / grow, total tokens", "longer_over_grow_total", 1.0, 3)],
        numbers=table_a2_numbers,
        note="The paper's token counts are at full scale; at smaller scales compare the ratios."),
    "tableA3": PaperTable(
        "Table A3: freeze ablation (validation CE at the end of the last phase)",
        (PRE_GROW, POST_GROW, RunName("pre", "freeze"), RunName("post", "freeze")),
        [report.Row(f"{n}-norm {p}", f"{n}_{p}", P["table_a3"][n][p]) for n in NORMS for p in ("grow", "freeze")]
        + [report.Row("delta grow (post - pre)", "delta_grow", DELTAS["delta_grow"], sign=True),
           report.Row("delta freeze", "delta_freeze", DELTAS["delta_freeze"], sign=True),
           report.Row("delta freeze - delta grow", "delta_freeze_minus_grow", DELTAS["delta_freeze_minus_grow"]),
           report.Row("PPL gap grow", "ppl_gap_grow", P["table_a3"]["ppl_gap"]["grow"], 2, sign=True),
           report.Row("PPL gap freeze", "ppl_gap_freeze", P["table_a3"]["ppl_gap"]["freeze"], 2, sign=True)],
        numbers=table_a3_numbers, readings=("delta_freeze_minus_grow", "delta_freeze"),
        claims=[("freezing earlier blocks leaves the post - pre difference nearly unchanged "
                 "(|delta freeze - delta grow| < |delta grow| / 2)",
                 lambda m: abs(m["delta_freeze_minus_grow"]) < abs(m["delta_grow"]) / 2)]),
    "table4": PaperTable(
        "Table 4: whole-block removal on the fixed diagnostic batch: dCE = CE(skip) - CE(full); "
        "angular distance = arccos(cos(h_in, h_out)) / pi", MAIN_RUNS,
        [report.Row(f"{title}, block {b}: {label}", f"{run.name}_{short}_{b}", P["table4"][run.name][metric][b], 3)
         for run, title in TABLE4_TITLES.items() for metric, short, label in TABLE4_METRICS for b in range(3)],
        numbers=table4_numbers, layout=table4_grid,
        # The paper's Section 5 claims, its own numbers as the thresholds. Absolute CE costs are scale-bound: below
        # full scale a "DISAGREES" on the first two says the kit's blocks carry less, not a sign error.
        claims=[("removing any post-grow block raises CE by at least 2.38 (the paper's smallest post-grow ΔCE)",
                 lambda m: min(m[f"post-grow_dce_{b}"] for b in range(3)) >= min(P["table4"]["post-grow"]["delta_ce"])),
                ("every post-grow block's angular distance is above 0.34 (the paper's smallest)",
                 lambda m: min(m[f"post-grow_angular_{b}"] for b in range(3)) > 0.34),
                ("only pre-grow has a near-identity final block: its final-block ΔCE and angular distance are the "
                 "smallest of the four runs'",
                 lambda m: all(m[f"pre-grow_{k}_2"] < m[f"{r}_{k}_2"] for k in ("dce", "angular")
                               for r in ("post-grow", "pre-joint", "post-joint"))),
                ("post-joint has low removal sensitivity on block 0 and high on block 2 (0.55, 0.99, 4.00): block 0 "
                 "has the smallest ΔCE of its blocks, block 2 the largest, and its block 0 is below every other "
                 "run's block 0",
                 lambda m: m["post-joint_dce_0"] < m["post-joint_dce_1"] < m["post-joint_dce_2"]
                 and all(m["post-joint_dce_0"] < m[f"{r}_dce_0"] for r in ("pre-grow", "post-grow", "pre-joint"))),
                ("block 0 carries the most in pre-grow, post-grow and pre-joint",
                 lambda m: all(m[f"{r}_dce_0"] > max(m[f"{r}_dce_1"], m[f"{r}_dce_2"])
                               for r in ("pre-grow", "post-grow", "pre-joint")))]),
    "tableA4": PaperTable(
        "Table A4: transition-aligned training-loss response (windows scaled to the phase length, at least "
        f"{diag.MIN_WINDOW} steps). Jump: the smoothed peak minus the baseline; immediate: the highest raw "
        "loss in the smoothing window after the transition. AUC: mean (loss - baseline), signed and absolute. "
        "The paper does not define its columns; its value stands beside each reading", (PRE_GROW, POST_GROW),
        [report.Row(f"{n}-norm, transition {t}, {label}", f"{n}_{t}_{key}", P["table_a4"][n][t - 1][pkey], d,
             compare=key != "recovery")  # recovery: this scale's steps against the paper's
         for n in ("pre", "post") for t in (1, 2)
         for label, key, pkey, d in (("jump (smoothed)", "jump", "jump", 4),
                                     ("jump (immediate)", "immediate_jump", "jump", 4),
                                     ("AUC 1k, mean |excess|", "auc_1k", "auc_1k", 4),
                                     ("AUC 1k, mean excess", "signed_auc_1k", "auc_1k", 4),
                                     ("AUC 5k, mean |excess|", "auc_5k", "auc_5k", 4),
                                     ("AUC 5k, mean excess", "signed_auc_5k", "auc_5k", 4),
                                     ("recovery steps", "recovery", "recovery_steps", 0))],
        numbers=table_a4_numbers,
        claims=[(f"post-norm's smoothed jump exceeds pre-norm's at transition {t}",
                 lambda m, t=t: m[f"post_{t}_jump"] > m[f"pre_{t}_jump"]) for t in (1, 2)],
        note="Recovery steps are in this scale's steps (the paper's in 50k-step phases): n/a = the smoothed loss "
             "never rose above the baseline; inf = it had not come back by the end of the phase."),
    "fig3": PaperTable("Figure 3: (a) interaction, (b) per-phase validation CE of grow", MAIN_RUNS,
                       figures=fig3_figures),
    "fig4": boundary_figure("Figure 4: std of per-token RMS at each block boundary across grow checkpoints", "std",
                            fig4_figures),
    "fig5": boundary_figure("Figure 5: (a) token-type RMS after block 0 across checkpoints, (b) validation CE "
                            "through grow", "ratio", fig5_figures),
    "figA1": boundary_figure("Figure A1: per-token RMS after block 0 at the final checkpoint", "kurtosis",
                             fig_a1_figures),
    "figA2": PaperTable("Figure A2: block removal per block", MAIN_RUNS, figures=fig_a2_figures),
}
