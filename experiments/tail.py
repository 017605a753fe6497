"""The account's causal test by construction (issue 49; its entry in docs/preregistrations.md, 2026-12-04):
a heavy tail in the student's own residual stream, under both protocols.

    python repro.py tail --scale toy --seeds 42,43,44,45,46,47,48,49   # results/<scale>/tail.md and .json
    python -m experiments.tail                                         # the sizing and the power calculation

At CPU budgets no student grows the paper's ~37x boundary tail (toy: 1.2x), so it is built in: one massive channel
in the student's frozen copy of the boundary token's embedding row (RunConfig.boundary_tail), the teacher untouched.
Pre-norm's stream carries it through every block; post-norm's entry RMSNorm keeps its direction, not its size.
The design: placement x protocol x tail (none, 37x), seeds 42-49; ~6.1x on pre-norm for the response's shape; the
planted channel dose under both protocols. Primary: D = (pre-grow tail - pre-grow) - (pre-joint tail - pre-joint),
predicted > 0, read only after the manipulation check (every 37x pre-norm student's boundary/regular RMS >=
presets.MECHANISM's 10 at every block boundary at the end of every phase).
"""

import json
import math
import statistics
from functools import lru_cache
from pathlib import Path

import torch

import model
import paper
import rundir
from experiments import presets, readings, report, studies, suite
from experiments.power import power
from experiments.suite import RunName, run_folder
from experiments.variants import Variant, train_variants, variant_workspace
from interventions.boundary import with_tail
from nets import hidden_only
from plumbing import errors

# The dose, sized from what the kit measured (fixed in the entry before any of its runs)

PAPER_RATIO = 37.0           # the paper's boundary/regular RMS (pre-norm, after block 0 at the end of growth)
SMALL_RATIO = 37.0 ** 0.5    # the log-midpoint of 1 and 37: the response's shape between none and the paper's
# The regular tokens' RMS after block 0 at the end of phase 0 of an undosed pre-norm student (the boundary a first
# appended block reads), measured at toy from the records of pre-grow, seeds 42-44 (`python -m experiments.tail`):
# 7.804, 8.415, 8.008. At smoke the path only (numbers meaningless): the stream's RMS there is not measured.
REGULAR_RMS = {"toy": 8.0755, "smoke": 1.0}
CHECK_RATIO = presets.MECHANISM["boundary_over_regular"]  # the manipulation check's threshold (fixed before it)


def check_scale(scale: str):
    """The dose is sized from the regular RMS measured at a scale: one without it is one line naming --scale."""
    if scale not in REGULAR_RMS:
        raise errors.OptionError("--scale", f"{scale}: the causal test sizes its tail from the regular tokens' RMS "
                                 f"measured at a scale, and none is measured at {scale}; choose "
                                 f"{' or '.join(REGULAR_RMS)}, or measure it (measure_regular_rms, over {scale}'s "
                                 "recorded pre-grow runs) and add it to experiments/tail.py's REGULAR_RMS")


def tail_value(scale: str, ratio: float, hidden: int) -> float:
    """The channel's value that puts the boundary token's RMS at `ratio` x the regular tokens' after block 0:
    one channel of value v has RMS v / sqrt(H), the rest of the row (~0.13) is negligible beside it."""
    check_scale(scale)
    return round(ratio * REGULAR_RMS[scale] * math.sqrt(hidden), 1)


def measure_regular_rms(records: Path, seeds=(42, 43, 44)) -> list[float]:
    """Per seed, the monitor's mean RMS after block 0 at phase 0's last monitor row of the recorded pre-grow run."""
    rows = {seed: studies.read_record(records / f"{run_folder('pre-grow', seed)}.json")["metrics"] for seed in seeds}
    last = {seed: [r for r in rows[seed] if r.get("monitor") and r.get("phase") == 0][-1] for seed in seeds}
    return [next(b["mean"] for b in last[seed]["boundaries"] if b["boundary"] == 1) for seed in seeds]


