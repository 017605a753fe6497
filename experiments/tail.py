"""The account's causal test by construction (issue 49; its entry in docs/preregistrations.md, 2026-12-04):
a heavy tail in the student's own residual stream, under both protocols.

    python repro.py tail --scale toy --seeds 42,43,44,45,46,47,48,49   # results/<scale>/tail.md and .json
    python -m experiments.tail                                         # the sizing and the power calculation

The paper explains post-norm's lead under growth by the boundary a pre-norm prefix hands each appended block:
structural tokens whose RMS drifts to ~37x the regular tokens'. At CPU budgets no student grows that tail
(toy: 1.2x), so here it is built in: the student's frozen copy of the document-boundary token's embedding row
gets one massive channel (RunConfig.boundary_tail; interventions/boundary.py, with_tail), the teacher untouched.
Every position 0 then starts from it. Pre-norm's residual stream carries it through every block (each sublayer
reads it through an RMSNorm, and what a sublayer adds is small beside it); post-norm's entry RMSNorm takes its
scale away before block 0, so post-norm's first sublayer reads, at position 0, a vector along the tail's channel
at the norm's gain there times sqrt(H) (and ~0 elsewhere): the tail's direction without its size.

The design: placement (pre, post) x protocol (joint, grow) x tail (none, 37x), seeds 42-49; the smaller dose
(sqrt(37) ~ 6.1x) on pre-norm for the response's shape; and the planted channel dose (beyond.py's, forward only
at every block boundary) under joint as well as grow. Primary: D = (pre-grow tail - pre-grow) - (pre-joint tail -
pre-joint), predicted > 0. Read only after the manipulation check: every 37x pre-norm student's boundary/regular
RMS >= presets.MECHANISM's 10 at every block boundary at the end of every phase (the monitor's rows).
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import rundir
from experiments import presets, readings, report, studies, suite
from experiments.power import power
from experiments.suite import RunName
from experiments.variants import Variant, train_variants, variant_workspace

# ----------------------------------------------------------------------------------------------
# The dose, sized from what the kit measured (fixed in the entry before any of its runs)

PAPER_RATIO = 37.0           # the paper's boundary/regular RMS (pre-norm, after block 0 at the end of growth)
SMALL_RATIO = 37.0 ** 0.5    # the log-midpoint of 1 and 37: the response's shape between none and the paper's
# The regular tokens' RMS after block 0 at the end of phase 0 of an undosed pre-norm student (the boundary a first
# appended block reads), measured at toy from the records of pre-grow, seeds 42-44 (`python -m experiments.tail`):
# 7.804, 8.415, 8.008. At smoke the path only (numbers meaningless): the stream's RMS there is not measured.
REGULAR_RMS = {"toy": 8.0755, "smoke": 1.0}
CHECK_RATIO = presets.MECHANISM["boundary_over_regular"]  # the manipulation check's threshold (fixed before it)
MEASURED_SEEDS = (42, 43, 44)


def tail_value(scale: str, ratio: float, hidden: int) -> float:
    """The channel's value that puts the boundary token's RMS at `ratio` x the regular tokens' after block 0:
    one channel of value v has RMS v / sqrt(H), the rest of the row (~0.13) is negligible beside it."""
    if scale not in REGULAR_RMS:
        raise ValueError(f"the tail is sized from the regular RMS measured at a scale; none is at {scale!r} (measured: "
                         f"{', '.join(REGULAR_RMS)}): measure it (measure_regular_rms) and add it to REGULAR_RMS")
    return round(ratio * REGULAR_RMS[scale] * math.sqrt(hidden), 1)


def measure_regular_rms(records: Path, seeds=MEASURED_SEEDS) -> list[float]:
    """Per seed, the monitor's mean per-token RMS after block 0 at the last monitor row of phase 0 of the recorded
    pre-grow run (records/<workspace>/s<seed>/pre-grow.json)."""
    out = []
    for seed in seeds:
        rows = studies.read_record(records / f"s{seed}" / "pre-grow.json")["metrics"]
        last = [r for r in rows if r.get("monitor") and r.get("phase") == 0][-1]
        out.append(next(b["mean"] for b in last["boundaries"] if b["boundary"] == 1))
    return out


# ----------------------------------------------------------------------------------------------
# The power calculation (the entry's): D's spread planned from the kit's measured differences of dose effects

EFFECT = 0.0332      # the paper's interaction (Table 1): the size of penalty the account must explain
PLANNING_SD = 0.0116  # the largest per-seed SD of the planted interactions at toy (0.0116, 0.0092; 3 seeds)
PESSIMISTIC_SD = 0.0429  # Table 1's interaction at toy (a difference of placements, not doses: an upper bound)
# The seeds: 42-49 (presets.DEFAULT_SEEDS["tail"]), the floor of 8, past what PLANNING_SD needs (power_table).


def power_table(ns=range(3, 17)) -> list[dict]:
    return [{"n": n, "planning": power(EFFECT, PLANNING_SD, n), "pessimistic": power(EFFECT, PESSIMISTIC_SD, n),
             "half_effect": power(EFFECT / 2, PLANNING_SD, n)} for n in ns]


# ----------------------------------------------------------------------------------------------
# The runs

CHANNEL = {"run": {"boundary": "dose-channel", "boundary_scale": 1000.0}}  # beyond.DOSES's planted channel dose
CELLS = [(norm, protocol) for norm in ("pre", "post") for protocol in ("joint", "grow")]


def variants(scale: str, hidden: int) -> list[Variant]:
    """Every run of the design: the suite's four, the four at 37x, pre-norm's two at ~6.1x, the planted channel
    dose's four (its grow runs in the planted experiment's folder: the same runs)."""
    full, small = (tail_value(scale, r, hidden) for r in (PAPER_RATIO, SMALL_RATIO))
    out = [Variant(f"{n}-{p}", RunName(n, p)) for n, p in CELLS]
    out += [Variant(f"{n}-{p} + tail 37x", RunName(n, p), "tail-37", {"run": {"boundary_tail": full}}) for n, p in CELLS]
    out += [Variant(f"pre-{p} + tail 6x", RunName("pre", p), "tail-6", {"run": {"boundary_tail": small}})
            for p in ("joint", "grow")]
    out += [Variant(f"{n}-{p} + channel 1000x", RunName(n, p), "dose-channel-1000", CHANNEL) for n, p in CELLS]
    return out


def ws_variants(ws: suite.Workspace) -> list[Variant]:
    return variants(ws.preset.name, presets.teacher_shape(ws.preset).hidden_size)


def label(v: Variant, seed: int) -> str:
    """Its folder under the scale's runs (and its record's path under the scale's records): studies.Job.label."""
    return f"beyond/{v.folder}/s{seed}/{v.run.name}" if v.folder else f"s{seed}/{v.run.name}"


