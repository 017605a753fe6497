"""Readings of the results pages: the rule declared before the runs (report.reading, by a Holm-adjusted p in a
declared family), and the sentence it chooses, whose words cannot say more than its interval.

    readings.sentence("delta grow", readings.stats(values))   # "delta grow: -0.0273 [...] reads **below 0**: ..."
"""

import math

from experiments import report
from experiments.presets import TIE_MARGIN

# Readings chosen after their numbers were first seen (the rule is the declared one, the choice to read them is
# not), so each says "post hoc": Table 3's interactions at equal steps (aeec662), issue 32's corrections (afae114).
POST_HOC = {"table2": ("delta_ce_phase_0", "delta_ce_phase_1", "delta_ce_phase_2", "delta_ce_last_minus_phase_0"),
            "table3": ("interaction_longer", "interaction_replay"),
            "intervention": ("transplant interaction: prefix × appended placement",)}


# Families of readings declared before their runs to be read by Holm-adjusted p, by (scale, experiment): mini's
# Table 1 secondaries over eight seeds (docs/preregistrations.md, 2026-12-05, d4f63c5). Others read alone.
HOLM_FAMILIES = {("mini", "table1"): ("delta_joint", "delta_grow")}


def declared_p(scale: str, name: str, st: dict) -> dict[str, float]:
    """{key: its Holm-adjusted p} over the family HOLM_FAMILIES declares for this scale's experiment; {} if none."""
    keys = [key for key in HOLM_FAMILIES.get((scale, name), ()) if key in st]
    return dict(zip(keys, holm_family([st[key] for key in keys])))


def stats(values: list) -> dict:
    """report.across_seeds of a reference's per-seed values, a null as NaN (shown per seed, no interval made)."""
    return report.across_seeds([math.nan if v is None else v for v in values])


def read(s: dict, p_holm: float | None = None) -> str:
    """The declared rule's reading (report.reading), in a family by its Holm-adjusted p; a seed without a value
    gives none."""
    if missing := sum(not math.isfinite(v) for v in s["values"]):
        return f"no reading: {missing} of {len(s['values'])} seeds have no value (null: a diverged run, n/a or never)"
    return report.reading(s, TIE_MARGIN, p_holm)


def holm_family(members: list[dict]) -> list[float]:
    """Each member's one-sample t-test p, adjusted by Holm over the family (NaN where there is no test)."""
    raw = [report.p_two_sided(s) for s in members]
    return [math.nan if math.isnan(p) else adjusted for p, adjusted in zip(raw, report.holm(raw))]


def p_text(p: float) -> str:
    return "n/a (no test)" if math.isnan(p) else f"{p:.3g}"


def sentence(label: str, s: dict, p_holm: float | None = None, family: int = 0) -> str:
    """One reading as a sentence: the difference, the verdict, why, and the smallest tie margin the seeds allowed."""
    verdict = read(s, p_holm)
    if verdict.startswith("no reading"):
        return f"{label}: {verdict}."
    if p_holm is None:
        test = "its 95% t-interval " + ("excludes 0" if verdict in ("below 0", "above 0") else "includes 0")
    else:
        below = "below" if p_holm < 0.05 else "not below"
        test = f"its Holm-adjusted p, {p_text(p_holm)}, is {below} 0.05 over the family's {family} comparisons"
    if verdict == "inconclusive":
        why = f"{test}, and its 90% interval is not inside ±{TIE_MARGIN:g}"
    elif verdict.startswith("a tie"):
        why = f"its 90% t-interval lies inside ±{TIE_MARGIN:g} (two one-sided tests at 5%)"
    else:
        why = test
    return (f"{label}: {report.stats_cell(s, signed=True)} over {s['n']} seeds reads **{verdict}**: {why}; "
            f"the smallest tie margin these seeds allow is ±{report.smallest_tie_margin(s):.4f}.")


def reading_cell(s: dict, p_holm: float | None = None) -> str:
    """A reading in a table's cell, with the smallest tie margin the seeds allowed."""
    verdict, margin = read(s, p_holm), report.smallest_tie_margin(s)
    return verdict + (f" (tie margin ±{margin:.3f})" if math.isfinite(margin) and "no reading" not in verdict else "")


RULE = (f"Readings follow the rule declared before the runs (docs/preregistrations.md): **below 0** or **above 0** "
        f"where the 95% t-interval excludes 0 (in a declared family: where the Holm-adjusted p is below 0.05); **a "
        f"tie within ±{TIE_MARGIN:g}** nats where the 90% t-interval lies inside ±{TIE_MARGIN:g} (two one-sided "
        "tests at 5%, TOST); else **inconclusive**. A seed without a value (a diverged run) gives no reading. "
        "Each reading states the smallest tie margin its seeds allowed (|mean| + the 90% half-width): a tie "
        "within a smaller margin was out of reach whatever the mean.")


# What a reference records beside its numbers: seeds, diverged runs

def seeds_of(reference: dict, name: str | None) -> list[int]:
    """The seeds of a reference's table `name` (None, or one it records none for: the reference's)."""
    return (reference.get("table_seeds") or {}).get(name) or reference["seeds"]


def diverged_line(values: dict[str, list], seeds: list[int], what: str) -> str:
    """How many of a table's runs diverged: a diverged run's CE is null in the reference."""
    total = sum(len(v) for v in values.values())
    bad = [f"{name} s{seed}" for name, v in values.items() for seed, x in zip(seeds, v) if x is None]
    if not bad:
        return f"Seeds {', '.join(map(str, seeds))}; diverged: none of the {total} {what}."
    return (f"Seeds {', '.join(map(str, seeds))}; diverged: {len(bad)} of the {total} {what} ({', '.join(bad)}): "
            "a number it enters shows its seeds' values, with no mean, interval or reading.")


def by_row(numbers: dict) -> dict[str, dict[str, list]]:
    """{row: {quantity: per-seed values}} of a report whose keys are "<row>: <quantity>"."""
    rows: dict[str, dict[str, list]] = {}
    for key, values in numbers.items():
        row, _, quantity = key.rpartition(": ")
        rows.setdefault(row, {})[quantity] = values
    return rows


def ce_values(numbers: dict) -> dict[str, list]:
    """{variant: its final CE per seed} of a variant report (intervention, planted); null as NaN."""
    return {row: [math.nan if v is None else v for v in q["ce"]] for row, q in by_row(numbers).items() if "ce" in q}