# The power calculation (the entry's): D's spread planned from the kit's measured differences of dose effects

EFFECT = 0.0332      # the paper's interaction (Table 1): the size of penalty the account must explain
PLANNING_SD = 0.0116  # the largest per-seed SD of the planted interactions at toy (0.0116, 0.0092; 3 seeds)
PESSIMISTIC_SD = 0.0429  # Table 1's interaction at toy (a difference of placements, not doses: an upper bound)
# The seeds: 42-49 (presets.DEFAULT_SEEDS["tail"]), the floor of 8, past what PLANNING_SD needs (power_table).
NO_POWER = "none: no reading: one seed (D's interval, and so its power, needs two seeds or more)"


def powers(n: int) -> tuple[float, float] | None:
    """The primary's power for the paper's size over n seeds at the planned and the pessimistic SD; None for one."""
    return (power(EFFECT, PLANNING_SD, n), power(EFFECT, PESSIMISTIC_SD, n)) if n >= 2 else None


def power_table(ns=range(3, 17)) -> list[dict]:
    return [{"n": n, "planning": power(EFFECT, PLANNING_SD, n), "pessimistic": power(EFFECT, PESSIMISTIC_SD, n),
             "half_effect": power(EFFECT / 2, PLANNING_SD, n)} for n in ns]


CHANNEL = {"run": {"boundary": "dose-channel", "boundary_scale": 1000.0}}  # beyond.DOSES's planted channel dose
CELLS = [(norm, protocol) for norm in ("pre", "post") for protocol in ("joint", "grow")]


def variants(scale: str, hidden: int) -> list[Variant]:
    """Every run of the design: the suite's four, the four at 37x, pre-norm's two at ~6.1x, the channel dose's four."""
    full, small = (tail_value(scale, r, hidden) for r in (PAPER_RATIO, SMALL_RATIO))
    out = [Variant(f"{n}-{p}", RunName(n, p)) for n, p in CELLS]
    out += [Variant(f"{n}-{p} + tail 37x", RunName(n, p), "tail-37", {"run": {"boundary_tail": full}}) for n, p in CELLS]
    out += [Variant(f"pre-{p} + tail 6x", RunName("pre", p), "tail-6", {"run": {"boundary_tail": small}})
            for p in ("joint", "grow")]
    out += [Variant(f"{n}-{p} + channel 1000x", RunName(n, p), "dose-channel-1000", CHANNEL) for n, p in CELLS]
    return out


def ws_variants(ws: suite.Workspace) -> list[Variant]:
    return variants(ws.preset.name, presets.teacher_shape(ws.preset).hidden_size)


def manifest(ws: suite.Workspace, seeds: list[int]) -> list[studies.Job]:
    return studies.unique(studies.Job(variant_workspace(ws, v, s), v.run, s) for s in seeds for v in ws_variants(ws))


# The numbers, from each run's done.json and kept log rows: a run folder's (live) or its record's (the page)

def contrast(ce: dict, dosed: str, norm: str) -> list[float]:
    """Per seed, (norm-grow dosed - norm-grow) - (norm-joint dosed - norm-joint)."""
    grow, joint = (f"{norm}-{p}" for p in ("grow", "joint"))
    return [(gd - g) - (jd - j) for gd, g, jd, j in zip(ce[f"{grow} + {dosed}"], ce[grow], ce[f"{joint} + {dosed}"],
                                                         ce[joint])]


def lowest_ratio(rows: list[dict]) -> dict | None:
    """The lowest boundary/regular RMS after block 0 at a phase's last monitor row: {"phase", "boundary", "ratio"}."""
    last = {row["phase"]: row for row in rows if row.get("monitor")}
    found = [{"phase": p, "boundary": b["boundary"], "ratio": b["boundary_over_others"]}
             for p, row in sorted(last.items()) for b in row["boundaries"] if b["boundary"] >= 1]
    return min(found, key=lambda r: r["ratio"], default=None)