def manifest(ws: suite.Workspace, seeds: list[int]) -> list[studies.Job]:
    return studies.unique(studies.Job(variant_workspace(ws, v, s), v.run, s) for s in seeds for v in ws_variants(ws))


# ----------------------------------------------------------------------------------------------
# The numbers, from each run's done.json and kept log rows: a run folder's (live) or its record's (the page), the
# same (a record keeps every monitor row and done.json; a folder restored from it holds them)

def contrast(ce: dict, dosed: str, norm: str) -> list[float]:
    """Per seed, (norm-grow dosed - norm-grow) - (norm-joint dosed - norm-joint)."""
    grow, joint = (f"{norm}-{p}" for p in ("grow", "joint"))
    return [(gd - g) - (jd - j) for gd, g, jd, j in zip(ce[f"{grow} + {dosed}"], ce[grow], ce[f"{joint} + {dosed}"],
                                                         ce[joint])]


def lowest_ratio(rows: list[dict]) -> dict | None:
    """The lowest boundary/regular RMS (the monitor's boundary_over_others) at a block boundary after block 0, at
    the last monitor row of a phase: {"phase", "boundary", "ratio"} (None: no monitor row)."""
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
    raw = [report.p_two_sided(r["d"]) for r in rows[1:]]
    for row, p, p_holm in zip(rows[1:], raw, report.holm(raw)):
        row["p"] = math.nan if math.isnan(p) else p_holm
        row["reading"] = report.adjusted_reading(row["d"], p_holm, presets.TIE_MARGIN)
    for row in rows:
        row["smallest_tie_margin"] = report.smallest_tie_margin(row["d"])
    return rows


def outcome(scale: str, hidden: int, seeds: list[int], read) -> dict:
    """The report's numbers from `read(label) -> (done, rows, machine row)` of every run, or, where a run has none
    yet, how many have (out["recorded"] < out["runs"]: no contrast is computed before every run is in)."""
    runs = variants(scale, hidden)
    found = {(v.label, s): got for v in runs for s in seeds if (got := read(label(v, s))) is not None}
    # No numbers to ship: its page reads the committed records (page_section), never a reference.
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
    return out


