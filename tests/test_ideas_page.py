"""The ideas study's one rendering (ideas.section_lines), of the results page and of the live report alike, from a
reference's per-seed values: the primary contrasts Holm-adjusted as the pre-registration says, read by the
declared rule, checked against numbers planted by hand."""
import json

from experiments import ideas, readings, registry, report

SEEDS = [42, 43, 44]


def ideas_report(deltas: dict[str, list[float]]) -> dict:
    """An ideas.json as run_ideas writes its rows (only their Δ) and `numbers`, idea 4 choosing pre,post,post."""
    rows = [{"idea": c.idea, "primary": c.primary, "variant": c.variant.label, "baseline": c.baseline.label,
             "delta": report.across_seeds(deltas.get(c.variant.label, [0.001, -0.002, 0.0015]))}
            for c in ideas.fixed_contrasts()]
    chosen = f"pre,post,post-grow (chosen on seed {ideas.SEARCH_SEED})"
    rows += [{"idea": 4, "primary": True, "variant": chosen, "baseline": "post-grow",
              "delta": report.across_seeds([-0.02, -0.025, -0.022])},
             {"idea": 4, "primary": False, "variant": chosen, "baseline": "pre-grow",
              "delta": report.across_seeds([0.01, 0.02, 0.03])}]
    return {"seeds": SEEDS, "rows": rows, "numbers": ideas.contrast_numbers(rows)}


def section(deltas: dict) -> list[str]:
    return ideas.section_lines(ideas_report(deltas)["numbers"], SEEDS)


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
        assert rows[i][6] == report.reading(stats[i], 0.01, holm[i - 1])
    assert rows[1][6] == "below 0" and rows[4][2] == "post-grow"  # idea 4's primary is against post-grow
    assert rows[2][6] != "below 0"
    assert rows[1][4] == "-0.0500, -0.0520, -0.0490" and rows[4][4] == "-0.0200, -0.0250, -0.0220"  # every seed's Δ


def test_a_planted_harm_reads_above_zero_and_the_secondaries_carry_no_reading():
    lines = section({"pre-grow + reinit": [0.30, 0.31, 0.305]})
    assert primary_rows(lines)[3][6] == "above 0"
    secondary = lines[lines.index("| idea | option | against | Δ CE | Δ per seed |") + 2:]
    assert any("| 4 | pre,post,post-grow (chosen on seed 41) | pre-grow | " in line and "| +0.0100, +0.0200, +0.0300 |"
               in line for line in secondary)


def test_the_live_report_renders_its_contrasts_as_the_page_renders_the_shipped_ones():
    """ideas.markdown of a live report holds, line for line, the page's section of the numbers the reference takes
    from that report's JSON, a diverged seed (null there) included; what only the runs say comes after."""
    out = ideas_report({"pre-grow + reinit": [0.30, report.DIVERGED, 0.305]})
    jump = report.across_seeds([0.01, 0.02, 0.03])
    for row in out["rows"]:
        row |= {"jump": jump, "baseline_jump": jump, "jump_delta": jump, "transitions": "no transition rows", "cost": ""}
    out["numbers"] = ideas.contrast_numbers(out["rows"])
    ce = {name: 3.0 + i / 10 for i, name in enumerate(ideas.schedules(3))}
    out |= {"scale": "toy", "diverged_runs": ["s43/pre-grow + reinit"],
            "search": {"seed": ideas.SEARCH_SEED, "ce": ce, "chosen": "pre,post,post", "diverged": []}}
    shipped = {"seeds": SEEDS, "tables": {"ideas": json.loads(json.dumps(report.finite(out)))["numbers"]}}
    page = registry.STUDIES["ideas"].page(shipped, "nowhere")
    live = ideas.markdown(out, 17)
    start = live.index(page[2])
    assert live[start:start + len(page) - 4] == page[2:-2] and page[-2:] == ["", ""]
    idea3 = primary_rows(page)[3]
    assert idea3[3:7] == ["+0.3025 [+0.2707, +0.3343] (1 of 3 diverged)", "+0.3000, n/a, +0.3050", "n/a (no test)",
                          "no reading: 1 of 3 diverged"]