def family(ce: dict) -> list[dict]:
    """The primary (alone: no adjustment) and the declared secondary family, Holm over it."""
    three_way = lambda dosed: [a - b for a, b in zip(contrast(ce, dosed, "pre"), contrast(ce, dosed, "post"))]
    rows = [{"name": "D, pre-norm, tail 37x", "primary": True, "d": report.across_seeds(contrast(ce, "tail 37x", "pre"))}]
    secondary = [("D, post-norm, tail 37x", contrast(ce, "tail 37x", "post")),
                 ("three-way: D pre - D post, tail 37x", three_way("tail 37x")),
                 ("D, pre-norm, tail 6x", contrast(ce, "tail 6x", "pre")),
                 ("three-way: D pre - D post, channel 1000x", three_way("channel 1000x"))]
    rows += [{"name": name, "primary": False, "d": report.across_seeds(values)} for name, values in secondary]
    rows[0]["p"] = report.p_two_sided(rows[0]["d"])
    rows[0]["reading"] = report.reading(rows[0]["d"], presets.TIE_MARGIN)
    for row, p in zip(rows[1:], readings.holm_family([r["d"] for r in rows[1:]])):  # NaN: no test
        row["p"], row["reading"] = p, report.reading(row["d"], presets.TIE_MARGIN, p)
    for row in rows:
        row["smallest_tie_margin"] = report.smallest_tie_margin(row["d"])
    return rows


def outcome(scale: str, hidden: int, seeds: list[int], read: dict[str, tuple]) -> dict:
    """The report's numbers from `read`, {run folder: (done, rows, machine row)} of the runs that are in, or, before every
    run is in, how many are."""
    runs, label = variants(scale, hidden), lambda v, s: run_folder(v.run.name, s, v.folder)  # as studies.Job.label
    found = {(v.label, s): read[label(v, s)] for v in runs for s in seeds if label(v, s) in read}
    # No numbers to ship: its page reads the committed records (recorded_outcome), never a reference.
    out = {"experiment": "tail", "scale": scale, "seeds": seeds, "numbers": {}, "runs": len(runs) * len(seeds),
           "recorded": len(found), "check_ratio": CHECK_RATIO, "tie_margin": presets.TIE_MARGIN,
           "machines": [found[v.label, s][2] for s in seeds for v in runs if (v.label, s) in found]}
    if len(found) < out["runs"]:
        return out
    done = lambda v, s: found[v.label, s][0]
    ce = {v.label: [report.DIVERGED if done(v, s).get("diverged") else done(v, s)["ce"] for s in seeds] for v in runs}
    out["ce"] = {k: report.across_seeds(v) for k, v in ce.items()}
    out["family"] = family(ce)
    out["diverged_runs"] = [f"{label(v, s)} (step {done(v, s)['diverged']['step']}: {done(v, s)['diverged']['why']})"
                            for v in runs for s in seeds if done(v, s).get("diverged")]
    out["checks"] = [{"run": v.label, "norm": v.run.norm, "lowest": (lowest := [lowest_ratio(found[v.label, s][1])
                                                                                for s in seeds]),
                      "met": all(low is not None and low["ratio"] >= CHECK_RATIO for low in lowest)}
                     for v in runs if v.folder == "tail-37"]
    out["doses"], out["channel_parts"] = dose_agreement(ce), channel_parts(ce)
    out["attention"] = {name: attention_summary({r: [last_attention(found[r, s][1]) for s in seeds] for r in names})
                        for name, names in ATTENTION_RUNS}
    out["position_state"] = position_state(scale) if presets.PRESETS[scale].shipped_teachers else None
    return out


# What the tie tests (issue 57): where the dose sits, whether its size matters, whether position 0 draws attention

DOCUMENTS = 8     # the documents position_state compares, each opened by the boundary token
SHAPE_SEED = 42   # the built students' seed: position 0's state is the same across documents whatever the weights
ATTENTION_RUNS = (("undosed", ("pre-joint", "pre-grow")), ("37x", ("pre-joint + tail 37x", "pre-grow + tail 37x")))


