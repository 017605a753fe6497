"""The account's causal test on the mechanism scale (issue 39; docs/preregistrations.md, 2026-12-03): the
three-way contrast C = Δgrow(mechanism) − Δgrow(control), paired by seed, and the gate that decides whether
it is read as a causal test at all. The page's words (experiments/pages.py) come from these numbers.

    python repro.py scan --scale mechanism    # also results/mechanism/criteria.json: the gate's statistics
    seeds, values = causal.paired(mechanism_reference, control_reference, "delta_grow")   # C per seed
    causal.gate_failure(causal.checks(mechanism_reference, control_reference))           # None: read C

The gate (the entry, as written): C is read as a causal test only if the mechanism teacher met its criterion
(presets.TEACHER_MECHANISM on `repro.py scan`'s layers), the mechanism pre-grow student met the student
criterion (presets.MECHANISM, seed 42, after block 0 at the end of growth), and the control passed its
manipulation check (its teacher has no layer from index 2 with max/median >= 100, and its pre-grow student
fails the student criterion). Their statistics reach the references as the criteria report, which `repro.py
scan` writes at these scales (write_criteria) and `repro.py reference` ships. A check with no measurement in
the references is not met: it is "not yet measured", and nothing causal is claimed.
"""
from __future__ import annotations

import diag
import rundir
from experiments import regime, report, tables
from experiments.presets import MECHANISM, TEACHER_MECHANISM
from plumbing import corpora

SCALES = ("mechanism", "mechanism-control")
STUDENT_SEED = 42  # the entry measures the student criterion on pre-grow, seed 42
# Where a reference holds the checks' statistics: tables["criteria"], per seed (the teacher's repeated).
CRITERIA = "criteria"
TEACHER_KEYS = ("teacher: massive_ratio_from_layer", "teacher: sink_heads_from_layer")
STUDENT_KEYS = tuple(f"pre-grow: {key}" for key in MECHANISM)
GATE = ("the mechanism teacher met its criterion", "the mechanism pre-grow student met the student criterion",
        "the control passed its manipulation check")


# ----------------------------------------------------------------------------------------------
# The checks, from the statistics the entry names

def teacher_criterion(layers: list[dict]) -> dict:
    """presets.TEACHER_MECHANISM on the scan's rows (diag.layer_scan: 0-based "layer", "massive_ratio",
    "sink_heads"): the largest max/median and sink-head share among the layers from `from_layer` on."""
    kept = [row for row in layers if row["layer"] >= TEACHER_MECHANISM["from_layer"]]
    found = {"massive_ratio_from_layer": max((row["massive_ratio"] or 0.0 for row in kept), default=0.0),
             "sink_heads_from_layer": max((row["sink_heads"] or 0.0 for row in kept), default=0.0)}
    return {**found, "present": teacher_meets(found)}


def teacher_meets(found: dict) -> bool:
    """Some layer from index 2 with max/median >= 100, and some with >= 20% sink heads (their maxima)."""
    return found["massive_ratio_from_layer"] >= TEACHER_MECHANISM["massive_ratio"] and \
        found["sink_heads_from_layer"] >= TEACHER_MECHANISM["sink_heads"]


def student_criterion(values: dict) -> bool:
    """presets.MECHANISM: boundary/regular RMS, kurtosis over distinct states and max/median, all three."""
    return all(values.get(key) is not None and values[key] >= threshold for key, threshold in MECHANISM.items())


def measured(reference: dict | None, keys: tuple[str, ...], seed: int) -> dict | None:
    """{statistic: its value at `seed`} from a reference's criteria table, or None where any is missing."""
    table = (reference or {}).get("tables", {}).get(CRITERIA, {})
    seeds = (reference or {}).get("table_seeds", {}).get(CRITERIA) or (reference or {}).get("seeds", [])
    if seed not in seeds or not all(key in table for key in keys):
        return None
    values = {key.split(": ", 1)[1]: table[key][seeds.index(seed)] for key in keys}
    return None if any(v is None for v in values.values()) else values