def check_met(out: dict) -> bool:
    """The manipulation check, read before the primary: every dosed pre-norm student's ratio at or above CHECK_RATIO."""
    return all(check["met"] for check in out["checks"] if check["norm"] == "pre")


def from_folders(ws: suite.Workspace):
    def read(name: str):
        folder = ws.runs / name
        if not (folder / "done.json").is_file():
            return None
        return rundir.read_json(folder / "done.json"), rundir.read_metrics(folder), studies.folder_machine_row(name, folder)
    return read


def from_records(records: Path):
    def read(name: str):
        path = records / f"{name}.json"
        if not path.is_file():
            return None
        record = studies.read_record(path)
        return record["done"], record["metrics"], studies.machine_row(name, record["provenance"], record["wall_seconds"])
    return read


def run_tail(ws: suite.Workspace, seeds: list[int], force: bool = False) -> dict:
    """The account's causal test by construction: placement (pre, post) x protocol (joint, grow) x a tail in the
    student's own boundary token (none, 37x; pre-norm also ~6.1x), and the planted channel dose under both
    protocols; D = (pre-grow tail - pre-grow) - (pre-joint tail - pre-joint), read after its manipulation check
    by the rule pre-registered in docs/preregistrations.md (results/<scale>/tail.md/.json). A study: recorded runs
    are not trained again."""
    studies.restore_study(ws, manifest(ws, seeds), force)
    train_variants(ws, ws_variants(ws), seeds, force)
    if not ws.ctx.is_main:
        return {}
    out = outcome(ws.preset.name, presets.teacher_shape(ws.preset).hidden_size, seeds, from_folders(ws))
    lines = markdown(out) + [""] + studies.machines_markdown(out["machines"])
    return report.write(ws.results, "tail", out, lines, echo=True)


def recorded_outcome(scale: str, records: Path = studies.RECORDS_DIR) -> dict:
    """outcome() of the study at `scale` as its records (the committed ones unless given) hold it."""
    hidden, seeds = presets.teacher_shape(presets.PRESETS[scale]).hidden_size, presets.DEFAULT_SEEDS["tail"][scale]
    return outcome(scale, hidden, seeds, from_records(records / scale))


def page_section(scale: str, records: Path) -> list[str]:
    """The results page's section, from the committed records alone (nothing to train on a fresh clone)."""
    return markdown(recorded_outcome(scale, records))


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
              f"pre-norm. Power for the paper's size (0.033) at the planned SD {PLANNING_SD}: "
              f"{power(EFFECT, PLANNING_SD, len(out['seeds'])):.2f}; at the pessimistic SD {PESSIMISTIC_SD}: "
              f"{power(EFFECT, PESSIMISTIC_SD, len(out['seeds'])):.2f}.", "",
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
    lines += ["", "| run | validation CE |", "| --- | --- |"]
    lines += [f"| {name} | {report.stats_cell(s)} |" for name, s in out["ce"].items()]
    return lines


# ----------------------------------------------------------------------------------------------
# The README's headline: the test's row and its sentence, from the committed records (recorded_outcome)

def headline_cells(out: dict) -> list[str]:
    """D and its reading once every pre-registered run is recorded (gated by the manipulation check), else how many are."""
    if "family" not in out:
        return [f"running: {out['recorded']} of {out['runs']} runs recorded", ""]
    d = out["family"][0]["d"]
    return [report.stats_cell(d, signed=True), readings.read(d) if check_met(out) else
            "not read: its manipulation check failed"]


def headline_claim(out: dict) -> list[str]:
    """In plain words, once every run is in: whether the account's prediction held, D's interval, the power, the check."""
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
            f"{power(EFFECT, PLANNING_SD, n):.2f} at the planned SD ({PLANNING_SD}), "
            f"{power(EFFECT, PESSIMISTIC_SD, n):.2f} at the pessimistic one ({PESSIMISTIC_SD})."]


if __name__ == "__main__":  # the entry's numbers, from the committed records and the kit's references
    measured = measure_regular_rms(studies.RECORDS_DIR / "toy")
    print(json.dumps({"regular_rms_per_seed": measured, "regular_rms": statistics.fmean(measured),
                      "tail_37x": tail_value("toy", PAPER_RATIO, 128), "tail_6x": tail_value("toy", SMALL_RATIO, 128),
                      "power": power_table()}, indent=1))