@torch.no_grad()
def position_spread(student: model.Student, input_ids: torch.Tensor, position: int) -> list[float]:
    """Per block boundary (the input of block 0, then each block's output: return_boundaries), the largest
    difference of the hidden state at `position` between any two documents of the batch (its rows), over channels."""
    _, boundaries = student(input_ids, output_fn=hidden_only, return_boundaries=True)
    return [(h[:, position].amax(0) - h[:, position].amin(0)).max().item() for h in boundaries]


def documents(eot: int, rows: int, length: int, seed: int = 0) -> torch.Tensor:
    """`rows` documents of random regular ids, each opened by the boundary token `eot`, as data.py opens one."""
    ids = torch.randint(0, eot, (rows, length), generator=torch.Generator().manual_seed(seed))
    ids[:, 0] = eot
    return ids


@lru_cache(maxsize=None)
def position_state(scale: str) -> dict:
    """position_spread at positions 0 and 1 of a pre- and a post-norm student built from the scale's shipped teacher
    with the 37x tail, as its runs start (the records keep no weights). Position 0 attends to itself alone, RoPE there
    is the identity and all else acts per row, so its state is the boundary token's alone: 0 up to float rounding."""
    preset = presets.PRESETS[scale]
    teacher = model.load_qwen3(suite.SHIPPED_ROOT / preset.shipped_teachers[0] / "phase-0")
    eot = teacher.config.vocab_size - 1  # the kit's toy vocabulary: its ids, then <|endoftext|> (data.py)
    ids = documents(eot, DOCUMENTS, preset.data["max_len"])
    value = tail_value(scale, PAPER_RATIO, teacher.config.hidden_size)
    out = {"documents": DOCUMENTS, "length": preset.data["max_len"], "teacher": preset.shipped_teachers[0]}
    for norm in ("pre", "post"):
        student = model.Student.from_teacher(teacher, preset.run["blocks"], preset.run["layers_per_block"], norm,
                                             SHAPE_SEED)
        with torch.no_grad():
            student.embed_tokens.weight.copy_(with_tail(student.embed_tokens.weight, eot, value))
        out[norm] = {position: position_spread(student, ids, position) for position in (0, 1)}
    return out


def last_attention(rows: list[dict]) -> list[list[float]]:
    """Each layer's per-head attention on position 0 (diag.first_token_attention) at a run's last monitor row."""
    last = [row for row in rows if row.get("monitor")][-1:]  # none: a run that logged no monitor row
    return [heads for row in last for heads in row["first_attention"] if heads is not None]


def attention_summary(per_run: dict[str, list[list[list[float]]]]) -> dict:
    """{"layers": each layer's mean over heads, seeds and runs, "highest": the largest head's} of last_attention's."""
    per_layer = [h for per_seed in per_run.values() for layers in per_seed for h in enumerate(layers)]
    if not per_layer:
        return {"layers": [], "highest": math.nan}
    return {"layers": [statistics.fmean(h for layer, heads in per_layer if layer == i for h in heads)
                       for i in range(1 + max(layer for layer, _ in per_layer))],
            "highest": max(h for _, heads in per_layer for h in heads)}


def dose_agreement(ce: dict) -> dict:
    """The 37x and ~6.1x tails on pre-norm: each protocol's CE difference (37x − 6x) read, and D's correlation."""
    diff = {p: report.paired(ce[f"pre-{p} + tail 37x"], ce[f"pre-{p} + tail 6x"]) for p in ("joint", "grow")}
    for s in diff.values():
        s["reading"] = readings.read(s)
    d37, d6 = contrast(ce, "tail 37x", "pre"), contrast(ce, "tail 6x", "pre")
    return {"ce_difference": diff, "d_correlation": correlation(d37, d6)}


def correlation(x: list[float], y: list[float]) -> float:
    """Pearson's r over seeds; NaN where there is none: a diverged run's value, under two seeds, a constant side."""
    finite = all(isinstance(v, float) and math.isfinite(v) for v in x + y)
    return statistics.correlation(x, y) if finite and len(set(x)) > 1 and len(set(y)) > 1 else math.nan


