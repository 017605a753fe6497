"""The ideas section of a results page (experiments/pages.py), generated from a reference's per-seed values:
the primary contrasts Holm-adjusted as the pre-registration says, read by the declared rule, checked against
numbers planted by hand."""
from experiments import ideas, pages, readings, reference, report

SEEDS = [42, 43, 44]


def ideas_report(deltas: dict[str, list[float]]) -> dict:
    """An ideas.json as run_ideas writes its rows (only what report_numbers reads), idea 4 choosing pre,post,post."""
    rows = [{"idea": c.idea, "primary": c.primary, "variant": c.variant.label, "baseline": c.baseline.label,
             "delta": report.across_seeds(deltas.get(c.variant.label, [0.001, -0.002, 0.0015]))}
            for c in ideas.fixed_contrasts()]
    chosen = f"pre,post,post-grow (chosen on seed {ideas.SEARCH_SEED})"
    rows += [{"idea": 4, "primary": True, "variant": chosen, "baseline": "post-grow",
              "delta": report.across_seeds([-0.02, -0.025, -0.022])},
             {"idea": 4, "primary": False, "variant": chosen, "baseline": "pre-grow",
              "delta": report.across_seeds([0.01, 0.02, 0.03])}]
    return {"seeds": SEEDS, "rows": rows}


def section(deltas: dict) -> list[str]:
    numbers = reference.report_numbers(ideas_report(deltas))
    return pages.ideas_section("nowhere", {"seeds": SEEDS, "tables": {"ideas": numbers}, "table_seeds": {"ideas": SEEDS}})


def primary_rows(lines: list[str]) -> dict[int, list[str]]:
    start = lines.index("| idea | option | against | Δ CE | Δ per seed (42, 43, 44) | p (Holm) | reading | "
                        "smallest tie margin |") + 2
    rows = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[int(cells[0])] = cells
    return rows


def test_the_primaries_are_one_holm_family_of_seven_read_by_the_declared_rule():
    planted = {"post-grow + asymmetric LR": [-0.05, -0.052, -0.049]}  # idea 1: clearly below 0
    rows = primary_rows(section(planted))
    assert sorted(rows) == [1, 2, 3, 4, 5, 6, 7]
    stats = {1: report.across_seeds(planted["post-grow + asymmetric LR"]),
             4: report.across_seeds([-0.02, -0.025, -0.022])}
    stats.update({i: report.across_seeds([0.001, -0.002, 0.0015]) for i in (2, 3, 5, 6, 7)})
    raw = [report.p_two_sided(stats[i]) for i in range(1, 8)]
    holm = report.holm(raw)
    for i in range(1, 8):
        assert rows[i][5] == readings.p_text(holm[i - 1])
        assert rows[i][6] == report.adjusted_reading(stats[i], holm[i - 1], 0.01)
    assert rows[1][6] == "below 0" and rows[4][2] == "post-grow"  # idea 4's primary is against post-grow
    assert rows[2][6] != "below 0"
    assert rows[1][4] == "-0.0500, -0.0520, -0.0490" and rows[4][4] == "-0.0200, -0.0250, -0.0220"  # every seed's Δ


def test_a_planted_harm_reads_above_zero_and_the_secondaries_carry_no_reading():
    lines = section({"pre-grow + reinit": [0.30, 0.31, 0.305]})
    assert primary_rows(lines)[3][6] == "above 0"
    secondary = lines[lines.index("| idea | option | against | Δ CE | Δ per seed |") + 2:]
    assert any("| 4 | pre,post,post-grow (chosen on seed 41) | pre-grow | " in line and "| +0.0100, +0.0200, +0.0300 |"
               in line for line in secondary)