def transition(step, costs, redrawn=()):
    return {"step": step, "event": "transition", "block": len(costs), "removal_costs": costs,
            "reinitialized": list(redrawn)}


def test_the_remedys_firings_are_its_transitions_removal_costs_against_its_threshold():
    """Issue 57: idea 3 re-draws a prefix block whose removal ΔCE is below identity_threshold; a transition fires
    when its lowest cost is below it (a run's own threshold), and the row says how often that happened."""
    run_a = [{"step": 1, "loss": 3.0}, transition(251, {"0": 5.6}), transition(501, {"0": 5.1, "1": 0.09}, ["1"])]
    run_b = [transition(251, {"0": 6.0}), transition(501, {"0": 5.0, "1": 0.12})]
    got = ideas.remedy_firings([(run_a, 0.105), (run_b, 0.105)])
    assert got == {"transitions": 4, "fired": 1, "logged": 1, "lowest": 0.09, "thresholds": [0.105]}
    assert ideas.remedy_firings([(run_b, 0.2)])["fired"] == 1  # the run's own threshold decides
    assert ideas.firing_text(got, [0.01, 0.0, 0.0]) == "the remedy fired at 1 of its 4 transitions (a removal ΔCE " \
                                                       "below 0.105)"
    never = ideas.remedy_firings([(run_b, 0.105)])
    assert ideas.firing_text(never, [0.0, 0.0]).startswith("a no-op: the remedy never fired, at 0 of its 2 transitions "
                                                           "(lowest removal ΔCE 0.120, its threshold 0.105); its CE "
                                                           "equals its baseline's on every seed")
    assert "equals" not in ideas.firing_text(never, [0.0, 1e-9])


def test_idea_3s_never_fired_count_on_the_page_is_its_records_removal_costs_against_their_threshold():
    from experiments import studies
    firings = ideas.recorded_firings("toy", SEEDS)
    assert sorted(firings) == ["post-grow + reinit", "pre-grow + reinit"]
    for variant in ideas.remedy_variants():
        records = [studies.read_record(studies.RECORDS_DIR / "toy" / "beyond" / variant.folder / f"s{s}" /
                                       f"{variant.run.name}.json") for s in SEEDS]
        rows = [(row, r["config"]["identity_threshold"]) for r in records for row in r["metrics"]
                if row.get("event") == "transition"]
        by_hand = sum(any(cost < threshold for cost in row["removal_costs"].values()) for row, threshold in rows)
        got = firings[variant.label]
        assert got["transitions"] == len(rows) == 6 and got["fired"] == by_hand == 0 and got["logged"] == 0
        assert got["lowest"] == min(c for row, _ in rows for c in row["removal_costs"].values()) > 0.105
    from experiments import reference
    page = "\n".join(registry.ideas_page(reference.load("toy"), "toy"))
    row = next(line for line in page.splitlines() if line.startswith("| 3 | pre-grow + reinit |"))
    assert "a no-op: the remedy never fired, at 0 of its 6 transitions (lowest removal ΔCE 0.217, its threshold " \
           "0.105); its CE equals its baseline's on every seed" in row


def test_the_live_report_counts_firings_from_its_run_folders_as_the_page_does_from_records(tmp_path):
    """live_firings reads each remedy run's metrics.jsonl and its config.json's identity_threshold."""
    from pathlib import Path

    from experiments import presets, suite
    from experiments.variants import variant_dir
    from plumbing import devices
    ws = suite.Workspace(presets.PRESETS["smoke"], tmp_path / "smoke", tmp_path / "results", devices.Dist())
    for variant in ideas.remedy_variants():
        for seed, cost in zip(SEEDS, (0.3, 0.05, 0.2)):
            folder = Path(variant_dir(ws, variant, seed))
            folder.mkdir(parents=True)
            (folder / "config.json").write_text(json.dumps({"identity_threshold": 0.105}))
            (folder / "metrics.jsonl").write_text(json.dumps(transition(501, {"0": 5.0, "1": cost})) + "\n")
    got = ideas.live_firings(ws, SEEDS)
    assert {k: (v["transitions"], v["fired"], v["lowest"]) for k, v in got.items()} == \
        {"pre-grow + reinit": (3, 1, 0.05), "post-grow + reinit": (3, 1, 0.05)}