def channel_parts(ce: dict) -> list[dict]:
    """The three-way channel contrast's parts, D pre and D post, each read alone (post hoc: no Holm adjustment)."""
    rows = [{"name": f"D, {norm}-norm, channel 1000x", "d": report.across_seeds(contrast(ce, "channel 1000x", norm))}
            for norm in ("pre", "post")]
    for row in rows:
        row["reading"], row["smallest_tie_margin"] = readings.read(row["d"]), report.smallest_tie_margin(row["d"])
    return rows


def channel_words(out: dict) -> str:
    """Whose D the three-way channel contrast's reading comes from, chosen by the parts' readings."""
    three = next(row for row in out["family"] if row["name"].endswith("channel 1000x"))
    pre, post = out["channel_parts"]
    said = (f"The three-way channel contrast reads {three['reading']} (Holm); its parts, each read alone: pre-norm's "
            f"D {report.stats_cell(pre['d'], True)} reads {pre['reading']}, post-norm's "
            f"{report.stats_cell(post['d'], True)} reads {post['reading']}.")
    if three["reading"] == "above 0" and post["reading"] == "below 0" and pre["reading"] != "above 0":
        against = ", the opposite sign to the account's (D > 0)" if pre["reading"] == "below 0" else ""
        return (f"{said} Its \"above 0\" is post-norm's: the channel costs post-norm more under joint training than "
                f"under growth, while pre-norm's D reads {pre['reading']}{against}; it is no support for the "
                "account's prediction for pre-norm.")
    return f"{said} Pre-norm's D reads above 0, as the account predicts." if pre["reading"] == "above 0" else said


def scope_facts(out: dict) -> dict:
    """What scope_lines' words rest on: position 0's state, the two doses' tie, no sink, and D's reading."""
    state, doses, attention = out["position_state"], out["doses"]["ce_difference"], out["attention"]
    largest = max(abs(v) for norm in ("pre", "post") for v in state[norm][0])
    return {"same_state": largest <= 1e-6 * max(abs(v) for norm in ("pre", "post") for v in state[norm][1]),
            "sizes_tie": all(s["reading"].startswith("a tie") for s in doses.values()),
            "no_sink": all(a["highest"] < presets.SINK["attention"] for a in attention.values()),
            "d": readings.read(out["family"][0]["d"]), "largest": largest}


def verdict_words(d: str) -> str:
    claim = "the literal reading \"a massive boundary token costs the appended pre-norm block\""
    if d.startswith("a tie"):
        return f"D's tie within ±{presets.TIE_MARGIN:g} refutes, at this scale, {claim} (a cost past that margin)"
    if d in ("above 0", "below 0"):
        return f"D reads {d}: it {'supports' if d == 'above 0' else 'contradicts'} {claim}"
    return f"D reads {d}: it neither refutes nor supports {claim}"


def scope_conclusion(facts: dict) -> str:
    """The sentence that says what D tests, chosen by scope_facts."""
    pre = paper.PAPER["token_type_rms"]["pre"]
    drift = (f"the drift of the prefix's scale that the paper measures (its Figure 5a, pre-norm: the boundary "
             f"token's RMS {pre['boundary'][0]:g} → {pre['boundary'][1]:g}, the regular tokens' {pre['regular'][0]:g} → "
             f"{pre['regular'][1]:g} through growth)")
    if facts["same_state"] and facts["sizes_tie"] and facts["no_sink"]:
        return (f"So the dose is one constant vector at a position every document shares, which pre-norm's sublayers "
                f"read by its direction and no head attends to: {verdict_words(facts['d'])}; it does not test {drift}, "
                "which a constant dose does not reproduce.")
    failed = [what for key, what in (("same_state", "position 0's state differs across documents"),
                                     ("sizes_tie", "the two doses' CE is not a tie"),
                                     ("no_sink", "a head attends to position 0 as a sink")) if not facts[key]]
    return (f"So the dose is more than a constant vector read by its direction ({'; '.join(failed)}): "
            f"{verdict_words(facts['d'])}.")