def checks(mechanism: dict | None, control: dict | None) -> dict[str, bool | None]:
    """Each check of the gate: True, False, or None where the references do not hold its statistics yet."""
    teacher, student = (measured(mechanism, keys, STUDENT_SEED) for keys in (TEACHER_KEYS, STUDENT_KEYS))
    control_teacher, control_student = (measured(control, keys, STUDENT_SEED) for keys in (TEACHER_KEYS, STUDENT_KEYS))
    manipulated = None if control_teacher is None or control_student is None else \
        control_teacher["massive_ratio_from_layer"] < TEACHER_MECHANISM["massive_ratio"] and \
        not student_criterion(control_student)
    met = lambda found, passes: None if found is None else passes(found)
    return {GATE[0]: met(teacher, teacher_meets), GATE[1]: met(student, student_criterion), GATE[2]: manipulated}


def criteria_numbers(teacher_layers: list[dict], students: dict[int, dict]) -> dict:
    """The criteria report: the teacher's statistics (teacher_criterion on the scan's rows, the same at every
    seed) and each seed's pre-grow statistics ({seed: regime.mechanism's values}), as rows of per-seed values."""
    teacher, seeds = teacher_criterion(teacher_layers), sorted(students)
    rows = [{"key": key, "values": [teacher[key.split(": ", 1)[1]]] * len(seeds)} for key in TEACHER_KEYS]
    rows += [{"key": key, "values": [students[s][key.split(": ", 1)[1]] for s in seeds]} for key in STUDENT_KEYS]
    return {"experiment": CRITERIA, "seeds": seeds, "rows": rows}


def write_criteria(ws, teacher_layers: list[dict]) -> dict | None:
    """results/<scale>/criteria.json and .md from the scan's teacher rows and every finished pre-grow run, each
    measured after block 0 at the end of growth on the diagnostic batch as the searches measured it
    (regime.mechanism on diag.diagnose_checkpoint); None, and nothing written, before any pre-grow run finished."""
    decode, batch, students = corpora.vocabulary(ws.preset.data).decode, tables.diagnostic_batch(ws), {}
    for run_dir in sorted(ws.students_dir.glob(f"s*/{tables.PRE_GROW.name}")):
        if (run_dir / "done.json").is_file() and not rundir.final_eval(run_dir).get("diverged"):
            final = diag.checkpoint_series(run_dir)[-1]
            student = tables.load_student(ws, final["path"])
            students[int(run_dir.parent.name[1:])] = regime.mechanism(
                diag.diagnose_checkpoint(student, batch, decode, final["active_blocks"]))
    if not students:
        return None
    out = criteria_numbers(teacher_layers, students)
    lines = [f"# The causal test's criteria ({ws.preset.name} scale)", "", "| statistic | " +
             " | ".join(f"s{seed}" for seed in out["seeds"]) + " |", "| --- |" + " --- |" * len(out["seeds"])]
    lines += [f"| {row['key']} | " + " | ".join(report.fmt(v, 3) for v in row["values"]) + " |" for row in out["rows"]]
    return report.write(ws.results, CRITERIA, out, lines)


def gate_failure(found: dict[str, bool | None]) -> str | None:
    """The first check of the gate not met, in the entry's order, said as such; None when all are met."""
    for check in GATE:
        if found.get(check) is None:
            return f"{check}: not yet measured"
        if not found[check]:
            return f"{check}: failed"
    return None


# ----------------------------------------------------------------------------------------------
# The contrasts, paired by seed

def paired(mechanism: dict, control: dict, key: str) -> tuple[list[int], list[float | None]]:
    """(the seeds both scales' Table 1 has, key(mechanism) − key(control) at each): C for "delta_grow", the
    difference of interactions for "interaction". A null (a diverged run) on either side stays null."""
    own = lambda reference: (reference.get("table_seeds") or {}).get("table1") or reference["seeds"]
    m_seeds, c_seeds = own(mechanism), own(control)
    seeds = [s for s in m_seeds if s in c_seeds]
    m, c = mechanism["tables"]["table1"][key], control["tables"]["table1"][key]
    values = [None if m[m_seeds.index(s)] is None or c[c_seeds.index(s)] is None
              else m[m_seeds.index(s)] - c[c_seeds.index(s)] for s in seeds]
    return seeds, values