def fine_cell(s: dict) -> str:
    """A difference near 0 with a fifth decimal on its mean, which stats_cell's four would show as ±0.0000."""
    return f"{s['mean']:+.5f} [{s['ci95'][0]:+.4f}, {s['ci95'][1]:+.4f}]" if s.get("ci95") else report.stats_cell(s, True)


def scope_lines(out: dict) -> list[str]:
    """The section's account of what the tie tests (issue 57), every number from outcome's."""
    state, doses, n = out["position_state"], out["doses"], len(out["seeds"])
    if state is None:
        return ["### What the tie tests", "", "Not computed: position 0's state needs a student built from a teacher "
                "the kit ships at this scale, and none is shipped."]
    facts, grow, joint = scope_facts(out), doses["ce_difference"]["grow"], doses["ce_difference"]["joint"]
    second = [v for norm in ("pre", "post") for v in state[norm][1]]
    zero = "0 at every block boundary, bit for bit" if facts["largest"] == 0 else \
        f"at most {facts['largest']:.2g} at a block boundary (float rounding)"
    layers = lambda a: ", ".join(f"{v:.3f}" for v in a["layers"])
    undosed, dosed = out["attention"]["undosed"], out["attention"]["37x"]
    return ["### What the tie tests", "",
            "**Where the dose sits.** The tail is in the frozen embedding row of the boundary token, which opens every "
            "document: position 0. Under causal attention position 0 attends to itself alone, so its state is the "
            f"same for every document: in a pre- and a post-norm student built from the shipped teacher "
            f"(`{state['teacher']}`) with the 37x tail, as its runs start (no student checkpoint is committed: the "
            f"records keep numbers, not weights), the largest difference of position 0's state across "
            f"{state['documents']} random documents of {state['length']} tokens is {zero}; at position 1 it is "
            f"{min(second):.3g} to {max(second):.3g}.", "",
            "**Whether its size matters.** The 37x and the ~6.1x tail, seed by seed (37x − 6x): pre-grow "
            f"{fine_cell(grow)} ({grow['reading']}), pre-joint {fine_cell(joint)} ({joint['reading']}); D at 37x and at 6x "
            f"correlate over the {n} seeds at r = {doses['d_correlation']:.3f}. Each pre-norm sublayer, the appended "
            "block's included, reads the stream through an RMSNorm, which keeps the dose's direction and drops its size"
            + (": the two sizes give the same CE." if facts["sizes_tie"] else "; the two sizes' CE is not read as a tie."),
            "", "**Whether position 0 draws attention.** Each layer's attention on position 0 at the pre-norm runs' end "
            "(their last monitor row; mean over heads, seeds and both protocols), layer by layer: undosed "
            f"{layers(undosed)}; with the 37x tail {layers(dosed)}. The largest head's mean on any layer, seed and run "
            f"is {max(undosed['highest'], dosed['highest']):.3f} (a sink head's is ≥ {presets.SINK['attention']:g}, "
            "presets.SINK): " + ("no sink forms, dosed or not." if facts["no_sink"] else "a sink forms."), "",
            scope_conclusion(facts)]


def scope_claim(out: dict) -> str:
    """scope_lines in one sentence, for the README's headline."""
    facts, grow = scope_facts(out), out["doses"]["ce_difference"]["grow"]
    attention = [v for a in out["attention"].values() for v in a["layers"]]
    return (f"What it tests: its dose sits at position 0, whose state differs across documents by "
            f"{facts['largest']:.2g} at every block boundary (a student built from the shipped teacher); its two sizes "
            f"agree seed by seed (37x − 6x on pre-grow {fine_cell(grow)}, {grow['reading']}; per-seed D "
            f"at the two correlate at r = {out['doses']['d_correlation']:.3f}); attention on position 0 is "
            f"{min(attention):.3f}-{max(attention):.3f} per layer, dosed or not. {scope_conclusion(facts)}")


def check_met(out: dict) -> bool:
    """The manipulation check, read before the primary: every dosed pre-norm student's ratio at or above CHECK_RATIO."""
    return all(check["met"] for check in out["checks"] if check["norm"] == "pre")


def run_tail(ws: suite.Workspace, seeds: list[int], force: bool = False) -> dict:
    """The causal test's runs trained (those recorded restored) and its report (results/<scale>/tail.md/.json)."""
    # One seed trains and reads nothing rather than being refused: each run is recorded apart, so it joins later
    # seeds' records in the pre-registered study.
    if len(seeds) < 2 and ws.ctx.is_main:
        suite.console.print(f"tail: one seed ({seeds[0]}): its runs train and are recorded, and its report reads "
                            "nothing (no reading: one seed; D's interval needs two seeds or more)", highlight=False)
    studies.restore_study(ws, manifest(ws, seeds), force)
    train_variants(ws, ws_variants(ws), seeds, force)
    if not ws.ctx.is_main:
        return {}
    read = {job.label: (rundir.read_json(job.folder / "done.json"), rundir.read_metrics(job.folder),
                        studies.folder_machine_row(job.label, job.folder))
            for job in manifest(ws, seeds) if (job.folder / "done.json").is_file()}
    out = outcome(ws.preset.name, presets.teacher_shape(ws.preset).hidden_size, seeds, read)
    lines = markdown(out) + [""] + studies.machines_markdown(out["machines"])
    return report.write(ws.results, "tail", out, lines, echo=True)


def recorded_outcome(scale: str, records: Path | None = None) -> dict:
    """outcome() of the study at `scale` from its records (the committed ones unless given), each checked as its
    dry run checks it (studies.page_records)."""
    ws = studies.page_workspace(scale, records or studies.RECORDS_DIR)
    seeds = presets.DEFAULT_SEEDS["tail"][scale]
    read = {name: (r["done"], r["metrics"], studies.machine_row(name, r["provenance"], r["wall_seconds"]))
            for name, r in studies.page_records(manifest(ws, seeds)).items()}
    return outcome(scale, presets.teacher_shape(ws.preset).hidden_size, seeds, read)


def markdown(out: dict) -> list[str]:
    """The section, from outcome's numbers alone (live runs and committed records read the same)."""
    lines = [f"## The account's causal test by construction ({out['scale']} scale)", "",
             "A tail of the paper's size put into the students' own residual stream (the boundary token's frozen "
             "embedding row, one channel at 37x the regular tokens' RMS after block 0; the teacher untouched), under "
             "both protocols; pre-registered with its seeds, power calculation and manipulation check in "
             "docs/preregistrations.md (2026-12-04).", ""]
    if "family" not in out:
        return lines + [f"Running: {out['recorded']} of its {out['runs']} runs recorded (seeds "
                        f"{', '.join(map(str, out['seeds']))}); nothing is read until every pre-registered run is in."]
    lines += [f"Validation CE at each run's end, {report.seeds_text(out['seeds'])}; contrasts paired by seed. "
              "D = (grow with the tail − grow) − (joint with the tail − joint); the account predicts D > 0 for "
              "pre-norm. Power for the paper's size (0.033)" + (f": {NO_POWER}." if (both := powers(len(out["seeds"])))
                                                                 is None else f" at the planned SD {PLANNING_SD}: "
              f"{both[0]:.2f}; at the pessimistic SD {PESSIMISTIC_SD}: {both[1]:.2f}."), "",
              report.diverged_line(out["diverged_runs"], out["runs"]), "",
              f"**Manipulation check** (boundary/regular RMS ≥ {out['check_ratio']:g} at every block boundary at the "
              "end of every phase, for every pre-norm student at 37x): "
              + ("met" if check_met(out) else "**not met**: D is not read as a test of the account") + ".", "",
              "| run at 37x | lowest ratio per seed (phase, boundary) | check |", "| --- | --- | --- |"]
    for c in out["checks"]:
        cells = ", ".join("n/a" if low is None else f"{low['ratio']:.1f} (p{low['phase']}, b{low['boundary']})"
                          for low in c["lowest"])
        lines.append(f"| {c['run']} | {cells} | {'met' if c['met'] else 'not met'}"
                     f"{'' if c['norm'] == 'pre' else ' (reported)'} |")
    lines += ["", "| contrast | mean [95% CI] | per seed | p | reading | smallest tie margin |",
              "| --- | --- | --- | --- | --- | --- |"]
    for row in out["family"]:
        name = f"**{row['name']} (primary)**" if row["primary"] else f"{row['name']} (Holm over the secondaries)"
        lines.append(f"| {name} | {report.stats_cell(row['d'], True)} | {report.per_seed_text(row['d']['values'])} | "
                     f"{report.fmt(row['p'], 3)} | {row['reading']} | {report.fmt(row['smallest_tie_margin'], 4)} |")
    lines += ["", "Post hoc (issue 57; outside the pre-registered family, each read alone): the three-way channel "
              "contrast's parts.", "", "| contrast | mean [95% CI] | per seed | reading | smallest tie margin |",
              "| --- | --- | --- | --- | --- |"]
    lines += [f"| {row['name']} | {report.stats_cell(row['d'], True)} | {report.per_seed_text(row['d']['values'])} | "
              f"{row['reading']} | {report.fmt(row['smallest_tie_margin'], 4)} |" for row in out["channel_parts"]]
    lines += ["", channel_words(out), "", *scope_lines(out), "", "| run | validation CE |", "| --- | --- |"]
    lines += [f"| {name} | {report.stats_cell(s)} |" for name, s in out["ce"].items()]
    return lines


# The README's headline: the test's row and its sentence, from the committed records (recorded_outcome)

def headline_cells(out: dict) -> list[str]:
    """D and its reading (gated by the manipulation check) once every run is recorded, else how many are."""
    if "family" not in out:
        return [f"running: {out['recorded']} of {out['runs']} runs recorded", ""]
    d = out["family"][0]["d"]
    return [report.stats_cell(d, signed=True), readings.read(d) if check_met(out) else
            "not read: its manipulation check failed"]


def headline_claim(out: dict) -> list[str]:
    """In plain words, once every run is in: whether the prediction held, D's interval, the power, the check."""
    if "family" not in out:
        return []
    d, n = out["family"][0]["d"], len(out["seeds"])
    verdict = readings.read(d)
    held = ("is not read: its manipulation check failed" if not check_met(out) else "holds" if verdict == "above 0" else
            "is neither confirmed nor refuted (inconclusive)" if verdict == "inconclusive" else
            f"does not hold (D reads {verdict})")
    return [f"- **the account's causal test** (`{out['scale']}`, {n} seeds; its manipulation check, boundary/regular RMS "
            f">= {CHECK_RATIO:g} at every boundary of every pre-norm student with the 37x tail, "
            f"{'met' if check_met(out) else 'failed'}): the account's prediction, D > 0, {held}: "
            f"{report.stats_cell(d, signed=True)}; its power for the paper's size ({EFFECT:.3f}) was "
            + (NO_POWER if (both := powers(n)) is None else f"{both[0]:.2f} at the planned SD ({PLANNING_SD}), "
               f"{both[1]:.2f} at the pessimistic one ({PESSIMISTIC_SD})") + "."
            + (f" {scope_claim(out)}" if out["position_state"] is not None else "")]


if __name__ == "__main__":  # the entry's numbers, from the committed records and the kit's references
    measured = measure_regular_rms(studies.RECORDS_DIR / "toy")
    print(json.dumps({"regular_rms_per_seed": measured, "regular_rms": statistics.fmean(measured),
                      "tail_37x": tail_value("toy", PAPER_RATIO, 128), "tail_6x": tail_value("toy", SMALL_RATIO, 128),
                      "power": power_table()}, indent=1))
